//! Adam over a flat parameter buffer, update for update equal to `torch.optim.Adam`
//! (no AMSGrad, no weight decay), with its state open for saving, restoring and comparing.
use tch::Tensor;

use super::kernels::{self, AdamCoefficients};
use super::params::ParamEntry;
use super::{Error, Result};

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
    pub groups: Vec<ParamGroup>,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    step: u64,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    /// The denominator buffer of the tensor-operation path (off the CPU), made on first use.
    scratch: Option<Tensor>,
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
            step: 0,
            exp_avg: params.zeros_like().detach(),
            exp_avg_sq: params.zeros_like().detach(),
            scratch: None,
        })
    }

    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// One Adam step of `params` (flat) with `grads` (flat, same layout):
    /// m ← β₁m + (1−β₁)g, v ← β₂v + (1−β₂)g², p ← p − lr/(1−β₁ᵗ) · m / (√v/√(1−β₂ᵗ) + ε).
    pub fn step(&mut self, params: &Tensor, grads: &Tensor) {
        self.step += 1;
        let t = self.step as i32;
        let bias_correction1 = 1.0 - self.beta1.powi(t);
        let bias_correction2_sqrt = (1.0 - self.beta2.powi(t)).sqrt();
        let buffers = [params, grads, &self.exp_avg, &self.exp_avg_sq];
        let len = self.exp_avg.numel();
        if !kernels::adam_step_applies(buffers, len)
            || params.numel() != len
            || grads.numel() != len
        {
            self.step_with_tensor_ops(params, grads, bias_correction1, bias_correction2_sqrt);
            return;
        }
        for group in &self.groups {
            let coefficients = AdamCoefficients {
                one_minus_beta1: (1.0 - self.beta1) as f32,
                beta2: self.beta2 as f32,
                one_minus_beta2: (1.0 - self.beta2) as f32,
                bias_correction2_sqrt: bias_correction2_sqrt as f32,
                eps: self.eps as f32,
                neg_step_size: (-group.lr / bias_correction1) as f32,
            };
            kernels::adam_step(
                buffers,
                group.start as usize,
                group.end as usize,
                coefficients,
            );
        }
    }

    /// The same step as tensor operations over whole buffers (any device).
    fn step_with_tensor_ops(
        &mut self,
        params: &Tensor,
        grads: &Tensor,
        bias_correction1: f64,
        bias_correction2_sqrt: f64,
    ) {
        let scratch = self
            .scratch
            .get_or_insert_with(|| params.zeros_like().detach());
        tch::no_grad(|| {
            let _ = self.exp_avg.lerp_(grads, 1.0 - self.beta1);
            let _ = self.exp_avg_sq.g_mul_scalar_(self.beta2);
            let _ = self
                .exp_avg_sq
                .addcmul_(grads, &(grads * (1.0 - self.beta2)));
            let _ = self.exp_avg_sq.sqrt_out(scratch);
            let _ = scratch
                .g_div_scalar_(bias_correction2_sqrt)
                .g_add_scalar_(self.eps);
            for group in &self.groups {
                let len = group.end - group.start;
                let step_size = group.lr / bias_correction1;
                let mut denom = scratch.narrow(0, group.start, len);
                // p += (−step_size)·m/denom, folded into one addcdiv by scaling the denominator.
                let _ = denom.g_div_scalar_(-step_size);
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
        });
        self.step = state.step;
        Ok(())
    }
}

/// Scales `grads` (flat) in place so that their L2 norm is at most `max_norm`, as
/// `torch.nn.utils.clip_grad_norm_`; returns the norm before clipping (a device scalar, no sync).
///
/// The norm is taken the way torch takes it over a module's parameters: one norm per parameter
/// (`layout` gives each one's place in the flat buffer), then the norm of those norms. A single
/// float32 norm over millions of entries drifts from that by 1e-5 relative and more as models
/// grow, which would move the logged `grad_norm` and the clip factor away from the official ones.
pub fn clip_grad_norm(grads: &mut Tensor, layout: &[ParamEntry], max_norm: f64) -> Tensor {
    tch::no_grad(|| {
        let norm = grad_norm(grads, layout);
        let coef = ((&norm + 1e-6).reciprocal() * max_norm).clamp_max(1.0);
        let _ = grads.g_mul_(&coef);
        norm
    })
}

/// The total L2 norm of a flat gradient buffer: the norm of the per-parameter norms.
pub fn grad_norm(grads: &Tensor, layout: &[ParamEntry]) -> Tensor {
    if layout.is_empty() {
        return grads.norm();
    }
    let norms: Vec<Tensor> = layout
        .iter()
        .map(|e| grads.narrow(0, e.offset, e.numel).norm())
        .collect();
    Tensor::stack(&norms, 0).norm()
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
            adam.step(&params, &Tensor::from_slice(&g));
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

    #[test]
    fn fused_cpu_step_equals_the_tensor_operation_step() {
        let params = Tensor::randn([1000], (tch::Kind::Float, tch::Device::Cpu));
        let reference = params.copy();
        let groups = vec![
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
        ];
        let mut fused = Adam::new(&params, groups.clone(), 0.9, 0.999, 1e-8).unwrap();
        let mut tensor_ops = Adam::new(&reference, groups, 0.9, 0.999, 1e-8).unwrap();
        for t in 1..=3i32 {
            let grads = Tensor::randn([1000], (tch::Kind::Float, tch::Device::Cpu));
            fused.step(&params, &grads);
            tensor_ops.step += 1;
            tensor_ops.step_with_tensor_ops(
                &reference,
                &grads,
                1.0 - 0.9f64.powi(t),
                (1.0 - 0.999f64.powi(t)).sqrt(),
            );
        }
        // Within rounding: parameters reach |x| ≈ 4, where one f32 ulp is 4.8e-7 (a wrong
        // term would be off by about the learning rate, 1e-4).
        assert!((&params - &reference).abs().max().double_value(&[]) < 2e-6);
        assert!(
            (&fused.exp_avg_sq - &tensor_ops.exp_avg_sq)
                .abs()
                .max()
                .double_value(&[])
                < 1e-6
        );
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
        let norm = grad_norm(&g, &[entry(0, 2), entry(2, 1)]);
        assert_eq!(norm.double_value(&[]), 13.0);
    }

    #[test]
    fn clipping_scales_only_above_the_threshold() {
        let mut g = Tensor::from_slice(&[3.0f32, 4.0]);
        let norm = clip_grad_norm(&mut g, &[], 1.0);
        assert_eq!(norm.double_value(&[]), 5.0);
        let clipped = to_vec(&g);
        assert!((clipped[0] - 0.6).abs() < 1e-6 && (clipped[1] - 0.8).abs() < 1e-6);
        let mut small = Tensor::from_slice(&[0.3f32, 0.4]);
        let small_norm = clip_grad_norm(&mut small, &[], 1.0);
        assert!((small_norm.double_value(&[]) - 0.5).abs() < 1e-7);
        assert_eq!(to_vec(&small), to_vec(&Tensor::from_slice(&[0.3f32, 0.4])));
    }
}
