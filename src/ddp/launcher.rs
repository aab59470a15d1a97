//! The built-in launcher: `tdmpc2 train world_size=N` starts this node's ranks as child
//! processes of the same binary (with torchrun's environment variables) and supervises them.
//!
//! - Output: rank 0 speaks as is; other ranks' lines are prefixed with `[rank r]`.
//! - A rank that fails makes the launcher stop the others (SIGTERM, then SIGKILL after a grace
//!   period) and exit non-zero, naming the rank and its last error lines.
//! - Ctrl-C or SIGTERM is passed to every rank (rank 0 writes a checkpoint), then the launcher
//!   exits non-zero; a second Ctrl-C kills the ranks.
//! - With `max_restarts=K`, a failed job is started again, up to K times: every rank resumes
//!   from the run directory's last checkpoint (as under torchrun, the ranks see
//!   `TORCHELASTIC_RESTART_COUNT`). A stop that was asked for is never restarted, nor is a rank
//!   that refused its input (exit 2).
use std::collections::VecDeque;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Command;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::{affinity, heartbeat, rendezvous};
use crate::error::{Error, Result, BAD_INPUT_EXIT_CODE, STOPPED_EXIT_CODE};

/// How long ranks get to end once one failed, before they are killed.
const GRACE: Duration = Duration::from_secs(20);
/// How long ranks get to end after a stop (Ctrl-C, SIGTERM, a rank that stopped as asked):
/// rank 0 writes the checkpoint then, a large one with `save_buffer` too. A second Ctrl-C kills
/// at once.
const STOP_GRACE: Duration = Duration::from_secs(120);
/// A stop signal this long after the first is a second request (kill now), not the same one
/// delivered twice.
const SECOND_REQUEST_AFTER: Duration = Duration::from_secs(1);
/// Error lines kept per rank for the failure report.
const TAIL_LINES: usize = 12;

pub struct LaunchPlan {
    /// Ranks of the whole job and of this node.
    pub world_size: usize,
    pub nnodes: usize,
    pub node_rank: usize,
    pub master_addr: String,
    pub master_port: u16,
    /// Whether each local rank gets its own slice of the CPUs (see `affinity`).
    pub cpu_affinity: bool,
    /// How many times a failed job is started again.
    pub max_restarts: usize,
    /// With several nodes: silence after which a peer node counts as gone (`peer_timeout`),
    /// and how long the job may take to form (`dist_timeout`).
    pub peer_timeout: Duration,
    pub dist_timeout: Duration,
    /// What every node's launcher must agree on (world size, nodes, task, seed, steps): a
    /// launcher started with other settings, or one of another job, is refused.
    pub job: String,
    /// The worker's command line (the same subcommand and arguments as the launcher's).
    pub program: std::path::PathBuf,
    pub args: Vec<std::ffi::OsString>,
}

impl LaunchPlan {
    pub fn local_ranks(&self) -> usize {
        self.world_size / self.nnodes
    }

    fn global_rank(&self, local_rank: usize) -> usize {
        self.node_rank * self.local_ranks() + local_rank
    }
}

enum Event {
    Line {
        rank: usize,
        text: String,
        is_err: bool,
    },
    Exit {
        rank: usize,
        status: std::io::Result<std::process::ExitStatus>,
    },
    PeerLost(heartbeat::PeerLost),
    /// A rank's stdout or stderr reached its end.
    StreamEnded,
}

/// How long the launcher reads what the ranks wrote last, once they have all exited.
const DRAIN: Duration = Duration::from_secs(5);

/// How long this node's ranks get to stop once a peer node is gone (they are likely stuck in a
/// collective with it, so a checkpoint is not to be expected).
const PEER_GRACE: Duration = Duration::from_secs(5);
/// How soon after a node's ranks end every other node has said how its own ended: a beat to
/// notice, then its ranks' stop within PEER_GRACE.
const ENDED_WITHIN: Duration = Duration::from_secs(8);
/// How long node 0 keeps the store up after every node has ended, so that they read it.
const READ_GRACE: Duration = Duration::from_secs(2);

