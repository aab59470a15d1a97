//! The process group: PyTorch's c10d through `torch.distributed` in the embedded interpreter,
//! formed on the store the ranks met through ([`super::meeting`]). Tensors cross into Python without a copy: the Python tensor shares the
//! tch tensor's storage, so in-place collectives land in ours.
//!
//! The rule callers cannot break: every collective accepts CPU tensors and tensors on the rank's
//! device. Gloo serves both; NCCL is always joined device-keyed (`cpu:gloo,cuda:nccl`), so the
//! small host-side collectives (stop flag, readiness, evaluation) go through gloo beside it.
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use envs::deadline::Deadline;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use tch::{Device, Tensor};

use super::rank::RankInfo;
use crate::error::{Error, Result};

/// Which c10d backend carries the collectives (`dist_backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Gloo for every tensor, CPU or CUDA (how two ranks share one GPU).
    Gloo,
    /// NCCL for CUDA tensors, with gloo beside it for CPU tensors.
    Nccl,
}

impl Backend {
    /// The backend for `setting` on `device`: `auto` is NCCL on CUDA and gloo on CPU.
    pub fn choose(setting: &str, device: Device) -> Result<Self> {
        match (setting, device.is_cuda()) {
            ("gloo", _) | ("auto", false) => Ok(Self::Gloo),
            ("nccl", true) | ("auto", true) => Ok(Self::Nccl),
            ("nccl", false) => Err(Error::Config(
                "dist_backend=nccl needs a CUDA device, but this rank runs on the CPU; use \
                 dist_backend=gloo (or auto), or device=cuda"
                    .into(),
            )),
            (other, _) => Err(Error::Config(format!(
                "dist_backend={other} is not a backend; allowed: {}",
                crate::config::DIST_BACKENDS.join(", ")
            ))),
        }
    }

    /// The `backend` argument of `init_process_group`.
    pub fn torch_name(self) -> &'static str {
        match self {
            Self::Gloo => "gloo",
            Self::Nccl => "cpu:gloo,cuda:nccl",
        }
    }
}

/// How a rank joins the process group, taken once from the config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSettings {
    /// `dist_backend`: auto, gloo or nccl.
    pub backend: String,
    /// How long a collective waits for the other ranks (`dist_timeout`).
    pub timeout: Duration,
    /// A real group even with one rank (`dist_force_group`).
    pub force_group: bool,
}

impl GroupSettings {
    pub fn from_config(config: &crate::config::Config) -> Self {
        Self {
            backend: config.dist_backend.clone(),
            timeout: Duration::from_secs(config.dist_timeout),
            force_group: config.dist_force_group,
        }
    }

    /// Forms the group of `rank` on `device`; returns it with the backend it chose. A stop
    /// asked meanwhile (`stop_asked`) ends the wait for the other ranks.
    pub fn join(
        &self,
        rank: RankInfo,
        device: Device,
        stop_asked: fn() -> bool,
    ) -> Result<(ProcessGroup, Backend)> {
        let backend = Backend::choose(&self.backend, device)?;
        let group = ProcessGroup::init(
            rank,
            backend,
            device,
            self.timeout,
            self.force_group,
            stop_asked,
        )?;
        Ok((group, backend))
    }
}

pub struct ProcessGroup {
    info: RankInfo,
    /// `torch.distributed`, present when there is a real group, and its backend.
    dist: Option<(Py<PyModule>, Backend)>,
    /// How long a collective waits for the other ranks (`dist_timeout`).
    timeout: Duration,
    /// A collective timed out and gloo still waits in it: the group is left as it is at exit
    /// (destroying it would join gloo's thread, which waits on).
    abandoned: AtomicBool,
}

impl ProcessGroup {
    /// A lone rank with no group: every collective leaves its tensor as it is.
    pub fn alone(info: RankInfo) -> Self {
        Self {
            info,
            dist: None,
            timeout: Duration::ZERO,
            abandoned: AtomicBool::new(false),
        }
    }

    /// The backend of a real group; `None` for a lone rank.
    pub fn backend(&self) -> Option<Backend> {
        self.dist.as_ref().map(|(_, backend)| *backend)
    }

