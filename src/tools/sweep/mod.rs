//! Sweeps, hydra's way: `tdmpc2 train --multirun seed=1,2 lr=3e-4,1e-3` runs every combination
//! of the comma-separated values as its own `tdmpc2 train` child process, each in its own run
//! directory, then writes a summary (sweep.csv, sweep.json) beside them.
mod grid;
mod spawn;
mod summary;
mod suspend;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::config::{Config, Source};
use crate::error::{Error, Result};
use grid::{expand, is_key, Job};
use spawn::{gpu_slots, refuse_jobs_beyond_their_gpus, run_all, visible_gpus, Spawner};
use summary::{refuse_another_sweeps_summary, summarize};

/// What became of a job.
#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    Ok,
    Failed(String),
    Stopped,
    NotStarted,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Status::Ok => write!(f, "ok"),
            Status::Failed(why) => write!(f, "failed ({why})"),
            Status::Stopped => write!(f, "stopped"),
            Status::NotStarted => write!(f, "not started"),
        }
    }
}

/// `tdmpc2 train --multirun ...`: the jobs of `sweep`'s overrides (comma-separated values
/// expanded), listed only with `list_only`, else run `jobs_at_once` at a time.
pub fn run(sweep: &Source, list_only: bool, jobs_at_once: Option<usize>) -> Result<()> {
    let cores = crate::device::cores();
    let parallel = jobs_at_once.unwrap_or(1);
    if parallel == 0 || parallel > cores {
        return Err(Error::Config(format!(
            "--jobs {parallel}: run between 1 and {cores} jobs at once (this machine has {cores} \
             CPU cores)"
        )));
    }
    sweep.refuse_derived_settings()?;
    let source = |overrides: Vec<String>| Source {
        overrides,
        ..sweep.clone()
    };
    let base = jobs_dir(sweep)?;
    if base.exists() && !base.is_dir() {
        return Err(Error::Config(format!(
            "run_dir={}: a file; a sweep puts each job's directory in it, so give a directory \
             (new or holding this sweep's jobs); no job was started",
            base.display()
        )));
    }
    let jobs = expand(&sweep.overrides, &base)?;
    let configs = validate(&jobs, &|o| source(o.to_vec()))?;
    if list_only {
        for job in &jobs {
            outln!("job {}: {}", job.index, job.overrides.join(" "));
        }
        return Ok(());
    }
    refuse_another_sweeps_summary(&base, &jobs)?;
    let visible = visible_gpus();
    let gpus = gpu_slots(parallel, visible.clone());
    let per_job = gpus.as_ref().map_or(visible.len(), |slots| slots[0].len());
    if per_job > 0 {
        refuse_jobs_beyond_their_gpus(&jobs, &configs, per_job, parallel)?;
    }
    let mut flags = Vec::new();
    if let Some(name) = &sweep.config_name {
        flags.extend(["--config-name".to_string(), name.clone()]);
    }
    if let Some(path) = &sweep.config_path {
        flags.extend(["--config-path".to_string(), path.display().to_string()]);
    }
    let spawner = Spawner {
        exe: crate::this_binary::path()?,
        flags,
        cores,
        parallel,
        gpus,
    };
    outln!(
        "sweep: {} jobs into {}, {parallel} at a time",
        jobs.len(),
        base.display()
    );
    spawn::catch_stop_signals();
    suspend::stop_jobs_with_the_sweep();
    let statuses = run_all(&spawner, &jobs, &configs);
    summarize(&jobs, &statuses, &base)
}

/// Where the job directories go: under run_dir when given, else runs/<task>/<exp_name> of the
/// first job, as its own run would be placed.
fn jobs_dir(sweep: &Source) -> Result<PathBuf> {
    let mut first: Vec<String> = expand(&sweep.overrides, Path::new("."))?[0]
        .overrides
        .iter()
        .filter(|o| !is_key(o, "run_dir"))
        .cloned()
        .collect();
    first.extend(
        sweep
            .overrides
            .iter()
            .filter(|o| is_key(o, "run_dir"))
            .cloned(),
    );
    let first = Source {
        overrides: first,
        ..sweep.clone()
    };
    // A first job that does not load is reported by `validate`, naming the job.
    Ok(match Config::load(&first) {
        Ok(Config {
            run_dir: Some(dir), ..
        }) => PathBuf::from(dir),
        // The folder of a run's seed folders (a task list named as a run names it).
        Ok(first) => first
            .run_dir()
            .parent()
            .map_or_else(|| PathBuf::from("runs"), Path::to_path_buf),
        Err(_) => PathBuf::from("runs"),
    })
}

/// Every job's configuration, loaded and resolved against its task before anything runs.
fn validate(jobs: &[Job], source: &dyn Fn(&[String]) -> Source) -> Result<Vec<Config>> {
    let mut specs: BTreeMap<String, Vec<envs::EnvSpec>> = BTreeMap::new();
    // The datasets of offline jobs, checked once for each model and horizon they train.
    let mut datasets_fit = std::collections::BTreeSet::new();
    let mut configs = Vec::new();
    for job in jobs {
        let checked = (|| {
            let mut config = Config::load(&source(&job.overrides))?;
            let key = format!("{} obs={}", config.task, config.obs);
            if !specs.contains_key(&key) {
                let made = crate::config::task_specs(&config, config.env_options(0)?)?;
                specs.insert(key.clone(), made);
            }
            config.resolve_with_specs(&specs[&key])?;
            if config.offline() {
                let model = format!(
                    "{:?} {:?} {:?} {:?} horizon={}",
                    config.data_dir,
                    config.tasks()?,
                    config.resolved_obs_dim()?,
                    config.resolved_action_dim()?,
                    config.horizon
                );
                if !datasets_fit.contains(&model) {
                    crate::trainer::open_dataset(&config)?;
                    datasets_fit.insert(model);
                }
            }
            config.check_pipeline_threads()?;
            config.check_backend()?;
            crate::trainer::run_dir::refuse_a_bad_start(&config)?;
            Ok::<_, Error>(config)
        })();
        match checked {
            Ok(config) => configs.push(config),
            Err(e) => {
                let message = e.to_string();
                let message = message.trim_start_matches("config error: ");
                let message = format!(
                    "--multirun job {} ({}): {message}; no job was started",
                    job.index,
                    job.describe()
                );
                return Err(if e.exit_code() == 2 {
                    Error::Config(message)
                } else {
                    Error::Other(message)
                });
            }
        }
    }
    Ok(configs)
}
