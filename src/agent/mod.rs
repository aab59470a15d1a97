//! The TD-MPC2 agent: world model, losses and optimisers, and the MPPI planner.
//!
//! Behaviour follows the official implementation (nicklashansen/tdmpc2) and is checked against
//! vectors recorded from it (`tests/parity.rs`). Parameters live in flat buffers (one per
//! optimiser) so that optimiser steps, gradient clipping and gradient all-reduce are a handful of
//! tensor operations; every parameter is a view into its buffer, named with the official
//! state-dict key.

pub mod adam;
pub mod bench;
pub mod config;
pub mod import;
pub mod kernels;
pub mod layers;
pub mod math;
pub mod noise;
pub mod params;
pub mod planner;
#[cfg(test)]
mod planner_reference;
pub mod scale;
pub mod update;
pub mod world_model;

use tch::{Device, Kind, Tensor};

pub use adam::{clip_grad_norm, Adam, AdamState};
pub use config::AgentConfig;
pub use import::import_official;
pub use noise::{HostNoise, Noise, NoiseKind, RecordingNoise, ReplayNoise, TorchNoise};
pub use planner::{LatentModel, Planner};
pub use scale::RunningScale;
pub use update::{Batch, Learner, PolicyPass, UpdateInfo, UpdateStats, WorldModelPass};
pub use world_model::{PolicyOutput, QParams, WorldModel};

/// Errors of the agent.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("torch: {0}")]
    Torch(#[from] tch::TchError),
    #[error("invalid agent config: {0}")]
    Config(String),
    #[error("{what}: expected shape {expected:?}, got {got:?}")]
    Shape {
        what: String,
        expected: Vec<i64>,
        got: Vec<i64>,
    },
    #[error("noise replay: {0}")]
    Replay(String),
    #[error("checkpoint {path}: {message}")]
    Checkpoint { path: String, message: String },
}

pub type Result<T> = std::result::Result<T, Error>;

/// Checks a tensor's shape, naming it in the error.
pub(crate) fn expect_shape(what: &str, tensor: &Tensor, expected: &[i64]) -> Result<()> {
    let got = tensor.size();
    if got != expected {
        return Err(Error::Shape {
            what: what.to_string(),
            expected: expected.to_vec(),
            got,
        });
    }
    Ok(())
}

/// A complete agent: the world model, its learner state, the planner, and two noise streams.
///
/// `sample_noise` serves the per-sample draws (policy noise, planner samples); `batch_noise`
/// serves the draws made once per batch (the Q heads picked in an update), which a distributed
/// trainer seeds identically on every rank.
pub struct Agent {
    pub config: AgentConfig,
    pub model: WorldModel,
    pub learner: Learner,
    pub planner: Planner,
    pub sample_noise: Box<dyn Noise + Send>,
    pub batch_noise: Box<dyn Noise + Send>,
}

impl Agent {
    /// A freshly initialised agent. `seed` seeds torch's global generator (initialisation and
    /// per-sample noise) and the host stream of per-batch draws.
    /// Also applies [`kernels::retain_freed_memory`] (process-wide allocator tuning).
    pub fn new(config: AgentConfig, device: Device, seed: u64) -> Result<Self> {
        config.validate()?;
        kernels::retain_freed_memory();
        let sample_noise = TorchNoise::seeded(seed);
        let model = WorldModel::new(&config, device)?;
        let learner = Learner::new(&config, &model)?;
        let planner = Planner::new(&config, device, 1)?;
        Ok(Self {
            config,
            model,
            learner,
            planner,
            sample_noise: Box::new(sample_noise),
            batch_noise: Box::new(HostNoise::seeded(seed)),
        })
    }

    /// Chooses an action for one observation; `t0` marks the first step of an episode.
    pub fn act(&mut self, obs: &[f32], t0: bool, eval_mode: bool) -> Result<Vec<f32>> {
        let obs_dim = self.config.obs_dim as i64;
        if obs.len() as i64 != obs_dim {
            return Err(Error::Shape {
                what: "observation".into(),
                expected: vec![obs_dim],
                got: vec![obs.len() as i64],
            });
        }
        let obs = Tensor::from_slice(obs)
            .view([1, obs_dim])
            .to_device(self.model.device());
        let action = if self.config.mpc {
            self.planner
                .plan(&self.model, &obs, t0, eval_mode, self.sample_noise.as_mut())?
        } else {
            self.planner.act_with_policy(
                &self.model,
                &obs,
                eval_mode,
                self.sample_noise.as_mut(),
            )?
        };
        let action = action.to_device(Device::Cpu).to_kind(Kind::Float);
        Ok(Vec::<f32>::try_from(&action)?)
    }

    /// One full TD-MPC2 update on a batch (world model, policy, target Qs).
    pub fn update(&mut self, batch: &Batch) -> Result<UpdateInfo> {
        self.learner.update(
            &mut self.model,
            batch,
            self.sample_noise.as_mut(),
            self.batch_noise.as_mut(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small_config(mpc: bool) -> AgentConfig {
        AgentConfig {
            enc_dim: 16,
            mlp_dim: 16,
            latent_dim: 8,
            num_q: 2,
            num_samples: 64,
            num_elites: 8,
            num_pi_trajs: 4,
            iterations: 2,
            mpc,
            ..AgentConfig::defaults(None, 5, 3).unwrap()
        }
    }

    #[test]
    fn agent_acts_within_bounds_and_updates() {
        for mpc in [true, false] {
            let mut agent = Agent::new(small_config(mpc), Device::Cpu, 0).unwrap();
            let obs = [0.1f32, -0.2, 0.3, 0.0, 1.0];
            for (t0, eval_mode) in [(true, false), (false, false), (false, true)] {
                let action = agent.act(&obs, t0, eval_mode).unwrap();
                assert_eq!(action.len(), 3);
                assert!(
                    action
                        .iter()
                        .all(|a| a.is_finite() && (-1.0..=1.0).contains(a)),
                    "{action:?}"
                );
            }
            assert!(matches!(
                agent.act(&obs[..4], false, false),
                Err(Error::Shape { .. })
            ));
            let o = (Kind::Float, Device::Cpu);
            let batch = Batch {
                obs: Tensor::randn([4, 8, 5], o),
                action: Tensor::rand([3, 8, 3], o) * 2.0 - 1.0,
                reward: Tensor::randn([3, 8, 1], o),
                terminated: Tensor::zeros([3, 8, 1], o),
            };
            let stats = agent.update(&batch).unwrap().fetch().unwrap();
            assert!(stats.total_loss.is_finite());
        }
    }
}
