//! Who this process is: its rank among all ranks, and its place on its node. Read from the
//! environment that torchrun, SLURM or our own launcher sets, else from the config.
use crate::config::Config;
use crate::error::{Error, Result};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankInfo {
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
    pub local_world_size: usize,
    pub master_addr: String,
    pub master_port: u16,
    /// The CPUs its launcher allotted to this rank alone (SLURM's `--cpus-per-task`, or the
    /// slice our launcher pins it to), which it shares with no other rank of its node; `None`
    /// when its node's ranks share their CPUs.
    pub own_cpus: Option<usize>,
}

/// Which launcher set the environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchedBy {
    /// torchrun, or our own launcher (both set RANK, WORLD_SIZE, LOCAL_RANK, ...).
    Torchrun,
    Slurm,
    /// Nothing: a plain process, which is rank 0 of a single-rank run (or the launcher itself).
    Nobody,
}

impl RankInfo {
    /// The rank of a plain single process.
    pub fn single(config: &Config) -> Self {
        Self {
            rank: 0,
            world_size: 1,
            local_rank: 0,
            local_world_size: 1,
            master_addr: config.master_addr.clone(),
            master_port: config.master_port,
            own_cpus: None,
        }
    }

    pub fn from_env(
        config: &Config,
        vars: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(Self, LaunchedBy)> {
        let vars = Vars(vars);
        let launcher = config.launcher.as_str();
        // The built-in launcher's own ranks carry torchrun's variables; under SLURM it still
        // starts them itself. A batch script or an salloc shell has SLURM's task variables too
        // (task 0 of the allocation's tasks) but is no task of a step: only srun makes one
        // (SLURM_STEP_ID), so `auto` reads them only there and otherwise starts the ranks.
        // With `builtin`, torchrun's variables are ours only in a process our launcher (or a
        // sweep) started: a pod's (Kubeflow sets RANK and WORLD_SIZE a node) are not a rank's.
        let started_by_us = (vars.0)(crate::ddp::lifeline::LAUNCHER_PID_ENV).is_some();
        let use_torchrun_vars = match launcher {
            "slurm" => false,
            "builtin" => started_by_us,
            _ => true,
        };
        let in_srun_step = (vars.0)("SLURM_STEP_ID").is_some();
        let use_slurm_vars = launcher == "slurm" || (launcher == "auto" && in_srun_step);
        // Read only where this launcher takes them (`builtin` in a pod passes a RANK over).
        let pair = |on: bool, names: [&str; 2]| -> Result<(Option<usize>, Option<usize>)> {
            match on {
                true => Ok((vars.number(names[0])?, vars.number(names[1])?)),
                false => Ok((None, None)),
            }
        };
        let torchrun_vars = pair(use_torchrun_vars, ["RANK", "WORLD_SIZE"])?;
        let slurm_vars = pair(use_slurm_vars, ["SLURM_PROCID", "SLURM_NTASKS"])?;
        let missing = |what: &str| {
            Error::Config(format!(
                "launcher={launcher}, but {what} are not set: start the job with that launcher, \
                 or use launcher=auto"
            ))
        };
        match launcher {
            "torchrun" if torchrun_vars.0.is_none() || torchrun_vars.1.is_none() => {
                return Err(missing("RANK and WORLD_SIZE"))
            }
            "slurm" if slurm_vars.0.is_none() || slurm_vars.1.is_none() => {
                return Err(missing("SLURM_PROCID and SLURM_NTASKS"))
            }
            _ => {}
        }
        // One of a pair without the other is no launcher's doing: a half-copied environment,
        // which would otherwise train as a single process beside the job's other ranks.
        let half_set =
            |(rank, size): (Option<usize>, Option<usize>), names: [&str; 2]| match (rank, size) {
                (Some(r), None) if r > 0 => Err(Error::Config(format!(
                    "{}={r} is set but {} is not: a launcher sets both; set both, or neither",
                    names[0], names[1]
                ))),
                (None, Some(n)) if n > 1 => Err(Error::Config(format!(
                    "{}={n} is set but {} is not: a launcher sets both; set both, or neither",
                    names[1], names[0]
                ))),
                _ => Ok(()),
            };
        if use_torchrun_vars {
            half_set(torchrun_vars, ["RANK", "WORLD_SIZE"])?;
        }
        if use_slurm_vars {
            half_set(slurm_vars, ["SLURM_PROCID", "SLURM_NTASKS"])?;
        }
        if let (true, (Some(rank), Some(world_size))) = (use_torchrun_vars, torchrun_vars) {
            let info = vars.torchrun(config, rank, world_size)?;
            return info.checked().map(|i| (i, LaunchedBy::Torchrun));
        }
        if let (true, (Some(rank), Some(world_size))) = (use_slurm_vars, slurm_vars) {
            let info = vars.slurm(config, rank, world_size)?;
            return info.checked().map(|i| (i, LaunchedBy::Slurm));
        }
        Ok((Self::single(config), LaunchedBy::Nobody))
    }

    fn checked(self) -> Result<Self> {
        if self.world_size == 0 {
            return Err(Error::Config(
                "world size 0: WORLD_SIZE (or SLURM_NTASKS) must be at least 1".into(),
            ));
        }
        if self.rank >= self.world_size {
            return Err(Error::Config(format!(
                "rank {} is not below world size {}: check RANK/WORLD_SIZE (or SLURM_PROCID/SLURM_NTASKS)",
                self.rank, self.world_size
            )));
        }
        // Two ranks of a node on one GPU, or a rank on another's, without a word.
        if self.local_world_size == 0
            || self.local_world_size > self.world_size
            || self.local_rank >= self.local_world_size
        {
            return Err(Error::Config(format!(
                "local rank {} of {} ranks on this node, in a world of {}: the local rank must be \
                 below the node's ranks, at least 1 and at most the world size; check \
                 LOCAL_RANK/LOCAL_WORLD_SIZE (or SLURM_LOCALID/SLURM_TASKS_PER_NODE)",
                self.local_rank, self.local_world_size, self.world_size
            )));
        }
        Ok(self)
    }

    pub fn is_root(&self) -> bool {
        self.rank == 0
    }
}

/// The environment a launcher set, read as rank settings.
struct Vars<'a>(&'a dyn Fn(&str) -> Option<String>);

