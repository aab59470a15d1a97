//! torch's fused Adam (`_fused_adam_`, the kernel of `torch.optim.Adam(fused=True)`) through the
//! shim: one kernel on CUDA for what is otherwise about twenty, and capturable, since the rate
//! and the step count are tensors. tch has no binding for it.
use tch::Tensor;

use super::GraphError;

/// One slice of parameters with its gradients and moments (all the same shape and device).
pub struct AdamSlice<'a> {
    pub params: &'a Tensor,
    pub grads: &'a Tensor,
    pub exp_avg: &'a Tensor,
    pub exp_avg_sq: &'a Tensor,
}

/// Adam's update of every slice in place, at rate `lr` (0-dim) after `step` steps (0-dim,
/// float32, already advanced for this step).
pub fn fused_adam(
    slices: &[AdamSlice<'_>],
    step: &Tensor,
    lr: &Tensor,
    betas: (f64, f64),
    eps: f64,
) -> Result<(), GraphError> {
    imp::fused_adam(slices, step, lr, betas, eps)
}

#[cfg(tdmpc2_cuda_graphs)]
mod imp {
    use std::ffi::{c_char, c_void};

    use tch::Tensor;

    use super::AdamSlice;
    use crate::cuda::graph::imp::check;
    use crate::cuda::GraphError;

    extern "C" {
        #[allow(clippy::too_many_arguments)]
        fn tdmpc2_fused_adam(
            params: *const *mut c_void,
            grads: *const *mut c_void,
            exp_avgs: *const *mut c_void,
            exp_avg_sqs: *const *mut c_void,
            steps: *const *mut c_void,
            count: i64,
            lr: *mut c_void,
            beta1: f64,
            beta2: f64,
            eps: f64,
        ) -> *mut c_char;
    }

    pub fn fused_adam(
        slices: &[AdamSlice<'_>],
        step: &Tensor,
        lr: &Tensor,
        (beta1, beta2): (f64, f64),
        eps: f64,
    ) -> Result<(), GraphError> {
        // SAFETY (here and below): tch's tensor handle is a pointer to the at::Tensor the shim
        // expects; the shim reads the handles only during the call.
        let handles = |pick: for<'s> fn(&'s AdamSlice<'s>) -> &'s Tensor| -> Vec<*mut c_void> {
            slices
                .iter()
                .map(|s| pick(s).as_ptr() as *mut c_void)
                .collect()
        };
        let params = handles(|s| s.params);
        let grads = handles(|s| s.grads);
        let exp_avgs = handles(|s| s.exp_avg);
        let exp_avg_sqs = handles(|s| s.exp_avg_sq);
        let steps = vec![step.as_ptr() as *mut c_void; slices.len()];
        check("fused adam", unsafe {
            tdmpc2_fused_adam(
                params.as_ptr(),
                grads.as_ptr(),
                exp_avgs.as_ptr(),
                exp_avg_sqs.as_ptr(),
                steps.as_ptr(),
                slices.len() as i64,
                lr.as_ptr() as *mut c_void,
                beta1,
                beta2,
                eps,
            )
        })
    }
}

#[cfg(not(tdmpc2_cuda_graphs))]
mod imp {
    use tch::Tensor;

    use super::AdamSlice;
    use crate::cuda::GraphError;

    pub fn fused_adam(
        _: &[AdamSlice<'_>],
        _: &Tensor,
        _: &Tensor,
        _: (f64, f64),
        _: f64,
    ) -> Result<(), GraphError> {
        Err(GraphError::NotBuilt(env!("TDMPC2_CUDA_GRAPHS_MISSING")))
    }
}
