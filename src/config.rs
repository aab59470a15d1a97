//! The run configuration: official TD-MPC2 names and defaults (configs/config.yaml), hydra-style
//! overrides, validation, and the fields derived from the task.
use serde::{Deserialize, Serialize};

/// Every setting of a run. Field names follow the official TD-MPC2 config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    // environment
    pub task: String,
    pub obs: String,
    pub episodic: bool,
    // evaluation
    pub checkpoint: Option<String>,
    pub eval_episodes: usize,
    pub eval_freq: u64,
    // training
    pub steps: u64,
    pub batch_size: usize,
    pub reward_coef: f64,
    pub value_coef: f64,
    pub termination_coef: f64,
    pub consistency_coef: f64,
    pub rho: f64,
    pub lr: f64,
    pub enc_lr_scale: f64,
    pub grad_clip_norm: f64,
    pub tau: f64,
    pub discount_denom: f64,
    pub discount_min: f64,
    pub discount_max: f64,
    pub buffer_size: usize,
    pub exp_name: String,
    // planning
    pub mpc: bool,
    pub iterations: usize,
    pub num_samples: usize,
    pub num_elites: usize,
    pub num_pi_trajs: usize,
    pub horizon: usize,
    pub min_std: f64,
    pub max_std: f64,
    pub temperature: f64,
    // actor
    pub log_std_min: f64,
    pub log_std_max: f64,
    pub entropy_coef: f64,
    // critic
    pub num_bins: usize,
    pub vmin: f64,
    pub vmax: f64,
    // architecture
    pub model_size: Option<u32>,
    pub num_enc_layers: usize,
    pub enc_dim: usize,
    pub num_channels: usize,
    pub mlp_dim: usize,
    pub latent_dim: usize,
    pub task_dim: usize,
    pub num_q: usize,
    pub dropout: f64,
    pub simnorm_dim: usize,
    // logging
    pub wandb_project: String,
    pub wandb_entity: Option<String>,
    pub wandb_name: Option<String>,
    pub wandb_silent: bool,
    pub enable_wandb: bool,
    pub enable_tensorboard: bool,
    pub enable_mlflow: bool,
    pub save_csv: bool,
    // misc
    pub compile: bool,
    pub save_video: bool,
    pub save_agent: bool,
    pub seed: u64,
    pub save_freq: u64,
    pub save_buffer: bool,
    pub resume: Option<String>,
    // distributed
    pub world_size: usize,
    pub sync_freq: usize,
    pub master_addr: String,
    pub master_port: u16,
    pub nnodes: usize,
    pub node_rank: usize,
    pub dist_timeout: u64,
    pub dist_backend: String,
    pub dist_force_group: bool,
    pub max_restarts: usize,
    pub peer_timeout: u64,
    pub launcher: String,
    pub lr_scale: String,
    pub lr_warmup_steps: u64,
    // throughput
    pub num_envs: usize,
    pub steps_per_update: usize,
    /// `None` for auto.
    pub env_workers: Option<usize>,
    pub pipeline: bool,
    /// `None` for auto.
    pub actor_threads: Option<usize>,
    // hardware
    pub device: String,
    pub num_threads: Option<usize>,
    pub tf32: bool,
    pub cpu_affinity: bool,
    // output
    pub run_dir: Option<String>,
    // derived (filled by `resolve`)
    pub discount: Option<f64>,
    pub seed_steps: Option<u64>,
    pub obs_shape: Option<Vec<usize>>,
    pub action_dim: Option<usize>,
    pub episode_length: Option<usize>,
    pub bin_size: Option<f64>,
}

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_yaml_ng::{Mapping, Value};

use crate::error::{Error, Result};

/// The defaults, compiled in so the binary works from any directory.
pub const DEFAULTS_YAML: &str = include_str!("../configs/config.yaml");

/// The most restarts `max_restarts` allows: a job failing more often needs a person.
const MAX_RESTARTS: u64 = 100;

/// Model-size presets of the official code (MODEL_SIZE); a preset overrides these keys.
pub const MODEL_SIZES: [u32; 5] = [1, 5, 19, 48, 317];

struct Preset {
    enc_dim: usize,
    mlp_dim: usize,
    latent_dim: usize,
    num_enc_layers: usize,
    num_q: usize,
}

fn preset(size: u32) -> Option<Preset> {
    let p = |enc_dim, mlp_dim, latent_dim, num_enc_layers, num_q| Preset {
        enc_dim,
        mlp_dim,
        latent_dim,
        num_enc_layers,
        num_q,
    };
    Some(match size {
        1 => p(256, 384, 128, 2, 2),
        5 => p(256, 512, 512, 2, 5),
        19 => p(1024, 1024, 768, 3, 5),
        48 => p(1792, 1792, 768, 4, 5),
        317 => p(4096, 4096, 1376, 5, 8),
        _ => return None,
    })
}

/// Ranks per CPU core a node may run before `world_size` is refused on the CPU.
const OVERSUBSCRIPTION: usize = 4;

/// The memory a rank on a GPU may ask for: more than any GPU has, so only absurd settings
/// are refused up front (the device reports a real shortage when it allocates).
const GPU_MEMORY_CAP: f64 = 256.0 * (1u64 << 30) as f64;

/// |x| bound of vmin, vmax and the log-std limits: e^80 is still a finite 32-bit float.
const EXP_LIMIT: f64 = 80.0;

/// What a part of a rank's memory is for, the keys that size it, and its bytes.
struct Footprint {
    what: &'static str,
    keys: String,
    bytes: f64,
}

/// What the resource checks compare against.
struct Machine {
    cores: usize,
    memory_bytes: f64,
    /// Asked only when `device=auto` and a check depends on it.
    cuda_available: fn() -> bool,
}

