//! The process group: PyTorch's c10d through `torch.distributed` in the embedded interpreter
//! (gloo on CPU, nccl on CUDA, `env://` rendezvous). Tensors cross into Python without a copy:
//! the Python tensor shares the tch tensor's storage, so in-place collectives land in ours.
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use tch::Tensor;

use super::rank::RankInfo;
use crate::error::{Error, Result};

pub struct ProcessGroup {
    info: RankInfo,
    /// `torch.distributed`, present when world_size > 1.
    dist: Option<Py<PyModule>>,
}

impl ProcessGroup {
    /// Joins the group described by `info` (a single rank needs no group at all).
    pub fn init(info: RankInfo, backend: &str, timeout: Duration) -> Result<Self> {
        if info.world_size == 1 {
            return Ok(Self { info, dist: None });
        }
        let dist = envs::python::with_python(|py| {
            py.import("torch")?;
            let os = py.import("os")?;
            let environ = os.getattr("environ")?;
            environ.set_item("MASTER_ADDR", &info.master_addr)?;
            environ.set_item("MASTER_PORT", info.master_port.to_string())?;
            let dist = py.import("torch.distributed")?;
            let datetime = py.import("datetime")?;
            let kwargs = PyDict::new(py);
            kwargs.set_item("backend", backend)?;
            kwargs.set_item("init_method", "env://")?;
            kwargs.set_item("rank", info.rank)?;
            kwargs.set_item("world_size", info.world_size)?;
            let seconds = timeout.as_secs_f64();
            kwargs.set_item(
                "timeout",
                datetime.getattr("timedelta")?.call((0, seconds), None)?,
            )?;
            dist.call_method("init_process_group", (), Some(&kwargs))?;
            Ok(dist.unbind())
        })
        .map_err(|e| {
            Error::Other(format!(
                "cannot join the process group at {}:{} as rank {} of {} ({e}); check master_addr \
                 and master_port (is the port free and reachable?), or raise dist_timeout",
                info.master_addr, info.master_port, info.rank, info.world_size
            ))
        })?;
        Ok(Self {
            info,
            dist: Some(dist),
        })
    }

    /// The backend and the environment variables that tune it, as one line for the log.
    pub fn describe(backend: &str) -> String {
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

    /// Averages `tensor` in place across ranks (sum then divide: gloo has no AVG).
    pub fn all_reduce_mean(&self, tensor: &mut Tensor) -> Result<()> {
        let Some(dist) = &self.dist else {
            return Ok(());
        };
        call(dist, "all_reduce", tensor)?;
        let _ = tensor.divide_scalar_(self.info.world_size as f64);
        Ok(())
    }

    /// Sums `tensor` in place across ranks.
    pub fn all_reduce_sum(&self, tensor: &mut Tensor) -> Result<()> {
        let Some(dist) = &self.dist else {
            return Ok(());
        };
        call(dist, "all_reduce", tensor)
    }

    /// Overwrites `tensor` with rank 0's values.
    pub fn broadcast_from_root(&self, tensor: &mut Tensor) -> Result<()> {
        let Some(dist) = &self.dist else {
            return Ok(());
        };
        envs::python::with_python(|py| {
            let kwargs = PyDict::new(py);
            kwargs.set_item("src", 0)?;
            dist.bind(py)
                .call_method("broadcast", (to_python(py, tensor)?,), Some(&kwargs))?;
            Ok(())
        })
        .map_err(|e| collective_error("broadcast", e))
    }

    /// Concatenates every rank's `tensor` along dimension 0, in rank order.
    pub fn all_gather(&self, tensor: &Tensor) -> Result<Tensor> {
        let Some(dist) = &self.dist else {
            return Ok(tensor.shallow_clone());
        };
        let parts: Vec<Tensor> = (0..self.info.world_size)
            .map(|_| tensor.empty_like())
            .collect();
        envs::python::with_python(|py| {
            let list = PyList::empty(py);
            for part in &parts {
                list.append(to_python(py, part)?)?;
            }
            dist.bind(py)
                .call_method1("all_gather", (list, to_python(py, tensor)?))?;
            Ok(())
        })
        .map_err(|e| collective_error("all_gather", e))?;
        Ok(Tensor::cat(&parts, 0))
    }

    pub fn barrier(&self) -> Result<()> {
        let Some(dist) = &self.dist else {
            return Ok(());
        };
        envs::python::with_python(|py| dist.bind(py).call_method0("barrier").map(|_| ()))
            .map_err(|e| collective_error("barrier", e))
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if let Some(dist) = &self.dist {
            let _ = envs::python::with_python(|py| {
                dist.bind(py)
                    .call_method0("destroy_process_group")
                    .map(|_| ())
            });
        }
    }
}

fn call(dist: &Py<PyModule>, op: &str, tensor: &Tensor) -> Result<()> {
    envs::python::with_python(|py| {
        dist.bind(py).call_method1(op, (to_python(py, tensor)?,))?;
        Ok(())
    })
    .map_err(|e| collective_error(op, e))
}

fn collective_error(op: &str, e: envs::Error) -> Error {
    Error::Other(format!(
        "collective {op} failed ({e}); another rank probably stopped (see its output), or the \
         collective timed out (dist_timeout)"
    ))
}

/// Wraps a tch tensor as a `torch.Tensor` sharing its storage (torch must be imported).
fn to_python<'py>(py: Python<'py>, tensor: &Tensor) -> PyResult<Bound<'py, PyAny>> {
    let ptr = tensor
        .pyobject_wrap()
        .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))?;
    // SAFETY: THPVariable_Wrap returns a new reference to a valid Python object.
    unsafe { Bound::from_owned_ptr_or_err(py, ptr as *mut pyo3::ffi::PyObject) }
}
