//! The command line: `tdmpc2 train|import|bench`, hydra style (`key=value`, `--config-name`).
use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::arg_values::count;
use crate::checkpoint::WeightsGiven;
use crate::config::{Config, Source};
use crate::ddp::launcher::{self, LaunchPlan};
use crate::ddp::{LaunchedBy, RankInfo};
use crate::error::{Error, Result};
use crate::trainer;

#[derive(Debug, Parser)]
#[command(name = "tdmpc2", version, about = "Distributed TD-MPC2 trainer")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Train an agent. Settings are hydra-style overrides: `tdmpc2 train task=walker-run steps=1e5`.
    Train(RunArgs),
    /// Evaluate a checkpoint: `tdmpc2 eval checkpoint=PATH eval_episodes=N` (a run's checkpoint
    /// plays with its run's task and sizes; `task=` plays it on another).
    Eval(EvalArgs),
    /// Write a dataset in the official format (for `train data_dir=`) from episodes of an agent
    /// (`checkpoint=PATH`) or of random actions: `tdmpc2 collect --out DIR --episodes N task=...`.
    Collect(CollectArgs),
    /// Convert an official TD-MPC2 checkpoint (`torch.save`) to our safetensors.
    Import {
        /// The official `.pt` file.
        input: PathBuf,
        /// The `.safetensors` file to write.
        output: PathBuf,
    },
    /// Write a checkpoint of ours as an official one (`torch.save`), for the official code's
    /// `TDMPC2.load`: `tdmpc2 export RUN_DIR final.pt`.
    Export {
        /// What `checkpoint=` takes: a checkpoint directory, a run directory (its latest
        /// checkpoint) or a `.safetensors` file.
        input: PathBuf,
        /// The `.pt` file to write.
        output: PathBuf,
    },
    /// Environment and agent benchmarks, printed as JSON lines.
    Bench(Box<crate::bench::command::BenchArgs>),
    /// One rank of `bench --cases ddp` (started by the bench itself).
    #[command(hide = true)]
    BenchWorker(crate::bench::ddp::WorkerArgs),
    /// One worker process of a vector env (`tdmpc2 env-worker`, started by its parent, which
    /// talks to it over stdin/stdout and shared memory).
    #[command(name = crate::actor::ENV_WORKER, hide = true)]
    EnvWorker,
    /// Draw learning curves of run directories: `tdmpc2 plot RUN_DIR... --out curves.png`.
    Plot(crate::tools::plot::PlotArgs),
    /// Check that this machine can train: venv, torch, GPUs, dm_control, ports, cores, disk.
    Doctor(DoctorArgs),
}

/// Where settings come from: a config file laid over the defaults, then `key=value` overrides.
#[derive(Debug, Args)]
pub struct SettingsArgs {
    /// A config file in `--config-path` (default: the repository's configs/), laid over the defaults.
    #[arg(long = "config-name", value_name = "NAME")]
    pub config_name: Option<String>,
    /// The directory holding `--config-name`.
    #[arg(long = "config-path", value_name = "DIR")]
    pub config_path: Option<PathBuf>,
    /// `key=value` overrides (values are YAML scalars or flow lists, nested keys as a.b=value).
    #[arg(value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
}

/// How a training run's configuration is assembled.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub settings: SettingsArgs,
    /// `--cfg job` prints the resolved configuration as YAML and exits.
    #[arg(long = "cfg", value_name = "job", value_parser = ["job"])]
    pub cfg: Option<String>,
    /// One job per combination of comma-separated values (`seed=1,2 lr=3e-4,1e-3`).
    #[arg(long, short = 'm')]
    pub multirun: bool,
    /// With --multirun: how many jobs run at once (default 1, at most the CPU count).
    #[arg(long, value_name = "K", requires = "multirun")]
    pub jobs: Option<usize>,
}

