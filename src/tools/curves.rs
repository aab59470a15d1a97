//! Learning curves read back from run directories (`metrics.jsonl`, `config.yaml`) and from the
//! official TD-MPC2 results CSVs, and their mean and spread over seeds.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The metrics file every run directory holds.
pub const METRICS_FILE: &str = "metrics.jsonl";

/// One point per logged record: (x, metric).
pub type Curve = Vec<(f64, f64)>;

/// The records of one run's `metrics.jsonl`.
pub struct Metrics {
    pub path: PathBuf,
    records: Vec<serde_json::Map<String, serde_json::Value>>,
}

impl Metrics {
    /// Reads `RUN_DIR/metrics.jsonl` (or the file itself when given one).
    pub fn read(run: &Path) -> Result<Self> {
        let path = if run.is_dir() {
            run.join(METRICS_FILE)
        } else {
            run.to_path_buf()
        };
        if !path.is_file() {
            return Err(Error::Config(format!(
                "{} holds no {METRICS_FILE}: give a run directory (one that `tdmpc2 train` \
                 wrote), or its {METRICS_FILE}",
                run.display()
            )));
        }
        let text = std::fs::read_to_string(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidData => Error::Config(format!(
                "{}: not text ({METRICS_FILE} holds JSON lines); damaged, or another file",
                path.display()
            )),
            _ => Error::io(format!("read {}", path.display()), e),
        })?;
        let mut records = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<serde_json::Value>(line) {
                Ok(serde_json::Value::Object(record)) => records.push(record),
                // A run killed while writing leaves a cut last line; everything before it counts.
                Err(e) if e.is_eof() && i + 1 == text.lines().count() => {}
                _ => {
                    return Err(Error::Config(format!(
                        "{} line {}: not a JSON object",
                        path.display(),
                        i + 1
                    )))
                }
            }
        }
        Ok(Self { path, records })
    }

    fn of_phase<'a>(
        &'a self,
        phase: &'a str,
    ) -> impl Iterator<Item = &'a serde_json::Map<String, serde_json::Value>> + 'a {
        self.records
            .iter()
            .filter(move |r| r.get("phase").and_then(|p| p.as_str()) == Some(phase))
    }

    /// The numeric fields of the `phase` records, `step` and `phase` excepted.
    pub fn metric_names(&self, phase: &str) -> BTreeSet<String> {
        self.of_phase(phase)
            .flat_map(|r| r.iter())
            .filter(|(k, v)| v.is_number() && k.as_str() != "step")
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Whether any `phase` record holds `metric`, as a number or not (NaN is logged as null).
    pub fn logs(&self, phase: &str, metric: &str) -> bool {
        self.of_phase(phase).any(|r| r.contains_key(metric))
    }

    /// `metric` against `x` over the `phase` records that hold both.
    pub fn curve(&self, phase: &str, x: &str, metric: &str) -> Curve {
        self.of_phase(phase)
            .filter_map(|r| Some((r.get(x)?.as_f64()?, r.get(metric)?.as_f64()?)))
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .collect()
    }

    /// The last evaluation's value of `metric`.
    pub fn last(&self, phase: &str, metric: &str) -> Option<f64> {
        self.of_phase(phase)
            .filter_map(|r| r.get(metric)?.as_f64())
            .last()
    }
}

/// How far the seeds of one configuration spread around their mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Spread {
    /// From the lowest to the highest seed.
    Minmax,
    /// One standard deviation either side of the mean.
    Std,
}

/// The mean of several curves and a band around it.
#[derive(Debug, Clone, PartialEq)]
pub struct Band {
    pub x: Vec<f64>,
    pub mean: Vec<f64>,
    pub low: Vec<f64>,
    pub high: Vec<f64>,
}

impl Band {
    /// Aggregates curves point by point: the k-th record of every run (runs of one
    /// configuration evaluate at the same steps; along wall time the k-th evaluations match),
    /// as far as every run goes: a seed that stopped early would otherwise leave the mean and
    /// change it with a jump.
    pub fn by_index(curves: &[Curve], spread: Spread) -> Self {
        let shortest = curves.iter().map(Vec::len).min().unwrap_or(0);
        let columns = (0..shortest).map(|k| {
            let points: Vec<(f64, f64)> = curves.iter().map(|c| c[k]).collect();
            let x = points.iter().map(|p| p.0).sum::<f64>() / points.len() as f64;
            (x, points.into_iter().map(|p| p.1).collect::<Vec<_>>())
        });
        Self::from_columns(columns, spread)
    }

