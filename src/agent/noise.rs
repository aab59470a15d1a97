//! Sources of the agent's random draws, so that tests can replay recorded draws.
//!
//! Five kinds of draw exist: standard normal tensors, permutations (the Q heads picked), Exp(1)
//! tensors (the Gumbel noise of the planner's elite choice), dropout masks and the integer
//! image shifts of the pixel encoder's augmentation. Every draw ends
//! on the device that uses it, permutations included: the heads are picked there with
//! `index_select`, so that nothing the device computes waits for the host (a CUDA graph replays
//! device draws; a host value would be frozen into it).
use std::collections::VecDeque;

use rand::rngs::{SmallRng, StdRng};
use rand::{Rng, SeedableRng};
use tch::{Device, Kind, Tensor};

use super::error::{Error, Result};
use super::kernels;

/// The kind of a random draw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoiseKind {
    /// Standard normal, of a shape.
    Randn,
    /// A uniformly random permutation of 0..n.
    Randperm,
    /// Exp(1), of a shape.
    Exponential,
    /// A dropout mask: 0 with probability p, else 1/(1−p).
    DropoutMask,
    /// Integer image shifts, uniform in 0..=max, as floats (n, 1, 1, 2).
    Shift,
}

/// A stream of random draws.
pub trait Noise {
    /// Standard normal samples of `shape` on `device` (float32).
    fn randn(&mut self, shape: &[i64], device: Device) -> Result<Tensor>;
    /// A random permutation of `0..n` (int64) on `device`.
    fn randperm(&mut self, n: i64, device: Device) -> Result<Tensor>;
    /// Exp(1) samples of `shape` on `device` (float32).
    fn exponential(&mut self, shape: &[i64], device: Device) -> Result<Tensor>;
    /// A dropout mask of `shape` on `device`: 0 with probability `p`, else 1/(1−p).
    fn dropout_mask(&mut self, shape: &[i64], p: f64, device: Device) -> Result<Tensor>;
    /// `n` image shifts (x, y), each uniform in `0..=max`, as float32 (n, 1, 1, 2) on `device`
    /// (the official `torch.randint(0, 2·pad + 1, (n, 1, 1, 2))`).
    fn shifts(&mut self, n: i64, max: i64, device: Device) -> Result<Tensor>;
}

/// A dropout mask from torch's generator on accelerators, from `rng` on the CPU (torch draws
/// CPU Bernoulli samples one by one, which is an order of magnitude slower).
fn dropout_mask_on(rng: &mut SmallRng, shape: &[i64], p: f64, device: Device) -> Result<Tensor> {
    if device == Device::Cpu {
        return Ok(kernels::dropout_mask(rng, shape, p));
    }
    let mut keep = Tensor::f_empty(shape, (Kind::Float, device))?;
    Ok(keep
        .f_bernoulli_float_(1.0 - p)?
        .f_mul_scalar(1.0 / (1.0 - p))?)
}

/// Draws from torch's global generator on the tensor's device (no host round trip for normal
/// and exponential draws). Seeding it seeds the whole process's torch generator. CPU dropout
/// masks come from a stream of its own.
#[derive(Debug)]
pub struct TorchNoise {
    mask_rng: SmallRng,
}

impl TorchNoise {
    /// Seeds torch's global generators (CPU and all accelerators) and returns the stream.
    pub fn seeded(seed: u64) -> Self {
        tch::manual_seed(seed as i64);
        Self {
            mask_rng: SmallRng::seed_from_u64(seed),
        }
    }
}

impl TorchNoise {
    /// A stream over torch's global generators as they stand (not reseeded): a second reader
    /// of the stream some [`TorchNoise::seeded`] started. Its own dropout-mask stream is unused
    /// by acting, which never drops out.
    pub fn global() -> Self {
        Self {
            mask_rng: SmallRng::seed_from_u64(0),
        }
    }
}

impl Noise for TorchNoise {
    fn randn(&mut self, shape: &[i64], device: Device) -> Result<Tensor> {
        Ok(Tensor::f_randn(shape, (Kind::Float, device))?)
    }

