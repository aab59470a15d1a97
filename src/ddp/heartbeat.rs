//! Heartbeats between the launchers of a multi-node job, so that a node that goes away without
//! a word (a crashed host, a cut network, a frozen machine) is noticed within `peer_timeout`
//! seconds, not after a collective's `dist_timeout`.
//!
//! Node 0's launcher hosts the job's store (c10d's TCPStore on `master_addr:master_port`), as
//! torchrun's agent does. Every launcher counts up its own key there once a second and watches
//! the others' counters. A counter that stops moving for `peer_timeout` seconds, or a store that
//! stops answering (node 0 went away), ends the watch with a [`PeerLost`].
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envs::deadline::Deadline;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::error::{Error, Result};

const BEAT: Duration = Duration::from_secs(1);
/// How a node's ranks of an attempt ended (the value of its `ended` key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Finished, or stopped as asked.
    Well = 1,
    /// Failed: the job may be restarted.
    Failed = 2,
    /// Refused their input (exit 2): a restart would fail the same way.
    Refused = 3,
    /// Their training diverged (exit 4): a restart would most likely diverge again.
    Diverged = 4,
    /// It stopped before this attempt (Ctrl-C or SIGTERM to its launcher, or its ranks stopped
    /// as asked): the job stops.
    Stopped = 5,
    /// Some of its ranks did not end after SIGKILL (hung in the kernel): a restart would meet
    /// them on their GPU and files.
    Hung = 6,
}

impl Ended {
    /// Whether a restart of the job may go otherwise.
    pub fn restartable(self) -> bool {
        matches!(self, Self::Well | Self::Failed)
    }

    /// How another node's attempt ended, in words for the log.
    fn in_words(self) -> String {
        match self {
            Self::Refused => "its ranks refused their input (its log names the setting)".into(),
            Self::Diverged => "its ranks' training diverged (its log names the step)".into(),
            Self::Stopped => format!("it stopped before this attempt ({STOPPED_THERE})"),
            Self::Hung => "its ranks hung in the kernel (SIGKILL did not end them; its log names \
                           them)"
                .into(),
            Self::Well | Self::Failed => "its ranks failed".into(),
        }
    }

    fn from_value(value: i64) -> Option<Self> {
        [
            Self::Well,
            Self::Failed,
            Self::Refused,
            Self::Diverged,
            Self::Stopped,
            Self::Hung,
        ]
        .into_iter()
        .find(|ended| *ended as i64 == value)
    }
}

/// What the job is (set by node 0, checked by the other nodes).
const JOB_KEY: &str = "tdmpc2/job";

/// Beats missed after which a node that has not said it ended is taken for gone.
const SILENT: Duration = Duration::from_secs(3);

/// The least time c10d is given to connect once node 0's port answers.
const MIN_CONNECT: Duration = Duration::from_secs(5);
/// When a node's wait for node 0 is first reported, then how often.
const FIRST_REPORT: Duration = Duration::from_secs(10);
const REPORT_EVERY: Duration = Duration::from_secs(60);

