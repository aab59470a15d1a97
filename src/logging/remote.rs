//! A tracker reached over the network (W&B, MLflow) must not end a run that may have days
//! left: its failures are warnings, and the records it missed are sent again, in order, once
//! it answers. While it does not, it rests between attempts, [`RETRY_EVERY`] after the first
//! failure and twice as long after each next one, up to [`LONGEST_REST`]: each attempt may cost
//! its client's timeouts (a minute or more) on rank 0, while the other ranks wait for it in the
//! next collective. `metrics.jsonl` holds every record whatever the trackers do.
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{Record, Sink, TrackerRuns, Video};
use crate::error::{Error, Result};

/// The records kept for a tracker that does not answer; older ones are dropped past this.
const BACKLOG: usize = 10_000;

/// How long a tracker that stopped answering rests before it is asked again.
const RETRY_EVERY: Duration = Duration::from_secs(60);
/// The longest rest, after failures one after another.
const LONGEST_REST: Duration = Duration::from_secs(16 * 60);

pub struct Remote {
    inner: Box<dyn Sink>,
    /// Records not yet delivered, oldest first.
    backlog: VecDeque<Record>,
    /// Records dropped because the backlog was full, in the current outage.
    dropped: u64,
    /// While failing: when it may be asked again.
    next_attempt: Option<Instant>,
    /// Failed attempts since it last answered: each doubles the rest (warnings once per
    /// outage, at the first).
    failures_in_a_row: u32,
    retry_every: Duration,
    /// The run directory whose `trackers.json` notes from which step records wait, so that a
    /// resume sends them (an outage that outlasted the attempt); None: not noted.
    ledger: Option<PathBuf>,
    /// For a tracker that takes each step once: the records of the latest step, sent when a
    /// later step comes or the run ends (a stop may leave them to the resume).
    latest: Vec<Record>,
    /// The step whose evaluation the resume redoes (see [`Sink::leave_to_the_resume`]).
    left_to_the_resume: Option<u64>,
}

impl Remote {
    pub fn new(inner: Box<dyn Sink>) -> Self {
        Self {
            inner,
            backlog: VecDeque::new(),
            dropped: 0,
            next_attempt: None,
            failures_in_a_row: 0,
            retry_every: RETRY_EVERY,
            ledger: None,
            latest: Vec::new(),
            left_to_the_resume: None,
        }
    }

    /// Notes in `run_dir`'s `trackers.json` from which step records wait while any do.
    pub fn noting_in(mut self, run_dir: &Path) -> Self {
        self.ledger = Some(run_dir.to_owned());
        self
    }

    /// Records the tracker missed before the run resumed (from `metrics.jsonl`): sent before
    /// the next one.
    pub fn owe(&mut self, records: Vec<Record>) {
        self.backlog.extend(records);
    }

    /// Sends `record`: a healthy tracker that owes nothing takes it as it is; only one that
    /// fails (or owes records from before a resume) keeps copies.
    fn send(&mut self, record: &Record) {
        if !self.failing() && self.backlog.is_empty() {
            if let Err(e) = self.inner.write(record) {
                self.keep(record);
                self.failed(&e);
            }
            return;
        }
        self.keep(record);
        if !self.resting() {
            self.deliver();
        }
    }

    /// Sends the records held back of the latest step.
    fn send_latest(&mut self) {
        for record in std::mem::take(&mut self.latest) {
            self.send(&record);
        }
    }

    /// Keeps `record` to send later; the first of the backlog is noted.
    fn keep(&mut self, record: &Record) {
        if self.backlog.is_empty() {
            self.note(|dir, tracker| TrackerRuns::note_owed(dir, tracker, record.step));
        }
        if self.backlog.len() == BACKLOG {
            self.backlog.pop_front();
            self.dropped += 1;
        }
        self.backlog.push_back(record.clone());
    }

    fn note(&self, what: impl FnOnce(&Path, &str) -> Result<()>) {
        let Some(dir) = &self.ledger else {
            return;
        };
        if let Err(e) = what(dir, self.inner.name()) {
            errln!(
                "warning: {e}: a resume may not know which records {} missed",
                self.inner.name()
            );
        }
    }

    /// Whether its last attempt failed.
    fn failing(&self) -> bool {
        self.failures_in_a_row > 0
    }