    fn randperm(&mut self, n: i64, device: Device) -> Result<Tensor> {
        Ok(Tensor::f_randperm(n, (Kind::Int64, device))?)
    }

    fn exponential(&mut self, shape: &[i64], device: Device) -> Result<Tensor> {
        let mut out = Tensor::f_empty(shape, (Kind::Float, device))?;
        Ok(out.f_exponential_(1.0)?)
    }

    fn dropout_mask(&mut self, shape: &[i64], p: f64, device: Device) -> Result<Tensor> {
        dropout_mask_on(&mut self.mask_rng, shape, p, device)
    }

    fn shifts(&mut self, n: i64, max: i64, device: Device) -> Result<Tensor> {
        Ok(Tensor::f_randint_low(
            0,
            max + 1,
            [n, 1, 1, 2],
            (Kind::Float, device),
        )?)
    }
}

/// A host-side stream from a seeded [`StdRng`]: identical on every process given the same
/// seed, whatever the device. Used for the draws that all ranks must share.
#[derive(Debug)]
pub struct HostNoise {
    rng: StdRng,
}

impl HostNoise {
    pub fn seeded(seed: u64) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed),
        }
    }

    fn host_tensor(values: Vec<f32>, shape: &[i64], device: Device) -> Result<Tensor> {
        Ok(Tensor::from_slice(&values)
            .f_view(shape)?
            .f_to_device(device)?)
    }
}

impl Noise for HostNoise {
    fn randn(&mut self, shape: &[i64], device: Device) -> Result<Tensor> {
        let count = shape.iter().product::<i64>().max(0) as usize;
        let mut values = Vec::with_capacity(count);
        while values.len() < count {
            // Box–Muller: two independent normals per pair of uniforms.
            let u1: f64 = 1.0 - self.rng.random::<f64>();
            let u2: f64 = self.rng.random::<f64>();
            let radius = (-2.0 * u1.ln()).sqrt();
            let angle = 2.0 * std::f64::consts::PI * u2;
            values.push((radius * angle.cos()) as f32);
            if values.len() < count {
                values.push((radius * angle.sin()) as f32);
            }
        }
        Self::host_tensor(values, shape, device)
    }

    fn randperm(&mut self, n: i64, device: Device) -> Result<Tensor> {
        let mut perm: Vec<i64> = (0..n.max(0)).collect();
        for i in (1..perm.len()).rev() {
            let j = self.rng.random_range(0..=i);
            perm.swap(i, j);
        }
        Ok(Tensor::from_slice(&perm).f_to_device(device)?)
    }

    fn exponential(&mut self, shape: &[i64], device: Device) -> Result<Tensor> {
        let count = shape.iter().product::<i64>().max(0) as usize;
        let values = (0..count)
            .map(|_| -(1.0 - self.rng.random::<f64>()).ln() as f32)
            .collect();
        Self::host_tensor(values, shape, device)
    }

    fn dropout_mask(&mut self, shape: &[i64], p: f64, device: Device) -> Result<Tensor> {
        let mut rng = SmallRng::seed_from_u64(self.rng.random());
        let mask = kernels::dropout_mask(&mut rng, shape, p);
        Ok(mask.f_to_device(device)?)
    }

    fn shifts(&mut self, n: i64, max: i64, device: Device) -> Result<Tensor> {
        let values = (0..2 * n.max(0))
            .map(|_| self.rng.random_range(0..=max) as f32)
            .collect();
        Self::host_tensor(values, &[n, 1, 1, 2], device)
    }
}

/// Permutations drawn ahead of a call into one device tensor, and served from it in order: the
/// learner's rank-shared draws (the Q heads picked), drawn on the host by a stream every rank
/// shares and uploaded with one copy before the update, so that the update itself reads them
/// from the device (a CUDA graph replays the copy's destination, never a host value).
#[derive(Debug)]
pub struct PreparedPermutations {
    /// (slots, n): one permutation of 0..n per row, refilled in place.
    rows: Tensor,
    served: i64,
}

impl PreparedPermutations {
    /// Room for `slots` permutations of `0..n` on `device`.
    pub fn new(slots: usize, n: i64, device: Device) -> Self {
        Self {
            rows: Tensor::zeros([slots as i64, n.max(0)], (Kind::Int64, device)),
            served: 0,
        }
    }

