//! Batches read ahead of the updates, on a thread of their own.
use std::sync::Arc;

use rand_pcg::Pcg64;

use super::Dataset;
use crate::buffer::Batch;
use crate::error::{Error, Result};

/// Batches sampled on a thread of their own, a few ahead of the updates that take them, each
/// from the stream its index gives: the run's batches do not depend on timing (nor on where a
/// run resumed), and reading them from disk overlaps the updates.
pub struct Prefetcher {
    batches: Option<std::sync::mpsc::Receiver<Result<Batch>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Prefetcher {
    /// Batches ready ahead of the one taken.
    const AHEAD: usize = 2;

    /// Batches `first`, `first + 1`, ..., batch `k` drawn from `stream(k)`.
    pub fn start(
        dataset: Arc<Dataset>,
        batch_size: usize,
        first: u64,
        stream: impl Fn(u64) -> Pcg64 + Send + 'static,
    ) -> Self {
        let (sender, batches) = std::sync::mpsc::sync_channel(Self::AHEAD);
        let thread = std::thread::Builder::new()
            .name("dataset-prefetch".into())
            .spawn(move || {
                for k in first.. {
                    let batch = dataset.sample(batch_size, &mut stream(k));
                    let failed = batch.is_err();
                    // The receiver gone: the run ended.
                    if sender.send(batch).is_err() || failed {
                        return;
                    }
                }
            })
            .ok();
        Self {
            batches: Some(batches),
            thread,
        }
    }

    /// The next batch of the stream.
    pub fn next(&self) -> Result<Batch> {
        let gone = || Error::Other("the dataset's prefetching thread ended".into());
        match &self.batches {
            Some(batches) => batches.recv().map_err(|_| gone())?,
            None => Err(gone()),
        }
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        // Closing the channel ends the thread at its next batch.
        drop(self.batches.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
