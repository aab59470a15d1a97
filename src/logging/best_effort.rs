//! The files beside `metrics.jsonl` (the CSVs, TensorBoard's events) must not end a run that
//! may have days left when they fail (a full disk, a folder made read-only): the first failure
//! is a warning, and that sink writes no more, so that it holds no gaps. `metrics.jsonl` holds
//! every record.
use super::{Record, Sink, Video};
use crate::error::Result;

pub struct BestEffort {
    inner: Box<dyn Sink>,
    failed: bool,
}

impl BestEffort {
    pub fn new(inner: Box<dyn Sink>) -> Self {
        Self {
            inner,
            failed: false,
        }
    }

    fn attempt(&mut self, what: &str, work: impl FnOnce(&mut dyn Sink) -> Result<()>) {
        if self.failed {
            return;
        }
        if let Err(e) = work(self.inner.as_mut()) {
            self.failed = true;
            errln!(
                "warning: {} could not be written ({what}: {e}); it takes no more records, and \
                 training goes on (metrics.jsonl has them all)",
                self.inner.name()
            );
        }
    }
}

impl Sink for BestEffort {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn write(&mut self, record: &Record) -> Result<()> {
        self.attempt(&format!("step {}", record.step), |sink| sink.write(record));
        Ok(())
    }

    fn video(&mut self, video: &Video) -> Result<()> {
        self.attempt(&format!("the video of step {}", video.step), |sink| {
            sink.video(video)
        });
        Ok(())
    }

    fn close(&mut self) -> Result<()> {
        self.attempt("closing", |sink| sink.close());
        Ok(())
    }

    fn close_stopped(&mut self) -> Result<()> {
        self.attempt("closing", |sink| sink.close_stopped());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::logging::Phase;
    use std::sync::{Arc, Mutex};

    /// Fails its second write, and counts the writes it was asked for.
    struct FullDisk(Arc<Mutex<u32>>);

    impl Sink for FullDisk {
        fn name(&self) -> &'static str {
            "train.csv"
        }

        fn write(&mut self, _: &Record) -> Result<()> {
            let mut asked = self.0.lock().unwrap();
            *asked += 1;
            match *asked {
                2 => Err(Error::Other("No space left on device".into())),
                _ => Ok(()),
            }
        }
    }

    #[test]
    fn a_failed_file_is_a_warning_and_writes_no_more() {
        let asked = Arc::new(Mutex::new(0));
        let mut sink = BestEffort::new(Box::new(FullDisk(Arc::clone(&asked))));
        for step in 0..4 {
            sink.write(&Record::new(Phase::Train, step)).unwrap();
        }
        sink.close().unwrap();
        assert_eq!(*asked.lock().unwrap(), 2, "no write after the failed one");
    }
}
