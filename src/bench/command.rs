//! The `bench` command: its arguments, what it refuses before any case runs, and the cases
//! in turn.
use clap::Args;

use crate::arg_values::{count, thread_count};
use crate::config::MODEL_SIZES;
use crate::ddp::RankInfo;
use crate::error::{Error, Result};

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// What to measure: env (environment steps/s), buffer (replay-buffer bytes per row and
    /// memory), dataset (offline batches read from dataset files: memory and ms), video (evaluation videos: rendering and encoding), agent (plan and update ms
    /// vs matmul throughput), graphs (plan and update ms, eager and as CUDA graphs, on CUDA),
    /// ddp (data-parallel scaling of agent steps/s), loop (the training loop's agent steps/s
    /// over num_envs × pipeline × compile).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "env,agent",
        value_parser = clap::builder::PossibleValuesParser::new(BENCH_CASES)
    )]
    pub cases: Vec<String>,
    /// env: agent steps per measurement (all of a vector env's envs together).
    #[arg(long, default_value_t = 2000, value_parser = count)]
    pub env_steps: usize,
    /// buffer: rows of each replay buffer measured.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(2..))]
    pub buffer_rows: u64,
    /// dataset: megabytes of the dataset written and read.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..))]
    pub dataset_mb: u64,
    /// video: the task filmed.
    #[arg(long, default_value = "cartpole-swingup")]
    pub video_task: String,
    /// video: frames rendered at each size, and encoded.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..))]
    pub video_frames: u64,
    /// agent, graphs, loop: model sizes to time (official presets: 1, 5, 19, 48, 317).
    #[arg(long, value_delimiter = ',', default_value = "1,5")]
    pub model_sizes: Vec<u32>,
    /// agent, graphs: task dimensions to time (walker-run and/or dog-run).
    #[arg(long, value_delimiter = ',', default_value = "walker-run,dog-run")]
    pub tasks: Vec<String>,
    /// agent: environment counts of batched plans to time besides one (per-environment ms).
    #[arg(long, value_delimiter = ',', default_value = "4,16", value_parser = env_count)]
    pub plan_envs: Vec<usize>,
    /// agent, loop: torch threads (default: all cores).
    #[arg(long, value_parser = thread_count)]
    pub threads: Option<usize>,
    /// agent, graphs: timed calls per plan and per update measurement (after one warm-up call).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub agent_repeats: u64,
    /// agent, graphs, loop: where to run the model.
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda", "auto"])]
    pub device: String,
    /// ddp: rank counts to measure; each rank gets cores / ranks threads.
    #[arg(long, value_delimiter = ',', default_value = "1,2", value_parser = count)]
    pub ranks: Vec<usize>,
    /// ddp: micro-batches per synchronised update.
    #[arg(long, default_value_t = 1, value_parser = count)]
    pub sync_freq: usize,
    /// ddp: timed agent steps (plan + update) per rank.
    #[arg(long, default_value_t = 30, value_parser = count)]
    pub ddp_steps: usize,
    /// ddp: untimed agent steps before the timed ones.
    #[arg(long, default_value_t = 3)]
    pub ddp_warmup: usize,
    /// ddp: repetitions of the measurements (medians are reported).
    #[arg(long, default_value_t = 3, value_parser = count)]
    pub ddp_rounds: usize,
    /// loop: the task trained (Pendulum-v1 is native: the loop's own costs; walker-run adds
    /// dm_control in worker processes).
    #[arg(long, default_value = "Pendulum-v1")]
    pub loop_task: String,
    /// loop: environments per rank to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16", value_parser = env_count)]
    pub num_envs: Vec<usize>,
    /// loop: pipeline settings to measure.
    #[arg(long, value_delimiter = ',', default_value = "false,true")]
    pub pipeline: Vec<bool>,
    /// loop: timed vector steps per case (after seeding).
    #[arg(long, default_value_t = 30, value_parser = count)]
    pub loop_steps: usize,
    /// loop: `compile` settings to measure (CUDA graphs on CUDA; the CPU runs eagerly either
    /// way).
    #[arg(long, value_delimiter = ',', default_value = "true")]
    pub compile: Vec<bool>,
    /// loop: a `KEY=VALUE` setting for every case's run (repeatable), e.g. fused_kernels=true.
    #[arg(long = "loop-set", value_name = "KEY=VALUE")]
    pub loop_settings: Vec<String>,
    /// graphs: also profile one plan and one update, eager and as a graph: the kernels the
    /// device ran and their device time (torch's profiler with CUDA activity).
    #[arg(long)]
    pub kernels: bool,
    /// graphs: the `fused_kernels` settings to measure the update and plans with (our fused
    /// CUDA kernels, or torch's operations).
    #[arg(long, value_delimiter = ',', default_value = "false,true")]
    pub fused_kernels: Vec<bool>,
}