/// Sets its flag when dropped: ends the heartbeat of a finished attempt, however it ended.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Runs the plan to completion; Ok only when every local rank exited 0.
pub fn launch(plan: &LaunchPlan) -> Result<()> {
    if !plan.world_size.is_multiple_of(plan.nnodes) {
        return Err(Error::Config(format!(
            "world_size={} must be a multiple of nnodes={} (world_size counts the ranks of all nodes)",
            plan.world_size, plan.nnodes
        )));
    }
    if plan.node_rank == 0 {
        rendezvous::check_port_free(&plan.master_addr, plan.master_port)?;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("start the launcher runtime", e))?;
    // Several nodes: node 0's launcher hosts the job's store for every attempt, and the
    // launchers watch each other through it.
    let store = match plan.nnodes {
        1 => None,
        _ => Some(Arc::new(job_store(plan)?)),
    };
    let mut restart = 0;
    loop {
        match runtime.block_on(supervise(plan, restart, store.as_ref())) {
            Err(Error::JobFailed(why)) if restart < plan.max_restarts => {
                // A node whose ranks refused their input would refuse it on every attempt. The
                // others say how they ended within moments of this node (their watch sees its
                // ranks end within a beat, then stops their own).
                let refused = store
                    .as_ref()
                    .and_then(|store| store.refused_node(restart, ENDED_WITHIN));
                if let Some(node) = refused {
                    return Err(Error::Config(format!(
                        "{why}\n[launcher] node {node}'s ranks refused their input (its log names \
                         the setting): not restarted"
                    )));
                }
                restart += 1;
                eprintln!(
                    "[launcher] {why}\n[launcher] restarting every rank from the last checkpoint \
                     (restart {restart} of {}, max_restarts)",
                    plan.max_restarts
                );
                if plan.node_rank == 0 && store.is_none() {
                    rendezvous::wait_for_port(&plan.master_addr, plan.master_port)?;
                }
            }
            // Node 0 hosts the store: it waits for the others to end too, or they would take
            // its going for a lost node.
            result @ (Ok(()) | Err(Error::Stopped(_))) => {
                if let Some(store) = &store {
                    store.finish(restart, plan.peer_timeout);
                }
                return result;
            }
            // Node 0 keeps the store up until the others have ended too, and a little longer:
            // a node that ended reads how the others did right after (a refusal is never
            // restarted), and must find the store.
            result => {
                if let Some(store) = store.as_ref().filter(|_| plan.node_rank == 0) {
                    store.refused_node(restart, plan.peer_timeout);
                    std::thread::sleep(READ_GRACE);
                }
                return result;
            }
        }
    }
}

/// The job's store between the launchers of several nodes, hosted by node 0's and joined by
/// the others' once `master_addr` resolves.
fn job_store(plan: &LaunchPlan) -> Result<heartbeat::JobStore> {
    rendezvous::check_master_resolves(&plan.master_addr, plan.master_port, plan.dist_timeout)?;
    heartbeat::JobStore::open(
        &plan.master_addr,
        plan.master_port,
        plan.node_rank,
        plan.nnodes,
        &plan.job,
        (plan.dist_timeout, plan.peer_timeout),
    )
}

/// The variable that tells a rank how many times its job was restarted (torchrun's name).
pub const RESTART_COUNT_ENV: &str = "TORCHELASTIC_RESTART_COUNT";

/// Environment defaults for spawned ranks, unless already set: OpenMP threads that sleep rather
/// than spin while they wait. Ranks share the machine's cores, and spinning threads made a rank
/// 2–3× slower next to a single busy process on 2 cores (sleeping: 1.7×; idle: no difference).
pub fn rank_env_defaults() -> Vec<(&'static str, &'static str)> {
    missing_defaults(|key| std::env::var_os(key).is_some())
}

fn missing_defaults(is_set: impl Fn(&str) -> bool) -> Vec<(&'static str, &'static str)> {
    [("OMP_WAIT_POLICY", "PASSIVE")]
        .into_iter()
        .filter(|(key, _)| !is_set(key))
        .collect()
}

