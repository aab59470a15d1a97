//! What rank 0 reports: the resolved config in the run directory, a record per finished
//! episode and per evaluation (console, files, trackers), and a progress bar on a terminal.
use std::io::IsTerminal;
use std::path::Path;
use std::time::Instant;

use envs::Frame;
use indicatif::{ProgressBar, ProgressStyle};

use super::evaluate::Evaluation;
use crate::actor::EpisodeStats;
use crate::agent::UpdateStats;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::logging::{Logger, LoggerOptions, Phase, Record};

/// The resolved config, in the run directory.
pub(super) const CONFIG_FILE: &str = crate::config::RUN_CONFIG_FILE;

pub(super) struct Report {
    logger: Logger,
    progress: Option<ProgressBar>,
    /// A multitask run's tasks, by task id (empty for one task).
    tasks: Vec<String>,
}

impl Report {
    /// Creates the run directory with the resolved config in it and opens the logger, whose
    /// files continue from global step `continues_from` (a resumed run's; None: a fresh run,
    /// `restarted` where it restarts the job that wrote the directory); so does the progress
    /// bar.
    pub(super) fn open(
        config: &Config,
        dir: &Path,
        continues_from: Option<u64>,
        restarted: bool,
    ) -> Result<Self> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        let path = dir.join(CONFIG_FILE);
        let yaml = config.to_yaml()?;
        // A resume may change settings; the file then says the latest, and the log what changed.
        if let Ok(before) = std::fs::read_to_string(&path) {
            let changed = crate::config::changed_settings(&before, &yaml);
            if !changed.is_empty() {
                errln!(
                    "Settings changed since {} was written (now replaced): {}",
                    path.display(),
                    changed.join("; ")
                );
            }
        }
        crate::whole_file::write(&path, yaml).map_err(|e| Error::io("write config.yaml", e))?;
        let logger = Logger::open(&LoggerOptions {
            continues_from,
            restarted,
            ..LoggerOptions::from_config(config, dir)?
        })?;
        let progress = std::io::stderr()
            .is_terminal()
            .then(|| progress_bar(continues_from.unwrap_or(0), config.steps));
        let tasks = if config.multitask() {
            config.tasks()?
        } else {
            Vec::new()
        };
        Ok(Self {
            logger,
            progress,
            tasks,
        })
    }

    pub(super) fn evaluation(
        &mut self,
        global_step: u64,
        evaluation: &Evaluation,
        episodes: u64,
        clock: &Clock,
    ) -> Result<()> {
        let summary = &evaluation.overall;
        let mut record = Record::new(Phase::Eval, global_step)
            .with("episode_reward", summary.mean)
            .with("episode_reward_std", summary.std)
            .with("episode_reward_min", summary.min)
            .with("episode_reward_max", summary.max)
            .with("episode_length", summary.mean_length)
            .with("episodes", summary.episodes as f64)
            .with("episode", episodes as f64)
            .with("elapsed_time", clock.elapsed())
            .with("steps_per_second", clock.rate(global_step));
        if let Some(s) = summary.success {
            record = record.with("episode_success", s);
        }
        for (key, value) in evaluation.values_by_task(&self.tasks) {
            record = record.with(&key, value);
        }
        self.log(&record)
    }

    /// The frames of an evaluation's first episode, written as a video in the background.
    pub(super) fn video(&mut self, global_step: u64, frames: Vec<Frame>) -> Result<()> {
        self.logger.video(global_step, frames)
    }

    /// The training episodes that ended at one step, as one record (trackers keep one point
    /// a step: W&B merges the records of a step, TensorBoard keeps the last), with the
    /// statistics of the last update when there was one. Several episodes (one per
    /// environment that ended) log their mean, with `episodes_ended`, `episode_reward_min` and
    /// `episode_reward_max`. A multitask run's episodes also log their returns under their
    /// tasks' names (`episode_reward+<task>`, the mean of that task's), as evaluations do, so
    /// each task's training curve can be drawn.
    pub(super) fn episodes(
        &mut self,
        global_step: u64,
        ended: &[EpisodeStats],
        episodes: u64,
        clock: &Clock,
        update: Option<&UpdateStats>,
    ) -> Result<()> {
        let Some(first) = ended.first() else {
            return Ok(());
        };
        let mean = |values: &[f64]| values.iter().sum::<f64>() / values.len() as f64;
        let rewards: Vec<f64> = ended.iter().map(|e| e.reward).collect();
        let lengths: Vec<f64> = ended.iter().map(|e| e.length as f64).collect();
        let terminated: Vec<f64> = ended.iter().map(|e| e.terminated as u8 as f64).collect();
        let mut record = Record::new(Phase::Train, global_step)
            .with("episode_reward", mean(&rewards))
            .with("episode_length", mean(&lengths))
            .with("episode_terminated", mean(&terminated))
            .with("episode", episodes as f64)
            .with("elapsed_time", clock.elapsed())
            .with("steps_per_second", clock.rate(global_step));
        if ended.len() > 1 {
            let (min, max) = rewards
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &r| {
                    (lo.min(r), hi.max(r))
                });
            record = record
                .with("episodes_ended", ended.len() as f64)
                .with("episode_reward_min", min)
                .with("episode_reward_max", max);
        }
        let successes: Vec<f64> = ended.iter().filter_map(|e| e.success).collect();
        if !successes.is_empty() {
            record = record.with("episode_success", mean(&successes));
        }
        if first.task.is_some() {
            let mut tasks: Vec<u32> = ended.iter().filter_map(|e| e.task).collect();
            tasks.sort_unstable();
            tasks.dedup();
            for task in tasks {
                let Some(name) = self.tasks.get(task as usize) else {
                    continue;
                };
                let of_task: Vec<&EpisodeStats> =
                    ended.iter().filter(|e| e.task == Some(task)).collect();
                let rewards: Vec<f64> = of_task.iter().map(|e| e.reward).collect();
                record = record.with(&format!("episode_reward+{name}"), mean(&rewards));
                let successes: Vec<f64> = of_task.iter().filter_map(|e| e.success).collect();
                if !successes.is_empty() {
                    record = record.with(&format!("episode_success+{name}"), mean(&successes));
                }
            }
        }
        for (k, v) in update.map(UpdateStats::named).into_iter().flatten() {
            record = record.with(k, v);
        }
        self.log(&record)
    }

    /// An offline run's update statistics after `updates` updates.
    pub(super) fn updates(
        &mut self,
        updates: u64,
        clock: &Clock,
        stats: &UpdateStats,
    ) -> Result<()> {
        let mut record = Record::new(Phase::Train, updates)
            .with("elapsed_time", clock.elapsed())
            .with("steps_per_second", clock.rate(updates));
        for (k, v) in stats.named() {
            record = record.with(k, v);
        }
        self.log(&record)
    }

    /// The loop acts at the last step too, as the official one does: the bar stops at its end.
    pub(super) fn progress(&self, global_step: u64) {
        if let Some(bar) = &self.progress {
            let end = bar.length().unwrap_or(u64::MAX);
            bar.set_position(global_step.min(end));
        }
    }

    /// A line on the console, under the progress bar when there is one.
    pub(super) fn note(&self, line: &str) {
        match &self.progress {
            Some(bar) => bar.suspend(|| errln!("{line}")),
            None => errln!("{line}"),
        }
    }

    /// A stop came during the evaluation of `step`, which the resume redoes (see
    /// [`Logger::leave_to_the_resume`]).
    pub(super) fn leave_to_the_resume(&mut self, step: u64) {
        self.logger.leave_to_the_resume(step);
    }

    pub(super) fn close(self) -> Result<()> {
        if let Some(bar) = &self.progress {
            bar.finish_and_clear();
        }
        self.logger.close()
    }

    /// Closes the logs after a requested stop wrote its checkpoint: the videos reach the
    /// trackers, and the runs there end as stopped, not failed. A failure here is a warning:
    /// the stop is what the run reports.
    pub(super) fn close_stopped(self) {
        if let Some(bar) = &self.progress {
            bar.finish_and_clear();
        }
        if let Err(e) = self.logger.close_stopped() {
            errln!("warning: closing the logs after the stop: {e}");
        }
    }

    fn log(&mut self, record: &Record) -> Result<()> {
        match &self.progress {
            Some(bar) => bar.suspend(|| self.logger.log(record)),
            None => self.logger.log(record),
        }
    }
}

