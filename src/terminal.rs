//! The user's terminal: lines on stdout and stderr (`outln!`, `errln!`), and its hangup. A
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

/// Whether this process was started to outlive its terminal (`nohup`: SIGHUP ignored). Asked
/// before any handler of SIGHUP is installed: otherwise a hangup stops a run as Ctrl-C does.
pub fn hangup_ignored() -> bool {
    // SAFETY: a zeroed sigaction is a valid out-parameter; a null new action changes nothing.
    let mut current: libc::sigaction = unsafe { std::mem::zeroed() };
    let read = unsafe { libc::sigaction(libc::SIGHUP, std::ptr::null(), &mut current) };
    read == 0 && current.sa_sigaction == libc::SIG_IGN
}
