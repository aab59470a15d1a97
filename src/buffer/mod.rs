//! The replay buffer (reference §6): a ring of rows, episodes appended whole when they end,
//! slices of H+1 consecutive rows sampled per-episode uniformly into a time-major batch.
//!
//! An episode of L steps takes L+1 rows: row 0 holds o_0, row t holds (o_t, a_{t-1}, r_{t-1},
//! terminated_t). Each observation is stored once; of a pixel observation (a stack of frames)
//! only its newest frame, as bytes: stacks are rebuilt from consecutive rows when sampled, the
//! first frame repeated at the episode start as the environment did. Sampling costs O(B·H),
//! independent of fill and, unless most episodes are too short for a slice, of the number of
//! episodes held.
use std::collections::VecDeque;

use rand::Rng;
use rand_pcg::Pcg64;
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result};

mod saved;
pub use saved::{BufferMeta, Dealing, SavedPart, SavedTensors};

/// A batch of H+1 consecutive steps for B sequences, time-major.
#[derive(Debug)]
pub struct Batch {
    /// (H+1, B, obs_dim): float32 states, or uint8 pixels.
    pub obs: Tensor,
    /// (H, B, action_dim)
    pub action: Tensor,
    /// (H, B, 1)
    pub reward: Tensor,
    /// (H, B, 1); zeros for non-episodic tasks.
    pub terminated: Tensor,
    /// (B,) int64: each sample's task, for a multitask model (one task over the horizon).
    pub task: Option<Tensor>,
}

impl Batch {
    /// The batch on `device` (no copy when it is already there).
    pub fn to_device(&self, device: Device) -> Batch {
        Batch {
            obs: self.obs.to_device(device),
            action: self.action.to_device(device),
            reward: self.reward.to_device(device),
            terminated: self.terminated.to_device(device),
            task: self.task.as_ref().map(|t| t.to_device(device)),
        }
    }

    /// A copy on `device`, in memory of its own (never shared with `self`).
    pub fn copy_to(&self, device: Device) -> Batch {
        let copy = |t: &Tensor| t.to_device(device).copy();
        Batch {
            obs: copy(&self.obs),
            action: copy(&self.action),
            reward: copy(&self.reward),
            terminated: copy(&self.terminated),
            task: self.task.as_ref().map(copy),
        }
    }

    /// Overwrites this batch's tensors in place with `other`'s (same shapes, any device).
    pub fn refill(&mut self, other: &Batch) -> Result<()> {
        let sizes = |b: &Batch| {
            let task = b.task.as_ref().map(Tensor::size);
            (b.obs.size(), b.action.size(), b.reward.size(), task)
        };
        if sizes(self) != sizes(other) {
            return Err(Error::Config(format!(
                "a batch of sizes {:?} cannot refill one of {:?}",
                sizes(other),
                sizes(self)
            )));
        }
        self.obs.f_copy_(&other.obs)?;
        self.action.f_copy_(&other.action)?;
        self.reward.f_copy_(&other.reward)?;
        self.terminated.f_copy_(&other.terminated)?;
        if let (Some(task), Some(other)) = (&mut self.task, &other.task) {
            task.f_copy_(other)?;
        }
        Ok(())
    }
}

/// One finished episode, as the actor hands it over.
#[derive(Debug, Clone, Default)]
pub struct Episode {
    /// (L+1) × [`ObsLayout::stored`], row-major: what the buffer keeps of each observation
    /// (all of a state; the newest frame of a pixel stack, whose older frames are the rows
    /// before).
    pub obs: StoredObs,
    /// L × action_dim.
    pub action: Vec<f32>,
    /// L rewards.
    pub reward: Vec<f32>,
    /// L flags (1.0 where the step terminated the episode).
    pub terminated: Vec<f32>,
    /// The task it was played in, for a multitask model.
    pub task: Option<u32>,
}

/// What the buffer keeps of an episode's observations, as it keeps them: float32 states, or
/// the newest frame of each pixel stack as bytes (a quarter of float32's memory while the
/// episode is played: 25 MB less for each environment's 500-step episode of 64×64 frames).
#[derive(Debug, Clone, PartialEq)]
pub enum StoredObs {
    States(Vec<f32>),
    Frames(Vec<u8>),
}

