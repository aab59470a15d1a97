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

/// Starts [`peak_bytes`] over from the memory resident now (Linux 4.0 and later).
pub fn reset_peak() -> Result<()> {
    std::fs::write("/proc/self/clear_refs", "5")
        .map_err(|e| Error::io("reset the peak (clear_refs)", e))
}

/// Memory the system can still give (`MemAvailable` of /proc/meminfo), in bytes.
pub fn available_bytes() -> Result<f64> {
    let info =
        std::fs::read_to_string("/proc/meminfo").map_err(|e| Error::io("read /proc/meminfo", e))?;
    kib_field(&info, "MemAvailable")
        .map(|k| k * 1024.0)
        .ok_or_else(|| Error::Other("no MemAvailable in /proc/meminfo".into()))
}

fn kib_field(text: &str, field: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

fn status_kib(field: &str) -> Result<f64> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| Error::io("read /proc/self/status", e))?;
    kib_field(&status, field)
        .ok_or_else(|| Error::Other(format!("no {field} in /proc/self/status")))
}
