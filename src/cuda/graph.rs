//! CUDA graphs over torch's `at::cuda::CUDAGraph` (src/cuda/shim.cpp): record a sequence
//! of torch calls once, then launch all of its kernels with one call.
//!
//! A graph replays the exact kernels it recorded, on the exact memory it recorded:
//! - inputs are tensors allocated before the capture and refilled in place (`copy_`) before each
//!   replay; outputs are the tensors the captured call returned, overwritten by each replay;
//! - nothing inside the captured call may synchronise with the host (`double_value`,
//!   `Vec::try_from`, `.to(Device::Cpu)`), and values that change between replays must live in
//!   device tensors, not host scalars;
//! - random draws use the default CUDA generator, whose Philox offset advances on every replay,
//!   so each replay draws new numbers.
//!
//! The shim is built only against a CUDA torch wheel (build.rs sets `cfg(tdmpc2_cuda_graphs)`);
//! without it the same API exists and every call returns [`GraphError::NotBuilt`].
use std::mem::ManuallyDrop;
use std::panic::AssertUnwindSafe;
use std::sync::{Mutex, MutexGuard, PoisonError};

use tch::Device;

use super::generator::SharedGenerator;
use crate::error::panic_message;

#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    #[error("CUDA graphs are not built into this binary: {0}")]
    NotBuilt(&'static str),
    #[error("CUDA graphs need a CUDA GPU, and none is visible")]
    NoGpu,
    #[error("CUDA graphs run on a CUDA device, not {0:?}")]
    NotCuda(Device),
    #[error("CUDA graph {op}: {message}")]
    Cuda { op: &'static str, message: String },
    /// The call being captured (or warmed up) panicked: a torch error inside tch, typically.
    #[error("the call captured as a CUDA graph panicked: {0}")]
    CallPanicked(String),
}

/// Torch keeps the capture state of its CUDA generators on the host, shared by all threads:
/// every capture registers the default generator and marks it as capturing, and every replay
/// advances the generators its graph registered without a lock. So a draw, replay or capture
/// on one thread (a pipelined actor's) while another thread captures would be counted into
/// that capture instead of advancing the generator, and two replays could advance it at once:
/// the draws would depend on the threads' timing. Captures, replays and eager updates on CUDA
/// take turns through this lock (each replay holds it only while it is launched).
static GENERATOR_TURNS: Mutex<()> = Mutex::new(());

/// This thread's turn with torch's CUDA generators (see [`GENERATOR_TURNS`]): for work on
/// CUDA that draws from the default generator outside a graph while other threads may capture
/// or replay graphs.
pub fn generator_turn() -> MutexGuard<'static, ()> {
    GENERATOR_TURNS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// The shim is built and a CUDA GPU is visible.
pub fn cuda_graphs_available() -> bool {
    check_available().is_ok()
}

/// Why calls on `device` cannot run as CUDA graphs here, if they cannot: it is not a CUDA
/// device, or the build has no shim, or no GPU is visible.
pub fn why_no_graphs(device: Device) -> Option<String> {
    if !device.is_cuda() {
        return Some(format!("{device:?} is not CUDA; graphs run on CUDA only"));
    }
    check_available().err().map(|e| e.to_string())
}

fn check_available() -> Result<(), GraphError> {
    if imp::device_count()? == 0 {
        return Err(GraphError::NoGpu);
    }
    Ok(())
}

fn cuda_index(device: Device) -> Result<i64, GraphError> {
    match device {
        Device::Cuda(index) => Ok(index as i64),
        other => Err(GraphError::NotCuda(other)),
    }
}

/// Waits until every stream of `device` is idle.
pub fn synchronize(device: Device) -> Result<(), GraphError> {
    imp::synchronize(cuda_index(device)?)
}

/// A memory pool that several graphs capture into, so their intermediate buffers share memory.
/// Only sound when the graphs replay in the order they were captured, and one's outputs are
/// consumed before a later one overwrites them.
#[derive(Debug, Clone)]
pub struct GraphPool {
    id: (u64, u64),
}

impl GraphPool {
    pub fn new() -> Result<GraphPool, GraphError> {
        Ok(GraphPool {
            id: imp::pool_handle()?,
        })
    }
}

/// A captured graph; dropping it frees the graph and returns its memory to its pool.
pub struct CudaGraph {
    raw: imp::RawGraph,
    device: Device,
}

impl CudaGraph {
    /// Captures `f` on `device` and returns the graph with what the captured call returned (its
    /// static outputs).
    ///
    /// `f` first runs `warmup` times eagerly on the capture's side stream (a stream from torch's
    /// pool, current for this thread until the capture ends): libraries such as cuBLAS allocate
    /// workspaces on first use, which must not happen inside a capture. Two or three warm-up
    /// calls are usual; callers that warmed up on the same shapes themselves may pass 0. The
    /// whole device is synchronised before the warm-up and before the capture, and the side
    /// stream after it, so inputs prepared on the caller's stream are ready.
    ///
    /// Without a `pool` the graph gets a private memory pool. A capture holds the generators'
    /// turn ([`generator_turn`]) throughout, so other threads' replays and turns wait for it.
    ///
    /// A failed capture returns the error of the call (a panic inside it included) or of the
    /// capture. Torch may then leave its CUDA generators marked as capturing, so the process
    /// should not go on with CUDA work: the trainer ends the run.
    pub fn capture<T, E>(
        device: Device,
        pool: Option<&GraphPool>,
        warmup: usize,
        f: impl FnMut() -> Result<T, E>,
    ) -> Result<(CudaGraph, T), E>
    where
        E: From<GraphError>,
    {
        Self::capture_drawing_from(device, pool, warmup, &[], f)
    }

    /// [`Self::capture`] of a call that also draws from `generators` (besides torch's default
    /// generator): each replay advances them too, so their draws are new on every replay.
    pub fn capture_drawing_from<T, E>(
        device: Device,
        pool: Option<&GraphPool>,
        warmup: usize,
        generators: &[SharedGenerator],
        mut f: impl FnMut() -> Result<T, E>,
    ) -> Result<(CudaGraph, T), E>
    where
        E: From<GraphError>,
    {
        let index = cuda_index(device)?;
        check_available()?;
        let _turn = generator_turn();
        // Leaked unless the capture succeeds: after a failed capture torch's allocator may
        // still refer to the graph, so freeing it could leave a dangling pointer there.
        let raw = ManuallyDrop::new(imp::RawGraph::new(index)?);
        for generator in generators {
            let generator = generator.lock().unwrap_or_else(PoisonError::into_inner);
            if generator.device() != device {
                return Err(GraphError::NotCuda(generator.device()).into());
            }
            raw.register_generator(generator.raw())?;
        }
        // tch turns torch's errors into panics: inside a capture they are errors like any other.
        let mut call = || {
            std::panic::catch_unwind(AssertUnwindSafe(&mut f)).unwrap_or_else(|payload| {
                Err(GraphError::CallPanicked(panic_message(payload.as_ref())).into())
            })
        };
        let side = SideStream::enter(&raw)?;
        for _ in 0..warmup {
            call()?;
        }
        let capturing = Capturing::begin(&raw, pool.map_or((0, 0), |p| p.id))?;
        let outputs = call();
        let ended = capturing.end();
        let left = side.leave();
        // The call's own error explains a failed capture better than the failure it caused.
        let outputs = outputs?;
        ended?;
        left?;
        let raw = ManuallyDrop::into_inner(raw);
        Ok((CudaGraph { raw, device }, outputs))
    }

    /// Launches the graph on the current stream of its device (the default stream unless the
    /// caller set another); returns without waiting for it.
    pub fn replay(&self) -> Result<(), GraphError> {
        let _turn = generator_turn();
        self.raw.replay()
    }

    pub fn device(&self) -> Device {
        self.device
    }
}

/// The capture's side stream is current while this lives; the caller's stream comes back on
/// drop, also when `f` fails or panics.
struct SideStream<'a> {
    raw: &'a imp::RawGraph,
    active: bool,
}

