//! Adam over a flat parameter buffer, update for update equal to `torch.optim.Adam`
//! (no AMSGrad, no weight decay), with its state open for saving, restoring and comparing.
//!
//! On the CPU a fused kernel takes the step's scalars from the host. Elsewhere the step is
//! tensor operations whose scalars (step count, bias corrections, warmed-up rates) are device
//! tensors advanced by device operations, as torch's `capturable=True` (the official optimiser
//! on CUDA): a CUDA graph that replays the step sees them change, where host scalars would be
//! frozen into it. With `fused_kernels` on, CUDA takes torch's fused Adam instead (one kernel a
//! group, the same device scalars).
use tch::{Kind, Tensor};

use super::error::{Error, Result};
use super::kernels::{self, AdamCoefficients};
use super::params::ParamEntry;

/// A contiguous slice of the flat buffer sharing one learning rate (a torch param group).
#[derive(Debug, Clone, PartialEq)]
pub struct ParamGroup {
    pub start: i64,
    pub end: i64,
    pub lr: f64,
}

/// The optimiser state: step count and both moment buffers (flat, parameter layout).
#[derive(Debug)]
pub struct AdamState {
    pub step: u64,
    pub exp_avg: Tensor,
    pub exp_avg_sq: Tensor,
}

#[derive(Debug)]
pub struct Adam {
    /// The groups at their base rates (before warm-up).
    groups: Vec<ParamGroup>,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// Rates rise linearly to the groups' over this many steps (0: from the first).
    warmup_steps: u64,
    step: u64,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    /// The tensor-operation path's device scalars, made on its first step.
    on_device: Option<DeviceScalars>,
}

/// What the tensor-operation step keeps on the parameters' device.
#[derive(Debug)]
struct DeviceScalars {
    /// The step count (float32, shape [1]), advanced by the step itself.
    step: Tensor,
    /// Each group's base rate, [groups].
    base_lrs: Tensor,
    /// The denominator buffer.
    scratch: Tensor,
}

impl DeviceScalars {
    /// For parameters like `params` after `steps` steps.
    fn new(params: &Tensor, groups: &[ParamGroup], steps: u64) -> Self {
        let base: Vec<f32> = groups.iter().map(|g| g.lr as f32).collect();
        Self {
            step: Tensor::full([1], steps as f64, (Kind::Float, params.device())),
            base_lrs: Tensor::from_slice(&base).to_device(params.device()),
            scratch: params.zeros_like().detach(),
        }
    }
}

impl Adam {
    /// An optimiser for a flat buffer like `params` with the given groups (which must tile
    /// disjoint ranges of it).
    pub fn new(
        params: &Tensor,
        groups: Vec<ParamGroup>,
        beta1: f64,
        beta2: f64,
        eps: f64,
    ) -> Result<Self> {
        let numel = params.size()[0];
        for g in &groups {
            if g.start < 0 || g.end > numel || g.start > g.end {
                return Err(Error::Config(format!(
                    "param group {g:?} outside 0..{numel}"
                )));
            }
        }
        Ok(Self {
            groups,
            beta1,
            beta2,
            eps,
            warmup_steps: 0,
            step: 0,
            exp_avg: params.zeros_like().detach(),
            exp_avg_sq: params.zeros_like().detach(),
            on_device: None,
        })
    }

    /// Rates rise linearly over the first `steps` steps: step t uses min(t/steps, 1) of each
    /// group's rate.
    pub fn with_warmup(mut self, steps: u64) -> Self {
        self.warmup_steps = steps;
        self
    }

    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// Sets the host's count of steps taken, and nothing else: for a caller whose steps ran in
    /// a CUDA graph, which advances the device's count (see [`crate::agent::Updater`]).
    pub fn set_step_count(&mut self, steps: u64) {
        self.step = steps;
    }

    /// The rate of group `group` in the step numbered `step` (counting from 1).
    fn rate_at(&self, group: &ParamGroup, step: u64) -> f64 {
        if self.warmup_steps == 0 {
            return group.lr;
        }
        group.lr * (step as f64 / self.warmup_steps as f64).min(1.0)
    }

    /// The rate each group's last step used (the base rates before the first step).
    pub fn learning_rates(&self) -> Vec<f64> {
        match self.step {
            0 => self.groups.iter().map(|g| g.lr).collect(),
            step => self.groups.iter().map(|g| self.rate_at(g, step)).collect(),
        }
    }

