//! The TD-MPC2 update (official `_update`, `update_pi` and the soft target update), split into
//! gradient computation and optimiser steps so that a distributed trainer can all-reduce or
//! accumulate gradients in between:
//!
//! 1. [`Updater::world_model_backward`] → gradients in [`Updater::model_grads_mut`]
//! 2. [`Updater::step_world_model`] (clip, Adam)
//! 3. [`Updater::policy_backward`] (the Q scale is updated from values the caller may gather
//!    from all ranks) → gradients in [`Updater::policy_grads_mut`]
//! 4. [`Updater::step_policy`] (clip, Adam)
//! 5. [`WorldModel::soft_update_target`]
//!
//! [`Updater::update`] runs all five for a single process.
use tch::{Kind, Reduction, Tensor};

use super::adam::{clip_grad_norm, parameter_views, Adam, ParamGroup};
use super::config::AgentConfig;
use super::ensemble::Heads;
use super::error::{expect_shape, Result};
use super::noise::Noise;
use super::scale::RunningScale;
use super::task::TaskRows;
pub use super::update_stats::{UpdateInfo, UpdateStats};
use super::world_model::{QParams, QReduce, WorldModel};
use crate::buffer::Batch;

const BETAS: (f64, f64) = (0.9, 0.999);
const MODEL_EPS: f64 = 1e-8;
const POLICY_EPS: f64 = 1e-5;

/// An episodic model's termination loss on the predicted latents ẑ_1..ẑ_H and the official
/// statistics of the last step (rate, F1); zeros for a model that never terminates.
fn termination_terms(
    model: &WorldModel,
    predicted: &Tensor,
    terminated: &Tensor,
) -> (Tensor, Tensor, Tensor) {
    let Some(head) = model.termination.as_ref() else {
        let zero = || Tensor::zeros([], (Kind::Float, model.device()));
        return (zero(), zero(), zero());
    };
    let logits = head.forward(predicted);
    let loss =
        logits.binary_cross_entropy_with_logits::<Tensor>(terminated, None, None, Reduction::Mean);
    let last = predicted.size()[0] - 1;
    let (rate, f1) = super::math::termination_statistics(
        &logits.get(last).detach().sigmoid(),
        &terminated.get(last),
    );
    (loss, rate, f1)
}

/// Checks a batch's shapes against the model and horizon; returns the batch size.
fn batch_size_of(batch: &Batch, model: &WorldModel, horizon: i64) -> Result<i64> {
    let b = *batch.obs.size().get(1).unwrap_or(&0);
    expect_shape("batch.obs", &batch.obs, &[horizon + 1, b, model.obs_dim])?;
    expect_shape(
        "batch.action",
        &batch.action,
        &[horizon, b, model.action_dim],
    )?;
    expect_shape("batch.reward", &batch.reward, &[horizon, b, 1])?;
    expect_shape("batch.terminated", &batch.terminated, &[horizon, b, 1])?;
    if let Some(task) = &batch.task {
        expect_shape("batch.task", task, &[b])?;
    }
    Ok(b)
}

/// Losses of one world-model backward pass (device scalars) and the latents for the policy.
#[derive(Debug)]
pub struct WorldModelPass {
    pub consistency_loss: Tensor,
    pub reward_loss: Tensor,
    pub value_loss: Tensor,
    pub termination_loss: Tensor,
    /// Episodic tasks: the official termination statistics of the last step (zero otherwise).
    pub termination_rate: Tensor,
    pub termination_f1: Tensor,
    pub total_loss: Tensor,
    /// The rollout ẑ_0..ẑ_H, detached: (H+1, B, latent_dim).
    pub latents: Tensor,
    /// A multitask batch's task ids (B,), for the policy pass on these latents.
    pub task: Option<Tensor>,
}

/// Results of one policy backward pass (device scalars).
#[derive(Debug)]
pub struct PolicyPass {
    pub pi_loss: Tensor,
    pub entropy: Tensor,
    pub scaled_entropy: Tensor,
}

/// Optimiser state, Q scale and gradient buffers of the TD-MPC2 update.
#[derive(Debug)]
pub struct Updater {
    config: AgentConfig,
    pub model_optim: Adam,
    pub policy_optim: Adam,
    pub scale: RunningScale,
    model_grads: Tensor,
    policy_grads: Tensor,
    /// Each parameter's view of the two gradient buffers, for the clipping norm.
    model_grad_views: Vec<Tensor>,
    policy_grad_views: Vec<Tensor>,
    /// Whether the gradient buffers hold gradients not yet consumed by a step (the next
    /// backward adds to them instead of overwriting).
    model_grads_pending: bool,
    policy_grads_pending: bool,
    /// ρ^t for t = 0..=H.
    rho_powers: Tensor,
}

