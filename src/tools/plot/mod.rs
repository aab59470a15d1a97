//! `tdmpc2 plot RUN_DIR...`: learning curves from `metrics.jsonl` as PNG or SVG. Runs whose
//! configurations differ only in the seed become one mean line with a band over the seeds.
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use plotters::prelude::*;

mod figure;
mod groups;

use super::curves::{self, Band, Curve, Metrics, Spread};
use crate::error::{Error, Result};
use figure::{draw_grid, grid, Figure, Series};
use groups::{group_by_config, group_labels};

/// DejaVu Sans cut down to ASCII (assets/FONT-LICENSE.txt): no system font needed.
#[derive(Debug, Clone, clap::Args)]
pub struct PlotArgs {
    /// Run directories (or their metrics.jsonl files).
    #[arg(value_name = "RUN_DIR", required = true)]
    pub runs: Vec<PathBuf>,
    /// The metric on the y axis (any numeric field of the records).
    #[arg(long, default_value = "episode_reward")]
    pub metric: String,
    /// The x axis: global agent steps, seconds since the run started, or both side by side.
    #[arg(long, default_value = "step", value_parser = ["step", "elapsed_time", "both"])]
    pub x: String,
    /// Which records to draw: evaluations, training episodes, or both.
    #[arg(long, default_value = "eval", value_parser = ["eval", "train", "both"])]
    pub phase: String,
    /// The band around the mean of runs that differ only in their seed.
    #[arg(long, value_enum, default_value = "minmax")]
    pub band: Spread,
    /// An official TD-MPC2 results CSV (columns step, seed and reward or success) drawn beside
    /// the runs, its simulator steps as agent steps of the task it is named for.
    #[arg(long, value_name = "FILE.csv")]
    pub reference: Option<PathBuf>,
    /// The picture to write: .png or .svg.
    #[arg(long, default_value = "curves.png")]
    pub out: PathBuf,
    /// Picture width in pixels.
    #[arg(long, default_value_t = 960)]
    pub width: u32,
    /// Picture height in pixels.
    #[arg(long, default_value_t = 600)]
    pub height: u32,
    /// The title (default: the metric and the task).
    #[arg(long)]
    pub title: Option<String>,
}

/// The smallest chart that holds its axes and legend (width, height), and the longest side of
/// the whole picture.
const MIN_SIZE: (u32, u32) = (200, 150);
const MAX_SIDE: u32 = 16384;

/// The whole picture's pixels, `rows` × `columns` panels of the asked size, within
/// [`MAX_SIDE`] a side (a bitmap of more overflows the drawing library's 32-bit indices).
fn figure_size(args: &PlotArgs, rows: usize, columns: usize) -> Result<(u32, u32)> {
    let width = args.width as usize * columns;
    let height = args.height as usize * rows;
    match (u32::try_from(width), u32::try_from(height)) {
        (Ok(w), Ok(h)) if w <= MAX_SIDE && h <= MAX_SIDE => Ok((w, h)),
        _ => Err(Error::Config(format!(
            "--width {} --height {}: {rows} × {columns} panels of that size make a picture of \
             {width} × {height} pixels, more than {MAX_SIDE} a side; give a smaller size",
            args.width, args.height
        ))),
    }
}

/// Refuses an `--out` the figure cannot be written to, before any run is read: a missing
/// folder, a directory, a file that cannot be opened for writing.
fn refuse_an_unwritable_out(out: &Path) -> Result<()> {
    let refused = |why: String| Error::Config(format!("--out {}: {why}", out.display()));
    let folder = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !folder.is_dir() {
        let what = match folder.exists() {
            true => "is a file, not a folder",
            false => "does not exist",
        };
        return Err(refused(format!("the folder {} {what}", folder.display())));
    }
    if out.is_dir() {
        return Err(refused("is a directory; give the file to write".into()));
    }
    // A file there is opened as it is (the figure replaces it later, as it replaces a link,
    // never written through); a new one is made and removed again.
    let probe = match out.symlink_metadata() {
        Ok(_) => std::fs::OpenOptions::new().write(true).open(out).map(drop),
        Err(_) => std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(out)
            .and_then(|_| std::fs::remove_file(out)),
    };
    probe.map_err(|e| refused(format!("cannot be written ({e})")))?;
    Ok(())
}

