//! Weights & Biases through the Python `wandb` package. Without credentials and without
//! `WANDB_MODE`, runs are offline: `<run_dir>/wandb/offline-run-*`, for `wandb sync` later.
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use embedded_python as python;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::{Record, Sink, Video};
use crate::error::{Error, Result};

/// What `wandb.init` gets besides the run directory and the config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WandbOptions {
    pub project: String,
    pub entity: Option<String>,
    /// The run's display name; W&B picks one when `None`.
    pub name: Option<String>,
    pub group: Option<String>,
    pub tags: Vec<String>,
    /// `wandb_silent`: no W&B lines on the terminal.
    pub silent: bool,
    /// "offline", "online", "disabled"... `None`: `WANDB_MODE` when set, else online with
    /// credentials (`WANDB_API_KEY` or a netrc entry from `wandb login`), else offline.
    pub mode: Option<String>,
}

/// Unfinished runs in this process, changed only during the import turn
/// ([`python::attach_exclusive`]), as are `wandb.init` and `wandb.teardown`.
static LIVE_RUNS: AtomicUsize = AtomicUsize::new(0);

/// The sink's name, and its key in `trackers.json`.
pub(super) const NAME: &str = "wandb";

pub struct Wandb {
    /// `None` once finished.
    run: Option<Py<PyAny>>,
    id: String,
    /// A continued run holds the steps its undone attempt logged, up to this one: W&B ignores
    /// a step it holds online, and its sync may renumber one offline, so they are not sent.
    held_through: Option<u64>,
}

impl Wandb {
    fn holds(&self, step: u64) -> bool {
        self.held_through.is_some_and(|held| step <= held)
    }
}

impl Wandb {
    /// Starts a run with `config` (the resolved config) as its config; with `continues`, the
    /// run of that id continues (online; offline, a new offline run of that id, which
    /// `wandb sync --id <id>` appends), its config updated to `config`.
    pub fn create(
        opts: &WandbOptions,
        run_dir: &Path,
        config: &serde_json::Value,
        continues: Option<(&str, Option<u64>)>,
    ) -> Result<Self> {
        let held_through = continues.and_then(|(_, held)| held);
        let continues = continues.map(|(id, _)| id);
        let config = serde_json::to_string(config)
            .map_err(|e| Error::Other(format!("config to JSON for wandb: {e}")))?;
        let requested = opts
            .mode
            .clone()
            .or_else(|| std::env::var("WANDB_MODE").ok());
        let mode = resolve_mode(requested, || {
            ["WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"]
                .iter()
                .any(|k| std::env::var_os(k).is_some_and(|v| !v.is_empty()))
                || python::attach_exclusive(|py| -> python::Result<bool> {
                    Ok(netrc_has_wandb_key(py))
                })
                .unwrap_or(false)
        });
        let (run, id) = python::attach_exclusive(|py| -> python::Result<_> {
            let wandb = py.import("wandb")?;
            let settings = PyDict::new(py);
            settings.set_item("silent", opts.silent)?;
            // The trainer prints from Rust straight to fd 1, which "wrap" never sees and
            // "redirect" would take over for the whole process: capture nothing instead.
            if std::env::var_os("WANDB_CONSOLE").is_none() {
                settings.set_item("console", "off")?;
            }
            let kwargs = PyDict::new(py);
            kwargs.set_item("project", &opts.project)?;
            kwargs.set_item("entity", opts.entity.as_deref())?;
            kwargs.set_item("name", opts.name.as_deref())?;
            kwargs.set_item("group", opts.group.as_deref())?;
            kwargs.set_item("tags", &opts.tags)?;
            kwargs.set_item("dir", run_dir.to_string_lossy())?;
            let config = py.import("json")?.call_method1("loads", (config,))?;
            kwargs.set_item("config", &config)?;
            kwargs.set_item("mode", &mode)?;
            if let Some(id) = continues {
                kwargs.set_item("id", id)?;
                kwargs.set_item("resume", "allow")?;
            }
            // Other runs in this process (tests, a second logger) stay untouched.
            kwargs.set_item("reinit", "create_new")?;
            kwargs.set_item(
                "settings",
                wandb.getattr("Settings")?.call((), Some(&settings))?,
            )?;
            let run = wandb.getattr("init")?.call((), Some(&kwargs))?;
            LIVE_RUNS.fetch_add(1, Ordering::SeqCst);
            let id: String = run.getattr("id")?.extract()?;
            if continues.is_some() {
                // A resumed run's stored config replaces the one given to `init`.
                let update = PyDict::new(py);
                update.set_item("allow_val_change", true)?;
                run.getattr("config")?
                    .call_method("update", (config,), Some(&update))?;
            }
            Ok((run.unbind(), id))
        })
        .map_err(|e| {
            let offline = match mode.as_str() {
                "offline" => "",
                _ => ", or WANDB_MODE=offline to log locally",
            };
            Error::Other(format!(
                "enable_wandb: wandb.init failed ({} mode, dir {}): {}. \
                 Set enable_wandb=false{offline}",
                mode,
                run_dir.display(),
                python::message(&e.0).trim_end().trim_end_matches('.')
            ))
        })?;
        Ok(Self {
            run: Some(run),
            id,
            held_through,
        })
    }

    /// The run's id, which a resumed run continues.
    pub fn id(&self) -> &str {
        &self.id
    }

    fn run(&self) -> Result<&Py<PyAny>> {
        self.run
            .as_ref()
            .ok_or_else(|| Error::Other("wandb run already finished".into()))
    }