impl Updater {
    pub fn new(config: &AgentConfig, model: &WorldModel) -> Result<Self> {
        config.validate()?;
        let flat = &model.model_params.flat;
        let (enc_start, enc_end) = model.encoder_range();
        let model_groups = vec![
            ParamGroup {
                start: enc_start,
                end: enc_end,
                lr: config.lr * config.enc_lr_scale,
            },
            ParamGroup {
                start: enc_end,
                end: model.model_params.numel(),
                lr: config.lr,
            },
        ];
        let model_optim = Adam::new(flat, model_groups, BETAS.0, BETAS.1, MODEL_EPS)?;
        let policy_flat = &model.policy_params.flat;
        let policy_groups = vec![ParamGroup {
            start: 0,
            end: model.policy_params.numel(),
            lr: config.lr,
        }];
        let policy_optim = Adam::new(policy_flat, policy_groups, BETAS.0, BETAS.1, POLICY_EPS)?;
        let model_grads = flat.zeros_like().detach();
        let policy_grads = policy_flat.zeros_like().detach();
        let model_grad_views = parameter_views(&model_grads, &model.model_params.entries);
        let policy_grad_views = parameter_views(&policy_grads, &model.policy_params.entries);
        let rho: Vec<f32> = (0..=config.horizon)
            .map(|t| config.rho.powi(t as i32) as f32)
            .collect();
        Ok(Self {
            config: config.clone(),
            model_optim,
            policy_optim,
            scale: RunningScale::new(config.tau, model.device()),
            model_grads,
            policy_grads,
            model_grad_views,
            policy_grad_views,
            model_grads_pending: false,
            policy_grads_pending: false,
            rho_powers: Tensor::from_slice(&rho).to_device(model.device()),
        })
    }

    /// The steps both optimisers have taken, as the host counts them.
    pub fn step_counts(&self) -> [u64; 2] {
        [
            self.model_optim.step_count(),
            self.policy_optim.step_count(),
        ]
    }

    /// Sets the host's step counts: a caller that replays updates in a CUDA graph counts them
    /// itself (a replay advances only the device's counts; a capture counts a step that
    /// nothing ran).
    pub fn set_step_counts(&mut self, [model, policy]: [u64; 2]) {
        self.model_optim.set_step_count(model);
        self.policy_optim.set_step_count(policy);
    }

    /// The world-model gradient buffer (layout of `model.model_params`), e.g. for an all-reduce.
    pub fn model_grads_mut(&mut self) -> &mut Tensor {
        &mut self.model_grads
    }

    /// Both optimisers' rates rise linearly over their first `steps` steps.
    pub fn with_warmup(mut self, steps: u64) -> Self {
        self.model_optim = self.model_optim.with_warmup(steps);
        self.policy_optim = self.policy_optim.with_warmup(steps);
        self
    }

    /// The policy gradient buffer (layout of `model.policy_params`).
    pub fn policy_grads_mut(&mut self) -> &mut Tensor {
        &mut self.policy_grads
    }

    /// TD targets y_t = r_t + γ(1 − d_t)·min of two target heads at (z'_{t+1}, π(z'_{t+1})),
    /// with z' from the online encoder. Returns (next latents, targets).
    fn td_targets(
        &self,
        model: &WorldModel,
        batch: &Batch,
        task: Option<&TaskRows>,
        sample_noise: &mut dyn Noise,
        batch_noise: &mut dyn Noise,
    ) -> Result<(Tensor, Tensor)> {
        let h = self.config.horizon as i64;
        tch::no_grad(|| {
            let next_z = model.encode(&batch.obs.narrow(0, 1, h), task, sample_noise)?;
            let mut shape = next_z.size();
            if let Some(last) = shape.last_mut() {
                *last = model.action_dim;
            }
            let eps = sample_noise.randn(&shape, model.device())?;
            let action = model.pi_action(&next_z, &eps, task);
            let heads = Heads::random_pair(batch_noise, self.config.num_q as i64, model.device())?;
            let q = model.q_value(
                &next_z,
                &action,
                task,
                QParams::Target,
                &heads,
                QReduce::Min,
                None,
            )?;
            let continuing = match task {
                Some(task) => (1.0f64 - &batch.terminated) * &task.discount,
                None => (1.0f64 - &batch.terminated) * self.config.discount,
            };
            Ok((next_z, &batch.reward + continuing * q))
        })
    }

