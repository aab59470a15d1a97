//! The environment interface shared by native, gymnasium and dm_control tasks.
use crate::{Error, Result};

/// Shapes and horizon of an environment as the agent sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvSpec {
    pub obs_shape: Vec<usize>,
    pub action_dim: usize,
    /// Steps after which the episode is truncated.
    pub episode_length: usize,
}

impl EnvSpec {
    /// Number of floats in one observation.
    pub fn obs_dim(&self) -> usize {
        self.obs_shape.iter().product()
    }

    /// Errors unless `action` has exactly `action_dim` components.
    pub fn check_action<T>(&self, action: &[T]) -> Result<()> {
        if action.len() == self.action_dim {
            Ok(())
        } else {
            Err(Error::ActionLength {
                expected: self.action_dim,
                got: action.len(),
            })
        }
    }
}

/// The outcome of one step.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub obs: Vec<f32>,
    pub reward: f64,
    pub terminated: bool,
    pub truncated: bool,
    pub success: Option<f64>,
}

/// What the agent observes: the task's state vector, or stacked camera frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[repr(u8)]
pub enum ObsKind {
    #[default]
    State = 0,
    /// [`FRAME_STACK`] RGB frames of [`FRAME_SIZE`]² pixels, channel-major: (9, 64, 64).
    Rgb = 1,
}

/// Frames stacked into one pixel observation (the newest last).
pub const FRAME_STACK: usize = 3;
/// Height and width of a pixel observation's frames.
pub const FRAME_SIZE: usize = 64;
/// Height and width of a video frame where the env can choose (the official render size).
pub const VIDEO_SIZE: usize = 384;

/// How an environment is made: what the agent observes, and whether it must also render
/// frames for videos (with state observations an environment otherwise loads no renderer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EnvOptions {
    pub obs: ObsKind,
    pub videos: bool,
}

impl EnvOptions {
    /// Whether the environment draws images (for the agent or for videos).
    pub fn renders(self) -> bool {
        self.obs == ObsKind::Rgb || self.videos
    }
}

impl From<ObsKind> for EnvOptions {
    fn from(obs: ObsKind) -> Self {
        Self { obs, videos: false }
    }
}

impl ObsKind {
    /// The config value (`obs=state|rgb`).
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "state" => Some(Self::State),
            "rgb" => Some(Self::Rgb),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::State => "state",
            Self::Rgb => "rgb",
        }
    }

    /// The observation shape of a pixel task.
    pub fn rgb_shape() -> Vec<usize> {
        vec![3 * FRAME_STACK, FRAME_SIZE, FRAME_SIZE]
    }
}

/// One rendered image: `height`×`width` RGB, row-major, 3 bytes a pixel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub height: usize,
    pub width: usize,
    pub rgb: Vec<u8>,
}

impl Frame {
    /// `self` resampled to `size`×`size` by averaging the source pixels each target pixel
    /// covers (area resampling; a copy when the size already matches).
    pub fn resized(&self, size: usize) -> Frame {
        if (self.height, self.width) == (size, size) {
            return self.clone();
        }
        let mut rgb = vec![0u8; size * size * 3];
        let span = |i: usize, source: usize| (i * source / size, ((i + 1) * source).div_ceil(size));
        for y in 0..size {
            let (y0, y1) = span(y, self.height);
            for x in 0..size {
                let (x0, x1) = span(x, self.width);
                let mut sum = [0u32; 3];
                for sy in y0..y1.max(y0 + 1) {
                    for sx in x0..x1.max(x0 + 1) {
                        let p = (sy * self.width + sx) * 3;
                        for (total, &value) in sum.iter_mut().zip(&self.rgb[p..p + 3]) {
                            *total += u32::from(value);
                        }
                    }
                }
                let count = ((y1.max(y0 + 1) - y0) * (x1.max(x0 + 1) - x0)) as u32;
                for c in 0..3 {
                    rgb[(y * size + x) * 3 + c] = ((sum[c] + count / 2) / count) as u8;
                }
            }
        }
        Frame {
            height: size,
            width: size,
            rgb,
        }
    }
}

pub trait Env: Send {
    fn spec(&self) -> &EnvSpec;
    /// Some(seed) reseeds the env's random stream (gymnasium semantics); None continues it.
    fn reset(&mut self, seed: Option<u64>) -> Result<Vec<f32>>;
    /// action in [-1, 1]^action_dim (after the RescaleAction wrapper); wrong length -> Error, not panic.
    fn step(&mut self, action: &[f32]) -> Result<Step>;
    /// The current image, `size`×`size` where the env can choose (otherwise its own size).
    fn render(&mut self, size: usize) -> Result<Frame> {
        let _ = size;
        Err(Error::Unsupported {
            task: "rendering".into(),
            reason: "this environment draws no images (pixel observations and videos need a \
                     DMControl task or a gymnasium env with an rgb_array render mode)"
                .into(),
        })
    }
    /// Which of its tasks the next reset starts (see [`crate::multitask`]); an environment
    /// of one task has task 0 only.
    fn switch_task(&mut self, task: usize) -> Result<()> {
        if task == 0 {
            return Ok(());
        }
        Err(Error::VectorInput(format!(
            "task {task} of an environment that runs one task"
        )))
    }
}

impl<E: Env + ?Sized> Env for Box<E> {
    fn spec(&self) -> &EnvSpec {
        (**self).spec()
    }
    fn reset(&mut self, seed: Option<u64>) -> Result<Vec<f32>> {
        (**self).reset(seed)
    }
    fn step(&mut self, action: &[f32]) -> Result<Step> {
        (**self).step(action)
    }
    fn render(&mut self, size: usize) -> Result<Frame> {
        (**self).render(size)
    }
    fn switch_task(&mut self, task: usize) -> Result<()> {
        (**self).switch_task(task)
    }
}

/// Per-component bounds of a continuous (Box) action space.
#[derive(Debug, Clone, PartialEq)]
pub struct ActionBox {
    pub low: Vec<f64>,
    pub high: Vec<f64>,
}

/// An unwrapped environment that takes actions in its own [`ActionBox`].
pub trait BoxEnv: Env {
    fn action_box(&self) -> &ActionBox;

    /// [`Env::step`] with an action in the box in double precision, as the official wrappers
    /// rescale it (dm_control's `action_scale`, in float64): a box other than [-1, 1] gives
    /// values that float32 cannot hold. An environment whose actions are float32 rounds it.
    fn step_in_box(&mut self, action: &[f64]) -> Result<Step> {
        let action: Vec<f32> = action.iter().map(|&a| a as f32).collect();
        self.step(&action)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resizing_averages_the_pixels_each_target_pixel_covers() {
        // 4×4 → 2×2: each target pixel is the mean of a 2×2 block.
        let rgb: Vec<u8> = (0..16u8).flat_map(|p| [p * 10, 255 - p * 10, 7]).collect();
        let frame = Frame {
            height: 4,
            width: 4,
            rgb,
        };
        let small = frame.resized(2);
        assert_eq!((small.height, small.width), (2, 2));
        // Top-left block: pixels 0, 1, 4, 5 → red (0+10+40+50)/4 = 25.
        assert_eq!(&small.rgb[..3], &[25, 230, 7]);
        assert_eq!(frame.resized(4), frame, "same size: unchanged");
        // Upsampling repeats pixels.
        assert_eq!(frame.resized(8).rgb[..3], frame.rgb[..3]);
    }
}
