//! Parity with the official TD-MPC2: the fixture in tests/data/parity was recorded from the
//! official PyTorch code (see its README). Our agent is loaded with the same weights, fed the
//! same inputs and the same random draws (replayed), and must reproduce every recorded output
//! within 1e-5 absolute or 1e-4 relative.
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use tch::{Device, Kind, Tensor};
use tdmpc2::agent::ensemble::Heads;
use tdmpc2::agent::task::Tasks;
use tdmpc2::agent::world_model::QParams;
use tdmpc2::agent::{
    import_official, python_tensors, AgentConfig, NoiseKind, Planner, ReplayNoise, TaskModel,
    UpdateStats, Updater, WorldModel,
};
use tdmpc2::buffer::Batch;

const ABS_TOL: f64 = 1e-5;
const REL_TOL: f64 = 1e-4;

/// The state fixture (tests/data/parity) and the pixel ones (tests/data/parity_pixels*,
/// recorded by scripts/record_parity.py).
const STATE: &str = "parity";
const PIXELS: &str = "parity_pixels";
/// State observations with `episodic=true`, recorded by scripts/record_parity.py.
const EPISODIC: &str = "parity_episodic";
/// Three tasks of one multitask model, recorded by scripts/record_parity.py.
const MULTITASK: &str = "parity_multitask";
/// Another pixel configuration: 16 channels (latent 256), one action, two Qs, batch 3.
const PIXELS_SMALL: &str = "parity_pixels_small";
/// State observations with Q dropout, its masks recorded as draws.
const DROPOUT: &str = "parity_dropout";

/// A fixture's folder: under TDMPC2_TEST_DATA where set (a test binary carried to another
/// machine, see scripts/gpu_check.sh), else under this checkout's tests/data.
fn data_dir(fixture: &str) -> PathBuf {
    let data = std::env::var_os("TDMPC2_TEST_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data"));
    data.join(fixture)
}