    /// Computes the world-model losses on `batch` and adds their gradients to the world-model
    /// gradient buffer. Draws: policy noise for the TD actions (sample stream), then one
    /// permutation for the target heads (batch stream).
    pub fn world_model_backward(
        &mut self,
        model: &WorldModel,
        batch: &Batch,
        sample_noise: &mut dyn Noise,
        batch_noise: &mut dyn Noise,
    ) -> Result<WorldModelPass> {
        let h = self.config.horizon as i64;
        batch_size_of(batch, model, h)?;
        let batch = &batch.to_device(model.device());
        let rows = model.task_rows(batch.task.as_ref())?;
        let task = rows.as_ref();
        let (next_z, td_targets) =
            self.td_targets(model, batch, task, sample_noise, batch_noise)?;
        let cfg = &self.config;

        // Latent rollout from the encoded first observation, with gradients.
        let mut z = model.encode(&batch.obs.get(0), task, sample_noise)?;
        let mut latents = vec![z.shallow_clone()];
        for t in 0..h {
            z = model.next(&z, &batch.action.get(t), task);
            latents.push(z.shallow_clone());
        }
        let zs = Tensor::stack(&latents, 0);
        let rho = self.rho_powers.narrow(0, 0, h);
        let per_step_mean = |x: &Tensor| x.flatten(1, -1).mean_dim(-1, false, Kind::Float);

        let predicted = zs.narrow(0, 1, h);
        let consistency =
            (per_step_mean(&(&predicted - &next_z).square()) * &rho).sum(Kind::Float) / h as f64;

        let rollout = zs.narrow(0, 0, h);
        let reward_logits = model.reward(&rollout, &batch.action, task);
        let reward_ce = model.two_hot.soft_ce(&reward_logits, &batch.reward);
        let reward_loss = (per_step_mean(&reward_ce) * &rho).sum(Kind::Float) / h as f64;

        let q_logits = model.q_logits(
            &rollout,
            &batch.action,
            task,
            QParams::Online,
            &Heads::All,
            Some(sample_noise),
        )?;
        let value_ce = model.two_hot.soft_ce(&q_logits, &td_targets); // (K, H, B, 1)
        let value_per_step = value_ce
            .flatten(2, -1)
            .mean_dim(-1, false, Kind::Float)
            .sum_dim_intlist(0, false, Kind::Float);
        let value_loss = (value_per_step * &rho).sum(Kind::Float) / (h * cfg.num_q as i64) as f64;

        let (termination_loss, termination_rate, termination_f1) =
            termination_terms(model, &predicted, &batch.terminated);
        let total_loss = &consistency * cfg.consistency_coef
            + &reward_loss * cfg.reward_coef
            + &termination_loss * cfg.termination_coef
            + &value_loss * cfg.value_coef;

        let grads =
            Tensor::f_run_backward(&[&total_loss], model.model_params.views(), false, false)?;
        model
            .model_params
            .gather_grads(&grads, &mut self.model_grads, self.model_grads_pending)?;
        self.model_grads_pending = true;
        Ok(WorldModelPass {
            consistency_loss: consistency.detach(),
            reward_loss: reward_loss.detach(),
            value_loss: value_loss.detach(),
            termination_loss: termination_loss.detach(),
            termination_rate,
            termination_f1,
            total_loss: total_loss.detach(),
            latents: zs.detach(),
            task: batch.task.as_ref().map(Tensor::shallow_clone),
        })
    }

    /// Clips the accumulated world-model gradients and takes an Adam step; returns the norm
    /// before clipping.
    pub fn step_world_model(&mut self, model: &WorldModel) -> Result<Tensor> {
        let norm = clip_grad_norm(
            &mut self.model_grads,
            &self.model_grad_views,
            self.config.grad_clip_norm,
        )?;
        self.model_optim
            .step(&model.model_params.flat, &self.model_grads)?;
        self.model_grads_pending = false;
        Ok(norm)
    }

