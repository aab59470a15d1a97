//! The fused kernels as tensor functions: each checks its inputs (float32, contiguous, on one
//! CUDA device, the shapes it documents) and launches on torch's current stream.
use tch::{Device, Kind, Tensor};

use super::module::{kernel, Arg, Launch};
use super::FusedError;

/// Rows per block for the kernels that give each row a warp.
const WARPS_PER_BLOCK: i64 = 4;
const THREADS: u32 = 128;

/// Checks one input of a launch on `device`: a tensor on another device would be read at an
/// address of the wrong context (an illegal address, which ends the CUDA context).
pub(super) fn input(
    kernel: &'static str,
    device: Device,
    what: &str,
    t: &Tensor,
    shape: &[i64],
) -> Result<(), FusedError> {
    let problem = if t.kind() != Kind::Float {
        Some(format!("is {:?}, not float32", t.kind()))
    } else if !t.is_contiguous() {
        Some("is not contiguous".into())
    } else if !super::launch_on(t.device()) {
        Some(format!("is on {:?}", t.device()))
    } else if t.device() != device {
        Some(format!("is on {:?}, the launch on {device:?}", t.device()))
    } else if t.size() != shape {
        Some(format!("has shape {:?}, not {shape:?}", t.size()))
    } else {
        None
    };
    match problem {
        Some(message) => Err(refused(kernel, format!("{what} {message}"))),
        None => Ok(()),
    }
}

pub(super) fn refused(kernel: &'static str, message: String) -> FusedError {
    FusedError::Input { kernel, message }
}

/// The (rows, columns) of a 2-D input.
pub(super) fn matrix(
    kernel: &'static str,
    what: &str,
    t: &Tensor,
) -> Result<(i64, i64), FusedError> {
    t.size2()
        .map_err(|e| refused(kernel, format!("{what}: {e}")))
}

