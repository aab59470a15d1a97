//! What planning needs from a model ([`LatentModel`]), the world model's answer to it, and
//! the rollouts the planner scores candidates with.
use tch::{Device, Kind, Tensor};

use crate::agent::ensemble::Heads;
use crate::agent::error::{Error, Result};
use crate::agent::noise::Noise;
use crate::agent::task::{self, TaskRows};
use crate::agent::world_model::{QParams, QReduce, WorldModel};

/// What planning needs from a model. Latent arguments are (N, Z), or (G, Z) with G < N for G
/// latents each shared by N/G consecutive rows of the other argument (the first planning step
/// of G environments), which implementations may exploit.
pub trait LatentModel {
    fn device(&self) -> Device;
    fn obs_dim(&self) -> i64;
    fn latent_dim(&self) -> i64;
    fn action_dim(&self) -> i64;
    fn num_q(&self) -> i64;
    /// Observations (E, obs_dim) → latents (E, Z); pixel encoders draw shifts from `noise`.
    fn encode(&self, obs: &Tensor, noise: &mut dyn Noise) -> Result<Tensor>;
    /// Next latents (N, Z).
    fn next(&self, z: &Tensor, a: &Tensor) -> Tensor;
    /// Decoded rewards (H·N, 1) of a rollout of N rows over H steps, step-major: step 0 from the
    /// latents `z0` (G, Z), each shared by N/G consecutive rows; step t ≥ 1 from `later[t − 1]`
    /// (N, Z); the actions (H·N, A).
    fn rollout_rewards(&self, z0: &Tensor, later: &[Tensor], actions: &Tensor) -> Tensor;
    /// For the latents (N, Z) of each step, 1.0 where the latent is terminal, 0.0 elsewhere,
    /// step-major (steps·N, 1); `None` if never terminal.
    fn terminal(&self, steps: &[Tensor]) -> Option<Tensor>;
    /// Policy-prior sample with standard-normal noise `eps` (N, A).
    fn policy_action(&self, z: &Tensor, eps: &Tensor) -> Tensor;
    /// Mean of the two Q heads of `pair` (N, 1), without dropout.
    fn q_avg(&self, z: &Tensor, a: &Tensor, pair: &Heads) -> Result<Tensor>;
    /// A candidate's value, `returns + factor·q_avg(z, a, pair)` (N, 1): `returns` (N, 1),
    /// `factor` (N, 1) or one value (the discount over the horizon, zero past a terminal step).
    fn bootstrapped(
        &self,
        z: &Tensor,
        a: &Tensor,
        pair: &Heads,
        returns: &Tensor,
        factor: &Tensor,
    ) -> Result<Tensor> {
        Ok(returns + factor * self.q_avg(z, a, pair)?)
    }
    /// Each environment's action mask (E, A) where its task has fewer actions than the model.
    fn action_mask(&self) -> Option<&Tensor> {
        None
    }
    /// Each environment's discount (E, 1) where they differ by task; `None`: the planner's.
    fn discount(&self) -> Option<&Tensor> {
        None
    }
    /// Why this model cannot plan as it is (a multitask model without its tasks).
    fn unusable(&self) -> Option<&'static str> {
        None
    }
}

/// Whether each latent of `z` is shared by several consecutive rows of `other`.
fn is_shared(z: &Tensor, other: &Tensor) -> bool {
    z.size()[0] < other.size()[0]
}

impl LatentModel for WorldModel {
    fn device(&self) -> Device {
        WorldModel::device(self)
    }
    fn obs_dim(&self) -> i64 {
        self.obs_dim
    }
    fn latent_dim(&self) -> i64 {
        self.latent_dim
    }
    fn action_dim(&self) -> i64 {
        self.action_dim
    }
    fn num_q(&self) -> i64 {
        self.q.size
    }
    fn encode(&self, obs: &Tensor, noise: &mut dyn Noise) -> Result<Tensor> {
        WorldModel::encode(self, obs, None, noise)
    }
    fn next(&self, z: &Tensor, a: &Tensor) -> Tensor {
        if is_shared(z, a) {
            self.next_shared(z, a)
        } else {
            WorldModel::next(self, z, a, None)
        }
    }
    fn rollout_rewards(&self, z0: &Tensor, later: &[Tensor], actions: &Tensor) -> Tensor {
        self.two_hot
            .decode(&self.reward.forward_rollout(z0, later, actions))
    }
    fn terminal(&self, steps: &[Tensor]) -> Option<Tensor> {
        // Nothing to concatenate where the model never terminates.
        self.termination.as_ref()?;
        self.termination_logits(&Tensor::cat(steps, 0))
            .map(|logits| logits.sigmoid().gt(0.5).to_kind(Kind::Float))
    }
    fn policy_action(&self, z: &Tensor, eps: &Tensor) -> Tensor {
        if is_shared(z, eps) {
            self.pi_action_shared(z, eps)
        } else {
            self.pi_action(z, eps, None)
        }
    }
    fn q_avg(&self, z: &Tensor, a: &Tensor, pair: &Heads) -> Result<Tensor> {
        self.q_value(z, a, None, QParams::Online, pair, QReduce::Avg, None)
    }
    /// With the fused kernels, the pair's decoding, their mean and the bootstrap are one kernel.
    fn bootstrapped(
        &self,
        z: &Tensor,
        a: &Tensor,
        pair: &Heads,
        returns: &Tensor,
        factor: &Tensor,
    ) -> Result<Tensor> {
        if !(matches!(pair, Heads::Pair(_)) && crate::cuda::fused::applies_to(z)) {
            return Ok(returns + factor * self.q_avg(z, a, pair)?);
        }
        let logits = self.q_logits(z, a, None, QParams::Online, pair, None)?;
        let rows = returns.numel() as i64;
        let value = crate::cuda::fused::q_bootstrap(
            &logits,
            &self.two_hot.support,
            &returns.reshape([rows]),
            &factor.reshape([-1]),
        )?;
        Ok(value.view([rows, 1]))
    }
    fn unusable(&self) -> Option<&'static str> {
        self.task
            .is_some()
            .then_some("a multitask model plans with its environments' tasks (TaskModel)")
    }
}

