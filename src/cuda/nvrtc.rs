//! NVRTC, CUDA's run-time compiler, loaded from the torch wheel's CUDA libraries when first
//! needed: our kernels are compiled at run time, so the build needs no nvcc and compiling
//! needs no GPU. `TDMPC2_NVRTC` names the library file where it lies elsewhere.
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::PathBuf;
use std::sync::OnceLock;

/// Folders the build found the wheel's NVRTC in (`:`-separated), searched before the loader's
/// own paths.
const WHEEL_DIRS: &str = env!("TDMPC2_NVRTC_DIRS");
/// Library names, newest CUDA first.
const NAMES: [&str; 2] = ["libnvrtc.so.13", "libnvrtc.so.12"];
pub const LIBRARY_VAR: &str = "TDMPC2_NVRTC";

#[derive(Debug, Clone, thiserror::Error)]
pub enum NvrtcError {
    #[error(
        "NVRTC (CUDA's run-time compiler) cannot be loaded: {0}; it ships in the CUDA torch \
         wheel (nvidia/cu13/lib/libnvrtc.so.13), or set {LIBRARY_VAR} to the library's path"
    )]
    Missing(String),
    #[error("NVRTC {call} failed: {message}")]
    Call { call: &'static str, message: String },
    #[error("kernel source {name} does not compile for {arch}:\n{log}")]
    Compile {
        name: String,
        arch: String,
        log: String,
    },
}

type Program = *mut c_void;
type Status = c_int;

/// The NVRTC entry points we call.
struct Api {
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> Status,
    error_string: unsafe extern "C" fn(Status) -> *const c_char,
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> Status,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> Status,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> Status,
    log: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    cubin_size: unsafe extern "C" fn(Program, *mut usize) -> Status,
    cubin: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    destroy: unsafe extern "C" fn(*mut Program) -> Status,
}

/// The loaded compiler (loaded once per process; never unloaded).
pub struct Nvrtc {
    api: Api,
    /// Where it was loaded from.
    pub library: String,
    /// (major, minor)
    pub version: (i32, i32),
}

/// A GPU architecture to compile for, as compute capability (9, 0) for an H100.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Arch {
    pub major: i32,
    pub minor: i32,
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sm_{}{}", self.major, self.minor)
    }
}

/// The process's NVRTC, loaded on first use.
pub fn nvrtc() -> Result<&'static Nvrtc, NvrtcError> {
    static LOADED: OnceLock<Result<Nvrtc, NvrtcError>> = OnceLock::new();
    LOADED
        .get_or_init(Nvrtc::load)
        .as_ref()
        .map_err(Clone::clone)
}

fn candidates() -> Vec<String> {
    if let Some(path) = std::env::var_os(LIBRARY_VAR).filter(|p| !p.is_empty()) {
        return vec![path.to_string_lossy().into_owned()];
    }
    let mut out = Vec::new();
    let dirs = loaded_cuda_runtime_dirs();
    let dirs = dirs
        .iter()
        .map(String::as_str)
        .chain(WHEEL_DIRS.split(':').filter(|d| !d.is_empty()));
    for dir in dirs {
        for name in NAMES {
            let path = PathBuf::from(dir).join(name);
            if path.exists() {
                out.push(path.display().to_string());
            }
        }
    }
    out.extend(NAMES.iter().map(|n| n.to_string()));
    out
}

/// The folders of the CUDA runtime libraries this process has loaded (torch's, from its wheel):
/// NVRTC ships beside them, wherever the venv lies on this machine.
fn loaded_cuda_runtime_dirs() -> Vec<String> {
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        found: *mut c_void,
    ) -> c_int {
        // SAFETY: the loader passes a valid entry, and `found` is the Vec given below.
        let (info, found) = unsafe { (&*info, &mut *(found as *mut Vec<String>)) };
        if !info.dlpi_name.is_null() {
            // SAFETY: a NUL-terminated path owned by the loader.
            let name = unsafe { CStr::from_ptr(info.dlpi_name) }.to_string_lossy();
            let path = std::path::Path::new(name.as_ref());
            let is_cudart = path
                .file_name()
                .is_some_and(|f| f.to_string_lossy().starts_with("libcudart.so"));
            if let (true, Some(dir)) = (is_cudart, path.parent()) {
                found.push(dir.display().to_string());
            }
        }
        0
    }
    let mut found: Vec<String> = Vec::new();
    // SAFETY: `visit` only reads the entries and pushes into `found`, alive for the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut found as *mut Vec<String>).cast()) };
    found
}

/// NVRTC opens its builtins library by name, which the loader would not find beside it in a
/// wheel: loaded first from the same folder, it is found by its soname.
fn preload_builtins(nvrtc_path: &str) {
    let Some(dir) = std::path::Path::new(nvrtc_path).parent() else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("libnvrtc-builtins.so.") {
            if let Ok(path) = CString::new(entry.path().display().to_string()) {
                // SAFETY: a valid C string; a failure only leaves NVRTC to look itself.
                unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            }
        }
    }
}

pub(crate) fn last_dl_error() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string owned by the loader.
    let message = unsafe { libc::dlerror() };
    if message.is_null() {
        "unknown loader error".into()
    } else {
        // SAFETY: checked non-null above.
        unsafe { CStr::from_ptr(message) }
            .to_string_lossy()
            .into_owned()
    }
}