fn read_from(fixture: &str, name: &str) -> HashMap<String, Tensor> {
    let path = data_dir(fixture).join(name);
    Tensor::read_safetensors(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
        .into_iter()
        .collect()
}

fn manifest_of(fixture: &str) -> serde_json::Value {
    let path = data_dir(fixture).join("manifest.json");
    let text = std::fs::read_to_string(path).expect("manifest.json");
    serde_json::from_str(&text).expect("manifest is JSON")
}

fn config() -> AgentConfig {
    config_of(STATE)
}

/// A fixture's configuration (manifest.json) as an agent config. The observation size is the
/// recorded input's last dimension (the manifest records the task, not its dimensions).
fn config_of(fixture: &str) -> AgentConfig {
    let m = manifest_of(fixture);
    let c = &m["config"];
    let obs = &read_from(fixture, "fixture.safetensors")["batch.obs"];
    let obs_dim = *obs.size().last().expect("batch.obs has dimensions") as usize;
    let f = |k: &str| c[k].as_f64().unwrap_or_else(|| panic!("config.{k}"));
    let u = |k: &str| c[k].as_u64().unwrap_or_else(|| panic!("config.{k}")) as usize;
    let episode_length = f("episode_length");
    let frac = episode_length / f("discount_denom");
    let discount = ((frac - 1.0) / frac).clamp(f("discount_min"), f("discount_max"));
    AgentConfig {
        obs_dim,
        obs: envs::ObsKind::parse(c["obs"].as_str().expect("config.obs")).expect("obs kind"),
        num_channels: u("num_channels"),
        action_dim: u("action_dim"),
        latent_dim: u("latent_dim"),
        enc_dim: u("enc_dim"),
        mlp_dim: u("mlp_dim"),
        num_enc_layers: u("num_enc_layers"),
        num_q: u("num_q"),
        num_bins: u("num_bins"),
        vmin: f("vmin"),
        vmax: f("vmax"),
        simnorm_dim: u("simnorm_dim"),
        dropout: f("dropout"),
        log_std_min: f("log_std_min"),
        log_std_max: f("log_std_max"),
        episodic: c["episodic"].as_bool().expect("config.episodic"),
        horizon: u("horizon"),
        rho: f("rho"),
        discount,
        lr: f("lr"),
        enc_lr_scale: f("enc_lr_scale"),
        grad_clip_norm: f("grad_clip_norm"),
        tau: f("tau"),
        consistency_coef: f("consistency_coef"),
        reward_coef: f("reward_coef"),
        value_coef: f("value_coef"),
        termination_coef: f("termination_coef"),
        entropy_coef: f("entropy_coef"),
        mpc: c["mpc"].as_bool().expect("config.mpc"),
        iterations: u("iterations"),
        num_samples: u("num_samples"),
        num_elites: u("num_elites"),
        num_pi_trajs: u("num_pi_trajs"),
        min_std: f("min_std"),
        max_std: f("max_std"),
        temperature: f("temperature"),
        tasks: c["multitask"].as_bool().unwrap_or(false).then(|| {
            let list = |k: &str| -> Vec<f64> {
                c[k].as_array()
                    .unwrap_or_else(|| panic!("config.{k}"))
                    .iter()
                    .map(|v| v.as_f64().expect("a number"))
                    .collect()
            };
            let discount = |length: f64| {
                let frac = length / f("discount_denom");
                ((frac - 1.0) / frac).clamp(f("discount_min"), f("discount_max"))
            };
            Tasks {
                task_dim: u("task_dim"),
                action_dims: list("action_dims").iter().map(|&a| a as usize).collect(),
                discounts: list("episode_lengths").into_iter().map(discount).collect(),
            }
        }),
    }
}

/// Worst deviation of one comparison.
#[derive(Debug, Default, Clone, Copy)]
struct Deviation {
    max_abs: f64,
    /// Largest |diff| / (ABS_TOL + REL_TOL·|expected|): below 1 everywhere means within tolerance.
    worst_vs_tolerance: f64,
    /// Elements outside both tolerances.
    failures: i64,
    /// Failures whose size is at most 2.5·lr (an Adam sign flip of a near-zero gradient).
    sign_flips: i64,
    elements: i64,
}

/// Per-category record of the comparisons, printed at the end.
#[derive(Default)]
struct Report {
    categories: BTreeMap<String, Deviation>,
    failures: Vec<String>,
}

impl Report {
    fn compare(
        &mut self,
        category: &str,
        name: &str,
        got: &Tensor,
        expected: &Tensor,
        flip_size: Option<f64>,
    ) {
        let magnitude = expected.abs();
        self.compare_to_magnitude(category, name, got, expected, &magnitude, flip_size);
    }

    /// Like [`Self::compare`], with the relative tolerance taken of `magnitude` (same shape)
    /// instead of the expected values: for a sum whose terms may cancel, the size of its terms.
    fn compare_to_magnitude(
        &mut self,
        category: &str,
        name: &str,
        got: &Tensor,
        expected: &Tensor,
        magnitude: &Tensor,
        flip_size: Option<f64>,
    ) {
        let got = got.to_device(Device::Cpu).to_kind(Kind::Double);
        let expected = expected.to_device(Device::Cpu).to_kind(Kind::Double);
        let magnitude = magnitude.to_device(Device::Cpu).to_kind(Kind::Double);
        if got.size() != expected.size() {
            self.failures.push(format!(
                "{name}: shape {:?} vs expected {:?}",
                got.size(),
                expected.size()
            ));
            return;
        }
        let diff = (&got - &expected).abs();
        let outside = diff
            .gt(ABS_TOL)
            .logical_and(&diff.gt_tensor(&(&magnitude * REL_TOL)));
        let failures = outside.sum(Kind::Int64).int64_value(&[]);
        let sign_flips = match flip_size {
            Some(size) => outside
                .logical_and(&diff.le(size))
                .sum(Kind::Int64)
                .int64_value(&[]),
            None => 0,
        };
        let (max_abs, worst_vs_tolerance) = if diff.numel() == 0 {
            (0.0, 0.0)
        } else {
            let allowed = &magnitude * REL_TOL + ABS_TOL;
            (
                diff.max().double_value(&[]),
                (&diff / allowed).max().double_value(&[]),
            )
        };
        let entry = self.categories.entry(category.to_string()).or_default();
        entry.max_abs = entry.max_abs.max(max_abs);
        entry.worst_vs_tolerance = entry.worst_vs_tolerance.max(worst_vs_tolerance);
        entry.failures += failures;
        entry.sign_flips += sign_flips;
        entry.elements += diff.numel() as i64;
        // Sign flips are a few elements whose tiny gradient took the other sign under another
        // summation order; an optimiser's error (a wrong sign, a step missed, the encoder's rate
        // on every layer) moves nearly every element by about as much, so few are allowed.
        let allowed_flips = (diff.numel() as i64 / 100).max(8);
        if failures > sign_flips || sign_flips > allowed_flips {
            self.failures.push(format!(
                "{name}: {failures} elements out of tolerance ({sign_flips} sign-flip sized, at \
                 most {allowed_flips} allowed), max abs diff {max_abs:.3e}"
            ));
        }
    }

    fn finish(self) {
        println!(
            "{:<24} {:>9} {:>11} {:>10} {:>9} {:>10}",
            "category", "elements", "max |diff|", "diff/tol", "failures", "sign-flips"
        );
        for (category, d) in &self.categories {
            println!(
                "{category:<24} {:>9} {:>11.3e} {:>10.3e} {:>9} {:>10}",
                d.elements, d.max_abs, d.worst_vs_tolerance, d.failures, d.sign_flips
            );
        }
        assert!(
            self.failures.is_empty(),
            "parity failures:\n{}",
            self.failures.join("\n")
        );
    }
}

fn fixture_model(
    config: &AgentConfig,
    weights: &HashMap<String, Tensor>,
    device: Device,
) -> WorldModel {
    let mut model = WorldModel::new(config, device).expect("model");
    model
        .load_named(
            weights
                .iter()
                .map(|(k, v)| (k.clone(), v.shallow_clone()))
                .collect(),
        )
        .expect("weights load");
    model
}

fn get<'a>(fixture: &'a HashMap<String, Tensor>, key: &str) -> &'a Tensor {
    fixture
        .get(key)
        .unwrap_or_else(|| panic!("fixture has no `{key}`"))
}

