"""Meta-World tasks the way the official TD-MPC2 wraps them (its envs/metaworld.py), on
Meta-World's v3 environments: goal observable, a zero action stepped after each reset (the
observation returned is the one before it), float32 observations, success as v2 judged it, and
the corner2 camera moved where the official code puts it. Action repeat and the time limit are
the Rust wrappers'."""
import os
import sys

import numpy as np


def report_unraisable(unraisable):
    """An exception Python cannot raise (a half-made renderer's `__del__`) in one line on stderr,
    not a traceback: the failure that matters reaches the parent as this worker's error."""
    print(f"ignored: {unraisable.exc_type.__name__}: {unraisable.exc_value}", file=sys.stderr)


sys.unraisablehook = report_unraisable


class Unsupported(Exception):
    """The task exists but cannot be used here."""


# Where v3 counts a button as pressed farther from its target than v2, the official's (0.024
# against 0.02): v2's distance, so that success means what it meant there.
V2_SUCCESS_DISTANCE = {
    "button-press-topdown-v3-goal-observable": 0.02,
    "button-press-topdown-wall-v3-goal-observable": 0.02,
}

# The official camera, moved to the official position, at the official video size.
CAMERA = "corner2"
CAMERA_POSITION = [0.75, 0.075, 0.7]
VIDEO_SIZE = 384


def environments():
    try:
        from metaworld.env_dict import ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE
    except ImportError as e:
        raise Unsupported(
            f"cannot import metaworld ({e}); reinstall its venv: scripts/setup.sh --family metaworld"
        ) from None
    return ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE


class MetaWorldAdapter:
    def __init__(self, env_id, seed, renders, episode_length):
        if renders:
            os.environ.setdefault("MUJOCO_GL", "egl")
        envs = environments()
        if env_id not in envs:
            raise Unsupported(f"this Meta-World has no environment {env_id}")
        env = envs[env_id](seed=seed)
        # As the official wrapper: each reset draws a new goal and object placement. They come
        # from the env's own generator (seeded by reset), not numpy's global one, so that
        # environments sharing a process stay independent and reproducible.
        env._freeze_rand_vec = False
        env.seeded_rand_vec = True
        camera = env.model.camera(CAMERA).id
        env.model.cam_pos[camera] = CAMERA_POSITION
        self.env = env
        self.camera = camera
        self.renderer = None
        self.renders = renders
        self.obs_shape = [int(n) for n in env.observation_space.shape]
        self.action_low = np.asarray(env.action_space.low, dtype=np.float64).tolist()
        self.action_high = np.asarray(env.action_space.high, dtype=np.float64).tolist()
        # Simulator steps: the Rust wrappers repeat each action twice.
        self.episode_length = int(episode_length)
        self.zeros = np.zeros(env.action_space.shape, dtype=np.float32)
        self.success_distance = V2_SUCCESS_DISTANCE.get(env_id)

    def reset(self, seed):
        if seed is not None:
            self.env.seed(int(seed))
        obs, _info = self.env.reset()
        self.env.step(self.zeros)
        return np.asarray(obs, dtype=np.float32)

    def step(self, action):
        obs, reward, _terminated, _truncated, info = self.env.step(action.astype(np.float32))
        success = float(info["success"])
        if self.success_distance is not None:
            # Within v3's own success too: a step v3 finds unstable reports no success (and a
            # distance of 0), and v2's distance is the tighter one.
            success = float(bool(info["success"]) and info["obj_to_target"] <= self.success_distance)
        return np.asarray(obs, dtype=np.float32), float(reward), False, False, success

    def render(self):
        if not self.renders:
            raise Unsupported("this environment was made without a renderer")
        if self.renderer is None:
            import mujoco

            self.renderer = mujoco.Renderer(self.env.model, VIDEO_SIZE, VIDEO_SIZE)
        self.renderer.update_scene(self.env.data, camera=self.camera)
        # The official frames came from mujoco-py, whose rows run bottom to top: with corner2's
        # rolled orientation that is what shows the table upright.
        frame = np.ascontiguousarray(self.renderer.render()[::-1], dtype=np.uint8)
        return frame.tobytes(), int(frame.shape[0]), int(frame.shape[1])

    def close(self):
        if self.renderer is not None:
            self.renderer.close()
            self.renderer = None
        self.env.close()