/// Each local rank's CPUs, when pinning is on and there are at least as many CPUs as ranks.
fn cpu_slices(plan: &LaunchPlan) -> Result<Option<Vec<Vec<usize>>>> {
    if !plan.cpu_affinity || plan.local_ranks() < 2 {
        return Ok(None);
    }
    let allowed = affinity::allowed_cpus()?;
    let slices = affinity::split(&allowed, plan.local_ranks());
    if let Some(slices) = &slices {
        let list: Vec<String> = slices
            .iter()
            .enumerate()
            .map(|(r, cpus)| format!("{} → {}", plan.global_rank(r), affinity::format_list(cpus)))
            .collect();
        eprintln!(
            "CPU affinity (cpu_affinity=false turns it off): rank → CPUs {}",
            list.join(", ")
        );
    }
    Ok(slices)
}

async fn supervise(
    plan: &LaunchPlan,
    restart: usize,
    store: Option<&Arc<heartbeat::JobStore>>,
) -> Result<()> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Event>();
    let alive = spawn_ranks(plan, restart, store.is_some(), &tx)?;
    let _heartbeat = match store {
        Some(store) => Some(start_heartbeat(plan, restart, store, &tx)?),
        None => None,
    };
    drop(tx);
    let mut interrupt =
        signal(SignalKind::interrupt()).map_err(|e| Error::io("watch SIGINT", e))?;
    let mut terminate =
        signal(SignalKind::terminate()).map_err(|e| Error::io("watch SIGTERM", e))?;
    let mut job = Supervision::new(plan, alive);
    while job.running > 0 {
        let deadline = job.deadline;
        let timeout = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            event = rx.recv() => match event {
                Some(event) => job.on_event(event),
                None => break,
            },
            _ = interrupt.recv() => job.interrupt("interrupted (Ctrl-C)"),
            _ = terminate.recv() => job.interrupt("terminated (SIGTERM)"),
            _ = timeout => job.kill("ranks still running after the grace period"),
        }
    }
    // The ranks' last lines (the error that ended one) may still be in the pipes when their
    // exits are seen.
    let drained = tokio::time::Instant::now() + DRAIN;
    while job.open_streams > 0 {
        match tokio::time::timeout_at(drained, rx.recv()).await {
            Ok(Some(event)) => job.on_event(event),
            _ => break,
        }
    }
    let outcome = job.outcome();
    if let Some(store) = store {
        store.mark_ended(
            restart,
            match outcome {
                Ok(()) | Err(Error::Stopped(_)) => heartbeat::Ended::Well,
                Err(Error::Config(_)) => heartbeat::Ended::Refused,
                Err(_) => heartbeat::Ended::Failed,
            },
        );
    }
    outcome
}

/// Starts this node's ranks with their rank variables, their output forwarded and their exits
/// reported on `tx`; returns their pids.
fn spawn_ranks(
    plan: &LaunchPlan,
    restart: usize,
    agent_store: bool,
    tx: &mpsc::UnboundedSender<Event>,
) -> Result<Vec<Option<u32>>> {
    let local = plan.local_ranks();
    let cpu_slices = cpu_slices(plan)?;
    let mut children = Vec::with_capacity(local);
    for local_rank in 0..local {
        let rank = plan.global_rank(local_rank);
        let mut child = Command::new(&plan.program)
            .args(&plan.args)
            .envs(rank_env_defaults())
            .env(RESTART_COUNT_ENV, restart.to_string())
            .envs(agent_store.then_some((heartbeat::AGENT_STORE_ENV, "1")))
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", plan.world_size.to_string())
            .env("LOCAL_RANK", local_rank.to_string())
            .env("LOCAL_WORLD_SIZE", local.to_string())
            .env("NODE_RANK", plan.node_rank.to_string())
            .env("MASTER_ADDR", &plan.master_addr)
            .env("MASTER_PORT", plan.master_port.to_string())
            .env(
                super::lifeline::LAUNCHER_PID_ENV,
                std::process::id().to_string(),
            )
            // The launcher's own slices only: not a value inherited from its environment.
            .env_remove(affinity::CPUS_ENV)
            .envs(cpu_slices.as_ref().map(|slices| {
                (
                    affinity::CPUS_ENV,
                    affinity::format_list(&slices[local_rank]),
                )
            }))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Error::io(format!("start rank {rank} ({})", plan.program.display()), e))?;
        if let Some(out) = child.stdout.take() {
            forward(out, rank, false, tx.clone());
        }
        if let Some(err) = child.stderr.take() {
            forward(err, rank, true, tx.clone());
        }
        children.push((rank, child));
    }
    // The pids of ranks not yet reaped: only those may be signalled (a reaped pid can be reused).
    let mut alive = Vec::with_capacity(local);
    for (rank, mut child) in children {
        let tx = tx.clone();
        alive.push(child.id());
        tokio::spawn(async move {
            let status = child.wait().await;
            let _ = tx.send(Event::Exit { rank, status });
        });
    }
    Ok(alive)
}

