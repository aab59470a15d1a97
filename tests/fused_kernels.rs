//! The fused CUDA kernels against the torch operations they replace. Each case runs twice:
//! `gpu::` on a CUDA GPU, eager and captured in a CUDA graph (ignored by default; scripts/gpu_check.sh
//! runs them, and each fails, not passes, without a GPU), and `cpu::` on the CPU through the
//! kernels' host build (the same CUDA C compiled by the host's C++ compiler, its threads and
//! barriers emulated: `cuda::fused::host`), eager only. Tolerance: 1e-5 absolute or 1e-4 relative.
mod common;

use std::sync::{Mutex, MutexGuard, PoisonError};

use tch::{Device, Kind, Tensor};
use tdmpc2::agent::ensemble::{Ensemble, Heads};
use tdmpc2::agent::layers::simnorm;
use tdmpc2::agent::math::TwoHot;
use tdmpc2::agent::params::{FlatParams, ParamVisitor};
use tdmpc2::cuda::fused::{self, Affine, FusedError, MppiSettings, Refit};
use tdmpc2::cuda::{cuda_graphs_available, CudaGraph};

/// One case at a time: the cases switch the process's `fused_kernels`.
static ONE_CASE: Mutex<()> = Mutex::new(());

fn one_case() -> MutexGuard<'static, ()> {
    ONE_CASE.lock().unwrap_or_else(PoisonError::into_inner)
}

fn gpu() -> Device {
    assert!(cuda_graphs_available(), "no CUDA GPU (or no shim) here");
    Device::Cuda(0)
}

fn cpu() -> Device {
    fused::host::load().unwrap_or_else(|e| panic!("{e}"));
    Device::Cpu
}

/// Each case on the GPU (`gpu::case`) and on the CPU through the host build (`cpu::case`).
macro_rules! on_gpu_and_cpu {
    ($($case:ident),* $(,)?) => {
        mod gpu {
            $(
                #[test]
                #[ignore = "needs a CUDA GPU: scripts/gpu_check.sh"]
                fn $case() {
                    let _one = super::one_case();
                    super::$case(super::gpu());
                }
            )*
        }
        mod cpu {
            $(
                #[test]
                fn $case() {
                    let _one = super::one_case();
                    super::$case(super::cpu());
                }
            )*
        }
    };
}

on_gpu_and_cpu!(
    layer_norm_then_mish_or_simnorm_equal_torchs,
    layer_norm_of_stacked_members_equals_torchs,
    layer_norm_kernels_backward_equals_torchs_autograd,
    the_policy_action_equals_torchs_with_and_without_masks,
    the_q_bootstrap_equals_two_decoded_heads_averaged,
    the_two_hot_cross_entropy_and_its_gradient_equal_torchs,
    a_q_pair_with_the_fused_kernels_equals_the_member_by_member_pair,
    gathering_members_equals_index_select_on_each_stack,
    mppi_selection_refit_and_resampling_equal_the_planners_torch_operations,
    plans_with_the_fused_refit_equal_plans_with_torch_operations,
);

fn assert_close(what: &str, ours: &Tensor, theirs: &Tensor) {
    assert_close_at_scale(what, ours, theirs, &theirs.abs());
}

/// As [`assert_close`], relative to `scale` rather than to the result: where the result is a
/// sum whose terms nearly cancel, float32 rounds at the terms' magnitude.
fn assert_close_at_scale(what: &str, ours: &Tensor, theirs: &Tensor, scale: &Tensor) {
    assert_eq!(ours.size(), theirs.size(), "{what}: shapes");
    let diff = (ours - theirs).abs();
    let allowed = scale * 1e-4 + 1e-5;
    let over = diff.gt_tensor(&allowed).sum(Kind::Int64).int64_value(&[]);
    assert_eq!(
        over,
        0,
        "{what}: {over} entries differ by more than 1e-5 + 1e-4·|x| (largest {})",
        diff.max().double_value(&[])
    );
}

