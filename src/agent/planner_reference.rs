//! Test-only: the single-environment MPPI planner as it was before batching, kept verbatim
//! (including its own copies of the shared-latent first layer and the policy sample) so that
//! tests can show the batched planner at one environment computes the same thing.
use tch::{Kind, Tensor};

use super::config::AgentConfig;
use super::ensemble::Heads;
use super::error::Result;
use super::layers::Mlp;
use super::math;
use super::noise::Noise;
use super::world_model::{QParams, QReduce, WorldModel};

fn is_shared(z: &Tensor, a: &Tensor) -> bool {
    z.size()[0] == 1 && a.size()[0] > 1
}

/// The former shared-prefix MLP (now `Mlp::forward_rollout`) for one latent (1, S) shared by every row.
fn shared_prefix(mlp: &Mlp, shared: &Tensor, per_row: &Tensor) -> Tensor {
    let first = &mlp.layers[0];
    let width = shared.size()[1];
    let rest = per_row.size()[1];
    let shared_part = shared.linear(&first.weight.narrow(1, 0, width), Some(&first.bias));
    let linear = per_row.linear::<Tensor>(&first.weight.narrow(1, width, rest), None) + shared_part;
    let mut h = first.finish(linear);
    for layer in &mlp.layers[1..] {
        h = layer.forward(&h);
    }
    h
}

fn next(model: &WorldModel, z: &Tensor, a: &Tensor) -> Tensor {
    if is_shared(z, a) {
        shared_prefix(&model.dynamics, z, a)
    } else {
        model.next(z, a, None)
    }
}

fn reward(model: &WorldModel, z: &Tensor, a: &Tensor) -> Tensor {
    let logits = if is_shared(z, a) {
        shared_prefix(&model.reward, z, a)
    } else {
        model.reward(z, a, None)
    };
    model.two_hot.decode(&logits)
}

fn terminal(model: &WorldModel, z: &Tensor) -> Option<Tensor> {
    model
        .termination_logits(z)
        .map(|logits| logits.sigmoid().gt(0.5).to_kind(Kind::Float))
}

fn policy_action(model: &WorldModel, z: &Tensor, eps: &Tensor) -> Tensor {
    let out = model.policy.forward(z);
    let parts = out.chunk(2, -1);
    let log_std = math::squash_log_std(&parts[1], model.log_std_min, model.log_std_dif);
    (&parts[0] + eps * log_std.exp()).tanh()
}

struct Rollout {
    returns: Tensor,
    latents: Tensor,
    terminated: Option<Tensor>,
}

impl Rollout {
    fn first_rows(&self, rows: i64) -> Rollout {
        let take = |t: &Tensor| t.narrow(0, 0, rows).copy();
        Rollout {
            returns: take(&self.returns),
            latents: take(&self.latents),
            terminated: self.terminated.as_ref().map(take),
        }
    }