    /// Draws every slot from `source`, in order, and starts serving from the first.
    pub fn refill(&mut self, source: &mut dyn Noise) -> Result<()> {
        let (slots, n) = (self.rows.size()[0], self.rows.size()[1]);
        let drawn = (0..slots)
            .map(|_| source.randperm(n, Device::Cpu))
            .collect::<Result<Vec<_>>>()?;
        if !drawn.is_empty() {
            tch::no_grad(|| self.rows.f_copy_(&Tensor::f_stack(&drawn, 0)?))?;
        }
        self.served = 0;
        Ok(())
    }

    /// Makes room for `slots` permutations (new memory if the count changes).
    pub fn ensure_slots(&mut self, slots: usize) {
        let size = self.rows.size();
        if size[0] != slots as i64 {
            *self = Self::new(slots, size[1], self.rows.device());
        }
    }

    /// Serves the prepared permutations again from the first.
    pub fn rewind(&mut self) {
        self.served = 0;
    }
}

impl PreparedPermutations {
    fn only_permutations(kind: NoiseKind) -> Error {
        Error::Replay(format!(
            "a {kind:?} draw was asked of the prepared permutations, which serve permutations only"
        ))
    }
}

impl Noise for PreparedPermutations {
    fn randn(&mut self, _shape: &[i64], _device: Device) -> Result<Tensor> {
        Err(Self::only_permutations(NoiseKind::Randn))
    }

    fn randperm(&mut self, n: i64, device: Device) -> Result<Tensor> {
        let (slots, width) = (self.rows.size()[0], self.rows.size()[1]);
        if self.served >= slots || n != width || device != self.rows.device() {
            return Err(Error::Replay(format!(
                "permutation {} of 0..{n} on {device:?} asked; {slots} of 0..{width} on {:?} \
                 were prepared",
                self.served,
                self.rows.device()
            )));
        }
        self.served += 1;
        Ok(self.rows.get(self.served - 1))
    }

    fn exponential(&mut self, _shape: &[i64], _device: Device) -> Result<Tensor> {
        Err(Self::only_permutations(NoiseKind::Exponential))
    }

    fn dropout_mask(&mut self, _shape: &[i64], _p: f64, _device: Device) -> Result<Tensor> {
        Err(Self::only_permutations(NoiseKind::DropoutMask))
    }

    fn shifts(&mut self, _n: i64, _max: i64, _device: Device) -> Result<Tensor> {
        Err(Self::only_permutations(NoiseKind::Shift))
    }
}

/// Hands back recorded draws in order; a draw of another kind or shape than the next recorded
/// one is an error (the caller's draw order has diverged from the recording).
#[derive(Debug, Default)]
pub struct ReplayNoise {
    queue: VecDeque<(NoiseKind, Tensor)>,
    served: usize,
}

impl ReplayNoise {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a recorded draw. Permutations are given as integer tensors.
    pub fn push(&mut self, kind: NoiseKind, tensor: Tensor) {
        self.queue.push_back((kind, tensor));
    }

    /// Draws not yet served.
    pub fn remaining(&self) -> usize {
        self.queue.len()
    }

    fn next(&mut self, kind: NoiseKind, shape: &[i64]) -> Result<Tensor> {
        let index = self.served;
        let (recorded_kind, tensor) = self.queue.pop_front().ok_or_else(|| {
            Error::Replay(format!(
                "draw {index} ({kind:?} {shape:?}) requested, but the recording is exhausted"
            ))
        })?;
        if recorded_kind != kind || tensor.size() != shape {
            return Err(Error::Replay(format!(
                "draw {index}: requested {kind:?} {shape:?}, recorded {recorded_kind:?} {:?}",
                tensor.size()
            )));
        }
        self.served += 1;
        Ok(tensor)
    }
}

impl Noise for ReplayNoise {
    fn randn(&mut self, shape: &[i64], device: Device) -> Result<Tensor> {
        Ok(self
            .next(NoiseKind::Randn, shape)?
            .f_to_kind(Kind::Float)?
            .f_to_device(device)?)
    }

