//! One rank's training run as named steps (reference §7): the state they share and what each
//! step does. `trainer::run` calls them in order.
use std::time::Instant;

use tch::Device;

use super::countdown::Countdown;
use super::eval_point::{self, EvalSettings, Point};
use super::pipeline::Pipeline;
use super::report::{Clock, Report};
use super::schedule::Schedule;
use super::setup;
use super::stop::{self, StopRequest};
use super::streams::Streams;
use crate::actor::{Acting, Actor};
use crate::agent::UpdateInfo;
use crate::checkpoint::{self, CheckpointSettings, TrainState};
use crate::config::Config;
use crate::ddp::{ProcessGroup, RankInfo};
use crate::error::{Error, Result};
use crate::learner::{finite, Learner};

/// The loop's own settings, taken once from the resolved config (steps are this rank's).
#[derive(Debug, Clone, PartialEq, Eq)]
struct LoopSettings {
    world_size: u64,
    local_steps: u64,
    seed_steps: u64,
    /// Updates per vector step: num_envs / steps_per_update.
    updates_per_step: u64,
    /// Updates of the seed-data pretraining: seed_steps / steps_per_update, at least one.
    pretrain_updates: u64,
    /// Rank 0 films each evaluation's first episode with `save_video`.
    eval: EvalSettings,
}

impl LoopSettings {
    fn from_config(config: &Config, world_size: u64) -> Result<Self> {
        let seed_steps = config.resolved_seed_steps()?;
        let steps_per_update = config.steps_per_update as u64;
        Ok(Self {
            world_size,
            local_steps: config.steps / world_size,
            seed_steps,
            updates_per_step: config.num_envs as u64 / steps_per_update,
            pretrain_updates: (seed_steps / steps_per_update).max(1),
            eval: EvalSettings::from_config(config, config.save_video)?,
        })
    }
}

pub(super) struct Training<'g> {
    settings: LoopSettings,
    checkpoints: CheckpointSettings,
    group: &'g ProcessGroup,
    learner: Learner<'g>,
    actor: Actor,
    pipeline: Option<Pipeline>,
    streams: Streams,
    state: TrainState,
    schedule: Schedule,
    /// Rank 0's logging.
    report: Option<Report>,
    clock: Clock,
    /// Set once every rank's buffer can give a batch.
    ready_to_update: bool,
    /// The model optimiser's steps when this process started (a resume's are the run's).
    updates_at_start: u64,
    /// Whether the seed-data pretraining is made (or was, before the checkpoint resumed from).
    pretrained: bool,
    /// The last update's statistics (device tensors), logged with the next finished episode.
    last_info: Option<UpdateInfo>,
    /// With pipeline=true: the updates owed by the last step, made beside the next one.
    pending: u64,
    /// The global step of the last checkpoint this process wrote.
    saved_at: Option<u64>,
}