impl<'a> SideStream<'a> {
    fn enter(raw: &'a imp::RawGraph) -> Result<SideStream<'a>, GraphError> {
        raw.enter_side_stream()?;
        Ok(SideStream { raw, active: true })
    }

    fn leave(mut self) -> Result<(), GraphError> {
        self.active = false;
        self.raw.leave_side_stream()
    }
}

impl Drop for SideStream<'_> {
    fn drop(&mut self) {
        if self.active {
            let _ = self.raw.leave_side_stream();
        }
    }
}

/// A capture in progress; ended on drop so that a failing or panicking `f` leaves no stream
/// capturing.
struct Capturing<'a> {
    raw: &'a imp::RawGraph,
    active: bool,
}

impl<'a> Capturing<'a> {
    fn begin(raw: &'a imp::RawGraph, pool: (u64, u64)) -> Result<Capturing<'a>, GraphError> {
        raw.capture_begin(pool)?;
        Ok(Capturing { raw, active: true })
    }

    fn end(mut self) -> Result<(), GraphError> {
        self.active = false;
        self.raw.capture_end()
    }
}

impl Drop for Capturing<'_> {
    fn drop(&mut self) {
        if self.active {
            let _ = self.raw.capture_end();
        }
    }
}

#[cfg(tdmpc2_cuda_graphs)]
pub(super) mod imp {
    use std::ffi::{c_char, CStr};
    use std::ptr::NonNull;

