//! Which device and how many CPU threads a rank uses.
use pyo3::prelude::*;
use tch::Device;

use crate::ddp::RankInfo;
use crate::error::{Error, Result};

pub use crate::config::cores;

/// `device=auto|cpu|cuda|cuda:N`: on cuda, local rank r takes visible GPU r, unless the
/// scheduler shows each task only its own GPU (`srun --gpus-per-task=1`), which is then GPU 0.
/// With `share_gpus` (collectives over gloo, which unlike NCCL lets ranks share a GPU) more
/// local ranks than GPUs take them in turn: rank r takes GPU r mod the visible count.
pub fn select(setting: &str, rank: &RankInfo, share_gpus: bool) -> Result<Device> {
    let visible = tch::Cuda::device_count() as usize;
    choose(setting, rank, visible, gpu_bound_per_task(), share_gpus)
}

/// Whether `local_ranks` ranks of a node could each take a device with `visible` GPUs, as
/// [`select`] decides it (a sweep's check of its jobs before any starts).
pub fn ranks_fit(setting: &str, local_ranks: usize, visible: usize, share_gpus: bool) -> bool {
    let last = RankInfo {
        rank: local_ranks.saturating_sub(1),
        world_size: local_ranks,
        local_rank: local_ranks.saturating_sub(1),
        local_world_size: local_ranks,
        master_addr: String::new(),
        master_port: 0,
        own_cpus: None,
    };
    choose(setting, &last, visible, false, share_gpus).is_ok()
}

/// SLURM bound one GPU to this task: it sees exactly one, and srun started it.
fn gpu_bound_per_task() -> bool {
    let one_visible = std::env::var("CUDA_VISIBLE_DEVICES")
        .map(|v| !v.is_empty() && !v.contains(','))
        .unwrap_or(false);
    one_visible && std::env::var_os("SLURM_LOCALID").is_some()
}

fn choose(
    setting: &str,
    rank: &RankInfo,
    visible: usize,
    bound_per_task: bool,
    share_gpus: bool,
) -> Result<Device> {
    let wants_cuda = match setting {
        "cpu" => return Ok(Device::Cpu),
        "auto" => visible > 0,
        _ => true,
    };
    if !wants_cuda {
        return Ok(Device::Cpu);
    }
    if let Some(index) = setting.strip_prefix("cuda:") {
        let index: usize = index
            .parse()
            .map_err(|_| Error::Config(format!("device={setting}: expected cuda:<index>")))?;
        if index >= visible {
            return Err(Error::Config(format!(
                "device={setting}, but only {visible} GPU(s) are visible (CUDA_VISIBLE_DEVICES={})",
                visible_devices()
            )));
        }
        // Every local rank would take that one GPU, which NCCL refuses (unless the scheduler
        // shows each task only its own).
        if rank.local_world_size > 1 && !share_gpus && !bound_per_task {
            return Err(Error::Config(format!(
                "device={setting} with {} local ranks puts them all on GPU {index}: use \
                 device=cuda (local rank r takes GPU r), or dist_backend=gloo to let ranks \
                 share GPUs",
                rank.local_world_size
            )));
        }
        return Ok(Device::Cuda(index));
    }
    if bound_per_task && visible == 1 {
        return Ok(Device::Cuda(0));
    }
    if share_gpus && visible > 0 {
        return Ok(Device::Cuda(rank.local_rank % visible));
    }
    if rank.local_world_size > visible {
        return Err(Error::Config(format!(
            "device={setting} with {} local ranks, but {visible} GPU(s) are visible \
             (CUDA_VISIBLE_DEVICES={}); lower world_size, use device=cpu, or \
             dist_backend=gloo to let ranks share GPUs",
            rank.local_world_size,
            visible_devices()
        )));
    }
    Ok(Device::Cuda(rank.local_rank))
}

/// Threads per rank: the setting, else this machine's cores shared among the local ranks.
pub fn threads(setting: Option<usize>, local_ranks: usize) -> usize {
    crate::config::share_of_cores(setting, cores(), local_ranks)
}

/// A rank's threads: the setting; else the CPUs its launcher allotted to it alone, at most the
/// cores it may run on (an srun task bound to its CPUs already sees only its own: sharing them
/// again among the node's ranks would leave most idle); else its share of the node's cores.
pub fn rank_threads(setting: Option<usize>, rank: &RankInfo) -> usize {
    match (setting, rank.own_cpus) {
        (None, Some(own)) => own.min(cores()).max(1),
        _ => threads(setting, rank.local_world_size),
    }
}

/// TF32 matmuls and cudnn's autotuner on CUDA, as the official code sets them (matmul
/// precision "high"; convolutions keep torch's default, TF32); `tf32=false` keeps full float32,
/// convolutions included. Set through the embedded torch, which shares its libtorch (and so
/// these global flags) with tch. Nothing changes on the CPU.
pub fn set_tf32(device: Device, on: bool) -> Result<()> {
    if !device.is_cuda() {
        return Ok(());
    }
    embedded_python::with_python(|py| {
        let torch = py.import("torch")?;
        let precision = if on { "high" } else { "highest" };
        torch.call_method1("set_float32_matmul_precision", (precision,))?;
        let cudnn = torch.getattr("backends")?.getattr("cudnn")?;
        cudnn.setattr("benchmark", on)?;
        cudnn.setattr("allow_tf32", on)?;
        Ok(())
    })
    .map_err(|e| Error::Other(format!("cannot set tf32={on}: {e}")))
}

