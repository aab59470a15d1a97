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

use std::time::Instant;

use rand_pcg::Pcg64;
use tch::{Device, Kind, Tensor};

use crate::agent::{
    AgentConfig, HostNoise, Noise, PreparedPermutations, TorchNoise, UpdateInfo, Updater,
    WorldModel,
};
use crate::buffer::{Batch, BufferSettings, Episode, ReplayBuffer};
use crate::config::Config;
use crate::ddp::ProcessGroup;
use crate::error::{Error, Result};

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
/// NCCL's stream after the call returns.
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

    /// Updates through one CUDA graph from now on (captured at the next update): for one rank
    /// on CUDA with `sync_freq=1`. Says why not otherwise, and stays eager.
    pub fn capture_updates(&mut self) -> std::result::Result<(), String> {
        let device = self.model.device();
        let why_not = graphed::why_not_captured(device, self.group.world_size(), self.sync_freq);
        match why_not {
            Some(why) => Err(why),
            None => {
                let episodic = self.model.termination.is_some();
                self.graphed = Some(graphed::GraphedUpdate::new(device, episodic));
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
        let group = self.group;
        let (model, learner) = (&mut self.model, &mut self.updater);
        let sample_noise = &mut self.sample_noise;
        let shared = &mut self.shared_draws;
        // Each micro-batch draws one pair of heads for the world model, one for the policy.
        shared.ensure_slots(2 * batches.len());
        shared.refill(self.batch_noise.as_mut())?;
        if let (Some(graphed), [batch]) = (&mut self.graphed, batches) {
            return graphed.update(model, learner, batch, sample_noise.as_mut(), shared);
        }
        if group.world_size() == 1 && batches.len() == 1 {
            return Ok(learner.update(model, &batches[0], sample_noise.as_mut(), shared)?);
        }
        let micro = batches.len() as f64;
        let unions = task_unions(group, model, batches)?;
        let mut passes = Vec::with_capacity(batches.len());
        for (batch, union) in batches.iter().zip(&unions) {
            renormalise_as(model, union);
            passes.push(learner.world_model_backward(
                model,
                batch,
                sample_noise.as_mut(),
                shared,
            )?);
        }
        let started = Instant::now();
        average(group, learner.model_grads_mut(), micro)?;
        self.comm.grad_all_reduce += started.elapsed().as_secs_f64();
        let grad_norm = learner.step_world_model(model);

        let mut gather_seconds = 0.0;
        let mut gather = |q: &Tensor| -> crate::agent::Result<Tensor> {
            let started = Instant::now();
            let gathered = group
                .all_gather(q)
                .map_err(|e| crate::agent::Error::Config(e.to_string()));
            gather_seconds += started.elapsed().as_secs_f64();
            gathered
        };
        let mut policy_passes = Vec::with_capacity(passes.len());
        for (pass, union) in passes.iter().zip(&unions) {
            renormalise_as(model, union);
            policy_passes.push(learner.policy_backward(
                model,
                &pass.latents,
                pass.task.as_ref(),
                sample_noise.as_mut(),
                shared,
                &mut gather,
            )?);
        }
        renormalise_as(model, &None);
        // The embedding gradient each rank's policy loss leaves for the next step, averaged
        // now: every rank carries the same (and a checkpoint holds it).
        if let Some(mut carried) = learner.carried_task_grad(model) {
            group.all_reduce_mean(&mut carried)?;
        }
        self.comm.other += gather_seconds;
        let started = Instant::now();
        average(group, learner.policy_grads_mut(), micro)?;
        self.comm.grad_all_reduce += started.elapsed().as_secs_f64();
        let pi_grad_norm = learner.step_policy(model);
        model.soft_update_target(self.tau);
        let (wm, pi) = (mean_passes(&passes), mean_policy(&policy_passes));
        // Losses are per-rank means: averaged, they are the losses of the whole N·k·B batch
        // (the grad norms and the scale are already global and stay as they are).
        let mut info = learner.info(&wm, grad_norm, &pi, pi_grad_norm);
        let started = Instant::now();
        group.all_reduce_mean(&mut info.values)?;
        self.comm.other += started.elapsed().as_secs_f64();
        Ok(info)
    }
}

/// A multitask model on several ranks: for each micro-batch, the tasks any rank's holds, as a
/// mask over the task table, nonzero where held (one collective for all; no host read, as
/// a CUDA graph needs). Otherwise nothing: each lookup renormalises its own rows.
fn task_unions(
    group: &ProcessGroup,
    model: &WorldModel,
    batches: &[Batch],
) -> Result<Vec<Option<Tensor>>> {
    let (Some(table), true) = (&model.task, group.world_size() > 1) else {
        return Ok(batches.iter().map(|_| None).collect());
    };
    let (tasks, device) = (table.weight.size()[0], model.device());
    let mut seen = Tensor::zeros([batches.len() as i64, tasks], (Kind::Float, device));
    for (i, batch) in batches.iter().enumerate() {
        let ids = batch.task.as_ref().ok_or_else(|| {
            Error::Config("a multitask model needs the task of every sample".into())
        })?;
        let _ = seen
            .get(i as i64)
            .index_fill_(0, &ids.to_device(device).to_kind(Kind::Int64), 1.0);
    }
    group.all_reduce_mean(&mut seen)?;
    Ok((0..batches.len() as i64)
        .map(|i| Some(seen.get(i)))
        .collect())
}

fn renormalise_as(model: &mut WorldModel, union: &Option<Tensor>) {
    if let Some(table) = model.task.as_mut() {
        table.renormalise_as(union.as_ref().map(Tensor::shallow_clone));
    }
}

/// Sum over micro-batches → mean over micro-batches and ranks.
fn average(group: &ProcessGroup, grads: &mut Tensor, micro: f64) -> Result<()> {
    if micro > 1.0 {
        let _ = grads.divide_scalar_(micro);
    }
    group.all_reduce_mean(grads)
}

fn mean_of(values: Vec<&Tensor>) -> Tensor {
    Tensor::stack(&values, 0).mean(tch::Kind::Float)
}

fn mean_passes(passes: &[crate::agent::WorldModelPass]) -> crate::agent::WorldModelPass {
    crate::agent::WorldModelPass {
        consistency_loss: mean_of(passes.iter().map(|p| &p.consistency_loss).collect()),
        reward_loss: mean_of(passes.iter().map(|p| &p.reward_loss).collect()),
        value_loss: mean_of(passes.iter().map(|p| &p.value_loss).collect()),
        termination_loss: mean_of(passes.iter().map(|p| &p.termination_loss).collect()),
        termination_rate: mean_of(passes.iter().map(|p| &p.termination_rate).collect()),
        termination_f1: mean_of(passes.iter().map(|p| &p.termination_f1).collect()),
        total_loss: mean_of(passes.iter().map(|p| &p.total_loss).collect()),
        latents: passes[0].latents.shallow_clone(),
        task: passes[0].task.as_ref().map(Tensor::shallow_clone),
    }
}

fn mean_policy(passes: &[crate::agent::PolicyPass]) -> crate::agent::PolicyPass {
    crate::agent::PolicyPass {
        pi_loss: mean_of(passes.iter().map(|p| &p.pi_loss).collect()),
        entropy: mean_of(passes.iter().map(|p| &p.entropy).collect()),
        scaled_entropy: mean_of(passes.iter().map(|p| &p.scaled_entropy).collect()),
    }
}
