//! A call made again and again on the same shapes, run through a CUDA graph: the plan and the
//! update.
//!
//! The first call runs eagerly on the capture's side stream (a real call, which also lets
//! libraries set up their lazy state outside the capture) and is then captured; every later
//! call is one replay. So every call does its work once, and the graph's random draws come
//! from torch's CUDA generator where the eager call would take them (a capture records offsets
//! into the generator's stream without advancing it; each replay advances it).
//!
//! What the call reads must be tensors refilled in place before each call; what it returns
//! lives in the graph's memory and is overwritten by the next replay. Host state the call
//! changes is changed twice by the first call (once eagerly, once while capturing) and never by
//! a replay: the caller keeps such state itself (the update's step counts).
use tch::{Device, Tensor};

use super::generator::SharedGenerator;
use super::graph::{CudaGraph, GraphError};

/// A call captured on its first use and replayed after.
pub struct Replayed {
    device: Device,
    graph: Option<(CudaGraph, Tensor)>,
}

impl Replayed {
    pub fn new(device: Device) -> Self {
        Self {
            device,
            graph: None,
        }
    }

    /// Whether the call has been captured.
    pub fn captured(&self) -> bool {
        self.graph.is_some()
    }

    /// Runs `f` (see the module's documentation); returns its output, which the next call
    /// overwrites.
    pub fn call<E>(&mut self, f: impl FnMut() -> Result<Tensor, E>) -> Result<Tensor, E>
    where
        E: From<GraphError>,
    {
        self.call_drawing_from(&[], f)
    }

    /// [`Self::call`] of a call that also draws from `generators`, which the capture registers
    /// (later calls replay with the generators registered then).
    pub fn call_drawing_from<E>(
        &mut self,
        generators: &[SharedGenerator],
        mut f: impl FnMut() -> Result<Tensor, E>,
    ) -> Result<Tensor, E>
    where
        E: From<GraphError>,
    {
        if let Some((graph, outputs)) = &self.graph {
            graph.replay()?;
            return Ok(outputs.shallow_clone());
        }
        let mut eager = None;
        let (graph, outputs) =
            CudaGraph::capture_drawing_from(self.device, None, 1, generators, || {
                let out = f()?;
                if eager.is_none() {
                    eager = Some(out.shallow_clone());
                }
                Ok::<_, E>(out)
            })?;
        self.graph = Some((graph, outputs));
        Ok(eager.expect("the warm-up call ran before the capture"))
    }
}

impl std::fmt::Debug for Replayed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replayed")
            .field("device", &self.device)
            .field("captured", &self.captured())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Off CUDA nothing is run: the error says why, and the call is not made.
    #[test]
    fn a_cpu_call_is_refused_before_it_runs() {
        let mut replayed = Replayed::new(Device::Cpu);
        let mut calls = 0;
        let err = replayed
            .call(|| {
                calls += 1;
                Ok::<_, GraphError>(Tensor::zeros([1], (tch::Kind::Float, Device::Cpu)))
            })
            .unwrap_err();
        assert!(matches!(err, GraphError::NotCuda(Device::Cpu)), "{err}");
        assert_eq!(calls, 0);
        assert!(!replayed.captured());
    }
}
