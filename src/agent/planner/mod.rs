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
mod latent;
#[cfg(test)]
mod tests;

use tch::{Device, Kind, Tensor};

use super::config::AgentConfig;
use super::ensemble::Heads;
use super::error::{expect_shape, Error, Result};
use super::noise::Noise;
use super::task::TaskRows;
use super::world_model::WorldModel;
use latent::Rollout;
pub use latent::{LatentModel, TaskModel};

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
    action_dim: i64,
    num_envs: i64,
    /// The final means of the previous plan, (E, H, A); shifted by one step for the next plan.
    prev_mean: Tensor,
    /// Candidate actions (E, H, N, A), reused across calls: columns 0..P hold the policy
    /// trajectories, the rest the Gaussian samples.
    candidates: Tensor,
    /// γ^t for t = 0..H, (H, 1, 1): the weights of a rollout's rewards.
    discounts: Tensor,
    /// γ^H as one value (1): the weight of a rollout's bootstrapped Q, made once so that a plan
    /// neither allocates nor fills it.
    horizon_discount: Tensor,
}

/// What a plan reads, on the model's device: the observations (E, obs_dim) and whether each
/// environment keeps its warm start (E, 1, 1).
#[derive(Debug)]
pub struct PlanInputs {
    pub obs: Tensor,
    pub continuing: Tensor,
}

impl PlanInputs {
    /// Overwrites these inputs with `other`'s, in place.
    pub fn refill(&mut self, other: &PlanInputs) {
        self.obs.copy_(&other.obs);
        self.continuing.copy_(&other.continuing);
    }
}

