//! Ctrl-Z stops the running jobs with the sweep, and `fg` continues them. Each job runs in a
//! process group of its own (so that Ctrl-C reaches the sweep alone), where a terminal's
//! suspension does not reach it: left running, a job would fill the pipes of the stopped sweep
//! with its output and block, and its other ranks would fail waiting for it.
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Instant;

/// The process groups of the running jobs (0: a free slot). A fixed array: the handler may
/// neither allocate nor lock.
static JOB_GROUPS: [AtomicI32; 1024] = [const { AtomicI32::new(0) }; 1024];

/// From here on, Ctrl-Z (SIGTSTP) stops every registered job's processes, then the sweep.
pub(super) fn stop_jobs_on_suspend() {
    // SAFETY: the handler reads atomics and calls kill and getpid: async-signal-safe.
    unsafe { libc::signal(libc::SIGTSTP, on_suspend as *const () as libc::sighandler_t) };
}

extern "C" fn on_suspend(_: libc::c_int) {
    for group in &JOB_GROUPS {
        let group = group.load(Ordering::SeqCst);
        if group > 0 {
            // SAFETY: kill(2) of a job's process group, which this sweep started.
            unsafe { libc::kill(-group, libc::SIGSTOP) };
        }
    }
    // SAFETY: stops this process once the handler returns, as SIGTSTP's default action would.
    unsafe { libc::kill(libc::getpid(), libc::SIGSTOP) };
}

/// A running job's process group, stopped with the sweep while this lives, and continued after
/// it by [`Self::continue_if_the_sweep_did`].
pub(super) struct SuspendedWithTheSweep {
    group: libc::pid_t,
    slot: Option<usize>,
    continued: Option<Instant>,
}

impl SuspendedWithTheSweep {
    /// Registers the job whose process group is `group` (beyond 1024 jobs at once, a job is
    /// left to run on while the sweep is stopped).
    pub(super) fn register(group: libc::pid_t) -> Self {
        let slot = JOB_GROUPS.iter().position(|slot| {
            slot.compare_exchange(0, group, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        });
        Self {
            group,
            slot,
            continued: envs::deadline::last_continue(),
        }
    }

    /// Continues the job if the sweep continued since the last look.
    pub(super) fn continue_if_the_sweep_did(&mut self) {
        let continued = envs::deadline::last_continue();
        if continued != self.continued {
            self.continued = continued;
            // SAFETY: kill(2) of the job's process group, which this sweep started.
            unsafe { libc::kill(-self.group, libc::SIGCONT) };
        }
    }
}

impl Drop for SuspendedWithTheSweep {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            JOB_GROUPS[slot].store(0, Ordering::SeqCst);
        }
    }
}