impl Default for StoredObs {
    fn default() -> Self {
        Self::States(Vec::new())
    }
}

impl FromIterator<f32> for StoredObs {
    fn from_iter<I: IntoIterator<Item = f32>>(states: I) -> Self {
        Self::States(states.into_iter().collect())
    }
}

impl From<Vec<f32>> for StoredObs {
    fn from(states: Vec<f32>) -> Self {
        Self::States(states)
    }
}

impl StoredObs {
    /// An episode's first observation `obs`, of `layout`: what the buffer keeps of it.
    pub fn first(layout: ObsLayout, obs: &[f32]) -> Self {
        Self::rows(layout, &obs[obs.len().saturating_sub(layout.stored())..])
    }

    /// Rows of what the buffer keeps, `values` (rows × [`ObsLayout::stored`]), of `layout`.
    pub fn rows(layout: ObsLayout, values: &[f32]) -> Self {
        match layout {
            ObsLayout::Vector { .. } => Self::States(values.to_vec()),
            ObsLayout::Frames { .. } => Self::Frames(values.iter().map(|&v| v as u8).collect()),
        }
    }

    /// Appends what the buffer keeps of observation `obs`, of `layout` (its last
    /// [`ObsLayout::stored`] numbers: all of a state, a stack's newest frame).
    pub fn push(&mut self, layout: ObsLayout, obs: &[f32]) {
        let kept = &obs[obs.len().saturating_sub(layout.stored())..];
        match self {
            Self::States(values) => values.extend_from_slice(kept),
            // Pixel values are whole numbers 0–255: bytes, as stored.
            Self::Frames(bytes) => bytes.extend(kept.iter().map(|&v| v as u8)),
        }
    }

    /// Numbers held (rows × stored).
    pub fn len(&self) -> usize {
        match self {
            Self::States(values) => values.len(),
            Self::Frames(bytes) => bytes.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Episode {
    pub fn len(&self) -> usize {
        self.reward.len()
    }

    pub fn is_empty(&self) -> bool {
        self.reward.is_empty()
    }
}

/// Where an episode's rows sit in the ring; `start + len` may wrap around.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct Span {
    start: usize,
    rows: usize,
    /// Leading rows that only complete the frame stacks of later rows: an episode whose
    /// oldest rows were overwritten has lost the frames its first rows' stacks need.
    #[serde(default)]
    context: usize,
    /// The episode's task (multitask runs).
    #[serde(default)]
    task: Option<u32>,
}

/// How observations are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObsLayout {
    /// The whole observation, float32.
    Vector { dim: usize },
    /// Stacks of `stack` frames of `frame` bytes each: only the newest frame of a row is kept.
    Frames { frame: usize, stack: usize },
}

impl ObsLayout {
    /// The layout of observations of `kind` with `dim` numbers each.
    pub fn new(kind: envs::ObsKind, dim: usize) -> Self {
        match kind {
            envs::ObsKind::State => Self::Vector { dim },
            envs::ObsKind::Rgb => Self::Frames {
                frame: dim / envs::FRAME_STACK,
                stack: envs::FRAME_STACK,
            },
        }
    }

    /// Numbers in one whole observation.
    pub fn obs_dim(self) -> usize {
        match self {
            Self::Vector { dim } => dim,
            Self::Frames { frame, stack } => frame * stack,
        }
    }

    /// What a row stores of its observation: all of it, or the newest frame (the numbers at
    /// the end of the observation).
    pub fn stored(self) -> usize {
        match self {
            Self::Vector { dim } => dim,
            Self::Frames { frame, .. } => frame,
        }
    }

    /// Rows before a sampled row whose observations its own completes (the older frames).
    fn lookback(self) -> usize {
        match self {
            Self::Vector { .. } => 0,
            Self::Frames { stack, .. } => stack - 1,
        }
    }

    fn kind(self) -> Kind {
        match self {
            Self::Vector { .. } => Kind::Float,
            Self::Frames { .. } => Kind::Uint8,
        }
    }
}

/// What a rank's replay buffer is built from (`Config::buffer_settings`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferSettings {
    /// Rows kept: min(buffer_size, steps / world_size), as many as the rank can ever fill.
    pub capacity: usize,
    pub obs: ObsLayout,
    pub action_dim: usize,
    /// Sequences per sampled batch (`batch_size`).
    pub batch_size: usize,
}

