//! The online trainer of one rank (reference §7): act, step, store, update, in strict sequence,
//! with evaluation, logging and checkpoints at global-step points shared by all ranks.
//!
//! `steps`, `eval_freq` and `save_freq` count global agent steps; each rank runs
//! `steps / world_size` of them. Evaluation and checkpoints happen at the first episode end at
//! or after each multiple of their frequency, the way the official trainer evaluates.
pub mod actor;
pub mod evaluate;
pub mod finite;
pub mod learner;
pub mod lock;
pub mod stop;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use rand::SeedableRng;
use rand_pcg::Pcg64;

use crate::agent::{Agent, HostNoise, TorchNoise};
use crate::checkpoint::{self, TrainState};
use crate::config::Config;
use crate::ddp::{Backend, ProcessGroup, RankInfo};
use crate::error::{Error, Result};
use crate::logging::{Logger, LoggerOptions, Phase, Record};
use actor::Actor;
use learner::Learner;

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

    // Identical initialisation on every rank (and broadcast from rank 0 all the same); the
    // streams drawn from afterwards come from `reseed`.
    let mut agent = Agent::new(agent_config, device, config.seed)?;
    let env = envs::make(&config.task, config.seed + rank.rank as u64)?;
    let mut actor = Actor::new(env, config.episodic);
    let mut rng = Pcg64::seed_from_u64(0);

    let local_steps = config.steps / world;
    let seed_steps = config.seed_steps.unwrap_or(1000);
    let capacity = (config.buffer_size as u64).min(local_steps.max(1)) as usize;
    let mut learner = Learner::new(&config, capacity, device, &group)?;
    let mut state = TrainState::default();

    match checkpoint::resume(&config, &dir, &mut agent, &mut learner, &group)? {
        Some(resumed) => state = resumed,
        None => learner.broadcast_parameters(&mut agent)?,
    }
    let global_start = state.step * world;
    reseed(&config, rank.rank, global_start, &mut agent, &mut rng);
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
    // A resumed run already evaluated and saved at its first step, before the checkpoint.
    let first_step = state.step;
    let mut eval_due = state.step == 0;
    let mut save_due = false;
    let mut ready_to_update = false;
    let mut last_info = None;
    while state.step <= local_steps {
        let global = state.step * world;
        if state.step > first_step {
            let before = (state.step - 1) * world;
            eval_due |= crossed(config.eval_freq, before, global);
            save_due |= crossed(config.save_freq, before, global);
        }
        if actor.done() {
            if eval_due {
                let eval_seed = derive_seed(config.seed, rank.rank, global, 1);
                let outcome = evaluate::evaluate(
                    &mut agent,
                    actor.env_mut(),
                    config.eval_episodes,
                    eval_seed,
                    &group,
                )?;
                let summary = match outcome {
                    evaluate::Outcome::Done(summary) => summary,
                    evaluate::Outcome::Stopped(request) => {
                        // The episode that just ended is not in the buffer nor counted: the
                        // checkpoint is the state before it.
                        state.elapsed = elapsed();
                        let when = format!("during the evaluation at step {global}");
                        return Err(stop_with_checkpoint(
                            &config, &dir, &state, &agent, &learner, &group, &when, request,
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
            if actor.has_episode() {
                let (episode, stats) = actor.take_episode();
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
            if save_due {
                state.elapsed = elapsed();
                checkpoint::save(&config, &dir, &state, &agent, &learner, &group)?;
                reseed(&config, rank.rank, global, &mut agent, &mut rng);
                save_due = false;
            }
            actor.reset(derive_seed(config.seed, rank.rank, state.episodes, 0))?;
        }
        if let Some(request) = stop::requested(&group)? {
            state.elapsed = elapsed();
            let when = format!("at step {global}");
            return Err(stop_with_checkpoint(
                &config, &dir, &state, &agent, &learner, &group, &when, request,
            ));
        }

        let action = if state.step > seed_steps {
            let (obs, t0) = actor.observation();
            agent.act(obs, t0, false)?
        } else {
            actor.random_action(&mut rng)
        };
        actor.step(&action)?;

        // Only a run resumed without its replay buffers can find it empty here.
        ready_to_update = ready_to_update || (state.step >= seed_steps && learner.ready()?);
        if state.step >= seed_steps && ready_to_update {
            // A run stopped during pretraining makes only the updates that were left.
            let (done, updates) = if state.step == seed_steps {
                (state.pretrain_updates, seed_steps)
            } else {
                (0, 1)
            };
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
                        "during pretraining (after {update} of {updates} updates) at step {global}"
                    );
                    return Err(stop_with_checkpoint(
                        &config, &dir, &state, &agent, &learner, &group, &when, request,
                    ));
                }
                last_info = Some(learner.update(&mut agent, &mut rng)?);
            }
            state.pretrain_updates = 0;
        }
        state.step += 1;
        if let Some(bar) = &progress {
            bar.set_position(state.step * world);
        }
    }
    if let Some(bar) = &progress {
        bar.finish_and_clear();
    }
    if let Some(logger) = logger.take() {
        logger.close()?;
    }
    state.step = local_steps;
    state.elapsed = elapsed();
    checkpoint::save(&config, &dir, &state, &agent, &learner, &group)?;
    if root {
        eprintln!("Training finished: {}", dir.display());
    }
    Ok(())
}

/// Writes the checkpoint a stop promises; returns the error that ends the run (the save's own,
/// if it failed).
#[allow(clippy::too_many_arguments)]
fn stop_with_checkpoint(
    config: &Config,
    dir: &Path,
    state: &TrainState,
    agent: &Agent,
    learner: &Learner,
    group: &ProcessGroup,
    when: &str,
    request: stop::StopRequest,
) -> Error {
    match checkpoint::save(config, dir, state, agent, learner, group) {
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
fn reseed(config: &Config, rank: usize, global_step: u64, agent: &mut Agent, rng: &mut Pcg64) {
    // Seeds torch's generator and the agent's own CPU dropout-mask stream.
    agent.sample_noise = Box::new(TorchNoise::seeded(derive_seed(
        config.seed,
        rank,
        global_step,
        2,
    )));
    // The per-batch stream (Q heads) is shared by all ranks: no rank in its seed.
    agent.batch_noise = Box::new(HostNoise::seeded(derive_seed(
        config.seed,
        0,
        global_step,
        3,
    )));
    *rng = Pcg64::seed_from_u64(derive_seed(config.seed, rank, global_step, 4));
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