/// Beats in the job's store and reports a node gone silent on `tx`, until dropped.
fn start_heartbeat(
    plan: &LaunchPlan,
    restart: usize,
    store: &Arc<heartbeat::JobStore>,
    tx: &mpsc::UnboundedSender<Event>,
) -> Result<StopOnDrop> {
    let stop = Arc::new(AtomicBool::new(false));
    let watch = heartbeat::Watch {
        attempt: restart,
        peer_timeout: plan.peer_timeout,
        start_timeout: plan.dist_timeout,
    };
    let tx = tx.clone();
    heartbeat::spawn(store.clone(), watch, stop.clone(), move |lost| {
        let _ = tx.send(Event::PeerLost(lost));
    })
    .map_err(|e| Error::io("start the heartbeat between nodes", e))?;
    Ok(StopOnDrop(stop))
}

/// What the launcher knows of its ranks while they run, and what it decides from it.
struct Supervision {
    /// The global rank of local rank 0.
    first_rank: usize,
    alive: Vec<Option<u32>>,
    running: usize,
    /// The ranks' stdout and stderr pipes not yet at their end.
    open_streams: usize,
    /// Each rank's last error lines.
    tails: Vec<VecDeque<String>>,
    failure: Option<Failure>,
    lost_peer: Option<heartbeat::PeerLost>,
    /// A rank that stopped because a stop was asked for (by another node, say): not a failure.
    stopped: Option<usize>,
    interrupted: Option<Interruption>,
    /// When the ranks still running get SIGKILL.
    deadline: Option<tokio::time::Instant>,
    /// Ranks the launcher killed: not failures of their own.
    killed: Vec<usize>,
    killing: bool,
}

/// Why the job was asked to stop, and when the first request came.
struct Interruption {
    why: &'static str,
    at: tokio::time::Instant,
}

/// The first rank that failed, how, and whether it refused its input (the same on every
/// attempt, so never restarted).
struct Failure {
    rank: usize,
    how: String,
    config: bool,
}

impl Supervision {
    fn new(plan: &LaunchPlan, alive: Vec<Option<u32>>) -> Self {
        let local = alive.len();
        Self {
            first_rank: plan.node_rank * local,
            running: local,
            open_streams: 2 * local,
            alive,
            tails: vec![VecDeque::new(); local],
            failure: None,
            lost_peer: None,
            stopped: None,
            interrupted: None,
            deadline: None,
            killed: Vec::new(),
            killing: false,
        }
    }

    fn on_event(&mut self, event: Event) {
        match event {
            Event::Line { rank, text, is_err } => {
                print_line(rank, &text, is_err);
                if is_err {
                    let tail = &mut self.tails[rank - self.first_rank];
                    if tail.len() == TAIL_LINES {
                        tail.pop_front();
                    }
                    tail.push_back(text);
                }
            }
            Event::Exit { rank, status } => self.on_exit(rank, status),
            Event::StreamEnded => self.open_streams = self.open_streams.saturating_sub(1),
            // A rank here that stopped as agreed means the job is stopping: a node whose
            // launcher leaves now is no loss.
            Event::PeerLost(lost) => {
                if self.lost_peer.is_none() && self.interrupted.is_none() && self.stopped.is_none()
                {
                    eprintln!("[launcher] {lost}; stopping this node's ranks");
                    self.lost_peer = Some(lost);
                    stop_all(&self.alive, libc::SIGTERM);
                    self.deadline = Some(tokio::time::Instant::now() + PEER_GRACE);
                }
            }
        }
    }

