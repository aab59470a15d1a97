//! This very binary, which starts ranks, environment workers and sweep runs as processes of
//! its own.
use std::path::PathBuf;

use crate::error::{Error, Result};

/// The binary this process runs. When a rebuild has replaced the file since it started (a
/// `cargo build` during a long job), the path names the new build; the running one, which a
/// restart must run again beside ranks that are still running it, is then only reachable as
/// `/proc/self/exe`.
pub fn path() -> Result<PathBuf> {
    let path = std::env::current_exe().map_err(|e| Error::io("locate the tdmpc2 binary", e))?;
    let replaced = path.to_string_lossy().ends_with(" (deleted)");
    let running = PathBuf::from("/proc/self/exe");
    Ok(if replaced && running.exists() {
        running
    } else {
        path
    })
}
