//! How far a long piece of work is (pretraining, an evaluation): a line at most once a minute,
//! so that a log read on a cluster shows the run is working. The progress bar counts agent
//! steps, which stand still meanwhile, and a log file has no bar.
use std::time::{Duration, Instant};

use crate::logging::clock_time;

pub struct Countdown {
    what: String,
    unit: &'static str,
    total: u64,
    start: Instant,
    next: Instant,
}

impl Countdown {
    const EVERY: Duration = Duration::from_secs(60);

    /// `total` `unit`s of `what`, started at `now`.
    pub fn start(what: impl Into<String>, unit: &'static str, total: u64, now: Instant) -> Self {
        Self {
            what: what.into(),
            unit,
            total,
            start: now,
            next: now + Self::EVERY,
        }
    }

    /// The line to show after `done` of them at `now`, when one is due.
    pub fn line(&mut self, done: u64, now: Instant) -> Option<String> {
        if now < self.next || done == 0 || done >= self.total {
            return None;
        }
        self.next = now + Self::EVERY;
        let elapsed = now.duration_since(self.start).as_secs_f64();
        let left = elapsed * (self.total - done) as f64 / done as f64;
        Some(format!(
            "{}: {done} of {} {} ({}%), {} elapsed, about {} left",
            self.what,
            self.total,
            self.unit,
            done * 100 / self.total,
            clock_time(elapsed as u64),
            clock_time(left.round() as u64)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_once_a_minute_with_what_is_left() {
        let start = Instant::now();
        let at = |seconds: u64| start + Duration::from_secs(seconds);
        let mut countdown = Countdown::start("Pretraining", "updates", 5000, start);
        assert_eq!(countdown.line(900, at(59)), None, "not before a minute");
        assert_eq!(
            countdown.line(1000, at(60)).as_deref(),
            Some("Pretraining: 1000 of 5000 updates (20%), 0:01:00 elapsed, about 0:04:00 left")
        );
        assert_eq!(
            countdown.line(1500, at(90)),
            None,
            "a minute after the last line"
        );
        assert!(countdown.line(2000, at(120)).is_some());
        assert_eq!(
            countdown.line(5000, at(300)),
            None,
            "nothing once it is done"
        );
    }
}
