//! A replay buffer in a checkpoint: its tensors and bookkeeping, and restoring them into a
//! ring of the same or another capacity, or dealing the buffers of one world size out to the
//! ranks of another. A ring that has not wrapped yet is saved up to its last row, and saved
//! rows come back a slice at a time: a restore holds no second copy of the ring.
use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

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
    /// The rows saved, the ring's first (a ring that had not wrapped yet); none: all of them,
    /// as every buffer saved before this was recorded.
    #[serde(default)]
    saved_rows: Option<usize>,
}

impl BufferMeta {
    /// Rows the saved ring had.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Rows of the ring the saved tensors hold, from its first.
    fn saved_rows(&self) -> usize {
        self.saved_rows.unwrap_or(self.capacity)
    }

    /// That the bookkeeping describes a ring the buffer could have written: episodes one after
    /// another within the capacity, ending at the cursor, their rows the rows filled.
    pub fn check(&self) -> Result<()> {
        let capacity = self.capacity;
        let mut end = self.episodes.first().map_or(self.cursor, |s| s.start);
        let mut rows = 0usize;
        let mut consistent = capacity > 0 && self.cursor < capacity;
        for span in &self.episodes {
            consistent &= span.start == end
                && span.start < capacity
                && span.rows > 0
                && span.context <= span.rows;
            if !consistent {
                break;
            }
            rows = rows.saturating_add(span.rows);
            end = (span.start + span.rows.min(capacity)) % capacity;
        }
        // Fewer rows saved than the ring has: those of a ring that had not wrapped.
        let saved = self.saved_rows();
        let within_saved = saved == capacity
            || (saved <= capacity && self.episodes.iter().all(|s| s.start + s.rows <= saved));
        if consistent
            && rows == self.filled
            && rows <= capacity
            && end == self.cursor
            && within_saved
        {
            return Ok(());
        }
        Err(Error::Unreadable(format!(
            "the saved replay buffer's bookkeeping is inconsistent: capacity {capacity}, cursor \
             {}, {} rows filled, {saved} rows saved, episodes (start, rows, context) {:?}",
            self.cursor,
            self.filled,
            self.episodes
                .iter()
                .map(|s| (s.start, s.rows, s.context))
                .collect::<Vec<_>>()
        )))
    }
}

/// How the buffers saved by `from` ranks are dealt out to the `to` ranks of a resumed run,
/// episode by episode: episode e of saved rank i (oldest first) goes to rank
/// (i + from·e) mod `to`. Every episode goes to one rank, the ranks' shares are near equal, and
/// at the same world size each rank takes its own buffer whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dealing {
    pub from: usize,
    pub to: usize,
}

impl Dealing {
    fn rank_of(&self, saved_rank: usize, episode: usize) -> usize {
        (saved_rank + self.from * episode) % self.to
    }

    /// The saved ranks with episodes for `rank`: those congruent to it modulo gcd(from, to).
    pub fn sources(&self, rank: usize) -> Vec<usize> {
        let common = gcd(self.from, self.to);
        (0..self.from)
            .filter(|i| i % common == rank % common)
            .collect()
    }
}

fn gcd(a: usize, b: usize) -> usize {
    match b {
        0 => a.max(1),
        _ => gcd(b, a % b),
    }
}

/// The episodes of one saved buffer that a restore takes.
#[derive(Debug, Clone)]
pub struct SavedPart {
    meta: BufferMeta,
    /// Indices into `meta.episodes`, oldest first.
    taken: Vec<usize>,
}

impl SavedPart {
    /// Every episode of a saved buffer.
    pub fn whole(meta: BufferMeta) -> Self {
        let taken = (0..meta.episodes.len()).collect();
        Self { meta, taken }
    }

    /// The episodes of the buffer that `saved_rank` saved which `rank` takes in `dealing`.
    pub fn dealt(meta: BufferMeta, dealing: Dealing, saved_rank: usize, rank: usize) -> Self {
        let taken = (0..meta.episodes.len())
            .filter(|&e| dealing.rank_of(saved_rank, e) == rank)
            .collect();
        Self { meta, taken }
    }

    pub fn meta(&self) -> &BufferMeta {
        &self.meta
    }

    /// Rows of the episodes taken.
    pub fn rows(&self) -> usize {
        self.taken.iter().map(|&e| self.meta.episodes[e].rows).sum()
    }