    /// Aggregates curves against agent steps: point by point ([`Self::by_index`]) where the runs
    /// logged at the same steps (evaluations), else each run's value read off its line at every
    /// step one of them logged, over the steps all of them cover (training records, logged at
    /// episode ends, which fall at other steps in each seed of a task that ends early).
    pub fn by_step(curves: &[Curve], spread: Spread) -> Self {
        let shortest = curves.iter().map(Vec::len).min().unwrap_or(0);
        let aligned = (0..shortest).all(|k| curves.iter().all(|c| c[k].0 == curves[0][k].0));
        if aligned {
            return Self::by_index(curves, spread);
        }
        let first = curves.iter().filter_map(|c| c.first()).map(|p| p.0);
        let last = curves.iter().filter_map(|c| c.last()).map(|p| p.0);
        let (from, to) = (
            first.fold(f64::MIN, f64::max),
            last.fold(f64::MAX, f64::min),
        );
        let mut steps: Vec<f64> = curves
            .iter()
            .flatten()
            .map(|p| p.0)
            .filter(|x| (from..=to).contains(x))
            .collect();
        steps.sort_by(f64::total_cmp);
        steps.dedup();
        if steps.is_empty() {
            // Runs over steps apart from each other: record by record, as before.
            return Self::by_index(curves, spread);
        }
        let columns = steps.into_iter().map(|x| {
            let ys = curves.iter().map(|c| value_at(c, x)).collect();
            (x, ys)
        });
        Self::from_columns(columns, spread)
    }

    /// Aggregates `(x, y)` samples that share an x (the official CSVs: one row per seed and step).
    pub fn by_x(samples: &[(f64, f64)], spread: Spread) -> Self {
        let mut columns: BTreeMap<OrderedX, Vec<f64>> = BTreeMap::new();
        for &(x, y) in samples {
            columns.entry(OrderedX(x)).or_default().push(y);
        }
        Self::from_columns(columns.into_iter().map(|(x, ys)| (x.0, ys)), spread)
    }

    fn from_columns(columns: impl Iterator<Item = (f64, Vec<f64>)>, spread: Spread) -> Self {
        let mut band = Band {
            x: vec![],
            mean: vec![],
            low: vec![],
            high: vec![],
        };
        for (x, ys) in columns {
            let n = ys.len() as f64;
            let mean = ys.iter().sum::<f64>() / n;
            let (low, high) = match spread {
                Spread::Minmax => (
                    ys.iter().copied().fold(f64::INFINITY, f64::min),
                    ys.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                ),
                Spread::Std => {
                    let std = (ys.iter().map(|y| (y - mean).powi(2)).sum::<f64>() / n).sqrt();
                    (mean - std, mean + std)
                }
            };
            band.x.push(x);
            band.mean.push(mean);
            band.low.push(low);
            band.high.push(high);
        }
        band
    }
}

/// A curve's value at `x`, on the straight line between its points either side (`x` within
/// its span, its points in order of x).
fn value_at(curve: &Curve, x: f64) -> f64 {
    let after = curve.partition_point(|p| p.0 < x).min(curve.len() - 1);
    let (x1, y1) = curve[after];
    if x1 == x || after == 0 {
        return y1;
    }
    let (x0, y0) = curve[after - 1];
    y0 + (y1 - y0) * (x - x0) / (x1 - x0)
}

/// A finite f64 as a map key.
#[derive(Debug, Clone, Copy, PartialEq)]
struct OrderedX(f64);

impl Eq for OrderedX {}

