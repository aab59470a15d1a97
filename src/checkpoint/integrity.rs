//! Exact checksums: crc32c of the bytes of every part of the learner state, and of each file of
//! a checkpoint. Bytes, not sums of values, so the result is the same whatever the thread count,
//! device or world size that computes it.
use std::path::Path;

use tch::{Device, Tensor};

use crate::error::{Error, Result};
use crate::learner::Learner;

/// Elements copied to the host at a time, so a large model's hash needs little extra memory.
const CHUNK: i64 = 1 << 22;

/// Named crc32c values, in a fixed order.
pub type Parts = Vec<(&'static str, u32)>;

/// The parts of the learner state that must be identical on all ranks after an optimiser step
/// (parameters, target Qs, both optimisers' moments and steps, the Q scale), each with the
/// crc32c of its bytes, in a fixed order.
pub fn learner_parts(learner: &Learner) -> Parts {
    let model = learner.model();
    let updater = learner.updater();
    let (m, p) = (updater.model_optim.state(), updater.policy_optim.state());
    let tensors = [
        ("model_params", &model.model_params.flat),
        ("policy_params", &model.policy_params.flat),
        ("target_params", &model.target_params.flat),
        ("model_optim.exp_avg", &m.exp_avg),
        ("model_optim.exp_avg_sq", &m.exp_avg_sq),
        ("policy_optim.exp_avg", &p.exp_avg),
        ("policy_optim.exp_avg_sq", &p.exp_avg_sq),
        ("scale", updater.scale.value()),
    ];
    let mut parts: Parts = tensors
        .into_iter()
        .map(|(name, t)| (name, tensor_crc(t)))
        .collect();
    if let Some(carried) = updater.carried_task_grad(model) {
        parts.push(("carried_task_grad", tensor_crc(&carried)));
    }
    let mut steps = m.step.to_le_bytes().to_vec();
    steps.extend(p.step.to_le_bytes());
    parts.push(("optim_steps", crc32c::crc32c(&steps)));
    parts
}

/// One number for all the parts: the crc32c of their crcs in order.
pub fn combine(parts: &[(&str, u32)]) -> u32 {
    parts.iter().fold(0, |crc, (_, part)| {
        crc32c::crc32c_append(crc, &part.to_le_bytes())
    })
}

/// crc32c of a tensor's shape and the bytes of its elements in row-major order.
fn tensor_crc(tensor: &Tensor) -> u32 {
    let mut crc = 0;
    for d in tensor.size() {
        crc = crc32c::crc32c_append(crc, &d.to_le_bytes());
    }
    let flat = tensor.detach().reshape([-1]);
    let n = flat.numel() as i64;
    let elt = flat.kind().elt_size_in_bytes();
    let mut start = 0;
    while start < n {
        let len = CHUNK.min(n - start);
        let chunk = flat
            .narrow(0, start, len)
            .to_device(Device::Cpu)
            .contiguous();
        let mut bytes = vec![0u8; len as usize * elt];
        chunk.copy_data_u8(&mut bytes, len as usize);
        crc = crc32c::crc32c_append(crc, &bytes);
        start += len;
    }
    crc
}

/// crc32c of a file's bytes.
pub fn file_crc(path: &Path) -> Result<u32> {
    use std::io::Read;
    let mut file =
        std::fs::File::open(path).map_err(|e| Error::io(format!("read {}", path.display()), e))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut crc = 0;
    loop {
        let n = file
            .read(&mut buf)
            .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
        if n == 0 {
            return Ok(crc);
        }
        crc = crc32c::crc32c_append(crc, &buf[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tensor_hash_sees_every_byte_and_the_shape() {
        let a = Tensor::arange(10_000_000, (tch::Kind::Float, Device::Cpu));
        let base = tensor_crc(&a);
        assert_eq!(base, tensor_crc(&a.copy()), "same bytes, same hash");
        let b = a.copy();
        let _ = b.narrow(0, 9_999_999, 1).fill_(-1.0);
        assert_ne!(
            base,
            tensor_crc(&b),
            "the last element of the last chunk counts"
        );
        assert_ne!(base, tensor_crc(&a.view([1000, 10000])), "the shape counts");
        // A non-contiguous view hashes as its row-major copy.
        let t = a.view([1000, 10000]).transpose(0, 1);
        assert_eq!(tensor_crc(&t), tensor_crc(&t.contiguous()));
    }
}
