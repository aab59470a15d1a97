//! The logged statistics of one update: device scalars in one tensor until they are fetched,
//! then named values on the host (the official names and order).
use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use super::error::Result;

/// The logged statistics of one update, kept on the device until [`UpdateInfo::fetch`].
#[derive(Debug)]
pub struct UpdateInfo {
    /// The values in the order of [`UpdateStats::FIELDS`].
    pub values: Tensor,
    /// Whether the termination statistics are part of them (episodic tasks).
    pub episodic: bool,
}

/// The logged statistics of one update, on the host.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct UpdateStats {
    pub consistency_loss: f64,
    pub reward_loss: f64,
    pub value_loss: f64,
    pub termination_loss: f64,
    pub total_loss: f64,
    pub grad_norm: f64,
    pub pi_loss: f64,
    pub pi_grad_norm: f64,
    pub pi_entropy: f64,
    pub pi_scaled_entropy: f64,
    pub pi_scale: f64,
    /// Episodic tasks only, as the official code logs them.
    pub termination_rate: Option<f64>,
    pub termination_f1: Option<f64>,
}

impl UpdateStats {
    /// The statistics tensor's entries, in order; the last two are logged for episodic tasks.
    pub const FIELDS: [&'static str; 13] = [
        "consistency_loss",
        "reward_loss",
        "value_loss",
        "termination_loss",
        "total_loss",
        "grad_norm",
        "pi_loss",
        "pi_grad_norm",
        "pi_entropy",
        "pi_scaled_entropy",
        "pi_scale",
        "termination_rate",
        "termination_f1",
    ];

    /// `(name, value)` pairs in [`Self::FIELDS`] order, of the statistics this update has.
    pub fn named(&self) -> Vec<(&'static str, f64)> {
        let v = [
            self.consistency_loss,
            self.reward_loss,
            self.value_loss,
            self.termination_loss,
            self.total_loss,
            self.grad_norm,
            self.pi_loss,
            self.pi_grad_norm,
            self.pi_entropy,
            self.pi_scaled_entropy,
            self.pi_scale,
        ];
        let termination = [self.termination_rate, self.termination_f1];
        Self::FIELDS
            .into_iter()
            .zip(v.into_iter().map(Some).chain(termination))
            .filter_map(|(name, value)| value.map(|v| (name, v)))
            .collect()
    }
}

impl UpdateInfo {
    /// Copies the statistics to the host (one synchronisation).
    pub fn fetch(&self) -> Result<UpdateStats> {
        // The f_ calls: an error of the device's queued work surfaces here, as an error.
        let v = Vec::<f64>::try_from(
            &self
                .values
                .f_to_kind(Kind::Double)?
                .f_to_device(tch::Device::Cpu)?,
        )?;
        Ok(UpdateStats {
            consistency_loss: v[0],
            reward_loss: v[1],
            value_loss: v[2],
            termination_loss: v[3],
            total_loss: v[4],
            grad_norm: v[5],
            pi_loss: v[6],
            pi_grad_norm: v[7],
            pi_entropy: v[8],
            pi_scaled_entropy: v[9],
            pi_scale: v[10],
            termination_rate: self.episodic.then_some(v[11]),
            termination_f1: self.episodic.then_some(v[12]),
        })
    }
}
