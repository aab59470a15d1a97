//! The tools around a run, through the real binary: `plot` on real runs, `train --multirun`,
//! `doctor`, `export` (with `import` back), and the GPU scripts' runs and summaries.
mod common;

use std::path::Path;
use std::process::{Command, Output};

/// The tiny settings with one thread per run: a Pendulum run in seconds.
fn tiny() -> Vec<&'static str> {
    [common::TINY, &["num_threads=1"]].concat()
}

fn tdmpc2(args: &[&str]) -> Output {
    Command::new(common::tdmpc2_bin())
        .args(args)
        .output()
        .expect("the tdmpc2 binary runs")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn train(run_dir: &Path, seed: &str) {
    let mut args = vec!["train", "steps=400", "eval_freq=200", seed];
    args.extend(tiny());
    let dir = format!("run_dir={}", run_dir.display());
    args.push(&dir);
    let out = tdmpc2(&args);
    assert!(out.status.success(), "training failed: {}", text(&out));
}

fn plot(args: &[&str]) -> Output {
    let mut all = vec!["plot"];
    all.extend_from_slice(args);
    tdmpc2(&all)
}

fn decode(png: &Path) -> image::RgbImage {
    image::open(png)
        .unwrap_or_else(|e| panic!("{} is a PNG: {e}", png.display()))
        .to_rgb8()
}

/// Pixels close to `rgb` (antialiasing blends the edges).
fn count_near(img: &image::RgbImage, rgb: [u8; 3]) -> usize {
    img.pixels()
        .filter(|p| (0..3).all(|c| (p.0[c] as i32 - rgb[c] as i32).abs() <= 6))
        .count()
}

#[test]
fn plot_draws_two_seeds_as_a_band_and_the_picture_follows_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    train(&a, "seed=1");
    train(&b, "seed=2");
    let (a_s, b_s) = (a.display().to_string(), b.display().to_string());

    let both = dir.path().join("both.png");
    let out = plot(&[
        &a_s,
        &b_s,
        "--out",
        both.to_str().unwrap(),
        "--width",
        "640",
        "--height",
        "400",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let img = decode(&both);
    assert_eq!(img.dimensions(), (640, 400));
    // The mean line (first colour) and the band around it (the same colour, faint on white).
    assert!(count_near(&img, [31, 119, 180]) > 100, "no mean line drawn");
    assert!(
        count_near(&img, [215, 231, 242]) > 100,
        "no band over the two seeds"
    );

    // The same runs as SVG: one series for both seeds. A link where the picture goes is
    // replaced by it, not written through.
    let svg = dir.path().join("both.svg");
    let linked = dir.path().join("someone-elses.txt");
    std::fs::write(&linked, "keep me").unwrap();
    std::os::unix::fs::symlink(&linked, &svg).unwrap();
    let out = plot(&[&a_s, &b_s, "--out", svg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(std::fs::read_to_string(&linked).unwrap(), "keep me");
    assert!(!svg.symlink_metadata().unwrap().is_symlink());
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(
        svg.starts_with("<svg") && svg.contains("(2 seeds)"),
        "{svg}"
    );

    // Against agent steps and wall time side by side, the official reference on the first only
    // (its results have no wall time).
    let reference = dir.path().join("walker-run.csv");
    std::fs::write(
        &reference,
        "step,reward,seed\n0,1,1\n1000,50,1\n0,2,2\n1000,60,2\n",
    )
    .unwrap();
    let axes = dir.path().join("axes.svg");
    let out = plot(&[
        &a_s,
        "--x",
        "both",
        "--reference",
        reference.to_str().unwrap(),
        "--out",
        axes.to_str().unwrap(),
        "--width",
        "640",
        "--height",
        "400",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("DMControl simulator steps, 2 an agent step")
            && text(&out).contains("the runs drawn trained on Pendulum-v1"),
        "{}",
        text(&out)
    );
    let axes = std::fs::read_to_string(&axes).unwrap();
    assert!(
        axes.contains("width=\"1280\""),
        "not two panels side by side"
    );
    assert!(axes.contains("agent steps") && axes.contains("wall time (s)"));
    assert!(axes.contains("against wall time"));
    assert_eq!(axes.matches("official TD-MPC2 (walker-run)").count(), 1);

    // Another data set (seed 1 alone, its rewards shifted) gives another picture.
    let shifted = dir.path().join("shifted");
    std::fs::create_dir(&shifted).unwrap();
    let metrics = std::fs::read_to_string(a.join("metrics.jsonl")).unwrap();
    let lines: Vec<String> = metrics
        .lines()
        .map(|l| {
            let mut r: serde_json::Value = serde_json::from_str(l).unwrap();
            r["episode_reward"] = (r["episode_reward"].as_f64().unwrap() * 0.5 + 100.0).into();
            r.to_string()
        })
        .collect();
    std::fs::write(shifted.join("metrics.jsonl"), lines.join("\n")).unwrap();
    let other = dir.path().join("other.png");
    let out = plot(&[
        &a_s,
        shifted.to_str().unwrap(),
        "--out",
        other.to_str().unwrap(),
        "--width",
        "640",
        "--height",
        "400",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let other = decode(&other);
    assert_eq!(other.dimensions(), (640, 400));
    let differing = img
        .pixels()
        .zip(other.pixels())
        .filter(|(p, q)| p != q)
        .count();
    assert!(differing > 1000, "only {differing} pixels differ");
}

#[test]
fn plot_says_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("metrics.jsonl"),
        "{\"phase\":\"eval\",\"step\":0,\"episode_reward\":1.0,\"q\":null}\n",
    )
    .unwrap();
    let sweep_summary = dir.path().join("sweep.csv");
    std::fs::write(&sweep_summary, "job,status\n").unwrap();
    let run = dir.path().to_str().unwrap();
    let summary = sweep_summary.to_str().unwrap();
    let cases: [(&[&str], &str); 10] = [
        (&[run, "--metric", "reward"], "available: episode_reward"),
        (
            &[run, "--metric", "q"],
            "logs it in no eval record as a finite number",
        ),
        (&[summary], "no run directory among 1 path(s) given"),
        (
            &[run, "--out", "/nonexistent/dir/c.png"],
            "the folder /nonexistent/dir does not exist",
        ),
        (&[run, "--out", "x.jpg"], "allowed: .png, .svg"),
        (&["/nonexistent/run"], "/nonexistent/run does not exist"),
        (
            &[run, "curves5.png"],
            "curves5.png does not exist (the figure to write? give it as --out curves5.png)",
        ),
        (
            &[run, "--phase", "train"],
            "has no train records yet, so no --metric episode_reward to draw",
        ),
        (
            &[
                run,
                "--reference",
                "/nonexistent.csv",
                "--out",
                "/tmp/x.png",
            ],
            "--reference /nonexistent.csv: cannot be read",
        ),
        (
            &[
                run,
                "--x",
                "elapsed_time",
                "--reference",
                "/nonexistent.csv",
            ],
            "use it with --x step or --x both",
        ),
    ];
    for (args, expected) in cases {
        let out = plot(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        let message = text(&out);
        assert!(message.contains(expected), "{args:?}: {message}");
        assert!(!message.contains("panicked"), "{message}");
    }
    // Values no plot can span (a foreign file): the plotting library looped forever on them.
    let huge = tempfile::tempdir().unwrap();
    std::fs::write(
        huge.path().join("metrics.jsonl"),
        "{\"phase\":\"eval\",\"step\":0,\"episode_reward\":-1e308}\n\
         {\"phase\":\"eval\",\"step\":1,\"episode_reward\":1e308}\n",
    )
    .unwrap();
    let png = huge.path().join("c.png");
    let out = plot(&[
        huge.path().to_str().unwrap(),
        "--out",
        png.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("values run from -1e308 to 1e308"),
        "{}",
        text(&out)
    );
    // A run evaluated once (just started) is a dot, not an empty chart; given twice, it is
    // still one run.
    let png = dir.path().join("one.png");
    let metrics = dir.path().join("metrics.jsonl");
    let out = plot(&[
        run,
        metrics.to_str().unwrap(),
        "--out",
        png.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("the same run as given before"),
        "{}",
        text(&out)
    );
    // The legend's stroke alone is about 40 pixels of the first colour.
    assert!(
        count_near(&decode(&png), [31, 119, 180]) > 70,
        "no dot drawn"
    );
}

#[test]
fn multirun_runs_every_combination_in_its_own_directory() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = format!("run_dir={}", dir.path().display());
    let mut args = vec![
        "train",
        "--multirun",
        "--jobs",
        "2",
        "steps=400",
        "seed=1,2",
        "horizon=2,3",
        &run_dir,
    ];
    args.extend(tiny());
    let out = tdmpc2(&args);
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    for (i, name) in [
        "0_seed=1_horizon=2",
        "1_seed=1_horizon=3",
        "2_seed=2_horizon=2",
        "3_seed=2_horizon=3",
    ]
    .iter()
    .enumerate()
    {
        let job = dir.path().join(name);
        assert!(job.join("metrics.jsonl").is_file(), "{name}: {log}");
        let config = std::fs::read_to_string(job.join("config.yaml")).unwrap();
        assert!(config.contains(&format!("seed: {}", 1 + i / 2)), "{config}");
        assert!(
            config.contains(&format!("horizon: {}", 2 + i % 2)),
            "{config}"
        );
        assert!(log.contains(&format!("[job {i}] ")), "{log}");
    }
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("sweep.json")).unwrap())
            .unwrap();
    let jobs = summary.as_array().unwrap();
    assert_eq!(jobs.len(), 4);
    for job in jobs {
        assert_eq!(job["status"], "ok", "{job}");
        assert!(job["episode_reward"].as_f64().is_some(), "{job}");
    }
    assert_eq!(jobs[3]["overrides"]["horizon"], "3");
    let csv = std::fs::read_to_string(dir.path().join("sweep.csv")).unwrap();
    assert_eq!(csv.lines().count(), 5, "{csv}");
    assert!(log.contains("seed=2 horizon=3"), "the summary table: {log}");

    // The same sweep again: its jobs' directories hold runs, refused before any job starts.
    let out = tdmpc2(&args);
    let log = text(&out);
    assert_eq!(out.status.code(), Some(2), "{log}");
    assert!(
        log.contains("already holds a run") && log.contains("no job was started"),
        "{log}"
    );
    // Another sweep into the same folder would replace this one's summary.
    let mut other = vec!["train", "--multirun", "steps=400", "seed=3,4", &run_dir];
    other.extend(tiny());
    let out = tdmpc2(&other);
    let log = text(&out);
    assert_eq!(out.status.code(), Some(2), "{log}");
    assert!(
        log.contains("holds the summary of another sweep (4 jobs, not these 2)"),
        "{log}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("sweep.csv")).unwrap(),
        csv
    );
    assert!(!log.contains("[job 0] "), "{log}");
}

#[test]
fn multirun_checks_every_combination_before_running_any() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = format!("run_dir={}", dir.path().display());
    let mut args = vec![
        "train",
        "--multirun",
        "steps=400",
        "seed=1,2",
        "horizon=2,-1",
        &run_dir,
    ];
    args.extend(tiny());
    let out = tdmpc2(&args);
    let log = text(&out);
    assert_eq!(out.status.code(), Some(2), "{log}");
    assert!(
        log.contains("job 1 (seed=1 horizon=-1)") && log.contains("horizon"),
        "{log}"
    );
    assert!(log.contains("no job was started"), "{log}");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "something ran: {log}"
    );

    // A run_dir that is a file takes no jobs' directories.
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"").unwrap();
    let run_dir = format!("run_dir={}", file.display());
    let mut args = vec!["train", "--multirun", "steps=400", "seed=1,2", &run_dir];
    args.extend(tiny());
    let out = tdmpc2(&args);
    let log = text(&out);
    assert_eq!(out.status.code(), Some(2), "{log}");
    assert!(
        log.contains("a-file: a file") && log.contains("no job was started"),
        "{log}"
    );
    assert!(!log.contains("[job 0]"), "{log}");
    std::fs::remove_file(&file).unwrap();

    // A multitask sweep resolves its tasks as `train` does; a task it cannot make is named.
    let out = tdmpc2(&[
        "train",
        "--multirun",
        "task=[Pendulum-v1,cartpole-swingup]",
        "seed=1,2",
        "--cfg",
        "job",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let out = tdmpc2(&[
        "train",
        "--multirun",
        "task=[Pendulum-v1,nosuch-task]",
        "seed=1,2",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("task 1 of 2 (nosuch-task) cannot be made"),
        "{}",
        text(&out)
    );

    let out = tdmpc2(&["train", "--multirun", "seed=1,2", "--jobs", "100000"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--jobs 100000"), "{}", text(&out));
}

fn doctor(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut command = Command::new(common::tdmpc2_bin());
    command
        .arg("doctor")
        .args(args)
        .env_remove("TDMPC2_SITE_PACKAGES");
    // The embedded interpreter finds a venv through a `python` on PATH: keep only the others,
    // so that the venv is what TDMPC2_VENV / TDMPC2_SITE_PACKAGES say.
    let path = std::env::var_os("PATH").unwrap_or_default();
    let outside_venvs = std::env::split_paths(&path).filter(|dir| {
        !dir.parent()
            .is_some_and(|venv| venv.join("pyvenv.cfg").is_file())
    });
    command.env("PATH", std::env::join_paths(outside_venvs).unwrap());
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("the tdmpc2 binary runs")
}

/// A family venv that is there but does not work (here: MyoSuite's pointed at Meta-World's)
/// fails the doctor only for a run that needs it.
#[test]
fn doctor_fails_a_broken_family_only_for_a_run_that_needs_it() {
    let metaworld = envs::Family::MetaWorld.venv();
    let myosuite = [("TDMPC2_VENV_MYOSUITE", metaworld.as_path())];
    let out = doctor(&["task=cartpole-swingup"], &myosuite);
    let log = text(&out);
    assert!(
        log.contains("! myosuite: not installed") && log.contains("has no myosuite"),
        "{log}"
    );
    // Whatever else this machine lacks, not that.
    let verdict = log
        .lines()
        .find(|l| l.contains("ready"))
        .unwrap_or_default();
    assert!(!verdict.contains("myosuite"), "{log}");
    let out = doctor(&["task=myo-reach"], &myosuite);
    let log = text(&out);
    assert!(log.contains("✗ myosuite: not installed"), "{log}");
    assert!(log.contains("not ready: myosuite"), "{log}");
}

/// What `train` would refuse at its start, the doctor names first: a task that cannot be made,
/// a `resume` path naming no checkpoint, a run directory that cannot be made, or one holding
/// checkpoints.
#[test]
fn doctor_names_a_task_and_a_run_dir_that_train_would_refuse() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let run_dir = format!("run_dir={}", file.join("run").display());
    let resume = format!("resume={}", dir.path().join("no-run").display());
    let out = doctor(
        &["task=nosuch", &run_dir, &resume, "checkpoint=/runs/x/1"],
        &[],
    );
    let log = text(&out);
    assert_eq!(out.status.code(), Some(1), "{log}");
    assert!(
        log.contains("✗ checkpoint: checkpoint=/runs/x/1 is read by eval and collect"),
        "{log}"
    );
    assert!(log.contains("✗ task: unknown task `nosuch`"), "{log}");
    assert!(
        log.contains(&format!("✗ resume: {resume}: not a checkpoint directory")),
        "{log}"
    );
    assert!(
        log.contains(&format!(
            "✗ run_dir: {run_dir} cannot be made: {} takes no directory (Not a directory",
            file.display()
        )),
        "{log}"
    );
    assert!(
        log.contains("not ready: task, checkpoint, resume, run_dir"),
        "{log}"
    );
    // A device the run could not take (no GPU here, or too few) fails as the run would.
    if !tch::Cuda::is_available() {
        let log = text(&doctor(&["device=cuda"], &[]));
        assert!(
            log.contains("✗ device: device=cuda with 1 local ranks, but 0 GPU(s)"),
            "{log}"
        );
        assert!(log.contains("not ready: device"), "{log}");
        let log = text(&doctor(&["dist_backend=nccl"], &[]));
        assert!(
            log.contains("✗ device: dist_backend=nccl needs a CUDA device"),
            "{log}"
        );
    }
    let out = doctor(&["task=[Pendulum-v1,nosuch-task]"], &[]);
    let log = text(&out);
    assert!(
        log.contains("✗ task: task=[Pendulum-v1,nosuch-task]: task 1 of 2 (nosuch-task)"),
        "{log}"
    );

    // The run's config file, as train reads it.
    std::fs::write(dir.path().join("mine.yaml"), "task: nosuch\n").unwrap();
    let config_path = dir.path().display().to_string();
    let out = doctor(
        &["--config-path", &config_path, "--config-name", "mine"],
        &[],
    );
    assert!(
        text(&out).contains("✗ task: unknown task `nosuch`"),
        "{}",
        text(&out)
    );
    let out = doctor(&["--config-name=nosuch"], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("nosuch"), "{}", text(&out));

    // A new run directory is made to see that it can be, and removed again.
    let new = dir.path().join("new/run");
    let out = doctor(&[&format!("run_dir={}", new.display())], &[]);
    assert!(text(&out).contains(&format!("✓ run_dir: {} can be made", new.display())));
    assert!(
        !dir.path().join("new").exists(),
        "the doctor leaves nothing behind"
    );
}

/// The doctor reads what `train` would refuse of a run directory's files: a checkpoint of
/// other sizes or whose bytes changed, and a folder of files no run wrote.
#[test]
fn doctor_names_a_damaged_checkpoint_and_a_folder_of_other_files() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    train(&run, "seed=1");
    let model = common::checkpoint(&run, 400).join("model.safetensors");
    // A model of other sizes than the checkpoint's (size 1), as a resume would find.
    let run_dir = format!("run_dir={}", run.display());
    let sized = [
        "task=Pendulum-v1",
        "steps=800",
        "resume=auto",
        "model_size=5",
        &run_dir,
    ];
    let log = text(&doctor(&sized, &[]));
    assert!(
        log.contains("✗ resume: checkpoint ") && log.contains("does not fit this model"),
        "{log}"
    );
    common::damage_middle(&model);
    let settings = [
        "task=Pendulum-v1".to_string(),
        "steps=800".into(),
        "resume=auto".into(),
        format!("run_dir={}", run.display()),
    ];
    let log = text(&doctor(&settings.each_ref().map(String::as_str), &[]));
    assert!(
        log.contains(&format!("✗ resume: {} is damaged", model.display())),
        "{log}"
    );

    let folder = dir.path().join("folder");
    std::fs::create_dir(&folder).unwrap();
    std::fs::write(folder.join("config.yaml"), "mine: 1\n").unwrap();
    let log = text(&doctor(&[&format!("run_dir={}", folder.display())], &[]));
    assert!(
        log.contains("holds config.yaml but no run recorded there"),
        "{log}"
    );
}

#[test]
fn doctor_passes_here_and_forms_a_two_rank_group() {
    let out = doctor(&["--world-size", "2"], &[]);
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    for line in [
        "✓ torch: 2.11",
        "✓ libtorch: ",
        "✓ dm_control: cartpole-swingup resets and steps",
        "✓ process group: 2 ranks over",
        "= 3 in",
        "✓ task: dog-run is made and the settings resolve",
        "✓ device: device=auto: rank → ",
        "✓ run_dir: ",
        "ready to train",
    ] {
        assert!(log.contains(line), "no '{line}' in:\n{log}");
    }
    assert!(!log.contains('✗'), "{log}");
    // Rendering (pixel observations) is timed where EGL works, and otherwise a note that says
    // what to install (state runs do not need it).
    let rendering = log
        .lines()
        .find(|l| l.contains(" rendering: "))
        .unwrap_or_else(|| panic!("no rendering line in:\n{log}"));
    if rendering.starts_with('✓') {
        assert!(
            rendering.contains("cartpole-swingup 64×64: first frame")
                && rendering.contains("frames/s"),
            "{rendering}"
        );
    } else {
        common::not_checked(&format!(
            "doctor's rendering check: MuJoCo renders no frame on this machine ({rendering})"
        ));
        assert!(
            rendering.starts_with("! rendering") && rendering.contains("libEGL"),
            "{rendering}"
        );
    }
}

#[test]
fn doctor_names_what_is_missing_and_fails() {
    let empty = tempfile::tempdir().unwrap();
    // A venv setting that points nowhere useful.
    let out = doctor(&[], &[("TDMPC2_VENV", empty.path())]);
    let log = text(&out);
    assert_eq!(out.status.code(), Some(1), "{log}");
    assert!(
        log.contains("✗ venv: TDMPC2_VENV=") && log.contains("holds no lib/python3"),
        "{log}"
    );
    assert!(log.contains("not ready: venv"), "{log}");
    // site-packages without torch: torch is missing, and so is everything that needs it.
    let out = doctor(&[], &[("TDMPC2_SITE_PACKAGES", empty.path())]);
    let log = text(&out);
    assert_eq!(out.status.code(), Some(1), "{log}");
    assert!(log.contains("✗ torch: `import torch` fails"), "{log}");
    assert!(
        log.contains("No module named 'torch'") && log.contains("scripts/setup.sh"),
        "{log}"
    );
    assert!(!log.contains("✓ dm_control"), "{log}");
    let out = doctor(&["--world-size", "0"], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

#[test]
fn multirun_reports_a_failed_job_and_runs_the_others() {
    let dir = tempfile::tempdir().unwrap();
    // Job 0's run directory cannot be created: a file is in the way.
    std::fs::write(dir.path().join("0_seed=1"), "in the way").unwrap();
    let run_dir = format!("run_dir={}", dir.path().display());
    let mut args = vec!["train", "--multirun", "steps=400", "seed=1,2", &run_dir];
    args.extend(tiny());
    let out = tdmpc2(&args);
    let log = text(&out);
    assert_eq!(out.status.code(), Some(1), "{log}");
    assert!(
        log.contains("1 of 2 jobs failed: job 0 (seed=1) failed (exit"),
        "{log}"
    );
    assert!(dir.path().join("1_seed=2/metrics.jsonl").is_file(), "{log}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("sweep.json")).unwrap())
            .unwrap();
    assert!(
        summary[0]["status"].as_str().unwrap().starts_with("failed"),
        "{summary}"
    );
    assert_eq!(summary[1]["status"], "ok", "{summary}");
}

/// A sweep of two seeds' two-rank jobs into `dir`, in a process group of its own, once job 0
/// trains (its first train record): the sweep, the rest of its stdout, and what it printed.
fn two_rank_sweep_training(
    dir: &Path,
) -> (
    std::process::Child,
    std::io::BufReader<std::process::ChildStdout>,
    String,
) {
    use std::os::unix::process::CommandExt;
    let run_dir = format!("run_dir={}", dir.display());
    let port = format!("master_port={}", common::free_port());
    let mut args = vec![
        "train",
        "--multirun",
        "steps=100000",
        "seed=1,2",
        "world_size=2",
        &port,
        &run_dir,
    ];
    args.extend(tiny());
    let mut sweep = Command::new(common::tdmpc2_bin())
        .args(&args)
        .process_group(0)
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(dir.join("sweep.stderr")).unwrap())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(sweep.stdout.take().unwrap());
    let mut seen = String::new();
    while !seen.lines().any(|line| line.starts_with("[job 0] train")) {
        let n = std::io::BufRead::read_line(&mut stdout, &mut seen).unwrap();
        assert!(n > 0, "the sweep ended early: {seen}");
    }
    (sweep, stdout, seen)
}

/// The launcher of the sweep's one running job, and its two ranks.
fn job_processes(sweep: &std::process::Child) -> (u32, Vec<u32>) {
    let launcher = common::children_of(sweep.id());
    assert_eq!(launcher.len(), 1, "one job at a time");
    let ranks = common::children_of(launcher[0]);
    assert_eq!(ranks.len(), 2, "the job's two ranks");
    (launcher[0], ranks)
}

/// A terminal's Ctrl-C (SIGINT to the sweep's whole process group) stops the sweep; its
/// two-rank job is asked once, so it stops with a checkpoint instead of being killed, also
/// when a wrapper passes the stop on as SIGTERM a moment later (the same request, not a second).
#[test]
fn a_stopped_sweep_stops_its_job_and_starts_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let (mut sweep, mut stdout, seen) = two_rank_sweep_training(dir.path());
    // SAFETY: SIGINT to the process group our child leads, as a terminal's Ctrl-C, then
    // SIGTERM to the sweep, as a wrapper passing it on.
    unsafe { libc::kill(-(sweep.id() as libc::pid_t), libc::SIGINT) };
    std::thread::sleep(std::time::Duration::from_millis(10));
    unsafe { libc::kill(sweep.id() as libc::pid_t, libc::SIGTERM) };
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let status = sweep.wait().unwrap();
    assert_eq!(status.code(), Some(3), "{seen}{rest}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("sweep.json")).unwrap())
            .unwrap();
    assert_eq!(summary[0]["status"], "stopped", "{summary}");
    assert_eq!(summary[1]["status"], "not started", "{summary}");
    assert!(!dir.path().join("1_seed=2").exists());
    // The stopped job wrote its checkpoint.
    let checkpoints = dir.path().join("0_seed=1/checkpoints");
    assert!(
        std::fs::read_dir(&checkpoints).is_ok_and(|mut d| d.next().is_some()),
        "{rest}"
    );
    // Its launcher ended the stop itself, not killed by a second request.
    let stderr = std::fs::read_to_string(dir.path().join("sweep.stderr")).unwrap();
    assert!(
        stderr.contains("[job 0] terminated (SIGTERM): all ranks stopped"),
        "{stderr}"
    );
}

/// Ctrl-Z (SIGTSTP to the sweep's process group) stops the job's processes with the sweep,
/// though the job runs in a group of its own; `fg` (SIGCONT to the sweep) continues them.
#[test]
fn a_suspended_sweep_suspends_its_job_and_continues_it() {
    let dir = tempfile::tempdir().unwrap();
    let (mut sweep, stdout, seen) = two_rank_sweep_training(dir.path());
    let (launcher, ranks) = job_processes(&sweep);
    let job = [launcher, ranks[0], ranks[1]];
    let stopped = |pid: &u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            stat.rsplit_once(") ")
                .is_some_and(|(_, s)| s.starts_with('T'))
        })
    };
    let within = |what: &dyn Fn() -> bool| {
        let started = std::time::Instant::now();
        while !what() && started.elapsed() < std::time::Duration::from_secs(20) {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        what()
    };
    let signal_sweep = |signal| {
        // SAFETY: kill(2) of the process group our child leads, as a terminal does.
        unsafe { libc::kill(-(sweep.id() as libc::pid_t), signal) };
    };
    signal_sweep(libc::SIGTSTP);
    let all_stopped = within(&|| stopped(&sweep.id()) && job.iter().all(stopped));
    signal_sweep(libc::SIGCONT);
    let all_continued = within(&|| !stopped(&sweep.id()) && !job.iter().any(stopped));
    // And trains on: another train record (read on a thread of its own, so that a job that
    // does not train fails the test rather than hanging it).
    let (lines, read) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(stdout).map_while(|line| line.ok()) {
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    let mut more = String::new();
    while let Ok(line) = read.recv_timeout(std::time::Duration::from_secs(120)) {
        more += &line;
        more.push('\n');
        if line.starts_with("[job 0] train") {
            break;
        }
    }
    signal_sweep(libc::SIGINT);
    let status = sweep.wait().unwrap();
    let rest: String = read.try_iter().map(|line| line + "\n").collect();
    assert!(
        all_stopped,
        "the job's launcher and ranks stopped with the sweep"
    );
    assert!(all_continued, "and continued with it");
    assert_eq!(status.code(), Some(3), "{seen}{more}{rest}");
    assert!(
        more.contains("[job 0] train"),
        "trained on: {seen}{more}{rest}"
    );
}

/// A sweep killed outright (SIGKILL, the OOM killer) leaves no job training unwatched: its
/// two-rank job's launcher is asked to stop when the sweep dies, and stops with a checkpoint.
#[test]
fn a_killed_sweep_leaves_no_job_running() {
    let dir = tempfile::tempdir().unwrap();
    let (mut sweep, _stdout, _) = two_rank_sweep_training(dir.path());
    let (launcher, ranks) = job_processes(&sweep);
    sweep.kill().unwrap();
    sweep.wait().unwrap();
    let alive = |pid: &u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| !stat.contains(") Z"))
    };
    let killed = std::time::Instant::now();
    let job = [launcher, ranks[0], ranks[1]];
    while job.iter().any(alive) && killed.elapsed() < std::time::Duration::from_secs(150) {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let left: Vec<u32> = job.into_iter().filter(alive).collect();
    for pid in &left {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    assert!(left.is_empty(), "still running: {left:?}");
    let checkpoints = dir.path().join("0_seed=1/checkpoints");
    assert!(
        std::fs::read_dir(&checkpoints).is_ok_and(|mut d| d.next().is_some()),
        "the job stopped with its checkpoint"
    );
}

/// Ctrl-C or SIGTERM while `export` writes ends it at once, as by default, and the part it
/// wrote under a temporary name goes with it (a hidden file as large as the model was left).
#[test]
fn an_export_ended_by_a_signal_leaves_no_part_of_its_file() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    train(&run, "seed=2");
    for signal in [libc::SIGINT, libc::SIGTERM] {
        let out = dir.path().join(format!("signal-{signal}.pt"));
        let mut export = Command::new(common::tdmpc2_bin());
        export.arg("export").arg(&run).arg(&out);
        // The signal's default action, as from a terminal, whatever this test inherited (a
        // suite started in the background by a shell ignores SIGINT, and so would the export).
        // SAFETY: signal(2) in the child between fork and exec, async-signal-safe.
        unsafe {
            use std::os::unix::process::CommandExt;
            export.pre_exec(move || {
                libc::signal(signal, libc::SIG_DFL);
                Ok(())
            });
        }
        let mut child = export
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let partial = |dir: &Path| {
            std::fs::read_dir(dir)
                .unwrap()
                .flatten()
                .any(|entry| entry.file_name().to_string_lossy().ends_with(".partial"))
        };
        // The part exists from before torch is imported until the rename.
        while !partial(dir.path()) {
            assert!(child.try_wait().unwrap().is_none(), "no part seen");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        let status = child.wait().unwrap();
        assert_eq!(
            status.signal(),
            Some(signal),
            "ended as by default: {status:?}"
        );
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|entry| entry.file_name())
            .collect();
        assert!(!partial(dir.path()), "{names:?}");
    }
}

/// `export` writes a run's latest checkpoint as an official one (torch's zip format), whose
/// `import` gives back the same tensors; a missing or damaged input (a missing one to either) and
/// an unwritable output are named errors, and nothing is left behind.
#[test]
fn export_writes_the_official_format_and_refuses_what_it_cannot_read() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    train(&run, "seed=1");
    let pt = dir.path().join("final.pt");
    // A file named as a partial export would be is someone else's: kept.
    let bystander = dir.path().join("final.pt.partial");
    std::fs::write(&bystander, "keep me").unwrap();
    let out = tdmpc2(&["export", &run.to_string_lossy(), &pt.to_string_lossy()]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(std::fs::read_to_string(&bystander).unwrap(), "keep me");
    assert!(
        text(&out).contains("step_000000000400/model.safetensors"),
        "{}",
        text(&out)
    );
    let bytes = std::fs::read(&pt).unwrap();
    assert_eq!(&bytes[..2], b"PK", "torch.save writes a zip archive");

    let back = dir.path().join("back.safetensors");
    let out = tdmpc2(&["import", &pt.to_string_lossy(), &back.to_string_lossy()]);
    assert!(out.status.success(), "{}", text(&out));
    let model = run.join("checkpoints/step_000000000400/model.safetensors");
    let (ours, imported) = (common::tensors(&model), common::tensors(&back));
    assert_eq!(ours.len(), imported.len());
    for ((name, a), (other, b)) in ours.iter().zip(&imported) {
        assert_eq!(name, other);
        assert!(a.equal(b), "{name} changed on the way");
    }

    // Nothing is overwritten: not a file written before, not a checkpoint's own.
    for (verb, input, output) in [("export", &run, &pt), ("import", &pt, &model)] {
        let before = std::fs::read(output).unwrap();
        let out = tdmpc2(&[verb, &input.to_string_lossy(), &output.to_string_lossy()]);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(
            text(&out).contains("exists; give a new file"),
            "{}",
            text(&out)
        );
        assert_eq!(
            std::fs::read(output).unwrap(),
            before,
            "{verb} kept the file"
        );
    }

    let missing = dir.path().join("nothing-here");
    let fresh = dir.path().join("fresh.pt");
    let out = tdmpc2(&[
        "export",
        &missing.to_string_lossy(),
        &fresh.to_string_lossy(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("nothing-here"), "{}", text(&out));

    let fresh = dir.path().join("fresh.safetensors");
    let out = tdmpc2(&[
        "import",
        &missing.to_string_lossy(),
        &fresh.to_string_lossy(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("nothing-here: no such file"),
        "{}",
        text(&out)
    );
    let out = tdmpc2(&["import", &run.to_string_lossy(), &fresh.to_string_lossy()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("run: not a file"), "{}", text(&out));

    let unwritable = dir.path().join("no-such-dir/final.pt");
    let out = tdmpc2(&[
        "export",
        &run.to_string_lossy(),
        &unwritable.to_string_lossy(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("no-such-dir"), "{}", text(&out));
    // A folder's name (a trailing '/') is no file to write: it met torch's own checks, with a
    // traceback.
    let folder = format!("{}/", dir.path().join("new").display());
    let out = tdmpc2(&["export", &run.to_string_lossy(), &folder]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("ends in '/'"), "{}", text(&out));

    // A name that is not UTF-8 is the same file to Python (it was another, garbled one).
    {
        use std::os::unix::ffi::OsStrExt;
        let odd_name = dir
            .path()
            .join(std::ffi::OsStr::from_bytes(b"model_\xff.pt"));
        let out = Command::new(common::tdmpc2_bin())
            .arg("export")
            .arg(&run)
            .arg(&odd_name)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        assert!(odd_name.is_file());
        let back = dir
            .path()
            .join(std::ffi::OsStr::from_bytes(b"back_\xfe.safetensors"));
        let out = Command::new(common::tdmpc2_bin())
            .arg("import")
            .arg(&odd_name)
            .arg(&back)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        assert!(back.is_file());
    }

    // A state dict whose Q weight is not a stack of matrices (a foreign file) is named.
    let odd = dir.path().join("odd.safetensors");
    let tensors: Vec<(String, tch::Tensor)> = common::tensors(&model)
        .into_iter()
        .map(|(name, t)| match name.as_str() {
            "_Qs.params.0.weight" => (name, tch::Tensor::from(1.0f32)),
            _ => (name, t),
        })
        .collect();
    tch::Tensor::write_safetensors(&tensors, &odd).unwrap();
    let odd_pt = dir.path().join("odd.pt");
    let out = tdmpc2(&["export", &odd.to_string_lossy(), &odd_pt.to_string_lossy()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("not a TD-MPC2 state dict") && !text(&out).contains("panicked"),
        "{}",
        text(&out)
    );

    let mut damaged = std::fs::read(&model).unwrap();
    let last = damaged.len() - 1;
    damaged[last] ^= 0xff;
    std::fs::write(&model, damaged).unwrap();
    let again = dir.path().join("again.pt");
    let out = tdmpc2(&["export", &run.to_string_lossy(), &again.to_string_lossy()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("is damaged"), "{}", text(&out));
    assert!(!again.exists(), "nothing written from a damaged checkpoint");
    // Not a safetensors file at all (garbage under the name): named, exit 2.
    std::fs::write(&odd, b"\xff\xff\xff\xff\xff\xff\xff\x7fgarbage").unwrap();
    for verb in ["export", "eval"] {
        let out = match verb {
            "export" => tdmpc2(&[verb, &odd.to_string_lossy(), &again.to_string_lossy()]),
            _ => tdmpc2(&[
                verb,
                "task=Pendulum-v1",
                "model_size=1",
                &format!("checkpoint={}", odd.display()),
            ]),
        };
        assert_eq!(out.status.code(), Some(2), "{verb}: {}", text(&out));
        assert!(
            text(&out).contains("odd.safetensors: not a readable safetensors file"),
            "{verb}: {}",
            text(&out)
        );
    }
}

/// scripts/time_to_return.py (the runs of `gpu_check.sh --walker`) on tiny CPU runs: a run that
/// ends at its target stops after its first evaluation there, the shared deadline stops the next,
/// and each is summarised, its metrics kept for `plot`.
#[test]
fn time_to_return_stops_runs_at_the_target_and_at_the_deadline() {
    let out = tempfile::tempdir().unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/time_to_return.py");
    let bin = common::tdmpc2_bin();
    let result = Command::new("python3")
        .arg(script)
        .args(["--bin", bin.to_str().unwrap()])
        .args(["--out", out.path().to_str().unwrap()])
        .args([
            "--runs",
            "spu16,official-ratio",
            "--seconds",
            "100",
            "--grace",
            "15",
        ])
        .args(["--target", "-100000"])
        .args(tiny())
        .args([
            "device=cpu",
            "compile=false",
            "num_envs=1",
            "steps_per_update=1",
        ])
        .args(["steps=1000000", "eval_freq=200"])
        .output()
        .expect("python3 runs");
    assert!(result.status.success(), "{}", text(&result));
    let summaries: Vec<serde_json::Value> =
        std::fs::read_to_string(out.path().join("walker.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
    assert_eq!(summaries.len(), 2, "{}", text(&result));
    let (first, second) = (&summaries[0], &summaries[1]);
    assert_eq!(first["run"], "spu16");
    assert_eq!(first["ended"], "target", "{first}");
    assert_eq!(first["first_at_target"]["step"], 0, "{first}");
    assert_eq!(second["run"], "official-ratio");
    assert_eq!(second["ended"], "deadline", "{second}");
    assert!(second["last_logged_step"].as_u64().unwrap() > 0, "{second}");
    for name in ["walker-spu16", "walker-official-ratio"] {
        let kept = out.path().join(name);
        assert!(
            !common::metrics(&kept).is_empty(),
            "{name}: no metrics kept"
        );
        assert!(kept.join("config.yaml").is_file(), "{name}: no config.yaml");
    }
    let log = std::fs::read_to_string(out.path().join("walker.log")).unwrap();
    assert!(log.contains("===== spu16") && log.contains("===== official-ratio"));
}

/// `compare_official.py summary` on lines of the form a GPU run gives (ours from `bench --cases
/// graphs`, with and without the fused kernels; the official code compiled; both trainers, ours
/// at 1 and 16 environments), which the CPU never produces: one table row per call and
/// setting, with the official code's warm-up, and one trainer row per environment count.
#[test]
fn compare_summary_reads_a_gpu_runs_lines() {
    let dir = tempfile::tempdir().unwrap();
    let ms = |graph: f64| serde_json::json!({"eager": 17.0, "graph": graph, "eager_min": 16.0, "graph_min": graph});
    let graphs = |fused: bool, num_envs: u32, plan: f64, update: f64| {
        serde_json::json!({"impl": "ours", "round": 1, "case": "graphs", "model_size": 5,
            "task": "dog-run", "tf32": true, "fused_kernels": fused, "num_envs": num_envs,
            "device": "Cuda(0)", "plan_ms": ms(plan), "update_ms": ms(update)})
    };
    let ours_loop = |num_envs: u32, settings: &[&str], rate: f64| {
        serde_json::json!({"impl": "ours", "round": 0, "case": "loop", "model_size": 5,
            "task": "walker-run", "device": "cuda", "compile": true, "num_envs": num_envs,
            "pipeline": false, "settings": settings, "agent_steps_per_second": rate})
    };
    let lines = [
        graphs(false, 1, 4.0, 2.8),
        graphs(false, 16, 10.0, 2.8),
        graphs(true, 1, 2.0, 2.0),
        serde_json::json!({"impl": "official", "round": 1, "case": "agent", "model_size": 5,
            "task": "dog-run", "obs_dim": 223, "action_dim": 38, "plan_ms": 6.0,
            "update_ms": 5.0, "plan_ms_min": 6.0, "update_ms_min": 5.0, "compile": true,
            "plan_warmup_s": 80.0, "plan_warmup_calls": 5, "update_warmup_s": 120.0,
            "update_warmup_calls": 4, "device": "cuda", "gpu": "NVIDIA H200"}),
        ours_loop(1, &[], 180.0),
        ours_loop(1, &["fused_kernels=true"], 240.0),
        ours_loop(16, &[], 1200.0),
        serde_json::json!({"case": "trainer", "model_size": 5, "agent_steps_per_second": 120.0,
            "steady_agent_steps_per_second": 130.0, "warmup_s": 90.0, "warmup_steps": 3,
            "seeding_s": 2.0, "pretraining_s": 100.0, "seed_steps": 500, "steps": 2000,
            "device": "cuda", "compile": true}),
    ];
    let file = dir.path().join("compare.jsonl");
    let text_lines: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    std::fs::write(&file, text_lines.join("\n")).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/compare_official.py");
    let out = Command::new("python3")
        .arg(script)
        .arg("summary")
        .arg(&file)
        .output()
        .expect("python3 runs");
    let printed = text(&out);
    assert!(out.status.success(), "{printed}");
    assert!(
        printed.contains("NVIDIA H200") && printed.contains("dog-run dims"),
        "{printed}"
    );
    assert!(printed.contains("80.0 (5 calls)"), "the warm-up: {printed}");
    let rows: Vec<serde_json::Value> = printed
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let ratio = |call: &str, fused: bool| {
        rows.iter()
            .find(|r| r["case"] == "compare" && r["call"] == call && r["fused_kernels"] == fused)
            .map(|r| r["ratio"].as_f64().unwrap())
    };
    assert_eq!(ratio("plan", false), Some(1.5), "{printed}");
    assert_eq!(ratio("update", true), Some(2.5), "{printed}");
    let speedups: Vec<(u64, bool, f64)> = rows
        .iter()
        .filter(|r| r["case"] == "compare_trainer")
        .map(|r| {
            let envs = r["num_envs"].as_u64().unwrap();
            let fused = r["fused_kernels"].as_bool().unwrap();
            (envs, fused, r["speedup"].as_f64().unwrap())
        })
        .collect();
    assert_eq!(
        speedups,
        vec![(1, false, 1.5), (1, true, 2.0), (16, false, 10.0)],
        "{printed}"
    );
}
