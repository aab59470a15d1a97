//! The online trainer of one rank (reference §7): act, step, store, update, in strict sequence,
//! with evaluation, logging and checkpoints at global-step points shared by all ranks.
//!
//! `steps`, `eval_freq` and `save_freq` count global agent steps; each rank runs
//! `steps / world_size` of them. Evaluation and checkpoints happen at the first episode end at
//! or after each multiple of their frequency, the way the official trainer evaluates.
pub mod evaluate;
pub mod finite;
pub mod lock;
pub mod pipeline;
pub mod stop;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use rand::SeedableRng;
use rand_pcg::Pcg64;

use envs::{Placement, VectorEnv};

use crate::actor::{Acting, Actor, Policy};
use crate::agent::{HostNoise, TorchNoise, UpdateInfo};
use crate::checkpoint::{self, TrainState};
use crate::config::Config;
use crate::ddp::{Backend, ProcessGroup, RankInfo};
use crate::error::{Error, Result};
use crate::learner::Learner;
use crate::logging::{Logger, LoggerOptions, Phase, Record};
use pipeline::Pipeline;

/// The run directory: `run_dir`, else `runs/<task>/<exp_name>/<seed>`.
pub fn run_dir(config: &Config) -> PathBuf {
    match &config.run_dir {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from("runs")
            .join(&config.task)
            .join(&config.exp_name)
            .join(config.seed.to_string()),
    }
}

/// Counts a crossing of a multiple of `every` between two consecutive global steps.
fn crossed(every: u64, before: u64, now: u64) -> bool {
    now / every != before / every
}

