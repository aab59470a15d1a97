//! `tdmpc2 bench --cases loop`: agent steps/s of the whole training loop (environments, batched
//! plan, updates, buffer) for several `num_envs` × `pipeline` × `compile`, each case a real
//! `tdmpc2 train` run, next to the baseline of the same model size measured in the same sitting:
//! the first of each list (by default num_envs=1, pipeline=false, compile=true).
//!
//! The rate is the trainer's own: agent steps per second from the end of seeding to the end of
//! the run (no evaluation or checkpoint inside that window), so start-up, the first evaluation
//! and the pretraining updates are left out. Every case makes one update per vector step
//! (`steps_per_update = num_envs`), the schedule the official vectorised trainer uses.
use std::process::{Command, ExitStatus, Stdio};

use serde_json::{json, Value};

use crate::error::{Error, Result};

/// The lines of a failed case's log that its error carries.
const FAILURE_LINES: usize = 30;

/// What to measure.
#[derive(Debug, Clone)]
pub struct LoopOptions {
    pub task: String,
    pub model_sizes: Vec<u32>,
    pub num_envs: Vec<usize>,
    pub pipeline: Vec<bool>,
    /// Timed vector steps per case (after seeding).
    pub vector_steps: usize,
    /// `compile` settings (CUDA graphs on CUDA).
    pub compile: Vec<bool>,
    pub device: String,
    pub threads: Option<usize>,
    /// `KEY=VALUE` settings given to every case's run after its own (`fused_kernels=true`).
    pub settings: Vec<String>,
}

/// One case: the command line of its run.
fn train_args(
    options: &LoopOptions,
    episode_length: usize,
    size: u32,
    num_envs: usize,
    pipeline: bool,
    compile: bool,
) -> Vec<String> {
    // Seeding: the shortest allowed (one episode per environment); no evaluation.
    let seed_steps = num_envs * episode_length;
    let steps = seed_steps + (options.vector_steps + 1) * num_envs;
    let mut args: Vec<String> = [
        format!("task={}", options.task),
        format!("model_size={size}"),
        format!("num_envs={num_envs}"),
        format!("steps_per_update={num_envs}"),
        format!("pipeline={pipeline}"),
        format!("compile={compile}"),
        format!("steps={steps}"),
        format!("seed_steps={seed_steps}"),
        format!("device={}", options.device),
        "eval_episodes=0".into(),
        format!("eval_freq={}", 10 * steps),
        format!("save_freq={}", 10 * steps),
        "enable_tensorboard=false".into(),
        "save_csv=false".into(),
    ]
    .into();
    if let Some(t) = options.threads {
        args.push(format!("num_threads={t}"));
    }
    args.extend(options.settings.iter().cloned());
    args
}

/// The rate in the trainer's last line: "... (R agent steps/s after seeding)".
fn parse_rate(log: &str) -> Option<f64> {
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("agent steps/s after seeding"))?;
    let open = line.rfind('(')?;
    line[open + 1..].split_whitespace().next()?.parse().ok()
}

/// Refuses, before any case runs, options that no case could run with: every case's
/// settings are loaded as `tdmpc2 train` would (a misspelt `--loop-set` key, a model size).
pub fn check(options: &LoopOptions) -> Result<()> {
    if options.vector_steps == 0
        || options.num_envs.is_empty()
        || options.num_envs.contains(&0)
        || options.pipeline.is_empty()
        || options.compile.is_empty()
    {
        return Err(Error::Config(
            "bench loop needs --loop-steps >= 1, --num-envs (each >= 1), a --pipeline and a \
             --compile setting"
                .into(),
        ));
    }
    if let Some(bad) = options
        .settings
        .iter()
        .find(|s| !matches!(s.split_once('='), Some((key, _)) if !key.is_empty()))
    {
        return Err(Error::Config(format!(
            "bench loop: --loop-set {bad:?} is not KEY=VALUE (a setting of `tdmpc2 train`, \
             e.g. fused_kernels=true)"
        )));
    }
    refuse_settings_the_bench_makes(options)?;
    let spec = envs::make(&options.task, 0)
        .map_err(|e| match e {
            envs::Error::UnknownTask { .. } => {
                Error::Config(format!("bench loop: --loop-task {}: {e}", options.task))
            }
            other => other.into(),
        })?
        .spec()
        .clone();
    let mut observed = false;
    for &size in &options.model_sizes {
        for (num_envs, pipeline, compile) in cases(options) {
            let source = crate::config::Source {
                overrides: train_args(
                    options,
                    spec.episode_length,
                    size,
                    num_envs,
                    pipeline,
                    compile,
                ),
                ..Default::default()
            };
            source
                .refuse_derived_settings()
                .and_then(|()| crate::config::Config::load(&source))
                .and_then(|mut config| {
                    config.resolve(&spec)?;
                    // What the settings observe (obs=rgb), made once as the runs will.
                    if !observed {
                        crate::config::task_specs(&config, config.env_options(0)?)?;
                        observed = true;
                    }
                    Ok(())
                })
                .map_err(|e| {
                    let why = e.to_string();
                    let why = why.trim_start_matches("config error: ");
                    Error::Config(format!("bench loop (--loop-set, --model-sizes): {why}"))
                })?;
        }
    }
    Ok(())
}

