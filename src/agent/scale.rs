//! The running scale of Q values that normalises the policy loss.
use tch::{Device, Kind, Tensor};

const LOW_PERCENTILE: f32 = 5.0;
const HIGH_PERCENTILE: f32 = 95.0;

/// S ← S + τ·(max(P95 − P5, 1) − S), percentiles over the batch with linear interpolation.
/// The value stays on the device (no host synchronisation).
#[derive(Debug)]
pub struct RunningScale {
    value: Tensor,
    tau: f64,
}

/// Sorted-position interpolation of one percentile, computed in float32 like the reference.
fn percentile_position(percentile: f32, count: i64) -> (i64, i64, f32, f32) {
    let position = percentile * (count - 1) as f32 / 100.0;
    let floor = position.floor();
    let ceil = (floor + 1.0).min((count - 1) as f32);
    let weight_ceil = position - floor;
    (floor as i64, ceil as i64, 1.0 - weight_ceil, weight_ceil)
}

impl RunningScale {
    pub fn new(tau: f64, device: Device) -> Self {
        Self {
            value: Tensor::ones([1], (Kind::Float, device)),
            tau,
        }
    }

    /// The current scale, shape (1,).
    pub fn value(&self) -> &Tensor {
        &self.value
    }

    /// Overwrites the scale (restoring a train state).
    pub fn set(&mut self, value: &Tensor) {
        tch::no_grad(|| self.value.copy_(&value.view([1])));
    }

    /// The 5th and 95th percentiles of `x` (N, …) along the first dim; shape (2, …).
    pub fn percentiles(x: &Tensor) -> Tensor {
        let count = x.size()[0];
        let rows = x.flatten(1, -1);
        let (sorted, _) = rows.sort(0, false);
        let pick = |percentile| {
            let (floor, ceil, weight_floor, weight_ceil) = percentile_position(percentile, count);
            sorted.get(floor) * weight_floor as f64 + sorted.get(ceil) * weight_ceil as f64
        };
        let mut shape = x.size();
        shape[0] = 2;
        Tensor::stack(&[pick(LOW_PERCENTILE), pick(HIGH_PERCENTILE)], 0).view(shape.as_slice())
    }

    /// Updates from a batch of values (N, 1). A distributed caller passes the values gathered
    /// from all ranks so that every rank computes the same scale.
    pub fn update(&mut self, x: &Tensor) {
        tch::no_grad(|| {
            let p = Self::percentiles(&x.detach());
            let spread = (p.get(1) - p.get(0)).clamp_min(1.0);
            let _ = self.value.lerp_(&spread.view([-1]), self.tau);
        });
    }

    /// `x / S`.
    pub fn normalize(&self, x: &Tensor) -> Tensor {
        x / &self.value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_linearly_like_numpy() {
        // 0..=20 shuffled: P5 = 1.0, P95 = 19.0 exactly.
        let values: Vec<f32> = [
            7, 3, 20, 0, 15, 9, 1, 18, 12, 5, 19, 2, 10, 4, 16, 6, 11, 14, 8, 13, 17,
        ]
        .iter()
        .map(|&v| v as f32)
        .collect();
        let x = Tensor::from_slice(&values).view([21, 1]);
        let p = RunningScale::percentiles(&x);
        assert_eq!(
            Vec::<f32>::try_from(&p.view([-1])).unwrap(),
            vec![1.0, 19.0]
        );
        // Eight values: positions 0.35 and 6.65.
        let x =
            Tensor::from_slice(&[0.0f32, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0]).view([8, 1]);
        let p = Vec::<f32>::try_from(&RunningScale::percentiles(&x).view([-1])).unwrap();
        assert!(
            (p[0] - 3.5).abs() < 1e-5 && (p[1] - 66.5).abs() < 1e-4,
            "{p:?}"
        );
    }

    #[test]
    fn update_moves_towards_the_spread_with_a_floor_of_one() {
        let mut scale = RunningScale::new(0.01, Device::Cpu);
        let x =
            Tensor::from_slice(&[0.0f32, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0]).view([8, 1]);
        scale.update(&x);
        let expected = 1.0 + 0.01 * (66.5 - 3.5 - 1.0);
        assert!((scale.value().double_value(&[0]) - expected).abs() < 1e-5);
        // A spread below 1 counts as 1.
        let mut scale = RunningScale::new(0.5, Device::Cpu);
        scale.update(&Tensor::zeros([8, 1], (Kind::Float, Device::Cpu)));
        assert_eq!(scale.value().double_value(&[0]), 1.0);
        let q = Tensor::from_slice(&[4.0f32]);
        assert_eq!(scale.normalize(&q).double_value(&[0]), 4.0);
    }
}
