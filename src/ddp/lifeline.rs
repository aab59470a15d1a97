//! A rank started by the built-in launcher (or torchrun's agent) dies with it. Without this, a launcher killed by
//! SIGKILL or the OOM killer leaves its ranks training as orphans, each failing later on a
//! broken output pipe with no checkpoint.
//!
//! The kernel sends the rank SIGHUP when its parent dies (`PR_SET_PDEATHSIG`). A SIGHUP while
//! the launcher lives is a terminal's hangup sent to the whole process group (an ssh session
//! that ends under `nohup tdmpc2 train ...`): the launcher decides for its ranks, so the rank
//! ignores it. Otherwise its handler
//! points stdout and stderr at /dev/null (the pipes to the launcher are broken, and a write
//! there would fail) and calls the rank's `on_orphaned` (the trainer passes its stop request, so
//! the rank stops the way Ctrl-C stops it: every rank agrees at the next step and rank 0 writes a
//! checkpoint). A watchdog makes sure of the rest: once the launcher is gone
//! it ends the process after a short grace period.
use std::os::fd::IntoRawFd;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use crate::error::{Error, Result};

/// The launcher's pid, as it passes it to the ranks it starts.
pub const LAUNCHER_PID_ENV: &str = "TDMPC2_LAUNCHER_PID";

/// Set by torchrun's agent for the workers it starts.
const TORCHRUN_RUN_ID_ENV: &str = "TORCHELASTIC_RUN_ID";

const POLL: Duration = Duration::from_millis(200);

/// Binds this process's life to the launcher that started it: ours, named in the environment,
/// or torchrun's agent (nothing to do for a process neither started). `on_orphaned` runs when
/// the launcher dies, in a signal handler too: it must be async-signal-safe (store to an
/// atomic, nothing more). An orphaned rank gets
/// `grace` (the run's `stop_grace`) to agree on a step with the others and checkpoint before it
/// is ended.
pub fn bind_to_launcher(on_orphaned: fn(), grace: Duration) -> Result<()> {
    let Some(launcher) = bound_launcher()? else {
        return Ok(());
    };
    // A second binding keeps the first callback: one process has one launcher.
    if ON_ORPHANED.set(on_orphaned).is_err() {
        return Err(Error::Other(
            "this rank is already bound to its launcher".into(),
        ));
    }
    // Our launcher decides for its ranks on a hangup while it lives; torchrun's agent passes
    // on the one it got (or its own shutdown) as SIGHUP, which stays a stop, as on any rank.
    if let Launcher::Ours = launcher.kind {
        let null = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .map_err(|e| Error::io("open /dev/null", e))?;
        NULL_FD.store(null.into_raw_fd(), Ordering::SeqCst);
        LAUNCHER.store(launcher.pid, Ordering::SeqCst);
        // SAFETY: the handler calls dup2, loads an atomic (ON_ORPHANED, set above) and calls
        // `on_orphaned`, which this function's contract requires to be async-signal-safe.
        unsafe { libc::signal(libc::SIGHUP, orphaned as *const () as libc::sighandler_t) };
    }
    signal_when_parent_dies(libc::SIGHUP, "SIGHUP")?;
    // The launcher may have died before the request above: then it is not the parent anymore.
    if parent() != launcher.pid {
        return Err(Error::Other(format!(
            "the launcher (pid {}) exited before this rank started",
            launcher.pid
        )));
    }
    std::thread::Builder::new()
        .name("launcher-watch".into())
        .spawn(move || watch(launcher.pid, grace))
        .map_err(|e| Error::io("start the launcher watchdog", e))?;
    Ok(())
}

#[derive(Debug, Clone, Copy)]
enum Launcher {
    /// The built-in launcher (or a sweep), named in the environment.
    Ours,
    /// torchrun's agent.
    Torchrun,
}

#[derive(Debug, Clone, Copy)]
struct Bound {
    pid: libc::pid_t,
    kind: Launcher,
}

/// The launcher this rank dies with: ours, named in the environment, or torchrun's agent, its
/// parent (`--no-python`). torchrun starts its workers in sessions of their own and binds them
/// to nothing: an agent killed (SIGKILL, the OOM killer) would leave them training unwatched,
/// holding their GPUs and the run directory's lock.
fn bound_launcher() -> Result<Option<Bound>> {
    if let Some(value) = std::env::var_os(LAUNCHER_PID_ENV) {
        let pid = parse_pid(&value.to_string_lossy())?;
        return Ok(Some(Bound {
            pid,
            kind: Launcher::Ours,
        }));
    }
    Ok(std::env::var_os(TORCHRUN_RUN_ID_ENV).map(|_| Bound {
        pid: parent(),
        kind: Launcher::Torchrun,
    }))
}

