//! Where a run's logs continue: rows of steps past the checkpoint a run resumes from (or any
//! row, for a run that starts afresh in a directory whose earlier run reached no checkpoint)
//! belong to an attempt that is undone; they are dropped before the run writes those steps
//! again, so that every file holds each step once. The file as it was is kept beside it, as
//! `<name>.before-<unix time>`: nothing a user may want to look at is lost.
use std::fs;
use std::path::Path;

use super::{Phase, Record};
use crate::error::{Error, Result};

/// The last step `metrics.jsonl` in `dir` holds: how far the trackers were sent records.
pub fn logged_through(dir: &Path) -> Option<u64> {
    fs::read_to_string(dir.join("metrics.jsonl"))
        .ok()
        .and_then(|text| text.lines().filter_map(jsonl_step).max())
}

/// The records of `metrics.jsonl` in `dir` from global step `from` on, in order: what a
/// tracker missed (a value that was not finite was written as null, and is left out).
pub fn records_from(dir: &Path, from: u64) -> Vec<Record> {
    let Ok(text) = fs::read_to_string(dir.join("metrics.jsonl")) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|row| {
            let row = row.as_object()?;
            let phase = match row.get("phase")?.as_str()? {
                "train" => Phase::Train,
                "eval" => Phase::Eval,
                _ => return None,
            };
            let step = row.get("step")?.as_u64().filter(|&step| step >= from)?;
            let values = row
                .iter()
                .filter(|(key, _)| !matches!(key.as_str(), "phase" | "step"))
                .filter_map(|(key, value)| Some((key.clone(), value.as_f64()?)))
                .collect();
            Some(Record {
                phase,
                step,
                values,
            })
        })
        .collect()
}

/// Keeps only the rows of `metrics.jsonl`, `train.csv` and `eval.csv` in `dir` up to global
/// step `through` (none: no row). A file whose rows all stay is left untouched. A CSV that
/// cannot be rewritten is returned with why (the CSVs are best effort); `metrics.jsonl`'s
/// failure is the error.
pub fn drop_rows_after(dir: &Path, through: Option<u64>) -> Result<Vec<Error>> {
    let keeps = |step: Option<u64>| matches!((step, through), (Some(s), Some(t)) if s <= t);
    rewrite(&dir.join("metrics.jsonl"), |lines| {
        lines
            .filter(|line| keeps(jsonl_step(line)))
            .map(str::to_owned)
            .collect()
    })?;
    let mut failed = Vec::new();
    for csv in ["train.csv", "eval.csv"] {
        let rewritten = rewrite(&dir.join(csv), |mut lines| {
            let Some(header) = lines.next() else {
                return Vec::new();
            };
            // A row cut short (a full disk) has fewer cells, and may read as an earlier step.
            let cells = header.split(',').count();
            let rows = lines.filter(|line| line.split(',').count() == cells);
            let rows = rows.filter(|line| keeps(csv_step(line)));
            std::iter::once(header)
                .chain(rows)
                .map(str::to_owned)
                .collect()
        });
        failed.extend(rewritten.err());
    }
    Ok(failed)
}