pub fn run(config: Config, rank: RankInfo) -> Result<()> {
    // First thing: a stop requested during start-up must still end in a checkpoint.
    stop::install_handlers();
    crate::ddp::lifeline::bind_to_launcher()?;
    let dir = run_dir(&config);
    // Before the group forms: a second run on this directory fails at once (its other ranks
    // are stopped by their launcher, or time out).
    let _lock = if rank.rank == 0 {
        Some(lock::RunLock::acquire(&dir)?)
    } else {
        None
    };
    let device = crate::device::select(&config.device, &rank, config.dist_backend == "gloo")?;
    tch::set_num_threads(crate::device::threads(config.num_threads, rank.local_world_size) as i32);
    crate::device::set_tf32(device, config.tf32)?;
    let backend = Backend::choose(&config.dist_backend, device)?;
    let group = ProcessGroup::init(
        rank.clone(),
        backend,
        device,
        Duration::from_secs(config.dist_timeout),
        config.dist_force_group,
    )?;
    // After the group: its communication threads, already started, keep every CPU.
    let pinned = if config.cpu_affinity {
        crate::ddp::affinity::apply_from_env()?
    } else {
        None
    };
    let world = group.world_size() as u64;
    let root = group.rank() == 0;
    if let (true, Some(cpus)) = (root, pinned) {
        eprintln!(
            "rank 0 pinned to CPUs {}",
            crate::ddp::affinity::format_list(&cpus)
        );
    }
    if root && group.is_real() {
        eprintln!("{}", ProcessGroup::describe(backend));
    }
    if root {
        if let Some(line) = crate::device::compile_note(device, config.compile) {
            eprintln!("{line}");
        }
    }
    let agent_config = config.agent_config()?;

    let local_steps = config.steps / world;
    let seed_steps = config.seed_steps.unwrap_or(1000);
    let capacity = (config.buffer_size as u64).min(local_steps.max(1)) as usize;
    // Identical initialisation on every rank (and broadcast from rank 0 all the same); the
    // streams drawn from afterwards come from `reseed`.
    let mut learner = Learner::new(&config, capacity, device, &group)?;
    let policy = Policy::new(
        &agent_config,
        device,
        config.num_envs,
        Box::new(TorchNoise::global()),
    )?;
    let mut actor = Actor::new(make_envs(&config, rank.rank)?, policy, config.episodic)?;
    let pipeline = Pipeline::new(&config, &rank)?;
    let mut rng = Pcg64::seed_from_u64(0);
    let mut actor_rng = Pcg64::seed_from_u64(0);
    let mut state = TrainState::default();

    match checkpoint::resume(&config, &dir, &mut learner, &group)? {
        Some(resumed) => state = resumed,
        None => learner.broadcast_parameters()?,
    }
    actor.policy_mut().load_weights(learner.model())?;
    let global_start = state.step * world;
    let streams = Streams {
        config: &config,
        rank: rank.rank,
        pipelined: pipeline.is_some(),
    };
    streams.reseed(
        global_start,
        &mut learner,
        &mut actor,
        &mut rng,
        &mut actor_rng,
    );
    let mut logger = if root {
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        let yaml = config.to_yaml()?;
        std::fs::write(dir.join("config.yaml"), yaml)
            .map_err(|e| Error::io("write config.yaml", e))?;
        Some(Logger::open(&LoggerOptions::from_config(&config, &dir)?)?)
    } else {
        None
    };
    let progress = (root && std::io::stderr().is_terminal()).then(|| progress_bar(config.steps));

    let start = Instant::now();
    let elapsed_before = state.elapsed;
    let elapsed = || elapsed_before + start.elapsed().as_secs_f64();
    let updates_per_step = (config.num_envs / config.steps_per_update) as u64;
    // A resumed run already evaluated and saved at its first step, before the checkpoint.
    let mut previous_step = state.step;
    let mut eval_due = state.step == 0;
    let mut save_due = false;
    let mut ready_to_update = false;
    let mut last_info = None;
    // With pipeline=true: the updates owed by the last step, made beside the next one.
    let mut pending = 0u64;
    // Where learning's steady state began: the throughput reported at the end.
    let mut steady_from = None;
    while state.step <= local_steps {
        if state.step > seed_steps && steady_from.is_none() {
            steady_from = Some((Instant::now(), state.step));
        }
        let global = state.step * world;
        if state.step > previous_step {
            let before = previous_step * world;
            eval_due |= crossed(config.eval_freq, before, global);
            save_due |= crossed(config.save_freq, before, global);
        }
        previous_step = state.step;
        // Evaluations and checkpoints wait until every environment ends its episode, and see
        // no update in flight.
        let at_boundary = actor.all_done();
        let checkpoint_point = (eval_due || save_due) && at_boundary;
        if checkpoint_point && pending > 0 {
            last_info = Some(run_updates(&mut learner, &mut rng, pending)?);
            actor.policy_mut().load_weights(learner.model())?;
            pending = 0;
        }
        if checkpoint_point && eval_due && config.eval_episodes == 0 {
            eval_due = false;
        }
        if checkpoint_point && eval_due {
            let eval_seed = derive_seed(config.seed, rank.rank, global, 1);
            let outcome = evaluate::evaluate(&mut actor, config.eval_episodes, eval_seed, &group)?;
            let summary = match outcome {
                evaluate::Outcome::Done(summary) => summary,
                evaluate::Outcome::Stopped(request) => {
                    // The episodes that just ended are not in the buffer nor counted: the
                    // checkpoint is the state before them.
                    state.elapsed = elapsed();
                    let when = format!("during the evaluation at step {global}");
                    return Err(stop_with_checkpoint(
                        &config, &dir, &state, &learner, &group, &when, request,
                    ));
                }
            };
            if let Some(logger) = &mut logger {
                let mut record = Record::new(Phase::Eval, global)
                    .with("episode_reward", summary.mean)
                    .with("episode_reward_std", summary.std)
                    .with("episode_reward_min", summary.min)
                    .with("episode_reward_max", summary.max)
                    .with("episode_length", summary.mean_length)
                    .with("episodes", summary.episodes as f64)
                    .with("episode", state.episodes as f64)
                    .with("elapsed_time", elapsed())
                    .with("steps_per_second", global as f64 / elapsed().max(1e-9));
                if let Some(s) = summary.success {
                    record = record.with("episode_success", s);
                }
                log_line(logger, &progress, &record)?;
            }
            eval_due = false;
        }
        for i in actor.done() {
            let Some((episode, stats)) = actor.take_episode(i) else {
                continue;
            };
            learner.add_episode(&episode)?;
            state.episodes += 1;
            // Fetched on every rank (the values are all-reduced), so all stop alike.
            let update_stats = match &last_info {
                Some(info) => Some(crate::agent::UpdateInfo::fetch(info)?),
                None => None,
            };
            if let Some(s) = &update_stats {
                finite::check_stats(s, global)?;
            }
            if let Some(logger) = &mut logger {
                let mut record = Record::new(Phase::Train, global)
                    .with("episode_reward", stats.reward)
                    .with("episode_length", stats.length as f64)
                    .with("episode_terminated", stats.terminated as u8 as f64)
                    .with("episode", state.episodes as f64)
                    .with("elapsed_time", elapsed())
                    .with("steps_per_second", global as f64 / elapsed().max(1e-9));
                if let Some(s) = stats.success {
                    record = record.with("episode_success", s);
                }
                if let Some(s) = &update_stats {
                    for (k, v) in s.named() {
                        record = record.with(k, v);
                    }
                }
                log_line(logger, &progress, &record)?;
            }
        }
        if checkpoint_point && save_due {
            state.elapsed = elapsed();
            checkpoint::save(&config, &dir, &state, &learner, &group)?;
            streams.reseed(global, &mut learner, &mut actor, &mut rng, &mut actor_rng);
            save_due = false;
        }
        if !(eval_due || save_due) {
            // Episode seeds count the episodes started (finished ones and those running), so
            // every episode of every environment gets its own.
            let done = actor.done();
            let started = state.episodes + (actor.num_envs() - done.len()) as u64;
            for (episode, i) in (started..).zip(done) {
                actor.reset(i, derive_seed(config.seed, rank.rank, episode, 0))?;
            }
        }
        if let Some(request) = stop::requested(&group)? {
            if pending > 0 {
                run_updates(&mut learner, &mut rng, pending)?;
            }
            state.elapsed = elapsed();
            let when = format!("at step {global}");
            return Err(stop_with_checkpoint(
                &config, &dir, &state, &learner, &group, &when, request,
            ));
        }

        let explore = state.step > seed_steps;
        let owed = std::mem::take(&mut pending);
        let stepped = match &pipeline {
            None => actor.step(if explore {
                Acting::Policy
            } else {
                Acting::Random(&mut rng)
            })?,
            Some(pipeline) => {
                let acting = if explore {
                    Acting::Policy
                } else {
                    Acting::Random(&mut actor_rng)
                };
                let (stepped, info) = pipeline.overlap(
                    || actor.step(acting),
                    || match owed {
                        0 => Ok(None),
                        n => run_updates(&mut learner, &mut rng, n).map(Some),
                    },
                )?;
                if let Some(info) = info {
                    last_info = Some(info);
                    actor.policy_mut().load_weights(learner.model())?;
                }
                stepped
            }
        } as u64;

        // Only a run resumed without its replay buffers can find it empty here.
        let seeding_ends = state.step <= seed_steps && seed_steps < state.step + stepped.max(1);
        let learning = seeding_ends || state.step > seed_steps;
        ready_to_update = ready_to_update || (learning && learner.ready()?);
        if learning && ready_to_update {
            if seeding_ends {
                // One update per steps_per_update seed steps, as afterwards. A run stopped
                // during pretraining makes only the updates that were left.
                let updates = (seed_steps / config.steps_per_update as u64).max(1);
                let done = state.pretrain_updates;
                if updates > 1 && root {
                    eprintln!(
                        "Pretraining agent on seed data ({} updates)...",
                        updates - done
                    );
                }
                for update in done..updates {
                    // The same update indices on every rank: the stop check is a collective.
                    let request = if updates > 1 {
                        stop::requested(&group)?
                    } else {
                        None
                    };
                    if let Some(request) = request {
                        state.elapsed = elapsed();
                        state.pretrain_updates = update;
                        let when = format!(
                            "during pretraining (after {update} of {updates} updates) at step \
                             {global}"
                        );
                        return Err(stop_with_checkpoint(
                            &config, &dir, &state, &learner, &group, &when, request,
                        ));
                    }
                    last_info = Some(learner.update(&mut rng)?);
                }
                state.pretrain_updates = 0;
                actor.policy_mut().load_weights(learner.model())?;
            } else if pipeline.is_some() {
                pending = updates_per_step;
            } else {
                last_info = Some(run_updates(&mut learner, &mut rng, updates_per_step)?);
                actor.policy_mut().load_weights(learner.model())?;
            }
        }
        state.step += stepped.max(1);
        if let Some(bar) = &progress {
            bar.set_position(state.step * world);
        }
    }
    if pending > 0 {
        run_updates(&mut learner, &mut rng, pending)?;
    }
    let steady_rate = steady_from.map(|(since, step)| {
        (state.step.min(local_steps + 1) - step) as f64 * world as f64
            / since.elapsed().as_secs_f64().max(1e-9)
    });
    if let Some(bar) = &progress {
        bar.finish_and_clear();
    }
    if let Some(logger) = logger.take() {
        logger.close()?;
    }
    state.step = local_steps;
    state.elapsed = elapsed();
    checkpoint::save(&config, &dir, &state, &learner, &group)?;
    if root {
        match steady_rate {
            Some(rate) => eprintln!(
                "Training finished: {} ({rate:.1} agent steps/s after seeding)",
                dir.display()
            ),
            None => eprintln!("Training finished: {}", dir.display()),
        }
    }
    Ok(())
}