impl Vars<'_> {
    fn number(&self, key: &str) -> Result<Option<usize>> {
        (self.0)(key)
            .map(|v| {
                v.trim().parse::<usize>().map_err(|_| {
                    Error::Config(format!(
                        "environment variable {key}={v} is not a non-negative integer"
                    ))
                })
            })
            .transpose()
    }

    /// MASTER_ADDR when set; set but empty is refused (c10d took it for unset).
    fn master_addr(&self) -> Result<Option<String>> {
        match (self.0)("MASTER_ADDR") {
            Some(addr) if addr.trim().is_empty() => Err(Error::Config(
                "MASTER_ADDR is set but empty: give node 0's address or host name, or unset it \
                 (master_addr then)"
                    .into(),
            )),
            addr => Ok(addr),
        }
    }

    fn port(&self, default: u16) -> Result<u16> {
        match (self.0)("MASTER_PORT") {
            Some(v) => v
                .trim()
                .parse()
                .ok()
                .filter(|&port: &u16| port != 0)
                .ok_or_else(|| {
                    Error::Config(format!("MASTER_PORT={v} is not a port number (1 to 65535)"))
                }),
            None => Ok(default),
        }
    }

    /// A rank of torchrun or of our own launcher.
    fn torchrun(&self, config: &Config, rank: usize, world_size: usize) -> Result<RankInfo> {
        let local_world_size = self.number("LOCAL_WORLD_SIZE")?.unwrap_or(world_size);
        Ok(RankInfo {
            rank,
            world_size,
            local_rank: self.number("LOCAL_RANK")?.unwrap_or(0),
            local_world_size,
            master_addr: self
                .master_addr()?
                .unwrap_or_else(|| config.master_addr.clone()),
            master_port: self.port(config.master_port)?,
            own_cpus: match config.cpu_affinity {
                true => self.pinned_cpus(local_world_size)?,
                false => None,
            },
        })
    }

    /// The CPUs our launcher pins this rank to (the rank pins itself as it joins the group):
    /// the slice's size, at most the rank's share of the cores this process may use (a
    /// container's CPU limit, which the slices do not know), so that every rank runs as many
    /// threads.
    fn pinned_cpus(&self, local_world_size: usize) -> Result<Option<usize>> {
        let Some(list) = crate::ddp::affinity::launcher_slice(self.0) else {
            return Ok(None);
        };
        let slice = crate::ddp::affinity::parse_list(&list)?.len();
        let share = crate::config::share_of_cores(None, crate::config::cores(), local_world_size);
        Ok(Some(slice.min(share).max(1)))
    }

    /// A SLURM task: the master is MASTER_ADDR, else the step's first node; its CPUs are its own
    /// with `--cpus-per-task`.
    fn slurm(&self, config: &Config, rank: usize, world_size: usize) -> Result<RankInfo> {
        let master_addr = match self.master_addr()? {
            Some(addr) => addr,
            None => slurm_first_node(self.0).unwrap_or_else(|| config.master_addr.clone()),
        };
        Ok(RankInfo {
            rank,
            world_size,
            local_rank: self.number("SLURM_LOCALID")?.unwrap_or(0),
            local_world_size: self.slurm_tasks_on_this_node()?,
            master_addr,
            master_port: self.port(config.master_port)?,
            own_cpus: self.number("SLURM_CPUS_PER_TASK")?.filter(|&n| n > 0),
        })
    }
}

