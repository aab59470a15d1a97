//! Deadlines that a stop of the whole job does not use up.
//!
//! Ctrl-Z, `kill -STOP` of a process group and a scheduler's suspension (SLURM's `scontrol
//! suspend`) stop every process of a job together, for minutes or hours, while the monotonic
//! clock runs on. A wait for another process timed by that clock alone would find its limit
//! passed the moment the job continues, before the other process had run at all. A process
//! that [`counts_continues`] restarts every deadline's allowance at the last continue
//! (SIGCONT), so a process that really went silent is still caught, within the limit of the job
//! running again.
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// When this process last continued after a stop.
static LAST_CONTINUE: Mutex<Option<Instant>> = Mutex::new(None);

/// How long [`Deadline::passed`] waits before it looks again: a waiting thread can wake the
/// instant the job continues, before the thread that notes continues has run.
const SECOND_LOOK: Duration = Duration::from_millis(250);

/// Notes every continue of this process from now on. Call it first thing in `main`, before
/// any thread starts: SIGCONT is blocked in this thread and every thread started after, and
/// taken by a thread of its own (continuing itself is the kernel's, blocked or not). A handler
/// would interrupt whichever thread it ran on, and libraries' sleeps and polls do not all
/// retry an interrupted call (c10d's connect does not). Child processes inherit the mask: ours
/// take their continues the same way, and any other is still continued by the kernel.
pub fn counts_continues() -> std::io::Result<()> {
    // SAFETY: sigemptyset and sigaddset fill the set they are given.
    let set = unsafe {
        let mut set = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCONT);
        set
    };
    // SAFETY: a valid set; the old mask is not asked for.
    let blocked = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if blocked != 0 {
        return Err(std::io::Error::from_raw_os_error(blocked));
    }
    let taker = std::thread::Builder::new()
        .name("continues".into())
        .spawn(move || loop {
            // SAFETY: waits for a signal of a valid set; no information is asked for.
            if unsafe { libc::sigwaitinfo(&set, std::ptr::null_mut()) } == libc::SIGCONT {
                note_continue();
            }
        });
    if let Err(e) = taker {
        // Nothing would take a continue, which would stay pending (see `Deadline::passed`).
        // SAFETY: the same valid set, unblocked again.
        unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
        return Err(e);
    }
    Ok(())
}

/// Notes that the process continued now.
pub(crate) fn note_continue() {
    *LAST_CONTINUE.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
}

/// When this process last continued after a stop, if it has since [`counts_continues`].
pub fn last_continue() -> Option<Instant> {
    *LAST_CONTINUE.lock().unwrap_or_else(PoisonError::into_inner)
}

fn counted_from(start: Instant) -> Instant {
    last_continue().map_or(start, |continued| continued.max(start))
}

/// A limit on a wait, counted while the job runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    start: Instant,
    limit: Duration,
}

impl Deadline {
    /// A deadline `limit` from now.
    pub fn after(limit: Duration) -> Self {
        Self::since(Instant::now(), limit)
    }

    /// A deadline `limit` after `start`.
    pub fn since(start: Instant, limit: Duration) -> Self {
        Self { start, limit }
    }

    pub fn limit(&self) -> Duration {
        self.limit
    }

    /// How long the wait has lasted while the job ran: since its start, or since the last
    /// continue if that came later.
    pub fn waited(&self) -> Duration {
        counted_from(self.start).elapsed()
    }

    /// The time left (zero once passed).
    pub fn left(&self) -> Duration {
        self.limit.saturating_sub(self.waited())
    }

    /// When it passes unless the job is stopped before then: the time to sleep until.
    pub fn at(&self) -> Instant {
        counted_from(self.start) + self.limit
    }

    /// Whether the limit passed. Looked at twice, a moment apart, before it says so: the job
    /// may just have continued, its continue not yet noted (a continue still pending is waited
    /// for, however long a busy machine keeps the thread that notes it from running).
    pub fn passed(&self) -> bool {
        if self.waited() < self.limit {
            return false;
        }
        let looked = Instant::now();
        while continue_pending() && looked.elapsed() < NOTING_LIMIT {
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(SECOND_LOOK);
        self.waited() >= self.limit
    }
}

/// How long [`Deadline::passed`] waits at most for a pending continue to be noted.
const NOTING_LIMIT: Duration = Duration::from_secs(10);

/// Whether a SIGCONT waits to be taken (blocked, as [`counts_continues`] blocks it, it stays
/// pending until its thread takes it).
fn continue_pending() -> bool {
    // SAFETY: sigpending fills the zeroed set it is given; sigismember reads it.
    unsafe {
        let mut pending = std::mem::zeroed::<libc::sigset_t>();
        libc::sigpending(&mut pending) == 0 && libc::sigismember(&pending, libc::SIGCONT) == 1
    }
}

/// Held by the tests that note continues: a continue reaches every deadline of the process, so
/// two such tests side by side would reach each other's. (They note continues themselves: the
/// test harness's threads do not block SIGCONT, so one of them could take a real one.)
#[cfg(test)]
pub(crate) static NOTING_CONTINUES: Mutex<()> = Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_continue_not_yet_taken_is_seen_pending() {
        // In a thread of its own, which alone blocks SIGCONT and is sent it.
        std::thread::spawn(|| {
            // SAFETY: a set of SIGCONT alone, blocked in this thread, sent to it and taken.
            unsafe {
                let mut set = std::mem::zeroed::<libc::sigset_t>();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, libc::SIGCONT);
                libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
                assert!(!continue_pending());
                libc::pthread_kill(libc::pthread_self(), libc::SIGCONT);
                assert!(continue_pending());
                let none = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                assert_eq!(
                    libc::sigtimedwait(&set, std::ptr::null_mut(), &none),
                    libc::SIGCONT
                );
                assert!(!continue_pending());
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_continue_restarts_the_allowance_and_a_silence_after_it_still_passes() {
        let _alone = NOTING_CONTINUES.lock();
        let limit = Duration::from_millis(300);
        let deadline = Deadline::after(limit);
        std::thread::sleep(limit + Duration::from_millis(100));
        note_continue();
        let continued = last_continue().expect("noted");
        assert!(continued.elapsed() < Duration::from_secs(1));
        assert!(deadline.waited() < limit, "{:?}", deadline.waited());
        assert!(deadline.left() > Duration::ZERO);
        assert!(!deadline.passed());
        assert!(deadline.at() >= continued + limit);
        std::thread::sleep(limit);
        assert!(deadline.passed(), "silent for its limit after the continue");

        // A deadline that starts after the last continue counts from its start.
        let later = Deadline::after(Duration::from_secs(1));
        assert!(!later.passed());
        std::thread::sleep(Duration::from_millis(1100));
        assert!(later.passed());
        assert_eq!(later.limit(), Duration::from_secs(1));
    }
}