pub fn run(options: &LoopOptions, print: &mut dyn FnMut(&Value)) -> Result<()> {
    check(options)?;
    let _handlers = crate::trainer::stop::install_handlers_for_now();
    let program = crate::this_binary::path()?;
    let episode_length = envs::make(&options.task, 0)?.spec().episode_length;
    for &size in &options.model_sizes {
        let mut baseline = None;
        for (num_envs, pipeline, compile) in cases(options) {
            let dir = super::scratch::Scratch::new("loop")?;
            let mut command = Command::new(&program);
            command
                .arg("train")
                .args(train_args(
                    options,
                    episode_length,
                    size,
                    num_envs,
                    pipeline,
                    compile,
                ))
                .arg(format!("run_dir={}", dir.path().display()));
            let ran = run_case(command);
            drop(dir);
            if crate::trainer::stop::requested_here() {
                return Err(Error::Stopped(
                    "bench stopped (Ctrl-C or SIGTERM); its run directory was removed".into(),
                ));
            }
            let (status, log) = ran?;
            if !status.success() {
                // The whole cause: a first run on a new machine is diagnosed from this alone.
                let lines: Vec<&str> = log.lines().collect();
                let tail = lines[lines.len().saturating_sub(FAILURE_LINES)..].join("\n");
                return Err(Error::Other(format!(
                    "bench loop: model_size={size} num_envs={num_envs} pipeline={pipeline} \
                     compile={compile} failed; the end of its log:\n{tail}"
                )));
            }
            let rate = parse_rate(&log).ok_or_else(|| {
                Error::Other(format!("bench loop: no throughput in the run's log: {log}"))
            })?;
            let base = *baseline.get_or_insert(rate);
            print(&json!({
                "case": "loop",
                "task": options.task,
                "device": options.device,
                "model_size": size,
                "num_envs": num_envs,
                "steps_per_update": num_envs,
                "pipeline": pipeline,
                "compile": compile,
                "settings": options.settings,
                "agent_steps_per_second": rate,
                "baseline_agent_steps_per_second": base,
                "speedup_vs_baseline": rate / base,
            }));
        }
    }
    Ok(())
}

/// A `--loop-set` of a setting each case's run is given by the bench would replace it unseen
/// (the last of a key wins), and the results would name the bench's: refused, naming the
/// option that sets it.
fn refuse_settings_the_bench_makes(options: &LoopOptions) -> Result<()> {
    let bare = LoopOptions {
        settings: Vec::new(),
        ..options.clone()
    };
    let made = train_args(&bare, 1, 1, 1, false, true);
    let key_of = |setting: &str| {
        let key = setting.split_once('=').map_or(setting, |(key, _)| key);
        key.trim().trim_start_matches('+').to_owned()
    };
    let made: Vec<String> = made.iter().map(|s| key_of(s)).collect();
    for setting in &options.settings {
        let key = key_of(setting);
        if key != "run_dir" && !made.contains(&key) {
            continue;
        }
        let instead = match key.as_str() {
            "task" => "--loop-task",
            "model_size" => "--model-sizes",
            "num_envs" => "--num-envs",
            "pipeline" => "--pipeline",
            "compile" => "--compile",
            "device" => "--device",
            "num_threads" => "--threads",
            "steps" | "seed_steps" | "steps_per_update" => "--loop-steps (and --num-envs)",
            _ => "nothing: the bench sets it for what it measures",
        };
        return Err(Error::Config(format!(
            "bench loop: --loop-set {setting} sets what the bench gives each case's run; use \
             {instead}"
        )));
    }
    Ok(())
}