/// A multitask world model planning for E environments, each with its task: every head gets
/// its rows' task embeddings, and the planner the tasks' action masks and discounts.
pub struct TaskModel<'m> {
    model: &'m WorldModel,
    /// One row per environment.
    rows: TaskRows,
}

impl<'m> TaskModel<'m> {
    /// `task` (E,): each environment's task id.
    pub fn new(model: &'m WorldModel, task: &Tensor) -> Result<Self> {
        let rows = model
            .task_rows(Some(&task.to_device(model.device())))?
            .ok_or_else(|| Error::Config("task ids given to a single-task model".into()))?;
        Ok(Self { model, rows })
    }

    /// `z` (rows, Z) with the task embedding of each row appended.
    fn with_task(&self, z: &Tensor) -> Tensor {
        task::with_task(z, Some(&self.rows.for_rows(z.size()[0])))
    }
}

impl LatentModel for TaskModel<'_> {
    fn device(&self) -> Device {
        self.model.device()
    }
    fn obs_dim(&self) -> i64 {
        self.model.obs_dim
    }
    fn latent_dim(&self) -> i64 {
        self.model.latent_dim
    }
    fn action_dim(&self) -> i64 {
        self.model.action_dim
    }
    fn num_q(&self) -> i64 {
        self.model.q.size
    }
    fn encode(&self, obs: &Tensor, noise: &mut dyn Noise) -> Result<Tensor> {
        self.model.encode(obs, Some(&self.rows), noise)
    }
    fn next(&self, z: &Tensor, a: &Tensor) -> Tensor {
        // The input is [z, emb, a]: a shared latent's [z, emb] is shared as well.
        if is_shared(z, a) {
            self.model
                .dynamics
                .forward_rollout(&self.with_task(z), &[], a)
        } else {
            let rows = self.rows.for_rows(z.size()[0]);
            self.model.next(z, a, Some(&rows))
        }
    }
    fn rollout_rewards(&self, z0: &Tensor, later: &[Tensor], actions: &Tensor) -> Tensor {
        let later: Vec<Tensor> = later.iter().map(|z| self.with_task(z)).collect();
        let logits = self
            .model
            .reward
            .forward_rollout(&self.with_task(z0), &later, actions);
        self.model.two_hot.decode(&logits)
    }
    fn terminal(&self, _steps: &[Tensor]) -> Option<Tensor> {
        // Multitask models are not episodic (as the official).
        None
    }
    fn policy_action(&self, z: &Tensor, eps: &Tensor) -> Tensor {
        let rows = self.rows.for_rows(eps.size()[0]);
        let z = match eps.size()[0] / z.size()[0].max(1) {
            1 => z.shallow_clone(),
            k => z.repeat_interleave_self_int(k, 0, None),
        };
        self.model.pi_action(&z, eps, Some(&rows))
    }
    fn q_avg(&self, z: &Tensor, a: &Tensor, pair: &Heads) -> Result<Tensor> {
        let rows = self.rows.for_rows(z.size()[0]);
        let (params, reduce) = (QParams::Online, QReduce::Avg);
        self.model
            .q_value(z, a, Some(&rows), params, pair, reduce, None)
    }
    fn action_mask(&self) -> Option<&Tensor> {
        Some(&self.rows.mask)
    }
    fn discount(&self) -> Option<&Tensor> {
        Some(&self.rows.discount)
    }
}

/// Returns (E, R, 1), final latents (E, R, Z) and termination flags (E, R, 1) of R candidate
/// rollouts per environment.
pub(super) struct Rollout {
    pub(super) returns: Tensor,
    pub(super) latents: Tensor,
    pub(super) terminated: Option<Tensor>,
}

impl Rollout {
    pub(super) fn first_rows(&self, rows: i64) -> Rollout {
        let take = |t: &Tensor| t.narrow(1, 0, rows).copy();
        Rollout {
            returns: take(&self.returns),
            latents: take(&self.latents),
            terminated: self.terminated.as_ref().map(take),
        }
    }

    pub(super) fn concat(&self, rest: &Rollout) -> Rollout {
        let cat = |a: &Tensor, b: &Tensor| Tensor::cat(&[a, b], 1);
        Rollout {
            returns: cat(&self.returns, &rest.returns),
            latents: cat(&self.latents, &rest.latents),
            terminated: match (&self.terminated, &rest.terminated) {
                (Some(a), Some(b)) => Some(cat(a, b)),
                _ => None,
            },
        }
    }
}