/// Waits until node 0's launcher answers at `addr:port`, saying now and then that this node
/// waits, rather than leaving the wait to c10d, which prints its C++ frames for each try.
fn wait_for_node_0(addr: &str, port: u16, node: usize, start: &Deadline) -> Result<()> {
    let mut next_report = FIRST_REPORT;
    while !super::rendezvous::answers(addr, port, Duration::from_secs(2)) {
        if start.passed() {
            return Err(Error::Other(format!(
                "cannot reach node 0's launcher at {addr}:{port} within {} s (dist_timeout): \
                 nothing answered there; is node 0's launcher started, with the same \
                 master_addr and master_port, and can this node reach that port?",
                start.limit().as_secs()
            )));
        }
        let waited = start.waited();
        if waited >= next_report {
            next_report = waited + REPORT_EVERY;
            errln!(
                "node {node}: waiting {} s for node 0's launcher at {addr}:{port} (master_addr, \
                 master_port): nothing answers there yet; up to {} s (dist_timeout)",
                waited.as_secs(),
                start.limit().as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

fn heartbeat_key(attempt: usize, node: usize) -> String {
    format!("tdmpc2/heartbeat/{attempt}/{node}")
}

fn ended_key(attempt: usize, node: usize) -> String {
    format!("tdmpc2/ended/{attempt}/{node}")
}

/// Why a launcher that came as `node` was refused the job (its settings, or its job, differ).
fn refused_key(node: usize) -> String {
    format!("tdmpc2/refused/{node}")
}

/// Counts the launchers that joined as `node`: 1 once its own has, for the life of the job.
fn claim_key(node: usize) -> String {
    format!("tdmpc2/node/{node}")
}

/// The job's store between launchers, hosted by node 0's launcher for the life of the job.
/// Ranks join their process group through it too (see [`AGENT_STORE_ENV`]), one key prefix per
/// attempt of a restarted job, so the store outlives every rank and every attempt.
pub struct JobStore {
    store: Py<PyAny>,
    node: usize,
    nnodes: usize,
}

/// Set (to "1") for ranks whose launcher hosts the job's store: they rendezvous through it.
pub const AGENT_STORE_ENV: &str = "TDMPC2_AGENT_STORE";

impl JobStore {
    /// Node 0 hosts the store on `port`; the other nodes connect to it at `addr:port`, waiting
    /// up to `start_timeout` for it, and must run the same `job` (see [`JobStore::join`]). Each
    /// later operation waits at most `op_timeout`.
    pub fn open(
        addr: &str,
        port: u16,
        node: usize,
        nnodes: usize,
        job: &str,
        timeouts: (Duration, Duration),
    ) -> Result<Self> {
        let (start_timeout, op_timeout) = timeouts;
        let start = Deadline::after(start_timeout);
        if node > 0 {
            wait_for_node_0(addr, port, node, &start)?;
        }
        let store = embedded_python::with_python(|py| {
            let dist = py.import("torch.distributed")?;
            let timedelta = py.import("datetime")?.getattr("timedelta")?;
            let kwargs = PyDict::new(py);
            kwargs.set_item("is_master", node == 0)?;
            kwargs.set_item("wait_for_workers", false)?;
            kwargs.set_item(
                "timeout",
                timedelta.call((0, start.left().max(MIN_CONNECT).as_secs_f64()), None)?,
            )?;
            let store = dist
                .getattr("TCPStore")?
                .call((addr, port), Some(&kwargs))?;
            store.call_method1(
                "set_timeout",
                (timedelta.call((0, op_timeout.as_secs_f64()), None)?,),
            )?;
            Ok(store.unbind())
        })
        .map_err(|e| {
            let role = if node == 0 {
                format!("host the job's store on port {port} (is master_port free?)")
            } else {
                format!("reach node 0's launcher at {addr}:{port} (master_addr, master_port)")
            };
            Error::Other(format!("cannot {role}: {e}"))
        })?;
        let store = Self {
            store,
            node,
            nnodes,
        };
        store.join(job, &format!("{addr}:{port}"))?;
        Ok(store)
    }

    /// Node 0 says which job it hosts; every other node checks that it runs the same one and
    /// claims its node rank. A launcher given another world size or task, or a node rank
    /// another launcher has, and a node of another job that reached this job's store (two jobs
    /// on one master_port), are refused here: they would form no job, or start ranks among
    /// this job's and stop it when they fail.
    fn join(&self, job: &str, at: &str) -> Result<()> {
        let hosted = embedded_python::with_python(|py| {
            let store = self.store.bind(py);
            if self.node == 0 {
                store.call_method1("set", (JOB_KEY, job))?;
                return Ok(job.to_owned());
            }
            let bytes: Vec<u8> = store.call_method1("get", (JOB_KEY,))?.extract()?;
            Ok(String::from_utf8_lossy(&bytes).into_owned())
        })
        .map_err(|e| Error::Other(format!("cannot read the job node 0 hosts at {at}: {e}")))?;
        let changed = crate::config::changed_settings(&hosted, job);
        if hosted != job {
            let node = self.node;
            let (why, told) = match changed.is_empty() {
                false => (
                    format!(
                        "node {node}'s settings differ from those of node 0's launcher at {at} \
                         (node 0's → this node's): {}",
                        changed.join(", ")
                    ),
                    format!(
                        "its settings differ from this node's (node 0's → node {node}'s): {}",
                        changed.join(", ")
                    ),
                ),
                true => (
                    format!(
                        "node {node} runs `{job}`, but node 0's launcher at {at} runs `{hosted}`"
                    ),
                    format!("it runs `{job}`, but this node runs `{hosted}`"),
                ),
            };
            // Told to node 0, which would otherwise wait `dist_timeout` for this node.
            let _ = self.set(&refused_key(node), &told);
            return Err(Error::Config(format!(
                "{why}; give every node the same settings (node_rank, paths and thread counts \
                 aside), and each job a master_port of its own"
            )));
        }
        let claim = claim_key(self.node);
        if self.add(&claim, 1)? != 1 {
            let _ = self.add(&claim, -1);
            return Err(Error::Config(format!(
                "node_rank={} is taken: another launcher joined the job at {at} as node {0} (the \
                 same node_rank given twice, another job on this master_port, or a launcher of \
                 this job started again: a node is never replaced, start the whole job again); \
                 give each node its own node_rank (0 to nnodes-1), and each job a master_port of \
                 its own",
                self.node
            )));
        }
        Ok(())
    }

    fn set(&self, key: &str, value: &str) -> Result<()> {
        embedded_python::with_python(|py| {
            self.store.bind(py).call_method1("set", (key, value))?;
            Ok(())
        })
        .map_err(Error::from)
    }

    /// Why a launcher that came as `node` was refused, while none joined as `node`: the job
    /// cannot form. (Once one has, a launcher refused as that node is another job's, and none
    /// of this one's concern, in this attempt and every later one.)
    fn refusal(&self, node: usize) -> Option<String> {
        if self.add(&claim_key(node), 0).unwrap_or(1) != 0 {
            return None;
        }
        embedded_python::with_python(|py| {
            let store = self.store.bind(py);
            let key = refused_key(node);
            // `get` would wait for the key.
            if !store
                .call_method1("check", (vec![key.as_str()],))?
                .extract::<bool>()?
            {
                return Ok(None);
            }
            let bytes: Vec<u8> = store.call_method1("get", (key,))?.extract()?;
            Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
        })
        .ok()
        .flatten()
    }

    fn add(&self, key: &str, amount: i64) -> Result<i64> {
        embedded_python::with_python(|py| {
            self.store
                .bind(py)
                .call_method1("add", (key, amount))?
                .extract()
        })
        .map_err(Error::from)
    }

    /// Says how this node's ranks of `attempt` ended, before its heartbeat stops: the other
    /// nodes then do not take a node that finished first (or stopped as asked) for lost while
    /// they still write their checkpoint, and learn at once of one whose ranks failed.
    pub fn mark_ended(&self, attempt: usize, ended: Ended) {
        let _ = self.add(&ended_key(attempt, self.node), ended as i64);
    }

    /// How `node`'s ranks of `attempt` ended; None while they run (or the store does not say).
    fn ended(&self, attempt: usize, node: usize) -> Option<Ended> {
        self.ended_or_gone(attempt, node).ok().flatten()
    }

    /// As [`Self::ended`], with the store's failure (node 0 gone) as an error.
    fn ended_or_gone(&self, attempt: usize, node: usize) -> Result<Option<Ended>> {
        Ok(Ended::from_value(self.add(&ended_key(attempt, node), 0)?))
    }

    /// Waits (up to `limit`, and no longer once the store is gone) until every node has said
    /// how its ranks of `attempt` ended, and returns a node whose ranks ended in a way no
    /// restart mends (refused their input, or diverged) and how, if one did, or a node that
    /// already stopped the next attempt.
    pub fn unrestartable_node(&self, attempt: usize, limit: Duration) -> Option<(usize, Ended)> {
        let store_gone = std::cell::Cell::new(false);
        self.wait_for_nodes(attempt, limit, |node| {
            match self.ended_or_gone(attempt, node) {
                Ok(ended) => ended.is_some(),
                Err(_) => {
                    store_gone.set(true);
                    true
                }
            }
        });
        if store_gone.get() {
            return None;
        }
        let unrestartable = |node| {
            let ended = self.ended(attempt, node).filter(|e| !e.restartable());
            ended.map(|ended| (node, ended))
        };
        let stopped_next = |node| {
            let stopped = self.ended(attempt + 1, node) == Some(Ended::Stopped);
            stopped.then_some((node, Ended::Stopped))
        };
        (0..self.nnodes)
            .find_map(unrestartable)
            .or_else(|| (0..self.nnodes).find_map(stopped_next))
    }

    /// Says this node's ranks of `attempt` ended well (finished, or stopped as asked); node 0
    /// then waits (up to `limit`) for every node to say so, so that no launcher loses the store
    /// while its ranks still end. A node that stopped beating without saying so is gone (its
    /// launcher killed, say): node 0 waits for it no longer than a few beats.
    pub fn finish(&self, attempt: usize, limit: Duration) {
        let key = |node: usize| format!("tdmpc2/done/{attempt}/{node}");
        let _ = self.add(&key(self.node), 1);
        if self.node != 0 {
            return;
        }
        self.wait_for_nodes(attempt, limit, |node| {
            self.add(&key(node), 0).unwrap_or(0) > 0
        });
    }

    /// Waits (up to `limit`) until every node is `settled` or has stopped beating for
    /// `SILENT` (gone: its launcher killed, say).
    fn wait_for_nodes(&self, attempt: usize, limit: Duration, settled: impl Fn(usize) -> bool) {
        let beats = |node: usize| self.add(&heartbeat_key(attempt, node), 0).unwrap_or(-1);
        let mut last: Vec<(i64, Instant)> = (0..self.nnodes)
            .map(|n| (beats(n), Instant::now()))
            .collect();
        let deadline = Deadline::after(limit);
        while !deadline.passed() {
            let mut waiting = false;
            for (node, (count, moved)) in last.iter_mut().enumerate() {
                if settled(node) {
                    continue;
                }
                let now = beats(node);
                if now != *count {
                    (*count, *moved) = (now, Instant::now());
                }
                waiting |= !Deadline::since(*moved, SILENT).passed();
            }
            if !waiting {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// What to watch: the nodes of `attempt`, through the job's store.
#[derive(Debug, Clone)]
pub struct Watch {
    pub attempt: usize,
    /// Silence after which a node that has beaten before counts as gone.
    pub peer_timeout: Duration,
    /// How long a node may take to start beating (the job's start-up, `dist_timeout`).
    pub start_timeout: Duration,
}
/// A node that went away, in words for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerLost {
    pub node: usize,
    pub why: String,
    /// How its ranks ended (`Failed` for a node that went silent): whether a restart may mend
    /// it.
    pub ended: Ended,
    /// Whether its ranks are likely stopping with a checkpoint: node 0's launcher gone (its
    /// ranks stop as on Ctrl-C when it dies), so this node's ranks get the stop's grace too,
    /// not seconds, to meet them in the stop's collectives.
    pub likely_stopping: bool,
}

impl std::fmt::Display for PeerLost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "node {} went away: {}", self.node, self.why)
    }
}

/// How a node that stopped as asked is named: why it did, in words.
pub const STOPPED_THERE: &str = "Ctrl-C or SIGTERM there, or its ranks stopped as asked";

/// What the watch tells its launcher about the other nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum News {
    /// A node was asked to stop (its launcher marked the next attempt stopped): the job is
    /// stopping, also where its ranks have not met the others yet.
    Stopping { node: usize },
    /// A node went away; the watch ends.
    Lost(PeerLost),
}

/// Starts watching on a thread of its own; `tell` hears of the first node asked to stop, and
/// of the first lost, after which the watch ends. It also ends when `stop` is set.
pub fn spawn(
    store: Arc<JobStore>,
    watch: Watch,
    stop: Arc<AtomicBool>,
    mut tell: impl FnMut(News) + Send + 'static,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("heartbeat".into())
        .spawn(move || {
            let mut told = |news| {
                if !stop.load(Ordering::SeqCst) {
                    tell(news);
                }
            };
            if let Some(lost) = run(&store, &watch, &stop, &mut told) {
                told(News::Lost(lost));
            }
        })
        .map(|_| ())
}

fn run(
    store: &JobStore,
    watch: &Watch,
    stop: &AtomicBool,
    tell: &mut impl FnMut(News),
) -> Option<PeerLost> {
    let key = |node: usize| heartbeat_key(watch.attempt, node);
    let started = Instant::now();
    // Per node: its last counter value and when it last moved.
    let mut seen: Vec<(i64, Option<Instant>)> = vec![(0, None); store.nnodes];
    let mut told_stopping = false;
    while !stop.load(Ordering::SeqCst) {
        for (node, (last, moved)) in seen.iter_mut().enumerate() {
            let step = if node == store.node { 1 } else { 0 };
            let value = match store.add(&key(node), step) {
                Ok(value) => value,
                Err(e) => {
                    return Some(PeerLost {
                        node: 0,
                        why: format!("its launcher's store does not answer ({e})"),
                        ended: Ended::Failed,
                        likely_stopping: true,
                    })
                }
            };
            if value != *last {
                *last = value;
                *moved = Some(Instant::now());
            }
            if node == store.node {
                continue;
            }
            // A stop there is marked at once, before its ranks end (a checkpoint may take
            // minutes), and before they met the others, who would wait `dist_timeout`.
            if !told_stopping && store.ended(watch.attempt + 1, node) == Some(Ended::Stopped) {
                told_stopping = true;
                tell(News::Stopping { node });
            }
            match store.ended(watch.attempt, node) {
                Some(Ended::Well) => continue,
                Some(ended) => {
                    return Some(PeerLost {
                        node,
                        why: ended.in_words(),
                        ended,
                        likely_stopping: false,
                    });
                }
                None => {}
            }
            if moved.is_none() {
                if let Some(why) = store.refusal(node) {
                    return Some(PeerLost {
                        node,
                        why: format!(
                            "its launcher came and was refused the job: {why}; give every node \
                             the same settings (node_rank, paths and thread counts aside), and \
                             each job a master_port of its own"
                        ),
                        ended: Ended::Refused,
                        likely_stopping: false,
                    });
                }
            }
            let silence = moved.map(|at| Deadline::since(at, watch.peer_timeout));
            let start = Deadline::since(started, watch.start_timeout);
            let why = match silence {
                Some(silence) if silence.passed() => format!(
                    "its launcher sent no heartbeat for {} s (peer_timeout)",
                    silence.waited().as_secs()
                ),
                None if start.passed() => format!(
                    "its launcher never joined within {} s (dist_timeout): check nnodes, \
                     node_rank, master_addr and master_port on every node, and that node 0 \
                     is reachable on master_port",
                    start.waited().as_secs()
                ),
                _ => continue,
            };
            return Some(PeerLost {
                node,
                why,
                ended: Ended::Failed,
                likely_stopping: false,
            });
        }
        std::thread::sleep(BEAT);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const JOB: &str = "world_size=2 nnodes=2 task=walker-run seed=1";

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port()
    }

    fn open(port: u16, node: usize, job: &str) -> Result<JobStore> {
        let limit = Duration::from_secs(20);
        JobStore::open("127.0.0.1", port, node, 2, job, (limit, limit))
    }

    /// Node 0's watch over node 1, which says how its ranks ended and never beats: what node 0
    /// reports within `within`.
    fn watch_a_node_that_ended(ended: Ended, within: Duration) -> Option<PeerLost> {
        let port = free_port();
        let host = Arc::new(open(port, 0, JOB).unwrap());
        let peer = open(port, 1, JOB).unwrap();
        peer.mark_ended(0, ended);
        let watch = Watch {
            attempt: 0,
            peer_timeout: Duration::from_millis(500),
            start_timeout: Duration::from_millis(500),
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        spawn(host, watch, stop.clone(), move |news| {
            if let News::Lost(lost) = news {
                let _ = tx.send(lost);
            }
        })
        .unwrap();
        let lost = rx.recv_timeout(within).ok();
        stop.store(true, Ordering::SeqCst);
        lost
    }

    /// A node whose launcher was asked to stop marks the next attempt stopped at once: the
    /// others hear of it while its ranks still run, or still wait to meet theirs.
    #[test]
    fn a_node_asked_to_stop_is_told_at_once() {
        let port = free_port();
        let host = Arc::new(open(port, 0, JOB).unwrap());
        let peer = open(port, 1, JOB).unwrap();
        let watch = Watch {
            attempt: 0,
            peer_timeout: Duration::from_secs(60),
            start_timeout: Duration::from_secs(60),
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        spawn(host, watch, stop.clone(), move |news| {
            let _ = tx.send(news);
        })
        .unwrap();
        assert!(
            rx.recv_timeout(Duration::from_secs(2)).is_err(),
            "nothing yet"
        );
        peer.mark_ended(1, Ended::Stopped);
        let news = rx.recv_timeout(Duration::from_secs(10));
        stop.store(true, Ordering::SeqCst);
        assert_eq!(news, Ok(News::Stopping { node: 1 }));
    }

    #[test]
    fn a_node_that_ended_well_is_not_lost_and_one_that_failed_is_named_at_once() {
        // Silent far past peer_timeout and start_timeout, but finished: not lost.
        assert_eq!(
            watch_a_node_that_ended(Ended::Well, Duration::from_secs(3)),
            None
        );
        let within = Duration::from_secs(10);
        let lost = watch_a_node_that_ended(Ended::Failed, within).expect("not reported");
        assert_eq!((lost.node, lost.why.as_str()), (1, "its ranks failed"));
        assert!(lost.ended.restartable(), "a failure may be restarted");
        let lost = watch_a_node_that_ended(Ended::Refused, within).expect("not reported");
        assert!(
            lost.ended == Ended::Refused && lost.why.contains("refused their input"),
            "{lost}"
        );
        let lost = watch_a_node_that_ended(Ended::Diverged, within).expect("not reported");
        assert!(
            !lost.ended.restartable() && lost.why.contains("diverged"),
            "{lost}"
        );
        let lost = watch_a_node_that_ended(Ended::Hung, within).expect("not reported");
        assert!(
            !lost.ended.restartable() && lost.why.contains("hung in the kernel"),
            "{lost}"
        );
        let lost = watch_a_node_that_ended(Ended::Stopped, within).expect("not reported");
        assert!(
            !lost.ended.restartable() && lost.why.contains("stopped before this attempt"),
            "{lost}"
        );
    }

    /// A node of another job (or given other settings) and a second launcher claiming a node
    /// rank are refused, naming what differs; the job's own node joins.
    #[test]
    fn only_the_hosted_jobs_nodes_join_each_once() {
        let port = free_port();
        let _host = open(port, 0, JOB).unwrap();
        let other = "world_size=2 nnodes=2 task=dog-run seed=1";
        let e = open(port, 1, other).err().expect("another job").to_string();
        assert!(e.contains(other) && e.contains(JOB), "{e}");
        let _node = open(port, 1, JOB).unwrap();
        let e = open(port, 1, JOB).err().expect("node 1 again").to_string();
        assert!(e.contains("node_rank=1 is taken"), "{e}");
    }

    /// A launcher refused the job for its settings is named by node 0 at once, while that node
    /// has not joined; once it has (and until it beats, as at the start of each attempt),
    /// another refused launcher is no concern of the job's.
    #[test]
    fn a_node_refused_for_its_settings_is_named_at_once_until_it_joins() {
        let watch = Watch {
            attempt: 0,
            peer_timeout: Duration::from_secs(60),
            start_timeout: Duration::from_secs(60),
        };
        let stop = Arc::new(AtomicBool::new(false));
        let watch_for = |node_1_joined: bool, within| {
            let port = free_port();
            let host = Arc::new(open(port, 0, JOB).unwrap());
            // Joined, but not beating.
            let _node_1 = node_1_joined.then(|| open(port, 1, JOB).unwrap());
            let other = "world_size=2 nnodes=2 task=walker-run seed=2";
            assert!(open(port, 1, other).is_err());
            let (tx, rx) = std::sync::mpsc::channel();
            spawn(host, watch.clone(), stop.clone(), move |news| {
                let _ = tx.send(news);
            })
            .unwrap();
            rx.recv_timeout(within)
        };
        let Ok(News::Lost(lost)) = watch_for(false, Duration::from_secs(10)) else {
            panic!("node 1's refusal was not reported");
        };
        assert_eq!((lost.node, lost.ended), (1, Ended::Refused));
        let expected = "it runs `world_size=2 nnodes=2 task=walker-run seed=2`, but this node runs";
        assert!(
            lost.why
                .contains("its launcher came and was refused the job")
                && lost.why.contains(expected),
            "{lost}"
        );
        let news = watch_for(true, Duration::from_secs(4));
        stop.store(true, Ordering::SeqCst);
        assert!(news.is_err(), "{news:?}");
    }

    /// A node whose ranks refused their input (or diverged, or that stopped the next attempt)
    /// is found once every node has ended; none is when they all ended otherwise, or when the
    /// wait runs out.
    #[test]
    fn an_unrestartable_node_is_found_among_the_ended() {
        let port = free_port();
        let host = open(port, 0, JOB).unwrap();
        let peer = open(port, 1, JOB).unwrap();
        let short = Duration::from_millis(300);
        host.mark_ended(0, Ended::Refused);
        assert_eq!(
            host.unrestartable_node(0, short),
            Some((0, Ended::Refused)),
            "its own, once the wait runs out"
        );
        peer.mark_ended(0, Ended::Failed);
        let within = Duration::from_secs(20);
        assert_eq!(
            peer.unrestartable_node(0, within),
            Some((0, Ended::Refused))
        );
        host.mark_ended(1, Ended::Failed);
        peer.mark_ended(1, Ended::Well);
        assert_eq!(host.unrestartable_node(1, within), None);
        host.mark_ended(3, Ended::Failed);
        peer.mark_ended(3, Ended::Diverged);
        assert_eq!(
            host.unrestartable_node(3, within),
            Some((1, Ended::Diverged))
        );
        // Node 1 stopped as asked while node 0's ranks failed: no restart without it.
        host.mark_ended(4, Ended::Failed);
        peer.mark_ended(4, Ended::Well);
        peer.mark_ended(5, Ended::Stopped);
        assert_eq!(
            host.unrestartable_node(4, within),
            Some((1, Ended::Stopped))
        );
        // Node 0 gone: no wait for keys that cannot come.
        drop(host);
        let started = Instant::now();
        assert_eq!(peer.unrestartable_node(2, within), None);
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn a_lost_peer_names_its_node() {
        let lost = PeerLost {
            node: 1,
            why: "its launcher sent no heartbeat for 31 s (peer_timeout)".into(),
            ended: Ended::Failed,
            likely_stopping: false,
        };
        assert_eq!(
            lost.to_string(),
            "node 1 went away: its launcher sent no heartbeat for 31 s (peer_timeout)"
        );
    }
}
