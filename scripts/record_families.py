"""Records tests/data/families/<family>.json: short rollouts of the task families with the
official TD-MPC2 wrapper logic (its envs/metaworld.py, envs/myosuite.py, envs/mujoco.py)
applied to the packages of our venvs, which envs/tests/families.rs replays through
`envs::make`. Run it with the family's own venv:

    .venv-metaworld/bin/python scripts/record_families.py metaworld tests/data/families
    .venv-myosuite/bin/python  scripts/record_families.py myosuite  tests/data/families
    .venv/bin/python           scripts/record_families.py gymnasium tests/data/families

Per task: made with SEED, then EPISODES episodes of STEPS agent steps, episode e reset with
seed SEED + 100 e (the first reset is the make seed's). Actions a_k[j] = sin(0.37 k + 1.3 j + e)
(float32 argument, sine rounded to float32) are written into the fixture, already in the
action box (all these boxes are [-1, 1], where our rescaling is the identity).

The official wrappers, as applied here:
  - Meta-World: the goal-observable v3 class made with seed=SEED; camera 2 (corner2) moved to
    (0.75, 0.075, 0.7); `_freeze_rand_vec = False`; reset, then a zero action stepped, the
    observation being the reset's; action repeat 2 (rewards summed, the last step's info);
    success = info["success"], but for the two button-press-topdown tasks, whose v3 classes
    count a button within 0.024 of its target as pressed where v2 (the official) counted 0.02:
    there success = info["obj_to_target"] <= 0.02, v2's rule. Those two tasks act with
    Meta-World's scripted policies for SCRIPTED_STEPS (clipped to [-1, 1], rounded to float32),
    so that the button passes through the distances where the two rules differ. Seeding is ours: the official draws each reset's goal from
    numpy's global generator, we from the env's own, seeded by `env.seed(seed)` at each seeded
    reset (`seeded_rand_vec = True`), so that environments in one process stay independent.
  - MyoSuite: `myosuite.utils.gym.make(id)`; terminated and truncated ignored; success =
    info["solved"]; no action repeat. Seeding is ours: `reset(seed=...)`.
  - gymnasium (the official names): gym.make(id) with the official ids (the MuJoCo v4 ones,
    still registered: v5 changed Walker2d's right foot friction), but LunarLander-v3 (v2 is
    gone from gymnasium 1.x), continuous; no action repeat;
    LunarLander's success = the episode's return so far > 200; `reset(seed=...)`.
Observations are float32, written as Python floats (exact, so they parse back bit for bit).
"""

import json
import math
import os
import sys

import numpy as np

SEED = 3
EPISODES = 2
STEPS = 12
SCRIPTED_STEPS = 32
# Meta-World v2's success distance where v3 changed it (v3 allows 0.024).
V2_SUCCESS_DISTANCE = {"mw-button-press-topdown": 0.02, "mw-button-press-topdown-wall": 0.02}


def actions(episode, dim):
    return [
        [float(np.float32(math.sin(float(np.float32(0.37 * k + 1.3 * j + episode))))) for j in range(dim)]
        for k in range(STEPS)
    ]


def floats(array):
    return [float(x) for x in np.asarray(array, dtype=np.float32).reshape(-1)]


def package(name):
    from importlib.metadata import version

    return f"{name} {version(name)}"


