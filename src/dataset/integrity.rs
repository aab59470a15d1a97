//! Whether a dataset file's bytes are those that were written: every entry of its zip archive
//! (`torch.save`'s format) read to its end against the CRC-32 the archive keeps for it.
//!
//! Reading a whole dataset takes minutes at mt80's size, so each file is checked once: a stamp
//! of its identity (device, inode, size, modification and status-change times: a copy that
//! keeps the modification time still changes the status-change time) is kept in `.tdmpc2-verified/` beside the files, or, where
//! the dataset's directory is read-only, in `$XDG_CACHE_HOME/tdmpc2/verified/` (default
//! `~/.cache`). A file changed since its stamp is checked again. Ranks that share a machine take
//! the stamp's lock, so that one of them reads the file and the others find the stamp.
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::zip_crc::{ReadBack, Unreadable};

/// What checking one file found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    /// Every entry read back with its CRC-32; the bytes read.
    Read(u64),
    /// A stamp says the file, as it is, was read back before.
    Stamped,
    /// Left part-way, as `stopped` asked: nothing is known of the file.
    Stopped,
}

/// Reads every entry of `path` to its end, checking its CRC-32 (leaving it part-way once
/// `stopped` says so); the bytes read. The error names the file and the entry, and what to do.
pub fn verify(path: &Path, stopped: &dyn Fn() -> bool) -> Result<Checked> {
    match crate::zip_crc::read_back(path, stopped) {
        Ok(ReadBack::Checked(bytes)) => Ok(Checked::Read(bytes)),
        Ok(ReadBack::Stopped) => Ok(Checked::Stopped),
        Ok(ReadBack::NoChecksums) => {
            errln!(
                "warning: dataset file {} records no CRC-32s (saved with torch's CRC-32s \
                 turned off): its bytes cannot be checked",
                path.display()
            );
            Ok(Checked::Read(0))
        }
        Err(Unreadable::Damaged(what)) => Err(Error::Config(format!(
            "dataset file {}: {what}; the file is not what was written (a damaged copy or an \
             interrupted download): download or copy it again",
            path.display()
        ))),
        Err(Unreadable::CannotOpen(e)) => Err(Error::Config(format!(
            "dataset file {}: {e}",
            path.display()
        ))),
        // Not known to be damaged: a failure a restart may get past.
        Err(Unreadable::ReadFailed(what, e)) => Err(Error::io(
            format!("read {what} of dataset file {}", path.display()),
            e,
        )),
    }
}

/// [`verify`], unless a stamp says this file (same size and modification time) was verified
/// before; a whole read leaves a stamp where one can be kept.
pub fn verify_once(path: &Path, stopped: &dyn Fn() -> bool) -> Result<Checked> {
    let Some(mut stamp) = Stamp::open(path, stopped) else {
        return verify(path, stopped);
    };
    if stamp.matches() {
        return Ok(Checked::Stamped);
    }
    let checked = verify(path, stopped)?;
    if let Checked::Read(_) = checked {
        stamp.record();
    }
    Ok(checked)
}

/// A file's stamp, locked while held.
struct Stamp {
    file: File,
    expected: String,
}

