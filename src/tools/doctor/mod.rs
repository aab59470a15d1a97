//! `tdmpc2 doctor`: is this machine ready to train? One line per check, ✓ or ✗ with what to do;
//! `--world-size N` also forms a real N-rank process group here and all-reduces one tensor.
use std::path::{Path, PathBuf};

use pyo3::prelude::*;

use crate::config::{Config, Source};
use crate::error::{Error, Result};

mod dataset;
mod families;
mod group;
mod render;

/// The torch release the binary is built against (tch 0.24).
const TORCH_RELEASE: &str = "2.11";
/// Below this much free space in the run directory's filesystem, checkpoints may not fit.
const LOW_DISK_BYTES: u64 = 2 << 30;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mark {
    Pass,
    /// Worth knowing; a run can go on.
    Note,
    /// A run needs it: the doctor exits non-zero.
    Fail,
}

struct Report {
    failures: Vec<String>,
}

impl Report {
    fn line(&mut self, mark: Mark, name: &str, detail: impl AsRef<str>) {
        let symbol = match mark {
            Mark::Pass => "✓",
            Mark::Note => "!",
            Mark::Fail => "✗",
        };
        outln!("{symbol} {name}: {}", detail.as_ref());
        if mark == Mark::Fail {
            self.failures.push(name.to_string());
        }
    }
}

pub use group::rank_check;
pub use render::render_check;

/// Checks this machine for the run `source` describes; with `world_size`, also forms a process
/// group of that many ranks here.
pub fn run(source: &Source, world_size: Option<usize>) -> Result<()> {
    source.refuse_derived_settings()?;
    let config = Config::load(source)?;
    let most = crate::config::most_local_cpu_ranks();
    let world_size = match world_size {
        Some(n) if n == 0 || n > most => {
            return Err(Error::Config(format!(
                "--world-size {n}: the check starts that many ranks here; give 1 to {most}, as \
                 world_size allows on this machine's cores"
            )))
        }
        Some(n) => n,
        // This node's ranks.
        None => (config.world_size / config.nnodes.max(1)).max(1),
    };
    // The user's own choice of renderer, if any (this process loads dm_control for state).
    let chosen_renderer = std::env::var("MUJOCO_GL").ok();
    let mut report = Report { failures: vec![] };
    let torch_ok = check_python(&mut report);
    check_gpus(&mut report, torch_ok);
    check_device(&mut report, &config, world_size);
    let mut resolved = None;
    if torch_ok {
        families::check_dm_control(&mut report, &config);
        families::check_families(&mut report, &config);
        let renders = config.obs == "rgb" || config.save_video;
        render::check_rendering(&mut report, chosen_renderer.as_deref(), renders);
        resolved = check_task(&mut report, &config);
    }
    if let Some(dir) = &config.data_dir {
        dataset::check_dataset(&mut report, dir, resolved.as_ref());
    }
    check_port(&mut report, config.master_port);
    check_cpus(&mut report, world_size, config.num_threads);
    check_resume(&mut report, &config, resolved.as_ref());
    check_run_dir(&mut report, &config);
    check_disk(&mut report, &config.run_dir());
    if world_size > 1 && torch_ok {
        // As many as this machine's cores allow starting here (the cpus line says the rest).
        group::check_group(&mut report, world_size.min(most), world_size);
    }
    if report.failures.is_empty() {
        outln!("ready to train");
        Ok(())
    } else {
        Err(Error::Other(format!(
            "not ready: {} (see the ✗ lines above)",
            report.failures.join(", ")
        )))
    }
}

/// The venv, torch in it, and the libtorch and libpython this process loaded. Returns whether
/// torch imports.
fn check_python(report: &mut Report) -> bool {
    let site = embedded_python::site_packages();
    check_venv(report, &site);
    let probe = embedded_python::with_python(|py| {
        let sys = py.import("sys")?;
        let sysconfig = py.import("sysconfig")?;
        let python: String = sys.getattr("version")?.extract()?;
        let libdir: Option<String> = sysconfig
            .call_method1("get_config_var", ("LIBDIR",))?
            .extract()?;
        let torch = match py.import("torch") {
            Ok(torch) => torch,
            Err(e) => return Ok((python, libdir, Err(e.to_string()))),
        };
        let version: String = torch.getattr("__version__")?.extract()?;
        let file: String = torch.getattr("__file__")?.extract()?;
        let cuda: Option<String> = torch.getattr("version")?.getattr("cuda")?.extract()?;
        Ok((python, libdir, Ok((version, file, cuda))))
    });
    let (python, libdir, torch) = match probe {
        Ok(found) => found,
        Err(e) => {
            report.line(
                Mark::Fail,
                "python",
                format!("the embedded interpreter fails: {e}"),
            );
            return false;
        }
    };
    let loaded = loaded_libraries();
    let libpython = loaded.iter().find(|p| file_name_has(p, "libpython"));
    report.line(
        Mark::Pass,
        "libpython",
        format!(
            "Python {} from {}",
            python.split_whitespace().next().unwrap_or("?"),
            libpython
                .map(|p| p.display().to_string())
                .or(libdir)
                .unwrap_or_else(|| "?".into())
        ),
    );
    let (version, file, cuda) = match torch {
        Ok(found) => found,
        Err(e) => {
            report.line(
                Mark::Fail,
                "torch",
                format!(
                    "`import torch` fails in {} ({e}); install the pinned requirements with \
                     scripts/setup.sh, or point TDMPC2_VENV at a venv that has torch=={TORCH_RELEASE}.*",
                    site.display()
                ),
            );
            return false;
        }
    };
    check_torch_build(report, &version, &file, cuda, &loaded);
    true
}