/// What `bench --cases` takes; an unknown case is refused before any is measured.
const BENCH_CASES: [&str; 8] = [
    "env", "buffer", "dataset", "video", "agent", "graphs", "ddp", "loop",
];

pub fn run(args: &BenchArgs) -> Result<()> {
    let mut video_env = check(args)?;
    for case in &args.cases {
        match case.as_str() {
            "env" => super::env::run(args.env_steps, &mut |line| outln!("{line}"))?,
            "buffer" => {
                super::buffer::run(args.buffer_rows as usize, &mut |line| outln!("{line}"))?
            }
            "dataset" => {
                super::dataset::run(args.dataset_mb as usize, &mut |line| outln!("{line}"))?
            }
            "video" => {
                let env = match video_env.take() {
                    Some(env) => env,
                    None => super::video::open(&args.video_task)?,
                };
                let frames = args.video_frames as usize;
                super::video::run(env, &args.video_task, frames, &mut |line| outln!("{line}"))?
            }
            "agent" => {
                let options = super::agent::BenchOptions {
                    model_sizes: args.model_sizes.clone(),
                    tasks: args.tasks.clone(),
                    plan_envs: args.plan_envs.clone(),
                    threads: args.threads,
                    device: args.device.clone(),
                    plan_repeats: args.agent_repeats as usize,
                    update_repeats: args.agent_repeats as usize,
                    ..Default::default()
                };
                super::agent::run(&options, &mut |line| outln!("{line}"))?;
            }
            "graphs" => {
                let options = super::graphs::GraphOptions {
                    model_sizes: args.model_sizes.clone(),
                    tasks: args.tasks.clone(),
                    repeats: args.agent_repeats as usize,
                    device: args.device.clone(),
                    kernels: args.kernels,
                    fused_kernels: args.fused_kernels.clone(),
                };
                super::graphs::run(&options, &mut |line| outln!("{line}"))?;
            }
            "ddp" => super::ddp::run(&ddp_options(args), &mut |line| outln!("{line}"))?,
            "loop" => {
                super::train_loop::run(&loop_options(args), &mut |line| outln!("{line}"))?;
            }
            other => {
                return Err(Error::Config(format!(
                    "unknown bench case '{other}'; allowed: {}",
                    BENCH_CASES.join(", ")
                )))
            }
        }
    }
    Ok(())
}

fn loop_options(args: &BenchArgs) -> super::train_loop::LoopOptions {
    super::train_loop::LoopOptions {
        task: args.loop_task.clone(),
        model_sizes: args.model_sizes.clone(),
        num_envs: args.num_envs.clone(),
        pipeline: args.pipeline.clone(),
        vector_steps: args.loop_steps,
        compile: args.compile.clone(),
        device: args.device.clone(),
        threads: args.threads,
        settings: args.loop_settings.clone(),
    }
}

/// What no case could run with is refused before the first runs (exit 2): a model size, a
/// task, a device this machine lacks, a loop setting `train` would refuse. Returns the video
/// case's environment, made to check its task.
fn check(args: &BenchArgs) -> Result<Option<Box<dyn envs::Env>>> {
    let runs = |case: &str| args.cases.iter().any(|c| c == case);
    // `tdmpc2 bench ...`: what was given (not a default) is known only from the matches.
    let mut line = std::env::args_os().skip(1).peekable();
    if line.peek().is_some_and(|verb| verb == "bench") {
        let bench = <BenchArgs as clap::Args>::augment_args(clap::Command::new("bench"));
        if let Ok(given) = bench.try_get_matches_from(line) {
            refuse_options_of_cases_not_run(&args.cases, &given)?;
        }
    }
    if ["agent", "graphs", "loop"].into_iter().any(runs) {
        if let Some(size) = args.model_sizes.iter().find(|s| !MODEL_SIZES.contains(s)) {
            return Err(Error::Config(format!(
                "--model-sizes {size}: allowed: {MODEL_SIZES:?}"
            )));
        }
        let rank = RankInfo {
            rank: 0,
            world_size: 1,
            local_rank: 0,
            local_world_size: 1,
            master_addr: String::new(),
            master_port: 0,
            own_cpus: None,
        };
        crate::device::select(&args.device, &rank, false).map_err(|e| {
            let why = e.to_string();
            let why = why.trim_start_matches("config error: ").to_owned();
            Error::Config(format!("--device {}: {why}", args.device))
        })?;
    }
    if runs("graphs") {
        super::graphs::cuda_device(&args.device)?;
    }
    if runs("dataset") {
        super::dataset::refuse_what_does_not_fit(args.dataset_mb as usize)?;
    }
    if runs("agent") || runs("graphs") {
        if let Some(task) = args
            .tasks
            .iter()
            .find(|task| super::agent::task_dims(task).is_err())
        {
            return Err(Error::Config(format!(
                "--tasks {task}: allowed: {}",
                super::agent::TASKS.join(", ")
            )));
        }
    }
    if runs("loop") {
        super::train_loop::check(&loop_options(args))?;
    }
    if runs("ddp") {
        ddp_options(args).check()?;
    }
    if runs("buffer") {
        super::buffer::check(args.buffer_rows as usize)?;
    }
    match runs("video") {
        true => super::video::open(&args.video_task).map(Some),
        false => Ok(None),
    }
}

