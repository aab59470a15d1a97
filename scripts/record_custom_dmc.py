"""Records tests/data/custom_dmc.json: short rollouts of the official TD-MPC2 custom DMControl
tasks, which envs/tests/dmc.rs (`custom_tasks_match_the_official_definitions`) replays with
our own definitions (envs/src/py/dmc_custom.py).

    MUJOCO_GL=disable ~/.cache/tdmpc2/venv/bin/python scripts/record_custom_dmc.py \
        OFFICIAL_CHECKOUT tests/data/custom_dmc.json [COMMIT]

OFFICIAL_CHECKOUT is the root of the official repository (its package in `tdmpc2/`); the
task modules under `tdmpc2/envs/tasks` add the custom tasks to dm_control's suite when
imported, and the official code then loads them with `suite.load`. COMMIT names the official
revision in the fixture's "about" (default: `git rev-parse --short HEAD` in the checkout).

Each task is driven the way `envs::make(task, SEED)` drives it (envs/src/dmc.rs,
envs/src/py/dmc_adapter.py, envs/src/wrappers.rs), so the two agree to rounding:
  - built with `task_kwargs={"random": SEED}` and no reward visualisation, then reset once;
  - agent action a_k[j] = sin(0.37 k + 1.3 j) for agent step k (from 0) and component j: the
    argument is computed in float32, its sine in float64 and rounded to float32 (the test
    computes the same; this way no float32 sine of a particular libm or numpy is involved);
  - RescaleAction: clipped to [-1, 1], widened to float64, mapped by
    low + (a + 1) * (0.5 * (high - low)) in float64 and rounded to float32; the adapter widens
    that back to float64 for dm_control;
  - ActionRepeat 2: the agent's reward is the float64 sum of the two physics-control rewards,
    its observation the second one's;
  - observations: the suite's entries in order, each flattened and cast to float32, then
    concatenated. The 500-step time limit is not reached in STEPS steps.
Values are written as Python floats: float32 ones exactly, so they parse back bit for bit.
"""

import json
import os
import re
import subprocess
import sys

import numpy as np

def custom_tasks():
    """The official custom tasks as envs/src/dmc.rs lists them (`CUSTOM_TASKS`), its one
    source."""
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "envs", "src", "dmc.rs")
    with open(source) as f:
        text = f.read()
    listed = re.search(r"pub const CUSTOM_TASKS: \[&str; \d+\] = \[(.*?)\];", text, re.S)
    if listed is None:
        sys.exit(f"{source}: no CUSTOM_TASKS list")
    return re.findall(r'"([^"]+)"', listed.group(1))


TASKS = custom_tasks()
SEED = 3
STEPS = 30
ACTION_REPEAT = 2


def suite_name(task):
    """`"cup-spin"` -> `("ball_in_cup", "spin")`, as envs::dmc::domain_and_task maps it."""
    domain, name = task.replace("-", "_").split("_", 1)
    return {"cup": "ball_in_cup", "pointmass": "point_mass"}.get(domain, domain), name


def load_official(checkout):
    """dm_control's suite with the official custom tasks registered in it."""
    sys.path.insert(0, os.path.join(checkout, "tdmpc2"))
    # Imported for their side effect: each adds its tasks to its domain's suite under the
    # tag 'custom'.
    from envs.tasks import ball_in_cup, cheetah, fish, hopper, pendulum, reacher, walker  # noqa: F401
    from dm_control import suite

    return suite


def agent_action(step, dim):
    args = np.float32(0.37) * np.float32(step) + np.float32(1.3) * np.arange(dim, dtype=np.float32)
    assert args.dtype == np.float32
    return np.sin(args.astype(np.float64)).astype(np.float32)


def flatten(observation):
    return np.concatenate(
        [np.asarray(v, dtype=np.float64).reshape(-1).astype(np.float32) for v in observation.values()]
    )


def floats(values):
    return [float(x) for x in values]


def record(suite, task):
    domain, name = suite_name(task)
    if (domain, name) not in suite._get_tasks("custom"):
        sys.exit(f"{task}: not an official custom task")
    env = suite.load(domain, name, task_kwargs={"random": SEED}, visualize_reward=False)
    spec = env.action_spec()
    low = np.broadcast_to(spec.minimum, spec.shape).astype(np.float64).reshape(-1)
    high = np.broadcast_to(spec.maximum, spec.shape).astype(np.float64).reshape(-1)
    half_range = 0.5 * (high - low)
    dim = low.size

    reset_obs = flatten(env.reset().observation)
    rewards, observations, actions = [], [], []
    for k in range(STEPS):
        action = agent_action(k, dim)
        clipped = np.clip(action, np.float32(-1), np.float32(1)).astype(np.float64)
        raw = (low + (clipped + 1.0) * half_range).astype(np.float32)
        physics_action = raw.astype(np.float64).reshape(spec.shape)
        reward = None
        for _ in range(ACTION_REPEAT):
            ts = env.step(physics_action)
            assert not ts.last(), f"{task}: episode ended at agent step {k}"
            r = float(ts.reward or 0.0)
            reward = r if reward is None else r + reward
        actions.append(floats(action))
        rewards.append(reward)
        observations.append(floats(flatten(ts.observation)))
    return {
        "obs_dim": int(reset_obs.size),
        "action_dim": int(dim),
        "reset_obs": floats(reset_obs),
        "actions": actions,
        "rewards": rewards,
        "obs": observations,
    }


def revision(checkout):
    try:
        out = subprocess.run(
            ["git", "-C", checkout, "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(checkout, out_path, commit=None):
    suite = load_official(checkout)
    commit = commit or revision(checkout)
    fixture = {
        "about": (
            f"Rollouts of the official TD-MPC2 custom DMControl tasks (nicklashansen/tdmpc2 at "
            f"{commit}, tdmpc2/envs/tasks), recorded by scripts/record_custom_dmc.py "
            f"(MUJOCO_GL=disable) as envs::make(task, seed) steps them: reset, then `steps` "
            f"agent steps (action repeat 2) with a_k[j] = sin(0.37 k + 1.3 j) (float32 "
            f"argument, sine rounded to float32; listed in `actions`). `rewards` and `obs` are "
            f"those of each agent step."
        ),
        "seed": SEED,
        "steps": STEPS,
        "tasks": {task: record(suite, task) for task in TASKS},
    }
    with open(out_path, "w") as f:
        json.dump(fixture, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"recorded {len(TASKS)} tasks into {out_path}")


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    main(*sys.argv[1:])