impl<'g> Training<'g> {
    /// Sets up or resumes: the learner (identical on every rank, broadcast from rank 0 all the
    /// same, or loaded from the checkpoint), the actor with its environments, the streams, and
    /// rank 0's report.
    pub(super) fn start(
        config: &Config,
        rank: &RankInfo,
        device: Device,
        group: &'g ProcessGroup,
    ) -> Result<Self> {
        let world_size = group.world_size() as u64;
        let setup::Start {
            mut learner,
            mut actor,
            checkpoints,
            state,
            resumed_from,
            restarted,
        } = setup::start(config, rank, device, group)?;
        let pipeline = Pipeline::new(config, rank)?;
        let mut streams = Streams::new(config.seed, rank.rank, pipeline.is_some());
        streams.reseed(state.step * world_size, &mut learner, &mut actor)?;
        let report = match group.rank() {
            0 => Some(Report::open(
                config,
                &checkpoints.run_dir,
                resumed_from,
                restarted,
            )?),
            _ => None,
        };
        let (local_steps, seed_steps) = (config.steps / world_size, config.resolved_seed_steps()?);
        if group.rank() == 0 && local_steps < seed_steps {
            errln!(
                "warning: steps={} gives each of the {world_size} rank(s) {local_steps} agent \
                 steps, fewer than seed_steps={seed_steps} (random actions before the first \
                 update): this run makes no update; raise steps (to world_size × more than \
                 seed_steps), or lower seed_steps",
                config.steps
            );
        }
        // The pretraining burst is a run's first updates: made once the learner has updated
        // and no stop left some of it owed.
        let pretrained =
            learner.updater().model_optim.step_count() > 0 && state.pretrain_updates == 0;
        if group.rank() == 0 && world_size > 1 && config.env_timeout >= config.dist_timeout {
            errln!(
                "warning: env_timeout={} is not below dist_timeout={}: a hung environment \
                 worker may show as the other ranks' collective timing out instead of being \
                 named; keep env_timeout below dist_timeout",
                config.env_timeout,
                config.dist_timeout
            );
        }
        let updates_at_start = learner.updater().model_optim.step_count();
        let mut training = Self {
            settings: LoopSettings::from_config(config, world_size)?,
            schedule: schedule(config, resumed_from, (state.eval_due, state.save_due)),
            clock: Clock::new(state.elapsed),
            checkpoints,
            group,
            learner,
            actor,
            pipeline,
            streams,
            state,
            report,
            ready_to_update: false,
            updates_at_start,
            pretrained,
            last_info: None,
            pending: 0,
            saved_at: None,
        };
        // The checkpoint resumed from, when it is this run's and of this very step, is the
        // state a stop before the first step would save: it keeps it (a second one would count
        // the environments' next episodes).
        let resumed_here = resumed_from == Some(training.global_step());
        if resumed_here && training.holds_a_checkpoint_of_this_step()? {
            training.saved_at = resumed_from;
        }
        if resumed_from.is_some() {
            training.warn_if_the_buffer_cannot_refill()?;
        }
        Ok(training)
    }

    /// A run resumed without its replay buffers refills them from new episodes: when its
    /// steps end before each environment's first whole episode, it can make no update (a
    /// collective: every rank asks).
    fn warn_if_the_buffer_cannot_refill(&self) -> Result<()> {
        if self.learner.ready()? {
            return Ok(());
        }
        let left = self.settings.local_steps.saturating_sub(self.state.step) / self.vector_step();
        let episode = self.actor.longest_episode() as u64;
        if self.group.rank() == 0 && left < episode {
            errln!(
                "warning: this resumed run's replay buffers hold no episode to learn from, and \
                 each environment has {left} steps left, fewer than an episode ({episode}): \
                 it makes no update unless an episode ends early; raise steps \
                 (save_buffer=true keeps the buffers in checkpoints)"
            );
        }
        Ok(())
    }

    pub(super) fn running(&self) -> bool {
        self.state.step <= self.settings.local_steps
    }

    fn global_step(&self) -> u64 {
        self.state.step * self.settings.world_size
    }

    /// Whether this step acts at random and learns nothing: up to seed_steps, unless the
    /// learner has already made its pretraining. A run resumed on more ranks than saved it
    /// starts at a lower local step, below seed_steps again, with a trained learner.
    fn seeding(&self) -> bool {
        !self.pretrained && self.state.step <= self.settings.seed_steps
    }

    /// Notes what fell due; whether this step is a checkpoint point: an evaluation or a
    /// checkpoint is due and every environment is at an episode boundary.
    pub(super) fn begin_step(&mut self) -> Result<bool> {
        if !self.seeding() {
            self.clock.steady_from(self.state.step);
        }
        self.schedule.advance(self.global_step());
        if !self.schedule.any_due() {
            return Ok(false);
        }
        setup::every_rank(self.group, self.actor.all_done())
    }

    /// Makes the updates the pipeline owes, so that evaluations and checkpoints see none in
    /// flight.
    pub(super) fn drain_pipeline(&mut self) -> Result<()> {
        if self.pending > 0 {
            self.last_info = Some(self.update(self.pending)?);
            self.actor.policy_mut().load_weights(self.learner.model())?;
            self.pending = 0;
        }
        Ok(())
    }

