//! MLflow through the Python `mlflow` package (`mlflow-skinny` suffices). The tracking URI is
//! `MLFLOW_TRACKING_URI` when set, else the file store `file://<run_dir>/mlruns`.
use std::collections::HashMap;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use embedded_python as python;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::tracker_runs::{MlflowRun, TrackerRuns};
use super::{Record, Sink, Video};
use crate::error::{Error, Result};

/// MLflow's cap on one `log_batch` call's params.
const PARAMS_PER_BATCH: usize = 100;
/// MLflow's cap on a param value's length.
const MAX_PARAM_LEN: usize = 6000;
/// The tag listing the steps a continued run resumed at, comma-separated.
const RESUMED_TAG: &str = "resumed_at_steps";

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
    /// Starts a run and logs `config`, flattened to `a.b` keys, as its params. A resumed run
    /// (`resumed`: its checkpoint's step, None for a restart that had none, and the runs its
    /// directory logged to) continues its
    /// MLflow run when that run is still at this tracking URI: params it lacks are added,
    /// changed ones (MLflow keeps params fixed) go to `changed_on_resume.<key>` tags, and the
    /// `resumed_at_steps` tag lists where it resumed.
    pub fn create(
        opts: &MlflowOptions,
        run_dir: &Path,
        config: &serde_json::Value,
        resumed: Option<(Option<u64>, &TrackerRuns)>,
    ) -> Result<Self> {
        let env_uri = std::env::var("MLFLOW_TRACKING_URI")
            .ok()
            .filter(|u| !u.is_empty());
        let explicit_uri = opts.tracking_uri.clone().or(env_uri);
        let default_store = explicit_uri.is_none();
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
            set_client_defaults(py, &tracking_uri)?;
            let mlflow = py.import("mlflow")?;
            let entities = py.import("mlflow.entities")?;
            let client = mlflow
                .getattr("MlflowClient")?
                .call1((tracking_uri.as_str(),))?;
            // The run this directory logged to: at this URI, or, in the default store, under
            // the directory's earlier path (moved or copied with it, when it is there).
            let earlier = resumed.and_then(|(step, runs)| {
                let run = runs.mlflow.as_ref()?;
                let here = run.tracking_uri == tracking_uri
                    || (default_store && is_file_store(&run.tracking_uri));
                here.then_some((step, run.run_id.as_str()))
            });
            let continued = match earlier {
                Some((step, run_id)) => continue_at(&client, &tracking_uri, run_id, step)?,
                None => None,
            };
            let (run_id, logged) = match continued {
                Some(continued) => continued,
                None => (new_run(py, &client, opts)?, HashMap::new()),
            };
            log_params(
                &client,
                &entities.getattr("Param")?,
                &run_id,
                &params,
                &logged,
            )?;
            Ok(Self {
                client: client.unbind(),
                metric: entities.getattr("Metric")?.unbind(),
                run_id,
                tracking_uri,
                finished: false,
            })
        })
        .map_err(|e| {
            let message = python::message(&e.0);
            let why = message.trim_end().trim_end_matches('.');
            // A scheme no store of MLflow's takes is bad input, which a restart would not mend.
            match why.starts_with("UnsupportedModelRegistryStoreURIException") {
                true => Error::Config(format!(
                    "MLFLOW_TRACKING_URI: MLflow cannot store runs there ({why}). Give it a \
                     URI MLflow takes, unset it (a file store in the run directory), or set \
                     enable_mlflow=false"
                )),
                false => Error::Other(format!(
                    "enable_mlflow: cannot start an MLflow run in experiment {:?}: {why}. Set \
                     enable_mlflow=false, or MLFLOW_TRACKING_URI",
                    opts.experiment,
                )),
            }
        })
    }

    /// Where this run is found again.
    pub fn tracker_run(&self) -> MlflowRun {
        MlflowRun {
            tracking_uri: self.tracking_uri.clone(),
            run_id: self.run_id.clone(),
        }
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

/// Logs `params` to `run_id`, but for those it `logged` already: a changed value goes to a
/// `changed_on_resume.<key>` tag (MLflow keeps params fixed).
fn log_params(
    client: &Bound<'_, PyAny>,
    param: &Bound<'_, PyAny>,
    run_id: &str,
    params: &[(String, String)],
    logged: &HashMap<String, String>,
) -> PyResult<()> {
    for chunk in params.chunks(PARAMS_PER_BATCH) {
        let batch = PyList::empty(client.py());
        for (k, v) in chunk {
            match logged.get(k) {
                None => batch.append(param.call1((k, v))?)?,
                // Where the run resumes from and where its nodes meet change with every resume.
                Some(_) if crate::config::PLACEMENT_SETTINGS.contains(&k.as_str()) => {}
                Some(before) if before != v => {
                    let tag = format!("changed_on_resume.{k}");
                    client.call_method1("set_tag", (run_id, tag, v))?;
                }
                Some(_) => {}
            }
        }
        if batch.is_empty() {
            continue;
        }
        let kwargs = PyDict::new(client.py());
        kwargs.set_item("params", batch)?;
        client.call_method("log_batch", (run_id,), Some(&kwargs))?;
    }
    Ok(())
}

/// A new run in the options' experiment, created when missing; its id.
fn new_run(py: Python<'_>, client: &Bound<'_, PyAny>, opts: &MlflowOptions) -> PyResult<String> {
    let experiment_id = experiment_id(client, &opts.experiment)?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("run_name", &opts.run_name)?;
    let run = client.call_method("create_run", (experiment_id,), Some(&kwargs))?;
    run.getattr("info")?.getattr("run_id")?.extract()
}

/// The settings of MLflow's client this trainer needs, unless the environment sets them.
fn set_client_defaults(py: Python<'_>, tracking_uri: &str) -> PyResult<()> {
    let environ = py.import("os")?.getattr("environ")?;
    if is_file_store(tracking_uri) {
        // MLflow 3 refuses the file store unless asked for it explicitly.
        environ.call_method1("setdefault", ("MLFLOW_ALLOW_FILE_STORE", "true"))?;
    }
    // A server that does not answer costs its client's timeout per attempt on rank 0, while
    // the other ranks wait: 2 retries and 20 s, not its 7 and 120 s.
    environ.call_method1("setdefault", ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2"))?;
    environ.call_method1("setdefault", ("MLFLOW_HTTP_REQUEST_TIMEOUT", "20"))?;
    // Its "View run" line, printed before a run is marked ended, fails on a terminal that is
    // gone (and the run stays running); the run directory names the run.
    environ.call_method1(
        "setdefault",
        ("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true"),
    )?;
    Ok(())
}

/// Continues `run_id` from the checkpoint of `step` (None: from the start, a restart before
/// any checkpoint): in a file store its points past the step are dropped first; the step (0)
/// joins its `resumed_at_steps` tag. Its id and logged params; None when the store does not
/// hold it (see [`continue_run`]).
fn continue_at(
    client: &Bound<'_, PyAny>,
    tracking_uri: &str,
    run_id: &str,
    step: Option<u64>,
) -> python::Result<Option<(String, HashMap<String, String>)>> {
    if is_file_store(tracking_uri) {
        let store: std::path::PathBuf = client
            .py()
            .import("mlflow.utils.file_utils")?
            .call_method1("local_file_uri_to_path", (tracking_uri,))?
            .extract()?;
        drop_points_after(&store, run_id, step)?;
    }
    let Some((run_id, logged, steps)) = continue_run(client, run_id)? else {
        return Ok(None);
    };
    let step = step.unwrap_or(0);
    let steps = match steps {
        Some(before) => format!("{before},{step}"),
        None => step.to_string(),
    };
    client.call_method1("set_tag", (&run_id, RESUMED_TAG, steps))?;
    Ok(Some((run_id, logged)))
}

/// The id of the experiment `name`, created when missing: also when another job (a sweep's
/// seed started beside this one) creates it first. One that was deleted is refused, naming it:
/// MLflow starts no run in it.
fn experiment_id<'py>(client: &Bound<'py, PyAny>, name: &str) -> PyResult<Bound<'py, PyAny>> {
    let existing = |client: &Bound<'py, PyAny>| -> PyResult<Option<Bound<'py, PyAny>>> {
        let experiment = client.call_method1("get_experiment_by_name", (name,))?;
        if experiment.is_none() {
            return Ok(None);
        }
        let stage: String = experiment.getattr("lifecycle_stage")?.extract()?;
        if stage != "active" {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "the experiment {name:?} was deleted (it is in MLflow's trash): restore it \
                 (mlflow experiments restore), or name another with exp_name"
            )));
        }
        Ok(Some(experiment.getattr("experiment_id")?))
    };
    if let Some(id) = existing(client)? {
        return Ok(id);
    }
    match client.call_method1("create_experiment", (name,)) {
        Ok(id) => Ok(id),
        Err(e) => match existing(client)? {
            Some(id) => Ok(id),
            None => Err(e),
        },
    }
}