    /// One Adam step of `params` (flat) with `grads` (flat, same layout):
    /// m ← β₁m + (1−β₁)g, v ← β₂v + (1−β₂)g², p ← p − lr/(1−β₁ᵗ) · m / (√v/√(1−β₂ᵗ) + ε).
    pub fn step(&mut self, params: &Tensor, grads: &Tensor) -> Result<()> {
        if crate::cuda::fused::enabled() && params.device().is_cuda() {
            return self.step_with_torch_fused(params, grads);
        }
        let buffers = [params, grads, &self.exp_avg, &self.exp_avg_sq];
        let len = self.exp_avg.numel();
        if !kernels::adam_step_applies(buffers, len)
            || params.numel() != len
            || grads.numel() != len
        {
            self.step_with_tensor_ops(params, grads);
            return Ok(());
        }
        self.step += 1;
        let t = self.step as i32;
        let bias_correction1 = 1.0 - self.beta1.powi(t);
        let bias_correction2_sqrt = (1.0 - self.beta2.powi(t)).sqrt();
        for group in &self.groups {
            let coefficients = AdamCoefficients {
                one_minus_beta1: (1.0 - self.beta1) as f32,
                beta2: self.beta2 as f32,
                one_minus_beta2: (1.0 - self.beta2) as f32,
                bias_correction2_sqrt: bias_correction2_sqrt as f32,
                eps: self.eps as f32,
                neg_step_size: (-self.rate_at(group, self.step) / bias_correction1) as f32,
            };
            kernels::adam_step(
                buffers,
                group.start as usize,
                group.end as usize,
                coefficients,
            );
        }
        Ok(())
    }

    /// Advances the device step count; returns it and each group's rate for this step ([groups]).
    fn advance_device_scalars(&mut self, params: &Tensor) -> (Tensor, Tensor) {
        let (taken, groups, warmup) = (self.step, &self.groups, self.warmup_steps);
        self.step += 1;
        let scalars = self
            .on_device
            .get_or_insert_with(|| DeviceScalars::new(params, groups, taken));
        tch::no_grad(|| {
            let step = scalars.step.g_add_scalar_(1.0);
            let lrs = match warmup {
                0 => scalars.base_lrs.shallow_clone(),
                steps => &scalars.base_lrs * (&step / steps as f64).clamp_max(1.0),
            };
            (step, lrs)
        })
    }

    /// The step through torch's fused Adam, one call a group, reading the device scalars.
    fn step_with_torch_fused(&mut self, params: &Tensor, grads: &Tensor) -> Result<()> {
        let (step, lrs) = self.advance_device_scalars(params);
        let step = step.view([]);
        for (index, group) in self.groups.iter().enumerate() {
            let len = group.end - group.start;
            let slice = |t: &Tensor| t.narrow(0, group.start, len);
            let (p, g) = (slice(params), slice(grads));
            let (m, v) = (slice(&self.exp_avg), slice(&self.exp_avg_sq));
            let lr = lrs.get(index as i64);
            let slices = [crate::cuda::AdamSlice {
                params: &p,
                grads: &g,
                exp_avg: &m,
                exp_avg_sq: &v,
            }];
            tch::no_grad(|| {
                crate::cuda::fused_adam(&slices, &step, &lr, (self.beta1, self.beta2), self.eps)
            })?;
        }
        Ok(())
    }

    /// The same step as tensor operations over whole buffers (any device), with the order of
    /// operations of torch's capturable multi-tensor Adam; reads no host value.
    fn step_with_tensor_ops(&mut self, params: &Tensor, grads: &Tensor) {
        let (beta1, beta2, eps) = (self.beta1, self.beta2, self.eps);
        let (step, lrs) = self.advance_device_scalars(params);
        let (groups, scalars) = (&self.groups, self.on_device.as_ref().expect("made above"));
        tch::no_grad(|| {
            // −lr/(1 − β₁ᵗ) per group, and √(1 − β₂ᵗ).
            let neg_step_sizes = ((Tensor::pow_scalar(beta1, &step) - 1.0) / lrs).reciprocal();
            let bias_correction2_sqrt = (1.0f64 - Tensor::pow_scalar(beta2, &step)).sqrt();
            let _ = self.exp_avg.lerp_(grads, 1.0 - beta1);
            let _ = self
                .exp_avg_sq
                .g_mul_scalar_(beta2)
                .addcmul_(grads, &(grads * (1.0 - beta2)));
            let _ = self.exp_avg_sq.sqrt_out(&scalars.scratch);
            for (index, group) in groups.iter().enumerate() {
                let len = group.end - group.start;
                let neg_step_size = neg_step_sizes.narrow(0, index as i64, 1);
                // p += m / (√v / (√(1 − β₂ᵗ)·(−step)) + ε/(−step)): one addcdiv.
                let mut denom = scalars.scratch.narrow(0, group.start, len);
                let _ = denom.g_div_(&(&bias_correction2_sqrt * &neg_step_size));
                let _ = denom.g_add_(&(neg_step_size.reciprocal() * eps));
                let mut p = params.narrow(0, group.start, len);
                let _ = p.addcdiv_(&self.exp_avg.narrow(0, group.start, len), &denom);
            }
        });
    }

