//! How the ranks meet before their group forms: through a c10d TCP store (rank 0 hosts it, or
//! our launcher), each rank checking in and waiting for all. The wait is ours, in short slices,
//! rather than inside c10d: it says what it waits for, and a stop (Ctrl-C, SIGTERM) ends it at
//! once instead of after `dist_timeout`. torchrun's ranks join as torch has them (`env://` on
//! its agent's store): its agents have met before they start ranks, and its restart counts
//! differ between nodes, so no key prefix of an attempt is shared by all of them.
use std::time::Duration;

use envs::deadline::Deadline;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::rank::RankInfo;
use crate::error::{Error, Result};

/// How long one attempt to reach the store, or one look at who joined, may block.
const SLICE: Duration = Duration::from_secs(2);
/// When a wait is first reported, then how often.
const FIRST_REPORT: Duration = Duration::from_secs(10);
const REPORT_EVERY: Duration = Duration::from_secs(60);
/// torchrun's switch for a store its agent hosts (all ranks join it as clients).
const TORCHRUN_AGENT_STORE_ENV: &str = "TORCHELASTIC_USE_AGENT_STORE";

/// Who hosts the store, and the key prefix of this attempt's rendezvous.
struct Host {
    this_rank: bool,
    prefix: String,
    /// The job the store serves, which a rank checks before it joins: where rank 0 hosts it
    /// (our launcher binds the port itself, so no other job's store can answer there).
    job: Option<String>,
}

impl Host {
    fn of(info: &RankInfo) -> Self {
        let attempt = |var: &str| std::env::var(var).unwrap_or_else(|_| "0".into());
        if std::env::var(super::heartbeat::AGENT_STORE_ENV).as_deref() == Ok("1") {
            // Our launcher hosts the store: one prefix per attempt, as it restarts.
            let attempt = attempt(super::launcher::RESTART_COUNT_ENV);
            return Self {
                this_rank: false,
                prefix: format!("tdmpc2/attempt_{attempt}/"),
                job: None,
            };
        }
        Self {
            this_rank: info.rank == 0,
            prefix: "tdmpc2/".into(),
            job: Some(this_job()),
        }
    }
}

/// How this rank was given its master address `addr`, for errors: MASTER_ADDR from torchrun
/// or SLURM, SLURM's first node without it, else master_addr (which our launcher passes on as
/// MASTER_ADDR).
fn master_addr_given(addr: &str) -> String {
    let var = |key: &str| std::env::var(key).ok();
    if var(super::lifeline::LAUNCHER_PID_ENV).is_none() {
        match var("MASTER_ADDR") {
            Some(given) if given == addr => return format!("MASTER_ADDR={addr}"),
            None if super::rank::slurm_first_node(&var).as_deref() == Some(addr) => {
                return format!("{addr}, SLURM's first node (MASTER_ADDR unset),");
            }
            _ => {}
        }
    }
    format!("master_addr={addr}")
}