#[derive(Debug, Args)]
pub struct EvalArgs {
    /// `checkpoint=PATH` and other settings; a checkpoint a run saved is played with the task
    /// and sizes of its run's config.yaml, unless given here.
    #[command(flatten)]
    pub settings: SettingsArgs,
    /// `--cfg job` prints the resolved configuration as YAML and exits.
    #[arg(long = "cfg", value_name = "job", value_parser = ["job"])]
    pub cfg: Option<String>,
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Also form a real process group of N ranks on this machine and all-reduce one tensor
    /// (NCCL when there are N GPUs, else gloo).
    #[arg(long, value_name = "N")]
    pub world_size: Option<usize>,
    /// One rank of the --world-size check (started by the doctor itself).
    #[arg(long, hide = true)]
    pub rank_check: bool,
    /// Render frames in this process (started by the doctor itself with MUJOCO_GL=egl).
    #[arg(long, hide = true)]
    pub render_check: bool,
    /// The run to check for: its config file and `key=value` settings (master_port,
    /// num_threads, run_dir, a data_dir whose files to read back, a resume checkpoint, ...).
    #[command(flatten)]
    pub settings: SettingsArgs,
}

#[derive(Debug, Args)]
pub struct CollectArgs {
    /// The directory the chunk files (`chunk_<i>.pt`) are written to.
    #[arg(long)]
    pub out: PathBuf,
    /// Episodes to play, the tasks of a multitask run taken in turn.
    #[arg(long, value_parser = count)]
    pub episodes: usize,
    /// Episodes per file (a file's episodes share one length; a training run's ranks share
    /// the files out).
    #[arg(long, default_value_t = 100, value_parser = count)]
    pub episodes_per_file: usize,
    /// `checkpoint=PATH` plays that agent's plans (with their exploration noise, as the
    /// official datasets hold training episodes), with the task and sizes of its run unless
    /// given here; without it, uniform random actions.
    #[command(flatten)]
    pub settings: SettingsArgs,
}

impl SettingsArgs {
    pub fn source(&self) -> Source {
        Source {
            config_name: self.config_name.clone(),
            config_path: self.config_path.clone(),
            overrides: self.overrides.clone(),
            beneath: Vec::new(),
        }
    }
}

/// hydra's other spellings of our flags, as ours: the two-letter shorts `-cn NAME`, `-cp DIR`
/// and `-cd DIR` (also `-cn=NAME`; clap takes one-letter shorts only), `-c job` for `--cfg job`,
/// and `--config-dir`, which adds a directory where hydra looks for `--config-name` (here the
/// one directory it reads). `--resolve` is dropped: `--cfg job` prints the resolved config.
/// Arguments are taken as the OS gives them: a path that is not UTF-8 reaches clap, which names
/// it, where `std::env::args` panics.
pub fn hydra_short_flags(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    const SPELLINGS: [(&str, &str); 4] = [
        ("-cn", "--config-name"),
        ("-cp", "--config-path"),
        ("-cd", "--config-path"),
        ("--config-dir", "--config-path"),
    ];
    let args: Vec<OsString> = args.into_iter().collect();
    // `-c` only as hydra's `-c job`: another command's `-c` stays clap's to name.
    let cfg_job = |i: usize| {
        args.get(i + 1).map(|a| a.as_bytes()) == Some(b"job".as_slice())
            && args[i].as_bytes() == b"-c"
    };
    let cfg_at: Vec<bool> = (0..args.len()).map(cfg_job).collect();
    args.into_iter()
        .zip(cfg_at)
        .filter(|(arg, _)| arg.as_bytes() != b"--resolve")
        .map(|(arg, cfg)| {
            if cfg || arg.as_bytes() == b"-c=job" {
                return OsString::from(if cfg { "--cfg" } else { "--cfg=job" });
            }
            for (short, long) in SPELLINGS {
                let bytes = arg.as_bytes();
                if bytes == short.as_bytes() {
                    return long.into();
                }
                if let Some(value) = bytes
                    .strip_prefix(short.as_bytes())
                    .and_then(|v| v.strip_prefix(b"="))
                {
                    return OsString::from_vec([long.as_bytes(), b"=", value].concat());
                }
            }
            arg
        })
        .collect()
}

/// The settings of `eval` or `collect` (`verb`): the command's own, over those that built the
/// model of its checkpoint where a run saved it.
fn playing_source(args: &SettingsArgs, verb: &str) -> Result<Source> {
    let source = args.source();
    source.refuse_derived_settings()?;
    crate::tools::run_settings::taken_beneath(source, verb)
}

/// The configuration of a training run, validated and resolved against the task's environment:
/// under torchrun or SLURM as the launcher placed
/// this process (its ranks on this node, and the world size where the config leaves it at 1),
/// before the checks that depend on them (memory per node, steps per rank), which would
/// otherwise pass for one rank.
fn resolved_training_config(args: &RunArgs) -> Result<Config> {
    let config = resolved(args.settings.source(), true)?;
    config.check_training_fits()?;
    config.refuse_untaken_terminations()?;
    Ok(config)
}

