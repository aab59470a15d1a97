//! Which job a run directory belongs to. A directory holding checkpoints takes no new run
//! without `resume` (the new run's metrics would follow the old run's, and a later
//! `resume=auto` could pick the old run's checkpoints), nor a resume from an earlier checkpoint
//! than its latest (`resume=auto` would go back to the later one). A restarted job (our launcher's
//! `max_restarts`, torchrun's `--max-restarts`) resumes by itself only from checkpoints of its
//! own: rank 0 records its job in `<run_dir>/.job`, and a job is its launcher process (the
//! parent of every attempt's ranks), named by host, pid and start time. So a first attempt
//! refused here is refused again when restarted, instead of resuming another job's run.
use std::path::Path;

use super::lock::RunLock;
use crate::checkpoint::{
    check_resume_source, checkpoints_dir, resume_source_of, resumes, step_of, store,
};
use crate::config::Config;
use crate::error::{Error, Result};

const JOB: &str = ".job";

/// What `train` refuses before anything starts: a `resume` path that names no checkpoint, a
/// `checkpoint` (which train would not read), and a run directory whose checkpoints are not this
/// run's to continue.
pub fn refuse_a_bad_start(config: &Config) -> Result<()> {
    refuse_a_checkpoint_to_start_from(config)?;
    check_resume_source(config)?;
    refuse_a_used_run_dir(config)
}

/// `checkpoint=` is what eval, collect and export read; train would leave it unread, and a run
/// meant to go on from it would start from scratch.
pub fn refuse_a_checkpoint_to_start_from(config: &Config) -> Result<()> {
    match &config.checkpoint {
        None => Ok(()),
        Some(path) => Err(Error::Config(format!(
            "checkpoint={path} is read by eval and collect, not by train: to go on from a \
             run's checkpoint, give resume={path} (or resume=auto for this run directory's \
             latest); train starts from no weights file alone"
        ))),
    }
}

/// Rank 0's hold on the run directory. A bad `resume` path is refused before the directory is
/// made; a used directory once its lock is held, so that two runs starting together cannot
/// both find it unused. The directory becomes this job's ([`record_job`]) once the run has
/// started, so that a run refused later (a checkpoint that does not fit) leaves it as it was.
pub fn claim(config: &Config) -> Result<RunLock> {
    refuse_a_checkpoint_to_start_from(config)?;
    resume_source_of(config)?;
    let lock = RunLock::acquire(&config.run_dir())?;
    refuse_a_used_run_dir(config)?;
    Ok(lock)
}

/// Refuses a run directory whose checkpoints are not this run's to continue: a new run (no
/// `resume`) on one that holds any, and a resume from an earlier step than its latest
/// checkpoint (`resume=auto` and a restart would go back to that later one, and the logs
/// already run past the resumed step).
pub fn refuse_a_used_run_dir(config: &Config) -> Result<()> {
    let run_dir = config.run_dir();
    let Some((latest, _)) = store::latest(&checkpoints_dir(&run_dir)) else {
        return refuse_files_of_no_run(&run_dir);
    };
    if !resumes(config.resume.as_deref()) {
        return Err(Error::Config(format!(
            "run_dir={} already holds a run (checkpoints up to step {latest}): resume=auto \
             continues it; to start a new run, choose another run_dir or remove that one",
            run_dir.display()
        )));
    }
    let resumed = resume_source_of(config)?.and_then(|dir| step_of(&dir));
    match resumed {
        Some(step) if step < latest => Err(Error::Config(format!(
            "resume={} continues step {step}, but run_dir={} holds checkpoints of later steps \
             (up to {latest}), which resume=auto and a restart would go back to; to go on from \
             step {step}, write into another run_dir, or remove the later checkpoints from {}",
            config.resume.as_deref().unwrap_or_default(),
            run_dir.display(),
            checkpoints_dir(&run_dir).display()
        ))),
        _ => Ok(()),
    }
}

/// Refuses a run directory holding files a run writes (and would replace or append to) that
/// no run wrote there: a run's directory has its `.job`. A folder of the user's own (`run_dir=.`,
/// a shared output folder) keeps its files.
fn refuse_files_of_no_run(run_dir: &Path) -> Result<()> {
    if run_dir.join(JOB).exists() {
        return Ok(());
    }
    let written = std::iter::once(super::report::CONFIG_FILE).chain(crate::logging::LOG_FILES);
    let found: Vec<&str> = written.filter(|name| run_dir.join(name).exists()).collect();
    if found.is_empty() {
        return Ok(());
    }
    Err(Error::Config(format!(
        "run_dir={} holds {} but no run recorded there (a run's directory has its {JOB} file); \
         a run would replace or add to them: give another run_dir, or move them away",
        run_dir.display(),
        found.join(", ")
    )))
}

