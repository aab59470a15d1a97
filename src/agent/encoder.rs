//! Observation encoders: an MLP for state vectors, and the official pixel encoder
//! (random-shift augmentation, x/255 − 0.5, four convolutions with ReLU between them,
//! flattened and SimNorm-ed), under the official keys `_encoder.state.*` and
//! `_encoder.rgb.{2,4,6,8}.*` (positions in the official `nn.Sequential`).
use tch::{Device, Kind, Tensor};

use super::config::AgentConfig;
use super::error::Result;
use super::layers::{simnorm, Activation, Mlp};
use super::noise::Noise;
use super::params::ParamVisitor;

/// Observations → latents.
#[derive(Debug)]
pub enum Encoder {
    State(Mlp),
    Pixels(ConvEncoder),
}

impl Encoder {
    pub fn new(config: &AgentConfig) -> Self {
        let z = config.latent_dim as i64;
        let simnorm_dim = config.simnorm_dim as i64;
        match config.obs {
            envs::ObsKind::State => {
                let hidden =
                    vec![config.enc_dim as i64; config.num_enc_layers.saturating_sub(1).max(1)];
                let act = Some(Activation::SimNorm(simnorm_dim));
                // A multitask model's observations come with their task's embedding.
                let task_dim = config.tasks.as_ref().map_or(0, |t| t.task_dim);
                let input = (config.obs_dim + task_dim) as i64;
                Self::State(Mlp::new(input, &hidden, z, act, 0.0))
            }
            envs::ObsKind::Rgb => {
                let channels = (config.obs_dim as i64) / (IMAGE_SIZE * IMAGE_SIZE);
                let num_channels = config.num_channels as i64;
                Self::Pixels(ConvEncoder::new(channels, num_channels, simnorm_dim))
            }
        }
    }

    /// The official state-dict prefix of the encoder's parameters.
    pub fn prefix(&self) -> &'static str {
        match self {
            Self::State(_) => "_encoder.state",
            Self::Pixels(_) => "_encoder.rgb",
        }
    }

    /// Observations (…, obs_dim) → latents (…, latent_dim). Only pixels draw (their shifts).
    pub fn forward(&self, obs: &Tensor, noise: &mut dyn Noise) -> Result<Tensor> {
        match self {
            Self::State(mlp) => Ok(mlp.forward(obs)),
            Self::Pixels(conv) => conv.forward(obs, noise),
        }
    }
}

impl ParamVisitor for Encoder {
    fn visit_params(&mut self, prefix: &str, f: &mut dyn FnMut(String, &mut Tensor)) {
        match self {
            Self::State(mlp) => mlp.visit_params(prefix, f),
            Self::Pixels(conv) => conv.visit_params(prefix, f),
        }
    }
}

/// Replicate padding of the shift augmentation; shifts are 0..=2·pad pixels.
pub const SHIFT_PAD: i64 = 3;
/// Frames are square, of this many pixels a side.
pub const IMAGE_SIZE: i64 = 64;

/// One `nn.Conv2d` (no padding) and its stride.
#[derive(Debug)]
struct Conv {
    weight: Tensor,
    bias: Tensor,
    stride: i64,
    /// Index in the official `nn.Sequential` (after ShiftAug and PixelPreprocess).
    position: usize,
}

impl Conv {
    /// PyTorch's default initialisation, which the official code keeps for convolutions:
    /// weight and bias uniform in ±1/√fan_in (kaiming-uniform with a = √5), from torch's
    /// global CPU generator.
    fn new(input: i64, output: i64, kernel: i64, stride: i64, position: usize) -> Self {
        let bound = 1.0 / ((input * kernel * kernel) as f64).sqrt();
        let uniform = |shape: &[i64]| {
            let mut t = Tensor::empty(shape, (Kind::Float, Device::Cpu));
            let _ = t.uniform_(-bound, bound);
            t
        };
        let weight = uniform(&[output, input, kernel, kernel]);
        let bias = uniform(&[output]);
        Self {
            weight,
            bias,
            stride,
            position,
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        x.conv2d(
            &self.weight,
            Some(&self.bias),
            [self.stride, self.stride],
            [0, 0],
            [1, 1],
            1,
        )
    }
}

#[derive(Debug)]
pub struct ConvEncoder {
    convs: Vec<Conv>,
    channels: i64,
    simnorm_dim: i64,
}

impl ConvEncoder {
    /// An encoder of `channels`-channel 64×64 images (9: three stacked RGB frames).
    pub fn new(channels: i64, num_channels: i64, simnorm_dim: i64) -> Self {
        let c = num_channels;
        Self {
            convs: vec![
                Conv::new(channels, c, 7, 2, 2),
                Conv::new(c, c, 5, 2, 4),
                Conv::new(c, c, 3, 2, 6),
                Conv::new(c, c, 3, 1, 8),
            ],
            channels,
            simnorm_dim,
        }
    }

