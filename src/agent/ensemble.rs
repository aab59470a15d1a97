//! The Q ensemble: `num_q` MLPs with their parameters stacked, and which members to evaluate.
use tch::{Device, Tensor};

use super::error::{Error, Result};
use super::layers::{fused_normed, layer_norm, normed, visit_layers, Activation, Layer, Mlp, Norm};
use super::noise::Noise;
use super::params::ParamVisitor;
use crate::cuda::fused::Affine;

/// How the rows of an ensemble layer's output meet its members' LayerNorm parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Members {
    /// (rows, out): one member, its parameters (out).
    One,
    /// (rows, K, out): the first layer, one matmul over the stacked weights.
    Interleaved,
    /// (K, rows, out): the later layers, batched matmuls.
    Blocks,
}

/// [`normed`] for a stack of members, each with its affine parameters (K, out).
fn normed_members(
    x: Tensor,
    weight: &Tensor,
    bias: &Tensor,
    members: Members,
    activation: Option<Activation>,
) -> Tensor {
    let features = *x.size().last().expect("a layer's output has features");
    if let (Some(activation), true) = (activation, crate::cuda::fused::applies_with_gradient(&x)) {
        let member_rows = match members {
            Members::Blocks => x.size()[1],
            Members::One | Members::Interleaved => 1,
        };
        let (weight, bias) = (weight.contiguous(), bias.contiguous());
        let affine = Affine {
            member_rows,
            ..Affine::single(&weight, &bias)
        };
        return fused_normed(&x, affine, activation);
    }
    let (weight, bias) = match members {
        Members::Blocks => (weight.unsqueeze(1), bias.unsqueeze(1)),
        Members::One | Members::Interleaved => (weight.shallow_clone(), bias.shallow_clone()),
    };
    let y = bias.addcmul(&layer_norm(&x, features, None), &weight);
    match activation {
        Some(activation) => activation.apply(&y),
        None => y,
    }
}

/// Which members of the ensemble to evaluate.
#[derive(Debug)]
pub enum Heads {
    All,
    /// Two members (the official code always averages or mins two random heads), as an int64
    /// index tensor (2) on the ensemble's device.
    Pair(Tensor),
}

impl Heads {
    /// The first two entries of a random permutation of `num` heads, drawn on `device`.
    pub fn random_pair(noise: &mut dyn Noise, num: i64, device: Device) -> Result<Self> {
        if num < 2 {
            return Err(Error::Config(format!(
                "num_q is {num}; two Q heads are picked, so at least 2 are needed"
            )));
        }
        Ok(Self::Pair(noise.randperm(num, device)?.narrow(0, 0, 2)))
    }

    /// The given two members.
    pub fn pair(first: i64, second: i64, device: Device) -> Self {
        Self::Pair(Tensor::from_slice(&[first, second]).to_device(device))
    }
}

/// Reborrows an optional noise source for one call.
fn reborrow<'s>(noise: &'s mut Option<&mut dyn Noise>) -> Option<&'s mut dyn Noise> {
    match noise {
        Some(n) => Some(&mut **n),
        None => None,
    }
}

/// `num` identical MLPs whose parameters are stacked along a leading member dimension
/// (the official vmapped ensemble): weights (K, out, in), biases and norms (K, out).
#[derive(Debug)]
pub struct Ensemble {
    pub layers: Vec<Layer>,
    pub size: i64,
}

impl Ensemble {
    /// `members` MLPs like [`Mlp::new`], stacked.
    pub fn new(members: i64, input: i64, hidden: &[i64], output: i64, dropout: f64) -> Self {
        let mlps: Vec<Mlp> = (0..members)
            .map(|_| Mlp::new(input, hidden, output, None, dropout))
            .collect();
        let depth = mlps[0].layers.len();
        let stack = |get: &dyn Fn(&Layer) -> &Tensor, i: usize| {
            Tensor::stack(
                &mlps
                    .iter()
                    .map(|m| get(&m.layers[i]).shallow_clone())
                    .collect::<Vec<_>>(),
                0,
            )
        };
        let layers = (0..depth)
            .map(|i| {
                let template = &mlps[0].layers[i];
                Layer {
                    weight: stack(&|l| &l.weight, i),
                    bias: stack(&|l| &l.bias, i),
                    norm: template.norm.as_ref().map(|_| Norm {
                        weight: stack(&|l| &l.norm.as_ref().expect("normed layer").weight, i),
                        bias: stack(&|l| &l.norm.as_ref().expect("normed layer").bias, i),
                    }),
                    activation: template.activation,
                    dropout: template.dropout,
                }
            })
            .collect();
        Self {
            layers,
            size: members,
        }
    }