pub(super) fn warp_rows(rows: i64) -> Launch {
    Launch {
        blocks: ((rows + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK) as u32,
        threads: THREADS,
        shared_bytes: 0,
    }
}

/// tanh(μ + ε·exp(log σ)) from the policy head's output [rows, 2A] (μ, raw log σ squashed into
/// [low, low + dif]) and ε [rows, A]; masked by `mask` [rows / rows_per_mask, A] where given.
pub fn policy_action(
    head: &Tensor,
    eps: &Tensor,
    mask: Option<(&Tensor, i64)>,
    low: f64,
    dif: f64,
) -> Result<Tensor, FusedError> {
    const NAME: &str = "policy_action";
    let device = eps.device();
    let (rows, actions) = matrix(NAME, "eps", eps)?;
    input(NAME, device, "head", head, &[rows, 2 * actions])?;
    input(NAME, device, "eps", eps, &[rows, actions])?;
    let rows_per_mask = match mask {
        Some((m, per)) => {
            if per < 1 || rows % per != 0 {
                return Err(refused(
                    NAME,
                    format!("{rows} rows do not split into groups of {per}"),
                ));
            }
            input(NAME, device, "mask", m, &[rows / per, actions])?;
            per
        }
        None => 1,
    };
    let out = eps.empty_like();
    let total = rows * actions;
    kernel(device, NAME)?.launch(
        Launch {
            blocks: ((total + 255) / 256) as u32,
            threads: 256,
            shared_bytes: 0,
        },
        &[
            Arg::tensor(Some(head)),
            Arg::tensor(Some(eps)),
            Arg::tensor(mask.map(|(m, _)| m)),
            Arg::tensor(Some(&out)),
            Arg::I64(rows),
            Arg::I32(actions as i32),
            Arg::F32(low as f32),
            Arg::F32(dif as f32),
            Arg::I64(rows_per_mask),
        ],
    )?;
    Ok(out)
}

/// returns + factor·(Q₁ + Q₂)/2 [rows], the Qᵢ decoded from the pair's two-hot logits
/// [2, rows, bins] over `support` [bins]; `factor` has one value or one per row.
pub fn q_bootstrap(
    logits: &Tensor,
    support: &Tensor,
    returns: &Tensor,
    factor: &Tensor,
) -> Result<Tensor, FusedError> {
    const NAME: &str = "q_bootstrap";
    let device = logits.device();
    let size = logits.size();
    let [2, rows, bins] = size[..] else {
        return Err(refused(
            NAME,
            format!("logits have shape {size:?}, not [2, rows, bins]"),
        ));
    };
    input(NAME, device, "logits", logits, &[2, rows, bins])?;
    input(NAME, device, "support", support, &[bins])?;
    input(NAME, device, "returns", returns, &[rows])?;
    let stride = if factor.numel() == 1 { 0 } else { 1 };
    input(
        NAME,
        device,
        "factor",
        factor,
        &[if stride == 0 { 1 } else { rows }],
    )?;
    let out = returns.empty_like();
    kernel(device, NAME)?.launch(
        warp_rows(rows),
        &[
            Arg::tensor(Some(logits)),
            Arg::tensor(Some(support)),
            Arg::tensor(Some(returns)),
            Arg::tensor(Some(factor)),
            Arg::I64(stride),
            Arg::tensor(Some(&out)),
            Arg::I64(rows),
            Arg::I32(bins as i32),
        ],
    )?;
    Ok(out)
}

/// The two-hot coding's bins: `bins` evenly spaced on [vmin, vmax], `bin_size` apart.
#[derive(Debug, Clone, Copy)]
pub struct Bins {
    pub bins: i64,
    pub vmin: f64,
    pub vmax: f64,
    pub bin_size: f64,
}

/// The soft cross-entropy [rows] of `logits` [rows, bins] against the two-hot coding of
/// `target` [target_rows] (row r takes target r % target_rows), and its gradient with respect
/// to the logits [rows, bins].
pub fn two_hot_soft_ce(
    logits: &Tensor,
    target: &Tensor,
    bins: Bins,
) -> Result<(Tensor, Tensor), FusedError> {
    const NAME: &str = "two_hot_soft_ce";
    let device = logits.device();
    let (rows, width) = matrix(NAME, "logits", logits)?;
    let target_rows = target.numel() as i64;
    if width != bins.bins || target_rows < 1 || rows % target_rows != 0 {
        return Err(refused(
            NAME,
            format!(
                "logits [{rows}, {width}] do not take {} bins and targets for {target_rows} rows",
                bins.bins
            ),
        ));
    }
    input(NAME, device, "logits", logits, &[rows, width])?;
    input(NAME, device, "target", target, &[target_rows])?;
    let loss = Tensor::empty([rows], (Kind::Float, logits.device()));
    let grad = logits.empty_like();
    kernel(device, NAME)?.launch(
        warp_rows(rows),
        &[
            Arg::tensor(Some(logits)),
            Arg::tensor(Some(target)),
            Arg::tensor(Some(&loss)),
            Arg::tensor(Some(&grad)),
            Arg::I64(rows),
            Arg::I32(width as i32),
            Arg::I64(target_rows),
            Arg::F32(bins.vmin as f32),
            Arg::F32(bins.vmax as f32),
            Arg::F32(bins.bin_size as f32),
        ],
    )?;
    Ok((loss, grad))
}

/// The dynamic shared memory of `mppi_refit`'s block: the values of an environment's candidates
/// and two numbers an elite, at most the 48 KiB a block takes without opting in to more, less
/// the kernel's static `totals[2]` (so num_samples + 2 × num_elites ≤ 12,286).
pub fn mppi_shared_bytes(candidates: i64, elites: i64) -> Result<i64, String> {
    const STATIC: i64 = 2 * 4;
    const MOST: i64 = (48 << 10) - STATIC;
    let bytes = (candidates + 2 * elites) * 4;
    match bytes <= MOST {
        true => Ok(bytes),
        false => Err(format!(
            "MPPI's kernel holds num_samples + 2 × num_elites = {} values in a block's {MOST} \
             bytes of shared memory, at most {}",
            candidates + 2 * elites,
            MOST / 4
        )),
    }
}

/// MPPI's constants.
#[derive(Debug, Clone, Copy)]
pub struct MppiSettings {
    pub elites: i64,
    pub policy_rows: i64,
    pub temperature: f64,
    pub min_std: f64,
    pub max_std: f64,
}

/// What one refit gives: the elites' weights [E, K], the elites [E, H, K, A], and the new
/// mean and std [E, H, A].
#[derive(Debug)]
pub struct Refit {
    pub score: Tensor,
    pub elites: Tensor,
    pub mean: Tensor,
    pub std: Tensor,
}

fn candidates_shape(kernel: &'static str, candidates: &Tensor) -> Result<[i64; 4], FusedError> {
    let size = candidates.size();
    match size[..] {
        [e, h, n, a] => Ok([e, h, n, a]),
        _ => Err(refused(
            kernel,
            format!("candidates have shape {size:?}, not [E, H, N, A]"),
        )),
    }
}

/// candidates[:, :, P:] = clamp(mean + std·draws, −1, 1)·mask (draws [E, H, N − P, A]).
pub fn mppi_sample(
    candidates: &Tensor,
    mean: &Tensor,
    std: &Tensor,
    mask: Option<&Tensor>,
    draws: &Tensor,
    policy_rows: i64,
) -> Result<(), FusedError> {
    const NAME: &str = "mppi_sample";
    let device = candidates.device();
    let [e, h, n, a] = candidates_shape(NAME, candidates)?;
    input(NAME, device, "candidates", candidates, &[e, h, n, a])?;
    input(NAME, device, "mean", mean, &[e, h, a])?;
    input(NAME, device, "std", std, &[e, h, a])?;
    input(NAME, device, "draws", draws, &[e, h, n - policy_rows, a])?;
    if let Some(mask) = mask {
        input(NAME, device, "mask", mask, &[e, a])?;
    }
    kernel(device, NAME)?.launch(
        Launch {
            blocks: e as u32,
            threads: 512,
            shared_bytes: 0,
        },
        &[
            Arg::tensor(Some(mean)),
            Arg::tensor(Some(std)),
            Arg::tensor(mask),
            Arg::tensor(Some(draws)),
            Arg::tensor(Some(candidates)),
            Arg::I32(n as i32),
            Arg::I32(h as i32),
            Arg::I32(a as i32),
            Arg::I32(policy_rows as i32),
        ],
    )
}

/// Selection and refit from the candidates' values [E, N]; with `next_draws`, also the next
/// iteration's candidates (as [`mppi_sample`] from the new mean and std).
pub fn mppi_refit(
    values: &Tensor,
    candidates: &Tensor,
    mask: Option<&Tensor>,
    next_draws: Option<&Tensor>,
    settings: MppiSettings,
) -> Result<Refit, FusedError> {
    const NAME: &str = "mppi_refit";
    let device = candidates.device();
    let [e, h, n, a] = candidates_shape(NAME, candidates)?;
    let k = settings.elites;
    let p = settings.policy_rows;
    if !(1..=n).contains(&k) || !(0..n).contains(&p) {
        return Err(refused(
            NAME,
            format!("{k} elites and {p} policy rows do not fit {n} candidates"),
        ));
    }
    input(NAME, device, "values", values, &[e, n])?;
    input(NAME, device, "candidates", candidates, &[e, h, n, a])?;
    if let Some(mask) = mask {
        input(NAME, device, "mask", mask, &[e, a])?;
    }
    if let Some(draws) = next_draws {
        input(NAME, device, "draws", draws, &[e, h, n - p, a])?;
    }
    let options = (Kind::Float, candidates.device());
    let refit = Refit {
        score: Tensor::empty([e, k], options),
        elites: Tensor::empty([e, h, k, a], options),
        mean: Tensor::empty([e, h, a], options),
        std: Tensor::empty([e, h, a], options),
    };
    let shared = mppi_shared_bytes(n, k).map_err(|why| refused(NAME, why))?;
    kernel(device, NAME)?.launch(
        Launch {
            blocks: e as u32,
            threads: 512,
            shared_bytes: shared as u32,
        },
        &[
            Arg::tensor(Some(values)),
            Arg::tensor(Some(candidates)),
            Arg::tensor(mask),
            Arg::tensor(next_draws),
            Arg::tensor(Some(&refit.score)),
            Arg::tensor(Some(&refit.elites)),
            Arg::tensor(Some(&refit.mean)),
            Arg::tensor(Some(&refit.std)),
            Arg::I32(n as i32),
            Arg::I32(h as i32),
            Arg::I32(a as i32),
            Arg::I32(k as i32),
            Arg::I32(p as i32),
            Arg::F32(settings.temperature as f32),
            Arg::F32(settings.min_std as f32),
            Arg::F32(settings.max_std as f32),
        ],
    )?;
    Ok(refit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    /// Bad inputs are refused before anything launches, naming the kernel and the input.
    #[test]
    fn inputs_off_the_gpu_or_misshapen_are_refused_by_name() {
        let x = Tensor::zeros([4, 8], (Kind::Float, Device::Cpu));
        let w = Tensor::ones([8], (Kind::Float, Device::Cpu));
        let three = Tensor::ones([3, 8], (Kind::Float, Device::Cpu));
        let bins = Bins {
            bins: 8,
            vmin: -10.0,
            vmax: 10.0,
            bin_size: 20.0 / 7.0,
        };
        let e = two_hot_soft_ce(&x, &three, bins).unwrap_err().to_string();
        assert!(e.contains("targets for 24 rows"), "{e}");
        let two = Tensor::zeros([2], (Kind::Float, Device::Cpu));
        let e = two_hot_soft_ce(&x, &two, bins).unwrap_err().to_string();
        assert!(e.contains("logits is on Cpu"), "{e}");
        let logits = Tensor::zeros([3, 4, 5], (Kind::Float, Device::Cpu));
        let e = q_bootstrap(&logits, &w, &w, &w).unwrap_err().to_string();
        assert!(e.contains("not [2, rows, bins]"), "{e}");
        let candidates = Tensor::zeros([1, 3, 8, 2], (Kind::Float, Device::Cpu));
        let values = Tensor::zeros([1, 8], (Kind::Float, Device::Cpu));
        let settings = MppiSettings {
            elites: 9,
            policy_rows: 2,
            temperature: 0.5,
            min_std: 0.05,
            max_std: 2.0,
        };
        let e = mppi_refit(&values, &candidates, None, None, settings)
            .unwrap_err()
            .to_string();
        assert!(e.contains("9 elites"), "{e}");
    }

    /// A block of `mppi_refit` holds num_samples + 2 × num_elites values: 12,286 fit the 48 KiB
    /// a launch takes without opting in to more, beside its static 8 bytes; one more fails
    /// every plan.
    #[test]
    fn mppi_refit_takes_what_a_block_shared_memory_holds() {
        assert_eq!(mppi_shared_bytes(512, 64), Ok(2560));
        assert_eq!(mppi_shared_bytes(12_158, 64), Ok((48 << 10) - 8));
        let e = mppi_shared_bytes(12_159, 64).unwrap_err();
        assert!(e.contains("num_samples + 2 × num_elites = 12287"), "{e}");
    }
}