    fn on_exit(&mut self, rank: usize, status: std::io::Result<std::process::ExitStatus>) {
        use std::os::unix::process::ExitStatusExt;
        self.running -= 1;
        self.alive[rank - self.first_rank] = None;
        let ok = matches!(&status, Ok(s) if s.success());
        let code = status.as_ref().ok().and_then(|s| s.code());
        if self.killing && matches!(&status, Ok(s) if s.signal() == Some(libc::SIGKILL)) {
            self.killed.push(rank);
        } else if code == Some(STOPPED_EXIT_CODE) && self.failure.is_none() {
            // The others stop at the same step by agreement; the grace is a bound.
            self.stopped.get_or_insert(rank);
            self.deadline
                .get_or_insert(tokio::time::Instant::now() + STOP_GRACE);
        } else if !ok && self.failure.is_none() && self.interrupted.is_none() {
            self.failure = Some(Failure {
                rank,
                how: describe(&status),
                config: code == Some(BAD_INPUT_EXIT_CODE),
            });
            stop_all(&self.alive, libc::SIGTERM);
            self.deadline = Some(tokio::time::Instant::now() + GRACE);
        }
    }

    fn interrupt(&mut self, why: &'static str) {
        let now = tokio::time::Instant::now();
        if let Some(first) = &self.interrupted {
            // One request often arrives twice (a terminal's Ctrl-C, and a wrapper passing it
            // on): only a later one means "now".
            if now - first.at > SECOND_REQUEST_AFTER {
                self.kill("asked again to stop");
            }
            return;
        }
        self.interrupted = Some(Interruption { why, at: now });
        stop_all(&self.alive, libc::SIGTERM);
        self.deadline
            .get_or_insert(tokio::time::Instant::now() + STOP_GRACE);
    }

    fn kill(&mut self, why: &str) {
        eprintln!("[launcher] {why}; killing the ranks still running");
        self.killing = true;
        stop_all(&self.alive, libc::SIGKILL);
        self.deadline = None;
    }

    /// The ranks the launcher killed, for a message ("" when none).
    fn killed_note(&self) -> String {
        match self.killed.as_slice() {
            [] => String::new(),
            ranks => format!(
                "; killed after the grace period: rank(s) {ranks:?}, so a checkpoint they were \
                 writing may be missing"
            ),
        }
    }

    /// Ok only when every rank exited 0; else what went wrong first. A stop that was asked for
    /// wins over a failure, so that Ctrl-C is never answered with a restart.
    fn outcome(self) -> Result<()> {
        let killed = self.killed_note();
        if let Some(Interruption { why, .. }) = self.interrupted {
            let failed = match &self.failure {
                Some(f) => format!(" (after rank {} failed: {})", f.rank, f.how),
                None => String::new(),
            };
            return Err(Error::Stopped(format!(
                "{why}: all ranks stopped{failed}{killed}"
            )));
        }
        if let Some(lost) = self.lost_peer {
            let why = format!("{lost}; this node's ranks were stopped");
            return Err(match lost.refused {
                true => Error::Config(why),
                false => Error::JobFailed(why),
            });
        }
        if let Some(failure) = &self.failure {
            let tail = &self.tails[failure.rank - self.first_rank];
            let lines: Vec<String> = tail.iter().map(|l| format!("  {l}")).collect();
            let lines = match lines.is_empty() {
                true => "  (none)".to_owned(),
                false => lines.join("\n"),
            };
            let (rank, how) = (failure.rank, &failure.how);
            if failure.config {
                return Err(Error::Config(format!(
                    "rank {rank} refused its input ({how}); the other ranks were \
                     stopped. Its last error lines:\n{lines}"
                )));
            }
            return Err(Error::JobFailed(format!(
                "rank {rank} failed ({how}); the other ranks were stopped{killed}. Its last \
                 error lines:\n{lines}"
            )));
        }
        if let Some(rank) = self.stopped {
            let tail = &self.tails[rank - self.first_rank];
            let why = tail.back().map_or("", String::as_str);
            let why = why.strip_prefix("error: ").unwrap_or(why);
            return Err(Error::Stopped(format!(
                "the job stopped (rank {rank}: {why}){killed}"
            )));
        }
        Ok(())
    }
}

