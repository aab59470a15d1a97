//! One environment worker process as its parent sees it: starting it, talking to it, noticing
//! its death, and ending it.
use std::fs::File;
use std::io::{self, BufReader};
use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use memmap2::MmapMut;

use super::protocol::{self, Decoder};
use super::{ReplyLimit, StopProbe, WorkerCommand, STOP_PATIENCE};
use crate::deadline::Deadline;
use crate::{Error, Result};

/// How long a worker whose channel broke may take to be reaped before it is killed.
const DEATH_GRACE: Duration = Duration::from_secs(3);
/// How long a worker may take to exit after its stdin closes before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// Math libraries in a worker get one thread each: a worker is meant to use one core.
const ONE_THREAD: [&str; 3] = ["OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"];

pub struct WorkerProcess {
    task: String,
    /// The global indices of the envs this worker runs.
    envs: Range<usize>,
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    /// The shared region (a memfd the worker inherited as `SHM_FD`), mapped once sized.
    shm: File,
    region: Option<MmapMut>,
    /// Why the worker is gone, once it is.
    dead: Option<String>,
    /// Ended with the others ([`end_all`]): its drop waits for nothing.
    ended: bool,
    reply_limit: Option<ReplyLimit>,
    /// Whether its owner is to stop, and how long a reply may then still take.
    stop: Option<StopProbe>,
    stop_patience: Duration,
    /// `rank 1: ` (from the command's owner), or empty.
    owner: String,
    /// What the last command asked for, and when: its reply is due within the limit from then,
    /// so workers asked together are waited for together, not one limit after another.
    asked: &'static str,
    asked_at: Instant,
}

