"""Per-step glue between Rust and a gymnasium env: one call per step, float32 observations."""
import os

import gymnasium
import numpy as np
from gymnasium import spaces


class Unsupported(Exception):
    """The env exists but cannot be used through this crate."""


def registered_ids():
    return list(gymnasium.envs.registry.keys())


class GymAdapter:
    def __init__(self, env_id, renders=False):
        if renders:
            # MuJoCo envs render headless through EGL unless the user chose a backend.
            os.environ.setdefault("MUJOCO_GL", "egl")
        # Only when rendering: envs whose constructor takes no render_mode refuse even None.
        env = gymnasium.make(env_id, **({"render_mode": "rgb_array"} if renders else {}))
        if env.spec is None or env.spec.max_episode_steps is None:
            env.close()
            raise Unsupported("the env has no max_episode_steps in its spec")
        act = env.action_space
        if not isinstance(act, spaces.Box):
            env.close()
            raise Unsupported(f"only Box action spaces are supported, got {act}")
        obs_space = env.observation_space
        self.env = env
        self.episode_length = int(env.spec.max_episode_steps)
        self.action_shape = act.shape
        self.action_dtype = act.dtype
        self.action_low = np.asarray(act.low, dtype=np.float64).reshape(-1).tolist()
        self.action_high = np.asarray(act.high, dtype=np.float64).reshape(-1).tolist()
        if isinstance(obs_space, spaces.Box):
            self.obs_shape = [int(n) for n in obs_space.shape]
            self._flatten = lambda obs: np.asarray(obs, dtype=np.float32).reshape(-1)
        else:
            self.obs_shape = [int(spaces.flatdim(obs_space))]
            self._flatten = lambda obs: np.asarray(
                spaces.flatten(obs_space, obs), dtype=np.float32
            ).reshape(-1)

    def reset(self, seed):
        obs, _info = self.env.reset(seed=seed)
        return self._flatten(obs)

    def step(self, action):
        action = action.reshape(self.action_shape).astype(self.action_dtype, copy=False)
        obs, reward, terminated, truncated, info = self.env.step(action)
        success = info.get("success", info.get("is_success"))
        return (
            self._flatten(obs),
            float(reward),
            bool(terminated),
            bool(truncated),
            None if success is None else float(success),
        )

    def render(self):
        """The current frame as (bytes of (height, width, 3) uint8, height, width)."""
        frame = self.env.render()
        if frame is None or getattr(frame, "ndim", 0) != 3 or frame.shape[2] != 3:
            raise Unsupported("render() did not return an (height, width, 3) rgb_array")
        frame = np.ascontiguousarray(frame, dtype=np.uint8)
        return frame.tobytes(), int(frame.shape[0]), int(frame.shape[1])

    def close(self):
        self.env.close()
