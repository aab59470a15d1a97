//! The built-in launcher: `tdmpc2 train world_size=N` starts this node's ranks as child
//! processes of the same binary (with torchrun's environment variables) and supervises them.
//!
//! - Output: rank 0 speaks as is; other ranks' lines are prefixed with `[rank r]`.
//! - A rank that fails makes the launcher stop the others (SIGTERM, then SIGKILL after a grace
//!   period) and exit non-zero, naming the rank and its last lines on stderr.
//! - Ctrl-C or SIGTERM is passed to every rank (rank 0 writes a checkpoint), then the launcher
//!   exits non-zero; a second Ctrl-C kills the ranks.
//! - With `max_restarts=K`, a failed job is started again, up to K times: every rank resumes
//!   from the run directory's last checkpoint (as under torchrun, the ranks see
//!   `TORCHELASTIC_RESTART_COUNT`). A stop that was asked for is never restarted, nor is a rank
//!   that refused its input (exit 2) or whose training diverged (exit 4).
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Command;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::mpsc;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::supervision::{Event, StopRequest, Supervision};
use super::{affinity, heartbeat, rendezvous};
use crate::error::{Error, Result};

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
    /// How long the ranks get to end after a stop (`stop_grace`).
    pub stop_grace: Duration,
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

/// How long the launcher reads what the ranks wrote last, once they have all exited.
const DRAIN: Duration = Duration::from_secs(5);

/// How soon after a node's ranks end every other node has said how its own ended: a beat to
/// notice, then its ranks' stop within the supervision's PEER_GRACE.
const ENDED_WITHIN: Duration = Duration::from_secs(8);
/// How long node 0 keeps the store up after every node has ended, so that they read it.
const READ_GRACE: Duration = Duration::from_secs(2);

/// Ctrl-C and SIGTERM, watched from the first attempt to the last: once watched, a signal no
/// longer ends the launcher by itself, so one that comes between two attempts (while the ranks'
/// output drains, or the port frees) must be seen then, and no restart follow it.
struct StopSignals {
    interrupt: Signal,
    terminate: Signal,
    /// The terminal's hangup (its ranks ignore it while the launcher lives), unless `nohup`
    /// asked to outlive the terminal.
    hangup: Option<Signal>,
}

impl StopSignals {
    /// Within the runtime's context.
    fn watch() -> Result<Self> {
        let hangup = match crate::terminal::hangup_ignored() {
            true => None,
            false => Some(signal(SignalKind::hangup()).map_err(|e| Error::io("watch SIGHUP", e))?),
        };
        Ok(Self {
            interrupt: signal(SignalKind::interrupt()).map_err(|e| Error::io("watch SIGINT", e))?,
            terminate: signal(SignalKind::terminate())
                .map_err(|e| Error::io("watch SIGTERM", e))?,
            hangup,
        })
    }

    /// The next request.
    async fn next(&mut self) -> StopRequest {
        let hangup = async {
            match &mut self.hangup {
                Some(hangup) => hangup.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = self.interrupt.recv() => StopRequest::INTERRUPT,
            _ = self.terminate.recv() => StopRequest::TERMINATE,
            _ = hangup => StopRequest::HANGUP,
        }
    }

    /// A request that came since the last one was taken, if any (the runtime gets a moment
    /// to take in what the kernel delivered).
    fn came(&mut self, runtime: &tokio::runtime::Runtime) -> Option<StopRequest> {
        let wait = Duration::from_millis(50);
        runtime
            .block_on(async { tokio::time::timeout(wait, self.next()).await })
            .ok()
    }
}

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
    // Once here rather than by every rank (see `meeting`).
    rendezvous::check_master_resolves(
        &format!("master_addr={}", plan.master_addr),
        &plan.master_addr,
        plan.master_port,
        plan.dist_timeout,
    )?;
    if plan.node_rank == 0 {
        if let Some(warning) =
            rendezvous::check_node_0_hosts(&plan.master_addr, plan.master_port, plan.nnodes)?
        {
            errln!("{warning}");
        }
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
    let mut signals = {
        let _context = runtime.enter();
        StopSignals::watch()?
    };
    let mut restart = 0;
    loop {
        match runtime.block_on(supervise(plan, restart, store.as_ref(), &mut signals)) {
            Err(Error::JobFailed(why)) if restart < plan.max_restarts => {
                let attempt = Attempt {
                    plan,
                    store: store.as_deref(),
                    number: restart,
                };
                if let Err(e) = attempt.may_restart(&why, &mut signals, &runtime) {
                    // The other nodes read how this one ended right after: node 0 keeps the
                    // store up a moment.
                    if plan.node_rank == 0 && store.is_some() {
                        std::thread::sleep(READ_GRACE);
                    }
                    return Err(e);
                }
                errln!(
                    "[launcher] {why}\n[launcher] restarting every rank from the last checkpoint, \
                     or from the start when none was written yet (restart {} of {}, \
                     max_restarts)",
                    restart + 1,
                    plan.max_restarts
                );
                attempt.prepare_restart(&mut signals, &runtime)?;
                restart += 1;
            }
            // Node 0 hosts the store: it waits for the others to end too, or they would take
            // its going for a lost node.
            result @ (Ok(()) | Err(Error::Stopped(_))) => {
                if let Some(store) = &store {
                    store.finish(restart, plan.peer_timeout);
                }
                return result;
            }
            result => {
                let attempt = Attempt {
                    plan,
                    store: store.as_deref(),
                    number: restart,
                };
                return attempt.end_unrestarted(result);
            }
        }
    }
}

/// An attempt of the job that ended in failure, and what the other nodes say of theirs.
struct Attempt<'a> {
    plan: &'a LaunchPlan,
    store: Option<&'a heartbeat::JobStore>,
    number: usize,
}

