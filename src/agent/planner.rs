//! MPPI planning in the latent space of the world model (official `_plan`, `_estimate_value`).
use tch::{Device, Kind, Tensor};

use super::config::AgentConfig;
use super::noise::Noise;
use super::world_model::{QParams, QReduce, WorldModel};
use super::{expect_shape, Result};

/// What planning needs from a model. Latent arguments are (N, Z), or (1, Z) for one latent
/// shared by N actions (the first planning step), which implementations may exploit.
pub trait LatentModel {
    fn device(&self) -> Device;
    fn obs_dim(&self) -> i64;
    fn latent_dim(&self) -> i64;
    fn action_dim(&self) -> i64;
    fn num_q(&self) -> i64;
    /// Observations (1, obs_dim) → latent (1, Z).
    fn encode(&self, obs: &Tensor) -> Tensor;
    /// Next latents (N, Z).
    fn next(&self, z: &Tensor, a: &Tensor) -> Tensor;
    /// Decoded rewards (N, 1).
    fn reward(&self, z: &Tensor, a: &Tensor) -> Tensor;
    /// 1.0 where the latent is terminal, 0.0 elsewhere (N, 1); `None` if never terminal.
    fn terminal(&self, z: &Tensor) -> Option<Tensor>;
    /// Policy-prior sample with standard-normal noise `eps` (N, A).
    fn policy_action(&self, z: &Tensor, eps: &Tensor) -> Tensor;
    /// Mean of Q heads `pair.0` and `pair.1` (N, 1), without dropout.
    fn q_avg(&self, z: &Tensor, a: &Tensor, pair: (i64, i64)) -> Result<Tensor>;
}

fn is_shared(z: &Tensor, a: &Tensor) -> bool {
    z.size()[0] == 1 && a.size()[0] > 1
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
    fn encode(&self, obs: &Tensor) -> Tensor {
        WorldModel::encode(self, obs)
    }
    fn next(&self, z: &Tensor, a: &Tensor) -> Tensor {
        if is_shared(z, a) {
            self.next_from_one(z, a)
        } else {
            WorldModel::next(self, z, a)
        }
    }
    fn reward(&self, z: &Tensor, a: &Tensor) -> Tensor {
        let logits = if is_shared(z, a) {
            self.reward_from_one(z, a)
        } else {
            WorldModel::reward(self, z, a)
        };
        self.two_hot.decode(&logits)
    }
    fn terminal(&self, z: &Tensor) -> Option<Tensor> {
        self.termination_logits(z)
            .map(|logits| logits.sigmoid().gt(0.5).to_kind(Kind::Float))
    }
    fn policy_action(&self, z: &Tensor, eps: &Tensor) -> Tensor {
        self.pi_action(z, eps)
    }
    fn q_avg(&self, z: &Tensor, a: &Tensor, pair: (i64, i64)) -> Result<Tensor> {
        self.q_value(z, a, QParams::Online, pair, QReduce::Avg, None)
    }
}

/// Returns, final latents and termination flags of a batch of candidate rollouts.
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

/// The planner's settings and its warm-start state.
#[derive(Debug)]
pub struct Planner {
    horizon: i64,
    num_samples: i64,
    num_elites: i64,
    num_pi_trajs: i64,
    iterations: usize,
    min_std: f64,
    max_std: f64,
    temperature: f64,
    discount: f64,
    action_dim: i64,
    /// The final mean of the previous plan, (H, A); shifted by one step for the next plan.
    prev_mean: Tensor,
    /// Candidate actions (H, N, A), reused across calls: columns 0..P hold the policy
    /// trajectories, the rest the Gaussian samples.
    candidates: Tensor,
}

impl Planner {
    pub fn new(config: &AgentConfig, device: Device) -> Self {
        let h = config.horizon as i64;
        let a = config.action_dim as i64;
        let n = config.num_samples as i64;
        Self {
            horizon: h,
            num_samples: n,
            num_elites: config.num_elites as i64,
            num_pi_trajs: config.num_pi_trajs as i64,
            iterations: config.iterations,
            min_std: config.min_std,
            max_std: config.max_std,
            temperature: config.temperature,
            discount: config.discount,
            action_dim: a,
            prev_mean: Tensor::zeros([h, a], (Kind::Float, device)),
            candidates: Tensor::zeros([h, n, a], (Kind::Float, device)),
        }
    }

    /// The mean kept for the next warm start, (H, A).
    pub fn prev_mean(&self) -> &Tensor {
        &self.prev_mean
    }

    /// Plans from one observation (1, obs_dim) and returns the action (A) clamped to [−1, 1],
    /// on the model's device. `t0` drops the warm start; `eval_mode` drops the final
    /// exploration noise (the elite choice stays random).
    pub fn plan(
        &mut self,
        model: &impl LatentModel,
        obs: &Tensor,
        t0: bool,
        eval_mode: bool,
        noise: &mut dyn Noise,
    ) -> Result<Tensor> {
        expect_shape("planner observation", obs, &[1, model.obs_dim()])?;
        expect_shape(
            "planner action space",
            &self.prev_mean,
            &[self.horizon, model.action_dim()],
        )?;
        let obs = obs.to_device(model.device());
        tch::no_grad(|| self.plan_inner(model, &obs, t0, eval_mode, noise))
    }

