//! Deadlines that a stop of the whole job does not use up.
//!
//! Ctrl-Z, `kill -STOP` of a process group and a scheduler's suspension (SLURM's `scontrol
//! suspend`) stop every process of a job together, for minutes or hours, while the monotonic
//! clock runs on. A wait for another process timed by that clock alone would find its limit
//! passed the moment the job continues, before the other process had run at all. A process
//! that [`counts_continues`] restarts every deadline's allowance at the last continue
//! (SIGCONT), so a process that really went silent is still caught, within the limit of the job
//! running again.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The last SIGCONT, in nanoseconds of `CLOCK_MONOTONIC` (0: none yet).
static LAST_CONTINUE_NS: AtomicU64 = AtomicU64::new(0);

/// One reading of both clocks, to turn the handler's nanoseconds into an [`Instant`] (which
/// reads the same `CLOCK_MONOTONIC` on Linux).
static ORIGIN: OnceLock<(Instant, u64)> = OnceLock::new();

/// How long [`Deadline::passed`] waits before it looks again: a process's waiting thread can
/// wake the instant the job continues, before another thread has run the SIGCONT handler.
const SECOND_LOOK: Duration = Duration::from_millis(250);

/// Notes every continue of this process from now on (installs a SIGCONT handler; continuing
/// itself is the kernel's and stays as it is). Call once, early, in every process that waits
/// on another with a limit.
pub fn counts_continues() -> std::io::Result<()> {
    ORIGIN.get_or_init(|| (Instant::now(), monotonic_ns()));
    let handler = on_continue as *const () as libc::sighandler_t;
    // SAFETY: the handler reads the monotonic clock and stores to an atomic: async-signal-safe.
    if unsafe { libc::signal(libc::SIGCONT, handler) } == libc::SIG_ERR {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

extern "C" fn on_continue(_: libc::c_int) {
    LAST_CONTINUE_NS.store(monotonic_ns(), Ordering::SeqCst);
}

fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// When this process last continued after a stop, if it has since [`counts_continues`].
pub fn last_continue() -> Option<Instant> {
    let at = LAST_CONTINUE_NS.load(Ordering::SeqCst);
    let (origin, origin_ns) = ORIGIN.get()?;
    (at != 0).then(|| *origin + Duration::from_nanos(at.saturating_sub(*origin_ns)))
}

/// How long a wait that began at `start` has lasted while the job ran: the time since `start`,
/// or since the last continue if that came later.
pub fn waited_since(start: Instant) -> Duration {
    counted_from(start).elapsed()
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
        Self::from(Instant::now(), limit)
    }

    /// A deadline `limit` after `start`.
    pub fn from(start: Instant, limit: Duration) -> Self {
        Self { start, limit }
    }

    pub fn limit(&self) -> Duration {
        self.limit
    }

    /// How long the wait has lasted, as [`waited_since`] counts it.
    pub fn waited(&self) -> Duration {
        waited_since(self.start)
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
    /// may just have continued, with the handler not yet run.
    pub fn passed(&self) -> bool {
        if self.waited() < self.limit {
            return false;
        }
        std::thread::sleep(SECOND_LOOK);
        self.waited() >= self.limit
    }
}

/// Held by the tests that raise SIGCONT: a continue reaches every deadline of the process, so
/// two such tests side by side would reach each other's.
#[cfg(test)]
pub(crate) static RAISING_SIGCONT: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_continue_restarts_the_allowance_and_a_silence_after_it_still_passes() {
        let _alone = RAISING_SIGCONT.lock();
        counts_continues().unwrap();
        let limit = Duration::from_millis(300);
        let deadline = Deadline::after(limit);
        std::thread::sleep(limit + Duration::from_millis(100));
        // SAFETY: raising SIGCONT at a running process only runs its handler.
        unsafe { libc::raise(libc::SIGCONT) };
        let continued = last_continue().expect("the handler ran");
        assert!(continued.elapsed() < Duration::from_secs(1));
        assert!(deadline.waited() < limit, "{:?}", deadline.waited());
        assert!(deadline.left() > Duration::ZERO);
        assert!(!deadline.passed());
        assert!(deadline.at() >= continued + limit);
        std::thread::sleep(limit);
        assert!(deadline.passed(), "silent for its limit after the continue");

        // A deadline that starts after the last continue counts from its start.
        let later = Deadline::after(Duration::from_millis(50));
        assert!(!later.passed());
        std::thread::sleep(Duration::from_millis(100));
        assert!(later.passed());
        assert_eq!(later.limit(), Duration::from_millis(50));
    }
}