    /// A copy with its own storage (on the CPU), e.g. for the target network.
    pub fn deep_copy(&self) -> Self {
        let copy = |t: &Tensor| t.detach().to_device(Device::Cpu).copy();
        Self {
            layers: self
                .layers
                .iter()
                .map(|l| Layer {
                    weight: copy(&l.weight),
                    bias: copy(&l.bias),
                    norm: l.norm.as_ref().map(|n| Norm {
                        weight: copy(&n.weight),
                        bias: copy(&n.bias),
                    }),
                    activation: l.activation,
                    dropout: l.dropout,
                })
                .collect(),
            size: self.size,
        }
    }

    /// Evaluates the chosen members on a shared input `x` (…, in); returns (k, …, out).
    /// `detach` cuts the parameters from autograd (gradients reach `x` only). With `dropout`
    /// (training), each member's first layer gets its own mask from that noise source. A pair
    /// is picked from the stacked parameters on the device, so the members evaluated are never
    /// a host value.
    pub fn forward(
        &self,
        x: &Tensor,
        heads: &Heads,
        detach: bool,
        dropout: Option<&mut dyn Noise>,
    ) -> Result<Tensor> {
        let leading = x.size();
        let input = *leading.last().expect("ensemble input has a feature dim");
        let rows: i64 = leading[..leading.len() - 1].iter().product();
        let x = x.reshape([rows, input]);
        let param = |t: &Tensor| {
            if detach {
                t.detach()
            } else {
                t.shallow_clone()
            }
        };
        let out = match heads {
            Heads::All => self.forward_stacked(&x, self.size, &self.params(&param), dropout)?,
            Heads::Pair(index) => {
                let picked = self.picked(index, &param)?;
                if dropout.is_some() || !stacks_pairs(&x) {
                    self.forward_pair(&x, &picked, dropout)?
                } else {
                    self.forward_stacked(&x, 2, &picked, None)?
                }
            }
        };
        let mut shape = vec![out.size()[0]];
        shape.extend_from_slice(&leading[..leading.len() - 1]);
        shape.push(out.size()[2]);
        Ok(out.view(shape.as_slice()))
    }

    /// Each layer's [weight, bias, norm weight, norm bias] as `param` gives them from the
    /// stacks (the norm's empty where a layer has none).
    fn params(&self, param: &dyn Fn(&Tensor) -> Tensor) -> Vec<[Tensor; 4]> {
        self.layers
            .iter()
            .map(|layer| {
                let (norm_weight, norm_bias) = match &layer.norm {
                    Some(n) => (param(&n.weight), param(&n.bias)),
                    None => (Tensor::new(), Tensor::new()),
                };
                [
                    param(&layer.weight),
                    param(&layer.bias),
                    norm_weight,
                    norm_bias,
                ]
            })
            .collect()
    }

    /// [`Ensemble::params`] of the members `index`: one fused kernel for every stack where
    /// [`crate::cuda::fused::gathers`] them (no gradient wanted), else a copy per stack.
    fn picked(
        &self,
        index: &Tensor,
        param: &dyn Fn(&Tensor) -> Tensor,
    ) -> Result<Vec<[Tensor; 4]>> {
        let stacks = self.params(param);
        let present: Vec<&Tensor> = stacks.iter().flatten().filter(|t| t.defined()).collect();
        let mut gathered = match crate::cuda::fused::gathers(&present) {
            true => Some(crate::cuda::fused::gather_members(&present, index)?.into_iter()),
            false => None,
        };
        let mut pick = |t: &Tensor| match (t.defined(), gathered.as_mut()) {
            (false, _) => Tensor::new(),
            (true, Some(picks)) => picks.next().expect("one pick per stack"),
            (true, None) => t.index_select(0, index),
        };
        Ok(stacks
            .iter()
            .map(|layer| layer.each_ref().map(&mut pick))
            .collect())
    }

