//! Generic wrappers that turn a raw environment into the agent's view of it.
use std::collections::VecDeque;

use crate::{BoxEnv, Env, EnvSpec, Error, Frame, ObsKind, Result, Step, FRAME_SIZE, FRAME_STACK};

/// Exposes actions in `[-1, 1]` and maps them affinely onto the wrapped env's action box.
/// Components outside `[-1, 1]` are clipped; non-finite ones are an error.
pub struct RescaleAction<E> {
    env: E,
    low: Vec<f64>,
    half_range: Vec<f64>,
    raw: Vec<f64>,
}

impl<E: BoxEnv> RescaleAction<E> {
    pub fn new(env: E) -> Result<Self> {
        let bounds = env.action_box();
        let dim = env.spec().action_dim;
        let unsupported = |reason: String| Error::Unsupported {
            task: "action space".into(),
            reason,
        };
        if bounds.low.len() != dim || bounds.high.len() != dim {
            return Err(unsupported(format!(
                "action bounds have {} and {} components, expected {dim}",
                bounds.low.len(),
                bounds.high.len()
            )));
        }
        for (i, (&lo, &hi)) in bounds.low.iter().zip(&bounds.high).enumerate() {
            if !(lo.is_finite() && hi.is_finite() && lo <= hi) {
                return Err(unsupported(format!(
                    "component {i} has bounds [{lo}, {hi}], need finite low <= high"
                )));
            }
        }
        let low = bounds.low.clone();
        let half_range = bounds
            .low
            .iter()
            .zip(&bounds.high)
            .map(|(lo, hi)| 0.5 * (hi - lo))
            .collect();
        Ok(Self {
            env,
            low,
            half_range,
            raw: vec![0.0; dim],
        })
    }

    pub fn inner(&self) -> &E {
        &self.env
    }
}

impl<E: BoxEnv> Env for RescaleAction<E> {
    fn spec(&self) -> &EnvSpec {
        self.env.spec()
    }

    fn reset(&mut self, seed: Option<u64>) -> Result<Vec<f32>> {
        self.env.reset(seed)
    }

    fn step(&mut self, action: &[f32]) -> Result<Step> {
        self.env.spec().check_action(action)?;
        for (index, (&a, raw)) in action.iter().zip(self.raw.iter_mut()).enumerate() {
            if !a.is_finite() {
                return Err(Error::NonFiniteAction { index, value: a });
            }
            let a = f64::from(a.clamp(-1.0, 1.0));
            *raw = self.low[index] + (a + 1.0) * self.half_range[index];
        }
        self.env.step_in_box(&self.raw)
    }

    fn render(&mut self, size: usize) -> Result<Frame> {
        self.env.render(size)
    }
}

/// Repeats each action `repeat` times, summing rewards; stops early when the episode ends.
pub struct ActionRepeat<E> {
    env: E,
    repeat: usize,
    spec: EnvSpec,
}

impl<E: Env> ActionRepeat<E> {
    /// `repeat` of 0 is treated as 1.
    pub fn new(env: E, repeat: usize) -> Self {
        let repeat = repeat.max(1);
        let mut spec = env.spec().clone();
        spec.episode_length = spec.episode_length.div_ceil(repeat);
        Self { env, repeat, spec }
    }
}

impl<E: Env> Env for ActionRepeat<E> {
    fn spec(&self) -> &EnvSpec {
        &self.spec
    }

    fn reset(&mut self, seed: Option<u64>) -> Result<Vec<f32>> {
        self.env.reset(seed)
    }

    fn step(&mut self, action: &[f32]) -> Result<Step> {
        let mut step = self.env.step(action)?;
        for _ in 1..self.repeat {
            if step.terminated || step.truncated {
                break;
            }
            let reward = step.reward;
            step = self.env.step(action)?;
            step.reward += reward;
        }
        Ok(step)
    }

    fn render(&mut self, size: usize) -> Result<Frame> {
        self.env.render(size)
    }
}

/// Truncates episodes after `episode_length` steps and refuses to step a finished episode.
pub struct TimeLimit<E> {
    env: E,
    spec: EnvSpec,
    elapsed: usize,
    running: bool,
}

