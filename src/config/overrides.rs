//! Laying a config file and hydra-style `key=value` overrides over the defaults' YAML tree,
//! then reading the tree into a `Config` with errors in plain words.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_yaml_ng::{Mapping, Value};

use super::hydra::{
    check_hydra_defaults, check_hydra_section, has_top_level_comma, hydra_key_hint,
    is_hydra_missing, refuse_interpolations, unescaped, YAML_SIGNS,
};
use super::{Config, Source};
use crate::error::{Error, Result};

impl Source {
    pub(super) fn file(&self) -> Result<Option<PathBuf>> {
        // Hydra's primary config is `config` (the official `hydra.main(config_name='config')`):
        // `--config-path DIR` alone reads DIR/config.yaml, as there.
        let name = match (&self.config_name, &self.config_path) {
            (Some(name), _) => name,
            (None, Some(_)) => &PRIMARY_CONFIG.to_owned(),
            (None, None) => return Ok(None),
        };
        let dir = match &self.config_path {
            Some(dir) => dir.clone(),
            None => default_config_dir(),
        };
        let file_name = if name.ends_with(".yaml") || name.ends_with(".yml") {
            name.clone()
        } else {
            format!("{name}.yaml")
        };
        let path = dir.join(file_name);
        if path.is_file() {
            return Ok(Some(path));
        }
        if !dir.is_dir() {
            let what = match dir.exists() {
                true => "is a file, not a directory",
                false => "does not exist",
            };
            let set_by =
                match self.config_path.is_none() && std::env::var_os(CONFIG_DIR_VAR).is_some() {
                    true => format!("{CONFIG_DIR_VAR}, or --config-path"),
                    false => "--config-path".to_owned(),
                };
            return Err(Error::Config(format!(
                "--config-name {name}: the config directory {:?} {what} ({set_by} sets it)",
                dir.display().to_string()
            )));
        }
        let available: Vec<String> = std::fs::read_dir(&dir)
            .map(|entries| {
                entries
                    .flatten()
                    .filter(|e| e.path().is_file())
                    .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                    .filter_map(|n| n.strip_suffix(".yaml").map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let what = match path.is_dir() {
            true => "a directory, not a file:",
            false => "no file",
        };
        if self.config_name.is_none() {
            return Err(Error::Config(format!(
                "--config-path {}: {what} {} (hydra's primary config, read without \
                 --config-name); give --config-name NAME",
                dir.display(),
                path.display()
            )));
        }
        let own_file = match self.config_path.is_none() {
            true => "; for a file of your own, --config-path DIR --config-name NAME",
            false => "",
        };
        Err(Error::Config(format!(
            "--config-name {name}: {what} {} (available in {}: {}){own_file}",
            path.display(),
            dir.display(),
            if available.is_empty() {
                "none".into()
            } else {
                available.join(", ")
            }
        )))
    }
}

/// The file `--config-path` reads without `--config-name`, as hydra's primary config.
const PRIMARY_CONFIG: &str = "config";

/// The variable that names another directory of config files than the repository's.
const CONFIG_DIR_VAR: &str = "TDMPC2_CONFIG_DIR";

/// The repository's `configs/` directory: `TDMPC2_CONFIG_DIR`, else next to the sources the
/// binary was built from.
pub fn default_config_dir() -> PathBuf {
    std::env::var_os(CONFIG_DIR_VAR)
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("configs"))
}

pub(super) fn merge_file(tree: &mut Value, layer: Value, file: &Path) -> Result<()> {
    let Value::Mapping(layer) = layer else {
        if layer.is_null() {
            return Ok(());
        }
        return Err(Error::Config(format!(
            "{}: expected a mapping of keys",
            file.display()
        )));
    };
    for (key, value) in layer {
        let key = key
            .as_str()
            .ok_or_else(|| Error::Config(format!("{}: keys must be strings", file.display())))?
            .to_owned();
        // Hydra's "???" (a value to be given) leaves the default: every key has one here.
        if is_hydra_missing(&value) {
            continue;
        }
        if key == "defaults" {
            check_hydra_defaults(&value)
                .map_err(|e| Error::Config(format!("{}: {e}", file.display())))?;
            continue;
        }
        if key == "hydra" {
            check_hydra_section(&value)
                .map_err(|e| Error::Config(format!("{}: {e}", file.display())))?;
            continue;
        }
        if let Some(hint) = hydra_key_hint(&key) {
            return Err(Error::Config(format!(
                "{}: key '{key}': {hint}; remove it from the file",
                file.display()
            )));
        }
        set_path(tree, &key, value)
            .map_err(|e| Error::Config(format!("{}: {e}", file.display())))?;
    }
    Ok(())
}

/// Applies one hydra-style `key=value` (or `a.b=value`); the value is a YAML scalar or flow list.
pub fn apply_override(tree: &mut Value, arg: &str) -> Result<()> {
    if let Some(key) = arg.strip_prefix('~') {
        let key = key.split_once('=').map_or(key, |(key, _)| key);
        // An unknown key is that, first (setting it to its own value finds it or not).
        let mut probe = tree.clone();
        let own = path_value(tree, key).unwrap_or(Value::Null);
        if let Err(unknown) = set_path(&mut probe, key, own) {
            return Err(Error::Config(format!("'{arg}': {unknown}")));
        }
        let default = path_value(&super::defaults::tree()?, key)
            .and_then(|v| serde_yaml_ng::to_string(&v).ok())
            .map_or_else(String::new, |text| text.trim().to_owned());
        return Err(Error::Config(format!(
            "'{arg}': hydra's ~ deletes a key, but every setting here has a value; give \
             {key}={default} for the built-in default"
        )));
    }
    if let Some(hint) = hydra_key_hint(arg) {
        return Err(Error::Config(format!("'{arg}': {hint}")));
    }
    let Some((key, raw)) = arg.split_once('=') else {
        return Err(Error::Config(format!(
            "cannot parse '{arg}': overrides are key=value (for example steps=100000)"
        )));
    };
    let key = key.trim();
    let appends = key.starts_with('+') && !key.starts_with("++");
    let key = key.trim_start_matches('+');
    if key.is_empty() {
        return Err(Error::Config(format!(
            "cannot parse '{arg}': the key is empty"
        )));
    }
    if has_top_level_comma(raw) {
        return Err(Error::Config(format!(
            "'{arg}': commas separate values to sweep (`tdmpc2 train`: add --multirun (-m) to \
             run one job per value); write a list as {key}=[a,b], or quote one value \
             ({key}='a,b')"
        )));
    }
    // `key=` is the empty string, as in hydra (null is `key=null`): a path left empty by an
    // unset shell variable (`data_dir=$DATA`) is refused by name, not taken as no path.
    // YAML would read ` #` on as a comment (`exp_name=run #2` as `run`): a shell argument has
    // none, so such a value is taken whole, as a string.
    // A leading `#`, `&`, `!` or `*` is a comment, an anchor, a tag or an alias to YAML
    // (`data_dir=#x` would be null: an online run); hydra escapes with a backslash
    // (`exp_name=a\,b` is `a,b`). Such values are the text given.
    let commented = raw.contains(" #") || raw.contains("\t#");
    let quoted = raw.trim_start().starts_with(['\'', '"']);
    let yaml_sign = raw.trim_start().starts_with(YAML_SIGNS);
    super::refuse_deep_nesting(raw, key)?;
    let value: Value = if raw.trim().is_empty() {
        Value::String(String::new())
    } else if let Some(text) = unescaped(raw).filter(|_| !quoted) {
        Value::String(text.trim().to_owned())
    } else if (commented || yaml_sign) && !quoted {
        Value::String(raw.trim().to_owned())
    } else {
        serde_yaml_ng::from_str(raw).map_err(|e| {
            let whole = !raw.trim().is_empty() && raw.trim().chars().all(|c| c.is_ascii_digit());
            if whole {
                return Error::Config(format!(
                    "{key}={raw} is too large: a whole number is at most {}",
                    u64::MAX
                ));
            }
            Error::Config(format!(
                "cannot parse the value of {key}: '{raw}' is not a YAML value ({e})"
            ))
        })?
    };
    set_path(tree, key, value).map_err(|e| match appends {
        true => Error::Config(format!(
            "{e} (hydra's + adds a key; here every setting exists already and no other can \
             be added)"
        )),
        false => Error::Config(e),
    })
}

/// Sets a dotted path inside the tree; every segment must already exist (the defaults name
/// every key), otherwise the error names the closest known key.
fn set_path(tree: &mut Value, dotted: &str, value: Value) -> std::result::Result<(), String> {
    let mut node = tree;
    let segments: Vec<&str> = dotted.split('.').collect();
    for (i, segment) in segments.iter().enumerate() {
        let prefix = segments[..i].join(".");
        let Value::Mapping(map) = node else {
            return Err(format!(
                "{prefix} is not a section, so {dotted} does not exist"
            ));
        };
        let key = Value::String((*segment).to_owned());
        if !map.contains_key(&key) {
            let known: Vec<String> = keys_of(map)
                .into_iter()
                .map(|k| {
                    if prefix.is_empty() {
                        k
                    } else {
                        format!("{prefix}.{k}")
                    }
                })
                .collect();
            return Err(unknown_key(dotted, &known));
        }
        if i + 1 == segments.len() {
            map.insert(key, value);
            return Ok(());
        }
        node = map.get_mut(&key).expect("checked above");
    }
    Ok(())
}

/// The value at a dotted path of the tree, if there is one.
pub(super) fn path_value(tree: &Value, dotted: &str) -> Option<Value> {
    dotted
        .split('.')
        .try_fold(tree, |node, segment| node.get(segment))
        .cloned()
}

fn keys_of(map: &Mapping) -> Vec<String> {
    map.keys()
        .filter_map(|k| k.as_str().map(str::to_owned))
        .collect()
}

fn unknown_key(key: &str, known: &[String]) -> String {
    // A suggestion only where it is close (more than a typo away says nothing).
    let closest = known
        .iter()
        .map(|k| (strsim::jaro_winkler(key, k), k))
        .filter(|(similarity, _)| *similarity >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0));
    match closest {
        Some((_, k)) => format!("unknown key '{key}'; did you mean '{k}'?"),
        None => format!("unknown key '{key}' (`tdmpc2 train --cfg job` lists every key)"),
    }
}

/// Deserializes the tree into a config. A value of another YAML type that means the same is
/// taken as the type the key needs: an integral float (`steps=1e5`) for an integer, a number
/// or boolean for a string (`exp_name=2024`, spelled as it was given in `raw` overrides).
/// A value of the wrong type is named with the file it came from (`origin` of its key).
pub(super) fn from_tree(
    mut tree: Value,
    raw: &BTreeMap<&str, &str>,
    origin: &dyn Fn(&str) -> Option<String>,
) -> Result<Config> {
    refuse_interpolations(&tree, origin)?;
    // Each pass converts one value to a type that is never converted again.
    for _ in 0..=2 * keys_in(&tree) {
        let error = match serde_path_to_error::deserialize(tree.clone()) {
            Ok(config) => return Ok(config),
            Err(error) => error,
        };
        let key = error.path().to_string();
        let inner = error.into_inner().to_string();
        let expected = inner.rsplit(", expected ").next().unwrap_or_default();
        let converted = match tree.get(key.as_str()) {
            // task=[a, b]: one multitask model, kept as the string `[a,b]`.
            Some(Value::Sequence(items)) if key == "task" => {
                super::tasks::list_value(items).map(Value::String)
            }
            Some(value) => convert(value, expected, raw.get(key.as_str()).copied()),
            None => None,
        };
        match (converted, tree.as_mapping_mut()) {
            (Some(value), Some(map)) => {
                map.insert(Value::String(key), value);
            }
            _ => {
                // serde spells a float out in full: 1e300 as 301 digits.
                let huge = tree
                    .get(key.as_str())
                    .and_then(Value::as_f64)
                    .filter(|x| x.abs() >= 1e16);
                let text = tree.get(key.as_str()).and_then(Value::as_str);
                let described = match (huge, text.and_then(|t| why_not_a_number(t, expected))) {
                    (_, Some(why)) => why,
                    (Some(x), None) => {
                        format!("expected {}, got {x:e}", describe_expected(expected))
                    }
                    (None, None) => describe_type_error(&inner),
                };
                let from = origin(&key).map_or(String::new(), |file| format!("{file}: "));
                return Err(Error::Config(format!(
                    "{from}wrong type for '{key}': {described}"
                )));
            }
        }
    }
    Err(Error::Config(
        "the configuration does not settle on types".into(),
    ))
}

fn keys_in(tree: &Value) -> usize {
    tree.as_mapping().map_or(0, Mapping::len)
}

/// `value` as the type serde `expected`, where that keeps its meaning: also hydra's spellings,
/// an integer with underscores (`steps=10_000_000`, as the official config writes it) and a
/// boolean as yes/no/on/off or 1/0.
fn convert(value: &Value, expected: &str, raw: Option<&str>) -> Option<Value> {
    const INTEGERS: [&str; 4] = ["usize", "u64", "u32", "u16"];
    const FLOATS: [&str; 2] = ["f64", "f32"];
    let numeric = INTEGERS.contains(&expected) || FLOATS.contains(&expected);
    if let Some(x) = value.as_str().filter(|_| numeric).and_then(arithmetic) {
        return match FLOATS.contains(&expected) {
            true => Some(Value::Number(x.into())),
            false => convert(&Value::Number(x.into()), expected, raw),
        };
    }
    match value {
        Value::String(s) if INTEGERS.contains(&expected) && digits_maybe_grouped(s) => {
            let n: u64 = s.replace('_', "").parse().ok()?;
            Some(Value::Number(n.into()))
        }
        Value::String(s)
            if FLOATS.contains(&expected) && s.contains('_') && digits_maybe_grouped(s) =>
        {
            let x: f64 = s.replace('_', "").parse().ok()?;
            Some(Value::Number(x.into()))
        }
        Value::String(s) if expected == "a boolean" => match s.to_ascii_lowercase().as_str() {
            "yes" | "on" | "true" => Some(Value::Bool(true)),
            "no" | "off" | "false" => Some(Value::Bool(false)),
            _ => None,
        },
        Value::Number(n) if expected == "a boolean" => match n.as_u64() {
            Some(0) => Some(Value::Bool(false)),
            Some(1) => Some(Value::Bool(true)),
            _ => None,
        },
        Value::Number(n) if INTEGERS.contains(&expected) => {
            let x = n.as_f64().filter(|_| n.is_f64())?;
            // 2^64 is exact as a float; anything below it and integral is a u64.
            let integral = x.fract() == 0.0 && (0.0..18_446_744_073_709_551_616.0).contains(&x);
            integral.then(|| Value::Number((x as u64).into()))
        }
        Value::Number(_) | Value::Bool(_) if expected == "a string" => {
            let text = match (raw, value) {
                (Some(raw), _) => raw.to_owned(),
                (None, Value::Number(n)) => n.to_string(),
                (None, other) => other.as_bool().map(|b| b.to_string())?,
            };
            Some(Value::String(text))
        }
        // `task=gym:` reads as YAML's mapping {gym: null}: a string key takes it as given.
        Value::Mapping(_) if expected == "a string" => raw.map(|r| Value::String(r.to_owned())),
        _ => None,
    }
}

/// A number, grouped by underscores as hydra and Python write them (`10_000_000`, `1_000.5`),
/// or not (a quoted `'1000'`): each underscore between two digits.
fn digits_maybe_grouped(s: &str) -> bool {
    let bytes = s.as_bytes();
    s.starts_with(|c: char| c.is_ascii_digit())
        && bytes.iter().enumerate().all(|(i, &b)| {
            b != b'_'
                || (i > 0
                    && bytes[i - 1].is_ascii_digit()
                    && bytes.get(i + 1).is_some_and(u8::is_ascii_digit))
        })
}

/// The official parser's arithmetic, `A+B`, `A-B`, `A*B` or `A/B` of two whole numbers
/// (`eval_freq=10000/2`).
fn arithmetic(s: &str) -> Option<f64> {
    let at = s.find(['+', '-', '*', '/'])?;
    let (a, op, b) = (&s[..at], &s[at..=at], &s[at + 1..]);
    let whole = |n: &str| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit());
    if !whole(a) || !whole(b) {
        return None;
    }
    let (a, b): (f64, f64) = (a.parse().ok()?, b.parse().ok()?);
    let x = match op {
        "+" => a + b,
        "-" => a - b,
        "*" => a * b,
        _ => a / b,
    };
    x.is_finite().then_some(x)
}