    /// Computes the policy loss on the (detached) latents and adds its gradients to the policy
    /// gradient buffer. Before the loss, the Q scale is updated from `gather(Q(ẑ_0, π(ẑ_0)))`:
    /// a distributed caller gathers the values of all ranks there; otherwise pass the identity.
    /// Draws: policy noise (sample stream), then one permutation for the two online heads
    /// (batch stream).
    pub fn policy_backward(
        &mut self,
        model: &WorldModel,
        latents: &Tensor,
        task: Option<&Tensor>,
        sample_noise: &mut dyn Noise,
        batch_noise: &mut dyn Noise,
        gather: &mut dyn FnMut(&Tensor) -> Result<Tensor>,
    ) -> Result<PolicyPass> {
        let cfg = &self.config;
        let steps = cfg.horizon as i64 + 1;
        let batch_size = *latents.size().get(1).unwrap_or(&0);
        expect_shape(
            "policy latents",
            latents,
            &[steps, batch_size, model.latent_dim],
        )?;
        let latents = &latents.to_device(model.device());
        // Looked up after the world model's step, as the official (its rows renormalised again).
        let rows = model.task_rows(task.map(|t| t.to_device(model.device())).as_ref())?;
        let task = rows.as_ref();
        let eps = sample_noise.randn(&[steps, batch_size, model.action_dim], model.device())?;
        let policy = model.pi(latents, &eps, task);
        let heads = Heads::random_pair(batch_noise, cfg.num_q as i64, model.device())?;
        let q = model.q_value(
            latents,
            &policy.action,
            task,
            QParams::Detached,
            &heads,
            QReduce::Avg,
            Some(sample_noise),
        )?;
        let gathered = gather(&q.get(0).detach())?;
        self.scale.update(&gathered);
        let q = self.scale.normalize(&q);
        let objective = (&policy.scaled_entropy * cfg.entropy_coef + q).mean_dim(
            [1, 2].as_slice(),
            false,
            Kind::Float,
        );
        let pi_loss = (-objective * &self.rho_powers).mean(Kind::Float);
        let mut inputs: Vec<&Tensor> = model.policy_params.views().iter().collect();
        let task_emb = model.task.as_ref().map(|t| &t.weight);
        inputs.extend(task_emb);
        let mut grads = Tensor::f_run_backward(&[&pi_loss], &inputs, false, false)?;
        if task_emb.is_some() {
            let emb_grad = grads.pop().expect("the task embedding's gradient");
            self.carry_task_grad(model, &emb_grad)?;
        }
        model.policy_params.gather_grads(
            &grads,
            &mut self.policy_grads,
            self.policy_grads_pending,
        )?;
        self.policy_grads_pending = true;
        Ok(PolicyPass {
            pi_loss: pi_loss.detach(),
            entropy: policy.entropy.detach().mean(Kind::Float),
            scaled_entropy: policy.scaled_entropy.detach().mean(Kind::Float),
        })
    }

    /// Clips the accumulated policy gradients and takes an Adam step; returns the norm before
    /// clipping.
    pub fn step_policy(&mut self, model: &WorldModel) -> Result<Tensor> {
        let norm = clip_grad_norm(
            &mut self.policy_grads,
            &self.policy_grad_views,
            self.config.grad_clip_norm,
        )?;
        self.policy_optim
            .step(&model.policy_params.flat, &self.policy_grads)?;
        self.policy_grads_pending = false;
        Ok(norm)
    }

    /// One complete update for a single process.
    pub fn update(
        &mut self,
        model: &mut WorldModel,
        batch: &Batch,
        sample_noise: &mut dyn Noise,
        batch_noise: &mut dyn Noise,
    ) -> Result<UpdateInfo> {
        let wm = self.world_model_backward(model, batch, sample_noise, batch_noise)?;
        let grad_norm = self.step_world_model(model)?;
        let pi = self.policy_backward(
            model,
            &wm.latents,
            wm.task.as_ref(),
            sample_noise,
            batch_noise,
            &mut |q| Ok(q.shallow_clone()),
        )?;
        let pi_grad_norm = self.step_policy(model)?;
        model.soft_update_target(self.config.tau);
        Ok(self.info(&wm, grad_norm, &pi, pi_grad_norm))
    }