/// `TDMPC2_VENV` (unless `TDMPC2_SITE_PACKAGES` overrides it) holds the site-packages the
/// embedded interpreter uses.
fn check_venv(report: &mut Report, site: &Path) {
    let venv = match std::env::var_os("TDMPC2_SITE_PACKAGES") {
        Some(_) => None,
        None => std::env::var("TDMPC2_VENV").ok(),
    };
    match venv {
        Some(venv) if !Path::new(&venv).join("lib").is_dir() || !site.starts_with(&venv) => {
            report.line(
                Mark::Fail,
                "venv",
                format!(
                    "TDMPC2_VENV={venv} holds no lib/python3.*/site-packages (the embedded \
                     interpreter looks for {}); point TDMPC2_VENV at the venv \
                     scripts/setup.sh made, or unset it",
                    site.display()
                ),
            );
        }
        _ if site.is_dir() => report.line(
            Mark::Pass,
            "venv",
            format!("site-packages {}", site.display()),
        ),
        _ => report.line(
            Mark::Fail,
            "venv",
            format!(
                "site-packages {} does not exist; run scripts/setup.sh, or set TDMPC2_VENV",
                site.display()
            ),
        ),
    }
}

/// torch's version against the one this binary is built for, and the libtorch this process
/// loaded against the venv's.
fn check_torch_build(
    report: &mut Report,
    version: &str,
    file: &str,
    cuda: Option<String>,
    loaded: &[PathBuf],
) {
    let build = cuda.map_or("a CPU-only build".to_string(), |c| {
        format!("CUDA {c} build")
    });
    if version.starts_with(&format!("{TORCH_RELEASE}.")) {
        report.line(Mark::Pass, "torch", format!("{version}, {build}, {file}"));
    } else {
        report.line(
            Mark::Fail,
            "torch",
            format!(
                "{version} in the venv, but this binary is built for torch {TORCH_RELEASE} (tch \
                 0.24); install torch=={TORCH_RELEASE}.0 (scripts/setup.sh)"
            ),
        );
    }
    let torch_lib = Path::new(&file).parent().map(|d| d.join("lib"));
    match loaded.iter().find(|p| file_name_has(p, "libtorch_cpu")) {
        Some(lib) if torch_lib.as_ref().is_some_and(|dir| lib.starts_with(dir)) => {
            report.line(Mark::Pass, "libtorch", lib.display().to_string())
        }
        Some(lib) => report.line(
            Mark::Fail,
            "libtorch",
            format!(
                "this process loaded {} but the venv's torch is {}: two libtorch copies crash; \
                 rebuild with that venv first on PATH (source scripts/env.sh)",
                lib.display(),
                file
            ),
        ),
        None => report.line(
            Mark::Note,
            "libtorch",
            "not found among the loaded libraries",
        ),
    }
}

/// The shared libraries mapped into this process.
fn loaded_libraries() -> Vec<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut libs: Vec<PathBuf> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| p.contains(".so"))
        .map(PathBuf::from)
        .collect();
    libs.dedup();
    libs
}

fn file_name_has(path: &Path, stem: &str) -> bool {
    path.file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with(stem))
}

