//! Building blocks: NormedLinear layers and MLPs (the stacked Q ensemble is in `ensemble`).
use tch::{Device, Kind, Tensor};

use super::kernels;
use super::params::ParamVisitor;
use crate::cuda::fused::Affine;

/// LayerNorm epsilon of `nn.LayerNorm`.
const LAYER_NORM_EPS: f64 = 1e-5;

/// Standard deviation of the truncated-normal initialisation of every linear weight.
const INIT_STD: f64 = 0.02;

/// The activation closing a normed layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    Mish,
    /// Softmax within consecutive groups of this many features.
    SimNorm(i64),
}

impl Activation {
    pub fn apply(self, x: &Tensor) -> Tensor {
        match self {
            Activation::Mish => kernels::mish(x),
            Activation::SimNorm(group) => simnorm(x, group),
        }
    }
}

/// LayerNorm over the last dimension (of size `features`) with optional affine parameters:
/// torch's operator itself rather than its `layer_norm` wrapper (the same kernels and
/// gradients, fewer dispatched operators).
pub(super) fn layer_norm(x: &Tensor, features: i64, affine: Option<(&Tensor, &Tensor)>) -> Tensor {
    let (weight, bias) = match affine {
        Some((w, b)) => (Some(w), Some(b)),
        None => (None, None),
    };
    Tensor::native_layer_norm(x, [features], weight, bias, LAYER_NORM_EPS).0
}

/// LayerNorm of the last dim with affine `weight` and `bias` (1-D), then `activation`: one fused
/// kernel (and one for its backward) where
/// [`crate::cuda::fused::applies_with_gradient`] the input, torch's operations elsewhere.
pub(super) fn normed(
    x: Tensor,
    weight: &Tensor,
    bias: &Tensor,
    activation: Option<Activation>,
) -> Tensor {
    let features = *x.size().last().expect("a layer's output has features");
    if let (Some(activation), true) = (activation, crate::cuda::fused::applies_with_gradient(&x)) {
        return fused_normed(&x, Affine::single(weight, bias), activation);
    }
    let y = layer_norm(&x, features, Some((weight, bias)));
    match activation {
        Some(activation) => activation.apply(&y),
        None => y,
    }
}

/// LayerNorm and `activation` of the last dim in one fused kernel.
pub(super) fn fused_normed(x: &Tensor, affine: Affine, activation: Activation) -> Tensor {
    let shape = x.size();
    let features = *shape.last().expect("a layer's output has features");
    let rows = x.contiguous().view([-1, features]);
    let fused = match activation {
        Activation::Mish => crate::cuda::fused::layer_norm_mish(&rows, affine, LAYER_NORM_EPS),
        Activation::SimNorm(group) => {
            crate::cuda::fused::layer_norm_simnorm(&rows, affine, LAYER_NORM_EPS, group)
        }
    };
    // A kernel that cannot run is a broken installation: torch's errors surface as panics in
    // tch, and so does this one, with its cause.
    fused
        .unwrap_or_else(|e| panic!("{e} (set fused_kernels=false to run without)"))
        .view(shape.as_slice())
}

/// Simplicial normalisation: softmax over groups of `group` features of the last dim.
pub fn simnorm(x: &Tensor, group: i64) -> Tensor {
    let shape = x.size();
    let mut grouped = shape.clone();
    if let Some(last) = grouped.last_mut() {
        *last /= group;
    }
    grouped.push(group);
    super::kernels::softmax_last_dim(&x.view(grouped.as_slice())).view(shape.as_slice())
}

/// Truncated normal N(0, 0.02²) on [−2, 2] (the bounds lie 100σ out, so this is a plain normal).
fn trunc_normal(shape: &[i64]) -> Tensor {
    (Tensor::randn(shape, (Kind::Float, Device::Cpu)) * INIT_STD).clamp(-2.0, 2.0)
}

/// LayerNorm affine parameters.
#[derive(Debug)]
pub struct Norm {
    pub weight: Tensor,
    pub bias: Tensor,
}

/// A linear layer, optionally followed by dropout, LayerNorm and an activation (the official
/// `NormedLinear`); without a norm it is a plain `nn.Linear`.
#[derive(Debug)]
pub struct Layer {
    /// (out, in), as in PyTorch.
    pub weight: Tensor,
    pub bias: Tensor,
    pub norm: Option<Norm>,
    pub activation: Option<Activation>,
    pub dropout: f64,
}

impl Layer {
    pub fn plain(input: i64, output: i64) -> Self {
        Self {
            weight: trunc_normal(&[output, input]),
            bias: Tensor::zeros([output], (Kind::Float, Device::Cpu)),
            norm: None,
            activation: None,
            dropout: 0.0,
        }
    }

