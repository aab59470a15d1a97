//! The fused kernels' CUDA C run on the CPU, so that a machine without a GPU tests what they
//! compute (tests/fused_kernels.rs): each source is compiled by the host's C++ compiler after
//! `host_cuda.h`, which emulates the thread blocks, warps, barriers, shuffles and shared memory
//! the kernels use, and loaded into the process. Off until [`load`] is called: the trainer never
//! calls it, and on CUDA the kernels always run on the GPU.
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use super::catalogue::{Source, SOURCES};
use super::module::Launch;
use super::FusedError;

const HEADER: &str = include_str!("host_cuda.h");

/// What a host kernel's `launch` is (`HostKernel` in host_cuda.h): null, or what went wrong.
type LaunchFn =
    unsafe extern "C" fn(*const c_void, u32, u32, u32, *mut *mut c_void) -> *const c_char;

/// Each kernel's `HostKernel` (its address), or why the build failed.
static LOADED: OnceLock<Result<HashMap<&'static str, usize>, String>> = OnceLock::new();

/// Compiles and loads every kernel source for the CPU (once per process; the first call takes a
/// few seconds). From then on the fused kernels launch on CPU tensors too.
pub fn load() -> Result<(), FusedError> {
    LOADED
        .get_or_init(|| build(&SOURCES).map_err(|e| e.to_string()))
        .as_ref()
        .map(|_| ())
        .map_err(|message| FusedError::Host(message.clone()))
}

/// Whether [`load`] has succeeded in this process.
pub fn loaded() -> bool {
    matches!(LOADED.get(), Some(Ok(_)))
}

/// The kernel `name`'s handle, for [`launch`] and the shim.
pub(super) fn kernel(name: &'static str) -> Result<usize, FusedError> {
    match LOADED.get() {
        Some(Ok(kernels)) => kernels
            .get(name)
            .copied()
            .ok_or(FusedError::UnknownKernel(name)),
        _ => Err(FusedError::Host(
            "the host build of the kernels is not loaded (fused::host::load)".into(),
        )),
    }
}

/// Runs a kernel to the end on this thread.
pub(super) fn launch(
    handle: usize,
    name: &'static str,
    launch: Launch,
    args: &mut [*mut c_void],
) -> Result<(), FusedError> {
    let kernel = handle as *const c_void;
    // SAFETY: handle is a HostKernel of a library loaded for the process's life, whose first
    // field is its launch function; each of args points at an argument of the kernel's type.
    let message = unsafe {
        let launch_fn = *(kernel as *const LaunchFn);
        launch_fn(
            kernel,
            launch.blocks,
            launch.threads,
            launch.shared_bytes,
            args.as_mut_ptr(),
        )
    };
    if message.is_null() {
        return Ok(());
    }
    // SAFETY: a NUL-terminated message the library keeps until this thread's next launch.
    let message = unsafe { CStr::from_ptr(message) }
        .to_string_lossy()
        .into_owned();
    Err(FusedError::Launch {
        kernel: name,
        message,
    })
}

/// Compiles each source to a library of its own and loads it.
fn build(sources: &[Source]) -> Result<HashMap<&'static str, usize>, FusedError> {
    let dir = tempfile_dir()?;
    let built = compile_all(sources, &dir);
    let loaded = built.and_then(|libraries| {
        let mut kernels = HashMap::new();
        for (source, library) in sources.iter().zip(libraries) {
            for &name in source.kernels {
                kernels.insert(name, find(&library, name)?);
            }
        }
        Ok(kernels)
    });
    // The loaded libraries stay mapped after their files are gone.
    let _ = std::fs::remove_dir_all(&dir);
    loaded
}

fn tempfile_dir() -> Result<std::path::PathBuf, FusedError> {
    let dir = std::env::temp_dir().join(format!("tdmpc2-host-kernels-{}", std::process::id()));
    std::fs::create_dir_all(&dir)
        .map_err(|e| FusedError::Host(format!("cannot make {}: {e}", dir.display())))?;
    Ok(dir)
}

