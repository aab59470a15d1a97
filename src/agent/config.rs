//! The agent's settings, fully resolved (no optional or derived fields left).
use serde::{Deserialize, Serialize};

use super::encoder::IMAGE_SIZE;
use super::error::{Error, Result};
use super::task::Tasks;
use crate::config::PIXEL_FEATURES;

/// Everything the agent needs, with the official TD-MPC2 names. Built directly by tests, or
/// from the run configuration by the trainer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentConfig {
    // dimensions
    /// Numbers in one observation (9·64·64 for pixels).
    pub obs_dim: usize,
    /// State vectors (an MLP encoder) or stacked frames (the convolutional encoder).
    pub obs: envs::ObsKind,
    /// Channels of the convolutional encoder's layers (pixels only).
    pub num_channels: usize,
    pub action_dim: usize,
    pub latent_dim: usize,
    pub enc_dim: usize,
    pub mlp_dim: usize,
    pub num_enc_layers: usize,
    pub num_q: usize,
    pub num_bins: usize,
    pub vmin: f64,
    pub vmax: f64,
    pub simnorm_dim: usize,
    pub dropout: f64,
    pub log_std_min: f64,
    pub log_std_max: f64,
    pub episodic: bool,
    // learning
    pub horizon: usize,
    pub rho: f64,
    pub discount: f64,
    pub lr: f64,
    pub enc_lr_scale: f64,
    pub grad_clip_norm: f64,
    pub tau: f64,
    pub consistency_coef: f64,
    pub reward_coef: f64,
    pub value_coef: f64,
    pub termination_coef: f64,
    pub entropy_coef: f64,
    // planning
    pub mpc: bool,
    /// Already includes the +2 for large action spaces (applied by config resolution).
    pub iterations: usize,
    pub num_samples: usize,
    pub num_elites: usize,
    pub num_pi_trajs: usize,
    pub min_std: f64,
    pub max_std: f64,
    pub temperature: f64,
    /// A multitask model's tasks (the official `multitask`); `None` for one task.
    #[serde(default)]
    pub tasks: Option<Tasks>,
}

impl AgentConfig {
    /// The defaults of configs/config.yaml, with a model-size preset (None: the file's own
    /// widths, which are size 5), for a task of the given dimensions and 500-step episodes.
    /// Benchmarks and tests start here; the one source of every default is the config file.
    pub fn defaults(
        model_size: Option<u32>,
        obs_dim: usize,
        action_dim: usize,
    ) -> crate::error::Result<Self> {
        Self::from_config(&crate::config::Config::for_dims(
            model_size, obs_dim, action_dim,
        )?)
    }

    /// The agent's settings of a run; the config must be resolved against the task.
    pub fn from_config(config: &crate::config::Config) -> crate::error::Result<Self> {
        Ok(AgentConfig {
            obs_dim: config.resolved_obs_dim()?,
            obs: config.obs_kind()?,
            num_channels: config.num_channels,
            action_dim: config.resolved_action_dim()?,
            latent_dim: config.latent_dim,
            enc_dim: config.enc_dim,
            mlp_dim: config.mlp_dim,
            num_enc_layers: config.num_enc_layers,
            num_q: config.num_q,
            num_bins: config.num_bins,
            vmin: config.vmin,
            vmax: config.vmax,
            simnorm_dim: config.simnorm_dim,
            dropout: config.dropout,
            log_std_min: config.log_std_min,
            log_std_max: config.log_std_max,
            episodic: config.episodic,
            horizon: config.horizon,
            rho: config.rho,
            discount: config.resolved_discount()?,
            lr: config.lr * config.lr_multiplier(),
            enc_lr_scale: config.enc_lr_scale,
            grad_clip_norm: config.grad_clip_norm,
            tau: config.tau,
            consistency_coef: config.consistency_coef,
            reward_coef: config.reward_coef,
            value_coef: config.value_coef,
            termination_coef: config.termination_coef,
            entropy_coef: config.entropy_coef,
            mpc: config.mpc,
            iterations: config.iterations,
            num_samples: config.num_samples,
            num_elites: config.num_elites,
            num_pi_trajs: config.num_pi_trajs,
            min_std: config.min_std,
            max_std: config.max_std,
            temperature: config.temperature,
            tasks: Self::tasks_of(config)?,
        })
    }

    /// A multitask run's tasks: each one's action size and discount (from its episode length).
    fn tasks_of(config: &crate::config::Config) -> crate::error::Result<Option<Tasks>> {
        if !config.multitask() {
            return Ok(None);
        }
        let unresolved = || {
            crate::error::Error::Config(
                "a multitask config must be resolved against its tasks first".into(),
            )
        };
        let action_dims = config.action_dims.clone().ok_or_else(unresolved)?;
        let lengths = config.episode_lengths.as_ref().ok_or_else(unresolved)?;
        Ok(Some(Tasks {
            task_dim: config.task_dim,
            action_dims,
            discounts: lengths.iter().map(|&l| config.discount_for(l)).collect(),
        }))
    }

