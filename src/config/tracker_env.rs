//! The trackers' environment variables, checked with the config: W&B refuses a bad
//! `WANDB_MODE` only once the run has started, and a sweep's `WANDB_RUN_ID` names the run's
//! directory.
use super::Config;
use crate::error::{Error, Result};

/// The modes `wandb.init` takes.
const WANDB_MODES: [&str; 6] = ["online", "offline", "disabled", "dryrun", "shared", "run"];
/// What W&B refuses in a project name.
pub(super) const PROJECT_REFUSED: &str = "/\\#?%:";
/// What W&B refuses in a run id.
const RUN_ID_REFUSED: &str = ":;,#?/'";

impl Config {
    /// `WANDB_MODE` (with `enable_wandb`) and the sweep run id that names the run directory,
    /// read through `var`.
    pub(super) fn validate_tracker_env(&self, var: impl Fn(&str) -> Option<String>) -> Result<()> {
        if self.enable_wandb {
            if let Some(mode) = var("WANDB_MODE") {
                if !WANDB_MODES.contains(&mode.as_str()) {
                    return Err(Error::Config(format!(
                        "WANDB_MODE={mode:?} is not a W&B mode: give one of {} (offline logs \
                         under the run directory), or unset it",
                        WANDB_MODES.join(", ")
                    )));
                }
            }
        }
        let sweep_run = var("WANDB_SWEEP_ID").and(var("WANDB_RUN_ID"));
        if let Some(id) = sweep_run.filter(|id| !id.is_empty() && self.run_dir.is_none()) {
            let refused = id.chars().find(|c| RUN_ID_REFUSED.contains(*c));
            if refused.is_some() || id == "." || id == ".." {
                return Err(Error::Config(format!(
                    "WANDB_RUN_ID={id:?} (set by a W&B sweep's agent) names this run's folder \
                     under runs/, and a run id has none of {RUN_ID_REFUSED} and is not . or ..; \
                     give a W&B run id, or run_dir=PATH"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(config: &Config, vars: &[(&str, &str)]) -> Result<()> {
        config.validate_tracker_env(|key| {
            vars.iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn a_wandb_mode_or_sweep_run_id_wandb_would_refuse_is_refused_by_name() {
        let mut config = Config::defaults().unwrap();
        check(&config, &[("WANDB_MODE", "bogus")]).unwrap();
        config.enable_wandb = true;
        for mode in WANDB_MODES {
            check(&config, &[("WANDB_MODE", mode)]).unwrap();
        }
        for mode in ["bogus", ""] {
            let e = check(&config, &[("WANDB_MODE", mode)]).unwrap_err();
            assert!(
                e.to_string()
                    .contains(&format!("WANDB_MODE={mode:?} is not a W&B mode")),
                "{e}"
            );
        }
        let sweep = |id: &'static str| [("WANDB_SWEEP_ID", "abc"), ("WANDB_RUN_ID", id)];
        check(&config, &sweep("x7g2kq")).unwrap();
        check(&config, &sweep("run%1")).unwrap();
        check(&config, &[("WANDB_RUN_ID", "../x")]).unwrap();
        for id in ["x/../../evil", "..", "a:b"] {
            let e = check(&config, &sweep(id)).unwrap_err();
            assert!(e.to_string().contains("names this run's folder"), "{e}");
        }
        config.run_dir = Some("/tmp/elsewhere".into());
        check(&config, &sweep("x/../../evil")).unwrap();
    }
}
