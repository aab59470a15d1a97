//! The learning smoke test: a short Pendulum-v1 run must beat a random policy clearly. It
//! fails when learning is broken (losses, targets, optimiser or policy), not merely slow.
use std::process::Command;

/// Mean return of uniform random actions over `episodes` episodes.
fn random_policy_return(episodes: u64) -> f64 {
    let mut env = envs::make("Pendulum-v1", 0).unwrap();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f32 / (1u64 << 53) as f32 * 2.0 - 1.0
    };
    let mut total = 0.0;
    for episode in 0..episodes {
        env.reset(Some(1000 + episode)).unwrap();
        loop {
            let step = env.step(&[uniform()]).unwrap();
            total += step.reward;
            if step.terminated || step.truncated {
                break;
            }
        }
    }
    total / episodes as f64
}

/// 1000 random steps, 1000 pretraining updates, then 600 steps with one update each.
#[test]
fn a_short_run_beats_a_random_policy() {
    assert_short_run_learns(1600, &[]);
}

/// Two environments, acting and learning overlapped: 1000 random steps, 1000 pretraining
/// updates, then 700 vector steps of two updates each. Two, not more: with N environments the
/// first episodes acted by the learned policy reach the buffer only after N × 200 further
/// steps. At 300 vector steps (the single environment's budget) one seed in two had not
/// learned yet; at 700 each of seeds 1 to 6 had (returns −81 to −668 against −1307).
#[test]
fn a_short_pipelined_run_with_two_environments_beats_a_random_policy() {
    assert_short_run_learns(2400, &["num_envs=2", "pipeline=true"]);
}

fn assert_short_run_learns(steps: u64, extra: &[&str]) {
    let random = random_policy_return(10);
    let dir = tempfile::tempdir().unwrap();
    // Policy-prior acting (mpc=false) keeps the budget small.
    let out = Command::new(env!("CARGO_BIN_EXE_tdmpc2"))
        .args([
            "train",
            "task=Pendulum-v1",
            "model_size=1",
            "mpc=false",
            &format!("steps={steps}"),
            "seed_steps=1000",
            &format!("eval_freq={steps}"),
            "eval_episodes=6",
            "batch_size=64",
            "enable_tensorboard=false",
        ])
        .args(extra)
        .arg(format!("run_dir={}", dir.path().display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metrics = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
    let last_eval: serde_json::Value = metrics
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .rfind(|r| r["phase"] == "eval")
        .unwrap();
    assert_eq!(last_eval["step"], steps);
    let learned = last_eval["episode_reward"].as_f64().unwrap();
    eprintln!("{extra:?}: random policy {random:.1}, after {steps} steps {learned:.1}");
    assert!(
        random < -900.0,
        "the random baseline is what Pendulum gives: {random}"
    );
    assert!(
        learned > random + 400.0,
        "no learning: {learned:.1} vs random {random:.1}"
    );
}
