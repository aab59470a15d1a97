//! What the launcher knows of its ranks while they run (their output, their exits, a stop
//! asked for, a peer node lost) and what it decides from it: whom to stop or kill, and when, and
//! how the attempt ended (well, stopped, refused, or failed and restartable).
use std::collections::VecDeque;
use std::time::Duration;

use envs::deadline::Deadline;

use super::group::PEER_PROBABLY_STOPPED;
use super::heartbeat;
use super::launcher::LaunchPlan;
use crate::error::{Error, Result, BAD_INPUT_EXIT_CODE, DIVERGED_EXIT_CODE, STOPPED_EXIT_CODE};

/// How long ranks get to end once one failed, before they are killed.
const GRACE: Duration = Duration::from_secs(20);
/// How long killed ranks get to be reaped: one still there has hung in the kernel (a GPU
/// driver after an error, a hard network mount), where SIGKILL waits.
const REAP_WAIT: Duration = Duration::from_secs(30);
/// Error lines kept per rank for the failure report.
const TAIL_LINES: usize = 12;

pub(super) enum Event {
    Line {
        rank: usize,
        text: String,
        is_err: bool,
    },
    Exit {
        rank: usize,
        status: std::io::Result<std::process::ExitStatus>,
    },
    PeerLost(heartbeat::PeerLost),
    /// Another node was asked to stop.
    PeerStopping {
        node: usize,
    },
    /// A rank's stdout or stderr reached its end.
    StreamEnded,
}

/// How a node's first rank begins the line that says every rank agreed to stop and rank 0
/// writes the checkpoint: its launcher then gives its ranks the stop's grace, also when
/// another node's launcher goes away meanwhile (as it does when its loss caused the stop).
pub const STOPPING_NOTICE: &str = "stopping:";

/// How long this node's ranks get to stop once a peer node is gone (they are likely stuck in a
/// collective with it, so a checkpoint is not to be expected).
const PEER_GRACE: Duration = Duration::from_secs(5);
/// What the launcher knows of its ranks while they run, and what it decides from it.
pub(super) struct Supervision {
    /// The global rank of local rank 0.
    first_rank: usize,
    alive: Vec<Option<u32>>,
    /// Which local ranks have exited.
    exited: Vec<bool>,
    /// The ranks' stdout and stderr pipes not yet at their end.
    open_streams: usize,
    /// Each rank's last lines on stderr (where it says everything it says).
    tails: Vec<VecDeque<String>>,
    failure: Option<Failure>,
    /// The first rank that failed once a stop was under way (Ctrl-C, a rank that stopped as
    /// asked, every rank's agreement): the stop goes on with its grace, and the job is not
    /// restarted, but its checkpoint may be missing.
    failed_while_stopping: Option<Failure>,
    /// Ranks that failed after the first: one of them may be the cause, the first only waiting
    /// on it in a collective (both exits can be in before the launcher reads either).
    later_failures: Vec<Failure>,
    lost_peer: Option<heartbeat::PeerLost>,
    /// A rank that stopped because a stop was asked for (by another node, say): not a failure.
    stopped: Option<usize>,
    interrupted: Option<Interruption>,
    /// When the ranks still running get SIGKILL.
    deadline: Option<Deadline>,
    /// How long ranks get to end after a stop (Ctrl-C, SIGTERM, a rank that stopped as asked):
    /// rank 0 writes the checkpoint then, a large one with `save_buffer` too (`stop_grace`). A
    /// second Ctrl-C kills at once.
    stop_grace: Duration,
    /// Whether the deadline is a stop's grace (a failure's or a lost peer's replaces it).
    graced_stop: bool,
    /// Ranks the launcher killed: not failures of their own.
    killed: Vec<usize>,
    /// Why the ranks still running are being killed, once they are.
    killing: Option<String>,
    /// Killed ranks that had not ended [`REAP_WAIT`] later: the launcher gave up on them.
    unreaped: Vec<usize>,
    /// A rank here said that every rank agreed to stop ([`STOPPING_NOTICE`]).
    stopping: bool,
    /// Another node that was asked to stop: this node's ranks were asked too.
    peer_stopping: Option<usize>,
    /// A node that went away after that: the stop goes on, but may end without its checkpoint.
    lost_while_stopping: Option<heartbeat::PeerLost>,
}

/// A stop signal the launcher received, and how it says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct StopRequest {
    pub signal: libc::c_int,
    pub why: &'static str,
}

impl StopRequest {
    pub const INTERRUPT: Self = Self {
        signal: libc::SIGINT,
        why: "interrupted (Ctrl-C)",
    };
    pub const TERMINATE: Self = Self {
        signal: libc::SIGTERM,
        why: "terminated (SIGTERM)",
    };
    pub const HANGUP: Self = Self {
        signal: libc::SIGHUP,
        why: "hung up (the terminal closed)",
    };
}

