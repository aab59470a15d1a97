//! Rank 0's metrics, fanned out to sinks: the console, `metrics.jsonl`, `train.csv`/`eval.csv`,
//! TensorBoard event files, Weights & Biases and MLflow; and its evaluation videos, written to
//! the run directory and handed to the sinks that show them.
mod best_effort;
mod console;
mod continuation;
mod csv;
mod gif;
mod jsonl;
pub mod mlflow;
mod remote;
mod sink;
pub mod tensorboard;
mod tracker_runs;
mod video;
pub mod wandb;

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use envs::Frame;

use crate::config::Config;
use crate::error::{Error, Result};
use best_effort::BestEffort;
pub use console::{clock_time, console_line, Console};
pub use csv::Csv;
pub use jsonl::Jsonl;
pub use mlflow::{Mlflow, MlflowOptions};
use remote::Remote;
pub use sink::Sink;
pub use tensorboard::EventWriter;
pub use tracker_runs::{MlflowRun, TrackerRuns};
use video::VideoWriter;
pub use video::{video_path, write_video, Video, VIDEO_DIR, VIDEO_FPS, VIDEO_TAG};
pub use wandb::{Wandb, WandbOptions};

/// The files a run's logs continue in its directory (rows past a resumed step are dropped).
pub const LOG_FILES: [&str; 3] = ["metrics.jsonl", "train.csv", "eval.csv"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Train,
    Eval,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Train => "train",
            Phase::Eval => "eval",
        }
    }
}

/// One line of metrics at a global step.
#[derive(Debug, Clone)]
pub struct Record {
    pub phase: Phase,
    pub step: u64,
    pub values: BTreeMap<String, f64>,
}

impl Record {
    pub fn new(phase: Phase, step: u64) -> Self {
        Self {
            phase,
            step,
            values: BTreeMap::new(),
        }
    }

    pub fn with(mut self, key: &str, value: f64) -> Self {
        self.values.insert(key.to_owned(), value);
        self
    }
}

/// Where a run's metrics go. `metrics.jsonl` in `run_dir` is always written.
#[derive(Debug, Clone)]
pub struct LoggerOptions {
    pub run_dir: PathBuf,
    /// One line per record on stdout.
    pub console: bool,
    pub save_csv: bool,
    /// Event files in `run_dir/tb`.
    pub tensorboard: bool,
    pub wandb: Option<WandbOptions>,
    pub mlflow: Option<MlflowOptions>,
    /// The resolved config: W&B's run config, MLflow's params.
    pub config: serde_json::Value,
    /// The global step a resumed run continues from; None for a fresh run. Rows of later steps
    /// (of any step, for a fresh run) are dropped from the files first.
    pub continues_from: Option<u64>,
    /// A fresh start that restarts the job that wrote this directory (`max_restarts`, before
    /// its first checkpoint): it continues that attempt's tracker runs, from their start,
    /// instead of leaving a second W&B run of the same name in the group.
    pub restarted: bool,
}

impl LoggerOptions {
    /// Only `metrics.jsonl`.
    pub fn new(run_dir: impl Into<PathBuf>) -> Self {
        Self {
            run_dir: run_dir.into(),
            console: false,
            save_csv: false,
            tensorboard: false,
            wandb: None,
            mlflow: None,
            config: serde_json::Value::Null,
            continues_from: None,
            restarted: false,
        }
    }

