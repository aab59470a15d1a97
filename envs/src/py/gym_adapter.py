"""Per-step glue between Rust and a gymnasium env: one call per step, float32 observations."""
import importlib.util
import os
import sys
import warnings

import gymnasium
import numpy as np
from gymnasium import spaces


class Unsupported(Exception):
    """The env exists but cannot be used through this crate."""


def registered_ids():
    """The ids gymnasium can make here: not those whose entry point only raises (the mujoco-py
    v2/v3 ids, the shimmy wrappers), nor the Jax ones without Jax."""
    has_jax = importlib.util.find_spec("jax") is not None

    def usable(spec):
        entry = spec.entry_point
        if callable(entry):
            return not getattr(entry, "__name__", "").startswith("_raise")
        return has_jax or not any(jax in str(entry) for jax in (".phys2d.", ".tabular."))

    return [name for name, spec in gymnasium.envs.registry.items() if usable(spec)]


def report_warning(message):
    """MuJoCo's warnings go to stderr instead of a MUJOCO_LOG.TXT in the working directory."""
    print(f"mujoco: {message}", file=sys.stderr)


# gymnasium's MuJoCo environments, whose models load when made.
MUJOCO_IDS = {name for name, spec in gymnasium.envs.registry.items()
              if "mujoco" in str(getattr(spec, "entry_point", ""))}


class GymAdapter:
    """`continuous`: made with continuous=True (LunarLander). `success_above`: success is the
    episode's return so far above this (the official LunarLander rule), else the env's own
    `success` or `is_success` info. `official`: one of the official task names, whose
    deprecated ids are the official choice, not the user's, so not warned about."""

    def __init__(self, env_id, renders=False, continuous=False, success_above=None,
                 official=False):
        if renders:
            # MuJoCo envs render headless through EGL unless the user chose a backend.
            os.environ.setdefault("MUJOCO_GL", "egl")
            # pygame-drawn ones (classic control, Box2D) draw off screen: SDL needs no display
            # (probing for one prints an error line where there is none), nor a sound card.
            os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
            os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
        kwargs = {"continuous": True} if continuous else {}
        # Only when rendering: envs whose constructor takes no render_mode refuse even None.
        if renders:
            kwargs["render_mode"] = "rgb_array"
        if "mujoco" in sys.modules or env_id in MUJOCO_IDS:
            import mujoco

            mujoco.set_mju_user_warning(report_warning)
        try:
            with warnings.catch_warnings():
                if official:
                    warnings.filterwarnings("ignore", "(?s).*is out of date", DeprecationWarning)
                env = gymnasium.make(env_id, **kwargs)
        except gymnasium.error.DependencyNotInstalled as e:
            raise Unsupported(f"{e} (scripts/setup.sh installs gymnasium[mujoco,box2d])") from None
        except ImportError as e:
            raise Unsupported(f"gymnasium cannot make it here: {e}") from None
        if env.spec is None or env.spec.max_episode_steps is None:
            env.close()
            raise Unsupported("the env has no max_episode_steps in its spec")
        act = env.action_space
        if not isinstance(act, spaces.Box):
            env.close()
            raise Unsupported(f"only Box action spaces are supported, got {act}")
        obs_space = env.observation_space
        self.env = env
        self.success_above = success_above
        self.episode_return = 0.0
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
        self.episode_return = 0.0
        return self._flatten(obs)

    def step(self, action):
        action = action.reshape(self.action_shape).astype(self.action_dtype, copy=False)
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.episode_return += float(reward)
        if self.success_above is None:
            success = info.get("success", info.get("is_success"))
        else:
            success = self.episode_return > self.success_above
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