/// Why the job was asked to stop, and when the first request came (monotonic ms).
struct Interruption {
    why: &'static str,
    at_ms: i64,
}

/// The first rank that failed, how, and what its exit code says of it.
struct Failure {
    rank: usize,
    how: String,
    ended: heartbeat::Ended,
}

impl Supervision {
    pub(super) fn new(plan: &LaunchPlan, alive: Vec<Option<u32>>) -> Self {
        let local = alive.len();
        Self {
            first_rank: plan.node_rank * local,
            exited: vec![false; local],
            open_streams: 2 * local,
            alive,
            tails: vec![VecDeque::new(); local],
            failure: None,
            failed_while_stopping: None,
            later_failures: Vec::new(),
            lost_peer: None,
            stopped: None,
            interrupted: None,
            deadline: None,
            stop_grace: plan.stop_grace,
            graced_stop: false,
            killed: Vec::new(),
            killing: None,
            unreaped: Vec::new(),
            stopping: false,
            peer_stopping: None,
            lost_while_stopping: None,
        }
    }

    /// Local ranks not yet exited.
    pub(super) fn running(&self) -> usize {
        self.exited.iter().filter(|&&exited| !exited).count()
    }

    /// The ranks' output pipes not yet at their end.
    pub(super) fn streams_open(&self) -> usize {
        self.open_streams
    }

    /// When the ranks still running are to be killed, once that is decided (or, once they
    /// were, given up on).
    pub(super) fn deadline(&self) -> Option<Deadline> {
        self.deadline
    }

    /// Whether the launcher gave up on ranks that SIGKILL did not end.
    pub(super) fn gave_up(&self) -> bool {
        !self.unreaped.is_empty()
    }

    /// Whether the job is stopping as asked, no rank having failed before: Ctrl-C or SIGTERM
    /// here, a rank here that stopped as asked, or a rank here saying that every rank agreed to.
    fn stop_under_way(&self) -> bool {
        self.failure.is_none()
            && (self.interrupted.is_some()
                || self.stopped.is_some()
                || self.stopping
                || self.peer_stopping.is_some())
    }

    pub(super) fn on_event(&mut self, event: Event) {
        match event {
            Event::Line { rank, text, is_err } => {
                print_line(rank, &text, is_err);
                self.stopping |= text.starts_with(STOPPING_NOTICE);
                if is_err {
                    let tail = &mut self.tails[rank - self.first_rank];
                    if tail.len() == TAIL_LINES {
                        tail.pop_front();
                    }
                    tail.push_back(text);
                }
            }
            Event::Exit { rank, status } => self.on_exit(rank, status),
            Event::StreamEnded => self.open_streams = self.open_streams.saturating_sub(1),
            // A rank here that stopped, or said that every rank agreed to, means the job is
            // stopping: a node whose launcher leaves now is no loss, and rank 0 may still be
            // writing the checkpoint.
            Event::PeerStopping { node } => {
                // Its ranks stop, and this node's with them: at the same step once they met,
                // at once while they still wait to (they would wait `dist_timeout`).
                if !self.stop_under_way() && self.failure.is_none() && self.lost_peer.is_none() {
                    errln!("[launcher] node {node} was asked to stop; stopping this node's ranks");
                    self.peer_stopping = Some(node);
                    stop_all(&self.alive, libc::SIGTERM);
                    self.give_stop_grace();
                }
            }
            Event::PeerLost(lost)
                if (self.stopping || self.peer_stopping.is_some()) && self.lost_peer.is_none() =>
            {
                self.lost_while_stopping.get_or_insert(lost);
                self.give_stop_grace();
            }
            Event::PeerLost(lost) => {
                if self.lost_peer.is_none() && self.interrupted.is_none() && self.stopped.is_none()
                {
                    errln!("[launcher] {lost}; stopping this node's ranks");
                    stop_all(&self.alive, libc::SIGTERM);
                    match lost.likely_stopping {
                        true => self.give_stop_grace(),
                        false => {
                            self.deadline = Some(Deadline::after(PEER_GRACE));
                            self.graced_stop = false;
                        }
                    }
                    self.lost_peer = Some(lost);
                }
            }
        }
    }