    /// The sinks a config asks for (`save_csv`, `enable_tensorboard`, `enable_wandb`,
    /// `enable_mlflow`), with the console on. W&B runs are named as the official logger names
    /// them: `wandb_name`, else the seed, in the group `<task>-<exp_name>` (exp_name's other
    /// characters than letters and digits as `-`), tagged with both and `seed:<seed>`. MLflow
    /// runs are named `wandb_name`, else `<task>-<seed>`, in the experiment `exp_name`.
    pub fn from_config(cfg: &Config, run_dir: &Path) -> Result<Self> {
        let config =
            serde_json::to_value(cfg).map_err(|e| Error::Other(format!("config to JSON: {e}")))?;
        let run_name = cfg
            .wandb_name
            .clone()
            .unwrap_or_else(|| format!("{}-{}", cfg.task, cfg.seed));
        let exp = wandb_safe(&cfg.exp_name);
        // As the official logger: a project or entity named "none" turns W&B off.
        let named_none = [
            Some(cfg.wandb_project.as_str()),
            cfg.wandb_entity.as_deref(),
        ]
        .into_iter()
        .zip(["wandb_project", "wandb_entity"])
        .find_map(|(value, key)| (value == Some("none")).then_some(key));
        if let (true, Some(key)) = (cfg.enable_wandb, named_none) {
            errln!("note: W&B is off: {key}=none turns it off, as in the official logger");
        }
        Ok(Self {
            run_dir: run_dir.to_owned(),
            console: true,
            save_csv: cfg.save_csv,
            tensorboard: cfg.enable_tensorboard,
            wandb: (cfg.enable_wandb && named_none.is_none()).then(|| WandbOptions {
                project: cfg.wandb_project.clone(),
                entity: cfg.wandb_entity.clone(),
                name: Some(
                    cfg.wandb_name
                        .clone()
                        .unwrap_or_else(|| cfg.seed.to_string()),
                ),
                group: Some(format!("{}-{exp}", cfg.task)),
                tags: vec![cfg.task.clone(), exp.clone(), format!("seed:{}", cfg.seed)],
                silent: cfg.wandb_silent,
                mode: None,
            }),
            mlflow: cfg.enable_mlflow.then(|| MlflowOptions {
                experiment: cfg.exp_name.clone(),
                run_name,
                tracking_uri: None,
            }),
            config,
            continues_from: None,
            restarted: false,
        })
    }
}

/// Writes each record to every sink. Call [`Logger::close`] at the end of a run: a logger
/// dropped without it marks its W&B and MLflow runs as failed.
pub struct Logger {
    dir: PathBuf,
    sinks: Vec<Box<dyn Sink>>,
    videos: VideoWriter,
}

