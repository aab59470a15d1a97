//! Sweeps, hydra's way: `tdmpc2 train --multirun seed=1,2 lr=3e-4,1e-3` runs every combination
//! of the comma-separated values as its own `tdmpc2 train` child process, each in its own run
//! directory, then writes a summary (sweep.csv, sweep.json) beside them.
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::config::{Config, Source};
use crate::error::{Error, Result, STOPPED_EXIT_CODE};
use crate::tools::curves::Metrics;

/// The most jobs one sweep makes: more is a typo (every combination is checked before any
/// runs).
const MOST_JOBS: usize = 10_000;

/// One combination of the swept values.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub index: usize,
    /// The swept settings and this job's value of each, in command-line order.
    pub choices: Vec<(String, String)>,
    /// Every override this job runs with, `run_dir` included.
    pub overrides: Vec<String>,
    pub run_dir: PathBuf,
}

impl Job {
    fn describe(&self) -> String {
        self.choices
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// What became of a job.
#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    Ok,
    Failed(String),
    Stopped,
    NotStarted,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Status::Ok => write!(f, "ok"),
            Status::Failed(why) => write!(f, "failed ({why})"),
            Status::Stopped => write!(f, "stopped"),
            Status::NotStarted => write!(f, "not started"),
        }
    }
}