/// The device each of this node's ranks would take, by the rule a rank follows: a setting it
/// cannot have (device=cuda without a GPU, more ranks than GPUs) fails as the run would.
fn check_device(report: &mut Report, config: &Config, local_ranks: usize) {
    let share_gpus = config.dist_backend == "gloo";
    let devices: Result<Vec<tch::Device>> = (0..local_ranks)
        .map(|local_rank| {
            let rank = crate::ddp::RankInfo {
                rank: local_rank,
                world_size: local_ranks,
                local_rank,
                local_world_size: local_ranks,
                ..crate::ddp::RankInfo::single(config)
            };
            crate::device::select(&config.device, &rank, share_gpus)
        })
        .collect();
    match config.check_backend().and(devices) {
        Ok(devices) => {
            let names: Vec<String> = devices
                .iter()
                .map(|device| match device {
                    tch::Device::Cuda(index) => format!("cuda:{index}"),
                    _ => "cpu".into(),
                })
                .collect();
            report.line(
                Mark::Pass,
                "device",
                format!("device={}: rank → {}", config.device, names.join(", ")),
            );
        }
        Err(e) => report.line(
            Mark::Fail,
            "device",
            e.to_string().trim_start_matches("config error: "),
        ),
    }
}

/// GPUs and the CUDA versions of the driver and of the wheel; NCCL. Informational: a run on
/// the CPU needs none of it.
fn check_gpus(report: &mut Report, torch_ok: bool) {
    let count = tch::Cuda::device_count();
    if !torch_ok {
        report.line(
            Mark::Note,
            "gpus",
            format!("{count} visible (torch not importable, no more checks)"),
        );
        return;
    }
    let probe = embedded_python::with_python(|py| {
        let torch = py.import("torch")?;
        let cuda = torch.getattr("cuda")?;
        let available: bool = cuda.call_method0("is_available")?.extract()?;
        let wheel: Option<String> = torch.getattr("version")?.getattr("cuda")?.extract()?;
        // The driver's CUDA version as an integer (12040 is 12.4); absent without a driver.
        let driver: Option<i64> = torch
            .getattr("_C")?
            .call_method0("_cuda_getDriverVersion")
            .and_then(|v| v.extract())
            .ok();
        let dist = py.import("torch.distributed")?;
        let nccl: bool = dist.call_method0("is_nccl_available")?.extract()?;
        let gloo: bool = dist.call_method0("is_gloo_available")?.extract()?;
        Ok((available, wheel, driver, nccl, gloo))
    });
    let Ok((available, wheel, driver, nccl, gloo)) = probe else {
        report.line(Mark::Note, "gpus", format!("{count} visible to libtorch"));
        return;
    };
    let driver = driver
        .filter(|v| *v > 0)
        .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10));
    match (count, &wheel, &driver) {
        (0, None, _) => report.line(Mark::Note, "gpus", "none: the CPU wheel of torch (device=cpu)"),
        (0, Some(w), None) => report.line(
            Mark::Note,
            "gpus",
            format!("none visible (no NVIDIA driver); the wheel is built for CUDA {w}; runs use the CPU"),
        ),
        (0, Some(w), Some(d)) => report.line(
            Mark::Note,
            "gpus",
            format!(
                "none usable: driver CUDA {d}, wheel CUDA {w}; a driver older than the wheel's \
                 CUDA cannot run it (update the driver, or install a torch wheel for CUDA {d}); \
                 check CUDA_VISIBLE_DEVICES"
            ),
        ),
        (n, w, d) => report.line(
            if available { Mark::Pass } else { Mark::Note },
            "gpus",
            format!(
                "{n} visible, driver CUDA {}, wheel CUDA {}",
                d.as_deref().unwrap_or("?"),
                w.as_deref().unwrap_or("?")
            ),
        ),
    }
    let backends = format!("gloo {}, nccl {}", yes(gloo), yes(nccl));
    report.line(
        if gloo { Mark::Pass } else { Mark::Fail },
        "collectives",
        if gloo {
            backends
        } else {
            format!("{backends}; multi-rank runs need gloo: reinstall torch (scripts/setup.sh)")
        },
    );
}

fn yes(b: bool) -> &'static str {
    if b {
        "available"
    } else {
        "missing"
    }
}

/// dm_control imports and one task resets and steps.
fn check_port(report: &mut Report, port: u16) {
    match std::net::TcpListener::bind(("0.0.0.0", port)) {
        Ok(_) => report.line(Mark::Pass, "master_port", format!("{port} is free")),
        Err(e) => report.line(
            Mark::Note,
            "master_port",
            format!("{port} is taken ({e}); multi-rank runs need master_port=<a free port>"),
        ),
    }
}

fn check_cpus(report: &mut Report, world_size: usize, num_threads: Option<usize>) {
    let cores = crate::device::cores();
    let threads = crate::device::threads(num_threads, world_size);
    let wanted = threads * world_size;
    let detail = format!("{cores} cores for {world_size} rank(s) × {threads} thread(s)");
    let advice = match threads {
        1 => format!("run at most {cores} rank(s) on this machine"),
        _ => format!("set num_threads={}", (cores / world_size).max(1)),
    };
    if wanted <= cores {
        report.line(Mark::Pass, "cpus", detail);
    } else {
        report.line(
            Mark::Note,
            "cpus",
            format!("{detail}: oversubscribed, ranks will slow each other; {advice}"),
        );
    }
}