impl<E: Env> TimeLimit<E> {
    pub fn new(env: E, episode_length: usize) -> Self {
        let mut spec = env.spec().clone();
        spec.episode_length = episode_length;
        Self {
            env,
            spec,
            elapsed: 0,
            running: false,
        }
    }

    /// Steps taken in the current episode.
    pub fn elapsed(&self) -> usize {
        self.elapsed
    }
}

impl<E: Env> Env for TimeLimit<E> {
    fn spec(&self) -> &EnvSpec {
        &self.spec
    }

    fn reset(&mut self, seed: Option<u64>) -> Result<Vec<f32>> {
        self.running = false;
        let obs = self.env.reset(seed)?;
        self.elapsed = 0;
        self.running = true;
        Ok(obs)
    }

    fn step(&mut self, action: &[f32]) -> Result<Step> {
        if !self.running {
            return Err(Error::NeedsReset);
        }
        let mut step = self.env.step(action)?;
        self.elapsed += 1;
        if self.elapsed >= self.spec.episode_length {
            step.truncated = true;
        }
        self.running = !(step.terminated || step.truncated);
        Ok(step)
    }

    fn render(&mut self, size: usize) -> Result<Frame> {
        self.env.render(size)
    }
}

/// The standard stack: `TimeLimit(ActionRepeat(RescaleAction(env)))`.
/// Observes the last [`FRAME_STACK`] rendered frames instead of the state: (9, 64, 64), values
/// 0–255, channel-major, the newest frame last; at reset the first frame fills the stack (the
/// official `Pixels` wrapper). Frames of another size are resampled to 64×64.
pub struct PixelStack<E> {
    env: E,
    spec: EnvSpec,
    /// Channel-major frames, oldest first.
    frames: VecDeque<Vec<f32>>,
}

impl<E: Env> PixelStack<E> {
    pub fn new(env: E) -> Self {
        let spec = EnvSpec {
            obs_shape: ObsKind::rgb_shape(),
            ..env.spec().clone()
        };
        Self {
            env,
            spec,
            frames: VecDeque::with_capacity(FRAME_STACK),
        }
    }

    /// Renders the current frame into the stack (`copies` times) and returns the stack.
    fn observe(&mut self, copies: usize) -> Result<Vec<f32>> {
        let frame = self.env.render(FRAME_SIZE)?.resized(FRAME_SIZE);
        let pixels = FRAME_SIZE * FRAME_SIZE;
        let mut planar = vec![0f32; 3 * pixels];
        for (p, rgb) in frame.rgb.chunks_exact(3).enumerate() {
            for (c, &value) in rgb.iter().enumerate() {
                planar[c * pixels + p] = f32::from(value);
            }
        }
        for _ in 0..copies {
            if self.frames.len() == FRAME_STACK {
                self.frames.pop_front();
            }
            self.frames.push_back(planar.clone());
        }
        Ok(self.frames.iter().flatten().copied().collect())
    }
}

impl<E: Env> Env for PixelStack<E> {
    fn spec(&self) -> &EnvSpec {
        &self.spec
    }

    fn reset(&mut self, seed: Option<u64>) -> Result<Vec<f32>> {
        self.env.reset(seed)?;
        self.observe(FRAME_STACK)
    }

    fn step(&mut self, action: &[f32]) -> Result<Step> {
        let step = self.env.step(action)?;
        Ok(Step {
            obs: self.observe(1)?,
            ..step
        })
    }

    fn render(&mut self, size: usize) -> Result<Frame> {
        self.env.render(size)
    }
}

pub fn wrap<E: BoxEnv + 'static>(
    env: E,
    repeat: usize,
    episode_length: usize,
) -> Result<Box<dyn Env>> {
    wrap_observed(env, repeat, episode_length, ObsKind::State)
}

