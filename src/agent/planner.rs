//! MPPI planning in the latent space of the world model (official `_plan`, `_estimate_value`),
//! for E environments at once: every environment has its own means, standard deviations,
//! elites, elite choice and warm start; the model runs once over all E·N candidates.
//!
//! Random draws are those of E separate plans laid end to end along the first dimension
//! (environment-major), so that one environment's slice is exactly the draw its own plan would
//! make, and at E = 1 the draws are today's single-environment draws. The one draw all
//! environments share is the Q-head permutation of each iteration: as in the official code,
//! one `randperm` serves the whole batch of a Q call (per-environment heads would need a gather
//! of the heads' weights per row).
use tch::{Device, Kind, Tensor};

use super::config::AgentConfig;
use super::noise::Noise;
use super::world_model::{QParams, QReduce, WorldModel};
use super::{expect_shape, Error, Result};

/// What planning needs from a model. Latent arguments are (N, Z), or (G, Z) with G < N for G
/// latents each shared by N/G consecutive rows of the other argument (the first planning step
/// of G environments), which implementations may exploit.
pub trait LatentModel {
    fn device(&self) -> Device;
    fn obs_dim(&self) -> i64;
    fn latent_dim(&self) -> i64;
    fn action_dim(&self) -> i64;
    fn num_q(&self) -> i64;
    /// Observations (E, obs_dim) → latents (E, Z).
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
    fn encode(&self, obs: &Tensor) -> Tensor {
        WorldModel::encode(self, obs)
    }
    fn next(&self, z: &Tensor, a: &Tensor) -> Tensor {
        if is_shared(z, a) {
            self.next_shared(z, a)
        } else {
            WorldModel::next(self, z, a)
        }
    }
    fn reward(&self, z: &Tensor, a: &Tensor) -> Tensor {
        let logits = if is_shared(z, a) {
            self.reward_shared(z, a)
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
        if is_shared(z, eps) {
            self.pi_action_shared(z, eps)
        } else {
            self.pi_action(z, eps)
        }
    }
    fn q_avg(&self, z: &Tensor, a: &Tensor, pair: (i64, i64)) -> Result<Tensor> {
        self.q_value(z, a, QParams::Online, pair, QReduce::Avg, None)
    }
}

/// Returns (E, R, 1), final latents (E, R, Z) and termination flags (E, R, 1) of R candidate
/// rollouts per environment.
struct Rollout {
    returns: Tensor,
    latents: Tensor,
    terminated: Option<Tensor>,
}

impl Rollout {
    fn first_rows(&self, rows: i64) -> Rollout {
        let take = |t: &Tensor| t.narrow(1, 0, rows).copy();
        Rollout {
            returns: take(&self.returns),
            latents: take(&self.latents),
            terminated: self.terminated.as_ref().map(take),
        }
    }

    fn concat(&self, rest: &Rollout) -> Rollout {
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

/// The planner's settings and the warm-start state of each environment.
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
    num_envs: i64,
    /// The final means of the previous plan, (E, H, A); shifted by one step for the next plan.
    prev_mean: Tensor,
    /// Candidate actions (E, H, N, A), reused across calls: columns 0..P hold the policy
    /// trajectories, the rest the Gaussian samples.
    candidates: Tensor,
}

impl Planner {
    /// A planner for `num_envs` environments (at least 1) whose warm starts start empty.
    pub fn new(config: &AgentConfig, device: Device, num_envs: usize) -> Result<Self> {
        if num_envs == 0 {
            return Err(Error::Config(
                "num_envs must be at least 1 (environments planned for at once)".into(),
            ));
        }
        let e = num_envs as i64;
        let h = config.horizon as i64;
        let a = config.action_dim as i64;
        let n = config.num_samples as i64;
        Ok(Self {
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
            num_envs: e,
            prev_mean: Tensor::zeros([e, h, a], (Kind::Float, device)),
            candidates: Tensor::zeros([e, h, n, a], (Kind::Float, device)),
        })
    }

    /// The number of environments planned for at once.
    pub fn num_envs(&self) -> usize {
        self.num_envs as usize
    }

    /// The means kept for the next warm starts, (E, H, A).
    pub fn prev_mean(&self) -> &Tensor {
        &self.prev_mean
    }

    /// Plans for one environment (a planner made for one): observation (1, obs_dim), action
    /// (A). See [`Self::plan_batch`].
    pub fn plan(
        &mut self,
        model: &impl LatentModel,
        obs: &Tensor,
        t0: bool,
        eval_mode: bool,
        noise: &mut dyn Noise,
    ) -> Result<Tensor> {
        Ok(self.plan_batch(model, obs, &[t0], eval_mode, noise)?.get(0))
    }

