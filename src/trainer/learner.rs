//! The learner of one rank: its replay buffer and the synchronised TD-MPC2 update.
//!
//! With `sync_freq = k`, each rank computes the gradients of k micro-batches (all world-model
//! passes, then one optimiser step on the averaged gradients; then all policy passes on the
//! stored latents, then one policy step). Gradients are averaged over ranks and micro-batches,
//! so N ranks × k micro-batches of B behave as one update on a batch of N·k·B. The Q scale is
//! updated at every micro-batch from the Q values gathered from all ranks.
use rand_pcg::Pcg64;
use tch::{Device, Tensor};

use crate::agent::{Agent, Batch, UpdateInfo};
use crate::buffer::{Episode, ReplayBuffer};
use crate::config::Config;
use crate::dist::ProcessGroup;
use crate::error::Result;

pub struct Learner<'g> {
    pub buffer: ReplayBuffer,
    batch_size: usize,
    horizon: usize,
    sync_freq: usize,
    tau: f64,
    group: &'g ProcessGroup,
}

impl<'g> Learner<'g> {
    pub fn new(
        config: &Config,
        capacity: usize,
        device: Device,
        group: &'g ProcessGroup,
    ) -> Result<Self> {
        let obs_dim = config
            .obs_shape
            .as_ref()
            .map(|s| s.iter().product())
            .unwrap_or(0);
        let action_dim = config.action_dim.unwrap_or(0);
        Ok(Self {
            buffer: ReplayBuffer::new(capacity, obs_dim, action_dim, device)?,
            batch_size: config.batch_size,
            horizon: config.horizon,
            sync_freq: config.sync_freq,
            tau: config.tau,
            group,
        })
    }

    pub fn add_episode(&mut self, episode: &Episode) -> Result<()> {
        self.buffer.add(episode)
    }

    /// Makes every rank start from rank 0's parameters and target Qs.
    pub fn broadcast_parameters(&self, agent: &mut Agent) -> Result<()> {
        let model = &agent.model;
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
    pub fn update(&mut self, agent: &mut Agent, rng: &mut Pcg64) -> Result<UpdateInfo> {
        let batches = (0..self.sync_freq)
            .map(|_| self.sample(rng))
            .collect::<Result<Vec<_>>>()?;
        self.update_on(agent, &batches)
    }

    /// One synchronised update on the given micro-batches.
    pub fn update_on(&mut self, agent: &mut Agent, batches: &[Batch]) -> Result<UpdateInfo> {
        let group = self.group;
        if group.world_size() == 1 && batches.len() == 1 {
            return Ok(agent.update(&batches[0])?);
        }
        let Agent {
            model,
            learner,
            sample_noise,
            batch_noise,
            ..
        } = agent;
        let micro = batches.len() as f64;
        let mut passes = Vec::with_capacity(batches.len());
        for batch in batches {
            passes.push(learner.world_model_backward(
                model,
                batch,
                sample_noise.as_mut(),
                batch_noise.as_mut(),
            )?);
        }
        average(group, learner.model_grads_mut(), micro)?;
        let grad_norm = learner.step_world_model(model);

        let mut gather = |q: &Tensor| -> crate::agent::Result<Tensor> {
            group
                .all_gather(q)
                .map_err(|e| crate::agent::Error::Config(e.to_string()))
        };
        let mut policy_passes = Vec::with_capacity(passes.len());
        for pass in &passes {
            policy_passes.push(learner.policy_backward(
                model,
                &pass.latents,
                sample_noise.as_mut(),
                batch_noise.as_mut(),
                &mut gather,
            )?);
        }
        average(group, learner.policy_grads_mut(), micro)?;
        let pi_grad_norm = learner.step_policy(model);
        model.soft_update_target(self.tau);
        let (wm, pi) = (mean_passes(&passes), mean_policy(&policy_passes));
        // Losses are per-rank means: averaged, they are the losses of the whole N·k·B batch
        // (the grad norms and the scale are already global and stay as they are).
        let mut info = learner.info(&wm, grad_norm, &pi, pi_grad_norm);
        group.all_reduce_mean(&mut info.values)?;
        Ok(info)
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
        total_loss: mean_of(passes.iter().map(|p| &p.total_loss).collect()),
        latents: passes[0].latents.shallow_clone(),
    }
}

fn mean_policy(passes: &[crate::agent::PolicyPass]) -> crate::agent::PolicyPass {
    crate::agent::PolicyPass {
        pi_loss: mean_of(passes.iter().map(|p| &p.pi_loss).collect()),
        entropy: mean_of(passes.iter().map(|p| &p.entropy).collect()),
        scaled_entropy: mean_of(passes.iter().map(|p| &p.scaled_entropy).collect()),
    }
}