/// A bar from `start` of `total` steps, whose rate counts only the steps made from there (a
/// resumed run's first position is not progress).
fn progress_bar(start: u64, total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total).with_position(start);
    let style = ProgressStyle::with_template("{bar:40} {pos}/{len} steps  {per_sec}  ETA {eta}")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    // The rate estimator takes in the start position (a tick records it), then forgets the
    // time before it.
    bar.tick();
    bar.reset_eta();
    bar
}

/// Training time across resumes, and the throughput once learning reached its steady state.
pub(super) struct Clock {
    start: Instant,
    /// Seconds of training before this process started.
    before: f64,
    /// Where learning's steady state began (time, local step).
    steady_from: Option<(Instant, u64)>,
}

impl Clock {
    pub(super) fn new(before: f64) -> Self {
        Self {
            start: Instant::now(),
            before,
            steady_from: None,
        }
    }

    pub(super) fn elapsed(&self) -> f64 {
        self.before + self.start.elapsed().as_secs_f64()
    }

    /// Global agent steps per second of training so far.
    fn rate(&self, global_step: u64) -> f64 {
        global_step as f64 / self.elapsed().max(1e-9)
    }

    /// Marks the first step of the steady state (later calls change nothing).
    pub(super) fn steady_from(&mut self, step: u64) {
        self.steady_from.get_or_insert((Instant::now(), step));
    }

    /// Global agent steps per second since the steady state began, up to local step `step`;
    /// none over a single step (a finished run resumed redoes its last one), which times
    /// nothing of the run.
    pub(super) fn steady_rate(&self, step: u64, world_size: u64) -> Option<f64> {
        let (since, from) = self.steady_from?;
        let steps = step.saturating_sub(from);
        (steps > 1)
            .then(|| steps as f64 * world_size as f64 / since.elapsed().as_secs_f64().max(1e-9))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_steady_rate_takes_more_than_one_step() {
        let mut clock = Clock::new(0.0);
        assert_eq!(clock.steady_rate(5, 1), None, "not steady yet");
        clock.steady_from(400);
        assert_eq!(clock.steady_rate(401, 1), None);
        std::thread::sleep(std::time::Duration::from_millis(10));
        let rate = clock.steady_rate(402, 2).unwrap();
        assert!(rate > 0.0 && rate <= 400.0, "{rate}");
    }
}