fn compare_components(report: &mut Report, model: &WorldModel, fixture: &HashMap<String, Tensor>) {
    let _guard = tch::no_grad_guard();
    let obs = get(fixture, "batch.obs").get(0);
    let action = get(fixture, "batch.action").get(0);
    let reward = get(fixture, "batch.reward").get(0);
    let mut shift = ReplayNoise::new();
    if let Some(draw) = fixture.get("draw.z0_shift") {
        shift.push(NoiseKind::Shift, draw.shallow_clone());
    }
    let rows = model
        .task_rows(fixture.get("batch.task"))
        .expect("task rows");
    let task = rows.as_ref();
    let z0 = model.encode(&obs, task, &mut shift).expect("encode");
    let logits = model.reward(&z0, &action, task);
    let policy = model.pi(&z0, get(fixture, "draw.pi_eps"), task);
    let outputs = [
        ("out.z0", z0.shallow_clone()),
        ("out.next_z", model.next(&z0, &action, task)),
        ("out.reward_logits", logits.shallow_clone()),
        ("out.reward_value", model.two_hot.decode(&logits)),
        (
            "out.q_all_logits",
            model
                .q_logits(&z0, &action, task, QParams::Online, &Heads::All, None)
                .expect("q"),
        ),
        (
            "out.q_all_target_logits",
            model
                .q_logits(&z0, &action, task, QParams::Target, &Heads::All, None)
                .expect("q"),
        ),
        ("out.pi_mean_raw", policy.mean_raw.shallow_clone()),
        ("out.pi_log_std", policy.log_std.shallow_clone()),
        ("out.pi_action", policy.action.shallow_clone()),
        ("out.pi_entropy", policy.entropy.shallow_clone()),
        ("out.two_hot_of_reward", model.two_hot.encode(&reward)),
        (
            "out.soft_ce_reward",
            model.two_hot.soft_ce(&logits, &reward),
        ),
    ];
    for (key, got) in outputs {
        report.compare("components", key, &got, get(fixture, key), None);
    }
    // The scaled entropy is about −A·Σ(−½ε² − log σ − ½ log 2π) over the action dimensions: where
    // the terms (|log σ| up to 10) cancel, it keeps their rounding, A times.
    let eps = get(fixture, "draw.pi_eps");
    let terms =
        (eps.square() * 0.5 + policy.log_std.abs() + 0.92).sum_dim_intlist(-1, true, Kind::Float)
            * model.action_dim as f64;
    let key = "out.pi_scaled_entropy";
    let (got, expected) = (&policy.scaled_entropy, get(fixture, key));
    report.compare_to_magnitude("components", key, got, expected, &terms, None);
    if let Some(expected) = fixture.get("out.termination_logits") {
        let got = model
            .termination_logits(&z0)
            .expect("an episodic model has a termination head");
        let key = "out.termination_logits";
        report.compare("components", key, &got, expected, None);
    }
}

/// The draws of one update: policy noise and shifts in the sample stream, permutations in the
/// batch stream. The state fixture names its four; a recording with `update_draws` lists
/// every draw in call order.
fn replay_for_update(
    update: &str,
    manifest: &serde_json::Value,
    fixture: &HashMap<String, Tensor>,
) -> (ReplayNoise, ReplayNoise) {
    let mut sample_noise = ReplayNoise::new();
    let mut batch_noise = ReplayNoise::new();
    let Some(draws) = manifest["update_draws"].as_array() else {
        let draw = |name: &str| get(fixture, &format!("{update}.draw.{name}")).shallow_clone();
        sample_noise.push(NoiseKind::Randn, draw("td_pi_eps"));
        sample_noise.push(NoiseKind::Randn, draw("pi_eps"));
        batch_noise.push(NoiseKind::Randperm, draw("td_q_perm"));
        batch_noise.push(NoiseKind::Randperm, draw("pi_q_perm"));
        return (sample_noise, batch_noise);
    };
    let draws: Vec<(NoiseKind, Tensor)> = draws
        .iter()
        .filter(|draw| {
            let name = draw[0].as_str().expect("draw name");
            name.starts_with(&format!("{update}."))
        })
        .map(|draw| {
            let name = draw[0].as_str().expect("draw name");
            (draw_kind(draw), get(fixture, name).shallow_clone())
        })
        .collect();
    let mut mask_calls = 0;
    let mut next = 0;
    while next < draws.len() {
        let (kind, tensor) = &draws[next];
        match kind {
            NoiseKind::Randperm => batch_noise.push(NoiseKind::Randperm, tensor.shallow_clone()),
            NoiseKind::DropoutMask => {
                let members: Vec<&Tensor> = draws[next..]
                    .iter()
                    .take_while(|(kind, _)| *kind == NoiseKind::DropoutMask)
                    .map(|(_, mask)| mask)
                    .collect();
                next += members.len();
                let picked = (mask_calls > 0).then(|| &draws[next]);
                for mask in our_dropout_masks(&members, picked) {
                    sample_noise.push(NoiseKind::DropoutMask, mask);
                }
                mask_calls += 1;
                continue;
            }
            kind => sample_noise.push(*kind, tensor.shallow_clone()),
        }
        next += 1;
    }
    (sample_noise, batch_noise)
}