/// The cases an option serves, as its help begins (`agent, graphs: ...`).
fn cases_of(option: &clap::Arg) -> Vec<&'static str> {
    let help = option
        .get_help()
        .map(ToString::to_string)
        .unwrap_or_default();
    let named = help.split_once(':').map_or("", |(cases, _)| cases);
    BENCH_CASES
        .into_iter()
        .filter(|case| named.split(',').any(|name| name.trim() == *case))
        .collect()
}

/// An option given for cases that do not run would be ignored: refused, naming its cases.
fn refuse_options_of_cases_not_run(cases: &[String], given: &clap::ArgMatches) -> Result<()> {
    let command = <BenchArgs as clap::Args>::augment_args(clap::Command::new("bench"));
    for option in command.get_arguments() {
        let id = option.get_id().as_str();
        let on_the_line = given.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
        let served = cases_of(option);
        if on_the_line && !served.is_empty() && !served.iter().any(|c| cases.iter().any(|r| r == c))
        {
            return Err(Error::Config(format!(
                "--{} serves the {} case{}, and --cases {} runs none of them: add one to --cases, \
                 or leave the option out",
                option.get_long().unwrap_or(id),
                match served.split_last() {
                    Some((last, [])) => last.to_string(),
                    Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
                    None => String::new(),
                },
                if served.len() > 1 { "s" } else { "" },
                cases.join(",")
            )));
        }
    }
    Ok(())
}

fn ddp_options(args: &BenchArgs) -> super::ddp::DdpOptions {
    super::ddp::DdpOptions {
        ranks: args.ranks.clone(),
        sync_freq: args.sync_freq,
        steps: args.ddp_steps,
        warmup: args.ddp_warmup,
        rounds: args.ddp_rounds,
        seed: 1,
    }
}

/// An environment count, at most `num_envs`'s limit.
fn env_count(text: &str) -> std::result::Result<usize, String> {
    let most = crate::config::MAX_NUM_ENVS;
    match count(text)? {
        n if n > most => Err(format!("at most {most} (num_envs's limit)")),
        n => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Args, Command};

    fn bench() -> Command {
        BenchArgs::augment_args(Command::new("bench"))
    }

    fn refusal(cases: &str, options: &[&str]) -> Option<String> {
        let given = bench()
            .try_get_matches_from([&["bench", "--cases", cases], options].concat())
            .unwrap();
        let cases: Vec<String> = cases.split(',').map(str::to_owned).collect();
        refuse_options_of_cases_not_run(&cases, &given)
            .err()
            .map(|e| e.to_string())
    }

    #[test]
    fn every_option_but_cases_names_the_cases_it_serves() {
        for option in bench().get_arguments().filter(|o| o.get_id() != "cases") {
            assert!(
                !cases_of(option).is_empty(),
                "--{}: its help names no case",
                option.get_id()
            );
        }
    }

    #[test]
    fn an_option_of_cases_that_do_not_run_is_refused() {
        let e = refusal("env", &["--model-sizes", "5"]).unwrap();
        assert!(
            e.contains("--model-sizes serves the agent, graphs and loop cases, and --cases env"),
            "{e}"
        );
        let e = refusal("env,agent", &["--ranks", "2"]).unwrap();
        assert!(e.contains("--ranks serves the ddp case,"), "{e}");
        assert_eq!(refusal("loop", &["--model-sizes", "5"]), None);
        assert_eq!(
            refusal("graphs,ddp", &["--device", "cpu", "--ranks", "2"]),
            None
        );
        assert_eq!(refusal("env", &[]), None);
    }
}