    /// Observations (…, channels·64·64), of any numeric kind, values 0–255 → latents
    /// (…, 16·num_channels). A 3-D input (T, B, ·) is encoded one time slice after another, each
    /// drawing its own shifts (the official per-slice loop), so that draws come in its order.
    pub fn forward(&self, obs: &Tensor, noise: &mut dyn Noise) -> Result<Tensor> {
        if obs.dim() == 3 {
            let slices = (0..obs.size()[0])
                .map(|t| self.forward(&obs.get(t), noise))
                .collect::<Result<Vec<_>>>()?;
            return Ok(Tensor::stack(&slices, 0));
        }
        let shape = obs.size();
        let images = obs.f_reshape([-1, self.channels, IMAGE_SIZE, IMAGE_SIZE])?;
        let mut x = shift(&images.f_to_kind(Kind::Float)?, noise)? / 255.0 - 0.5;
        for (i, conv) in self.convs.iter().enumerate() {
            x = conv.forward(&x);
            if i + 1 < self.convs.len() {
                x = x.relu();
            }
        }
        let mut out_shape = shape[..shape.len() - 1].to_vec();
        out_shape.push(-1);
        Ok(simnorm(&x.flatten(1, -1), self.simnorm_dim).reshape(out_shape.as_slice()))
    }
}

/// The official `ShiftAug`: replicate-pad by [`SHIFT_PAD`], then sample each image's 64×64
/// window at an integer offset through bilinear `grid_sample` (as the official does, so that
/// the rounding matches too).
fn shift(images: &Tensor, noise: &mut dyn Noise) -> Result<Tensor> {
    let (n, size) = (images.size()[0], IMAGE_SIZE);
    let device = images.device();
    let padded = images.f_pad([SHIFT_PAD; 4], "replicate", None)?;
    let full = size + 2 * SHIFT_PAD;
    let eps = 1.0 / full as f64;
    let arange =
        Tensor::f_linspace(-1.0 + eps, 1.0 - eps, full, (Kind::Float, device))?.narrow(0, 0, size);
    let xs = arange.view([1, size, 1]).expand([size, size, 1], false);
    let base = Tensor::cat(&[&xs, &xs.transpose(1, 0)], 2).unsqueeze(0);
    let shifts = noise.shifts(n, 2 * SHIFT_PAD, device)? * (2.0 / full as f64);
    let grid = base + shifts;
    Ok(Tensor::f_grid_sampler(&padded, &grid, 0, 0, false)?)
}

impl ParamVisitor for ConvEncoder {
    fn visit_params(&mut self, prefix: &str, f: &mut dyn FnMut(String, &mut Tensor)) {
        for conv in &mut self.convs {
            f(
                format!("{prefix}.{}.weight", conv.position),
                &mut conv.weight,
            );
            f(format!("{prefix}.{}.bias", conv.position), &mut conv.bias);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{NoiseKind, ReplayNoise};

    fn shifts(values: &[f32]) -> ReplayNoise {
        let mut replay = ReplayNoise::new();
        let n = values.len() as i64 / 2;
        replay.push(
            NoiseKind::Shift,
            Tensor::from_slice(values).view([n, 1, 1, 2]),
        );
        replay
    }

    #[test]
    fn a_shift_moves_the_window_by_whole_pixels_over_replicated_edges() {
        let image = Tensor::arange(64 * 64, (Kind::Float, Device::Cpu)).view([1, 1, 64, 64]);
        let images = Tensor::cat(&[&image, &image], 0);
        // Image 0 at the centre (3, 3): itself. Image 1 at (0, 1): x moves 3 left, y 2 up.
        let out = shift(&images, &mut shifts(&[3.0, 3.0, 0.0, 1.0])).unwrap();
        let centred = (out.get(0) - image.get(0)).abs().max().double_value(&[]);
        assert!(centred < 1e-3, "centre shift is the identity: {centred}");
        let moved = out.get(1).get(0);
        let source = |y: i64, x: i64| ((y - 2).max(0) * 64 + (x - 3).max(0)) as f64;
        for (y, x) in [(0, 0), (5, 7), (63, 63), (2, 3), (1, 60)] {
            let got = moved.double_value(&[y, x]);
            assert!((got - source(y, x)).abs() < 1e-2, "({y}, {x}): {got}");
        }
    }

    #[test]
    fn pixels_encode_to_simnorm_latents_of_sixteen_features_a_channel() {
        let config = AgentConfig {
            obs_dim: 9 * 64 * 64,
            obs: envs::ObsKind::Rgb,
            num_channels: 4,
            latent_dim: 64,
            ..AgentConfig::defaults(Some(1), 3, 2).unwrap()
        };
        let mut encoder = Encoder::new(&config);
        let mut names = vec![];
        encoder.visit_params("_encoder.rgb", &mut |name, t| names.push((name, t.size())));
        assert_eq!(
            names[0],
            ("_encoder.rgb.2.weight".to_string(), vec![4, 9, 7, 7])
        );
        assert_eq!(names[7], ("_encoder.rgb.8.bias".to_string(), vec![4]));
        let obs = Tensor::randint(256, [2, 3, 9 * 64 * 64], (Kind::Uint8, Device::Cpu));
        let mut noise = crate::agent::HostNoise::seeded(1);
        let z = encoder.forward(&obs, &mut noise).unwrap();
        assert_eq!(z.size(), [2, 3, 64]);
        let group_sums = z.view([2, 3, 8, 8]).sum_dim_intlist(-1, false, Kind::Float);
        assert!((group_sums - 1.0).abs().max().double_value(&[]) < 1e-5);
        for bad in [
            AgentConfig {
                latent_dim: 128,
                ..config.clone()
            },
            AgentConfig {
                obs_dim: 9 * 64 * 63,
                ..config.clone()
            },
        ] {
            let e = crate::agent::WorldModel::new(&bad, Device::Cpu).unwrap_err();
            assert!(e.to_string().contains("pixels need obs_dim"), "{e}");
        }
    }
}
