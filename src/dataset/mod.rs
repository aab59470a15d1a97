//! Offline datasets in the official format: the `chunk_{i}.pt` files of the official download
//! scripts, each a TensorDict of shape [episodes, T] with `obs`, `action`, `reward` and `task`
//! (row 0 of an episode holds o_0 and NaN fillers; row t holds o_t, a_{t−1}, r_{t−1}).
//!
//! A file is indexed once, without running pickled code (`official_format.py`): where each
//! tensor's bytes lie in the file. Batches are then read straight from disk, a few rows per
//! sample, so that a dataset larger than memory trains; only each episode's task id is held.
//! Every rank samples from every file, uniformly over all episodes from its own stream: a run's
//! batches are the official single-process sampling split across ranks, whatever the world
//! size and the number of files.
use std::fs::File;
use std::path::{Path, PathBuf};

use rand::Rng;
use rand_pcg::Pcg64;
use tch::Tensor;

use crate::buffer::Batch;
use crate::error::{Error, Result};

mod episode_checks;
pub mod integrity;
mod layout;
mod prefetch;
mod writer;

pub use prefetch::Prefetcher;
pub use writer::ChunkWriter;

use episode_checks::{episode_tasks, refuse_early_terminations, refuse_tasks_numbered_otherwise};
use layout::{index, Field, Fields};

const OFFICIAL_FORMAT: &str = include_str!("official_format.py");
const MODULE: &str = "tdmpc2_official_format";

/// What the run's model needs of every file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    pub obs_dim: usize,
    pub action_dim: usize,
    /// The run's tasks, in task-id order.
    pub tasks: Vec<ExpectedTask>,
    /// Whether batches carry task ids (a multitask model).
    pub multitask: bool,
    /// Rows of one sampled slice: horizon + 1.
    pub slice: usize,
}

/// One task of the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedTask {
    pub name: String,
    /// Its own observation size: the rest of its rows is zero, the padding to the widest task's.
    pub obs_dim: usize,
}

/// The dataset files of `dir` (`*.pt`), in the official order (sorted by name).
pub fn files(dir: &Path) -> Result<Vec<PathBuf>> {
    let files = dataset_files(dir)
        .map_err(|e| Error::Config(format!("data_dir={}: cannot be read: {e}", dir.display())))?;
    if files.is_empty() {
        return Err(Error::Config(format!(
            "data_dir={}: holds no dataset file (*.pt, as the official chunk_<i>.pt)",
            dir.display()
        )));
    }
    Ok(files)
}

/// The files of a dataset in `dir`: every `.pt` file there, in name order, but hidden ones (a
/// Mac's `._chunk_0.pt` beside each copied file), as the official `glob('*.pt')` reads them. A
/// `.pt` entry that cannot be followed (a link to nothing) is an error naming it: left out,
/// the run would train on part of the data without a word.
fn dataset_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let hidden = entry.file_name().as_encoded_bytes().starts_with(b".");
        if hidden || path.extension().is_none_or(|x| x != "pt") {
            continue;
        }
        match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() => files.push(path),
            Ok(_) => {}
            Err(e) => {
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("{} cannot be followed ({e})", path.display()),
                ))
            }
        }
    }
    files.sort();
    Ok(files)
}

/// One dataset file, indexed.
struct Chunk {
    path: PathBuf,
    file: File,
    length: usize,
    obs: Field,
    action: Field,
    reward: Field,
    /// Each episode's task id.
    tasks: Vec<u32>,
}

