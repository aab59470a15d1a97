//! Our compiled kernels loaded on a CUDA device (once per process and device) and launched on
//! torch's current stream of that device, where a CUDA graph being captured records them; or,
//! once [`super::host::load`] has built them for the CPU, run on CPU tensors.
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, PoisonError};

use tch::{Device, Tensor};

use super::catalogue::{cubin, SOURCES};
use super::FusedError;
use crate::cuda::nvrtc::Arch;

/// A loaded kernel: the runtime's `cudaKernel_t` on a CUDA device, or the host build's
/// `HostKernel` on the CPU; valid for the process's life.
#[derive(Debug, Clone, Copy)]
pub struct Kernel {
    /// The CUDA device, or `None` for the CPU.
    device: Option<i64>,
    handle: usize,
    name: &'static str,
}

/// One kernel argument, by value.
#[derive(Debug, Clone, Copy)]
pub enum Arg {
    Ptr(*mut c_void),
    I64(i64),
    I32(i32),
    F32(f32),
    /// A value (a struct) in memory the caller keeps alive through the launch.
    Value(*const c_void),
}

impl Arg {
    /// A tensor's data (null for `None`).
    pub fn tensor(t: Option<&Tensor>) -> Arg {
        Arg::Ptr(t.map_or(std::ptr::null_mut(), Tensor::data_ptr))
    }
}

/// How a kernel is launched: blocks, threads per block, dynamic shared memory in bytes.
#[derive(Debug, Clone, Copy)]
pub struct Launch {
    pub blocks: u32,
    pub threads: u32,
    pub shared_bytes: u32,
}