/// The official Q ensemble draws a dropout mask (…, out) for each member, in member order, also
/// where the call then picks two heads (the permutation that picks them is the draw after the
/// masks). Ours draws what it evaluates: in the world model's loss (`picked` None) one mask
/// (rows, K, out) for all K members at once, in the policy's loss the two picked members'
/// masks (rows, out), in pick order.
fn our_dropout_masks(members: &[&Tensor], picked: Option<&(NoiseKind, Tensor)>) -> Vec<Tensor> {
    let rows = |mask: &Tensor| {
        let out = *mask.size().last().expect("a mask has dimensions");
        mask.reshape([-1, out])
    };
    match picked {
        None => vec![Tensor::stack(
            &members.iter().map(|m| rows(m)).collect::<Vec<_>>(),
            1,
        )],
        Some((kind, permutation)) => {
            assert_eq!(
                *kind,
                NoiseKind::Randperm,
                "the heads' permutation follows their masks"
            );
            (0..2)
                .map(|i| rows(members[permutation.int64_value(&[i]) as usize]))
                .collect()
        }
    }
}

fn draw_kind(draw: &serde_json::Value) -> NoiseKind {
    match draw[1].as_str().expect("draw kind") {
        "randn" | "randn_like" => NoiseKind::Randn,
        "randperm" => NoiseKind::Randperm,
        "gumbel_exponential" => NoiseKind::Exponential,
        "randint" => NoiseKind::Shift,
        "dropout" => NoiseKind::DropoutMask,
        other => panic!("unknown draw kind {other}"),
    }
}

fn run_updates(
    report: &mut Report,
    config: &AgentConfig,
    model: &mut WorldModel,
    fixture: &HashMap<String, Tensor>,
    weight_keys: &[String],
    (manifest, updates): (&serde_json::Value, &[&str]),
) {
    let mut learner = Updater::new(config, model).expect("learner");
    let batch = Batch {
        obs: get(fixture, "batch.obs").shallow_clone(),
        action: get(fixture, "batch.action").shallow_clone(),
        reward: get(fixture, "batch.reward").shallow_clone(),
        terminated: get(fixture, "batch.terminated").shallow_clone(),
        task: fixture.get("batch.task").map(Tensor::shallow_clone),
    };
    for &update in updates {
        let (mut sample_noise, mut batch_noise) = replay_for_update(update, manifest, fixture);
        let info = learner
            .update(model, &batch, &mut sample_noise, &mut batch_noise)
            .expect("update");
        assert_eq!(
            sample_noise.remaining() + batch_noise.remaining(),
            0,
            "{update}: draws left unused"
        );
        let stats: UpdateStats = info.fetch().expect("fetch info");
        let ours: Vec<String> = stats
            .named()
            .iter()
            .map(|(field, _)| format!("{update}.info.{field}"))
            .collect();
        let prefix = format!("{update}.info.");
        let unmatched: Vec<&String> = fixture
            .keys()
            .filter(|k| k.starts_with(&prefix) && !ours.contains(k))
            .collect();
        assert!(
            unmatched.is_empty(),
            "statistics we do not report: {unmatched:?}"
        );
        for (field, value) in stats.named() {
            let key = format!("{update}.info.{field}");
            report.compare(
                &format!("{update} info"),
                &key,
                &Tensor::from_slice(&[value]),
                get(fixture, &key),
                None,
            );
        }
        let ours: HashMap<String, Tensor> = model.named_tensors().into_iter().collect();
        for key in weight_keys {
            // The official detached Q view is the online Q data.
            let our_key = key.replace("_detach_Qs_params", "_Qs.params");
            let got = ours
                .get(&our_key)
                .unwrap_or_else(|| panic!("we have no `{our_key}`"));
            let lr = if key.starts_with("_encoder") {
                config.lr * config.enc_lr_scale
            } else {
                config.lr
            };
            let expected_key = format!("{update}.param.{key}");
            report.compare(
                &format!("{update} params"),
                &expected_key,
                got,
                get(fixture, &expected_key),
                Some(2.5 * lr),
            );
        }
        let key = format!("{update}.scale");
        report.compare(
            &format!("{update} scale"),
            &key,
            learner.scale.value(),
            get(fixture, &key),
            None,
        );
    }
}