/// Runs one case's training to its end, its log read as it comes. A stop asked of the bench
/// (Ctrl-C, SIGTERM) is passed on to the run; a bench killed outright takes the run with it.
fn run_case(mut command: Command) -> Result<(ExitStatus, String)> {
    use std::io::Read;
    crate::ddp::lifeline::ends_with_this_process(&mut command);
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::io("run tdmpc2 train", e))?;
    let mut stderr = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut log = String::new();
        if let Some(stderr) = stderr.as_mut() {
            let _ = stderr.read_to_string(&mut log);
        }
        log
    });
    let mut passed_on = false;
    let status = loop {
        if let Some(status) = child
            .try_wait()
            .map_err(|e| Error::io("wait for tdmpc2 train", e))?
        {
            break status;
        }
        if !passed_on && crate::trainer::stop::requested_here() {
            // SAFETY: kill(2) of our own child, not yet reaped.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            passed_on = true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    Ok((status, reader.join().unwrap_or_default()))
}

/// Every (num_envs, pipeline, compile) of the options once, compile outermost; the first, the
/// baseline, is the first of each list.
fn cases(options: &LoopOptions) -> Vec<(usize, bool, bool)> {
    let mut cases = Vec::new();
    for &c in &options.compile {
        for &n in &options.num_envs {
            for &p in &options.pipeline {
                if !cases.contains(&(n, p, c)) {
                    cases.push((n, p, c));
                }
            }
        }
    }
    cases
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setting_that_is_not_key_value_is_refused_before_any_run() {
        let options = LoopOptions {
            task: "Pendulum-v1".into(),
            model_sizes: vec![1],
            num_envs: vec![1],
            pipeline: vec![false],
            vector_steps: 1,
            compile: vec![true],
            device: "cpu".into(),
            threads: None,
            settings: vec!["fused_kernels".into()],
        };
        let err = run(&options, &mut |_| panic!("nothing is measured")).unwrap_err();
        assert!(
            err.to_string().contains("--loop-set \"fused_kernels\""),
            "{err}"
        );
        for (setting, instead) in [
            ("pipeline=true", "use --pipeline"),
            ("task=walker-run", "use --loop-task"),
            ("run_dir=/tmp/x", "the bench sets it"),
        ] {
            let made_by_the_bench = LoopOptions {
                settings: vec![setting.into()],
                ..options.clone()
            };
            let err = run(&made_by_the_bench, &mut |_| panic!("nothing is measured")).unwrap_err();
            assert!(
                matches!(err, Error::Config(_))
                    && err.to_string().contains(&format!("--loop-set {setting}"))
                    && err.to_string().contains(instead),
                "{err}"
            );
        }
        let misspelt = LoopOptions {
            settings: vec!["fused_kernel=true".into()],
            ..options
        };
        let err = run(&misspelt, &mut |_| panic!("nothing is measured")).unwrap_err();
        assert!(
            matches!(err, Error::Config(_)) && err.to_string().contains("fused_kernel"),
            "{err}"
        );
    }

    /// The first of each list is the baseline; a list without 1 environment runs none.
    #[test]
    fn the_cases_start_with_the_baseline_and_run_each_once() {
        let mut options = LoopOptions {
            task: "Pendulum-v1".into(),
            model_sizes: vec![1],
            num_envs: vec![1, 16],
            pipeline: vec![false, true],
            vector_steps: 1,
            compile: vec![false, true],
            device: "cpu".into(),
            threads: None,
            settings: vec![],
        };
        let all = cases(&options);
        assert_eq!(all.len(), 8);
        assert_eq!(all[0], (1, false, false));
        assert_eq!(all[7], (16, true, true));
        options.num_envs = vec![16, 16];
        options.pipeline = vec![true];
        options.compile = vec![true];
        assert_eq!(cases(&options), vec![(16, true, true)]);
        options.pipeline = vec![];
        let err = run(&options, &mut |_| panic!("nothing is measured")).unwrap_err();
        assert!(err.to_string().contains("a --pipeline"), "{err}");
    }

    #[test]
    fn the_rate_is_read_from_the_trainers_last_line() {
        let log = "Pretraining...\nTraining finished: /tmp/x (123.5 agent steps/s after seeding)\n";
        assert_eq!(parse_rate(log), Some(123.5));
        assert_eq!(parse_rate("Training finished: /tmp/x"), None);
    }

    #[test]
    fn each_case_makes_one_update_per_vector_step_after_short_seeding() {
        let options = LoopOptions {
            task: "Pendulum-v1".into(),
            model_sizes: vec![1],
            num_envs: vec![1, 4],
            pipeline: vec![false, true],
            vector_steps: 10,
            compile: vec![true],
            device: "cpu".into(),
            threads: Some(2),
            settings: vec!["fused_kernels=true".into()],
        };
        let args = train_args(&options, 200, 5, 4, true, false);
        assert_eq!(args.last().map(String::as_str), Some("fused_kernels=true"));
        for expected in [
            "model_size=5",
            "num_envs=4",
            "steps_per_update=4",
            "pipeline=true",
            "compile=false",
            "seed_steps=800",
            "steps=844",
            "eval_episodes=0",
            "num_threads=2",
        ] {
            assert!(args.iter().any(|a| a == expected), "{expected} in {args:?}");
        }
    }
}