    fn on_exit(&mut self, rank: usize, status: std::io::Result<std::process::ExitStatus>) {
        use std::os::unix::process::ExitStatusExt;
        self.exited[rank - self.first_rank] = true;
        self.alive[rank - self.first_rank] = None;
        let ok = matches!(&status, Ok(s) if s.success());
        let code = status.as_ref().ok().and_then(|s| s.code());
        if self.killing.is_some() && matches!(&status, Ok(s) if s.signal() == Some(libc::SIGKILL)) {
            self.killed.push(rank);
        } else if code == Some(STOPPED_EXIT_CODE) && self.failure.is_none() {
            // The others stop at the same step by agreement; the grace is a bound.
            self.stopped.get_or_insert(rank);
            self.give_stop_grace();
        } else if !ok {
            let failure = Failure {
                rank,
                how: describe(&status),
                ended: match code {
                    Some(BAD_INPUT_EXIT_CODE) => heartbeat::Ended::Refused,
                    Some(DIVERGED_EXIT_CODE) => heartbeat::Ended::Diverged,
                    _ => heartbeat::Ended::Failed,
                },
            };
            if self.stop_under_way() {
                self.failed_during_the_stop(failure);
                return;
            }
            if self.failure.is_some() {
                // A failure of its own, whatever it was asked since: refused input, divergence,
                // or killed (out of memory: the launcher's own kill counts as none).
                let of_its_own = !matches!(failure.ended, heartbeat::Ended::Failed)
                    || matches!(&status, Ok(s) if s.signal() == Some(libc::SIGKILL));
                if of_its_own {
                    self.later_failures.push(failure);
                }
                return;
            }
            self.failure = Some(failure);
            // Being killed already (a second request): the wait for the kill stands.
            if self.killing.is_none() {
                stop_all(&self.alive, libc::SIGTERM);
                self.deadline = Some(Deadline::after(GRACE));
                self.graced_stop = false;
            }
        }
    }

    /// A rank failed while the job stops (out of memory writing its buffer, an abort at the
    /// process group's end): the others keep the stop's grace to end, rank 0 to write the
    /// checkpoint; once rank 0 itself is gone there is no checkpoint left to wait for.
    fn failed_during_the_stop(&mut self, failure: Failure) {
        let writer_gone = failure.rank == 0;
        self.failed_while_stopping.get_or_insert(failure);
        self.give_stop_grace();
        let killing = self.killing.is_some();
        if writer_gone && !killing && self.deadline.is_some_and(|d| d.left() > GRACE) {
            self.deadline = Some(Deadline::after(GRACE));
            self.graced_stop = false;
        }
    }

    /// The failure that ended the attempt: the first, unless it was a collective that failed
    /// because another rank had stopped and a later one failed of itself (refused its input,
    /// diverged, or was killed; its exit code then decides whether the job is restarted).
    fn cause(&mut self) -> Option<Failure> {
        let first = self.failure.take()?;
        let follows = |failure: &Failure| {
            self.tails[failure.rank - self.first_rank]
                .iter()
                .any(|line| line.contains(PEER_PROBABLY_STOPPED))
        };
        if !follows(&first) {
            return Some(first);
        }
        match self.later_failures.iter().position(|f| !follows(f)) {
            Some(at) => Some(self.later_failures.swap_remove(at)),
            None => Some(first),
        }
    }

    /// Whether a stop was asked of this node's launcher (Ctrl-C, SIGTERM).
    pub(super) fn was_interrupted(&self) -> bool {
        self.interrupted.is_some()
    }

    pub(super) fn interrupt(&mut self, request: StopRequest) {
        let now = crate::terminal::monotonic_ms();
        if let Some(first) = &self.interrupted {
            // Ctrl-C again, a moment later: not the first passed on twice (a terminal's and a
            // wrapper's), nor a SIGTERM or hangup that followed it (a closed terminal, a sweep
            // that went away).
            if crate::terminal::is_second_request(request.signal, first.at_ms, now) {
                self.kill("asked again to stop");
            }
            return;
        }
        self.interrupted = Some(Interruption {
            why: request.why,
            at_ms: now,
        });
        stop_all(&self.alive, libc::SIGTERM);
        self.give_stop_grace();
    }

    /// The ranks get the stop's grace to end, unless a deadline is already set.
    fn give_stop_grace(&mut self) {
        if self.deadline.is_none() {
            self.deadline = Some(Deadline::after(self.stop_grace));
            self.graced_stop = true;
        }
    }

    /// The deadline passed: the ranks still running are killed, or, when they already were,
    /// given up on.
    pub(super) fn grace_ran_out(&mut self) {
        if self.killing.is_some() {
            self.unreaped = self.ranks_running();
            errln!(
                "[launcher] rank(s) {:?} (pids {:?}) did not end {} s after SIGKILL: they hang \
                 in the kernel (a GPU driver after an error, a hard network mount, say); \
                 giving up on them",
                self.unreaped,
                self.alive.iter().flatten().collect::<Vec<_>>(),
                REAP_WAIT.as_secs()
            );
            self.deadline = None;
            return;
        }
        let why = match self.graced_stop {
            true => format!(
                "ranks still running after the grace period (stop_grace={} s)",
                self.stop_grace.as_secs()
            ),
            false => "ranks still running after the grace period".to_string(),
        };
        self.kill(&why);
    }