    /// Whether the tracker failed lately: it is not asked again until its time comes.
    fn resting(&self) -> bool {
        self.next_attempt.is_some_and(|at| Instant::now() < at)
    }

    /// Sends the backlog in order; stops at the first failure.
    fn deliver(&mut self) {
        let owed = self.backlog.len();
        while let Some(record) = self.backlog.front() {
            if let Err(e) = self.inner.write(record) {
                // What it took is not owed: a resume would send it twice.
                let step = record.step;
                if self.backlog.len() < owed {
                    self.note(|dir, tracker| TrackerRuns::note_owed(dir, tracker, step));
                }
                self.failed(&e);
                return;
            }
            self.backlog.pop_front();
        }
        if owed > 0 {
            self.note(TrackerRuns::note_paid);
        }
        if !self.failing() && owed > 0 {
            errln!(
                "{} took the {owed} records it missed before the run resumed",
                self.inner.name()
            );
        }
        if self.failing() {
            let lost = match self.dropped {
                0 => String::new(),
                n => format!(" ({n} of the oldest were dropped: more than {BACKLOG} waited)"),
            };
            errln!(
                "{} takes records again: the missed ones were sent{lost}",
                self.inner.name()
            );
            self.dropped = 0;
        }
        self.next_attempt = None;
        self.failures_in_a_row = 0;
    }

    /// Warns once per outage.
    fn failed(&mut self, e: &Error) {
        let rest = self.retry_every * 2u32.pow(self.failures_in_a_row.min(10));
        self.next_attempt = Some(Instant::now() + rest.min(LONGEST_REST));
        self.failures_in_a_row += 1;
        if self.failures_in_a_row == 1 {
            errln!(
                "warning: {} does not take records ({e}); training goes on, it is asked again \
                 after {} s (then less often), and the records are sent once it answers \
                 (metrics.jsonl has them all)",
                self.inner.name(),
                self.retry_every.as_secs()
            );
        }
    }

    fn warn_unclosed(&self, closed: Result<()>) {
        if let Err(e) = closed {
            errln!(
                "warning: {} did not end its run ({e}); it may show the run as still running \
                 or crashed (metrics.jsonl has every record)",
                self.inner.name()
            );
        }
    }

    fn warn_unsent(&self, when: &str) {
        if !self.backlog.is_empty() {
            let resumed = match self.ledger {
                Some(_) => " (a resume of this run sends them first)",
                None => "",
            };
            errln!(
                "warning: {} missed {} records {when}; metrics.jsonl has them{resumed}",
                self.inner.name(),
                self.backlog.len() as u64 + self.dropped
            );
        }
    }
}

impl Sink for Remote {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn write(&mut self, record: &Record) -> Result<()> {
        if !self.inner.takes_each_step_once() {
            self.send(record);
            return Ok(());
        }
        if self.latest.first().is_some_and(|r| r.step != record.step) {
            self.send_latest();
        }
        self.latest.push(record.clone());
        Ok(())
    }

    fn leave_to_the_resume(&mut self, step: u64) {
        self.left_to_the_resume = Some(step);
    }

    /// Sent after the records still owed: a tracker that orders by step (W&B) drops records
    /// of steps before one it has. While it fails, the video stays in the run directory.
    fn video(&mut self, video: &Video) -> Result<()> {
        self.send_latest();
        if !self.backlog.is_empty() && !self.resting() {
            self.deliver();
        }
        let sent = match self.failing() || !self.backlog.is_empty() {
            true => Err(Error::Other(
                "it does not answer, and records of earlier steps wait to be sent".into(),
            )),
            false => {
                let sent = self.inner.video(video);
                if let Err(e) = &sent {
                    self.failed(e);
                }
                sent
            }
        };
        if let Err(e) = sent {
            errln!(
                "warning: {} did not take the video of step {} ({e}); it is in {}",
                self.inner.name(),
                video.step,
                video.path.display()
            );
        }
        Ok(())
    }

    /// A tracker that cannot end its run is a warning: the run's checkpoint and files are
    /// written, and a failure here would have it restarted, to fail the same way.
    fn close(&mut self) -> Result<()> {
        self.send_latest();
        self.deliver();
        self.warn_unsent("at the end of the run");
        let closed = self.inner.close();
        self.warn_unclosed(closed);
        Ok(())
    }

