//! Where a run's logs continue: rows of steps past the checkpoint a run resumes from (or any
//! row, for a run that starts afresh in a directory whose earlier run reached no checkpoint)
//! belong to an attempt that is undone; they are dropped before the run writes those steps
//! again, so that every file holds each step once. The file as it was is kept beside it, as
//! `<name>.before-<unix time>`: nothing a user may want to look at is lost.
use std::fs;
use std::path::Path;

use crate::error::{Error, Result};

/// Keeps only the rows of `metrics.jsonl`, `train.csv` and `eval.csv` in `dir` up to global
/// step `through` (none: no row). A file whose rows all stay is left untouched.
pub fn drop_rows_after(dir: &Path, through: Option<u64>) -> Result<()> {
    let keeps = |step: Option<u64>| matches!((step, through), (Some(s), Some(t)) if s <= t);
    rewrite(&dir.join("metrics.jsonl"), |lines| {
        lines
            .filter(|line| keeps(jsonl_step(line)))
            .map(str::to_owned)
            .collect()
    })?;
    for csv in ["train.csv", "eval.csv"] {
        rewrite(&dir.join(csv), |mut lines| {
            let header = lines.next().map(str::to_owned);
            let rows = lines.filter(|line| keeps(csv_step(line)));
            header.into_iter().chain(rows.map(str::to_owned)).collect()
        })?;
    }
    Ok(())
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
    let kept: Vec<String> = keep(text.lines());
    if kept.len() == text.lines().count() {
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

        drop_rows_after(dir.path(), Some(1000)).unwrap();
        let steps = |text: String| -> Vec<u64> { text.lines().filter_map(jsonl_step).collect() };
        assert_eq!(steps(fs::read_to_string(&jsonl).unwrap()), [0, 500, 1000]);
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
}
