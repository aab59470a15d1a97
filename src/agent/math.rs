//! TD-MPC2's numerics: symlog, two-hot value coding, soft cross-entropy and the squashed
//! Gaussian policy's log-probabilities. Operation order follows the official code so results
//! agree to the last few bits.
use tch::{Device, Kind, Tensor};

/// 0.5·ln(2π), the per-dimension constant of a standard normal's log-density.
const HALF_LOG_TWO_PI: f64 = 0.918_938_517_570_495_6;

/// sign(x)·ln(1+|x|).
pub fn symlog(x: &Tensor) -> Tensor {
    x.sign() * (x.abs() + 1.0).log()
}

/// sign(x)·(e^|x| − 1), the inverse of [`symlog`].
pub fn symexp(x: &Tensor) -> Tensor {
    x.sign() * (x.abs().exp() - 1.0)
}

/// Discrete regression over `num_bins` evenly spaced bins on [vmin, vmax] in symlog space.
#[derive(Debug)]
pub struct TwoHot {
    pub num_bins: i64,
    pub vmin: f64,
    pub vmax: f64,
    pub bin_size: f64,
    /// The bin centres, `linspace(vmin, vmax, num_bins)`.
    pub support: Tensor,
}

impl TwoHot {
    pub fn new(num_bins: usize, vmin: f64, vmax: f64, device: Device) -> Self {
        let num_bins = num_bins as i64;
        Self {
            num_bins,
            vmin,
            vmax,
            bin_size: (vmax - vmin) / (num_bins - 1) as f64,
            support: Tensor::linspace(vmin, vmax, num_bins, (Kind::Float, device)),
        }
    }

    /// The bins as the fused kernels take them.
    pub fn bins(&self) -> crate::cuda::fused::Bins {
        crate::cuda::fused::Bins {
            bins: self.num_bins,
            vmin: self.vmin,
            vmax: self.vmax,
            bin_size: self.bin_size,
        }
    }

    /// Soft two-hot targets for scalars `x` of shape (…, 1); returns (…, num_bins).
    ///
    /// Targets of a diverging run (NaN, ±inf) still give indices inside the support: NaN
    /// codes as 0 and infinities as the edges, so the update finishes and the trainer can
    /// report the non-finite loss instead of an index out of bounds.
    pub fn encode(&self, x: &Tensor) -> Tensor {
        let x = symlog(x)
            .nan_to_num(0.0, self.vmax, self.vmin)
            .clamp(self.vmin, self.vmax);
        let position = (&x - self.vmin) / self.bin_size;
        let lower = position.floor().clamp(0.0, (self.num_bins - 1) as f64);
        let upper_weight = &position - &lower;
        let lower_index = lower.to_kind(Kind::Int64);
        let upper_index = (&lower_index + 1).remainder(self.num_bins);
        let mut shape = x.size();
        if let Some(last) = shape.last_mut() {
            *last = self.num_bins;
        }
        Tensor::zeros(&shape, (x.kind(), x.device()))
            .scatter(-1, &lower_index, &(1.0f64 - &upper_weight))
            .scatter(-1, &upper_index, &upper_weight)
    }

    /// The expected value of logits (…, num_bins) over the support, mapped back with symexp;
    /// returns (…, 1).
    pub fn decode(&self, logits: &Tensor) -> Tensor {
        let probs = logits.softmax(-1, Kind::Float);
        symexp(&(probs * &self.support).sum_dim_intlist(-1, true, Kind::Float))
    }

    /// Cross-entropy of logits (…, num_bins) against the two-hot coding of `target` (…, 1),
    /// whose leading dims are the logits' last ones; returns (…, 1).
    pub fn soft_ce(&self, logits: &Tensor, target: &Tensor) -> Tensor {
        if let Some(fused) = self.fused_soft_ce(logits, target) {
            return fused;
        }
        let log_probs = logits.log_softmax(-1, Kind::Float);
        -(self.encode(target) * log_probs).sum_dim_intlist(-1, true, Kind::Float)
    }