    use super::GraphError;

    #[repr(C)]
    struct Tdmpc2CudaGraph {
        _opaque: [u8; 0],
    }

    extern "C" {
        fn tdmpc2_cuda_free_error(message: *mut c_char);
        fn tdmpc2_cuda_device_count(out: *mut i64) -> *mut c_char;
        fn tdmpc2_cuda_synchronize(device: i64) -> *mut c_char;
        fn tdmpc2_cuda_graph_pool_handle(first: *mut u64, second: *mut u64) -> *mut c_char;
        fn tdmpc2_cuda_graph_new(device: i64, out: *mut *mut Tdmpc2CudaGraph) -> *mut c_char;
        fn tdmpc2_cuda_graph_delete(graph: *mut Tdmpc2CudaGraph);
        fn tdmpc2_cuda_graph_enter_side_stream(graph: *mut Tdmpc2CudaGraph) -> *mut c_char;
        fn tdmpc2_cuda_graph_leave_side_stream(graph: *mut Tdmpc2CudaGraph) -> *mut c_char;
        fn tdmpc2_cuda_graph_capture_begin(
            graph: *mut Tdmpc2CudaGraph,
            pool_first: u64,
            pool_second: u64,
        ) -> *mut c_char;
        fn tdmpc2_cuda_graph_capture_end(graph: *mut Tdmpc2CudaGraph) -> *mut c_char;
        fn tdmpc2_cuda_graph_replay(graph: *mut Tdmpc2CudaGraph) -> *mut c_char;
        fn tdmpc2_cuda_graph_register_generator(
            graph: *mut Tdmpc2CudaGraph,
            generator: *mut std::ffi::c_void,
        ) -> *mut c_char;
    }

    /// Turns the shim's returned message (null on success) into a result, freeing it.
    pub(in crate::cuda) fn check(op: &'static str, message: *mut c_char) -> Result<(), GraphError> {
        if message.is_null() {
            return Ok(());
        }
        // SAFETY: a non-null return is a NUL-terminated string the shim malloc'd for us.
        let text = unsafe { CStr::from_ptr(message) }
            .to_string_lossy()
            .trim()
            .to_string();
        unsafe { tdmpc2_cuda_free_error(message) };
        Err(GraphError::Cuda { op, message: text })
    }