/// The host's C++ compiler: `CXX`, else `c++`.
fn compiler() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "c++".into())
}

/// Compiles every source at once (one compiler process each), then loads each library.
fn compile_all(sources: &[Source], dir: &std::path::Path) -> Result<Vec<Library>, FusedError> {
    let cxx = compiler();
    let mut jobs = Vec::new();
    for source in sources {
        let path = dir.join(format!("{}.so", source.name));
        let mut child = Command::new(&cxx)
            .args([
                "-std=c++17",
                "-O2",
                "-fPIC",
                "-shared",
                "-w",
                "-x",
                "c++",
                "-",
                "-o",
            ])
            .arg(&path)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| FusedError::Host(format!("cannot run the C++ compiler {cxx:?}: {e}")))?;
        let text = host_text(source)?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(text.as_bytes())
                .map_err(|e| FusedError::Host(format!("{}: {e}", source.name)))?;
        }
        jobs.push((source, path, child));
    }
    let mut libraries = Vec::new();
    for (source, path, child) in jobs {
        let out = child
            .wait_with_output()
            .map_err(|e| FusedError::Host(format!("{}: {e}", source.name)))?;
        if !out.status.success() {
            return Err(FusedError::Host(format!(
                "{cxx} cannot compile {} for the CPU: {}",
                source.name,
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        libraries.push(Library::open(&path)?);
    }
    Ok(libraries)
}

/// The text the host compiler reads: the emulation, the source (its dynamic shared memory
/// declared as a pointer, which C++ can express), and a table of its kernels.
fn host_text(source: &Source) -> Result<String, FusedError> {
    let kernels: Vec<String> = source
        .kernels
        .iter()
        .map(|k| format!("tdmpc2_host::host_kernel(\"{k}\", {k})"))
        .collect();
    Ok(format!(
        "{HEADER}\n#line 1 \"common.cuh\"\n{}\n\
         extern \"C\" const tdmpc2_host::HostKernel* tdmpc2_host_kernel(const char* name) {{\n\
           static const tdmpc2_host::HostKernel kernels[] = {{{}}};\n\
           for (const auto& k : kernels) if (strcmp(k.name, name) == 0) return &k;\n\
           return nullptr;\n\
         }}\n",
        pointer_to_dynamic_shared(source.name, &source.full_text())?,
        kernels.join(", ")
    ))
}

/// `extern __shared__ T name[];` (the launch's dynamic shared memory) as
/// `T* name = (T*)tdmpc2_host::dynamic_shared();`.
fn pointer_to_dynamic_shared(source: &str, text: &str) -> Result<String, FusedError> {
    const DECLARATION: &str = "extern __shared__ ";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(DECLARATION) {
        out.push_str(&rest[..at]);
        let after = &rest[at + DECLARATION.len()..];
        let declared = after
            .find("[];")
            .and_then(|end| after[..end].trim().rsplit_once(' ').map(|d| (d, end)));
        let Some(((kind, name), end)) = declared else {
            return Err(FusedError::Host(format!(
                "{source}: dynamic shared memory is declared as `extern __shared__ T name[];` \
                 for the host build"
            )));
        };
        out.push_str(&format!(
            "{kind}* {name} = static_cast<{kind}*>(tdmpc2_host::dynamic_shared());"
        ));
        rest = &after[end + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

/// A loaded library, kept for the process's life.
struct Library {
    handle: *mut c_void,
    path: String,
}

impl Library {
    fn open(path: &std::path::Path) -> Result<Self, FusedError> {
        let path = path.display().to_string();
        let c_path = CString::new(path.clone())
            .map_err(|_| FusedError::Host(format!("{path:?} holds a NUL byte")))?;
        // SAFETY: dlopen with a valid C string; the handle is never closed.
        let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(FusedError::Host(format!(
                "cannot load {path}: {}",
                super::super::nvrtc::last_dl_error()
            )));
        }
        Ok(Self { handle, path })
    }
}

/// The `HostKernel` of `name` in `library`.
fn find(library: &Library, name: &'static str) -> Result<usize, FusedError> {
    // SAFETY: a loaded library and a valid symbol name.
    let table = unsafe { libc::dlsym(library.handle, c"tdmpc2_host_kernel".as_ptr()) };
    if table.is_null() {
        return Err(FusedError::Host(format!(
            "{} has no kernel table",
            library.path
        )));
    }
    type TableFn = unsafe extern "C" fn(*const c_char) -> *const c_void;
    let c_name = CString::new(name).expect("kernel names hold no NUL byte");
    // SAFETY: the symbol is the table function host_text defines.
    let kernel = unsafe { std::mem::transmute::<*mut c_void, TableFn>(table)(c_name.as_ptr()) };
    if kernel.is_null() {
        return Err(FusedError::UnknownKernel(name));
    }
    Ok(kernel as usize)
}

#[cfg(test)]
mod tests {
    use super::super::module::Arg;
    use super::*;

    #[test]
    fn dynamic_shared_memory_becomes_a_pointer() {
        let text = "  extern __shared__ float shared[];\n  float* v = shared;";
        let host = pointer_to_dynamic_shared("k.cu", text).unwrap();
        assert_eq!(
            host,
            "  float* shared = static_cast<float*>(tdmpc2_host::dynamic_shared());\n  float* v = shared;"
        );
        let e = pointer_to_dynamic_shared("k.cu", "extern __shared__ float s[4];")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("k.cu") && e.contains("extern __shared__ T name[];"),
            "{e}"
        );
    }

    /// Each thread writes its slot, then reads its neighbour's: with the barrier between, every
    /// block gives the neighbours' numbers; without it, the blocks that run their threads in
    /// one of the two orders read slots not yet written. Threads that wait at different
    /// barriers are an error, not a hang.
    #[test]
    fn the_emulation_orders_threads_only_at_barriers() {
        const SOURCE: &str = r#"
extern "C" __global__ void neighbours(float* out, int synced) {
  __shared__ float slot[64];
  const int t = threadIdx.x;
  slot[t] = blockIdx.x * 100.0f + t;
  if (synced) __syncthreads();
  out[blockIdx.x * blockDim.x + t] = slot[(t + 1) % blockDim.x];
  if (synced) __syncthreads();
  slot[t] = 0.0f;
}
extern "C" __global__ void mismatched(float* out) {
  if (threadIdx.x < 16) __syncwarp(); else __syncthreads();
  out[threadIdx.x] = warp_sum(1.0f);
}
"#;
        let source = Source::new("test.cu", SOURCE, &["neighbours", "mismatched"]);
        let kernels = build(&[source]).unwrap();
        let run = |kernel: &'static str, out: &mut Vec<f32>, extra: Option<i32>| {
            let mut args = vec![Arg::Ptr(out.as_mut_ptr().cast())];
            args.extend(extra.map(Arg::I32));
            let mut pointers = super::super::module::argument_pointers(&mut args);
            launch(
                kernels[kernel],
                kernel,
                Launch {
                    blocks: 2,
                    threads: 64,
                    shared_bytes: 0,
                },
                &mut pointers,
            )
        };
        let expected: Vec<f32> = (0..128)
            .map(|i| ((i / 64) * 100 + (i % 64 + 1) % 64) as f32)
            .collect();
        let mut out = vec![-1.0; 128];
        run("neighbours", &mut out, Some(1)).unwrap();
        assert_eq!(out, expected);
        run("neighbours", &mut out, Some(0)).unwrap();
        assert_ne!(out[..64], expected[..64], "block 0 runs thread 0 first");
        assert_ne!(out[64..], expected[64..], "block 1 runs thread 63 first");
        let e = run("mismatched", &mut out, None).unwrap_err().to_string();
        assert!(e.contains("mismatched") && e.contains("never reach"), "{e}");
    }
}
