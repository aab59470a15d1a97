//! The limit on a gloo collective, `dist_timeout`, counted while the job runs.
//!
//! Gloo fixes an operation's deadline when it starts and counts a stop of the job (Ctrl-Z, a
//! scheduler's suspension) as time waited: after a stop longer than `dist_timeout`, every rank
//! that was waiting on another would fail the moment the job continued, before the other had
//! run. So gloo gets a limit it never reaches ([`BEYOND_REACH`]), and a thread of ours ends the
//! rank when one collective has waited `dist_timeout` with the job running
//! ([`envs::deadline`]). NCCL keeps its own limit: its collectives return to the host before
//! they complete, so only its watchdog sees them wait.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use envs::deadline::Deadline;

use super::group::PEER_PROBABLY_STOPPED;
use crate::error::{Error, Result};

/// Gloo's own limit: thirty days.
pub(super) const BEYOND_REACH: Duration = Duration::from_secs(30 * 24 * 3600);

/// How often the watchdog looks.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Watches the collectives of one process group from a thread of its own, which ends with it.
pub(super) struct Watchdog {
    shared: Arc<Shared>,
}

struct Shared {
    limit: Duration,
    in_flight: Mutex<Option<InFlight>>,
    ended: AtomicBool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct InFlight {
    op: &'static str,
    deadline: Deadline,
}

impl Watchdog {
    /// Starts watching; a collective may wait `limit` (`dist_timeout`).
    pub(super) fn start(limit: Duration) -> Result<Self> {
        let shared = Arc::new(Shared {
            limit,
            in_flight: Mutex::new(None),
            ended: AtomicBool::new(false),
        });
        let watched = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("collective-watchdog".into())
            .spawn(move || watch(&watched))
            .map_err(|e| Error::Other(format!("cannot start the collectives' watchdog: {e}")))?;
        Ok(Self { shared })
    }

    /// Runs the collective `op` under the limit.
    pub(super) fn watch<T>(&self, op: &'static str, call: impl FnOnce() -> T) -> T {
        let in_flight = InFlight {
            op,
            deadline: Deadline::after(self.shared.limit),
        };
        *self.slot() = Some(in_flight);
        let _clear = InFlightUntilDropped(self);
        call()
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<InFlight>> {
        self.shared
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Clears the collective in flight, also when its call unwinds.
struct InFlightUntilDropped<'a>(&'a Watchdog);

impl Drop for InFlightUntilDropped<'_> {
    fn drop(&mut self) {
        *self.0.slot() = None;
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shared.ended.store(true, Ordering::SeqCst);
    }
}

fn watch(shared: &Shared) {
    let current = || {
        *shared
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    };
    while !shared.ended.load(Ordering::SeqCst) {
        std::thread::sleep(LOOK_EVERY);
        let Some(in_flight) = current() else {
            continue;
        };
        if in_flight.deadline.passed() && current() == Some(in_flight) {
            let error = timed_out(in_flight.op, shared.limit);
            errln!("error: {error}");
            // The waiting thread is inside gloo, which nothing interrupts; ending the process
            // closes its connections, so the other ranks' collectives fail at once rather than
            // each waiting out its own limit.
            // SAFETY: ends the process without running exit handlers (Python's would wait on
            // the collective this thread gives up on).
            unsafe { libc::_exit(error.exit_code()) };
        }
    }
}

fn timed_out(op: &str, limit: Duration) -> Error {
    Error::Collective(format!(
        "collective {op} had no answer from the other ranks within {} s (dist_timeout) while \
         the job ran; {PEER_PROBABLY_STOPPED}",
        limit.as_secs()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_collective_that_ends_in_time_leaves_nothing_in_flight() {
        let watchdog = Watchdog::start(Duration::from_secs(60)).unwrap();
        let seen = watchdog.watch("all_reduce", || *watchdog.slot());
        assert_eq!(seen.map(|f| f.op), Some("all_reduce"));
        assert!(watchdog.slot().is_none());
        let said = timed_out("all_gather", Duration::from_secs(7)).to_string();
        assert!(said.contains("all_gather") && said.contains("7 s (dist_timeout)"));
        assert!(said.contains(PEER_PROBABLY_STOPPED), "{said}");
    }
}