impl Attempt<'_> {
    /// Whether a restart may follow `why`: not when another node's ranks refused their input
    /// (they would on every attempt) or diverged (they most likely would again), nor after a
    /// stop asked for meanwhile. The others say how they ended within moments of this node
    /// (their watch sees its ranks end within a beat, then stops their own).
    fn may_restart(
        &self,
        why: &str,
        signals: &mut StopSignals,
        runtime: &tokio::runtime::Runtime,
    ) -> Result<()> {
        let unrestartable = self
            .store
            .and_then(|store| store.unrestartable_node(self.number, ENDED_WITHIN));
        if let Some((node, ended)) = unrestartable {
            return Err(not_restarted(why, node, ended));
        }
        match signals.came(runtime) {
            Some(request) => Err(self.stopped_before_restart(format!(
                "{why}\n[launcher] {} before the restart: not restarted",
                request.why
            ))),
            None => Ok(()),
        }
    }

    /// Readies the next attempt: a lone node 0 waits for its port to be free again, and a stop
    /// asked for meanwhile ends the job instead.
    fn prepare_restart(
        &self,
        signals: &mut StopSignals,
        runtime: &tokio::runtime::Runtime,
    ) -> Result<()> {
        if self.plan.node_rank == 0 && self.store.is_none() {
            rendezvous::wait_for_port(&self.plan.master_addr, self.plan.master_port)?;
        }
        match signals.came(runtime) {
            Some(request) => Err(self.stopped_before_restart(format!(
                "[launcher] {} before restart {} started: not restarted",
                request.why,
                self.number + 1
            ))),
            None => Ok(()),
        }
    }

    /// Ends the job on a stop asked for between this attempt and the next. The other nodes
    /// learn it from the store, where this node's next attempt ended as stopped (their watch of
    /// that attempt then stops their ranks), rather than wait `dist_timeout` for ranks that
    /// never come; node 0 keeps the store up until they have.
    fn stopped_before_restart(&self, message: String) -> Error {
        if let Some(store) = self.store {
            let next = self.number + 1;
            store.mark_ended(next, heartbeat::Ended::Stopped);
            store.finish(next, self.plan.peer_timeout);
        }
        Error::Stopped(message)
    }

    /// The job's end after an attempt that is not restarted. Node 0 keeps the store up until
    /// the others have ended too, and a little longer: a node that ended reads how the others
    /// did right after, and must find the store. A node whose ranks failed because another
    /// node's refused their input or diverged ends as that node did (exit 2 or 4, not 1).
    fn end_unrestarted(&self, result: Result<()>) -> Result<()> {
        let node_zero = self.plan.node_rank == 0;
        let limit = match node_zero {
            true => self.plan.peer_timeout,
            false => ENDED_WITHIN,
        };
        let unrestartable = match (&result, self.store) {
            (Err(Error::JobFailed(_)), Some(store)) => store.unrestartable_node(self.number, limit),
            (_, Some(store)) if node_zero => {
                store.unrestartable_node(self.number, limit);
                None
            }
            _ => None,
        };
        if node_zero && self.store.is_some() {
            std::thread::sleep(READ_GRACE);
        }
        match (result, unrestartable) {
            // Another node's stop explains no failure here: it stays one (exit 1).
            (Err(Error::JobFailed(why)), Some((node, ended)))
                if ended != heartbeat::Ended::Stopped =>
            {
                Err(not_restarted(&why, node, ended))
            }
            (result, _) => result,
        }
    }
}