    /// [`Self::soft_ce`] on CUDA with the fused kernels: the loss and its gradient from one
    /// kernel, joined to autograd by [`with_gradient`] (about 25 torch kernels fewer, forward
    /// and backward); the same numbers to within float rounding (the kernel fuses multiply-adds).
    /// None where it does not apply: targets that want a gradient, or other shapes.
    fn fused_soft_ce(&self, logits: &Tensor, target: &Tensor) -> Option<Tensor> {
        // The kernel gives no gradient for the targets (the update's are constants).
        let fused = crate::cuda::fused::applies_with_gradient(logits)
            && crate::cuda::fused::applies_to(target)
            && target.device() == logits.device();
        if !fused {
            return None;
        }
        let shape = logits.size();
        let leading = &shape[..shape.len() - 1];
        let target_shape = target.size();
        let (1, target_leading) = target_shape.split_last()? else {
            return None;
        };
        if !leading.ends_with(target_leading) {
            return None;
        }
        let rows = logits.detach().contiguous().view([-1, self.num_bins]);
        let target = target.detach().contiguous().view([-1]);
        let (loss, grad) = crate::cuda::fused::two_hot_soft_ce(&rows, &target, self.bins())
            .unwrap_or_else(|e| panic!("{e} (set fused_kernels=false to run without)"));
        let mut loss_shape = leading.to_vec();
        loss_shape.push(1);
        Some(with_gradient(
            &loss.view(loss_shape.as_slice()),
            logits,
            &grad.view(shape.as_slice()),
        ))
    }
}

/// `value` (…, 1) with `grad` (…, n), the derivative of each row's value with respect to that
/// row of `input` (…, n), attached for autograd: value + (s − s.detach()) with s = Σ input·grad
/// over the last dim. The result is `value` exactly, and an upstream gradient g reaches `input`
/// as g·grad.
pub fn with_gradient(value: &Tensor, input: &Tensor, grad: &Tensor) -> Tensor {
    let surrogate = (input * grad).sum_dim_intlist(-1, true, Kind::Float);
    value + (&surrogate - surrogate.detach())
}

/// Maps an unbounded network output into [low, low + dif] with tanh.
pub fn squash_log_std(raw: &Tensor, low: f64, dif: f64) -> Tensor {
    (raw.tanh() + 1.0) * (0.5 * dif) + low
}

/// Log-density of `mean + eps·exp(log_std)` under N(mean, exp(log_std)²), summed over the
/// last dim (keepdim).
pub fn gaussian_log_prob(eps: &Tensor, log_std: &Tensor) -> Tensor {
    let residual = eps.square() * -0.5 - log_std;
    (residual - HALF_LOG_TWO_PI).sum_dim_intlist(-1, true, Kind::Float)
}

/// The tanh change of variables: the log-probability correction for `action = tanh(u)`.
/// Returns the corrected log-probability given the squashed action.
pub fn squash_correction(squashed_action: &Tensor, log_prob: &Tensor) -> Tensor {
    let jacobian = (1.0f64 - squashed_action.square()).relu() + 1e-6;
    log_prob - jacobian.log().sum_dim_intlist(-1, true, Kind::Float)
}

/// The official "scaled entropy": −ℓp · (A·g)/(ℓp + 1e-8), where g is the Gaussian
/// log-probability before squashing, A the action size (a multitask row's own) and ℓp the
/// squashed log-probability; `scaled_log_prob` is A·g. Kept in this exact form (rather than
/// its near-equal −A·g) for bit-level agreement with the reference, gradients included.
pub fn scaled_entropy(scaled_log_prob: &Tensor, squashed_log_prob: &Tensor) -> Tensor {
    let entropy_scale = scaled_log_prob / (squashed_log_prob + 1e-8);
    -squashed_log_prob * entropy_scale
}