/// Keeps only the points up to `through` in the metric files of an MLflow file store's run
/// (`metrics`: `<store>/<experiment>/<run>/metrics`), and no line MLflow cannot read (one cut
/// short would make it refuse the run). Nothing is kept beside them, as every file there
/// is read as a metric: `metrics.jsonl` keeps the undone attempt's points.
pub fn drop_file_store_points_after(metrics: &Path, through: Option<u64>) -> Result<()> {
    let Ok(entries) = fs::read_dir(metrics) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let path = entry.path();
        // A rewrite below cut short by a kill left its temporary file, which MLflow would
        // read as a metric (an empty one makes it refuse the run).
        if crate::whole_file::is_partial(&entry.file_name()) {
            fs::remove_file(&path)
                .map_err(|e| Error::io(format!("remove {}", path.display()), e))?;
            continue;
        }
        // Metric names with '/' are folders.
        if path.is_dir() {
            drop_file_store_points_after(&path, through)?;
            continue;
        }
        let Ok(text) = fs::read_to_string(&path) else {
            continue;
        };
        let (complete, _cut) = text.rsplit_once('\n').unwrap_or(("", &text));
        let kept: Vec<&str> = complete
            .lines()
            .filter(|line| file_store_step(line).is_some_and(|step| Some(step) <= through))
            .collect();
        let out: String = kept.iter().map(|line| format!("{line}\n")).collect();
        // MLflow refuses a run with an empty metric file ("No data found"): none at all then.
        if kept.is_empty() {
            fs::remove_file(&path)
                .map_err(|e| Error::io(format!("remove {}", path.display()), e))?;
        } else if out != text {
            crate::whole_file::write(&path, out)
                .map_err(|e| Error::io(format!("rewrite {}", path.display()), e))?;
        }
    }
    Ok(())
}

/// The step of a line MLflow's file store reads (`timestamp value [step [dataset digest]]`, as
/// `FileStore._get_metric_from_line`); None for one it would refuse.
fn file_store_step(line: &str) -> Option<u64> {
    let fields: Vec<&str> = line.split(' ').collect();
    fields[0].parse::<i64>().ok()?;
    fields.get(1)?.parse::<f64>().ok()?;
    match fields.len() {
        // MLflow reads the step of a line with a dataset as 0, as of one without a step.
        2 | 5 => Some(0),
        3 => fields[2].parse().ok(),
        _ => None,
    }
}

fn jsonl_step(line: &str) -> Option<u64> {
    serde_json::from_str::<serde_json::Value>(line).ok()?["step"].as_u64()
}

/// The step is a CSV file's first column.
fn csv_step(line: &str) -> Option<u64> {
    line.split(',').next()?.parse().ok()
}

