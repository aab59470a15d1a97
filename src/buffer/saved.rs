//! A replay buffer in a checkpoint: its tensors and bookkeeping, and restoring them into a
//! ring of the same or another capacity.
use serde::{Deserialize, Serialize};
use tch::{Device, Tensor};

use super::{ReplayBuffer, Span};
use crate::error::{Error, Result};

/// The buffer's bookkeeping, saved beside its tensors in a checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BufferMeta {
    capacity: usize,
    obs_dim: usize,
    action_dim: usize,
    episodes: Vec<Span>,
    cursor: usize,
    filled: usize,
}

impl BufferMeta {
    /// Rows the saved ring had.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

impl ReplayBuffer {
    /// The storage tensors (on the CPU) and bookkeeping, for a checkpoint.
    pub fn export(&self) -> (Vec<(String, Tensor)>, BufferMeta) {
        let tensors = [
            ("obs", &self.obs),
            ("action", &self.action),
            ("reward", &self.reward),
            ("terminated", &self.terminated),
        ]
        .into_iter()
        .map(|(name, t)| (name.to_owned(), t.to_device(Device::Cpu)))
        .collect();
        let meta = BufferMeta {
            capacity: self.capacity,
            obs_dim: self.obs_dim,
            action_dim: self.action_dim,
            episodes: self.episodes.iter().copied().collect(),
            cursor: self.cursor,
            filled: self.filled,
        };
        (tensors, meta)
    }

    /// Restores what [`Self::export`] produced into a buffer of the same observation and
    /// action widths. A buffer of another capacity (a resume with more or fewer `steps` a rank,
    /// or another `buffer_size`) takes the saved episodes in order, oldest first, from its first
    /// row; when they do not all fit, the newest rows that do, as the ring would have kept them.
    pub fn restore(&mut self, tensors: &[(String, Tensor)], meta: BufferMeta) -> Result<()> {
        if (meta.obs_dim, meta.action_dim) != (self.obs_dim, self.action_dim) {
            return Err(Error::Other(format!(
                "the saved replay buffer holds observations of {} and actions of {} numbers; \
                 this run's are {} and {}",
                meta.obs_dim, meta.action_dim, self.obs_dim, self.action_dim
            )));
        }
        let moved = (meta.capacity != self.capacity)
            .then(|| linearised(&meta, self.capacity, self.layout.lookback()))
            .transpose()?;
        // Every saved tensor is checked before any is copied.
        let storage = [
            ("obs", &self.obs),
            ("action", &self.action),
            ("reward", &self.reward),
            ("terminated", &self.terminated),
        ];
        let mut pairs = Vec::with_capacity(storage.len());
        for (name, target) in storage {
            let saved = tensors
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| t)
                .ok_or_else(|| Error::Other(format!("the saved replay buffer lacks '{name}'")))?;
            let mut expected = target.size();
            expected[0] = meta.capacity as i64;
            if saved.size() != expected || saved.kind() != target.kind() {
                return Err(Error::Other(format!(
                    "the saved replay buffer's '{name}' has shape {:?} ({:?}); its bookkeeping \
                     says {expected:?} ({:?})",
                    saved.size(),
                    saved.kind(),
                    target.kind()
                )));
            }
            pairs.push((saved, target));
        }
        for (saved, target) in pairs {
            tch::no_grad(|| match &moved {
                None => target.shallow_clone().f_copy_(saved),
                Some((_, rows)) => {
                    let kept = saved.f_index_select(0, &Tensor::from_slice(rows))?;
                    target
                        .narrow(0, 0, rows.len() as i64)
                        .f_copy_(&kept.to_device(self.device))
                }
            })?;
        }
        match moved {
            None => {
                self.episodes = meta.episodes.into_iter().collect();
                self.cursor = meta.cursor;
                self.filled = meta.filled;
            }
            Some((episodes, rows)) => {
                self.episodes = episodes.into_iter().collect();
                self.cursor = rows.len() % self.capacity;
                self.filled = rows.len();
            }
        }
        Ok(())
    }
}