pub struct ReplayBuffer {
    capacity: usize,
    layout: ObsLayout,
    obs_dim: usize,
    action_dim: usize,
    obs: Tensor,
    action: Tensor,
    reward: Tensor,
    terminated: Tensor,
    /// Episodes still (at least partly) in the ring, oldest first.
    episodes: VecDeque<Span>,
    cursor: usize,
    filled: usize,
    device: Device,
}

impl ReplayBuffer {
    pub fn new(
        capacity: usize,
        layout: ObsLayout,
        action_dim: usize,
        device: Device,
    ) -> Result<Self> {
        if capacity == 0 {
            return Err(Error::Config("buffer_size must be >= 1".into()));
        }
        let rows = capacity as i64;
        let opts = (Kind::Float, device);
        // A GPU without room for it is bad input (a setting to lower), not a panic.
        let zeros = |shape: &[i64], options: (Kind, Device)| {
            Tensor::f_zeros(shape, options).map_err(|e| {
                let bytes = capacity * Self::bytes_per_row(layout, action_dim);
                Error::Config(format!(
                    "buffer_size={capacity}: the replay buffer's {:.1} GB cannot be allocated \
                     on {device:?} ({}); lower buffer_size",
                    bytes as f64 / 1e9,
                    e.to_string().lines().next().unwrap_or_default()
                ))
            })
        };
        Ok(Self {
            capacity,
            layout,
            obs_dim: layout.obs_dim(),
            action_dim,
            obs: zeros(&[rows, layout.stored() as i64], (layout.kind(), device))?,
            action: zeros(&[rows, action_dim as i64], opts)?,
            reward: zeros(&[rows], opts)?,
            terminated: zeros(&[rows], opts)?,
            episodes: VecDeque::new(),
            cursor: 0,
            filled: 0,
            device,
        })
    }