impl WorkerProcess {
    pub fn spawn(worker: &WorkerCommand, task: &str, envs: Range<usize>) -> Result<Self> {
        let start_error = |reason: String| Error::WorkerStart {
            program: worker.program.display().to_string(),
            reason,
        };
        let shm = memfd().map_err(|e| start_error(format!("no shared memory: {e}")))?;
        let mut command = Command::new(&worker.program);
        command
            .args(&worker.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        command.envs(worker.env.iter().map(|(key, value)| (key, value)));
        for var in ONE_THREAD {
            if std::env::var_os(var).is_none() {
                command.env(var, "1");
            }
        }
        let parent = std::process::id();
        let shm_fd = shm.as_raw_fd();
        let highest_fd = highest_open_fd();
        // SAFETY: the hook only makes async-signal-safe system calls.
        unsafe { command.pre_exec(move || prepare_child(parent, shm_fd, highest_fd)) };
        let mut child =
            spawn_from_lasting_thread(command).map_err(|e| start_error(e.to_string()))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(start_error("its stdin and stdout are not pipes".into()));
        };
        Ok(Self {
            task: task.into(),
            envs,
            child,
            stdin: Some(stdin),
            stdout: BufReader::new(stdout),
            shm,
            region: None,
            dead: None,
            ended: false,
            reply_limit: worker.reply_limit.clone(),
            stop: None,
            stop_patience: STOP_PATIENCE,
            owner: match worker.owner.as_str() {
                "" => String::new(),
                owner => format!("{owner}: "),
            },
            asked: protocol::command_name(0),
            asked_at: Instant::now(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn envs(&self) -> Range<usize> {
        self.envs.clone()
    }

    /// Sizes the shared region to `bytes` and maps it on this side.
    pub fn map(&mut self, bytes: usize) -> Result<()> {
        let what = |e: io::Error| self.failure(format!("has no shared region: {e}"));
        self.shm.set_len(bytes as u64).map_err(what)?;
        // SAFETY: the region is shared with the worker only, which touches it only between
        // a command and its reply, while this side waits.
        let map = unsafe { MmapMut::map_mut(&self.shm) }.map_err(what)?;
        self.region = Some(map);
        Ok(())
    }

    /// The shared region (empty before [`Self::map`]).
    pub fn region(&self) -> &[u8] {
        self.region.as_deref().unwrap_or(&[])
    }

    pub fn region_mut(&mut self) -> &mut [u8] {
        self.region.as_deref_mut().unwrap_or(&mut [])
    }

    /// Waits for replies watching `probe`: see [`super::VectorEnv::give_up_hung_workers_at_stop`].
    pub fn watch_stops(&mut self, probe: StopProbe) {
        self.stop = Some(probe);
    }

    /// Sends a command; pair it with one [`Self::receive`].
    pub fn send(&mut self, tag: u8, payload: &[u8]) -> Result<()> {
        if let Some(what) = &self.dead {
            return Err(self.failure(what.clone()));
        }
        self.asked = protocol::command_name(tag);
        self.asked_at = Instant::now();
        let sent = match self.stdin.as_mut() {
            Some(stdin) => protocol::write_frame(stdin, tag, payload),
            None => Err(io::ErrorKind::BrokenPipe.into()),
        };
        sent.map_err(|e| self.died(&e))
    }

    /// Waits for the reply to the last command: its payload, or the error it reports.
    pub fn receive(&mut self) -> Result<Vec<u8>> {
        if let Some(what) = &self.dead {
            return Err(self.failure(what.clone()));
        }
        // A frame already buffered is an answer; otherwise wait at most the limit for one to
        // start (a worker writes each frame at once), watching for a stop.
        let watched = self.reply_limit.is_some() || self.stop.is_some();
        if watched && self.stdout.buffer().is_empty() {
            let wait = Wait {
                limit: self.reply_limit.clone().map(|limit| {
                    let deadline = Deadline::since(self.asked_at, limit.after);
                    (deadline, limit)
                }),
                stop: self.stop.map(|probe| (probe, self.stop_patience)),
            };
            match wait.until_readable(self.stdout.get_ref().as_raw_fd()) {
                Ok(Waited::Readable) => {}
                Ok(Waited::Silent(limit)) => return Err(self.silent(limit)),
                Ok(Waited::GivenUpAtStop) => return Err(self.given_up_at_stop()),
                Err(e) => return Err(self.died(&e)),
            }
        }
        let frame = match protocol::read_frame(&mut self.stdout) {
            Ok(Some(frame)) => frame,
            Ok(None) => return Err(self.died(&io::ErrorKind::UnexpectedEof.into())),
            Err(e) => return Err(self.died(&e)),
        };
        match frame {
            (protocol::OK, payload) => Ok(payload),
            (protocol::ERR, payload) => {
                let mut d = Decoder(&payload);
                let env = d.u32().unwrap_or(protocol::NO_ENV);
                let message = String::from_utf8_lossy(d.rest()).into_owned();
                match usize::try_from(env) {
                    Ok(local) if env != protocol::NO_ENV && local < self.envs.len() => {
                        Err(Error::WorkerEnv {
                            task: self.task.clone(),
                            index: self.envs.start + local,
                            pid: self.pid(),
                            message,
                        })
                    }
                    _ => Err(self.failure(format!("failed: {message}"))),
                }
            }
            (tag, _) => {
                let e = protocol::invalid(format!("reply tag {tag}"));
                Err(self.died(&e))
            }
        }
    }

    pub fn call(&mut self, tag: u8, payload: &[u8]) -> Result<Vec<u8>> {
        self.send(tag, payload)?;
        self.receive()
    }

    /// Whether the worker still runs, asking nothing of it (no reply is waited for): one that
    /// died is named as [`Self::call`] would name it, and gone for good.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(what) = &self.dead {
            return Err(self.failure(what.clone()));
        }
        match self.child.try_wait() {
            Ok(Some(status)) => {
                self.stdin = None;
                let what = format!("died: {}", describe(status));
                self.dead = Some(what.clone());
                Err(self.failure(what))
            }
            // Running, or not to be told: the next call finds out.
            Ok(None) | Err(_) => Ok(()),
        }
    }

    /// The channel broke: the worker died (or, if still running after a grace period, is
    /// killed). Either way it is gone for good.
    fn died(&mut self, cause: &io::Error) -> Error {
        self.stdin = None;
        let what = match wait_for_exit(&mut self.child, DEATH_GRACE) {
            Some(status) => format!("died: {}", describe(status)),
            None => {
                self.kill();
                format!("broke its channel ({cause}) and was killed")
            }
        };
        self.dead = Some(what.clone());
        self.failure(what)
    }

    /// The worker is alive but did not answer in time: it is killed (a hung renderer or
    /// driver may never return) and gone for good.
    fn silent(&mut self, limit: ReplyLimit) -> Error {
        self.kill();
        let limit = format!("{} s ({})", limit.after.as_secs_f64(), limit.setting);
        self.dead = Some(format!(
            "did not answer `{}` within {limit} and was killed",
            self.asked
        ));
        Error::WorkerSilent {
            owner: self.owner.clone(),
            task: self.task.clone(),
            envs: self.env_names(),
            pid: self.pid(),
            asked: self.asked,
            limit,
        }
    }

    /// The worker did not answer within its patience after a stop was asked: it is killed, as
    /// a silent one is.
    fn given_up_at_stop(&mut self) -> Error {
        self.kill();
        let patience = self.stop_patience.as_secs_f64();
        self.dead = Some(format!(
            "did not answer `{}` within {patience} s of the stop and was killed",
            self.asked
        ));
        Error::GivenUpAtStop {
            owner: self.owner.clone(),
            task: self.task.clone(),
            envs: self.env_names(),
            pid: self.pid(),
            asked: self.asked,
            patience,
        }
    }

    fn env_names(&self) -> String {
        match self.envs.len() {
            1 => format!("env {}", self.envs.start),
            _ => format!("envs {}-{}", self.envs.start, self.envs.end - 1),
        }
    }

    fn failure(&self, what: String) -> Error {
        Error::Worker {
            task: self.task.clone(),
            envs: self.env_names(),
            pid: self.pid(),
            what,
        }
    }

    /// Closes the worker's stdin: it exits once it has read everything before.
    pub fn close(&mut self) {
        self.stdin = None;
    }

    /// Kills the worker and reaps it, waiting a grace period at most: a process stuck in the
    /// kernel (a hung driver) dies only when its call returns, and nobody should wait for
    /// that; it is left to die with this process (it is bound to it).
    pub fn kill(&mut self) {
        self.stdin = None;
        let _ = self.child.kill();
        let _ = wait_for_exit(&mut self.child, DEATH_GRACE);
    }

    /// Whether the worker has exited (and is reaped).
    fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }
}

/// Ends `workers` together, as [`WorkerProcess`]'s drop ends one, but with one grace for all
/// rather than one per worker in turn (64 hung workers would take minutes, past a stop's
/// grace): stdins closed at once, [`EXIT_GRACE`] for all to exit, then those left killed at
/// once and [`DEATH_GRACE`] for all to be reaped. One still there is stuck in the kernel and
/// left to die with this process.
pub fn end_all(workers: &mut [WorkerProcess]) {
    workers.iter_mut().for_each(WorkerProcess::close);
    // Every worker asked (and reaped if it exited), not only those up to the first running.
    let all_exited = |workers: &mut [WorkerProcess]| {
        let mut all = true;
        for worker in workers.iter_mut() {
            all &= worker.exited();
        }
        all
    };
    let wait = |workers: &mut [WorkerProcess], grace: Duration| {
        let deadline = Instant::now() + grace;
        while !all_exited(workers) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    wait(workers, EXIT_GRACE);
    for worker in workers.iter_mut() {
        if !worker.exited() {
            let _ = worker.child.kill();
        }
    }
    wait(workers, DEATH_GRACE);
    for worker in workers.iter_mut() {
        worker.ended = true;
    }
}

impl Drop for WorkerProcess {
    /// Ends the worker and reaps it (no zombie), killing it if it does not exit by itself;
    /// nothing more once [`end_all`] ended it.
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        self.close();
        if wait_for_exit(&mut self.child, EXIT_GRACE).is_none() {
            self.kill();
        }
    }
}

/// Runs in the child between fork and exec: dies with the parent, leaves Ctrl-C and SIGTERM
/// to the parent (which then ends it), and finds the shared region at `SHM_FD`.
fn prepare_child(parent: u32, shm_fd: RawFd, highest_fd: RawFd) -> io::Result<()> {
    let check = |rc: libc::c_int| {
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    // SAFETY: async-signal-safe system calls on this process and its own descriptors.
    unsafe {
        check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL))?;
        if libc::getppid() as u32 != parent {
            // No allocation between fork and exec: ESRCH, the parent is gone.
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGTERM, libc::SIG_IGN);
        // A terminal's hangup (an ssh session ending under `nohup`) reaches the whole process
        // group; the rank decides what it means, and the exec above reset its handler.
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
        if shm_fd == protocol::SHM_FD {
            check(libc::fcntl(shm_fd, libc::F_SETFD, 0))?;
        } else {
            check(libc::dup2(shm_fd, protocol::SHM_FD))?;
        }
        // Nothing else of the parent's crosses the exec (its collectives' sockets and pipes,
        // which a worker, or a process it leaves, would hold open): close-on-exec for every
        // descriptor past the region's. Kernels before 5.11 (RHEL 8's 4.18, common on
        // clusters) lack the call: there, each descriptor up to the highest the parent had.
        let first = protocol::SHM_FD + 1;
        let marked = libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        );
        if marked != 0 {
            close_on_exec_through(first, highest_fd);
        }
        Ok(())
    }
}