impl Chunk {
    fn open(path: &Path, expected: &Expected) -> Result<Self> {
        let fail =
            |message: String| Error::Config(format!("dataset file {}: {message}", path.display()));
        let index = index(path).map_err(&fail)?;
        let [episodes, length] = index.batch_size[..] else {
            return Err(fail(format!(
                "its TensorDict has batch size {:?}, expected [episodes, T]",
                index.batch_size
            )));
        };
        if episodes == 0 {
            return Err(fail(format!(
                "holds no episode (its TensorDict has batch size [0, {length}]): leave it out"
            )));
        }
        let fields = Fields {
            index: &index,
            episodes,
            length,
        };
        let (obs, action, reward) = (
            fields.field("obs", &["float32"]).map_err(&fail)?,
            fields.field("action", &["float32"]).map_err(&fail)?,
            fields.scalar("reward", &["float32"]).map_err(&fail)?,
        );
        if obs.width != expected.obs_dim || action.width != expected.action_dim {
            return Err(fail(format!(
                "observations of {} numbers and actions of {}, but the run's model takes {} and \
                 {} (the task set's largest, as the official datasets are padded)",
                obs.width, action.width, expected.obs_dim, expected.action_dim
            )));
        }
        if length < expected.slice {
            return Err(fail(format!(
                "episodes of {length} rows, shorter than a sampled slice of horizon + 1 = {}",
                expected.slice
            )));
        }
        let file = File::open(path).map_err(|e| fail(e.to_string()))?;
        refuse_early_terminations(&file, &fields).map_err(&fail)?;
        let tasks = episode_tasks(&file, &fields, expected.tasks.len()).map_err(&fail)?;
        refuse_tasks_numbered_otherwise(&file, &obs, length, &tasks, &expected.tasks)
            .map_err(&fail)?;
        Ok(Self {
            path: path.to_owned(),
            file,
            length,
            obs,
            action,
            reward,
            tasks,
        })
    }
}

impl Chunk {
    /// Refuses a value that is not finite among `bytes` (rows of `name` of episode `episode`
    /// from `row`): bad data, named when a batch first draws it, rather than a loss that
    /// diverges thousands of updates later or a reward silently learnt as another number.
    /// Row 0's action and reward, which the official format leaves NaN, are never drawn.
    fn refuse_non_finite(
        &self,
        name: &str,
        bytes: &[u8],
        width: usize,
        episode: usize,
        row: usize,
    ) -> Result<()> {
        let values = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        match values.enumerate().find(|(_, v)| !v.is_finite()) {
            None => Ok(()),
            Some((k, value)) => Err(Error::Config(format!(
                "dataset file {}: `{name}` of episode {episode} at row {} is {value}: training \
                 takes finite numbers only; repair the episode, or leave its file out",
                self.path.display(),
                row + k / width.max(1)
            ))),
        }
    }
}

/// A dataset, sampled as the replay buffer is: an episode uniformly among all the files', then
/// a slice of horizon + 1 rows uniformly within it.
pub struct Dataset {
    chunks: Vec<Chunk>,
    /// Index of each chunk's first episode among all of the dataset's.
    first_episode: Vec<usize>,
    episodes: usize,
    bytes: u64,
    slice: usize,
    multitask: bool,
}

impl Dataset {
    pub fn open(files: &[PathBuf], expected: &Expected) -> Result<Self> {
        let mut chunks = Vec::with_capacity(files.len());
        let mut first_episode = Vec::with_capacity(files.len());
        let (mut episodes, mut bytes) = (0, 0);
        for path in files {
            let chunk = Chunk::open(path, expected)?;
            first_episode.push(episodes);
            episodes += chunk.tasks.len();
            bytes += std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            chunks.push(chunk);
        }
        if episodes == 0 {
            return Err(Error::Config("the dataset files hold no episode".into()));
        }
        Ok(Self {
            chunks,
            first_episode,
            episodes,
            bytes,
            slice: expected.slice,
            multitask: expected.multitask,
        })
    }

    pub fn episodes(&self) -> usize {
        self.episodes
    }

    /// Size of the files on disk.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// How many episodes of each task the dataset holds.
    pub fn episodes_per_task(&self, num_tasks: usize) -> Vec<usize> {
        let mut counts = vec![0; num_tasks];
        for task in self.chunks.iter().flat_map(|c| &c.tasks) {
            counts[*task as usize] += 1;
        }
        counts
    }