/// `count` synchronised updates; the statistics of the last.
fn run_updates(learner: &mut Learner, rng: &mut Pcg64, count: u64) -> Result<UpdateInfo> {
    let mut info = learner.update(rng)?;
    for _ in 1..count {
        info = learner.update(rng)?;
    }
    Ok(info)
}

/// A rank's environments: `num_envs` of the task, environment i seeded with
/// seed + i·world_size + rank (environment 0 as a single environment always was). Python
/// environments step in worker processes when there are several.
fn make_envs(config: &Config, rank: usize) -> Result<VectorEnv> {
    let n = config.num_envs;
    let seeds: Vec<u64> = (0..n)
        .map(|i| config.seed + (i * config.world_size + rank) as u64)
        .collect();
    let native = envs::native::TASKS.contains(&config.task.as_str());
    let workers = match config.env_workers {
        _ if n == 1 || native => 0,
        Some(k) => k,
        None => crate::device::threads(config.num_threads, 1).min(n),
    };
    let placement = match workers {
        0 => Placement::InProcess,
        k => Placement::Workers(k),
    };
    let worker = crate::cli::env_worker_command()?;
    Ok(VectorEnv::new(&config.task, &seeds, placement, &worker)?)
}

/// Writes the checkpoint a stop promises; returns the error that ends the run (the save's own,
/// if it failed).
#[allow(clippy::too_many_arguments)]
fn stop_with_checkpoint(
    config: &Config,
    dir: &Path,
    state: &TrainState,
    learner: &Learner,
    group: &ProcessGroup,
    when: &str,
    request: stop::StopRequest,
) -> Error {
    match checkpoint::save(config, dir, state, learner, group) {
        Ok(()) => Error::Stopped(format!("stopped {when}: {request}; checkpoint written")),
        Err(e) => e,
    }
}

