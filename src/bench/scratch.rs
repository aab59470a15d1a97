//! The folders the bench's cases write in, under the system's temporary folder: named for the
//! case and the process, removed when the case is done, and those of a bench that was killed
//! (SIGKILL, a machine that went down) removed by the next bench that makes one.
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

const PREFIX: &str = "tdmpc2-bench-";

/// A case's folder, removed with what it holds when dropped.
pub struct Scratch(PathBuf);

impl Scratch {
    /// A new, empty folder for `case` (a bench case's name).
    pub fn new(case: &str) -> Result<Scratch> {
        remove_those_of_ended_benches();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir =
            std::env::temp_dir().join(format!("{PREFIX}{case}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        Ok(Scratch(dir))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Removes the bench folders whose process has ended (one killed before it could).
fn remove_those_of_ended_benches() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        match owner(&name.to_string_lossy()) {
            Some(pid) if !crate::ddp::lifeline::is_alive(pid) => {
                let _ = std::fs::remove_dir_all(entry.path());
            }
            _ => {}
        }
    }
}

/// The process that made a folder named `tdmpc2-bench-<case>-<pid>-<nanos>`.
fn owner(name: &str) -> Option<i32> {
    let mut parts = name.strip_prefix(PREFIX)?.rsplitn(3, '-');
    parts.next()?.parse::<u128>().ok()?;
    let pid = parts.next()?.parse::<i32>().ok().filter(|pid| *pid > 0)?;
    parts.next().filter(|case| !case.is_empty())?;
    Some(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_is_removed_when_done_and_one_of_an_ended_bench_by_the_next() {
        let mut ended = std::process::Command::new("true").spawn().unwrap();
        let pid = ended.id();
        ended.wait().unwrap();
        let left = std::env::temp_dir().join(format!("{PREFIX}test-{pid}-1"));
        std::fs::create_dir_all(left.join("run")).unwrap();
        let ours = Scratch::new("test").unwrap();
        assert!(!left.exists(), "{} was left", left.display());
        let path = ours.path().to_path_buf();
        let other = Scratch::new("test").unwrap();
        assert!(path.is_dir(), "a live bench's folder was removed");
        assert_ne!(path, other.path());
        drop(ours);
        assert!(!path.exists());
    }

    #[test]
    fn only_bench_folders_name_an_owner() {
        assert_eq!(owner("tdmpc2-bench-loop-42-17"), Some(42));
        assert_eq!(owner("tdmpc2-bench-loop-42"), None);
        assert_eq!(owner("tdmpc2-bench--42-17"), None);
        assert_eq!(owner("tdmpc2-bench-loop-0-17"), None);
        assert_eq!(owner("other-loop-42-17"), None);
    }
}
