//! MLflow through the Python `mlflow` package (`mlflow-skinny` suffices). The tracking URI is
//! `MLFLOW_TRACKING_URI` when set, else the file store `file://<run_dir>/mlruns`.
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use embedded_python as python;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::{Record, Sink, Video};
use crate::error::{Error, Result};

/// MLflow's cap on one `log_batch` call's params.
const PARAMS_PER_BATCH: usize = 100;
/// MLflow's cap on a param value's length.
const MAX_PARAM_LEN: usize = 6000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MlflowOptions {
    /// The experiment, created when missing (`exp_name`).
    pub experiment: String,
    pub run_name: String,
    /// Overrides `MLFLOW_TRACKING_URI` and the default file store.
    pub tracking_uri: Option<String>,
}

/// One MLflow run, driven through an `MlflowClient` (no process-global active run).
pub struct Mlflow {
    client: Py<PyAny>,
    metric: Py<PyAny>,
    run_id: String,
    tracking_uri: String,
    finished: bool,
}

impl Mlflow {
    /// Starts a run and logs `config`, flattened to `a.b` keys, as its params.
    pub fn create(
        opts: &MlflowOptions,
        run_dir: &Path,
        config: &serde_json::Value,
    ) -> Result<Self> {
        let env_uri = std::env::var("MLFLOW_TRACKING_URI")
            .ok()
            .filter(|u| !u.is_empty());
        let explicit_uri = opts.tracking_uri.clone().or(env_uri);
        let run_dir = std::path::absolute(run_dir)
            .map_err(|e| Error::io(format!("resolve {}", run_dir.display()), e))?;
        let params = flatten(config);
        python::attach_exclusive(|py| -> python::Result<_> {
            let tracking_uri = match explicit_uri {
                Some(uri) => uri,
                None => py
                    .import("pathlib")?
                    .getattr("Path")?
                    .call1((run_dir.join("mlruns"),))?
                    .call_method0("as_uri")?
                    .extract()?,
            };
            if is_file_store(&tracking_uri) {
                // MLflow 3 refuses the file store unless asked for it explicitly.
                py.import("os")?
                    .getattr("environ")?
                    .call_method1("setdefault", ("MLFLOW_ALLOW_FILE_STORE", "true"))?;
            }
            let mlflow = py.import("mlflow")?;
            let entities = py.import("mlflow.entities")?;
            let client = mlflow
                .getattr("MlflowClient")?
                .call1((tracking_uri.as_str(),))?;
            let experiment = client.call_method1("get_experiment_by_name", (&opts.experiment,))?;
            let experiment_id = if experiment.is_none() {
                client.call_method1("create_experiment", (&opts.experiment,))?
            } else {
                experiment.getattr("experiment_id")?
            };
            let kwargs = PyDict::new(py);
            kwargs.set_item("run_name", &opts.run_name)?;
            let run = client.call_method("create_run", (experiment_id,), Some(&kwargs))?;
            let run_id: String = run.getattr("info")?.getattr("run_id")?.extract()?;
            let param = entities.getattr("Param")?;
            for chunk in params.chunks(PARAMS_PER_BATCH) {
                let batch = PyList::empty(py);
                for (k, v) in chunk {
                    batch.append(param.call1((k, v))?)?;
                }
                let kwargs = PyDict::new(py);
                kwargs.set_item("params", batch)?;
                client.call_method("log_batch", (&run_id,), Some(&kwargs))?;
            }
            Ok(Self {
                client: client.unbind(),
                metric: entities.getattr("Metric")?.unbind(),
                run_id,
                tracking_uri,
                finished: false,
            })
        })
        .map_err(|e| {
            Error::Other(format!(
                "enable_mlflow: cannot start an MLflow run in experiment {:?}: {e}. \
                 Set enable_mlflow=false, or MLFLOW_TRACKING_URI",
                opts.experiment
            ))
        })
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    pub fn tracking_uri(&self) -> &str {
        &self.tracking_uri
    }

    fn end(&mut self, status: &str) -> Result<()> {
        if self.finished {
            return Ok(());
        }
        self.finished = true;
        python::attach_exclusive(|py| -> python::Result<_> {
            self.client
                .bind(py)
                .call_method1("set_terminated", (&self.run_id, status))?;
            Ok(())
        })
        .map_err(|e| Error::Other(format!("mlflow end run {}: {e}", self.run_id)))
    }
}

impl Sink for Mlflow {
    fn name(&self) -> &'static str {
        "mlflow"
    }

