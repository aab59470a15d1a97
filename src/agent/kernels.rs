//! Hand-written CPU kernels for the elementwise hot spots: Mish, short-row softmax and dropout
//! masks.
//!
//! On the CPU, torch's Mish evaluates three transcendental functions per element (exp, log1p,
//! tanh) in forward and again in backward, and its dropout draws Bernoulli samples one at a
//! time; together they cost about a third of a plan and a quarter of an update. Here
//! tanh(softplus(x)) is computed from a single exponential, n/(n+2) with n = eˣ(eˣ+2), in one
//! vectorised pass on the calling thread (about 3× faster than torch's two-thread Mish; extra
//! threads would compete with the spinning OpenMP workers). Other devices use torch's operators.
//!
//! [`retain_freed_memory`] stops glibc from handing freed activation buffers back to the kernel
//! (and faulting fresh zeroed pages in on the next allocation), about a tenth of an update.
//!
//! For autograd, [`mish`] returns the tangent line `x·y' + (y − x̄·y')` where `y`, `y'` are the
//! kernel's value and derivative at `x̄`, `x` detached (constants): its gradient is exactly `y'`
//! and its value `y` within a rounding, for one multiply and one add forward and one multiply
//! backward instead of a Mish backward.

use rand::rngs::SmallRng;
use rand::RngCore;
use tch::{Device, Kind, Tensor};

/// Above this, tanh(softplus(x)) is 1 in float32 (and eˣ(eˣ+2) would overflow further up).
const MISH_SATURATION: f32 = 20.0;

#[inline(always)]
fn exp_approx(x: f32) -> f32 {
    // Cephes expf: x = k·ln2 + r, |r| ≤ ln2/2, degree-5 polynomial; about 1 ulp.
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5·2²³: adding it rounds to an integer
    let x = x.clamp(-87.3, 88.0);
    let shifted = x.mul_add(LOG2E, ROUND);
    let k = shifted - ROUND;
    let exponent = shifted.to_bits().wrapping_sub(ROUND.to_bits()) as i32;
    let r = k.mul_add(-LN2_LO, k.mul_add(-LN2_HI, x));
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 0.5);
    let poly = (p * r).mul_add(r, r) + 1.0;
    poly * f32::from_bits(((exponent + 127) as u32) << 23)
}

#[inline(always)]
fn mish_value(x: f32) -> f32 {
    let e = exp_approx(x.min(MISH_SATURATION));
    let n = e * (e + 2.0);
    x * (n / (n + 2.0))
}

/// Mish and its derivative t + x·σ(x)·(1 − t²), t = tanh(softplus(x)).
#[inline(always)]
fn mish_value_and_grad(x: f32) -> (f32, f32) {
    let e = exp_approx(x.min(MISH_SATURATION));
    let n = e * (e + 2.0);
    let d = n + 2.0;
    let t = n / d;
    let sigmoid = e / (1.0 + e);
    let one_minus_t2 = 4.0 * (n + 1.0) / (d * d);
    (x * t, t + x * sigmoid * one_minus_t2)
}

fn mish_slice_generic(x: &[f32], y: &mut [f32]) {
    for (out, &v) in y.iter_mut().zip(x) {
        *out = mish_value(v);
    }
}