    /// The saved ring verbatim: all of a ring of this capacity.
    fn is_verbatim(&self, capacity: usize) -> bool {
        self.meta.capacity == capacity && self.taken.len() == self.meta.episodes.len()
    }
}

/// A saved buffer's tensors, read a slice of rows at a time (from a file, or held in memory).
pub trait SavedTensors {
    /// The shape and kind of tensor `name`, if saved.
    fn describe(&self, name: &str) -> Option<(Vec<i64>, Kind)>;
    /// Rows `start..start + count` of tensor `name`, on the CPU or where it is held.
    fn rows(&self, name: &str, start: i64, count: i64) -> Result<Tensor>;
}

impl SavedTensors for [(String, Tensor)] {
    fn describe(&self, name: &str) -> Option<(Vec<i64>, Kind)> {
        let (_, t) = self.iter().find(|(n, _)| n == name)?;
        Some((t.size(), t.kind()))
    }

    fn rows(&self, name: &str, start: i64, count: i64) -> Result<Tensor> {
        let (_, t) = (self.iter().find(|(n, _)| n == name))
            .ok_or_else(|| Error::Other(format!("the saved replay buffer lacks '{name}'")))?;
        Ok(t.f_narrow(0, start, count)?)
    }
}

impl SavedTensors for Vec<(String, Tensor)> {
    fn describe(&self, name: &str) -> Option<(Vec<i64>, Kind)> {
        self.as_slice().describe(name)
    }

    fn rows(&self, name: &str, start: i64, count: i64) -> Result<Tensor> {
        self.as_slice().rows(name, start, count)
    }
}

impl<T: SavedTensors + ?Sized> SavedTensors for &T {
    fn describe(&self, name: &str) -> Option<(Vec<i64>, Kind)> {
        (**self).describe(name)
    }

    fn rows(&self, name: &str, start: i64, count: i64) -> Result<Tensor> {
        (**self).rows(name, start, count)
    }
}

/// The most bytes of a tensor's rows a restore reads at once.
const SLICE_BYTES: i64 = 64 << 20;

impl ReplayBuffer {
    /// The storage tensors (where the buffer keeps them, shared, not copied) and bookkeeping,
    /// for a checkpoint: its writer copies a device's rows to the host a slice at a time. A
    /// ring that has not wrapped yet gives its rows up to the last filled.
    pub fn export(&self) -> (Vec<(String, Tensor)>, BufferMeta) {
        let from_first_row = self.episodes.front().is_none_or(|first| first.start == 0);
        let saved_rows = match from_first_row && self.filled < self.capacity {
            true => self.filled,
            false => self.capacity,
        };
        let tensors = self
            .storage()
            .into_iter()
            .map(|(name, t)| (name.to_owned(), t.narrow(0, 0, saved_rows as i64)))
            .collect();
        let meta = BufferMeta {
            capacity: self.capacity,
            obs_dim: self.obs_dim,
            action_dim: self.action_dim,
            episodes: self.episodes.iter().copied().collect(),
            cursor: self.cursor,
            filled: self.filled,
            saved_rows: Some(saved_rows),
        };
        (tensors, meta)
    }

