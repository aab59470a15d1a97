//! What this process holds in memory, as Linux reports it (/proc/self/status).
use crate::error::{Error, Result};

/// Resident memory now, in bytes (`VmRSS`).
pub fn resident_bytes() -> Result<f64> {
    status_kib("VmRSS").map(|k| k * 1024.0)
}

/// The most resident memory so far, in bytes (`VmHWM`).
pub fn peak_bytes() -> Result<f64> {
    status_kib("VmHWM").map(|k| k * 1024.0)
}

fn status_kib(field: &str) -> Result<f64> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| Error::io("read /proc/self/status", e))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| Error::Other(format!("no {field} in /proc/self/status")))
}