fn forward(
    stream: impl AsyncRead + Unpin + Send + 'static,
    rank: usize,
    is_err: bool,
    tx: mpsc::UnboundedSender<Event>,
) {
    tokio::spawn(async move {
        let mut reader = BufReader::new(stream);
        let mut line = Vec::new();
        // Bytes, not UTF-8 lines: a line that is not UTF-8 (a path in Latin-1 in a Python
        // warning) must not end the forwarding, or the rank's next write fails on a closed pipe.
        while matches!(reader.read_until(b'\n', &mut line).await, Ok(n) if n > 0) {
            let text = String::from_utf8_lossy(&line)
                .trim_end_matches(['\n', '\r'])
                .to_owned();
            line.clear();
            if tx.send(Event::Line { rank, text, is_err }).is_err() {
                return;
            }
        }
        let _ = tx.send(Event::StreamEnded);
    });
}

fn print_line(rank: usize, text: &str, is_err: bool) {
    match (rank, is_err) {
        (0, false) => println!("{text}"),
        (0, true) => eprintln!("{text}"),
        (_, false) => println!("[rank {rank}] {text}"),
        (_, true) => eprintln!("[rank {rank}] {text}"),
    }
}

fn describe(status: &std::io::Result<std::process::ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(code), _) => format!("exit code {code}"),
            (None, Some(sig)) => format!("killed by signal {sig}"),
            _ => "unknown exit".into(),
        },
        Err(e) => format!("could not be waited for: {e}"),
    }
}