    /// Joins the group described by `info` for collectives on `device`. A single rank needs
    /// no group unless `force` asks for one (to run the real collectives with one rank).
    /// `stop_asked` ends the wait for the other ranks early (see [`super::meeting`]).
    pub fn init(
        info: RankInfo,
        backend: Backend,
        device: Device,
        timeout: Duration,
        force: bool,
        stop_asked: fn() -> bool,
    ) -> Result<Self> {
        if info.world_size == 1 && !force {
            return Ok(Self::alone(info));
        }
        if let Device::Cuda(index) = device {
            // NCCL's communicators bind to the current device.
            embedded_python::with_python(|py| {
                py.import("torch")?
                    .getattr("cuda")?
                    .call_method1("set_device", (index,))?;
                Ok(())
            })?;
        }
        let store = super::meeting::meet(&info, timeout, stop_asked)?;
        let dist = init_process_group(&info, backend, store.as_ref(), timeout).map_err(|e| {
            // A stop asked meanwhile took the store's host down: not a rank slow to start.
            if stop_asked() {
                return super::meeting::stopped(&info);
            }
            Error::Collective(format!(
                "rank {} of {} cannot form the process group with the others at {}:{} ({}); \
                 raise dist_timeout if they are slow to start",
                info.rank,
                info.world_size,
                info.master_addr,
                info.master_port,
                super::meeting::without_frames(&e.0)
            ))
        })?;
        Ok(Self {
            info,
            dist: Some((dist, backend)),
            timeout,
            abandoned: AtomicBool::new(false),
        })
    }

    /// The backend and the environment variables that tune it, as one line for the log.
    pub fn describe(backend: Backend) -> String {
        let backend = backend.torch_name();
        let mut settings: Vec<String> = std::env::vars()
            .filter(|(k, _)| {
                ["NCCL_", "TORCH_NCCL_", "GLOO_"]
                    .iter()
                    .any(|p| k.starts_with(p))
            })
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        settings.sort();
        if settings.is_empty() {
            format!(
                "collectives: {backend}; no NCCL_*/TORCH_NCCL_*/GLOO_* settings in the environment"
            )
        } else {
            format!("collectives: {backend}; settings: {}", settings.join(" "))
        }
    }

    pub fn info(&self) -> &RankInfo {
        &self.info
    }

    pub fn rank(&self) -> usize {
        self.info.rank
    }

    pub fn world_size(&self) -> usize {
        self.info.world_size
    }

    /// Whether collectives really run (several ranks, or one rank in a forced group).
    pub fn is_real(&self) -> bool {
        self.dist.is_some()
    }

    /// Averages `tensor` in place across ranks (sum then divide: gloo has no AVG).
    pub fn all_reduce_mean(&self, tensor: &mut Tensor) -> Result<()> {
        self.all_reduce_sum(tensor)?;
        if self.is_real() {
            let _ = tensor.divide_scalar_(self.info.world_size as f64);
        }
        Ok(())
    }

    /// Sums `tensor` in place across ranks.
    pub fn all_reduce_sum(&self, tensor: &mut Tensor) -> Result<()> {
        self.collective("all_reduce", |py| {
            Ok((PyTuple::new(py, [to_python(py, tensor)?])?, PyDict::new(py)))
        })
    }

    /// Overwrites `tensor` with rank 0's values.
    pub fn broadcast_from_root(&self, tensor: &mut Tensor) -> Result<()> {
        self.collective("broadcast", |py| {
            let kwargs = PyDict::new(py);
            kwargs.set_item("src", 0)?;
            Ok((PyTuple::new(py, [to_python(py, tensor)?])?, kwargs))
        })
    }

    /// Concatenates every rank's `tensor` along dimension 0, in rank order.
    pub fn all_gather(&self, tensor: &Tensor) -> Result<Tensor> {
        if !self.is_real() {
            return Ok(tensor.shallow_clone());
        }
        let parts: Vec<Tensor> = (0..self.info.world_size)
            .map(|_| tensor.empty_like())
            .collect();
        self.collective("all_gather", |py| {
            let list = PyList::empty(py);
            for part in &parts {
                list.append(to_python(py, part)?)?;
            }
            let args = PyTuple::new(py, [list.into_any(), to_python(py, tensor)?])?;
            Ok((args, PyDict::new(py)))
        })?;
        Ok(Tensor::cat(&parts, 0))
    }

