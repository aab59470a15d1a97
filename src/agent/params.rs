//! Parameters packed into one flat buffer per optimiser.
//!
//! Each module keeps ordinary tensors; [`FlatParams::pack`] copies them into a single 1-D buffer
//! and swaps every module tensor for a view into it. The views are autograd leaves, so
//! gradients are computed per parameter as usual, while optimiser steps, clipping, target
//! updates and collective operations run on the whole buffer at once.
use tch::{Device, Kind, Tensor};

use super::error::{Error, Result};

/// Something that owns named parameters.
pub trait ParamVisitor {
    /// Calls `f` with the full name and a mutable handle of every parameter, in a fixed order.
    fn visit_params(&mut self, prefix: &str, f: &mut dyn FnMut(String, &mut Tensor));
}

/// Where one parameter lives in its flat buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamEntry {
    pub name: String,
    pub shape: Vec<i64>,
    pub offset: i64,
    pub numel: i64,
}

/// A flat parameter buffer and the layout of the parameters inside it.
#[derive(Debug)]
pub struct FlatParams {
    /// The 1-D float32 buffer. It never requires grad; the per-parameter views do.
    pub flat: Tensor,
    pub entries: Vec<ParamEntry>,
    views: Vec<Tensor>,
}

impl FlatParams {
    /// Copies the parameters of `modules` (visited in order, each under its prefix) into one
    /// buffer on `device`, and replaces them with views of it.
    pub fn pack(
        modules: &mut [(&str, &mut dyn ParamVisitor)],
        device: Device,
        requires_grad: bool,
    ) -> Self {
        let mut entries = Vec::new();
        let mut pieces = Vec::new();
        let mut offset = 0;
        for (prefix, module) in modules.iter_mut() {
            module.visit_params(prefix, &mut |name, tensor| {
                let numel = tensor.numel() as i64;
                entries.push(ParamEntry {
                    name,
                    shape: tensor.size(),
                    offset,
                    numel,
                });
                pieces.push(tensor.detach().to_kind(Kind::Float).reshape([-1]));
                offset += numel;
            });
        }
        let flat = if pieces.is_empty() {
            Tensor::zeros([0], (Kind::Float, device))
        } else {
            Tensor::cat(&pieces, 0).to_device(device)
        };
        let views: Vec<Tensor> = entries
            .iter()
            .map(|e| {
                flat.narrow(0, e.offset, e.numel)
                    .view(e.shape.as_slice())
                    .set_requires_grad(requires_grad)
            })
            .collect();
        let mut index = 0;
        for (prefix, module) in modules.iter_mut() {
            module.visit_params(prefix, &mut |_, tensor| {
                *tensor = views[index].shallow_clone();
                index += 1;
            });
        }
        Self {
            flat,
            entries,
            views,
        }
    }

    /// The per-parameter views, in layout order.
    pub fn views(&self) -> &[Tensor] {
        &self.views
    }

    /// Total number of scalars.
    pub fn numel(&self) -> i64 {
        self.flat.size()[0]
    }

    /// The contiguous range `[start, end)` covered by the parameters whose names start with
    /// `prefix` (they must be adjacent in the layout).
    pub fn range_of(&self, prefix: &str) -> Option<(i64, i64)> {
        let matching: Vec<&ParamEntry> = self
            .entries
            .iter()
            .filter(|e| e.name.starts_with(prefix))
            .collect();
        let first = matching.first()?;
        let last = matching.last()?;
        Some((first.offset, last.offset + last.numel))
    }

    /// Each parameter's name with a view of `buffer` (same layout as the parameters): used to
    /// name gradients and optimiser moments.
    pub fn named_views_of(&self, buffer: &Tensor) -> Vec<(String, Tensor)> {
        self.entries
            .iter()
            .map(|e| {
                (
                    e.name.clone(),
                    buffer.narrow(0, e.offset, e.numel).view(e.shape.as_slice()),
                )
            })
            .collect()
    }

    /// Flattens per-parameter gradients (undefined ones count as zero) into `out`, adding to it
    /// when `accumulate` is set.
    pub fn gather_grads(&self, grads: &[Tensor], out: &mut Tensor, accumulate: bool) -> Result<()> {
        if grads.len() != self.entries.len() {
            return Err(Error::Config(format!(
                "{} gradients for {} parameters",
                grads.len(),
                self.entries.len()
            )));
        }
        let pieces: Vec<Tensor> = grads
            .iter()
            .zip(&self.entries)
            .map(|(g, e)| {
                if g.defined() {
                    g.reshape([-1])
                } else {
                    Tensor::zeros([e.numel], (Kind::Float, self.flat.device()))
                }
            })
            .collect();
        tch::no_grad(|| {
            if accumulate {
                *out += Tensor::cat(&pieces, 0);
            } else {
                let _ = Tensor::cat_out(out, &pieces, 0);
            }
        });
        Ok(())
    }

    /// Copies named tensors into the parameters. Every parameter must be given, with its shape.
    pub fn load(&self, lookup: &mut dyn FnMut(&str) -> Option<Tensor>) -> Result<()> {
        for (entry, view) in self.entries.iter().zip(&self.views) {
            let source = lookup(&entry.name)
                .ok_or_else(|| Error::Config(format!("missing parameter `{}`", entry.name)))?;
            if source.size() != entry.shape {
                return Err(Error::Shape {
                    what: format!("parameter `{}`", entry.name),
                    expected: entry.shape.clone(),
                    got: source.size(),
                });
            }
            tch::no_grad(|| view.detach().copy_(&source));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Two {
        a: Tensor,
        b: Tensor,
    }

    impl ParamVisitor for Two {
        fn visit_params(&mut self, prefix: &str, f: &mut dyn FnMut(String, &mut Tensor)) {
            f(format!("{prefix}.a"), &mut self.a);
            f(format!("{prefix}.b"), &mut self.b);
        }
    }

    #[test]
    fn packed_views_share_the_buffer_and_get_gradients() {
        let mut m = Two {
            a: Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0]).view([2, 2]),
            b: Tensor::from_slice(&[5.0f32]),
        };
        let mut flat = FlatParams::pack(&mut [("m", &mut m)], Device::Cpu, true);
        assert_eq!(flat.numel(), 5);
        assert_eq!(flat.range_of("m.b"), Some((4, 5)));
        let loss = (&m.a * 2.0).sum(Kind::Float) + (&m.b * &m.b).sum(Kind::Float);
        let grads = Tensor::run_backward(&[loss], flat.views(), false, false);
        let mut grad = Tensor::zeros([5], (Kind::Float, Device::Cpu));
        flat.gather_grads(&grads, &mut grad, false).unwrap();
        assert_eq!(
            Vec::<f32>::try_from(&grad).unwrap(),
            vec![2.0, 2.0, 2.0, 2.0, 10.0]
        );
        tch::no_grad(|| {
            let _ = flat.flat.g_add_scalar_(1.0);
        });
        assert_eq!(m.a.double_value(&[1, 1]), 5.0);
    }
}