    fn concat(&self, rest: &Rollout) -> Rollout {
        let cat = |a: &Tensor, b: &Tensor| Tensor::cat(&[a, b], 0);
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

/// The former `Planner` for one environment.
pub struct ReferencePlanner {
    config: AgentConfig,
    pub prev_mean: Tensor,
    candidates: Tensor,
}

impl ReferencePlanner {
    pub fn new(config: &AgentConfig) -> Self {
        let (h, n, a) = (
            config.horizon as i64,
            config.num_samples as i64,
            config.action_dim as i64,
        );
        let cpu = (Kind::Float, tch::Device::Cpu);
        Self {
            config: config.clone(),
            prev_mean: Tensor::zeros([h, a], cpu),
            candidates: Tensor::zeros([h, n, a], cpu),
        }
    }

    /// Plans from one observation (1, obs_dim); returns the action (A).
    pub fn plan(
        &mut self,
        model: &WorldModel,
        obs: &Tensor,
        t0: bool,
        eval_mode: bool,
        noise: &mut dyn Noise,
    ) -> Result<Tensor> {
        tch::no_grad(|| self.plan_inner(model, obs, t0, eval_mode, noise))
    }

    fn plan_inner(
        &mut self,
        model: &WorldModel,
        obs: &Tensor,
        t0: bool,
        eval_mode: bool,
        noise: &mut dyn Noise,
    ) -> Result<Tensor> {
        let c = &self.config;
        let (h, n, p, a, k) = (
            c.horizon as i64,
            c.num_samples as i64,
            c.num_pi_trajs as i64,
            c.action_dim as i64,
            c.num_elites as i64,
        );
        let device = model.device();
        let z = model.encode(obs, None, noise)?;
        if p > 0 {
            let mut zp = z.shallow_clone();
            for t in 0..h {
                let eps = noise.randn(&[p, a], device)?;
                let action = policy_action(model, &zp, &eps);
                self.candidates.get(t).narrow(0, 0, p).copy_(&action);
                if t + 1 < h {
                    zp = next(model, &zp, &action);
                }
            }
        }
        let mut mean = Tensor::zeros([h, a], (Kind::Float, device));
        let mut std = Tensor::full([h, a], c.max_std, (Kind::Float, device));
        if !t0 && h > 1 {
            mean.narrow(0, 0, h - 1)
                .copy_(&self.prev_mean.narrow(0, 1, h - 1));
        }
        let mut policy_rollout = None;
        let mut score = Tensor::zeros([k, 1], (Kind::Float, device));
        let mut elite_actions = Tensor::zeros([h, k, a], (Kind::Float, device));
        for _ in 0..c.iterations {
            let r = noise.randn(&[h, n - p, a], device)?;
            let samples = (mean.unsqueeze(1) + std.unsqueeze(1) * r).clamp(-1.0, 1.0);
            self.candidates.narrow(1, p, n - p).copy_(&samples);
            let value = self
                .estimate_value(model, &z, &mut policy_rollout, noise)?
                .nan_to_num(0.0, None, None);
            let (_, elite_idxs) = value.squeeze_dim(1).topk(k, 0, true, true);
            let elite_value = value.index_select(0, &elite_idxs);
            elite_actions = self.candidates.index_select(1, &elite_idxs);
            let (max_value, _) = elite_value.max_dim(0, false);
            score = ((elite_value - max_value) * c.temperature).exp();
            score = &score / score.sum_dim_intlist(0, false, Kind::Float);
            let weights = score.unsqueeze(0);
            let total = score.sum_dim_intlist(0, false, Kind::Float) + 1e-9;
            mean = (&weights * &elite_actions).sum_dim_intlist(1, false, Kind::Float) / &total;
            std = ((&weights * (&elite_actions - mean.unsqueeze(1)).square()).sum_dim_intlist(
                1,
                false,
                Kind::Float,
            ) / &total)
                .sqrt()
                .clamp(c.min_std, c.max_std);
        }
        let exponential = noise.exponential(&[k], device)?;
        let gumbel = score.squeeze_dim(1).log() - exponential.log();
        let choice = gumbel.softmax(0, Kind::Float).argmax(-1, false).view([1]);
        let chosen = elite_actions.index_select(1, &choice).squeeze_dim(1);
        let mut action = chosen.get(0);
        if !eval_mode {
            action += std.get(0) * noise.randn(&[a], device)?;
        }
        self.prev_mean.copy_(&mean);
        Ok(action.clamp(-1.0, 1.0))
    }

    fn rollout(&self, model: &WorldModel, z0: &Tensor, first: i64, rows: i64) -> Rollout {
        let mut z = z0.shallow_clone();
        let mut returns: Option<Tensor> = None;
        let mut discount = 1.0;
        let mut terminated: Option<Tensor> = None;
        for t in 0..self.config.horizon as i64 {
            let action = self.candidates.get(t).narrow(0, first, rows);
            let r = reward(model, &z, &action);
            z = next(model, &z, &action);
            let term = match &terminated {
                Some(done) => (1.0f64 - done) * discount * r,
                None => r * discount,
            };
            returns = Some(match returns {
                Some(g) => g + term,
                None => term,
            });
            discount *= self.config.discount;
            if let Some(now) = terminal(model, &z) {
                terminated = Some(match terminated {
                    Some(done) => (done + now).clamp_max(1.0),
                    None => now,
                });
            }
        }
        Rollout {
            returns: returns.expect("the horizon is at least 1"),
            latents: z,
            terminated,
        }
    }

    fn estimate_value(
        &self,
        model: &WorldModel,
        z0: &Tensor,
        policy_rollout: &mut Option<Rollout>,
        noise: &mut dyn Noise,
    ) -> Result<Tensor> {
        let (n, p) = (
            self.config.num_samples as i64,
            self.config.num_pi_trajs as i64,
        );
        let rollout = match policy_rollout.as_ref() {
            Some(cached) => cached.concat(&self.rollout(model, z0, p, n - p)),
            None => {
                let all = self.rollout(model, z0, 0, n);
                if p > 0 {
                    *policy_rollout = Some(all.first_rows(p));
                }
                all
            }
        };
        let discount = (0..self.config.horizon).fold(1.0, |d, _| d * self.config.discount);
        let z = &rollout.latents;
        let eps = noise.randn(&[n, self.config.action_dim as i64], z.device())?;
        let action = policy_action(model, z, &eps);
        let pair = Heads::random_pair(noise, self.config.num_q as i64, z.device())?;
        let q = model.q_value(z, &action, None, QParams::Online, &pair, QReduce::Avg, None)?;
        let bootstrap = match &rollout.terminated {
            Some(done) => (1.0f64 - done) * discount * q,
            None => q * discount,
        };
        Ok(rollout.returns + bootstrap)
    }
}
