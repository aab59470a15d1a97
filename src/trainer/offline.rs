//! Offline training on a dataset (the official offline trainer): `steps` updates on batches
//! sampled from every dataset file (uniformly over all episodes, from each rank's own stream),
//! evaluated every `eval_freq` updates (each task on its own), checkpointed every `save_freq`
//! updates and at the end. Steps count updates, which
//! every rank makes together, so the step is the same number on every rank.
use std::sync::Arc;

use tch::Device;

use super::eval_point::{self, EvalSettings, Point};
use super::report::{Clock, Report};
use super::schedule::Schedule;
use super::setup;
use super::stop;
use super::streams::Streams;
use crate::actor::Actor;
use crate::agent::UpdateInfo;
use crate::checkpoint::{self, CheckpointSettings, TrainState};
use crate::config::Config;
use crate::dataset::{self, Dataset, Expected, ExpectedTask, Prefetcher};
use crate::ddp::{ProcessGroup, RankInfo};
use crate::error::{Error, Result};
use crate::learner::{finite, Learner};

/// Update statistics are logged this often (and at every evaluation), as the official trainer.
const LOG_EVERY: u64 = 10_000;

pub(super) fn train(
    config: &Config,
    rank: &RankInfo,
    device: Device,
    group: &ProcessGroup,
) -> Result<()> {
    let mut run = Offline::start(config, rank, device, group)?;
    while run.state.step < run.settings.steps {
        run.schedule.advance(run.state.step);
        run.evaluate_if_due()?;
        run.checkpoint_if_due()?;
        run.stop_if_requested()?;
        run.update()?;
    }
    run.finish()
}

/// The run's own settings, taken once from the resolved config.
struct Settings {
    steps: u64,
    sync_freq: usize,
    eval: EvalSettings,
}

/// One rank's offline run as named steps: the state they share and what each does.
struct Offline<'g> {
    settings: Settings,
    device: Device,
    group: &'g ProcessGroup,
    dataset: Arc<Dataset>,
    /// This rank's batches, drawn from the learner's stream ahead of the updates.
    batches: Prefetcher,
    learner: Learner<'g>,
    actor: Actor,
    checkpoints: CheckpointSettings,
    streams: Streams,
    state: TrainState,
    schedule: Schedule,
    /// Rank 0's logging.
    report: Option<Report>,
    clock: Clock,
    /// The last update's statistics (device tensors), logged with the next evaluation.
    last: Option<UpdateInfo>,
    /// The update of the last checkpoint this process wrote.
    saved_at: Option<u64>,
}

impl<'g> Offline<'g> {
    /// Sets up or resumes: the dataset, the learner (identical on every
    /// rank), the actor whose environments evaluate, the streams and rank 0's report.
    fn start(
        config: &Config,
        rank: &RankInfo,
        device: Device,
        group: &'g ProcessGroup,
    ) -> Result<Self> {
        let dataset = Arc::new(open_dataset(config)?);
        let setup::Start {
            mut learner,
            mut actor,
            checkpoints,
            mut state,
            resumed_from,
            restarted,
        } = setup::start(config, rank, device, group)?;
        // Resumed from this run's own checkpoint of this update: a stop before the next update
        // keeps it (saved again, the same state would replace it for nothing).
        let saved_at = match resumed_from {
            Some(from) if setup::holds_checkpoint(&checkpoints, from, group)? => Some(state.step),
            _ => None,
        };
        let mut streams = Streams::new(config.seed, rank.rank, false);
        streams.reseed(state.step, &mut learner, &mut actor)?;
        // Checkpoints from before it was recorded: as if `sync_freq` never changed.
        let first_batch = *state
            .batches_read
            .get_or_insert(state.step * config.sync_freq as u64);
        let batches = Prefetcher::start(
            dataset.clone(),
            config.batch_size,
            first_batch,
            streams.batches(),
        );
        let report = match group.rank() {
            0 => {
                let report = Report::open(config, &checkpoints.run_dir, resumed_from, restarted)?;
                describe(config, &dataset, group.world_size());
                Some(report)
            }
            _ => None,
        };
        Ok(Self {
            settings: Settings {
                steps: config.steps,
                sync_freq: config.sync_freq,
                eval: EvalSettings::from_config(config, false)?,
            },
            device,
            group,
            dataset,
            batches,
            learner,
            actor,
            checkpoints,
            streams,
            schedule: match resumed_from {
                None => Schedule::fresh(Some(config.eval_freq), config.save_freq),
                Some(from) => Schedule::resumed(
                    Some(config.eval_freq),
                    config.save_freq,
                    from,
                    (state.eval_due, state.save_due),
                ),
            },
            clock: Clock::new(state.elapsed),
            state,
            report,
            last: None,
            saved_at,
        })
    }