    fn randperm(&mut self, n: i64, device: Device) -> Result<Tensor> {
        Ok(self
            .next(NoiseKind::Randperm, &[n])?
            .f_to_kind(Kind::Int64)?
            .f_to_device(device)?)
    }

    fn exponential(&mut self, shape: &[i64], device: Device) -> Result<Tensor> {
        Ok(self
            .next(NoiseKind::Exponential, shape)?
            .f_to_kind(Kind::Float)?
            .f_to_device(device)?)
    }

    fn dropout_mask(&mut self, shape: &[i64], _p: f64, device: Device) -> Result<Tensor> {
        Ok(self
            .next(NoiseKind::DropoutMask, shape)?
            .f_to_kind(Kind::Float)?
            .f_to_device(device)?)
    }

    fn shifts(&mut self, n: i64, _max: i64, device: Device) -> Result<Tensor> {
        Ok(self
            .next(NoiseKind::Shift, &[n, 1, 1, 2])?
            .f_to_kind(Kind::Float)?
            .f_to_device(device)?)
    }
}

/// Serves the draws of another stream and keeps a copy of each, in order, e.g. to replay them
/// (sliced or whole) through a [`ReplayNoise`].
#[derive(Debug)]
pub struct RecordingNoise<N> {
    inner: N,
    /// The draws so far; permutations as int64 tensors.
    pub draws: Vec<(NoiseKind, Tensor)>,
}

impl<N: Noise> RecordingNoise<N> {
    pub fn new(inner: N) -> Self {
        Self {
            inner,
            draws: Vec::new(),
        }
    }

    fn keep(&mut self, kind: NoiseKind, draw: Tensor) -> Result<Tensor> {
        self.draws.push((kind, draw.f_detach_copy()?));
        Ok(draw)
    }
}

impl<N: Noise> Noise for RecordingNoise<N> {
    fn randn(&mut self, shape: &[i64], device: Device) -> Result<Tensor> {
        let draw = self.inner.randn(shape, device)?;
        self.keep(NoiseKind::Randn, draw)
    }

    fn randperm(&mut self, n: i64, device: Device) -> Result<Tensor> {
        let draw = self.inner.randperm(n, device)?;
        self.keep(NoiseKind::Randperm, draw)
    }

    fn exponential(&mut self, shape: &[i64], device: Device) -> Result<Tensor> {
        let draw = self.inner.exponential(shape, device)?;
        self.keep(NoiseKind::Exponential, draw)
    }

    fn dropout_mask(&mut self, shape: &[i64], p: f64, device: Device) -> Result<Tensor> {
        let draw = self.inner.dropout_mask(shape, p, device)?;
        self.keep(NoiseKind::DropoutMask, draw)
    }

