//! `tdmpc2 collect`: plays episodes with a trained agent (or uniform random actions) and writes
//! them as a dataset in the official format, for offline training (`data_dir=`).
use std::path::PathBuf;

use rand::SeedableRng;
use rand_pcg::Pcg64;

use crate::actor::{Acting, ActorSettings};
use crate::config::Config;
use crate::dataset::ChunkWriter;
use crate::ddp::RankInfo;
use crate::error::{Error, Result};

/// What `tdmpc2 collect` writes.
#[derive(Debug, Clone)]
pub struct Collection {
    pub out: PathBuf,
    pub episodes: usize,
    pub episodes_per_file: usize,
}

/// What a dataset file cannot hold is refused before any episode is played (from the loaded
/// settings alone; `run` asks again of the resolved ones).
pub fn refuse_what_files_cannot_hold(config: &Config, args: &Collection) -> Result<()> {
    if args.episodes == 0 {
        return Err(Error::Config("--episodes must be at least 1".into()));
    }
    if config.episodic {
        return Err(Error::Config(format!(
            "collect: task={} ends episodes early (episodic=true), and dataset files (the \
             official format) hold no terminations: offline training would bootstrap through \
             every fall or crash. Collect a task that runs its episodes to the end",
            config.task
        )));
    }
    if config.obs_kind()? != envs::ObsKind::State {
        return Err(Error::Config(format!(
            "collect: obs={}: dataset files (the official format) hold states, and offline \
             training takes states only; collect with obs=state",
            config.obs
        )));
    }
    Ok(())
}

/// `--episodes` whose files would not fit in the space free under `--out` are refused before
/// any is played (a run of many hours would otherwise end with the disk full).
fn refuse_what_the_disk_cannot_hold(
    config: &Config,
    args: &Collection,
    action_dim: Option<usize>,
) -> Result<()> {
    // The tasks take turns: their mean episode length, for several.
    let length = match &config.episode_lengths {
        Some(lengths) if !lengths.is_empty() => {
            lengths.iter().sum::<usize>().div_ceil(lengths.len())
        }
        _ => config.resolved_episode_length()?,
    };
    let per_episode =
        ChunkWriter::episode_bytes(config.resolved_obs_dim()?, action_dim.unwrap_or(0), length);
    let needed = per_episode.saturating_mul(args.episodes as u64);
    let Ok((dir, free)) = crate::checkpoint::disk::free_bytes(&args.out) else {
        return Ok(());
    };
    if needed <= free {
        return Ok(());
    }
    // No space, or no place for files at all (/proc, a read-only mount): the second is why.
    let probe = dir.join(format!(".tdmpc2-probe-{}", std::process::id()));
    match std::fs::create_dir(&probe) {
        Ok(()) => {
            let _ = std::fs::remove_dir(&probe);
        }
        Err(e) => {
            return Err(Error::Config(format!(
                "--out {}: no folder can be made in {} ({e}); give --out where one can",
                args.out.display(),
                dir.display()
            )))
        }
    }
    let gb = |bytes: u64| bytes as f64 / 1e9;
    Err(Error::Config(format!(
        "--episodes {}: the dataset would take about {:.1} GB ({} bytes an episode), and {} \
         has {:.1} GB free; collect at most {} episodes there, or give --out on a larger disk",
        args.episodes,
        gb(needed),
        per_episode,
        dir.display(),
        gb(free),
        free / per_episode.max(1)
    )))
}

/// Plays `args.episodes` episodes, with the agent of `checkpoint=` or random actions.
/// Plays and writes the episodes; a failure leaves no `--out` folder that it made and left
/// empty.
pub fn run(config: &Config, args: &Collection) -> Result<()> {
    let made_out = !args.out.exists();
    let collected = collect(config, args);
    if collected.is_err() && made_out {
        // Only while nothing is in it: a file finished before the failure stays.
        let _ = std::fs::remove_dir(&args.out);
    }
    collected
}

/// The end of a collection asked to stop: the finished episodes written, the error saying so.
fn stopped(writer: ChunkWriter, finished: usize, args: &Collection) -> Error {
    match writer.finish() {
        Ok(files) if files.is_empty() => Error::Stopped(
            "collect stopped (Ctrl-C, SIGTERM or a hangup) before an episode ended: nothing \
             was written"
                .into(),
        ),
        Ok(files) => Error::Stopped(format!(
            "collect stopped (Ctrl-C, SIGTERM or a hangup) after {finished} of {} episodes, \
             written in {} file(s) in {}; those under way were dropped",
            args.episodes,
            files.len(),
            args.out.display()
        )),
        Err(e) => e,
    }
}

fn collect(config: &Config, args: &Collection) -> Result<()> {
    // Ctrl-C, SIGTERM or a hangup: the episodes finished are written, the ones under way
    // dropped (and an --out folder this left empty removed).
    crate::trainer::stop::install_handlers();
    refuse_what_files_cannot_hold(config, args)?;
    let rank = RankInfo::single(config);
    let checkpoint = config.checkpoint.as_deref();
    // No more environments than episodes: the agent plans for every environment, and one that
    // never starts has no observation.
    let num_envs = config.num_envs.min(args.episodes).max(1);
    let policy = super::playing_policy::build(config, &rank, num_envs, checkpoint)?;
    let planning = checkpoint.is_some();
    let action_dims = match &config.action_dims {
        Some(dims) => dims.clone(),
        None => vec![config.resolved_action_dim()?],
    };
    refuse_what_the_disk_cannot_hold(config, args, action_dims.iter().max().copied())?;
    let mut writer = ChunkWriter::new(
        &args.out,
        args.episodes_per_file,
        config.resolved_obs_dim()?,
        action_dims,
    )?;
    let alone = Config {
        world_size: 1,
        num_envs,
        ..config.clone()
    };
    let mut actor = ActorSettings::from_config(&alone, &rank)?
        .make_actor(policy)?
        .advise_on_early_ends(
            "dataset files (the official format) hold no terminations: collect a task that runs \
             its episodes to the end (the files finished before this episode are kept)",
        );
    let tasks = config.tasks()?;
    let mut random = Pcg64::seed_from_u64(config.seed);
    let episode_seed = |n: usize| crate::trainer::collected_episode_seed(config.seed, n as u64);
    let (mut started, mut finished) = (0, 0);
    for i in 0..actor.num_envs() {
        actor.reset(i, episode_seed(started))?;
        started += 1;
    }
    while finished < args.episodes {
        if crate::trainer::stop::requested_here() {
            return Err(stopped(writer, finished, args));
        }
        let acting = match planning {
            true => Acting::Policy,
            false => Acting::Random(&mut random),
        };
        actor.step(acting)?;
        for i in actor.done() {
            let Some((episode, stats)) = actor.take_episode(i) else {
                continue;
            };
            let task = &tasks[episode.task.unwrap_or(0) as usize];
            writer.add(episode)?;
            finished += 1;
            errln!(
                "episode {finished}/{}: {task}, return {:.1}",
                args.episodes,
                stats.reward
            );
            if started < args.episodes {
                actor.reset(i, episode_seed(started))?;
                started += 1;
            }
        }
    }
    let files = writer.finish()?;
    outln!(
        "wrote {finished} episodes in {} file{} to {}",
        files.len(),
        if files.len() == 1 { "" } else { "s" },
        args.out.display()
    );
    Ok(())
}
