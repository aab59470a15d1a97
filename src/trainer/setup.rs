//! A rank's place before training: its device and threads, then the process group, then its
//! CPUs (after the group: its communication threads, already started, keep every CPU).
use tch::Device;

use crate::config::Config;
use crate::ddp::{affinity, GroupSettings, ProcessGroup, RankInfo};
use crate::error::Result;

pub(super) fn join_group(config: &Config, rank: &RankInfo) -> Result<(Device, ProcessGroup)> {
    let device = crate::device::select(&config.device, rank, config.dist_backend == "gloo")?;
    tch::set_num_threads(crate::device::threads(config.num_threads, rank.local_world_size) as i32);
    crate::device::set_tf32(device, config.tf32)?;
    let (group, backend) = GroupSettings::from_config(config).join(rank.clone(), device)?;
    let pinned = match config.cpu_affinity {
        true => affinity::apply_from_env()?,
        false => None,
    };
    if group.rank() == 0 {
        if let Some(cpus) = pinned {
            eprintln!("rank 0 pinned to CPUs {}", affinity::format_list(&cpus));
        }
        if group.is_real() {
            eprintln!("{}", ProcessGroup::describe(backend));
        }
        if let Some(line) = crate::device::compile_note(device, config.compile) {
            eprintln!("{line}");
        }
    }
    Ok((device, group))
}