/// Replaces `path`'s lines with those `keep` returns, the old file moved aside; nothing happens
/// when the file is absent or unchanged.
fn rewrite(path: &Path, keep: impl FnOnce(std::str::Lines<'_>) -> Vec<String>) -> Result<()> {
    let Ok(text) = fs::read_to_string(path) else {
        return Ok(());
    };
    // A last line cut short (no newline) goes: the next row would be appended to it.
    let complete = match text.rsplit_once('\n') {
        Some((complete, _cut)) => complete,
        None => "",
    };
    let kept: Vec<String> = keep(complete.lines());
    if kept.len() == text.lines().count() && text.ends_with('\n') {
        return Ok(());
    }
    let mut out = kept.join("\n");
    if !kept.is_empty() {
        out.push('\n');
    }
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    crate::whole_file::replace_keeping(path, &name, out)
        .map(drop)
        .map_err(|e| Error::io(format!("rewrite {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_past_the_resumed_step_go_and_the_rest_stay() {
        let dir = tempfile::tempdir().unwrap();
        let jsonl = dir.path().join("metrics.jsonl");
        let csv = dir.path().join("eval.csv");
        let rows = [0, 500, 1000, 1500];
        let lines: String = rows
            .iter()
            .map(|s| format!("{{\"phase\":\"eval\",\"step\":{s}}}\n"))
            .collect();
        fs::write(&jsonl, format!("{lines}{{\"phase\":\"ev")).unwrap();
        let csv_rows: String = rows.iter().map(|s| format!("{s},1.5\n")).collect();
        fs::write(&csv, format!("step,episode_reward\n{csv_rows}")).unwrap();

        assert_eq!(logged_through(dir.path()), Some(1500));
        drop_rows_after(dir.path(), Some(1000)).unwrap();
        assert_eq!(logged_through(dir.path()), Some(1000));
        let steps = |text: String| -> Vec<u64> { text.lines().filter_map(jsonl_step).collect() };
        assert_eq!(steps(fs::read_to_string(&jsonl).unwrap()), [0, 500, 1000]);
        let owed = records_from(dir.path(), 500);
        let owed: Vec<(u64, Phase)> = owed.iter().map(|r| (r.step, r.phase)).collect();
        assert_eq!(owed, [(500, Phase::Eval), (1000, Phase::Eval)]);
        let kept: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with("metrics.jsonl.before-"))
            .collect();
        assert_eq!(kept.len(), 1, "the file as it was stays beside it");
        let before = fs::read_to_string(dir.path().join(&kept[0])).unwrap();
        assert_eq!(steps(before), [0, 500, 1000, 1500]);
        assert_eq!(
            fs::read_to_string(&csv).unwrap(),
            "step,episode_reward\n0,1.5\n500,1.5\n1000,1.5\n"
        );
        drop_rows_after(dir.path(), Some(1000)).unwrap();
        assert_eq!(steps(fs::read_to_string(&jsonl).unwrap()), [0, 500, 1000]);

        // A fresh run keeps no row, and the CSV header.
        drop_rows_after(dir.path(), None).unwrap();
        assert_eq!(fs::read_to_string(&jsonl).unwrap(), "");
        assert_eq!(fs::read_to_string(&csv).unwrap(), "step,episode_reward\n");
        drop_rows_after(&dir.path().join("absent"), None).unwrap();
    }

    /// A row cut short by a full disk (`15` of `1500,…`) is not read as step 15 and kept, with
    /// the next row glued to it.
    #[test]
    fn a_row_cut_short_goes() {
        let dir = tempfile::tempdir().unwrap();
        let csv = dir.path().join("train.csv");
        fs::write(&csv, "step,loss\n500,1.5\n1000,1.25\n15").unwrap();
        drop_rows_after(dir.path(), Some(1000)).unwrap();
        assert_eq!(
            fs::read_to_string(&csv).unwrap(),
            "step,loss\n500,1.5\n1000,1.25\n"
        );
        fs::write(&csv, "step,loss\n500,1.5\n15,2\n1000\n").unwrap();
        drop_rows_after(dir.path(), Some(1000)).unwrap();
        assert_eq!(
            fs::read_to_string(&csv).unwrap(),
            "step,loss\n500,1.5\n15,2\n"
        );
    }

    #[test]
    fn a_file_store_run_keeps_its_points_up_to_the_resumed_step() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = dir.path().join("metrics");
        fs::create_dir_all(metrics.join("eval")).unwrap();
        let reward = metrics.join("eval").join("episode_reward");
        fs::write(
            &reward,
            "17 1.5 500\n18 2.5 1000\n19 3.5 1500\n20 4.5 2000 d x\n21 2",
        )
        .unwrap();
        let old = metrics.join("old_format");
        fs::write(&old, "17 1.5\n17 1.5 1500 7\n").unwrap();
        let kept = metrics.join("kept");
        fs::write(&kept, "17 1.5 0\n").unwrap();
        let later = metrics.join("later");
        fs::write(&later, "17 1.5 1500\n").unwrap();
        // A rewrite's temporary file, left by a kill: MLflow would read it as a metric.
        let left = metrics.join("eval").join(".partial-41-0");
        fs::write(&left, "").unwrap();
        drop_file_store_points_after(&metrics, Some(1000)).unwrap();
        assert!(!left.exists());
        assert_eq!(
            fs::read_to_string(&reward).unwrap(),
            "17 1.5 500\n18 2.5 1000\n20 4.5 2000 d x\n"
        );
        assert_eq!(fs::read_to_string(&old).unwrap(), "17 1.5\n");
        assert_eq!(fs::read_to_string(&kept).unwrap(), "17 1.5 0\n");
        assert!(
            !later.exists(),
            "a file of no point is none (MLflow refuses an empty one)"
        );
        assert_eq!(
            fs::read_dir(&metrics).unwrap().count(),
            3,
            "nothing beside them"
        );
        drop_file_store_points_after(&dir.path().join("absent"), None).unwrap();
        // A restart from nothing: no point stays.
        drop_file_store_points_after(&metrics, None).unwrap();
        assert!(!reward.exists() && !kept.exists());
    }
}