/// A seed for stream `purpose` of `rank` at `counter` (SplitMix64 mixing; dm_control takes 32 bits).
fn derive_seed(seed: u64, rank: usize, counter: u64, purpose: u64) -> u64 {
    let mut x = seed ^ (rank as u64).rotate_left(40) ^ counter.rotate_left(8) ^ purpose;
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (x ^ (x >> 31)) & 0xffff_ffff
}

/// Re-derives every random stream from (seed, rank, step). Done at each checkpoint point, so a
/// run resumed from that checkpoint draws exactly what the uninterrupted run draws.
struct Streams<'c> {
    config: &'c Config,
    rank: usize,
    pipelined: bool,
}

impl Streams<'_> {
    fn reseed(
        &self,
        global_step: u64,
        learner: &mut Learner,
        actor: &mut Actor,
        rng: &mut Pcg64,
        actor_rng: &mut Pcg64,
    ) {
        let seed = |rank, purpose| derive_seed(self.config.seed, rank, global_step, purpose);
        // Seeds torch's generator and the learner's own CPU dropout-mask stream; the per-batch
        // stream (Q heads) is shared by all ranks: no rank in its seed.
        learner.set_noise(
            Box::new(TorchNoise::seeded(seed(self.rank, 2))),
            Box::new(HostNoise::seeded(seed(0, 3))),
        );
        *rng = Pcg64::seed_from_u64(seed(self.rank, 4));
        // In the strict loop acting shares torch's generator and the random actions share the
        // learner's stream, as they always did. Pipelined, the two threads draw concurrently:
        // each needs streams of its own for a run to be reproducible.
        if self.pipelined {
            actor
                .policy_mut()
                .set_noise(Box::new(HostNoise::seeded(seed(self.rank, 5))));
            *actor_rng = Pcg64::seed_from_u64(seed(self.rank, 6));
        } else {
            actor.policy_mut().set_noise(Box::new(TorchNoise::global()));
        }
    }
}

fn progress_bar(total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    let style = ProgressStyle::with_template("{bar:40} {pos}/{len} steps  {per_sec}  ETA {eta}")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar
}

fn log_line(logger: &mut Logger, progress: &Option<ProgressBar>, record: &Record) -> Result<()> {
    match progress {
        Some(bar) => bar.suspend(|| logger.log(record)),
        None => logger.log(record),
    }
}