impl PartialOrd for OrderedX {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for OrderedX {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// An official results CSV's column for `metric`: the DMControl files hold returns, the
/// Meta-World, MyoSuite and ManiSkill2 files success rates.
fn reference_column(metric: &str) -> Option<&'static str> {
    match metric {
        "episode_reward" => Some("reward"),
        "episode_success" => Some("success"),
        _ => None,
    }
}

/// The official results CSV format (`step`, `seed` and `reward` or `success` columns, any
/// order, more allowed): every (step, value) sample of `metric`, steps as the file counts them.
pub fn read_reference(path: &Path, metric: &str) -> Result<Vec<(f64, f64)>> {
    let Some(wanted) = reference_column(metric) else {
        return Err(Error::Config(format!(
            "--reference with --metric {metric}: the official results hold episode_reward \
             (column reward) or episode_success (column success)"
        )));
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::Config(format!(
            "--reference {}: cannot be read ({e}); give an official results CSV",
            path.display()
        ))
    })?;
    // As a spreadsheet may save it too: a byte-order mark, cells in quotes, rows left empty.
    let text = text.trim_start_matches('\u{feff}');
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, line)| (i + 1, line, csv_cells(line)))
        .filter(|(_, _, cells)| cells.iter().any(|cell| !cell.is_empty()));
    let Some((_, _, header)) = lines.next() else {
        return Err(Error::Config(format!(
            "--reference {} is empty; give an official results CSV (columns step, seed and \
             reward or success)",
            path.display()
        )));
    };
    let column = |name: &str| {
        header.iter().position(|h| h == name).ok_or_else(|| {
            let other = ["reward", "success"]
                .into_iter()
                .find(|o| *o != name && header.iter().any(|h| h == o))
                .map(|o| format!("; it holds {o}: --metric episode_{o}"))
                .unwrap_or_default();
            Error::Config(format!(
                "--reference {}: no '{name}' column (found: {}){other}; the official results \
                 CSVs have columns step, seed and reward or success",
                path.display(),
                header.join(", ")
            ))
        })
    };
    let (step, value) = (column("step")?, column(wanted)?);
    let mut samples = Vec::new();
    for (number_of_line, line, cells) in lines {
        let number = |c: usize| cells.get(c).and_then(|s| s.parse::<f64>().ok());
        match (number(step), number(value)) {
            (Some(s), Some(v)) if s >= 0.0 && s.is_finite() && v.is_finite() => {
                samples.push((s, v))
            }
            _ => {
                return Err(Error::Config(format!(
                    "--reference {} line {}: step must be a number >= 0 and {wanted} a number, \
                     got '{line}'",
                    path.display(),
                    number_of_line
                )))
            }
        }
    }
    if samples.is_empty() {
        return Err(Error::Config(format!(
            "--reference {} has no rows",
            path.display()
        )));
    }
    Ok(samples)
}

/// The cells of a CSV line, trimmed: a cell in double quotes may hold commas, and `""` in it is
/// a quote.
fn csv_cells(line: &str) -> Vec<String> {
    let mut cells = vec![String::new()];
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        let cell = cells.last_mut().expect("one cell at least");
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                chars.next();
                cell.push('"');
            }
            '"' => quoted = !quoted,
            ',' if !quoted => cells.push(String::new()),
            c => cell.push(c),
        }
    }
    cells.iter().map(|cell| cell.trim().to_owned()).collect()
}

/// The reference's samples (step, value) over the runs' steps: up to the first of its steps at
/// or past `last` (all of them without runs), so a 4M-step official curve does not dwarf a
/// 100k-step run.
pub fn up_to(samples: Vec<(f64, f64)>, last: Option<f64>) -> Vec<(f64, f64)> {
    let Some(last) = last else {
        return samples;
    };
    let reach = samples
        .iter()
        .map(|s| s.0)
        .filter(|&step| step >= last)
        .reduce(f64::min)
        .unwrap_or(f64::INFINITY);
    samples.into_iter().filter(|s| s.0 <= reach).collect()
}

