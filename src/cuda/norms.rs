//! The L2 norms of many tensors in one call: torch's `_foreach_norm` through the shim (tch has
//! no binding for it). On CUDA that is one multi-tensor kernel instead of one kernel per tensor,
//! and the norms torch's `clip_grad_norm_` takes there; on the CPU torch takes one norm per
//! tensor either way. A build without the shim takes one norm per tensor itself.
use tch::Tensor;

use super::GraphError;

/// The L2 norm of each of `pieces` (at least one; all on one device, one float kind), stacked
/// into a tensor of shape `[pieces.len()]`.
pub fn norms(pieces: &[Tensor]) -> Result<Tensor, GraphError> {
    if pieces.is_empty() {
        return Err(GraphError::Cuda {
            op: "foreach norm",
            message: "no tensors to take the norms of".into(),
        });
    }
    imp::norms(pieces)
}

#[cfg(tdmpc2_cuda_graphs)]
mod imp {
    use std::ffi::{c_char, c_void};

    use tch::Tensor;

    use crate::cuda::graph::imp::new_tensor;
    use crate::cuda::GraphError;

    extern "C" {
        fn tdmpc2_foreach_norms(
            tensors: *const *mut c_void,
            count: i64,
            out: *mut *mut c_void,
        ) -> *mut c_char;
    }

    pub fn norms(pieces: &[Tensor]) -> Result<Tensor, GraphError> {
        // SAFETY: tch's tensor handle is a pointer to the at::Tensor the shim expects; the shim
        // only reads them, during the call.
        let handles: Vec<*mut c_void> = pieces.iter().map(|t| t.as_ptr() as *mut c_void).collect();
        new_tensor("foreach norm", |out| unsafe {
            tdmpc2_foreach_norms(handles.as_ptr(), handles.len() as i64, out)
        })
    }
}

#[cfg(not(tdmpc2_cuda_graphs))]
mod imp {
    use tch::Tensor;

    use crate::cuda::GraphError;

    pub fn norms(pieces: &[Tensor]) -> Result<Tensor, GraphError> {
        let norms: Vec<Tensor> = pieces.iter().map(Tensor::norm).collect();
        Ok(Tensor::stack(&norms, 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    /// On the CPU the one call gives exactly the norms taken one by one, for views of one flat
    /// buffer as the gradient buffers have them.
    #[test]
    fn one_call_gives_each_pieces_norm_exactly() {
        tch::manual_seed(3);
        let flat = Tensor::randn([70_001], (Kind::Float, Device::Cpu));
        let bounds = [(0, 5), (5, 65_536), (65_541, 1), (65_542, 4_459)];
        let pieces: Vec<Tensor> = bounds.iter().map(|&(o, n)| flat.narrow(0, o, n)).collect();
        let ours = norms(&pieces).unwrap();
        assert_eq!(ours.size(), [4]);
        for (i, piece) in pieces.iter().enumerate() {
            assert_eq!(
                ours.double_value(&[i as i64]),
                piece.norm().double_value(&[]),
                "piece {i}"
            );
        }
    }

    #[test]
    fn no_pieces_are_an_error() {
        let e = norms(&[]).unwrap_err().to_string();
        assert!(e.contains("no tensors"), "{e}");
    }
}
