//! The jobs of a sweep's overrides: hydra's comma lists, `range()` and `choice()` expanded
//! into every combination, each with its own run directory.
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The most jobs one sweep makes: more is a typo (every combination is checked before any
/// runs).
pub(super) const MOST_JOBS: usize = 10_000;

/// One combination of the swept values.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub index: usize,
    /// The swept settings and this job's value of each, in command-line order.
    pub choices: Vec<(String, String)>,
    /// Every override this job runs with, `run_dir` included.
    pub overrides: Vec<String>,
    pub run_dir: PathBuf,
}

impl Job {
    pub(super) fn describe(&self) -> String {
        self.choices
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Splits a value at its top-level commas: `1,2` is two values, `[1,2]`, `"a,b"` and hydra's
/// escaped `a\,b` are one (the escape is kept for the override to undo).
pub fn split_values(raw: &str) -> Vec<String> {
    let (mut values, mut current, mut depth, mut quote) = (vec![], String::new(), 0i32, None);
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        match (c, quote) {
            ('\\', None) => {
                current.push(c);
                current.extend(chars.next());
                continue;
            }
            ('"' | '\'', None) => quote = Some(c),
            (c, Some(q)) if c == q => quote = None,
            ('[' | '{' | '(', None) => depth += 1,
            (']' | '}' | ')', None) => depth -= 1,
            (',', None) if depth == 0 => {
                values.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    values.push(current);
    values
}

/// The values a sweep takes from `raw`: its top-level commas, or hydra's `choice(a,b)` and
/// `range(start,stop[,step])` (integers, `stop` excluded, as Python's and hydra's).
fn sweep_values(key: &str, raw: &str) -> Result<Vec<String>> {
    refuse_other_sweep_calls(key, raw)?;
    let call = |name: &str| {
        raw.trim()
            .strip_prefix(name)
            .and_then(|rest| rest.strip_prefix('('))
            .and_then(|rest| rest.strip_suffix(')'))
    };
    if let Some(inner) = call("choice") {
        let values: Vec<String> = split_values(inner)
            .into_iter()
            .map(|v| v.trim().to_owned())
            .collect();
        if values.iter().any(String::is_empty) {
            return Err(Error::Config(format!(
                "{key}={raw}: choice takes values, none of them empty, e.g. choice(a,b)"
            )));
        }
        return Ok(values);
    }
    let Some(inner) = call("range") else {
        return Ok(split_values(raw));
    };
    let bad = || {
        Error::Config(format!(
            "{key}={raw}: range takes whole numbers, range(start,stop) or range(start,stop,step) \
             with a step other than 0 (stop excluded)"
        ))
    };
    let numbers = inner
        .split(',')
        .map(|n| n.trim().parse::<i64>().map_err(|_| bad()))
        .collect::<Result<Vec<i64>>>()?;
    let (start, stop, step) = match numbers[..] {
        [start, stop] => (start, stop, 1),
        [start, stop, step] if step != 0 => (start, stop, step),
        _ => return Err(bad()),
    };
    let (start, stop, step) = (i128::from(start), i128::from(stop), i128::from(step));
    let (span, stride) = match step > 0 {
        true => (stop - start, step),
        false => (start - stop, -step),
    };
    let count = (span.max(0) as u128).div_ceil(stride as u128) as i128;
    if count == 0 || count > MOST_JOBS as i128 {
        return Err(Error::Config(format!(
            "{key}={raw} gives {count} values: a sweep takes 1 to {MOST_JOBS}"
        )));
    }
    Ok((0..count).map(|i| (start + i * step).to_string()).collect())
}

/// Hydra's sweep functions this sweep does not take (`interval`, `glob`, ...: an optimising
/// sweeper's), and `range(`/`choice(` calls left open, are refused naming the setting.
fn refuse_other_sweep_calls(key: &str, raw: &str) -> Result<()> {
    let raw = raw.trim();
    let Some((name, rest)) = raw.split_once('(') else {
        return Ok(());
    };
    let taken = ["range", "choice"];
    let others = ["interval", "glob", "shuffle", "sort", "tag", "extend_list"];
    if others.contains(&name) {
        return Err(Error::Config(format!(
            "{key}={raw}: {name}() is not taken here: this sweep runs lists (a,b), range() and \
             choice()"
        )));
    }
    if taken.contains(&name) && !rest.ends_with(')') {
        return Err(Error::Config(format!(
            "{key}={raw}: {name}( is not closed: write {name}(...)"
        )));
    }
    Ok(())
}

/// Expands the overrides into jobs: the cartesian product of the swept values, the last
/// setting varying fastest. `base` is the directory the job directories go into.
pub fn expand(overrides: &[String], base: &Path) -> Result<Vec<Job>> {
    let mut fixed = Vec::new();
    let mut swept: Vec<(String, Vec<String>)> = Vec::new();
    for arg in overrides {
        let Some((key, raw)) = arg.split_once('=') else {
            return Err(Error::Config(format!(
                "cannot parse '{arg}': overrides are key=value (for example steps=100000)"
            )));
        };
        let values = sweep_values(key.trim(), raw)?;
        if values.len() == 1 {
            fixed.push(format!("{key}={}", values[0]));
            continue;
        }
        let key = key.trim().trim_start_matches('+').to_string();
        if key == "run_dir" {
            return Err(Error::Config(
                "run_dir cannot be swept: --multirun gives every job its own directory under \
                 run_dir (or runs/<task>/<exp_name>)"
                    .into(),
            ));
        }
        if values.iter().any(|v| v.trim().is_empty()) {
            return Err(Error::Config(format!(
                "{arg}: an empty value in a sweep; write the values as {key}=a,b,c"
            )));
        }
        swept.push((key, values));
    }
    for (key, _) in &swept {
        let given = overrides.iter().filter(|o| is_key(o, key)).count();
        if given > 1 {
            return Err(Error::Config(format!(
                "{key} is swept and given {given} times; give all its values in one {key}=a,b,c"
            )));
        }
    }
    let total = swept
        .iter()
        .try_fold(1usize, |n, (_, values)| n.checked_mul(values.len()))
        .filter(|&n| n <= MOST_JOBS)
        .ok_or_else(|| {
            let counts: Vec<String> = swept
                .iter()
                .map(|(key, values)| format!("{key}: {}", values.len()))
                .collect();
            Error::Config(format!(
                "the sweep makes more than {MOST_JOBS} jobs ({}); sweep fewer values at once",
                counts.join(", ")
            ))
        })?;
    let mut jobs = Vec::with_capacity(total);
    for index in 0..total {
        let mut rest = index;
        let mut choices = vec![(String::new(), String::new()); swept.len()];
        for (slot, (key, values)) in swept.iter().enumerate().rev() {
            choices[slot] = (key.clone(), values[rest % values.len()].clone());
            rest /= values.len();
        }
        let run_dir = base.join(slug(index, &choices));
        let mut job_overrides = fixed.clone();
        job_overrides.retain(|o| !is_key(o, "run_dir"));
        job_overrides.extend(choices.iter().map(|(k, v)| format!("{k}={v}")));
        // Quoted: a base that holds a comma (`exp_name='a,b'`) is one value, not a sweep.
        let quoted = run_dir.display().to_string().replace('\'', "''");
        job_overrides.push(format!("run_dir='{quoted}'"));
        jobs.push(Job {
            index,
            choices,
            overrides: job_overrides,
            run_dir,
        });
    }
    Ok(jobs)
}

pub(super) fn is_key(arg: &str, key: &str) -> bool {
    arg.split_once('=')
        .is_some_and(|(k, _)| k.trim().trim_start_matches('+') == key)
}

/// A job's directory name: its index, then its choices (`3_seed=2_horizon=3`).
fn slug(index: usize, choices: &[(String, String)]) -> String {
    let mut name = index.to_string();
    for (k, v) in choices {
        name.push('_');
        name.push_str(k);
        name.push('=');
        name.push_str(v);
    }
    // The index alone tells jobs apart: long values (task lists) are cut, as a folder name
    // takes at most 255 bytes.
    name.chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '=' | '.' | '_' | '-' | '+' => c,
            _ => '-',
        })
        .take(MOST_SLUG_CHARS)
        .collect()
}

/// The longest job folder name (ASCII, so as many bytes).
const MOST_SLUG_CHARS: usize = 120;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_calls_this_sweep_cannot_run_are_named() {
        for (arg, named) in [
            ("lr=interval(0,1)", "interval() is not taken here"),
            ("seed=range(1,4", "range( is not closed"),
            ("seed=choice(1,2", "choice( is not closed"),
            ("lr=choice()", "choice takes values, none of them empty"),
            ("lr=choice(1,,2)", "choice takes values, none of them empty"),
        ] {
            let e = expand(&[arg.into()], Path::new(".")).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{arg}: {e}");
            assert!(e.to_string().contains(named), "{arg}: {e}");
        }
        assert_eq!(
            expand(&["exp_name=try(2)".into()], Path::new(".")).unwrap()[0].overrides,
            ["exp_name=try(2)", "run_dir='./0'"]
        );
        // A base folder with a comma or a quote in its name is one path.
        let jobs = expand(&["seed=1,2".into()], Path::new("runs/a,b'c")).unwrap();
        let run_dir = jobs[0].overrides.last().unwrap();
        assert_eq!(run_dir, "run_dir='runs/a,b''c/0_seed=1'");
        let config = crate::config::Config::load(&crate::config::Source {
            overrides: jobs[0].overrides.clone(),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(config.run_dir.as_deref(), Some("runs/a,b'c/0_seed=1"));
    }

    #[test]
    fn commas_sweep_but_brackets_and_quotes_do_not() {
        assert_eq!(split_values("1,2,3"), ["1", "2", "3"]);
        assert_eq!(split_values("[1,2]"), ["[1,2]"]);
        assert_eq!(split_values("[1,2],[3]"), ["[1,2]", "[3]"]);
        assert_eq!(split_values("'a,b',c"), ["'a,b'", "c"]);
        assert_eq!(split_values("3e-4"), ["3e-4"]);
        assert_eq!(split_values("a\\,b,c"), ["a\\,b", "c"]);
        let values = |raw: &str| sweep_values("seed", raw);
        assert_eq!(values("range(1,4)").unwrap(), ["1", "2", "3"]);
        assert_eq!(values("range(10, 0, -5)").unwrap(), ["10", "5"]);
        assert_eq!(values("choice(a, [b,c])").unwrap(), ["a", "[b,c]"]);
        for bad in ["range(1)", "range(1,4,0)", "range(0.5,2)", "range(4,1)"] {
            assert!(values(bad).is_err(), "{bad}");
        }
        let jobs = expand(&["seed=range(1,3)".into()], Path::new("/s")).unwrap();
        assert_eq!(jobs.len(), 2);
        let one = expand(&["seed=range(7,8)".into()], Path::new("/s")).unwrap();
        assert!(
            one[0].overrides.contains(&"seed=7".to_string()),
            "{:?}",
            one[0].overrides
        );
    }

    #[test]
    fn a_swept_key_is_given_once() {
        for args in [
            ["seed=1,2", "seed=3,4"],
            ["seed=1,2", "seed=5"],
            ["seed=5", "+seed=1,2"],
        ] {
            let args = args.map(String::from);
            let e = expand(&args, Path::new("runs")).unwrap_err().to_string();
            assert!(e.contains("give all its values in one"), "{args:?}: {e}");
        }
        // A fixed key given twice is not swept: the last value wins, as everywhere.
        let args = ["seed=1", "seed=2", "horizon=2,3"].map(String::from);
        assert_eq!(expand(&args, Path::new("runs")).unwrap().len(), 2);
    }

    /// More combinations than a sweep takes (or than a usize counts) are refused, naming the
    /// swept keys, where they allocated gigabytes or wrapped to zero jobs and panicked.
    #[test]
    fn a_sweep_of_too_many_jobs_is_refused() {
        let wide = ["seed=1,2,3,4,5,6,7,8,9,10", "horizon=1,2,3,4,5,6,7,8,9,10"];
        let mut args: Vec<String> = wide.iter().map(|a| a.to_string()).collect();
        assert_eq!(expand(&args, Path::new("runs")).unwrap().len(), 100);
        args.push("lr=1,2,3,4,5,6,7,8,9,10,11".into());
        args.push("rho=1,2,3,4,5,6,7,8,9,10".into());
        let e = expand(&args, Path::new("runs")).unwrap_err().to_string();
        assert!(
            e.contains("more than 10000 jobs (seed: 10, horizon: 10, lr: 11, rho: 10)"),
            "{e}"
        );
        let keys: Vec<String> = (0..64).map(|k| format!("+k{k}=1,2")).collect();
        let e = expand(&keys, Path::new("runs")).unwrap_err().to_string();
        assert!(e.contains("more than 10000 jobs"), "{e}");
    }

    #[test]
    fn the_product_varies_the_last_setting_fastest() {
        let args: Vec<String> = ["steps=400", "seed=1,2", "horizon=2,3", "mlp_dims=[4,4]"]
            .map(String::from)
            .into();
        let jobs = expand(&args, Path::new("out")).unwrap();
        let described: Vec<String> = jobs.iter().map(Job::describe).collect();
        assert_eq!(
            described,
            [
                "seed=1 horizon=2",
                "seed=1 horizon=3",
                "seed=2 horizon=2",
                "seed=2 horizon=3"
            ]
        );
        assert_eq!(jobs[3].run_dir, Path::new("out/3_seed=2_horizon=3"));
        let long = format!("exp_name={},b", "x".repeat(300));
        let cut = expand(&[long], Path::new("out")).unwrap();
        let name = |i: usize| cut[i].run_dir.file_name().unwrap().len();
        assert_eq!((name(0), name(1)), (MOST_SLUG_CHARS, "1_exp_name=b".len()));
        assert_eq!(
            jobs[1].overrides,
            [
                "steps=400",
                "mlp_dims=[4,4]",
                "seed=1",
                "horizon=3",
                "run_dir='out/1_seed=1_horizon=3'"
            ]
        );
        let e = expand(&["run_dir=a,b".into()], Path::new(".")).unwrap_err();
        assert!(e.to_string().contains("run_dir cannot be swept"), "{e}");
        let e = expand(&["seed=1,".into()], Path::new(".")).unwrap_err();
        assert!(e.to_string().contains("empty value"), "{e}");
    }
}