fn replay_for_plan(
    plan: &str,
    manifest: &serde_json::Value,
    fixture: &HashMap<String, Tensor>,
) -> ReplayNoise {
    let draws = manifest["plan_draws"].as_array().expect("plan_draws");
    let mut replay = ReplayNoise::new();
    for draw in draws {
        let name = draw[0].as_str().expect("draw name");
        if !name.starts_with(&format!("{plan}.")) {
            continue;
        }
        replay.push(draw_kind(draw), get(fixture, name).shallow_clone());
    }
    replay
}

fn run_plans(
    report: &mut Report,
    config: &AgentConfig,
    model: &WorldModel,
    fixture: &HashMap<String, Tensor>,
    (manifest, plans): (&serde_json::Value, &[(&str, bool)]),
) {
    if plans.is_empty() {
        return;
    }
    let mut planner = Planner::new(config, model.device(), 1).expect("planner");
    for &(plan, t0) in plans {
        let mut noise = replay_for_plan(plan, manifest, fixture);
        let obs = get(fixture, &format!("{plan}.obs"));
        let action = match fixture.get(&format!("{plan}.task")) {
            Some(task) => {
                let model = TaskModel::new(model, task).expect("task model");
                planner.plan(&model, obs, t0, false, &mut noise)
            }
            None => planner.plan(model, obs, t0, false, &mut noise),
        }
        .expect("plan");
        assert_eq!(noise.remaining(), 0, "{plan}: draws left unused");
        let key = format!("{plan}.action");
        report.compare(&key, &key, &action, get(fixture, &key), None);
        let key = format!("{plan}.prev_mean_after");
        report.compare(
            &key,
            &key,
            &planner.prev_mean().get(0),
            get(fixture, &key),
            None,
        );
    }
}

/// Each fixture of tests/data with the updates and the plans (name, t0) it recorded.
type Calls = (
    &'static str,
    &'static [&'static str],
    &'static [(&'static str, bool)],
);
const FIXTURES: [Calls; 6] = [
    (
        STATE,
        &["update1", "update2"],
        &[("plan1", true), ("plan2", false)],
    ),
    (
        MULTITASK,
        &["update1", "update2"],
        &[("plan1", true), ("plan2", true), ("plan3", true)],
    ),
    (EPISODIC, &["update1"], &[("plan1", true)]),
    (PIXELS, &["update1"], &[("plan1", true)]),
    (PIXELS_SMALL, &["update1"], &[("plan1", true)]),
    (DROPOUT, &["update1", "update2"], &[("plan1", true)]),
];

#[test]
fn matches_the_official_implementation() {
    check_fixture(STATE);
}

/// A multitask model (task embedding with a row past the unit norm, zero-padded observations,
/// action masks, per-task discounts and entropy scales, samples of three tasks in one batch) in
/// the components, two updates (the second with the policy loss's embedding gradient carried
/// over) and one plan for each task.
#[test]
fn matches_the_official_implementation_with_several_tasks() {
    check_fixture(MULTITASK);
}

/// An episodic model (termination head, its loss and statistics, terminations in the TD
/// targets and the planner's returns) in the components, one update and one plan.
#[test]
fn matches_the_official_implementation_when_episodic() {
    check_fixture(EPISODIC);
}

/// The pixel encoder (shift augmentation replayed) in the components, one update and one plan.
#[test]
fn matches_the_official_implementation_with_pixels() {
    check_fixture(PIXELS);
    check_fixture(PIXELS_SMALL);
}

/// Q dropout in both losses: one mask per head where the world model's loss evaluates all five,
/// and the official's masks of the two heads the policy's loss picks (dropout is on there too:
/// the official detached Q copy trains with the model); two updates, one plan (planning
/// evaluates without dropout).
#[test]
fn matches_the_official_implementation_with_dropout() {
    check_fixture(DROPOUT);
}