/// A run this directory logged to, marked running again: its id, logged params and
/// `resumed_at_steps` tag. None when the store does not hold it (deleted, another store at the
/// same URI); a store that cannot say (a server that does not answer) is an error, not a new
/// run beside one left running.
type Continued = (String, HashMap<String, String>, Option<String>);
fn continue_run(client: &Bound<'_, PyAny>, run_id: &str) -> PyResult<Option<Continued>> {
    let run = match client.call_method1("get_run", (run_id,)) {
        Ok(run) => run,
        Err(e) if error_code(client.py(), &e).as_deref() == Some("RESOURCE_DOES_NOT_EXIST") => {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    let info = run.getattr("info")?;
    let stage: String = info.getattr("lifecycle_stage")?.extract()?;
    // A run of a deleted experiment is found too (the file store looks in its trash): a new
    // run is refused there, naming the experiment.
    let experiment = client.call_method1("get_experiment", (info.getattr("experiment_id")?,))?;
    let experiment_stage: String = experiment.getattr("lifecycle_stage")?.extract()?;
    if stage != "active" || experiment_stage != "active" {
        return Ok(None);
    }
    let data = run.getattr("data")?;
    let params: HashMap<String, String> = data.getattr("params")?.extract()?;
    let tags: HashMap<String, String> = data.getattr("tags")?.extract()?;
    let kwargs = PyDict::new(client.py());
    kwargs.set_item("status", "RUNNING")?;
    client.call_method("update_run", (run_id,), Some(&kwargs))?;
    Ok(Some((
        run_id.to_owned(),
        params,
        tags.get(RESUMED_TAG).cloned(),
    )))
}

/// An `MlflowException`'s code (`RESOURCE_DOES_NOT_EXIST`, ...).
fn error_code(py: Python<'_>, e: &PyErr) -> Option<String> {
    e.value(py).getattr("error_code").ok()?.extract().ok()
}

/// The points a file store's run holds past the checkpoint it resumes from belong to the undone
/// attempt: dropped, as from the run's own files (a server cannot drop them).
fn drop_points_after(store: &Path, run_id: &str, step: Option<u64>) -> python::Result<()> {
    let Ok(experiments) = std::fs::read_dir(store) else {
        return Ok(());
    };
    for experiment in experiments.flatten() {
        let metrics = experiment.path().join(run_id).join("metrics");
        if metrics.is_dir() {
            super::continuation::drop_file_store_points_after(&metrics, step)
                .map_err(|e| python::Error(e.to_string()))?;
        }
    }
    Ok(())
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
/// multitask run's `episode_reward+walker-run` becomes `episode_reward.walker-run`. Not
/// `episode_reward/walker-run`: the file store keeps `episode_reward` as a file, which a key
/// under it would need as a folder, and refuses the whole batch.
fn metric_key(key: &str) -> String {
    key.chars()
        .map(|c| match c {
            '+' => '.',
            c if c.is_alphanumeric() || "_-. :/".contains(c) => c,
            _ => '_',
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
            "eval/episode_reward.avg_dmcontrol"
        );
        assert_eq!(metric_key("eval/q(pi)"), "eval/q_pi_");
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
