//! Stopping on Ctrl-C or SIGTERM: the handler only sets a flag; the training loop checks it
//! between steps, agreeing across ranks so that every rank stops at the same step (and rank 0
//! can write a checkpoint while the collectives still line up).
use std::sync::atomic::{AtomicU8, Ordering};

use tch::{Kind, Tensor};

use crate::ddp::ProcessGroup;
use crate::error::Result;

/// Why a rank asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Ctrl-C or SIGTERM.
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
            Reason::Signal => write!(f, "rank {rank} (node {node}) got Ctrl-C or SIGTERM"),
            Reason::LauncherLost => write!(
                f,
                "the launcher of rank {rank} went away: node {node} was stopped or killed"
            ),
        }
    }
}

/// This process's request: 0 for none, else a `Reason` code (the first one stays).
static REQUESTED: AtomicU8 = AtomicU8::new(0);

extern "C" fn on_signal(_: libc::c_int) {
    request(Reason::Signal);
}

/// Asks the training loop to stop. Async-signal-safe: one lock-free atomic operation.
pub fn request(reason: Reason) {
    let _ = REQUESTED.compare_exchange(0, reason as u8, Ordering::SeqCst, Ordering::SeqCst);
}

pub fn install_handlers() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
}

/// Whether this process was asked to stop (no collective: for leaving long work early, before
/// the next [`requested`] agrees on it).
pub fn requested_here() -> bool {
    REQUESTED.load(Ordering::SeqCst) != 0
}

/// Whether any rank asked to stop, agreed by all (one tiny all-gather when there is a group).
pub fn requested(group: &ProcessGroup) -> Result<Option<StopRequest>> {
    let local = REQUESTED.load(Ordering::SeqCst);
    let codes = group.all_gather(&Tensor::from_slice(&[local as f32]).to_kind(Kind::Float))?;
    let codes = Vec::<f32>::try_from(codes)?;
    let ranks_per_node = group.info().local_world_size.max(1);
    Ok(codes.iter().enumerate().find_map(|(rank, &code)| {
        Reason::from_code(code as u8).map(|reason| StopRequest {
            rank,
            node: rank / ranks_per_node,
            reason,
        })
    }))
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
}
