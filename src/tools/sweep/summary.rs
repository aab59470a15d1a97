//! A sweep's summary: the table printed at its end, and sweep.csv and sweep.json beside the
//! jobs, which a later sweep into the same folder must not replace with another's.
use std::path::Path;

use super::grid::Job;
use super::spawn::stopping;
use super::Status;
use crate::error::{Error, Result};
use crate::tools::curves::Metrics;

/// A folder holding another sweep's summary (other jobs) is refused: this sweep's would
/// replace it. The same sweep again (to go on with `resume=auto`) writes its own over it, as
/// over a summary that does not parse (nothing to keep).
pub(super) fn refuse_another_sweeps_summary(base: &Path, jobs: &[Job]) -> Result<()> {
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

/// The final evaluation return of a finished job, from its metrics.jsonl.
fn final_return(job: &Job) -> Option<f64> {
    Metrics::read(&job.run_dir)
        .ok()?
        .last("eval", "episode_reward")
}

/// Prints the table and writes sweep.csv and sweep.json into `base`; fails when a job did.
pub(super) fn summarize(jobs: &[Job], statuses: &[Status], base: &Path) -> Result<()> {
    let rows: Vec<(String, Option<f64>)> = jobs
        .iter()
        .map(|job| (job.describe(), final_return(job)))
        .collect();
    let width = rows.iter().map(|r| r.0.len()).max().unwrap_or(0).max(9);
    outln!(
        "\n{:<4} {:<width$} {:>14}  status",
        "job",
        "overrides",
        "episode_reward"
    );
    for ((job, (overrides, reward)), status) in jobs.iter().zip(&rows).zip(statuses) {
        let reward = reward.map_or("-".to_string(), |r| format!("{r:.2}"));
        outln!(
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
    outln!("summary: {}", base.join("sweep.csv").display());
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