/// Loads, validates and resolves the configuration against the task's environment.
fn resolved(source: Source, as_placed: bool) -> Result<Config> {
    source.refuse_derived_settings()?;
    let mut config = Config::load(&source)?;
    // A task of a family with a venv of its own is made in a worker to read its spec: one that
    // hangs there is named after env_timeout, as a rank's would be.
    let env_timeout = std::time::Duration::from_secs(config.env_timeout);
    envs::set_default_worker(crate::actor::env_worker_command(Some(env_timeout))?);
    // The first environment made loads dm_control's renderer for the whole process: rank 0
    // films with save_video. A launcher's variables that do not parse are reported when the
    // rank starts; commands that run no rank need none.
    let launched = RankInfo::from_env(&config, &env_text).ok();
    match &launched {
        Some((rank, by)) if as_placed && *by != LaunchedBy::Nobody => {
            check_world_size(&config, rank, *by)?;
            config.ranks_on_this_node = Some(rank.local_world_size);
            if config.world_size == 1 && rank.world_size > 1 {
                config.world_size = rank.world_size;
                config.validate()?;
            }
        }
        Some(_) | None if !as_placed => config.ranks_on_this_node = Some(1),
        _ => {}
    }
    let rank = launched.map_or(0, |(rank, _)| rank.rank);
    config.resolve_by_making_tasks(config.env_options(rank)?)?;
    Ok(config)
}

/// An environment variable as text, one that is not UTF-8 included (lossily, so that a check
/// refuses it rather than take it for unset).
fn env_text(key: &str) -> Option<String> {
    std::env::var_os(key).map(|value| value.to_string_lossy().into_owned())
}

pub fn run(cli: Cli) -> Result<()> {
    // An environment whose simulator lives in a task family's own venv steps in a worker
    // process of this binary (`envs::make("mw-reach", …)` anywhere in this process); one
    // that hangs (a simulator's import, EGL's start) is killed after the default env_timeout.
    let env_timeout = crate::config::Config::default_env_timeout()?;
    envs::set_default_worker(crate::actor::env_worker_command(Some(env_timeout))?);
    match cli.command {
        Command::Train(args) if args.multirun => {
            crate::tools::sweep::run(&args.settings.source(), args.cfg.is_some(), args.jobs)
        }
        Command::Train(args) => train_command(&args),
        Command::Eval(args) => {
            let config = resolved(playing_source(&args.settings, "eval")?, false)?;
            if args.cfg.is_some() {
                crate::terminal::write_out(format_args!("{}", config.to_yaml()?));
                return Ok(());
            }
            note_training_settings("eval", &config);
            evaluate(config)
        }
        Command::Collect(args) => {
            let collection = crate::tools::collect::Collection {
                out: args.out.clone(),
                episodes: args.episodes,
                episodes_per_file: args.episodes_per_file,
            };
            let source = playing_source(&args.settings, "collect")?;
            // Before the tasks are made: obs=rgb would start a renderer first.
            let loaded = Config::load(&source)?;
            crate::tools::collect::refuse_what_files_cannot_hold(&loaded, &collection)?;
            note_training_settings("collect", &loaded);
            crate::tools::collect::run(&resolved(source, false)?, &collection)
        }
        Command::Import { input, output } => {
            if !input.is_file() {
                let what = if input.exists() {
                    "not a file"
                } else {
                    "no such file"
                };
                return Err(Error::Config(format!(
                    "import {}: {what}; give an official checkpoint (the .pt file the official \
                     trainer saves)",
                    input.display()
                )));
            }
            let keys = crate::agent::import_official(&input, &output)?;
            outln!("wrote {} tensors to {}", keys.len(), output.display());
            Ok(())
        }
        Command::Export { input, output } => {
            let model = crate::checkpoint::model_file(&input, WeightsGiven::ToExport)?;
            crate::checkpoint::say_which_weights(&input, &model);
            crate::checkpoint::verify_model(&model)?;
            let written = crate::agent::export_official(&model, &output)?;
            outln!(
                "wrote {written} tensors of {} to {}",
                model.display(),
                output.display()
            );
            Ok(())
        }
        Command::Bench(args) => crate::bench::command::run(&args),
        Command::BenchWorker(args) => crate::bench::ddp::worker(&args),
        Command::EnvWorker => Ok(envs::serve_worker()?),
        Command::Plot(args) => crate::tools::plot::run(&args),
        Command::Doctor(args) if args.rank_check => crate::tools::doctor::rank_check(),
        Command::Doctor(args) if args.render_check => crate::tools::doctor::render_check(),
        Command::Doctor(args) => {
            crate::tools::doctor::run(&args.settings.source(), args.world_size)
        }
    }
}

