//! What planning needs from a model ([`LatentModel`]), the world model's answer to it, and
//! the rollouts the planner scores candidates with.
use tch::{Device, Kind, Tensor};

use crate::agent::layers::Heads;
use crate::agent::noise::Noise;
use crate::agent::world_model::{QParams, QReduce, WorldModel};
use crate::agent::Result;

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
