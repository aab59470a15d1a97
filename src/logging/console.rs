//! The console line, in the official trainer's style.
use super::{Record, Sink, Video};
use crate::error::Result;

pub struct Console;

impl Sink for Console {
    fn name(&self) -> &'static str {
        "console"
    }

    fn write(&mut self, record: &Record) -> Result<()> {
        say(&console_line(record));
        Ok(())
    }

    fn video(&mut self, video: &Video) -> Result<()> {
        say(&format!(
            "{:<6}  I: {:<10}  video: {} ({} frames)",
            "eval",
            video.step,
            video.path.display(),
            video.frames
        ));
        Ok(())
    }
}

/// A line on stdout; a reader that went away (`train | head`) costs the lines, not the run
/// (`outln!` would panic).
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

/// Seconds as Python's `timedelta` prints them, as the official console does: `0:01:02`,
/// `1 day, 1:00:00`.
pub fn clock_time(seconds: u64) -> String {
    let (days, t) = (seconds / 86_400, seconds % 86_400);
    let hms = format!("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60);
    match days {
        0 => hms,
        1 => format!("1 day, {hms}"),
        n => format!("{n} days, {hms}"),
    }
}

/// A count with thousands separators, as the official console prints counts: `6,000`.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(d);
    }
    out
}

/// `train  E: 12  I: 6,000  R: 512.3  S: 1.0  T: 0:01:02 ...`.
pub fn console_line(record: &Record) -> String {
    let mut line = format!("{:<6}", record.phase.name());
    let v = |k: &str| record.values.get(k).copied();
    if let Some(e) = v("episode") {
        line += &format!("  E: {:<6}", grouped(e as u64));
    }
    line += &format!("  I: {:<10}", grouped(record.step));
    if let Some(r) = v("episode_reward") {
        line += &format!("  R: {r:<9.1}");
    }
    if let Some(s) = v("episode_reward_std") {
        line += &format!("  ±{s:<7.1}");
    }
    if let Some(s) = v("episode_success") {
        line += &format!("  S: {s:<4.1}");
    }
    if let Some(t) = v("elapsed_time") {
        line += &format!("  T: {}", clock_time(t as u64));
    }
    if let Some(sps) = v("steps_per_second") {
        line += &format!("  SPS: {sps:.1}");
    }
    // A multitask evaluation: one line per task (and average), as the official prints them.
    for (key, value) in &record.values {
        let Some((what, task)) = key.split_once('+') else {
            continue;
        };
        match what {
            "episode_reward" => line += &format!("\n  {task:<28}  R: {value:.1}"),
            "episode_success" => line += &format!("\n  {task:<28}  S: {value:.2}"),
            "episode_score" => line += &format!("\n  {:<28}  {value:.1}", "normalized score"),
            _ => {}
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logging::Phase;

    #[test]
    fn console_line_reads_like_the_official_one() {
        let r = Record::new(Phase::Eval, 6000)
            .with("episode_reward", 512.34)
            .with("elapsed_time", 3725.0);
        let line = console_line(&r);
        assert!(line.starts_with("eval"), "{line}");
        assert!(
            line.contains("I: 6,000") && line.contains("R: 512.3") && line.contains("T: 1:02:05"),
            "{line}"
        );
        let line = console_line(&Record::new(Phase::Train, 1_234_567).with("episode_success", 1.0));
        assert!(
            line.contains("I: 1,234,567") && line.contains("S: 1.0"),
            "{line}"
        );
        assert_eq!(clock_time(90_000), "1 day, 1:00:00");
        assert_eq!(clock_time(3 * 86_400 + 62), "3 days, 0:01:02");
        let line = console_line(
            &r.with("episode_reward+walker-run", 20.5)
                .with("episode_score+normalized", 2.5),
        );
        let lines: Vec<&str> = line.lines().collect();
        assert_eq!(lines.len(), 3, "{line}");
        assert!(
            lines[1].contains("walker-run") && lines[1].ends_with("R: 20.5"),
            "{line}"
        );
        assert!(
            lines[2].contains("normalized score") && lines[2].ends_with("2.5"),
            "{line}"
        );
    }
}
