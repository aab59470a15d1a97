//! One run per run directory. Rank 0 (of any launch path) holds an exclusive flock(2) on
//! `<run_dir>/.lock`, a file naming its pid and host. The kernel drops the lock when the process
//! ends, however it ends, so a lock file left by a killed run is stale by construction: the
//! next run takes it over with a warning.
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

const LOCK: &str = ".lock";

/// Held while the run lives; removes its file when dropped, and the folders taking it made
/// where they are still empty (a run refused before it wrote anything leaves nothing).
#[derive(Debug)]
pub struct RunLock {
    path: PathBuf,
    /// The folders `acquire` made, the deepest first.
    made: Vec<PathBuf>,
    // Closing the file releases the lock.
    _file: File,
}

/// Who holds (or held) a lock: the contents of the lock file.
#[derive(Debug, Clone, PartialEq)]
struct Owner {
    pid: u32,
    host: String,
}

impl Owner {
    fn me() -> Owner {
        Owner {
            pid: std::process::id(),
            host: hostname(),
        }
    }

    fn parse(text: &str) -> Option<Owner> {
        let mut pid = None;
        let mut host = None;
        for line in text.lines() {
            match line.split_once('=') {
                Some(("pid", v)) => pid = v.trim().parse().ok(),
                Some(("host", v)) => host = Some(v.trim().to_owned()),
                _ => {}
            }
        }
        Some(Owner {
            pid: pid?,
            host: host?,
        })
    }

    fn describe(&self) -> String {
        format!("pid {} on {}", self.pid, self.host)
    }

    /// Whether the owner is a live process of this host (`None`: on another host, unknown).
    fn alive(&self) -> Option<bool> {
        if self.host != hostname() {
            return None;
        }
        let Ok(pid) = libc::pid_t::try_from(self.pid) else {
            return Some(false);
        };
        Some(crate::ddp::lifeline::is_alive(pid))
    }
}

impl RunLock {
    /// Takes `dir`'s lock (creating `dir`), or says which run holds it.
    pub fn acquire(dir: &Path) -> Result<RunLock> {
        let mut made = make_folders(dir).map_err(|e| {
            // The nearest path of it that exists: a file there is why (not "File exists").
            let nearest = dir.ancestors().find(|path| path.exists());
            let why = match nearest.filter(|path| !path.is_dir()) {
                Some(file) if file == dir => "a file, not a directory".to_string(),
                Some(file) => format!("{} is a file, not a directory", file.display()),
                None => format!("cannot create it ({e})"),
            };
            Error::Config(format!("run_dir={}: {why}", dir.display()))
        })?;
        let path = dir.join(LOCK);
        let io = |what: &str, e| Error::io(format!("{what} {}", path.display()), e);
        // A run ending between our open and our lock removes the file we opened: try again.
        for _ in 0..10 {
            let opened = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path);
            let mut file = match opened {
                // A run refused there at the same moment removed the folder it made.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    made.extend(make_folders(dir).map_err(|e| io("create the folder of", e))?);
                    made.sort_by_key(|folder| std::cmp::Reverse(folder.components().count()));
                    made.dedup();
                    continue;
                }
                opened => opened.map_err(|e| io("open", e))?,
            };
            let previous = read_owner(&mut file);
            // SAFETY: flock on a descriptor this function owns.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if rc != 0 {
                let err = std::io::Error::last_os_error();
                match err.raw_os_error() {
                    Some(libc::EWOULDBLOCK) => return Err(in_use(dir, &path, previous)),
                    // A file system without flock: fall back on the recorded owner alone.
                    Some(libc::ENOLCK) | Some(libc::EOPNOTSUPP) => {
                        if let Some(owner) = &previous {
                            if owner.alive() != Some(false) {
                                return Err(in_use(dir, &path, previous));
                            }
                        }
                    }
                    _ => return Err(io("lock", err)),
                }
            }
            let current = std::fs::metadata(&path).map(|m| m.ino()).ok();
            let ours = file.metadata().map_err(|e| io("stat", e))?.ino();
            if current != Some(ours) {
                continue;
            }
            if let Some(owner) = previous.filter(|o| *o != Owner::me()) {
                errln!(
                    "warning: taking over the stale lock {} of {}, a run that ended without \
                     removing it",
                    path.display(),
                    owner.describe()
                );
            }
            let me = Owner::me();
            file.set_len(0).map_err(|e| io("write", e))?;
            file.rewind().map_err(|e| io("write", e))?;
            writeln!(file, "pid={}\nhost={}", me.pid, me.host).map_err(|e| io("write", e))?;
            file.sync_all().map_err(|e| io("write", e))?;
            return Ok(RunLock {
                path,
                made,
                _file: file,
            });
        }
        Err(Error::Other(format!(
            "could not take the lock {}: it keeps being replaced",
            path.display()
        )))
    }
}