fn stop_all(alive: &[Option<u32>], sig: i32) {
    for pid in alive.iter().flatten() {
        // SAFETY: kill(2) on a child we have not reaped yet, with a valid signal number.
        unsafe {
            libc::kill(*pid as i32, sig);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    /// Supervision of two local ranks whose pids are unknown (nothing is signalled).
    fn two_ranks() -> Supervision {
        let plan = LaunchPlan {
            world_size: 2,
            nnodes: 1,
            node_rank: 0,
            master_addr: "127.0.0.1".into(),
            master_port: 1,
            cpu_affinity: false,
            max_restarts: 3,
            peer_timeout: Duration::from_secs(1),
            dist_timeout: Duration::from_secs(1),
            job: String::new(),
            program: "tdmpc2".into(),
            args: Vec::new(),
        };
        Supervision::new(&plan, vec![None, None])
    }

    fn exited(code: i32) -> std::io::Result<std::process::ExitStatus> {
        Ok(std::process::ExitStatus::from_raw(code << 8))
    }

    fn signalled(signal: i32) -> std::io::Result<std::process::ExitStatus> {
        Ok(std::process::ExitStatus::from_raw(signal))
    }

    #[test]
    fn a_rank_that_refuses_its_input_is_not_restarted() {
        let mut job = two_ranks();
        job.on_exit(1, exited(BAD_INPUT_EXIT_CODE));
        job.on_exit(0, signalled(libc::SIGTERM));
        let err = job.outcome().unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{err}");
        assert!(
            err.to_string().contains("rank 1 refused its input"),
            "{err}"
        );
    }

    #[test]
    fn ctrl_c_after_a_failure_is_a_stop_not_a_restart() {
        let mut job = two_ranks();
        job.on_exit(1, exited(1));
        job.interrupt("interrupted (Ctrl-C)");
        job.on_exit(0, exited(STOPPED_EXIT_CODE));
        let err = job.outcome().unwrap_err();
        assert!(matches!(err, Error::Stopped(_)), "{err}");
        assert!(err.to_string().contains("after rank 1 failed"), "{err}");
    }

    /// Another node whose ranks refused their input ends this node's job as refused (exit 2,
    /// never restarted: it would fail the same way); one that failed may be restarted.
    #[test]
    fn a_peer_that_refused_its_input_is_not_restarted() {
        for (refused, config) in [(true, true), (false, false)] {
            let mut job = two_ranks();
            job.on_event(Event::PeerLost(heartbeat::PeerLost {
                node: 1,
                why: "its ranks ended".into(),
                refused,
            }));
            job.on_exit(0, exited(STOPPED_EXIT_CODE));
            job.on_exit(1, exited(STOPPED_EXIT_CODE));
            let err = job.outcome().unwrap_err();
            assert_eq!(matches!(err, Error::Config(_)), config, "{err}");
            assert_eq!(!config, matches!(err, Error::JobFailed(_)), "{err}");
        }
    }

    /// Ranks here stopped as agreed (a stop asked on another node): that node's launcher
    /// leaving afterwards is the job ending, not a loss to restart from.
    #[test]
    fn a_peer_leaving_after_an_agreed_stop_is_no_failure() {
        let mut job = two_ranks();
        job.on_exit(1, exited(STOPPED_EXIT_CODE));
        job.on_event(Event::PeerLost(heartbeat::PeerLost {
            node: 0,
            why: "its launcher's store does not answer".into(),
            refused: false,
        }));
        job.on_exit(0, exited(STOPPED_EXIT_CODE));
        let err = job.outcome().unwrap_err();
        assert!(matches!(err, Error::Stopped(_)), "{err}");
    }

    #[test]
    fn one_request_delivered_twice_is_no_second_request() {
        let mut job = two_ranks();
        job.interrupt("interrupted (Ctrl-C)");
        job.interrupt("terminated (SIGTERM)");
        assert!(!job.killing, "the same stop, passed on by a wrapper");
        let first = job.interrupted.as_mut().unwrap();
        first.at -= SECOND_REQUEST_AFTER * 2;
        job.interrupt("interrupted (Ctrl-C)");
        assert!(job.killing, "a second Ctrl-C kills");
    }

    #[test]
    fn a_rank_killed_after_the_stop_grace_is_no_failure() {
        let mut job = two_ranks();
        job.on_exit(1, exited(STOPPED_EXIT_CODE));
        job.kill("ranks still running after the grace period");
        job.on_exit(0, signalled(libc::SIGKILL));
        let err = job.outcome().unwrap_err();
        assert!(matches!(err, Error::Stopped(_)), "{err}");
        assert!(err.to_string().contains("rank(s) [0]"), "{err}");
    }

    #[test]
    fn output_that_is_not_utf8_is_forwarded_and_reading_goes_on() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let lines = runtime.block_on(async {
            let (tx, mut rx) = mpsc::unbounded_channel();
            let bytes = b"caf\xe9 /tmp/d\xe9j\xe0\nnext line\r\nlast".to_vec();
            forward(std::io::Cursor::new(bytes), 1, true, tx);
            let mut lines = Vec::new();
            while let Some(event) = rx.recv().await {
                match event {
                    Event::Line { text, .. } => lines.push(text),
                    Event::StreamEnded => lines.push("(end)".into()),
                    _ => {}
                }
            }
            lines
        });
        assert_eq!(
            lines,
            [
                "caf\u{fffd} /tmp/d\u{fffd}j\u{fffd}",
                "next line",
                "last",
                "(end)"
            ]
        );
    }

    #[test]
    fn ranks_sleep_while_waiting_unless_the_user_chose() {
        assert_eq!(
            missing_defaults(|_| false),
            [("OMP_WAIT_POLICY", "PASSIVE")]
        );
        assert!(missing_defaults(|key| key == "OMP_WAIT_POLICY").is_empty());
    }
}
