//! Atomic checkpoint directories: `checkpoints/step_<N>/` appears whole or not at all.
//!
//! Files are written into a hidden temporary directory, synced, then the directory is renamed
//! into place. A writer killed mid-way leaves only a `.tmp-*` directory, which loading ignores
//! (and the next save removes), so the latest complete checkpoint is always the one picked. A
//! checkpoint saved again at its step (the final one at a save point) is swapped for the new.
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

const PREFIX: &str = "step_";
const TMP_PREFIX: &str = ".tmp-";
/// A complete checkpoint moved aside while its step's new one takes its place (where the two
/// cannot be swapped in one step): `.aside-step_<N>`.
const ASIDE_PREFIX: &str = ".aside-";

/// Writes checkpoint `step` under `root`: `write` fills a fresh temporary directory, whose files
/// are then synced and which is renamed into place. Returns the checkpoint's directory. On
/// failure (a full disk, say) the temporary directory is removed, so that a restart does not
/// meet the disk fuller still.
pub fn save(root: &Path, step: u64, write: impl FnOnce(&Path) -> Result<()>) -> Result<PathBuf> {
    fs::create_dir_all(root).map_err(|e| Error::io(format!("create {}", root.display()), e))?;
    restore_set_aside(root);
    remove_stale_temporaries(root);
    let name = format!("{PREFIX}{step:012}");
    let tmp = root.join(format!("{TMP_PREFIX}{name}-{}", std::process::id()));
    fs::create_dir_all(&tmp).map_err(|e| Error::io(format!("create {}", tmp.display()), e))?;
    if let Err(e) = write(&tmp).and_then(|()| sync_all(&tmp)) {
        let _ = fs::remove_dir_all(&tmp);
        return Err(e);
    }
    let dest = root.join(&name);
    match dest.exists() {
        true => replace(&tmp, &dest)?,
        false => fs::rename(&tmp, &dest)
            .map_err(|e| Error::io(format!("rename into {}", dest.display()), e))?,
    }
    sync_dir(root)?;
    Ok(dest)
}

/// Syncs every file of `dir`, then `dir` itself.
fn sync_all(dir: &Path) -> Result<()> {
    let files = fs::read_dir(dir).map_err(|e| Error::io(format!("list {}", dir.display()), e))?;
    for entry in files.flatten() {
        File::open(entry.path())
            .and_then(|f| f.sync_all())
            .map_err(|e| Error::io(format!("sync {}", entry.path().display()), e))?;
    }
    sync_dir(dir)
}

/// Puts the complete directory `new` in the place of the checkpoint `dest` of the same step:
/// the two are swapped in one step, so that there is no moment in which neither is there, and
/// the old one, now under the temporary name, is removed after (or by the next save).
fn replace(new: &Path, dest: &Path) -> Result<()> {
    match exchange(new, dest) {
        Ok(()) => {
            let _ = fs::remove_dir_all(new);
            Ok(())
        }
        // Where the swap is not to be had (a filesystem or a sandbox without it), two renames.
        Err(_) => replace_by_renames(new, dest),
    }
}

/// [`replace`] without the swap: the old one is moved aside first (`.aside-step_<N>`). A kill
/// between the two renames leaves it there, never a half-written checkpoint, and the next look
/// at the checkpoints ([`restore_set_aside`]) puts it back.
fn replace_by_renames(new: &Path, dest: &Path) -> Result<()> {
    let failed = |e| Error::io(format!("replace {}", dest.display()), e);
    let aside =
        aside_of(dest).ok_or_else(|| Error::Checkpoint(format!("{}: no name", dest.display())))?;
    fs::rename(dest, &aside).map_err(failed)?;
    fs::rename(new, dest).map_err(failed)?;
    let _ = fs::remove_dir_all(aside);
    Ok(())
}

fn aside_of(dest: &Path) -> Option<PathBuf> {
    let name = dest.file_name()?.to_str()?;
    Some(dest.with_file_name(format!("{ASIDE_PREFIX}{name}")))
}

/// Puts back a checkpoint moved aside by a replacement that was cut short (its step then has
/// none in place), or removes it (the new one is in place). Called by a save only, which holds
/// the run's lock; best effort.
fn restore_set_aside(root: &Path) {
    let Ok(entries) = fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(original) = name.strip_prefix(ASIDE_PREFIX) else {
            continue;
        };
        let dest = root.join(original);
        let _ = match dest.exists() {
            true => fs::remove_dir_all(entry.path()),
            false => fs::rename(entry.path(), dest),
        };
    }
}

