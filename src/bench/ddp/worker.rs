//! One rank of a `bench --cases ddp` measurement (`tdmpc2 bench-worker`): the training loop's
//! per-step work minus the environment, timed, reported as one JSON line on stdout.
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;
use tch::Device;

use crate::actor::Policy;
use crate::agent::{HostNoise, TorchNoise};
use crate::buffer::Episode;
use crate::config::{Config, Source};
use crate::ddp::{ProcessGroup, RankInfo};
use crate::error::{Error, Result};
use crate::learner::{Learner, LearnerSettings};

use super::summary::WorkerReport;

/// walker-run's dimensions (dm_control): the discount they resolve to is 0.99.
const OBS_DIM: usize = 24;
const ACTION_DIM: usize = 6;
const EPISODE_LENGTH: usize = 500;
/// Random episodes per rank's buffer: sampling cost does not depend on the fill.
const EPISODES: usize = 4;
/// Collective timeout of the workers' group; the parent stops all ranks as soon as one fails.
const GROUP_TIMEOUT: Duration = Duration::from_secs(300);

/// The hidden `bench-worker` subcommand: one rank of a measurement (rank variables from the
/// environment, as torchrun sets them).
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    #[arg(long)]
    pub threads: usize,
    #[arg(long)]
    pub sync_freq: usize,
    #[arg(long)]
    pub steps: usize,
    #[arg(long)]
    pub warmup: usize,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// The resolved config of the measurement: official settings, model_size=1, walker-run dims.
fn worker_config(args: &WorkerArgs) -> Result<Config> {
    let overrides = vec![
        "model_size=1".to_owned(),
        "device=cpu".to_owned(),
        format!("sync_freq={}", args.sync_freq),
        format!("num_threads={}", args.threads),
        format!("seed={}", args.seed),
    ];
    let mut config = Config::load(&Source {
        overrides,
        ..Source::default()
    })?;
    config.resolve(&envs::EnvSpec {
        obs_shape: vec![OBS_DIM],
        action_dim: ACTION_DIM,
        episode_length: EPISODE_LENGTH,
    })?;
    Ok(config)
}

fn random_episode(rng: &mut Pcg64) -> Episode {
    let mut uniform = |n: usize, low: f32| -> Vec<f32> {
        (0..n).map(|_| rng.random_range(low..=1.0f32)).collect()
    };
    Episode {
        obs: uniform((EPISODE_LENGTH + 1) * OBS_DIM, -1.0).into(),
        action: uniform(EPISODE_LENGTH * ACTION_DIM, -1.0),
        reward: uniform(EPISODE_LENGTH, 0.0),
        terminated: vec![0.0; EPISODE_LENGTH],
        task: None,
    }
}

/// The training loop's work per agent step minus the environment: seconds planning, updating.
fn agent_step(
    policy: &mut Policy,
    learner: &mut Learner,
    rng: &mut Pcg64,
    t0: bool,
) -> Result<(f64, f64)> {
    let obs: Vec<f32> = (0..OBS_DIM)
        .map(|_| rng.random_range(-1.0f32..=1.0))
        .collect();
    let started = Instant::now();
    policy.act(&obs, &[t0], false)?;
    let planned = Instant::now();
    learner.update(rng)?;
    policy.load_weights(learner.model())?;
    Ok((
        (planned - started).as_secs_f64(),
        planned.elapsed().as_secs_f64(),
    ))
}

/// Milliseconds of the update's two gradient all-reduces, each repeat started after a barrier.
fn isolated_all_reduce_ms(group: &ProcessGroup, learner: &Learner) -> Result<f64> {
    const REPEATS: usize = 10;
    if group.world_size() == 1 {
        return Ok(0.0);
    }
    let model = learner.model();
    let mut grads = [
        model.model_params.flat.zeros_like(),
        model.policy_params.flat.zeros_like(),
    ];
    let mut seconds = 0.0;
    for _ in 0..REPEATS {
        group.barrier()?;
        let started = Instant::now();
        for grad in &mut grads {
            group.all_reduce_mean(grad)?;
        }
        seconds += started.elapsed().as_secs_f64();
    }
    Ok(seconds * 1e3 / REPEATS as f64)
}

