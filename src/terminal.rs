//! The user's terminal: lines on stdout and stderr (`outln!`, `errln!`), its hangup, and
//! what makes a Ctrl-C a second request. A
//! reader that went away (`train | head`, a `tee` ended by the same Ctrl-C, a closed terminal)
//! costs the lines, never the run: `println!` panics there, before a stop's checkpoint is
//! written.
use std::fmt::Arguments;
use std::io::Write;

/// Writes to stdout, dropping what cannot be written.
pub fn write_out(args: Arguments<'_>) {
    let _ = std::io::stdout().lock().write_fmt(args);
}

/// Writes to stderr, dropping what cannot be written.
pub fn write_err(args: Arguments<'_>) {
    let _ = std::io::stderr().lock().write_fmt(args);
}

/// `println!` that never panics.
#[macro_export]
macro_rules! outln {
    () => {
        $crate::terminal::write_out(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::terminal::write_out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `eprintln!` that never panics.
#[macro_export]
macro_rules! errln {
    () => {
        $crate::terminal::write_err(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::terminal::write_err(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// A stop request this long after the first is a second request (end now), not the same one
/// delivered twice (a terminal's Ctrl-C and a wrapper passing it on).
pub const SECOND_REQUEST_AFTER_MS: i64 = 1000;

/// Whether `signal`, received at `now_ms` when the first stop request came at `first_ms`
/// ([`monotonic_ms`]), is a second request: Ctrl-C again, what a person at the terminal does.
/// A scheduler's or a launcher's repeated SIGTERM, or a hangup passed on twice, is not.
pub fn is_second_request(signal: libc::c_int, first_ms: i64, now_ms: i64) -> bool {
    signal == libc::SIGINT && now_ms - first_ms >= SECOND_REQUEST_AFTER_MS
}

/// Milliseconds of the monotonic clock (async-signal-safe: clock_gettime); at least 1.
pub fn monotonic_ms() -> i64 {
    // SAFETY: a zeroed timespec is a valid out-parameter.
    let mut now: libc::timespec = unsafe { std::mem::zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    (now.tv_sec * 1000 + now.tv_nsec / 1_000_000).max(1)
}

/// Whether this process was started to outlive its terminal (`nohup`: SIGHUP ignored). Asked
/// before any handler of SIGHUP is installed: otherwise a hangup stops a run as Ctrl-C does.
pub fn hangup_ignored() -> bool {
    // SAFETY: a zeroed sigaction is a valid out-parameter; a null new action changes nothing.
    let mut current: libc::sigaction = unsafe { std::mem::zeroed() };
    let read = unsafe { libc::sigaction(libc::SIGHUP, std::ptr::null(), &mut current) };
    read == 0 && current.sa_sigaction == libc::SIG_IGN
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_ctrl_c_a_moment_after_the_first_request_is_a_second_request() {
        let first = monotonic_ms();
        assert!(first > 0 && monotonic_ms() >= first);
        let later = first + SECOND_REQUEST_AFTER_MS;
        assert!(is_second_request(libc::SIGINT, first, later));
        assert!(
            !is_second_request(libc::SIGINT, first, first + 10),
            "passed on twice"
        );
        for signal in [libc::SIGTERM, libc::SIGHUP] {
            assert!(!is_second_request(signal, first, later), "{signal}");
        }
    }
}