/// Writes the tangent line of Mish at each `x`: slope `g` and offset `y − x·g`.
fn mish_grad_slice_generic(x: &[f32], offset: &mut [f32], g: &mut [f32]) {
    for ((offset, grad), &v) in offset.iter_mut().zip(g.iter_mut()).zip(x) {
        let (value, slope) = mish_value_and_grad(v);
        (*offset, *grad) = ((-v).mul_add(slope, value), slope);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn mish_slice_avx2(x: &[f32], y: &mut [f32]) {
    mish_slice_generic(x, y)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn mish_grad_slice_avx2(x: &[f32], offset: &mut [f32], g: &mut [f32]) {
    mish_grad_slice_generic(x, offset, g)
}

fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn mish_slice(x: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU supports the enabled features (checked above).
        return unsafe { mish_slice_avx2(x, y) };
    }
    mish_slice_generic(x, y)
}

fn mish_grad_slice(x: &[f32], offset: &mut [f32], g: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU supports the enabled features (checked above).
        return unsafe { mish_grad_slice_avx2(x, offset, g) };
    }
    mish_grad_slice_generic(x, offset, g)
}

/// Softmax of one group in place of `output`: max, exponentials, one reciprocal of the sum.
#[inline(always)]
fn softmax_group(input: &[f32], output: &mut [f32]) {
    let max = input.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let mut sum = 0.0;
    for (out, &v) in output.iter_mut().zip(input) {
        *out = exp_approx(v - max);
        sum += *out;
    }
    let scale = 1.0 / sum;
    for out in output.iter_mut() {
        *out *= scale;
    }
}

/// Groups of a fixed `N`: the compiler keeps a group in registers.
#[inline(always)]
fn softmax_groups_fixed<const N: usize>(x: &[f32], y: &mut [f32]) {
    for (input, output) in x.chunks_exact(N).zip(y.chunks_exact_mut(N)) {
        let input: &[f32; N] = input.try_into().expect("chunks of N");
        let output: &mut [f32; N] = output.try_into().expect("chunks of N");
        softmax_group(input, output);
    }
}

#[inline(always)]
fn softmax_groups_any(x: &[f32], y: &mut [f32], group: usize) {
    for (input, output) in x.chunks_exact(group).zip(y.chunks_exact_mut(group)) {
        softmax_group(input, output);
    }
}

#[inline(always)]
fn softmax_groups_generic(x: &[f32], y: &mut [f32], group: usize) {
    match group {
        8 => softmax_groups_fixed::<8>(x, y),
        16 => softmax_groups_fixed::<16>(x, y),
        _ => softmax_groups_any(x, y, group),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_groups_avx2(x: &[f32], y: &mut [f32], group: usize) {
    softmax_groups_generic(x, y, group)
}

fn softmax_groups(x: &[f32], y: &mut [f32], group: usize) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU supports the enabled features (checked above).
        return unsafe { softmax_groups_avx2(x, y, group) };
    }
    softmax_groups_generic(x, y, group)
}

/// Whether the fast path applies: a non-empty float32 tensor on the CPU.
fn on_cpu(x: &Tensor) -> bool {
    x.device() == Device::Cpu && x.kind() == Kind::Float && x.numel() > 0
}

/// Scalars of one Adam step of one parameter group, in float32 as torch applies them.
#[derive(Debug, Clone, Copy)]
pub struct AdamCoefficients {
    pub one_minus_beta1: f32,
    pub beta2: f32,
    pub one_minus_beta2: f32,
    pub bias_correction2_sqrt: f32,
    pub eps: f32,
    /// −lr/(1 − β₁ᵗ)
    pub neg_step_size: f32,
}

/// torch's single-tensor Adam, element by element: lerp for the first moment, then the second
/// moment, the bias-corrected denominator and the addcdiv.
fn adam_slice_generic(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], c: AdamCoefficients) {
    for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
        *m += c.one_minus_beta1 * (g - *m);
        *v = *v * c.beta2 + c.one_minus_beta2 * g * g;
        let denom = v.sqrt() / c.bias_correction2_sqrt + c.eps;
        *p += c.neg_step_size * (*m / denom);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn adam_slice_avx2(
    p: &mut [f32],
    g: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    c: AdamCoefficients,
) {
    adam_slice_generic(p, g, m, v, c)
}

/// Whether [`adam_step`] can run on these buffers: contiguous 1-D float32 CPU tensors of at
/// least `len` elements.
pub fn adam_step_applies(buffers: [&Tensor; 4], len: usize) -> bool {
    buffers
        .iter()
        .all(|t| on_cpu(t) && t.is_contiguous() && t.dim() == 1 && t.numel() >= len)
}

/// One fused Adam pass over `[start, end)` of flat CPU float buffers (parameters, gradients,
/// moments), instead of nine tensor passes.
///
/// # Panics
/// If [`adam_step_applies`] does not hold for `end`, or `start > end`.
pub fn adam_step(buffers: [&Tensor; 4], start: usize, end: usize, coefficients: AdamCoefficients) {
    assert!(
        adam_step_applies(buffers, end) && start <= end,
        "adam_step on unsuitable buffers"
    );
    let [params, grads, exp_avg, exp_avg_sq] = buffers;
    // SAFETY: contiguous float buffers of at least `end` elements (asserted above), distinct
    // allocations owned by the optimiser and the model; nothing else touches them during the
    // call (the optimiser runs on the thread that owns the model).
    unsafe {
        let p = &mut slice_of(params)[start..end];
        let g = &as_slice(grads)[start..end];
        let m = &mut slice_of(exp_avg)[start..end];
        let v = &mut slice_of(exp_avg_sq)[start..end];
        #[cfg(target_arch = "x86_64")]
        if has_avx2() {
            return adam_slice_avx2(p, g, m, v, coefficients);
        }
        adam_slice_generic(p, g, m, v, coefficients);
    }
}

/// Keeps freed heap memory in the process instead of returning it to the kernel: allocations up
/// to 32 MiB come from the heap (not fresh `mmap`s) and the heap top is not trimmed. Torch's CPU
/// allocator frees and re-allocates every activation of every step, so without this each
/// update re-faults (and the kernel re-zeroes) hundreds of megabytes of pages. Process-wide;
/// effective once, later calls do nothing. A no-op outside glibc.
pub fn retain_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // glibc's mallopt parameters (malloc.h).
            const M_TRIM_THRESHOLD: i32 = -1;
            const M_TOP_PAD: i32 = -2;
            const M_MMAP_THRESHOLD: i32 = -3;
            extern "C" {
                fn mallopt(param: i32, value: i32) -> i32;
            }
            // SAFETY: mallopt only adjusts allocator parameters; the values are in range
            // (32 MiB is glibc's largest mmap threshold).
            unsafe {
                mallopt(M_MMAP_THRESHOLD, 32 << 20);
                mallopt(M_TRIM_THRESHOLD, i32::MAX);
                mallopt(M_TOP_PAD, 64 << 20);
            }
        });
    }
}

