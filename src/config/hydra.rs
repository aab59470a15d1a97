//! Hydra's spellings as this parser reads them: its `???`, `defaults` list and own section in a
//! config file, its own settings on the command line, its backslash escapes and sweep commas,
//! YAML's signs kept as text, and its interpolations, which are not resolved here.
use std::path::Path;

use serde_yaml_ng::Value;

use super::overrides::path_value;
use crate::error::{Error, Result};

/// Hydra's "???": a value to be given.
pub(super) fn is_hydra_missing(value: &Value) -> bool {
    value.as_str() == Some("???")
}

/// A hydra config file's `defaults` list, as the official and seed-project files have it: the
/// base config (every file here is laid over the defaults, which are that config), `_self_` and
/// hydra's own launcher and sweeper choices, which mean nothing here.
pub(super) fn check_hydra_defaults(value: &Value) -> std::result::Result<(), String> {
    let Value::Sequence(entries) = value else {
        return Err("defaults: expected hydra's list of defaults".into());
    };
    for entry in entries {
        let name = match entry {
            Value::String(name) => name.clone(),
            Value::Mapping(map) if map.len() == 1 => map
                .keys()
                .next()
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            _ => String::new(),
        };
        let understood = matches!(name.as_str(), "config" | "_self_")
            || name.starts_with("override hydra/")
            || name.starts_with("hydra/");
        if !understood {
            return Err(format!(
                "defaults entry {}: only the base config (config, which every file is laid \
                 over), _self_ and hydra's own entries (override hydra/...) are understood; \
                 put the settings of another file in this one",
                serde_yaml_ng::to_string(entry)
                    .map(|s| s.trim().to_owned())
                    .unwrap_or_default()
            ));
        }
    }
    Ok(())
}

/// What YAML reads as its own syntax at the start of a plain value (a comment, an anchor, a
/// tag, an alias, a directive, reserved signs and block scalars), never as text.
pub(super) const YAML_SIGNS: [char; 9] = ['#', '&', '!', '*', '%', '@', '`', '|', '>'];

/// The characters hydra lets a backslash escape in a plain value.
const ESCAPABLE: &str = "\\,()[]{}:= '\"";

/// `raw` with hydra's escapes undone (`a\,b` is `a,b`), where it holds one.
pub(super) fn unescaped(raw: &str) -> Option<String> {
    let (mut text, mut escaped, mut chars) = (String::new(), false, raw.chars().peekable());
    while let Some(c) = chars.next() {
        match chars.peek() {
            Some(&next) if c == '\\' && ESCAPABLE.contains(next) => {
                text.push(next);
                chars.next();
                escaped = true;
            }
            _ => text.push(c),
        }
    }
    escaped.then_some(text)
}

/// Whether `raw` holds a comma outside brackets, quotes and escapes: hydra's sweep separator
/// (`seed=1,2`), where `task=[a,b]`, `run_dir=runs/[a,b]/0`, `'a,b'` and `a\,b` hold one value.
pub(super) fn has_top_level_comma(raw: &str) -> bool {
    let (mut depth, mut quote, mut chars) = (0i32, None, raw.chars());
    while let Some(c) = chars.next() {
        match (quote, c) {
            (None, '\\') => {
                chars.next();
            }
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '[' | '{') => depth += 1,
            (None, ']' | '}') => depth -= 1,
            (None, ',') if depth <= 0 => return true,
            _ => {}
        }
    }
    false
}

/// What hydra's own settings (`hydra.run.dir=...`, `hydra/launcher=...`) are here.
pub(super) fn hydra_key_hint(arg: &str) -> Option<&'static str> {
    let key = arg.split_once('=').map_or(arg, |(key, _)| key);
    let key = key.trim().trim_start_matches('+');
    if key == "work_dir" {
        return Some(
            "the official work_dir is run_dir here (runs/<task>/<exp_name>/<seed> by default)",
        );
    }
    if key == "hydra.run.dir" || key == "hydra.sweep.dir" {
        return Some("hydra's own settings are not read here; the run directory is run_dir=DIR");
    }
    if key.starts_with("hydra/job_logging")
        || key.starts_with("hydra/hydra_logging")
        || key == "hydra.verbose"
    {
        return Some(
            "hydra's logging is not used here: rank 0 logs the run (console and files under \
             run_dir), other ranks their warnings and errors (docs/outputs.md)",
        );
    }
    if key.starts_with("hydra.job.") || key == "hydra.output_subdir" {
        return Some(
            "hydra's job settings are not read here: a run never changes its working \
             directory, and writes everything under run_dir, its resolved config as \
             config.yaml (docs/outputs.md)",
        );
    }
    (key == "hydra" || key.starts_with("hydra.") || key.starts_with("hydra/")).then_some(
        "hydra's own settings are not read here: --multirun (-m) sweeps, and ranks start with \
         launcher=builtin, torchrun or slurm (docs/distributed.md)",
    )
}

/// A setting holding `${...}` (hydra's interpolation, which this parser does not resolve):
/// refused, as a number setting's is, with the file it came from. A path the run reads
/// (`checkpoint`, `resume`, `data_dir`) that exists is taken as it is: an earlier version may
/// have named a folder so.
pub(super) fn refuse_interpolations(
    tree: &Value,
    origin: &dyn Fn(&str) -> Option<String>,
) -> Result<()> {
    const READ_PATHS: [&str; 3] = ["checkpoint", "resume", "data_dir"];
    let Some(map) = tree.as_mapping() else {
        return Ok(());
    };
    for (key, value) in map {
        let (Some(key), Some(text)) = (key.as_str(), value.as_str()) else {
            continue;
        };
        let existing = READ_PATHS.contains(&key) && Path::new(text).exists();
        if text.contains("${") && !existing {
            let from = origin(key).map_or(String::new(), |file| format!("{file}: "));
            return Err(Error::Config(format!(
                "{from}{key}={text}: interpolations are not resolved here; give the value itself"
            )));
        }
    }
    Ok(())
}

/// A hydra file's own section (logging, job, output folders) has nothing to do here, but for
/// the run directory, which is run_dir, and a sweep, which is `-m`: those would be lost unsaid.
pub(super) fn check_hydra_section(value: &Value) -> std::result::Result<(), String> {
    for (setting, instead) in [
        (
            "run.dir",
            "the run directory is run_dir here; set run_dir instead",
        ),
        (
            "sweep.dir",
            "the run directory is run_dir here; set run_dir instead",
        ),
        (
            "sweeper.params",
            "sweeps are given as `tdmpc2 train -m key=a,b` here",
        ),
        ("mode", "sweeps are given as `tdmpc2 train -m key=a,b` here"),
    ] {
        if path_value(value, setting).is_some() {
            return Err(format!("hydra.{setting}: {instead}"));
        }
    }
    Ok(())
}