/// One rank: warm-up, then `steps` timed (plan + update) steps; prints its report on stdout.
pub fn worker(args: &WorkerArgs) -> Result<()> {
    if args.threads == 0 || args.steps == 0 {
        return Err(Error::Config(
            "bench-worker needs --threads >= 1 and --steps >= 1".into(),
        ));
    }
    let config = worker_config(args)?;
    let (rank, _) = RankInfo::from_env(&config, &|key| std::env::var(key).ok())?;
    tch::set_num_threads(args.threads as i32);
    let group = ProcessGroup::init(
        rank.clone(),
        crate::ddp::Backend::Gloo,
        Device::Cpu,
        GROUP_TIMEOUT,
        false,
        || false,
    )?;
    crate::ddp::affinity::apply_from_env()?;
    let device = Device::Cpu;
    let mut learner = Learner::new(
        &LearnerSettings::from_config(&config)?.with_capacity(EPISODES * (EPISODE_LENGTH + 1)),
        device,
        &group,
    )?;
    learner.broadcast_parameters()?;
    let mut policy = Policy::new(
        &crate::agent::AgentConfig::from_config(&config)?,
        device,
        1,
        Box::new(TorchNoise::global()),
    )?;
    policy.load_weights(learner.model())?;
    // As in training: per-sample draws differ by rank, the per-batch draws (Q heads) are shared.
    learner.set_noise(
        Box::new(TorchNoise::seeded(config.seed + 1 + rank.rank as u64)),
        Box::new(HostNoise::seeded(config.seed)),
    );
    let mut rng = Pcg64::seed_from_u64(config.seed.wrapping_mul(1000) + rank.rank as u64);
    for _ in 0..EPISODES {
        learner.add_episode(&random_episode(&mut rng))?;
    }
    if !learner.ready()? {
        return Err(Error::Other("bench buffer cannot be sampled from".into()));
    }

    for i in 0..args.warmup {
        agent_step(&mut policy, &mut learner, &mut rng, i == 0)?;
    }
    group.barrier()?;
    let comm_before = learner.comm_times();
    let (mut plan, mut update) = (0.0, 0.0);
    let started = Instant::now();
    for i in 0..args.steps {
        let t0 = args.warmup == 0 && i == 0;
        let (p, u) = agent_step(&mut policy, &mut learner, &mut rng, t0)?;
        plan += p;
        update += u;
    }
    let seconds = started.elapsed().as_secs_f64();
    let comm = learner.comm_times();
    let allreduce_isolated_ms = isolated_all_reduce_ms(&group, &learner)?;
    let per_step_ms = 1e3 / args.steps as f64;
    let report = WorkerReport {
        rank: rank.rank,
        world_size: rank.world_size,
        threads: args.threads,
        steps: args.steps,
        seconds,
        plan_ms: plan * per_step_ms,
        update_ms: update * per_step_ms,
        allreduce_ms: (comm.grad_all_reduce - comm_before.grad_all_reduce) * per_step_ms,
        other_collectives_ms: (comm.other - comm_before.other) * per_step_ms,
        allreduce_isolated_ms,
    };
    let line = serde_json::to_string(&report)
        .map_err(|e| Error::Other(format!("cannot write the bench report: {e}")))?;
    outln!("{line}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_config_is_walker_run_model_size_1() {
        let config = worker_config(&WorkerArgs {
            threads: 1,
            sync_freq: 2,
            steps: 1,
            warmup: 0,
            seed: 1,
        })
        .unwrap();
        assert_eq!(config.discount, Some(0.99));
        assert_eq!((config.mlp_dim, config.latent_dim), (384, 128));
        assert_eq!(
            (
                config.batch_size,
                config.horizon,
                config.num_samples,
                config.num_elites,
                config.num_pi_trajs,
                config.iterations,
                config.sync_freq
            ),
            (256, 3, 512, 64, 24, 6, 2)
        );
    }
}