/// One line of the figure, with a band when it aggregates several runs.
pub fn run(args: &PlotArgs) -> Result<()> {
    let format = Format::of(&args.out)?;
    refuse_an_unwritable_out(&args.out)?;
    if !(MIN_SIZE.0..=MAX_SIDE).contains(&args.width)
        || !(MIN_SIZE.1..=MAX_SIDE).contains(&args.height)
    {
        return Err(Error::Config(format!(
            "--width {} --height {}: a chart takes {} to {MAX_SIDE} by {} to {MAX_SIDE} pixels",
            args.width, args.height, MIN_SIZE.0, MIN_SIZE.1
        )));
    }
    if args.reference.is_some() && args.x == "elapsed_time" {
        return Err(Error::Config(
            "--reference is drawn against agent steps; use it with --x step or --x both".into(),
        ));
    }
    let args = &PlotArgs {
        runs: runs_given(&args.runs)?,
        ..args.clone()
    };
    let steps = step_unit(&args.runs)?;
    if args.reference.is_some() && steps == StepUnit::Updates {
        return Err(Error::Config(
            "--reference with runs trained on a dataset: their steps count updates, the official \
             results simulator steps"
                .into(),
        ));
    }
    let title = args.title.clone().unwrap_or_else(|| default_title(args));
    let panels = panels(args, &title)?;
    let series = panels
        .iter()
        .map(|panel| series(args, panel))
        .collect::<Result<Vec<_>>>()?;
    let figures: Vec<Figure> = panels
        .iter()
        .zip(&series)
        .map(|(panel, series)| Figure {
            title: &panel.title,
            x_label: match (panel.x, steps) {
                ("step", StepUnit::AgentSteps) => "agent steps",
                ("step", StepUnit::Updates) => "updates",
                _ => "wall time (s)",
            },
            y_label: &panel.metric,
            series,
        })
        .collect();
    // Several panels: a grid of panels of the given size each.
    for figure in &figures {
        figure
            .ranges()
            .map_err(|e| Error::Config(format!("{}: {e}", figure.title)))?;
    }
    let (rows, columns) = grid(figures.len());
    let size = figure_size(args, rows, columns)?;
    write_picture(&figures, (rows, columns), size, format, &args.out)?;
    outln!("wrote {}", args.out.display());
    Ok(())
}

/// Draws the grid of `figures` into `out`: beside it, then renamed over it, so that a reader
/// never sees half a picture and a link there is replaced, not written through.
fn write_picture(
    figures: &[Figure],
    grid: (usize, usize),
    size: (u32, u32),
    format: Format,
    out: &Path,
) -> Result<()> {
    let partial = partial_beside(out);
    let _watched = crate::partial_files::watch(&partial);
    let drawn = match format {
        Format::Png => draw_grid(
            figures,
            BitMapBackend::new(&partial, size).into_drawing_area(),
            grid,
        ),
        Format::Svg => draw_grid(
            figures,
            SVGBackend::new(&partial, size).into_drawing_area(),
            grid,
        ),
    };
    let written = drawn
        .map_err(|e| Error::Other(format!("draw {}: {e}", out.display())))
        .and_then(|()| {
            std::fs::rename(&partial, out)
                .map_err(|e| Error::io(format!("write {}", out.display()), e))
        });
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    written
}

/// A name beside `out` of this process's own, with `out`'s extension (which tells the
/// drawing backend the format).
fn partial_beside(out: &Path) -> PathBuf {
    let name = out.file_name().unwrap_or_default().to_string_lossy();
    let extension = out.extension().unwrap_or_default().to_string_lossy();
    out.with_file_name(format!(
        ".{name}.{}.partial.{extension}",
        std::process::id()
    ))
}

enum Format {
    Png,
    Svg,
}

/// The runs among the paths given: run directories and `.jsonl` files. Other files (a sweep's
/// `sweep.csv` beside its jobs, caught by `sweep/*`) are passed over, with a note.
fn runs_given(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    if let Some(missing) = paths.iter().find(|p| !p.exists()) {
        let figure = missing
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("png") || e.eq_ignore_ascii_case("svg"));
        let hint = match figure {
            true => format!(
                " (the figure to write? give it as --out {})",
                missing.display()
            ),
            false => String::new(),
        };
        return Err(Error::Config(format!(
            "{} does not exist{hint}",
            missing.display()
        )));
    }
    let (runs, others): (Vec<PathBuf>, Vec<PathBuf>) = paths
        .iter()
        .cloned()
        .partition(|p| !p.is_file() || p.extension().is_some_and(|e| e == "jsonl"));
    if !others.is_empty() {
        let names: Vec<String> = others.iter().map(|p| p.display().to_string()).collect();
        errln!(
            "note: passing over {} (not a run directory nor its {})",
            names.join(", "),
            curves::METRICS_FILE
        );
    }
    if runs.is_empty() {
        return Err(Error::Config(format!(
            "no run directory among {} path(s) given: give run directories (those `tdmpc2 \
             train` wrote) or their {}",
            paths.len(),
            curves::METRICS_FILE
        )));
    }
    // A run given twice (its folder and its metrics.jsonl, or two spellings of one path)
    // would count as two seeds.
    let mut seen = BTreeSet::new();
    let mut distinct = Vec::with_capacity(runs.len());
    for run in runs {
        let file = match run.is_dir() {
            true => run.join(curves::METRICS_FILE),
            false => run.clone(),
        };
        match seen.insert(file.canonicalize().unwrap_or(file)) {
            true => distinct.push(run),
            false => errln!(
                "note: passing over {}: the same run as given before",
                run.display()
            ),
        }
    }
    Ok(distinct)
}