    /// Logs the last update's statistics, then evaluates each task with the current model.
    fn evaluate_if_due(&mut self) -> Result<()> {
        if !self.schedule.eval_due() {
            return Ok(());
        }
        let i = self.state.step;
        let stats = match &self.last {
            Some(info) => Some(info.fetch()?),
            None => None,
        };
        if let Some(stats) = &stats {
            finite::check_stats(stats, i)?;
        }
        // Before the evaluation, so that a stop during it keeps the record. Multiples of
        // LOG_EVERY are logged already.
        if let (Some(report), Some(stats)) = (&mut self.report, &stats) {
            if !i.is_multiple_of(LOG_EVERY) {
                report.updates(i, &self.clock, stats)?;
            }
        }
        if self.settings.eval.episodes > 0 {
            self.actor.policy_mut().load_weights(self.learner.model())?;
            self.streams.reseed_evaluation_noise(i);
            let point = Point {
                step: i,
                episodes: 0,
                clock: &self.clock,
            };
            let stopped = eval_point::evaluate_and_log(
                &mut self.actor,
                &self.settings.eval,
                self.streams.evaluation_seed(i),
                self.group,
                self.report.as_mut(),
                point,
            )?;
            if let Some(request) = stopped {
                return Err(self.stop(&format!("during the evaluation at update {i}"), request));
            }
            // The official evaluation acts with the model it trains, and each task's lookup
            // renormalises that task's row; every task is evaluated (on some rank).
            if let Some(table) = self.learner.model_mut().task.as_mut() {
                table.renormalise_every_row()?;
            }
        }
        self.schedule.evaluated();
        Ok(())
    }

    /// Writes the checkpoint that is due (the streams need no re-deriving: each update's are).
    fn checkpoint_if_due(&mut self) -> Result<()> {
        if !self.schedule.save_due() {
            return Ok(());
        }
        self.note_state();
        checkpoint::save(&self.checkpoints, &self.state, &self.learner, self.group)?;
        self.saved_at = Some(self.state.step);
        self.schedule.saved();
        Ok(())
    }

    /// Ends the run with a checkpoint when any rank asked to stop (agreed by all).
    fn stop_if_requested(&mut self) -> Result<()> {
        match stop::requested(self.group)? {
            Some(request) => Err(self.stop(&format!("at update {}", self.state.step), request)),
            None => Ok(()),
        }
    }

    /// One synchronised update on `sync_freq` batches of this rank's stream.
    fn update(&mut self) -> Result<()> {
        let batches = (0..self.settings.sync_freq)
            .map(|_| Ok(self.batches.next()?.to_device(self.device)))
            .collect::<Result<Vec<_>>>()?;
        // Every update draws from streams of its own: a run resumed at any update (a stop's
        // checkpoint too) draws what the uninterrupted run draws.
        self.streams
            .reseed_learner(self.state.step, &mut self.learner);
        let info = self.learner.update_on(&batches)?;
        self.state.step += 1;
        *self.state.batches_read.get_or_insert(0) += batches.len() as u64;
        let done = self.state.step;
        if done.is_multiple_of(LOG_EVERY) {
            let stats = info.fetch()?;
            finite::check_stats(&stats, done)?;
            if let Some(report) = &mut self.report {
                report.updates(done, &self.clock, &stats)?;
            }
        }
        self.last = Some(info);
        if let Some(report) = &self.report {
            report.progress(done);
        }
        Ok(())
    }

    /// Writes the final checkpoint, then closes the report: a failed save leaves the
    /// trackers' runs failed, not finished.
    fn finish(mut self) -> Result<()> {
        self.note_state();
        checkpoint::save(&self.checkpoints, &self.state, &self.learner, self.group)?;
        if let Some(report) = self.report.take() {
            report.close()?;
        }
        if self.group.rank() == 0 {
            let peak = crate::memory::peak_bytes().unwrap_or(f64::NAN);
            errln!(
                "Training finished: {} ({:.1} updates/s; rank 0 sampled from {:.1} MB of dataset \
                 files with a peak memory of {:.1} MB)",
                self.checkpoints.run_dir.display(),
                self.settings.steps as f64 / self.clock.elapsed().max(1e-9),
                self.dataset.bytes() as f64 / 1e6,
                peak / 1e6
            );
        }
        Ok(())
    }

    /// What a checkpoint keeps of the run beside the learner: time, and an evaluation owed.
    fn note_state(&mut self) {
        self.state.elapsed = self.clock.elapsed();
        self.state.eval_due = self.schedule.eval_due();
    }

    /// Writes the checkpoint a stop promises; returns the error that ends the run (the save's
    /// own, if it failed).
    fn stop(&mut self, when: &str, request: stop::StopRequest) -> Error {
        self.note_state();
        // Only a stop leaves a periodic checkpoint owed.
        self.state.save_due = self.schedule.save_due();
        let (state, learner, report) = (&self.state, &self.learner, self.report.take());
        let saved_here = self.saved_at == Some(self.state.step);
        let stop = setup::Stop {
            when,
            request,
            saved_here,
        };
        setup::stop_with_checkpoint(&self.checkpoints, state, learner, self.group, stop, report)
    }
}