fn visible_devices() -> String {
    std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "<unset>".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(local_rank: usize, local_world_size: usize) -> RankInfo {
        RankInfo {
            rank: local_rank,
            world_size: local_world_size,
            local_rank,
            local_world_size,
            master_addr: "127.0.0.1".into(),
            master_port: 12355,
            own_cpus: None,
        }
    }

    /// The flags are global torch state: set, read back, and left at torch's defaults.
    #[test]
    fn tf32_off_keeps_convolutions_in_float32_too_and_the_cpu_changes_nothing() {
        let flags = || {
            embedded_python::with_python(|py| {
                let torch = py.import("torch")?;
                let cudnn = torch.getattr("backends")?.getattr("cudnn")?;
                let precision: String = torch
                    .call_method0("get_float32_matmul_precision")?
                    .extract()?;
                let benchmark: bool = cudnn.getattr("benchmark")?.extract()?;
                let conv_tf32: bool = cudnn.getattr("allow_tf32")?.extract()?;
                Ok((precision, benchmark, conv_tf32))
            })
            .unwrap()
        };
        // Never "high": other tests of this process may be multiplying on the CPU meanwhile.
        set_tf32(Device::Cuda(0), false).unwrap();
        assert_eq!(flags(), ("highest".into(), false, false));
        set_tf32(Device::Cpu, true).unwrap();
        assert_eq!(
            flags(),
            ("highest".into(), false, false),
            "the CPU changes nothing"
        );
        embedded_python::with_python(|py| {
            let cudnn = py.import("torch")?.getattr("backends")?.getattr("cudnn")?;
            cudnn.setattr("allow_tf32", true)
        })
        .unwrap();
    }

    #[test]
    fn cpu_and_auto_without_gpus() {
        assert_eq!(select("cpu", &rank(1, 2), false).unwrap(), Device::Cpu);
        if tch::Cuda::device_count() == 0 {
            assert_eq!(select("auto", &rank(1, 2), true).unwrap(), Device::Cpu);
            let e = select("cuda", &rank(0, 2), true).unwrap_err().to_string();
            assert!(
                e.contains("2 local ranks") && e.contains("CUDA_VISIBLE_DEVICES"),
                "{e}"
            );
        }
    }

    #[test]
    fn local_rank_takes_its_gpu_and_too_few_gpus_is_an_error() {
        assert_eq!(
            choose("cuda", &rank(3, 4), 4, false, false).unwrap(),
            Device::Cuda(3)
        );
        assert_eq!(
            choose("auto", &rank(1, 2), 2, false, false).unwrap(),
            Device::Cuda(1)
        );
        assert_eq!(
            choose("auto", &rank(1, 2), 0, false, false).unwrap(),
            Device::Cpu
        );
        let e = choose("cuda", &rank(0, 8), 4, false, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("8 local ranks") && e.contains("4 GPU(s)"), "{e}");
        let e = choose("cuda:2", &rank(0, 1), 2, false, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("device=cuda:2") && e.contains("only 2"), "{e}");
        let e = choose("cuda:x", &rank(0, 1), 2, false, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("cuda:<index>"), "{e}");
        // One GPU named for several local ranks: all on it, which only gloo allows.
        let e = choose("cuda:1", &rank(1, 2), 2, false, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("2 local ranks puts them all on GPU 1"), "{e}");
        assert_eq!(
            choose("cuda:1", &rank(1, 2), 2, false, true).unwrap(),
            Device::Cuda(1)
        );
        assert_eq!(
            choose("cuda:0", &rank(1, 2), 1, true, false).unwrap(),
            Device::Cuda(0),
            "srun --gpus-per-task=1: each task's own GPU is its cuda:0"
        );
    }

    #[test]
    fn ranks_share_gpus_in_turn_over_gloo() {
        assert_eq!(
            choose("cuda", &rank(1, 2), 1, false, true).unwrap(),
            Device::Cuda(0)
        );
        assert_eq!(
            choose("auto", &rank(3, 4), 2, false, true).unwrap(),
            Device::Cuda(1)
        );
        assert_eq!(
            choose("auto", &rank(1, 2), 0, false, true).unwrap(),
            Device::Cpu
        );
        let e = choose("cuda", &rank(1, 2), 1, false, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("dist_backend=gloo"), "{e}");
    }

    #[test]
    fn a_gpu_bound_per_task_is_gpu_zero() {
        assert_eq!(
            choose("cuda", &rank(3, 4), 1, true, false).unwrap(),
            Device::Cuda(0)
        );
        // Bound per task but seeing several: the local rank indexes them as usual.
        assert_eq!(
            choose("cuda", &rank(1, 4), 4, true, false).unwrap(),
            Device::Cuda(1)
        );
        assert!(choose("cuda", &rank(3, 4), 1, false, false).is_err());
    }

    #[test]
    fn threads_share_the_cores() {
        assert_eq!(threads(Some(3), 8), 3);
        assert!(threads(None, 1) >= 1);
        assert_eq!(threads(None, 10_000), 1);
    }

    /// An srun task with `--cpus-per-task` takes its own CPUs (no more than it may run on),
    /// never a share of them; a setting still wins.
    #[test]
    fn a_rank_with_cpus_of_its_own_keeps_them() {
        let own = |n| RankInfo {
            own_cpus: Some(n),
            ..rank(0, 4)
        };
        assert_eq!(rank_threads(None, &own(1)), 1);
        assert_eq!(rank_threads(None, &own(usize::MAX)), cores());
        assert_eq!(rank_threads(Some(3), &own(8)), 3);
        assert_eq!(rank_threads(None, &rank(0, 4)), threads(None, 4));
    }
}