    /// Plans from the observations (E, obs_dim) of all environments and returns their actions
    /// (E, A) clamped to [−1, 1], on the model's device. `t0[e]` drops environment e's warm
    /// start; `eval_mode` drops the final exploration noise (the elite choice stays random).
    /// Reads nothing back from the device (only `noise` might, and [`super::TorchNoise`]
    /// does not), and every shape depends on E alone.
    pub fn plan_batch(
        &mut self,
        model: &impl LatentModel,
        obs: &Tensor,
        t0: &[bool],
        eval_mode: bool,
        noise: &mut dyn Noise,
    ) -> Result<Tensor> {
        let e = self.num_envs;
        expect_shape("planner observations", obs, &[e, model.obs_dim()])?;
        if t0.len() as i64 != e {
            return Err(Error::Shape {
                what: "planner t0 flags (one per environment)".into(),
                expected: vec![e],
                got: vec![t0.len() as i64],
            });
        }
        expect_shape(
            "planner action space",
            &self.prev_mean,
            &[e, self.horizon, model.action_dim()],
        )?;
        let obs = obs.to_device(model.device());
        tch::no_grad(|| self.plan_inner(model, &obs, t0, eval_mode, noise))
    }

    fn plan_inner(
        &mut self,
        model: &impl LatentModel,
        obs: &Tensor,
        t0: &[bool],
        eval_mode: bool,
        noise: &mut dyn Noise,
    ) -> Result<Tensor> {
        let (e, h, n, p, a, k) = (
            self.num_envs,
            self.horizon,
            self.num_samples,
            self.num_pi_trajs,
            self.action_dim,
            self.num_elites,
        );
        let device = model.device();
        // One latent per environment (E, Z): the first step's layers see it once, not once per
        // candidate.
        let z = model.encode(obs);

        // Policy trajectories, fixed for all iterations.
        if p > 0 {
            let mut zp = z.shallow_clone();
            for t in 0..h {
                let eps = noise.randn(&[e * p, a], device)?;
                let action = model.policy_action(&zp, &eps);
                self.candidates
                    .select(1, t)
                    .narrow(1, 0, p)
                    .copy_(&action.view([e, p, a]));
                if t + 1 < h {
                    zp = model.next(&zp, &action);
                }
            }
        }

        let mut mean = Tensor::zeros([e, h, a], (Kind::Float, device));
        let mut std = Tensor::full([e, h, a], self.max_std, (Kind::Float, device));
        if h > 1 {
            if t0.iter().all(|&first| !first) {
                mean.narrow(1, 0, h - 1)
                    .copy_(&self.prev_mean.narrow(1, 1, h - 1));
            } else {
                for (env, _) in t0.iter().enumerate().filter(|(_, &first)| !first) {
                    let env = env as i64;
                    mean.get(env)
                        .narrow(0, 0, h - 1)
                        .copy_(&self.prev_mean.get(env).narrow(0, 1, h - 1));
                }
            }
        }

        let mut policy_rollout = None;
        let mut score = Tensor::zeros([e, k, 1], (Kind::Float, device));
        let mut elite_actions = Tensor::zeros([e, h, k, a], (Kind::Float, device));
        for _ in 0..self.iterations {
            let r = noise
                .randn(&[e * h, n - p, a], device)?
                .view([e, h, n - p, a]);
            let samples = (mean.unsqueeze(2) + std.unsqueeze(2) * r).clamp(-1.0, 1.0);
            self.candidates.narrow(2, p, n - p).copy_(&samples);

            let value = self
                .estimate_value(model, &z, &mut policy_rollout, noise)?
                .nan_to_num(0.0, None, None)
                .view([e, n]);
            let (_, elite_idxs) = value.topk(k, 1, true, true);
            let elite_value = value.gather(1, &elite_idxs, false).unsqueeze(2);
            elite_actions = self.candidates.gather(
                2,
                &elite_idxs.view([e, 1, k, 1]).expand([e, h, k, a], false),
                false,
            );

            let (max_value, _) = elite_value.max_dim(1, true);
            score = ((elite_value - max_value) * self.temperature).exp();
            score = &score / score.sum_dim_intlist(1, true, Kind::Float);
            let weights = score.unsqueeze(1);
            let total = score.sum_dim_intlist(1, true, Kind::Float) + 1e-9;
            mean = (&weights * &elite_actions).sum_dim_intlist(2, false, Kind::Float) / &total;
            std = ((&weights * (&elite_actions - mean.unsqueeze(2)).square()).sum_dim_intlist(
                2,
                false,
                Kind::Float,
            ) / &total)
                .sqrt()
                .clamp(self.min_std, self.max_std);
        }

        // Sample one elite per environment with the Gumbel-max trick on log-weights.
        let exponential = noise.exponential(&[e * k], device)?.view([e, k]);
        let gumbel = score.squeeze_dim(2).log() - exponential.log();
        let choice = gumbel.softmax(1, Kind::Float).argmax(1, true);
        let mut action = elite_actions
            .select(1, 0)
            .gather(1, &choice.view([e, 1, 1]).expand([e, 1, a], false), false)
            .squeeze_dim(1);
        if !eval_mode {
            action += std.select(1, 0) * noise.randn(&[e * a], device)?.view([e, a]);
        }
        self.prev_mean.copy_(&mean);
        Ok(action.clamp(-1.0, 1.0))
    }

