//! The doctor's `--world-size N` check: N ranks of this binary form a real process group here
//! and all-reduce one tensor.
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tch::{Device, Tensor};

use super::{Mark, Report};
use crate::ddp::{Backend, ProcessGroup, RankInfo};
use crate::error::{Error, Result};

/// How long the ranks of `--world-size` may take to form their group and all-reduce.
const GROUP_TIMEOUT: Duration = Duration::from_secs(120);

/// Starts `world_size` ranks of this binary (`doctor --rank-check`) and waits for their sums;
/// fewer than the `node_ranks` the run has are said.
pub(super) fn check_group(report: &mut Report, world_size: usize, node_ranks: usize) {
    let of = match world_size < node_ranks {
        true => format!(" (of this node's {node_ranks}: as many as its cores allow)"),
        false => String::new(),
    };
    match all_reduce_across(world_size) {
        Ok(line) => report.line(Mark::Pass, "process group", format!("{line}{of}")),
        Err(line) => report.line(Mark::Fail, "process group", format!("{line}{of}")),
    }
}

/// What the group check found, as the report's line.
fn all_reduce_across(world_size: usize) -> std::result::Result<String, String> {
    let gpus = tch::Cuda::device_count() as usize;
    let backend = if gpus >= world_size { "nccl" } else { "gloo" };
    let port = std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free local port: {e}"))?
        .port();
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate tdmpc2: {e}"))?;
    let start = Instant::now();
    let mut failed = Vec::new();
    for (rank, child) in start_ranks(&exe, world_size, port, backend)?
        .into_iter()
        .enumerate()
    {
        match wait_with_deadline(child, start + GROUP_TIMEOUT, "no sum") {
            Ok(out) if out.status.success() => {}
            Ok(out) => {
                let text = String::from_utf8_lossy(&out.stderr);
                let last = text.lines().last().unwrap_or("no output").to_string();
                failed.push(format!("rank {rank}: {last}"));
            }
            Err(e) => failed.push(format!("rank {rank}: {e}")),
        }
    }
    let expected = world_size * (world_size + 1) / 2;
    match failed.is_empty() {
        true => Ok(format!(
            "{world_size} ranks over {backend} all-reduced 1+..+{world_size} = {expected} in {:.1}s",
            start.elapsed().as_secs_f64()
        )),
        false => Err(format!(
            "{world_size} ranks over {backend} failed: {}; check that 127.0.0.1 ports are \
             usable and raise the timeout with dist_timeout in real runs",
            failed.join("; ")
        )),
    }
}

/// The ranks of the group check; when one cannot start, those already started are stopped.
fn start_ranks(
    exe: &std::path::Path,
    world_size: usize,
    port: u16,
    backend: &str,
) -> std::result::Result<Vec<Child>, String> {
    let mut children = Vec::with_capacity(world_size);
    for rank in 0..world_size {
        let mut command = Command::new(exe);
        crate::ddp::lifeline::ends_with_this_process(&mut command);
        let child = command
            .args(["doctor", "--rank-check"])
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", world_size.to_string())
            .env("LOCAL_WORLD_SIZE", world_size.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("TDMPC2_DOCTOR_BACKEND", backend)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        match child {
            Ok(child) => children.push(child),
            Err(e) => {
                for mut started in children {
                    let _ = started.kill();
                    let _ = started.wait();
                }
                return Err(format!("cannot start rank {rank}: {e}"));
            }
        }
    }
    Ok(children)
}

/// Waits for `child` until `deadline` (then kills it), its output read as it comes: a child
/// that writes more than a pipe holds (`NCCL_DEBUG=INFO`) would otherwise block, and be taken
/// for one that never answered.
pub(super) fn wait_with_deadline(
    mut child: Child,
    deadline: Instant,
    what: &str,
) -> std::io::Result<std::process::Output> {
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("{what} by the deadline"),
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Ok(std::process::Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

/// One rank of the group check: all-reduce rank + 1 and compare with 1 + 2 + .. + world_size.
pub fn rank_check() -> Result<()> {
    let var = |key: &str| {
        std::env::var(key).map_err(|_| Error::Config(format!("doctor --rank-check needs {key}")))
    };
    let number = |key: &str| -> Result<usize> {
        var(key)?
            .parse()
            .map_err(|_| Error::Config(format!("{key} is not a number")))
    };
    let info = RankInfo {
        rank: number("RANK")?,
        world_size: number("WORLD_SIZE")?,
        local_rank: number("LOCAL_RANK")?,
        local_world_size: number("LOCAL_WORLD_SIZE")?,
        master_addr: var("MASTER_ADDR")?,
        master_port: var("MASTER_PORT")?
            .parse()
            .map_err(|_| Error::Config("MASTER_PORT is not a port".into()))?,
        own_cpus: None,
    };
    let (backend, device) = match var("TDMPC2_DOCTOR_BACKEND")?.as_str() {
        "nccl" => (Backend::Nccl, Device::Cuda(info.local_rank)),
        _ => (Backend::Gloo, Device::Cpu),
    };
    let (rank, world_size) = (info.rank, info.world_size);
    let group = ProcessGroup::init(info, backend, device, GROUP_TIMEOUT, false, || false)?;
    let mut tensor = Tensor::from_slice(&[(rank + 1) as f32]).to_device(device);
    group.all_reduce_sum(&mut tensor)?;
    let sum = tensor.to_device(Device::Cpu).double_value(&[0]);
    let expected = (world_size * (world_size + 1) / 2) as f64;
    if sum != expected {
        return Err(Error::Other(format!(
            "rank {rank}: the all-reduce gave {sum}, expected {expected}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child that writes more than a pipe holds is read as it writes: it ends, with its
    /// output whole, instead of blocking until the deadline.
    #[test]
    fn a_child_that_writes_much_is_not_taken_for_a_silent_one() {
        let child = Command::new("sh")
            .args([
                "-c",
                "head -c 300000 /dev/zero; head -c 100000 /dev/zero >&2; exit 3",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out =
            wait_with_deadline(child, Instant::now() + Duration::from_secs(60), "no end").unwrap();
        assert_eq!(out.status.code(), Some(3));
        assert_eq!((out.stdout.len(), out.stderr.len()), (300_000, 100_000));
        let silent = Command::new("sleep")
            .arg("60")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let e = wait_with_deadline(silent, Instant::now(), "no end").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
    }
}
