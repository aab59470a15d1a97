"""MyoSuite hand tasks the way the official TD-MPC2 wraps them (its envs/myosuite.py): no action
repeat, no early termination (the env's own time limit and instability termination are
ignored: the Rust time limit ends every episode at 100 steps), success from `solved`, and the
hand_side_inter camera for videos."""
import os
import sys
import warnings

import numpy as np


def report_unraisable(unraisable):
    """An exception Python cannot raise (a half-made renderer's `__del__`) in one line on stderr,
    not a traceback: the failure that matters reaches the parent as this worker's error."""
    print(f"ignored: {unraisable.exc_type.__name__}: {unraisable.exc_value}", file=sys.stderr)


sys.unraisablehook = report_unraisable


class Unsupported(Exception):
    """The task exists but cannot be used here."""


CAMERA = "hand_side_inter"
VIDEO_SIZE = 384


def report_warning(message):
    """MuJoCo's warnings go to stderr instead of a MUJOCO_LOG.TXT in the working directory;
    the one MyoSuite's model builder gives every environment is left out."""
    if "empty prefix" not in message:
        print(f"mujoco: {message}", file=sys.stderr)


class MyoSuiteAdapter:
    def __init__(self, env_id, renders, episode_length):
        if renders:
            os.environ.setdefault("MUJOCO_GL", "egl")
        warnings.filterwarnings("ignore")
        try:
            import myosuite  # noqa: F401 (registers the environments)
            from myosuite.utils import gym as gym_utils
        except ImportError as e:
            raise Unsupported(
                f"cannot import myosuite ({e}); reinstall its venv: scripts/setup.sh --family myosuite"
            ) from None
        import mujoco

        mujoco.set_mju_user_warning(report_warning)
        if env_id not in gym_utils.envs.registry:
            raise Unsupported(f"this MyoSuite has no environment {env_id}")
        self.env = gym_utils.make(env_id)
        self.renders = renders
        self.obs_shape = [int(n) for n in self.env.observation_space.shape]
        act = self.env.action_space
        self.action_low = np.asarray(act.low, dtype=np.float64).reshape(-1).tolist()
        self.action_high = np.asarray(act.high, dtype=np.float64).reshape(-1).tolist()
        self.episode_length = int(episode_length)

    def reset(self, seed):
        obs, _info = self.env.reset(seed=None if seed is None else int(seed))
        return np.asarray(obs, dtype=np.float32)

    def step(self, action):
        obs, reward, _terminated, _truncated, info = self.env.step(action.astype(np.float32))
        return np.asarray(obs, dtype=np.float32), float(reward), False, False, float(info["solved"])

    def render(self):
        if not self.renders:
            raise Unsupported("this environment was made without a renderer")
        frame = self.env.unwrapped.mj_renderer.render_offscreen(
            width=VIDEO_SIZE, height=VIDEO_SIZE, camera_id=CAMERA
        )
        frame = np.ascontiguousarray(frame, dtype=np.uint8)
        return frame.tobytes(), int(frame.shape[0]), int(frame.shape[1])

    def close(self):
        self.env.close()