    pub fn barrier(&self) -> Result<()> {
        self.collective("barrier", |py| Ok((PyTuple::empty(py), PyDict::new(py))))
    }

    /// Runs `torch.distributed.<op>` on the arguments `args` makes, and waits for it. Over
    /// gloo it runs asynchronously and is waited for in slices, up to `dist_timeout` counted
    /// while the job runs (see [`GLOO_OWN_TIMEOUT`]).
    fn collective(
        &self,
        op: &'static str,
        args: impl for<'py> FnOnce(Python<'py>) -> PyResult<(Bound<'py, PyTuple>, Bound<'py, PyDict>)>,
    ) -> Result<()> {
        let Some((dist, backend)) = &self.dist else {
            return Ok(());
        };
        let waits_here = *backend == Backend::Gloo;
        let deadline = Deadline::after(self.timeout);
        let work = embedded_python::with_python(|py| {
            let (args, kwargs) = args(py)?;
            kwargs.set_item("async_op", waits_here)?;
            Ok(dist.bind(py).call_method(op, args, Some(&kwargs))?.unbind())
        })
        .map_err(|e| collective_error(op, e))?;
        if !waits_here {
            return Ok(());
        }
        loop {
            let done = embedded_python::with_python(|py| {
                let work = work.bind(py);
                let kwargs = PyDict::new(py);
                let slice = py.import("datetime")?.getattr("timedelta")?.call1((0, 1))?;
                kwargs.set_item("timeout", slice)?;
                // torch raises the same for a slice that ended and for a collective that
                // failed; a completed one's own wait (at once) says which it was.
                if work.call_method("wait", (), Some(&kwargs)).is_ok() {
                    return Ok(true);
                }
                if !work.call_method0("is_completed")?.extract::<bool>()? {
                    return Ok(false);
                }
                work.call_method0("wait")?;
                Ok(true)
            })
            .map_err(|e| collective_error(op, e))?;
            if done {
                return Ok(());
            }
            if deadline.passed() {
                self.abandoned.store(true, Ordering::SeqCst);
                return Err(timed_out(op, self.timeout));
            }
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if self.abandoned.load(Ordering::SeqCst) {
            return;
        }
        if let Some((dist, _)) = &self.dist {
            let _ = embedded_python::with_python(|py| {
                dist.bind(py)
                    .call_method0("destroy_process_group")
                    .map(|_| ())
            });
        }
    }
}

/// `torch.distributed.init_process_group` on the store the ranks met through (`env://` under
/// torchrun), forming within `timeout` (`dist_timeout`); then gloo's own limit is put out of
/// reach ([`GLOO_OWN_TIMEOUT`]).
fn init_process_group(
    info: &RankInfo,
    backend: Backend,
    store: Option<&Py<PyAny>>,
    timeout: Duration,
) -> embedded_python::Result<Py<PyModule>> {
    embedded_python::with_python(|py| {
        let dist = py.import("torch.distributed")?;
        let timedelta = py.import("datetime")?.getattr("timedelta")?;
        let timeout = timedelta.call((0, timeout.as_secs_f64()), None)?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("backend", backend.torch_name())?;
        match store {
            Some(store) => {
                store.bind(py).call_method1("set_timeout", (&timeout,))?;
                kwargs.set_item("store", store.bind(py))?
            }
            None => {
                let environ = py.import("os")?.getattr("environ")?;
                environ.set_item("MASTER_ADDR", &info.master_addr)?;
                environ.set_item("MASTER_PORT", info.master_port.to_string())?;
                kwargs.set_item("init_method", "env://")?;
            }
        }
        kwargs.set_item("rank", info.rank)?;
        kwargs.set_item("world_size", info.world_size)?;
        kwargs.set_item("timeout", timeout)?;
        dist.call_method("init_process_group", (), Some(&kwargs))?;
        if backend == Backend::Gloo {
            let out_of_reach = timedelta.call((0, GLOO_OWN_TIMEOUT.as_secs_f64()), None)?;
            dist.getattr("distributed_c10d")?
                .call_method1("_set_pg_timeout", (out_of_reach,))?;
        }
        Ok(dist.unbind())
    })
}