    /// Runs a shim call that makes a new tensor into `out` and takes ownership of that tensor.
    pub(in crate::cuda) fn new_tensor(
        op: &'static str,
        call: impl FnOnce(*mut *mut std::ffi::c_void) -> *mut c_char,
    ) -> Result<tch::Tensor, GraphError> {
        let mut out = std::ptr::null_mut();
        check(op, call(&mut out))?;
        if out.is_null() {
            return Err(GraphError::Cuda {
                op,
                message: "the shim returned no tensor".into(),
            });
        }
        // SAFETY: the shim made a new at::Tensor for us to own, as tch's own calls do.
        Ok(unsafe { tch::Tensor::from_ptr(out as *mut _) })
    }

    pub fn device_count() -> Result<usize, GraphError> {
        let mut count = 0i64;
        check("device count", unsafe {
            tdmpc2_cuda_device_count(&mut count)
        })?;
        Ok(count.max(0) as usize)
    }

    pub fn synchronize(device: i64) -> Result<(), GraphError> {
        check("synchronize", unsafe { tdmpc2_cuda_synchronize(device) })
    }

    pub fn pool_handle() -> Result<(u64, u64), GraphError> {
        let (mut first, mut second) = (0u64, 0u64);
        check("pool handle", unsafe {
            tdmpc2_cuda_graph_pool_handle(&mut first, &mut second)
        })?;
        Ok((first, second))
    }

    pub struct RawGraph(NonNull<Tdmpc2CudaGraph>);

    // SAFETY: the shim's graph holds no thread-bound state; replay uses the calling thread's
    // current stream. It is not Sync: replays advance generator state without a lock.
    unsafe impl Send for RawGraph {}

    impl RawGraph {
        pub fn new(device: i64) -> Result<RawGraph, GraphError> {
            let mut raw = std::ptr::null_mut();
            check("create", unsafe { tdmpc2_cuda_graph_new(device, &mut raw) })?;
            NonNull::new(raw)
                .map(RawGraph)
                .ok_or_else(|| GraphError::Cuda {
                    op: "create",
                    message: "the shim returned no graph".into(),
                })
        }

        pub fn enter_side_stream(&self) -> Result<(), GraphError> {
            check("enter side stream", unsafe {
                tdmpc2_cuda_graph_enter_side_stream(self.0.as_ptr())
            })
        }

        pub fn leave_side_stream(&self) -> Result<(), GraphError> {
            check("leave side stream", unsafe {
                tdmpc2_cuda_graph_leave_side_stream(self.0.as_ptr())
            })
        }

        pub fn capture_begin(&self, pool: (u64, u64)) -> Result<(), GraphError> {
            check("capture begin", unsafe {
                tdmpc2_cuda_graph_capture_begin(self.0.as_ptr(), pool.0, pool.1)
            })
        }

        pub fn capture_end(&self) -> Result<(), GraphError> {
            check("capture end", unsafe {
                tdmpc2_cuda_graph_capture_end(self.0.as_ptr())
            })
        }

        pub fn replay(&self) -> Result<(), GraphError> {
            check("replay", unsafe {
                tdmpc2_cuda_graph_replay(self.0.as_ptr())
            })
        }

        /// `generator`: the shim's generator, alive for the call.
        pub fn register_generator(
            &self,
            generator: *mut std::ffi::c_void,
        ) -> Result<(), GraphError> {
            check("register generator", unsafe {
                tdmpc2_cuda_graph_register_generator(self.0.as_ptr(), generator)
            })
        }
    }

    impl Drop for RawGraph {
        fn drop(&mut self) {
            // Freeing a graph edits the list of graphs torch's generators keep: not while
            // another thread captures or replays.
            let _turn = super::generator_turn();
            unsafe { tdmpc2_cuda_graph_delete(self.0.as_ptr()) }
        }
    }
}

#[cfg(not(tdmpc2_cuda_graphs))]
pub(super) mod imp {
    use super::GraphError;

    pub(in crate::cuda) fn not_built() -> GraphError {
        GraphError::NotBuilt(env!("TDMPC2_CUDA_GRAPHS_MISSING"))
    }

    pub fn device_count() -> Result<usize, GraphError> {
        Err(not_built())
    }

    pub fn synchronize(_device: i64) -> Result<(), GraphError> {
        Err(not_built())
    }

