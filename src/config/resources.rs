//! What the settings need of the machine: ranks against CPU cores, and a lower bound of a
//! rank's memory against RAM (or, on a GPU, a cap no GPU exceeds).
use super::Config;
use crate::buffer::ReplayBuffer;
use crate::error::{Error, Result};

/// Ranks per CPU core a node may run before `world_size` is refused on the CPU.
const OVERSUBSCRIPTION: usize = 4;

/// The memory a rank on a GPU may ask for: more than any GPU has, so only absurd settings
/// are refused up front (the device reports a real shortage when it allocates).
const GPU_MEMORY_CAP: f64 = 256.0 * (1u64 << 30) as f64;

/// The most ranks a node of `cores` CPU cores runs on the CPU (more are refused).
fn most_cpu_ranks(cores: usize) -> usize {
    OVERSUBSCRIPTION * cores
}

/// The most ranks this node runs on the CPU, as `world_size` is checked: the tools that start
/// ranks here take no more.
pub fn most_local_cpu_ranks() -> usize {
    most_cpu_ranks(Machine::this().cores)
}

/// The cores this process may run on (its affinity and CPU quota; 1 when unknown).
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A rank's threads: the setting, else its share of `cores` among the node's local ranks, at
/// least one.
pub fn share_of_cores(setting: Option<usize>, cores: usize, local_ranks: usize) -> usize {
    setting.unwrap_or_else(|| (cores / local_ranks.max(1)).max(1))
}

/// A pipelined rank's (acting, learning) threads out of `total`: `actor` when set (it must leave the learner at
/// least one), else half, each at least one.
pub fn split_threads(total: usize, actor: Option<usize>) -> Result<(usize, usize)> {
    match actor {
        Some(a) if a >= total && total > 1 => Err(Error::Config(format!(
            "actor_threads={a} leaves no thread to the learner: the rank has {total} \
             (num_threads, or cores / local ranks); use actor_threads <= {}",
            total - 1
        ))),
        Some(a) => Ok((a.max(1), total.saturating_sub(a).max(1))),
        None => {
            let actor = (total / 2).max(1);
            Ok((actor, total.saturating_sub(actor).max(1)))
        }
    }
}

/// What a part of a rank's memory is for, the keys that size it, and its bytes.
struct Footprint {
    what: &'static str,
    keys: String,
    bytes: f64,
}

/// What the resource checks compare against.
pub(super) struct Machine {
    pub(super) cores: usize,
    pub(super) memory_bytes: f64,
    /// Asked only when `device=auto` and a check depends on it.
    pub(super) cuda_available: fn() -> bool,
}

impl Machine {
    pub(super) fn this() -> Machine {
        // The node's CPUs, not the ones this process is bound to: a rank that srun bound to
        // one CPU resolves the same config as the launcher that has them all.
        // SAFETY: sysconf has no preconditions; a failure returns -1.
        let (pages, page_size, online) = unsafe {
            (
                libc::sysconf(libc::_SC_PHYS_PAGES),
                libc::sysconf(libc::_SC_PAGE_SIZE),
                libc::sysconf(libc::_SC_NPROCESSORS_ONLN),
            )
        };
        let memory_bytes = if pages > 0 && page_size > 0 {
            pages as f64 * page_size as f64
        } else {
            f64::INFINITY
        };
        Machine {
            cores: usize::try_from(online)
                .ok()
                .filter(|&n| n > 0)
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
            memory_bytes,
            cuda_available: tch::Cuda::is_available,
        }
    }
}

fn gib(bytes: f64) -> String {
    format!("{:.1} GiB", bytes / (1u64 << 30) as f64)
}

