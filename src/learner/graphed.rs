//! The update as one CUDA graph (`compile=true` on CUDA): world-model and policy passes of
//! every micro-batch, optimiser steps, target update and statistics, with the collectives
//! between them when they are NCCL's (which a graph can hold). Before each replay the sampled
//! micro-batches and the rank-shared draws are copied into the tensors the graph reads; the
//! statistics are copied out of the graph's memory after it.
use tch::Device;

use super::synchronised::UpdateParts;
use crate::agent::UpdateInfo;
use crate::buffer::Batch;
use crate::cuda::Replayed;
use crate::ddp::Backend;
use crate::error::{Error, Result};

#[derive(Debug)]
pub(super) struct GraphedUpdate {
    /// The micro-batches the graph reads, made at the first update.
    batches: Vec<Batch>,
    replayed: Replayed,
}

impl GraphedUpdate {
    pub(super) fn new(device: Device) -> Self {
        Self {
            batches: Vec::new(),
            replayed: Replayed::new(device),
        }
    }

    /// Refuses a number of micro-batches other than the one captured (before anything the
    /// graph reads is reallocated for them).
    pub(super) fn check_micro_batches(&self, count: usize) -> Result<()> {
        if !self.batches.is_empty() && count != self.batches.len() {
            return Err(Error::Config(format!(
                "a captured update takes {} micro-batches, not {count}",
                self.batches.len()
            )));
        }
        Ok(())
    }

    /// One update on `batches`, whose draws of Q heads `parts.shared` holds (refilled). The
    /// caller has checked their count ([`Self::check_micro_batches`]) before refilling those.
    pub(super) fn update(
        &mut self,
        parts: &mut UpdateParts,
        batches: &[Batch],
    ) -> Result<UpdateInfo> {
        if self.batches.is_empty() {
            let device = parts.model.device();
            self.batches = batches.iter().map(|b| b.copy_to(device)).collect();
        } else {
            for (fixed, batch) in self.batches.iter_mut().zip(batches) {
                fixed.refill(batch)?;
            }
        }
        let counts = parts.updater.step_counts();
        let statics = &self.batches;
        let values = self.replayed.call(|| {
            parts.shared.rewind();
            Ok::<_, Error>(parts.run(statics)?.values)
        })?;
        parts.updater.set_step_counts(counts.map(|steps| steps + 1));
        Ok(UpdateInfo {
            values: values.copy(),
            episodic: parts.model.termination.is_some(),
        })
    }
}

/// Why the updates of a rank in a group of `backend` (`None` for a lone rank) cannot be one
/// graph, where graphs can run.
pub(super) fn why_not_captured(backend: Option<Backend>) -> Option<String> {
    match backend {
        None | Some(Backend::Nccl) => None,
        Some(Backend::Gloo) => Some(
            "dist_backend=gloo: gloo's collectives on CUDA tensors go through the host, which \
             a graph cannot hold"
                .into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each case the graph does not cover is named; a lone rank on CUDA, or one in an NCCL
    /// group, is captured.
    #[test]
    fn the_cases_left_eager_say_why() {
        let why = |backend| why_not_captured(backend).unwrap_or_default();
        let off_cuda = crate::cuda::why_no_graphs(Device::Cpu).unwrap_or_default();
        assert!(off_cuda.contains("CUDA only"));
        assert!(why(Some(Backend::Gloo)).contains("dist_backend=gloo"));
        assert_eq!(why_not_captured(None), None);
        assert_eq!(why_not_captured(Some(Backend::Nccl)), None);
    }

    /// Once the graph holds its micro-batches, another count is refused (before the learner
    /// would reallocate the shared draws the graph reads).
    #[test]
    fn a_captured_update_refuses_another_micro_batch_count() {
        let mut graphed = GraphedUpdate::new(Device::Cpu);
        assert!(graphed.check_micro_batches(3).is_ok());
        let zeros = |shape: &[i64]| tch::Tensor::zeros(shape, (tch::Kind::Float, Device::Cpu));
        let batch = || Batch {
            obs: zeros(&[2, 4, 3]),
            action: zeros(&[1, 4, 1]),
            reward: zeros(&[1, 4, 1]),
            terminated: zeros(&[1, 4, 1]),
            task: None,
        };
        graphed.batches = vec![batch(), batch()];
        assert!(graphed.check_micro_batches(2).is_ok());
        let err = graphed.check_micro_batches(1).unwrap_err().to_string();
        assert!(err.contains("takes 2 micro-batches, not 1"), "{err}");
    }
}