/// The saved episodes laid out from row 0 of a ring of `capacity` rows: the newest rows that
/// fit, oldest first. Returns their spans there and, for each new row, its row in the saved
/// ring. An episode that loses its first rows keeps `lookback` of what is left as frame context
/// only, as the ring's own overwriting does.
fn linearised(
    meta: &BufferMeta,
    capacity: usize,
    lookback: usize,
) -> Result<(Vec<Span>, Vec<i64>)> {
    let saved_capacity = meta.capacity;
    if saved_capacity == 0 || meta.episodes.iter().any(|s| s.rows > saved_capacity) {
        return Err(Error::Other(format!(
            "the saved replay buffer's bookkeeping is inconsistent: capacity {saved_capacity} \
             with episodes of {:?} rows",
            meta.episodes.iter().map(|s| s.rows).collect::<Vec<_>>()
        )));
    }
    let mut room = capacity;
    let mut kept = Vec::new();
    for span in meta.episodes.iter().rev() {
        if room == 0 {
            break;
        }
        let rows = span.rows.min(room);
        let lost = span.rows - rows;
        let context = match lost {
            0 => span.context,
            _ => lookback.min(rows),
        };
        kept.push((span, lost, rows, context));
        room -= rows;
    }
    let mut spans = Vec::with_capacity(kept.len());
    let mut positions = Vec::with_capacity(capacity - room);
    for (span, lost, rows, context) in kept.into_iter().rev() {
        spans.push(Span {
            start: positions.len(),
            rows,
            context,
            task: span.task,
        });
        positions.extend((lost..span.rows).map(|i| ((span.start + i) % saved_capacity) as i64));
    }
    Ok((spans, positions))
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand_pcg::Pcg64;

    use super::*;
    use crate::buffer::tests::{check_stacks, episode, pixel_episode, values, PIXELS};
    use crate::buffer::ObsLayout;

    /// A copy of `buffer` through a checkpoint, into a buffer of `capacity` rows.
    fn moved(buffer: &ReplayBuffer, capacity: usize) -> Result<ReplayBuffer> {
        let (tensors, meta) = buffer.export();
        let mut other = ReplayBuffer::new(capacity, buffer.layout, 1, Device::Cpu)?;
        other.restore(&tensors, meta)?;
        Ok(other)
    }

    #[test]
    fn a_wrapped_ring_restored_into_a_larger_buffer_samples_the_same_and_fills_on() {
        let mut small =
            ReplayBuffer::new(25, ObsLayout::Vector { dim: 2 }, 1, Device::Cpu).unwrap();
        for base in [0.0, 100.0, 200.0, 300.0] {
            small.add(&episode(base, 9)).unwrap(); // the last wraps; episode 1 lost 5 rows
        }
        let mut large = moved(&small, 100).unwrap();
        assert_eq!((large.len(), large.num_episodes()), (25, 3));
        for seed in 0..3 {
            let (a, b) = (
                small
                    .sample(64, 3, &mut Pcg64::seed_from_u64(seed))
                    .unwrap(),
                large
                    .sample(64, 3, &mut Pcg64::seed_from_u64(seed))
                    .unwrap(),
            );
            for (x, y) in [
                (&a.obs, &b.obs),
                (&a.action, &b.action),
                (&a.reward, &b.reward),
            ] {
                assert_eq!(values(x), values(y), "seed {seed}");
            }
        }
        // The larger ring fills its free rows before it overwrites anything.
        for base in [400.0, 500.0, 600.0, 700.0, 800.0, 900.0, 1000.0] {
            large.add(&episode(base, 9)).unwrap();
        }
        assert_eq!((large.len(), large.num_episodes()), (95, 10));
        large.add(&episode(1100.0, 9)).unwrap();
        assert_eq!(
            (large.len(), large.num_episodes()),
            (100, 10),
            "105 rows: one dropped"
        );
        // The same capacity restores the ring as it was.
        let same = moved(&small, 25).unwrap();
        assert_eq!(
            (same.cursor, same.episodes.clone()),
            (small.cursor, small.episodes)
        );
    }

    #[test]
    fn a_smaller_buffer_keeps_the_newest_rows_and_rebuilds_their_frame_stacks() {
        let mut buffer = ReplayBuffer::new(100, PIXELS, 1, Device::Cpu).unwrap();
        buffer.add(&pixel_episode(0, 19)).unwrap(); // 20 rows
        buffer.add(&pixel_episode(50, 14)).unwrap(); // 15 rows
        buffer.add(&pixel_episode(100, 9)).unwrap(); // 10 rows
        let small = moved(&buffer, 30).unwrap();
        assert_eq!((small.len(), small.num_episodes()), (30, 3));
        let starts = check_stacks(&small, 6);
        let first: Vec<usize> = starts.iter().filter(|s| s.0 == 0).map(|s| s.1).collect();
        assert!(
            first.iter().all(|&t| t >= 17),
            "episode 0 keeps its last 5 rows (steps 15..20), two of them frame context only"
        );
        assert!(first.contains(&17) && starts.iter().any(|s| s.0 == 100));
        let tiny = moved(&buffer, 12).unwrap();
        assert_eq!((tiny.len(), tiny.num_episodes()), (12, 2));
        assert!(check_stacks(&tiny, 7).iter().all(|s| s.0 == 100));
    }

    #[test]
    fn a_saved_buffer_of_other_widths_or_damaged_bookkeeping_is_an_error() {
        let mut buffer =
            ReplayBuffer::new(50, ObsLayout::Vector { dim: 2 }, 1, Device::Cpu).unwrap();
        buffer.add(&episode(0.0, 9)).unwrap();
        let (tensors, meta) = buffer.export();
        let mut wider =
            ReplayBuffer::new(50, ObsLayout::Vector { dim: 3 }, 1, Device::Cpu).unwrap();
        let err = wider
            .restore(&tensors, meta.clone())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("observations of 2") && err.contains("are 3"),
            "{err}"
        );
        let mut target =
            ReplayBuffer::new(80, ObsLayout::Vector { dim: 2 }, 1, Device::Cpu).unwrap();
        let damaged = BufferMeta {
            capacity: 40,
            ..meta.clone()
        };
        let err = target.restore(&tensors, damaged).unwrap_err().to_string();
        assert!(err.contains("'obs' has shape [50, 2]"), "{err}");
        let damaged = BufferMeta {
            capacity: 0,
            ..meta.clone()
        };
        assert!(target.restore(&tensors, damaged).is_err());
        // A missing part leaves the buffer as it was, its other parts not copied in.
        target.add(&episode(500.0, 9)).unwrap();
        let before = values(&target.obs);
        let err = target.restore(&tensors[..3], meta).unwrap_err().to_string();
        assert!(err.contains("lacks 'terminated'"), "{err}");
        assert_eq!(values(&target.obs), before);
        assert_eq!(target.len(), 10);
    }
}