    fn finish(&mut self, exit_code: i32) -> Result<()> {
        let Some(run) = self.run.take() else {
            return Ok(());
        };
        python::attach_exclusive(|py| -> python::Result<_> {
            let kwargs = PyDict::new(py);
            kwargs.set_item("exit_code", exit_code)?;
            let finished = run.bind(py).call_method("finish", (), Some(&kwargs));
            // `finish` can return before the run's files are complete, and wandb's atexit
            // teardown never runs in an embedded interpreter: the last run tears down.
            if LIVE_RUNS.fetch_sub(1, Ordering::SeqCst) == 1 {
                py.import("wandb")?.call_method0("teardown")?;
            }
            finished?;
            Ok(())
        })
        .map_err(|e| Error::Other(format!("wandb finish: {e}")))
    }
}

impl Sink for Wandb {
    fn name(&self) -> &'static str {
        NAME
    }

    fn takes_each_step_once(&self) -> bool {
        true
    }

    fn write(&mut self, record: &Record) -> Result<()> {
        if self.holds(record.step) {
            return Ok(());
        }
        let run = self.run()?;
        python::attach_exclusive(|py| -> python::Result<_> {
            let data = PyDict::new(py);
            let phase = record.phase.name();
            // The step as a key too, as the official logger has it (an x-axis for panels).
            data.set_item(format!("{phase}/step"), record.step)?;
            for (k, v) in &record.values {
                data.set_item(format!("{phase}/{k}"), v)?;
            }
            let kwargs = PyDict::new(py);
            kwargs.set_item("step", record.step)?;
            run.bind(py).call_method("log", (data,), Some(&kwargs))?;
            Ok(())
        })
        .map_err(|e| Error::Other(format!("wandb log at step {}: {e}", record.step)))
    }

    /// The GIF file as a `wandb.Video` at the video's step (W&B copies it into the run).
    fn video(&mut self, video: &Video) -> Result<()> {
        if self.holds(video.step) {
            return Ok(());
        }
        let run = self.run()?;
        python::attach_exclusive(|py| -> python::Result<_> {
            let media = py
                .import("wandb")?
                .getattr("Video")?
                .call1((video.path.to_string_lossy(),))?;
            let data = PyDict::new(py);
            data.set_item(super::VIDEO_TAG, media)?;
            let kwargs = PyDict::new(py);
            kwargs.set_item("step", video.step)?;
            run.bind(py).call_method("log", (data,), Some(&kwargs))?;
            Ok(())
        })
        .map_err(|e| Error::Other(format!("wandb video at step {}: {e}", video.step)))
    }

    fn close(&mut self) -> Result<()> {
        self.finish(0)
    }

    /// Stopped with its checkpoint, to be resumed: W&B shows it preempted, not finished.
    fn close_stopped(&mut self) -> Result<()> {
        let marked = self.run.as_ref().map_or(Ok(()), |run| {
            python::attach_exclusive(|py| -> python::Result<_> {
                run.bind(py).call_method0("mark_preempting")?;
                Ok(())
            })
            .map_err(|e| Error::Other(format!("wandb mark_preempting: {e}")))
        });
        let finished = self.finish(crate::error::STOPPED_EXIT_CODE);
        marked.and(finished)
    }
}

impl Drop for Wandb {
    /// Not closed: the run ends as failed.
    fn drop(&mut self) {
        let _ = self.finish(1);
    }
}

/// The mode for `wandb.init`: the requested one, else online only with credentials.
fn resolve_mode(requested: Option<String>, has_credentials: impl FnOnce() -> bool) -> String {
    match requested.filter(|m| !m.is_empty()) {
        Some(mode) => mode,
        None if has_credentials() => "online".to_owned(),
        None => "offline".to_owned(),
    }
}

/// Whether `~/.netrc` (or `$NETRC`) has an entry for the W&B host, where `wandb login`
/// stores the API key. An unreadable netrc counts as none.
fn netrc_has_wandb_key(py: Python<'_>) -> bool {
    let found = || -> PyResult<bool> {
        let os = py.import("os")?;
        let environ = os.getattr("environ")?;
        let base: String = environ
            .call_method1("get", ("WANDB_BASE_URL", "https://api.wandb.ai"))?
            .extract()?;
        let host = py
            .import("urllib.parse")?
            .call_method1("urlparse", (base,))?
            .getattr("hostname")?;
        let path = match environ.call_method1("get", ("NETRC",))? {
            p if p.is_none() => os
                .getattr("path")?
                .call_method1("expanduser", ("~/.netrc",))?,
            p => p,
        };
        if !os
            .getattr("path")?
            .call_method1("exists", (&path,))?
            .extract::<bool>()?
        {
            return Ok(false);
        }
        let entry = py
            .import("netrc")?
            .call_method1("netrc", (path,))?
            .call_method1("authenticators", (host,))?;
        Ok(!entry.is_none())
    };
    found().unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_is_offline_without_credentials_unless_requested() {
        let env = |m: &str| Some(m.to_owned());
        assert_eq!(resolve_mode(None, || false), "offline");
        assert_eq!(resolve_mode(env(""), || false), "offline");
        assert_eq!(resolve_mode(None, || true), "online");
        assert_eq!(resolve_mode(env("disabled"), || true), "disabled");
        assert_eq!(
            resolve_mode(env("online"), || panic!(
                "not asked when a mode is requested"
            )),
            "online"
        );
    }
}