impl Nvrtc {
    fn load() -> Result<Self, NvrtcError> {
        let mut tried = Vec::new();
        for path in candidates() {
            let c_path = CString::new(path.clone()).map_err(|_| {
                NvrtcError::Missing(format!("{LIBRARY_VAR}={path:?} holds a NUL byte"))
            })?;
            preload_builtins(&path);
            // SAFETY: dlopen with a valid C string; the handle is kept for the process's life.
            let handle =
                unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            if handle.is_null() {
                tried.push(last_dl_error());
                continue;
            }
            // SAFETY: the handle is a loaded NVRTC; the symbols have the signatures of
            // nvrtc.h.
            let api = match unsafe { Api::resolve(handle) } {
                Ok(api) => api,
                // Not an NVRTC we can use (too old, or another library of that name): the next.
                Err(why) => {
                    tried.push(format!("{path}: {why}"));
                    continue;
                }
            };
            let (mut major, mut minor) = (0, 0);
            // SAFETY: two valid out-pointers.
            check("nvrtcVersion", &api, unsafe {
                (api.version)(&mut major, &mut minor)
            })?;
            return Ok(Self {
                api,
                library: path,
                version: (major, minor),
            });
        }
        Err(NvrtcError::Missing(tried.join("; ")))
    }

    /// Compiles `source` (named `name` in messages) to a cubin for `arch`.
    pub fn compile(&self, name: &str, source: &str, arch: Arch) -> Result<Vec<u8>, NvrtcError> {
        let nul = |what: &str| NvrtcError::Call {
            call: "nvrtcCreateProgram",
            message: format!("the {what} holds a NUL byte"),
        };
        let c_source = CString::new(source).map_err(|_| nul("source"))?;
        let c_name = CString::new(name).map_err(|_| nul("name"))?;
        let mut program: Program = std::ptr::null_mut();
        // SAFETY: valid C strings, no headers.
        let status = unsafe {
            (self.api.create)(
                &mut program,
                c_source.as_ptr(),
                c_name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        check("nvrtcCreateProgram", &self.api, status)?;
        let result = self.build(program, name, arch);
        // SAFETY: the program was created above and is destroyed once.
        unsafe { (self.api.destroy)(&mut program) };
        result
    }

    fn build(&self, program: Program, name: &str, arch: Arch) -> Result<Vec<u8>, NvrtcError> {
        let options = [
            format!("--gpu-architecture={arch}"),
            // NVRTC's other defaults are nvcc's (no fast math), as torch's kernels are built.
            "--std=c++17".into(),
        ];
        let options: Vec<CString> = options
            .into_iter()
            .map(|o| CString::new(o).expect("options hold no NUL byte"))
            .collect();
        let pointers: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
        // SAFETY: `pointers` holds valid C strings alive for the call.
        let status =
            unsafe { (self.api.compile)(program, pointers.len() as c_int, pointers.as_ptr()) };
        if status != 0 {
            return Err(NvrtcError::Compile {
                name: name.into(),
                arch: arch.to_string(),
                log: self.log(program),
            });
        }
        let mut size = 0usize;
        // SAFETY: a compiled program and a valid out-pointer.
        check("nvrtcGetCUBINSize", &self.api, unsafe {
            (self.api.cubin_size)(program, &mut size)
        })?;
        let mut cubin = vec![0u8; size];
        // SAFETY: the buffer has the size NVRTC asked for.
        check("nvrtcGetCUBIN", &self.api, unsafe {
            (self.api.cubin)(program, cubin.as_mut_ptr().cast())
        })?;
        Ok(cubin)
    }

    fn log(&self, program: Program) -> String {
        let mut size = 0usize;
        // SAFETY: a valid program and out-pointer.
        if unsafe { (self.api.log_size)(program, &mut size) } != 0 || size == 0 {
            return "(NVRTC gave no log)".into();
        }
        let mut log = vec![0u8; size];
        // SAFETY: the buffer has the size NVRTC asked for.
        if unsafe { (self.api.log)(program, log.as_mut_ptr().cast()) } != 0 {
            return "(NVRTC's log could not be read)".into();
        }
        String::from_utf8_lossy(&log)
            .trim_end_matches('\0')
            .trim()
            .to_owned()
    }
}

fn check(call: &'static str, api: &Api, status: Status) -> Result<(), NvrtcError> {
    if status == 0 {
        return Ok(());
    }
    // SAFETY: NVRTC returns null or a static string for any status.
    let text = unsafe { (api.error_string)(status) };
    let text = if text.is_null() {
        String::new()
    } else {
        // SAFETY: checked non-null above.
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    };
    Err(NvrtcError::Call {
        call,
        message: format!("{text} (status {status})"),
    })
}

impl Api {
    unsafe fn resolve(handle: *mut c_void) -> Result<Self, String> {
        unsafe fn symbol<T: Copy>(handle: *mut c_void, name: &str) -> Result<T, String> {
            let c_name = CString::new(name).expect("symbol names hold no NUL byte");
            let found = libc::dlsym(handle, c_name.as_ptr());
            if found.is_null() {
                return Err(format!("the library has no {name}"));
            }
            Ok(std::mem::transmute_copy(&found))
        }
        Ok(Self {
            version: symbol(handle, "nvrtcVersion")?,
            error_string: symbol(handle, "nvrtcGetErrorString")?,
            create: symbol(handle, "nvrtcCreateProgram")?,
            compile: symbol(handle, "nvrtcCompileProgram")?,
            log_size: symbol(handle, "nvrtcGetProgramLogSize")?,
            log: symbol(handle, "nvrtcGetProgramLog")?,
            cubin_size: symbol(handle, "nvrtcGetCUBINSize")?,
            cubin: symbol(handle, "nvrtcGetCUBIN")?,
            destroy: symbol(handle, "nvrtcDestroyProgram")?,
        })
    }
}