impl Logger {
    /// Creates the run directory and every sink `opts` asks for; W&B and MLflow start their
    /// runs here (a failure to start is an error; later failures of theirs are warnings, see
    /// [`remote`]).
    pub fn open(opts: &LoggerOptions) -> Result<Self> {
        let dir = &opts.run_dir;
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        // A resumed run continues the tracker runs its directory logged to.
        let continues = opts.continues_from.is_some() || opts.restarted;
        let mut before = match continues {
            true => TrackerRuns::load(dir),
            false => TrackerRuns::default(),
        };
        if !continues {
            // An earlier run's tracker runs are not this one's, also if this attempt fails
            // before it names its own and is restarted.
            before.save(dir)?;
        }
        if before.wandb.is_some() {
            // W&B takes no step twice: how far its run got is kept before the rows past the
            // checkpoint go (a resume that fails after this one, or comes before the run gets
            // as far again, still knows). Records it was owed it does not hold.
            let logged = before
                .wandb_holds_through
                .max(continuation::logged_through(dir));
            let holds = match before.owed_from.get(wandb::NAME) {
                Some(&from) => logged.min(from.checked_sub(1)),
                None => logged,
            };
            if holds != before.wandb_holds_through {
                before.wandb_holds_through = holds;
                before.save(dir)?;
            }
        }
        let csv_left_as_it_was = continuation::drop_rows_after(dir, opts.continues_from)?;
        tensorboard::drop_events_after(&dir.join("tb"), opts.continues_from);
        let mut sinks: Vec<Box<dyn Sink>> = Vec::new();
        if opts.console {
            sinks.push(Box::new(Console));
        }
        sinks.push(Box::new(Jsonl::create(&dir.join("metrics.jsonl"))?));
        // The CSVs and TensorBoard are best effort, from the start too: a warning, and the run
        // goes on without them (`metrics.jsonl` holds every record).
        match csv_left_as_it_was.first() {
            _ if !opts.save_csv => {}
            None => sinks.push(Box::new(BestEffort::new(Box::new(Csv::new(dir))))),
            // Appended to, its rows past the checkpoint would be there twice.
            Some(e) => errln!("warning: no CSV is written this run: {e}"),
        }
        if opts.tensorboard {
            let from = opts.continues_from.map_or(0, |step| step + 1);
            match EventWriter::create(&dir.join("tb"), from) {
                Ok(events) => sinks.push(Box::new(BestEffort::new(Box::new(events)))),
                Err(e) => errln!("warning: no TensorBoard events are written this run: {e}"),
            }
        }
        let mut runs = before.clone();
        if let Some(wandb) = &opts.wandb {
            let continues = before
                .wandb
                .as_deref()
                .map(|id| (id, before.wandb_holds_through));
            let wandb = Wandb::create(wandb, dir, &opts.config, continues)?;
            if before.wandb.as_deref() != Some(wandb.id()) {
                runs.wandb_holds_through = None;
            }
            runs.wandb = Some(wandb.id().to_owned());
            let remote = owing(Remote::new(Box::new(wandb)), &mut runs, dir, opts);
            // Named at once: a restart after a failure below continues this run.
            runs.save(dir)?;
            sinks.push(Box::new(remote));
        }
        if let Some(mlflow) = &opts.mlflow {
            let resumed = continues.then_some((opts.continues_from, &before));
            let mlflow = Mlflow::create(mlflow, dir, &opts.config, resumed)?;
            runs.mlflow = Some(mlflow.tracker_run());
            sinks.push(Box::new(owing(
                Remote::new(Box::new(mlflow)),
                &mut runs,
                dir,
                opts,
            )));
        }
        // A tracker that is not on now owes nothing this run can send.
        runs.owed_from
            .retain(|tracker, _| sinks.iter().any(|sink| sink.name() == tracker));
        runs.save(dir)?;
        Ok(Self {
            dir: dir.clone(),
            sinks,
            videos: VideoWriter::new(dir),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Adds a sink after those of the options.
    pub fn push(&mut self, sink: Box<dyn Sink>) {
        self.sinks.push(sink);
    }

    /// Writes `record` to every sink, also after one fails; the first failure is returned.
    /// Videos of earlier steps reach the sinks first (trackers keep steps in order).
    pub fn log(&mut self, record: &Record) -> Result<()> {
        let videos = self.deliver_videos(Some(record.step));
        let written = first_error(self.sinks.iter_mut().map(|s| s.write(record)));
        videos.and(written)
    }

    /// The run stops during its evaluation of `step`, which a resume redoes: trackers that take
    /// each step once leave that step's records to the resume, which sends them with the
    /// evaluation (they would refuse it after them).
    pub fn leave_to_the_resume(&mut self, step: u64) {
        for sink in &mut self.sinks {
            sink.leave_to_the_resume(step);
        }
    }

    /// Hands over the frames of the evaluation video of `step`: they are encoded and written
    /// to `eval_video/` in the background, and reach the sinks before any later record.
    pub fn video(&mut self, step: u64, frames: Vec<Frame>) -> Result<()> {
        self.videos.submit(step, frames)?;
        self.deliver_videos(Some(step)).map(drop)
    }

    /// Closes every sink (W&B `finish`, MLflow `end_run`), also after one fails, once the
    /// videos handed over are written and delivered.
    pub fn close(self) -> Result<()> {
        self.end(|sink| sink.close())
    }

    /// [`Self::close`] after a requested stop: MLflow marks the run killed, not finished.
    pub fn close_stopped(self) -> Result<()> {
        self.end(|sink| sink.close_stopped())
    }

    fn end(mut self, close: impl FnMut(&mut Box<dyn Sink>) -> Result<()>) -> Result<()> {
        let videos = self.deliver_videos(None);
        let closed = first_error(self.sinks.iter_mut().map(close));
        videos.and(closed)
    }

    /// Passes the finished videos to every sink, waiting for those of steps before `before`.
    /// A video that could not be made is a warning: the run goes on without it.
    fn deliver_videos(&mut self, before: Option<u64>) -> Result<()> {
        let mut results = Vec::new();
        for video in self.videos.collect(before) {
            match video {
                Ok(video) => results.extend(self.sinks.iter_mut().map(|s| s.video(&video))),
                Err(e) => {
                    errln!("warning: an evaluation video was not written ({e}); training goes on")
                }
            }
        }
        first_error(results.into_iter())
    }
}

/// `remote`, noting what it owes in `dir`'s `trackers.json` from now on, with the records it
/// missed before the checkpoint this run continues from (an outage that outlasted the attempt
/// before): those of `metrics.jsonl` from the step it owes from. Records past the checkpoint are
/// retraced, and a fresh start continues from none: then it owes nothing.
fn owing(mut remote: Remote, runs: &mut TrackerRuns, dir: &Path, opts: &LoggerOptions) -> Remote {
    let tracker = remote.name();
    let owed = runs.owed_from.get(tracker).copied();
    match (owed, opts.continues_from) {
        (Some(from), Some(checkpoint)) if from <= checkpoint => {
            remote.owe(continuation::records_from(dir, from));
        }
        _ => {
            runs.owed_from.remove(tracker);
        }
    }
    remote.noting_in(dir)
}

/// A name W&B takes in groups and tags: every run of characters other than ASCII letters and
/// digits as one `-`.
fn wandb_safe(name: &str) -> String {
    let mut safe = String::new();
    for c in name.chars() {
        match c.is_ascii_alphanumeric() {
            true => safe.push(c),
            false if !safe.ends_with('-') => safe.push('-'),
            false => {}
        }
    }
    safe
}

fn first_error(results: impl Iterator<Item = Result<()>>) -> Result<()> {
    let mut first = Ok(());
    for result in results {
        if first.is_ok() {
            first = result;
        }
    }
    first
}

fn append(path: &Path) -> Result<BufWriter<File>> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map(BufWriter::new)
        .map_err(|e| Error::io(format!("open {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonl_and_csv_hold_every_record() {
        let dir = tempfile::tempdir().unwrap();
        let mut logger = Logger::open(&LoggerOptions {
            save_csv: true,
            ..LoggerOptions::new(dir.path())
        })
        .unwrap();
        for step in [10u64, 20] {
            logger
                .log(&Record::new(Phase::Eval, step).with("episode_reward", step as f64 * 1.5))
                .unwrap();
        }
        logger
            .log(
                &Record::new(Phase::Train, 20)
                    .with("episode_reward", 3.0)
                    .with("episode", 2.0),
            )
            .unwrap();
        let jsonl = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
        let lines: Vec<serde_json::Value> = jsonl
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[1]["phase"], "eval");
        assert_eq!(lines[1]["episode_reward"], 30.0);
        let eval = std::fs::read_to_string(dir.path().join("eval.csv")).unwrap();
        assert_eq!(eval, "step,episode_reward\n10,15\n20,30\n");
        let train = std::fs::read_to_string(dir.path().join("train.csv")).unwrap();
        assert_eq!(
            train, "step,episode_reward,episode\n20,3,2\n",
            "step and the return first"
        );
    }

    /// TensorBoard is best effort from the start too: a `tb` that cannot be a folder is a
    /// warning, and `metrics.jsonl` takes every record.
    #[test]
    fn a_tensorboard_folder_that_cannot_be_made_fails_nothing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tb"), "a file where the folder goes").unwrap();
        let mut logger = Logger::open(&LoggerOptions {
            tensorboard: true,
            ..LoggerOptions::new(dir.path())
        })
        .unwrap();
        logger.log(&Record::new(Phase::Eval, 10)).unwrap();
        logger.close().unwrap();
        let jsonl = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
        assert_eq!(jsonl.lines().count(), 1);
    }

    /// Columns follow the records: a key that appears later widens the file (earlier rows get
    /// an empty cell), and a resumed run's logger appends under the file's own header.
    #[test]
    fn csv_columns_grow_with_the_records_and_survive_a_resume() {
        let dir = tempfile::tempdir().unwrap();
        let options = |continues_from| LoggerOptions {
            save_csv: true,
            continues_from,
            ..LoggerOptions::new(dir.path())
        };
        let train = |step: u64| Record::new(Phase::Train, step).with("episode_reward", 1.0);
        let mut logger = Logger::open(&options(None)).unwrap();
        logger.log(&train(10)).unwrap();
        logger.log(&train(20).with("pi_loss", 0.5)).unwrap();
        logger.log(&train(30).with("pi_loss", 0.25)).unwrap();
        logger.close().unwrap();
        let csv = || std::fs::read_to_string(dir.path().join("train.csv")).unwrap();
        assert_eq!(
            csv(),
            "step,episode_reward,pi_loss\n10,1,\n20,1,0.5\n30,1,0.25\n"
        );
        // Resumed from step 20: the row of step 30 goes, the columns stay.
        let mut logger = Logger::open(&options(Some(20))).unwrap();
        logger.log(&train(30).with("pi_loss", 0.125)).unwrap();
        logger.close().unwrap();
        assert_eq!(
            csv(),
            "step,episode_reward,pi_loss\n10,1,\n20,1,0.5\n30,1,0.125\n"
        );
    }

    struct Failing;

    impl Sink for Failing {
        fn name(&self) -> &'static str {
            "failing"
        }

        fn write(&mut self, _: &Record) -> Result<()> {
            Err(Error::Other("sink failed".into()))
        }
    }

    #[test]
    fn a_failing_sink_reports_and_the_others_still_write() {
        let dir = tempfile::tempdir().unwrap();
        let mut logger = Logger::open(&LoggerOptions::new(dir.path())).unwrap();
        logger.sinks.insert(0, Box::new(Failing));
        let err = logger
            .log(&Record::new(Phase::Train, 1).with("loss", 0.5))
            .unwrap_err();
        assert!(err.to_string().contains("sink failed"), "{err}");
        let jsonl = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
        assert_eq!(jsonl.lines().count(), 1);
        logger.close().unwrap();
    }

    #[test]
    fn options_follow_the_config() {
        let source = crate::config::Source {
            overrides: vec![
                "task=walker-walk".into(),
                "seed=3".into(),
                "exp_name=abl_1".into(),
                "enable_wandb=true".into(),
                "enable_mlflow=true".into(),
                "enable_tensorboard=false".into(),
                "wandb_silent=true".into(),
            ],
            ..Default::default()
        };
        let cfg = Config::load(&source).unwrap();
        let opts = LoggerOptions::from_config(&cfg, Path::new("runs/x")).unwrap();
        assert!(!opts.tensorboard && opts.save_csv && opts.console);
        let wandb = opts.wandb.unwrap();
        assert_eq!(wandb.name.as_deref(), Some("3"));
        assert_eq!(wandb.group.as_deref(), Some("walker-walk-abl-1"));
        assert_eq!(wandb.tags, ["walker-walk", "abl-1", "seed:3"]);
        assert!(wandb.silent);
        let mlflow = opts.mlflow.unwrap();
        assert_eq!(mlflow.experiment, "abl_1");
        assert_eq!(mlflow.run_name, "walker-walk-3");
        assert_eq!(opts.config["seed"], 3);
        assert_eq!(opts.config["task"], "walker-walk");
        for none in ["wandb_project=none", "wandb_entity=none"] {
            let mut source = source.clone();
            source.overrides.push(none.into());
            let cfg = Config::load(&source).unwrap();
            let opts = LoggerOptions::from_config(&cfg, Path::new("runs/x")).unwrap();
            assert!(opts.wandb.is_none(), "{none} turns W&B off, as officially");
            assert!(opts.mlflow.is_some());
        }
    }
}