    /// After a stop the job is to end soon (a launcher gives it a grace period): a tracker
    /// that is resting is not asked again.
    fn close_stopped(&mut self) -> Result<()> {
        // The records of the step whose evaluation the resume redoes go to the resume, whichever
        // queue holds them (a resumed run stopped again holds the ones it owed in its backlog).
        let mut left = None;
        if let Some(step) = self.left_to_the_resume {
            let held = self.latest.len() + self.backlog.len();
            self.latest.retain(|r| r.step != step);
            self.backlog.retain(|r| r.step != step);
            left = (self.latest.len() + self.backlog.len() < held).then_some(step);
        }
        self.send_latest();
        if !self.resting() {
            self.deliver();
        }
        // metrics.jsonl holds what was left: the resume sends it before the evaluation (with
        // records still waiting, an earlier step is noted already).
        if let (Some(step), true) = (left, self.backlog.is_empty()) {
            self.note(|dir, tracker| TrackerRuns::note_owed(dir, tracker, step));
        }
        self.warn_unsent("before the stop");
        let closed = self.inner.close_stopped();
        self.warn_unclosed(closed);
        Ok(())
    }
}

/// A run that ends on an error (or a panic) drops its logger: what was held back of the
/// latest step is sent as it would have been.
impl Drop for Remote {
    fn drop(&mut self) {
        self.send_latest();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::error::Error;
    use crate::logging::Phase;

    /// Takes records while `up`, keeping their steps; counts the attempts it refused.
    struct Flaky {
        up: Arc<Mutex<bool>>,
        steps: Arc<Mutex<Vec<u64>>>,
        refused: Arc<Mutex<u64>>,
    }

    impl Sink for Flaky {
        fn name(&self) -> &'static str {
            "flaky"
        }

        fn write(&mut self, record: &Record) -> Result<()> {
            if !*self.up.lock().unwrap() {
                *self.refused.lock().unwrap() += 1;
                return Err(Error::Other("connection refused".into()));
            }
            self.steps.lock().unwrap().push(record.step);
            Ok(())
        }

        /// A video counts as its step, in the same order as the records.
        fn video(&mut self, video: &Video) -> Result<()> {
            if !*self.up.lock().unwrap() {
                return Err(Error::Other("connection refused".into()));
            }
            self.steps.lock().unwrap().push(video.step);
            Ok(())
        }

        fn close(&mut self) -> Result<()> {
            match *self.up.lock().unwrap() {
                true => Ok(()),
                false => Err(Error::Other("connection refused".into())),
            }
        }
    }

    type Shared<T> = Arc<Mutex<T>>;

    /// A `Remote` over a `Flaky` tracker, up or not, with its switch, the steps it took and
    /// the attempts it refused.
    /// Asked again at every record while down (`retry_every` zero) unless a test says.
    fn flaky(up: bool) -> (Remote, Shared<bool>, Shared<Vec<u64>>, Shared<u64>) {
        let (up, steps, refused) = (Arc::new(Mutex::new(up)), Arc::default(), Arc::default());
        let mut remote = Remote::new(Box::new(Flaky {
            up: Arc::clone(&up),
            steps: Arc::clone(&steps),
            refused: Arc::clone(&refused),
        }));
        remote.retry_every = Duration::ZERO;
        (remote, up, steps, refused)
    }

