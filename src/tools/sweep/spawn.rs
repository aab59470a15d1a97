//! The jobs' processes: each slot of parallel jobs runs the next job with its own threads,
//! GPUs and port, its output forwarded behind `[job i]`, and passes a stop on.
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::grid::Job;
use super::suspend::StoppedWithTheSweep;
use super::Status;
use crate::config::Config;
use crate::error::{Error, Result, STOPPED_EXIT_CODE};
use crate::terminal::{is_second_request, monotonic_ms};

/// How long a finished job's output may still come.
const DRAIN: Duration = Duration::from_secs(5);

/// When the first stop request came (monotonic ms; 0: none): it stops the sweep (each running
/// job is asked once to stop and checkpoints).
static FIRST_REQUEST_MS: AtomicI64 = AtomicI64::new(0);
/// A second request came (Ctrl-C again, not the first passed on twice): it kills the jobs.
static SECOND_REQUEST: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(signal: libc::c_int) {
    let now = monotonic_ms();
    let first = FIRST_REQUEST_MS.compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst);
    if first.is_err_and(|first| is_second_request(signal, first, now)) {
        SECOND_REQUEST.store(true, Ordering::SeqCst);
    }
}

pub(super) fn stopping() -> bool {
    FIRST_REQUEST_MS.load(Ordering::SeqCst) > 0
}

/// From here on, Ctrl-C, SIGTERM and a hangup (unless `nohup` ignores it) stop the sweep
/// instead of ending this process.
pub(super) fn catch_stop_signals() {
    let hangup = !crate::terminal::hangup_ignored();
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        if hangup {
            libc::signal(libc::SIGHUP, on_signal as *const () as libc::sighandler_t);
        }
    }
}

/// Runs the jobs, `spawner.parallel` at a time, each slot taking the next job until none is
/// left or a stop was asked for; the status of each.
pub(super) fn run_all(spawner: &Spawner, jobs: &[Job], configs: &[Config]) -> Vec<Status> {
    let statuses: Mutex<Vec<Status>> = Mutex::new(vec![Status::NotStarted; jobs.len()]);
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for slot in 0..spawner.parallel.min(jobs.len()) {
            let (next, statuses) = (&next, &statuses);
            scope.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= jobs.len() || stopping() {
                    return;
                }
                let status = run_job(spawner.command(&jobs[i], &configs[i], slot), i);
                if let Ok(mut all) = statuses.lock() {
                    all[i] = status;
                }
            });
        }
    });
    statuses.into_inner().unwrap_or_default()
}

/// How the jobs' processes are started.
pub(super) struct Spawner {
    pub(super) exe: PathBuf,
    /// --config-name and --config-path, as given to the sweep.
    pub(super) flags: Vec<String>,
    pub(super) cores: usize,
    pub(super) parallel: usize,
    /// The GPUs of each slot of parallel jobs, when there are enough to go round.
    pub(super) gpus: Option<Vec<Vec<String>>>,
}

impl Spawner {
    pub(super) fn command(&self, job: &Job, config: &Config, slot: usize) -> Command {
        let mut command = Command::new(&self.exe);
        command.arg("train").args(&self.flags).args(&job.overrides);
        let ranks = config.world_size.max(1);
        // Multi-rank jobs side by side would all rendezvous on one port (the default or the
        // one given): each takes its own, counted up (down near the top of the range).
        if self.parallel > 1 && ranks > 1 {
            let port = usize::from(config.master_port);
            let port = match port + job.index {
                up if up <= usize::from(u16::MAX) => up,
                _ => port.saturating_sub(job.index),
            };
            command.arg(format!("master_port={port}"));
        }
        // Unless the job's config sets them (on the command line or in its config file).
        if config.num_threads.is_none() {
            let threads = (self.cores / (self.parallel * ranks)).max(1);
            command.arg(format!("num_threads={threads}"));
        }
        if let Some(gpus) = &self.gpus {
            command.env("CUDA_VISIBLE_DEVICES", gpus[slot].join(","));
        }
        command
    }
}

/// The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them.
pub(super) fn visible_gpus() -> Vec<String> {
    match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(list) => list
            .split(',')
            .map(|g| g.trim().to_string())
            .filter(|g| !g.is_empty())
            .collect(),
        Err(_) => (0..tch::Cuda::device_count())
            .map(|g| g.to_string())
            .collect(),
    }
}

/// Splits the GPUs evenly between `parallel` job slots, when each slot can have one.
pub(super) fn gpu_slots(parallel: usize, gpus: Vec<String>) -> Option<Vec<Vec<String>>> {
    if parallel < 2 || gpus.len() < parallel {
        return None;
    }
    let per_slot = gpus.len() / parallel;
    Some(
        gpus.chunks(per_slot)
            .take(parallel)
            .map(<[String]>::to_vec)
            .collect(),
    )
}

/// Each job sees `per_slot` GPUs (all of them, or its share with `--jobs`): one whose ranks on a
/// node outnumber them would be refused when it starts (NCCL gives each rank a GPU of its
/// own), every such job failing in turn.
pub(super) fn refuse_jobs_beyond_their_gpus(
    jobs: &[Job],
    configs: &[Config],
    per_slot: usize,
    parallel: usize,
) -> Result<()> {
    for (job, config) in jobs.iter().zip(configs) {
        let ranks_here = config.world_size / config.nnodes.max(1);
        let share_gpus = config.dist_backend == "gloo";
        if !crate::device::ranks_fit(&config.device, ranks_here, per_slot, share_gpus) {
            return Err(Error::Config(format!(
                "--multirun job {} ({}): its {ranks_here} ranks a node need a GPU each, but \
                 {}: lower its world_size{}, or dist_backend=gloo to let ranks share GPUs; no \
                 job was started",
                job.index,
                job.describe(),
                match parallel {
                    1 => format!("{per_slot} GPU(s) are visible"),
                    _ => format!("--jobs {parallel} leaves each job {per_slot} GPU(s)"),
                },
                match parallel {
                    1 => "",
                    _ => ", run fewer jobs at once",
                }
            )));
        }
    }
    Ok(())
}