    pub(super) fn kill(&mut self, why: &str) {
        errln!("[launcher] {why}; killing the ranks still running");
        stop_all(&self.alive, libc::SIGKILL);
        if self.killing.is_none() {
            self.killing = Some(why.to_owned());
            self.deadline = Some(Deadline::after(REAP_WAIT));
            self.graced_stop = false;
        }
    }

    /// The global ranks of this node not yet exited.
    fn ranks_running(&self) -> Vec<usize> {
        (self.exited.iter().enumerate())
            .filter(|(_, &exited)| !exited)
            .map(|(local, _)| self.first_rank + local)
            .collect()
    }

    /// The ranks the launcher killed, for a message ("" when none).
    fn killed_note(&self) -> String {
        match (self.killed.as_slice(), &self.killing) {
            ([], _) | (_, None) => String::new(),
            (ranks, Some(why)) => format!(
                "; killed ({why}): rank(s) {ranks:?}, so a checkpoint they were writing may be \
                 missing"
            ),
        }
    }

    /// A rank's last lines on stderr, indented, for a report.
    fn last_lines(&self, rank: usize) -> String {
        let tail = &self.tails[rank - self.first_rank];
        match tail.is_empty() {
            true => "  (none: it wrote nothing)".to_owned(),
            false => tail
                .iter()
                .map(|l| format!("  {l}"))
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    /// Ok only when every rank exited 0; else what went wrong first. A stop that was asked for
    /// wins over a failure, so that Ctrl-C is never answered with a restart.
    pub(super) fn outcome(mut self) -> Result<()> {
        if !self.unreaped.is_empty() {
            return Err(self.hung());
        }
        let killed = self.killed_note();
        let failure = self.cause();
        let failed_while_stopping = self.failed_while_stopping.take();
        if let Some(Interruption { why, .. }) = self.interrupted {
            let failed = match (&failure, &failed_while_stopping) {
                (Some(f), _) => format!(" (after rank {} failed: {})", f.rank, f.how),
                (None, Some(f)) => format!(
                    " (rank {} failed meanwhile: {}; the stop's checkpoint may be missing, the \
                     last one written stands)",
                    f.rank, f.how
                ),
                (None, None) => String::new(),
            };
            return Err(Error::Stopped(format!(
                "{why}: all ranks stopped{failed}{killed}"
            )));
        }
        if let Some(lost) = self.lost_peer.take() {
            let why = format!("{lost}; this node's ranks were stopped");
            return Err(match lost.ended {
                // Node 0's launcher gone: its ranks stop with a checkpoint, and no restart can
                // be made without its store.
                _ if lost.likely_stopping => Error::Stopped(why),
                heartbeat::Ended::Hung => Error::Other(why),
                heartbeat::Ended::Refused => Error::Config(why),
                heartbeat::Ended::Diverged => Error::Diverged(why),
                heartbeat::Ended::Stopped => Error::Stopped(why),
                _ => Error::JobFailed(why),
            });
        }
        if let Some(failure) = &failure {
            return Err(self.failed(failure, &killed));
        }
        self.stopped_as_agreed(failed_while_stopping, &killed)
    }

    /// Ranks SIGKILL did not end: a stop stays one; otherwise the job is not restarted, as new
    /// ranks would meet the hung ones' GPU and files.
    fn hung(&self) -> Error {
        let hung = format!(
            "rank(s) {:?} did not end after SIGKILL (hung in the kernel; the system log, dmesg, \
             says why)",
            self.unreaped
        );
        match (&self.interrupted, self.stop_under_way()) {
            (Some(Interruption { why, .. }), _) => Error::Stopped(format!(
                "{why}: the ranks were stopped, but {hung}; the stop's checkpoint may be missing"
            )),
            (None, true) => Error::Stopped(format!(
                "the job was stopping, but {hung}; the stop's checkpoint may be missing"
            )),
            (None, false) => Error::Other(format!(
                "{hung}: the job is not restarted while they hold their GPU and files"
            )),
        }
    }

    /// The job's end by `failure`, the rank that failed first of itself: refused input and
    /// divergence are not restarted, another failure may be.
    fn failed(&self, failure: &Failure, killed: &str) -> Error {
        let lines = self.last_lines(failure.rank);
        let (rank, how) = (failure.rank, &failure.how);
        match failure.ended {
            heartbeat::Ended::Refused => Error::Config(format!(
                "rank {rank} refused its input ({how}); the other ranks were stopped. Its last \
                 lines on stderr:\n{lines}"
            )),
            heartbeat::Ended::Diverged => Error::Diverged(format!(
                "rank {rank}'s training diverged ({how}); the other ranks were stopped, and the \
                 job is not restarted: from the last checkpoint it would most likely diverge \
                 again. Its last lines on stderr:\n{lines}"
            )),
            _ => Error::JobFailed(format!(
                "rank {rank} failed ({how}); the other ranks were stopped{killed}. Its last \
                 lines on stderr:\n{lines}"
            )),
        }
    }

    /// The end of a job whose ranks stopped as every rank agreed (a stop asked on another
    /// node, say), or ended well: Ok.
    fn stopped_as_agreed(
        &self,
        failed_while_stopping: Option<Failure>,
        killed: &str,
    ) -> Result<()> {
        // A stop asked on another node, named before how this node's ranks ended.
        let asked = match self.peer_stopping {
            Some(node) => format!("node {node} stopped ({}); ", heartbeat::STOPPED_THERE),
            None => String::new(),
        };
        if let Some(f) = &failed_while_stopping {
            return Err(Error::Stopped(format!(
                "{asked}the job was stopping, and rank {} failed meanwhile ({}){killed}; the \
                 stop's checkpoint may be missing (the last one written stands). Its last lines \
                 on stderr:\n{}",
                f.rank,
                f.how,
                self.last_lines(f.rank)
            )));
        }
        if let (None, Some(lost)) = (self.stopped, &self.lost_while_stopping) {
            return Err(Error::Stopped(format!(
                "{asked}every rank agreed to stop, but {lost} before this node's ranks \
                 ended{killed}; the stop's checkpoint may be missing (the last one written \
                 stands)"
            )));
        }
        if let Some(rank) = self.stopped {
            let tail = &self.tails[rank - self.first_rank];
            let why = tail.back().map_or("", String::as_str);
            let why = why.strip_prefix("error: ").unwrap_or(why);
            return Err(Error::Stopped(format!(
                "{asked}the job stopped (rank {rank}: {why}){killed}"
            )));
        }
        Ok(())
    }
}

fn print_line(rank: usize, text: &str, is_err: bool) {
    match (rank, is_err) {
        (0, false) => outln!("{text}"),
        (0, true) => errln!("{text}"),
        (_, false) => outln!("[rank {rank}] {text}"),
        (_, true) => errln!("[rank {rank}] {text}"),
    }
}

fn describe(status: &std::io::Result<std::process::ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(code), _) => format!("exit code {code}"),
            (None, Some(sig)) => format!("killed by signal {sig}"),
            _ => "unknown exit".into(),
        },
        Err(e) => format!("could not be waited for: {e}"),
    }
}

