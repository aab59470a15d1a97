"""dm_control suite tasks the way TD-MPC2 loads them, one call per physics step."""
# MUJOCO_GL (the renderer dm_control loads) is chosen before this module loads: see dmc.rs.
import numpy as np
from dm_control import suite

# dmc_custom.py, loaded by dmc.rs under this name before this module.
import tdmpc2_dmc_custom as custom


class DmcAdapter:
    def __init__(self, domain, task, seed):
        self.env = custom.load(domain, task, seed)
        if self.env is None:
            self.env = suite.load(
                domain, task, task_kwargs={"random": seed}, visualize_reward=False
            )
        spec = self.env.action_spec()
        self.action_shape = spec.shape
        self.action_low = np.broadcast_to(spec.minimum, spec.shape).astype(np.float64).reshape(-1).tolist()
        self.action_high = np.broadcast_to(spec.maximum, spec.shape).astype(np.float64).reshape(-1).tolist()
        self.obs_dim = int(
            sum(int(np.prod(v.shape)) for v in self.env.observation_spec().values())
        )

    @staticmethod
    def _flatten(observation):
        return np.concatenate(
            [np.asarray(v, dtype=np.float32).reshape(-1) for v in observation.values()]
        )

    def reset(self, seed):
        if seed is not None:
            self.env.task.random.seed(seed)
        return self._flatten(self.env.reset().observation)

    def step(self, action):
        ts = self.env.step(action.astype(np.float64).reshape(self.action_shape))
        return self._flatten(ts.observation), float(ts.reward or 0.0)

    def render(self, size, camera):
        """The current frame, (size, size, 3) uint8, as bytes."""
        return self.env.physics.render(size, size, camera_id=camera).tobytes()

    def close(self):
        """Frees the rendering contexts now, on this thread; left to Python's cycle collector,
        they would be freed on whichever thread it runs, where EGL refuses them."""
        physics = self.env.physics
        with physics._contexts_lock:
            if physics._contexts:
                physics._free_rendering_contexts()
