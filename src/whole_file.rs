//! Files written whole: the bytes go to a temporary file beside the target, which is then
//! renamed over it, so that a reader (or a run killed mid-write) sees the old file or the new
//! one, never a part. The temporary's name holds nothing of the target's (a reader that picks
//! files by name, as TensorBoard picks `*tfevents*`, never takes it for one).
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Writes `bytes` to `path` whole (see the module).
pub fn write(path: &Path, bytes: impl AsRef<[u8]>) -> std::io::Result<()> {
    write_with(path, |file| file.write_all(bytes.as_ref()))
}

/// Writes to `path` whole what `fill` writes into the file it is given (see the module): for
/// contents too large to hold in memory at once.
pub fn write_with(
    path: &Path,
    fill: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>,
) -> std::io::Result<()> {
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let partial = path.with_file_name(format!(
        "{PARTIAL_PREFIX}{}-{}",
        std::process::id(),
        WRITES.fetch_add(1, Ordering::Relaxed)
    ));
    let durable = || -> std::io::Result<()> {
        let mut file = std::fs::File::create(&partial)?;
        fill(&mut file)?;
        // On disk before it replaces the old file: after a crash of the machine, the old file
        // or the new one, never an empty one (XFS, or ext4 without auto_da_alloc).
        file.sync_all()
    };
    durable()
        .and_then(|()| std::fs::rename(&partial, path))
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&partial);
        })?;
    // The rename itself, where the file system can sync a folder.
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        let _ = std::fs::File::open(dir).and_then(|dir| dir.sync_all());
    }
    Ok(())
}

/// Whether `name` is a temporary file of [`write`] (one left by a process killed mid-write).
pub fn is_partial(name: &std::ffi::OsStr) -> bool {
    name.to_str()
        .is_some_and(|name| name.starts_with(PARTIAL_PREFIX))
}

const PARTIAL_PREFIX: &str = ".partial-";

/// Replaces `path` with `bytes` whole, the file as it was kept beside it as
/// `<kept_as>.before-<unix time>` (`-1`, `-2`, ... when taken): a hard link, or a copy where
/// none can be made. A kill in between leaves both, never neither.
pub fn replace_keeping(
    path: &Path,
    kept_as: &str,
    bytes: impl AsRef<[u8]>,
) -> std::io::Result<PathBuf> {
    replace_keeping_with(path, kept_as, |file| file.write_all(bytes.as_ref()))
}

/// [`replace_keeping`] with what `fill` writes into the new file (see [`write_with`]).
pub fn replace_keeping_with(
    path: &Path,
    kept_as: &str,
    fill: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>,
) -> std::io::Result<PathBuf> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let base = format!("{kept_as}.before-{secs}");
    let aside = (0..)
        .map(|n| match n {
            0 => path.with_file_name(&base),
            n => path.with_file_name(format!("{base}-{n}")),
        })
        .find(|aside| !aside.exists())
        .unwrap_or_default();
    std::fs::hard_link(path, &aside).or_else(|_| std::fs::copy(path, &aside).map(drop))?;
    write_with(path, fill)?;
    Ok(aside)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_replaced_whole_and_nothing_is_left_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        write(&path, "a: 1\n").unwrap();
        write(&path, "a: 2\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a: 2\n");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        // Replaced twice (within a second, usually): both earlier versions stay, apart.
        let first = replace_keeping(&path, "config", "a: 3\n").unwrap();
        let second = replace_keeping(&path, "config", "a: 4\n").unwrap();
        assert_eq!(std::fs::read_to_string(&first).unwrap(), "a: 2\n");
        assert_eq!(std::fs::read_to_string(&second).unwrap(), "a: 3\n");
        assert_ne!(first, second);
        let e = write(&dir.path().join("no-folder/x"), "x").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    }
}
