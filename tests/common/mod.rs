//! Helpers shared by the integration tests.
#![allow(dead_code)]
use std::path::PathBuf;

/// A small but complete configuration of the native Pendulum-v1: every mechanism runs, in
/// seconds (no `num_threads`: each rank takes cores / ranks unless a test sets it).
pub const TINY: &[&str] = &[
    "task=Pendulum-v1",
    "model_size=1",
    "batch_size=16",
    "num_samples=32",
    "num_elites=4",
    "num_pi_trajs=2",
    "iterations=1",
    "seed_steps=200",
    "eval_episodes=2",
    "enable_tensorboard=false",
];

/// The tdmpc2 binary: `TDMPC2_BIN` when set (test binaries built here and run on another
/// machine, e.g. a GPU machine without a Rust toolchain), else the one cargo built.
pub fn tdmpc2_bin() -> PathBuf {
    std::env::var_os("TDMPC2_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_tdmpc2")))
}

/// A spawned process killed (with its ranks, which die with their launcher) when dropped
/// still running: a test that fails half-way must not leave a run of a million steps on CI's
/// cores.
pub struct Reaped(Option<std::process::Child>);

impl Reaped {
    pub fn spawn(command: &mut std::process::Command) -> Reaped {
        Reaped(Some(command.spawn().expect("the command starts")))
    }

    pub fn wait_with_output(mut self) -> std::io::Result<std::process::Output> {
        self.0
            .take()
            .expect("not yet waited for")
            .wait_with_output()
    }
}

impl std::ops::Deref for Reaped {
    type Target = std::process::Child;
    fn deref(&self) -> &std::process::Child {
        self.0.as_ref().expect("not yet waited for")
    }
}

impl std::ops::DerefMut for Reaped {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        self.0.as_mut().expect("not yet waited for")
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// A TCP port that was free a moment ago (for `master_port`), below the ports the kernel picks
/// itself (32768 and up by default: gloo's and the stores' own listeners, outgoing
/// connections), so that nothing started meanwhile takes it; the tests of a binary, which run
/// at once, get ports 16 apart (a sweep's jobs take master_port + their index).
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOWEST: u32 = 16_384;
    const APART: u32 = 16;
    const SLOTS: u32 = (32_768 - LOWEST) / APART;
    static TAKEN: AtomicU32 = AtomicU32::new(0);
    let first = std::process::id() % SLOTS;
    (0..SLOTS)
        .map(|_| LOWEST + (first + TAKEN.fetch_add(1, Ordering::SeqCst)) % SLOTS * APART)
        .map(|port| port as u16)
        .find(|&port| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok())
        .expect("a free local port")
}

/// Says what a passing test could not check on this machine, in a line that stays visible:
/// cargo hides a passing test's output, so the line also goes to the file `TDMPC2_NOT_CHECKED`
/// names (scripts/test.sh sets it and prints the lines after the suite).
pub fn not_checked(what: &str) {
    let line = format!("NOT CHECKED HERE: {what}");
    eprintln!("{line}");
    if let Some(path) = std::env::var_os("TDMPC2_NOT_CHECKED") {
        use std::io::Write;
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut file| writeln!(file, "{line}"));
        if let Err(e) = appended {
            eprintln!(
                "cannot add to {}: {e}",
                std::path::Path::new(&path).display()
            );
        }
    }
}

/// Every tensor of a safetensors file, sorted by name.
pub fn tensors(file: &std::path::Path) -> Vec<(String, tch::Tensor)> {
    let mut t = tch::Tensor::read_safetensors(file)
        .unwrap_or_else(|e| panic!("{} is a complete safetensors file: {e}", file.display()));
    t.sort_by(|a, b| a.0.cmp(&b.0));
    t
}

/// The checkpoint a run writes at global step `step`.
pub fn checkpoint(run_dir: &std::path::Path, step: u64) -> std::path::PathBuf {
    run_dir.join("checkpoints").join(format!("step_{step:012}"))
}

/// Two safetensors files hold the same tensors, bit for bit.
pub fn assert_same_tensors(a: &std::path::Path, b: &std::path::Path) {
    let (a, b) = (tensors(a), tensors(b));
    assert_eq!(a.len(), b.len());
    for ((name_a, ta), (name_b, tb)) in a.iter().zip(&b) {
        assert_eq!(name_a, name_b);
        assert!(ta.equal(tb), "{name_a} differs");
    }
}

/// The pids of `parent`'s children.
pub fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            let ppid: u32 = stat
                .rsplit(')')
                .next()?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            (ppid == parent).then_some(pid)
        })
        .collect()
}

/// A GIF's frame count, width and height, as Pillow reads them.
pub fn gif_frames(path: &std::path::Path) -> (usize, usize, usize) {
    use pyo3::prelude::*;
    embedded_python::attach_exclusive(|py| -> embedded_python::Result<(usize, usize, usize)> {
        let image = py
            .import("PIL.Image")?
            .call_method1("open", (path.to_string_lossy(),))?;
        let (width, height): (usize, usize) = image.getattr("size")?.extract()?;
        Ok((image.getattr("n_frames")?.extract()?, width, height))
    })
    .unwrap_or_else(|e| panic!("{} is a GIF: {e}", path.display()))
}

/// The records of a run's `metrics.jsonl`.
pub fn metrics(run_dir: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON record"))
        .collect()
}

/// Runs `command` to its end and returns its output; a failure shows its stderr.
pub fn succeeds(command: &mut std::process::Command) -> std::process::Output {
    let out = command.output().expect("the command starts");
    assert!(
        out.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Overwrites 4 KB in the middle of `path` with other bytes: the file keeps its size, and a
/// safetensors file still loads (its header is at the start), yet its data is damaged.
pub fn damage_middle(path: &std::path::Path) {
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let len = file.metadata().unwrap().len();
    file.seek(SeekFrom::Start(len / 2)).unwrap();
    let mut block = vec![0u8; 4096];
    file.read_exact(&mut block).unwrap();
    for b in &mut block {
        *b = b.wrapping_mul(31).wrapping_add(7);
    }
    file.seek(SeekFrom::Start(len / 2)).unwrap();
    file.write_all(&block).unwrap();
}
