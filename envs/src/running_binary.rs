//! The binary this process runs, which starts its worker processes (and, in the trainer, its
//! ranks and sweep jobs) as processes of its own.
use std::path::PathBuf;

/// The running binary's path. When a rebuild has replaced the file since it started (a `cargo
/// build` during a long job), the path names the new build; the running one, which a worker or
/// a restarted rank must run beside processes still running it, is then only reachable as
/// `/proc/self/exe`.
pub fn path() -> std::io::Result<PathBuf> {
    let path = std::env::current_exe()?;
    let replaced = path.to_string_lossy().ends_with(" (deleted)");
    let running = PathBuf::from("/proc/self/exe");
    Ok(if replaced && running.exists() {
        running
    } else {
        path
    })
}
