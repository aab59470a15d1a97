//! Values each rank keeps of its own (episode counts per environment, the planner's warm start):
//! gathered into one row per rank when a checkpoint is saved, and each rank's row sent back by
//! rank 0, which alone reads the checkpoint, on resume.
use tch::{Kind, Tensor};

use crate::ddp::ProcessGroup;
use crate::error::Result;

/// Every rank's `local` (all ranks have as many values), as rows (world size, values).
pub(super) fn gather(local: &Tensor, group: &ProcessGroup) -> Result<Tensor> {
    let all = group.all_gather(local)?;
    Ok(all.reshape([group.world_size() as i64, -1]))
}

/// This rank's row of `saved` (world size, `len`) as `kind`, where rank 0 holds it; `None` on
/// every rank when rank 0's has another shape (another world size or number of values) or
/// there is none.
pub(super) fn share(
    saved: Option<&Tensor>,
    len: usize,
    kind: Kind,
    group: &ProcessGroup,
) -> Result<Option<Tensor>> {
    let world = group.world_size() as i64;
    let fitting = saved.filter(|rows| rows.size() == [world, len as i64]);
    let mut fits = Tensor::from_slice(&[i64::from(fitting.is_some())]);
    group.broadcast_from_root(&mut fits)?;
    if fits.int64_value(&[0]) == 0 {
        return Ok(None);
    }
    let mut rows = match fitting {
        Some(rows) => rows.to_kind(kind).contiguous(),
        None => Tensor::zeros([world, len as i64], (kind, tch::Device::Cpu)),
    };
    group.broadcast_from_root(&mut rows)?;
    Ok(Some(rows.get(group.rank() as i64)))
}