/// A run's `config.yaml` (beside its `metrics.jsonl` when given that file) without its seed,
/// the settings that change how it executed, not what it learned
/// ([`crate::config::EXECUTION_SETTINGS`]: a sweep's parallel jobs get ports of their own),
/// those derived from the rest ([`crate::config::DERIVED_FIELDS`]), and those left null (a
/// file written before a field was added has none).
pub fn config_without_seed(run: &Path) -> Option<serde_yaml_ng::Mapping> {
    let dir = match run.is_dir() {
        true => run,
        false => run.parent()?,
    };
    let text = std::fs::read_to_string(dir.join(crate::config::RUN_CONFIG_FILE)).ok()?;
    let serde_yaml_ng::Value::Mapping(mut map) = serde_yaml_ng::from_str(&text).ok()? else {
        return None;
    };
    let dropped = crate::config::EXECUTION_SETTINGS
        .iter()
        .chain(&crate::config::DERIVED_FIELDS);
    for key in std::iter::once(&"seed").chain(dropped) {
        map.remove(*key);
    }
    map.retain(|_, value| !value.is_null());
    Some(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_stops_just_past_the_runs() {
        let samples: Vec<(f64, f64)> = [0.0, 100.0, 200.0, 300.0, 0.0, 100.0, 200.0]
            .into_iter()
            .map(|step| (step, 1.0))
            .collect();
        let steps = |kept: Vec<(f64, f64)>| kept.iter().map(|s| s.0).collect::<Vec<_>>();
        assert_eq!(
            steps(up_to(samples.clone(), Some(150.0))),
            [0.0, 100.0, 200.0, 0.0, 100.0, 200.0]
        );
        assert_eq!(
            steps(up_to(samples.clone(), Some(100.0))),
            [0.0, 100.0, 0.0, 100.0]
        );
        assert_eq!(up_to(samples.clone(), Some(900.0)).len(), 7);
        assert_eq!(up_to(samples, None).len(), 7);
    }

    /// Seeds whose records fall at other steps are averaged at the same step, over the steps
    /// every seed covers, not record by record.
    #[test]
    fn seeds_logged_at_other_steps_meet_at_each_step() {
        let a: Curve = vec![(100.0, 1.0), (300.0, 3.0), (500.0, 5.0)];
        let b: Curve = vec![(200.0, 20.0), (400.0, 40.0)];
        let band = Band::by_step(&[a.clone(), b], Spread::Minmax);
        assert_eq!(band.x, [200.0, 300.0, 400.0]);
        assert_eq!(
            band.mean,
            [(2.0 + 20.0) / 2.0, (3.0 + 30.0) / 2.0, (4.0 + 40.0) / 2.0]
        );
        assert_eq!((band.low[1], band.high[1]), (3.0, 30.0));
        // Seeds evaluated at the same steps: record by record, as by_index.
        let c: Curve = a.iter().map(|&(x, y)| (x, y * 2.0)).collect();
        assert_eq!(
            Band::by_step(&[a.clone(), c.clone()], Spread::Std),
            Band::by_index(&[a, c], Spread::Std)
        );
    }

    #[test]
    fn bands_follow_the_spread_asked_for() {
        let curves = vec![
            vec![(0.0, 1.0), (10.0, 4.0)],
            vec![(0.0, 3.0), (10.0, 4.0), (20.0, -100.0)],
        ];
        let b = Band::by_index(&curves, Spread::Minmax);
        assert_eq!(b.x, [0.0, 10.0], "as far as every seed goes");
        assert_eq!(b.mean, [2.0, 4.0]);
        assert_eq!((b.low[0], b.high[0]), (1.0, 3.0));
        let s = Band::by_index(&curves, Spread::Std);
        assert_eq!((s.low[0], s.high[0]), (1.0, 3.0));
        assert_eq!((s.low[1], s.high[1]), (4.0, 4.0));
        let r = Band::by_x(&[(5.0, 1.0), (0.0, 0.0), (5.0, 3.0)], Spread::Minmax);
        assert_eq!((r.x, r.mean), (vec![0.0, 5.0], vec![0.0, 2.0]));
    }

    #[test]
    fn reference_csvs_need_step_and_the_metric_s_column() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.csv");
        std::fs::write(&good, "seed,step,reward\n1,0,5\n2,0,7\n").unwrap();
        let returns = read_reference(&good, "episode_reward").unwrap();
        assert_eq!(returns, [(0.0, 5.0), (0.0, 7.0)]);
        let e = read_reference(&good, "episode_success")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("it holds reward: --metric episode_reward"),
            "{e}"
        );
        let e = read_reference(&good, "loss").unwrap_err().to_string();
        assert!(e.contains("--metric loss"), "{e}");
        let success = dir.path().join("mw-assembly.csv");
        std::fs::write(&success, "step,success,seed\n0,0.0,3\n100000,0.1,3\n").unwrap();
        let rates = read_reference(&success, "episode_success").unwrap();
        assert_eq!(rates, [(0.0, 0.0), (100000.0, 0.1)]);
        let e = read_reference(&success, "episode_reward")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("it holds success: --metric episode_success"),
            "{e}"
        );
        let bad = dir.path().join("bad.csv");
        std::fs::write(&bad, "step,return\n0,5\n").unwrap();
        let e = read_reference(&bad, "episode_reward")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no 'reward' column (found: step, return)"),
            "{e}"
        );
        std::fs::write(&bad, "step,reward\n0,x\n").unwrap();
        let e = read_reference(&bad, "episode_reward")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2"), "{e}");
        std::fs::write(&bad, "step,reward\n0,1\n-5,2\n").unwrap();
        let e = read_reference(&bad, "episode_reward")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 3: step must be a number >= 0"), "{e}");
        std::fs::write(&bad, "step,reward\n\n0,1\nx,2\n").unwrap();
        let e = read_reference(&bad, "episode_reward")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 4:"), "{e}");
        for empty in ["", "\u{feff}", "\n,,\n"] {
            std::fs::write(&bad, empty).unwrap();
            let e = read_reference(&bad, "episode_reward")
                .unwrap_err()
                .to_string();
            assert!(e.contains("is empty"), "{e}");
        }
        // As a spreadsheet saves it: a note with a comma and quotes, and rows left empty.
        let noted = dir.path().join("noted.csv");
        let row = r#"1,"x, ""y""",100,5"#;
        std::fs::write(&noted, format!("seed,note,step,reward\n{row}\n,,,\n")).unwrap();
        assert_eq!(
            read_reference(&noted, "episode_reward").unwrap(),
            [(100.0, 5.0)]
        );
        assert_eq!(csv_cells(row), ["1", r#"x, "y""#, "100", "5"]);
        let quoted = dir.path().join("quoted.csv");
        std::fs::write(&quoted, "\u{feff}\"step\",\"reward\"\r\n\"0\",\"5.5\"\r\n").unwrap();
        assert_eq!(
            read_reference(&quoted, "episode_reward").unwrap(),
            [(0.0, 5.5)]
        );
    }

    #[test]
    fn metrics_give_curves_names_and_the_last_value() {
        let dir = tempfile::tempdir().unwrap();
        let e = Metrics::read(dir.path()).err().unwrap().to_string();
        assert!(e.contains("holds no metrics.jsonl"), "{e}");
        std::fs::write(
            dir.path().join(METRICS_FILE),
            "{\"phase\":\"eval\",\"step\":0,\"episode_reward\":1.5}\n\
             {\"phase\":\"train\",\"step\":5,\"episode_reward\":9,\"fps\":3}\n\
             {\"phase\":\"eval\",\"step\":10,\"episode_reward\":2.5}\n{\"phase\":\"ev",
        )
        .unwrap();
        let m = Metrics::read(dir.path()).unwrap();
        assert_eq!(
            m.curve("eval", "step", "episode_reward"),
            [(0.0, 1.5), (10.0, 2.5)]
        );
        let other = tempfile::tempdir().unwrap();
        std::fs::write(other.path().join(METRICS_FILE), "not json\n").unwrap();
        let e = Metrics::read(other.path()).err().unwrap().to_string();
        assert!(e.contains("line 1: not a JSON object"), "{e}");
        std::fs::write(other.path().join(METRICS_FILE), b"\xff\xfe\x00garbage").unwrap();
        let e = Metrics::read(other.path()).err().unwrap();
        assert_eq!(e.exit_code(), 2, "{e}");
        assert!(e.to_string().contains("metrics.jsonl: not text"), "{e}");
        // Killed while writing its first record: no records yet, no error.
        std::fs::write(other.path().join(METRICS_FILE), "{\"phase\":\"ev").unwrap();
        assert!(Metrics::read(other.path()).is_ok());
        assert_eq!(
            m.metric_names("train").into_iter().collect::<Vec<_>>(),
            ["episode_reward", "fps"]
        );
        assert_eq!(m.last("eval", "episode_reward"), Some(2.5));
    }
}
