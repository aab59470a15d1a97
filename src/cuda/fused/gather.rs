//! Picking ensemble members out of stacked parameters in one kernel (`gather.cu`): what
//! `index_select(0, index)` gives for each stack, for a Q pair's ten parameter stacks, without
//! ten copies. It has no backward, so it applies only where no stack wants a gradient.
use std::ffi::c_void;

use tch::{Kind, Tensor};

use super::kernels::refused;
use super::module::{kernel, Arg, Launch};
use super::FusedError;

/// The most stacks one launch takes (`TDMPC2_GATHER_STACKS` in gather.cu).
const MAX_STACKS: usize = 16;
const THREADS: u32 = 256;
/// Blocks per (picked member, stack): enough for a few hundred thousand floats each.
const MAX_BLOCKS_PER_STACK: i64 = 32;

#[repr(C)]
struct MemberStacks {
    source: [*const c_void; MAX_STACKS],
    target: [*mut c_void; MAX_STACKS],
    member_elements: [i64; MAX_STACKS],
}

/// Whether [`gather_members`] takes `stacks`: the fused kernels on, every stack a contiguous
/// float32 tensor where the kernels launch, at most 16 of them, and none wanting a gradient (in
/// grad mode).
pub fn gathers(stacks: &[&Tensor]) -> bool {
    super::enabled()
        && !stacks.is_empty()
        && stacks.len() <= MAX_STACKS
        && stacks
            .iter()
            .all(|s| super::launch_on(s.device()) && s.kind() == Kind::Float && s.is_contiguous())
        && !(stacks.iter().any(|s| s.requires_grad()) && imp::grad_enabled())
}

/// Each of `stacks` ([members, ...], one CUDA device) at the members `index` (int64, [picked],
/// on that device): [picked, ...] each, in one launch, cut from autograd.
pub fn gather_members(stacks: &[&Tensor], index: &Tensor) -> Result<Vec<Tensor>, FusedError> {
    const NAME: &str = "gather_members";
    let Some(first) = stacks.first() else {
        return Err(refused(NAME, "no stacks to pick from".into()));
    };
    if stacks.len() > MAX_STACKS {
        return Err(refused(
            NAME,
            format!("{} stacks, at most {MAX_STACKS}", stacks.len()),
        ));
    }
    let device = first.device();
    if index.kind() != Kind::Int64 || index.dim() != 1 || index.device() != device {
        return Err(refused(
            NAME,
            format!(
                "index is {:?} {:?} on {:?}, not int64 [picked] on {device:?}",
                index.kind(),
                index.size(),
                index.device()
            ),
        ));
    }
    let members = first.size().first().copied().unwrap_or(0);
    let picked = index.size()[0];
    let mut table = MemberStacks {
        source: [std::ptr::null(); MAX_STACKS],
        target: [std::ptr::null_mut(); MAX_STACKS],
        member_elements: [0; MAX_STACKS],
    };
    let mut picks = Vec::with_capacity(stacks.len());
    for (i, stack) in stacks.iter().enumerate() {
        let shape = stack.size();
        if shape.first() != Some(&members)
            || stack.kind() != Kind::Float
            || !stack.is_contiguous()
            || stack.device() != device
        {
            return Err(refused(
                NAME,
                format!(
                    "stack {i} is {:?} {shape:?} on {:?}, not contiguous float32 with {members} \
                     members on {device:?}",
                    stack.kind(),
                    stack.device()
                ),
            ));
        }
        let mut out_shape = shape.clone();
        out_shape[0] = picked;
        let out = Tensor::empty(out_shape.as_slice(), (Kind::Float, device));
        table.source[i] = stack.data_ptr();
        table.target[i] = out.data_ptr();
        table.member_elements[i] = shape[1..].iter().product();
        picks.push(out);
    }
    let largest = table.member_elements.iter().copied().max().unwrap_or(0);
    let blocks_per_stack =
        ((largest + THREADS as i64 - 1) / THREADS as i64).clamp(1, MAX_BLOCKS_PER_STACK);
    let blocks = blocks_per_stack * stacks.len() as i64 * picked;
    let index = index.contiguous();
    kernel(device, NAME)?.launch(
        Launch {
            blocks: blocks as u32,
            threads: THREADS,
            shared_bytes: 0,
        },
        &[
            Arg::Value(&table as *const MemberStacks as *const c_void),
            Arg::tensor(Some(&index)),
            Arg::I32(stacks.len() as i32),
            Arg::I32(members as i32),
            Arg::I32(blocks_per_stack as i32),
        ],
    )?;
    Ok(picks)
}

#[cfg(tdmpc2_cuda_graphs)]
mod imp {
    use std::ffi::c_char;

    use crate::cuda::graph::imp::check;

    extern "C" {
        fn tdmpc2_grad_enabled(out: *mut i32) -> *mut c_char;
    }

    /// torch's grad mode on this thread (off inside `tch::no_grad`).
    pub fn grad_enabled() -> bool {
        let mut out = 1;
        // SAFETY: a valid out-pointer. An error (none is possible) reads as grad mode on,
        // which keeps the gather off.
        check("grad mode", unsafe { tdmpc2_grad_enabled(&mut out) }).map_or(true, |_| out != 0)
    }
}

#[cfg(not(tdmpc2_cuda_graphs))]
mod imp {
    /// Without the shim the kernels never load; grad mode on keeps the gather off.
    pub fn grad_enabled() -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    #[test]
    fn misshapen_stacks_and_indices_are_refused_by_name() {
        let cpu = (Kind::Float, Device::Cpu);
        let index = Tensor::from_slice(&[0i64, 1]);
        let e = gather_members(&[], &index).unwrap_err().to_string();
        assert!(e.contains("gather_members: no stacks"), "{e}");
        let (a, b) = (Tensor::zeros([5, 3], cpu), Tensor::zeros([4, 3], cpu));
        let e = gather_members(&[&a, &b], &index).unwrap_err().to_string();
        assert!(e.contains("stack 1") && e.contains("with 5 members"), "{e}");
        let e = gather_members(&[&a], &index.to_kind(Kind::Float))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not int64 [picked]"), "{e}");
        let many: Vec<&Tensor> = std::iter::repeat_n(&a, 17).collect();
        let e = gather_members(&many, &index).unwrap_err().to_string();
        assert!(e.contains("17 stacks, at most 16"), "{e}");
    }

    /// On the CPU (or with the kernels off) nothing is gathered by the kernel.
    #[test]
    fn the_cpu_keeps_torchs_copies() {
        let a = Tensor::zeros([5, 3], (Kind::Float, Device::Cpu));
        assert!(!gathers(&[&a]));
    }

    /// Grad mode as torch keeps it: on, and off inside `no_grad`.
    #[cfg(tdmpc2_cuda_graphs)]
    #[test]
    fn grad_mode_is_read_from_torch() {
        assert!(imp::grad_enabled());
        assert!(!tch::no_grad(imp::grad_enabled));
        assert!(imp::grad_enabled());
    }
}
