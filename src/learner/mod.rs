//! The learner of one rank: the world model with its target Qs, the optimisers and Q scale, the
//! replay buffer, and the synchronised TD-MPC2 update. It is the only part of a rank that talks
//! to the process group during training.
//!
//! With `sync_freq = k`, each rank computes the gradients of k micro-batches (all world-model
//! passes, then one optimiser step on the averaged gradients; then all policy passes on the
//! stored latents, then one policy step). Gradients are averaged over ranks and micro-batches,
//! so N ranks × k micro-batches of B behave as one update on a batch of N·k·B. The Q scale is
//! updated at every micro-batch from the Q values gathered from all ranks.
pub mod finite;
mod graphed;
mod synchronised;

use rand_pcg::Pcg64;
use tch::{Device, Tensor};

use crate::agent::{
    AgentConfig, HostNoise, Noise, PreparedPermutations, TorchNoise, UpdateInfo, Updater,
    WorldModel,
};
use crate::buffer::{Batch, BufferSettings, Episode, ReplayBuffer};
use crate::config::Config;
use crate::ddp::ProcessGroup;
use crate::error::Result;
use synchronised::UpdateParts;

/// What a learner is built from, taken once from the resolved config.
#[derive(Debug, Clone, PartialEq)]
pub struct LearnerSettings {
    pub agent: AgentConfig,
    /// Seeds the initial parameters and the first random streams.
    pub seed: u64,
    pub buffer: BufferSettings,
    pub sync_freq: usize,
    /// Optimiser steps over which the learning rates ramp up from 0.
    pub warmup_steps: u64,
}

impl LearnerSettings {
    pub fn from_config(config: &Config) -> Result<Self> {
        Ok(Self {
            agent: AgentConfig::from_config(config)?,
            seed: config.seed,
            buffer: config.buffer_settings()?,
            sync_freq: config.sync_freq,
            warmup_steps: config.lr_warmup_steps,
        })
    }

    /// The same settings with a buffer of `capacity` rows.
    pub fn with_capacity(mut self, capacity: usize) -> Self {
        self.buffer.capacity = capacity;
        self
    }
}

pub struct Learner<'g> {
    model: WorldModel,
    updater: Updater,
    /// Per-sample draws (TD-target policy noise, dropout masks).
    sample_noise: Box<dyn Noise + Send>,
    /// Per-batch draws (the Q heads picked), identical on every rank.
    batch_noise: Box<dyn Noise + Send>,
    /// An update's per-batch draws, drawn from `batch_noise` before it and read on the device.
    shared_draws: PreparedPermutations,
    /// The update as a CUDA graph, once asked for.
    graphed: Option<graphed::GraphedUpdate>,
    buffer: ReplayBuffer,
    batch_size: usize,
    horizon: usize,
    sync_freq: usize,
    tau: f64,
    group: &'g ProcessGroup,
    comm: CommTimes,
}

/// Seconds spent inside the update's collectives since the learner was made (for benchmarks),
/// as the host sees them: on the CPU (gloo) the collectives themselves; on CUDA with NCCL the
/// time to enqueue them and to wait for what they depend on, not the transfer, which runs on
/// NCCL's stream after the call returns. Updates captured as a CUDA graph replay their
/// collectives inside it: only the eager first call's are timed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CommTimes {
    /// The two all-reduces of the flat gradient buffers.
    pub grad_all_reduce: f64,
    /// The Q-value all-gathers and the all-reduce of the logged info.
    pub other: f64,
}

impl<'g> Learner<'g> {
    /// A freshly initialised learner: torch's generator is seeded with `settings.seed` before
    /// the model is drawn, so every rank starts from the same parameters.
    pub fn new(
        settings: &LearnerSettings,
        device: Device,
        group: &'g ProcessGroup,
    ) -> Result<Self> {
        let agent = &settings.agent;
        agent.validate()?;
        crate::agent::kernels::retain_freed_memory();
        let sample_noise = TorchNoise::seeded(settings.seed);
        let model = WorldModel::new(agent, device)?;
        let updater = Updater::new(agent, &model)?.with_warmup(settings.warmup_steps);
        Ok(Self {
            model,
            updater,
            sample_noise: Box::new(sample_noise),
            batch_noise: Box::new(HostNoise::seeded(settings.seed)),
            shared_draws: PreparedPermutations::new(
                2 * settings.sync_freq,
                agent.num_q as i64,
                device,
            ),
            graphed: None,
            buffer: ReplayBuffer::new(
                settings.buffer.capacity,
                settings.buffer.obs,
                settings.buffer.action_dim,
                device,
            )?,
            batch_size: settings.buffer.batch_size,
            horizon: agent.horizon,
            sync_freq: settings.sync_freq,
            tau: agent.tau,
            group,
            comm: CommTimes::default(),
        })
    }