/// The kernel `name` on `device`, loading every source's kernels there on first use.
pub fn kernel(device: Device, name: &'static str) -> Result<Kernel, FusedError> {
    static LOADED: Mutex<Option<HashMap<(i64, &'static str), usize>>> = Mutex::new(None);
    let index = match device {
        Device::Cuda(index) => index,
        Device::Cpu if super::host::loaded() => {
            return Ok(Kernel {
                device: None,
                handle: super::host::kernel(name)?,
                name,
            })
        }
        _ => return Err(FusedError::NotCuda(device)),
    };
    let index = index as i64;
    let mut loaded = LOADED.lock().unwrap_or_else(PoisonError::into_inner);
    let loaded = loaded.get_or_insert_with(HashMap::new);
    // A device's kernels are registered together, once every source has loaded: a failure
    // leaves none, and the next call tries again.
    if !loaded.keys().any(|&(d, _)| d == index) {
        let arch = imp::arch(index)?;
        let mut found = Vec::new();
        for source in &SOURCES {
            let image = cubin(source, arch)?;
            let library = imp::load(index, &image)?;
            for &kernel in source.kernels {
                found.push(((index, kernel), imp::find(index, library, kernel)?));
            }
        }
        loaded.extend(found);
    }
    loaded
        .get(&(index, name))
        .map(|&handle| Kernel {
            device: Some(index),
            handle,
            name,
        })
        .ok_or(FusedError::UnknownKernel(name))
}

impl Kernel {
    /// The handle, for the shim to launch the kernel itself (it tells the two kinds apart by
    /// the tensors' device).
    pub fn handle(&self) -> *mut c_void {
        self.handle as *mut c_void
    }

    /// Launches on the device's current torch stream (asynchronously, as torch's kernels), or
    /// on the CPU runs it to the end.
    pub fn launch(&self, launch: Launch, args: &[Arg]) -> Result<(), FusedError> {
        if launch.blocks == 0 {
            return Ok(());
        }
        let mut values = args.to_vec();
        let mut pointers = argument_pointers(&mut values);
        match self.device {
            Some(device) => imp::launch(device, self.handle, self.name, launch, &pointers),
            None => super::host::launch(self.handle, self.name, launch, &mut pointers),
        }
    }
}

/// Where each argument's value is, as a launch reads them.
pub(super) fn argument_pointers(values: &mut [Arg]) -> Vec<*mut c_void> {
    values
        .iter_mut()
        .map(|arg| match arg {
            Arg::Ptr(p) => p as *mut *mut c_void as *mut c_void,
            Arg::I64(v) => v as *mut i64 as *mut c_void,
            Arg::I32(v) => v as *mut i32 as *mut c_void,
            Arg::F32(v) => v as *mut f32 as *mut c_void,
            Arg::Value(p) => *p as *mut c_void,
        })
        .collect()
}

#[cfg(tdmpc2_cuda_graphs)]
mod imp {
    use std::ffi::{c_char, c_void, CString};

    use super::{Arch, FusedError, Launch};
    use crate::cuda::graph::imp::check;

    extern "C" {
        fn tdmpc2_cuda_device_arch(device: i64, major: *mut i32, minor: *mut i32) -> *mut c_char;
        fn tdmpc2_cuda_library_load(
            device: i64,
            image: *const c_void,
            library: *mut *mut c_void,
        ) -> *mut c_char;
        fn tdmpc2_cuda_library_kernel(
            device: i64,
            library: *mut c_void,
            name: *const c_char,
            kernel: *mut *mut c_void,
        ) -> *mut c_char;
        fn tdmpc2_cuda_launch(
            device: i64,
            kernel: *mut c_void,
            grid: *const u32,
            block: *const u32,
            shared_bytes: u32,
            args: *mut *mut c_void,
        ) -> *mut c_char;
    }

    pub fn arch(device: i64) -> Result<Arch, FusedError> {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: valid out-pointers.
        check("device architecture", unsafe {
            tdmpc2_cuda_device_arch(device, &mut major, &mut minor)
        })?;
        Ok(Arch { major, minor })
    }

    pub fn load(device: i64, image: &[u8]) -> Result<*mut c_void, FusedError> {
        let mut library = std::ptr::null_mut();
        // SAFETY: the image is a whole cubin, read by the call.
        check("load kernels", unsafe {
            tdmpc2_cuda_library_load(device, image.as_ptr().cast(), &mut library)
        })?;
        Ok(library)
    }

    pub fn find(device: i64, library: *mut c_void, name: &str) -> Result<usize, FusedError> {
        let c_name = CString::new(name).expect("kernel names hold no NUL byte");
        let mut kernel = std::ptr::null_mut();
        // SAFETY: a loaded library and a valid name.
        check("find kernel", unsafe {
            tdmpc2_cuda_library_kernel(device, library, c_name.as_ptr(), &mut kernel)
        })?;
        Ok(kernel as usize)
    }

    pub fn launch(
        device: i64,
        kernel: usize,
        name: &'static str,
        launch: Launch,
        args: &[*mut c_void],
    ) -> Result<(), FusedError> {
        let grid = [launch.blocks, 1, 1];
        let block = [launch.threads, 1, 1];
        let mut args = args.to_vec();
        // SAFETY: each pointer points at an argument of the kernel's type, alive for the call
        // (the runtime copies them at launch).
        let message = unsafe {
            tdmpc2_cuda_launch(
                device,
                kernel as *mut c_void,
                grid.as_ptr(),
                block.as_ptr(),
                launch.shared_bytes,
                args.as_mut_ptr(),
            )
        };
        check("launch", message).map_err(|e| FusedError::Launch {
            kernel: name,
            message: e.to_string(),
        })
    }
}

#[cfg(not(tdmpc2_cuda_graphs))]
mod imp {
    use std::ffi::c_void;

    use super::{Arch, FusedError, Launch};

    fn not_built() -> FusedError {
        FusedError::NotBuilt(env!("TDMPC2_CUDA_GRAPHS_MISSING"))
    }
    pub fn arch(_: i64) -> Result<Arch, FusedError> {
        Err(not_built())
    }
    pub fn load(_: i64, _: &[u8]) -> Result<*mut c_void, FusedError> {
        Err(not_built())
    }
    pub fn find(_: i64, _: *mut c_void, _: &str) -> Result<usize, FusedError> {
        Err(not_built())
    }
    pub fn launch(
        _: i64,
        _: usize,
        _: &'static str,
        _: Launch,
        _: &[*mut c_void],
    ) -> Result<(), FusedError> {
        Err(not_built())
    }
}
