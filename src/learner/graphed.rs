//! The single-process update as one CUDA graph (`compile=true` on CUDA): world model, policy,
//! target update and statistics. Before each replay the sampled batch and the rank-shared
//! draws are copied into the tensors the graph reads; the statistics are copied out of the
//! graph's memory after it.
use tch::Device;

use crate::agent::{Noise, PreparedPermutations, UpdateInfo, Updater, WorldModel};
use crate::buffer::Batch;
use crate::cuda::Replayed;
use crate::error::{Error, Result};

#[derive(Debug)]
pub(super) struct GraphedUpdate {
    device: Device,
    episodic: bool,
    /// The batch the graph reads, made at the first update.
    batch: Option<Batch>,
    replayed: Replayed,
}

impl GraphedUpdate {
    pub(super) fn new(device: Device, episodic: bool) -> Self {
        Self {
            device,
            episodic,
            batch: None,
            replayed: Replayed::new(device),
        }
    }

    /// One update on `batch`, whose draws of Q heads `shared` holds (refilled).
    pub(super) fn update(
        &mut self,
        model: &mut WorldModel,
        updater: &mut Updater,
        batch: &Batch,
        sample_noise: &mut dyn Noise,
        shared: &mut PreparedPermutations,
    ) -> Result<UpdateInfo> {
        let device = self.device;
        let statics = self.batch.get_or_insert_with(|| batch.copy_to(device));
        statics.refill(batch)?;
        let counts = updater.step_counts();
        let values = self.replayed.call(|| {
            shared.rewind();
            let info = updater.update(model, statics, sample_noise, shared)?;
            Ok::<_, Error>(info.values)
        })?;
        updater.set_step_counts(counts.map(|steps| steps + 1));
        Ok(UpdateInfo {
            values: values.copy(),
            episodic: self.episodic,
        })
    }
}

/// Why this learner's updates cannot be one graph, if they cannot.
pub(super) fn why_not_captured(
    device: Device,
    world_size: usize,
    sync_freq: usize,
) -> Option<String> {
    if !device.is_cuda() {
        return Some(format!("updates run on {device:?}, graphs on CUDA only"));
    }
    if world_size > 1 {
        return Some(
            "with several ranks the update's collectives run between its parts, which are not \
             captured yet"
                .into(),
        );
    }
    if sync_freq > 1 {
        return Some(format!(
            "sync_freq={sync_freq}: micro-batches accumulate between optimiser steps, which are \
             not captured yet"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each case the graph does not cover is named; one rank on CUDA with one micro-batch is
    /// captured.
    #[test]
    fn the_cases_left_eager_say_why() {
        let gpu = Device::Cuda(0);
        let why = |device, world, sync_freq| {
            why_not_captured(device, world, sync_freq).unwrap_or_default()
        };
        assert!(why(Device::Cpu, 1, 1).contains("CUDA only"));
        assert!(why(gpu, 2, 1).contains("several ranks"));
        assert!(why(gpu, 1, 2).contains("sync_freq=2"));
        assert_eq!(why_not_captured(gpu, 1, 1), None);
    }
}