fn stop_all(alive: &[Option<u32>], sig: i32) {
    for pid in alive.iter().flatten() {
        // SAFETY: kill(2) on a child we have not reaped yet, with a valid signal number.
        unsafe {
            libc::kill(*pid as i32, sig);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    /// Supervision of two local ranks whose pids are unknown (nothing is signalled).
    fn two_ranks() -> Supervision {
        two_ranks_with(Duration::from_secs(120))
    }

    fn two_ranks_with(stop_grace: Duration) -> Supervision {
        let plan = LaunchPlan {
            world_size: 2,
            nnodes: 1,
            node_rank: 0,
            master_addr: "127.0.0.1".into(),
            master_port: 1,
            cpu_affinity: false,
            max_restarts: 3,
            peer_timeout: Duration::from_secs(1),
            dist_timeout: Duration::from_secs(1),
            stop_grace,
            job: String::new(),
            program: "tdmpc2".into(),
            args: Vec::new(),
        };
        Supervision::new(&plan, vec![None, None])
    }

    fn exited(code: i32) -> std::io::Result<std::process::ExitStatus> {
        Ok(std::process::ExitStatus::from_raw(code << 8))
    }

    fn signalled(signal: i32) -> std::io::Result<std::process::ExitStatus> {
        Ok(std::process::ExitStatus::from_raw(signal))
    }

    #[test]
    fn a_rank_that_refuses_its_input_is_not_restarted() {
        let mut job = two_ranks();
        job.on_exit(1, exited(BAD_INPUT_EXIT_CODE));
        job.on_exit(0, signalled(libc::SIGTERM));
        let err = job.outcome().unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{err}");
        assert!(
            err.to_string().contains("rank 1 refused its input"),
            "{err}"
        );
    }

    /// Rank 0's collective failed because rank 1 refused its input, and the launcher read rank
    /// 0's exit first: the job is refused (never restarted), naming rank 1.
    #[test]
    fn the_rank_a_failed_collective_waited_on_is_named() {
        let collective_failed = |job: &mut Supervision, rank: usize| {
            job.on_event(Event::Line {
                rank,
                text: format!("error: collective all_gather failed (...); {PEER_PROBABLY_STOPPED}"),
                is_err: true,
            });
        };
        let mut job = two_ranks();
        collective_failed(&mut job, 0);
        job.on_exit(0, exited(1));
        job.on_exit(1, exited(BAD_INPUT_EXIT_CODE));
        let err = job.outcome().unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{err}");
        assert!(err.to_string().contains("rank 1 refused"), "{err}");
        // SIGKILLed (out of memory, say): rank 1 is the failure.
        let mut job = two_ranks();
        collective_failed(&mut job, 0);
        job.on_exit(0, exited(1));
        job.on_exit(1, signalled(libc::SIGKILL));
        let err = job.outcome().unwrap_err().to_string();
        assert!(err.contains("rank 1 failed (killed by signal 9)"), "{err}");
        // Stopped as asked after the first failure, both collectives failed, or the other
        // failed after the launcher's SIGTERM (an NCCL abort, say): the first.
        for (other, other_collective_failed) in [
            (exited(STOPPED_EXIT_CODE), false),
            (exited(1), true),
            (exited(1), false),
            (signalled(libc::SIGABRT), false),
        ] {
            let mut job = two_ranks();
            collective_failed(&mut job, 0);
            if other_collective_failed {
                collective_failed(&mut job, 1);
            }
            job.on_exit(0, exited(1));
            job.on_exit(1, other);
            let err = job.outcome().unwrap_err().to_string();
            assert!(err.contains("rank 0 failed (exit code 1)"), "{err}");
        }
    }

    #[test]
    fn a_rank_whose_training_diverged_is_not_restarted() {
        let mut job = two_ranks();
        job.on_exit(0, exited(DIVERGED_EXIT_CODE));
        job.on_exit(1, signalled(libc::SIGTERM));
        let err = job.outcome().unwrap_err();
        assert!(matches!(err, Error::Diverged(_)), "{err}");
        assert!(err.to_string().contains("not restarted"), "{err}");
        assert_eq!(err.exit_code(), DIVERGED_EXIT_CODE);
    }

    #[test]
    fn ctrl_c_after_a_failure_is_a_stop_not_a_restart() {
        let mut job = two_ranks();
        job.on_exit(1, exited(1));
        job.interrupt(StopRequest::INTERRUPT);
        job.on_exit(0, exited(STOPPED_EXIT_CODE));
        let err = job.outcome().unwrap_err();
        assert!(matches!(err, Error::Stopped(_)), "{err}");
        assert!(err.to_string().contains("after rank 1 failed"), "{err}");
    }

    /// Another node whose ranks refused their input ends this node's job as refused (exit 2,
    /// never restarted: it would fail the same way), one whose training diverged as diverged
    /// (exit 4, never restarted), one whose launcher was asked to stop before this attempt as a
    /// stop (exit 3); one that failed may be restarted.
    #[test]
    fn a_peer_that_refused_its_input_diverged_or_stopped_is_not_restarted() {
        use heartbeat::Ended;
        for (ended, exit_code) in [
            (Ended::Refused, 2),
            (Ended::Diverged, 4),
            (Ended::Stopped, 3),
            (Ended::Failed, 1),
        ] {
            let mut job = two_ranks();
            job.on_event(Event::PeerLost(heartbeat::PeerLost {
                node: 1,
                why: "its ranks ended".into(),
                ended,
                likely_stopping: false,
            }));
            job.on_exit(0, exited(STOPPED_EXIT_CODE));
            job.on_exit(1, exited(STOPPED_EXIT_CODE));
            let err = job.outcome().unwrap_err();
            assert_eq!(err.exit_code(), exit_code, "{err}");
            assert_eq!(
                ended.restartable(),
                matches!(err, Error::JobFailed(_)),
                "{err}"
            );
        }
    }

    /// Ranks here stopped as agreed (a stop asked on another node): that node's launcher
    /// leaving afterwards is the job ending, not a loss to restart from.
    #[test]
    fn a_peer_leaving_after_an_agreed_stop_is_no_failure() {
        let mut job = two_ranks();
        job.on_exit(1, exited(STOPPED_EXIT_CODE));
        job.on_event(Event::PeerLost(heartbeat::PeerLost {
            node: 0,
            why: "its launcher's store does not answer".into(),
            ended: heartbeat::Ended::Failed,
            likely_stopping: false,
        }));
        job.on_exit(0, exited(STOPPED_EXIT_CODE));
        let err = job.outcome().unwrap_err();
        assert!(matches!(err, Error::Stopped(_)), "{err}");
    }

    /// Two ranks that said every rank agreed to stop, then lost node 1's launcher.
    fn stopping_then_a_peer_lost() -> Supervision {
        let mut job = two_ranks();
        job.on_event(Event::Line {
            rank: 0,
            text: format!("{STOPPING_NOTICE} every rank stops at step 8"),
            is_err: true,
        });
        job.on_event(Event::PeerLost(heartbeat::PeerLost {
            node: 1,
            why: "its launcher sent no heartbeat for 31 s (peer_timeout)".into(),
            ended: heartbeat::Ended::Failed,
            likely_stopping: false,
        }));
        job
    }

    /// A node lost to silence leaves this node's ranks seconds (they are likely stuck in a
    /// collective with it); node 0's launcher gone (its store does not answer) leaves them the
    /// stop's grace, to meet node 0's ranks, which stop with a checkpoint when it dies.
    #[test]
    fn node_0_s_launcher_gone_leaves_the_ranks_the_stop_s_grace() {
        for likely_stopping in [false, true] {
            let mut job = two_ranks_with(Duration::from_secs(3600));
            job.on_event(Event::PeerLost(heartbeat::PeerLost {
                node: 0,
                why: "its launcher's store does not answer (connection reset)".into(),
                ended: heartbeat::Ended::Failed,
                likely_stopping,
            }));
            let left = job.deadline().unwrap().left();
            match likely_stopping {
                true => assert!(left > Duration::from_secs(1800), "{left:?}"),
                false => assert!(left <= PEER_GRACE, "{left:?}"),
            }
            assert_eq!(job.graced_stop, likely_stopping);
            // A stop (no restart can be made without node 0's store), or a loss to restart.
            job.on_exit(0, exited(STOPPED_EXIT_CODE));
            job.on_exit(1, exited(STOPPED_EXIT_CODE));
            let err = job.outcome().unwrap_err();
            assert_eq!(matches!(err, Error::Stopped(_)), likely_stopping, "{err}");
        }
    }

    /// Another node asked to stop: this node's ranks are asked too (they may still wait to
    /// meet its ranks, which will not come) with the stop's grace, and the job ends as a stop
    /// naming that node, also when a rank fails meanwhile.
    #[test]
    fn a_node_asked_to_stop_stops_this_node_s_ranks_with_the_stop_s_grace() {
        for failing in [None, Some(1)] {
            let mut job = two_ranks_with(Duration::from_secs(3600));
            job.on_event(Event::PeerStopping { node: 1 });
            let left = job.deadline().unwrap().left();
            assert!(left > Duration::from_secs(1800), "{left:?}");
            if let Some(rank) = failing {
                job.on_exit(rank, exited(1));
            }
            for rank in 0..2 {
                if Some(rank) != failing {
                    job.on_exit(rank, exited(STOPPED_EXIT_CODE));
                }
            }
            let err = job.outcome().unwrap_err();
            assert!(matches!(err, Error::Stopped(_)), "{err}");
            assert!(
                err.to_string()
                    .starts_with(&format!("node 1 stopped ({})", heartbeat::STOPPED_THERE)),
                "{err}"
            );
        }
    }

    /// A node whose launcher went away after every rank agreed to stop (its loss may be why):
    /// rank 0 here gets the stop's grace to write the checkpoint, not a lost peer's seconds.
    #[test]
    fn a_peer_lost_while_the_ranks_stop_leaves_them_the_stop_s_grace() {
        let mut job = stopping_then_a_peer_lost();
        let left = job.deadline().unwrap().left();
        assert!(left > PEER_GRACE * 2, "{left:?}");
        job.on_exit(1, exited(STOPPED_EXIT_CODE));
        job.on_exit(0, exited(STOPPED_EXIT_CODE));
        let err = job.outcome().unwrap_err();
        assert!(matches!(err, Error::Stopped(_)), "{err}");

        // Ranks stuck in the save's collectives with the lost node, killed at the grace's end:
        // a stop that may lack its checkpoint, never a success.
        let mut job = stopping_then_a_peer_lost();
        job.kill("ranks still running after the grace period");
        job.on_exit(0, signalled(libc::SIGKILL));
        job.on_exit(1, signalled(libc::SIGKILL));
        let err = job.outcome().unwrap_err();
        assert!(matches!(err, Error::Stopped(_)), "{err}");
        assert!(
            err.to_string().contains("checkpoint may be missing"),
            "{err}"
        );
    }

    #[test]
    fn one_request_delivered_twice_is_no_second_request() {
        let mut job = two_ranks();
        job.interrupt(StopRequest::INTERRUPT);
        job.interrupt(StopRequest::TERMINATE);
        assert!(
            job.killing.is_none(),
            "the same stop, passed on by a wrapper"
        );
        let first = job.interrupted.as_mut().unwrap();
        first.at_ms -= 2 * crate::terminal::SECOND_REQUEST_AFTER_MS;
        for later in [StopRequest::TERMINATE, StopRequest::HANGUP] {
            job.interrupt(later);
            assert!(
                job.killing.is_none(),
                "{later:?} later is no second request"
            );
        }
        job.interrupt(StopRequest::INTERRUPT);
        assert!(job.killing.is_some(), "a second Ctrl-C kills");
        // And the stop says so, not that a grace period ran out.
        job.on_exit(0, signalled(libc::SIGKILL));
        job.on_exit(1, signalled(libc::SIGKILL));
        let err = job.outcome().unwrap_err().to_string();
        assert!(
            err.contains("killed (asked again to stop): rank(s) [0, 1]"),
            "{err}"
        );
    }

    /// A stop gives the ranks `stop_grace`; a failure its own grace, whatever `stop_grace` is.
    #[test]
    fn a_stop_gives_the_ranks_stop_grace() {
        for secs in [5, 3600] {
            let mut job = two_ranks_with(Duration::from_secs(secs));
            job.interrupt(StopRequest::TERMINATE);
            let left = job.deadline().unwrap().left();
            assert!(left <= Duration::from_secs(secs), "{left:?}");
            assert!(left > Duration::from_secs(secs) / 2, "{left:?}");
        }
        let mut job = two_ranks_with(Duration::from_secs(3600));
        job.on_exit(0, exited(1));
        assert!(job.deadline().unwrap().left() <= GRACE);
        assert!(!job.graced_stop, "its kill names no stop_grace");
    }

    /// A rank that fails once the job is stopping as asked (Ctrl-C here, a rank that stopped
    /// as asked, every rank's agreement) leaves rank 0 the stop's grace to write the
    /// checkpoint, and the job stops rather than restarting; once rank 0 itself failed there
    /// is no checkpoint to wait for.
    #[test]
    fn a_failure_during_a_stop_keeps_the_stop_and_its_grace() {
        let hour = Duration::from_secs(3600);
        type Stop = fn(&mut Supervision);
        let ways: [(&str, Stop); 3] = [
            ("Ctrl-C here", |job| job.interrupt(StopRequest::INTERRUPT)),
            ("rank 1 stopped as asked", |job| {
                job.on_exit(1, exited(STOPPED_EXIT_CODE))
            }),
            ("every rank agreed", |job| {
                job.on_event(Event::Line {
                    rank: 1,
                    text: format!("{STOPPING_NOTICE} every rank stops at step 8"),
                    is_err: true,
                })
            }),
        ];
        for (way, stop) in ways {
            let mut job = two_ranks_with(hour);
            stop(&mut job);
            // Rank 1 fails, or rank 0 when rank 1 has stopped already.
            let failing = if way == "rank 1 stopped as asked" {
                0
            } else {
                1
            };
            job.on_exit(failing, signalled(libc::SIGABRT));
            let left = job.deadline().unwrap().left();
            match failing {
                0 => assert!(left <= GRACE, "{way}: the writer is gone: {left:?}"),
                _ => assert!(left > hour / 2, "{way}: the stop's grace kept: {left:?}"),
            }
            if failing == 1 {
                job.on_exit(0, exited(STOPPED_EXIT_CODE));
            }
            let err = job.outcome().unwrap_err();
            assert!(matches!(err, Error::Stopped(_)), "{way}: {err}");
            let text = err.to_string();
            assert!(
                text.contains(&format!("rank {failing} failed meanwhile"))
                    && text.contains("checkpoint may be missing"),
                "{way}: {text}"
            );
        }
    }

    /// Ranks that SIGKILL does not end (hung in the kernel) are given up on after a wait, and
    /// the job is not restarted on top of them.
    #[test]
    fn ranks_that_outlive_sigkill_are_given_up_on() {
        let mut job = two_ranks();
        job.on_exit(0, exited(1));
        job.grace_ran_out();
        assert!(!job.gave_up());
        let left = job.deadline().expect("a wait for the killed ranks").left();
        assert!(left <= REAP_WAIT, "{left:?}");
        job.grace_ran_out();
        assert!(job.gave_up() && job.running() == 1);
        let err = job.outcome().unwrap_err();
        assert!(!matches!(err, Error::JobFailed(_)), "not restarted: {err}");
        assert!(
            err.to_string()
                .contains("rank(s) [1] did not end after SIGKILL"),
            "{err}"
        );
        // A stop stays a stop, and a failure while the killed ranks are awaited leaves the
        // wait as it was.
        let mut job = two_ranks();
        job.interrupt(StopRequest::INTERRUPT);
        job.grace_ran_out();
        let left = job.deadline().unwrap().left();
        job.on_exit(0, exited(1));
        assert!(job.deadline().unwrap().left() > left - Duration::from_secs(1));
        job.grace_ran_out();
        let err = job.outcome().unwrap_err();
        assert!(matches!(err, Error::Stopped(_)), "{err}");
        assert!(err.to_string().contains("rank(s) [1] did not end"), "{err}");
    }

    #[test]
    fn a_rank_killed_after_the_stop_grace_is_no_failure() {
        let mut job = two_ranks();
        job.on_exit(1, exited(STOPPED_EXIT_CODE));
        job.grace_ran_out();
        job.on_exit(0, signalled(libc::SIGKILL));
        let err = job.outcome().unwrap_err();
        assert!(matches!(err, Error::Stopped(_)), "{err}");
        assert!(
            err.to_string().contains(
                "killed (ranks still running after the grace period (stop_grace=120 s)): \
                 rank(s) [0]"
            ),
            "{err}"
        );
    }
}
