//! The doctor's dataset check (`tdmpc2 doctor data_dir=DIR`): every file read back against the
//! CRC-32s it keeps, whatever earlier runs' stamps say, then indexed against the run's model as
//! training opens it (widths, task ids, episodes long enough for a horizon).
use crate::config::Config;
use std::path::Path;

use super::{Mark, Report};
use crate::dataset::{self, integrity};

/// `resolved`: the run's config resolved against its tasks (None when they cannot be made: the
/// task line says why, and the dataset is only read back).
pub(super) fn check_dataset(report: &mut Report, dir: &str, resolved: Option<&Config>) {
    let files = match dataset::files(Path::new(dir)) {
        Ok(files) => files,
        Err(e) => return report.line(Mark::Fail, "dataset", e.to_string()),
    };
    let started = std::time::Instant::now();
    let mut bytes = 0;
    for file in &files {
        match integrity::verify(file, &|| false) {
            Ok(integrity::Checked::Read(read)) => bytes += read,
            Ok(_) => {}
            Err(e) => return report.line(Mark::Fail, "dataset", e.to_string()),
        }
    }
    report.line(
        Mark::Pass,
        "dataset",
        format!(
            "{} files of {dir} read back against their CRC-32s ({:.2} GB in {:.1} s)",
            files.len(),
            bytes as f64 / 1e9,
            started.elapsed().as_secs_f64()
        ),
    );
    let Some(config) = resolved else {
        return;
    };
    match crate::trainer::open_dataset(config) {
        Ok(dataset) => report.line(
            Mark::Pass,
            "dataset",
            format!(
                "its {} episodes fit the run's model and horizon",
                dataset.episodes()
            ),
        ),
        Err(e) => {
            let message = e.to_string();
            report.line(
                Mark::Fail,
                "dataset",
                message.trim_start_matches("config error: "),
            )
        }
    }
}