/// Why `text` is not the number a numeric setting expected, where it looks like one: not
/// finite (`inf`, `nan`, `1e400`), arithmetic that is no whole number or divides by zero, or an
/// interpolation (`${steps}`), which this parser does not resolve.
fn why_not_a_number(text: &str, expected: &str) -> Option<String> {
    let numeric = ["usize", "u64", "u32", "u16", "f64", "f32"].contains(&expected);
    let text = text.trim();
    if text.starts_with("${") {
        return Some(format!(
            "got {text:?}: interpolations are not resolved here; give the value itself"
        ));
    }
    if !numeric {
        return None;
    }
    if text.parse::<f64>().is_ok_and(|x| !x.is_finite()) {
        return Some(format!("expected a finite number, got {text}"));
    }
    let at = text.find(['+', '-', '*', '/'])?;
    let (a, b) = (&text[..at], &text[at + 1..]);
    let whole = |n: &str| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit());
    if !whole(a) || !whole(b) {
        return None;
    }
    match (&text[at..=at], b.parse::<f64>().ok()) {
        ("/", Some(0.0)) => Some(format!("{text} divides by zero")),
        _ => match arithmetic(text) {
            Some(x) if x.fract() != 0.0 || x < 0.0 => Some(format!(
                "{text} is {}, not {}",
                match x.fract() {
                    0.0 => format!("{x}"),
                    _ => format!("{x:.3}…"),
                },
                describe_expected(expected)
            )),
            _ => Some(format!(
                "{text} is out of range for {}",
                describe_expected(expected)
            )),
        },
    }
}

/// Plain words for the type serde expected.
fn describe_expected(rust: &str) -> &str {
    match rust {
        "usize" | "u64" | "u32" => "a non-negative integer",
        "u16" => "a port number 1..=65535",
        "f64" => "a number",
        "a boolean" => "true or false",
        other => other,
    }
}

/// Turns serde's "invalid type: string \"x\", expected usize" into plain words.
fn describe_type_error(message: &str) -> String {
    let Some((what, expected)) = message.rsplit_once(", expected ") else {
        return message.to_owned();
    };
    let got = what
        .strip_prefix("invalid type: ")
        .or_else(|| what.strip_prefix("invalid value: "))
        .unwrap_or(what);
    // serde's names for YAML's null, list and mapping.
    let got = match got {
        "unit value" => "null",
        "sequence" => "a list",
        "map" => "a mapping",
        other => other,
    };
    format!("expected {}, got {got}", describe_expected(expected))
}
