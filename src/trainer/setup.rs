//! A rank's place before training: its device and threads, then the process group, then its
//! CPUs (after the group: its communication threads, already started, keep every CPU); then
//! what it trains with, fresh or resumed, and the checkpoint a stop leaves.
use tch::Device;

use super::report::Report;
use super::stop::StopRequest;
use crate::actor::{Actor, ActorSettings, Policy};
use crate::agent::{AgentConfig, TorchNoise};
use crate::checkpoint::disk::BufferDisk;
use crate::checkpoint::{self, CheckpointSettings, TrainState};
use crate::config::Config;
use crate::ddp::{affinity, GroupSettings, ProcessGroup, RankInfo};
use crate::error::{Error, Result};
use crate::learner::{Learner, LearnerSettings};

/// Joins the process group on `device` (the rank's, from `device::select`).
pub(super) fn join_group(config: &Config, rank: &RankInfo, device: Device) -> Result<ProcessGroup> {
    tch::set_num_threads(crate::device::rank_threads(config.num_threads, rank) as i32);
    crate::device::set_tf32(device, config.tf32)?;
    let (group, backend) = GroupSettings::from_config(config).join(
        rank.clone(),
        device,
        super::stop::requested_here,
    )?;
    let pinned = match config.cpu_affinity {
        true => affinity::apply_from_env()?,
        false => None,
    };
    if group.rank() == 0 {
        if let Some(cpus) = pinned {
            errln!("rank 0 pinned to CPUs {}", affinity::format_list(&cpus));
        }
        if group.is_real() {
            errln!("{}", ProcessGroup::describe(backend));
        }
    }
    Ok(group)
}

/// What a run trains with, fresh or resumed.
pub(super) struct Start<'g> {
    pub(super) learner: Learner<'g>,
    pub(super) actor: Actor,
    pub(super) checkpoints: CheckpointSettings,
    pub(super) state: TrainState,
    /// The global step of the checkpoint `state` comes from; None for a fresh run. (Resumed at
    /// another world size, `state.step` × world size may fall short of it.)
    pub(super) resumed_from: Option<u64>,
    /// A fresh start of rank 0 that restarts the job that wrote the run directory (before its
    /// first checkpoint): the logs continue that attempt's tracker runs.
    pub(super) restarted: bool,
}

/// The learner (identical on every rank: broadcast from rank 0, or loaded from the
/// checkpoint), the actor with its environments and the learner's weights, and the counters.
pub(super) fn start<'g>(
    config: &Config,
    rank: &RankInfo,
    device: Device,
    group: &'g ProcessGroup,
) -> Result<Start<'g>> {
    if config.fused_kernels && device.is_cuda() {
        let (samples, elites) = (config.num_samples as i64, config.num_elites as i64);
        crate::cuda::fused::mppi_shared_bytes(samples, elites).map_err(|why| {
            Error::Config(format!(
                "fused_kernels=true: {why}; lower num_samples, or set fused_kernels=false"
            ))
        })?;
    }
    let mut learner = Learner::new(&LearnerSettings::from_config(config)?, device, group)?;
    crate::cuda::fused::set_enabled(config.fused_kernels);
    if config.fused_kernels && device.is_cuda() {
        crate::cuda::fused::prepare(device)
            .map_err(|e| Error::Config(format!("fused_kernels=true: {e}")))?;
    }
    let policy = Policy::new(
        &AgentConfig::from_config(config)?,
        device,
        config.num_envs,
        Box::new(TorchNoise::global()),
    )?;
    let actor_settings = ActorSettings {
        stop: Some(envs::StopProbe(super::stop::requested_here)),
        ..ActorSettings::from_config(config, rank)?
    };
    let mut actor = actor_settings.make_actor(policy)?;
    let checkpoints =
        CheckpointSettings::from_config(config).with_warm_start(actor.policy().warm_start_len());
    let resumed = checkpoint::resume(&checkpoints, &mut learner, group)?;
    let (state, resumed_from) = match resumed {
        Some((state, global_step)) => (state, Some(global_step)),
        None => {
            learner.broadcast_parameters()?;
            (TrainState::default(), None)
        }
    };
    checkpoint::forget_buffers_past(&checkpoints, resumed_from, group.rank());
    if config.save_buffer && group.rank() == 0 {
        let start = checkpoints.global_step(state.step, group.world_size());
        warn_if_buffers_outgrow_disk(config, rank, &learner, start);
    }
    if !state.env_episodes.is_empty() {
        actor.set_env_episodes(&state.env_episodes)?;
    }
    if !state.warm_start.is_empty() {
        actor.policy_mut().set_warm_start(&state.warm_start)?;
    }
    actor.policy_mut().load_weights(learner.model())?;
    if config.compile && device.is_cuda() {
        capture_graphs(&mut learner, actor.policy_mut(), group.rank() == 0);
    }
    let restarted = group.rank() == 0
        && resumed_from.is_none()
        && super::run_dir::restarts_its_job(&config.run_dir(), super::run_dir::restart_count());
    if group.rank() == 0 {
        super::run_dir::record_job(&config.run_dir())?;
    }
    Ok(Start {
        learner,
        actor,
        checkpoints,
        state,
        resumed_from,
        restarted,
    })
}

