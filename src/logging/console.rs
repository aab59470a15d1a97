//! The console line, in the official trainer's style.
use super::{Record, Sink, Video};
use crate::error::Result;

pub struct Console;

impl Sink for Console {
    fn name(&self) -> &'static str {
        "console"
    }

    fn write(&mut self, record: &Record) -> Result<()> {
        println!("{}", console_line(record));
        Ok(())
    }

    fn video(&mut self, video: &Video) -> Result<()> {
        println!(
            "{:<6}  I: {:<10}  video: {} ({} frames)",
            "eval",
            video.step,
            video.path.display(),
            video.frames
        );
        Ok(())
    }
}

/// `train  E: 12  I: 6,000  R: 512.3  T: 0:01:02 ...`.
pub fn console_line(record: &Record) -> String {
    let mut line = format!("{:<6}", record.phase.name());
    let v = |k: &str| record.values.get(k).copied();
    if let Some(e) = v("episode") {
        line += &format!("  E: {:<6}", e as u64);
    }
    line += &format!("  I: {:<10}", record.step);
    if let Some(r) = v("episode_reward") {
        line += &format!("  R: {r:<9.1}");
    }
    if let Some(s) = v("episode_reward_std") {
        line += &format!("  ±{s:<7.1}");
    }
    if let Some(t) = v("elapsed_time") {
        let t = t as u64;
        line += &format!("  T: {}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60);
    }
    if let Some(sps) = v("steps_per_second") {
        line += &format!("  SPS: {sps:.1}");
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
            line.contains("I: 6000") && line.contains("R: 512.3") && line.contains("T: 1:02:05"),
            "{line}"
        );
    }
}