    /// `members` stacked members with their parameters `params` (see [`Ensemble::params`],
    /// leading dimension `members`): the first layer as one matmul over the stacked weights
    /// (rows, members·out), the others as batched matmuls; returns (members, rows, out).
    fn forward_stacked(
        &self,
        x: &Tensor,
        members: i64,
        params: &[[Tensor; 4]],
        mut dropout: Option<&mut dyn Noise>,
    ) -> Result<Tensor> {
        let first = &self.layers[0];
        let [weight, bias, norm_weight, norm_bias] = &params[0];
        let (out, width) = (weight.size()[1], weight.size()[2]);
        let linear = bias
            .view([1, members * out])
            .addmm(x, &weight.view([members * out, width]).tr())
            .view([-1, members, out]);
        let norm = first.norm.as_ref().map(|_| {
            (
                norm_weight.shallow_clone(),
                norm_bias.shallow_clone(),
                Members::Interleaved,
            )
        });
        // (rows, K, out) → (K, rows, out) as a strided view; batched matmul reads it directly.
        let mut h = self
            .dropout_and_finish(first, linear, norm, reborrow(&mut dropout))?
            .transpose(0, 1);
        for (layer, [weight, bias, norm_weight, norm_bias]) in
            self.layers[1..].iter().zip(&params[1..])
        {
            let linear = bias
                .unsqueeze(1)
                .baddbmm(&h, &weight.transpose(1, 2), 1.0, 1.0);
            let norm = layer.norm.as_ref().map(|_| {
                (
                    norm_weight.shallow_clone(),
                    norm_bias.shallow_clone(),
                    Members::Blocks,
                )
            });
            h = self.dropout_and_finish(layer, linear, norm, reborrow(&mut dropout))?;
        }
        Ok(h)
    }

    /// Two members with their parameters `params` (see [`Ensemble::params`], leading dimension
    /// 2), each through plain matmuls (on the CPU faster than a batched matmul over two);
    /// returns (2, rows, out).
    fn forward_pair(
        &self,
        x: &Tensor,
        params: &[[Tensor; 4]],
        mut dropout: Option<&mut dyn Noise>,
    ) -> Result<Tensor> {
        let mut outputs = Vec::with_capacity(2);
        for member in 0..2 {
            let mut h = x.shallow_clone();
            for (layer, [weight, bias, norm_weight, norm_bias]) in self.layers.iter().zip(params) {
                let linear = h.linear(&weight.get(member), Some(&bias.get(member)));
                let norm = layer
                    .norm
                    .as_ref()
                    .map(|_| (norm_weight.get(member), norm_bias.get(member), Members::One));
                h = self.dropout_and_finish(layer, linear, norm, reborrow(&mut dropout))?;
            }
            outputs.push(h);
        }
        Ok(Tensor::stack(&outputs, 0))
    }

    fn dropout_and_finish(
        &self,
        layer: &Layer,
        linear: Tensor,
        norm: Option<(Tensor, Tensor, Members)>,
        dropout: Option<&mut dyn Noise>,
    ) -> Result<Tensor> {
        let mut h = linear;
        if let Some(noise) = dropout {
            if layer.dropout > 0.0 {
                let mask = noise.dropout_mask(&h.size(), layer.dropout, h.device())?;
                h *= mask;
            }
        }
        Ok(match norm {
            Some((weight, bias, Members::One)) => normed(h, &weight, &bias, layer.activation),
            Some((weight, bias, members)) => {
                normed_members(h, &weight, &bias, members, layer.activation)
            }
            None => match layer.activation {
                Some(activation) => activation.apply(&h),
                None => h,
            },
        })
    }
}

/// Whether a pair of members is evaluated as a stack of two (batched matmuls, one fused kernel
/// for both members' norms) rather than member by member: with the fused kernels, where fewer and
/// larger kernels win on CUDA (on the CPU only the kernels' host build in tests takes it; there
/// two plain matmuls are faster).
fn stacks_pairs(x: &Tensor) -> bool {
    crate::cuda::fused::runs_on(x.device())
}