    /// The policy loss's gradient of the task embedding, left for the next world-model step
    /// as the official code leaves it: its policy optimiser neither steps nor clears the
    /// embedding, whose gradient then adds to the next update's.
    fn carry_task_grad(&mut self, model: &WorldModel, grad: &Tensor) -> Result<()> {
        let (start, end) = model
            .model_params
            .range_of(super::task::TASK_EMB)
            .ok_or_else(|| super::error::Error::Config("the model has no task embedding".into()))?;
        tch::no_grad(|| {
            if !self.model_grads_pending {
                let _ = self.model_grads.zero_();
                self.model_grads_pending = true;
            }
            let mut slot = self.model_grads.narrow(0, start, end - start);
            slot += grad.reshape([-1]);
        });
        Ok(())
    }

    /// The task embedding's gradient carried to the next world-model step (see
    /// [`Self::carry_task_grad`]) of a multitask model: a view into the gradient buffer while
    /// one is carried (an in-place collective lands in it), zeros otherwise.
    pub fn carried_task_grad(&self, model: &WorldModel) -> Option<Tensor> {
        let (start, end) = model.model_params.range_of(super::task::TASK_EMB)?;
        let view = self.model_grads.narrow(0, start, end - start);
        Some(match self.model_grads_pending {
            true => view,
            false => view.zeros_like(),
        })
    }

    /// Carries `grad` to the next world-model step, as a checkpoint saved it.
    pub fn restore_carried_task_grad(&mut self, model: &WorldModel, grad: &Tensor) -> Result<()> {
        let (start, end) = model
            .model_params
            .range_of(super::task::TASK_EMB)
            .ok_or_else(|| super::error::Error::Config("the model has no task embedding".into()))?;
        if grad.numel() as i64 != end - start {
            return Err(super::error::Error::Config(format!(
                "a carried task-embedding gradient of {} numbers for a table of {}",
                grad.numel(),
                end - start
            )));
        }
        tch::no_grad(|| {
            let _ = self.model_grads.zero_();
            self.model_grads
                .narrow(0, start, end - start)
                .copy_(&grad.reshape([-1]).to_device(self.model_grads.device()));
        });
        self.model_grads_pending = true;
        Ok(())
    }