impl Format {
    fn of(out: &Path) -> Result<Self> {
        let ext = out.extension().and_then(|e| e.to_str()).unwrap_or("");
        match ext.to_ascii_lowercase().as_str() {
            "png" => Ok(Self::Png),
            "svg" => Ok(Self::Svg),
            _ => Err(Error::Config(format!(
                "--out {}: the picture's format comes from its extension; allowed: .png, .svg",
                out.display()
            ))),
        }
    }
}

/// What the runs' steps count.
#[derive(Debug, Clone, Copy, PartialEq)]
enum StepUnit {
    AgentSteps,
    /// Runs trained on a dataset (`data_dir`).
    Updates,
}

/// The runs' step unit, from their `config.yaml` (agent steps where it is missing); runs of
/// both kinds on one axis are refused.
fn step_unit(runs: &[PathBuf]) -> Result<StepUnit> {
    let offline = |run: &PathBuf| {
        curves::config_without_seed(run)
            .and_then(|config| config.get("data_dir").cloned())
            .is_some_and(|dir| !dir.is_null())
    };
    let updates = runs.iter().filter(|run| offline(run)).count();
    match updates {
        0 => Ok(StepUnit::AgentSteps),
        n if n == runs.len() => Ok(StepUnit::Updates),
        n => Err(Error::Config(format!(
            "{n} of the {} runs trained on a dataset: their steps count updates, the others' \
             agent steps; plot them apart",
            runs.len()
        ))),
    }
}

/// The official results count simulator steps, their agent steps times the action repeat of
/// the task the file is named for (2 on DMControl, Meta-World and ManiSkill2): what one agent
/// step of the runs drawn beside it is worth. Said on the console, as the file cannot say it.
fn reference_action_repeat(stem: &str) -> usize {
    match envs::Family::of(stem) {
        Some(family) => {
            let repeat = family.action_repeat();
            if repeat > 1 {
                errln!(
                    "note: --reference {stem}: its steps are {} simulator steps, {repeat} an \
                     agent step; drawn against agent steps (divided by {repeat})",
                    family.title()
                );
            }
            repeat
        }
        None => {
            errln!(
                "note: --reference {stem}: no task of that name, so its steps are taken as \
                 agent steps (the official files, named for their task, count simulator steps)"
            );
            1
        }
    }
}

/// An official file of another task than the runs' is said: a comparison across tasks is
/// seldom what was meant.
fn note_another_task(stem: &str, runs: &[PathBuf]) {
    if envs::Family::of(stem).is_none() {
        return;
    }
    let tasks: BTreeSet<String> = runs
        .iter()
        .filter_map(|run| {
            let config = curves::config_without_seed(run)?;
            config.get("task")?.as_str().map(str::to_owned)
        })
        .collect();
    let named = |task: &String| task.rsplit(':').next() == Some(stem);
    if !tasks.is_empty() && !tasks.iter().any(named) {
        errln!(
            "note: --reference {stem} holds the official results of task {stem}; the runs drawn \
             trained on {}",
            tasks.into_iter().collect::<Vec<_>>().join(", ")
        );
    }
}

fn default_title(args: &PlotArgs) -> String {
    let task = args.runs.iter().find_map(|run| {
        let config = curves::config_without_seed(run)?;
        config.get("task")?.as_str().map(str::to_owned)
    });
    match task {
        Some(task) => format!("{task}: {}", args.metric),
        None => args.metric.clone(),
    }
}