    /// The state, sharing storage with the optimiser (copy it to keep a snapshot).
    pub fn state(&self) -> AdamState {
        AdamState {
            step: self.step,
            exp_avg: self.exp_avg.shallow_clone(),
            exp_avg_sq: self.exp_avg_sq.shallow_clone(),
        }
    }

    /// Restores a saved state (moments in the same flat layout).
    pub fn load_state(&mut self, state: &AdamState) -> Result<()> {
        for (name, t) in [
            ("exp_avg", &state.exp_avg),
            ("exp_avg_sq", &state.exp_avg_sq),
        ] {
            if t.size() != self.exp_avg.size() {
                return Err(Error::Shape {
                    what: name.into(),
                    expected: self.exp_avg.size(),
                    got: t.size(),
                });
            }
        }
        tch::no_grad(|| {
            self.exp_avg.copy_(&state.exp_avg);
            self.exp_avg_sq.copy_(&state.exp_avg_sq);
            if let Some(scalars) = &self.on_device {
                let _ = scalars.step.detach().fill_(state.step as f64);
            }
        });
        self.step = state.step;
        Ok(())
    }
}

/// Scales `grads` (flat) in place so that their L2 norm is at most `max_norm`, as
/// `torch.nn.utils.clip_grad_norm_`; returns the norm before clipping (a device scalar, no sync).
///
/// The norm is taken the way torch takes it over a module's parameters: one norm per parameter
/// (`pieces`: each one's view of the flat buffer, see [`parameter_views`]; on CUDA all in one
/// multi-tensor kernel), then the norm of those norms. A single float32 norm over millions of
/// entries drifts from that by 1e-5 relative and more as models grow, which would move the
/// logged `grad_norm` and the clip factor away from the official ones.
pub fn clip_grad_norm(grads: &mut Tensor, pieces: &[Tensor], max_norm: f64) -> Result<Tensor> {
    tch::no_grad(|| {
        let norm = grad_norm(grads, pieces)?;
        let coef = ((&norm + 1e-6).reciprocal() * max_norm).clamp_max(1.0);
        let _ = grads.g_mul_(&coef);
        Ok(norm)
    })
}

/// Each parameter's view of a flat buffer laid out as `layout`: made once, so that a norm per
/// parameter costs no slicing per step.
pub fn parameter_views(flat: &Tensor, layout: &[ParamEntry]) -> Vec<Tensor> {
    layout
        .iter()
        .map(|e| flat.narrow(0, e.offset, e.numel))
        .collect()
}