/// The official `termination_statistics`: the share of terminated targets, and the F1 score
/// of predicting termination where `probability > 0.5`. `probability` and `target` are (B, 1);
/// both results are device scalars.
pub fn termination_statistics(probability: &Tensor, target: &Tensor) -> (Tensor, Tensor) {
    const EPS: f64 = 1e-9;
    let predicted = probability.squeeze_dim(-1).gt(0.5);
    let target = target.squeeze_dim(-1);
    let positive = target.eq(1.0);
    let count = |mask: &Tensor| mask.sum(Kind::Float);
    let rate = target.sum(Kind::Float) / target.size()[0] as f64;
    let true_positives = count(&predicted.logical_and(&positive));
    let false_negatives = count(&predicted.logical_not().logical_and(&positive));
    let false_positives = count(&predicted.logical_and(&positive.logical_not()));
    let recall = &true_positives / (&true_positives + false_negatives + EPS);
    let precision = &true_positives / (&true_positives + false_positives + EPS);
    let f1 = (&precision * &recall * 2.0) / (precision + recall + EPS);
    (rate, f1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &Tensor, b: &Tensor, tol: f64) -> bool {
        (a - b).abs().max().double_value(&[]) <= tol
    }

    #[test]
    fn symlog_and_symexp_are_inverse_and_odd() {
        let x = Tensor::from_slice(&[-100.0f32, -2.5, -1e-3, 0.0, 1e-3, 1.0, 7.0, 1000.0]);
        assert!(close(&symexp(&symlog(&x)), &x, 1e-3));
        assert!(close(&symlog(&x.neg()), &symlog(&x).neg(), 0.0));
        let one = Tensor::from_slice(&[1.0f32]);
        assert!(close(
            &symlog(&one),
            &Tensor::from_slice(&[2.0f32.ln()]),
            1e-7
        ));
    }

    #[test]
    fn two_hot_round_trip_recovers_values_inside_the_support() {
        let coder = TwoHot::new(101, -10.0, 10.0, Device::Cpu);
        let x = Tensor::from_slice(&[-500.0f32, -3.3, -0.01, 0.0, 0.25, 1.0, 42.0, 9000.0])
            .view([8, 1]);
        let target = coder.encode(&x);
        assert_eq!(target.size(), vec![8, 101]);
        assert!(close(
            &target.sum_dim_intlist(-1, false, Kind::Float),
            &Tensor::ones([8], (Kind::Float, Device::Cpu)),
            1e-6
        ));
        // At most two non-zero bins per row, adjacent.
        let nonzero = target.gt(0.0).sum_dim_intlist(-1, false, Kind::Int64);
        assert!(nonzero.le(2).all().int64_value(&[]) == 1);
        // Decoding "infinitely confident" logits gives back the value.
        let logits = (&target + 1e-30).log();
        let decoded = coder.decode(&logits);
        let relative = ((&decoded - &x).abs() / (x.abs() + 1.0))
            .max()
            .double_value(&[]);
        assert!(relative < 1e-4, "relative error {relative}");
    }

    #[test]
    fn two_hot_clamps_to_the_support_edges() {
        let coder = TwoHot::new(101, -10.0, 10.0, Device::Cpu);
        let huge = Tensor::from_slice(&[1e30f32, -1e30]).view([2, 1]);
        let target = coder.encode(&huge);
        assert_eq!(target.double_value(&[0, 100]), 1.0);
        assert_eq!(target.double_value(&[1, 0]), 1.0);
    }

    #[test]
    fn two_hot_keeps_non_finite_targets_inside_the_support() {
        let coder = TwoHot::new(101, -10.0, 10.0, Device::Cpu);
        let x = Tensor::from_slice(&[f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MAX])
            .view([4, 1]);
        let target = coder.encode(&x);
        let row_sums = target.sum_dim_intlist(-1, false, Kind::Float);
        assert!(close(
            &row_sums,
            &Tensor::ones([4], (Kind::Float, Device::Cpu)),
            1e-6
        ));
        assert_eq!(target.double_value(&[0, 50]), 1.0, "NaN codes as 0");
        assert_eq!(target.double_value(&[1, 100]), 1.0);
        assert_eq!(target.double_value(&[2, 0]), 1.0);
        assert_eq!(target.double_value(&[3, 100]), 1.0);
        // The loss against them is finite for finite logits.
        let logits = Tensor::zeros([4, 101], (Kind::Float, Device::Cpu));
        let ce = coder.soft_ce(&logits, &x);
        assert!(ce.isfinite().all().int64_value(&[]) == 1);
    }

    /// What the fused two-hot cross-entropy computes (its loss, and softmax·Σcoding − coding as
    /// its gradient), joined by `with_gradient`, has the composition's value bit for bit and its
    /// gradients, here with targets shared by several heads and weighted rows.
    #[test]
    fn a_loss_with_its_gradient_attached_backpropagates_as_the_composition() {
        tch::manual_seed(6);
        let coder = TwoHot::new(101, -10.0, 10.0, Device::Cpu);
        let logits = (Tensor::randn([5, 3, 4, 101], (Kind::Float, Device::Cpu)) * 3.0)
            .set_requires_grad(true);
        let target = Tensor::randn([3, 4, 1], (Kind::Float, Device::Cpu)) * 200.0;
        let weights = Tensor::rand([5, 3, 4, 1], (Kind::Float, Device::Cpu));

        let composed = coder.soft_ce(&logits, &target);
        (&composed * &weights).sum(Kind::Float).backward();
        let expected_grad = logits.grad().copy();
        let _ = logits.grad().zero_();

        let coding = coder.encode(&target);
        let detached = logits.detach();
        let value = -(&coding * detached.log_softmax(-1, Kind::Float)).sum_dim_intlist(
            -1,
            true,
            Kind::Float,
        );
        let grad = detached.softmax(-1, Kind::Float)
            * coding.sum_dim_intlist(-1, true, Kind::Float)
            - &coding;
        let joined = with_gradient(&value, &logits, &grad);
        assert!(
            joined.equal(&composed),
            "the value is not the composition's"
        );
        (&joined * &weights).sum(Kind::Float).backward();
        assert!(close(&logits.grad(), &expected_grad, 1e-6));
    }

    #[test]
    fn uniform_logits_decode_to_zero_and_soft_ce_is_log_bins() {
        let coder = TwoHot::new(101, -10.0, 10.0, Device::Cpu);
        let logits = Tensor::zeros([3, 101], (Kind::Float, Device::Cpu));
        assert!(close(
            &coder.decode(&logits),
            &Tensor::zeros([3, 1], (Kind::Float, Device::Cpu)),
            1e-5
        ));
        let target = Tensor::from_slice(&[0.5f32, -2.0, 3.0]).view([3, 1]);
        let ce = coder.soft_ce(&logits, &target);
        let expected = Tensor::full([3, 1], (101f64).ln(), (Kind::Float, Device::Cpu));
        assert!(close(&ce, &expected, 1e-5));
    }

    #[test]
    fn log_prob_matches_the_direct_formula() {
        let eps = Tensor::from_slice(&[0.3f32, -1.2, 2.0, 0.0]).view([2, 2]);
        let log_std = Tensor::from_slice(&[-1.0f32, 0.5, 0.0, -3.0]).view([2, 2]);
        let mean = Tensor::from_slice(&[0.1f32, -0.4, 0.7, 0.2]).view([2, 2]);
        let g = gaussian_log_prob(&eps, &log_std);
        let u = &mean + &eps * log_std.exp();
        let a = u.tanh();
        let lp = squash_correction(&a, &g);
        for row in 0..2 {
            let mut gaussian = 0.0f64;
            let mut corrected = 0.0f64;
            for col in 0..2 {
                let e = eps.double_value(&[row, col]);
                let s = log_std.double_value(&[row, col]);
                let sigma = s.exp();
                let x = mean.double_value(&[row, col]) + e * sigma;
                // N(x; mean, sigma²) density, then the tanh Jacobian.
                let density = (-0.5 * e * e).exp() / (sigma * (2.0 * std::f64::consts::PI).sqrt());
                gaussian += density.ln();
                corrected += density.ln() - ((1.0 - x.tanh().powi(2)).max(0.0) + 1e-6).ln();
            }
            assert!((g.double_value(&[row, 0]) - gaussian).abs() < 1e-5);
            assert!((lp.double_value(&[row, 0]) - corrected).abs() < 1e-4);
        }
        // The scaled entropy is −A·g up to the 1e-8 guard.
        let scaled = scaled_entropy(&(&g * 2.0), &lp);
        assert!(close(&scaled, &(&g * -2.0), 1e-4));
    }

    #[test]
    fn log_std_squash_spans_its_range() {
        let raw = Tensor::from_slice(&[-100.0f32, 0.0, 100.0]);
        let s = squash_log_std(&raw, -10.0, 12.0);
        assert!(close(&s, &Tensor::from_slice(&[-10.0f32, -4.0, 2.0]), 1e-6));
    }

    /// The official formula, worked by hand: targets 1,1,0,0,1 and predictions
    /// 0.9,0.2,0.7,0.1,0.6 give tp 2, fn 1, fp 1: rate 0.6, precision = recall = 2/3, F1 2/3.
    #[test]
    fn termination_statistics_follow_the_official_formula() {
        let probability = Tensor::from_slice(&[0.9f32, 0.2, 0.7, 0.1, 0.6]).view([5, 1]);
        let target = Tensor::from_slice(&[1.0f32, 1.0, 0.0, 0.0, 1.0]).view([5, 1]);
        let (rate, f1) = termination_statistics(&probability, &target);
        assert!((rate.double_value(&[]) - 0.6).abs() < 1e-6);
        assert!((f1.double_value(&[]) - 2.0 / 3.0).abs() < 1e-6);
        let none = Tensor::zeros([4, 1], (Kind::Float, Device::Cpu));
        let (rate, f1) = termination_statistics(&none, &none);
        assert_eq!((rate.double_value(&[]), f1.double_value(&[])), (0.0, 0.0));
    }
}
