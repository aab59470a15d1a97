//! Files written whole: the bytes go to a temporary file beside the target, which is then
//! renamed over it, so that a reader (or a run killed mid-write) sees the old file or the new
//! one, never a part.
use std::path::{Path, PathBuf};

/// Writes `bytes` to `path` whole (see the module).
pub fn write(path: &Path, bytes: impl AsRef<[u8]>) -> std::io::Result<()> {
    let mut partial = PathBuf::from(path).into_os_string();
    partial.push(format!(".partial-{}", std::process::id()));
    let partial = PathBuf::from(partial);
    std::fs::write(&partial, bytes)
        .and_then(|()| std::fs::rename(&partial, path))
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&partial);
        })
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
        let e = write(&dir.path().join("no-folder/x"), "x").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    }
}