/// Every file of `data_dir`, indexed and checked against the run's model (each rank samples
/// from all of them); `config` resolved against its tasks.
pub fn open_dataset(config: &Config) -> Result<Dataset> {
    let dir = config.data_dir.as_deref().unwrap_or_default();
    let files = dataset::files(std::path::Path::new(dir))?;
    let tasks = config
        .tasks()?
        .into_iter()
        .zip(config.resolved_obs_shapes()?)
        .map(|(name, obs_dim)| ExpectedTask { name, obs_dim })
        .collect();
    let expected = Expected {
        obs_dim: config.resolved_obs_dim()?,
        action_dim: config.resolved_action_dim()?,
        tasks,
        multitask: config.multitask(),
        slice: config.horizon + 1,
    };
    Dataset::open(&files, &expected).map_err(|e| match e {
        Error::Config(message) => Error::Config(format!("data_dir={dir}: {message}")),
        other => other,
    })
}

/// Reads every file of `data_dir` back against its CRC-32s (`verify_data`; once per file: see
/// `dataset::integrity`), before the ranks meet: reading takes as long as it takes, and no
/// collective waits on it. Rank r starts at its share of the files, so that the ranks of a
/// machine read different files at once and find each other's stamps; rank 0 says what it does.
pub(super) fn verify_dataset(config: &Config, rank: usize, world_size: usize) -> Result<()> {
    if !config.verify_data {
        return Ok(());
    }
    let dir = config.data_dir.as_deref().unwrap_or_default();
    let files = dataset::files(std::path::Path::new(dir))?;
    let started = std::time::Instant::now();
    let (mut read, mut stamped) = (0u64, 0usize);
    for k in 0..files.len() {
        super::stop::refuse_to_start_when_asked()?;
        let file = &files[(rank * files.len() / world_size.max(1) + k) % files.len()];
        if rank == 0 {
            let size = std::fs::metadata(file).map_or(0, |m| m.len());
            errln!(
                "verifying dataset file {} of {}: {} ({:.2} GB)",
                k + 1,
                files.len(),
                file.display(),
                size as f64 / 1e9
            );
        }
        match dataset::integrity::verify_once(file, &super::stop::requested_here)? {
            dataset::integrity::Checked::Read(bytes) => read += bytes,
            dataset::integrity::Checked::Stamped => stamped += 1,
            dataset::integrity::Checked::Stopped => super::stop::refuse_to_start_when_asked()?,
        }
    }
    if rank == 0 {
        errln!(
            "dataset verified in {:.1} s: {:.2} GB read against the files' CRC-32s, {stamped} of \
             {} files verified before (verify_data=false skips this)",
            started.elapsed().as_secs_f64(),
            read as f64 / 1e9,
            files.len()
        );
    }
    Ok(())
}

/// Rank 0's account of the data.
fn describe(config: &Config, dataset: &Dataset, world_size: usize) {
    let tasks = config.tasks().unwrap_or_default();
    let per_task = dataset.episodes_per_task(tasks.len());
    let held: Vec<String> = tasks
        .iter()
        .zip(&per_task)
        .filter(|(_, &n)| n > 0)
        .map(|(task, n)| format!("{task} {n}"))
        .collect();
    errln!(
        "Offline training for {} updates on {}: each of the {} ranks samples from all {} \
         episodes ({:.1} MB of files), read from disk as it samples: {}",
        config.steps,
        config.data_dir.as_deref().unwrap_or_default(),
        world_size,
        dataset.episodes(),
        dataset.bytes() as f64 / 1e6,
        held.join(", ")
    );
    // The official mt30 and mt80 files hold their tasks grouped: a download cut short, or a
    // copy of some files, leaves whole tasks out, and their evaluations score an untrained
    // task embedding.
    let missing: Vec<&str> = tasks
        .iter()
        .zip(&per_task)
        .filter(|(_, &n)| n == 0)
        .map(|(task, _)| task.as_str())
        .collect();
    if !missing.is_empty() {
        errln!(
            "warning: the dataset holds no episode of {} of the {} tasks ({}): their task \
             embeddings do not train, and their evaluations score untrained ones; check that \
             every file of the dataset is in data_dir",
            missing.len(),
            tasks.len(),
            missing.join(", ")
        );
    }
    // As the official trainer warns of its own datasets.
    let official = match config.task.as_str() {
        "mt30" => Some(OFFICIAL_MT30_EPISODES),
        "mt80" => Some(OFFICIAL_MT80_EPISODES),
        _ => None,
    };
    if let Some(expected) = official.filter(|&n| n != dataset.episodes()) {
        errln!(
            "warning: the official {} dataset holds {expected} episodes, this one {}: a \
             download cut short, or files of another dataset?",
            config.task,
            dataset.episodes()
        );
    }
}

/// Episodes of the official datasets (their trainer's buffer size over the episode length).
const OFFICIAL_MT30_EPISODES: usize = 345_690_000 / 501;
const OFFICIAL_MT80_EPISODES: usize = 550_450_000 / 101;