    /// Rolls out candidates `first..first + rows` of every environment from its latent in `z0`
    /// (E, Z) over the horizon: Σ_t γ^t (1 − done_t) r_t, the final latents and the
    /// termination flags.
    fn rollout(&self, model: &impl LatentModel, z0: &Tensor, first: i64, rows: i64) -> Rollout {
        let (e, a) = (self.num_envs, self.action_dim);
        let mut z = z0.shallow_clone();
        let mut returns: Option<Tensor> = None;
        let mut discount = 1.0;
        let mut terminated: Option<Tensor> = None;
        for t in 0..self.horizon {
            let action = self
                .candidates
                .select(1, t)
                .narrow(1, first, rows)
                .reshape([e * rows, a]);
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
        let per_env = |t: Tensor| t.view([e, rows, -1]);
        Rollout {
            returns: per_env(returns.expect("the horizon is at least 1")),
            latents: per_env(z),
            terminated: terminated.map(per_env),
        }
    }

    /// V = Σ_t γ^t r_t + γ^H·Q_avg(z_H, π(z_H)) for every candidate of every environment;
    /// (E·N, 1), from the latents `z0` (E, Z). The policy trajectories' rollouts are the same in
    /// every iteration, so `policy_rollout` keeps them after the first. Draws policy noise for
    /// π(z_H), then the permutation picking the two Q heads (shared by all environments).
    fn estimate_value(
        &self,
        model: &impl LatentModel,
        z0: &Tensor,
        policy_rollout: &mut Option<Rollout>,
        noise: &mut dyn Noise,
    ) -> Result<Tensor> {
        let (e, n, p) = (self.num_envs, self.num_samples, self.num_pi_trajs);
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
        let rows = |t: &Tensor| t.reshape([e * n, -1]);
        let z = rows(&rollout.latents);
        let eps = noise.randn(&[e * n, self.action_dim], z.device())?;
        let action = model.policy_action(&z, &eps);
        let perm = noise.randperm(model.num_q())?;
        let pair = match perm.as_slice() {
            [first, second, ..] => (*first, *second),
            _ => return Err(Error::Replay("Q-head permutation shorter than 2".into())),
        };
        let q = model.q_avg(&z, &action, pair)?;
        let bootstrap = match &rollout.terminated {
            Some(done) => (1.0f64 - rows(done)) * discount * q,
            None => q * discount,
        };
        Ok(rows(&rollout.returns) + bootstrap)
    }

    /// Acting without planning (`mpc = false`) for one environment: observation (1, obs_dim),
    /// action (A). See [`Self::act_with_policy_batch`].
    pub fn act_with_policy(
        &mut self,
        model: &WorldModel,
        obs: &Tensor,
        eval_mode: bool,
        noise: &mut dyn Noise,
    ) -> Result<Tensor> {
        expect_shape("policy observation", obs, &[1, model.obs_dim])?;
        Ok(self
            .act_with_policy_batch(model, obs, eval_mode, noise)?
            .get(0))
    }

    /// Acting without planning (`mpc = false`) for E observations (E, obs_dim): a policy
    /// sample, or tanh of its mean in eval mode. Returns (E, A).
    pub fn act_with_policy_batch(
        &mut self,
        model: &WorldModel,
        obs: &Tensor,
        eval_mode: bool,
        noise: &mut dyn Noise,
    ) -> Result<Tensor> {
        let rows = obs.size().first().copied().unwrap_or(0);
        expect_shape("policy observations", obs, &[rows, model.obs_dim])?;
        tch::no_grad(|| {
            let z = model.encode(obs);
            let eps = noise.randn(&[rows, self.action_dim], model.device())?;
            let out = model.pi(&z, &eps);
            Ok(if eval_mode { out.mean } else { out.action })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::noise::{HostNoise, NoiseKind, RecordingNoise, ReplayNoise, TorchNoise};
    use crate::agent::planner_reference::ReferencePlanner;

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
            let per_latent = eps.size()[0] / z.size()[0];
            let z = z.repeat_interleave_self_int(per_latent, 0, None);
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
        let mut planner = Planner::new(&config, Device::Cpu, 1).unwrap();
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
        let mut planner = Planner::new(&config, Device::Cpu, 1).unwrap();
        let mut noise = TorchNoise::seeded(1);
        let obs = Tensor::zeros([1, 3], (Kind::Float, Device::Cpu));
        let first = planner.plan(&model, &obs, true, false, &mut noise).unwrap();
        assert!(first.abs().max().double_value(&[]) <= 1.0);
        let mean = planner.prev_mean().get(0).copy();
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

    fn small_config(episodic: bool) -> AgentConfig {
        AgentConfig {
            enc_dim: 16,
            mlp_dim: 24,
            latent_dim: 16,
            num_q: 3,
            num_samples: 40,
            num_elites: 6,
            num_pi_trajs: 5,
            iterations: 3,
            episodic,
            ..AgentConfig::defaults(None, 5, 3).unwrap()
        }
    }

    /// A model with random parameters from a seeded host stream (independent of torch's
    /// global generator, which other tests reseed), so that rewards, values and terminations
    /// vary between candidates (fresh models decode every reward and Q to 0).
    fn random_model(config: &AgentConfig, seed: u64) -> WorldModel {
        let model = WorldModel::new(config, Device::Cpu).unwrap();
        let mut noise = HostNoise::seeded(seed);
        tch::no_grad(|| {
            for params in [&model.model_params, &model.policy_params] {
                let values = noise.randn(&params.flat.size(), Device::Cpu).unwrap() * 0.1;
                params.flat.detach().copy_(&values);
                for (entry, view) in params.entries.iter().zip(params.views()) {
                    if entry.name.ends_with("ln.weight") {
                        let _ = view.detach().g_add_scalar_(1.0);
                    }
                }
            }
        });
        model
    }

    /// (t0, eval_mode) of consecutive calls: episode starts, warm starts, both modes.
    const CALLS: [(bool, bool); 5] = [
        (true, false),
        (false, false),
        (false, true),
        (true, true),
        (false, false),
    ];

    /// At one environment the batched planner makes the same draws (order and shapes) and the
    /// same operations as the single-environment planner it replaced: equal bit for bit.
    #[test]
    fn one_environment_is_bit_identical_to_the_former_planner() {
        let configs = [
            small_config(false),
            small_config(true),
            AgentConfig::defaults(Some(1), 24, 6).unwrap(),
        ];
        for (c, config) in configs.iter().enumerate() {
            let model = random_model(config, 3);
            let mut reference = ReferencePlanner::new(config);
            let mut planner = Planner::new(config, Device::Cpu, 1).unwrap();
            let mut reference_noise = HostNoise::seeded(7);
            let mut noise = HostNoise::seeded(7);
            let mut obs_noise = HostNoise::seeded(8);
            for (call, &(t0, eval_mode)) in CALLS.iter().enumerate() {
                let obs = obs_noise
                    .randn(&[1, config.obs_dim as i64], Device::Cpu)
                    .unwrap();
                let expected = reference
                    .plan(&model, &obs, t0, eval_mode, &mut reference_noise)
                    .unwrap();
                let got = planner
                    .plan(&model, &obs, t0, eval_mode, &mut noise)
                    .unwrap();
                assert!(
                    got.equal(&expected),
                    "config {c} call {call}: {got:?} vs {expected:?}"
                );
                assert!(
                    planner.prev_mean().get(0).equal(&reference.prev_mean),
                    "config {c} call {call}: warm starts differ"
                );
                // The two streams are still in step.
                let (a, b) = (
                    noise.randn(&[1], Device::Cpu).unwrap(),
                    reference_noise.randn(&[1], Device::Cpu).unwrap(),
                );
                assert!(a.equal(&b), "config {c} call {call}: draws differ");
            }
        }
    }

    /// Splits draws made for `envs` environments into each environment's own draws: every draw
    /// is environment-major along its first dimension, except the Q-head permutation, which all
    /// environments share.
    fn split_draws(draws: &[(NoiseKind, Tensor)], envs: i64) -> Vec<ReplayNoise> {
        let mut replays: Vec<ReplayNoise> = (0..envs).map(|_| ReplayNoise::new()).collect();
        for (kind, draw) in draws {
            match kind {
                NoiseKind::Randperm => {
                    for replay in &mut replays {
                        replay.push(*kind, draw.copy());
                    }
                }
                _ => {
                    for (replay, part) in replays.iter_mut().zip(draw.chunk(envs, 0)) {
                        replay.push(*kind, part.contiguous());
                    }
                }
            }
        }
        replays
    }

    /// Three environments with different observations, episode starts and warm starts: the
    /// batched plan equals three separate plans fed each environment's slice of its draws.
    ///
    /// Not bit for bit: a one-row matmul (the encoder, and the shared first-layer part of the
    /// first step, at E = 1) takes another kernel than an E-row one and sums in another order,
    /// so latents differ in the last bit (rows of the N-candidate matmuls do not). MPPI's
    /// weights exp(0.5·(V − max V)) carry that into the means in proportion to the values'
    /// magnitude: about 3e-7 with the small model's values, up to 7e-5 with the size-1 model's
    /// (|V| in the hundreds, one ulp ≈ 1e-5). Any slicing or bookkeeping error gives
    /// differences of order 0.1.
    #[test]
    fn batched_plan_equals_separate_plans_given_the_same_draws() {
        let t0s = [
            [true, true, true],
            [false, false, false],
            [false, true, false],
            [true, false, false],
            [false, false, true],
        ];
        for (config, tolerance) in [
            (small_config(true), 1e-6),
            (AgentConfig::defaults(Some(1), 24, 6).unwrap(), 1e-3),
        ] {
            let model = random_model(&config, 4);
            let envs = 3;
            let mut batched = Planner::new(&config, Device::Cpu, envs).unwrap();
            let mut separate: Vec<Planner> = (0..envs)
                .map(|_| Planner::new(&config, Device::Cpu, 1).unwrap())
                .collect();
            let mut noise = RecordingNoise::new(HostNoise::seeded(11));
            let mut obs_noise = HostNoise::seeded(12);
            for (call, t0) in t0s.iter().enumerate() {
                let eval_mode = call == 2;
                let obs = obs_noise
                    .randn(&[envs as i64, config.obs_dim as i64], Device::Cpu)
                    .unwrap();
                noise.draws.clear();
                let actions = batched
                    .plan_batch(&model, &obs, t0, eval_mode, &mut noise)
                    .unwrap();
                assert_eq!(actions.size(), vec![envs as i64, config.action_dim as i64]);
                let replays = split_draws(&noise.draws, envs as i64);
                for (env, (planner, mut replay)) in separate.iter_mut().zip(replays).enumerate() {
                    let e = env as i64;
                    let action = planner
                        .plan(
                            &model,
                            &obs.narrow(0, e, 1),
                            t0[env],
                            eval_mode,
                            &mut replay,
                        )
                        .unwrap();
                    assert_eq!(replay.remaining(), 0, "call {call} env {env}: draws left");
                    let diff = (action - actions.get(e)).abs().max().double_value(&[]);
                    assert!(
                        diff <= tolerance,
                        "call {call} env {env}: actions differ by {diff}"
                    );
                    let diff = (planner.prev_mean().get(0) - batched.prev_mean().get(e))
                        .abs()
                        .max()
                        .double_value(&[]);
                    assert!(
                        diff <= tolerance,
                        "call {call} env {env}: means differ by {diff}"
                    );
                }
            }
        }
    }

    #[test]
    fn bad_environment_counts_are_errors() {
        let config = small_config(false);
        let model = random_model(&config, 4);
        assert!(matches!(
            Planner::new(&config, Device::Cpu, 0),
            Err(Error::Config(_))
        ));
        let mut planner = Planner::new(&config, Device::Cpu, 2).unwrap();
        let mut noise = HostNoise::seeded(1);
        let obs = Tensor::zeros([2, 5], (Kind::Float, Device::Cpu));
        // One t0 flag for two environments.
        assert!(matches!(
            planner.plan_batch(&model, &obs, &[true], false, &mut noise),
            Err(Error::Shape { .. })
        ));
        // The single-environment call on a planner for two.
        assert!(matches!(
            planner.plan(&model, &obs.narrow(0, 0, 1), true, false, &mut noise),
            Err(Error::Shape { .. })
        ));
        let actions = planner
            .plan_batch(&model, &obs, &[true, true], false, &mut noise)
            .unwrap();
        assert_eq!(actions.size(), vec![2, 3]);
        let policy = planner
            .act_with_policy_batch(&model, &obs, true, &mut noise)
            .unwrap();
        assert_eq!(policy.size(), vec![2, 3]);
    }
}