fn collective_error(op: &str, e: embedded_python::Error) -> Error {
    Error::Collective(format!(
        "collective {op} failed ({e}); {}",
        likely_cause(&e.0)
    ))
}

/// What a failed collective most likely means, from what the backend said.
fn likely_cause(said: &str) -> &'static str {
    if said.contains("Duplicate GPU detected") {
        // A launcher showed several of a node's ranks the same single GPU (e.g. srun tasks
        // sharing one GPU without --gpus-per-task): each took it as its own.
        return "two ranks of one node are on the same GPU, which NCCL refuses: give each rank \
                a GPU of its own (srun --gpus-per-task=1, or CUDA_VISIBLE_DEVICES listing one \
                GPU per local rank), or set dist_backend=gloo to let ranks share GPUs";
    }
    PEER_PROBABLY_STOPPED
}

/// Gloo's own limit on a collective, 20 days: out of reach. Gloo fixes an operation's deadline
/// when it starts and counts a stop of the job (Ctrl-Z, a scheduler's suspension) as time
/// waited, so every rank waiting on another when the job was stopped for longer than
/// `dist_timeout` would fail the moment it continued, before the other had run. The ranks wait
/// for gloo's collectives themselves instead ([`ProcessGroup::collective`]). NCCL keeps its own
/// limit: its collectives return to the host before they complete, so only its watchdog sees
/// them wait. (Below 2^31 ms, which c10d's polls take as an `int`.)
const GLOO_OWN_TIMEOUT: Duration = Duration::from_secs(20 * 24 * 3600);

fn timed_out(op: &str, limit: Duration) -> Error {
    Error::Collective(format!(
        "collective {op} waited {} s for the other ranks while the job ran (dist_timeout); \
         {PEER_PROBABLY_STOPPED}",
        limit.as_secs()
    ))
}

/// How a rank says that its collective failed because another rank likely stopped: a failure
/// that follows from another, which its launcher does not name as the job's cause.
pub const PEER_PROBABLY_STOPPED: &str =
    "another rank probably stopped (see its output), or the collective timed out (dist_timeout)";

/// Wraps a tch tensor as a `torch.Tensor` sharing its storage (torch must be imported).
fn to_python<'py>(py: Python<'py>, tensor: &Tensor) -> PyResult<Bound<'py, PyAny>> {
    let ptr = tensor
        .pyobject_wrap()
        .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))?;
    // SAFETY: THPVariable_Wrap returns a new reference to a valid Python object.
    unsafe { Bound::from_owned_ptr_or_err(py, ptr as *mut pyo3::ffi::PyObject) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_shared_by_two_nccl_ranks_is_named() {
        let nccl = "DistBackendError: NCCL error: invalid usage, NCCL version 2.27.3\n\
                    Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1b000";
        assert!(likely_cause(nccl).contains("same GPU"));
        assert!(likely_cause("Connection closed by peer").contains("another rank"));
    }

    #[test]
    fn backend_follows_the_setting_and_the_device() {
        let cuda = Device::Cuda(0);
        assert_eq!(Backend::choose("auto", Device::Cpu).unwrap(), Backend::Gloo);
        assert_eq!(Backend::choose("auto", cuda).unwrap(), Backend::Nccl);
        assert_eq!(Backend::choose("gloo", cuda).unwrap(), Backend::Gloo);
        assert_eq!(Backend::choose("nccl", cuda).unwrap(), Backend::Nccl);
        let e = Backend::choose("nccl", Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(e.contains("dist_backend=nccl") && e.contains("gloo"), "{e}");
        let e = Backend::choose("mpi", cuda).unwrap_err().to_string();
        assert!(
            e.contains("dist_backend=mpi") && e.contains("auto, gloo, nccl"),
            "{e}"
        );
    }

    #[test]
    fn nccl_always_has_gloo_beside_it_for_cpu_tensors() {
        assert_eq!(Backend::Nccl.torch_name(), "cpu:gloo,cuda:nccl");
        assert_eq!(Backend::Gloo.torch_name(), "gloo");
    }
}