impl Machine {
    fn this() -> Machine {
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

/// Where the starting file comes from: `--config-name NAME` looks in `--config-path DIR`
/// (default: the repository's `configs/`).
#[derive(Debug, Clone, Default)]
pub struct Source {
    pub config_name: Option<String>,
    pub config_path: Option<PathBuf>,
    pub overrides: Vec<String>,
}

impl Config {
    /// Builds a config from the compiled-in defaults, an optional named file laid over them,
    /// then `key=value` overrides. Validates everything that does not need the environment.
    pub fn load(source: &Source) -> Result<Config> {
        let mut tree: Value = serde_yaml_ng::from_str(DEFAULTS_YAML)
            .map_err(|e| Error::Config(format!("built-in defaults: {e}")))?;
        if let Some(file) = source.file()? {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| Error::Config(format!("cannot read {}: {e}", file.display())))?;
            let layer: Value = serde_yaml_ng::from_str(&text)
                .map_err(|e| Error::Config(format!("{}: {e}", file.display())))?;
            merge_file(&mut tree, layer, &file)?;
        }
        let mut raw = BTreeMap::new();
        for arg in &source.overrides {
            apply_override(&mut tree, arg)?;
            if let Some((key, value)) = arg.split_once('=') {
                raw.insert(key.trim().trim_start_matches('+'), value.trim());
            }
        }
        let config = from_tree(tree, &raw)?;
        config.validate()?;
        Ok(config)
    }

    /// Range checks that need no environment. Each error names the key and what is allowed.
    pub fn validate(&self) -> Result<()> {
        self.validate_floats()?;
        self.validate_sizes()?;
        self.validate_unsupported()?;
        if !(self.rho > 0.0 && self.rho <= 1.0) {
            return Err(range("rho", short(self.rho), "must satisfy 0 < rho <= 1"));
        }
        if self.num_pi_trajs >= self.num_samples {
            return Err(range(
                "num_pi_trajs",
                self.num_pi_trajs,
                &format!("must be < num_samples ({})", self.num_samples),
            ));
        }
        if self.num_elites > self.num_samples {
            return Err(range(
                "num_elites",
                self.num_elites,
                &format!("must be <= num_samples ({})", self.num_samples),
            ));
        }
        if self.min_std > self.max_std {
            return Err(range(
                "min_std",
                short(self.min_std),
                &format!("must be <= max_std ({})", short(self.max_std)),
            ));
        }
        if self.min_std <= 0.0 {
            return Err(range("min_std", short(self.min_std), "must be > 0"));
        }
        if let Some(size) = self.model_size {
            if preset(size).is_none() {
                return Err(Error::Config(format!(
                    "model_size={size} is not a model size; valid sizes: {}",
                    join(&MODEL_SIZES)
                )));
            }
        }
        if self.num_q < 2 {
            return Err(range(
                "num_q",
                self.num_q,
                "must be >= 2 (two heads are drawn per Q estimate)",
            ));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(range(
                "dropout",
                short(self.dropout),
                "must satisfy 0 <= dropout < 1",
            ));
        }
        if !(0.0..=1.0).contains(&self.tau) {
            return Err(range("tau", short(self.tau), "must satisfy 0 <= tau <= 1"));
        }
        if self.lr <= 0.0 {
            return Err(range("lr", short(self.lr), "must be > 0"));
        }
        if self.grad_clip_norm <= 0.0 {
            return Err(range(
                "grad_clip_norm",
                short(self.grad_clip_norm),
                "must be > 0",
            ));
        }
        for (key, value) in [
            ("reward_coef", self.reward_coef),
            ("value_coef", self.value_coef),
            ("termination_coef", self.termination_coef),
            ("consistency_coef", self.consistency_coef),
            ("entropy_coef", self.entropy_coef),
            ("enc_lr_scale", self.enc_lr_scale),
            ("temperature", self.temperature),
        ] {
            if value < 0.0 {
                return Err(range(key, short(value), "must be >= 0"));
            }
        }
        if self.discount_denom <= 0.0 {
            return Err(range(
                "discount_denom",
                short(self.discount_denom),
                "must be > 0",
            ));
        }
        if !(self.discount_min > 0.0 && self.discount_min < 1.0) {
            return Err(range(
                "discount_min",
                short(self.discount_min),
                "must satisfy 0 < discount_min < 1",
            ));
        }
        if !(self.discount_max >= self.discount_min && self.discount_max < 1.0) {
            return Err(range(
                "discount_max",
                short(self.discount_max),
                &format!(
                    "must satisfy discount_min ({}) <= discount_max < 1",
                    short(self.discount_min)
                ),
            ));
        }
        if let Some(discount) = self.discount {
            if !(discount > 0.0 && discount < 1.0) {
                return Err(range(
                    "discount",
                    short(discount),
                    "must satisfy 0 < discount < 1",
                ));
            }
        }
        for (key, value) in [
            ("vmin", self.vmin),
            ("vmax", self.vmax),
            ("log_std_min", self.log_std_min),
            ("log_std_max", self.log_std_max),
        ] {
            if value.abs() > EXP_LIMIT {
                return Err(range(
                    key,
                    short(value),
                    &format!(
                        "must be within [-{EXP_LIMIT}, {EXP_LIMIT}] (its exponential must be a \
                         finite 32-bit float)"
                    ),
                ));
            }
        }
        if self.num_bins < 2 || self.vmin >= self.vmax {
            return Err(Error::Config(format!(
                "num_bins={} vmin={} vmax={}: need num_bins >= 2 and vmin < vmax",
                self.num_bins,
                short(self.vmin),
                short(self.vmax)
            )));
        }
        if self.log_std_min >= self.log_std_max {
            return Err(range(
                "log_std_min",
                short(self.log_std_min),
                &format!("must be < log_std_max ({})", short(self.log_std_max)),
            ));
        }
        if self.node_rank >= self.nnodes {
            return Err(range(
                "node_rank",
                self.node_rank,
                &format!("must be < nnodes ({})", self.nnodes),
            ));
        }
        if !self.world_size.is_multiple_of(self.nnodes) {
            return Err(Error::Config(format!(
                "world_size={} cannot be split over nnodes={}: every node runs world_size / \
                 nnodes ranks, so world_size must be a multiple of nnodes",
                self.world_size, self.nnodes
            )));
        }
        if self.master_port == 0 {
            return Err(range("master_port", 0, "must be a port number 1..=65535"));
        }
        if self.master_addr.trim().is_empty() {
            return Err(Error::Config(
                "master_addr is empty; give the host name or address of node 0".into(),
            ));
        }
        const DEVICES: [&str; 3] = ["auto", "cpu", "cuda"];
        let gpu_index = self.device.strip_prefix("cuda:").map(str::parse::<u32>);
        if !DEVICES.contains(&self.device.as_str()) && !matches!(gpu_index, Some(Ok(_))) {
            return Err(Error::Config(format!(
                "device={} is not a device; allowed: auto, cpu, cuda, cuda:N",
                self.device
            )));
        }
        if self.obs != "state" {
            return Err(Error::Config(format!(
                "obs={} is not supported yet; allowed: state",
                self.obs
            )));
        }
        if !["none", "linear", "sqrt"].contains(&self.lr_scale.as_str()) {
            return Err(Error::Config(format!(
                "lr_scale={} is not a scaling rule; allowed: none, linear, sqrt",
                self.lr_scale
            )));
        }
        if !crate::ddp::Backend::SETTINGS.contains(&self.dist_backend.as_str()) {
            return Err(Error::Config(format!(
                "dist_backend={} is not a backend; allowed: {}",
                self.dist_backend,
                crate::ddp::Backend::SETTINGS.join(", ")
            )));
        }
        if self.dist_backend == "nccl" && self.device == "cpu" {
            return Err(Error::Config(
                "dist_backend=nccl needs GPUs, but device=cpu; use dist_backend=gloo or auto"
                    .into(),
            ));
        }
        const LAUNCHERS: [&str; 4] = ["auto", "builtin", "torchrun", "slurm"];
        if !LAUNCHERS.contains(&self.launcher.as_str()) {
            return Err(Error::Config(format!(
                "launcher={} is not a launcher; allowed: {}",
                self.launcher,
                LAUNCHERS.join(", ")
            )));
        }
        if !(1..=self.dist_timeout.max(1)).contains(&self.peer_timeout) {
            return Err(range(
                "peer_timeout",
                self.peer_timeout,
                &format!(
                    "must be >= 1 second and <= dist_timeout ({})",
                    self.dist_timeout
                ),
            ));
        }
        if let Some(resume) = &self.resume {
            if resume.is_empty() {
                return Err(Error::Config(
                    "resume= is empty; use resume=auto or resume=PATH".into(),
                ));
            }
        }
        if self.num_threads == Some(0) {
            return Err(range(
                "num_threads",
                0,
                "must be >= 1 (or null for cores / local ranks)",
            ));
        }
        if !self.num_envs.is_multiple_of(self.steps_per_update) {
            return Err(Error::Config(format!(
                "steps_per_update={} must divide num_envs={}: each vector step of num_envs \
                 environments makes num_envs / steps_per_update updates",
                self.steps_per_update, self.num_envs
            )));
        }
        if self.simnorm_dim > 0 && !self.latent_dim.is_multiple_of(self.simnorm_dim) {
            return Err(Error::Config(format!(
                "latent_dim={} must be a multiple of simnorm_dim={}",
                self.latent_dim, self.simnorm_dim
            )));
        }
        Ok(())
    }

    /// Every float is finite and fits the 32-bit floats the model computes in.
    fn validate_floats(&self) -> Result<()> {
        let optional = [("discount", self.discount), ("bin_size", self.bin_size)];
        let floats = [
            ("reward_coef", self.reward_coef),
            ("value_coef", self.value_coef),
            ("termination_coef", self.termination_coef),
            ("consistency_coef", self.consistency_coef),
            ("rho", self.rho),
            ("lr", self.lr),
            ("enc_lr_scale", self.enc_lr_scale),
            ("grad_clip_norm", self.grad_clip_norm),
            ("tau", self.tau),
            ("discount_denom", self.discount_denom),
            ("discount_min", self.discount_min),
            ("discount_max", self.discount_max),
            ("min_std", self.min_std),
            ("max_std", self.max_std),
            ("temperature", self.temperature),
            ("log_std_min", self.log_std_min),
            ("log_std_max", self.log_std_max),
            ("entropy_coef", self.entropy_coef),
            ("vmin", self.vmin),
            ("vmax", self.vmax),
            ("dropout", self.dropout),
        ];
        let set = optional
            .into_iter()
            .filter_map(|(key, value)| value.map(|v| (key, v)));
        for (key, value) in floats.into_iter().chain(set) {
            if !value.is_finite() || value.abs() > f64::from(f32::MAX) {
                return Err(range(
                    key,
                    short(value),
                    "must be a finite number that fits a 32-bit float (|x| <= 3.4e38)",
                ));
            }
        }
        Ok(())
    }

    /// Counts and sizes: a lower bound, and an upper one that keeps every product of them
    /// (tensor shapes, step counters) far from overflow. What they allocate together is
    /// checked against the machine by `resolve`.
    fn validate_sizes(&self) -> Result<()> {
        const STEPS: u64 = 1_000_000_000_000_000;
        const DIM: u64 = 1 << 20;
        let optional = |value: Option<usize>| value.map_or(1, |v| v as u64);
        let sizes: [(&str, u64, u64, u64); 36] = [
            ("steps", self.steps, 1, STEPS),
            ("eval_freq", self.eval_freq, 1, STEPS),
            ("save_freq", self.save_freq, 1, STEPS),
            ("lr_warmup_steps", self.lr_warmup_steps, 0, STEPS),
            ("seed_steps", self.seed_steps.unwrap_or(1), 1, STEPS),
            ("eval_episodes", self.eval_episodes as u64, 0, 1_000_000),
            ("batch_size", self.batch_size as u64, 1, 1 << 24),
            ("buffer_size", self.buffer_size as u64, 1, 1 << 40),
            ("horizon", self.horizon as u64, 1, 1_000),
            ("iterations", self.iterations as u64, 1, 1_000),
            ("num_samples", self.num_samples as u64, 1, 1 << 24),
            ("num_elites", self.num_elites as u64, 1, 1 << 24),
            ("num_pi_trajs", self.num_pi_trajs as u64, 0, 1 << 24),
            ("num_bins", self.num_bins as u64, 0, 100_000),
            ("num_q", self.num_q as u64, 0, 1_000),
            ("num_enc_layers", self.num_enc_layers as u64, 1, 1_000),
            ("enc_dim", self.enc_dim as u64, 1, DIM),
            ("mlp_dim", self.mlp_dim as u64, 1, DIM),
            ("latent_dim", self.latent_dim as u64, 1, DIM),
            ("simnorm_dim", self.simnorm_dim as u64, 1, DIM),
            ("task_dim", self.task_dim as u64, 0, DIM),
            ("num_channels", self.num_channels as u64, 0, DIM),
            ("action_dim", optional(self.action_dim), 1, DIM),
            ("episode_length", optional(self.episode_length), 1, STEPS),
            ("world_size", self.world_size as u64, 1, 1 << 16),
            ("nnodes", self.nnodes as u64, 1, 1 << 16),
            ("node_rank", self.node_rank as u64, 0, 1 << 16),
            ("sync_freq", self.sync_freq as u64, 1, 1 << 16),
            ("num_threads", optional(self.num_threads), 1, 4096),
            ("num_envs", self.num_envs as u64, 1, 4096),
            ("steps_per_update", self.steps_per_update as u64, 1, 4096),
            ("env_workers", optional(self.env_workers), 0, 4096),
            ("actor_threads", optional(self.actor_threads), 1, 4096),
            ("dist_timeout", self.dist_timeout, 1, 7 * 24 * 3600),
            ("max_restarts", self.max_restarts as u64, 0, MAX_RESTARTS),
            (
                "obs_shape",
                self.obs_shape
                    .as_ref()
                    .map_or(1, |s| s.iter().product::<usize>() as u64),
                1,
                DIM,
            ),
        ];
        for (key, value, min, max) in sizes {
            if value < min {
                return Err(range(key, value, &format!("must be >= {min}")));
            }
            if value > max {
                return Err(range(key, value, &format!("must be <= {max}")));
            }
        }
        // dm_control takes 32-bit seeds, and rank r seeds its environment with seed + r.
        let last_rank = self.world_size.saturating_sub(1) as u64;
        if self.seed.saturating_add(last_rank) > u64::from(u32::MAX) {
            return Err(range(
                "seed",
                self.seed,
                &format!(
                    "seed + world_size - 1 must be <= {} (environments take 32-bit seeds, \
                     rank r uses seed + r)",
                    u32::MAX
                ),
            ));
        }
        Ok(())
    }

    /// Keys of the official config this trainer accepts but does not implement: their
    /// defaults are fine, anything else is refused rather than silently ignored.
    fn validate_unsupported(&self) -> Result<()> {
        let defaults = Config::defaults()?;
        let unsupported = [
            (
                "save_video",
                self.save_video.to_string(),
                defaults.save_video.to_string(),
                "videos are not recorded",
            ),
            (
                "save_agent",
                self.save_agent.to_string(),
                defaults.save_agent.to_string(),
                "checkpoints are always written (save_freq spaces them)",
            ),
            (
                "num_channels",
                self.num_channels.to_string(),
                defaults.num_channels.to_string(),
                "it sizes the image encoder, and only obs=state is supported",
            ),
            (
                "task_dim",
                self.task_dim.to_string(),
                defaults.task_dim.to_string(),
                "it sizes the multitask embedding, and multitask training is not supported",
            ),
        ];
        for (key, value, default, why) in unsupported {
            if value != default {
                return Err(Error::Config(format!(
                    "{key}={value} is not supported: {why}; leave {key} at {default}"
                )));
            }
        }
        Ok(())
    }

    /// The compiled-in defaults, unvalidated.
    fn defaults() -> Result<Config> {
        let tree: Value = serde_yaml_ng::from_str(DEFAULTS_YAML)
            .map_err(|e| Error::Config(format!("built-in defaults: {e}")))?;
        from_tree(tree, &BTreeMap::new())
    }

    /// Applies the model-size preset and computes the fields the official parse step derives
    /// from the task: dimensions, episode length, discount, seed steps, planning iterations.
    pub fn resolve(&mut self, spec: &envs::EnvSpec) -> Result<()> {
        if let Some(p) = self.model_size.and_then(preset) {
            self.enc_dim = p.enc_dim;
            self.mlp_dim = p.mlp_dim;
            self.latent_dim = p.latent_dim;
            self.num_enc_layers = p.num_enc_layers;
            self.num_q = p.num_q;
        }
        let length = spec.episode_length;
        // An explicit discount or seed_steps (e.g. from a saved resolved config) is kept.
        let denom = length as f64 / self.discount_denom;
        // An infinite denominator (a tiny discount_denom) is the limit 1, before clipping.
        let discount = if denom.is_finite() {
            (denom - 1.0) / denom
        } else {
            1.0
        };
        // clip(x, min, max) as max then min: never a panic, even on an unvalidated config.
        self.discount
            .get_or_insert(discount.max(self.discount_min).min(self.discount_max));
        // Every environment finishes an episode before learning starts.
        let all_envs = (self.num_envs * length) as u64;
        self.seed_steps
            .get_or_insert((5 * length as u64).max(1000).max(all_envs));
        // The official parser adds two planning iterations for large action spaces (dog,
        // humanoid); a config resolved before already has them.
        if self.episode_length.is_none() && spec.action_dim >= 20 {
            self.iterations += 2;
        }
        self.obs_shape = Some(spec.obs_shape.clone());
        self.action_dim = Some(spec.action_dim);
        self.episode_length = Some(length);
        self.bin_size = Some((self.vmax - self.vmin) / (self.num_bins - 1) as f64);
        let seed_steps = self.seed_steps.unwrap_or_default();
        if seed_steps < (self.num_envs * length) as u64 {
            return Err(range(
                "seed_steps",
                seed_steps,
                &format!(
                    "must be >= num_envs × the episode length ({} × {length}), so that the \
                     buffer holds an episode of every environment before the first update",
                    self.num_envs
                ),
            ));
        }
        self.check_resources(&Machine::this())?;
        self.check_episode_fits(length)
    }

    /// Each rank keeps min(buffer_size, steps / world_size) rows, and an episode of L steps
    /// takes L + 1 of them (its first observation too).
    fn check_episode_fits(&self, length: usize) -> Result<()> {
        let rows = length as u64 + 1;
        if (self.buffer_size as u64) < rows {
            return Err(range(
                "buffer_size",
                self.buffer_size,
                &format!(
                    "must hold one whole episode of {}: >= episode_length + 1 = {rows} rows",
                    self.task
                ),
            ));
        }
        let world = self.world_size.max(1) as u64;
        if self.steps / world < rows {
            return Err(range(
                "steps",
                self.steps,
                &format!(
                    "each of the world_size={world} ranks runs steps / world_size = {} steps, \
                     but one episode of {} needs {rows} (its {length} steps and the first \
                     observation); use steps >= world_size × {rows} = {}",
                    self.steps / world,
                    self.task,
                    rows * world
                ),
            ));
        }
        Ok(())
    }

    /// The defaults with a model-size preset, resolved for a task of the given dimensions and
    /// 500-step episodes (as DMControl's): the settings benchmarks and tests build agents from.
    pub fn for_dims(model_size: Option<u32>, obs_dim: usize, action_dim: usize) -> Result<Config> {
        let size = model_size.map_or("null".to_owned(), |s| s.to_string());
        let mut config = Config::load(&Source {
            overrides: vec![format!("model_size={size}")],
            ..Source::default()
        })?;
        config.resolve(&envs::EnvSpec {
            obs_shape: vec![obs_dim],
            action_dim,
            episode_length: 500,
        })?;
        Ok(config)
    }

    /// What the settings need against what this machine has: ranks per node against CPU
    /// cores, and a lower bound of the memory per rank against RAM (or, on a GPU, a cap no GPU
    /// exceeds), so that an absurd size is refused here and not by an allocator mid-run.
    fn check_resources(&self, machine: &Machine) -> Result<()> {
        let local_ranks = (self.world_size / self.nnodes.max(1)).max(1);
        // Asked only when a check depends on it: probing CUDA starts its driver.
        let gpu = || match self.device.as_str() {
            "cpu" => false,
            "auto" => (machine.cuda_available)(),
            _ => true,
        };
        let max_ranks = OVERSUBSCRIPTION * machine.cores;
        if local_ranks > max_ranks && !gpu() {
            return Err(Error::Config(format!(
                "world_size={} puts {local_ranks} ranks on each of nnodes={} node(s), more than \
                 {OVERSUBSCRIPTION} per CPU core of this machine ({} cores) allow on the CPU; \
                 use world_size <= {} per node (num_threads sets each rank's threads, so fewer \
                 ranks still use every core)",
                self.world_size, self.nnodes, machine.cores, max_ranks
            )));
        }
        let parts = self.footprint();
        let per_rank: f64 = parts.iter().map(|p| p.bytes).sum();
        let on_node = per_rank * local_ranks as f64;
        if on_node <= machine.memory_bytes && per_rank <= GPU_MEMORY_CAP {
            return Ok(());
        }
        let (need, have, place) = if gpu() {
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
                 world_size={} / nnodes={}), more than {place} ({}); {} ({}) alone needs {}",
                gib(per_rank),
                self.world_size,
                self.nnodes,
                gib(have),
                largest.what,
                largest.keys,
                gib(largest.bytes)
            )));
        }
        Ok(())
    }

    /// A lower bound of the bytes one rank allocates, by what allocates them (32-bit floats).
    fn footprint(&self) -> [Footprint; 4] {
        let f = |v: usize| v as f64;
        let (obs, a) = (
            f(self.obs_shape.as_ref().map_or(0, |s| s.iter().product())),
            f(self.action_dim.unwrap_or(0)),
        );
        let (z, m, e, bins, q) = (
            f(self.latent_dim),
            f(self.mlp_dim),
            f(self.enc_dim),
            f(self.num_bins),
            f(self.num_q),
        );
        let (h, n, b) = (f(self.horizon), f(self.num_samples), f(self.batch_size));
        let hidden = f(self.num_enc_layers.saturating_sub(1).max(1));
        let encoder = obs * e + (hidden - 1.0) * e * e + e * z;
        let head = |inputs: f64, outputs: f64| inputs * m + m * m + m * outputs;
        let termination = if self.episodic { head(z, 1.0) } else { 0.0 };
        let q_heads = q * head(z + a, bins);
        let trainable =
            encoder + head(z + a, z) + head(z + a, bins) + termination + head(z, 2.0 * a) + q_heads;
        // Parameters, gradients and two Adam moments, and the target Q heads.
        let model = 4.0 * (4.0 * trainable + q_heads);
        let planning = 4.0 * n * (h * (z + a + m + bins) + q * (m + bins));
        let batch = 4.0 * b * (h + 1.0) * (obs + z + m + bins + q * (m + bins));
        let rows = (self.buffer_size as u64).min(self.steps / self.world_size.max(1) as u64);
        let buffer = 4.0 * rows as f64 * (obs + a + 2.0);
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
                    "num_samples={}, horizon={}, num_q={}",
                    self.num_samples, self.horizon, self.num_q
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

    /// The learning-rate multiplier for the effective batch (world_size × sync_freq).
    pub fn lr_multiplier(&self) -> f64 {
        let batches = (self.world_size * self.sync_freq) as f64;
        match self.lr_scale.as_str() {
            "linear" => batches,
            "sqrt" => batches.sqrt(),
            _ => 1.0,
        }
    }

    /// The agent's settings; needs a resolved config.
    pub fn agent_config(&self) -> Result<crate::agent::AgentConfig> {
        let unresolved =
            || Error::Config("the config must be resolved against the task first".into());
        let obs_shape = self.obs_shape.as_ref().ok_or_else(unresolved)?;
        Ok(crate::agent::AgentConfig {
            obs_dim: obs_shape.iter().product(),
            action_dim: self.action_dim.ok_or_else(unresolved)?,
            latent_dim: self.latent_dim,
            enc_dim: self.enc_dim,
            mlp_dim: self.mlp_dim,
            num_enc_layers: self.num_enc_layers,
            num_q: self.num_q,
            num_bins: self.num_bins,
            vmin: self.vmin,
            vmax: self.vmax,
            simnorm_dim: self.simnorm_dim,
            dropout: self.dropout,
            log_std_min: self.log_std_min,
            log_std_max: self.log_std_max,
            episodic: self.episodic,
            horizon: self.horizon,
            rho: self.rho,
            discount: self.discount.ok_or_else(unresolved)?,
            lr: self.lr * self.lr_multiplier(),
            enc_lr_scale: self.enc_lr_scale,
            grad_clip_norm: self.grad_clip_norm,
            tau: self.tau,
            consistency_coef: self.consistency_coef,
            reward_coef: self.reward_coef,
            value_coef: self.value_coef,
            termination_coef: self.termination_coef,
            entropy_coef: self.entropy_coef,
            mpc: self.mpc,
            iterations: self.iterations,
            num_samples: self.num_samples,
            num_elites: self.num_elites,
            num_pi_trajs: self.num_pi_trajs,
            min_std: self.min_std,
            max_std: self.max_std,
            temperature: self.temperature,
        })
    }

    /// The resolved config as YAML (what `--cfg job` prints and each run saves).
    pub fn to_yaml(&self) -> Result<String> {
        serde_yaml_ng::to_string(self)
            .map_err(|e| Error::Config(format!("cannot write config: {e}")))
    }
}