/// The CUDA checks one at a time: `fused_kernels` is one switch for the process.
static CUDA_PARITY: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Every fixture's components, updates and plans, eager on a GPU (full float32: TF32 off),
/// with torch's operations or with our fused kernels.
fn matches_on_cuda(fused_kernels: bool) {
    let _one = CUDA_PARITY
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let device = Device::Cuda(0);
    tdmpc2::device::set_tf32(device, false).expect("tf32 off");
    tdmpc2::cuda::fused::set_enabled(fused_kernels);
    if fused_kernels {
        tdmpc2::cuda::fused::prepare(device).expect("fused kernels load");
    }
    for (name, updates, plans) in FIXTURES {
        check_fixture_on(device, name, updates, plans);
    }
    tdmpc2::cuda::fused::set_enabled(false);
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu_check.sh"]
fn matches_the_official_implementation_on_cuda() {
    matches_on_cuda(false);
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu_check.sh"]
fn matches_the_official_implementation_on_cuda_with_fused_kernels() {
    matches_on_cuda(true);
}

/// A fixture recorded at full size by `scripts/check_parity.sh` (too large for the repository),
/// in the folder TDMPC2_PARITY_FIXTURE names: every update and plan it recorded.
#[test]
#[ignore = "needs a fixture recorded from the official code: scripts/check_parity.sh"]
fn matches_the_official_implementation_with_a_recorded_fixture() {
    let dir = std::env::var("TDMPC2_PARITY_FIXTURE")
        .expect("TDMPC2_PARITY_FIXTURE names the folder of a recorded fixture");
    let manifest = manifest_of(&dir);
    let calls = |key: &str| -> Vec<String> {
        let mut names: Vec<String> = manifest[key]
            .as_array()
            .unwrap_or_else(|| panic!("manifest.{key}"))
            .iter()
            .filter_map(|draw| Some(draw[0].as_str()?.split('.').next()?.to_string()))
            .collect();
        names.dedup();
        names
    };
    let updates = calls("update_draws");
    let plans = calls("plan_draws");
    println!("{dir}: {} updates, {} plans", updates.len(), plans.len());
    let updates: Vec<&str> = updates.iter().map(String::as_str).collect();
    let plans: Vec<(&str, bool)> = plans.iter().map(|p| (p.as_str(), true)).collect();
    check_fixture_on(Device::Cpu, &dir, &updates, &plans);
}

/// The fixture `name` of [`FIXTURES`] on the CPU.
fn check_fixture(name: &str) {
    let (_, updates, plans) = FIXTURES
        .iter()
        .find(|(fixture, _, _)| *fixture == name)
        .unwrap_or_else(|| panic!("{name} is not in FIXTURES"));
    check_fixture_on(Device::Cpu, name, updates, plans);
}

fn check_fixture_on(device: Device, name: &str, updates: &[&str], plans: &[(&str, bool)]) {
    println!("{name} on {device:?}");
    tch::set_num_threads(1);
    let config = config_of(name);
    let manifest = manifest_of(name);
    let weights = read_from(name, "weights.safetensors");
    let fixture: HashMap<String, Tensor> = read_from(name, "fixture.safetensors")
        .into_iter()
        .map(|(key, tensor)| (key, tensor.to_device(device)))
        .collect();
    let mut weight_keys: Vec<String> = manifest["weights_keys"]
        .as_object()
        .expect("weights_keys")
        .keys()
        .filter(|k| !k.starts_with("log_std"))
        .cloned()
        .collect();
    weight_keys.sort();

    let mut report = Report::default();
    let mut model = fixture_model(&config, &weights, device);
    compare_components(&mut report, &model, &fixture);
    let updates = (&manifest, updates);
    run_updates(
        &mut report,
        &config,
        &mut model,
        &fixture,
        &weight_keys,
        updates,
    );
    run_plans(&mut report, &config, &model, &fixture, (&manifest, plans));
    report.finish();
}

/// An official checkpoint (`torch.save({"model": state_dict})`, with tensordict bookkeeping
/// entries and the duplicated detached Q view) imports into the same model as the fixture weights.
#[test]
fn imports_an_official_checkpoint() {
    imports_an_official_checkpoint_of(STATE);
}

/// A multitask checkpoint: the task embedding and the action masks come through `import`.
#[test]
fn imports_an_official_multitask_checkpoint() {
    imports_an_official_checkpoint_of(MULTITASK);
}

/// The convolution weights of a pixel model come through `import` too.
#[test]
fn imports_an_official_pixel_checkpoint() {
    imports_an_official_checkpoint_of(PIXELS);
}

/// `tensors` for Python (see [`python_tensors`]).
fn to_python<'py>(
    py: pyo3::Python<'py>,
    tensors: &HashMap<String, Tensor>,
) -> pyo3::PyResult<pyo3::Bound<'py, pyo3::types::PyDict>> {
    python_tensors(py, tensors.iter().map(|(name, t)| (name.as_str(), t)))
}