/// Swaps two directory entries atomically (Linux's `renameat2` with `RENAME_EXCHANGE`).
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c_path =
        |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other);
    let (a, b) = (c_path(a)?, c_path(b)?);
    // SAFETY: both are NUL-terminated paths that outlive the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    match rc {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// The complete checkpoint of exactly `step` under `root`, if any.
pub fn at(root: &Path, step: u64) -> Option<PathBuf> {
    let dir = root.join(format!("{PREFIX}{step:012}"));
    let aside = aside_of(&dir)?;
    [dir, aside].into_iter().find(|d| d.is_dir())
}

/// The step of a checkpoint directory, from its name (`step_<N>`, or `.aside-step_<N>` for one
/// set aside by a replacement cut short).
pub fn step_of(dir: &Path) -> Option<u64> {
    let name = dir.file_name()?.to_str()?;
    let name = name.strip_prefix(ASIDE_PREFIX).unwrap_or(name);
    name.strip_prefix(PREFIX)?.parse().ok()
}

/// The complete checkpoint with the highest step under `root`, if any.
pub fn latest(root: &Path) -> Option<(u64, PathBuf)> {
    complete(root).into_iter().max_by_key(|(step, _)| *step)
}

/// The complete checkpoints under `root` with their steps, in no order (none when `root` cannot
/// be read).
///
/// A checkpoint set aside by a replacement cut short counts for its step while that step has
/// none in place; only a save (under the run's lock) moves it back, so that a reader never
/// renames what a writer is between two renames of.
fn complete(root: &Path) -> Vec<(u64, PathBuf)> {
    let Ok(entries) = fs::read_dir(root) else {
        return Vec::new();
    };
    let mut found: BTreeMap<u64, PathBuf> = BTreeMap::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(step) = step_of(&path).filter(|_| path.is_dir()) else {
            continue;
        };
        let aside = entry
            .file_name()
            .to_string_lossy()
            .starts_with(ASIDE_PREFIX);
        if !aside || !found.contains_key(&step) {
            found.insert(step, path);
        }
    }
    found.into_iter().collect()
}

/// Removes the checkpoints under `root` older than `step` but the newest `keep - 1` of them, so
/// that `keep` remain with `step`'s own; returns the steps of those older ones kept. Later
/// ones, if any, stay.
pub fn prune(root: &Path, step: u64, keep: usize) -> Result<Vec<u64>> {
    remove_stale_temporaries(root);
    let mut older: Vec<(u64, PathBuf)> = complete(root)
        .into_iter()
        .filter(|(at, _)| *at < step)
        .collect();
    older.sort_unstable_by_key(|(at, _)| std::cmp::Reverse(*at));
    let kept = keep.saturating_sub(1).min(older.len());
    for (_, dir) in older.split_off(kept) {
        discard(&dir)?;
    }
    Ok(older.into_iter().map(|(at, _)| at).collect())
}

/// Removes the entries under `root` older than `step` whose steps are not in `kept` (a rank's
/// replay buffers, kept for the checkpoints kept and no other).
pub fn prune_to(root: &Path, step: u64, kept: &[u64]) -> Result<()> {
    remove_stale_temporaries(root);
    for (at, dir) in complete(root) {
        if at < step && !kept.contains(&at) {
            discard(&dir)?;
        }
    }
    Ok(())
}

/// Removes the entries under `root` of steps past `step` (every one, for None).
pub fn remove_past(root: &Path, step: Option<u64>) -> Result<()> {
    remove_stale_temporaries(root);
    for (at, dir) in complete(root) {
        if step.is_none_or(|step| at > step) {
            discard(&dir)?;
        }
    }
    Ok(())
}

/// Removes a complete checkpoint: renamed to a temporary name first, so that a kill while its
/// files go leaves no partly removed directory under a name that loading counts (the next save
/// removes the rest).
fn discard(dir: &Path) -> Result<()> {
    let doomed = out_of_sight(dir)?;
    fs::remove_dir_all(&doomed).map_err(|e| Error::io(format!("remove {}", doomed.display()), e))
}

/// Renames a checkpoint to a temporary name, which loading skips; returns that name.
fn out_of_sight(dir: &Path) -> Result<PathBuf> {
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    let doomed = dir.with_file_name(format!("{TMP_PREFIX}removed-{name}-{}", std::process::id()));
    fs::rename(dir, &doomed).map_err(|e| Error::io(format!("remove {}", dir.display()), e))?;
    Ok(doomed)
}

