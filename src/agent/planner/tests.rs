//! The planner against a model with a known optimum, the former single-environment planner
//! and separate plans.
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
    fn encode(&self, obs: &Tensor, _noise: &mut dyn Noise) -> Result<Tensor> {
        Ok(Tensor::zeros(
            [obs.size()[0], 4],
            (Kind::Float, Device::Cpu),
        ))
    }
    fn next(&self, _z: &Tensor, a: &Tensor) -> Tensor {
        Tensor::zeros([a.size()[0], 4], (Kind::Float, Device::Cpu))
    }
    fn rollout_rewards(&self, _z0: &Tensor, _later: &[Tensor], a: &Tensor) -> Tensor {
        -(a - &self.target)
            .square()
            .sum_dim_intlist(-1, true, Kind::Float)
    }
    fn terminal(&self, _steps: &[Tensor]) -> Option<Tensor> {
        None
    }
    fn policy_action(&self, z: &Tensor, eps: &Tensor) -> Tensor {
        let per_latent = eps.size()[0] / z.size()[0];
        let z = z.repeat_interleave_self_int(per_latent, 0, None);
        (eps + z.sum_dim_intlist(-1, true, Kind::Float)).tanh()
    }
    fn q_avg(&self, z: &Tensor, _a: &Tensor, pair: &Heads) -> Result<Tensor> {
        let Heads::Pair(pair) = pair else {
            panic!("the planner averages a pair of heads");
        };
        assert_ne!(pair.int64_value(&[0]), pair.int64_value(&[1]));
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

/// At one environment the batched planner makes the same draws (order and shapes) as the
/// single-environment planner it replaced and computes the same plans: equal but for float
/// rounding (the reward's first layer sums its terms in another order).
#[test]
fn one_environment_matches_the_former_planner() {
    // Six refits amplify rounding: at model size 1 a relative change of 1e-7 in the observation
    // moves the former planner's own action by up to 8e-5, so 1e-3 is rounding, not a change.
    let close = |a: &Tensor, b: &Tensor| (a - b).abs().max().double_value(&[]) < 1e-3;
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
                close(&got, &expected),
                "config {c} call {call}: {got:?} vs {expected:?}"
            );
            assert!(
                close(&planner.prev_mean().get(0), &reference.prev_mean),
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
                    "call {call} env {env}: actions differ by {diff} (tolerance {tolerance})"
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

/// Environments of different tasks in one batched plan (task embeddings, action masks and
/// discounts per environment) equal separate plans of each, given the same draws; a task's
/// missing action components stay zero; a multitask model refuses to plan without tasks.
#[test]
fn environments_of_different_tasks_plan_as_they_would_alone() {
    let config = AgentConfig {
        tasks: Some(crate::agent::task::Tasks {
            task_dim: 4,
            action_dims: vec![3, 1, 2],
            discounts: vec![0.99, 0.95, 0.9],
        }),
        ..small_config(false)
    };
    let model = random_model(&config, 5);
    let tasks = Tensor::from_slice(&[2i64, 0, 1]);
    let envs = 3;
    let mut batched = Planner::new(&config, Device::Cpu, envs).unwrap();
    let mut noise = RecordingNoise::new(HostNoise::seeded(13));
    let obs = HostNoise::seeded(14)
        .randn(&[envs as i64, config.obs_dim as i64], Device::Cpu)
        .unwrap();
    let t0 = [true; 3];
    let plain = batched.plan_batch(&model, &obs, &t0, false, &mut HostNoise::seeded(1));
    assert!(matches!(plain, Err(Error::Config(_))), "no tasks given");
    let with_tasks = TaskModel::new(&model, &tasks).unwrap();
    let actions = batched
        .plan_batch(&with_tasks, &obs, &t0, false, &mut noise)
        .unwrap();
    let zeros = |row: i64, from: i64| {
        let rest = actions.get(row).narrow(0, from, 3 - from);
        rest.abs().max().double_value(&[])
    };
    assert_eq!((zeros(0, 2), zeros(2, 1)), (0.0, 0.0), "masked components");
    for (env, mut replay) in split_draws(&noise.draws, envs as i64)
        .into_iter()
        .enumerate()
    {
        let e = env as i64;
        let alone = TaskModel::new(&model, &tasks.narrow(0, e, 1)).unwrap();
        let mut planner = Planner::new(&config, Device::Cpu, 1).unwrap();
        let action = planner
            .plan(&alone, &obs.narrow(0, e, 1), true, false, &mut replay)
            .unwrap();
        assert_eq!(replay.remaining(), 0, "env {env}: draws left");
        let diff = (action - actions.get(e)).abs().max().double_value(&[]);
        assert!(diff <= 1e-6, "env {env}: actions differ by {diff}");
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
        .act_with_policy_batch(&model, None, &obs, true, &mut noise)
        .unwrap();
    assert_eq!(policy.size(), vec![2, 3]);
}
