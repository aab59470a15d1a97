//! Offline training on a dataset (the official offline trainer): `steps` updates on batches
//! read from this rank's dataset files, evaluated every `eval_freq` updates (each task on its
//! own), checkpointed every `save_freq` updates and at the end. Steps count updates, which
//! every rank makes together, so the step is the same number on every rank.
use tch::Device;

use super::evaluate::{self, Outcome};
use super::report::{Clock, Report};
use super::schedule::Schedule;
use super::stop;
use super::streams::Streams;
use crate::actor::{ActorSettings, Policy};
use crate::agent::{AgentConfig, TorchNoise, UpdateInfo};
use crate::checkpoint::{self, CheckpointSettings, TrainState};
use crate::config::Config;
use crate::dataset::{self, Dataset, Expected};
use crate::ddp::{ProcessGroup, RankInfo};
use crate::error::{Error, Result};
use crate::learner::{finite, Learner, LearnerSettings};

/// Update statistics are logged this often (and at every evaluation), as the official trainer.
const LOG_EVERY: u64 = 10_000;

pub(super) fn train(
    config: &Config,
    rank: &RankInfo,
    device: Device,
    group: &ProcessGroup,
) -> Result<()> {
    let dataset = open_shard(config, group)?;
    let mut learner = Learner::new(&LearnerSettings::from_config(config)?, device, group)?;
    let policy = Policy::new(
        &AgentConfig::from_config(config)?,
        device,
        config.num_envs,
        Box::new(TorchNoise::global()),
    )?;
    let mut actor = ActorSettings::from_config(config, rank.rank)?.make_actor(policy)?;
    let checkpoints = CheckpointSettings::from_config(config);
    let mut state = match checkpoint::resume(&checkpoints, &mut learner, group)? {
        Some(resumed) => resumed,
        None => {
            learner.broadcast_parameters()?;
            TrainState::default()
        }
    };
    let mut streams = Streams::new(config.seed, rank.rank, false);
    streams.reseed(state.step, &mut learner, &mut actor);
    let mut report = match group.rank() {
        0 => Some(Report::open(config, &checkpoints.run_dir)?),
        _ => None,
    };
    if report.is_some() {
        describe(config, &dataset, group.world_size());
    }
    let mut schedule = Schedule::new(config.eval_freq, config.save_freq, state.step);
    let clock = Clock::new(state.elapsed);
    let num_tasks = config.multitask().then_some(config.tasks()?.len());
    let mut last: Option<UpdateInfo> = None;
    while state.step < config.steps {
        let i = state.step;
        schedule.advance(i);
        if schedule.eval_due() {
            let info = match &last {
                Some(info) => Some(info.fetch()?),
                None => None,
            };
            actor.policy_mut().load_weights(learner.model())?;
            let seed = streams.evaluation_seed(i);
            if config.eval_episodes > 0 {
                match evaluate::evaluate(
                    &mut actor,
                    config.eval_episodes,
                    num_tasks,
                    seed,
                    group,
                    None,
                )? {
                    Outcome::Done(evaluation) => {
                        if let Some(report) = &mut report {
                            report.evaluation(i, &evaluation, 0, &clock)?;
                        }
                    }
                    Outcome::Stopped(request) => {
                        state.elapsed = clock.elapsed();
                        checkpoint::save(&checkpoints, &state, &learner, group)?;
                        return Err(Error::Stopped(format!(
                            "stopped during the evaluation at update {i}: {request}; checkpoint written"
                        )));
                    }
                }
            }
            if let Some(stats) = &info {
                finite::check_stats(stats, i)?;
                // Multiples of LOG_EVERY are logged already.
                if let (Some(report), false) = (&mut report, i.is_multiple_of(LOG_EVERY)) {
                    report.updates(i, &clock, stats)?;
                }
            }
            schedule.evaluated();
        }
        if schedule.save_due() {
            state.elapsed = clock.elapsed();
            checkpoint::save(&checkpoints, &state, &learner, group)?;
            streams.reseed(i, &mut learner, &mut actor);
            schedule.saved();
        }
        if let Some(request) = stop::requested(group)? {
            state.elapsed = clock.elapsed();
            checkpoint::save(&checkpoints, &state, &learner, group)?;
            return Err(Error::Stopped(format!(
                "stopped at update {i}: {request}; checkpoint written"
            )));
        }
        let batches = (0..config.sync_freq)
            .map(|_| {
                dataset
                    .sample(config.batch_size, &mut streams.learner)
                    .map(|b| b.to_device(device))
            })
            .collect::<Result<Vec<_>>>()?;
        let info = learner.update_on(&batches)?;
        if (i + 1) % LOG_EVERY == 0 {
            let stats = info.fetch()?;
            finite::check_stats(&stats, i + 1)?;
            if let Some(report) = &mut report {
                report.updates(i + 1, &clock, &stats)?;
            }
        }
        last = Some(info);
        state.step += 1;
        if let Some(report) = &report {
            report.progress(state.step);
        }
    }
    if let Some(report) = report.take() {
        report.close()?;
    }
    state.elapsed = clock.elapsed();
    checkpoint::save(&checkpoints, &state, &learner, group)?;
    if group.rank() == 0 {
        let peak = crate::memory::peak_bytes().unwrap_or(f64::NAN);
        eprintln!(
            "Training finished: {} ({:.1} updates/s; rank 0 read {:.1} MB of dataset files with \
             a peak memory of {:.1} MB)",
            checkpoints.run_dir.display(),
            config.steps as f64 / clock.elapsed().max(1e-9),
            dataset.bytes() as f64 / 1e6,
            peak / 1e6
        );
    }
    Ok(())
}

/// This rank's files of `data_dir`, indexed and checked against the run's model.
fn open_shard(config: &Config, group: &ProcessGroup) -> Result<Dataset> {
    let dir = config.data_dir.as_deref().unwrap_or_default();
    let files = dataset::files(std::path::Path::new(dir))?;
    let mine = dataset::shard(&files, group.rank(), group.world_size())?;
    let expected = Expected {
        obs_dim: config.resolved_obs_dim()?,
        action_dim: config.resolved_action_dim()?,
        num_tasks: config.tasks()?.len(),
        multitask: config.multitask(),
        slice: config.horizon + 1,
    };
    Dataset::open(&mine, &expected).map_err(|e| Error::Config(format!("data_dir={dir}: {e}")))
}

/// Rank 0's account of its share of the data.
fn describe(config: &Config, dataset: &Dataset, world_size: usize) {
    let tasks = config.tasks().unwrap_or_default();
    let per_task = dataset.episodes_per_task(tasks.len());
    let held: Vec<String> = tasks
        .iter()
        .zip(&per_task)
        .filter(|(_, &n)| n > 0)
        .map(|(task, n)| format!("{task} {n}"))
        .collect();
    eprintln!(
        "Offline training for {} updates on {} ({} ranks share its files): rank 0 reads {} \
         episodes ({:.1} MB) from disk as it samples: {}",
        config.steps,
        config.data_dir.as_deref().unwrap_or_default(),
        world_size,
        dataset.episodes(),
        dataset.bytes() as f64 / 1e6,
        held.join(", ")
    );
}
