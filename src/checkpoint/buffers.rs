//! Replay buffers on resume: each rank takes the saved buffers' episodes that are dealt to it
//! (its own buffer at the same world size, shares of the saved ranks' buffers at another).
use std::path::{Path, PathBuf};

use tch::Tensor;

use super::tensor_file::TensorFile;
use super::{buffers_dir, fail, integrity, store};
use crate::buffer::{BufferMeta, Dealing, ReplayBuffer, SavedPart, SavedTensors};
use crate::ddp::ProcessGroup;
use crate::error::{Error, Result};

/// A saved buffer's files: the tensors, the ring's bookkeeping, and the crc32c of each (the
/// bookkeeping's in a file of its own, which binaries from before it was written pass over).
const TENSORS: &str = "buffer.safetensors";
const META: &str = "buffer.json";
const HASH: &str = "buffer.crc32c";
const META_HASH: &str = "buffer.json.crc32c";

/// Writes a rank's buffer into `dir`, with the hashes that a resume checks it against; returns
/// the tensors' hash (the checkpoint records every rank's).
pub(super) fn write(dir: &Path, tensors: &[(String, Tensor)], meta: &BufferMeta) -> Result<u32> {
    let crc = super::tensor_file::write(&dir.join(TENSORS), tensors)?;
    let meta_path = dir.join(META);
    let bookkeeping =
        serde_json::to_vec_pretty(meta).map_err(|e| fail(&meta_path.display().to_string(), e))?;
    for (name, hash) in [(HASH, crc), (META_HASH, crc32c::crc32c(&bookkeeping))] {
        std::fs::write(dir.join(name), format!("{hash:08x}\n"))
            .map_err(|e| Error::io(format!("write {}", dir.join(name).display()), e))?;
    }
    std::fs::write(&meta_path, bookkeeping)
        .map_err(|e| Error::io(format!("write {}", meta_path.display()), e))?;
    Ok(crc)
}

/// The hash recorded with the buffer saved in `dir`. Every save writes one before its folder
/// appears: one missing or unreadable is damage, not another run's buffer.
fn recorded_hash(dir: &Path) -> Result<u32> {
    let path = dir.join(HASH);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        let why = match e.kind() {
            std::io::ErrorKind::NotFound => "is missing".to_string(),
            _ => format!("cannot be read ({e})"),
        };
        unusable(
            dir,
            &format!("{} {why}: the buffer cannot be checked", path.display()),
        )
    })?;
    u32::from_str_radix(text.trim(), 16).map_err(|e| {
        let why = format!("{} is damaged or edited ({e})", path.display());
        unusable(dir, &why)
    })
}

/// The bookkeeping's hash (none in buffers saved before it was written).
fn recorded_meta_hash(dir: &Path) -> Result<Option<u32>> {
    let path = dir.join(META_HASH);
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(None);
    };
    u32::from_str_radix(text.trim(), 16).map(Some).map_err(|e| {
        let why = format!("{} is damaged or edited ({e})", path.display());
        unusable(dir, &why)
    })
}

/// The tensors of the buffer saved in `dir`, once their bytes match the hash written with them
/// (buffers saved before hashes were written are read unchecked), opened to be read a slice of
/// rows at a time.
fn read_checked(dir: &Path) -> Result<TensorFile> {
    let path = dir.join(TENSORS);
    std::fs::File::open(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => unusable(dir, &format!("{} is missing", path.display())),
        _ => Error::io(format!("read {}", path.display()), e),
    })?;
    if let Ok(text) = std::fs::read_to_string(dir.join(HASH)) {
        let saved = u32::from_str_radix(text.trim(), 16)
            .map_err(|e| fail(&dir.join(HASH).display().to_string(), e))?;
        let now = integrity::file_crc(&path)?;
        if now != saved {
            return Err(unusable(
                dir,
                &format!(
                    "{} is damaged: its bytes do not match the hash recorded when it was saved \
                     (crc32c {now:08x}, saved {saved:08x})",
                    path.display()
                ),
            ));
        }
    }
    TensorFile::open(&path)
}

impl SavedTensors for TensorFile {
    fn describe(&self, name: &str) -> Option<(Vec<i64>, tch::Kind)> {
        TensorFile::describe(self, name)
    }

    fn rows(&self, name: &str, start: i64, count: i64) -> Result<Tensor> {
        TensorFile::rows(self, name, start, count)
    }
}

/// The saved buffers a rank takes episodes from: those found, as (saved rank, folder), and the
/// saved ranks of those not found.
struct Located {
    found: Vec<(usize, PathBuf)>,
    missing: Vec<usize>,
}

/// Where a resumed rank looks for the buffers saved with the checkpoint of `step`.
pub(super) struct SavedBuffers<'a> {
    /// The run that wrote the checkpoint (the buffers live beside it).
    pub source_run: &'a Path,
    /// This rank's own run directory: where a rank that cannot see the source run finds what
    /// it saved itself.
    pub run_dir: &'a Path,
    pub step: u64,
    pub dealing: Dealing,
    /// The hash of each saved rank's buffer, as the checkpoint recorded it: none when it saved
    /// none (None: a checkpoint from before they were recorded, whose buffers are taken as
    /// found).
    pub hashes: Option<Vec<u32>>,
}

