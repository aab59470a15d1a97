//! Ctrl-Z stops the running jobs with the sweep, and `fg` continues them. Each job runs in a
//! process group of its own (so that Ctrl-C reaches the sweep alone), where a terminal's
//! suspension does not reach it: left running, a job would fill the pipes of the stopped sweep
//! with its output and block, and its other ranks would fail waiting for it.
use std::sync::atomic::{AtomicI32, Ordering};

/// The process groups of the running jobs (0: a free slot). A fixed array: the handler may
/// neither allocate nor lock.
static JOB_GROUPS: [AtomicI32; 1024] = [const { AtomicI32::new(0) }; 1024];

/// The terminal's stop signals: Ctrl-Z, and a background sweep reading or writing the
/// terminal (`stty tostop`).
const STOP_SIGNALS: [libc::c_int; 3] = [libc::SIGTSTP, libc::SIGTTIN, libc::SIGTTOU];

/// From here on, the terminal's stop signals stop every registered job with the sweep.
pub(super) fn stop_jobs_with_the_sweep() {
    for signal in STOP_SIGNALS {
        install(signal);
    }
}

/// The handler for `signal`, with every stop signal blocked while it runs (a second Ctrl-Z, or
/// SIGTTOU during a SIGTSTP, waits for the first to end).
fn install(signal: libc::c_int) {
    // SAFETY: a zeroed sigaction filled in below; the handler is async-signal-safe (see there).
    unsafe {
        let mut action = std::mem::zeroed::<libc::sigaction>();
        action.sa_sigaction = on_stop as *const () as libc::sighandler_t;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        for blocked in STOP_SIGNALS {
            libc::sigaddset(&mut action.sa_mask, blocked);
        }
        libc::sigaction(signal, &action, std::ptr::null_mut());
    }
}

/// Stops the jobs, then this process by the signal's own default action (which the kernel
/// drops in an orphaned process group: the jobs are continued at once then), and continues the
/// jobs when this process continues. Only kill, signal, sigaction, sigprocmask and raise: all
/// async-signal-safe; errno is kept for the interrupted code.
extern "C" fn on_stop(signal: libc::c_int) {
    // SAFETY: errno is this thread's; read and restored around the calls below.
    let errno = unsafe { *libc::__errno_location() };
    signal_jobs(libc::SIGSTOP);
    // SAFETY: the default action for this signal, unblocked (a handler runs with its signal
    // blocked), raised: the process stops here until it is continued; then the handler is put
    // back for the next stop.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
        let mut set = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signal);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(signal);
    }
    install(signal);
    signal_jobs(libc::SIGCONT);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

fn signal_jobs(signal: libc::c_int) {
    for group in &JOB_GROUPS {
        let group = group.load(Ordering::SeqCst);
        if group > 0 {
            // SAFETY: kill(2) of a job's process group, which this sweep started.
            unsafe { libc::kill(-group, signal) };
        }
    }
}

/// A running job's process group, stopped and continued with the sweep while this lives.
pub(super) struct StoppedWithTheSweep(Option<usize>);

impl StoppedWithTheSweep {
    /// Registers the job whose process group is `group` (beyond 1024 jobs at once, a job is
    /// left to run on while the sweep is stopped).
    pub(super) fn register(group: libc::pid_t) -> Self {
        Self(JOB_GROUPS.iter().position(|slot| {
            slot.compare_exchange(0, group, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        }))
    }
}

impl Drop for StoppedWithTheSweep {
    fn drop(&mut self) {
        if let Some(slot) = self.0 {
            JOB_GROUPS[slot].store(0, Ordering::SeqCst);
        }
    }
}
