//! In-process behaviour and argument checks; worker processes are tested in tests/vector.rs.
use super::*;

fn no_worker() -> WorkerCommand {
    WorkerCommand::new("/nonexistent/envs-worker", &[])
}

fn pendulums(n: usize) -> VectorEnv {
    let seeds: Vec<u64> = (0..n as u64).collect();
    VectorEnv::new("Pendulum-v1", &seeds, Placement::InProcess, &no_worker()).unwrap()
}

fn error_text<T>(result: Result<T>) -> String {
    match result {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn each_env_matches_its_own_env_and_resets_alone() {
    let mut venv = pendulums(3);
    assert_eq!((venv.num_envs(), venv.spec().action_dim), (3, 1));
    let mut singles: Vec<_> = (0..3)
        .map(|seed| crate::make("Pendulum-v1", seed).unwrap())
        .collect();
    for (i, single) in singles.iter_mut().enumerate() {
        assert_eq!(venv.reset(i, None).unwrap(), single.reset(None).unwrap());
    }
    for t in 0..20 {
        if t == 7 {
            // Only env 1 restarts; envs 0 and 2 carry on with their episodes.
            assert_eq!(
                venv.reset(1, Some(99)).unwrap(),
                singles[1].reset(Some(99)).unwrap()
            );
        }
        let which = if t % 2 == 0 { vec![2, 0, 1] } else { vec![1] };
        let actions: Vec<f32> = which
            .iter()
            .map(|&i| 0.1 * i as f32 - 0.05 * t as f32)
            .collect();
        let steps = venv.step(&which, &actions).unwrap();
        for ((&i, step), action) in which.iter().zip(&steps).zip(&actions) {
            assert_eq!(
                step,
                &singles[i].step(&[*action]).unwrap(),
                "env {i} at step {t}"
            );
        }
    }
}

#[test]
fn a_vector_env_can_move_to_another_thread() {
    fn send<T: Send>() {}
    send::<VectorEnv>();
}

#[test]
fn bad_arguments_are_errors() {
    let e = error_text(VectorEnv::new(
        "Pendulum-v1",
        &[],
        Placement::InProcess,
        &no_worker(),
    ));
    assert!(e.contains("at least one seed"), "{e}");
    let e = error_text(VectorEnv::new(
        "Pendulum-v1",
        &[1],
        Placement::Workers(0),
        &no_worker(),
    ));
    assert!(e.contains("Workers(0)"), "{e}");
    let mut venv = pendulums(2);
    let e = error_text(venv.reset(2, None));
    assert!(
        e.contains("env index 2 is out of range: there are 2 envs"),
        "{e}"
    );
    venv.reset(0, None).unwrap();
    venv.reset(1, None).unwrap();
    let e = error_text(venv.step(&[0, 5], &[0.0, 0.0]));
    assert!(e.contains("env index 5 is out of range"), "{e}");
    let e = error_text(venv.step(&[1, 1], &[0.0, 0.0]));
    assert!(e.contains("env 1 is listed twice"), "{e}");
    let e = error_text(venv.step(&[0, 1], &[0.0]));
    assert!(
        e.contains("1 action components for 2 envs, expected 2"),
        "{e}"
    );
    assert_eq!(venv.step(&[], &[]).unwrap(), vec![]);
    // After the rejected calls the envs still step normally.
    assert_eq!(venv.step(&[1, 0], &[0.5, -0.5]).unwrap().len(), 2);
}

#[test]
fn a_missing_worker_program_is_an_error() {
    let e = error_text(VectorEnv::new(
        "Pendulum-v1",
        &[1, 2],
        Placement::Workers(2),
        &no_worker(),
    ));
    assert!(
        e.contains("cannot start the environment worker `/nonexistent/envs-worker`"),
        "{e}"
    );
}

/// Observes one component more than its spec says after its first step.
struct Overlong {
    spec: EnvSpec,
}

impl Env for Overlong {
    fn spec(&self) -> &EnvSpec {
        &self.spec
    }
    fn reset(&mut self, _seed: Option<u64>) -> Result<Vec<f32>> {
        Ok(vec![0.0; 2])
    }
    fn step(&mut self, _action: &[f32]) -> Result<Step> {
        Ok(Step {
            obs: vec![0.0; 3],
            reward: 0.0,
            terminated: false,
            truncated: false,
            success: None,
        })
    }
}

#[test]
fn an_observation_unlike_the_spec_is_an_error_in_process_too() {
    let spec = EnvSpec {
        obs_shape: vec![2],
        action_dim: 1,
        episode_length: 10,
    };
    let env: Box<dyn Env> = Box::new(Overlong { spec });
    let mut venv = VectorEnv::from_envs("overlong", vec![env]).unwrap();
    venv.reset(0, None).unwrap();
    let e = error_text(venv.step(&[0], &[0.0]));
    assert_eq!(
        e,
        "`overlong` env 0 returned an observation of 3 components, but its observation space \
         has 2"
    );
}

/// Observes NaN in component 1 after a reset, and its reward is infinite after a step.
struct Unstable {
    spec: EnvSpec,
    nan_at_reset: bool,
}

impl Env for Unstable {
    fn spec(&self) -> &EnvSpec {
        &self.spec
    }
    fn reset(&mut self, _seed: Option<u64>) -> Result<Vec<f32>> {
        match self.nan_at_reset {
            true => Ok(vec![0.0, f32::NAN]),
            false => Ok(vec![0.0; 2]),
        }
    }
    fn step(&mut self, _action: &[f32]) -> Result<Step> {
        Ok(Step {
            obs: vec![0.0; 2],
            reward: f64::INFINITY,
            terminated: false,
            truncated: false,
            success: None,
        })
    }
}

/// A NaN would reach the replay buffer (every update after diverges) or the planner (its
/// actions blamed): the env that returned it is named.
#[test]
fn a_non_finite_observation_or_reward_names_its_env() {
    let spec = EnvSpec {
        obs_shape: vec![2],
        action_dim: 1,
        episode_length: 10,
    };
    let envs: Vec<Box<dyn Env>> = [false, true]
        .into_iter()
        .map(|nan_at_reset| {
            let spec = spec.clone();
            Box::new(Unstable { spec, nan_at_reset }) as Box<dyn Env>
        })
        .collect();
    let mut venv = VectorEnv::from_envs("unstable", envs).unwrap();
    venv.reset(0, None).unwrap();
    let e = error_text(venv.reset(1, None));
    assert!(
        e.starts_with(
            "`unstable` env 1 returned a non-finite observation component 1 (NaN) after a reset"
        ),
        "{e}"
    );
    let e = error_text(venv.step(&[0], &[0.0]));
    assert!(
        e.starts_with("`unstable` env 0 returned a non-finite reward (inf) after a step"),
        "{e}"
    );
}