    fn storage(&self) -> [(&'static str, &Tensor); 4] {
        [
            ("obs", &self.obs),
            ("action", &self.action),
            ("reward", &self.reward),
            ("terminated", &self.terminated),
        ]
    }

    /// Restores what [`Self::export`] produced into a buffer of the same observation and
    /// action widths ([`Self::gather`] of the whole saved buffer).
    pub fn restore(&mut self, tensors: &[(String, Tensor)], meta: BufferMeta) -> Result<()> {
        self.gather(vec![SavedPart::whole(meta)], |_| Ok(tensors))
    }

    /// Fills this buffer with the episodes `parts` take; `load(p)` opens part p's tensors, one
    /// part at a time, and their rows are copied a slice at a time. A single whole buffer of this capacity comes back verbatim (a resume at
    /// the same size makes the same updates); otherwise the episodes are laid out oldest first
    /// from row 0, and when they do not all fit, the newest rows that do, as the ring would
    /// have kept them. A part is checked whole before any of it is copied: an error leaves the
    /// buffer as it was, or empty when parts before it were copied in already.
    pub fn gather<S: SavedTensors>(
        &mut self,
        parts: Vec<SavedPart>,
        mut load: impl FnMut(usize) -> Result<S>,
    ) -> Result<()> {
        for part in &parts {
            let meta = &part.meta;
            meta.check()?;
            if (meta.obs_dim, meta.action_dim) != (self.obs_dim, self.action_dim) {
                return Err(Error::Other(format!(
                    "the saved replay buffer holds observations of {} and actions of {} \
                     numbers; this run's are {} and {}",
                    meta.obs_dim, meta.action_dim, self.obs_dim, self.action_dim
                )));
            }
        }
        if let [part] = &parts[..] {
            if part.is_verbatim(self.capacity) {
                return self.restore_verbatim(&load(0)?, &part.meta);
            }
        }
        let Layout { spans, sources } = linearised(&parts, self.capacity, self.layout.lookback());
        // Rows are overwritten from the first copy on: an error after it leaves the buffer empty.
        let mut touched = false;
        for (p, part) in parts.iter().enumerate() {
            let (new_rows, saved_rows): (Vec<i64>, Vec<i64>) = sources
                .iter()
                .enumerate()
                .filter(|(_, (q, _))| *q == p)
                .map(|(new, (_, saved))| (new as i64, *saved))
                .unzip();
            if new_rows.is_empty() {
                continue;
            }
            let copied = load(p).and_then(|tensors| {
                self.checked(&tensors, &part.meta)?;
                touched = true;
                self.copy_rows(&tensors, &part.meta, (&new_rows, &saved_rows))
            });
            if let Err(e) = copied {
                if touched {
                    self.forget_rows();
                }
                return Err(e);
            }
        }
        self.episodes = spans.into_iter().collect();
        self.cursor = sources.len() % self.capacity;
        self.filled = sources.len();
        Ok(())
    }

    /// Copies rows `saved_rows` of a saved buffer to rows `new_rows` of this one, a run of
    /// consecutive rows a slice at a time.
    fn copy_rows(
        &self,
        saved: &impl SavedTensors,
        meta: &BufferMeta,
        (new_rows, saved_rows): (&[i64], &[i64]),
    ) -> Result<()> {
        let runs = runs(new_rows, saved_rows);
        for (name, target) in self.checked(saved, meta)? {
            copy_runs(saved, name, target, &runs)?;
        }
        Ok(())
    }

    fn restore_verbatim(&mut self, saved: &impl SavedTensors, meta: &BufferMeta) -> Result<()> {
        let whole = [(0, 0, meta.saved_rows() as i64)];
        let copied = self
            .checked(saved, meta)?
            .into_iter()
            .try_for_each(|(name, target)| copy_runs(saved, name, target, &whole));
        if let Err(e) = copied {
            self.forget_rows();
            return Err(e);
        }
        self.episodes = meta.episodes.iter().copied().collect();
        self.cursor = meta.cursor;
        self.filled = meta.filled;
        Ok(())
    }

    /// Empties the buffer (its rows are no longer what its bookkeeping says).
    fn forget_rows(&mut self) {
        self.episodes.clear();
        (self.cursor, self.filled) = (0, 0);
    }

    /// Each saved tensor's name beside the storage it goes to, all checked: present, with the
    /// saved rows and this buffer's row shape and kind.
    fn checked(
        &self,
        saved: &impl SavedTensors,
        meta: &BufferMeta,
    ) -> Result<Vec<(&'static str, &Tensor)>> {
        let mut pairs = Vec::with_capacity(4);
        for (name, target) in self.storage() {
            let (shape, kind) = saved
                .describe(name)
                .ok_or_else(|| Error::Other(format!("the saved replay buffer lacks '{name}'")))?;
            let mut expected = target.size();
            expected[0] = meta.saved_rows() as i64;
            if shape != expected || kind != target.kind() {
                return Err(Error::Other(format!(
                    "the saved replay buffer's '{name}' has shape {shape:?} ({kind:?}); its \
                     bookkeeping says {expected:?} ({:?})",
                    target.kind()
                )));
            }
            pairs.push((name, target));
        }
        Ok(pairs)
    }
}

/// Runs of consecutive rows, (new row, saved row, rows), from rows `new` taking rows `saved`.
fn runs(new: &[i64], saved: &[i64]) -> Vec<(i64, i64, i64)> {
    let mut runs: Vec<(i64, i64, i64)> = Vec::new();
    for (&n, &s) in new.iter().zip(saved) {
        match runs.last_mut() {
            Some((to, from, rows)) if *to + *rows == n && *from + *rows == s => *rows += 1,
            _ => runs.push((n, s, 1)),
        }
    }
    runs
}

/// Copies `runs` of rows of saved tensor `name` into `target`, at most [`SLICE_BYTES`] at a
/// time.
fn copy_runs(
    saved: &impl SavedTensors,
    name: &str,
    target: &Tensor,
    runs: &[(i64, i64, i64)],
) -> Result<()> {
    let rows = target.size().first().copied().unwrap_or(1).max(1);
    let row_bytes = (target.numel() as i64 / rows) * target.kind().elt_size_in_bytes() as i64;
    let per_slice = (SLICE_BYTES / row_bytes.max(1)).max(1);
    for &(to, from, count) in runs {
        let mut done = 0;
        while done < count {
            let n = per_slice.min(count - done);
            let slice = saved.rows(name, from + done, n)?;
            tch::no_grad(|| target.f_narrow(0, to + done, n)?.f_copy_(&slice).map(drop))?;
            done += n;
        }
    }
    Ok(())
}

/// Restored episodes laid out from row 0 of a ring.
struct Layout {
    spans: Vec<Span>,
    /// For each new row, its part and row in that part's saved ring.
    sources: Vec<(usize, i64)>,
}

/// The episodes `parts` take laid out from row 0 of a ring of `capacity` rows: the newest rows
/// that fit, oldest first (episodes of several parts by their age in their own buffer, then
/// by part). An episode that loses its first rows keeps `lookback` of what is left as frame
/// context only, as the ring's own overwriting does.
fn linearised(parts: &[SavedPart], capacity: usize, lookback: usize) -> Layout {
    let mut taken = Vec::new();
    for (p, part) in parts.iter().enumerate() {
        let newest = part.meta.episodes.len();
        taken.extend(part.taken.iter().map(|&e| (newest - e, p, e)));
    }
    // Oldest first: the largest age, then the first part.
    taken.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut room = capacity;
    let mut kept = Vec::new();
    for &(_, p, e) in taken.iter().rev() {
        if room == 0 {
            break;
        }
        let span = parts[p].meta.episodes[e];
        let rows = span.rows.min(room);
        let lost = span.rows - rows;
        let context = match lost {
            0 => span.context,
            _ => lookback.min(rows),
        };
        kept.push((p, span, lost, rows, context));
        room -= rows;
    }
    let mut spans = Vec::with_capacity(kept.len());
    let mut positions = Vec::with_capacity(capacity - room);
    for (p, span, lost, rows, context) in kept.into_iter().rev() {
        spans.push(Span {
            start: positions.len(),
            rows,
            context,
            task: span.task,
        });
        let saved_capacity = parts[p].meta.capacity;
        positions
            .extend((lost..span.rows).map(|i| (p, ((span.start + i) % saved_capacity) as i64)));
    }
    Layout {
        spans,
        sources: positions,
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand_pcg::Pcg64;

    use super::*;
    use crate::buffer::tests::{check_stacks, episode, pixel_episode, values, PIXELS};
    use crate::buffer::{Episode, ObsLayout};
    use tch::Device;

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

    /// A ring of `capacity` rows holding `episodes`, exported.
    fn saved(
        layout: ObsLayout,
        episodes: &[Episode],
        capacity: usize,
    ) -> (Vec<(String, Tensor)>, BufferMeta) {
        let mut ring = ReplayBuffer::new(capacity, layout, 1, Device::Cpu).unwrap();
        for episode in episodes {
            ring.add(episode).unwrap();
        }
        ring.export()
    }

    /// 10-row episodes of `bases` in a ring of 25 rows (the oldest loses 5).
    fn saved_vectors(bases: &[f32]) -> (Vec<(String, Tensor)>, BufferMeta) {
        let episodes: Vec<Episode> = bases.iter().map(|&base| episode(base, 9)).collect();
        saved(ObsLayout::Vector { dim: 2 }, &episodes, 25)
    }

    /// Rank `rank` of `world`, resumed from the buffers `ranks` saved.
    fn dealt(
        ranks: &[(Vec<(String, Tensor)>, BufferMeta)],
        (rank, world): (usize, usize),
        layout: ObsLayout,
        capacity: usize,
    ) -> ReplayBuffer {
        let dealing = Dealing {
            from: ranks.len(),
            to: world,
        };
        let sources = dealing.sources(rank);
        let parts = sources
            .iter()
            .map(|&i| SavedPart::dealt(ranks[i].1.clone(), dealing, i, rank))
            .collect();
        let mut buffer = ReplayBuffer::new(capacity, layout, 1, Device::Cpu).unwrap();
        let copy = |t: &[(String, Tensor)]| {
            t.iter()
                .map(|(n, t)| (n.clone(), t.copy()))
                .collect::<Vec<_>>()
        };
        buffer
            .gather(parts, |p| Ok(copy(&ranks[sources[p]].0)))
            .unwrap();
        buffer
    }

    /// The first stored value of each episode, oldest first (its base unless it lost rows).
    fn firsts(buffer: &ReplayBuffer) -> Vec<f32> {
        let obs = values(&buffer.obs);
        buffer.episodes.iter().map(|s| obs[2 * s.start]).collect()
    }

    #[test]
    fn saved_buffers_are_dealt_out_to_another_world_size_each_episode_to_one_rank() {
        let ranks = [
            saved_vectors(&[0.0, 100.0, 200.0]),
            saved_vectors(&[1000.0, 1100.0, 1200.0]),
        ];
        let vectors = ObsLayout::Vector { dim: 2 };
        let dealt = |rank, world, capacity| dealt(&ranks, (rank, world), vectors, capacity);
        // To one rank: both (wrapped) rings, oldest first, the ranks' episodes of one age side
        // by side.
        let one = dealt(0, 1, 100);
        assert_eq!(firsts(&one), [5.0, 1005.0, 100.0, 1100.0, 200.0, 1200.0]);
        assert_eq!((one.len(), one.cursor), (50, 50));
        let batch = one.sample(256, 3, &mut Pcg64::seed_from_u64(1)).unwrap();
        let obs = values(&batch.obs);
        for b in 0..256 {
            let x = |t: usize| obs[(t * 256 + b) * 2];
            assert!(
                (0..3).all(|t| x(t + 1) == x(t) + 1.0),
                "consecutive rows of one episode"
            );
        }
        // Into fewer rows: the newest that fit, the oldest kept episode trimmed.
        let small = dealt(0, 1, 35);
        assert_eq!(firsts(&small), [105.0, 1100.0, 200.0, 1200.0]);
        assert_eq!(small.len(), 35);
        // To more ranks: every episode to exactly one, in near-equal shares.
        for world in [3, 4] {
            let mut all: Vec<f32> = (0..world)
                .flat_map(|rank| firsts(&dealt(rank, world, 100)))
                .collect();
            all.sort_by(f32::total_cmp);
            assert_eq!(
                all,
                [5.0, 100.0, 200.0, 1005.0, 1100.0, 1200.0],
                "{world} ranks"
            );
        }
        assert_eq!(firsts(&dealt(0, 4, 100)), [5.0, 200.0]);
        assert_eq!(firsts(&dealt(3, 4, 100)), [1100.0]);
        assert_eq!(
            Dealing { from: 4, to: 2 }.sources(1),
            [1, 3],
            "shrinking by a factor: rank r takes the saved ranks r mod 2 whole"
        );
        assert_eq!(Dealing { from: 2, to: 3 }.sources(2), [0, 1]);
    }

    #[test]
    fn dealt_pixel_episodes_keep_their_frame_stacks() {
        let ranks = [
            saved(PIXELS, &[pixel_episode(0, 19), pixel_episode(50, 9)], 30),
            saved(PIXELS, &[pixel_episode(100, 14), pixel_episode(150, 9)], 30),
        ];
        // 45 of the 55 rows fit: episode 0 keeps its last 10, two of them frame context.
        let one = dealt(&ranks, (0, 1), PIXELS, 45);
        assert_eq!((one.len(), one.num_episodes()), (45, 4));
        let starts = check_stacks(&one, 3);
        assert!(starts.contains(&(0, 12)) && !starts.iter().any(|&(b, t)| b == 0 && t < 12));
        for rank in 0..3 {
            check_stacks(&dealt(&ranks, (rank, 3), PIXELS, 30), rank as u64);
        }
    }

    #[test]
    fn a_damaged_second_saved_buffer_leaves_the_buffer_empty() {
        let ranks = [saved_vectors(&[0.0, 100.0]), saved_vectors(&[1000.0])];
        let dealing = Dealing { from: 2, to: 1 };
        let parts: Vec<SavedPart> = (0..2)
            .map(|i| SavedPart::dealt(ranks[i].1.clone(), dealing, i, 0))
            .collect();
        let mut buffer =
            ReplayBuffer::new(100, ObsLayout::Vector { dim: 2 }, 1, Device::Cpu).unwrap();
        buffer.add(&episode(500.0, 9)).unwrap();
        let err = buffer
            .gather(parts, |p| {
                let kept = ranks[p].0.iter().take(4 - 2 * p);
                Ok(kept.map(|(n, t)| (n.clone(), t.copy())).collect::<Vec<_>>())
            })
            .unwrap_err()
            .to_string();
        assert!(err.contains("lacks 'reward'"), "{err}");
        assert_eq!((buffer.len(), buffer.num_episodes()), (0, 0));
        assert!(!buffer.can_sample(2));
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
        // The ring had not wrapped: its 10 rows were saved, not its 50; they restore into a
        // smaller ring too.
        assert_eq!(tensors[0].1.size(), [10, 2]);
        let mut smaller =
            ReplayBuffer::new(8, ObsLayout::Vector { dim: 2 }, 1, Device::Cpu).unwrap();
        smaller.restore(&tensors, meta.clone()).unwrap();
        assert_eq!(firsts(&smaller), [2.0], "the newest 8 rows");
        // A buffer saved before the saved rows were recorded: its whole ring.
        let mut json = serde_json::to_value(&meta).unwrap();
        json.as_object_mut().unwrap().remove("saved_rows");
        let old: BufferMeta = serde_json::from_value(json).unwrap();
        let whole: Vec<(String, Tensor)> = buffer
            .storage()
            .into_iter()
            .map(|(n, t)| (n.to_owned(), t.shallow_clone()))
            .collect();
        let mut same = ReplayBuffer::new(50, ObsLayout::Vector { dim: 2 }, 1, Device::Cpu).unwrap();
        same.restore(&whole, old).unwrap();
        assert_eq!((same.len(), firsts(&same)), (10, vec![0.0]));
        let damaged = BufferMeta {
            saved_rows: Some(12),
            ..meta.clone()
        };
        let err = target.restore(&tensors, damaged).unwrap_err().to_string();
        assert!(err.contains("'obs' has shape [10, 2]"), "{err}");
        let too_few = BufferMeta {
            saved_rows: Some(5),
            ..meta.clone()
        };
        let err = target.restore(&tensors, too_few).unwrap_err().to_string();
        assert!(err.contains("5 rows saved"), "{err}");
        let damaged = BufferMeta {
            capacity: 0,
            ..meta.clone()
        };
        assert!(target.restore(&tensors, damaged).is_err());
        // Bookkeeping no ring could have: refused whole, at the same size and at another.
        let mut same = ReplayBuffer::new(50, ObsLayout::Vector { dim: 2 }, 1, Device::Cpu).unwrap();
        let first = meta.episodes[0];
        for damaged in [
            BufferMeta {
                cursor: 50,
                ..meta.clone()
            },
            BufferMeta {
                filled: 11,
                ..meta.clone()
            },
            BufferMeta {
                episodes: vec![Span {
                    context: 11,
                    ..first
                }],
                ..meta.clone()
            },
            BufferMeta {
                episodes: vec![Span { start: 3, ..first }],
                ..meta.clone()
            },
            // Rows past the ring's end, with a cursor that agrees.
            BufferMeta {
                cursor: (60 + first.rows) % 50,
                episodes: vec![Span { start: 60, ..first }],
                ..meta.clone()
            },
        ] {
            for buffer in [&mut same, &mut target] {
                let err = buffer.restore(&tensors, damaged.clone()).unwrap_err();
                assert!(
                    err.to_string().contains("bookkeeping is inconsistent"),
                    "{err}"
                );
            }
        }
        // A missing part leaves the buffer as it was, its other parts not copied in.
        target.add(&episode(500.0, 9)).unwrap();
        let before = values(&target.obs);
        let err = target.restore(&tensors[..3], meta).unwrap_err().to_string();
        assert!(err.contains("lacks 'terminated'"), "{err}");
        assert_eq!(values(&target.obs), before);
        assert_eq!(target.len(), 10);
    }
}