impl Vars<'_> {
    /// How many tasks of this job step run on this node: this node's entry (`SLURM_NODEID`) of
    /// the step's tasks per node (`4(x2)`, or `3,2` when nodes differ), else of the job's; 1
    /// when SLURM says neither.
    fn slurm_tasks_on_this_node(&self) -> Result<usize> {
        let node = self.number("SLURM_NODEID")?.unwrap_or(0);
        for key in ["SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"] {
            if let Some(list) = (self.0)(key) {
                return tasks_on_node(&list, node).ok_or_else(|| {
                    Error::Config(format!(
                        "environment variable {key}={list} names no task count for node \
                         {node} (SLURM_NODEID)"
                    ))
                });
            }
        }
        Ok(1)
    }
}

/// Entry `node` of a SLURM tasks-per-node list: `2(x3),1` holds 2, 2, 2, 1.
fn tasks_on_node(list: &str, node: usize) -> Option<usize> {
    let mut first = 0;
    for entry in list.trim().split(',') {
        let (count, repeat) = match entry.split_once("(x") {
            Some((count, rest)) => (count, rest.strip_suffix(')')?.parse::<usize>().ok()?),
            None => (entry, 1),
        };
        let count = count.parse::<usize>().ok()?;
        if node < first + repeat {
            return Some(count);
        }
        first += repeat;
    }
    None
}

/// The first node of a SLURM step (`SLURM_STEP_NODELIST`), else of its job: a step on part of
/// the allocation (`srun -r2`, `--exclude`) need not run on the job's first node.
pub fn slurm_first_node(var: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    [
        "SLURM_STEP_NODELIST",
        "SLURM_JOB_NODELIST",
        "SLURM_NODELIST",
    ]
    .iter()
    .find_map(|key| var(key))
    .map(|list| first_host(&list))
}