/// An export of a fixture's model is the official state dict it was recorded from: the same
/// tensors under the same keys (the detached Q view, the log-std bounds and a multitask model's
/// action masks included), the bookkeeping the official `load_state_dict` needs, loaded with
/// `torch.load` as the official `TDMPC2.load` loads it; and it imports back unchanged.
#[test]
fn exports_the_official_state_dict() {
    use pyo3::prelude::*;
    use pyo3::types::PyDict;

    for fixture in [STATE, MULTITASK, PIXELS] {
        let config = config_of(fixture);
        let weights = read_from(fixture, "weights.safetensors");
        let dir = tempfile::tempdir().expect("tempdir");
        let ours = dir.path().join("model.safetensors");
        let pt = dir.path().join("final.pt");
        let model = fixture_model(&config, &weights, Device::Cpu);
        model.save(&ours).expect("save");
        let written = tdmpc2::agent::export_official(&ours, &pt).expect("export");
        assert_eq!(written, weights.len(), "{fixture}: tensors written");

        let problems: Vec<String> = embedded_python::with_python(|py| {
            let globals = PyDict::new(py);
            globals.set_item("expected", to_python(py, &weights)?)?;
            globals.set_item("path", pt.to_string_lossy().to_string())?;
            globals.set_item("num_q", config.num_q)?;
            py.run(
                c"
import torch
state = torch.load(path, map_location='cpu', weights_only=False)['model']
problems = []
tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
if set(tensors) != set(expected):
    problems.append(f'keys: missing {set(expected) - set(tensors)}, extra {set(tensors) - set(expected)}')
for name, (raw, shape) in expected.items():
    want = torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(shape)
    if name in tensors and not torch.equal(tensors[name].float(), want):
        problems.append(f'{name} differs')
for prefix in ('_Qs.params', '_detach_Qs_params', '_target_Qs_params'):
    size = state.get(prefix + '.__batch_size')
    if size != torch.Size([num_q]):
        problems.append(f'{prefix}.__batch_size is {size}')
    if prefix + '.__device' not in state or state[prefix + '.__device'] is not None:
        problems.append(f'{prefix}.__device missing or not None')
",
                Some(&globals),
                None,
            )?;
            globals.get_item("problems")?.expect("the check sets problems").extract()
        })
        .expect("reading the export");
        assert!(problems.is_empty(), "{fixture}: {problems:?}");

        let back = dir.path().join("imported.safetensors");
        import_official(&pt, &back).expect("import the export");
        let mut imported = WorldModel::new(&config, Device::Cpu).expect("model");
        imported.load(&back).expect("load");
        for (name, tensor) in imported.named_tensors() {
            let original = model
                .named_tensors()
                .into_iter()
                .find(|(n, _)| *n == name)
                .expect("same names");
            assert!(tensor.equal(&original.1), "{fixture}: {name} changed");
        }
    }
    // An official checkpoint of 2023's layout (no log-std bounds, nor a multitask model's
    // action masks), imported: exported in that layout (`_Qs.params.<n>`, four tensors a
    // layer, no detached view, no bookkeeping), which the official loader converts, taking what
    // it lacks from its config; and it imports back unchanged.
    for fixture in [STATE, MULTITASK] {
        let config = config_of(fixture);
        let dir = tempfile::tempdir().expect("tempdir");
        let model = fixture_model(
            &config,
            &read_from(fixture, "weights.safetensors"),
            Device::Cpu,
        );
        let without: Vec<(String, Tensor)> = model
            .named_tensors()
            .into_iter()
            .filter(|(name, _)| !name.starts_with("log_std") && name != "_action_masks")
            .collect();
        let old = dir.path().join("old.safetensors");
        Tensor::write_safetensors(&without, &old).expect("write");
        let pt = dir.path().join("old.pt");
        tdmpc2::agent::export_official(&old, &pt).expect("export");
        let keys: Vec<String> = embedded_python::with_python(|py| {
            let globals = pyo3::types::PyDict::new(py);
            globals.set_item("path", pt.to_string_lossy().to_string())?;
            py.run(
                c"
import torch
state = torch.load(path, map_location='cpu', weights_only=False)['model']
keys = sorted(k for k in state if 'Qs' in k or k.startswith('log_std') or k == '_action_masks')
",
                Some(&globals),
                None,
            )?;
            globals.get_item("keys")?.expect("set").extract()
        })
        .expect("reading the export");
        // The last layer has no LayerNorm: two tensors.
        let q_tensors = without
            .iter()
            .filter(|(n, _)| n.starts_with("_Qs.params."))
            .count();
        let mut want: Vec<String> = (0..q_tensors)
            .flat_map(|n| [format!("_Qs.params.{n}"), format!("_target_Qs.params.{n}")])
            .collect();
        want.sort();
        assert_eq!(keys, want, "{fixture}");
        let back = dir.path().join("back.safetensors");
        import_official(&pt, &back).expect("import the export");
        let mut back: Vec<(String, Tensor)> = Tensor::read_safetensors(&back).expect("read");
        back.sort_by(|a, b| a.0.cmp(&b.0));
        let mut without = without;
        without.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(back.len(), without.len(), "{fixture}");
        for ((a, x), (b, y)) in back.iter().zip(&without) {
            assert!(a == b && x.equal(y), "{fixture}: {a} / {b}");
        }
    }

    let dir = tempfile::tempdir().expect("tempdir");
    let not_a_model = dir.path().join("other.safetensors");
    Tensor::write_safetensors(
        &[("x", Tensor::zeros([2], (Kind::Float, Device::Cpu)))],
        &not_a_model,
    )
    .expect("write");
    let err = tdmpc2::agent::export_official(&not_a_model, &dir.path().join("x.pt")).unwrap_err();
    assert!(
        err.to_string().contains("not a TD-MPC2 state dict"),
        "{err}"
    );
    assert!(!dir.path().join("x.pt").exists(), "nothing written");
}