impl Config {
    /// What the settings need against what this machine has: ranks per node against CPU
    /// cores, and a lower bound of the memory per rank against RAM (or, on a GPU, a cap no GPU
    /// exceeds), so that an absurd size is refused here and not by an allocator mid-run.
    pub(super) fn check_resources(&self, machine: &Machine) -> Result<()> {
        let local_ranks = self.local_ranks();
        let placement = match self.ranks_on_this_node {
            Some(_) => "as this process runs".to_owned(),
            None => format!("world_size={} / nnodes={}", self.world_size, self.nnodes),
        };
        let who = match self.ranks_on_this_node {
            Some(_) => format!("{local_ranks} ranks run on this node"),
            None => format!(
                "world_size={} puts {local_ranks} ranks on each of nnodes={} node(s)",
                self.world_size, self.nnodes
            ),
        };
        let max_ranks = most_cpu_ranks(machine.cores);
        // Asked only when a check depends on it: probing CUDA starts its driver.
        if local_ranks > max_ranks && !self.runs_on_gpu(machine) {
            return Err(Error::Config(format!(
                "{who}, more than {OVERSUBSCRIPTION} per CPU core of this machine ({} cores) \
                 allow on the CPU; use world_size <= {} per node (num_threads sets each rank's \
                 threads, so fewer ranks still use every core)",
                machine.cores, max_ranks
            )));
        }
        let parts = self.footprint();
        let per_rank: f64 = parts.iter().map(|p| p.bytes).sum();
        let on_node = per_rank * local_ranks as f64;
        if on_node <= machine.memory_bytes && per_rank <= GPU_MEMORY_CAP {
            return Ok(());
        }
        let (need, have, place) = if self.runs_on_gpu(machine) {
            (
                per_rank,
                GPU_MEMORY_CAP,
                "a GPU (a cap above any GPU's memory)",
            )
        } else {
            (on_node, machine.memory_bytes, "this machine's memory")
        };
        if need > have {
            let largest = parts
                .iter()
                .max_by(|a, b| a.bytes.total_cmp(&b.bytes))
                .ok_or_else(|| Error::Other("no memory estimate".into()))?;
            return Err(Error::Config(format!(
                "these settings need at least {} per rank ({local_ranks} rank(s) on this node: \
                 {placement}), more than {place} ({}); {} ({}) alone needs {}",
                gib(per_rank),
                gib(have),
                largest.what,
                largest.keys,
                gib(largest.bytes)
            )));
        }
        Ok(())
    }

    /// Ranks on this node: as placed, else world_size / nnodes.
    fn local_ranks(&self) -> usize {
        self.ranks_on_this_node
            .unwrap_or(self.world_size / self.nnodes.max(1))
            .max(1)
    }

    /// A training run's `actor_threads` against the threads its ranks will have, split as a
    /// pipelined rank splits them: checked before a run (or a sweep's jobs) starts, with this
    /// node's cores (a rank bound to CPUs of its own checks again with those). Other commands
    /// build no pipeline.
    /// A training run's collectives: NCCL needs a GPU, which this machine may lack (refused
    /// here, before any rank starts; `eval` and `collect` form no group and take any backend).
    pub fn check_backend(&self) -> Result<()> {
        self.check_backend_on(&Machine::this())
    }

    pub(super) fn check_backend_on(&self, machine: &Machine) -> Result<()> {
        match self.dist_backend == "nccl" && !self.runs_on_gpu(machine) {
            true => Err(Error::Config(format!(
                "dist_backend=nccl needs a CUDA device, but device={} runs on the CPU here; use \
                 dist_backend=gloo (or auto), or device=cuda on a machine with a GPU",
                self.device
            ))),
            false => Ok(()),
        }
    }

    /// Whether the ranks run on a GPU: `device=auto` probes `machine` for one.
    fn runs_on_gpu(&self, machine: &Machine) -> bool {
        match self.device.as_str() {
            "cpu" => false,
            "auto" => (machine.cuda_available)(),
            _ => true,
        }
    }

    pub fn check_pipeline_threads(&self) -> Result<()> {
        self.check_pipeline_threads_on(&Machine::this())
    }

    fn check_pipeline_threads_on(&self, machine: &Machine) -> Result<()> {
        if !self.pipeline {
            return Ok(());
        }
        let threads = share_of_cores(self.num_threads, machine.cores, self.local_ranks());
        split_threads(threads, self.actor_threads).map(drop)
    }

    /// Numbers in an observation and in an action (0 before the task resolves them).
    fn observation_and_action_sizes(&self) -> (f64, f64) {
        let obs: usize = self.obs_shape.as_ref().map_or(0, |s| s.iter().product());
        (obs as f64, self.action_dim.unwrap_or(0) as f64)
    }