/// Descriptors other threads open between [`highest_open_fd`] and the fork: the kernel gives
/// each the lowest free number, so they lie at most this far past the highest seen.
const FDS_OPENED_MEANWHILE: RawFd = 1024;

/// The highest descriptor open in this process, for [`close_on_exec_through`]; without
/// `/proc`, the process's limit on descriptors (at most 2^16).
fn highest_open_fd() -> RawFd {
    let listed = std::fs::read_dir("/proc/self/fd").ok().map(|dir| {
        dir.flatten()
            .filter_map(|fd| fd.file_name().to_str()?.parse::<RawFd>().ok())
            .max()
            .unwrap_or(0)
    });
    listed.map_or_else(
        || {
            let mut limit = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: getrlimit writes the struct it is given.
            let known = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
            match known {
                true => limit.rlim_cur.min(1 << 16) as RawFd,
                false => 1 << 16,
            }
        },
        |highest| highest.saturating_add(FDS_OPENED_MEANWHILE),
    )
}

/// Marks descriptors `first..=last` close-on-exec, one by one (async-signal-safe: for a child
/// between fork and exec).
fn close_on_exec_through(first: RawFd, last: RawFd) {
    for fd in first..=last {
        // SAFETY: fcntl on a descriptor number; a number not open fails harmlessly.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 && flags & libc::FD_CLOEXEC == 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
}

/// An anonymous shared memory file, closed on exec (the worker gets its own copy at SHM_FD).
fn memfd() -> io::Result<File> {
    // SAFETY: memfd_create with a valid name; the new descriptor is owned by the File.
    let fd = unsafe { libc::memfd_create(c"tdmpc2-vector-env".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Spawns from one thread that lives as long as the process: PR_SET_PDEATHSIG fires when the
/// *thread* that forked the child exits, and a vector env may outlive the thread that made it.
fn spawn_from_lasting_thread(command: Command) -> io::Result<Child> {
    type Job = (Command, mpsc::Sender<io::Result<Child>>);
    static SPAWNER: Mutex<Option<mpsc::Sender<Job>>> = Mutex::new(None);
    let (reply, answer) = mpsc::channel();
    {
        let mut spawner = SPAWNER.lock().unwrap_or_else(PoisonError::into_inner);
        if spawner.is_none() {
            let (jobs, queue) = mpsc::channel::<Job>();
            std::thread::Builder::new()
                .name("env-worker-spawner".into())
                .spawn(move || {
                    for (mut command, reply) in queue {
                        let _ = reply.send(command.spawn());
                    }
                })?;
            *spawner = Some(jobs);
        }
        if let Some(jobs) = spawner.as_ref() {
            jobs.send((command, reply))
                .map_err(|_| io::Error::other("the spawner thread is gone"))?;
        }
    }
    answer
        .recv()
        .map_err(|_| io::Error::other("the spawner thread is gone"))?
}

/// A wait for a worker's reply: up to its deadline (none: as long as it lives), and a stop's
/// patience once its probe says the process is to stop.
struct Wait {
    limit: Option<(Deadline, ReplyLimit)>,
    stop: Option<(StopProbe, Duration)>,
}

#[derive(Debug, PartialEq, Eq)]
enum Waited {
    /// Something to read: data, end of file or an error.
    Readable,
    /// The deadline of this limit passed.
    Silent(ReplyLimit),
    /// The patience after a stop passed.
    GivenUpAtStop,
}

/// How often a wait that watches for a stop looks.
const STOP_LOOK: Duration = Duration::from_millis(200);

/// When a wait first saw that this process is to stop: every wait's patience counts from it, so
/// that workers hung together (a driver, a stalled disk) take one patience, not one each.
static STOP_SEEN: OnceLock<Instant> = OnceLock::new();

impl Wait {
    fn until_readable(&self, fd: RawFd) -> io::Result<Waited> {
        loop {
            let mut stop_seen = STOP_SEEN.get().copied();
            if let Some((probe, patience)) = self.stop {
                if stop_seen.is_none() && probe.asked() {
                    stop_seen = Some(*STOP_SEEN.get_or_init(Instant::now));
                }
                if stop_seen.is_some_and(|seen| seen.elapsed() >= patience) {
                    return Ok(Waited::GivenUpAtStop);
                }
            }
            // A continue after a stop of the job gives the wait its time again: the poll ends
            // at the old deadline, and the loop waits on.
            let deadline = self.limit.as_ref().map(|(deadline, _)| deadline);
            let mut slice = deadline.map_or(Duration::MAX, Deadline::left);
            if let Some((_, patience)) = self.stop {
                let patience_left =
                    stop_seen.map_or(STOP_LOOK, |seen| patience.saturating_sub(seen.elapsed()));
                slice = slice.min(STOP_LOOK).min(patience_left);
            }
            let millis = slice.as_millis().min(i32::MAX as u128) as i32;
            let mut poll = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd for a descriptor this process owns.
            match unsafe { libc::poll(&mut poll, 1, millis) } {
                0 => match &self.limit {
                    Some((deadline, limit)) if deadline.passed() => {
                        return Ok(Waited::Silent(limit.clone()))
                    }
                    _ => continue,
                },
                n if n > 0 => return Ok(Waited::Readable),
                _ => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
            }
        }
    }
}

fn wait_for_exit(child: &mut Child, grace: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + grace;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => return None,
        }
    }
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(signal)) => {
            let name = match signal {
                libc::SIGKILL => " (SIGKILL)",
                libc::SIGSEGV => " (SIGSEGV)",
                libc::SIGABRT => " (SIGABRT)",
                libc::SIGTERM => " (SIGTERM)",
                libc::SIGBUS => " (SIGBUS)",
                _ => "",
            };
            format!("killed by signal {signal}{name}")
        }
        _ => status.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deadline::{note_continue, NOTING_CONTINUES};

    /// Where `close_range` is missing (kernels before 5.11), the descriptors a child would
    /// inherit are marked one by one: a pipe opened without close-on-exec crosses an exec
    /// without it and not with it.
    #[test]
    fn descriptors_are_closed_on_exec_without_close_range() {
        let mut pipe = [0; 2];
        // SAFETY: pipe(2) into a two-element array, its ends moved past the numbers `ls`
        // opens itself (F_DUPFD copies no close-on-exec flag); all are closed below.
        let fds = unsafe {
            assert_eq!(libc::pipe(pipe.as_mut_ptr()), 0);
            pipe.map(|fd| {
                let high = libc::fcntl(fd, libc::F_DUPFD, 200);
                libc::close(fd);
                high
            })
        };
        assert!(fds.iter().all(|&fd| fd >= 200), "{fds:?}");
        let highest = highest_open_fd();
        let listed = |mark: bool| -> Vec<RawFd> {
            let mut command = Command::new("ls");
            command.arg("/proc/self/fd");
            if mark {
                // SAFETY: the hook only makes async-signal-safe system calls.
                unsafe {
                    command.pre_exec(move || {
                        close_on_exec_through(protocol::SHM_FD, highest);
                        Ok(())
                    })
                };
            }
            let out = command.output().expect("ls runs");
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .filter_map(|fd| fd.parse().ok())
                .collect()
        };
        let (plain, marked) = (listed(false), listed(true));
        // SAFETY: the two descriptors pipe(2) opened above.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        assert!(
            fds.iter().all(|fd| plain.contains(fd)),
            "{fds:?}, {plain:?}"
        );
        assert!(
            !fds.iter().any(|fd| marked.contains(fd)),
            "{fds:?}, {marked:?}"
        );
    }

    /// Workers that do not exit when their stdin closes (busy, or ignoring it) are ended
    /// together, within one grace for all, not one after another, and none is left a zombie.
    #[test]
    fn workers_that_do_not_exit_are_ended_together() {
        let command = crate::vector::WorkerCommand::new("/bin/sleep", &["600"]);
        let mut workers: Vec<WorkerProcess> = (0..6)
            .map(|i| WorkerProcess::spawn(&command, "sleep", i..i + 1).unwrap())
            .collect();
        let pids: Vec<u32> = workers.iter().map(WorkerProcess::pid).collect();
        let started = Instant::now();
        end_all(&mut workers);
        let took = started.elapsed();
        // One after another, they would take 6 × EXIT_GRACE (12 s).
        assert!(took < EXIT_GRACE * 3, "{took:?}");
        for pid in pids {
            assert!(
                !std::path::Path::new(&format!("/proc/{pid}")).exists(),
                "worker {pid} reaped"
            );
        }
        drop(workers);
        assert!(
            started.elapsed() < EXIT_GRACE * 3,
            "their drops wait for nothing more"
        );
    }

    /// [`Wait::until_readable`] up to `deadline` alone: whether `fd` became readable.
    fn wait_readable(fd: RawFd, deadline: Deadline) -> io::Result<bool> {
        let limit = ReplyLimit {
            after: deadline.limit(),
            setting: "test".into(),
        };
        let wait = Wait {
            limit: Some((deadline, limit)),
            stop: None,
        };
        Ok(wait.until_readable(fd)? == Waited::Readable)
    }

    fn stop_asked() -> bool {
        true
    }

    /// Once its owner is to stop, a silent worker is given up after the stop's patience (not
    /// its reply limit), killed and named; an answer within the patience is taken.
    #[test]
    fn a_worker_silent_at_a_stop_is_given_up_after_its_patience() {
        let mut command = crate::vector::WorkerCommand::new("/bin/sleep", &["600"]);
        command.reply_limit = Some(ReplyLimit {
            after: Duration::from_secs(600),
            setting: "env_timeout".into(),
        });
        let mut worker = WorkerProcess::spawn(&command, "sleep", 2..4).unwrap();
        worker.watch_stops(StopProbe(stop_asked));
        worker.stop_patience = Duration::from_millis(300);
        let pid = worker.pid();
        let started = Instant::now();
        worker.send(protocol::STEP, &[]).unwrap();
        let e = worker.receive().unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(30), "{e}");
        assert!(e.given_up_at_stop(), "{e}");
        assert_eq!(
            e.to_string(),
            format!(
                "the environment worker (pid {pid}) running `sleep` envs 2-3 did not answer \
                 `step` within 0.3 s of the stop and was killed"
            )
        );
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
        // Gone for good: the next call says so at once.
        assert!(worker.call(protocol::STEP, &[]).is_err());

        // Workers hung together take one patience, counted from when the stop was first seen
        // (one after another, they would take one each).
        let patience = Duration::from_secs(2);
        let started = Instant::now();
        for envs in [0..1, 1..2] {
            let mut worker = WorkerProcess::spawn(&command, "sleep", envs).unwrap();
            worker.watch_stops(StopProbe(stop_asked));
            worker.stop_patience = patience;
            worker.send(protocol::STEP, &[]).unwrap();
            assert!(worker.receive().unwrap_err().given_up_at_stop());
        }
        assert!(started.elapsed() < patience * 2, "{:?}", started.elapsed());

        let (reader, mut writer) = std::io::pipe().unwrap();
        let answer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            std::io::Write::write_all(&mut writer, b"x").unwrap();
            writer
        });
        let wait = Wait {
            limit: None,
            stop: Some((StopProbe(stop_asked), Duration::from_secs(30))),
        };
        assert_eq!(
            wait.until_readable(reader.as_raw_fd()).unwrap(),
            Waited::Readable
        );
        drop(answer.join().unwrap());
    }

    /// A continue while a worker's answer is awaited (the job was stopped) gives the wait its
    /// whole limit again; an answer within it is taken.
    #[test]
    fn a_continue_gives_a_wait_for_a_worker_its_limit_again() {
        let _alone = NOTING_CONTINUES.lock();
        let (reader, mut writer) = std::io::pipe().unwrap();
        // The answer comes a quarter of the limit before the renewed one ends: room for a
        // thread woken late on a busy machine.
        let limit = Duration::from_secs(2);
        let started = Instant::now();
        let deadline = Deadline::after(limit);
        let answer = std::thread::spawn(move || {
            std::thread::sleep(limit / 2);
            note_continue();
            std::thread::sleep(limit * 3 / 4);
            std::io::Write::write_all(&mut writer, b"x").unwrap();
            writer
        });
        let readable = wait_readable(reader.as_raw_fd(), deadline).unwrap();
        let waited = started.elapsed();
        let writer = answer.join().unwrap();
        assert!(
            readable,
            "the answer came within the limit after the continue"
        );
        assert!(waited > limit, "{waited:?}");

        let mut byte = [0u8; 1];
        std::io::Read::read_exact(&mut &reader, &mut byte).unwrap();
        // Silent for the limit with no continue: passed.
        let silent = Deadline::after(Duration::from_millis(100));
        assert!(!wait_readable(reader.as_raw_fd(), silent).unwrap());
        drop(writer);
    }
}