fn imports_an_official_checkpoint_of(fixture: &str) {
    use pyo3::prelude::*;
    use pyo3::types::PyDict;

    let config = config_of(fixture);
    let weights = read_from(fixture, "weights.safetensors");
    let dir = tempfile::tempdir().expect("tempdir");
    let pt = dir.path().join("final.pt");
    let out = dir.path().join("imported.safetensors");
    embedded_python::with_python(|py| {
        let globals = PyDict::new(py);
        globals.set_item("tensors", to_python(py, &weights)?)?;
        globals.set_item("path", pt.to_string_lossy().to_string())?;
        let code = c"
import torch
state = {}
for name, (raw, shape) in tensors.items():
    state[name] = torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(shape).clone()
for prefix in ('_Qs.params', '_detach_Qs_params', '_target_Qs_params'):
    state[prefix + '.__batch_size'] = torch.Size([5])
    state[prefix + '.__device'] = None
torch.save({'model': state}, path)
";
        py.run(code, Some(&globals), None)
    })
    .expect("writing an official-style checkpoint");

    let names = import_official(&pt, &out).expect("import");
    assert!(
        names
            .iter()
            .all(|n| !n.contains("__") && !n.starts_with("_detach")),
        "{names:?}"
    );
    let mut imported = WorldModel::new(&config, Device::Cpu).expect("model");
    imported.load(&out).expect("load imported");
    let reference = fixture_model(&config, &weights, Device::Cpu);
    for (a, b) in [
        (&imported.model_params.flat, &reference.model_params.flat),
        (&imported.policy_params.flat, &reference.policy_params.flat),
        (&imported.target_params.flat, &reference.target_params.flat),
    ] {
        assert!(a.equal(b), "imported parameters differ");
    }
    assert!(import_official(&dir.path().join("missing.pt"), &out).is_err());
}

/// The gradient norm at a size where float32 summation order shows (model size 5 with dog-run
/// dimensions, 4.6M world-model parameters): ours equals `torch.nn.utils.clip_grad_norm_` over
/// the same parameters, the call the official update makes, while one norm over the flat
/// buffer does not.
#[test]
fn grad_norm_equals_torchs_at_model_size_5_with_dog_run_dimensions() {
    use pyo3::prelude::*;
    use tdmpc2::agent::adam::{grad_norm, parameter_views};

    let config = AgentConfig {
        obs_dim: 223,
        obs: envs::ObsKind::State,
        num_channels: 32,
        action_dim: 38,
        enc_dim: 256,
        mlp_dim: 512,
        latent_dim: 512,
        num_enc_layers: 2,
        num_q: 5,
        ..config()
    };
    let model = WorldModel::new(&config, Device::Cpu).expect("model");
    let layout = &model.model_params.entries;
    let numel = model.model_params.numel();
    assert!(numel > 4_000_000, "{numel} parameters");
    // Deterministic gradients with parameters of very different scales, as in training.
    let grads = Tensor::arange(numel, (Kind::Float, Device::Cpu))
        .g_mul_scalar(0.37)
        .sin();
    for (i, entry) in layout.iter().enumerate() {
        let _ = grads
            .narrow(0, entry.offset, entry.numel)
            .g_mul_scalar_(10f64.powi(i as i32 % 4 - 2));
    }
    let ours = grad_norm(&grads, &parameter_views(&grads, layout))
        .expect("the gradient norm")
        .double_value(&[]);

    let torchs = embedded_python::with_python(|py| {
        let torch = py.import("torch")?;
        let parameters = pyo3::types::PyList::empty(py);
        for entry in layout {
            let grad = grads
                .narrow(0, entry.offset, entry.numel)
                .view(entry.shape.as_slice());
            let wrapped = grad.pyobject_wrap().expect("wrap");
            // SAFETY: THPVariable_Wrap returns a new reference to a valid Python object.
            let grad = unsafe { Bound::from_owned_ptr(py, wrapped as *mut pyo3::ffi::PyObject) };
            let parameter = torch
                .getattr("nn")?
                .getattr("Parameter")?
                .call1((grad.call_method0("clone")?,))?;
            parameter.setattr("grad", grad)?;
            parameters.append(parameter)?;
        }
        let clip = torch
            .getattr("nn")?
            .getattr("utils")?
            .getattr("clip_grad_norm_")?;
        clip.call1((parameters, 1e30))?
            .call_method0("item")?
            .extract::<f64>()
    })
    .expect("torch.nn.utils.clip_grad_norm_");

    let exact = grads.to_kind(Kind::Double).norm().double_value(&[]);
    let flat = grads.norm().double_value(&[]);
    eprintln!(
        "grad norm: ours {ours}, torch {torchs}, flat float32 {flat}, float64 {exact} \
         (relative to torch: ours {:.1e}, flat {:.1e})",
        (ours - torchs).abs() / torchs,
        (flat - torchs).abs() / torchs
    );
    assert!(
        (ours - torchs).abs() <= 1e-7 * torchs,
        "ours {ours} vs torch {torchs}"
    );
    // The size is large enough for the summation order to matter.
    assert!(
        (flat - torchs).abs() > 1e-6 * torchs,
        "flat {flat} vs torch {torchs}"
    );
}