/// The run's task (each of a multitask run's) is made and the settings resolve against it,
/// as `train` does first.
/// Returns the config resolved against its tasks, when they are made.
fn check_task(report: &mut Report, config: &Config) -> Option<Config> {
    let resolved = || -> Result<(Config, String)> {
        let mut config = config.clone();
        config.resolve_by_making_tasks(config.env_options(0)?)?;
        config.check_training_fits()?;
        let detail = match config.multitask() {
            true => format!(
                "its {} tasks are made and the settings resolve",
                config.tasks()?.len()
            ),
            false => format!("{} is made and the settings resolve", config.task),
        };
        Ok((config, detail))
    };
    match resolved() {
        Ok((config, detail)) => {
            report.line(Mark::Pass, "task", detail);
            Some(config)
        }
        Err(e) => {
            let message = e.to_string();
            let message = message.trim_start_matches("config error: ");
            report.line(Mark::Fail, "task", message);
            None
        }
    }
}

/// The checkpoint a `resume` setting names (nothing to say for a fresh run).
fn check_resume(report: &mut Report, config: &Config, resolved: Option<&Config>) {
    if let Err(e) = crate::trainer::run_dir::refuse_a_checkpoint_to_start_from(config) {
        let why = e.to_string();
        report.line(
            Mark::Fail,
            "checkpoint",
            why.trim_start_matches("config error: "),
        );
    }
    if !crate::checkpoint::resumes(config.resume.as_deref()) {
        return;
    }
    let source = crate::checkpoint::resume_source_of(config);
    // A checkpoint train would refuse for these settings (another task, past steps), or as
    // incomplete or damaged.
    let source = source.and_then(|dir| crate::checkpoint::check_resume_source(config).map(|_| dir));
    let source = source.and_then(|dir| match &dir {
        Some(found) => crate::checkpoint::verify_checkpoint(found).map(|()| dir),
        None => Ok(dir),
    });
    // Its model against the one these settings build, where the task resolved.
    let source = source.and_then(|dir| match (&dir, resolved) {
        (Some(found), Some(resolved)) => {
            crate::checkpoint::check_model_fits(resolved, found).map(|()| dir)
        }
        _ => Ok(dir),
    });
    match source {
        Ok(Some(dir)) => report.line(Mark::Pass, "resume", format!("from {}", dir.display())),
        Ok(None) => report.line(Mark::Pass, "resume", "no checkpoint yet: a fresh run"),
        Err(Error::Config(why)) => report.line(Mark::Fail, "resume", why),
        Err(e) => report.line(Mark::Fail, "resume", e.to_string()),
    }
}

/// The run directory can be made here (a directory is made and removed beside where it would
/// go, never in it), and holds no run that `train` would refuse to start on.
fn check_run_dir(report: &mut Report, config: &Config) {
    let run_dir = config.run_dir();
    if let Err(Error::Config(why)) = crate::trainer::run_dir::refuse_a_used_run_dir(config) {
        return report.line(Mark::Fail, "run_dir", why);
    }
    let mut existing = run_dir.clone();
    while !existing.exists() && existing.pop() {}
    if existing.as_os_str().is_empty() {
        existing = ".".into();
    }
    let probe = existing.join(format!(".tdmpc2-doctor-{}", std::process::id()));
    let made = std::fs::create_dir(&probe).and_then(|()| std::fs::remove_dir(&probe));
    match made {
        Ok(()) => report.line(
            Mark::Pass,
            "run_dir",
            format!("{} can be made", run_dir.display()),
        ),
        Err(e) => report.line(
            Mark::Fail,
            "run_dir",
            format!(
                "run_dir={} cannot be made: {} takes no directory ({e})",
                run_dir.display(),
                existing.display()
            ),
        ),
    }
}

fn check_disk(report: &mut Report, run_dir: &Path) {
    match crate::checkpoint::disk::free_bytes(run_dir) {
        Ok((_, free)) => {
            let gib = free as f64 / (1u64 << 30) as f64;
            let detail = format!("{gib:.1} GiB free for {}", run_dir.display());
            if free >= LOW_DISK_BYTES {
                report.line(Mark::Pass, "disk", detail)
            } else {
                report.line(
                    Mark::Note,
                    "disk",
                    format!("{detail}: checkpoints may not fit; free space or set run_dir"),
                )
            }
        }
        Err(e) => report.line(
            Mark::Note,
            "disk",
            format!("cannot read free space for {}: {e}", run_dir.display()),
        ),
    }
}