/// Runs one job to its end, its output forwarded line by line behind `[job i]`; on a stop
/// request it passes SIGTERM on (the job checkpoints and exits), and on a second it kills the
/// job's processes. A job runs in a process group of its own, so that a terminal's Ctrl-C
/// reaches the sweep alone and the job is asked once (a launcher takes a second request as
/// "kill the ranks now").
pub(super) fn run_job(mut command: Command, index: usize) -> Status {
    use std::os::unix::process::CommandExt;
    command
        .process_group(0)
        .env(
            crate::ddp::lifeline::LAUNCHER_PID_ENV,
            std::process::id().to_string(),
        )
        // A job is no rank of ours to pin: a list the sweep inherited is not its.
        .env_remove(crate::ddp::affinity::CPUS_ENV)
        // Nor a rank of another launcher (a pod's variables, which it would take as its own).
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env_remove("LOCAL_RANK")
        .env_remove("LOCAL_WORLD_SIZE")
        // Nor a restart of any launcher's job: it starts as its own job.
        .env_remove(crate::ddp::launcher::RESTART_COUNT_ENV)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => return Status::Failed(format!("could not start: {e}")),
    };
    let prefix = format!("[job {index}] ");
    let forwards = [
        child
            .stdout
            .take()
            .map(|out| forward(out, prefix.clone(), false)),
        child
            .stderr
            .take()
            .map(|err| forward(err, prefix.clone(), true)),
    ];
    let stopped_with_the_sweep = StoppedWithTheSweep::register(child.id() as libc::pid_t);
    let (mut signalled, mut killed) = (false, false);
    let exit = loop {
        match child.try_wait() {
            Ok(Some(exit)) => break Ok(exit),
            Ok(None) => {}
            Err(e) => break Err(e),
        }
        if stopping() && !signalled {
            // SAFETY: kill with a child's pid and SIGTERM has no other effect.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            signalled = true;
        }
        if SECOND_REQUEST.load(Ordering::SeqCst) && !killed {
            // SAFETY: kill of the job's process group (its pid: it leads the group it made).
            unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
            killed = true;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // Its group is gone: not one to stop with the sweep while its output drains.
    drop(stopped_with_the_sweep);
    // The job's output to its end, but not forever: a process it left (W&B's service, in a
    // session of its own) may hold its pipes open a while.
    let drained = Instant::now();
    let forwards: Vec<_> = forwards.into_iter().flatten().collect();
    while forwards.iter().any(|f| !f.is_finished()) && drained.elapsed() < DRAIN {
        std::thread::sleep(Duration::from_millis(50));
    }
    match exit {
        Ok(exit) if exit.success() => Status::Ok,
        Ok(exit) if signalled || exit.code() == Some(STOPPED_EXIT_CODE) => Status::Stopped,
        Ok(exit) => match exit.code() {
            Some(code) => Status::Failed(format!("exit {code}")),
            None => Status::Failed("killed by a signal".into()),
        },
        Err(e) => Status::Failed(format!("lost: {e}")),
    }
}

fn forward(
    stream: impl Read + Send + 'static,
    prefix: String,
    to_stderr: bool,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        let mut line = Vec::new();
        while reader.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
            let text = String::from_utf8_lossy(&line);
            let text = text.trim_end_matches(['\n', '\r']);
            // A progress bar's carriage returns: keep the last state of the line.
            let text = text.rsplit('\r').next().unwrap_or_default();
            if to_stderr {
                let _ = writeln!(std::io::stderr().lock(), "{prefix}{text}");
            } else {
                let _ = writeln!(std::io::stdout().lock(), "{prefix}{text}");
            }
            line.clear();
        }
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::tools::sweep::grid::expand;

    #[test]
    fn parallel_jobs_share_the_gpus_out() {
        let gpus = |n: usize| (0..n).map(|g| g.to_string()).collect::<Vec<_>>();
        assert_eq!(gpu_slots(1, gpus(8)), None);
        assert_eq!(gpu_slots(4, gpus(2)), None);
        assert_eq!(
            gpu_slots(2, gpus(5)),
            Some(vec![
                vec!["0".into(), "1".into()],
                vec!["2".into(), "3".into()]
            ])
        );
    }

    #[test]
    fn a_job_with_more_ranks_a_node_than_its_gpus_is_refused() {
        let jobs = expand(&["world_size=1,2".to_string()], Path::new("/tmp/sweep")).unwrap();
        let config = |world_size: usize, backend: &str| {
            let mut config = Config::for_dims(Some(1), 3, 1).unwrap();
            config.world_size = world_size;
            config.dist_backend = backend.into();
            config
        };
        let configs = [config(1, "auto"), config(2, "auto")];
        let e = refuse_jobs_beyond_their_gpus(&jobs, &configs, 1, 2)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("job 1 (world_size=2): its 2 ranks a node need a GPU each")
                && e.contains("--jobs 2 leaves each job 1 GPU(s)"),
            "{e}"
        );
        assert!(refuse_jobs_beyond_their_gpus(&jobs, &configs, 2, 2).is_ok());
        let e = refuse_jobs_beyond_their_gpus(&jobs, &configs, 1, 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("but 1 GPU(s) are visible"), "{e}");
        let gloo = [config(1, "gloo"), config(2, "gloo")];
        assert!(refuse_jobs_beyond_their_gpus(&jobs, &gloo, 1, 2).is_ok());
    }
}