    fn shifts(&mut self, n: i64, max: i64, device: Device) -> Result<Tensor> {
        let draw = self.inner.shifts(n, max, device)?;
        self.keep(NoiseKind::Shift, draw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_serves_in_order_and_rejects_mismatches() {
        let mut replay = ReplayNoise::new();
        replay.push(
            NoiseKind::Randn,
            Tensor::ones([2, 3], (Kind::Float, Device::Cpu)),
        );
        replay.push(NoiseKind::Randperm, Tensor::from_slice(&[2i64, 0, 1]));
        let first = replay.randn(&[2, 3], Device::Cpu).unwrap();
        assert_eq!(first.sum(Kind::Float).double_value(&[]), 6.0);
        assert!(matches!(
            replay.randn(&[3], Device::Cpu),
            Err(Error::Replay(_))
        ));
        let mut replay = ReplayNoise::new();
        replay.push(NoiseKind::Randperm, Tensor::from_slice(&[2i64, 0, 1]));
        let perm = replay.randperm(3, Device::Cpu).unwrap();
        assert_eq!(Vec::<i64>::try_from(&perm).unwrap(), vec![2, 0, 1]);
        assert!(matches!(
            replay.exponential(&[1], Device::Cpu),
            Err(Error::Replay(_))
        ));
    }

    #[test]
    fn recording_keeps_what_it_serves_and_replays_it() {
        let mut recording = RecordingNoise::new(HostNoise::seeded(3));
        let normal = recording.randn(&[2, 3], Device::Cpu).unwrap();
        let perm = recording.randperm(4, Device::Cpu).unwrap();
        let exp = recording.exponential(&[5], Device::Cpu).unwrap();
        let mut replay = ReplayNoise::new();
        for (kind, draw) in recording.draws {
            replay.push(kind, draw);
        }
        assert!(replay.randn(&[2, 3], Device::Cpu).unwrap().equal(&normal));
        assert!(replay.randperm(4, Device::Cpu).unwrap().equal(&perm));
        assert!(replay.exponential(&[5], Device::Cpu).unwrap().equal(&exp));
        assert_eq!(replay.remaining(), 0);
    }

    /// Prepared permutations are the source's, in its order, from the same device tensor on
    /// every refill; asking for more, or for another kind, is an error.
    #[test]
    fn prepared_permutations_serve_the_sources_draws_in_place() {
        let mut prepared = PreparedPermutations::new(2, 5, Device::Cpu);
        let mut source = HostNoise::seeded(4);
        let mut same = HostNoise::seeded(4);
        prepared.refill(&mut source).unwrap();
        let storage = prepared.rows.data_ptr();
        for _ in 0..2 {
            let served = prepared.randperm(5, Device::Cpu).unwrap();
            assert!(served.equal(&same.randperm(5, Device::Cpu).unwrap()));
        }
        assert!(matches!(
            prepared.randperm(5, Device::Cpu),
            Err(Error::Replay(_))
        ));
        prepared.refill(&mut source).unwrap();
        assert_eq!(prepared.rows.data_ptr(), storage, "refilled in place");
        assert!(prepared
            .randperm(5, Device::Cpu)
            .unwrap()
            .equal(&same.randperm(5, Device::Cpu).unwrap()));
        assert!(prepared.randperm(4, Device::Cpu).is_err(), "another size");
        assert!(prepared.randn(&[2], Device::Cpu).is_err());
    }

    #[test]
    fn host_noise_is_reproducible_and_well_formed() {
        let mut a = HostNoise::seeded(7);
        let mut b = HostNoise::seeded(7);
        let perm = Vec::<i64>::try_from(a.randperm(5, Device::Cpu).unwrap()).unwrap();
        let again = Vec::<i64>::try_from(b.randperm(5, Device::Cpu).unwrap()).unwrap();
        assert_eq!(perm, again);
        let mut sorted = perm.clone();
        sorted.sort();
        assert_eq!(sorted, vec![0, 1, 2, 3, 4]);
        let normal = a.randn(&[20000], Device::Cpu).unwrap();
        let mean = normal.mean(Kind::Float).double_value(&[]);
        let std = normal.std(true).double_value(&[]);
        assert!(
            mean.abs() < 0.05 && (std - 1.0).abs() < 0.05,
            "mean {mean} std {std}"
        );
        let exp = a.exponential(&[20000], Device::Cpu).unwrap();
        assert!(exp.min().double_value(&[]) >= 0.0);
        assert!((exp.mean(Kind::Float).double_value(&[]) - 1.0).abs() < 0.05);
    }

    #[test]
    fn torch_noise_draws_the_requested_shapes() {
        let mut noise = TorchNoise::seeded(3);
        assert_eq!(
            noise.randn(&[3, 4], Device::Cpu).unwrap().size(),
            vec![3, 4]
        );
        assert_eq!(
            noise.exponential(&[5], Device::Cpu).unwrap().size(),
            vec![5]
        );
        let mut perm = Vec::<i64>::try_from(noise.randperm(6, Device::Cpu).unwrap()).unwrap();
        perm.sort();
        assert_eq!(perm, (0..6).collect::<Vec<_>>());
        let mask = noise.dropout_mask(&[4, 1000], 0.5, Device::Cpu).unwrap();
        let rate = mask
            .eq(0.0)
            .to_kind(Kind::Float)
            .mean(Kind::Float)
            .double_value(&[]);
        assert!((rate - 0.5).abs() < 0.03 && mask.max().double_value(&[]) == 2.0);
    }
}