    /// A time-major batch of `batch_size` slices (on the CPU).
    pub fn sample(&self, batch_size: usize, rng: &mut Pcg64) -> Result<Batch> {
        let (rows, b) = (self.slice, batch_size);
        let horizon = rows - 1;
        let first = &self.chunks[0];
        let (d, a) = (first.obs.width, first.action.width);
        let mut obs = vec![0f32; rows * b * d];
        let mut action = vec![0f32; horizon * b * a];
        let mut reward = vec![0f32; horizon * b];
        let mut task = Vec::with_capacity(b);
        for i in 0..b {
            let episode = rng.random_range(0..self.episodes);
            let c = self.first_episode.partition_point(|&s| s <= episode) - 1;
            let (chunk, e) = (&self.chunks[c], episode - self.first_episode[c]);
            let start = rng.random_range(0..=chunk.length - rows);
            let read = |field: &Field, row, n| {
                field.read(&chunk.file, e, row, n).map_err(|err| {
                    let path = chunk.path.display();
                    match err.kind() {
                        // Indexed whole at the start: it changed on disk since.
                        std::io::ErrorKind::UnexpectedEof => Error::io(
                            format!(
                                "read dataset file {path}: it is shorter than when the run \
                                 opened it (changed on disk during training)"
                            ),
                            err,
                        ),
                        _ => Error::io(format!("read dataset file {path}"), err),
                    }
                })
            };
            let read = |name, field: &Field, row, n| {
                let bytes = read(field, row, n)?;
                chunk.refuse_non_finite(name, &bytes, field.width, e, row)?;
                Ok::<_, Error>(bytes)
            };
            scatter(&read("obs", &chunk.obs, start, rows)?, &mut obs, i, b, d);
            // Actions and rewards of rows 1..=H of the slice.
            scatter(
                &read("action", &chunk.action, start + 1, horizon)?,
                &mut action,
                i,
                b,
                a,
            );
            scatter(
                &read("reward", &chunk.reward, start + 1, horizon)?,
                &mut reward,
                i,
                b,
                1,
            );
            task.push(i64::from(chunk.tasks[e]));
        }
        let (h, b64) = (horizon as i64, b as i64);
        Ok(Batch {
            obs: Tensor::from_slice(&obs).view([rows as i64, b64, d as i64]),
            action: Tensor::from_slice(&action).view([h, b64, a as i64]),
            reward: Tensor::from_slice(&reward).view([h, b64, 1]),
            terminated: Tensor::zeros([h, b64, 1], (tch::Kind::Float, tch::Device::Cpu)),
            task: self.multitask.then(|| Tensor::from_slice(&task)),
        })
    }
}

