//! LayerNorm followed by Mish or SimNorm as one autograd node: our row kernel forward, and our
//! row kernel backward (dx, with each row's share of the weight's and bias's gradients, summed
//! over each member's rows by torch). tch has no custom autograd functions, so the node is the
//! shim's (`LayerNormActivation` in src/cuda/shim.cpp), which launches the kernels loaded here.
use std::ffi::c_void;

use tch::Tensor;

use super::kernels::{input, matrix, refused, warp_rows};
use super::module::kernel;
use super::FusedError;

/// Mish(LayerNorm(x)·weight + bias) over the last dim of x [rows, width]. `weight` and `bias`
/// are [width], or [members, width] for a stack of ensemble members where row r takes member
/// (r / member_rows) % members (see [`Affine`]). Joined to autograd where an input wants a
/// gradient.
pub fn layer_norm_mish(x: &Tensor, affine: Affine, eps: f64) -> Result<Tensor, FusedError> {
    layer_norm_then(Activation::Mish, x, affine, eps)
}

/// SimNorm(LayerNorm(x)·weight + bias): a softmax within each group of `group` features.
pub fn layer_norm_simnorm(
    x: &Tensor,
    affine: Affine,
    eps: f64,
    group: i64,
) -> Result<Tensor, FusedError> {
    layer_norm_then(Activation::SimNorm(group), x, affine, eps)
}

/// A LayerNorm's weight and bias: [width] for one layer, or [members, width] for a stack of
/// ensemble members, where `member_rows` consecutive rows share a member and the members
/// cycle: 1 for rows laid out [n, members, width], n for [members, n, width].
#[derive(Clone, Copy)]
pub struct Affine<'a> {
    pub weight: &'a Tensor,
    pub bias: &'a Tensor,
    pub member_rows: i64,
}

