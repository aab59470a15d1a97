//! The acting thread's random stream when it runs beside the learner (`pipeline=true`): a torch
//! generator of its own on the policy's device. Both threads' draws stay reproducible (torch's
//! default generator is the learner's alone), draws are made on the device (a host stream would
//! upload every plan's noise), and a captured plan registers the generator, so that every
//! replay draws anew.
use tch::{Device, Kind, Tensor};

use crate::agent::{Error, Noise, Result};
use crate::cuda::{Draw, Generator, GraphError, SharedGenerator};

pub struct OwnNoise {
    generator: SharedGenerator,
}

fn draw_error(e: GraphError) -> Error {
    Error::Draw(e.to_string())
}

impl OwnNoise {
    /// A stream from `seed` on `device`; an error where this build has no generators of its
    /// own (no shim).
    pub fn seeded(device: Device, seed: u64) -> std::result::Result<OwnNoise, GraphError> {
        Ok(OwnNoise {
            generator: Generator::new(device, seed)?.shared(),
        })
    }

    /// The generator, for the graphs that draw from it.
    pub fn generator(&self) -> SharedGenerator {
        self.generator.clone()
    }

    /// Another reader of the same stream.
    pub fn share(&self) -> OwnNoise {
        OwnNoise {
            generator: self.generator.clone(),
        }
    }

    /// Restarts the stream from `seed`, in place (a captured graph keeps drawing from it).
    pub fn reseed(&self, seed: u64) -> std::result::Result<(), GraphError> {
        self.lock().reseed(seed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Generator> {
        self.generator
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn filled(&mut self, shape: &[i64], device: Device, draw: Draw) -> Result<Tensor> {
        let mut out = Tensor::f_empty(shape, (Kind::Float, device))?;
        self.lock().fill(&mut out, draw).map_err(draw_error)?;
        Ok(out)
    }
}

impl Noise for OwnNoise {
    fn randn(&mut self, shape: &[i64], device: Device) -> Result<Tensor> {
        self.filled(shape, device, Draw::Normal)
    }

    fn randperm(&mut self, n: i64, device: Device) -> Result<Tensor> {
        let perm = self.lock().randperm(n).map_err(draw_error)?;
        Ok(perm.f_to_device(device)?)
    }

    fn exponential(&mut self, shape: &[i64], device: Device) -> Result<Tensor> {
        self.filled(shape, device, Draw::Exponential)
    }

    fn dropout_mask(&mut self, shape: &[i64], p: f64, device: Device) -> Result<Tensor> {
        let keep = self.filled(shape, device, Draw::Bernoulli { p: 1.0 - p })?;
        Ok(keep.f_mul_scalar(1.0 / (1.0 - p))?)
    }

    fn shifts(&mut self, n: i64, max: i64, device: Device) -> Result<Tensor> {
        let draw = Draw::Integers {
            low: 0,
            high: max + 1,
        };
        self.filled(&[n, 1, 1, 2], device, draw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two streams of one seed draw alike, whatever torch's default generator does between
    /// their draws; a reseed starts the stream over in place.
    #[test]
    #[cfg_attr(
        not(tdmpc2_cuda_graphs),
        ignore = "this build has no C++ shim (a CPU-only torch wheel)"
    )]
    fn the_stream_is_its_own_and_reseeds_in_place() {
        let mut a = OwnNoise::seeded(Device::Cpu, 4).unwrap();
        let mut b = OwnNoise::seeded(Device::Cpu, 4).unwrap();
        let first = a.randn(&[3, 5], Device::Cpu).unwrap();
        tch::manual_seed(1);
        let _ = Tensor::randn([7], (Kind::Float, Device::Cpu));
        assert!(first.equal(&b.randn(&[3, 5], Device::Cpu).unwrap()));
        let shifts = a.shifts(50, 4, Device::Cpu).unwrap();
        assert_eq!(shifts.size(), [50, 1, 1, 2]);
        assert!(shifts.max().double_value(&[]) <= 4.0 && shifts.min().double_value(&[]) >= 0.0);
        let mask = a.dropout_mask(&[4000], 0.5, Device::Cpu).unwrap();
        assert_eq!(mask.max().double_value(&[]), 2.0);
        let mut perm = Vec::<i64>::try_from(a.randperm(5, Device::Cpu).unwrap()).unwrap();
        perm.sort();
        assert_eq!(perm, [0, 1, 2, 3, 4]);

        let reader = a.share();
        reader.reseed(4).unwrap();
        assert!(a.randn(&[3, 5], Device::Cpu).unwrap().equal(&first));
    }
}