/// γ^t for t = 0..horizon as (horizon, 1, 1) on `device`, each power taken in f64.
fn discounts(discount: f64, horizon: i64, device: Device) -> Tensor {
    let powers: Vec<f32> = (0..horizon)
        .map(|t| discount.powi(t as i32) as f32)
        .collect();
    Tensor::from_slice(&powers)
        .to_device(device)
        .view([horizon, 1, 1])
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
            action_dim: a,
            num_envs: e,
            prev_mean: Tensor::f_zeros([e, h, a], (Kind::Float, device))?,
            candidates: Tensor::f_zeros([e, h, n, a], (Kind::Float, device))?,
            discounts: discounts(config.discount, h, device),
            horizon_discount: Tensor::full(
                [1],
                (0..h).fold(1.0, |d, _| d * config.discount),
                (Kind::Float, device),
            ),
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

    /// Continues from saved warm-start means (E, H, A), in place: a captured plan reads them
    /// where they are.
    pub fn set_prev_mean(&mut self, means: &Tensor) -> Result<()> {
        expect_shape("planner warm start", means, &self.prev_mean.size())?;
        self.prev_mean.f_copy_(means)?;
        Ok(())
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
        let inputs = self.inputs(model, obs, t0)?;
        self.plan_prepared(model, &inputs, eval_mode, noise)
    }

    /// A plan's inputs on the model's device, checked: what [`Self::plan_prepared`] reads.
    pub fn inputs(
        &self,
        model: &impl LatentModel,
        obs: &Tensor,
        t0: &[bool],
    ) -> Result<PlanInputs> {
        let e = self.num_envs;
        expect_shape("planner observations", obs, &[e, model.obs_dim()])?;
        if t0.len() as i64 != e {
            return Err(Error::Shape {
                what: "planner t0 flags (one per environment)".into(),
                expected: vec![e],
                got: vec![t0.len() as i64],
            });
        }
        let continuing: Vec<bool> = t0.iter().map(|&first| !first).collect();
        Ok(PlanInputs {
            obs: obs.to_device(model.device()),
            continuing: Tensor::from_slice(&continuing)
                .view([e, 1, 1])
                .to_device(model.device()),
        })
    }

    /// The plan proper, from inputs on the model's device: reads no host value and branches on
    /// none but `eval_mode`, so that a CUDA graph captured from one call replays the next
    /// (with `inputs` refilled in place).
    pub fn plan_prepared(
        &mut self,
        model: &impl LatentModel,
        inputs: &PlanInputs,
        eval_mode: bool,
        noise: &mut dyn Noise,
    ) -> Result<Tensor> {
        if let Some(why) = model.unusable() {
            return Err(Error::Config(format!("cannot plan: {why}")));
        }
        expect_shape(
            "planner action space",
            &self.prev_mean,
            &[self.num_envs, self.horizon, model.action_dim()],
        )?;
        tch::no_grad(|| self.plan_inner(model, &inputs.obs, &inputs.continuing, eval_mode, noise))
    }

    /// The plan: `continuing` (E, 1, 1) is true where an environment's warm start is kept.
    fn plan_inner(
        &mut self,
        model: &impl LatentModel,
        obs: &Tensor,
        continuing: &Tensor,
        eval_mode: bool,
        noise: &mut dyn Noise,
    ) -> Result<Tensor> {
        // One latent per environment (E, Z): the first step's layers see it once, not once per
        // candidate.
        let z = model.encode(obs, noise)?;
        self.sample_policy_trajectories(model, &z, noise)?;
        let (mut mean, mut std) = self.warm_start(continuing, model.device());
        let (e, h, k, a) = (
            self.num_envs,
            self.horizon,
            self.num_elites,
            self.action_dim,
        );
        let mut policy_rollout = None;
        let mut score = Tensor::zeros([e, k, 1], (Kind::Float, model.device()));
        let mut elite_actions = Tensor::zeros([e, h, k, a], (Kind::Float, model.device()));
        // A task's missing action components stay zero (the official masks them).
        let mask = model.action_mask().map(|m| m.view([e, 1, a]));
        // With fused kernels on (CUDA, or their host build in tests), selection, refit and
        // resampling are one kernel an iteration: the same numbers within rounding, the same
        // draws in the same order.
        let fused = crate::cuda::fused::runs_on(model.device());
        for i in 0..self.iterations {
            if !fused || i == 0 {
                self.sample_candidates(&mean, &std, mask.as_ref(), model.device(), noise)?;
            }
            let value = self.estimate_value(model, &z, &mut policy_rollout, noise)?;
            if fused {
                let last = i + 1 == self.iterations;
                let refit = self.fused_refit(&value, mask.as_ref(), last, noise)?;
                (score, elite_actions, mean, std) = (
                    refit.score.unsqueeze(2),
                    refit.elites,
                    refit.mean,
                    refit.std,
                );
                continue;
            }
            let value = value
                .nan_to_num(0.0, None, None)
                .view([e, self.num_samples]);
            let (_, elite_idxs) = value.topk(k, 1, true, true);
            let elite_value = value.gather(1, &elite_idxs, false).unsqueeze(2);
            elite_actions = self.candidates.gather(
                2,
                &elite_idxs.view([e, 1, k, 1]).expand([e, h, k, a], false),
                false,
            );
            (score, mean, std) = self.refit(&elite_value, &elite_actions);
            if let Some(mask) = &mask {
                mean *= mask;
                std *= mask;
            }
        }
        let action = self.choose_action(&score, &elite_actions, &std, eval_mode, noise)?;
        self.prev_mean.copy_(&mean);
        Ok(action.clamp(-1.0, 1.0))
    }

    /// The policy's trajectories, candidates 0..P of every environment, fixed for all
    /// iterations.
    fn sample_policy_trajectories(
        &mut self,
        model: &impl LatentModel,
        z: &Tensor,
        noise: &mut dyn Noise,
    ) -> Result<()> {
        let (e, h, p, a) = (
            self.num_envs,
            self.horizon,
            self.num_pi_trajs,
            self.action_dim,
        );
        if p == 0 {
            return Ok(());
        }
        let mut zp = z.shallow_clone();
        for t in 0..h {
            let eps = noise.randn(&[e * p, a], model.device())?;
            let action = model.policy_action(&zp, &eps);
            self.candidates
                .select(1, t)
                .narrow(1, 0, p)
                .copy_(&action.view([e, p, a]));
            if t + 1 < h {
                zp = model.next(&zp, &action);
            }
        }
        Ok(())
    }

    /// The first iteration's means and standard deviations: the previous plan's means shifted
    /// by one step where the environment goes on (`continuing`, (E, 1, 1)), zero where it starts
    /// an episode.
    fn warm_start(&self, continuing: &Tensor, device: Device) -> (Tensor, Tensor) {
        let (e, h, a) = (self.num_envs, self.horizon, self.action_dim);
        let mean = Tensor::zeros([e, h, a], (Kind::Float, device));
        let std = Tensor::full([e, h, a], self.max_std, (Kind::Float, device));
        if h > 1 {
            let shifted = self.prev_mean.narrow(1, 1, h - 1);
            mean.narrow(1, 0, h - 1)
                .copy_(&shifted.where_scalarother(continuing, 0.0));
        }
        (mean, std)
    }

    /// Selection and refit as one kernel (`cuda::fused::mppi_refit`), which also writes the next
    /// iteration's candidates from draws taken where [`Self::sample_candidates`] would take
    /// them: after this iteration's value draws.
    fn fused_refit(
        &self,
        value: &Tensor,
        mask: Option<&Tensor>,
        last: bool,
        noise: &mut dyn Noise,
    ) -> Result<crate::cuda::fused::Refit> {
        let (e, n, a) = (self.num_envs, self.num_samples, self.action_dim);
        let draws = match last {
            true => None,
            false => Some(self.candidate_draws(self.candidates.device(), noise)?),
        };
        let settings = crate::cuda::fused::MppiSettings {
            elites: self.num_elites,
            policy_rows: self.num_pi_trajs,
            temperature: self.temperature,
            min_std: self.min_std,
            max_std: self.max_std,
        };
        let mask = mask.map(|m| m.view([e, a]).contiguous());
        Ok(crate::cuda::fused::mppi_refit(
            &value.view([e, n]).contiguous(),
            &self.candidates,
            mask.as_ref(),
            draws.as_ref().map(Tensor::contiguous).as_ref(),
            settings,
        )?)
    }

    /// The standard-normal draws for candidates P..N of every environment, (E, H, N − P, A).
    fn candidate_draws(&self, device: Device, noise: &mut dyn Noise) -> Result<Tensor> {
        let (e, h, n, p, a) = (
            self.num_envs,
            self.horizon,
            self.num_samples,
            self.num_pi_trajs,
            self.action_dim,
        );
        Ok(noise
            .randn(&[e * h, n - p, a], device)?
            .view([e, h, n - p, a]))
    }

    /// Gaussian candidates P..N of every environment around `mean` with `std`, clamped, and
    /// masked (`mask` (E, 1, A)) where tasks have fewer actions.
    fn sample_candidates(
        &mut self,
        mean: &Tensor,
        std: &Tensor,
        mask: Option<&Tensor>,
        device: Device,
        noise: &mut dyn Noise,
    ) -> Result<()> {
        let (n, p) = (self.num_samples, self.num_pi_trajs);
        let r = self.candidate_draws(device, noise)?;
        let mut samples = (mean.unsqueeze(2) + std.unsqueeze(2) * r).clamp(-1.0, 1.0);
        if let Some(mask) = mask {
            samples *= mask.unsqueeze(2);
        }
        self.candidates.narrow(2, p, n - p).copy_(&samples);
        Ok(())
    }

    /// The elites' softmax weights (E, K, 1) and the weighted mean and clamped standard
    /// deviation (E, H, A) of their actions.
    fn refit(&self, elite_value: &Tensor, elite_actions: &Tensor) -> (Tensor, Tensor, Tensor) {
        let (max_value, _) = elite_value.max_dim(1, true);
        let mut score = ((elite_value - max_value) * self.temperature).exp();
        score = &score / score.sum_dim_intlist(1, true, Kind::Float);
        let weights = score.unsqueeze(1);
        let total = score.sum_dim_intlist(1, true, Kind::Float) + 1e-9;
        let mean = (&weights * elite_actions).sum_dim_intlist(2, false, Kind::Float) / &total;
        let std = ((&weights * (elite_actions - mean.unsqueeze(2)).square()).sum_dim_intlist(
            2,
            false,
            Kind::Float,
        ) / &total)
            .sqrt()
            .clamp(self.min_std, self.max_std);
        (score, mean, std)
    }

    /// One elite per environment, drawn with the Gumbel-max trick on log-weights; its first
    /// action, with exploration noise unless `eval_mode` (not yet clamped).
    fn choose_action(
        &self,
        score: &Tensor,
        elite_actions: &Tensor,
        std: &Tensor,
        eval_mode: bool,
        noise: &mut dyn Noise,
    ) -> Result<Tensor> {
        let (e, k, a) = (self.num_envs, self.num_elites, self.action_dim);
        let device = elite_actions.device();
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
        Ok(action)
    }

    /// Rolls out candidates `first..first + rows` of every environment from its latent in `z0`
    /// (E, Z) over the horizon: Σ_t γ^t (1 − done_t) r_t, the final latents and the
    /// termination flags. The dynamics step one at a time; then the rewards of all steps (see
    /// [`LatentModel::rollout_rewards`]) and their terminations.
    fn rollout(&self, model: &impl LatentModel, z0: &Tensor, first: i64, rows: i64) -> Rollout {
        let (e, h, a) = (self.num_envs, self.horizon, self.action_dim);
        // (H, E·rows, A): step t's actions of these candidates, environment-major.
        let actions = self
            .candidates
            .narrow(2, first, rows)
            .transpose(0, 1)
            .reshape([h, e * rows, a]);
        // z_1..z_H, (E·rows, Z) each.
        let mut latents: Vec<Tensor> = Vec::with_capacity(h as usize);
        for t in 0..h {
            let z = latents.last().unwrap_or(z0);
            latents.push(model.next(z, &actions.get(t)));
        }
        let rewards = model
            .rollout_rewards(
                z0,
                &latents[..h as usize - 1],
                &actions.reshape([h * e * rows, a]),
            )
            .view([h, e * rows, 1]);
        let mut weights = match model.discount() {
            // γ_e^t for each row's environment: (H, E·rows, 1).
            Some(discount) => {
                let steps = Tensor::arange(h, (Kind::Float, discount.device())).view([h, 1, 1]);
                discount
                    .repeat_interleave_self_int(rows, 0, None)
                    .unsqueeze(0)
                    .pow(&steps)
            }
            None => self.discounts.shallow_clone(),
        };
        // done_t: terminated at or before z_t (t = 1..H); the reward at step t counts while
        // z_t is not terminal.
        let terminated = model.terminal(&latents).map(|now| {
            let done = now
                .view([h, e * rows, 1])
                .cumsum(0, Kind::Float)
                .clamp_max(1.0);
            let alive = Tensor::cat(
                &[
                    Tensor::ones([1, e * rows, 1], (Kind::Float, done.device())),
                    1.0f64 - done.narrow(0, 0, h - 1),
                ],
                0,
            );
            weights = &weights * alive;
            done.get(h - 1)
        });
        let returns = (rewards * weights).sum_dim_intlist(0, false, Kind::Float);
        let per_env = |t: Tensor| t.view([e, rows, -1]);
        Rollout {
            returns: per_env(returns),
            latents: per_env(latents[h as usize - 1].shallow_clone()),
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
        let rows = |t: &Tensor| t.reshape([e * n, -1]);
        let z = rows(&rollout.latents);
        // γ^H (the environment's own with tasks), zero past a terminal step.
        let horizon_discount = match model.discount() {
            Some(discount) => discount
                .pow_tensor_scalar(self.horizon)
                .repeat_interleave_self_int(n, 0, None),
            None => self.horizon_discount.shallow_clone(),
        };
        let factor = match &rollout.terminated {
            Some(done) => (1.0f64 - rows(done)) * horizon_discount,
            None => horizon_discount,
        };
        let eps = noise.randn(&[e * n, self.action_dim], z.device())?;
        let action = model.policy_action(&z, &eps);
        let pair = Heads::random_pair(noise, model.num_q(), z.device())?;
        model.bootstrapped(&z, &action, &pair, &rows(&rollout.returns), &factor)
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
            .act_with_policy_batch(model, None, obs, eval_mode, noise)?
            .get(0))
    }

    /// Acting without planning (`mpc = false`) for E observations (E, obs_dim): a policy
    /// sample, or tanh of its mean in eval mode. Returns (E, A).
    pub fn act_with_policy_batch(
        &mut self,
        model: &WorldModel,
        task: Option<&TaskRows>,
        obs: &Tensor,
        eval_mode: bool,
        noise: &mut dyn Noise,
    ) -> Result<Tensor> {
        let rows = obs.size().first().copied().unwrap_or(0);
        expect_shape("policy observations", obs, &[rows, model.obs_dim])?;
        if model.task.is_some() != task.is_some() {
            return Err(Error::Config(
                "a multitask model acts with its environments' tasks, a single-task one without"
                    .into(),
            ));
        }
        tch::no_grad(|| {
            let z = model.encode(obs, task, noise)?;
            let eps = noise.randn(&[rows, self.action_dim], model.device())?;
            let out = model.pi(&z, &eps, task);
            Ok(if eval_mode { out.mean } else { out.action })
        })
    }
}