impl<'a> Affine<'a> {
    /// One layer's parameters, [width].
    pub fn single(weight: &'a Tensor, bias: &'a Tensor) -> Self {
        Self {
            weight,
            bias,
            member_rows: 1,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Activation {
    Mish,
    SimNorm(i64),
}

impl Activation {
    fn kernels(self) -> (&'static str, &'static str) {
        match self {
            Activation::Mish => ("layer_norm_mish", "layer_norm_mish_backward"),
            Activation::SimNorm(_) => ("layer_norm_simnorm", "layer_norm_simnorm_backward"),
        }
    }

    /// The shim's code for it: 0 for Mish, else SimNorm's group.
    fn group(self) -> i64 {
        match self {
            Activation::Mish => 0,
            Activation::SimNorm(group) => group,
        }
    }
}

/// What the shim's node needs besides its tensors (`LayerNormActivationSettings` there).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Settings {
    /// The kernels, or null for the same formulas as torch operations (the CPU's, for tests).
    forward: *mut c_void,
    backward: *mut c_void,
    blocks: u32,
    threads: u32,
    eps: f64,
    members: i64,
    member_rows: i64,
    group: i64,
}

/// Checks the inputs, then runs the shim's node with `activation`'s kernels.
fn layer_norm_then(
    activation: Activation,
    x: &Tensor,
    affine: Affine,
    eps: f64,
) -> Result<Tensor, FusedError> {
    let (name, backward) = activation.kernels();
    let mut settings = checked(name, activation, x, affine, eps)?;
    if !super::launch_on(x.device()) {
        return Err(refused(name, format!("x is on {:?}", x.device())));
    }
    settings.forward = kernel(x.device(), name)?.handle();
    settings.backward = kernel(x.device(), backward)?.handle();
    imp::layer_norm_activation(x, affine, &settings)
}

/// The settings for x and `affine`, or what is wrong with their shapes and devices (on CUDA
/// also their kind and layout: the kernels read contiguous float32).
fn checked(
    name: &'static str,
    activation: Activation,
    x: &Tensor,
    affine: Affine,
    eps: f64,
) -> Result<Settings, FusedError> {
    let (rows, width) = matrix(name, "x", x)?;
    if let Activation::SimNorm(group) = activation {
        if group < 1 || width % group != 0 {
            return Err(refused(
                name,
                format!("width {width} is not a multiple of the group {group}"),
            ));
        }
    }
    let (members, shape) = match affine.weight.size()[..] {
        [_] => (1, vec![width]),
        [members, _] => (members, vec![members, width]),
        ref other => {
            return Err(refused(
                name,
                format!("weight has shape {other:?}, not [width] or [members, width]"),
            ))
        }
    };
    if affine.member_rows < 1 || members < 1 || rows % (affine.member_rows * members) != 0 {
        return Err(refused(
            name,
            format!(
                "{rows} rows are not whole cycles of {members} members of {} rows each",
                affine.member_rows
            ),
        ));
    }
    let device = x.device();
    for (what, t, shape) in [
        ("x", x, vec![rows, width]),
        ("weight", affine.weight, shape.clone()),
        ("bias", affine.bias, shape),
    ] {
        if t.device() != device {
            return Err(refused(
                name,
                format!("{what} is on {:?}, x on {device:?}", t.device()),
            ));
        }
        if super::launch_on(device) {
            input(name, device, what, t, &shape)?;
        } else if t.size() != shape {
            return Err(refused(
                name,
                format!("{what} has shape {:?}, not {shape:?}", t.size()),
            ));
        }
    }
    let launch = warp_rows(rows);
    Ok(Settings {
        forward: std::ptr::null_mut(),
        backward: std::ptr::null_mut(),
        blocks: launch.blocks,
        threads: launch.threads,
        eps,
        members,
        member_rows: affine.member_rows,
        group: activation.group(),
    })
}

#[cfg(tdmpc2_cuda_graphs)]
mod imp {
    use std::ffi::{c_char, c_void};

    use tch::Tensor;

    use super::{Affine, FusedError, Settings};
    use crate::cuda::graph::imp::new_tensor;

    extern "C" {
        fn tdmpc2_layer_norm_activation(
            x: *mut c_void,
            weight: *mut c_void,
            bias: *mut c_void,
            settings: *const Settings,
            out: *mut *mut c_void,
        ) -> *mut c_char;
    }

    pub fn layer_norm_activation(
        x: &Tensor,
        affine: Affine,
        settings: &Settings,
    ) -> Result<Tensor, FusedError> {
        // SAFETY: tch's tensor handles are pointers to the at::Tensors the shim expects; it
        // reads them and the settings during the call only (the node keeps its own copies).
        Ok(new_tensor("layer norm activation", |out| unsafe {
            tdmpc2_layer_norm_activation(
                x.as_ptr() as *mut c_void,
                affine.weight.as_ptr() as *mut c_void,
                affine.bias.as_ptr() as *mut c_void,
                settings,
                out,
            )
        })?)
    }
}

#[cfg(not(tdmpc2_cuda_graphs))]
mod imp {
    use tch::Tensor;

    use super::{Affine, FusedError, Settings};

    pub fn layer_norm_activation(
        _: &Tensor,
        _: Affine,
        _: &Settings,
    ) -> Result<Tensor, FusedError> {
        Err(FusedError::NotBuilt(env!("TDMPC2_CUDA_GRAPHS_MISSING")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    /// Bad inputs are refused before anything launches, naming the kernel and the input.
    #[test]
    fn inputs_off_the_gpu_or_misshapen_are_refused_by_name() {
        let x = Tensor::zeros([4, 8], (Kind::Float, Device::Cpu));
        let w = Tensor::ones([8], (Kind::Float, Device::Cpu));
        let e = layer_norm_mish(&x, Affine::single(&w, &w), 1e-5)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("layer_norm_mish") && e.contains("x is on Cpu"),
            "{e}"
        );
        let e = layer_norm_simnorm(&x, Affine::single(&w, &w), 1e-5, 3)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a multiple of the group 3"), "{e}");
        let three = Tensor::ones([3, 8], (Kind::Float, Device::Cpu));
        let stacked = Affine {
            member_rows: 1,
            ..Affine::single(&three, &three)
        };
        let e = layer_norm_mish(&x, stacked, 1e-5).unwrap_err().to_string();
        assert!(e.contains("not whole cycles of 3 members"), "{e}");
        let short = Tensor::ones([7], (Kind::Float, Device::Cpu));
        let e = checked(
            "layer_norm_mish",
            Activation::Mish,
            &x,
            Affine::single(&w, &short),
            1e-5,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("bias has shape [7], not [8]"), "{e}");
        let scalar = Tensor::ones([], (Kind::Float, Device::Cpu));
        let e = layer_norm_mish(&x, Affine::single(&scalar, &scalar), 1e-5)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not [width] or [members, width]"), "{e}");
    }

    /// torch's composition: LayerNorm without affine, each row's member's affine, then the
    /// activation (as the CPU path of the agent's layers computes it).
    fn composition(x: &Tensor, affine: Affine, activation: Activation) -> Tensor {
        let (rows, width) = x.size2().unwrap();
        let members = affine.weight.numel() as i64 / width;
        let cycles = rows / (members * affine.member_rows);
        let per_row = |p: &Tensor| {
            p.reshape([1, members, 1, width])
                .expand([cycles, members, affine.member_rows, width], false)
                .reshape([rows, width])
        };
        let plain = Tensor::native_layer_norm(x, [width], None::<Tensor>, None::<Tensor>, 1e-5).0;
        let z = per_row(affine.bias) + plain * per_row(affine.weight);
        match activation {
            Activation::Mish => z.mish(),
            Activation::SimNorm(group) => z
                .view([rows, width / group, group])
                .softmax(-1, Kind::Float)
                .view([rows, width]),
        }
    }

    fn assert_close(what: &str, ours: &Tensor, theirs: &Tensor) {
        assert_eq!(ours.size(), theirs.size(), "{what}: shapes");
        let diff = (ours - theirs).abs();
        let over = diff
            .gt_tensor(&(theirs.abs() * 1e-4 + 1e-5))
            .sum(Kind::Int64)
            .int64_value(&[]);
        assert_eq!(
            over,
            0,
            "{what}: largest difference {}",
            diff.max().double_value(&[])
        );
    }

    /// The shim's node with the CPU's formulas (the ones the kernels compute) against torch's
    /// autograd through the composition: the output and every gradient, for one layer and for
    /// stacks of members in blocks and interleaved, and with only some inputs wanting
    /// gradients (the policy's loss through Q heads whose parameters are held).
    #[cfg(tdmpc2_cuda_graphs)]
    #[test]
    fn the_nodes_formulas_and_gradients_equal_torchs_autograd() {
        tch::manual_seed(11);
        let cpu = (Kind::Float, Device::Cpu);
        let (width, n) = (64, 6);
        for activation in [Activation::Mish, Activation::SimNorm(8)] {
            for (members, member_rows) in [(1, 1), (3, n), (3, 1)] {
                for (x_grad, params_grad) in [(true, true), (true, false), (false, true)] {
                    let what = format!(
                        "{activation:?}, {members} members of {member_rows} rows, gradients \
                         for x {x_grad} and parameters {params_grad}"
                    );
                    let rows = members * n;
                    let x = (Tensor::randn([rows, width], cpu) * 3.0).set_requires_grad(x_grad);
                    let shape: &[i64] = if members == 1 {
                        &[width]
                    } else {
                        &[members, width]
                    };
                    let w = Tensor::randn(shape, cpu).set_requires_grad(params_grad);
                    let b = Tensor::randn(shape, cpu).set_requires_grad(params_grad);
                    let upstream = Tensor::randn([rows, width], cpu);
                    let affine = Affine {
                        member_rows,
                        ..Affine::single(&w, &b)
                    };
                    let settings = checked("test", activation, &x, affine, 1e-5).unwrap();
                    let ours = imp::layer_norm_activation(&x, affine, &settings).unwrap();
                    let theirs = composition(&x, affine, activation);
                    assert_close(&format!("{what}: output"), &ours, &theirs);
                    // Without gradients there is no node, and the same numbers.
                    let plain =
                        tch::no_grad(|| imp::layer_norm_activation(&x, affine, &settings).unwrap());
                    assert!(!plain.requires_grad() && ours.requires_grad(), "{what}");
                    assert!(plain.equal(&ours.detach()), "{what}: without a node");
                    let inputs = [&x, &w, &b];
                    let wanted: Vec<&Tensor> =
                        inputs.into_iter().filter(|t| t.requires_grad()).collect();
                    let ours_grads = Tensor::run_backward(
                        &[(&ours * &upstream).sum(Kind::Float)],
                        &wanted,
                        false,
                        false,
                    );
                    let theirs_grads = Tensor::run_backward(
                        &[(&theirs * &upstream).sum(Kind::Float)],
                        &wanted,
                        false,
                        false,
                    );
                    for (i, (o, t)) in ours_grads.iter().zip(&theirs_grads).enumerate() {
                        assert_close(&format!("{what}: gradient {i}"), o, t);
                    }
                }
            }
        }
    }

    /// An upstream gradient that is not contiguous (the sum's expanded ones) reaches the node
    /// as it would from any loss.
    #[cfg(tdmpc2_cuda_graphs)]
    #[test]
    fn an_expanded_upstream_gradient_is_taken() {
        let cpu = (Kind::Float, Device::Cpu);
        let x = Tensor::randn([4, 16], cpu).set_requires_grad(true);
        let (w, b) = (Tensor::ones([16], cpu), Tensor::zeros([16], cpu));
        let affine = Affine::single(&w, &b);
        let settings = checked("test", Activation::Mish, &x, affine, 1e-5).unwrap();
        let ours = imp::layer_norm_activation(&x, affine, &settings).unwrap();
        let dx = Tensor::run_backward(&[ours.sum(Kind::Float)], &[&x], false, false);
        let theirs = composition(&x, affine, Activation::Mish).sum(Kind::Float);
        let expected = Tensor::run_backward(&[theirs], &[&x], false, false);
        assert_close("dx", &dx[0], &expected[0]);
    }
}