/// `tdmpc2 train` without `--multirun`: the resolved config printed (`--cfg job`), or trained.
fn train_command(args: &RunArgs) -> Result<()> {
    // Before the config resolves (it starts Python, and that takes a while): a stop asked
    // meanwhile ends the run before it starts, not through Python's own handler.
    if args.cfg.is_none() {
        trainer::stop::install_handlers();
    }
    let config = resolved_training_config(args)?;
    if args.cfg.is_some() {
        crate::terminal::write_out(format_args!("{}", config.to_yaml()?));
        return Ok(());
    }
    train(config)
}

/// A plain process with world_size > 1 becomes the launcher of this node's ranks; a process
/// started by a launcher (ours, torchrun or SLURM) is one rank.
fn train(mut config: Config) -> Result<()> {
    let (rank, launched_by) = RankInfo::from_env(&config, &env_text)?;
    config.check_pipeline_threads()?;
    config.check_backend()?;
    let launches = launched_by == LaunchedBy::Nobody && config.world_size > 1;
    if launches {
        // Python's signal module, first imported while SIGINT is at its default, would take it
        // over (and turn a Ctrl-C into a KeyboardInterrupt in the launcher's next Python
        // call): imported now, while ours holds it, it leaves SIGINT alone.
        let _ = embedded_python::with_python(|py| py.import("signal").map(drop));
        // The launcher watches the signals its own way from here; one that came before is
        // seen below.
        trainer::stop::restore_default_handlers();
    }
    // A rank under a launcher stops with the others, in the loop; a process of its own stops
    // here, having written nothing.
    if launched_by == LaunchedBy::Nobody {
        trainer::stop::refuse_to_start_when_asked()?;
    }
    if launches {
        if config.node_rank == 0 {
            trainer::lock::check_free(&config.run_dir())?;
            trainer::run_dir::refuse_a_bad_start(&config)?;
        }
        // Once here rather than by every rank (each then saying it, and the launcher again).
        if let Some(dir) = &config.data_dir {
            crate::dataset::files(std::path::Path::new(dir))?;
        }
        crate::ddp::lifeline::stop_when_parent_dies()?;
        let program = crate::this_binary::path()?;
        let plan = LaunchPlan {
            world_size: config.world_size,
            nnodes: config.nnodes,
            node_rank: config.node_rank,
            master_addr: config.master_addr.clone(),
            master_port: config.master_port,
            cpu_affinity: config.cpu_affinity,
            max_restarts: config.max_restarts,
            peer_timeout: std::time::Duration::from_secs(config.peer_timeout),
            dist_timeout: std::time::Duration::from_secs(config.dist_timeout),
            stop_grace: std::time::Duration::from_secs(config.stop_grace),
            job: config.job_settings()?,
            program,
            args: std::env::args_os().skip(1).collect(),
        };
        return launcher::launch(&plan);
    }
    if launched_by == LaunchedBy::Nobody && config.max_restarts > 0 {
        errln!(
            "warning: max_restarts={} is the built-in launcher's, which a run of world_size=1 \
             does without: this process is not restarted when it fails (resume=auto continues \
             it from its last checkpoint)",
            config.max_restarts
        );
    }
    // The launcher's world size was checked and taken as the config resolved.
    resume_after_restart(&mut config, std::env::var(launcher::RESTART_COUNT_ENV).ok())?;
    trainer::run(config, rank)
}

