//! The process group: PyTorch's c10d through `torch.distributed` in the embedded interpreter,
//! formed on the store the ranks met through ([`super::meeting`]). Tensors cross into Python without a copy: the Python tensor shares the
//! tch tensor's storage, so in-place collectives land in ours.
//!
//! The rule callers cannot break: every collective accepts CPU tensors and tensors on the rank's
//! device. Gloo serves both; NCCL is always joined device-keyed (`cpu:gloo,cuda:nccl`), so the
//! small host-side collectives (stop flag, readiness, evaluation) go through gloo beside it.
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use tch::{Device, Tensor};

use super::rank::RankInfo;
use super::watchdog::{self, Watchdog};
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
    /// Holds gloo's collectives to `dist_timeout`, counted while the job runs.
    watchdog: Option<Watchdog>,
}

impl ProcessGroup {
    /// A lone rank with no group: every collective leaves its tensor as it is.
    pub fn alone(info: RankInfo) -> Self {
        Self {
            info,
            dist: None,
            watchdog: None,
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
        let (watchdog, torch_timeout) = match backend {
            Backend::Gloo => (Some(Watchdog::start(timeout)?), watchdog::BEYOND_REACH),
            Backend::Nccl => (None, timeout),
        };
        let join = || init_process_group(&info, backend, store.as_ref(), torch_timeout);
        let dist = match &watchdog {
            Some(watchdog) => watchdog.watch("init_process_group", join),
            None => join(),
        }
        .map_err(|e| {
            Error::Collective(format!(
                "rank {} of {} cannot form the process group with the others at {}:{} ({}); \
                 raise dist_timeout if they are slow to start",
                info.rank,
                info.world_size,
                info.master_addr,
                info.master_port,
                embedded_python::message(&e.0)
            ))
        })?;
        Ok(Self {
            info,
            dist: Some((dist, backend)),
            watchdog,
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
        let Some((dist, _)) = &self.dist else {
            return Ok(());
        };
        self.watched("all_reduce", || call(dist, "all_reduce", tensor))?;
        let _ = tensor.divide_scalar_(self.info.world_size as f64);
        Ok(())
    }

    /// Sums `tensor` in place across ranks.
    pub fn all_reduce_sum(&self, tensor: &mut Tensor) -> Result<()> {
        let Some((dist, _)) = &self.dist else {
            return Ok(());
        };
        self.watched("all_reduce", || call(dist, "all_reduce", tensor))
    }

    /// Overwrites `tensor` with rank 0's values.
    pub fn broadcast_from_root(&self, tensor: &mut Tensor) -> Result<()> {
        let Some((dist, _)) = &self.dist else {
            return Ok(());
        };
        let broadcast = || {
            embedded_python::with_python(|py| {
                let kwargs = PyDict::new(py);
                kwargs.set_item("src", 0)?;
                dist.bind(py)
                    .call_method("broadcast", (to_python(py, tensor)?,), Some(&kwargs))?;
                Ok(())
            })
        };
        self.watched("broadcast", broadcast)
            .map_err(|e| collective_error("broadcast", e))
    }

    /// Concatenates every rank's `tensor` along dimension 0, in rank order.
    pub fn all_gather(&self, tensor: &Tensor) -> Result<Tensor> {
        let Some((dist, _)) = &self.dist else {
            return Ok(tensor.shallow_clone());
        };
        let parts: Vec<Tensor> = (0..self.info.world_size)
            .map(|_| tensor.empty_like())
            .collect();
        let all_gather = || {
            embedded_python::with_python(|py| {
                let list = PyList::empty(py);
                for part in &parts {
                    list.append(to_python(py, part)?)?;
                }
                dist.bind(py)
                    .call_method1("all_gather", (list, to_python(py, tensor)?))?;
                Ok(())
            })
        };
        self.watched("all_gather", all_gather)
            .map_err(|e| collective_error("all_gather", e))?;
        Ok(Tensor::cat(&parts, 0))
    }

    pub fn barrier(&self) -> Result<()> {
        let Some((dist, _)) = &self.dist else {
            return Ok(());
        };
        let barrier =
            || embedded_python::with_python(|py| dist.bind(py).call_method0("barrier").map(|_| ()));
        self.watched("barrier", barrier)
            .map_err(|e| collective_error("barrier", e))
    }

    /// Runs the collective `op` under the watchdog, when gloo carries it.
    fn watched<T>(&self, op: &'static str, call: impl FnOnce() -> T) -> T {
        match &self.watchdog {
            Some(watchdog) => watchdog.watch(op, call),
            None => call(),
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
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
/// torchrun), its collectives waiting at most `timeout`.
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
        Ok(dist.unbind())
    })
}

fn call(dist: &Py<PyModule>, op: &str, tensor: &Tensor) -> Result<()> {
    embedded_python::with_python(|py| {
        dist.bind(py).call_method1(op, (to_python(py, tensor)?,))?;
        Ok(())
    })
    .map_err(|e| collective_error(op, e))
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