/// The first host of a SLURM node list: `node[01-04,07],gpu2` → `node01`; each bracket of the
/// first entry gives its first number (`rack[1-2]n[3-4]-ib` → `rack1n3-ib`).
fn first_host(list: &str) -> String {
    let mut host = String::new();
    let mut chars = list.trim().chars();
    while let Some(c) = chars.next() {
        match c {
            ',' => break,
            '[' => {
                let range: String = chars.by_ref().take_while(|&c| c != ']').collect();
                host.push_str(range.split([',', '-']).next().unwrap_or(""));
            }
            c => host.push(c),
        }
    }
    host
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Source};
    use std::collections::HashMap;

    fn info(vars: &[(&str, &str)]) -> Result<(RankInfo, LaunchedBy)> {
        info_with(vars, "auto")
    }

    fn info_with(vars: &[(&str, &str)], launcher: &str) -> Result<(RankInfo, LaunchedBy)> {
        let config = Config::load(&Source {
            overrides: vec![format!("launcher={launcher}")],
            ..Source::default()
        })
        .unwrap();
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        RankInfo::from_env(&config, &|k| map.get(k).cloned())
    }

    #[test]
    fn torchrun_variables() {
        let (i, by) = info(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "10.1.2.3"),
            ("MASTER_PORT", "29500"),
            // The built-in launcher's ranks inside one SLURM task a node (its CPUs are theirs).
            ("SLURM_CPUS_PER_TASK", "32"),
        ])
        .unwrap();
        assert_eq!(by, LaunchedBy::Torchrun);
        assert_eq!(
            (i.rank, i.world_size, i.local_rank, i.local_world_size),
            (3, 4, 1, 2)
        );
        assert_eq!((i.master_addr.as_str(), i.master_port), ("10.1.2.3", 29500));
        assert_eq!(i.own_cpus, None, "these ranks share their node's CPUs");
    }

    /// A rank pinned by our launcher to a slice of CPUs (`cpu_affinity=true`, the default) has
    /// them to itself: its threads and environment workers are as many as the slice has, at
    /// most its share of the cores. A list our launcher did not give is not its own.
    #[test]
    fn a_rank_pinned_by_our_launcher_owns_its_slice() {
        let launcher = (crate::ddp::lifeline::LAUNCHER_PID_ENV, "1");
        let slice = (crate::ddp::affinity::CPUS_ENV, "4-6,9,9");
        let ranks = [
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_WORLD_SIZE", "2"),
        ];
        let own = |extra: &[(&str, &str)], overrides: &[&str]| {
            let config = Config::load(&Source {
                overrides: overrides.iter().map(|s| s.to_string()).collect(),
                ..Source::default()
            })
            .unwrap();
            let map: HashMap<String, String> = ranks
                .iter()
                .chain(extra)
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            RankInfo::from_env(&config, &|k| map.get(k).cloned()).map(|(info, _)| info.own_cpus)
        };
        let share = (crate::config::cores() / 2).max(1);
        assert_eq!(own(&[launcher, slice], &[]).unwrap(), Some(share.min(4)));
        assert_eq!(
            own(&[launcher, slice], &["cpu_affinity=false"]).unwrap(),
            None
        );
        assert_eq!(
            own(&[slice], &[]).unwrap(),
            None,
            "torchrun's ranks share it"
        );
        let bad = (crate::ddp::affinity::CPUS_ENV, "4-99999999999");
        let e = own(&[launcher, bad], &[]).unwrap_err().to_string();
        assert!(e.contains(crate::ddp::affinity::CPUS_ENV), "{e}");
    }

    #[test]
    fn slurm_variables() {
        let (i, by) = info(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NODEID", "1"),
            ("SLURM_STEP_TASKS_PER_NODE", "4(x2)"),
            // The job asked for 8 tasks on one node; the step runs 4 on each of 2.
            ("SLURM_TASKS_PER_NODE", "8"),
            ("SLURM_JOB_NODELIST", "gpu[05-08]"),
            ("SLURM_STEP_NODELIST", "gpu[07-08]"),
            ("SLURM_CPUS_PER_TASK", "8"),
        ])
        .unwrap();
        assert_eq!(by, LaunchedBy::Slurm);
        assert_eq!(
            (i.rank, i.world_size, i.local_rank, i.local_world_size),
            (5, 8, 1, 4)
        );
        assert_eq!((i.master_addr.as_str(), i.master_port), ("gpu07", 12355));
        assert_eq!(
            i.own_cpus,
            Some(8),
            "srun's --cpus-per-task are the task's own"
        );
    }

    #[test]
    fn plain_process_and_bad_values() {
        let (i, by) = info(&[]).unwrap();
        assert_eq!((by, i.rank, i.world_size), (LaunchedBy::Nobody, 0, 1));
        assert!(info(&[("RANK", "2"), ("WORLD_SIZE", "2")])
            .unwrap_err()
            .to_string()
            .contains("not below"));
        assert!(info(&[("RANK", "x"), ("WORLD_SIZE", "2")])
            .unwrap_err()
            .to_string()
            .contains("RANK=x"));
        // Variables a launcher does not take are not read: the built-in one in a pod.
        let pod = [("RANK", "x"), ("WORLD_SIZE", "2"), ("SLURM_NTASKS", "y")];
        let (i, by) = info_with(&pod, "builtin").unwrap();
        assert_eq!((by, i.rank, i.world_size), (LaunchedBy::Nobody, 0, 1));
        let rank_1 = |var: (&'static str, &'static str)| {
            info(&[("RANK", "1"), ("WORLD_SIZE", "2"), var])
                .unwrap_err()
                .to_string()
        };
        // c10d took an empty address for a missing one, and port 0 waited out dist_timeout.
        assert!(rank_1(("MASTER_ADDR", " ")).contains("MASTER_ADDR is set but empty"));
        assert!(rank_1(("LOCAL_RANK", "5")).contains("local rank 5 of 2 ranks on this node"));
        assert!(rank_1(("LOCAL_WORLD_SIZE", "0")).contains("local rank 0 of 0"));
        let alone = |vars: &[(&str, &str)]| info(vars).map(|(_, by)| by);
        assert!(alone(&[("RANK", "1")])
            .unwrap_err()
            .to_string()
            .contains("RANK=1 is set but WORLD_SIZE is not"));
        assert!(alone(&[("WORLD_SIZE", "2")])
            .unwrap_err()
            .to_string()
            .contains("WORLD_SIZE=2 is set but RANK is not"));
        // What says one process anyway is taken as it says.
        assert_eq!(alone(&[("WORLD_SIZE", "1")]).unwrap(), LaunchedBy::Nobody);
        assert_eq!(alone(&[("RANK", "0")]).unwrap(), LaunchedBy::Nobody);
        assert!(info(&[("RANK", "0"), ("WORLD_SIZE", "0")])
            .unwrap_err()
            .to_string()
            .contains("must be at least 1"));
        assert!(rank_1(("MASTER_PORT", "0")).contains("MASTER_PORT=0 is not a port number"));
    }

    #[test]
    fn the_launcher_setting_picks_the_variables() {
        let slurm = [
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
            ("SLURM_STEP_ID", "0"),
        ];
        // One SLURM task that starts its ranks itself.
        let (i, by) = info_with(&slurm, "builtin").unwrap();
        assert_eq!((by, i.world_size), (LaunchedBy::Nobody, 1));
        assert_eq!(info_with(&slurm, "auto").unwrap().1, LaunchedBy::Slurm);
        // A batch script or an salloc shell: the allocation's variables, but no srun step.
        let batch = [("SLURM_PROCID", "0"), ("SLURM_NTASKS", "8")];
        assert_eq!(info_with(&batch, "auto").unwrap().1, LaunchedBy::Nobody);
        assert_eq!(info_with(&batch, "slurm").unwrap().1, LaunchedBy::Slurm);
        let e = info_with(&slurm, "torchrun").unwrap_err().to_string();
        assert!(e.contains("launcher=torchrun") && e.contains("RANK"), "{e}");
        let e = info_with(&[], "slurm").unwrap_err().to_string();
        assert!(e.contains("SLURM_PROCID"), "{e}");
        // A pod's RANK and WORLD_SIZE (its node's, as Kubeflow sets them): the built-in
        // launcher starts the ranks itself; its own ranks read them.
        let pod = [("RANK", "1"), ("WORLD_SIZE", "2")];
        let (i, by) = info_with(&pod, "builtin").unwrap();
        assert_eq!((by, i.world_size), (LaunchedBy::Nobody, 1));
        assert_eq!(info_with(&pod, "auto").unwrap().1, LaunchedBy::Torchrun);
        let ours = [
            pod[0],
            pod[1],
            (crate::ddp::lifeline::LAUNCHER_PID_ENV, "1"),
        ];
        let (i, by) = info_with(&ours, "builtin").unwrap();
        assert_eq!((by, i.rank, i.world_size), (LaunchedBy::Torchrun, 1, 2));
    }

    #[test]
    fn slurm_tasks_per_node_lists() {
        assert_eq!(tasks_on_node("4(x2)", 1), Some(4));
        assert_eq!(tasks_on_node("2(x3),1", 2), Some(2));
        assert_eq!(tasks_on_node("2(x3),1", 3), Some(1));
        assert_eq!(tasks_on_node("3,2", 1), Some(2));
        assert_eq!(tasks_on_node("3,2", 2), None);
        assert_eq!(tasks_on_node("x", 0), None);
        let e = info(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_NODEID", "3"),
            ("SLURM_TASKS_PER_NODE", "1(x2)"),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("SLURM_TASKS_PER_NODE=1(x2)") && e.contains("node 3"),
            "{e}"
        );
    }

    #[test]
    fn first_host_of_node_lists() {
        assert_eq!(first_host("node[01-04,07],gpu2"), "node01");
        assert_eq!(first_host("gpu2,gpu3"), "gpu2");
        assert_eq!(first_host("single"), "single");
        assert_eq!(first_host("node[01-02]-ib,x"), "node01-ib");
        assert_eq!(first_host("rack[1-2]n[3-4]"), "rack1n3");
    }
}