    /// Updates through one CUDA graph from now on (captured at the next update), collectives
    /// included: on CUDA, alone or in a group whose CUDA collectives are NCCL's. Says why not
    /// otherwise, and stays eager.
    pub fn capture_updates(&mut self) -> std::result::Result<(), String> {
        let device = self.model.device();
        let why_not = crate::cuda::why_no_graphs(device)
            .or_else(|| graphed::why_not_captured(self.group.backend()));
        match why_not {
            Some(why) => Err(why),
            None => {
                self.graphed = Some(graphed::GraphedUpdate::new(device));
                Ok(())
            }
        }
    }

    pub fn comm_times(&self) -> CommTimes {
        self.comm
    }

    pub fn model(&self) -> &WorldModel {
        &self.model
    }

    pub fn model_mut(&mut self) -> &mut WorldModel {
        &mut self.model
    }

    /// The optimisers and the Q scale.
    pub fn updater(&self) -> &Updater {
        &self.updater
    }

    /// Carries a checkpoint's task-embedding gradient into the next update (multitask).
    pub fn restore_carried_task_grad(&mut self, grad: &Tensor) -> Result<()> {
        Ok(self.updater.restore_carried_task_grad(&self.model, grad)?)
    }

    pub fn updater_mut(&mut self) -> &mut Updater {
        &mut self.updater
    }

    pub fn buffer(&self) -> &ReplayBuffer {
        &self.buffer
    }

    pub fn buffer_mut(&mut self) -> &mut ReplayBuffer {
        &mut self.buffer
    }

    /// Replaces the two random streams (at every checkpoint point, so that a resumed run draws
    /// what the uninterrupted one draws).
    pub fn set_noise(&mut self, sample: Box<dyn Noise + Send>, batch: Box<dyn Noise + Send>) {
        self.sample_noise = sample;
        self.batch_noise = batch;
    }

    pub fn add_episode(&mut self, episode: &Episode) -> Result<()> {
        self.buffer.add(episode)
    }

    /// Makes every rank start from rank 0's parameters and target Qs.
    pub fn broadcast_parameters(&mut self) -> Result<()> {
        let model = &self.model;
        for flat in [
            &model.model_params.flat,
            &model.policy_params.flat,
            &model.target_params.flat,
        ] {
            self.group.broadcast_from_root(&mut flat.shallow_clone())?;
        }
        Ok(())
    }

    /// Whether every rank's buffer holds an episode long enough to sample from.
    pub fn ready(&self) -> Result<bool> {
        let local = self.buffer.can_sample(self.horizon + 1);
        if self.group.world_size() == 1 {
            return Ok(local);
        }
        let mut missing = Tensor::from_slice(&[if local { 0.0f32 } else { 1.0 }]);
        self.group.all_reduce_sum(&mut missing)?;
        Ok(missing.double_value(&[0]) == 0.0)
    }

    pub fn sample(&self, rng: &mut Pcg64) -> Result<Batch> {
        self.buffer.sample(self.batch_size, self.horizon, rng)
    }

    /// One synchronised update (k micro-batches sampled from this rank's buffer).
    pub fn update(&mut self, rng: &mut Pcg64) -> Result<UpdateInfo> {
        let batches = (0..self.sync_freq)
            .map(|_| self.sample(rng))
            .collect::<Result<Vec<_>>>()?;
        self.update_on(&batches)
    }

    /// One synchronised update on the given micro-batches.
    pub fn update_on(&mut self, batches: &[Batch]) -> Result<UpdateInfo> {
        if let Some(graphed) = &self.graphed {
            // The captured graph reads the shared draws where they are now.
            graphed.check_micro_batches(batches.len())?;
        }
        // Each micro-batch draws one pair of heads for the world model, one for the policy.
        self.shared_draws.ensure_slots(2 * batches.len());
        self.shared_draws.refill(self.batch_noise.as_mut())?;
        let mut parts = UpdateParts {
            group: self.group,
            model: &mut self.model,
            updater: &mut self.updater,
            sample_noise: self.sample_noise.as_mut(),
            shared: &mut self.shared_draws,
            comm: &mut self.comm,
            tau: self.tau,
        };
        match &mut self.graphed {
            Some(graphed) => graphed.update(&mut parts, batches),
            // An eager update on CUDA draws from torch's default generator: not while a
            // pipelined actor captures or replays its plans.
            None if parts.model.device().is_cuda() => {
                let _turn = crate::cuda::generator_turn();
                parts.run(batches)
            }
            None => parts.run(batches),
        }
    }
}