    /// The model's parameters: those trained, and those of the Q heads alone (which have
    /// target copies too).
    fn parameters(&self) -> (f64, f64) {
        let f = |v: usize| v as f64;
        let (obs, a) = self.observation_and_action_sizes();
        let (z, m, e, bins, q) = (
            f(self.latent_dim),
            f(self.mlp_dim),
            f(self.enc_dim),
            f(self.num_bins),
            f(self.num_q),
        );
        let hidden = f(self.num_enc_layers.saturating_sub(1).max(1));
        let encoder = match self.obs_kind() {
            // Four convolutions (7×7, 5×5, 3×3, 3×3) of num_channels filters each.
            Ok(envs::ObsKind::Rgb) => {
                let c = f(self.num_channels);
                let channels = obs / 4096.0;
                c * (49.0 * channels + (25.0 + 9.0 + 9.0) * c + 4.0)
            }
            _ => obs * e + (hidden - 1.0) * e * e + e * z,
        };
        let head = |inputs: f64, outputs: f64| inputs * m + m * m + m * outputs;
        let termination = if self.episodic { head(z, 1.0) } else { 0.0 };
        let q_heads = q * head(z + a, bins);
        let trainable =
            encoder + head(z + a, z) + head(z + a, bins) + termination + head(z, 2.0 * a) + q_heads;
        (trainable, q_heads)
    }

    /// A lower bound of the bytes one rank allocates, by what allocates them (32-bit floats).
    fn footprint(&self) -> [Footprint; 4] {
        let f = |v: usize| v as f64;
        let (obs, a) = self.observation_and_action_sizes();
        let (z, m, bins, q) = (
            f(self.latent_dim),
            f(self.mlp_dim),
            f(self.num_bins),
            f(self.num_q),
        );
        let (h, n, b) = (f(self.horizon), f(self.num_samples), f(self.batch_size));
        let (trainable, q_heads) = self.parameters();
        // Parameters, gradients and two Adam moments, and the target Q heads.
        let model = 4.0 * (4.0 * trainable + q_heads);
        // A rank plans for all its environments in one batch.
        let planning = 4.0 * f(self.num_envs) * n * (h * (z + a + m + bins) + q * (m + bins));
        let batch = 4.0 * b * (h + 1.0) * (obs + z + m + bins + q * (m + bins));
        let buffer = self.buffer_settings().map_or(0.0, |b| {
            b.capacity as f64 * ReplayBuffer::bytes_per_row(b.obs, b.action_dim) as f64
        });
        let model_keys = format!(
            "{}mlp_dim={}, latent_dim={}, enc_dim={}, num_enc_layers={}, num_q={}, num_bins={}",
            self.model_size
                .map_or(String::new(), |s| format!("model_size={s}: ")),
            self.mlp_dim,
            self.latent_dim,
            self.enc_dim,
            self.num_enc_layers,
            self.num_q,
            self.num_bins
        );
        [
            Footprint {
                what: "the model and its optimiser state",
                keys: model_keys,
                bytes: model,
            },
            Footprint {
                what: "planning",
                keys: format!(
                    "num_envs={}, num_samples={}, horizon={}, num_q={}",
                    self.num_envs, self.num_samples, self.horizon, self.num_q
                ),
                bytes: planning,
            },
            Footprint {
                what: "an update's batch",
                keys: format!(
                    "batch_size={}, horizon={}, num_q={}",
                    self.batch_size, self.horizon, self.num_q
                ),
                bytes: batch,
            },
            Footprint {
                what: "the replay buffer",
                keys: format!(
                    "buffer_size={} rows, or steps / world_size when fewer",
                    self.buffer_size
                ),
                bytes: buffer,
            },
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_split_between_acting_and_learning() {
        assert_eq!(split_threads(2, None).unwrap(), (1, 1));
        assert_eq!(split_threads(1, None).unwrap(), (1, 1));
        assert_eq!(split_threads(16, None).unwrap(), (8, 8));
        assert_eq!(split_threads(16, Some(4)).unwrap(), (4, 12));
        let err = split_threads(4, Some(4)).unwrap_err().to_string();
        assert!(
            err.contains("actor_threads=4") && err.contains("<= 3"),
            "{err}"
        );
        // Checked before a training run or a sweep's jobs start, with this node's cores.
        let mut c = Config::defaults().unwrap();
        (c.pipeline, c.actor_threads) = (true, Some(2));
        let two_cores = Machine {
            cores: 2,
            memory_bytes: 4e9,
            cuda_available: || false,
        };
        let e = c
            .check_pipeline_threads_on(&two_cores)
            .unwrap_err()
            .to_string();
        assert!(e.contains("actor_threads=2 leaves no thread"), "{e}");
        c.num_threads = Some(3);
        c.check_pipeline_threads_on(&two_cores).unwrap();
        c.pipeline = false;
        c.num_threads = None;
        c.check_pipeline_threads_on(&two_cores).unwrap();
    }
}
