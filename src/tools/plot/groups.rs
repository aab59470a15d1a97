//! Runs grouped as the seeds of one configuration, and what names each group in a legend.
use std::path::{Path, PathBuf};

use super::curves;

/// Indices of the runs, grouped: runs whose config.yaml match apart from seed and run_dir share
/// a group; a run without a config.yaml stands alone.
pub(super) fn group_by_config(runs: &[PathBuf]) -> Vec<Vec<usize>> {
    let configs: Vec<_> = runs
        .iter()
        .map(|r| curves::config_without_seed(r))
        .collect();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, config) in configs.iter().enumerate() {
        let same = groups.iter_mut().find(|g| {
            let first = &configs[g[0]];
            config.is_some() && first == config
        });
        match same {
            Some(group) => group.push(i),
            None => groups.push(vec![i]),
        }
    }
    groups
}

/// What tells the groups apart: the settings whose values differ between them, else the run
/// directory's name.
pub(super) fn group_labels(runs: &[PathBuf], groups: &[Vec<usize>]) -> Vec<String> {
    let configs: Vec<_> = groups
        .iter()
        .map(|g| curves::config_without_seed(&runs[g[0]]))
        .collect();
    let differing: Vec<String> = match configs
        .iter()
        .map(Option::as_ref)
        .collect::<Option<Vec<_>>>()
    {
        Some(all) if all.len() > 1 => {
            let mut keys: Vec<String> = all
                .iter()
                .flat_map(|c| c.keys().filter_map(|k| k.as_str().map(str::to_owned)))
                .collect();
            keys.sort();
            keys.dedup();
            keys.retain(|k| {
                all.iter()
                    .any(|c| c.get(k.as_str()) != all[0].get(k.as_str()))
            });
            keys
        }
        _ => vec![],
    };
    let named = |config: &serde_yaml_ng::Mapping, keys: usize| {
        differing
            .iter()
            .take(keys)
            .map(|k| format!("{k}={}", yaml_scalar(config.get(k.as_str()))))
            .collect::<Vec<_>>()
            .join(" ")
    };
    // Three settings name a group, unless two groups would read alike: then all of them.
    let short: std::collections::HashSet<String> =
        configs.iter().flatten().map(|c| named(c, 3)).collect();
    let keys = match short.len() == configs.len() {
        true => 3,
        false => differing.len(),
    };
    groups
        .iter()
        .zip(&configs)
        .map(|(group, config)| {
            let name = match (config, differing.is_empty()) {
                (Some(config), false) => named(config, keys),
                _ if group.len() > 1 => {
                    // As the folders are: `1 2` given in their sweep's folder, or `../1`.
                    let whole = |run: &PathBuf| {
                        run.canonicalize()
                            .or_else(|_| std::path::absolute(run))
                            .unwrap_or_else(|_| run.clone())
                    };
                    let folders: Vec<PathBuf> = group.iter().map(|&i| whole(&runs[i])).collect();
                    let common = common_ancestor(folders.iter().map(PathBuf::as_path));
                    match common.file_name() {
                        Some(_) => short_name(&common),
                        // Seeds with no folder of their own in common: the first, and more.
                        None => format!("{}, …", short_name(&runs[group[0]])),
                    }
                }
                _ => short_name(&runs[group[0]]),
            };
            match group.len() {
                1 => name,
                n => format!("{name} ({n} seeds)"),
            }
        })
        .collect()
}

fn yaml_scalar(value: Option<&serde_yaml_ng::Value>) -> String {
    match value {
        None | Some(serde_yaml_ng::Value::Null) => "null".into(),
        Some(serde_yaml_ng::Value::String(s)) => s.clone(),
        Some(other) => serde_yaml_ng::to_string(other)
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
    }
}

/// The deepest directory holding all of `runs` (the sweep or experiment of a seed group).
fn common_ancestor<'a>(mut runs: impl Iterator<Item = &'a Path>) -> PathBuf {
    let mut common = runs.next().map(Path::to_path_buf).unwrap_or_default();
    for run in runs {
        while !run.starts_with(&common) && common.pop() {}
    }
    common
}