/// Warns when the replay buffers that this node's checkpoints will hold from global step `start`
/// on need more disk than is free under the run directory (a full disk fails the run).
fn warn_if_buffers_outgrow_disk(config: &Config, rank: &RankInfo, learner: &Learner, start: u64) {
    let disk = BufferDisk::new(
        learner.buffer().bytes() as u64,
        rank.local_world_size as u64,
        (start, config.steps, config.save_freq),
        config.keep_checkpoints as u64,
    );
    if let Ok((dir, free)) = checkpoint::disk::free_bytes(&config.run_dir()) {
        if let Some(warning) = disk.warning(free, &dir) {
            errln!("{warning}");
        }
    }
}

/// `compile=true` on CUDA: the update and the plans run as CUDA graphs where they can, and
/// rank 0 says which do and why the others do not.
fn capture_graphs(learner: &mut Learner, policy: &mut Policy, say: bool) {
    let (updates, plans) = (learner.capture_updates(), policy.capture_plans());
    if say {
        for (what, outcome) in [("updates", updates), ("plans", plans)] {
            match outcome {
                Ok(()) => errln!("compile=true: {what} run as CUDA graphs"),
                Err(why) => errln!("compile=true: {what} run eagerly ({why})"),
            }
        }
    }
}

/// A requested stop: when it came, who asked, and whether this run wrote the checkpoint of
/// this very step already (a stop seen in the pass that saved: that checkpoint is the exact
/// state, and a second one would replace it with the environments' next episodes counted).
pub(super) struct Stop<'a> {
    pub(super) when: &'a str,
    pub(super) request: StopRequest,
    pub(super) saved_here: bool,
}

/// Writes the checkpoint a stop promises, then closes rank 0's logs as stopped; returns the
/// error that ends the run (the save's own, if it failed).
pub(super) fn stop_with_checkpoint(
    checkpoints: &CheckpointSettings,
    state: &TrainState,
    learner: &Learner,
    group: &ProcessGroup,
    stop: Stop<'_>,
    report: Option<Report>,
) -> Error {
    if group.info().local_rank == 0 {
        errln!(
            "{} every rank stops {}, as {}; rank 0 writes the checkpoint",
            crate::ddp::STOPPING_NOTICE,
            stop.when,
            stop.request
        );
    }
    let saved = match stop.saved_here {
        true => Ok(()),
        false => checkpoint::save(checkpoints, state, learner, group),
    };
    match saved {
        Ok(()) => {
            if let Some(report) = report {
                report.close_stopped();
            }
            // No rank leaves before rank 0 has closed its logs as stopped either: under srun
            // --kill-on-bad-exit or torchrun the first rank to exit ends the others. The
            // checkpoint is written whatever this says (a rank gone now changes nothing).
            let _ = group.all_reduce_sum(&mut tch::Tensor::from_slice(&[1.0f32]));
            let resume = match group.rank() {
                0 => "; the same command with resume=auto goes on from it",
                _ => "",
            };
            Error::Stopped(format!(
                "stopped {}: {}; checkpoint written{resume}",
                stop.when, stop.request
            ))
        }
        // The logs close as a failed run's (their drop).
        Err(e) => e,
    }
}

/// Whether `mine` holds on every rank (a collective on several ranks).
pub(super) fn every_rank(group: &ProcessGroup, mine: bool) -> Result<bool> {
    if group.world_size() == 1 {
        return Ok(mine);
    }
    let all = group.all_gather(&tch::Tensor::from_slice(&[f32::from(u8::from(mine))]))?;
    Ok(Vec::<f32>::try_from(all)?.iter().all(|&v| v == 1.0))
}

/// Whether the checkpoint resumed from is the run directory's own of `global_step`: a stop
/// before anything changed keeps it rather than write it again. Another run's checkpoint of the
/// same step does not count: this run's own would stay, and a restart would resume from it.
/// Rank 0's answer: the other ranks may not see the run directory.
pub(super) fn holds_checkpoint(
    checkpoints: &CheckpointSettings,
    global_step: u64,
    group: &ProcessGroup,
) -> Result<bool> {
    let held = group.rank() != 0 || checkpoint::resumes_own_checkpoint(checkpoints, global_step);
    every_rank(group, held)
}