    pub fn pool_handle() -> Result<(u64, u64), GraphError> {
        Err(not_built())
    }

    /// Never constructed: without the shim there is no graph.
    pub struct RawGraph(());

    impl RawGraph {
        pub fn new(_device: i64) -> Result<RawGraph, GraphError> {
            Err(not_built())
        }

        pub fn enter_side_stream(&self) -> Result<(), GraphError> {
            Err(not_built())
        }

        pub fn leave_side_stream(&self) -> Result<(), GraphError> {
            Err(not_built())
        }

        pub fn capture_begin(&self, _pool: (u64, u64)) -> Result<(), GraphError> {
            Err(not_built())
        }

        pub fn capture_end(&self) -> Result<(), GraphError> {
            Err(not_built())
        }

        pub fn replay(&self) -> Result<(), GraphError> {
            Err(not_built())
        }

        pub fn register_generator(
            &self,
            _generator: *mut std::ffi::c_void,
        ) -> Result<(), GraphError> {
            Err(not_built())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine has no GPU, or the binary has no shim.
    fn no_gpu_here() -> bool {
        !tch::Cuda::is_available()
    }

    #[test]
    fn without_a_gpu_capture_says_why() {
        if !no_gpu_here() {
            errln!("skipped: a CUDA GPU is visible; tests/cuda_graphs.rs covers it");
            return;
        }
        assert!(!cuda_graphs_available());
        let err = CudaGraph::capture(Device::Cuda(0), None, 1, || Ok::<_, GraphError>(()))
            .err()
            .expect("capture without a GPU must fail");
        let expected_built = cfg!(tdmpc2_cuda_graphs);
        match &err {
            GraphError::NoGpu => assert!(expected_built),
            GraphError::NotBuilt(reason) => {
                assert!(!expected_built);
                assert!(!reason.is_empty());
            }
            other => panic!("unexpected error: {other}"),
        }
        assert!(err.to_string().starts_with("CUDA graphs"), "{err}");
    }

    /// A shim that stops compiling against a CUDA wheel must not go unnoticed as a warning.
    #[test]
    fn a_cuda_wheel_gets_the_shim() {
        let cuda_wheel = env!("TDMPC2_TORCH_CUDA_WHEEL") == "1";
        assert!(
            cfg!(tdmpc2_cuda_graphs) || !cuda_wheel,
            "the torch wheel has CUDA, but the shim was left out (see the build warning)"
        );
    }

    #[test]
    fn a_cpu_device_is_refused() {
        let err = CudaGraph::capture(Device::Cpu, None, 0, || Ok::<_, GraphError>(()))
            .err()
            .expect("capture on the CPU must fail");
        assert!(matches!(err, GraphError::NotCuda(Device::Cpu)), "{err}");
        assert!(matches!(
            synchronize(Device::Cpu),
            Err(GraphError::NotCuda(Device::Cpu))
        ));
    }

    #[test]
    fn the_crate_error_names_graphs() {
        let err: crate::Error = GraphError::NoGpu.into();
        assert_eq!(
            err.to_string(),
            "CUDA graphs need a CUDA GPU, and none is visible"
        );
    }

    /// The shim turns torch's C++ exceptions into messages instead of unwinding into Rust.
    #[cfg(tdmpc2_cuda_graphs)]
    #[test]
    fn shim_errors_come_back_as_messages() {
        if !no_gpu_here() {
            errln!("skipped: a CUDA GPU is visible, so these calls would succeed");
            return;
        }
        assert_eq!(imp::device_count().expect("device count never fails"), 0);
        for (op, result) in [
            ("create", imp::RawGraph::new(0).map(drop)),
            ("synchronize", imp::synchronize(0)),
        ] {
            match result {
                Err(GraphError::Cuda { op: got, message }) => {
                    assert_eq!(got, op);
                    assert!(!message.is_empty(), "{op}: empty message");
                }
                other => panic!("{op} without a GPU: expected a CUDA error, got {other:?}"),
            }
        }
    }
}