/// A launcher started by another process of ours (a sweep's job) is asked to stop when that
/// process dies (SIGTERM, which it takes as a stop: its ranks checkpoint and end) instead of
/// running on unwatched, its output going nowhere. Nothing to do for a launcher started by hand.
pub fn stop_when_parent_dies() -> Result<()> {
    let Some(value) = std::env::var_os(LAUNCHER_PID_ENV) else {
        return Ok(());
    };
    let starter = parse_pid(&value.to_string_lossy())?;
    signal_when_parent_dies(libc::SIGTERM, "SIGTERM")?;
    if parent() != starter {
        return Err(Error::Stopped(format!(
            "the process that started this launcher (pid {starter}) exited before it started"
        )));
    }
    Ok(())
}

/// Whether process `pid` of this host exists (one of another user's too).
pub fn is_alive(pid: libc::pid_t) -> bool {
    // SAFETY: signal 0 sends nothing; it asks whether the process exists.
    let found = unsafe { libc::kill(pid, 0) } == 0;
    found || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// `command`'s process gets SIGTERM when this one ends, however it ends (a helper process of
/// a bench or of the doctor must not outlive it); one whose start this process did not outlive
/// is not started.
pub fn ends_with_this_process(command: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    let this = std::process::id();
    // SAFETY: prctl(2) and getppid(2) in the child between fork and exec, async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            match libc::getppid() as u32 == this {
                true => Ok(()),
                false => Err(std::io::Error::other("its parent ended during the start")),
            }
        });
    }
}

/// Asks the kernel for `signal` when this process's parent dies (the caller then checks that
/// the parent it expects is still the one).
fn signal_when_parent_dies(signal: libc::c_int, name: &str) -> Result<()> {
    // SAFETY: prctl with PR_SET_PDEATHSIG takes a signal number and changes nothing else.
    let set = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, signal as libc::c_ulong) };
    match set {
        0 => Ok(()),
        _ => Err(Error::io(
            format!("ask for {name} when the parent process dies (prctl)"),
            std::io::Error::last_os_error(),
        )),
    }
}

fn parse_pid(value: &str) -> Result<libc::pid_t> {
    value
        .trim()
        .parse()
        .ok()
        .filter(|pid: &libc::pid_t| *pid > 0)
        .ok_or_else(|| Error::Config(format!("{LAUNCHER_PID_ENV}={value} is not a process id")))
}

fn parent() -> libc::pid_t {
    // SAFETY: getppid cannot fail.
    unsafe { libc::getppid() }
}

/// The launcher's pid, stored before the handler is installed.
static LAUNCHER: AtomicI32 = AtomicI32::new(0);

/// /dev/null, opened before the handler may need it.
static NULL_FD: AtomicI32 = AtomicI32::new(-1);

/// What the rank does when its launcher dies, set before the handler is installed (reading it
/// afterwards is one atomic load).
static ON_ORPHANED: OnceLock<fn()> = OnceLock::new();

extern "C" fn orphaned(_: libc::c_int) {
    // getppid is async-signal-safe; the kernel reparents a rank before it signals the death.
    if parent() == LAUNCHER.load(Ordering::SeqCst) {
        return;
    }
    let null = NULL_FD.load(Ordering::SeqCst);
    if null >= 0 {
        for fd in [libc::STDOUT_FILENO, libc::STDERR_FILENO] {
            // SAFETY: dup2 is async-signal-safe; `null` stays open for the process's life.
            unsafe { libc::dup2(null, fd) };
        }
    }
    if let Some(on_orphaned) = ON_ORPHANED.get() {
        on_orphaned();
    }
}

fn watch(launcher: libc::pid_t, grace: Duration) {
    while parent() == launcher {
        std::thread::sleep(POLL);
    }
    // SAFETY: a handler is installed, or the signal ignored (nohup); raising it again is
    // harmless if the kernel already did.
    unsafe { libc::raise(libc::SIGHUP) };
    // Also where no handler of ours takes the hangup (ignored under nohup, or torchrun's
    // rank's): the stop is asked for all the same.
    if let Some(on_orphaned) = ON_ORPHANED.get() {
        on_orphaned();
    }
    let grace = envs::deadline::Deadline::after(grace);
    while !grace.passed() {
        std::thread::sleep(POLL);
    }
    // SAFETY: ends the process at once, as the launcher's SIGKILL would have.
    unsafe { libc::_exit(1) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_launcher_pid_must_be_a_process_id() {
        assert_eq!(parse_pid(" 42\n").unwrap(), 42);
        for bad in ["x1", "", "0", "-3"] {
            let e = parse_pid(bad).unwrap_err().to_string();
            assert!(e.contains(&format!("TDMPC2_LAUNCHER_PID={bad}")), "{e}");
        }
    }
}