impl Stamp {
    /// The stamp of `path`, locked; None where none can be kept (nor read), or once `stopped`
    /// says so while another process holds it.
    fn open(path: &Path, stopped: &dyn Fn() -> bool) -> Option<Self> {
        let meta = std::fs::metadata(path).ok()?;
        let expected = format!(
            "{} {} {} {} {} {} {}\n",
            meta.dev(),
            meta.ino(),
            meta.len(),
            meta.mtime(),
            meta.mtime_nsec(),
            meta.ctime(),
            meta.ctime_nsec()
        );
        let file = stamp_paths(path).into_iter().find_map(|stamp| {
            std::fs::create_dir_all(stamp.parent()?).ok()?;
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(stamp)
                .ok()
        })?;
        // Another process may hold it for the minutes its reading takes: polled, so that a stop
        // is not held up by it.
        loop {
            // SAFETY: flock on a descriptor this File owns; released when the File closes.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                break;
            }
            let busy = std::io::Error::last_os_error().raw_os_error() == Some(libc::EWOULDBLOCK);
            if !busy || stopped() {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        Some(Self { file, expected })
    }

    fn matches(&mut self) -> bool {
        let mut text = String::new();
        self.file.read_to_string(&mut text).is_ok() && text == self.expected
    }

    /// Best effort: a stamp that cannot be written only means the next run reads the file again.
    fn record(&mut self) {
        let _ = self.file.set_len(0).and_then(|()| {
            self.file.seek(SeekFrom::Start(0))?;
            self.file.write_all(self.expected.as_bytes())
        });
    }
}

/// Where a file's stamp may be kept, in order: beside the dataset, then in the user's cache.
fn stamp_paths(path: &Path) -> Vec<PathBuf> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let mut paths = Vec::new();
    if let Some(dir) = path.parent() {
        paths.push(dir.join(".tdmpc2-verified").join(name.as_ref()));
    }
    if let Some(cache) = crate::cache::user_cache() {
        let absolute = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
        let key = crc32c::crc32c(absolute.to_string_lossy().as_bytes());
        paths.push(cache.join("verified").join(format!("{key:08x}-{name}")));
    }
    paths
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small archive as torch.save writes them: stored entries.
    fn archive(path: &Path) {
        let mut zip = zip::ZipWriter::new(File::create(path).unwrap());
        let stored = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored);
        zip.start_file("archive/data.pkl", stored).unwrap();
        zip.write_all(b"pickle").unwrap();
        zip.start_file("archive/data/0", stored).unwrap();
        zip.write_all(&[7u8; 4096]).unwrap();
        zip.finish().unwrap();
    }

    /// Flips bytes inside entry `archive/data/0`'s data, the headers intact.
    fn damage(path: &Path) {
        let mut bytes = std::fs::read(path).unwrap();
        let at = bytes.windows(4).position(|w| w == [7, 7, 7, 7]).unwrap() + 100;
        for b in &mut bytes[at..at + 64] {
            *b ^= 0xff;
        }
        std::fs::write(path, bytes).unwrap();
    }

    #[test]
    fn a_damaged_entry_is_named_and_an_intact_file_is_read_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chunk_0.pt");
        archive(&path);
        let go_on = || false;
        assert_eq!(verify(&path, &go_on).unwrap(), Checked::Read(6 + 4096));
        // A stop leaves the file part-way, unstamped.
        assert_eq!(verify_once(&path, &|| true).unwrap(), Checked::Stopped);
        let stamp = dir.path().join(".tdmpc2-verified/chunk_0.pt");
        assert_eq!(std::fs::read(&stamp).unwrap_or_default(), b"");
        assert_eq!(verify_once(&path, &go_on).unwrap(), Checked::Read(4102));
        assert!(stamp.is_file());
        assert_eq!(verify_once(&path, &go_on).unwrap(), Checked::Stamped);

        // Damaged, with its modification time put back (as `cp -p` keeps it): the status-change
        // time still tells the stamp the file changed.
        let modified = std::fs::metadata(&path).unwrap();
        damage(&path);
        let times = [
            libc::timespec {
                tv_sec: modified.atime(),
                tv_nsec: modified.atime_nsec(),
            },
            libc::timespec {
                tv_sec: modified.mtime(),
                tv_nsec: modified.mtime_nsec(),
            },
        ];
        let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: a valid path and two timespecs, as utimensat takes them.
        assert_eq!(
            unsafe { libc::utimensat(libc::AT_FDCWD, c_path.as_ptr(), times.as_ptr(), 0) },
            0
        );
        assert_eq!(std::fs::metadata(&path).unwrap().mtime(), modified.mtime());
        let e = verify(&path, &go_on).unwrap_err().to_string();
        assert!(
            e.contains("chunk_0.pt") && e.contains("archive/data/0") && e.contains("again"),
            "{e}"
        );
        let e = verify_once(&path, &go_on).unwrap_err().to_string();
        assert!(e.contains("CRC-32"), "{e}");
    }

    /// A stop is not held up by another process reading the same file (holding its stamp).
    #[test]
    fn a_stop_does_not_wait_for_a_stamp_another_process_holds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chunk_0.pt");
        archive(&path);
        let held = Stamp::open(&path, &|| false).expect("a stamp beside the file");
        assert_eq!(verify_once(&path, &|| true).unwrap(), Checked::Stopped);
        drop(held);
        assert_eq!(verify_once(&path, &|| false).unwrap(), Checked::Read(4102));
    }

    #[test]
    fn a_file_that_is_no_zip_archive_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chunk_0.pt");
        std::fs::write(&path, b"not an archive at all").unwrap();
        let e = verify(&path, &|| false).unwrap_err().to_string();
        assert!(e.contains("not a readable zip archive"), "{e}");
    }
}
