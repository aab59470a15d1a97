//! Which W&B and MLflow runs a run directory logs to, kept in `<run_dir>/trackers.json`, so
//! that a resumed run (`resume=auto`, a restart, a requeued job) continues the same tracker
//! runs instead of starting new ones.
use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

const FILE: &str = "trackers.json";

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrackerRuns {
    /// The W&B run id (`wandb.init(id=...)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wandb: Option<String>,
    /// The last step the W&B run holds: the highest in `metrics.jsonl` when an attempt
    /// resumed, over every resume (a second one may come before the run gets as far again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wandb_holds_through: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlflow: Option<MlflowRun>,
    /// The first step each tracker (`wandb`, `mlflow`) has not taken, while records wait for
    /// it: a resume sends it those of `metrics.jsonl` from there to its checkpoint.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub owed_from: BTreeMap<String, u64>,
}

/// An MLflow run is found again only at the tracking URI that holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MlflowRun {
    pub tracking_uri: String,
    pub run_id: String,
}

impl TrackerRuns {
    /// The runs recorded in `dir`; none when the file is missing. A damaged file is reported
    /// and counts as none: new tracker runs start, and nothing else is lost.
    pub fn load(dir: &Path) -> Self {
        let path = dir.join(FILE);
        let Ok(text) = std::fs::read_to_string(&path) else {
            return Self::default();
        };
        serde_json::from_str(&text).unwrap_or_else(|e| {
            errln!(
                "{} is damaged ({e}); W&B and MLflow start new runs",
                path.display()
            );
            Self::default()
        })
    }

    /// Writes the file whole (a new file renamed over the old); with no runs, removes it (a
    /// fresh run must not continue an earlier run's trackers later).
    pub fn save(&self, dir: &Path) -> Result<()> {
        let path = dir.join(FILE);
        if *self == Self::default() {
            return match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(Error::io(format!("remove {}", path.display()), e))
                }
                _ => Ok(()),
            };
        }
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| Error::Other(format!("{FILE} to JSON: {e}")))?;
        crate::whole_file::write(&path, text + "\n")
            .map_err(|e| Error::io(format!("write {}", path.display()), e))
    }

    /// Notes in `dir`'s file that `tracker` has taken no record from `step` on.
    pub fn note_owed(dir: &Path, tracker: &str, step: u64) -> Result<()> {
        let mut runs = Self::load(dir);
        match runs.owed_from.insert(tracker.to_owned(), step) {
            Some(before) if before == step => Ok(()),
            _ => runs.save(dir),
        }
    }

    /// Notes in `dir`'s file that `tracker` owes nothing.
    pub fn note_paid(dir: &Path, tracker: &str) -> Result<()> {
        let mut runs = Self::load(dir);
        match runs.owed_from.remove(tracker) {
            Some(_) => runs.save(dir),
            None => Ok(()),
        }
    }

    pub fn mlflow_run_at(&self, tracking_uri: &str) -> Option<&str> {
        self.mlflow
            .as_ref()
            .filter(|run| run.tracking_uri == tracking_uri)
            .map(|run| run.run_id.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_survive_a_round_trip_and_damage_counts_as_none() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(TrackerRuns::load(dir.path()), TrackerRuns::default());
        let runs = TrackerRuns {
            wandb: Some("abc123".into()),
            wandb_holds_through: Some(1500),
            mlflow: Some(MlflowRun {
                tracking_uri: "file:///x/mlruns".into(),
                run_id: "r1".into(),
            }),
            owed_from: [("mlflow".to_string(), 700)].into(),
        };
        runs.save(dir.path()).unwrap();
        assert_eq!(TrackerRuns::load(dir.path()), runs);
        assert_eq!(runs.mlflow_run_at("file:///x/mlruns"), Some("r1"));
        assert_eq!(runs.mlflow_run_at("http://server:5000"), None);
        std::fs::write(dir.path().join(FILE), "{\"wandb\": ").unwrap();
        assert_eq!(TrackerRuns::load(dir.path()), TrackerRuns::default());
        TrackerRuns::default().save(dir.path()).unwrap();
        assert!(!dir.path().join(FILE).exists());
        TrackerRuns::default().save(dir.path()).unwrap();
    }

    /// The first step a tracker has not taken is noted until it takes every record again.
    #[test]
    fn what_a_tracker_owes_is_noted_from_its_first_step() {
        let dir = tempfile::tempdir().unwrap();
        TrackerRuns::note_owed(dir.path(), "wandb", 500).unwrap();
        TrackerRuns::note_owed(dir.path(), "mlflow", 700).unwrap();
        TrackerRuns::note_owed(dir.path(), "wandb", 900).unwrap();
        let owed = TrackerRuns::load(dir.path()).owed_from;
        assert_eq!(owed, [("mlflow".into(), 700), ("wandb".into(), 900)].into());
        TrackerRuns::note_paid(dir.path(), "wandb").unwrap();
        TrackerRuns::note_paid(dir.path(), "mlflow").unwrap();
        assert!(!dir.path().join(FILE).exists(), "nothing left to note");
    }
}