/// One chart of the picture.
struct Panel {
    title: String,
    metric: String,
    /// The x axis: "step" or "elapsed_time".
    x: &'static str,
    /// Whether `--reference` is drawn here: a single task's panel, or in a multitask plot the
    /// panel of the task the reference is of (not the others, nor their mean).
    takes_reference: bool,
}

/// The panels to draw: `--metric`, then, when the first run is a multitask one that logs it per
/// task (`episode_reward+walker-run`), one panel per task; each against `--x`, or against
/// agent steps and then wall time with `--x both`.
fn panels(args: &PlotArgs, title: &str) -> Result<Vec<Panel>> {
    let mut metrics = vec![(title.to_string(), args.metric.clone())];
    let first = Metrics::read(&args.runs[0])?;
    let prefix = format!("{}+", args.metric);
    for name in first.metric_names("eval") {
        if let Some(task) = name.strip_prefix(&prefix) {
            if !task.starts_with("avg_") {
                metrics.push((task.to_string(), name.clone()));
            }
        }
    }
    let axes: &[&'static str] = match args.x.as_str() {
        "both" => &["step", "elapsed_time"],
        "elapsed_time" => &["elapsed_time"],
        _ => &["step"],
    };
    let per_task = metrics.len() > 1;
    let stem = args.reference.as_ref().map(|reference| {
        let stem = reference.file_stem().unwrap_or_default();
        stem.to_string_lossy().into_owned()
    });
    let takes_reference = |metric: &str| match (per_task, &stem) {
        (false, _) => true,
        (true, Some(stem)) => metric == format!("{}+{stem}", args.metric),
        (true, None) => false,
    };
    if let Some(stem) = stem.as_ref().filter(|_| per_task) {
        if !metrics.iter().any(|(_, metric)| takes_reference(metric)) {
            errln!(
                "note: --reference {stem} is of none of the runs' tasks: it is not drawn (a \
                 multitask plot draws a task's official results on that task's panel)"
            );
        }
    }
    Ok(metrics
        .into_iter()
        .flat_map(|(title, metric)| {
            let takes_reference = takes_reference(&metric);
            axes.iter().map(move |&x| Panel {
                title: match (axes.len(), x) {
                    (2, "elapsed_time") => format!("{title}, against wall time"),
                    _ => title.clone(),
                },
                metric: metric.clone(),
                x,
                takes_reference,
            })
        })
        .collect())
}

