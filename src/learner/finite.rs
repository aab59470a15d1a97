//! Stops a diverging run: a non-finite loss, gradient norm or parameter ends training with an
//! error naming the step, and a checkpoint is never written of such a state.
//!
//! Every rank decides alike without a collective: the update statistics are all-reduced and
//! the parameters identical on all ranks, so each rank sees the same values at the same step.
//! The online loop checks at episode ends, which differ across ranks when episodes do (a
//! multitask run, early terminations): then the first rank to see it fails, naming the
//! divergence, and its launcher stops the others.
use super::Learner;
use crate::agent::UpdateStats;
use crate::error::{Error, Result};

/// The statistics of the last update are all finite.
pub fn check_stats(stats: &UpdateStats, step: u64) -> Result<()> {
    let bad: Vec<String> = stats
        .named()
        .iter()
        .filter(|(_, value)| !value.is_finite())
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    if bad.is_empty() {
        return Ok(());
    }
    Err(diverged(step, &bad.join(", ")))
}

/// The learner's parameters (world model, policy, target Q) and the Q scale are all finite:
/// what a checkpoint would save.
pub fn check_parameters(learner: &Learner, step: u64) -> Result<()> {
    let model = learner.model();
    let parts = [
        ("world-model parameters", &model.model_params.flat),
        ("policy parameters", &model.policy_params.flat),
        ("target Q parameters", &model.target_params.flat),
        ("Q scale", learner.updater().scale.value()),
    ];
    for (what, tensor) in parts {
        let finite = tensor.f_isfinite()?.f_all()?.f_int64_value(&[])? == 1;
        if !finite {
            return Err(diverged(step, &format!("the {what} are no longer finite")));
        }
    }
    Ok(())
}

fn diverged(step: u64, what: &str) -> Error {
    Error::Diverged(format!(
        "training diverged at step {step}: {what}; stopped without writing a checkpoint of \
         this state (the last checkpoint, if any, is the last good one); lower lr or the loss \
         coefficients"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(total_loss: f64, grad_norm: f64) -> UpdateStats {
        UpdateStats {
            consistency_loss: 1.0,
            reward_loss: 1.0,
            value_loss: 1.0,
            termination_loss: 0.0,
            total_loss,
            grad_norm,
            pi_loss: 1.0,
            pi_grad_norm: 1.0,
            pi_entropy: 1.0,
            pi_scaled_entropy: 1.0,
            pi_scale: 1.0,
            termination_rate: None,
            termination_f1: None,
        }
    }

    #[test]
    fn non_finite_statistics_name_the_step_and_the_loss() {
        assert!(check_stats(&stats(3.0, 20.0), 10).is_ok());
        let e = check_stats(&stats(f64::NAN, f64::INFINITY), 1234)
            .unwrap_err()
            .to_string();
        assert!(e.contains("step 1234"), "{e}");
        assert!(
            e.contains("total_loss=NaN") && e.contains("grad_norm=inf"),
            "{e}"
        );
        assert!(!e.contains("reward_loss"), "only the bad values: {e}");
    }

    #[test]
    fn non_finite_parameters_are_refused() {
        let config = crate::config::Config::for_dims(None, 3, 1).unwrap();
        let group = crate::ddp::ProcessGroup::alone(crate::ddp::RankInfo::single(&config));
        let learner = Learner::new(
            &crate::learner::LearnerSettings::from_config(&config)
                .unwrap()
                .with_capacity(10),
            tch::Device::Cpu,
            &group,
        )
        .unwrap();
        assert!(check_parameters(&learner, 5).is_ok());
        tch::no_grad(|| {
            let _ = learner.model().policy_params.flat.get(0).fill_(f64::NAN);
        });
        let e = check_parameters(&learner, 5).unwrap_err().to_string();
        assert!(
            e.contains("step 5") && e.contains("policy parameters"),
            "{e}"
        );
    }
}