    /// Bytes of storage per row (what the bench reports).
    pub fn bytes_per_row(layout: ObsLayout, action_dim: usize) -> usize {
        let obs = match layout {
            ObsLayout::Vector { dim } => 4 * dim,
            ObsLayout::Frames { frame, .. } => frame,
        };
        obs + 4 * (action_dim + 2)
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes of its storage: the most a checkpoint writes of it (all of it once it wrapped).
    pub fn bytes(&self) -> usize {
        self.capacity * Self::bytes_per_row(self.layout, self.action_dim)
    }

    /// Rows currently stored.
    pub fn len(&self) -> usize {
        self.filled
    }

    pub fn is_empty(&self) -> bool {
        self.filled == 0
    }

    pub fn num_episodes(&self) -> usize {
        self.episodes.len()
    }

    /// Whether some episode has at least `rows` rows to sample.
    pub fn can_sample(&self, rows: usize) -> bool {
        self.episodes.iter().any(|s| s.rows - s.context >= rows)
    }

    /// Appends a finished episode as L+1 rows, overwriting the oldest rows when full.
    pub fn add(&mut self, episode: &Episode) -> Result<()> {
        let steps = episode.len();
        let rows = steps + 1;
        let stored = self.layout.stored();
        let kinds_ok = matches!(
            (&episode.obs, self.layout),
            (StoredObs::States(_), ObsLayout::Vector { .. })
                | (StoredObs::Frames(_), ObsLayout::Frames { .. })
        );
        if !kinds_ok {
            return Err(Error::Other(format!(
                "an episode of {} for a buffer of {:?}",
                match episode.obs {
                    StoredObs::States(_) => "states",
                    StoredObs::Frames(_) => "frames",
                },
                self.layout
            )));
        }
        let shapes_ok = episode.obs.len() == rows * stored
            && episode.action.len() == steps * self.action_dim
            && episode.terminated.len() == steps;
        if !shapes_ok {
            return Err(Error::Other(format!(
                "episode of {steps} steps has {} obs values, {} action values, {} flags; \
                 expected {}, {}, {}",
                episode.obs.len(),
                episode.action.len(),
                episode.terminated.len(),
                rows * stored,
                steps * self.action_dim,
                steps
            )));
        }
        if rows > self.capacity {
            return Err(Error::Config(format!(
                "an episode of {rows} rows does not fit in buffer_size={}",
                self.capacity
            )));
        }
        if let Some(other) = self
            .episodes
            .front()
            .filter(|s| s.task.is_some() != episode.task.is_some())
        {
            return Err(Error::Other(format!(
                "an episode with task {:?} in a buffer of episodes with task {:?}: a buffer \
                 holds one task's episodes or every episode's task",
                episode.task, other.task
            )));
        }
        // Row 0 has no action/reward/flag; NaN as in the official buffer (never sampled).
        let mut action = vec![f32::NAN; self.action_dim];
        action.extend_from_slice(&episode.action);
        let mut reward = vec![f32::NAN];
        reward.extend_from_slice(&episode.reward);
        let mut terminated = vec![f32::NAN];
        terminated.extend_from_slice(&episode.terminated);

        self.evict(rows);
        let start = self.cursor;
        match &episode.obs {
            StoredObs::States(values) => write_rows(&self.obs, start, values, stored, self.device),
            StoredObs::Frames(bytes) => write_rows(&self.obs, start, bytes, stored, self.device),
        }
        write_rows(&self.action, start, &action, self.action_dim, self.device);
        write_rows(&self.reward, start, &reward, 1, self.device);
        write_rows(&self.terminated, start, &terminated, 1, self.device);
        self.episodes.push_back(Span {
            start,
            rows,
            context: 0,
            task: episode.task,
        });
        self.cursor = (start + rows) % self.capacity;
        self.filled = (self.filled + rows).min(self.capacity);
        Ok(())
    }

    /// Trims or drops the oldest episodes whose rows the next `rows` writes overwrite.
    fn evict(&mut self, rows: usize) {
        let free = self.capacity - self.filled;
        let mut overwrite = rows.saturating_sub(free);
        while overwrite > 0 {
            let Some(oldest) = self.episodes.front_mut() else {
                break;
            };
            let taken = overwrite.min(oldest.rows);
            oldest.start = (oldest.start + taken) % self.capacity;
            oldest.rows -= taken;
            oldest.context = self.layout.lookback().min(oldest.rows);
            self.filled -= taken;
            overwrite -= taken;
            if oldest.rows == 0 {
                self.episodes.pop_front();
            }
        }
    }

    /// Samples `batch_size` slices of `horizon + 1` rows: an episode uniformly among those with
    /// enough rows, then a start uniformly within it.
    pub fn sample(&self, batch_size: usize, horizon: usize, rng: &mut Pcg64) -> Result<Batch> {
        let length = horizon + 1;
        let mut listed = None;
        // Per sampled row, the rows of its observation's parts (oldest frame first).
        let parts = self.layout.lookback() + 1;
        let mut index = vec![0i64; length * batch_size];
        let mut obs_index = vec![0i64; length * batch_size * parts];
        let mut tasks = Vec::with_capacity(batch_size);
        for b in 0..batch_size {
            let span = self.draw_episode(length, rng, &mut listed)?;
            tasks.extend(span.task.map(i64::from));
            let offset = rng.random_range(span.context..=span.rows - length);
            for t in 0..length {
                let row = t * batch_size + b;
                let ring = |position: usize| ((span.start + position) % self.capacity) as i64;
                index[row] = ring(offset + t);
                for k in 0..parts {
                    let back = parts - 1 - k;
                    obs_index[row * parts + k] = ring((offset + t).saturating_sub(back));
                }
            }
        }
        let index = Tensor::from_slice(&index).to_device(self.device);
        let obs_index = Tensor::from_slice(&obs_index).to_device(self.device);
        let (h, b) = (horizon as i64, batch_size as i64);
        let obs = self
            .obs
            .index_select(0, &obs_index)
            .view([h + 1, b, self.obs_dim as i64]);
        // Actions, rewards and flags come from rows 1..=H of each slice.
        let later = index.narrow(0, b, h * b);
        let action = self
            .action
            .index_select(0, &later)
            .view([h, b, self.action_dim as i64]);
        let reward = self.reward.index_select(0, &later).view([h, b, 1]);
        let terminated = self.terminated.index_select(0, &later).view([h, b, 1]);
        // Every episode has its task, or none has (`add` keeps it so).
        let task =
            (tasks.len() == batch_size).then(|| Tensor::from_slice(&tasks).to_device(self.device));
        Ok(Batch {
            obs,
            action,
            reward,
            terminated,
            task,
        })
    }
}

impl ReplayBuffer {
    /// An episode uniformly among those with at least `length` rows to sample. It is drawn
    /// among all and drawn again when too short, so a sample takes no pass over the episodes
    /// (a ring of short episodes holds hundreds of thousands): nearly every episode is long
    /// enough, all but the trimmed oldest and those shorter than a slice. After
    /// [`REDRAWS`] misses in a row it is drawn among the eligible ones, listed once in
    /// `listed`; each way gives every eligible episode the same chance.
    fn draw_episode(
        &self,
        length: usize,
        rng: &mut Pcg64,
        listed: &mut Option<Vec<Span>>,
    ) -> Result<Span> {
        let eligible = |s: &Span| s.rows - s.context >= length;
        if listed.is_none() && !self.episodes.is_empty() {
            for _ in 0..REDRAWS {
                let span = self.episodes[rng.random_range(0..self.episodes.len())];
                if eligible(&span) {
                    return Ok(span);
                }
            }
        }
        let listed =
            listed.get_or_insert_with(|| self.episodes.iter().copied().filter(eligible).collect());
        match listed.len() {
            0 => Err(Error::Other(format!(
                "the replay buffer holds no episode of at least {length} rows"
            ))),
            n => Ok(listed[rng.random_range(0..n)]),
        }
    }
}

/// Draws among all episodes before [`ReplayBuffer::draw_episode`] lists the eligible ones.
const REDRAWS: usize = 16;

/// Copies `values` (rows × width) into `storage` from row `start`, wrapping at the end.
fn write_rows<T: tch::kind::Element>(
    storage: &Tensor,
    start: usize,
    values: &[T],
    width: usize,
    device: Device,
) {
    let capacity = storage.size()[0] as usize;
    let rows = values.len() / width;
    let first = rows.min(capacity - start);
    let shape = |n: usize| -> Vec<i64> {
        if storage.dim() == 1 {
            vec![n as i64]
        } else {
            vec![n as i64, width as i64]
        }
    };
    let head = Tensor::from_slice(&values[..first * width]).view(shape(first).as_slice());
    storage
        .narrow(0, start as i64, first as i64)
        .copy_(&head.to_device(device));
    if first < rows {
        let tail =
            Tensor::from_slice(&values[first * width..]).view(shape(rows - first).as_slice());
        storage
            .narrow(0, 0, (rows - first) as i64)
            .copy_(&tail.to_device(device));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// An episode whose observation at step t is `base + t` (obs_dim 2), action `base + t`.
    pub(super) fn episode(base: f32, steps: usize) -> Episode {
        Episode {
            obs: StoredObs::States(
                (0..=steps)
                    .flat_map(|t| [base + t as f32, -(base + t as f32)])
                    .collect(),
            ),
            action: (0..steps).map(|t| base + t as f32).collect(),
            reward: (0..steps).map(|t| base + t as f32 + 0.5).collect(),
            terminated: vec![0.0; steps],
            task: None,
        }
    }

    pub(super) fn values(t: &Tensor) -> Vec<f32> {
        Vec::<f32>::try_from(t.flatten(0, -1)).unwrap()
    }

    /// An episode keeps a pixel stack's newest frame as bytes, one a number, and all of a
    /// state as float32.
    #[test]
    fn episodes_keep_the_newest_frame_as_bytes_and_states_whole() {
        let frames = ObsLayout::Frames { frame: 4, stack: 3 };
        let stack: Vec<f32> = (0..12).map(|v| v as f32 * 20.0).collect();
        let mut obs = StoredObs::first(frames, &stack);
        obs.push(frames, &stack);
        assert_eq!(
            obs,
            StoredObs::Frames(vec![160, 180, 200, 220, 160, 180, 200, 220])
        );
        let states = ObsLayout::Vector { dim: 3 };
        let mut obs = StoredObs::first(states, &[0.5, -1.5, 2.5]);
        obs.push(states, &[3.5, 4.5, -5.5]);
        assert_eq!(obs, StoredObs::States(vec![0.5, -1.5, 2.5, 3.5, 4.5, -5.5]));
        // A buffer takes only the kind it stores.
        let mut buffer = ReplayBuffer::new(10, states, 1, Device::Cpu).unwrap();
        let played = Episode {
            obs: StoredObs::Frames(vec![0; 6]),
            ..episode(0.0, 1)
        };
        let e = buffer.add(&played).unwrap_err().to_string();
        assert!(e.contains("an episode of frames"), "{e}");
    }

    #[test]
    fn a_buffer_that_cannot_be_allocated_is_a_setting_to_lower() {
        let huge = ReplayBuffer::new(1 << 40, ObsLayout::Vector { dim: 1 << 20 }, 1, Device::Cpu);
        let e = huge.err().expect("4 EB cannot be allocated").to_string();
        assert!(
            e.contains("buffer_size=1099511627776: the replay buffer's")
                && e.contains("lower buffer_size"),
            "{e}"
        );
    }

    #[test]
    fn slices_are_consecutive_rows_of_one_episode() {
        let mut buffer =
            ReplayBuffer::new(100, ObsLayout::Vector { dim: 2 }, 1, Device::Cpu).unwrap();
        buffer.add(&episode(0.0, 9)).unwrap();
        buffer.add(&episode(100.0, 9)).unwrap();
        assert_eq!(buffer.len(), 20);
        let mut rng = Pcg64::seed_from_u64(0);
        let batch = buffer.sample(64, 3, &mut rng).unwrap();
        assert_eq!(batch.obs.size(), [4, 64, 2]);
        assert_eq!(batch.action.size(), [3, 64, 1]);
        assert_eq!(batch.reward.size(), [3, 64, 1]);
        let obs = values(&batch.obs.select(2, 0));
        let action = values(&batch.action);
        let reward = values(&batch.reward);
        for b in 0..64 {
            let o0 = obs[b];
            for t in 0..4 {
                assert_eq!(obs[t * 64 + b], o0 + t as f32, "obs consecutive");
            }
            for t in 0..3 {
                // a_t and r_t sit in row t+1 and belong to the transition o_t -> o_{t+1}.
                assert_eq!(action[t * 64 + b], o0 + t as f32);
                assert_eq!(reward[t * 64 + b], o0 + t as f32 + 0.5);
            }
            assert!(o0 % 100.0 <= 6.0, "slice stays inside its episode");
        }
    }

    /// Each sampled slice carries its episode's task; a buffer does not mix episodes with and
    /// without tasks.
    #[test]
    fn multitask_slices_carry_their_episodes_task() {
        let mut buffer =
            ReplayBuffer::new(100, ObsLayout::Vector { dim: 2 }, 1, Device::Cpu).unwrap();
        for (base, task) in [(0.0, 2), (100.0, 0), (200.0, 1)] {
            let played = Episode {
                task: Some(task),
                ..episode(base, 9)
            };
            buffer.add(&played).unwrap();
        }
        // Tasks survive a checkpoint (export, then restore into a fresh buffer).
        let (tensors, meta) = buffer.export();
        let meta: BufferMeta =
            serde_json::from_str(&serde_json::to_string(&meta).unwrap()).unwrap();
        buffer = ReplayBuffer::new(100, ObsLayout::Vector { dim: 2 }, 1, Device::Cpu).unwrap();
        buffer.restore(&tensors, meta).unwrap();
        let batch = buffer.sample(48, 3, &mut Pcg64::seed_from_u64(1)).unwrap();
        let tasks = Vec::<i64>::try_from(batch.task.expect("a multitask batch")).unwrap();
        let first_obs = values(&batch.obs.get(0).select(1, 0));
        for (o0, task) in first_obs.iter().zip(&tasks) {
            let expected = match (o0 / 100.0) as i64 {
                0 => 2,
                1 => 0,
                _ => 1,
            };
            assert_eq!(*task, expected, "slice from {o0}");
        }
        assert!(
            buffer.add(&episode(300.0, 9)).is_err(),
            "an episode without its task"
        );
        let mut single =
            ReplayBuffer::new(100, ObsLayout::Vector { dim: 2 }, 1, Device::Cpu).unwrap();
        single.add(&episode(0.0, 9)).unwrap();
        let batch = single.sample(4, 3, &mut Pcg64::seed_from_u64(1)).unwrap();
        assert!(batch.task.is_none());
    }

    #[test]
    fn sampling_is_uniform_over_episodes() {
        let mut buffer =
            ReplayBuffer::new(1000, ObsLayout::Vector { dim: 2 }, 1, Device::Cpu).unwrap();
        buffer.add(&episode(0.0, 3)).unwrap(); // one possible slice
        buffer.add(&episode(1000.0, 300)).unwrap(); // many possible slices
        let mut rng = Pcg64::seed_from_u64(1);
        let batch = buffer.sample(4000, 3, &mut rng).unwrap();
        let short = values(&batch.obs.get(0).select(1, 0))
            .iter()
            .filter(|&&o| o < 1000.0)
            .count();
        let share = short as f64 / 4000.0;
        assert!(
            (share - 0.5).abs() < 0.04,
            "per-episode uniform: short episode share {share}"
        );
    }

    /// Among many episodes too short for a slice, the long ones are still drawn alike, by
    /// redrawing (few short ones) or from the list of eligible ones (mostly short ones); with
    /// none long enough, the sample is an error naming the length.
    #[test]
    fn episodes_too_short_for_a_slice_are_never_drawn() {
        for shorts in [3, 400] {
            let mut buffer =
                ReplayBuffer::new(10_000, ObsLayout::Vector { dim: 2 }, 1, Device::Cpu).unwrap();
            for i in 0..shorts {
                buffer.add(&episode(5000.0 + i as f32 * 10.0, 2)).unwrap();
            }
            buffer.add(&episode(0.0, 3)).unwrap();
            buffer.add(&episode(1000.0, 300)).unwrap();
            let batch = buffer
                .sample(4000, 3, &mut Pcg64::seed_from_u64(3))
                .unwrap();
            let firsts = values(&batch.obs.get(0).select(1, 0));
            assert!(
                firsts.iter().all(|&o| o < 5000.0),
                "{shorts}: a short one drawn"
            );
            let share = firsts.iter().filter(|&&o| o < 1000.0).count() as f64 / 4000.0;
            assert!(
                (share - 0.5).abs() < 0.04,
                "{shorts} short ones: share {share}"
            );
        }
        let mut short_only =
            ReplayBuffer::new(100, ObsLayout::Vector { dim: 2 }, 1, Device::Cpu).unwrap();
        short_only.add(&episode(0.0, 2)).unwrap();
        let e = short_only
            .sample(4, 3, &mut Pcg64::seed_from_u64(3))
            .unwrap_err();
        assert!(
            e.to_string().contains("no episode of at least 4 rows"),
            "{e}"
        );
    }

    #[test]
    fn ring_overwrites_the_oldest_and_trims_it() {
        let mut buffer =
            ReplayBuffer::new(25, ObsLayout::Vector { dim: 2 }, 1, Device::Cpu).unwrap();
        buffer.add(&episode(0.0, 9)).unwrap(); // rows 0..10
        buffer.add(&episode(100.0, 9)).unwrap(); // rows 10..20
        buffer.add(&episode(200.0, 9)).unwrap(); // rows 20..25 then 0..5: trims episode 0
        assert_eq!(buffer.len(), 25);
        assert_eq!(buffer.num_episodes(), 3);
        buffer.add(&episode(300.0, 9)).unwrap(); // rows 5..15: drops episode 0, trims episode 1
        assert_eq!(buffer.num_episodes(), 3);
        let mut rng = Pcg64::seed_from_u64(2);
        let batch = buffer.sample(500, 3, &mut rng).unwrap();
        let obs = values(&batch.obs.select(2, 0));
        for b in 0..500 {
            let o0 = obs[b];
            assert!(o0 >= 100.0, "episode 0 is gone: {o0}");
            if o0 < 200.0 {
                assert!(o0 >= 105.0, "episode 1 lost its first 5 rows: {o0}");
            }
            for t in 0..4 {
                assert_eq!(
                    obs[t * 500 + b],
                    o0 + t as f32,
                    "a wrapped episode stays consecutive"
                );
            }
        }
    }

    pub(super) const PIXELS: ObsLayout = ObsLayout::Frames { frame: 2, stack: 3 };

    /// Frame t of an episode: `[base + t, 200 − base − t]` (bytes).
    fn frame(base: usize, t: usize) -> [f32; 2] {
        [(base + t) as f32, (200 - base - t) as f32]
    }

    /// The stack the environment shows at step t: frames t−2, t−1, t, the first repeated.
    fn stack(base: usize, t: usize) -> Vec<f32> {
        (0..3)
            .flat_map(|k| frame(base, (t + k).saturating_sub(2)))
            .collect()
    }

    pub(super) fn pixel_episode(base: usize, steps: usize) -> Episode {
        Episode {
            obs: StoredObs::Frames(
                (0..=steps)
                    .flat_map(|t| frame(base, t))
                    .map(|v| v as u8)
                    .collect(),
            ),
            action: vec![0.0; steps],
            reward: vec![0.0; steps],
            terminated: vec![0.0; steps],
            task: None,
        }
    }

    /// Every sampled stack is the one the environment showed, at episode starts too and after
    /// the ring overwrote an episode's first rows. Returns (episode, step) of each slice start.
    pub(super) fn check_stacks(buffer: &ReplayBuffer, seed: u64) -> Vec<(usize, usize)> {
        let batch = buffer
            .sample(300, 2, &mut Pcg64::seed_from_u64(seed))
            .unwrap();
        assert_eq!(batch.obs.kind(), Kind::Uint8);
        let obs = values(&batch.obs.to_kind(Kind::Float));
        let mut starts = vec![];
        for (i, row) in obs.chunks(6).enumerate() {
            let newest = row[4] as usize;
            let (base, t) = (newest / 50 * 50, newest % 50);
            assert_eq!(row, stack(base, t).as_slice(), "sampled row {i}");
            if i < 300 {
                starts.push((base, t));
            }
        }
        starts
    }

    #[test]
    fn pixel_rows_keep_one_frame_and_sampled_stacks_are_rebuilt_exactly() {
        let mut buffer = ReplayBuffer::new(100, PIXELS, 1, Device::Cpu).unwrap();
        assert_eq!(buffer.obs.size(), [100, 2], "one frame a row");
        buffer.add(&pixel_episode(0, 9)).unwrap();
        buffer.add(&pixel_episode(50, 20)).unwrap();
        let starts = check_stacks(&buffer, 4);
        assert!(
            starts.contains(&(0, 0)) && starts.contains(&(50, 1)),
            "episode starts sampled"
        );
        assert_eq!(
            ReplayBuffer::bytes_per_row(
                ObsLayout::Frames {
                    frame: 12288,
                    stack: 3
                },
                6
            ),
            12288 + 32
        );
    }

    #[test]
    fn a_trimmed_pixel_episode_keeps_its_first_rows_as_frame_context_only() {
        let mut buffer = ReplayBuffer::new(40, PIXELS, 1, Device::Cpu).unwrap();
        buffer.add(&pixel_episode(0, 19)).unwrap(); // rows 0..20
        buffer.add(&pixel_episode(50, 14)).unwrap(); // rows 20..35
        buffer.add(&pixel_episode(100, 9)).unwrap(); // rows 35..40, 0..5: trims episode 0 by 5
        let starts = check_stacks(&buffer, 5);
        let first: Vec<usize> = starts.iter().filter(|s| s.0 == 0).map(|s| s.1).collect();
        assert!(
            first.iter().all(|&t| t >= 7),
            "episode 0 now starts at step 5; steps 5 and 6 only complete later stacks"
        );
        assert!(first.contains(&7));
    }

    #[test]
    fn too_short_episodes_are_not_sampled_and_bad_input_is_an_error() {
        let mut buffer =
            ReplayBuffer::new(50, ObsLayout::Vector { dim: 2 }, 1, Device::Cpu).unwrap();
        buffer.add(&episode(0.0, 2)).unwrap(); // 3 rows < H+1
        let mut rng = Pcg64::seed_from_u64(3);
        assert!(buffer.sample(4, 3, &mut rng).is_err());
        let mut bad = episode(0.0, 4);
        bad.action.pop();
        assert!(buffer.add(&bad).is_err());
        assert!(
            buffer.add(&episode(0.0, 60)).is_err(),
            "larger than the buffer"
        );
    }
}
