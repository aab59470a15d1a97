//! Stopping on Ctrl-C or SIGTERM: the handler only sets a flag; the training loop checks it
//! between steps, agreeing across ranks so that every rank stops at the same step (and rank 0
//! can write a checkpoint while the collectives still line up).
use std::sync::atomic::{AtomicBool, Ordering};

use tch::{Kind, Tensor};

use crate::dist::ProcessGroup;
use crate::error::Result;

static REQUESTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    request();
}

/// Asks the training loop to stop, as Ctrl-C does. Async-signal-safe: one atomic store.
pub fn request() {
    REQUESTED.store(true, Ordering::SeqCst);
}

pub fn install_handlers() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
}

/// Whether any rank was asked to stop (one tiny all-reduce when there are several ranks).
pub fn requested(group: &ProcessGroup) -> Result<bool> {
    let local = REQUESTED.load(Ordering::SeqCst);
    if group.world_size() == 1 {
        return Ok(local);
    }
    let mut flag = Tensor::from_slice(&[local as u8 as f32]).to_kind(Kind::Float);
    group.all_reduce_sum(&mut flag)?;
    Ok(flag.double_value(&[0]) > 0.0)
}