/// Under torchrun or SLURM the launcher decides the world size; a different one in the config
/// means the user expected something else (e.g. one SLURM task meant to start 8 ranks).
fn check_world_size(config: &Config, rank: &RankInfo, launched_by: LaunchedBy) -> Result<()> {
    let by = match launched_by {
        LaunchedBy::Nobody => return Ok(()),
        LaunchedBy::Torchrun => "torchrun (or the built-in launcher)",
        LaunchedBy::Slurm => "SLURM",
    };
    if config.world_size == 1 || config.world_size == rank.world_size {
        return Ok(());
    }
    Err(Error::Config(format!(
        "world_size={} disagrees with {by}, which started this process as rank {} of {}. \
         Either let the launcher decide (one process per rank: set world_size={}, which \
         also overrides a config file's, e.g. config_ddp's 8), or run one process that starts world_size ranks itself with \
         launcher=builtin (e.g. inside `sbatch --ntasks=1`)",
        config.world_size, rank.rank, rank.world_size, rank.world_size
    )))
}

/// Says which training settings given to `eval` or `collect` they leave unused (one process,
/// the weights of `checkpoint=`), so that none is taken for applied.
fn note_training_settings(verb: &str, config: &Config) {
    let mut unused = Vec::new();
    if let Some(resume) = &config.resume {
        unused.push(format!("resume={resume} (the weights are checkpoint='s)"));
    }
    if let Some(data_dir) = &config.data_dir {
        unused.push(format!("data_dir={data_dir}"));
    }
    if config.world_size > 1 || config.nnodes > 1 {
        let (ranks, nodes) = (config.world_size, config.nnodes);
        unused.push(format!(
            "world_size={ranks} nnodes={nodes} (one process plays)"
        ));
    }
    if config.pipeline {
        unused.push("pipeline=true".into());
    }
    if !unused.is_empty() {
        errln!("note: {verb} leaves unused: {}", unused.join(", "));
    }
}

/// A restarted job (by our launcher's `max_restarts` or torchrun's `--max-restarts`) goes on
/// from the run directory's last checkpoint, when there is one of its own, without being told.
fn resume_after_restart(config: &mut Config, restart_count: Option<String>) -> Result<()> {
    let Some(count) = restart_count else {
        return Ok(());
    };
    let count: u64 = count.trim().parse().map_err(|_| {
        Error::Config(format!(
            "{}={count} is not a restart count",
            launcher::RESTART_COUNT_ENV
        ))
    })?;
    let dir = config.run_dir();
    let checkpoints = crate::checkpoint::checkpoints_dir(&dir);
    let restarts = trainer::run_dir::restarts_its_job(&dir, count);
    if restarts && crate::checkpoint::store::latest(&checkpoints).is_some() {
        config.resume = Some("auto".into());
    }
    Ok(())
}

/// Plays `eval_episodes` episodes in eval mode with the weights of `checkpoint` (a checkpoint
/// directory or any file in one, a run directory, or a `.safetensors` file, ours or imported),
/// checked against the hash its checkpoint recorded.
fn evaluate(config: Config) -> Result<()> {
    let Some(path) = config.checkpoint.as_deref() else {
        return Err(Error::Config(
            "eval needs checkpoint=PATH (a checkpoint directory or a file in one, a run directory, or a .safetensors file)".into(),
        ));
    };
    if config.eval_episodes == 0 {
        return Err(Error::Config(
            "eval_episodes=0: eval plays at least one episode".into(),
        ));
    }
    let rank = RankInfo::single(&config);
    let policy = crate::tools::playing_policy::build(&config, &rank, 1, Some(path))?;
    // Once the weights are found: a refused checkpoint leaves no folder behind.
    let (video_path, _made_folder) = match config.save_video {
        true => {
            let (path, made) = fresh_video_path(&config)?;
            (Some(path), made)
        }
        false => (None, None),
    };
    // One environment in this process (of every task, in a multitask run).
    let alone = Config {
        world_size: 1,
        num_envs: 1,
        ..config.clone()
    };
    let mut actor = crate::actor::ActorSettings::from_config(&alone, &rank)?.make_actor(policy)?;
    let group = crate::ddp::ProcessGroup::alone(rank);
    let mut video = Vec::new();
    let tasks = config.tasks()?;
    // An episode planned at full size can take minutes on a CPU: a word before the first.
    errln!(
        "Playing {} episode(s) of {} with {path}...",
        config.eval_episodes,
        config.task
    );
    let outcome = trainer::evaluate::evaluate(
        &mut actor,
        config.eval_episodes,
        config.multitask().then_some(tasks.len()),
        config.seed,
        &group,
        config.save_video.then_some(&mut video),
        Some(&|line: &str| errln!("{line}")),
    )?;
    let trainer::evaluate::Outcome::Done(evaluation) = outcome else {
        return Err(Error::Stopped("evaluation stopped by a signal".into()));
    };
    if let Some(path) = video_path.filter(|_| !video.is_empty()) {
        // The returns are the result: a video that cannot be written is said, not the end.
        match crate::logging::write_video(&path, &video) {
            Ok(_) => outln!("video of the first episode: {}", path.display()),
            Err(e) => errln!("warning: the video was not written: {e}"),
        }
    }
    crate::tools::eval_report::print(&config.task, path, &tasks, &evaluation);
    Ok(())
}

