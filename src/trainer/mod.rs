//! The online trainer of one rank (reference §7): act, store, update, in strict sequence (or
//! acting beside learning with `pipeline=true`), with evaluation, logging and checkpoints at
//! global-step points shared by all ranks.
//!
//! `steps`, `eval_freq` and `save_freq` count global agent steps; each rank runs
//! `steps / world_size` of them, `num_envs` per vector step. Evaluation and checkpoints happen
//! at the first episode end at or after each multiple of their frequency, the way the official
//! trainer evaluates (the last evaluation point at the end, mid-episode if need be); with episodes of different lengths across ranks (a multitask run, or
//! early terminations) the ranks agree on the first vector step where every environment of
//! every rank is at an episode end. An environment waiting for that point still counts its
//! steps, so that all ranks keep one step count.
mod countdown;
mod eval_point;
pub mod evaluate;
pub mod lock;
mod offline;
pub use offline::open_dataset;
pub mod pipeline;
mod report;
pub mod run_dir;
mod schedule;
mod setup;
pub mod stop;
mod streams;
pub use streams::collected_episode_seed;
mod training;

use crate::config::Config;
use crate::ddp::RankInfo;
use crate::error::Result;
use training::Training;

pub fn run(config: Config, rank: RankInfo) -> Result<()> {
    // First thing: a stop requested during start-up must still end in a checkpoint.
    stop::install_handlers();
    crate::ddp::lifeline::bind_to_launcher(
        || stop::request(stop::Reason::LauncherLost),
        std::time::Duration::from_secs(config.stop_grace),
    )?;
    // What needs no run directory first, so that a refused run leaves none behind.
    let device = crate::device::select(&config.device, &rank, config.dist_backend == "gloo")?;
    if config.offline() {
        offline::verify_dataset(&config, rank.rank, rank.world_size)?;
    }
    // A stop asked while the dataset was read (minutes, for a large one) ends the run before
    // it claims its directory: nothing written.
    stop::refuse_to_start_when_asked()?;
    // Before the group forms: a second run on this directory fails at once (its other ranks
    // are stopped by their launcher, or time out).
    let _lock = match rank.rank {
        0 => Some(run_dir::claim(&config)?),
        _ => None,
    };
    let group = setup::join_group(&config, &rank, device)?;
    if config.offline() {
        return offline::train(&config, &rank, device, &group);
    }
    if config.multitask() && group.rank() == 0 {
        errln!(
            "note: task={} without data_dir trains online, playing every task; the official \
             code trains its multitask models offline only (data_dir=DIR for that)",
            config.task
        );
    }
    let mut training = Training::start(&config, &rank, device, &group)?;
    while training.running() {
        // Evaluations and checkpoints wait until every environment ends its episode, and see
        // no update in flight.
        let checkpoint_point = training.begin_step()?;
        if checkpoint_point {
            training.drain_pipeline()?;
            training.evaluate_if_due()?;
        }
        training.store_finished_episodes()?;
        if checkpoint_point {
            training.checkpoint_if_due()?;
        }
        training.reset_finished_environments()?;
        training.stop_if_requested()?;
        training.act()?;
        training.learn()?;
        training.advance();
    }
    training.finish()
}
