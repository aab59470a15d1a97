//! What this process holds in memory, as Linux reports it (/proc/self/status), and what it
//! says when torch finds none left.
use crate::error::{Error, Result};

/// The exit code of a process that ran out of memory: a failure, which the settings may cure.
pub const EXHAUSTED_EXIT: i32 = 1;

/// Reports a panic of torch running out of memory (tch raises torch's errors as panics on the
/// hot path) as one line naming the settings that size memory, in place of Rust's report; the
/// panic then unwinds as any other (dropping what ends trackers' runs and releases locks), and
/// the process exits with [`EXHAUSTED_EXIT`] once it reaches `main` (see [`is_exhaustion`]).
/// Other panics keep Rust's report, as bugs.
pub fn report_exhaustion_panics() {
    let rust_report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        match exhaustion(text_of(info.payload())) {
            Some(what) => errln!(
                "error: out of memory: {what}; lower the settings that size memory (num_envs, \
             eval_episodes, batch_size, horizon, num_samples, model_size), or give the process \
             more memory"
            ),
            None => rust_report(info),
        }
    }));
}

/// Whether a panic's payload is torch running out of memory (already reported by the hook).
pub fn is_exhaustion(payload: &(dyn std::any::Any + Send)) -> bool {
    exhaustion(text_of(payload)).is_some()
}

fn text_of(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or_default()
}

/// torch's words for memory it could not get, in one line, if `panic` is about that.
fn exhaustion(panic: &str) -> Option<String> {
    const SIGNS: [&str; 2] = ["can't allocate memory", "out of memory"];
    let at = SIGNS.iter().filter_map(|sign| panic.find(sign)).min()?;
    // The sentence around the sign: from the message's start (after tch's wrapping), to the
    // first line break (escaped in tch's Debug text) or quote.
    let start = panic[..at]
        .rfind("Torch(\"")
        .map_or(0, |i| i + "Torch(\"".len());
    let line = &panic[start..];
    let end = ["\\n", "\n", "\""]
        .iter()
        .filter_map(|stop| line[at - start..].find(stop).map(|i| i + at - start))
        .min()
        .unwrap_or(line.len());
    Some(line[..end].trim().to_owned())
}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// torch's own refusal of an allocation, as tch panics with it, reads as one line; a panic
    /// about anything else is not taken for it.
    #[test]
    fn an_allocation_torch_refuses_is_told_in_one_line() {
        let panic = std::panic::catch_unwind(|| {
            tch::Tensor::empty([1i64 << 50], (tch::Kind::Float, tch::Device::Cpu))
        })
        .expect_err("4 PiB cannot be had");
        let text = panic
            .downcast_ref::<String>()
            .expect("tch panics with text");
        let what = exhaustion(text).expect("an allocation failure");
        assert!(
            what.contains("can't allocate memory: you tried to allocate 4503599627370496 bytes"),
            "{what}"
        );
        assert!(!what.contains('\n') && !what.contains("\\n") && !what.contains("Torch("));
        assert_eq!(exhaustion("index out of bounds: the len is 3"), None);
    }
}