    pub fn normed(input: i64, output: i64, activation: Activation, dropout: f64) -> Self {
        Self {
            norm: Some(Norm {
                weight: Tensor::ones([output], (Kind::Float, Device::Cpu)),
                bias: Tensor::zeros([output], (Kind::Float, Device::Cpu)),
            }),
            activation: Some(activation),
            dropout,
            ..Self::plain(input, output)
        }
    }

    pub fn output_dim(&self) -> i64 {
        self.weight.size()[0]
    }

    /// Linear → LayerNorm → activation (dropout, used only by the Q ensemble, is applied there).
    pub fn forward(&self, x: &Tensor) -> Tensor {
        self.finish(x.linear(&self.weight, Some(&self.bias)))
    }

    /// LayerNorm and activation of a linear output.
    pub fn finish(&self, linear: Tensor) -> Tensor {
        match &self.norm {
            Some(norm) => normed(linear, &norm.weight, &norm.bias, self.activation),
            None => match self.activation {
                Some(activation) => activation.apply(&linear),
                None => linear,
            },
        }
    }
}

impl ParamVisitor for Layer {
    fn visit_params(&mut self, prefix: &str, f: &mut dyn FnMut(String, &mut Tensor)) {
        f(format!("{prefix}.weight"), &mut self.weight);
        f(format!("{prefix}.bias"), &mut self.bias);
        if let Some(norm) = &mut self.norm {
            f(format!("{prefix}.ln.weight"), &mut norm.weight);
            f(format!("{prefix}.ln.bias"), &mut norm.bias);
        }
    }
}

/// The official `mlp`: NormedLinear+Mish hidden layers (dropout only on the first), then a
/// NormedLinear with `output_activation`, or a plain Linear without one.
#[derive(Debug)]
pub struct Mlp {
    pub layers: Vec<Layer>,
}

impl Mlp {
    pub fn new(
        input: i64,
        hidden: &[i64],
        output: i64,
        output_activation: Option<Activation>,
        dropout: f64,
    ) -> Self {
        let mut layers = Vec::with_capacity(hidden.len() + 1);
        let mut width = input;
        for (i, &h) in hidden.iter().enumerate() {
            let p = if i == 0 { dropout } else { 0.0 };
            layers.push(Layer::normed(width, h, Activation::Mish, p));
            width = h;
        }
        layers.push(match output_activation {
            Some(activation) => Layer::normed(width, output, activation, 0.0),
            None => Layer::plain(width, output),
        });
        Self { layers }
    }

    pub fn forward(&self, x: &Tensor) -> Tensor {
        self.forward_from(self.layers[0].forward(x))
    }

    /// The MLP over a rollout of N rows and H steps, step-major: its inputs are
    /// `cat([z_t, per_row[t·N + r]], -1)` where z_0 is `shared` (G, S), each row shared by N/G
    /// consecutive rows, and z_t (t ≥ 1) is `later[t − 1]` (N, S); `per_row` is (H·N, R). The
    /// first layer's shared part is computed once per row of `shared`, its per-row part in one
    /// matmul for all steps. With no `later` steps this is the MLP on one step whose latents
    /// are shared (the first planning step).
    pub fn forward_rollout(&self, shared: &Tensor, later: &[Tensor], per_row: &Tensor) -> Tensor {
        let all_steps_at_once = per_row.device() != Device::Cpu;
        self.forward_rollout_with(shared, later, per_row, all_steps_at_once)
    }

    /// [`Self::forward_rollout`], the layers after the first over all steps in one call or step
    /// by step.
    fn forward_rollout_with(
        &self,
        shared: &Tensor,
        later: &[Tensor],
        per_row: &Tensor,
        all_steps_at_once: bool,
    ) -> Tensor {
        let first = &self.layers[0];
        let (groups, width) = (shared.size()[0], shared.size()[1]);
        let steps = later.len() as i64 + 1;
        let (rows, rest) = (per_row.size()[0] / steps, per_row.size()[1]);
        let latent_weight = first.weight.narrow(1, 0, width);
        let linear = per_row.linear::<Tensor>(&first.weight.narrow(1, width, rest), None);
        let out = linear.size()[1];
        let by_step = linear.view([steps, rows, out]);
        let mut step0 = by_step.get(0).view([groups, rows / groups, out]);
        step0 += shared
            .linear(&latent_weight, Some(&first.bias))
            .unsqueeze(1);
        for (t, z) in later.iter().enumerate() {
            let mut step = by_step.get(t as i64 + 1);
            step += z.linear(&latent_weight, Some(&first.bias));
        }
        // The rest step by step on the CPU, where a step's activations stay in cache and all
        // steps' would not (one call over all steps made plans 10–20 % slower); elsewhere in one
        // call, a third of the kernels at a horizon of 3.
        if steps == 1 || all_steps_at_once {
            return self.forward_from(first.finish(linear));
        }
        let steps: Vec<Tensor> = (0..steps)
            .map(|t| self.forward_from(first.finish(by_step.get(t))))
            .collect();
        Tensor::cat(&steps, 0)
    }