/// The store every rank of `info`'s group has joined (prefixed for this attempt), once all
/// have, within `timeout` (`dist_timeout`); the group sets how long its operations wait.
/// `stop_asked` is looked at between slices. None under torchrun: its ranks join by `env://`.
pub(super) fn meet(
    info: &RankInfo,
    timeout: Duration,
    stop_asked: fn() -> bool,
) -> Result<Option<Py<PyAny>>> {
    // A name that cannot resolve would be tried until the deadline.
    super::rendezvous::check_master_resolves(
        &master_addr_given(&info.master_addr),
        &info.master_addr,
        info.master_port,
        timeout,
    )?;
    if std::env::var(TORCHRUN_AGENT_STORE_ENV).as_deref() == Ok("True") {
        return Ok(None);
    }
    let host = Host::of(info);
    let deadline = Deadline::after(timeout);
    let mut report = Report::new(info, timeout);
    let store = loop {
        // Nothing there yet is not asked of c10d, which prints its C++ frames for each try.
        let there = host.this_rank
            || super::rendezvous::answers(&info.master_addr, info.master_port, SLICE);
        let attempt = match there {
            true => connect(info, &host),
            false => Err(embedded_python::Error("nothing answers there".into())),
        };
        match attempt {
            Ok(store) => break store,
            // Not up yet (its host starts later, or is slower to start): again, until the
            // deadline. A host that cannot start its store fails at once.
            Err(e) if !host.this_rank && !deadline.passed() => {
                report.waiting(&deadline, "the store is not up yet", &e.0);
            }
            Err(e) => return Err(cannot_meet(info, &trimmed(&e.0))),
        }
        if stop_asked() {
            return Err(stopped(info));
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    if let Some(job) = &host.job {
        check_same_job(info, &store, host.this_rank, job, &deadline, stop_asked)?;
    }
    let joined = |delta: i64| {
        embedded_python::with_python(|py| {
            store
                .bind(py)
                .call_method1("add", ("joined", delta))?
                .extract::<i64>()
        })
    };
    let arrived = joined(1).map_err(|e| cannot_meet(info, &trimmed(&e.0)))?;
    if arrived > info.world_size as i64 {
        // Every rank of the store's job had joined: this one belongs to another job.
        return Err(Error::Config(format!(
            "master_port={} at {} serves a job whose {} ranks have all joined: rank {} would be \
             one too many, so it is another job's port (not this one's); give each job a \
             master_port of its own",
            info.master_port, info.master_addr, info.world_size, info.rank
        )));
    }
    loop {
        let count = joined(0).map_err(|e| cannot_meet(info, &trimmed(&e.0)))?;
        if count >= info.world_size as i64 {
            break;
        }
        if stop_asked() {
            return Err(stopped(info));
        }
        if deadline.passed() {
            return Err(Error::Collective(format!(
                "rank {} of {}: {count} of {} ranks joined at {}:{} within {} s (dist_timeout); \
                 are the other ranks started, with the same master_addr and master_port?",
                info.rank,
                info.world_size,
                info.world_size,
                info.master_addr,
                info.master_port,
                timeout.as_secs()
            )));
        }
        report.waiting(
            &deadline,
            &format!("{count} of {} joined", info.world_size),
            "",
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(Some(store))
}

/// The job this rank belongs to: SLURM's job where SLURM started the ranks (its steps may
/// hold a job's ranks between them), else empty (nothing tells jobs apart).
fn this_job() -> String {
    std::env::var("SLURM_JOB_ID")
        .map(|job| format!("SLURM job {job}"))
        .unwrap_or_default()
}

/// The host writes which job its store serves; a rank of another job is refused before it
/// joins: on a port that an earlier job (or a neighbour's on a shared node) still holds, it
/// would join that job's group.
fn check_same_job(
    info: &RankInfo,
    store: &Py<PyAny>,
    host_here: bool,
    ours: &str,
    deadline: &Deadline,
    stop_asked: fn() -> bool,
) -> Result<()> {
    let failed = |e: embedded_python::Error| cannot_meet(info, &trimmed(&e.0));
    if host_here {
        return embedded_python::with_python(|py| {
            store.bind(py).call_method1("set", ("job", ours))?;
            Ok(())
        })
        .map_err(failed);
    }
    loop {
        let theirs = embedded_python::with_python(|py| {
            let store = store.bind(py);
            if !store
                .call_method1("check", (vec!["job"],))?
                .extract::<bool>()?
            {
                return Ok(None);
            }
            let bytes: Vec<u8> = store.call_method1("get", ("job",))?.extract()?;
            Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
        })
        .map_err(failed)?;
        match theirs {
            Some(theirs) if theirs == ours => return Ok(()),
            Some(theirs) => {
                let named = |job: &str| match job {
                    "" => "one SLURM did not start".to_owned(),
                    job => job.to_owned(),
                };
                return Err(Error::Config(format!(
                    "master_port={} at {} is held by another job ({}), not this one ({}): give \
                     each job a master_port of its own (scripts/slurm/train.sbatch derives one \
                     from SLURM_JOB_ID)",
                    info.master_port,
                    info.master_addr,
                    named(&theirs),
                    named(ours)
                )));
            }
            None if stop_asked() => return Err(stopped(info)),
            None if deadline.passed() => {
                return Err(cannot_meet(
                    info,
                    "its store never said which job it serves",
                ))
            }
            None => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// One attempt at the store: hosted here (bound at once, not waiting for the others), or
/// reached within a slice.
fn connect(info: &RankInfo, host: &Host) -> embedded_python::Result<Py<PyAny>> {
    embedded_python::with_python(|py| {
        let dist = py.import("torch.distributed")?;
        let timedelta = py.import("datetime")?.getattr("timedelta")?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("is_master", host.this_rank)?;
        kwargs.set_item("timeout", timedelta.call((0, SLICE.as_secs_f64()), None)?)?;
        if host.this_rank {
            kwargs.set_item("wait_for_workers", false)?;
        }
        let store = dist.getattr("TCPStore")?.call(
            (info.master_addr.as_str(), info.master_port, info.world_size),
            Some(&kwargs),
        )?;
        let store = dist
            .getattr("PrefixStore")?
            .call1((host.prefix.as_str(), store))?;
        Ok(store.unbind())
    })
}

/// Says, now and then, what a rank waits for.
struct Report<'a> {
    info: &'a RankInfo,
    timeout: Duration,
    next: Duration,
}

impl<'a> Report<'a> {
    fn new(info: &'a RankInfo, timeout: Duration) -> Self {
        Self {
            info,
            timeout,
            next: FIRST_REPORT,
        }
    }

    fn waiting(&mut self, deadline: &Deadline, state: &str, last_error: &str) {
        let waited = deadline.waited();
        if waited < self.next {
            return;
        }
        self.next = waited + REPORT_EVERY;
        let said = match last_error {
            "" => String::new(),
            error => format!(" ({})", trimmed(error)),
        };
        errln!(
            "rank {}: waiting {} s for the other ranks at {}:{}: {state}{said}; up to {} s \
             (dist_timeout); Ctrl-C stops",
            self.info.rank,
            waited.as_secs(),
            self.info.master_addr,
            self.info.master_port,
            self.timeout.as_secs()
        );
    }
}

/// A Python error's message without its traceback and without the C++ frames c10d appends
/// ("Exception raised from ...", "frame #N: ...").
pub(super) fn without_frames(text: &str) -> String {
    let message = embedded_python::message(text);
    let lines: Vec<&str> = message
        .lines()
        .take_while(|line| !line.trim_start().starts_with("Exception raised from"))
        .filter(|line| {
            let line = line.trim_start();
            !line.starts_with("frame #") && !line.starts_with("<omitting python frames>")
        })
        .collect();
    lines.join("\n").trim().to_owned()
}

/// A Python error's message alone: its first line, without the traceback or c10d's frames.
pub(super) fn trimmed(text: &str) -> String {
    let message = embedded_python::message(text);
    message.lines().next().unwrap_or(message).trim().to_owned()
}

fn cannot_meet(info: &RankInfo, why: &str) -> Error {
    Error::Collective(format!(
        "cannot join the process group at {}:{} as rank {} of {} ({why}); check master_addr and \
         master_port (is the port free and reachable?), or raise dist_timeout",
        info.master_addr, info.master_port, info.rank, info.world_size
    ))
}

pub(super) fn stopped(info: &RankInfo) -> Error {
    Error::Stopped(format!(
        "rank {} was asked to stop while it waited for the other ranks at {}:{}",
        info.rank, info.master_addr, info.master_port
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// c10d's frames go, every line of the message stays.
    #[test]
    fn c10d_frames_are_dropped_and_the_message_kept() {
        let text = "DistNetworkError: Failed to recv, got 0 bytes.\nConnection was likely \
                    closed.\nException raised from recvBytes at socket.cpp:670 (most recent call \
                    first):\nframe #0: c10::Error::Error + 0x9d\n<omitting python frames>\n\
                    frame #17: main";
        assert_eq!(
            without_frames(text),
            "DistNetworkError: Failed to recv, got 0 bytes.\nConnection was likely closed."
        );
    }
}