impl SavedBuffers<'_> {
    /// The buffer directories of the saved ranks with episodes for `rank`: those found (and
    /// saved with this checkpoint), and the saved ranks of those not found.
    fn locate(&self, rank: usize) -> Result<Located> {
        let (mut found, mut missing) = (Vec::new(), Vec::new());
        let mut runs = vec![self.source_run];
        if self.run_dir != self.source_run {
            runs.push(self.run_dir);
        }
        for saved_rank in self.dealing.sources(rank) {
            let mut saved = None;
            for run in &runs {
                let Some(dir) = store::at(&buffers_dir(run, saved_rank), self.step) else {
                    continue;
                };
                if self.saved_with_the_checkpoint(saved_rank, &dir)? {
                    saved = Some(dir);
                    break;
                }
            }
            match saved {
                Some(dir) => found.push((saved_rank, dir)),
                None => missing.push(saved_rank),
            }
        }
        Ok(Located { found, missing })
    }

    /// Whether `dir` holds the buffer `saved_rank` wrote with this checkpoint; one that is
    /// not (another run's at the same step) is named and passed over.
    fn saved_with_the_checkpoint(&self, saved_rank: usize, dir: &Path) -> Result<bool> {
        let Some(hashes) = &self.hashes else {
            return Ok(true);
        };
        let expected = hashes.get(saved_rank).copied();
        let recorded = Some(recorded_hash(dir)?);
        if recorded != expected {
            errln!(
                "warning: {} is not the replay buffer saved with the checkpoint of step {} \
                 (another run's at the same step): passed over",
                dir.display(),
                self.step
            );
        }
        Ok(recorded == expected)
    }

    /// Fills `buffer` with what this rank takes of the saved buffers. Warns when no rank found
    /// any (rank 0, for the run), and on each rank that misses some while others found theirs.
    pub fn restore(&self, buffer: &mut ReplayBuffer, group: &ProcessGroup) -> Result<()> {
        let rank = group.rank();
        let Located { found, missing } = self.locate(rank)?;
        let mut finders = Tensor::from_slice(&[f64::from(!found.is_empty())]);
        group.all_reduce_sum(&mut finders)?;
        if finders.double_value(&[0]) == 0.0 {
            if rank == 0 {
                let why = match self.hashes.as_deref() {
                    Some([]) => "the checkpoint saved none (save_buffer=true saves them)",
                    _ => "none was found beside the checkpoint or in run_dir",
                };
                errln!(
                    "warning: resuming without replay buffers: {why}; the buffer refills from \
                     new episodes"
                );
            }
            return Ok(());
        }
        if !missing.is_empty() {
            errln!(
                "warning: rank {rank} resumes without the replay buffers of saved ranks \
                 {missing:?}, found neither beside the checkpoint nor in its run_dir"
            );
        }
        let parts = found
            .iter()
            .map(|(saved_rank, dir)| {
                let meta = read_meta(dir)?;
                Ok(SavedPart::dealt(meta, self.dealing, *saved_rank, rank))
            })
            .collect::<Result<Vec<_>>>()?;
        if rank == 0 {
            if let Some(note) = self.note(&parts, buffer.capacity()) {
                errln!("note: {note}");
            }
        }
        buffer.gather(parts, |p| read_checked(&found[p].1))
    }

    /// What a rank's buffer holds of the saved ones, when it is not the saved ring as it was.
    fn note(&self, parts: &[SavedPart], capacity: usize) -> Option<String> {
        let rows: usize = parts.iter().map(SavedPart::rows).sum();
        let kept = match rows <= capacity {
            true => "every saved row is kept",
            false => "the newest rows that fit are kept",
        };
        let Dealing { from, to } = self.dealing;
        if from != to {
            return Some(format!(
                "the replay buffers saved by {from} ranks are dealt out to this run's {to}, \
                 episode by episode: rank 0 takes {rows} saved rows into its {capacity} \
                 (min(buffer_size, steps / world_size)); {kept}"
            ));
        }
        let saved = parts.first().map(|p| p.meta().capacity())?;
        (saved != capacity).then(|| {
            format!(
                "the saved replay buffers hold {saved} rows a rank, this run's {capacity} \
                 (min(buffer_size, steps / world_size)); {kept}"
            )
        })
    }
}

fn read_meta(dir: &Path) -> Result<BufferMeta> {
    let path = dir.join(META);
    let bytes = std::fs::read(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => unusable(dir, &format!("{} is missing", path.display())),
        _ => Error::io(format!("read {}", path.display()), e),
    })?;
    let edited = |why: String| {
        unusable(
            dir,
            &format!("{} is damaged or edited ({why})", path.display()),
        )
    };
    if let Some(saved) = recorded_meta_hash(dir)? {
        let now = crc32c::crc32c(&bytes);
        if now != saved {
            return Err(edited(format!(
                "its bytes do not match the hash recorded when it was saved: crc32c {now:08x}, \
                 saved {saved:08x}"
            )));
        }
    }
    let meta: BufferMeta = serde_json::from_slice(&bytes).map_err(|e| edited(e.to_string()))?;
    meta.check().map_err(|e| edited(e.to_string()))?;
    Ok(meta)
}

/// A saved replay buffer that cannot be taken as it is: bad input, with the way on.
fn unusable(dir: &Path, why: &str) -> Error {
    Error::Unreadable(format!(
        "{why}; move {} away to resume without this replay buffer (it refills from new \
         episodes), or resume an earlier checkpoint",
        dir.display()
    ))
}