/// Views a contiguous CPU float tensor's data.
///
/// SAFETY: the caller keeps `t` alive and unaliased-for-writing while the slice is used.
unsafe fn as_slice(t: &Tensor) -> &[f32] {
    std::slice::from_raw_parts(t.data_ptr() as *const f32, t.numel())
}

/// SAFETY: `t` is a freshly allocated contiguous CPU float tensor nobody else references.
unsafe fn as_mut_slice(t: &mut Tensor) -> &mut [f32] {
    slice_of(t)
}

/// SAFETY: `t` is a contiguous CPU float tensor whose storage nothing else reads or writes while
/// the slice lives.
#[allow(clippy::mut_from_ref)]
unsafe fn slice_of(t: &Tensor) -> &mut [f32] {
    std::slice::from_raw_parts_mut(t.data_ptr() as *mut f32, t.numel())
}

/// Mish without autograd (inference).
pub fn mish_inference(x: &Tensor) -> Tensor {
    if !on_cpu(x) {
        return x.mish();
    }
    // Only the values are read: no detach needed (an operator per call, 119 per plan), and
    // `empty_like` does not require grad.
    let x = x.contiguous();
    let mut y = x.empty_like();
    // SAFETY: `x` is contiguous and kept alive; `y` is new and only written here.
    unsafe {
        let input = as_slice(&x);
        let output = as_mut_slice(&mut y);
        mish_slice(input, output);
    }
    y
}

/// Mish, differentiable: torch's operator off the CPU; on the CPU the fused kernel with the
/// value-plus-linear-term construction described in the module docs.
pub fn mish(x: &Tensor) -> Tensor {
    if !on_cpu(x) {
        return x.mish();
    }
    if !x.requires_grad() {
        return mish_inference(x);
    }
    let detached = x.detach().contiguous();
    let mut offset = detached.empty_like();
    let mut slope = detached.empty_like();
    // SAFETY: `detached` is contiguous and kept alive; the outputs are new.
    unsafe {
        let input = as_slice(&detached);
        let (o, g) = (as_mut_slice(&mut offset), as_mut_slice(&mut slope));
        mish_grad_slice(input, o, g);
    }
    x * slope + offset
}

/// Rows longer than this go to torch's softmax, which is faster there.
const SHORT_ROW: i64 = 32;

/// Softmax over the last dimension. For short rows without autograd on the CPU (SimNorm's
/// groups of 8, most of a plan's softmax time), one pass on the calling thread, about 1e-7 from
/// torch's, whose kernel is slow for short rows. Otherwise torch's operator.
pub fn softmax_last_dim(x: &Tensor) -> Tensor {
    let group = x.size().last().copied().unwrap_or(0);
    if !on_cpu(x) || x.requires_grad() || group == 0 || group > SHORT_ROW {
        return x.softmax(-1, Kind::Float);
    }
    let x = x.contiguous();
    let mut y = x.empty_like();
    // SAFETY: `x` is contiguous and kept alive; `y` is new and only written here.
    unsafe {
        softmax_groups(as_slice(&x), as_mut_slice(&mut y), group as usize);
    }
    y
}