    pub(super) fn evaluate_if_due(&mut self) -> Result<()> {
        if !self.schedule.eval_due() {
            return Ok(());
        }
        let global = self.global_step();
        let point = Point {
            step: global,
            episodes: self.state.finished(),
            clock: &self.clock,
        };
        let stopped = eval_point::evaluate_and_log(
            &mut self.actor,
            &self.settings.eval,
            self.streams.evaluation_seed(global),
            self.group,
            self.report.as_mut(),
            point,
        )?;
        // The episodes that ended before the evaluation go into the stop's checkpoint (its
        // episode counts have them).
        if let Some(request) = stopped {
            self.store_finished_episodes()?;
            return Err(self.stop(&format!("during the evaluation at step {global}"), request));
        }
        self.schedule.evaluated();
        Ok(())
    }

    /// Puts every finished episode into the buffer and logs them (one record a step: see
    /// `Report::episodes`), after checking the last update's statistics (all-reduced: the same
    /// on every rank; see `finite`).
    pub(super) fn store_finished_episodes(&mut self) -> Result<()> {
        let mut ended = Vec::new();
        for i in self.actor.done() {
            let Some((episode, stats)) = self.actor.take_episode(i) else {
                continue;
            };
            self.learner.add_episode(&episode)?;
            self.state.episodes += 1;
            ended.push(stats);
        }
        if ended.is_empty() {
            return Ok(());
        }
        let global = self.global_step();
        let update = match &self.last_info {
            Some(info) => Some(UpdateInfo::fetch(info)?),
            None => None,
        };
        if let Some(stats) = &update {
            finite::check_stats(stats, global)?;
        }
        if let Some(report) = &mut self.report {
            report.episodes(
                global,
                &ended,
                self.state.finished(),
                &self.clock,
                update.as_ref(),
            )?;
        }
        Ok(())
    }

    /// Writes the checkpoint that is due, then re-derives every stream from this step.
    pub(super) fn checkpoint_if_due(&mut self) -> Result<()> {
        if !self.schedule.save_due() {
            return Ok(());
        }
        self.note_actor_state()?;
        checkpoint::save(&self.checkpoints, &self.state, &self.learner, self.group)?;
        let global = self.global_step();
        self.saved_at = Some(global);
        self.streams
            .reseed(global, &mut self.learner, &mut self.actor)?;
        self.schedule.saved();
        Ok(())
    }

    /// Starts the next episode of every finished environment, unless they wait for an
    /// evaluation or a checkpoint. Episode seeds count the episodes started (finished ones and
    /// those running), so every episode of every environment gets its own.
    pub(super) fn reset_finished_environments(&mut self) -> Result<()> {
        if self.schedule.any_due() {
            return Ok(());
        }
        let done = self.actor.done();
        let started = self.state.episodes + (self.actor.num_envs() - done.len()) as u64;
        let starts: Vec<(usize, u64)> = (started..)
            .zip(done)
            .map(|(episode, i)| (i, self.streams.episode_seed(episode)))
            .collect();
        self.actor.reset_many(&starts)
    }

    /// Ends the run with a checkpoint when any rank asked to stop (agreed by all).
    pub(super) fn stop_if_requested(&mut self) -> Result<()> {
        let Some(request) = stop::requested(self.group)? else {
            return Ok(());
        };
        if self.pending > 0 {
            self.update(self.pending)?;
        }
        Err(self.stop(&format!("at step {}", self.global_step()), request))
    }

