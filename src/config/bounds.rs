//! Bounds of a config's numbers: every float finite and within a 32-bit float, every count and
//! size within limits that keep the products of them (tensor shapes, step counters) far from
//! overflow. What they allocate together is checked against the machine by `resolve`.
use super::defaults::{MAX_NUM_ENVS, MAX_WORLD_SIZE};
use super::validate::{range, short};
use super::Config;
use crate::error::Result;

/// The most restarts `max_restarts` allows: a job failing more often needs a person.
const MAX_RESTARTS: u64 = 100;

impl Config {
    /// Every float is finite and fits the 32-bit floats the model computes in.
    pub(super) fn validate_floats(&self) -> Result<()> {
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
    pub(super) fn validate_sizes(&self) -> Result<()> {
        const STEPS: u64 = 1_000_000_000_000_000;
        const DIM: u64 = 1 << 20;
        let optional = |value: Option<usize>| value.map_or(1, |v| v as u64);
        let sizes: [(&str, u64, u64, u64); 38] = [
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
            (
                "world_size",
                self.world_size as u64,
                1,
                MAX_WORLD_SIZE as u64,
            ),
            ("nnodes", self.nnodes as u64, 1, 1 << 16),
            ("node_rank", self.node_rank as u64, 0, 1 << 16),
            ("sync_freq", self.sync_freq as u64, 1, 1 << 16),
            ("num_threads", optional(self.num_threads), 1, 4096),
            ("num_envs", self.num_envs as u64, 1, MAX_NUM_ENVS as u64),
            ("steps_per_update", self.steps_per_update as u64, 1, 4096),
            ("env_workers", optional(self.env_workers), 0, 4096),
            ("env_timeout", self.env_timeout, 1, 7 * 24 * 3600),
            ("actor_threads", optional(self.actor_threads), 1, 4096),
            ("dist_timeout", self.dist_timeout, 1, 7 * 24 * 3600),
            ("stop_grace", self.stop_grace, 1, 7 * 24 * 3600),
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
        // dm_control takes 32-bit seeds, and rank r seeds its environment i with
        // seed + i·world_size + r.
        let last = (self.num_envs * self.world_size).saturating_sub(1) as u64;
        if self.seed.saturating_add(last) > u64::from(u32::MAX) {
            return Err(range(
                "seed",
                self.seed,
                &format!(
                    "seed + num_envs × world_size - 1 must be <= {} (environments take 32-bit \
                     seeds, rank r's environment i uses seed + i × world_size + r)",
                    u32::MAX
                ),
            ));
        }
        Ok(())
    }
}