/// Writes sample `i`'s rows (little-endian float32, row after row) into the time-major `out`
/// (rows × batch × width).
fn scatter(bytes: &[u8], out: &mut [f32], i: usize, batch: usize, width: usize) {
    for (t, row) in bytes.chunks_exact(width * 4).enumerate() {
        let at = (t * batch + i) * width;
        for (value, b) in out[at..at + width].iter_mut().zip(row.chunks_exact(4)) {
            *value = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::{Episode, StoredObs};
    use rand::SeedableRng;

    /// One of these tests at a time: torch (saving, in the embedded interpreter) from several
    /// short-lived test threads at once can deadlock on the interpreter lock; the trainer and
    /// `collect` use it from one thread.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
        ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An episode of `steps` steps whose every number says where it is: obs = 1000·episode +
    /// 10·row + dim, action = −(1000·episode + 10·step + dim), reward = 1000·episode + step.
    fn episode(id: usize, steps: usize, task: u32, obs_dim: usize, action_dim: usize) -> Episode {
        let e = 1000.0 * id as f32;
        Episode {
            obs: (0..=steps)
                .flat_map(|r| (0..obs_dim).map(move |d| e + 10.0 * r as f32 + d as f32))
                .collect(),
            action: (0..steps)
                .flat_map(|t| (0..action_dim).map(move |d| -(e + 10.0 * t as f32 + d as f32)))
                .collect(),
            reward: (0..steps).map(|t| e + t as f32).collect(),
            terminated: vec![0.0; steps],
            task: Some(task),
        }
    }

    fn expected(num_tasks: usize) -> Expected {
        let task = |k| ExpectedTask {
            name: format!("task-{k}"),
            obs_dim: 3,
        };
        Expected {
            obs_dim: 3,
            action_dim: 2,
            tasks: (0..num_tasks).map(task).collect(),
            multitask: true,
            slice: 4,
        }
    }

    /// Two tasks (the second acting with one of the two action numbers), two lengths.
    fn write(dir: &Path) -> Vec<PathBuf> {
        let mut writer = ChunkWriter::new(dir, 2, 3, vec![2, 1]).unwrap();
        for id in 0..5 {
            let steps = if id % 2 == 0 { 8 } else { 5 };
            writer
                .add(episode(id, steps, (id % 2) as u32, 3, 2))
                .unwrap();
        }
        writer.finish().unwrap()
    }

    /// A hidden `.pt` file (a Mac's `._chunk_0.pt`) is not a dataset file, as the official
    /// `glob('*.pt')` skips it.
    #[test]
    fn hidden_files_are_not_dataset_files() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["chunk_1.pt", "._chunk_1.pt", "chunk_0.pt", "README.md"] {
            std::fs::write(dir.path().join(name), b"").unwrap();
        }
        let files = dataset_files(dir.path()).unwrap();
        let names: Vec<_> = files.iter().filter_map(|f| f.file_name()).collect();
        assert_eq!(names, ["chunk_0.pt", "chunk_1.pt"]);
    }

    /// A file cut short after it was indexed (changed on disk during training) is named as
    /// such, not as a bare "failed to fill whole buffer".
    #[test]
    fn a_file_cut_short_during_training_is_named_so() {
        let _turn = one_at_a_time();
        let dir = tempfile::tempdir().unwrap();
        let written = write(dir.path());
        let data = Dataset::open(&written, &expected(2)).unwrap();
        for file in &written {
            std::fs::OpenOptions::new()
                .write(true)
                .open(file)
                .and_then(|f| f.set_len(600))
                .unwrap();
        }
        let e = data.sample(64, &mut Pcg64::seed_from_u64(1)).unwrap_err();
        assert!(
            e.to_string()
                .contains("is shorter than when the run opened it (changed on disk"),
            "{e}"
        );
    }

    #[test]
    fn batches_read_from_written_files_hold_the_episodes_rows() {
        let _turn = one_at_a_time();
        let dir = tempfile::tempdir().unwrap();
        let written = write(dir.path());
        assert_eq!(written.len(), 3, "2 + 1 episodes of 8 steps, 2 of 5");
        assert_eq!(files(dir.path()).unwrap(), {
            let mut sorted = written.clone();
            sorted.sort();
            sorted
        });
        let data = Dataset::open(&written, &expected(2)).unwrap();
        assert_eq!(data.episodes(), 5);
        assert_eq!(data.episodes_per_task(2), vec![3, 2]);
        let batch = data.sample(64, &mut Pcg64::seed_from_u64(1)).unwrap();
        assert_eq!(batch.obs.size(), [4, 64, 3]);
        assert_eq!(batch.action.size(), [3, 64, 2]);
        let obs = Vec::<f32>::try_from(batch.obs.flatten(0, -1)).unwrap();
        let action = Vec::<f32>::try_from(batch.action.flatten(0, -1)).unwrap();
        let reward = Vec::<f32>::try_from(batch.reward.flatten(0, -1)).unwrap();
        let task = Vec::<i64>::try_from(batch.task.unwrap()).unwrap();
        for b in 0..64 {
            let first = obs[b * 3];
            let (id, row) = ((first / 1000.0) as usize, (first % 1000.0 / 10.0) as usize);
            assert_eq!(task[b], (id % 2) as i64);
            for t in 0..4 {
                let at = (t * 64 + b) * 3;
                let want: Vec<f32> = (0..3).map(|d| first + 10.0 * t as f32 + d as f32).collect();
                assert_eq!(obs[at..at + 3], want[..], "sample {b} row {t}");
            }
            for t in 0..3 {
                // Row t+1 of the slice holds the action and reward of step row + t.
                let step = (row + t) as f32;
                let e = 1000.0 * id as f32;
                let a = &action[(t * 64 + b) * 2..(t * 64 + b) * 2 + 2];
                let second = if id % 2 == 1 {
                    0.0
                } else {
                    -(e + 10.0 * step + 1.0)
                };
                assert_eq!(
                    a,
                    [-(e + 10.0 * step), second],
                    "task 1 acts with one number"
                );
                assert_eq!(reward[t * 64 + b], e + step);
            }
        }
    }

    /// Task 1's observations have two numbers, the third zero: a task list in the other
    /// order puts task 0's episodes under the narrower task, and is refused naming it.
    #[test]
    fn a_task_list_in_another_order_than_the_datasets_is_refused() {
        let _turn = one_at_a_time();
        let dir = tempfile::tempdir().unwrap();
        let mut writer = ChunkWriter::new(dir.path(), 4, 3, vec![2, 2]).unwrap();
        for id in 0..4 {
            let mut e = episode(id, 5, (id % 2) as u32, 3, 2);
            if id % 2 == 1 {
                let StoredObs::States(obs) = &mut e.obs else {
                    unreachable!("state episodes")
                };
                obs.iter_mut().skip(2).step_by(3).for_each(|v| *v = 0.0);
            }
            writer.add(e).unwrap();
        }
        let files = writer.finish().unwrap();
        let tasks = |names: [&str; 2], dims: [usize; 2]| Expected {
            tasks: names
                .iter()
                .zip(dims)
                .map(|(name, obs_dim)| ExpectedTask {
                    name: name.to_string(),
                    obs_dim,
                })
                .collect(),
            ..expected(2)
        };
        assert!(Dataset::open(&files, &tasks(["wide", "narrow"], [3, 2])).is_ok());
        let e = Dataset::open(&files, &tasks(["narrow", "wide"], [2, 3]))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("episode 0 has task id 0, narrow, whose observations have 2 numbers")
                && e.contains("row 0 has 2 at number 3")
                && e.contains("another order than the run's task list"),
            "{e}"
        );
    }

    /// A number that is not finite where a batch draws it names the file, the entry, the
    /// episode and the row.
    #[test]
    fn a_value_that_is_not_finite_is_named_when_drawn() {
        let _turn = one_at_a_time();
        for (name, value, row) in [("reward", f32::NAN, 3), ("obs", f32::INFINITY, 2)] {
            let dir = tempfile::tempdir().unwrap();
            let mut writer = ChunkWriter::new(dir.path(), 1, 3, vec![2]).unwrap();
            let mut bad = episode(0, 5, 0, 3, 2);
            match name {
                // Step 2's reward: row 3 of the file's episode (row 0 has none).
                "reward" => bad.reward[2] = value,
                _ => match &mut bad.obs {
                    StoredObs::States(obs) => obs[row * 3 + 1] = value,
                    StoredObs::Frames(_) => unreachable!("state episodes"),
                },
            }
            writer.add(bad).unwrap();
            let files = writer.finish().unwrap();
            let data = Dataset::open(&files, &expected(1)).unwrap();
            let mut rng = Pcg64::seed_from_u64(1);
            let e = (0..50)
                .find_map(|_| data.sample(8, &mut rng).err())
                .expect("a batch drew the row")
                .to_string();
            assert!(
                e.contains(&format!("`{name}` of episode 0 at row {row} is {value}"))
                    && e.contains(&files[0].display().to_string()),
                "{e}"
            );
        }
    }

    /// Every episode is drawn as often, whichever file holds it and however many the file
    /// holds: files of 1, 3 and 6 episodes, 60,000 draws, 6,000 expected of each episode.
    #[test]
    fn episodes_are_drawn_uniformly_across_files_of_unequal_sizes() {
        let _turn = one_at_a_time();
        let dir = tempfile::tempdir().unwrap();
        let mut files = Vec::new();
        let mut id = 0;
        for (i, count) in [1, 3, 6].into_iter().enumerate() {
            let mut writer =
                ChunkWriter::new(&dir.path().join(i.to_string()), 2, 3, vec![2, 1]).unwrap();
            for _ in 0..count {
                writer.add(episode(id, 5, 0, 3, 2)).unwrap();
                id += 1;
            }
            files.extend(writer.finish().unwrap());
        }
        let data = Dataset::open(&files, &expected(2)).unwrap();
        assert_eq!(data.episodes(), 10);
        let mut counts = [0usize; 10];
        let mut rng = Pcg64::seed_from_u64(3);
        for _ in 0..60 {
            let batch = data.sample(1000, &mut rng).unwrap();
            let first = Vec::<f32>::try_from(batch.obs.get(0).select(1, 0)).unwrap();
            first
                .iter()
                .for_each(|v| counts[(v / 1000.0) as usize] += 1);
        }
        // Binomial(60,000, 1/10): a standard deviation of 73; five of them either way.
        for (episode, &n) in counts.iter().enumerate() {
            assert!(
                (5_635..=6_365).contains(&n),
                "episode {episode}: {n} of 60,000"
            );
        }
    }

    /// Prefetched batches are those of their indices' streams, in order from the first asked
    /// for, whatever the thread's timing.
    #[test]
    fn prefetched_batches_are_those_of_their_streams_in_order() {
        let _turn = one_at_a_time();
        let dir = tempfile::tempdir().unwrap();
        let data = std::sync::Arc::new(Dataset::open(&write(dir.path()), &expected(2)).unwrap());
        let stream = |k: u64| Pcg64::seed_from_u64(5 + 1000 * k);
        let prefetcher = Prefetcher::start(data.clone(), 8, 3, stream);
        for k in 3..8 {
            let (a, b) = (
                prefetcher.next().unwrap(),
                data.sample(8, &mut stream(k)).unwrap(),
            );
            assert!(a.obs.equal(&b.obs) && a.action.equal(&b.action));
            assert!(a.task.unwrap().equal(&b.task.unwrap()));
        }
        drop(prefetcher); // ends and joins its thread, not waiting on a full channel
    }

    #[test]
    fn files_that_do_not_fit_the_run_are_named_with_what_is_wrong() {
        let _turn = one_at_a_time();
        let dir = tempfile::tempdir().unwrap();
        let written = write(dir.path());
        let wider = Expected {
            obs_dim: 5,
            ..expected(2)
        };
        let e = Dataset::open(&written, &wider).err().unwrap().to_string();
        assert!(
            e.contains("chunk_0.pt") && e.contains("observations of 3") && e.contains("takes 5"),
            "{e}"
        );
        let e = Dataset::open(&written, &expected(1))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("task id 1") && e.contains("1 tasks"), "{e}");
        let long = Expected {
            slice: 7,
            ..expected(2)
        };
        let e = Dataset::open(&written, &long).err().unwrap().to_string();
        assert!(e.contains("episodes of 6 rows"), "{e}");
        let empty = tempfile::tempdir().unwrap();
        let e = files(empty.path()).err().unwrap().to_string();
        assert!(
            e.contains("data_dir=") && e.contains("no dataset file"),
            "{e}"
        );
    }

    /// Runs a script that writes dataset files, alone in the interpreter (it may swap modules).
    fn run_python(script: String) {
        embedded_python::attach_exclusive(|py| {
            let code = std::ffi::CString::new(script).unwrap();
            py.run(&code, None, None)
                .map_err(embedded_python::Error::from)
        })
        .unwrap();
    }

    #[test]
    fn a_dataset_file_that_is_a_link_to_nothing_is_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("chunk_0.pt"), "x").unwrap();
        std::fs::create_dir(dir.path().join("folder.pt")).unwrap();
        assert_eq!(files(dir.path()).unwrap(), [dir.path().join("chunk_0.pt")]);
        let link = dir.path().join("chunk_1.pt");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &link).unwrap();
        let e = files(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains(&format!("{} cannot be followed", link.display())),
            "{e}"
        );
        // Nor is a new dataset written through it.
        std::fs::remove_file(dir.path().join("chunk_0.pt")).unwrap();
        let e = ChunkWriter::new(dir.path(), 1, 3, vec![2]).err().unwrap();
        assert!(matches!(e, Error::Config(_)), "{e}");
        assert!(e.to_string().contains("written through it"), "{e}");
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
    }

    /// A checkpoint's weights (a plain mapping, one tensor under two names as our export
    /// writes) and a file of no episodes are named for what they are.
    #[test]
    fn a_checkpoint_or_a_file_of_no_episodes_is_named_for_what_it_is() {
        let _turn = one_at_a_time();
        let dir = tempfile::tempdir().unwrap();
        let (weights, none) = (dir.path().join("chunk_0.pt"), dir.path().join("chunk_1.pt"));
        let script = format!(
            "import torch\n\
             from tensordict import TensorDict\n\
             w = torch.zeros(2)\n\
             torch.save({{'model': {{'_pi.0.weight': w, '_Qs.0.weight': w}}}}, '{}')\n\
             torch.save(TensorDict({{'obs': torch.zeros(0, 6, 3), 'action': torch.zeros(0, 6, 2), \
             'reward': torch.zeros(0, 6), 'task': torch.zeros(0, 6, dtype=torch.int64)}}, \
             batch_size=[0, 6]), '{}')\n",
            weights.display(),
            none.display()
        );
        run_python(script);
        let e = Dataset::open(&[weights], &expected(1))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("holds a plain mapping (model), not a TensorDict of episodes"),
            "{e}"
        );
        let e = Dataset::open(&[none], &expected(1))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("holds no episode"), "{e}");
    }

    /// A `terminated` entry is read: a file whose episodes end early is refused, naming the
    /// episode; one of zeros (and the first row's NaN filler) opens.
    #[test]
    fn a_file_with_terminations_is_refused() {
        let _turn = one_at_a_time();
        let dir = tempfile::tempdir().unwrap();
        let (ends, runs) = (dir.path().join("chunk_0.pt"), dir.path().join("chunk_1.pt"));
        let script = format!(
            "import torch\n\
             from tensordict import TensorDict\n\
             def td(terminated):\n    return TensorDict({{'obs': torch.zeros(2, 6, 3), \
             'action': torch.zeros(2, 6, 2), 'reward': torch.zeros(2, 6), \
             'task': torch.ones(2, 6, dtype=torch.int64), 'terminated': terminated}}, \
             batch_size=[2, 6])\n\
             running = torch.zeros(2, 6); running[:, 0] = float('nan')\n\
             ending = running.clone(); ending[1, 3] = 1.0\n\
             torch.save(td(ending), '{}'); torch.save(td(running), '{}')\n",
            ends.display(),
            runs.display()
        );
        run_python(script);
        let e = Dataset::open(&[ends], &expected(2))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("chunk_0.pt") && e.contains("episode 1 terminates early"),
            "{e}"
        );
        let data = Dataset::open(&[runs], &expected(2)).unwrap();
        assert_eq!(data.episodes(), 2);
    }

    /// A reward of several numbers a row (a foreign file) is refused, naming it, where the
    /// prefetching thread panicked reading past its rows.
    #[test]
    fn a_reward_of_several_numbers_a_row_is_refused() {
        let _turn = one_at_a_time();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("chunk_0.pt");
        run_python(format!(
            "import torch\n\
             from tensordict import TensorDict\n\
             torch.save(TensorDict({{'obs': torch.zeros(2, 6, 3), \
             'action': torch.zeros(2, 6, 2), 'reward': torch.zeros(2, 6, 2), \
             'task': torch.ones(2, 6, dtype=torch.int64)}}, batch_size=[2, 6]), '{}')\n",
            file.display()
        ));
        let e = Dataset::open(&[file], &expected(2))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("chunk_0.pt") && e.contains("`reward` holds 2 numbers a row"),
            "{e}"
        );
    }

    /// TensorDicts pickled as their `__dict__` (versions before tensordict's reducer, under
    /// `tensordict.tensordict`) are read too: batch size and entries.
    #[test]
    fn an_older_tensordict_pickle_is_read() {
        let _turn = one_at_a_time();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("chunk_0.pt");
        // A stand-in class in place of the module for the save, the real one put back after;
        // one thread at a time, as every import.
        let script = format!(
            "import sys, types, torch, tensordict\n\
             class TensorDict: pass\n\
             TensorDict.__module__ = 'tensordict.tensordict'\n\
             stand_in = types.ModuleType('tensordict.tensordict'); stand_in.TensorDict = TensorDict\n\
             real = sys.modules.get('tensordict.tensordict')\n\
             sys.modules['tensordict.tensordict'] = stand_in\n\
             td = TensorDict()\n\
             td.__dict__.update(_tensordict={{'obs': torch.zeros(2, 6, 3), \
             'action': torch.zeros(2, 6, 2), 'reward': torch.zeros(2, 6), \
             'task': torch.ones(2, 6, dtype=torch.int64)}}, _batch_size=torch.Size([2, 6]), \
             _device=torch.device('cpu'), _is_shared=False)\n\
             try:\n    torch.save(td, '{}')\n\
             finally:\n    sys.modules.pop('tensordict.tensordict')\n    \
             real is not None and sys.modules.__setitem__('tensordict.tensordict', real)\n",
            file.display()
        );
        run_python(script);
        let data = Dataset::open(&[file], &expected(2)).unwrap();
        assert_eq!(
            (data.episodes(), data.episodes_per_task(2)),
            (2, vec![0, 2])
        );
    }

    /// tensordict from mid-2023 to mid-2024, which wrote the official datasets, pickled a
    /// TensorDict's entries in its own dict subclass (`tensordict.utils._StringOnlyDict`) and a
    /// lock set (protocol 2 names it `__builtin__.set`); with `__slots__` and no `__getstate__`
    /// the state is a pair. Both forms are read.
    #[test]
    fn a_2023_tensordict_pickle_is_read() {
        let _turn = one_at_a_time();
        let dir = tempfile::tempdir().unwrap();
        let (with_state, with_slots) =
            (dir.path().join("chunk_0.pt"), dir.path().join("chunk_1.pt"));
        let script = format!(
            "import sys, types, torch, tensordict\n\
             class _StringOnlyDict(dict): pass\n\
             _StringOnlyDict.__module__ = 'tensordict.utils'\n\
             SLOTS = ('_tensordict', '_batch_size', '_device', '_is_shared', '_lock_id')\n\
             class TensorDict:\n    __slots__ = SLOTS\n\
             class StatedTensorDict:\n    __slots__ = SLOTS\n    \
             def __getstate__(self):\n        return {{s: getattr(self, s) for s in SLOTS}}\n\
             for cls in (TensorDict, StatedTensorDict):\n    \
             cls.__module__ = 'tensordict.tensordict'\n\
             def filled(cls):\n    td = cls.__new__(cls)\n    \
             td._tensordict = _StringOnlyDict(obs=torch.zeros(2, 6, 3), action=torch.zeros(2, 6, 2), \
             reward=torch.zeros(2, 6), task=torch.ones(2, 6, dtype=torch.int32))\n    \
             td._batch_size = torch.Size([2, 6]); td._device = None; td._is_shared = False\n    \
             td._lock_id = set()\n    return td\n\
             names = ('tensordict.tensordict', 'tensordict.utils')\n\
             real = {{n: sys.modules.get(n) for n in names}}\n\
             utils = types.ModuleType(names[1]); utils._StringOnlyDict = _StringOnlyDict\n\
             sys.modules[names[1]] = utils\n\
             try:\n    for cls, path in ((StatedTensorDict, '{}'), (TensorDict, '{}')):\n        \
             td_module = types.ModuleType(names[0]); td_module.TensorDict = cls\n        \
             cls.__name__ = cls.__qualname__ = 'TensorDict'\n        \
             sys.modules[names[0]] = td_module\n        \
             torch.save(filled(cls), path)\n\
             finally:\n    for n in names:\n        sys.modules.pop(n)\n        \
             real[n] is not None and sys.modules.__setitem__(n, real[n])\n",
            with_state.display(),
            with_slots.display()
        );
        run_python(script);
        let data = Dataset::open(&[with_state, with_slots], &expected(2)).unwrap();
        assert_eq!(
            (data.episodes(), data.episodes_per_task(2)),
            (4, vec![0, 4])
        );
    }

    /// A file whose pickle would run a command is refused, and the command never runs.
    #[test]
    fn pickled_code_is_refused_not_run() {
        let _turn = one_at_a_time();
        let dir = tempfile::tempdir().unwrap();
        let (file, marker) = (dir.path().join("chunk_0.pt"), dir.path().join("ran"));
        let script = format!(
            "import os, torch\n\
             class Payload:\n    def __reduce__(self):\n        return (os.system, ('touch {}',))\n\
             torch.save({{'obs': Payload()}}, '{}')\n",
            marker.display(),
            file.display()
        );
        embedded_python::with_python(|py| {
            let code = std::ffi::CString::new(script).unwrap();
            py.run(&code, None, None)
        })
        .unwrap();
        let e = Dataset::open(&[file], &expected(2))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("posix.system") && e.contains("refused"), "{e}");
        assert!(!marker.exists(), "the pickled command ran");
    }
}