    /// One vector step of the environments: random actions while seeding, then the policy's.
    /// Pipelined, the updates the last step owed run beside it.
    pub(super) fn act(&mut self) -> Result<()> {
        let explore = !self.seeding();
        let owed = std::mem::take(&mut self.pending);
        let Some(pipeline) = &self.pipeline else {
            let acting = match explore {
                true => Acting::Policy,
                false => Acting::Random(&mut self.streams.learner),
            };
            self.actor.step(acting)?;
            return Ok(());
        };
        let acting = match explore {
            true => Acting::Policy,
            false => Acting::Random(&mut self.streams.actor),
        };
        let (actor, learner, rng) = (
            &mut self.actor,
            &mut self.learner,
            &mut self.streams.learner,
        );
        let (_, info) = pipeline.overlap(
            || actor.step(acting),
            || match owed {
                0 => Ok(None),
                n => run_updates(learner, rng, n).map(Some),
            },
        )?;
        if let Some(info) = info {
            self.last_info = Some(info);
            self.actor.policy_mut().load_weights(self.learner.model())?;
        }
        Ok(())
    }

    /// The updates this step makes: the pretraining burst when seeding ends, then
    /// `updates_per_step` per step (owed to the next step when pipelined). A run resumed
    /// without its replay buffers may find them unable to give a batch when seeding ends: it
    /// pretrains once they can.
    pub(super) fn learn(&mut self) -> Result<()> {
        let learning =
            self.pretrained || self.state.step + self.vector_step() > self.settings.seed_steps;
        self.ready_to_update = self.ready_to_update || (learning && self.learner.ready()?);
        if !(learning && self.ready_to_update) {
            return Ok(());
        }
        if !self.pretrained {
            self.pretrain()?;
            self.pretrained = true;
            return Ok(());
        }
        if self.pipeline.is_some() {
            self.pending = self.settings.updates_per_step;
            return Ok(());
        }
        self.last_info = Some(self.update(self.settings.updates_per_step)?);
        self.actor.policy_mut().load_weights(self.learner.model())?;
        Ok(())
    }

    /// One update per steps_per_update seed steps, as afterwards. A run stopped during
    /// pretraining makes only the updates that were left.
    fn pretrain(&mut self) -> Result<()> {
        let updates = self.settings.pretrain_updates;
        let done = self.state.pretrain_updates;
        let left = updates.saturating_sub(done);
        let report = self.report.as_ref().filter(|_| updates > 1);
        if let Some(report) = report {
            report.note(&format!(
                "Pretraining agent on seed data ({left} updates)..."
            ));
        }
        let mut progress =
            report.map(|_| Countdown::start("Pretraining", "updates", left, Instant::now()));
        for update in done..updates {
            // The same update indices on every rank: the stop check is a collective.
            let request = match updates > 1 {
                true => stop::requested(self.group)?,
                false => None,
            };
            if let Some(request) = request {
                self.state.pretrain_updates = update;
                // Updates made since a checkpoint of this step: the stop's records them.
                if update > done {
                    self.saved_at = None;
                }
                let when = format!(
                    "during pretraining (after {update} of {updates} updates) at step {}",
                    self.global_step()
                );
                return Err(self.stop(&when, request));
            }
            self.last_info = Some(self.learner.update(&mut self.streams.learner)?);
            // No environment steps meanwhile: a worker that died is named now, not after.
            self.actor.check_workers()?;
            let line = progress
                .as_mut()
                .and_then(|p| p.line(update + 1 - done, Instant::now()));
            if let (Some(line), Some(report)) = (line, &self.report) {
                report.note(&line);
            }
        }
        self.state.pretrain_updates = 0;
        self.actor.policy_mut().load_weights(self.learner.model())?;
        Ok(())
    }

    /// Agent steps per vector step: every environment's, whether it stepped or waited at its
    /// episode end for an evaluation or a checkpoint.
    fn vector_step(&self) -> u64 {
        self.actor.num_envs() as u64
    }

    pub(super) fn advance(&mut self) {
        self.state.step += self.vector_step();
        if let Some(report) = &self.report {
            report.progress(self.global_step());
        }
    }