/// Makes `dir` and the folders above it that are missing, one at a time from the top; returns
/// those this call made, the deepest first (by what it made, not by what is missing: a path
/// through `..` names folders that exist by other names). A folder that another run starting
/// beside this one removed again is made again (a few times).
fn make_folders(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut parts: Vec<&Path> = dir
        .ancestors()
        .filter(|folder| !folder.as_os_str().is_empty())
        .collect();
    parts.reverse();
    let (mut made, mut tries, mut next) = (Vec::new(), 0, 0);
    while let Some(folder) = parts.get(next) {
        match std::fs::create_dir(folder) {
            Ok(()) => made.push(folder.to_path_buf()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && folder.is_dir() => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && tries < 10 => {
                tries += 1;
                next = 0;
                continue;
            }
            Err(e) => return Err(e),
        }
        next += 1;
    }
    made.reverse();
    Ok(made)
}

/// Refuses at once when a run holds `dir`'s lock, without taking it: the built-in launcher asks
/// before it starts ranks, so that a refused rank 0 does not leave the others waiting.
pub fn check_free(dir: &Path) -> Result<()> {
    let path = dir.join(LOCK);
    let Ok(mut file) = File::open(&path) else {
        return Ok(());
    };
    // SAFETY: flock on a descriptor this function owns; closing it drops the shared lock.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
    let held = rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EWOULDBLOCK);
    if held {
        return Err(in_use(dir, &path, read_owner(&mut file)));
    }
    Ok(())
}

impl Drop for RunLock {
    fn drop(&mut self) {
        // Removed while still held, so no other run can lock the old file after us.
        let _ = std::fs::remove_file(&self.path);
        // Only an empty folder can be removed: what a run wrote stays.
        for folder in &self.made {
            if std::fs::remove_dir(folder).is_err() {
                break;
            }
        }
    }
}

fn read_owner(file: &mut File) -> Option<Owner> {
    let mut text = String::new();
    file.read_to_string(&mut text).ok()?;
    Owner::parse(&text)
}

fn in_use(dir: &Path, path: &Path, owner: Option<Owner>) -> Error {
    let who = match &owner {
        Some(owner) => owner.describe(),
        None => "a process that has not yet written its name".into(),
    };
    let mut message = format!(
        "run_dir={} is in use by another run ({who}); wait for it to end or stop it, or give \
         this run another run_dir (or exp_name or seed)",
        dir.display()
    );
    if owner.and_then(|o| o.alive()) == Some(false) {
        message.push_str(&format!(
            "; that pid is gone but a process it started still holds {} (`fuser {}` names it)",
            path.display(),
            path.display()
        ));
    }
    Error::Config(message)
}

pub(super) fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown-host".into();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_dir_that_is_a_file_is_named_so() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("notes.txt");
        std::fs::write(&file, "x").unwrap();
        let Err(e) = RunLock::acquire(&file) else {
            panic!("a file taken as a run directory");
        };
        assert!(
            e.to_string().contains("notes.txt: a file, not a directory"),
            "{e}"
        );
        let Err(e) = RunLock::acquire(&file.join("run").join("a")) else {
            panic!("a run directory made under a file");
        };
        assert!(
            e.to_string()
                .contains(&format!("{} is a file, not a directory", file.display())),
            "{e}"
        );
    }

    #[test]
    fn the_folders_a_lock_made_go_with_it_unless_written_in() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("a").join("b");
        drop(RunLock::acquire(&run).unwrap());
        assert!(
            !dir.path().join("a").exists(),
            "a refused run left its folders"
        );
        let lock = RunLock::acquire(&run).unwrap();
        std::fs::write(run.join("config.yaml"), "task: x\n").unwrap();
        drop(lock);
        assert!(run.join("config.yaml").is_file());
        drop(RunLock::acquire(&run).unwrap());
        assert!(
            run.join("config.yaml").is_file(),
            "a folder it found was removed"
        );
        // Through `..`: a folder that was there stays, the new one goes.
        let kept = dir.path().join("kept");
        std::fs::create_dir(&kept).unwrap();
        drop(RunLock::acquire(&dir.path().join("new/../kept/x")).unwrap());
        assert!(kept.is_dir() && !dir.path().join("new").exists());
    }

    #[test]
    fn a_held_lock_refuses_and_a_released_one_is_taken() {
        let dir = tempfile::tempdir().unwrap();
        let first = RunLock::acquire(dir.path()).unwrap();
        let text = std::fs::read_to_string(dir.path().join(LOCK)).unwrap();
        assert_eq!(Owner::parse(&text), Some(Owner::me()));
        // flock locks belong to the open file: a second open in this process is refused too.
        let err = RunLock::acquire(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains(&format!("run_dir={} is in use", dir.path().display()))
                && err.contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        let err = check_free(dir.path()).unwrap_err().to_string();
        assert!(err.contains("is in use"), "{err}");
        drop(first);
        assert!(!dir.path().join(LOCK).exists(), "removed on release");
        check_free(dir.path()).unwrap();
        let _again = RunLock::acquire(dir.path()).unwrap();
    }

    #[test]
    fn owners_parse_and_dead_ones_are_seen() {
        let owner = Owner::parse("pid=12\nhost=node7\n").unwrap();
        assert_eq!(owner.host, "node7");
        assert_eq!(Owner::parse("pid=x\nhost=a"), None);
        assert_eq!(Owner::me().alive(), Some(true));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = Owner {
            pid: child.id(),
            host: hostname(),
        };
        child.wait().unwrap();
        assert_eq!(dead.alive(), Some(false));
    }
}