fn largest_difference(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

/// `f` run eagerly, then on a GPU captured and replayed: both must equal `expected`, and a
/// replay must give the same numbers bit for bit (no atomics).
fn eager_and_captured(what: &str, expected: &Tensor, f: impl FnMut() -> Tensor) {
    eager_and_captured_at_scale(what, expected, &expected.abs(), f);
}

fn eager_and_captured_at_scale(
    what: &str,
    expected: &Tensor,
    scale: &Tensor,
    mut f: impl FnMut() -> Tensor,
) {
    let device = expected.device();
    assert_close_at_scale(&format!("{what}, eager"), &f(), expected, scale);
    if !device.is_cuda() {
        common::not_checked("the fused kernels captured in CUDA graphs and replayed (a GPU's)");
        return;
    }
    let (graph, out) = CudaGraph::capture(device, None, 1, || Ok::<_, FusedError>(f()))
        .unwrap_or_else(|e| panic!("{what}: capture failed: {e}"));
    graph.replay().expect("replay");
    let first = out.copy();
    assert_close_at_scale(&format!("{what}, captured"), &first, expected, scale);
    graph.replay().expect("replay");
    assert!(out.equal(&first), "{what}: two replays differ");
}

fn mish(x: &Tensor) -> Tensor {
    x * x.softplus().tanh()
}

fn layer_norm_then_mish_or_simnorm_equal_torchs(device: Device) {
    tch::manual_seed(1);
    for (rows, width) in [(512, 512), (7, 1024), (4096, 256), (3, 96)] {
        let x = Tensor::randn([rows, width], (Kind::Float, device)) * 3.0;
        let w = Tensor::randn([width], (Kind::Float, device));
        let b = Tensor::randn([width], (Kind::Float, device));
        let normed = Tensor::native_layer_norm(&x, [width], Some(&w), Some(&b), 1e-5).0;
        let affine = Affine::single(&w, &b);
        eager_and_captured(&format!("LN+Mish {rows}x{width}"), &mish(&normed), || {
            fused::layer_norm_mish(&x, affine, 1e-5).unwrap()
        });
        eager_and_captured(
            &format!("LN+SimNorm {rows}x{width}"),
            &simnorm(&normed, 8),
            || fused::layer_norm_simnorm(&x, affine, 1e-5, 8).unwrap(),
        );
    }
}

/// A stack of ensemble members, each row with its member's affine parameters: the members in
/// blocks of rows (K, n, width), as the batched layers lay them out, and interleaved
/// (n, K, width), as the first layer's one matmul does.
fn layer_norm_of_stacked_members_equals_torchs(device: Device) {
    tch::manual_seed(4);
    let (members, n, width) = (2, 512, 512);
    let w = Tensor::randn([members, width], (Kind::Float, device));
    let b = Tensor::randn([members, width], (Kind::Float, device));
    for blocks in [true, false] {
        let shape = if blocks {
            [members, n, width]
        } else {
            [n, members, width]
        };
        let x = Tensor::randn(shape, (Kind::Float, device)) * 3.0;
        let (wb, bb) = if blocks {
            (w.unsqueeze(1), b.unsqueeze(1))
        } else {
            (w.shallow_clone(), b.shallow_clone())
        };
        let plain = Tensor::native_layer_norm(&x, [width], None::<Tensor>, None::<Tensor>, 1e-5).0;
        let expected = mish(&bb.addcmul(&plain, &wb)).view([-1, width]);
        let rows = x.view([-1, width]);
        let affine = Affine {
            member_rows: if blocks { n } else { 1 },
            ..Affine::single(&w, &b)
        };
        let what = if blocks { "blocks" } else { "interleaved" };
        eager_and_captured(&format!("LN+Mish, members in {what}"), &expected, || {
            fused::layer_norm_mish(&rows, affine, 1e-5).unwrap()
        });
    }
}

/// The LayerNorm kernels' backward (the update's path) against torch's autograd through the
/// composition: the wanted gradients of x, weight and bias in one tensor, for one layer and for
/// stacks of members in blocks and interleaved; with every input wanting a gradient, with the
/// parameters held (the policy's loss through the Q heads: no parameter rows), with x held, and
/// from an expanded (non-contiguous) upstream gradient; eager and captured with the backward.
fn layer_norm_kernels_backward_equals_torchs_autograd(device: Device) {
    tch::manual_seed(6);
    let (width, n) = (512, 256);
    let cases = [
        (true, true, false),
        (true, false, false),
        (false, true, false),
        (true, true, true),
    ];
    for simnorm_group in [None, Some(8)] {
        for (members, member_rows) in [(1, 1), (2, n), (2, 1)] {
            for (x_grad, params_grad, expanded) in cases {
                let rows = members * n;
                let x = (Tensor::randn([rows, width], (Kind::Float, device)) * 3.0)
                    .set_requires_grad(x_grad);
                let shape: &[i64] = if members == 1 {
                    &[width]
                } else {
                    &[members, width]
                };
                let w = Tensor::randn(shape, (Kind::Float, device)).set_requires_grad(params_grad);
                let b = Tensor::randn(shape, (Kind::Float, device)).set_requires_grad(params_grad);
                // Small, so that the gradients summed over rows stay near 1 and float rounding
                // within the tolerance.
                let upstream = Tensor::randn([rows, width], (Kind::Float, device)) * 0.1;
                let wanted: Vec<&Tensor> = [&x, &w, &b]
                    .into_iter()
                    .filter(|t| t.requires_grad())
                    .collect();
                let gradients = |y: Tensor| {
                    let loss = if expanded {
                        y.sum(Kind::Float) * 0.01
                    } else {
                        (y * &upstream).sum(Kind::Float)
                    };
                    let grads = Tensor::run_backward(&[loss], &wanted, false, false);
                    Tensor::cat(
                        &grads.iter().map(|g| g.flatten(0, -1)).collect::<Vec<_>>(),
                        0,
                    )
                };
                let cycles = rows / (members * member_rows);
                let per_row = |p: &Tensor| {
                    p.reshape([1, members, 1, width])
                        .expand([cycles, members, member_rows, width], false)
                        .reshape([rows, width])
                };
                let plain =
                    Tensor::native_layer_norm(&x, [width], None::<Tensor>, None::<Tensor>, 1e-5).0;
                let z = per_row(&b) + plain * per_row(&w);
                let expected = gradients(match simnorm_group {
                    None => z.mish(),
                    Some(group) => simnorm(&z, group),
                });
                let affine = Affine {
                    member_rows,
                    ..Affine::single(&w, &b)
                };
                let what = format!(
                    "{} backward, {members} members of {member_rows} rows, gradients for x \
                     {x_grad} and parameters {params_grad}, expanded upstream {expanded}",
                    if simnorm_group.is_some() {
                        "LN+SimNorm"
                    } else {
                        "LN+Mish"
                    }
                );
                eager_and_captured(&what, &expected, || {
                    gradients(match simnorm_group {
                        None => fused::layer_norm_mish(&x, affine, 1e-5).unwrap(),
                        Some(group) => fused::layer_norm_simnorm(&x, affine, 1e-5, group).unwrap(),
                    })
                });
            }
        }
    }
}

fn the_policy_action_equals_torchs_with_and_without_masks(device: Device) {
    tch::manual_seed(2);
    let (rows, a, per) = (6 * 512, 6, 512);
    let head = Tensor::randn([rows, 2 * a], (Kind::Float, device)) * 2.0;
    let eps = Tensor::randn([rows, a], (Kind::Float, device));
    let (low, dif) = (-10.0, 12.0);
    let parts = head.split(a, 1);
    let log_std = (parts[1].tanh() + 1.0) * (0.5 * dif) + low;
    let expected = (&parts[0] + &eps * log_std.exp()).tanh();
    eager_and_captured("policy action", &expected, || {
        fused::policy_action(&head, &eps, None, low, dif).unwrap()
    });
    let mask = Tensor::randint(2, [rows / per, a], (Kind::Float, device));
    let masked = &expected * mask.repeat_interleave_self_int(per, 0, None);
    eager_and_captured("masked policy action", &masked, || {
        fused::policy_action(&head, &eps, Some((&mask, per)), low, dif).unwrap()
    });
}

fn the_q_bootstrap_equals_two_decoded_heads_averaged(device: Device) {
    tch::manual_seed(3);
    let two_hot = TwoHot::new(101, -10.0, 10.0, device);
    let rows = 16 * 512;
    let logits = Tensor::randn([2, rows, 101], (Kind::Float, device)) * 4.0;
    let returns = Tensor::randn([rows], (Kind::Float, device)) * 50.0;
    let (q1, q2) = (
        two_hot.decode(&logits.get(0)),
        two_hot.decode(&logits.get(1)),
    );
    let q = ((&q1 + &q2) / 2.0).view([rows]);
    // The heads' values of thousands, and the returns, nearly cancel in some rows: float32
    // rounds at the terms' magnitude.
    let magnitude = ((q1.abs() + q2.abs()) / 2.0).view([rows]);
    let terms = |factor: &Tensor| returns.abs() + &magnitude * factor;
    let scalar = Tensor::from_slice(&[0.99f32.powi(3)]).to_device(device);
    eager_and_captured_at_scale(
        "q bootstrap, one factor",
        &(&returns + &q * &scalar),
        &terms(&scalar),
        || fused::q_bootstrap(&logits, &two_hot.support, &returns, &scalar).unwrap(),
    );
    let per_row = Tensor::rand([rows], (Kind::Float, device));
    eager_and_captured_at_scale(
        "q bootstrap, a factor a row",
        &(&returns + &q * &per_row),
        &terms(&per_row),
        || fused::q_bootstrap(&logits, &two_hot.support, &returns, &per_row).unwrap(),
    );
}

/// The update's two-hot cross-entropy: the loss and its gradient with respect to the logits
/// (torch's autograd through the composition), five heads sharing each target, with targets
/// beyond the support and non-finite ones among them.
fn the_two_hot_cross_entropy_and_its_gradient_equal_torchs(device: Device) {
    tch::manual_seed(5);
    let two_hot = TwoHot::new(101, -10.0, 10.0, device);
    let (heads, rows) = (5, 3 * 256);
    let logits = Tensor::randn([heads, rows, 101], (Kind::Float, device)) * 4.0;
    let target = Tensor::randn([rows, 1], (Kind::Float, device)) * 300.0;
    let special = Tensor::from_slice(&[f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, 1e6])
        .to_device(device)
        .view([5, 1]);
    target.narrow(0, 0, 5).copy_(&special);
    let leaf = logits.copy().set_requires_grad(true);
    let expected_loss = {
        let log_probs = leaf.log_softmax(-1, Kind::Float);
        -(two_hot.encode(&target) * log_probs).sum_dim_intlist(-1, true, Kind::Float)
    };
    expected_loss.sum(Kind::Float).backward();
    let expected = Tensor::cat(
        &[
            expected_loss.detach().view([-1, 1]),
            leaf.grad().view([-1, 101]),
        ],
        1,
    );
    let bins = two_hot.bins();
    let flat_logits = logits.view([-1, 101]);
    let flat_target = target.view([-1]);
    eager_and_captured("two-hot cross-entropy and gradient", &expected, || {
        let (loss, grad) = fused::two_hot_soft_ce(&flat_logits, &flat_target, bins).unwrap();
        Tensor::cat(&[loss.view([-1, 1]), grad], 1)
    });
}

/// A Q pair through the ensemble with the fused kernels on, both ways it can go: at 512 rows all
/// five heads and then the pair kept, at 8,192 the pair picked and stacked; each against the
/// member-by-member torch path with the fused kernels off.
fn a_q_pair_with_the_fused_kernels_equals_the_member_by_member_pair(device: Device) {
    tch::manual_seed(6);
    let mut q = Ensemble::new(5, 512 + 6, &[512, 512], 101, 0.01);
    let _params = FlatParams::pack(&mut [("q", &mut q as &mut dyn ParamVisitor)], device, true);
    let pair = Heads::pair(3, 1, device);
    for rows in [512, 16 * 512] {
        let x = Tensor::randn([rows, 512 + 6], (Kind::Float, device));
        fused::set_enabled(false);
        let by_member = tch::no_grad(|| q.forward(&x, &pair, false, None).unwrap());
        fused::set_enabled(true);
        // Without gradients (the plan, the TD target, the policy's loss with the heads held)
        // the pair's parameters come from one gather; with them, from a copy per stack.
        let weight = &q.layers[0].weight;
        assert!(!fused::gathers(&[weight]), "parameters wanting gradients");
        assert!(tch::no_grad(|| fused::gathers(&[weight])));
        assert!(fused::gathers(&[&weight.detach()]));
        let gathered = tch::no_grad(|| q.forward(&x, &pair, false, None)).unwrap();
        let held = q.forward(&x, &pair, true, None).unwrap();
        let copied = q.forward(&x, &pair, false, None).unwrap();
        assert!(!gathered.requires_grad() && !held.requires_grad());
        let copied_grad = Tensor::run_backward(&[copied.sum(Kind::Float)], &[weight], false, false);
        fused::set_enabled(false);
        let by_member_grad = |x: &Tensor| {
            Tensor::run_backward(
                &[q.forward(x, &pair, false, None).unwrap().sum(Kind::Float)],
                &[weight],
                false,
                false,
            )
            .remove(0)
        };
        let (by_member_grad, reordered_grad) = (by_member_grad(&x), by_member_grad(&x.flip(0)));
        for (route, out) in [("gathered", gathered), ("held", held), ("copied", copied)] {
            assert_close(
                &format!("Q pair, {rows} rows, {route}"),
                &out.detach(),
                &by_member,
            );
        }
        // A sum over thousands of rows: float32 rounds it differently in another order, so
        // the stacked route may differ from torch's by what torch's own route differs by with
        // the rows reversed.
        let (ours, torchs) = (
            largest_difference(&copied_grad[0], &by_member_grad),
            largest_difference(&reordered_grad, &by_member_grad),
        );
        assert!(
            ours <= 4.0 * torchs + 1e-6,
            "Q pair, {rows} rows: the first layer's weight gradient differs from torch's by \
             {ours}, torch's from itself with the rows reversed by {torchs}"
        );
    }
}

/// The members of several stacks in one kernel equal index_select on each, eager and
/// captured; an index out of range gives NaN rather than reading outside the stack.
fn gathering_members_equals_index_select_on_each_stack(device: Device) {
    tch::manual_seed(8);
    let stacks: Vec<Tensor> = [
        vec![5, 512, 518],
        vec![5, 512],
        vec![5, 101, 512],
        vec![5, 3],
    ]
    .iter()
    .map(|shape| Tensor::randn(shape.as_slice(), (Kind::Float, device)))
    .collect();
    let refs: Vec<&Tensor> = stacks.iter().collect();
    fused::set_enabled(true);
    let applies = fused::gathers(&refs);
    fused::set_enabled(false);
    assert!(applies, "the gather should take these stacks");
    let index = Tensor::from_slice(&[4i64, 0]).to_device(device);
    let expected = Tensor::cat(
        &stacks
            .iter()
            .map(|s| s.index_select(0, &index).flatten(0, -1))
            .collect::<Vec<_>>(),
        0,
    );
    eager_and_captured("gathered members", &expected, || {
        let picks = fused::gather_members(&refs, &index).unwrap();
        Tensor::cat(
            &picks.iter().map(|p| p.flatten(0, -1)).collect::<Vec<_>>(),
            0,
        )
    });
    let outside = Tensor::from_slice(&[5i64, 1]).to_device(device);
    let picks = fused::gather_members(&refs, &outside).unwrap();
    assert_eq!(picks[1].get(0).isnan().all().int64_value(&[]), 1);
    assert!(picks[1].get(1).equal(&stacks[1].get(1)));
}

/// The planner's selection and refit as torch operations (src/agent/planner/mod.rs).
fn refit_with_torch(
    values: &Tensor,
    candidates: &Tensor,
    mask: Option<&Tensor>,
    s: MppiSettings,
) -> Refit {
    let [e, h, _, a] = candidates.size()[..] else {
        unreachable!()
    };
    let k = s.elites;
    let value = values.nan_to_num(0.0, None, None);
    let (_, idx) = value.topk(k, 1, true, true);
    let elite_value = value.gather(1, &idx, false).unsqueeze(2);
    let elites = candidates.gather(
        2,
        &idx.view([e, 1, k, 1]).expand([e, h, k, a], false),
        false,
    );
    let (max_value, _) = elite_value.max_dim(1, true);
    let mut score = ((&elite_value - max_value) * s.temperature).exp();
    score = &score / score.sum_dim_intlist(1, true, Kind::Float);
    let weights = score.unsqueeze(1);
    let total = score.sum_dim_intlist(1, true, Kind::Float) + 1e-9;
    let mut mean = (&weights * &elites).sum_dim_intlist(2, false, Kind::Float) / &total;
    let mut std = ((&weights * (&elites - mean.unsqueeze(2)).square()).sum_dim_intlist(
        2,
        false,
        Kind::Float,
    ) / &total)
        .sqrt()
        .clamp(s.min_std, s.max_std);
    if let Some(mask) = mask {
        mean *= mask.view([e, 1, a]);
        std *= mask.view([e, 1, a]);
    }
    Refit {
        score: score.squeeze_dim(2),
        elites,
        mean,
        std,
    }
}

fn mppi_selection_refit_and_resampling_equal_the_planners_torch_operations(device: Device) {
    tch::manual_seed(4);
    let settings = MppiSettings {
        elites: 64,
        policy_rows: 24,
        temperature: 0.5,
        min_std: 0.05,
        max_std: 2.0,
    };
    for (e, h, n, a, masked) in [
        (1, 3, 512, 6, false),
        (16, 3, 512, 38, true),
        (3, 5, 100, 1, false),
    ] {
        let what = format!("E={e} H={h} N={n} A={a} mask={masked}");
        let candidates =
            (Tensor::randn([e, h, n, a], (Kind::Float, device)) * 0.6).clamp(-1.0, 1.0);
        let values = Tensor::randn([e, n], (Kind::Float, device)) * 30.0;
        // A diverged candidate or two: NaN counts as 0, +inf as the largest float.
        let _ = values.get(0).get(5).fill_(f64::NAN);
        let _ = values.get(0).get(9).fill_(f64::INFINITY);
        let mask = masked.then(|| {
            let m = Tensor::ones([e, a], (Kind::Float, device));
            let _ = m.narrow(1, a / 2, a - a / 2).fill_(0.0);
            m
        });
        let expected = refit_with_torch(&values, &candidates, mask.as_ref(), settings);
        let draws = Tensor::randn([e, h, n - settings.policy_rows, a], (Kind::Float, device));
        let next = candidates.copy();
        let mut sampled =
            (expected.mean.unsqueeze(2) + expected.std.unsqueeze(2) * &draws).clamp(-1.0, 1.0);
        if let Some(m) = &mask {
            sampled *= m.view([e, 1, 1, a]);
        }
        next.narrow(2, settings.policy_rows, n - settings.policy_rows)
            .copy_(&sampled);

        let ours = fused::mppi_refit(&values, &candidates, mask.as_ref(), None, settings).unwrap();
        assert!(
            ours.elites.equal(&expected.elites),
            "{what}: other elites or order"
        );
        assert_close(&format!("{what} score"), &ours.score, &expected.score);
        assert_close(&format!("{what} mean"), &ours.mean, &expected.mean);
        assert_close(&format!("{what} std"), &ours.std, &expected.std);

        let resampled = candidates.copy();
        let refit =
            fused::mppi_refit(&values, &resampled, mask.as_ref(), Some(&draws), settings).unwrap();
        assert!(
            refit.elites.equal(&expected.elites),
            "{what}: elites after resampling"
        );
        assert_close(&format!("{what} next candidates"), &resampled, &next);

        let fresh = candidates.copy();
        fused::mppi_sample(
            &fresh,
            &expected.mean,
            &expected.std,
            mask.as_ref(),
            &draws,
            settings.policy_rows,
        )
        .unwrap();
        assert_close(&format!("{what} first samples"), &fresh, &next);

        eager_and_captured(&format!("{what} mean, captured"), &expected.mean, || {
            fused::mppi_refit(&values, &candidates, mask.as_ref(), None, settings)
                .unwrap()
                .mean
        });
    }
}

/// Plans with the fused kernels (refit, LayerNorm and activations, policy action, Q bootstrap)
/// equal plans with torch's operations from the same draws, at model sizes 1 and 5, over two
/// plans (the second warm-started) for one and for several environments, with the zero-initialised heads
/// drawn at random. Six iterations of MPPI amplify rounding (elites near the cut, softmax
/// weights of values in the hundreds), so the actions and warm starts may differ from torch's
/// by what torch's own differ by when the observations change by one part in a million (at
/// most 4× that, plus 1e-5), on an input where that is under 1e-3 (on some CPUs an input sits
/// at an elite cut, where a nudge flips an elite: the next input is taken).
fn plans_with_the_fused_refit_equal_plans_with_torch_operations(device: Device) {
    use tdmpc2::agent::{AgentConfig, Planner, TorchNoise, WorldModel};
    // One environment too: its policy prior runs once for all the policy's trajectories.
    for (size, envs) in [(1, 4), (5, 4), (5, 1)] {
        let config = AgentConfig::defaults(Some(size), 24, 6).unwrap();
        tch::manual_seed(5);
        let mut model = WorldModel::new(&config, device).unwrap();
        // The reward and Q heads start at zero, so every candidate would be worth 0 and the
        // elites a matter of how ties break (torch's topk does not say).
        let heads = model
            .named_tensors()
            .into_iter()
            .map(|(name, t)| {
                match t.kind() == Kind::Float && t.abs().max().double_value(&[]) == 0.0 {
                    true => (name, t.randn_like() * 0.1),
                    false => (name, t),
                }
            })
            .collect();
        model.load_named(heads).unwrap();
        // The first actions, the second (warm-started but for environment 1) actions and the
        // last warm start.
        let second_starts: Vec<bool> = (0..envs).map(|i| i == 1).collect();
        let plan = |fused: bool, obs: &Tensor| -> [Tensor; 3] {
            fused::set_enabled(fused);
            let mut planner = Planner::new(&config, device, envs).unwrap();
            let mut noise = TorchNoise::seeded(11);
            let first = planner
                .plan_batch(&model, obs, &vec![true; envs], false, &mut noise)
                .unwrap();
            let second = planner
                .plan_batch(&model, obs, &second_starts, false, &mut noise)
                .unwrap();
            [first, second, planner.prev_mean().copy()]
        };
        // An input where torch's own plan sits at an elite cut (a nudge of one part in a
        // million moves it as far as any error would) shows nothing: it is skipped, said so,
        // and one of the first few inputs must be stable.
        let stable = (0..4).find(|&draw| {
            tch::manual_seed(17 + draw);
            let obs = Tensor::randn([envs as i64, 24], (Kind::Float, device));
            let torch = plan(false, &obs);
            let nudged = [
                plan(false, &(&obs * (1.0 + 1e-6))),
                plan(false, &(&obs * (1.0 - 1e-6))),
            ];
            let torchs: Vec<f64> = (0..3)
                .map(|i| {
                    (nudged.iter())
                        .map(|n| largest_difference(&n[i], &torch[i]))
                        .fold(0.0, f64::max)
                })
                .collect();
            let bound = |torchs: f64| 4.0 * torchs + 1e-5;
            if torchs.iter().any(|&t| bound(t) > 1e-3) {
                eprintln!(
                    "size {size}, {envs} environments, input {draw}: torch's plan moves by {torchs:?} under a nudge \
                     of one part in a million (an elite cut); the next input"
                );
                return false;
            }
            let fused = plan(true, &obs);
            fused::set_enabled(false);
            for (i, what) in ["first actions", "second actions", "warm start"]
                .iter()
                .enumerate()
            {
                let ours = largest_difference(&fused[i], &torch[i]);
                assert!(
                    ours <= bound(torchs[i]),
                    "size {size}, {envs} environments, {what}: the fused plan differs from torch's by {ours}, \
                     torch's from itself with the observations nudged by one part in a million \
                     by {}",
                    torchs[i]
                );
            }
            true
        });
        assert!(
            stable.is_some(),
            "size {size}, {envs} environments: torch's plan is at an elite cut on every input"
        );
    }
}