    /// Width of one bin of the two-hot support (in symlog space).
    pub fn bin_size(&self) -> f64 {
        (self.vmax - self.vmin) / (self.num_bins as f64 - 1.0)
    }

    /// Rejects settings the agent cannot run with.
    pub fn validate(&self) -> Result<()> {
        let fail = |msg: String| Err(Error::Config(msg));
        for (name, value) in [
            ("obs_dim", self.obs_dim),
            ("action_dim", self.action_dim),
            ("latent_dim", self.latent_dim),
            ("enc_dim", self.enc_dim),
            ("mlp_dim", self.mlp_dim),
            ("num_enc_layers", self.num_enc_layers),
            ("horizon", self.horizon),
            ("simnorm_dim", self.simnorm_dim),
        ] {
            if value == 0 {
                return fail(format!("{name} must be at least 1"));
            }
        }
        if self.num_q < 2 {
            return fail(format!(
                "num_q must be at least 2 (two heads are sampled), got {}",
                self.num_q
            ));
        }
        if self.num_bins < 2 {
            return fail(format!(
                "num_bins must be at least 2, got {}",
                self.num_bins
            ));
        }
        if self.vmax <= self.vmin {
            return fail(format!(
                "vmax ({}) must exceed vmin ({})",
                self.vmax, self.vmin
            ));
        }
        if !self.latent_dim.is_multiple_of(self.simnorm_dim) {
            return fail(format!(
                "latent_dim ({}) must be a multiple of simnorm_dim ({})",
                self.latent_dim, self.simnorm_dim
            ));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return fail(format!("dropout must be in [0, 1), got {}", self.dropout));
        }
        if self.log_std_max < self.log_std_min {
            return fail("log_std_max must not be below log_std_min".into());
        }
        self.validate_observations()?;
        if self.mpc {
            self.validate_planner()?;
        }
        Ok(())
    }

    /// Pixels' shapes, and what a multitask model allows.
    fn validate_observations(&self) -> Result<()> {
        let fail = |msg: String| Err(Error::Config(msg));
        let image = (IMAGE_SIZE * IMAGE_SIZE) as usize;
        if self.obs == envs::ObsKind::Rgb
            && (!self.obs_dim.is_multiple_of(image)
                || self.num_channels == 0
                || self.latent_dim != PIXEL_FEATURES * self.num_channels)
        {
            return fail(format!(
                "pixels need obs_dim = channels × 64 × 64 and latent_dim = {PIXEL_FEATURES} × \
                 num_channels, got obs_dim {}, latent_dim {}, num_channels {}",
                self.obs_dim, self.latent_dim, self.num_channels
            ));
        }
        if let Some(tasks) = &self.tasks {
            tasks.validate(self.action_dim)?;
            if self.obs != envs::ObsKind::State || self.episodic {
                return fail(
                    "a multitask model observes states and is not episodic (as the official)"
                        .into(),
                );
            }
        }
        Ok(())
    }

    /// The planner's settings (checked where it plans, `mpc`).
    fn validate_planner(&self) -> Result<()> {
        let fail = |msg: String| Err(Error::Config(msg));
        if self.iterations == 0 {
            return fail("iterations must be at least 1".into());
        }
        if self.num_pi_trajs >= self.num_samples {
            return fail(format!(
                "num_pi_trajs ({}) must be below num_samples ({})",
                self.num_pi_trajs, self.num_samples
            ));
        }
        if self.num_elites == 0 || self.num_elites > self.num_samples {
            return fail(format!(
                "num_elites must be in 1..={} (num_samples), got {}",
                self.num_samples, self.num_elites
            ));
        }
        if self.min_std > self.max_std {
            return fail("min_std must not exceed max_std".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_large_action_spaces_get_more_iterations() {
        let walker = AgentConfig::defaults(None, 24, 6).unwrap();
        walker.validate().unwrap();
        assert_eq!(walker.iterations, 6);
        assert!((walker.discount - 0.99).abs() < 1e-12);
        let dog = AgentConfig::defaults(None, 223, 38).unwrap();
        assert_eq!(dog.iterations, 8);
        assert!((walker.bin_size() - 0.2).abs() < 1e-12);
        let small = AgentConfig::defaults(Some(1), 24, 6).unwrap();
        assert_eq!(
            (small.mlp_dim, small.latent_dim, small.num_q),
            (384, 128, 2)
        );
        assert!(AgentConfig::defaults(Some(7), 24, 6).is_err());
    }

    #[test]
    fn invalid_settings_are_rejected() {
        let mut config = AgentConfig::defaults(None, 24, 6).unwrap();
        config.latent_dim = 30;
        assert!(matches!(config.validate(), Err(Error::Config(_))));
        let mut config = AgentConfig::defaults(None, 24, 6).unwrap();
        config.num_q = 1;
        assert!(config.validate().is_err());
    }
}