    /// Makes what is owed (updates, and an evaluation whose point fell mid-episode), writes
    /// the final checkpoint, then closes the report: a failed save leaves the trackers' runs
    /// failed, not finished.
    pub(super) fn finish(mut self) -> Result<()> {
        self.drain_pipeline()?;
        let last = self.state.step.min(self.settings.local_steps + 1);
        let steady_rate = self.clock.steady_rate(last, self.settings.world_size);
        self.state.step = self.settings.local_steps;
        // The last point falls mid-episode unless num_envs × the episode length divides the
        // steps of each rank; training is over, so its unfinished episodes give way to it.
        self.schedule.advance(self.global_step());
        self.evaluate_if_due()?;
        self.note_actor_state()?;
        // A checkpoint of this step written here (or resumed from) is the state at this step;
        // the final one is an iteration later (the loop acts and learns at the last step too,
        // as the official one does): under the same name it would make a resume from it
        // repeat that iteration.
        if self.saved_at != Some(self.global_step()) {
            checkpoint::save(&self.checkpoints, &self.state, &self.learner, self.group)?;
        }
        if let Some(report) = self.report.take() {
            report.close()?;
        }
        if self.group.rank() == 0 {
            if self.learner.updater().model_optim.step_count() == self.updates_at_start {
                errln!(
                    "warning: no update was made: the steps ended while seeding, or before the \
                     replay buffers held a whole episode"
                );
            }
            let dir = self.checkpoints.run_dir.display();
            match steady_rate {
                Some(rate) => {
                    errln!("Training finished: {dir} ({rate:.1} agent steps/s after seeding)")
                }
                None => errln!("Training finished: {dir}"),
            }
        }
        Ok(())
    }

    /// Whether the run directory holds a checkpoint of this step (the one resumed from, when it
    /// is this run's).
    fn holds_a_checkpoint_of_this_step(&self) -> Result<bool> {
        setup::holds_checkpoint(&self.checkpoints, self.global_step(), self.group)
    }

    /// What a checkpoint keeps of the run beside the learner: time, an evaluation still owed,
    /// episodes per environment and the planner's warm start.
    fn note_actor_state(&mut self) -> Result<()> {
        self.state.elapsed = self.clock.elapsed();
        self.state.eval_due = self.schedule.eval_due();
        self.state.env_episodes = self.actor.env_episodes();
        self.state.warm_start = self.actor.policy().warm_start()?;
        Ok(())
    }

    /// `count` synchronised updates; the statistics of the last.
    fn update(&mut self, count: u64) -> Result<UpdateInfo> {
        run_updates(&mut self.learner, &mut self.streams.learner, count)
    }

    /// Writes the checkpoint a stop promises; returns the error that ends the run (the save's
    /// own, if it failed).
    fn stop(&mut self, when: &str, request: StopRequest) -> Error {
        if let Err(e) = self.note_actor_state() {
            return e;
        }
        // Only a stop leaves a periodic checkpoint owed.
        self.state.save_due = self.schedule.save_due();
        let (state, learner, report) = (&self.state, &self.learner, self.report.take());
        let saved_here = self.saved_at == Some(self.global_step());
        let stop = setup::Stop {
            when,
            request,
            saved_here,
        };
        setup::stop_with_checkpoint(&self.checkpoints, state, learner, self.group, stop, report)
    }
}

fn run_updates(learner: &mut Learner, rng: &mut rand_pcg::Pcg64, count: u64) -> Result<UpdateInfo> {
    let mut info = learner.update(rng)?;
    for _ in 1..count {
        info = learner.update(rng)?;
    }
    Ok(info)
}

/// The evaluation and checkpoint points, from the checkpoint's global step when resumed.
/// Without evaluation episodes, nothing waits for evaluation points.
fn schedule(config: &Config, resumed_from: Option<u64>, due: (bool, bool)) -> Schedule {
    let eval_freq = (config.eval_episodes > 0).then_some(config.eval_freq);
    match resumed_from {
        None => Schedule::fresh(eval_freq, config.save_freq),
        Some(from) => Schedule::resumed(eval_freq, config.save_freq, from, due),
    }
}