impl ParamVisitor for Ensemble {
    fn visit_params(&mut self, prefix: &str, f: &mut dyn FnMut(String, &mut Tensor)) {
        visit_layers(&mut self.layers, prefix, f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::noise::TorchNoise;
    use tch::Kind;

    fn member(ensemble: &Ensemble, k: i64) -> Mlp {
        Mlp {
            layers: ensemble
                .layers
                .iter()
                .map(|l| Layer {
                    weight: l.weight.get(k),
                    bias: l.bias.get(k),
                    norm: l.norm.as_ref().map(|n| Norm {
                        weight: n.weight.get(k),
                        bias: n.bias.get(k),
                    }),
                    activation: l.activation,
                    dropout: 0.0,
                })
                .collect(),
        }
    }

    #[test]
    fn ensemble_members_match_separate_mlps() {
        tch::manual_seed(3);
        let ensemble = Ensemble::new(3, 5, &[7, 7], 4, 0.0);
        let x = Tensor::randn([2, 6, 5], (Kind::Float, Device::Cpu));
        let all = ensemble.forward(&x, &Heads::All, false, None).unwrap();
        assert_eq!(all.size(), vec![3, 2, 6, 4]);
        for k in 0..3 {
            let single = member(&ensemble, k).forward(&x);
            assert!((single - all.get(k)).abs().max().double_value(&[]) < 1e-5);
        }
        let pair = ensemble
            .forward(&x, &Heads::pair(2, 0, Device::Cpu), true, None)
            .unwrap();
        assert!((pair.get(0) - all.get(2)).abs().max().double_value(&[]) < 1e-5);
        assert!((pair.get(1) - all.get(0)).abs().max().double_value(&[]) < 1e-5);
    }

    /// The pair as a stack of two (batched matmuls, as on CUDA with the fused kernels) gives
    /// what the member-by-member pair gives, in either order of the two heads.
    #[test]
    fn a_stacked_pair_matches_the_pair_member_by_member() {
        tch::manual_seed(5);
        let ensemble = Ensemble::new(5, 6, &[8, 8], 4, 0.0);
        let x = Tensor::randn([7, 6], (Kind::Float, Device::Cpu));
        for (first, second) in [(3, 1), (0, 4)] {
            let Heads::Pair(index) = Heads::pair(first, second, Device::Cpu) else {
                unreachable!()
            };
            let picked = ensemble.params(&|t: &Tensor| t.index_select(0, &index));
            let stacked = ensemble.forward_stacked(&x, 2, &picked, None).unwrap();
            let by_member = ensemble.forward_pair(&x, &picked, None).unwrap();
            assert_eq!(stacked.size(), vec![2, 7, 4]);
            let diff = (&stacked - &by_member).abs().max().double_value(&[]);
            assert!(diff < 1e-5, "pair ({first}, {second}): {diff}");
            let single = member(&ensemble, first).forward(&x);
            assert!((single - stacked.get(0)).abs().max().double_value(&[]) < 1e-5);
            let all = ensemble.params(&|t: &Tensor| t.shallow_clone());
            let all_then_kept = ensemble
                .forward_stacked(&x, 5, &all, None)
                .unwrap()
                .index_select(0, &index);
            let diff = (&all_then_kept - &by_member).abs().max().double_value(&[]);
            assert!(
                diff < 1e-5,
                "all heads, pair ({first}, {second}) kept: {diff}"
            );
        }
    }

    #[test]
    fn q_dropout_masks_differ_per_member_and_follow_the_mode() {
        let p = 0.25;
        let mut ensemble = Ensemble::new(4, 3, &[256, 8], 2, p);
        assert_eq!(ensemble.layers[0].dropout, p);
        assert_eq!(ensemble.layers[1].dropout, 0.0);
        // Make the first layer output exactly 1 before dropout, and look at it directly.
        ensemble.layers[0].norm = None;
        ensemble.layers[0].activation = None;
        ensemble.layers[0].bias = Tensor::ones([4, 256], (Kind::Float, Device::Cpu));
        ensemble.layers[0].weight = Tensor::zeros([4, 256, 3], (Kind::Float, Device::Cpu));
        let first = Ensemble {
            layers: ensemble.layers.drain(..1).collect(),
            size: 4,
        };
        let x = Tensor::randn([64, 3], (Kind::Float, Device::Cpu));
        let mut noise = TorchNoise::seeded(5);
        let train = first
            .forward(&x, &Heads::All, false, Some(&mut noise))
            .unwrap();
        let dropped = train.eq(0.0).to_kind(Kind::Float);
        let rate = dropped.mean(Kind::Float).double_value(&[]);
        assert!((rate - p).abs() < 0.02, "drop rate {rate}");
        // Survivors are rescaled by 1/(1-p).
        assert!((train.max().double_value(&[]) - 1.0 / (1.0 - p)).abs() < 1e-6);
        // Different members get different masks.
        let differ = dropped
            .get(0)
            .ne_tensor(&dropped.get(1))
            .to_kind(Kind::Float)
            .mean(Kind::Float);
        assert!(differ.double_value(&[]) > 0.2);
        let pair = first
            .forward(&x, &Heads::pair(0, 1, Device::Cpu), true, Some(&mut noise))
            .unwrap();
        let pair_dropped = pair.eq(0.0).to_kind(Kind::Float);
        assert!((pair_dropped.mean(Kind::Float).double_value(&[]) - p).abs() < 0.03);
        assert!(
            pair_dropped
                .get(0)
                .ne_tensor(&pair_dropped.get(1))
                .to_kind(Kind::Float)
                .mean(Kind::Float)
                .double_value(&[])
                > 0.2
        );
        // Eval mode: no dropout at all.
        let eval = first.forward(&x, &Heads::All, false, None).unwrap();
        assert_eq!(eval.eq(0.0).sum(Kind::Int64).int64_value(&[]), 0);
    }
}
