//! `tdmpc2 bench --cases env`: agent steps/s of environments, one in this process (the
//! baseline) and several at once over worker processes (`tdmpc2 env-worker`, one core each).
//! Pixel observations render one frame an agent step, so their rate is frames/s; they run in
//! worker processes only (a process loads dm_control with or without a renderer, once), the
//! baseline being one environment in one worker. With several workers, resetting every
//! environment is timed too, together (all workers at once) against one by one (the baseline).
use envs::{ObsKind, Placement, VectorEnv};
use serde_json::{json, Value};

use crate::error::Result;

/// Vectorised walker-run sizes measured against one in-process env.
const WALKER_NUM_ENVS: [usize; 4] = [1, 2, 4, 8];
/// Rendering cartpole-swingup environments (one a worker), against one.
const PIXEL_NUM_ENVS: [usize; 3] = [1, 2, 4];

/// One measurement: `num_envs` envs of `task`, in-process or over `workers` processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvCase {
    pub task: &'static str,
    pub obs: ObsKind,
    pub num_envs: usize,
    pub placement: Placement,
}

/// The cases in the order they run: per task, the in-process single env first (the
/// baseline the others are compared with), then the vector envs with workers = min(num_envs,
/// cores).
pub fn cases(cores: usize) -> Vec<EnvCase> {
    let workers = |n: usize| Placement::Workers(n.min(cores.max(1)));
    let mut cases = vec![
        EnvCase {
            task: "Pendulum-v1",
            obs: ObsKind::State,
            num_envs: 1,
            placement: Placement::InProcess,
        },
        EnvCase {
            task: "Pendulum-v1",
            obs: ObsKind::State,
            num_envs: 8,
            placement: workers(8),
        },
        EnvCase {
            task: "walker-run",
            obs: ObsKind::State,
            num_envs: 1,
            placement: Placement::InProcess,
        },
    ];
    cases.extend(WALKER_NUM_ENVS.iter().map(|&num_envs| EnvCase {
        task: "walker-run",
        obs: ObsKind::State,
        num_envs,
        placement: workers(num_envs),
    }));
    cases.extend(PIXEL_NUM_ENVS.iter().map(|&num_envs| EnvCase {
        task: "cartpole-swingup",
        obs: ObsKind::Rgb,
        num_envs,
        placement: Placement::Workers(num_envs),
    }));
    cases
}

/// Runs every case for `steps` agent steps (all envs together) and prints one JSON line each.
pub fn run(steps: usize, print: &mut dyn FnMut(&Value)) -> Result<()> {
    let cores = crate::device::cores();
    let worker = crate::actor::env_worker_command(None)?;
    let mut baseline = None;
    for case in cases(cores) {
        let seeds: Vec<u64> = (0..case.num_envs as u64).collect();
        let mut venv = VectorEnv::observed(case.task, case.obs, &seeds, case.placement, &worker)?;
        let rate = envs::bench::vector_steps_per_second(&mut venv, steps, 0)?;
        let first_of_its_kind = match case.obs {
            ObsKind::State => case.placement == Placement::InProcess,
            ObsKind::Rgb => true,
        };
        if first_of_its_kind && case.num_envs == 1 {
            baseline = Some((case.task, rate));
        }
        let (placement, workers) = match case.placement {
            Placement::InProcess => ("in-process", 0),
            Placement::Workers(k) => ("workers", k),
        };
        let mut line = json!({
            "case": "env", "task": case.task, "obs": case.obs.name(), "steps": steps,
            "num_envs": case.num_envs,
            "placement": placement, "workers": workers, "cores": cores,
            "agent_steps_per_second": rate,
        });
        if let Some((_, base)) = baseline.filter(|(task, _)| *task == case.task) {
            let key = match case.obs {
                ObsKind::State => "speedup_vs_one_in_process",
                ObsKind::Rgb => "speedup_vs_one_worker",
            };
            line[key] = (rate / base).into();
        }
        print(&line);
        if matches!(case.placement, Placement::Workers(k) if k > 1) {
            print(&reset_times(&case, &mut venv)?);
        }
    }
    Ok(())
}

/// Milliseconds to reset every environment of `venv`, one by one (the baseline) and together,
/// the median of a few rounds each.
fn reset_times(case: &EnvCase, venv: &mut VectorEnv) -> Result<Value> {
    const ROUNDS: usize = 9;
    let all: Vec<(usize, Option<u64>)> = (0..case.num_envs).map(|i| (i, Some(i as u64))).collect();
    let median_ms = |venv: &mut VectorEnv, together: bool| -> Result<f64> {
        let mut times = Vec::with_capacity(ROUNDS);
        for _ in 0..ROUNDS {
            let started = std::time::Instant::now();
            match together {
                true => drop(venv.reset_many(&all)?),
                false => {
                    for &(i, seed) in &all {
                        venv.reset(i, seed)?;
                    }
                }
            }
            times.push(started.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(f64::total_cmp);
        Ok(times[ROUNDS / 2])
    };
    let one_by_one = median_ms(venv, false)?;
    let together = median_ms(venv, true)?;
    let workers = match case.placement {
        Placement::Workers(k) => k,
        Placement::InProcess => 0,
    };
    Ok(json!({
        "case": "env resets", "task": case.task, "obs": case.obs.name(),
        "num_envs": case.num_envs, "workers": workers,
        "ms_one_by_one": one_by_one, "ms_together": together,
        "speedup": one_by_one / together.max(1e-9),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walker_run_is_measured_against_one_in_process_env_with_workers_capped_at_cores() {
        let walker: Vec<(usize, Placement)> = cases(2)
            .into_iter()
            .filter(|c| c.task == "walker-run")
            .map(|c| (c.num_envs, c.placement))
            .collect();
        assert_eq!(
            walker,
            vec![
                (1, Placement::InProcess),
                (1, Placement::Workers(1)),
                (2, Placement::Workers(2)),
                (4, Placement::Workers(2)),
                (8, Placement::Workers(2)),
            ]
        );
        assert!(cases(0)
            .iter()
            .all(|c| c.placement != Placement::Workers(0)));
        let pixels: Vec<(usize, Placement)> = cases(2)
            .into_iter()
            .filter(|c| c.obs == ObsKind::Rgb)
            .map(|c| (c.num_envs, c.placement))
            .collect();
        assert_eq!(
            pixels,
            vec![
                (1, Placement::Workers(1)),
                (2, Placement::Workers(2)),
                (4, Placement::Workers(4)),
            ],
            "a worker renders for one environment"
        );
    }
}
