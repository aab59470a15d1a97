//! Episodes written as dataset files of the official format (with tensordict, in the embedded
//! interpreter).
use std::path::{Path, PathBuf};

use super::{MODULE, OFFICIAL_FORMAT};
use crate::buffer::{Episode, StoredObs};
use crate::error::{Error, Result};

/// Episodes gathered into chunk files of the official format (`chunk_{i}.pt`), one file per
/// `per_file` episodes of one length (a file's episodes share T).
pub struct ChunkWriter {
    dir: PathBuf,
    per_file: usize,
    obs_dim: usize,
    action_dim: usize,
    /// Each task's own action size: the rest of an action is zero, as the policy's mask makes it.
    task_action_dims: Vec<usize>,
    /// Episodes waiting for their file, by length.
    pending: std::collections::BTreeMap<usize, Vec<Episode>>,
    written: Vec<PathBuf>,
}

/// A directory that already holds dataset files would mix them with the new ones (chunk names
/// restart at 0).
fn refuse_a_dataset(dir: &Path) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    if !dir.is_dir() {
        return Err(Error::Config(format!(
            "{} is a file: dataset files are written into a directory; give a new or empty one",
            dir.display()
        )));
    }
    let held = super::dataset_files(dir).map_err(|e| match e.kind() {
        // The directory is there: what is not is a link's target.
        std::io::ErrorKind::NotFound => Error::Config(format!(
            "{}: {e}; a new chunk would be written through it: remove it, or give an empty or \
             new directory",
            dir.display()
        )),
        _ => Error::io(format!("read {}", dir.display()), e),
    })?;
    if held.is_empty() {
        return Ok(());
    }
    let names: Vec<String> = held
        .iter()
        .take(3)
        .filter_map(|p| Some(p.file_name()?.to_string_lossy().into_owned()))
        .collect();
    Err(Error::Config(format!(
        "{} already holds dataset files ({}{}): the new episodes would mix with them; give an \
         empty or new directory",
        dir.display(),
        names.join(", "),
        if held.len() > 3 { ", ..." } else { "" }
    )))
}

impl ChunkWriter {
    pub fn new(
        dir: &Path,
        per_file: usize,
        obs_dim: usize,
        task_action_dims: Vec<usize>,
    ) -> Result<Self> {
        if per_file == 0 {
            return Err(Error::Config("episodes per file must be at least 1".into()));
        }
        refuse_a_dataset(dir)?;
        // A path that cannot be a directory here (a file on the way, no permission) is bad
        // input; a full disk is not.
        std::fs::create_dir_all(dir).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotADirectory
            | std::io::ErrorKind::PermissionDenied
            | std::io::ErrorKind::AlreadyExists => Error::Config(format!(
                "{}: cannot be made ({e}); give a new or empty directory that can",
                dir.display()
            )),
            _ => Error::io(format!("create {}", dir.display()), e),
        })?;
        Ok(Self {
            dir: dir.to_owned(),
            per_file,
            obs_dim,
            action_dim: task_action_dims.iter().copied().max().unwrap_or(0),
            task_action_dims,
            pending: Default::default(),
            written: Vec::new(),
        })
    }

    /// Adds a finished episode; a file is written when its length has `per_file` of them.
    /// The bytes a file takes per episode of `length` steps (its tensors: each of `length + 1`
    /// rows holds an observation, an action, a reward and an int64 task).
    pub fn episode_bytes(obs_dim: usize, action_dim: usize, length: usize) -> u64 {
        let row = (obs_dim + action_dim + 1) * 4 + 8;
        ((length + 1) * row) as u64
    }

    pub fn add(&mut self, episode: Episode) -> Result<()> {
        let length = episode.reward.len();
        let group = self.pending.entry(length).or_default();
        group.push(episode);
        if group.len() == self.per_file {
            let episodes = self.pending.remove(&length).unwrap_or_default();
            self.write(&episodes)?;
        }
        Ok(())
    }

    /// Writes what is left; the files written, in order.
    pub fn finish(mut self) -> Result<Vec<PathBuf>> {
        for episodes in std::mem::take(&mut self.pending).into_values() {
            self.write(&episodes)?;
        }
        Ok(self.written)
    }

    fn write(&mut self, episodes: &[Episode]) -> Result<()> {
        let (d, a) = (self.obs_dim, self.action_dim);
        let rows = episodes[0].reward.len() + 1;
        let (mut obs, mut action, mut reward, mut task) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for episode in episodes {
            let id = episode.task.unwrap_or(0);
            let own = self.task_action_dims.get(id as usize).copied().unwrap_or(a);
            // The official format's observations are float32 (frames too, were any written).
            match &episode.obs {
                StoredObs::States(values) => {
                    obs.extend(values.iter().flat_map(|v| v.to_le_bytes()))
                }
                StoredObs::Frames(bytes) => {
                    obs.extend(bytes.iter().flat_map(|&v| f32::from(v).to_le_bytes()))
                }
            }
            // Row 0: the first observation, NaN fillers for what led to it.
            action.extend(std::iter::repeat_n(f32::NAN, a).flat_map(f32::to_le_bytes));
            reward.extend(f32::NAN.to_le_bytes());
            for step in episode.action.chunks(a) {
                let kept = step
                    .iter()
                    .enumerate()
                    .map(|(j, &v)| if j < own { v } else { 0.0 });
                action.extend(kept.flat_map(f32::to_le_bytes));
            }
            reward.extend(episode.reward.iter().flat_map(|v| v.to_le_bytes()));
            task.extend(std::iter::repeat_n(i64::from(id), rows).flat_map(i64::to_le_bytes));
        }
        let path = self.dir.join(format!("chunk_{}.pt", self.written.len()));
        // `write_chunk` writes it under this name first.
        let partial = format!("pt.{}.tmp", std::process::id());
        let _watched = crate::partial_files::watch(&path.with_extension(partial));
        let failed = |e: pyo3::PyErr| {
            Error::Other(format!(
                "write dataset file {}: {e} (writing needs tensordict, which scripts/setup.sh \
                 installs)",
                path.display()
            ))
        };
        embedded_python::attach_exclusive(|py| {
            use pyo3::prelude::*;
            use pyo3::types::PyBytes;
            let module =
                embedded_python::load_module(py, OFFICIAL_FORMAT, MODULE).map_err(failed)?;
            // A path, not text: a name that is not UTF-8 reaches Python as the same file.
            let args = (
                path.as_path(),
                episodes.len(),
                rows,
                PyBytes::new(py, &obs),
                d,
                PyBytes::new(py, &action),
                a,
                PyBytes::new(py, &reward),
                PyBytes::new(py, &task),
            );
            module.call_method1("write_chunk", args).map_err(failed)?;
            Ok::<_, Error>(())
        })?;
        self.written.push(path);
        Ok(())
    }
}