/// Where `eval` films its first episode: `eval_video/<task>-<seed>.gif`, or with `-2`, `-3`,
/// ... when an earlier evaluation's video has that name. A folder that cannot be made there is
/// refused before any episode is played.
/// The video's name before its number: the task as a file name (`gym_Pendulum-v1`, a list's
/// names joined by `+`) and the seed.
fn video_stem(task: &str, seed: u64) -> String {
    let task = task.trim_start_matches('[').trim_end_matches(']');
    let task = task.replace(',', "+").replace([':', '/'], "_");
    format!("{task}-{seed}")
}

/// A folder made for a file that may never come: removed as the guard drops (or a signal ends
/// the process) while it is empty.
struct MadeFolder {
    dir: std::path::PathBuf,
    _watched: crate::partial_files::Pending,
}

impl Drop for MadeFolder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The video's path, and the folder made for it, if it was made here.
fn fresh_video_path(config: &Config) -> Result<(std::path::PathBuf, Option<MadeFolder>)> {
    let dir = std::path::Path::new(crate::logging::VIDEO_DIR);
    let made = (!dir.exists()).then(|| MadeFolder {
        dir: dir.to_owned(),
        _watched: crate::partial_files::watch(dir),
    });
    std::fs::create_dir_all(dir).map_err(|e| {
        Error::Config(format!(
            "save_video=true: eval writes its video into ./{}/, which cannot be made here \
             ({e}); run eval from another folder, or without save_video",
            dir.display()
        ))
    })?;
    let stem = video_stem(&config.task, config.seed);
    let name = |n: usize| match n {
        1 => format!("{stem}.gif"),
        n => format!("{stem}-{n}.gif"),
    };
    let free = (1..).map(|n| dir.join(name(n)));
    let path = free
        .take(100_000)
        .find(|path| std::fs::symlink_metadata(path).is_err())
        .unwrap_or_else(|| dir.join(name(0)));
    Ok((path, made))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_video_is_named_for_its_task_as_a_file_name() {
        assert_eq!(video_stem("walker-run", 1), "walker-run-1");
        assert_eq!(video_stem("gym:Pendulum-v1", 7), "gym_Pendulum-v1-7");
        assert_eq!(
            video_stem("[mw-reach,myo-reach]", 2),
            "mw-reach+myo-reach-2"
        );
    }

    #[test]
    fn hydra_short_flags_read_as_the_long_ones() {
        let args = [
            "tdmpc2",
            "train",
            "-cn",
            "config_ddp",
            "-cp=configs",
            "-cd",
            "mine",
            "--config-dir=mine",
            "-c",
            "job",
            "--resolve",
            "seed=1",
            "exp_name=-c",
            "-c",
            "x",
        ];
        assert_eq!(
            hydra_short_flags(args.map(OsString::from)),
            [
                "tdmpc2",
                "train",
                "--config-name",
                "config_ddp",
                "--config-path=configs",
                "--config-path",
                "mine",
                "--config-path=mine",
                "--cfg",
                "job",
                "seed=1",
                "exp_name=-c",
                "-c",
                "x",
            ]
        );
    }

    #[test]
    fn a_restarted_job_resumes_only_when_there_is_a_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::load(&Source {
            overrides: vec![format!("run_dir={}", dir.path().display())],
            ..Source::default()
        })
        .unwrap();
        resume_after_restart(&mut config, Some("1".into())).unwrap();
        assert_eq!(config.resume, None, "nothing to resume from yet");
        let e = resume_after_restart(&mut config, Some("x".into()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("TORCHELASTIC_RESTART_COUNT=x"), "{e}");
    }
}