    /// Assembles the logged statistics.
    pub fn info(
        &self,
        wm: &WorldModelPass,
        grad_norm: Tensor,
        pi: &PolicyPass,
        pi_grad_norm: Tensor,
    ) -> UpdateInfo {
        let scalars = [
            wm.consistency_loss.shallow_clone(),
            wm.reward_loss.shallow_clone(),
            wm.value_loss.shallow_clone(),
            wm.termination_loss.shallow_clone(),
            wm.total_loss.shallow_clone(),
            grad_norm,
            pi.pi_loss.shallow_clone(),
            pi_grad_norm,
            pi.entropy.shallow_clone(),
            pi.scaled_entropy.shallow_clone(),
            self.scale.value().view([]),
            wm.termination_rate.shallow_clone(),
            wm.termination_f1.shallow_clone(),
        ];
        UpdateInfo {
            values: Tensor::stack(&scalars, 0).to_kind(Kind::Float),
            episodic: self.config.episodic,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::noise::{NoiseKind, ReplayNoise, TorchNoise};
    use tch::Device;

    fn small_config() -> AgentConfig {
        AgentConfig {
            enc_dim: 16,
            mlp_dim: 16,
            latent_dim: 8,
            num_q: 3,
            dropout: 0.0,
            ..AgentConfig::defaults(None, 5, 2).unwrap()
        }
    }

    fn random_batch(b: i64) -> Batch {
        let o = (Kind::Float, Device::Cpu);
        Batch {
            obs: Tensor::randn([4, b, 5], o),
            action: Tensor::rand([3, b, 2], o) * 2.0 - 1.0,
            reward: Tensor::randn([3, b, 1], o),
            terminated: Tensor::zeros([3, b, 1], o),
            task: None,
        }
    }

    fn narrow(batch: &Batch, start: i64, len: i64) -> Batch {
        Batch {
            obs: batch.obs.narrow(1, start, len),
            action: batch.action.narrow(1, start, len),
            reward: batch.reward.narrow(1, start, len),
            terminated: batch.terminated.narrow(1, start, len),
            task: None,
        }
    }

    #[test]
    fn world_model_gradients_accumulate_over_micro_batches() {
        tch::manual_seed(0);
        let config = small_config();
        let model = WorldModel::new(&config, Device::Cpu).unwrap();
        let batch = random_batch(6);
        let eps = Tensor::randn([3, 6, 2], (Kind::Float, Device::Cpu));
        let perm = || Tensor::from_slice(&[2i64, 0, 1]);

        let mut whole = Updater::new(&config, &model).unwrap();
        let (mut sample, mut perms) = (ReplayNoise::new(), ReplayNoise::new());
        sample.push(NoiseKind::Randn, eps.shallow_clone());
        perms.push(NoiseKind::Randperm, perm());
        whole
            .world_model_backward(&model, &batch, &mut sample, &mut perms)
            .unwrap();

        let mut parts = Updater::new(&config, &model).unwrap();
        for (start, len) in [(0, 3), (3, 3)] {
            let (mut sample, mut perms) = (ReplayNoise::new(), ReplayNoise::new());
            sample.push(NoiseKind::Randn, eps.narrow(1, start, len));
            perms.push(NoiseKind::Randperm, perm());
            parts
                .world_model_backward(&model, &narrow(&batch, start, len), &mut sample, &mut perms)
                .unwrap();
        }
        // Losses are batch means: the sum of two half-batch gradients is twice the whole's.
        let expected = whole.model_grads_mut().shallow_clone() * 2.0;
        let diff = (parts.model_grads_mut().shallow_clone() - &expected)
            .abs()
            .max()
            .double_value(&[]);
        assert!(
            diff < 1e-5 * (1.0 + expected.abs().max().double_value(&[])),
            "diff {diff}"
        );
        assert!(expected.abs().max().double_value(&[]) > 0.0);

        // A step consumes the gradients: the next backward overwrites instead of adding.
        let norm = parts.step_world_model(&model).unwrap();
        assert!(norm.double_value(&[]) > 0.0);
        assert_eq!(parts.model_optim.step_count(), 1);
    }

    #[test]
    fn full_update_moves_parameters_and_targets_and_reports_finite_stats() {
        tch::manual_seed(1);
        let config = AgentConfig {
            dropout: 0.01,
            ..small_config()
        };
        let mut model = WorldModel::new(&config, Device::Cpu).unwrap();
        let mut learner = Updater::new(&config, &model).unwrap();
        let before = model.model_params.flat.copy();
        let target_before = model.target_params.flat.copy();
        let mut sample = TorchNoise::seeded(1);
        let mut perms = crate::agent::noise::HostNoise::seeded(1);
        let stats = learner
            .update(&mut model, &random_batch(8), &mut sample, &mut perms)
            .unwrap()
            .fetch()
            .unwrap();
        for (name, value) in stats.named() {
            assert!(value.is_finite(), "{name} = {value}");
        }
        assert!(stats.total_loss > 0.0 && stats.grad_norm > 0.0 && stats.pi_grad_norm > 0.0);
        assert!(!model.model_params.flat.equal(&before));
        assert!(!model.target_params.flat.equal(&target_before));
        // A batch of the wrong shape is an error.
        let mut bad = random_batch(4);
        bad.reward = Tensor::zeros([3, 4, 2], (Kind::Float, Device::Cpu));
        assert!(learner
            .update(&mut model, &bad, &mut sample, &mut perms)
            .is_err());
    }

    /// Episodic tasks log the official termination statistics of the last step; others do not.
    #[test]
    fn episodic_updates_report_termination_statistics() {
        tch::manual_seed(2);
        let stats_for = |episodic: bool| {
            let config = AgentConfig {
                episodic,
                ..small_config()
            };
            let mut model = WorldModel::new(&config, Device::Cpu).unwrap();
            let mut learner = Updater::new(&config, &model).unwrap();
            let batch = random_batch(8);
            // Two of the eight sequences end at the last step.
            let _ = batch.terminated.get(2).narrow(0, 0, 2).fill_(1.0);
            let mut sample = TorchNoise::seeded(2);
            let mut perms = crate::agent::noise::HostNoise::seeded(2);
            learner
                .update(&mut model, &batch, &mut sample, &mut perms)
                .unwrap()
                .fetch()
                .unwrap()
        };
        let episodic = stats_for(true);
        assert_eq!(episodic.termination_rate, Some(0.25));
        let f1 = episodic.termination_f1.unwrap();
        assert!((0.0..=1.0).contains(&f1), "{f1}");
        let names: Vec<&str> = episodic.named().iter().map(|(n, _)| *n).collect();
        assert_eq!(names, UpdateStats::FIELDS);
        assert!(episodic.termination_loss > 0.0);
        let plain = stats_for(false);
        assert_eq!((plain.termination_rate, plain.termination_f1), (None, None));
        assert_eq!(plain.named().len(), UpdateStats::FIELDS.len() - 2);
    }
}