impl Source {
    fn file(&self) -> Result<Option<PathBuf>> {
        let Some(name) = &self.config_name else {
            if let Some(dir) = &self.config_path {
                return Err(Error::Config(format!(
                    "--config-path {} needs --config-name NAME",
                    dir.display()
                )));
            }
            return Ok(None);
        };
        let dir = match &self.config_path {
            Some(dir) => dir.clone(),
            None => default_config_dir(),
        };
        let file_name = if name.ends_with(".yaml") || name.ends_with(".yml") {
            name.clone()
        } else {
            format!("{name}.yaml")
        };
        let path = dir.join(file_name);
        if path.is_file() {
            return Ok(Some(path));
        }
        let available: Vec<String> = std::fs::read_dir(&dir)
            .map(|entries| {
                entries
                    .flatten()
                    .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                    .filter_map(|n| n.strip_suffix(".yaml").map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        Err(Error::Config(format!(
            "--config-name {name}: no file {} (available in {}: {})",
            path.display(),
            dir.display(),
            if available.is_empty() {
                "none".into()
            } else {
                available.join(", ")
            }
        )))
    }
}

/// The repository's `configs/` directory: `TDMPC2_CONFIG_DIR`, else next to the sources the
/// binary was built from.
pub fn default_config_dir() -> PathBuf {
    std::env::var_os("TDMPC2_CONFIG_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("configs"))
}

fn merge_file(tree: &mut Value, layer: Value, file: &Path) -> Result<()> {
    let Value::Mapping(layer) = layer else {
        if layer.is_null() {
            return Ok(());
        }
        return Err(Error::Config(format!(
            "{}: expected a mapping of keys",
            file.display()
        )));
    };
    for (key, value) in layer {
        let key = key
            .as_str()
            .ok_or_else(|| Error::Config(format!("{}: keys must be strings", file.display())))?
            .to_owned();
        set_path(tree, &key, value)
            .map_err(|e| Error::Config(format!("{}: {e}", file.display())))?;
    }
    Ok(())
}

/// Applies one hydra-style `key=value` (or `a.b=value`); the value is a YAML scalar or flow list.
pub fn apply_override(tree: &mut Value, arg: &str) -> Result<()> {
    let Some((key, raw)) = arg.split_once('=') else {
        return Err(Error::Config(format!(
            "cannot parse '{arg}': overrides are key=value (for example steps=100000)"
        )));
    };
    let key = key.trim().trim_start_matches('+');
    if key.is_empty() {
        return Err(Error::Config(format!(
            "cannot parse '{arg}': the key is empty"
        )));
    }
    let value: Value = if raw.trim().is_empty() {
        Value::Null
    } else {
        serde_yaml_ng::from_str(raw).map_err(|e| {
            Error::Config(format!(
                "cannot parse the value of {key}: '{raw}' is not a YAML value ({e})"
            ))
        })?
    };
    set_path(tree, key, value).map_err(Error::Config)
}

/// Sets a dotted path inside the tree; every segment must already exist (the defaults name
/// every key), otherwise the error names the closest known key.
fn set_path(tree: &mut Value, dotted: &str, value: Value) -> std::result::Result<(), String> {
    let mut node = tree;
    let segments: Vec<&str> = dotted.split('.').collect();
    for (i, segment) in segments.iter().enumerate() {
        let prefix = segments[..i].join(".");
        let Value::Mapping(map) = node else {
            return Err(format!(
                "{prefix} is not a section, so {dotted} does not exist"
            ));
        };
        let key = Value::String((*segment).to_owned());
        if !map.contains_key(&key) {
            let known: Vec<String> = keys_of(map)
                .into_iter()
                .map(|k| {
                    if prefix.is_empty() {
                        k
                    } else {
                        format!("{prefix}.{k}")
                    }
                })
                .collect();
            return Err(unknown_key(dotted, &known));
        }
        if i + 1 == segments.len() {
            map.insert(key, value);
            return Ok(());
        }
        node = map.get_mut(&key).expect("checked above");
    }
    Ok(())
}

fn keys_of(map: &Mapping) -> Vec<String> {
    map.keys()
        .filter_map(|k| k.as_str().map(str::to_owned))
        .collect()
}

fn unknown_key(key: &str, known: &[String]) -> String {
    let closest = known
        .iter()
        .map(|k| (strsim::jaro_winkler(key, k), k))
        .max_by(|a, b| a.0.total_cmp(&b.0));
    match closest {
        Some((_, k)) => format!("unknown key '{key}'; did you mean '{k}'?"),
        None => format!("unknown key '{key}'"),
    }
}

/// Deserializes the tree into a config. A value of another YAML type that means the same is
/// taken as the type the key needs: an integral float (`steps=1e5`) for an integer, a number
/// or boolean for a string (`exp_name=2024`, spelled as it was given in `raw` overrides).
fn from_tree(mut tree: Value, raw: &BTreeMap<&str, &str>) -> Result<Config> {
    // Each pass converts one value to a type that is never converted again.
    for _ in 0..=2 * keys_in(&tree) {
        let error = match serde_path_to_error::deserialize(tree.clone()) {
            Ok(config) => return Ok(config),
            Err(error) => error,
        };
        let key = error.path().to_string();
        let inner = error.into_inner().to_string();
        let expected = inner.rsplit(", expected ").next().unwrap_or_default();
        let converted = match tree.get(key.as_str()) {
            Some(value) => convert(value, expected, raw.get(key.as_str()).copied()),
            None => None,
        };
        match (converted, tree.as_mapping_mut()) {
            (Some(value), Some(map)) => {
                map.insert(Value::String(key), value);
            }
            _ => {
                // serde spells a float out in full: 1e300 as 301 digits.
                let huge = tree
                    .get(key.as_str())
                    .and_then(Value::as_f64)
                    .filter(|x| x.abs() >= 1e16);
                let described = match huge {
                    Some(x) => format!("expected {}, got {x:e}", describe_expected(expected)),
                    None => describe_type_error(&inner),
                };
                return Err(Error::Config(format!(
                    "wrong type for '{key}': {described}"
                )));
            }
        }
    }
    Err(Error::Config(
        "the configuration does not settle on types".into(),
    ))
}

fn keys_in(tree: &Value) -> usize {
    tree.as_mapping().map_or(0, Mapping::len)
}

/// `value` as the type serde `expected`, where that keeps its meaning.
fn convert(value: &Value, expected: &str, raw: Option<&str>) -> Option<Value> {
    const INTEGERS: [&str; 4] = ["usize", "u64", "u32", "u16"];
    match value {
        Value::Number(n) if INTEGERS.contains(&expected) => {
            let x = n.as_f64().filter(|_| n.is_f64())?;
            // 2^64 is exact as a float; anything below it and integral is a u64.
            let integral = x.fract() == 0.0 && (0.0..18_446_744_073_709_551_616.0).contains(&x);
            integral.then(|| Value::Number((x as u64).into()))
        }
        Value::Number(_) | Value::Bool(_) if expected == "a string" => {
            let text = match (raw, value) {
                (Some(raw), _) => raw.to_owned(),
                (None, Value::Number(n)) => n.to_string(),
                (None, other) => other.as_bool().map(|b| b.to_string())?,
            };
            Some(Value::String(text))
        }
        _ => None,
    }
}

/// Plain words for the type serde expected.
fn describe_expected(rust: &str) -> &str {
    match rust {
        "usize" | "u64" | "u32" => "a non-negative integer",
        "u16" => "a port number 1..=65535",
        "f64" => "a number",
        "a boolean" => "true or false",
        other => other,
    }
}

/// Turns serde's "invalid type: string \"x\", expected usize" into plain words.
fn describe_type_error(message: &str) -> String {
    let Some((what, expected)) = message.rsplit_once(", expected ") else {
        return message.to_owned();
    };
    let got = what
        .strip_prefix("invalid type: ")
        .or_else(|| what.strip_prefix("invalid value: "))
        .unwrap_or(what);
    format!("expected {}, got {got}", describe_expected(expected))
}

/// A float as a user would write it: 1e300, not 301 digits.
fn short(x: f64) -> String {
    if x != 0.0 && !(1e-6..1e16).contains(&x.abs()) {
        format!("{x:e}")
    } else {
        x.to_string()
    }
}

fn range(key: &str, value: impl std::fmt::Display, allowed: &str) -> Error {
    Error::Config(format!("{key}={value} is out of range: {allowed}"))
}

fn join(values: &[u32]) -> String {
    values
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(overrides: &[&str]) -> Result<Config> {
        Config::load(&Source {
            overrides: overrides.iter().map(|s| s.to_string()).collect(),
            ..Source::default()
        })
    }

    fn error(overrides: &[&str]) -> String {
        load(overrides).expect_err("should be rejected").to_string()
    }

    #[test]
    fn defaults_match_the_official_values() {
        let c = load(&[]).unwrap();
        assert_eq!(
            (c.batch_size, c.horizon, c.num_samples, c.num_elites),
            (256, 3, 512, 64)
        );
        assert_eq!(
            (c.lr, c.enc_lr_scale, c.grad_clip_norm, c.tau),
            (3e-4, 0.3, 20.0, 0.01)
        );
        assert_eq!((c.num_bins, c.vmin, c.vmax, c.num_q), (101, -10.0, 10.0, 5));
        assert_eq!((c.latent_dim, c.mlp_dim, c.enc_dim), (512, 512, 256));
    }

    #[test]
    fn overrides_parse_yaml_scalars_and_lists() {
        let c = load(&[
            "steps=1000",
            "lr=1e-3",
            "mpc=false",
            "wandb_entity=me",
            "num_threads=null",
        ])
        .unwrap();
        assert_eq!((c.steps, c.lr, c.mpc), (1000, 1e-3, false));
        assert_eq!(c.wandb_entity.as_deref(), Some("me"));
        let c = load(&["obs_shape=[3, 4]"]).unwrap();
        assert_eq!(c.obs_shape, Some(vec![3, 4]));
    }

    #[test]
    fn nested_keys_are_set_and_checked() {
        let mut tree: Value = serde_yaml_ng::from_str("a: {b: 1, c: {d: 2}}").unwrap();
        apply_override(&mut tree, "a.c.d=5").unwrap();
        assert_eq!(tree["a"]["c"]["d"], Value::from(5));
        let e = apply_override(&mut tree, "a.c.e=1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("did you mean 'a.c.d'"), "{e}");
        let e = apply_override(&mut tree, "a.b.x=1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("a.b is not a section"), "{e}");
    }

    #[test]
    fn unknown_key_names_the_closest() {
        assert!(error(&["bach_size=3"]).contains("did you mean 'batch_size'"));
        assert!(error(&["horizn=3"]).contains("did you mean 'horizon'"));
    }

    #[test]
    fn wrong_types_name_key_and_type() {
        let e = error(&["batch_size=abc"]);
        assert!(
            e.contains("batch_size") && e.contains("non-negative integer"),
            "{e}"
        );
        let e = error(&["mpc=maybe"]);
        assert!(e.contains("mpc") && e.contains("true or false"), "{e}");
        let e = error(&["lr=fast"]);
        assert!(e.contains("'lr'") && e.contains("a number"), "{e}");
    }

    #[test]
    fn ranges_are_enforced() {
        for (arg, needle) in [
            ("batch_size=0", "batch_size=0 is out of range"),
            ("horizon=0", "horizon=0"),
            ("world_size=0", "world_size=0"),
            ("sync_freq=0", "sync_freq=0"),
            ("rho=0", "0 < rho <= 1"),
            ("rho=1.5", "0 < rho <= 1"),
            ("num_pi_trajs=600", "must be < num_samples"),
            ("num_elites=513", "must be <= num_samples"),
            ("min_std=3", "must be <= max_std"),
            ("model_size=7", "valid sizes: 1, 5, 19, 48, 317"),
        ] {
            let e = error(&[arg]);
            assert!(e.contains(needle), "{arg}: {e}");
        }
        assert!(load(&["rho=1"]).is_ok());
    }

    #[test]
    fn integral_floats_are_integers_and_names_are_strings_as_typed() {
        let c = load(&["steps=1e5", "exp_name=1.10", "wandb_name=7", "seed=3.0"]).unwrap();
        assert_eq!((c.steps, c.seed), (100_000, 3));
        assert_eq!(c.exp_name, "1.10");
        assert_eq!(c.wandb_name.as_deref(), Some("7"));
        assert!(error(&["steps=2.5"]).contains("wrong type for 'steps'"));
        assert!(error(&["steps=1e20"]).contains("got 1e20"));
    }

    #[test]
    fn non_finite_and_unsupported_values_are_refused() {
        for (arg, needle) in [
            ("lr=.nan", "lr=NaN is out of range"),
            ("tau=-.inf", "tau=-inf is out of range"),
            ("discount=1", "0 < discount < 1"),
            ("discount_min=0.999", "discount_min (0.999) <= discount_max"),
            ("save_agent=false", "save_agent=false is not supported"),
            ("task_dim=0", "task_dim=0 is not supported"),
        ] {
            let e = error(&[arg]);
            assert!(e.contains(needle), "{arg}: {e}");
        }
    }

    #[test]
    fn resources_are_checked_against_the_machine() {
        let mut c = load(&["task=Pendulum-v1", "device=cpu"]).unwrap();
        c.obs_shape = Some(vec![3]);
        c.action_dim = Some(1);
        let small = Machine {
            cores: 2,
            memory_bytes: 4e9,
            cuda_available: || false,
        };
        c.check_resources(&small).unwrap();
        c.world_size = 9;
        let e = c.check_resources(&small).unwrap_err().to_string();
        assert!(e.contains("world_size=9 puts 9 ranks"), "{e}");
        c.world_size = 8;
        c.check_resources(&small).unwrap();
        // Ranks of a GPU node are not limited by its cores.
        c.device = "auto".into();
        c.world_size = 64;
        let gpu = Machine {
            cuda_available: || true,
            ..small
        };
        c.check_resources(&gpu).unwrap();
        c.world_size = 1;
        c.buffer_size = 1 << 40;
        c.steps = 1 << 50;
        let e = c.check_resources(&gpu).unwrap_err().to_string();
        assert!(
            e.contains("more than a GPU") && e.contains("the replay buffer (buffer_size="),
            "{e}"
        );
        c.device = "cpu".into();
        c.buffer_size = 200_000_000;
        let e = c.check_resources(&small).unwrap_err().to_string();
        assert!(e.contains("this machine's memory (3.7 GiB)"), "{e}");
    }

    #[test]
    fn resolve_derives_the_official_fields() {
        let mut c = load(&["model_size=1"]).unwrap();
        let spec = envs::EnvSpec {
            obs_shape: vec![223],
            action_dim: 38,
            episode_length: 500,
        };
        c.resolve(&spec).unwrap();
        assert_eq!(
            (c.enc_dim, c.mlp_dim, c.latent_dim, c.num_q),
            (256, 384, 128, 2)
        );
        assert_eq!(c.discount, Some(0.99));
        assert_eq!(c.seed_steps, Some(2500));
        assert_eq!(c.iterations, 8);
        assert!((c.bin_size.unwrap() - 0.2).abs() < 1e-12);
        let mut c = load(&[]).unwrap();
        c.resolve(&envs::EnvSpec {
            obs_shape: vec![3],
            action_dim: 1,
            episode_length: 200,
        })
        .unwrap();
        assert_eq!(
            (c.discount, c.seed_steps, c.iterations),
            (Some(0.975), Some(1000), 6)
        );
        let mut c = load(&[]).unwrap();
        c.resolve(&envs::EnvSpec {
            obs_shape: vec![3],
            action_dim: 1,
            episode_length: 1000,
        })
        .unwrap();
        assert_eq!(c.discount, Some(0.995));
    }
}