/// A dropout mask of `shape`: each element 0 with probability `p`, else 1/(1−p), from `rng`.
pub fn dropout_mask(rng: &mut SmallRng, shape: &[i64], p: f64) -> Tensor {
    let count = shape.iter().product::<i64>().max(0) as usize;
    let keep_scale = (1.0 / (1.0 - p)) as f32;
    // Drop when a uniform 32-bit integer falls below p·2³².
    let threshold = (p * 4_294_967_296.0).round().min(u32::MAX as f64) as u32;
    let mut values = vec![keep_scale; count];
    let mut pairs = values.chunks_exact_mut(2);
    for pair in &mut pairs {
        let bits = rng.next_u64();
        if (bits as u32) < threshold {
            pair[0] = 0.0;
        }
        if ((bits >> 32) as u32) < threshold {
            pair[1] = 0.0;
        }
    }
    for last in pairs.into_remainder() {
        if rng.next_u32() < threshold {
            *last = 0.0;
        }
    }
    Tensor::from_slice(&values).view(shape)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn fast_exp_is_accurate() {
        for i in -8700..8800 {
            let x = i as f32 * 0.01;
            let (got, want) = (exp_approx(x) as f64, (x as f64).exp());
            assert!(
                ((got - want) / want).abs() < 3e-7,
                "exp({x}) = {got}, want {want}"
            );
        }
    }

    #[test]
    fn softmax_matches_torch() {
        for (rows, group) in [(300, 8), (40, 16), (7, 101), (5, 3), (6, 32)] {
            let x = Tensor::randn([rows, group], (Kind::Float, Device::Cpu)) * 6.0;
            // Far apart values in one row: the maximum must be subtracted.
            let _ = x.get(0).get(0).fill_(-100.0);
            let _ = x.get(1).get(1).fill_(80.0);
            let ours = softmax_last_dim(&x);
            let diff = (&ours - x.softmax(-1, Kind::Float))
                .abs()
                .max()
                .double_value(&[]);
            assert!(diff < 1e-6, "rows of {group}: {diff}");
        }
        // Autograd and other layouts go to torch, so they still work.
        let leaf = Tensor::randn([4, 8], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        assert!(softmax_last_dim(&leaf).requires_grad());
        let strided = Tensor::randn([8, 4], (Kind::Float, Device::Cpu)).transpose(0, 1);
        let diff = (softmax_last_dim(&strided) - strided.softmax(-1, Kind::Float))
            .abs()
            .max();
        assert!(diff.double_value(&[]) < 1e-6);
    }

    #[test]
    fn mish_matches_torch_in_value_and_gradient() {
        let x = (Tensor::arange_start_step(-3000, 3000, 1, (Kind::Float, Device::Cpu)) * 0.01)
            .cat_extra(&[-100.0f32, -50.0, 50.0, 100.0, 0.0]);
        let reference = x.mish();
        let ours = mish_inference(&x);
        let rel = (&ours - &reference).abs() / (reference.abs() + 1e-30);
        let worst = rel
            .where_self(&reference.abs().gt(1e-30), &rel.zeros_like())
            .max()
            .double_value(&[]);
        assert!(worst < 2e-6, "relative error {worst}");

        let leaf = x.detach().set_requires_grad(true);
        let y = mish(&leaf);
        // The tangent line's value is Mish's within a rounding of x·y'.
        let off = ((&y - &ours).abs() - (x.abs() + 1.0) * 5e-7).max();
        assert!(off.double_value(&[]) <= 0.0, "value off by {off:?}");
        let g = Tensor::run_backward(&[y.sum(Kind::Float)], &[&leaf], false, false).remove(0);
        let leaf2 = x.detach().set_requires_grad(true);
        let g_ref = Tensor::run_backward(&[leaf2.mish().sum(Kind::Float)], &[&leaf2], false, false)
            .remove(0);
        assert!((g - g_ref).abs().max().double_value(&[]) < 2e-6);
    }

    #[test]
    fn large_inputs_agree() {
        let x = Tensor::randn([300_000], (Kind::Float, Device::Cpu)) * 4.0;
        let diff = (mish_inference(&x) - x.mish())
            .abs()
            .max()
            .double_value(&[]);
        assert!(diff < 1e-5);
    }

    #[test]
    fn dropout_mask_has_the_right_rate_and_scale() {
        let mut rng = SmallRng::seed_from_u64(0);
        let p = 0.1;
        let mask = dropout_mask(&mut rng, &[1001, 999], p);
        let dropped = mask
            .eq(0.0)
            .to_kind(Kind::Float)
            .mean(Kind::Float)
            .double_value(&[]);
        assert!((dropped - p).abs() < 0.002, "rate {dropped}");
        let kept = mask.max().double_value(&[]);
        assert!((kept - 1.0 / (1.0 - p)).abs() < 1e-6);
    }

    trait CatExtra {
        fn cat_extra(&self, v: &[f32]) -> Tensor;
    }
    impl CatExtra for Tensor {
        fn cat_extra(&self, v: &[f32]) -> Tensor {
            Tensor::cat(&[self.shallow_clone(), Tensor::from_slice(v)], 0)
        }
    }
}
