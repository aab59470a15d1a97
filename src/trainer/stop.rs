//! Stopping on Ctrl-C, SIGTERM or a hangup: the handler only sets a flag; the training loop
//! checks it between steps, agreeing across ranks so that every rank stops at the same step (and
//! rank 0 can write a checkpoint while the collectives still line up). A process no launcher
//! started ends at once on a second Ctrl-C a moment after the first (a stop that hangs: a
//! tracker's network, a silent worker), as the launcher kills its ranks then.
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, Ordering};

use tch::{Kind, Tensor};

use crate::ddp::ProcessGroup;
use crate::error::Result;
use crate::terminal::{is_second_request, monotonic_ms};

/// Why a rank asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Ctrl-C, SIGTERM, or a hangup (the terminal closed).
    Signal = 1,
    /// The built-in launcher that started the rank died (see `ddp::lifeline`).
    LauncherLost = 2,
}

impl Reason {
    fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Self::Signal),
            2 => Some(Self::LauncherLost),
            _ => None,
        }
    }
}

/// The stop the ranks agreed on: the lowest rank that asked, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopRequest {
    pub rank: usize,
    /// The node of that rank (ranks are numbered node by node).
    pub node: usize,
    pub reason: Reason,
}

impl std::fmt::Display for StopRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self { rank, node, .. } = self;
        match self.reason {
            Reason::Signal => write!(
                f,
                "rank {rank} (node {node}) got Ctrl-C, SIGTERM or a hangup"
            ),
            Reason::LauncherLost => write!(
                f,
                "the launcher of rank {rank} went away: node {node} was stopped or killed"
            ),
        }
    }
}

/// This process's request: 0 for none, else a `Reason` code (the first one stays).
static REQUESTED: AtomicU8 = AtomicU8::new(0);

/// When the first signal came (monotonic ms; 0: none yet).
static FIRST_SIGNAL_MS: AtomicI64 = AtomicI64::new(0);
/// Whether a second request ends the process (none of our launchers decides for it).
static SECOND_REQUEST_ENDS: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(signal: libc::c_int) {
    let now = monotonic_ms();
    let first = FIRST_SIGNAL_MS.compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst);
    if let Err(first) = first {
        let again = is_second_request(signal, first, now);
        if SECOND_REQUEST_ENDS.load(Ordering::SeqCst) && again {
            end_as_by_default(signal);
        }
    }
    request(Reason::Signal);
}

/// Asks the training loop to stop. Async-signal-safe: one lock-free atomic operation.
pub fn request(reason: Reason) {
    let _ = REQUESTED.compare_exchange(0, reason as u8, Ordering::SeqCst, Ordering::SeqCst);
}

/// Ctrl-C, SIGTERM and a hangup (unless `nohup` ignores it) ask the run to stop. A rank of the
/// built-in launcher takes SIGHUP as its launcher's death ([`crate::ddp::lifeline`]).
pub fn install_handlers() {
    // A launcher of ours, torchrun's or an srun step decides for its ranks when to kill them.
    let launched = [
        crate::ddp::lifeline::LAUNCHER_PID_ENV,
        "RANK",
        "SLURM_STEP_ID",
    ]
    .iter()
    .any(|var| std::env::var_os(var).is_some());
    SECOND_REQUEST_ENDS.store(!launched, Ordering::SeqCst);
    let handler = on_signal as *const () as libc::sighandler_t;
    let hangup = !crate::terminal::hangup_ignored();
    // SAFETY: the handler stores to atomics, and on a second request restores the default
    // action and raises the signal again: all async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
        if hangup {
            libc::signal(libc::SIGHUP, handler);
        }
    }
}

/// Ctrl-C and SIGTERM end the process at once, as by default, but through a handler of ours:
/// first thing in `main`, before any Python runs. An embedded Python that imports `signal`
/// takes over a SIGINT left at its default, and then turns a Ctrl-C into a KeyboardInterrupt
/// raised in whatever Python code runs next: a traceback and exit 1, or no stop at all while
/// none runs. The handler removes the files being written (`partial_files`) first. A signal
/// ignored from the start (an environment worker's SIGINT) stays ignored.
pub fn end_at_once_on_signals() {
    let handler = end_at_once as *const () as libc::sighandler_t;
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: sigaction with a null new action only reads the current one into
        // `current`; the handler's calls are async-signal-safe.
        unsafe {
            let mut current: libc::sigaction = std::mem::zeroed();
            let read = libc::sigaction(signal, std::ptr::null(), &mut current);
            if read == 0 && current.sa_sigaction != libc::SIG_IGN {
                libc::signal(signal, handler);
            }
        }
    }
}

extern "C" fn end_at_once(signal: libc::c_int) {
    end_as_by_default(signal);
}