/// How a job ends that node `node`'s ranks ended in a way no restart mends (`ended`).
fn not_restarted(why: &str, node: usize, ended: heartbeat::Ended) -> Error {
    match ended {
        heartbeat::Ended::Diverged => Error::Diverged(format!(
            "{why}\n[launcher] node {node}'s training diverged (its log names the step): not \
             restarted"
        )),
        heartbeat::Ended::Stopped => Error::Stopped(format!(
            "{why}\n[launcher] node {node} stopped ({}): not restarted",
            heartbeat::STOPPED_THERE
        )),
        heartbeat::Ended::Hung => Error::Other(format!(
            "{why}\n[launcher] node {node}'s ranks hung in the kernel (its log names them): not \
             restarted"
        )),
        _ => Error::Config(format!(
            "{why}\n[launcher] node {node}'s ranks refused their input (its log names the \
             setting): not restarted"
        )),
    }
}

/// The job's store between the launchers of several nodes, hosted by node 0's and joined by
/// the others' once `master_addr` resolves.
fn job_store(plan: &LaunchPlan) -> Result<heartbeat::JobStore> {
    if let Some(warning) = rendezvous::loopback_warning(&plan.master_addr, plan.node_rank) {
        errln!("{warning}");
    }
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
        errln!(
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
    signals: &mut StopSignals,
) -> Result<()> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Event>();
    let alive = spawn_ranks(plan, restart, store.is_some(), &tx)?;
    let _heartbeat = match store {
        Some(store) => Some(start_heartbeat(plan, restart, store, &tx)?),
        None => None,
    };
    drop(tx);
    let mut job = Supervision::new(plan, alive);
    while job.running() > 0 && !job.gave_up() {
        let deadline = job.deadline();
        let timeout = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d.at().into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            // A stop asked before the ranks' exits were seen is taken first (a starved
            // launcher finds both ready at once): it must win over their failure. The grace
            // comes before the ranks' output, which a rank could keep coming forever.
            biased;
            request = signals.next() => {
                // Said at once, not when the ranks have ended (a checkpoint may take minutes):
                // a node whose ranks fail meanwhile must not restart without this one.
                // Once: the store adds what is marked.
                if let (Some(store), false) = (store, job.was_interrupted()) {
                    store.mark_ended(restart + 1, heartbeat::Ended::Stopped);
                }
                job.interrupt(request)
            }
            // A continue after a stop (Ctrl-Z) gives the grace its time again.
            _ = timeout => if deadline.is_some_and(|d| d.passed()) {
                // What the ranks said before (their exits among it) is taken first, no more
                // than was queued: a rank that keeps writing cannot hold the grace off.
                for _ in 0..rx.len() {
                    match rx.try_recv() {
                        Ok(event) => job.on_event(event),
                        Err(_) => break,
                    }
                }
                // Unless those events ended the ranks, or set another grace.
                if job.running() > 0 && job.deadline() == deadline {
                    job.grace_ran_out()
                }
            },
            event = rx.recv() => match event {
                Some(event) => job.on_event(event),
                None => break,
            },
        }
    }
    // The ranks' last lines (the error that ended one) may still be in the pipes when their
    // exits are seen.
    let drained = tokio::time::Instant::now() + DRAIN;
    while job.streams_open() > 0 {
        match tokio::time::timeout_at(drained, rx.recv()).await {
            Ok(Some(event)) => job.on_event(event),
            _ => break,
        }
    }
    let interrupted = job.was_interrupted();
    let hung = job.gave_up();
    let outcome = job.outcome();
    if let Some(store) = store {
        if matches!(outcome, Err(Error::Stopped(_))) && !interrupted {
            // Stopped as the ranks agreed (a stop asked on another node, say): no part in a
            // restart either, said before this attempt's end, which the others wait for.
            store.mark_ended(restart + 1, heartbeat::Ended::Stopped);
        }
        store.mark_ended(
            restart,
            match outcome {
                _ if hung => heartbeat::Ended::Hung,
                Ok(()) | Err(Error::Stopped(_)) => heartbeat::Ended::Well,
                Err(Error::Config(_)) => heartbeat::Ended::Refused,
                Err(Error::Diverged(_)) => heartbeat::Ended::Diverged,
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
    heartbeat::spawn(store.clone(), watch, stop.clone(), move |news| {
        let _ = tx.send(match news {
            heartbeat::News::Stopping { node } => Event::PeerStopping { node },
            heartbeat::News::Lost(lost) => Event::PeerLost(lost),
        });
    })
    .map_err(|e| Error::io("start the heartbeat between nodes", e))?;
    Ok(StopOnDrop(stop))
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

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A stop asked for between two attempts (no supervision loop running) is seen before
    /// the restart, once.
    #[test]
    fn a_stop_between_attempts_is_kept_for_the_restart_check() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut signals = {
            let _context = runtime.enter();
            StopSignals::watch().unwrap()
        };
        assert_eq!(signals.came(&runtime), None);
        // SAFETY: raise(3) on this process, whose SIGTERM tokio now handles.
        assert_eq!(unsafe { libc::raise(libc::SIGTERM) }, 0);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(signals.came(&runtime), Some(StopRequest::TERMINATE));
        assert_eq!(signals.came(&runtime), None, "taken once");
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