/// Records this process's job as the one that writes `run_dir` (rank 0, holding its lock).
pub fn record_job(run_dir: &Path) -> Result<()> {
    let path = run_dir.join(JOB);
    std::fs::write(&path, this_job()).map_err(|e| Error::io(format!("write {}", path.display()), e))
}

/// Whether the checkpoints in `run_dir` are this job's: a restarted attempt's to resume.
pub fn written_by_this_job(run_dir: &Path) -> bool {
    std::fs::read_to_string(run_dir.join(JOB)).is_ok_and(|job| job.trim() == this_job())
}

/// Whether this attempt, the launcher's restart number `restarts`, restarts the job that wrote
/// `run_dir`.
pub fn restarts_its_job(run_dir: &Path, restarts: u64) -> bool {
    restarts > 0 && written_by_this_job(run_dir)
}

/// The launcher's restart number (`TORCHELASTIC_RESTART_COUNT`, as our launcher and torchrun
/// set it); 0 where none is set or it is no number (`train` refuses that before).
pub fn restart_count() -> u64 {
    std::env::var(crate::ddp::launcher::RESTART_COUNT_ENV)
        .ok()
        .and_then(|count| count.trim().parse().ok())
        .unwrap_or(0)
}

/// This process's job: its parent (the launcher that starts every attempt) by host, pid and
/// start time (a pid alone may be reused).
fn this_job() -> String {
    let parent = std::os::unix::process::parent_id();
    // /proc/<pid>/stat: "pid (comm) state ..." with the start time the 20th field after comm.
    let started = std::fs::read_to_string(format!("/proc/{parent}/stat"))
        .ok()
        .and_then(|stat| {
            let after_comm = stat.rsplit_once(')')?.1.to_owned();
            after_comm.split_whitespace().nth(19).map(str::to_owned)
        })
        .unwrap_or_default();
    format!("{} {parent} {started}", super::lock::hostname())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Source;

    fn config(run_dir: &Path, resume: &str) -> Config {
        Config::load(&Source {
            overrides: vec![format!("run_dir={}", run_dir.display()), resume.into()],
            ..Source::default()
        })
        .unwrap()
    }

    #[test]
    fn train_refuses_a_checkpoint_it_would_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let e = refuse_a_bad_start(&config(dir.path(), "checkpoint=/runs/x/1"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("not by train") && e.contains("resume=/runs/x/1"),
            "{e}"
        );
        refuse_a_bad_start(&config(dir.path(), "resume=null")).unwrap();
    }

    #[test]
    fn a_run_dir_with_checkpoints_takes_only_a_resume() {
        let dir = tempfile::tempdir().unwrap();
        refuse_a_used_run_dir(&config(dir.path(), "resume=null")).unwrap();
        std::fs::create_dir_all(checkpoints_dir(dir.path()).join("step_000000000400")).unwrap();
        for fresh in ["resume=null", "resume=none"] {
            let e = refuse_a_used_run_dir(&config(dir.path(), fresh)).unwrap_err();
            assert!(
                e.to_string().contains("(checkpoints up to step 400)"),
                "{fresh}: {e}"
            );
        }
        refuse_a_used_run_dir(&config(dir.path(), "resume=auto")).unwrap();
        // A resume from an earlier checkpoint, while a later one is there.
        let checkpoints = checkpoints_dir(dir.path());
        std::fs::create_dir_all(checkpoints.join("step_000000000600")).unwrap();
        let earlier = format!("resume={}", checkpoints.join("step_000000000400").display());
        std::fs::write(checkpoints.join("step_000000000400/meta.json"), "{}").unwrap();
        let e = refuse_a_used_run_dir(&config(dir.path(), &earlier)).unwrap_err();
        assert!(
            e.to_string().contains("continues step 400")
                && e.to_string().contains("later steps (up to 600)"),
            "{e}"
        );
        refuse_a_used_run_dir(&config(dir.path(), "resume=auto")).unwrap();
        let latest = format!("resume={}", checkpoints.join("step_000000000600").display());
        std::fs::write(checkpoints.join("step_000000000600/meta.json"), "{}").unwrap();
        refuse_a_used_run_dir(&config(dir.path(), &latest)).unwrap();
        // Another run directory takes the branch.
        let other = tempfile::tempdir().unwrap();
        refuse_a_used_run_dir(&config(other.path(), &earlier)).unwrap();
    }

    #[test]
    fn a_job_recognises_its_own_run_dir() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!written_by_this_job(dir.path()), "no job recorded");
        record_job(dir.path()).unwrap();
        assert!(written_by_this_job(dir.path()));
        let recorded = std::fs::read_to_string(dir.path().join(JOB)).unwrap();
        assert_eq!(recorded.split(' ').count(), 3, "{recorded}");
        std::fs::write(dir.path().join(JOB), "another-host 1 2").unwrap();
        assert!(!written_by_this_job(dir.path()));
    }
}
