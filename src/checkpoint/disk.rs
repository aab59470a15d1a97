//! Disk space for checkpoints: what is free where a run writes, and whether the replay buffers
//! its checkpoints will hold (`save_buffer=true`) fit in it.
use std::path::{Path, PathBuf};

/// Bytes free to this user on the filesystem that holds `path`, or will hold it (the path
/// may not exist yet: its nearest existing ancestor is asked), with the directory asked.
pub fn free_bytes(path: &Path) -> std::io::Result<(PathBuf, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let mut dir = path.to_path_buf();
    while !dir.exists() {
        if !dir.pop() {
            break;
        }
    }
    if dir.as_os_str().is_empty() {
        dir = PathBuf::from(".");
    }
    let c_path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: statvfs writes into the zeroed struct we own; the path is NUL-terminated.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((dir, stat.f_bavail as u64 * stat.f_frsize as u64))
}

/// The replay buffers that a run's checkpoints still to come put on one node's disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferDisk {
    /// Bytes of one rank's saved buffer (its whole ring).
    pub per_rank: u64,
    /// Ranks of this node.
    pub ranks: u64,
    /// Checkpoints on disk at once: those still to come, at most `keep_checkpoints` + 1 (a
    /// new one is written before the oldest goes).
    pub checkpoints: u64,
}

impl BufferDisk {
    /// From global step `start` to `steps`: a checkpoint at each multiple of `save_freq` and
    /// one at the end; `keep` as `keep_checkpoints` (0: all).
    pub fn new(
        per_rank: u64,
        ranks: u64,
        (start, steps, save_freq): (u64, u64, u64),
        keep: u64,
    ) -> Self {
        let save_freq = save_freq.max(1);
        let periodic = steps / save_freq - start.min(steps) / save_freq;
        let to_come = periodic + u64::from(steps % save_freq != 0 && start < steps);
        let checkpoints = match keep {
            0 => to_come,
            _ => to_come.min(keep + 1),
        };
        Self {
            per_rank,
            ranks,
            checkpoints,
        }
    }

    pub fn bytes(&self) -> u64 {
        self.per_rank * self.ranks * self.checkpoints
    }

    /// A warning when they need more than the `free` bytes of `dir`.
    pub fn warning(&self, free: u64, dir: &Path) -> Option<String> {
        (self.bytes() > free).then(|| {
            format!(
                "warning: save_buffer=true: this node's replay buffers in the run's checkpoints \
                 will take up to {} ({} checkpoint(s) × {} rank(s) × {}), more than the {} free \
                 under {}; keep_checkpoints=N keeps only the newest N, a larger save_freq \
                 writes fewer",
                gib(self.bytes()),
                self.checkpoints,
                self.ranks,
                gib(self.per_rank),
                gib(free),
                dir.display()
            )
        })
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checkpoints_to_come_are_counted_and_capped_by_keep() {
        let gib = 1u64 << 30;
        // 10M steps, one every 500k: 20 of them (the last at the end).
        let all = BufferDisk::new(gib, 8, (0, 10_000_000, 500_000), 0);
        assert_eq!((all.checkpoints, all.bytes()), (20, 160 * gib));
        // Resumed at 9.2M, steps not a multiple: 9.5M, then the end.
        assert_eq!(
            BufferDisk::new(gib, 1, (9_200_000, 9_700_000, 500_000), 0).checkpoints,
            2
        );
        assert_eq!(
            BufferDisk::new(gib, 8, (0, 10_000_000, 500_000), 2).checkpoints,
            3
        );
        assert_eq!(BufferDisk::new(gib, 1, (800, 800, 400), 0).checkpoints, 0);
        let warning = all.warning(100 * gib, Path::new("/runs")).unwrap();
        assert!(
            warning.contains("160.0 GiB (20 checkpoint(s) × 8 rank(s) × 1.0 GiB)")
                && warning.contains("100.0 GiB free under /runs")
                && warning.contains("keep_checkpoints=N"),
            "{warning}"
        );
        assert_eq!(all.warning(200 * gib, Path::new("/runs")), None);
    }

    #[test]
    fn free_bytes_asks_the_nearest_existing_directory() {
        let dir = tempfile::tempdir().unwrap();
        let (asked, free) = free_bytes(&dir.path().join("runs/task/1")).unwrap();
        assert_eq!(asked, dir.path());
        assert!(free > 0);
    }
}