/// Ends the process from a handler of `signal` as the signal's default action would, the files
/// being written removed first. The process of a PID namespace's init (a container's entry
/// point) is not ended by its own signal: it exits with the shell's code for one, 128 + the
/// signal. Only unlink, signal, sigprocmask, raise and _exit: all async-signal-safe.
fn end_as_by_default(signal: libc::c_int) {
    crate::partial_files::remove_all();
    // SAFETY: as said above; a handler runs with its signal blocked, so it is unblocked for
    // the raise to act at once.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
        let mut set = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signal);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(signal);
        libc::_exit(128 + signal);
    }
}

/// Puts back the default actions of what [`install_handlers`] watches, for a launcher, whose
/// own watch runs the signals' handlers that were there before it.
pub fn restore_default_handlers() {
    let hangup = !crate::terminal::hangup_ignored();
    // SAFETY: setting a signal's default action has no preconditions.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
        libc::signal(libc::SIGTERM, libc::SIG_DFL);
        if hangup {
            libc::signal(libc::SIGHUP, libc::SIG_DFL);
        }
    }
}

/// [`install_handlers`] for the life of this guard; the handlers before are restored after (a
/// tool's long step in a process that otherwise ends on a signal).
pub struct HandlersForNow([libc::sighandler_t; 2]);

pub fn install_handlers_for_now() -> HandlersForNow {
    let handler = on_signal as *const () as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        HandlersForNow([
            libc::signal(libc::SIGINT, handler),
            libc::signal(libc::SIGTERM, handler),
        ])
    }
}

impl Drop for HandlersForNow {
    fn drop(&mut self) {
        // SAFETY: puts back the handlers `signal` returned.
        unsafe {
            libc::signal(libc::SIGINT, self.0[0]);
            libc::signal(libc::SIGTERM, self.0[1]);
        }
    }
}

/// Whether this process was asked to stop (no collective: for leaving long work early, before
/// the next [`requested`] agrees on it).
pub fn requested_here() -> bool {
    REQUESTED.load(Ordering::SeqCst) != 0
}

/// The error that ends a run asked to stop before it began (before it claimed its run
/// directory or met the other ranks): nothing was written.
pub fn refuse_to_start_when_asked() -> Result<()> {
    match requested_here() {
        true => Err(crate::error::Error::Stopped(
            "stopped before the run started (Ctrl-C, SIGTERM or a hangup): nothing was written"
                .into(),
        )),
        false => Ok(()),
    }
}

/// Whether any rank asked to stop, agreed by all (one tiny all-gather when there is a group).
pub fn requested(group: &ProcessGroup) -> Result<Option<StopRequest>> {
    let local = [
        REQUESTED.load(Ordering::SeqCst) as f32,
        group.info().local_rank as f32,
    ];
    let gathered = group.all_gather(&Tensor::from_slice(&local).to_kind(Kind::Float))?;
    let gathered = Vec::<f32>::try_from(gathered)?;
    let ranks: Vec<(u8, usize)> = gathered
        .chunks_exact(2)
        .map(|pair| (pair[0] as u8, pair[1] as usize))
        .collect();
    Ok(first_request(&ranks))
}

/// The first rank's request among `(code, local rank)` of every rank in rank order. Its node is
/// counted from the nodes' first ranks before it, since nodes may run different numbers of ranks
/// (SLURM's `--ntasks` over uneven nodes).
fn first_request(ranks: &[(u8, usize)]) -> Option<StopRequest> {
    let mut nodes_started = 0;
    ranks
        .iter()
        .enumerate()
        .find_map(|(rank, &(code, local_rank))| {
            nodes_started += usize::from(local_rank == 0);
            Reason::from_code(code).map(|reason| StopRequest {
                rank,
                node: nodes_started.saturating_sub(1),
                reason,
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_names_the_rank_its_node_and_why() {
        let lost = StopRequest {
            rank: 5,
            node: 1,
            reason: Reason::LauncherLost,
        };
        assert_eq!(
            lost.to_string(),
            "the launcher of rank 5 went away: node 1 was stopped or killed"
        );
        for reason in [Reason::Signal, Reason::LauncherLost] {
            assert_eq!(Reason::from_code(reason as u8), Some(reason));
        }
        assert_eq!(Reason::from_code(0), None);
    }

    #[test]
    fn a_request_is_placed_on_its_node_when_nodes_run_uneven_numbers_of_ranks() {
        // Three ranks on node 0, one on node 1, two on node 2; rank 4 (node 2) asks.
        let local_ranks = [0, 1, 2, 0, 0, 1];
        let ranks: Vec<(u8, usize)> = local_ranks
            .iter()
            .enumerate()
            .map(|(rank, &local)| (if rank >= 4 { 2 } else { 0 }, local))
            .collect();
        let request = first_request(&ranks).expect("rank 4 asked");
        assert_eq!((request.rank, request.node), (4, 2));
        assert_eq!(request.reason, Reason::LauncherLost);
        assert_eq!(first_request(&[(0, 0), (0, 1)]), None);
    }
}