    fn plan_inner(
        &mut self,
        model: &impl LatentModel,
        obs: &Tensor,
        t0: bool,
        eval_mode: bool,
        noise: &mut dyn Noise,
    ) -> Result<Tensor> {
        let (h, n, p, a) = (
            self.horizon,
            self.num_samples,
            self.num_pi_trajs,
            self.action_dim,
        );
        let device = model.device();
        // One latent (1, Z): the first step's layers see it once, not once per candidate.
        let z = model.encode(obs);

        // Policy trajectories, fixed for all iterations.
        if p > 0 {
            let mut zp = z.shallow_clone();
            for t in 0..h {
                let eps = noise.randn(&[p, a], device)?;
                let action = model.policy_action(&zp, &eps);
                self.candidates.get(t).narrow(0, 0, p).copy_(&action);
                if t + 1 < h {
                    zp = model.next(&zp, &action);
                }
            }
        }

        let mut mean = Tensor::zeros([h, a], (Kind::Float, device));
        let mut std = Tensor::full([h, a], self.max_std, (Kind::Float, device));
        if !t0 && h > 1 {
            mean.narrow(0, 0, h - 1)
                .copy_(&self.prev_mean.narrow(0, 1, h - 1));
        }

        let mut policy_rollout = None;
        let mut score = Tensor::zeros([self.num_elites, 1], (Kind::Float, device));
        let mut elite_actions = Tensor::zeros([h, self.num_elites, a], (Kind::Float, device));
        for _ in 0..self.iterations {
            let r = noise.randn(&[h, n - p, a], device)?;
            let samples = (mean.unsqueeze(1) + std.unsqueeze(1) * r).clamp(-1.0, 1.0);
            self.candidates.narrow(1, p, n - p).copy_(&samples);

            let value = self
                .estimate_value(model, &z, &mut policy_rollout, noise)?
                .nan_to_num(0.0, None, None);
            let (_, elite_idxs) = value.squeeze_dim(1).topk(self.num_elites, 0, true, true);
            let elite_value = value.index_select(0, &elite_idxs);
            elite_actions = self.candidates.index_select(1, &elite_idxs);

            let (max_value, _) = elite_value.max_dim(0, false);
            score = ((elite_value - max_value) * self.temperature).exp();
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
                .clamp(self.min_std, self.max_std);
        }

        // Sample one elite with the Gumbel-max trick on log-weights.
        let exponential = noise.exponential(&[self.num_elites], device)?;
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

    /// Rolls out candidates `first..first + rows` from the latent `z0` (1, Z) over the horizon:
    /// Σ_t γ^t (1 − done_t) r_t, the final latents and the termination flags.
    fn rollout(&self, model: &impl LatentModel, z0: &Tensor, first: i64, rows: i64) -> Rollout {
        let mut z = z0.shallow_clone();
        let mut returns: Option<Tensor> = None;
        let mut discount = 1.0;
        let mut terminated: Option<Tensor> = None;
        for t in 0..self.horizon {
            let action = self.candidates.get(t).narrow(0, first, rows);
            let reward = model.reward(&z, &action);
            z = model.next(&z, &action);
            let term = match &terminated {
                Some(done) => (1.0f64 - done) * discount * reward,
                None => reward * discount,
            };
            returns = Some(match returns {
                Some(g) => g + term,
                None => term,
            });
            discount *= self.discount;
            if let Some(now) = model.terminal(&z) {
                terminated = Some(match terminated {
                    Some(done) => (done + now).clamp_max(1.0),
                    None => now,
                });
            }
        }
        let returns = returns.expect("the horizon is at least 1");
        Rollout {
            returns,
            latents: z,
            terminated,
        }
    }

    /// V = Σ_t γ^t r_t + γ^H·Q_avg(z_H, π(z_H)) for every candidate; (N, 1), from the latent
    /// `z0` (1, Z). The policy trajectories' rollouts are the same in every iteration, so
    /// `policy_rollout` keeps them after the first. Draws policy noise for π(z_H), then the
    /// permutation picking the two Q heads.
    fn estimate_value(
        &self,
        model: &impl LatentModel,
        z0: &Tensor,
        policy_rollout: &mut Option<Rollout>,
        noise: &mut dyn Noise,
    ) -> Result<Tensor> {
        let (n, p) = (self.num_samples, self.num_pi_trajs);
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
        let discount = (0..self.horizon).fold(1.0, |d, _| d * self.discount);
        let z = &rollout.latents;
        let eps = noise.randn(&[n, self.action_dim], z.device())?;
        let action = model.policy_action(z, &eps);
        let perm = noise.randperm(model.num_q())?;
        let pair = match perm.as_slice() {
            [first, second, ..] => (*first, *second),
            _ => {
                return Err(super::Error::Replay(
                    "Q-head permutation shorter than 2".into(),
                ))
            }
        };
        let q = model.q_avg(z, &action, pair)?;
        let bootstrap = match &rollout.terminated {
            Some(done) => (1.0f64 - done) * discount * q,
            None => q * discount,
        };
        Ok(rollout.returns + bootstrap)
    }

    /// Acting without planning (`mpc = false`): a policy sample, or tanh of its mean in eval
    /// mode. Returns (A).
    pub fn act_with_policy(
        &mut self,
        model: &WorldModel,
        obs: &Tensor,
        eval_mode: bool,
        noise: &mut dyn Noise,
    ) -> Result<Tensor> {
        expect_shape("policy observation", obs, &[1, model.obs_dim])?;
        tch::no_grad(|| {
            let z = model.encode(obs);
            let eps = noise.randn(&[1, self.action_dim], model.device())?;
            let out = model.pi(&z, &eps);
            let action = if eval_mode { out.mean } else { out.action };
            Ok(action.get(0))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::noise::TorchNoise;

    /// A model whose reward is −|a − a*|² whatever the latent, with zero values beyond the
    /// horizon: the best plan repeats a*.
    struct Quadratic {
        target: Tensor,
    }

    impl LatentModel for Quadratic {
        fn device(&self) -> Device {
            Device::Cpu
        }
        fn obs_dim(&self) -> i64 {
            3
        }
        fn latent_dim(&self) -> i64 {
            4
        }
        fn action_dim(&self) -> i64 {
            self.target.size()[0]
        }
        fn num_q(&self) -> i64 {
            2
        }
        fn encode(&self, obs: &Tensor) -> Tensor {
            Tensor::zeros([obs.size()[0], 4], (Kind::Float, Device::Cpu))
        }
        fn next(&self, _z: &Tensor, a: &Tensor) -> Tensor {
            Tensor::zeros([a.size()[0], 4], (Kind::Float, Device::Cpu))
        }
        fn reward(&self, _z: &Tensor, a: &Tensor) -> Tensor {
            -(a - &self.target)
                .square()
                .sum_dim_intlist(-1, true, Kind::Float)
        }
        fn terminal(&self, _z: &Tensor) -> Option<Tensor> {
            None
        }
        fn policy_action(&self, z: &Tensor, eps: &Tensor) -> Tensor {
            (eps + z.sum_dim_intlist(-1, true, Kind::Float)).tanh()
        }
        fn q_avg(&self, z: &Tensor, _a: &Tensor, pair: (i64, i64)) -> Result<Tensor> {
            assert_ne!(pair.0, pair.1);
            Ok(Tensor::zeros([z.size()[0], 1], (Kind::Float, Device::Cpu)))
        }
    }

    fn first_action_error(iterations: usize, seed: u64) -> f64 {
        let target = Tensor::from_slice(&[0.5f32, -0.3, 0.8]);
        let model = Quadratic {
            target: target.shallow_clone(),
        };
        let config = AgentConfig {
            iterations,
            ..AgentConfig::defaults(None, 3, 3).unwrap()
        };
        let mut planner = Planner::new(&config, Device::Cpu);
        let mut noise = TorchNoise::seeded(seed);
        let obs = Tensor::zeros([1, 3], (Kind::Float, Device::Cpu));
        let action = planner.plan(&model, &obs, true, true, &mut noise).unwrap();
        assert_eq!(action.size(), vec![3]);
        (action - target)
            .square()
            .sum(Kind::Float)
            .sqrt()
            .double_value(&[])
    }

    #[test]
    fn more_iterations_bring_the_first_action_to_the_optimum() {
        let seeds = 0..8u64;
        let mean_error = |iterations| {
            seeds
                .clone()
                .map(|s| first_action_error(iterations, s))
                .sum::<f64>()
                / 8.0
        };
        let (one, four, twelve) = (mean_error(1), mean_error(4), mean_error(12));
        assert!(four < one && twelve < four, "errors {one} {four} {twelve}");
        assert!(twelve < 0.1, "error after 12 iterations {twelve}");
    }

    #[test]
    fn warm_start_shifts_the_previous_mean() {
        let model = Quadratic {
            target: Tensor::from_slice(&[0.9f32, -0.9]),
        };
        let config = AgentConfig {
            iterations: 6,
            ..AgentConfig::defaults(None, 3, 2).unwrap()
        };
        let mut planner = Planner::new(&config, Device::Cpu);
        let mut noise = TorchNoise::seeded(1);
        let obs = Tensor::zeros([1, 3], (Kind::Float, Device::Cpu));
        let first = planner.plan(&model, &obs, true, false, &mut noise).unwrap();
        assert!(first.abs().max().double_value(&[]) <= 1.0);
        let mean = planner.prev_mean().copy();
        assert!(
            (mean.get(0) - model.target.shallow_clone())
                .abs()
                .max()
                .double_value(&[])
                < 0.2
        );
        // A wrong observation shape is an error, not a panic.
        assert!(planner
            .plan(
                &model,
                &Tensor::zeros([2, 3], (Kind::Float, Device::Cpu)),
                false,
                false,
                &mut noise
            )
            .is_err());
    }
}