    /// A tracker that failed is not asked again before its time: each attempt may cost a
    /// timeout; the records wait, in order, and the end of the run asks once more.
    #[test]
    fn a_failed_tracker_rests_between_attempts() {
        let (mut remote, up, steps, refused) = flaky(false);
        remote.retry_every = Duration::from_secs(3600);
        for step in 1..=5 {
            remote.write(&Record::new(Phase::Train, step)).unwrap();
        }
        assert_eq!(*refused.lock().unwrap(), 1, "one attempt in the hour");
        *up.lock().unwrap() = true;
        remote.write(&Record::new(Phase::Train, 6)).unwrap();
        assert!(steps.lock().unwrap().is_empty(), "still resting");
        remote.close().unwrap();
        assert_eq!(*steps.lock().unwrap(), [1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn a_video_follows_the_records_owed_before_it() {
        let (mut remote, up, steps, _) = flaky(false);
        let video = |step| Video {
            step,
            path: "eval_video/x.gif".into(),
            gif: Vec::new(),
            width: 1,
            height: 1,
            frames: 1,
        };
        remote.write(&Record::new(Phase::Eval, 5)).unwrap();
        remote.video(&video(5)).unwrap();
        assert!(steps.lock().unwrap().is_empty());
        remote.write(&Record::new(Phase::Eval, 6)).unwrap();
        // Back before the next record: the records owed go first.
        *up.lock().unwrap() = true;
        remote.video(&video(6)).unwrap();
        // The video of step 5 was given up (it is in the run directory), never sent late.
        assert_eq!(*steps.lock().unwrap(), [5, 6, 6]);
    }

    #[test]
    fn an_outage_delays_records_in_order_and_never_fails_the_run() {
        let (mut remote, up, steps, refused) = flaky(true);
        let record = |step| Record::new(Phase::Train, step).with("reward", 1.0);
        remote.write(&record(1)).unwrap();
        *up.lock().unwrap() = false;
        remote.write(&record(2)).unwrap();
        remote.write(&record(3)).unwrap();
        assert_eq!(*steps.lock().unwrap(), [1]);
        // One attempt per record while it is down: a tracker that times out costs its
        // timeout once per record, not twice.
        assert_eq!(*refused.lock().unwrap(), 2);
        *up.lock().unwrap() = true;
        remote.write(&record(4)).unwrap();
        assert_eq!(*steps.lock().unwrap(), [1, 2, 3, 4]);
        assert!(remote.backlog.is_empty() && !remote.failing());
    }

    /// A run that trained to its end and wrote its checkpoint does not fail because its
    /// tracker cannot end the tracker's run (it would be restarted, to fail again).
    #[test]
    fn a_tracker_that_cannot_end_its_run_fails_nothing() {
        let (mut remote, _, _, _) = flaky(false);
        remote.write(&Record::new(Phase::Train, 1)).unwrap();
        remote.close().unwrap();
        let (mut remote, _, _, _) = flaky(false);
        remote.close_stopped().unwrap();
    }

    /// While records wait, `trackers.json` says from which step (a crash then loses none for
    /// a resume); once taken, nothing. Records owed from before a resume go first.
    #[test]
    fn what_waits_is_noted_and_what_was_owed_goes_first() {
        let dir = tempfile::tempdir().unwrap();
        let (remote, up, steps, _) = flaky(true);
        let mut remote = remote.noting_in(dir.path());
        let owed = || TrackerRuns::load(dir.path()).owed_from;
        remote.write(&Record::new(Phase::Train, 1)).unwrap();
        assert!(owed().is_empty());
        *up.lock().unwrap() = false;
        remote.write(&Record::new(Phase::Train, 2)).unwrap();
        remote.write(&Record::new(Phase::Train, 3)).unwrap();
        assert_eq!(owed(), [("flaky".to_string(), 2)].into());
        *up.lock().unwrap() = true;
        remote.write(&Record::new(Phase::Train, 4)).unwrap();
        assert_eq!(*steps.lock().unwrap(), [1, 2, 3, 4]);
        assert!(owed().is_empty());

        let (mut remote, _, steps, _) = flaky(true);
        remote.owe(vec![
            Record::new(Phase::Eval, 7),
            Record::new(Phase::Train, 8),
        ]);
        remote.write(&Record::new(Phase::Train, 9)).unwrap();
        assert_eq!(*steps.lock().unwrap(), [7, 8, 9]);
    }

    /// Takes each step once, as W&B: keeps the steps it took.
    struct EachStepOnce(Arc<Mutex<Vec<(Phase, u64)>>>);

    impl Sink for EachStepOnce {
        fn name(&self) -> &'static str {
            "once"
        }

        fn takes_each_step_once(&self) -> bool {
            true
        }

        fn write(&mut self, record: &Record) -> Result<()> {
            let mut taken = self.0.lock().unwrap();
            if taken.last().is_some_and(|&(_, step)| step > record.step) {
                return Err(Error::Other("a step before one it holds".into()));
            }
            taken.push((record.phase, record.step));
            Ok(())
        }
    }

    /// A stop during the evaluation of a step leaves that step's records, to a tracker that
    /// takes each step once, to the resume (noted owed), which sends them with the redone
    /// evaluation; any other end sends them.
    #[test]
    fn a_stop_during_an_evaluation_leaves_its_step_to_the_resume() {
        let dir = tempfile::tempdir().unwrap();
        let taken = Arc::new(Mutex::new(Vec::new()));
        let once = || Remote::new(Box::new(EachStepOnce(Arc::clone(&taken))));
        let owed = || TrackerRuns::load(dir.path()).owed_from;
        let mut remote = once().noting_in(dir.path());
        remote.write(&Record::new(Phase::Eval, 0)).unwrap();
        remote.write(&Record::new(Phase::Train, 500)).unwrap();
        assert_eq!(*taken.lock().unwrap(), [(Phase::Eval, 0)], "500 is held");
        remote.leave_to_the_resume(500);
        remote.close_stopped().unwrap();
        assert_eq!(*taken.lock().unwrap(), [(Phase::Eval, 0)]);
        assert_eq!(owed(), [("once".to_string(), 500)].into());

        // The resume: what was left, then the evaluation, at one step.
        let mut resumed = once().noting_in(dir.path());
        resumed.owe(vec![Record::new(Phase::Train, 500)]);
        resumed.write(&Record::new(Phase::Eval, 500)).unwrap();
        resumed.write(&Record::new(Phase::Train, 1000)).unwrap();
        resumed.close().unwrap();
        let expected = [
            (Phase::Eval, 0),
            (Phase::Train, 500),
            (Phase::Eval, 500),
            (Phase::Train, 1000),
        ];
        assert_eq!(*taken.lock().unwrap(), expected);
        assert!(owed().is_empty());

        // A resume stopped again during the same evaluation leaves what it owed to the next.
        taken.lock().unwrap().clear();
        let mut again = once().noting_in(dir.path());
        again.owe(vec![Record::new(Phase::Train, 500)]);
        again.leave_to_the_resume(500);
        again.close_stopped().unwrap();
        assert!(taken.lock().unwrap().is_empty());
        assert_eq!(owed(), [("once".to_string(), 500)].into());
        TrackerRuns::note_paid(dir.path(), "once").unwrap();

        // A stop at another point sends the latest step as it ends.
        taken.lock().unwrap().clear();
        let mut remote = once().noting_in(dir.path());
        remote.write(&Record::new(Phase::Train, 700)).unwrap();
        remote.leave_to_the_resume(500);
        remote.close_stopped().unwrap();
        assert_eq!(*taken.lock().unwrap(), [(Phase::Train, 700)]);
        assert!(owed().is_empty());
    }

    /// Takes `left` records, then refuses every one.
    struct TakesSome {
        left: usize,
        taken: Arc<Mutex<Vec<u64>>>,
    }

    impl Sink for TakesSome {
        fn name(&self) -> &'static str {
            "takes-some"
        }

        fn write(&mut self, record: &Record) -> Result<()> {
            if self.left == 0 {
                return Err(Error::Other("connection refused".into()));
            }
            self.left -= 1;
            self.taken.lock().unwrap().push(record.step);
            Ok(())
        }
    }

    /// A tracker that takes part of what waits, then fails again, owes only the rest: a resume
    /// would send it the others twice.
    #[test]
    fn what_a_tracker_took_of_its_backlog_is_not_owed() {
        let dir = tempfile::tempdir().unwrap();
        let taken = Arc::default();
        let sink = TakesSome {
            left: 2,
            taken: Arc::clone(&taken),
        };
        let mut remote = Remote::new(Box::new(sink)).noting_in(dir.path());
        remote.retry_every = Duration::ZERO;
        remote.owe(
            (1..=5)
                .map(|step| Record::new(Phase::Train, step))
                .collect(),
        );
        remote.write(&Record::new(Phase::Train, 6)).unwrap();
        assert_eq!(*taken.lock().unwrap(), [1, 2]);
        let owed = TrackerRuns::load(dir.path()).owed_from;
        assert_eq!(owed, [("takes-some".to_string(), 3)].into());
    }

    #[test]
    fn a_long_outage_keeps_the_latest_records() {
        let (mut remote, up, steps, _) = flaky(false);
        let total = BACKLOG as u64 + 5;
        for step in 0..total {
            remote.write(&Record::new(Phase::Train, step)).unwrap();
        }
        assert_eq!(remote.dropped, 5);
        *up.lock().unwrap() = true;
        remote.close().unwrap();
        let steps = steps.lock().unwrap();
        assert_eq!(steps.len(), BACKLOG);
        assert_eq!((steps[0], *steps.last().unwrap()), (5, total - 1));
    }
}
