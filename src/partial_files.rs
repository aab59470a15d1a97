//! Files being written to a temporary name before a rename puts them in place (an exported or
//! imported model, a dataset file, a video): a process that a signal ends meanwhile
//! removes them as it ends, so that a Ctrl-C'd `export` leaves no hidden part of a file of
//! gigabytes behind. Only SIGKILL (and a power cut) leaves one. A watched folder (made for a
//! file to come) is removed while it is empty.
use std::ffi::{c_char, CString};
use std::path::Path;
use std::sync::atomic::{AtomicPtr, Ordering};

/// The files of this process being written.
static WATCHED: Watched = Watched::new();

/// Watches `path`, a temporary file about to be written, until the guard drops (after its
/// rename, or its removal on an error). With every slot taken the file is written unwatched.
pub fn watch(path: &Path) -> Pending {
    WATCHED.watch(path)
}

/// Removes every watched file. Async-signal-safe (atomic loads and `unlink`): for the
/// handlers of the signals that end the process.
pub fn remove_all() {
    WATCHED.remove_all();
}

/// Files written at once: a few (one per thread that writes one).
const SLOTS: usize = 16;

/// Each slot: a path (a NUL-terminated string, never freed: a signal handler on another thread
/// may be reading it), or null.
struct Watched([AtomicPtr<c_char>; SLOTS]);

#[must_use = "the file is only watched while its guard lives"]
pub struct Pending {
    watched: &'static Watched,
    slot: Option<usize>,
}

impl Watched {
    const fn new() -> Self {
        Self([const { AtomicPtr::new(std::ptr::null_mut()) }; SLOTS])
    }

    fn watch(&'static self, path: &Path) -> Pending {
        use std::os::unix::ffi::OsStrExt;
        let unwatched = Pending {
            watched: self,
            slot: None,
        };
        let Ok(text) = CString::new(path.as_os_str().as_bytes()) else {
            return unwatched;
        };
        let raw = text.into_raw();
        for (slot, pending) in self.0.iter().enumerate() {
            let null = std::ptr::null_mut();
            if pending
                .compare_exchange(null, raw, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                return Pending {
                    slot: Some(slot),
                    ..unwatched
                };
            }
        }
        // SAFETY: `raw` came from `into_raw` above and was never shared.
        drop(unsafe { CString::from_raw(raw) });
        unwatched
    }

    fn remove_all(&self) {
        // Files first, then the folders (rmdir removes one only while empty): a folder made
        // for a file is watched before it.
        for remove in [libc::unlink, libc::rmdir] {
            for pending in &self.0 {
                let path = pending.load(Ordering::SeqCst);
                if !path.is_null() {
                    // SAFETY: a non-null slot holds a NUL-terminated string that is never freed.
                    unsafe { remove(path) };
                }
            }
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            // The path's bytes stay allocated (a few bytes a file written): a handler may
            // hold the pointer.
            self.watched.0[slot].store(std::ptr::null_mut(), Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Its own slots: the process's are those of other tests' checkpoints.
    static HERE: Watched = Watched::new();

    #[test]
    fn a_watched_file_is_removed_until_its_guard_drops() {
        let dir = tempfile::tempdir().unwrap();
        let (part, whole) = (dir.path().join("a.partial"), dir.path().join("b.partial"));
        std::fs::write(&part, "part").unwrap();
        let guard = HERE.watch(&part);
        HERE.remove_all();
        assert!(!part.exists());
        drop(guard);
        std::fs::write(&whole, "whole").unwrap();
        drop(HERE.watch(&whole));
        HERE.remove_all();
        assert!(whole.exists(), "renamed into place: no longer watched");
        let (empty, full) = (dir.path().join("empty"), dir.path().join("full"));
        std::fs::create_dir(&empty).unwrap();
        std::fs::create_dir(&full).unwrap();
        std::fs::write(full.join("video.gif"), "gif").unwrap();
        let guards = [HERE.watch(&empty), HERE.watch(&full)];
        HERE.remove_all();
        assert!(!empty.exists() && full.join("video.gif").exists());
        drop(guards);
        let many: Vec<Pending> = (0..SLOTS + 2).map(|_| HERE.watch(&part)).collect();
        assert_eq!(many.iter().filter(|p| p.slot.is_some()).count(), SLOTS);
    }
}