    /// The layers after the first, given the first's output.
    fn forward_from(&self, first_output: Tensor) -> Tensor {
        let mut h = first_output;
        for layer in &self.layers[1..] {
            h = layer.forward(&h);
        }
        h
    }

    pub fn last_mut(&mut self) -> &mut Layer {
        let last = self.layers.len() - 1;
        &mut self.layers[last]
    }
}

impl ParamVisitor for Mlp {
    fn visit_params(&mut self, prefix: &str, f: &mut dyn FnMut(String, &mut Tensor)) {
        visit_layers(&mut self.layers, prefix, f);
    }
}

/// Each layer's parameters under `prefix.i`, as torch names an `nn.Sequential`'s (the official
/// checkpoints' keys), for an MLP and for the stacked ensemble alike.
pub(super) fn visit_layers(
    layers: &mut [Layer],
    prefix: &str,
    f: &mut dyn FnMut(String, &mut Tensor),
) {
    for (i, layer) in layers.iter_mut().enumerate() {
        layer.visit_params(&format!("{prefix}.{i}"), f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simnorm_makes_groups_sum_to_one() {
        let x = Tensor::randn([3, 16], (Kind::Float, Device::Cpu));
        let y = simnorm(&x, 8)
            .view([3, 2, 8])
            .sum_dim_intlist(-1, false, Kind::Float);
        assert!((y - 1.0).abs().max().double_value(&[]) < 1e-6);
    }

    #[test]
    fn mlp_with_a_shared_prefix_matches_the_concatenated_input() {
        tch::manual_seed(4);
        let mlp = Mlp::new(7, &[9, 9], 3, Some(Activation::SimNorm(3)), 0.0);
        let shared = Tensor::randn([1, 5], (Kind::Float, Device::Cpu));
        let per_row = Tensor::randn([4, 2], (Kind::Float, Device::Cpu));
        let full = Tensor::cat(&[shared.expand([4, 5], false), per_row.shallow_clone()], 1);
        let diff = (mlp.forward(&full) - mlp.forward_rollout(&shared, &[], &per_row))
            .abs()
            .max();
        assert!(diff.double_value(&[]) < 1e-6);
        // Three groups of four rows, each with its own shared part.
        let shared = Tensor::randn([3, 5], (Kind::Float, Device::Cpu));
        let per_row = Tensor::randn([12, 2], (Kind::Float, Device::Cpu));
        let full = Tensor::cat(
            &[
                shared.repeat_interleave_self_int(4, 0, None),
                per_row.shallow_clone(),
            ],
            1,
        );
        let diff = (mlp.forward(&full) - mlp.forward_rollout(&shared, &[], &per_row))
            .abs()
            .max();
        assert!(diff.double_value(&[]) < 1e-6);
    }

    /// A rollout's MLP equals the MLP on every step's concatenated input, stacked step-major.
    #[test]
    fn mlp_over_a_rollout_matches_the_concatenated_inputs() {
        tch::manual_seed(5);
        let cpu = (Kind::Float, Device::Cpu);
        let mlp = Mlp::new(7, &[9, 9], 3, None, 0.0);
        let shared = Tensor::randn([3, 5], cpu);
        let later = [Tensor::randn([12, 5], cpu), Tensor::randn([12, 5], cpu)];
        let per_row = Tensor::randn([36, 2], cpu);
        let latents = Tensor::cat(
            &[
                shared.repeat_interleave_self_int(4, 0, None),
                later[0].shallow_clone(),
                later[1].shallow_clone(),
            ],
            0,
        );
        let full = mlp.forward(&Tensor::cat(&[latents, per_row.shallow_clone()], 1));
        let rollout = mlp.forward_rollout(&shared, &later, &per_row);
        assert!((&full - rollout).abs().max().double_value(&[]) < 1e-6);
        // As a GPU takes it: all steps in one call.
        let at_once = mlp.forward_rollout_with(&shared, &later, &per_row, true);
        assert!((&full - at_once).abs().max().double_value(&[]) < 1e-6);
        let one_step = mlp.forward_rollout(&shared, &[], &per_row.narrow(0, 0, 12));
        assert!(
            (one_step - full.narrow(0, 0, 12))
                .abs()
                .max()
                .double_value(&[])
                < 1e-6
        );
    }
}