/// [`wrap`], with the observation the agent gets: frames are rendered after the repeated
/// action, before the time limit (the official wrapper order).
pub fn wrap_observed<E: BoxEnv + 'static>(
    env: E,
    repeat: usize,
    episode_length: usize,
    obs: ObsKind,
) -> Result<Box<dyn Env>> {
    let env = ActionRepeat::new(RescaleAction::new(env)?, repeat);
    Ok(match obs {
        ObsKind::State => Box::new(TimeLimit::new(env, episode_length)),
        ObsKind::Rgb => Box::new(TimeLimit::new(PixelStack::new(env), episode_length)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ActionBox;

    /// Records raw actions; reward 1 per step; terminates at step `end`.
    struct Probe {
        spec: EnvSpec,
        bounds: ActionBox,
        actions: Vec<Vec<f32>>,
        end: usize,
    }

    impl Probe {
        fn new(low: Vec<f64>, high: Vec<f64>, end: usize) -> Self {
            let spec = EnvSpec {
                obs_shape: vec![1],
                action_dim: low.len(),
                episode_length: 10,
            };
            Self {
                spec,
                bounds: ActionBox { low, high },
                actions: vec![],
                end,
            }
        }
    }

    impl Env for Probe {
        fn spec(&self) -> &EnvSpec {
            &self.spec
        }
        fn reset(&mut self, _seed: Option<u64>) -> Result<Vec<f32>> {
            self.actions.clear();
            Ok(vec![0.0])
        }
        fn step(&mut self, action: &[f32]) -> Result<Step> {
            self.spec.check_action(action)?;
            self.actions.push(action.to_vec());
            let n = self.actions.len();
            Ok(Step {
                obs: vec![n as f32],
                reward: 1.0,
                terminated: n == self.end,
                truncated: false,
                success: None,
            })
        }
    }

    impl BoxEnv for Probe {
        fn action_box(&self) -> &ActionBox {
            &self.bounds
        }
    }

    #[test]
    fn rescale_maps_unit_box_onto_bounds() {
        let mut env =
            RescaleAction::new(Probe::new(vec![-2.0, 0.0, -1.0], vec![2.0, 1.0, 1.1], 99)).unwrap();
        env.reset(None).unwrap();
        env.step(&[-1.0, 1.0, 0.0]).unwrap();
        env.step(&[0.5, -3.0, 1.0]).unwrap();
        assert_eq!(
            env.inner().actions,
            [vec![-2.0, 1.0, 0.05], vec![1.0, 0.0, 1.1]]
        );
        assert!(matches!(
            env.step(&[0.0]),
            Err(Error::ActionLength {
                expected: 3,
                got: 1
            })
        ));
        assert!(matches!(
            env.step(&[0.0, f32::NAN, 0.0]),
            Err(Error::NonFiniteAction { index: 1, .. })
        ));
        assert!(RescaleAction::new(Probe::new(vec![f64::NEG_INFINITY], vec![1.0], 9)).is_err());
    }

    #[test]
    fn repeat_sums_rewards_and_stops_on_termination() {
        let probe = RescaleAction::new(Probe::new(vec![-1.0], vec![1.0], 5)).unwrap();
        let mut env = ActionRepeat::new(probe, 2);
        assert_eq!(env.spec().episode_length, 5);
        env.reset(None).unwrap();
        let s = env.step(&[0.0]).unwrap();
        assert_eq!((s.obs[0], s.reward, s.terminated), (2.0, 2.0, false));
        env.step(&[0.0]).unwrap();
        let s = env.step(&[0.0]).unwrap();
        assert_eq!((s.obs[0], s.reward, s.terminated), (5.0, 1.0, true));
    }

    #[test]
    fn time_limit_truncates_and_requires_reset() {
        let probe = RescaleAction::new(Probe::new(vec![-1.0], vec![1.0], 99)).unwrap();
        let mut env = TimeLimit::new(probe, 3);
        assert!(matches!(env.step(&[0.0]), Err(Error::NeedsReset)));
        env.reset(None).unwrap();
        let flags: Vec<bool> = (0..3)
            .map(|_| env.step(&[0.0]).unwrap().truncated)
            .collect();
        assert_eq!(flags, [false, false, true]);
        assert!(matches!(env.step(&[0.0]), Err(Error::NeedsReset)));
        env.reset(None).unwrap();
        assert_eq!(env.elapsed(), 0);
        assert!(env.step(&[0.0]).is_ok());
    }
}
