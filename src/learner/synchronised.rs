//! One update as every rank makes it: the world-model passes of the micro-batches, the
//! gradient all-reduce and the world-model step, the policy passes (each gathering the Q values
//! of all ranks for the scale), the policy all-reduce and step, the target update and the
//! statistics averaged over ranks. One rank with one micro-batch takes the single-process
//! update, which makes no collective. The same code runs eagerly and inside a CUDA graph.
use std::time::Instant;

use tch::{Kind, Tensor};

use super::CommTimes;
use crate::agent::{Noise, PreparedPermutations, UpdateInfo, Updater, WorldModel};
use crate::buffer::Batch;
use crate::ddp::ProcessGroup;
use crate::error::{Error, Result};

/// What one update works on, borrowed from the learner.
pub(super) struct UpdateParts<'a> {
    pub(super) group: &'a ProcessGroup,
    pub(super) model: &'a mut WorldModel,
    pub(super) updater: &'a mut Updater,
    /// Per-sample draws.
    pub(super) sample_noise: &'a mut dyn Noise,
    /// This update's rank-shared draws, prepared.
    pub(super) shared: &'a mut PreparedPermutations,
    pub(super) comm: &'a mut CommTimes,
    pub(super) tau: f64,
}

impl UpdateParts<'_> {
    /// One update on `batches`: the micro-batches of this rank.
    pub(super) fn run(&mut self, batches: &[Batch]) -> Result<UpdateInfo> {
        let (group, model, learner) = (self.group, &mut *self.model, &mut *self.updater);
        let (sample_noise, shared) = (&mut *self.sample_noise, &mut *self.shared);
        // A forced group of one rank runs the collectives all the same: it stands in for many
        // ranks on one GPU.
        if !group.is_real() && batches.len() == 1 {
            return Ok(learner.update(model, &batches[0], sample_noise, shared)?);
        }
        let micro = batches.len() as f64;
        let unions = task_unions(group, model, batches)?;
        let mut passes = Vec::with_capacity(batches.len());
        for (batch, union) in batches.iter().zip(&unions) {
            renormalise_as(model, union);
            passes.push(learner.world_model_backward(model, batch, sample_noise, shared)?);
        }
        let started = Instant::now();
        average(group, learner.model_grads_mut(), micro)?;
        self.comm.grad_all_reduce += started.elapsed().as_secs_f64();
        let grad_norm = learner.step_world_model(model)?;

        let mut gather_seconds = 0.0;
        let mut gather = |q: &Tensor| -> crate::agent::Result<Tensor> {
            let started = Instant::now();
            let gathered = group
                .all_gather(q)
                .map_err(|e| crate::agent::Error::Collective(e.to_string()));
            gather_seconds += started.elapsed().as_secs_f64();
            gathered
        };
        let mut policy_passes = Vec::with_capacity(passes.len());
        for (pass, union) in passes.iter().zip(&unions) {
            renormalise_as(model, union);
            policy_passes.push(learner.policy_backward(
                model,
                &pass.latents,
                pass.task.as_ref(),
                sample_noise,
                shared,
                &mut gather,
            )?);
        }
        renormalise_as(model, &None);
        // The embedding gradient each rank's policy loss leaves for the next step, averaged
        // now: every rank carries the same (and a checkpoint holds it).
        if let Some(mut carried) = learner.carried_task_grad(model) {
            group.all_reduce_mean(&mut carried)?;
        }
        self.comm.other += gather_seconds;
        let started = Instant::now();
        average(group, learner.policy_grads_mut(), micro)?;
        self.comm.grad_all_reduce += started.elapsed().as_secs_f64();
        let pi_grad_norm = learner.step_policy(model)?;
        model.soft_update_target(self.tau);
        let (wm, pi) = (mean_passes(&passes), mean_policy(&policy_passes));
        // Losses are per-rank means: averaged, they are the losses of the whole N·k·B batch
        // (the grad norms and the scale are already global and stay as they are).
        let mut info = learner.info(&wm, grad_norm, &pi, pi_grad_norm);
        let started = Instant::now();
        group.all_reduce_mean(&mut info.values)?;
        self.comm.other += started.elapsed().as_secs_f64();
        Ok(info)
    }
}

/// A multitask model on several ranks: for each micro-batch, the tasks any rank's holds, as a
/// mask over the task table, nonzero where held (one collective for all; no host read, as
/// a CUDA graph needs). Otherwise nothing: each lookup renormalises its own rows.
fn task_unions(
    group: &ProcessGroup,
    model: &WorldModel,
    batches: &[Batch],
) -> Result<Vec<Option<Tensor>>> {
    let (Some(table), true) = (&model.task, group.world_size() > 1) else {
        return Ok(batches.iter().map(|_| None).collect());
    };
    let (tasks, device) = (table.weight.size()[0], model.device());
    let mut seen = Tensor::zeros([batches.len() as i64, tasks], (Kind::Float, device));
    for (i, batch) in batches.iter().enumerate() {
        let ids = batch.task.as_ref().ok_or_else(|| {
            Error::Config("a multitask model needs the task of every sample".into())
        })?;
        let _ = seen
            .get(i as i64)
            .index_fill_(0, &ids.to_device(device).to_kind(Kind::Int64), 1.0);
    }
    group.all_reduce_mean(&mut seen)?;
    Ok((0..batches.len() as i64)
        .map(|i| Some(seen.get(i)))
        .collect())
}

fn renormalise_as(model: &mut WorldModel, union: &Option<Tensor>) {
    if let Some(table) = model.task.as_mut() {
        table.renormalise_as(union.as_ref().map(Tensor::shallow_clone));
    }
}

/// Sum over micro-batches → mean over micro-batches and ranks.
fn average(group: &ProcessGroup, grads: &mut Tensor, micro: f64) -> Result<()> {
    if micro > 1.0 {
        let _ = grads.divide_scalar_(micro);
    }
    group.all_reduce_mean(grads)
}

fn mean_of(values: Vec<&Tensor>) -> Tensor {
    Tensor::stack(&values, 0).mean(tch::Kind::Float)
}

fn mean_passes(passes: &[crate::agent::WorldModelPass]) -> crate::agent::WorldModelPass {
    crate::agent::WorldModelPass {
        consistency_loss: mean_of(passes.iter().map(|p| &p.consistency_loss).collect()),
        reward_loss: mean_of(passes.iter().map(|p| &p.reward_loss).collect()),
        value_loss: mean_of(passes.iter().map(|p| &p.value_loss).collect()),
        termination_loss: mean_of(passes.iter().map(|p| &p.termination_loss).collect()),
        termination_rate: mean_of(passes.iter().map(|p| &p.termination_rate).collect()),
        termination_f1: mean_of(passes.iter().map(|p| &p.termination_f1).collect()),
        total_loss: mean_of(passes.iter().map(|p| &p.total_loss).collect()),
        latents: passes[0].latents.shallow_clone(),
        task: passes[0].task.as_ref().map(Tensor::shallow_clone),
    }
}

fn mean_policy(passes: &[crate::agent::PolicyPass]) -> crate::agent::PolicyPass {
    crate::agent::PolicyPass {
        pi_loss: mean_of(passes.iter().map(|p| &p.pi_loss).collect()),
        entropy: mean_of(passes.iter().map(|p| &p.entropy).collect()),
        scaled_entropy: mean_of(passes.iter().map(|p| &p.scaled_entropy).collect()),
    }
}
