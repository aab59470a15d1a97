//! The one interface every metrics destination implements.
use super::{Record, Video};
use crate::error::Result;

/// A destination for records: a file, the console, an experiment tracker.
pub trait Sink: Send {
    /// A short name for error messages, e.g. "wandb".
    fn name(&self) -> &'static str;

    fn write(&mut self, record: &Record) -> Result<()>;

    /// An evaluation video, already written to the run directory; destinations that show
    /// media keep it too.
    fn video(&mut self, video: &Video) -> Result<()> {
        let _ = video;
        Ok(())
    }

    /// Whether the destination takes each step once, in order (W&B: a step it holds takes no
    /// more records, also in a resumed run).
    fn takes_each_step_once(&self) -> bool {
        false
    }

    /// The run stops with an evaluation of `step` under way, which its resume redoes: a
    /// destination that takes each step once leaves that step's records to the resume, to
    /// take with the evaluation.
    fn leave_to_the_resume(&mut self, step: u64) {
        let _ = step;
    }

    /// Flushes and finishes the destination. Called once; a sink dropped without it treats
    /// the run as failed where the destination knows the difference.
    fn close(&mut self) -> Result<()> {
        Ok(())
    }

    /// Finishes the destination after a requested stop (Ctrl-C, SIGTERM) that wrote its
    /// checkpoint: as [`Self::close`], where the destination cannot tell the two apart.
    fn close_stopped(&mut self) -> Result<()> {
        self.close()
    }
}