/// The last two components of a run directory (`<exp_name>/<seed>` in the default layout).
fn short_name(run: &Path) -> String {
    let run = if run.is_file() {
        run.parent().unwrap_or(run)
    } else {
        run
    };
    // `.`, `..` (or a file in the working directory): the folder they are.
    let run = match run.file_name() {
        Some(_) => run.to_path_buf(),
        None if run.as_os_str().is_empty() => Path::new(".").canonicalize().unwrap_or_default(),
        None => run.canonicalize().unwrap_or_else(|_| run.to_path_buf()),
    };
    let parts: Vec<_> = run
        .components()
        .filter(|c| matches!(c, std::path::Component::Normal(_)))
        .rev()
        .take(2)
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    parts.into_iter().rev().collect::<Vec<_>>().join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_group_and_groups_are_named_by_what_differs() {
        let dir = tempfile::tempdir().unwrap();
        // b was written by a version with a field more (null) and another derived value.
        let runs: Vec<PathBuf> = [("a", 1, 3, ""), ("b", 2, 3, "new: null\nobs_shapes: [3]\n")]
            .into_iter()
            .chain([("c", 1, 5, "")])
            .map(|(name, seed, horizon, more)| {
                let run = dir.path().join("sweep").join(name);
                std::fs::create_dir_all(&run).unwrap();
                let config =
                    format!("task: x\nseed: {seed}\nhorizon: {horizon}\nrun_dir: {name}\n{more}");
                std::fs::write(run.join("config.yaml"), config).unwrap();
                run
            })
            .collect();
        let groups = group_by_config(&runs);
        assert_eq!(groups, [vec![0, 1], vec![2]]);
        assert_eq!(
            group_labels(&runs, &groups),
            ["horizon=3 (2 seeds)", "horizon=5"]
        );
        let seeds = &[vec![0, 1]];
        assert_eq!(
            group_labels(&runs, seeds),
            ["<tmp>/sweep (2 seeds)"
                .replace("<tmp>", &dir.path().file_name().unwrap().to_string_lossy())]
        );
        // A folder spelled through `..` is the folder it is.
        let roundabout = [runs[0].clone(), runs[0].join("..").join("b")];
        assert_eq!(group_labels(&roundabout, seeds), group_labels(&runs, seeds));
        // Seeds with no folder in common are named by the first.
        let apart = [PathBuf::from("/a"), PathBuf::from("/b")];
        assert_eq!(group_labels(&apart, seeds), ["a, … (2 seeds)"]);
        let here = std::env::current_dir().unwrap();
        let named = |path: &Path| path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(short_name(Path::new(".")).ends_with(&named(&here)));
        assert!(short_name(Path::new("..")).ends_with(&named(here.parent().unwrap())));
    }

    /// Groups told apart only by a fourth setting are named by every setting that differs.
    #[test]
    fn groups_alike_in_three_settings_are_named_by_all() {
        let dir = tempfile::tempdir().unwrap();
        let runs: Vec<PathBuf> = [(1, 1), (1, 2), (2, 1)]
            .into_iter()
            .enumerate()
            .map(|(i, (a, z))| {
                let run = dir.path().join(i.to_string());
                std::fs::create_dir_all(&run).unwrap();
                let config = format!("a_x: {a}\nb_x: {a}\nc_x: {a}\nz: {z}\nseed: 1\n");
                std::fs::write(run.join("config.yaml"), config).unwrap();
                run
            })
            .collect();
        let groups = group_by_config(&runs);
        assert_eq!(
            group_labels(&runs, &groups),
            [
                "a_x=1 b_x=1 c_x=1 z=1",
                "a_x=1 b_x=1 c_x=1 z=2",
                "a_x=2 b_x=2 c_x=2 z=1"
            ]
        );
    }
}