    fn write(&mut self, record: &Record) -> Result<()> {
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        python::attach_exclusive(|py| -> python::Result<_> {
            let metric = self.metric.bind(py);
            let batch = PyList::empty(py);
            for (k, v) in &record.values {
                let key = metric_key(&format!("{}/{k}", record.phase.name()));
                batch.append(metric.call1((key, *v, millis, record.step))?)?;
            }
            let kwargs = PyDict::new(py);
            kwargs.set_item("metrics", batch)?;
            self.client
                .bind(py)
                .call_method("log_batch", (&self.run_id,), Some(&kwargs))?;
            Ok(())
        })
        .map_err(|e| Error::Other(format!("mlflow log at step {}: {e}", record.step)))
    }

    /// The GIF file as an artifact under `eval_video/`.
    fn video(&mut self, video: &Video) -> Result<()> {
        python::attach_exclusive(|py| -> python::Result<_> {
            self.client.bind(py).call_method1(
                "log_artifact",
                (&self.run_id, video.path.to_string_lossy(), super::VIDEO_DIR),
            )?;
            Ok(())
        })
        .map_err(|e| Error::Other(format!("mlflow video at step {}: {e}", video.step)))
    }

    fn close(&mut self) -> Result<()> {
        self.end("FINISHED")
    }

    fn close_stopped(&mut self) -> Result<()> {
        self.end("KILLED")
    }
}

impl Drop for Mlflow {
    /// Not closed: the run ends as failed.
    fn drop(&mut self) {
        let _ = self.end("FAILED");
    }
}

fn is_file_store(uri: &str) -> bool {
    uri.starts_with("file:") || !uri.contains(':')
}

/// `{"a": {"b": 1}, "c": [1, 2]}` -> `[("a.b", "1"), ("c", "[1,2]")]`; strings unquoted.
fn flatten(config: &serde_json::Value) -> Vec<(String, String)> {
    fn walk(prefix: &str, value: &serde_json::Value, out: &mut Vec<(String, String)>) {
        match value {
            serde_json::Value::Object(map) if !map.is_empty() => {
                for (k, v) in map {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&key, v, out);
                }
            }
            serde_json::Value::String(s) => out.push((prefix.to_owned(), truncate(s))),
            other if !prefix.is_empty() => {
                out.push((prefix.to_owned(), truncate(&other.to_string())))
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk("", config, &mut out);
    out
}

fn truncate(s: &str) -> String {
    s.chars().take(MAX_PARAM_LEN).collect()
}

/// `key` in the characters MLflow takes in a metric's name (letters, digits, `_-. :/`): a
/// multitask run's `episode_reward+walker-run` becomes `episode_reward/walker-run`.
fn metric_key(key: &str) -> String {
    key.chars()
        .map(|c| match c.is_alphanumeric() || "_-. :/".contains(c) {
            true => c,
            false => '/',
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_keys_use_only_what_mlflow_takes() {
        assert_eq!(
            metric_key("eval/episode_reward+avg_dmcontrol"),
            "eval/episode_reward/avg_dmcontrol"
        );
        assert_eq!(metric_key("train/pi_loss"), "train/pi_loss");
    }

    #[test]
    fn config_flattens_to_dotted_string_params() {
        let config = serde_json::json!({
            "task": "walker-walk",
            "seed": 1,
            "wandb_entity": null,
            "obs_shape": [24],
            "nested": {"lr": 0.0003, "deep": {"on": true}},
        });
        let params = flatten(&config);
        let get = |k: &str| {
            params
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("task"), Some("walker-walk"));
        assert_eq!(get("seed"), Some("1"));
        assert_eq!(get("wandb_entity"), Some("null"));
        assert_eq!(get("obs_shape"), Some("[24]"));
        assert_eq!(get("nested.lr"), Some("0.0003"));
        assert_eq!(get("nested.deep.on"), Some("true"));
        assert_eq!(params.len(), 6);
        assert!(flatten(&serde_json::Value::Null).is_empty());
    }

    #[test]
    fn file_store_uris() {
        assert!(is_file_store("file:///tmp/run/mlruns"));
        assert!(is_file_store("./mlruns"));
        assert!(!is_file_store("http://127.0.0.1:5000"));
        assert!(!is_file_store("sqlite:///mlflow.db"));
    }
}