fn series(args: &PlotArgs, panel: &Panel) -> Result<Vec<Series>> {
    let (metric, x) = (panel.metric.as_str(), panel.x);
    let phases: &[&str] = match args.phase.as_str() {
        "both" => &["eval", "train"],
        "train" => &["train"],
        _ => &["eval"],
    };
    let runs = read_runs(&args.runs, phases, metric)?;
    let groups = group_by_config(&args.runs);
    let labels = group_labels(&args.runs, &groups);
    let mut series = Vec::new();
    for phase in phases {
        for (members, label) in groups.iter().zip(&labels) {
            let curves: Vec<Curve> = members
                .iter()
                .map(|&i| runs[i].curve(phase, x, metric))
                .filter(|c| !c.is_empty())
                .collect();
            if curves.is_empty() {
                continue;
            }
            let label = match (phases.len(), *phase) {
                (2, "train") => format!("{label} (train)"),
                _ => label.clone(),
            };
            let (shortest, longest) = curves.iter().fold((usize::MAX, 0), |(lo, hi), c| {
                (lo.min(c.len()), hi.max(c.len()))
            });
            if shortest < longest {
                errln!(
                    "note: {label}: its seeds logged {shortest} to {longest} {phase} points; the \
                     curve is their mean as far as every seed goes ({shortest} points)"
                );
            }
            series.push(Series {
                label,
                band: match x {
                    "step" => Band::by_step(&curves, args.band),
                    _ => Band::by_index(&curves, args.band),
                },
                runs: curves.len(),
                faint: *phase == "train",
            });
        }
    }
    let drawn_here = panel.takes_reference && x == "step";
    if let Some(reference) = args.reference.as_ref().filter(|_| drawn_here) {
        let last_step = series
            .iter()
            .flat_map(|s| s.band.x.iter().copied())
            .reduce(f64::max);
        let stem = reference.file_stem().unwrap_or_default().to_string_lossy();
        let repeat = reference_action_repeat(&stem);
        note_another_task(&stem, &args.runs);
        let in_agent_steps = curves::read_reference(reference, &args.metric)?
            .into_iter()
            .map(|(step, value)| (step / repeat as f64, value))
            .collect();
        let samples = curves::up_to(in_agent_steps, last_step);
        let seeds = samples.iter().filter(|s| s.0 == samples[0].0).count();
        series.push(Series {
            label: format!("official TD-MPC2 ({stem})"),
            band: Band::by_x(&samples, args.band),
            runs: seeds,
            faint: false,
        });
    }
    if series.is_empty() {
        return Err(Error::Config(format!(
            "no {} records with both {} and {} in {}",
            args.phase,
            x,
            metric,
            args.runs
                .iter()
                .map(|r| r.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(series)
}

/// Every run's metrics, each of which must have `metric` in one of `phases` at least (with
/// `--phase both`, a run that has only one phase's records draws that phase's curve).
fn read_runs(runs: &[PathBuf], phases: &[&str], metric: &str) -> Result<Vec<Metrics>> {
    if ["step", "elapsed_time"].contains(&metric) {
        return Err(Error::Config(format!(
            "--metric {metric} is an x axis (--x {metric}); give a metric, e.g. episode_reward"
        )));
    }
    let read = runs
        .iter()
        .map(|run| Metrics::read(run))
        .collect::<Result<Vec<_>>>()?;
    let named = phases.join(" or ");
    for (run, metrics) in runs.iter().zip(&read) {
        let names: BTreeSet<String> = phases
            .iter()
            .flat_map(|phase| metrics.metric_names(phase))
            .collect();
        let logged = phases.iter().any(|phase| metrics.logs(phase, metric));
        if !names.contains(metric) && logged {
            return Err(Error::Config(format!(
                "--metric {metric}: {} logs it in no {named} record as a finite number (null \
                 stands for NaN or an infinity there)",
                run.display()
            )));
        }
        if names.is_empty() {
            return Err(Error::Config(format!(
                "{} has no {named} records yet, so no --metric {metric} to draw",
                run.display()
            )));
        }
        if !names.contains(metric) {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            return Err(Error::Config(format!(
                "--metric {}: {} has no such {} metric; available: {}",
                metric,
                run.display(),
                named,
                names.join(", ")
            )));
        }
        for phase in phases.iter().filter(|_| phases.len() > 1) {
            if !metrics.metric_names(phase).contains(metric) {
                errln!(
                    "note: {} has no {phase} records of {metric}: only its other phase is drawn",
                    run.display()
                );
            }
        }
    }
    Ok(read)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offline_runs_count_updates_and_are_not_drawn_with_online_ones() {
        let dir = tempfile::tempdir().unwrap();
        let run = |name: &str, data_dir: &str| {
            let run = dir.path().join(name);
            std::fs::create_dir(&run).unwrap();
            let config = format!("task: walker-run\ndata_dir: {data_dir}\n");
            std::fs::write(run.join("config.yaml"), config).unwrap();
            run
        };
        let (online, offline) = (run("online", "null"), run("offline", "/data"));
        let unknown = dir.path().join("no-config");
        assert_eq!(
            step_unit(&[online.clone(), unknown]).unwrap(),
            StepUnit::AgentSteps
        );
        assert_eq!(
            step_unit(std::slice::from_ref(&offline)).unwrap(),
            StepUnit::Updates
        );
        let e = step_unit(&[online, offline]).unwrap_err().to_string();
        assert!(e.contains("1 of the 2 runs trained on a dataset"), "{e}");
    }

    #[test]
    fn official_results_count_the_simulator_steps_of_their_task() {
        for (file, repeat) in [
            ("walker-run", 2),
            ("mw-assembly", 2),
            ("lift-cube", 2),
            ("myo-hand-key-turn", 1),
            ("mujoco-walker", 1),
            ("renamed", 1),
        ] {
            assert_eq!(reference_action_repeat(file), repeat, "{file}");
        }
    }

    #[test]
    fn a_multitask_run_gets_one_panel_per_task() {
        let dir = tempfile::tempdir().unwrap();
        let records: Vec<String> = (0..3)
            .map(|i| {
                serde_json::json!({
                    "phase": "eval", "step": i * 1000, "episode_reward": i as f64,
                    "episode_reward+walker-run": 2.0 * i as f64,
                    "episode_reward+cup-catch": 3.0 * i as f64,
                    "episode_reward+avg_dmcontrol": 2.5 * i as f64,
                })
                .to_string()
            })
            .collect();
        std::fs::write(dir.path().join("metrics.jsonl"), records.join("\n")).unwrap();
        let out = dir.path().join("curves.svg");
        let args = PlotArgs {
            runs: vec![dir.path().to_path_buf()],
            metric: "episode_reward".into(),
            x: "step".into(),
            phase: "eval".into(),
            band: Spread::Minmax,
            reference: None,
            out: out.clone(),
            width: 400,
            height: 300,
            title: Some("all".into()),
        };
        let panels = panels(&args, "all").unwrap();
        let titles: Vec<&str> = panels.iter().map(|p| p.title.as_str()).collect();
        assert_eq!(
            titles,
            ["all", "cup-catch", "walker-run"],
            "no panel for averages"
        );
        assert_eq!(panels[2].metric, "episode_reward+walker-run");
        // The official results of walker-run go on walker-run's panel only.
        let with_reference = PlotArgs {
            reference: Some("results/walker-run.csv".into()),
            ..args.clone()
        };
        let takes: Vec<bool> = super::panels(&with_reference, "all")
            .unwrap()
            .iter()
            .map(|p| p.takes_reference)
            .collect();
        assert_eq!(takes, [false, false, true]);
        run(&args).unwrap();
        let svg = std::fs::read_to_string(&out).unwrap();
        assert!(svg.contains("width=\"800\"") && svg.contains("height=\"600\""));
        let curve_colour = |svg: &str| svg.matches("#1F77B4").count();
        let single = PlotArgs {
            metric: "episode_reward+walker-run".into(),
            out: dir.path().join("one.svg"),
            ..args
        };
        run(&single).unwrap();
        let one = std::fs::read_to_string(dir.path().join("one.svg")).unwrap();
        assert!(
            one.contains("width=\"400\""),
            "a task's own curve: one panel"
        );
        assert!(curve_colour(&one) > 0);
        assert_eq!(
            curve_colour(&svg),
            3 * curve_colour(&one),
            "one curve per panel"
        );
        assert_eq!((grid(1), grid(3), grid(5)), ((1, 1), (2, 2), (2, 3)));
    }

    /// `--phase both` draws what a run has: a run with train records only (no evaluation yet)
    /// gets its train curve, where it was refused for missing eval records.
    #[test]
    fn both_phases_draw_the_phase_a_run_has() {
        let dir = tempfile::tempdir().unwrap();
        let records: Vec<String> = (0..3)
            .map(|i| {
                serde_json::json!({"phase": "train", "step": i * 100, "episode_reward": i})
                    .to_string()
            })
            .collect();
        std::fs::write(dir.path().join("metrics.jsonl"), records.join("\n")).unwrap();
        let args = |phase: &str, metric: &str| PlotArgs {
            runs: vec![dir.path().to_path_buf()],
            metric: metric.into(),
            x: "step".into(),
            phase: phase.into(),
            band: Spread::Minmax,
            reference: None,
            out: dir.path().join("curves.svg"),
            width: 400,
            height: 300,
            title: None,
        };
        run(&args("both", "episode_reward")).unwrap();
        let e = run(&args("eval", "episode_reward"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("has no eval records yet"), "{e}");
        let e = run(&args("both", "episode_length"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no such eval or train metric; available: episode_reward"),
            "{e}"
        );
    }

    #[test]
    fn a_picture_too_large_to_draw_is_refused_by_its_size() {
        let args = |width, height| PlotArgs {
            runs: vec![],
            metric: "episode_reward".into(),
            x: "step".into(),
            phase: "eval".into(),
            band: Spread::Minmax,
            reference: None,
            out: "x.png".into(),
            width,
            height,
            title: None,
        };
        assert_eq!(figure_size(&args(960, 600), 9, 9).unwrap(), (8640, 5400));
        // 100000² pixels overflowed the bitmap's indices (a panic); 2^31 × 2 wrapped to 0.
        let e = figure_size(&args(100_000, 100_000), 1, 1)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--width 100000") && e.contains("16384 a side"),
            "{e}"
        );
        let e = figure_size(&args(1 << 31, 600), 1, 2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("4294967296 × 600"), "{e}");
        let e = run(&args(100_000, 600)).unwrap_err().to_string();
        assert!(e.contains("200 to 16384 by 150 to 16384"), "{e}");
    }

    #[test]
    fn the_format_comes_from_the_extension() {
        assert!(matches!(Format::of(Path::new("a.PNG")), Ok(Format::Png)));
        assert!(matches!(Format::of(Path::new("a.svg")), Ok(Format::Svg)));
        let e = Format::of(Path::new("a.jpg")).err().unwrap().to_string();
        assert!(e.contains("allowed: .png, .svg"), "{e}");
    }
}