/// Splits a value at its top-level commas: `1,2` is two values, `[1,2]` and `"a,b"` are one.
pub fn split_values(raw: &str) -> Vec<String> {
    let (mut values, mut current, mut depth, mut quote) = (vec![], String::new(), 0i32, None);
    for c in raw.chars() {
        match (c, quote) {
            ('"' | '\'', None) => quote = Some(c),
            (c, Some(q)) if c == q => quote = None,
            ('[' | '{' | '(', None) => depth += 1,
            (']' | '}' | ')', None) => depth -= 1,
            (',', None) if depth == 0 => {
                values.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    values.push(current);
    values
}

/// The values a sweep takes from `raw`: its top-level commas, or hydra's `choice(a,b)` and
/// `range(start,stop[,step])` (integers, `stop` excluded, as Python's and hydra's).
fn sweep_values(key: &str, raw: &str) -> Result<Vec<String>> {
    refuse_other_sweep_calls(key, raw)?;
    let call = |name: &str| {
        raw.trim()
            .strip_prefix(name)
            .and_then(|rest| rest.strip_prefix('('))
            .and_then(|rest| rest.strip_suffix(')'))
    };
    if let Some(inner) = call("choice") {
        let values: Vec<String> = split_values(inner)
            .into_iter()
            .map(|v| v.trim().to_owned())
            .collect();
        if values.iter().any(String::is_empty) {
            return Err(Error::Config(format!(
                "{key}={raw}: choice takes values, none of them empty, e.g. choice(a,b)"
            )));
        }
        return Ok(values);
    }
    let Some(inner) = call("range") else {
        return Ok(split_values(raw));
    };
    let bad = || {
        Error::Config(format!(
            "{key}={raw}: range takes whole numbers, range(start,stop) or range(start,stop,step) \
             with a step other than 0 (stop excluded)"
        ))
    };
    let numbers = inner
        .split(',')
        .map(|n| n.trim().parse::<i64>().map_err(|_| bad()))
        .collect::<Result<Vec<i64>>>()?;
    let (start, stop, step) = match numbers[..] {
        [start, stop] => (start, stop, 1),
        [start, stop, step] if step != 0 => (start, stop, step),
        _ => return Err(bad()),
    };
    let (start, stop, step) = (i128::from(start), i128::from(stop), i128::from(step));
    let (span, stride) = match step > 0 {
        true => (stop - start, step),
        false => (start - stop, -step),
    };
    let count = (span.max(0) as u128).div_ceil(stride as u128) as i128;
    if count == 0 || count > MOST_JOBS as i128 {
        return Err(Error::Config(format!(
            "{key}={raw} gives {count} values: a sweep takes 1 to {MOST_JOBS}"
        )));
    }
    Ok((0..count).map(|i| (start + i * step).to_string()).collect())
}

/// Hydra's sweep functions this sweep does not take (`interval`, `glob`, ...: an optimising
/// sweeper's), and `range(`/`choice(` calls left open, are refused naming the setting.
fn refuse_other_sweep_calls(key: &str, raw: &str) -> Result<()> {
    let raw = raw.trim();
    let Some((name, rest)) = raw.split_once('(') else {
        return Ok(());
    };
    let taken = ["range", "choice"];
    let others = ["interval", "glob", "shuffle", "sort", "tag", "extend_list"];
    if others.contains(&name) {
        return Err(Error::Config(format!(
            "{key}={raw}: {name}() is not taken here: this sweep runs lists (a,b), range() and \
             choice()"
        )));
    }
    if taken.contains(&name) && !rest.ends_with(')') {
        return Err(Error::Config(format!(
            "{key}={raw}: {name}( is not closed: write {name}(...)"
        )));
    }
    Ok(())
}

/// Expands the overrides into jobs: the cartesian product of the swept values, the last
/// setting varying fastest. `base` is the directory the job directories go into.
pub fn expand(overrides: &[String], base: &Path) -> Result<Vec<Job>> {
    let mut fixed = Vec::new();
    let mut swept: Vec<(String, Vec<String>)> = Vec::new();
    for arg in overrides {
        let Some((key, raw)) = arg.split_once('=') else {
            return Err(Error::Config(format!(
                "cannot parse '{arg}': overrides are key=value (for example steps=100000)"
            )));
        };
        let values = sweep_values(key.trim(), raw)?;
        if values.len() == 1 {
            fixed.push(format!("{key}={}", values[0]));
            continue;
        }
        let key = key.trim().trim_start_matches('+').to_string();
        if key == "run_dir" {
            return Err(Error::Config(
                "run_dir cannot be swept: --multirun gives every job its own directory under \
                 run_dir (or runs/<task>/<exp_name>)"
                    .into(),
            ));
        }
        if values.iter().any(|v| v.trim().is_empty()) {
            return Err(Error::Config(format!(
                "{arg}: an empty value in a sweep; write the values as {key}=a,b,c"
            )));
        }
        swept.push((key, values));
    }
    for (key, _) in &swept {
        let given = overrides.iter().filter(|o| is_key(o, key)).count();
        if given > 1 {
            return Err(Error::Config(format!(
                "{key} is swept and given {given} times; give all its values in one {key}=a,b,c"
            )));
        }
    }
    let total = swept
        .iter()
        .try_fold(1usize, |n, (_, values)| n.checked_mul(values.len()))
        .filter(|&n| n <= MOST_JOBS)
        .ok_or_else(|| {
            let counts: Vec<String> = swept
                .iter()
                .map(|(key, values)| format!("{key}: {}", values.len()))
                .collect();
            Error::Config(format!(
                "the sweep makes more than {MOST_JOBS} jobs ({}); sweep fewer values at once",
                counts.join(", ")
            ))
        })?;
    let mut jobs = Vec::with_capacity(total);
    for index in 0..total {
        let mut rest = index;
        let mut choices = vec![(String::new(), String::new()); swept.len()];
        for (slot, (key, values)) in swept.iter().enumerate().rev() {
            choices[slot] = (key.clone(), values[rest % values.len()].clone());
            rest /= values.len();
        }
        let run_dir = base.join(slug(index, &choices));
        let mut job_overrides = fixed.clone();
        job_overrides.retain(|o| !is_key(o, "run_dir"));
        job_overrides.extend(choices.iter().map(|(k, v)| format!("{k}={v}")));
        job_overrides.push(format!("run_dir={}", run_dir.display()));
        jobs.push(Job {
            index,
            choices,
            overrides: job_overrides,
            run_dir,
        });
    }
    Ok(jobs)
}

fn is_key(arg: &str, key: &str) -> bool {
    arg.split_once('=')
        .is_some_and(|(k, _)| k.trim().trim_start_matches('+') == key)
}

/// A job's directory name: its index, then its choices (`3_seed=2_horizon=3`).
fn slug(index: usize, choices: &[(String, String)]) -> String {
    let mut name = index.to_string();
    for (k, v) in choices {
        name.push('_');
        name.push_str(k);
        name.push('=');
        name.push_str(v);
    }
    name.chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '=' | '.' | '_' | '-' | '+' => c,
            _ => '-',
        })
        .collect()
}

/// Ctrl-C and SIGTERM received: the first stops the sweep (each running job is asked once to
/// stop and checkpoints), a second kills the jobs.
static SIGNALS: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_signal(_: libc::c_int) {
    SIGNALS.fetch_add(1, Ordering::SeqCst);
}

fn stopping() -> bool {
    SIGNALS.load(Ordering::SeqCst) > 0
}

/// `tdmpc2 train --multirun ...`: the jobs of `sweep`'s overrides (comma-separated values
/// expanded), listed only with `list_only`, else run `jobs_at_once` at a time.
pub fn run(sweep: &Source, list_only: bool, jobs_at_once: Option<usize>) -> Result<()> {
    let cores = crate::device::cores();
    let parallel = jobs_at_once.unwrap_or(1);
    if parallel == 0 || parallel > cores {
        return Err(Error::Config(format!(
            "--jobs {parallel}: run between 1 and {cores} jobs at once (this machine has {cores} \
             CPU cores)"
        )));
    }
    sweep.refuse_derived_settings()?;
    let source = |overrides: Vec<String>| Source {
        overrides,
        ..sweep.clone()
    };
    let base = jobs_dir(sweep)?;
    if base.exists() && !base.is_dir() {
        return Err(Error::Config(format!(
            "run_dir={}: a file; a sweep puts each job's directory in it, so give a directory \
             (new or holding this sweep's jobs); no job was started",
            base.display()
        )));
    }
    let jobs = expand(&sweep.overrides, &base)?;
    let configs = validate(&jobs, &|o| source(o.to_vec()))?;
    if list_only {
        for job in &jobs {
            println!("job {}: {}", job.index, job.overrides.join(" "));
        }
        return Ok(());
    }
    refuse_another_sweeps_summary(&base, &jobs)?;
    let visible = visible_gpus();
    let gpus = gpu_slots(parallel, visible.clone());
    let per_job = gpus.as_ref().map_or(visible.len(), |slots| slots[0].len());
    if per_job > 0 {
        refuse_jobs_beyond_their_gpus(&jobs, &configs, per_job, parallel)?;
    }
    let mut flags = Vec::new();
    if let Some(name) = &sweep.config_name {
        flags.extend(["--config-name".to_string(), name.clone()]);
    }
    if let Some(path) = &sweep.config_path {
        flags.extend(["--config-path".to_string(), path.display().to_string()]);
    }
    let spawner = Spawner {
        exe: crate::this_binary::path()?,
        flags,
        cores,
        parallel,
        gpus,
    };
    println!(
        "sweep: {} jobs into {}, {parallel} at a time",
        jobs.len(),
        base.display()
    );
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let statuses = run_all(&spawner, &jobs, &configs);
    summarize(&jobs, &statuses, &base)
}

/// A folder holding another sweep's summary (other jobs) is refused: this sweep's would
/// replace it. The same sweep again (to go on with `resume=auto`) writes its own over it, as
/// over a summary that does not parse (nothing to keep).
fn refuse_another_sweeps_summary(base: &Path, jobs: &[Job]) -> Result<()> {
    let path = base.join("sweep.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(());
    };
    let Ok(summary) = serde_json::from_str::<Vec<serde_json::Value>>(&text) else {
        return Ok(());
    };
    let theirs: Vec<&str> = summary
        .iter()
        .filter_map(|job| job["run_dir"].as_str())
        .collect();
    let ours: Vec<String> = jobs
        .iter()
        .map(|job| job.run_dir.display().to_string())
        .collect();
    if theirs == ours {
        return Ok(());
    }
    Err(Error::Config(format!(
        "{} holds the summary of another sweep ({} jobs, not these {}): give this sweep a \
         folder of its own (exp_name=NAME or run_dir=DIR); no job was started",
        path.display(),
        theirs.len(),
        ours.len()
    )))
}

/// Where the job directories go: under run_dir when given, else runs/<task>/<exp_name> of the
/// first job.
fn jobs_dir(sweep: &Source) -> Result<PathBuf> {
    let mut first: Vec<String> = expand(&sweep.overrides, Path::new("."))?[0]
        .overrides
        .iter()
        .filter(|o| !is_key(o, "run_dir"))
        .cloned()
        .collect();
    first.extend(
        sweep
            .overrides
            .iter()
            .filter(|o| is_key(o, "run_dir"))
            .cloned(),
    );
    let first = Source {
        overrides: first,
        ..sweep.clone()
    };
    // A first job that does not load is reported by `validate`, naming the job.
    Ok(match Config::load(&first) {
        Ok(Config {
            run_dir: Some(dir), ..
        }) => PathBuf::from(dir),
        Ok(first) => PathBuf::from("runs")
            .join(&first.task)
            .join(&first.exp_name),
        Err(_) => PathBuf::from("runs"),
    })
}

/// Runs the jobs, `spawner.parallel` at a time, each slot taking the next job until none is
/// left or a stop was asked for; the status of each.
fn run_all(spawner: &Spawner, jobs: &[Job], configs: &[Config]) -> Vec<Status> {
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
struct Spawner {
    exe: PathBuf,
    /// --config-name and --config-path, as given to the sweep.
    flags: Vec<String>,
    cores: usize,
    parallel: usize,
    /// The GPUs of each slot of parallel jobs, when there are enough to go round.
    gpus: Option<Vec<Vec<String>>>,
}

impl Spawner {
    fn command(&self, job: &Job, config: &Config, slot: usize) -> Command {
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
fn visible_gpus() -> Vec<String> {
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
fn gpu_slots(parallel: usize, gpus: Vec<String>) -> Option<Vec<Vec<String>>> {
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
fn refuse_jobs_beyond_their_gpus(
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

/// Every job's configuration, loaded and resolved against its task before anything runs.
fn validate(jobs: &[Job], source: &dyn Fn(&[String]) -> Source) -> Result<Vec<Config>> {
    let mut specs: BTreeMap<String, Vec<envs::EnvSpec>> = BTreeMap::new();
    let mut configs = Vec::new();
    for job in jobs {
        let checked = (|| {
            let mut config = Config::load(&source(&job.overrides))?;
            let key = format!("{} obs={}", config.task, config.obs);
            if !specs.contains_key(&key) {
                let made = crate::config::task_specs(&config, config.env_options(0)?)?;
                specs.insert(key.clone(), made);
            }
            config.resolve_with_specs(&specs[&key])?;
            crate::trainer::run_dir::refuse_a_bad_start(&config)?;
            Ok::<_, Error>(config)
        })();
        match checked {
            Ok(config) => configs.push(config),
            Err(e) => {
                let message = e.to_string();
                let message = message.trim_start_matches("config error: ");
                let message = format!(
                    "--multirun job {} ({}): {message}; no job was started",
                    job.index,
                    job.describe()
                );
                return Err(if e.exit_code() == 2 {
                    Error::Config(message)
                } else {
                    Error::Other(message)
                });
            }
        }
    }
    Ok(configs)
}

/// Runs one job to its end, its output forwarded line by line behind `[job i]`; on a stop
/// request it passes SIGTERM on (the job checkpoints and exits), and on a second it kills the
/// job's processes. A job runs in a process group of its own, so that a terminal's Ctrl-C
/// reaches the sweep alone and the job is asked once (a launcher takes a second request as
/// "kill the ranks now").
fn run_job(mut command: Command, index: usize) -> Status {
    use std::os::unix::process::CommandExt;
    command
        .process_group(0)
        .env(
            crate::ddp::lifeline::LAUNCHER_PID_ENV,
            std::process::id().to_string(),
        )
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
        if SIGNALS.load(Ordering::SeqCst) > 1 && !killed {
            // SAFETY: kill of the job's process group (its pid: it leads the group it made).
            unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
            killed = true;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    for handle in forwards.into_iter().flatten() {
        let _ = handle.join();
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

/// The final evaluation return of a finished job, from its metrics.jsonl.
fn final_return(job: &Job) -> Option<f64> {
    Metrics::read(&job.run_dir)
        .ok()?
        .last("eval", "episode_reward")
}

/// Prints the table and writes sweep.csv and sweep.json into `base`; fails when a job did.
fn summarize(jobs: &[Job], statuses: &[Status], base: &Path) -> Result<()> {
    let rows: Vec<(String, Option<f64>)> = jobs
        .iter()
        .map(|job| (job.describe(), final_return(job)))
        .collect();
    let width = rows.iter().map(|r| r.0.len()).max().unwrap_or(0).max(9);
    println!(
        "\n{:<4} {:<width$} {:>14}  status",
        "job", "overrides", "episode_reward"
    );
    for ((job, (overrides, reward)), status) in jobs.iter().zip(&rows).zip(statuses) {
        let reward = reward.map_or("-".to_string(), |r| format!("{r:.2}"));
        println!(
            "{:<4} {overrides:<width$} {reward:>14}  {status}",
            job.index
        );
    }
    let mut csv = String::from("job,overrides,run_dir,episode_reward,status\n");
    let mut json = Vec::new();
    for ((job, (overrides, reward)), status) in jobs.iter().zip(&rows).zip(statuses) {
        let quoted = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
        csv.push_str(&format!(
            "{},{},{},{},{}\n",
            job.index,
            quoted(overrides),
            quoted(&job.run_dir.display().to_string()),
            reward.map_or(String::new(), |r| r.to_string()),
            quoted(&status.to_string()),
        ));
        let choices: serde_json::Map<String, serde_json::Value> = job
            .choices
            .iter()
            .map(|(k, v)| (k.clone(), v.clone().into()))
            .collect();
        json.push(serde_json::json!({
            "job": job.index, "overrides": choices, "run_dir": job.run_dir,
            "episode_reward": reward, "status": status.to_string(),
        }));
    }
    std::fs::create_dir_all(base)
        .map_err(|e| Error::io(format!("create {}", base.display()), e))?;
    let write = |name: &str, text: String| {
        let path = base.join(name);
        crate::whole_file::write(&path, text)
            .map_err(|e| Error::io(format!("write {}", path.display()), e))
    };
    write("sweep.csv", csv)?;
    let json = serde_json::to_string_pretty(&json).map_err(|e| Error::Other(e.to_string()))?;
    write("sweep.json", json + "\n")?;
    println!("summary: {}", base.join("sweep.csv").display());
    let failed: Vec<String> = jobs
        .iter()
        .zip(statuses)
        .filter(|(_, s)| matches!(s, Status::Failed(_)))
        .map(|(job, s)| format!("job {} ({}) {s}", job.index, job.describe()))
        .collect();
    if stopping() {
        return Err(Error::Stopped("the sweep was stopped by a signal".into()));
    }
    if !failed.is_empty() {
        return Err(Error::Other(format!(
            "{} of {} jobs failed: {}",
            failed.len(),
            jobs.len(),
            failed.join("; ")
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn sweep_calls_this_sweep_cannot_run_are_named() {
        for (arg, named) in [
            ("lr=interval(0,1)", "interval() is not taken here"),
            ("seed=range(1,4", "range( is not closed"),
            ("seed=choice(1,2", "choice( is not closed"),
            ("lr=choice()", "choice takes values, none of them empty"),
            ("lr=choice(1,,2)", "choice takes values, none of them empty"),
        ] {
            let e = expand(&[arg.into()], Path::new(".")).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{arg}: {e}");
            assert!(e.to_string().contains(named), "{arg}: {e}");
        }
        assert_eq!(
            expand(&["exp_name=try(2)".into()], Path::new(".")).unwrap()[0].overrides,
            ["exp_name=try(2)", "run_dir=./0"]
        );
    }

    #[test]
    fn commas_sweep_but_brackets_and_quotes_do_not() {
        assert_eq!(split_values("1,2,3"), ["1", "2", "3"]);
        assert_eq!(split_values("[1,2]"), ["[1,2]"]);
        assert_eq!(split_values("[1,2],[3]"), ["[1,2]", "[3]"]);
        assert_eq!(split_values("'a,b',c"), ["'a,b'", "c"]);
        assert_eq!(split_values("3e-4"), ["3e-4"]);
        let values = |raw: &str| sweep_values("seed", raw);
        assert_eq!(values("range(1,4)").unwrap(), ["1", "2", "3"]);
        assert_eq!(values("range(10, 0, -5)").unwrap(), ["10", "5"]);
        assert_eq!(values("choice(a, [b,c])").unwrap(), ["a", "[b,c]"]);
        for bad in ["range(1)", "range(1,4,0)", "range(0.5,2)", "range(4,1)"] {
            assert!(values(bad).is_err(), "{bad}");
        }
        let jobs = expand(&["seed=range(1,3)".into()], Path::new("/s")).unwrap();
        assert_eq!(jobs.len(), 2);
        let one = expand(&["seed=range(7,8)".into()], Path::new("/s")).unwrap();
        assert!(
            one[0].overrides.contains(&"seed=7".to_string()),
            "{:?}",
            one[0].overrides
        );
    }

    #[test]
    fn a_swept_key_is_given_once() {
        for args in [
            ["seed=1,2", "seed=3,4"],
            ["seed=1,2", "seed=5"],
            ["seed=5", "+seed=1,2"],
        ] {
            let args = args.map(String::from);
            let e = expand(&args, Path::new("runs")).unwrap_err().to_string();
            assert!(e.contains("give all its values in one"), "{args:?}: {e}");
        }
        // A fixed key given twice is not swept: the last value wins, as everywhere.
        let args = ["seed=1", "seed=2", "horizon=2,3"].map(String::from);
        assert_eq!(expand(&args, Path::new("runs")).unwrap().len(), 2);
    }

    /// More combinations than a sweep takes (or than a usize counts) are refused, naming the
    /// swept keys, where they allocated gigabytes or wrapped to zero jobs and panicked.
    #[test]
    fn a_sweep_of_too_many_jobs_is_refused() {
        let wide = ["seed=1,2,3,4,5,6,7,8,9,10", "horizon=1,2,3,4,5,6,7,8,9,10"];
        let mut args: Vec<String> = wide.iter().map(|a| a.to_string()).collect();
        assert_eq!(expand(&args, Path::new("runs")).unwrap().len(), 100);
        args.push("lr=1,2,3,4,5,6,7,8,9,10,11".into());
        args.push("rho=1,2,3,4,5,6,7,8,9,10".into());
        let e = expand(&args, Path::new("runs")).unwrap_err().to_string();
        assert!(
            e.contains("more than 10000 jobs (seed: 10, horizon: 10, lr: 11, rho: 10)"),
            "{e}"
        );
        let keys: Vec<String> = (0..64).map(|k| format!("+k{k}=1,2")).collect();
        let e = expand(&keys, Path::new("runs")).unwrap_err().to_string();
        assert!(e.contains("more than 10000 jobs"), "{e}");
    }

    #[test]
    fn the_product_varies_the_last_setting_fastest() {
        let args: Vec<String> = ["steps=400", "seed=1,2", "horizon=2,3", "mlp_dims=[4,4]"]
            .map(String::from)
            .into();
        let jobs = expand(&args, Path::new("out")).unwrap();
        let described: Vec<String> = jobs.iter().map(Job::describe).collect();
        assert_eq!(
            described,
            [
                "seed=1 horizon=2",
                "seed=1 horizon=3",
                "seed=2 horizon=2",
                "seed=2 horizon=3"
            ]
        );
        assert_eq!(jobs[3].run_dir, Path::new("out/3_seed=2_horizon=3"));
        assert_eq!(
            jobs[1].overrides,
            [
                "steps=400",
                "mlp_dims=[4,4]",
                "seed=1",
                "horizon=3",
                "run_dir=out/1_seed=1_horizon=3"
            ]
        );
        let e = expand(&["run_dir=a,b".into()], Path::new(".")).unwrap_err();
        assert!(e.to_string().contains("run_dir cannot be swept"), "{e}");
        let e = expand(&["seed=1,".into()], Path::new(".")).unwrap_err();
        assert!(e.to_string().contains("empty value"), "{e}");
    }
}