fn remove_stale_temporaries(root: &Path) {
    if let Ok(entries) = fs::read_dir(root) {
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    }
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(format!("sync {}", dir.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A save's writer of `model.safetensors` holding `bytes`.
    fn writes(bytes: &'static [u8]) -> impl FnOnce(&Path) -> Result<()> {
        move |dir: &Path| {
            fs::write(dir.join("model.safetensors"), bytes).map_err(|e| Error::io("write", e))
        }
    }

    #[test]
    fn latest_skips_half_written_checkpoints() {
        let root = tempfile::tempdir().unwrap();
        assert!(latest(root.path()).is_none());
        save(root.path(), 100, writes(b"one")).unwrap();
        save(root.path(), 200, writes(b"two")).unwrap();
        // A writer killed mid-way at step 300 leaves only its temporary directory.
        let partial = root
            .path()
            .join(format!("{TMP_PREFIX}{PREFIX}000000000300-1"));
        fs::create_dir_all(&partial).unwrap();
        fs::write(partial.join("model.safetensors"), b"hal").unwrap();
        let (step, dir) = latest(root.path()).unwrap();
        assert_eq!(step, 200);
        assert_eq!(fs::read(dir.join("model.safetensors")).unwrap(), b"two");
        save(root.path(), 300, writes(b"three")).unwrap();
        assert!(!partial.exists(), "the next save clears stale temporaries");
        assert_eq!(latest(root.path()).unwrap().0, 300);
    }

    #[test]
    fn a_replacement_swaps_whole_directories() {
        let root = tempfile::tempdir().unwrap();
        let dir = |name: &str, bytes: &[u8]| {
            let dir = root.path().join(name);
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join("model.safetensors"), bytes).unwrap();
            dir
        };
        let read = |dir: &Path| fs::read(dir.join("model.safetensors")).unwrap();
        let (old, new) = (dir("step_1", b"old"), dir(".tmp-step_1", b"new"));
        exchange(&new, &old).unwrap();
        assert_eq!((read(&old), read(&new)), (b"new".to_vec(), b"old".to_vec()));
        let newer = dir(".tmp-step_1-2", b"newer");
        replace_by_renames(&newer, &old).unwrap();
        assert_eq!(read(&old), b"newer");
        assert!(!newer.exists() && !aside_of(&old).unwrap().exists());
        let missing = root.path().join("absent");
        assert!(exchange(&missing, &old).is_err(), "a swap needs both");
    }

    /// Killed between the two renames of a replacement without the swap: the old checkpoint,
    /// set aside, still counts for its step (read where it is: a reader renames nothing), and
    /// the next save puts it back rather than remove it with the temporaries.
    #[test]
    fn a_checkpoint_set_aside_by_a_cut_replacement_is_found_and_put_back() {
        let root = tempfile::tempdir().unwrap();
        let saved = save(root.path(), 100, writes(b"kept")).unwrap();
        let aside = aside_of(&saved).unwrap();
        fs::rename(&saved, &aside).unwrap();
        let new = root
            .path()
            .join(format!("{TMP_PREFIX}{PREFIX}000000000100-7"));
        fs::create_dir_all(&new).unwrap();
        let (step, dir) = latest(root.path()).expect("found aside");
        assert_eq!((step, &dir), (100, &aside));
        assert_eq!(at(root.path(), 100), Some(aside.clone()));
        assert_eq!(fs::read(dir.join("model.safetensors")).unwrap(), b"kept");
        assert!(aside.exists(), "a reader moves nothing");
        save(root.path(), 200, writes(b"later")).unwrap();
        assert!(!aside.exists() && !new.exists());
        assert_eq!(
            fs::read(at(root.path(), 100).unwrap().join("model.safetensors")).unwrap(),
            b"kept"
        );
        // Both there (cut after the second rename): the one in place counts, the save removes
        // the other.
        fs::create_dir_all(&aside).unwrap();
        assert_eq!(at(root.path(), 100), Some(saved.clone()));
        assert_eq!(
            latest(root.path()).unwrap().1,
            root.path().join(format!("{PREFIX}000000000200"))
        );
        save(root.path(), 300, writes(b"last")).unwrap();
        assert!(!aside.exists());
    }

    /// A save that fails (a full disk, say) leaves no temporary directory behind.
    #[test]
    fn a_failed_save_leaves_nothing() {
        let root = tempfile::tempdir().unwrap();
        let err = save(root.path(), 100, |dir: &Path| {
            fs::write(dir.join("model.safetensors"), b"part").map_err(|e| Error::io("write", e))?;
            Err(Error::io(
                "write state.safetensors",
                std::io::Error::from_raw_os_error(libc::ENOSPC),
            ))
        })
        .unwrap_err();
        assert!(err.to_string().contains("No space left"), "{err}");
        assert_eq!(fs::read_dir(root.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_save_at_the_same_step_replaces_the_checkpoint_whole() {
        let root = tempfile::tempdir().unwrap();
        save(root.path(), 100, writes(b"first")).unwrap();
        let dir = save(root.path(), 100, writes(b"second")).unwrap();
        assert_eq!(fs::read(dir.join("model.safetensors")).unwrap(), b"second");
        let names: Vec<String> = fs::read_dir(root.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [format!("{PREFIX}000000000100")],
            "the old one is gone"
        );
    }

    #[test]
    fn pruning_keeps_the_newest_up_to_this_step_and_any_later_one() {
        let root = tempfile::tempdir().unwrap();
        for step in [100, 200, 300, 500] {
            save(root.path(), step, |_| Ok(())).unwrap();
        }
        let steps = || {
            let mut steps: Vec<u64> = fs::read_dir(root.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy()[PREFIX.len()..].parse())
                .collect::<std::result::Result<_, _>>()
                .unwrap();
            steps.sort();
            steps
        };
        // Step 500 is left from before a resume at an earlier step.
        assert_eq!(prune(root.path(), 300, 2).unwrap(), [200]);
        assert_eq!(steps(), [200, 300, 500]);
        assert!(prune(root.path(), 300, 1).unwrap().is_empty());
        assert_eq!(steps(), [300, 500]);
        prune(&root.path().join("absent"), 300, 1).unwrap();
    }

    /// A rank's buffers follow the checkpoints kept: one left at a step without a checkpoint
    /// goes, and pushes out none of theirs.
    #[test]
    fn buffers_are_pruned_to_the_checkpoints_kept() {
        let root = tempfile::tempdir().unwrap();
        for step in [100, 150, 200, 300] {
            save(root.path(), step, |_| Ok(())).unwrap();
        }
        prune_to(root.path(), 300, &[100]).unwrap();
        let mut left: Vec<u64> = complete(root.path())
            .into_iter()
            .map(|(at, _)| at)
            .collect();
        left.sort();
        assert_eq!(left, [100, 300]);
        prune_to(&root.path().join("absent"), 300, &[]).unwrap();
    }

    /// Buffers past the step a run resumes from belong to no checkpoint (its save failed
    /// after they were written); a fresh start keeps none.
    #[test]
    fn buffers_past_the_resumed_step_go() {
        let root = tempfile::tempdir().unwrap();
        for step in [100, 200, 300] {
            save(root.path(), step, |_| Ok(())).unwrap();
        }
        let left = || -> Vec<u64> {
            let mut steps: Vec<u64> = complete(root.path())
                .into_iter()
                .map(|(at, _)| at)
                .collect();
            steps.sort();
            steps
        };
        remove_past(root.path(), Some(200)).unwrap();
        assert_eq!(left(), [100, 200]);
        remove_past(root.path(), None).unwrap();
        assert!(left().is_empty());
        remove_past(&root.path().join("absent"), None).unwrap();
    }

    /// A pruned checkpoint leaves under a name loading skips before its files go: what a kill
    /// in the middle leaves is not a checkpoint, and the next save or prune removes it.
    #[test]
    fn a_pruned_checkpoint_is_renamed_out_of_sight_before_its_files_go() {
        let root = tempfile::tempdir().unwrap();
        for step in [100, 200, 300] {
            save(root.path(), step, writes(b"model")).unwrap();
        }
        // As a kill right after the rename leaves it: files and all.
        let doomed = out_of_sight(&root.path().join("step_000000000100")).unwrap();
        assert!(doomed.join("model.safetensors").is_file());
        assert!(at(root.path(), 100).is_none());
        let steps = || -> Vec<u64> {
            let mut steps: Vec<u64> = complete(root.path()).iter().map(|(s, _)| *s).collect();
            steps.sort();
            steps
        };
        assert_eq!(steps(), [200, 300]);
        prune(root.path(), 300, 1).unwrap();
        assert!(!doomed.exists());
        let names: Vec<String> = fs::read_dir(root.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["step_000000000300"]);
    }
}