def metaworld_rollouts():
    from metaworld import policies
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE as classes

    scripted = {
        "mw-button-press-topdown": policies.SawyerButtonPressTopdownV3Policy,
        "mw-button-press-topdown-wall": policies.SawyerButtonPressTopdownWallV3Policy,
    }

    def make(task):
        env = classes[task[len("mw-"):] + "-v3-goal-observable"](seed=SEED)
        env.model.cam_pos[2] = [0.75, 0.075, 0.7]
        env._freeze_rand_vec = False
        env.seeded_rand_vec = True
        zeros = np.zeros(env.action_space.shape, dtype=np.float32)

        def reset(seed):
            env.seed(seed)
            obs, _ = env.reset()
            env.step(zeros)
            return obs

        def step(action):
            reward = 0.0
            for _ in range(2):
                obs, r, _, _, info = env.step(np.asarray(action, dtype=np.float32).copy())
                reward += r
            success = float(info["success"])
            if task in V2_SUCCESS_DISTANCE:
                success = float(info["obj_to_target"] <= V2_SUCCESS_DISTANCE[task])
            return obs, reward, success

        policy = None
        if task in scripted:
            act = scripted[task]().get_action
            policy = lambda obs: floats(np.clip(act(obs), -1.0, 1.0))  # noqa: E731
        return reset, step, int(env.action_space.shape[0]), policy

    tasks = ["mw-reach", "mw-pick-place", *scripted]
    return package("metaworld"), {task: make for task in tasks}


def myosuite_rollouts():
    import myosuite  # noqa: F401
    from myosuite.utils import gym as gym_utils

    ids = {"myo-reach-hard": "myoHandReachRandom-v0", "myo-key-turn": "myoHandKeyTurnFixed-v0"}

    def make(task):
        env = gym_utils.make(ids[task])

        def reset(seed):
            return env.reset(seed=seed)[0]

        def step(action):
            obs, reward, _, _, info = env.step(np.asarray(action, dtype=np.float32).copy())
            return obs, reward, float(info["solved"])

        return reset, step, int(env.action_space.shape[0]), None

    return package("myosuite"), {task: make for task in ids}


def gymnasium_rollouts():
    import gymnasium

    ids = {"lunarlander-continuous": "LunarLander-v3", "mujoco-walker": "Walker2d-v4"}

    def make(task):
        kwargs = {"continuous": True} if task == "lunarlander-continuous" else {}
        env = gymnasium.make(ids[task], **kwargs)
        episode_return = [0.0]

        def reset(seed):
            episode_return[0] = 0.0
            return env.reset(seed=seed)[0]

        def step(action):
            obs, reward, _, _, _ = env.step(np.asarray(action, dtype=np.float32).copy())
            episode_return[0] += float(reward)
            success = None
            if task == "lunarlander-continuous":
                success = float(episode_return[0] > 200)
            return obs, reward, success

        return reset, step, int(env.action_space.shape[0]), None

    return package("gymnasium"), {task: make for task in ids}


def main():
    family, out_dir = sys.argv[1], sys.argv[2]
    version, tasks = {
        "metaworld": metaworld_rollouts,
        "myosuite": myosuite_rollouts,
        "gymnasium": gymnasium_rollouts,
    }[family]()
    rollouts = {}
    for task, make in tasks.items():
        reset, step, dim, policy = make(task)
        episodes = []
        for e in range(EPISODES):
            obs = reset(SEED + 100 * e)
            record = {"reset_seed": SEED + 100 * e, "reset_obs": floats(obs)}
            if policy is None:
                record["actions"] = actions(e, dim)
                outcomes = [step(a) for a in record["actions"]]
            else:
                record["actions"], outcomes = [], []
                for _ in range(SCRIPTED_STEPS):
                    record["actions"].append(policy(obs))
                    outcomes.append(step(record["actions"][-1]))
                    obs = outcomes[-1][0]
            record["obs"] = [floats(o) for o, _, _ in outcomes]
            record["rewards"] = [float(r) for _, r, _ in outcomes]
            record["success"] = [s for _, _, s in outcomes]
            episodes.append(record)
        rollouts[task] = {"seed": SEED, "episodes": episodes}
    fixture = {
        "about": f"Rollouts of the {family} family with the official TD-MPC2 wrapper logic, "
        f"recorded by scripts/record_families.py with {version}, {package('mujoco')}.",
        "rollouts": rollouts,
    }
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{family}.json"), "w") as f:
        json.dump(fixture, f, separators=(",", ":"))


if __name__ == "__main__":
    main()