/// The total L2 norm of a flat gradient buffer: the norm of the norms of its `pieces` (views of
/// it, one per parameter), or of the whole buffer without pieces.
pub fn grad_norm(grads: &Tensor, pieces: &[Tensor]) -> Result<Tensor> {
    if pieces.is_empty() {
        return Ok(grads.norm());
    }
    Ok(crate::cuda::norms(pieces)?.norm())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Kind;

    fn to_vec(t: &Tensor) -> Vec<f64> {
        Vec::<f64>::try_from(&t.to_kind(Kind::Double).view([-1])).unwrap()
    }

    #[test]
    fn two_steps_match_a_hand_computation() {
        let lr = 0.1;
        let (b1, b2, eps) = (0.9, 0.999, 1e-8);
        let params = Tensor::from_slice(&[1.0f32, -2.0, 0.5]);
        let mut adam = Adam::new(
            &params,
            vec![
                ParamGroup {
                    start: 0,
                    end: 2,
                    lr,
                },
                ParamGroup {
                    start: 2,
                    end: 3,
                    lr: lr * 0.3,
                },
            ],
            b1,
            b2,
            eps,
        )
        .unwrap();
        let grads = [[0.5f64, -1.0, 2.0], [0.1, 0.3, -4.0]];
        let mut expected = [1.0f64, -2.0, 0.5];
        let (mut m, mut v) = ([0.0f64; 3], [0.0f64; 3]);
        for (t, g) in grads.iter().enumerate() {
            let step = (t + 1) as i32;
            for i in 0..3 {
                m[i] = b1 * m[i] + (1.0 - b1) * g[i];
                v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
                let group_lr = if i < 2 { lr } else { lr * 0.3 };
                let denom = v[i].sqrt() / (1.0 - b2.powi(step)).sqrt() + eps;
                expected[i] -= group_lr / (1.0 - b1.powi(step)) * m[i] / denom;
            }
            let g: Vec<f32> = g.iter().map(|&x| x as f32).collect();
            adam.step(&params, &Tensor::from_slice(&g)).unwrap();
        }
        let got = to_vec(&params);
        for i in 0..3 {
            assert!(
                (got[i] - expected[i]).abs() < 1e-6,
                "{got:?} vs {expected:?}"
            );
        }
        assert_eq!(adam.step_count(), 2);
        let state = adam.state();
        assert!((to_vec(&state.exp_avg)[0] - m[0]).abs() < 1e-7);
        assert!((to_vec(&state.exp_avg_sq)[2] - v[2]).abs() < 1e-6);
    }

    fn two_groups() -> Vec<ParamGroup> {
        vec![
            ParamGroup {
                start: 0,
                end: 300,
                lr: 1e-3,
            },
            ParamGroup {
                start: 300,
                end: 1000,
                lr: 3e-4,
            },
        ]
    }

    /// An optimiser over `params` with [`two_groups`] and `warmup` steps of warm-up.
    fn adam(params: &Tensor, warmup: u64) -> Adam {
        Adam::new(params, two_groups(), 0.9, 0.999, 1e-8)
            .unwrap()
            .with_warmup(warmup)
    }

    /// The fused CPU step (host scalars) and the tensor-operation step (device scalars) take the
    /// same steps, warm-up included, and so does a tensor-operation optimiser restored from the
    /// fused one's state (its device step count follows the restored one).
    #[test]
    fn fused_cpu_step_equals_the_tensor_operation_step() {
        let params = Tensor::randn([1000], (tch::Kind::Float, tch::Device::Cpu));
        let reference = params.copy();
        let mut fused = adam(&params, 2);
        let mut tensor_ops = adam(&reference, 2);
        let close = |a: &Tensor, b: &Tensor| (a - b).abs().max().double_value(&[]) < 2e-6;
        for _ in 1..=3 {
            let grads = Tensor::randn([1000], (tch::Kind::Float, tch::Device::Cpu));
            fused.step(&params, &grads).unwrap();
            tensor_ops.step_with_tensor_ops(&reference, &grads);
        }
        // Within rounding: parameters reach |x| ≈ 4, where one f32 ulp is 4.8e-7 (a wrong
        // term would be off by about the learning rate, 1e-4).
        assert!(close(&params, &reference));
        assert!(close(&fused.exp_avg_sq, &tensor_ops.exp_avg_sq));
        assert_eq!(tensor_ops.step_count(), 3);
        assert_eq!(fused.learning_rates(), vec![1e-3, 3e-4]);

        let mut restored = adam(&reference, 2);
        let grads = Tensor::randn([1000], (tch::Kind::Float, tch::Device::Cpu));
        restored.step_with_tensor_ops(&reference.copy(), &grads.zeros_like());
        restored.load_state(&fused.state()).unwrap();
        let (restored_params, fused_params) = (params.copy(), params.copy());
        restored.step_with_tensor_ops(&restored_params, &grads);
        fused.step(&fused_params, &grads).unwrap();
        assert!(close(&restored_params, &fused_params));
    }

    /// torch's fused Adam (`_fused_adam_` through the shim; on the CPU here, as CUDA takes it with
    /// `fused_kernels`) takes the steps ours takes, per group and through the warm-up, reading
    /// the same device scalars, and resumes from a restored state the same way.
    #[test]
    fn torchs_fused_adam_equals_ours() {
        if env!("TDMPC2_TORCH_CUDA_WHEEL") == "0" {
            errln!("SKIPPED: the shim (and with it torch's fused Adam) needs the CUDA wheel");
            return;
        }
        let params = Tensor::randn([1000], (tch::Kind::Float, tch::Device::Cpu)) * 3.0;
        let reference = params.copy();
        let mut ours = adam(&params, 2);
        let mut torchs = adam(&reference, 2);
        let close = |a: &Tensor, b: &Tensor| (a - b).abs().max().double_value(&[]) < 2e-6;
        for _ in 1..=4 {
            let grads = Tensor::randn([1000], (tch::Kind::Float, tch::Device::Cpu));
            ours.step(&params, &grads).unwrap();
            torchs.step_with_torch_fused(&reference, &grads).unwrap();
            // A wrong rate or bias correction would be off by about the rate, 1e-4.
            assert!(close(&params, &reference));
            assert!(close(&ours.exp_avg, &torchs.exp_avg));
            assert!(close(&ours.exp_avg_sq, &torchs.exp_avg_sq));
        }
        assert_eq!(torchs.step_count(), 4);
        let grads = Tensor::randn([1000], (tch::Kind::Float, tch::Device::Cpu));
        let mut restored = adam(&reference, 2);
        restored.load_state(&ours.state()).unwrap();
        let (restored_params, our_params) = (params.copy(), params.copy());
        restored
            .step_with_torch_fused(&restored_params, &grads)
            .unwrap();
        ours.step(&our_params, &grads).unwrap();
        assert!(close(&restored_params, &our_params));
    }

    /// The warm-up scales each step's rates: step t of T uses t/T of them.
    #[test]
    fn warm_up_rises_linearly_to_the_base_rates() {
        let params = Tensor::zeros([1000], (tch::Kind::Float, tch::Device::Cpu));
        let mut adam = adam(&params, 4);
        assert_eq!(adam.learning_rates(), vec![1e-3, 3e-4]);
        let grads = params.ones_like();
        adam.step(&params, &grads).unwrap();
        assert_eq!(adam.learning_rates(), vec![1e-3 / 4.0, 3e-4 / 4.0]);
        // Adam's first step moves every parameter by its rate (m̂ = ĝ, √v̂ = |g|).
        assert!((params.double_value(&[0]) + 1e-3 / 4.0).abs() < 1e-9);
        for _ in 0..4 {
            adam.step(&params, &grads).unwrap();
        }
        assert_eq!(adam.learning_rates(), vec![1e-3, 3e-4]);
    }

    /// The tensor-operation step (the one a CUDA graph captures) never waits for the device
    /// to hand the host a value, and consecutive steps, warm-up included, dispatch the same
    /// operators with the same scalar arguments: a captured step replays the next one.
    #[test]
    fn tensor_operation_steps_are_replayable() {
        use crate::bench::op_count::{count_ops, trace_ops};
        let params = Tensor::randn([1000], (tch::Kind::Float, tch::Device::Cpu));
        let mut adam = adam(&params, 3);
        let grads = Tensor::randn([1000], (tch::Kind::Float, tch::Device::Cpu));
        let mut step = || {
            adam.step_with_tensor_ops(&params, &grads);
            Ok(())
        };
        step().unwrap();
        let ((), counted) = count_ops(&mut step).unwrap();
        assert!(counted.ops > 0);
        assert_eq!(counted.host_syncs, 0, "{counted:?}");
        let ((), second) = trace_ops(&mut step).unwrap();
        let ((), third) = trace_ops(&mut step).unwrap();
        assert_eq!(second, third);
    }

    #[test]
    fn the_norm_is_the_norm_of_per_parameter_norms() {
        let entry = |offset, numel| ParamEntry {
            name: String::new(),
            shape: vec![numel],
            offset,
            numel,
        };
        let g = Tensor::from_slice(&[3.0f32, 4.0, 12.0]);
        // sqrt(5² + 12²) = 13 either way; the layout only changes the order of summation.
        let norm = grad_norm(&g, &parameter_views(&g, &[entry(0, 2), entry(2, 1)])).unwrap();
        assert_eq!(norm.double_value(&[]), 13.0);
    }

    #[test]
    fn clipping_scales_only_above_the_threshold() {
        let mut g = Tensor::from_slice(&[3.0f32, 4.0]);
        let norm = clip_grad_norm(&mut g, &[], 1.0).unwrap();
        assert_eq!(norm.double_value(&[]), 5.0);
        let clipped = to_vec(&g);
        assert!((clipped[0] - 0.6).abs() < 1e-6 && (clipped[1] - 0.8).abs() < 1e-6);
        let mut small = Tensor::from_slice(&[0.3f32, 0.4]);
        let small_norm = clip_grad_norm(&mut small, &[], 1.0).unwrap();
        assert!((small_norm.double_value(&[]) - 0.5).abs() < 1e-7);
        assert_eq!(to_vec(&small), to_vec(&Tensor::from_slice(&[0.3f32, 0.4])));
    }
}
