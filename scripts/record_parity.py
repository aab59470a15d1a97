"""Records a parity fixture from the official TD-MPC2 code: pixel observations (obs=rgb, the
default) or state vectors (obs=state), episodic or not.

    PYTHONPATH=~/.cache/tdmpc2/official-deps python scripts/record_parity.py \
        OFFICIAL_CHECKOUT tests/data/parity_pixels [key=value ...]

(`key=value`: official config settings over the defaults below, e.g. `num_channels=16
latent_dim=256 action_dim=1 num_q=2 batch_size=3` for tests/data/parity_pixels_small,
`obs=state episodic=true` for tests/data/parity_episodic, `multitask=true` for
tests/data/parity_multitask, and `obs=state dropout=0.25 updates=2` for tests/data/parity_dropout;
`obs_dim=N` sizes state vectors; `model_size=N` takes the official preset's widths and the
official batch size and dropout instead of the small ones below, as scripts/check_parity.sh
does.)

A multitask fixture has the three tasks of MULTITASK (their own observation and action sizes
and episode lengths, so per-task discounts, padding and action masks all show), a batch whose
samples belong to different tasks, one task-embedding row beyond the unit norm (`max_norm=1`
rescales it at its first lookup), and one plan per task.
(`scripts/compare_official.sh` installs the official code's `tensordict` into that folder.)
The agent is built as scripts/compare_official.py builds it (the official config and parser
rules, compile=false, on the CPU), with small widths and the pixel encoder; its weights are
perturbed so that zero-initialised heads give non-trivial outputs. Then, on one random batch of
uint8 frames (or Gaussian state vectors), it records the component outputs, one `_update` and
one plan (`act` with t0), and every random draw in call order, shifts of the encoder's
augmentation included, and with `dropout` > 0 every dropout mask (the Q ensemble then runs member
by member: see `record_dropout_member_by_member`). Episodic fixtures get random termination flags and record the
termination head's logits. The files
have the layout of tests/data/parity (see its README), plus `update_draws` in the manifest:
the draws of each update in order, as `plan_draws` lists those of each plan. Observations are
saved flattened, (…, 9·64·64), as our agent takes them.
"""

import json
import os
import sys

import compare_official  # beside this file

SEED = 0
PIXELS = dict(
    obs="rgb",
    obs_shape={"rgb": (9, 64, 64)},
    num_channels=32,
    latent_dim=512,  # the encoder's 32·4·4 features
    mlp_dim=64,
    enc_dim=64,
    num_q=5,
    dropout=0.0,
    batch_size=4,
)
STATE = dict(
    obs="state",
    latent_dim=32,
    mlp_dim=64,
    enc_dim=64,
    num_q=5,
    dropout=0.0,
    batch_size=4,
)
STATE_DIM = 24
# What `model_size=N` leaves to the official preset and config.
SMALL = ("latent_dim", "mlp_dim", "enc_dim", "num_channels", "num_q", "dropout", "batch_size")
# name: (observation size, action size, episode length)
MULTITASK = {"walker-run": (24, 6, 500), "cartpole-swingup": (5, 1, 500), "mw-reach": (39, 4, 100)}


def save_file(tensors, path):
    """Writes `tensors` in the safetensors format (the venv has no `safetensors` package): an
    8-byte little-endian header length, a JSON header, then each tensor's bytes."""
    import struct

    import torch

    dtypes = {torch.float32: "F32", torch.int64: "I64", torch.uint8: "U8"}
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        if t.dtype not in dtypes:
            t = t.float()
        raw = t.numpy().tobytes()
        header[name] = {
            "dtype": dtypes[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)


class Recorder:
    """Wraps torch's random functions; keeps every draw, in order, named by kind."""

    def __init__(self, torch):
        self.torch, self.draws, self.prefix = torch, [], None
        originals = {
            "randn": torch.randn,
            "randn_like": torch.randn_like,
            "randperm": torch.randperm,
            "randint": torch.randint,
        }
        for kind, original in originals.items():
            setattr(torch, kind, self._wrap(kind, original))
        torch.Tensor.exponential_ = self._wrap("gumbel_exponential", torch.Tensor.exponential_)
        torch.nn.functional.dropout = self._dropout(torch.nn.functional.dropout)

    def _dropout(self, original):
        """Dropout as torch computes it (a Bernoulli mask scaled by 1/(1 − p), times the input),
        its mask kept as a draw of kind `dropout`."""

        def dropout(x, p=0.5, training=True, inplace=False):
            if self.prefix is None or not training or p == 0.0:
                return original(x, p, training, inplace)
            mask = self.torch.empty_like(x).bernoulli_(1 - p).div_(1 - p)
            self._keep("dropout", mask)
            return x * mask

        return dropout

    def _keep(self, kind, value):
        name = f"{self.prefix}.draw.{len(self.draws):03d}.{kind}"
        self.draws.append((name, kind, value.detach().clone()))

    def _wrap(self, kind, original):
        def draw(*args, **kwargs):
            out = original(*args, **kwargs)
            if self.prefix is not None:
                self._keep(kind, out)
            return out

        return draw

    def during(self, prefix, f):
        self.prefix, self.draws = prefix, []
        try:
            return f(), self.draws
        finally:
            self.prefix = None


def record_dropout_member_by_member():
    """The official Q ensemble evaluates its members under `torch.vmap(randomness="different")`,
    where each member draws its own dropout mask but a recorder sees only batched tensors. Member
    by member, with the same parameters and an independent mask each, it computes the same; the
    recorder then keeps `num_q` masks per call, in member order (of all members, also where the
    call picks two heads afterwards)."""
    import torch
    from common import layers

    def forward(self, *args, **kwargs):
        return torch.stack([self._call(self.params[i], *args, **kwargs) for i in range(self._n)])

    layers.Ensemble.forward = forward


def main(checkout, out_dir, settings):
    import torch

    sys.path.insert(0, os.path.join(checkout, "tdmpc2"))
    torch.manual_seed(SEED)
    multitask = settings.pop("multitask", False)
    # Two updates for multitask: the policy loss's gradient of the task embedding is left for
    # the next world-model step, which only a second update shows.
    updates = settings.pop("updates", 2 if multitask else 1)
    pixels = settings.get("obs", "rgb") == "rgb" and not multitask
    if multitask:
        frame = (max(o for o, _, _ in MULTITASK.values()),)
        defaults = {
            **STATE,
            "obs_shape": {"state": frame},
            "multitask": True,
            "tasks": list(MULTITASK),
            "task_dim": 8,
            "action_dim": max(a for _, a, _ in MULTITASK.values()),
            "action_dims": [a for _, a, _ in MULTITASK.values()],
            "obs_shapes": [(o,) for o, _, _ in MULTITASK.values()],
            "episode_lengths": [e for _, _, e in MULTITASK.values()],
        }
    elif pixels:
        defaults = PIXELS
        frame = (9, 64, 64)
    else:
        frame = (settings.pop("obs_dim", STATE_DIM),)
        defaults = {**STATE, "obs_shape": {"state": frame}}
    model_size = settings.pop("model_size", None)
    if model_size is not None:
        # The preset's widths and the official batch size and dropout, not the small ones above.
        defaults = {k: v for k, v in defaults.items() if k not in SMALL}
    agent, cfg = compare_official.build_agent(checkout, model_size or 1, {**defaults, **settings})
    if cfg.dropout > 0:
        record_dropout_member_by_member()
    H, B = cfg.horizon, cfg.batch_size

    # Each sample's task; the padding of observations and actions is zero, as the official
    # multitask wrapper and datasets have it.
    tasks = torch.tensor([0, 1, 2, 1][:B] + [0] * max(0, B - 4)) if multitask else None

    def observations(*leading, task=None):
        if pixels:
            return torch.randint(0, 256, (*leading, *frame), dtype=torch.uint8)
        x = torch.randn(*leading, *frame)
        if multitask:
            ids = tasks if task is None else torch.tensor([task])
            dims = torch.tensor([list(MULTITASK.values())[i][0] for i in ids.tolist()])
            x = (x * (torch.arange(frame[0]) < dims.unsqueeze(-1)).float()).reshape(x.shape)
        return x

    from common import math

    model = agent.model
    with torch.no_grad():
        for key, value in model.state_dict().items():
            if not isinstance(value, torch.Tensor) or key.startswith(("log_std", "_action_masks")):
                continue  # tensordict bookkeeping (`__batch_size`), constant buffers
            if value.is_floating_point():
                value.add_(torch.randn_like(value) * 0.05)
        for target, online in zip(
            model._target_Qs_params.values(True, True), model._Qs.params.values(True, True)
        ):
            target.copy_(online + torch.randn_like(online) * 0.01)
        if multitask:
            row = model._task_emb.weight[2]
            row.mul_(1.5 / row.norm())
    weights = {
        k: v.detach().clone().contiguous()
        for k, v in model.state_dict().items()
        if isinstance(v, torch.Tensor)
    }

    recorder = Recorder(torch)
    a = cfg.action_dim
    obs = observations(H + 1, B)
    terminated = torch.zeros(H, B, 1)
    if cfg.episodic:
        terminated = (torch.rand(H, B, 1) < 0.3).float()
    actions = torch.rand(H, B, a) * 2 - 1
    if multitask:
        actions = actions * model._action_masks[tasks]
    batch = {
        "batch.obs": obs,
        "batch.action": actions,
        "batch.reward": torch.randn(H, B, 1),
        "batch.terminated": terminated,
    }
    fixture = {}

    def components():
        with torch.no_grad():
            model.eval()
            z0 = model.encode(obs[0], tasks)
            action = batch["batch.action"][0]
            logits = model.reward(z0, action, tasks)
            z_in = model.task_emb(z0, tasks) if multitask else z0
            mean_raw, log_std = model._pi(z_in).chunk(2, dim=-1)
            if multitask:
                mean_raw = mean_raw * model._action_masks[tasks]  # as `pi` masks it
            pi_action, info = model.pi(z0, tasks)
            reward = batch["batch.reward"][0]
            episodic = {}
            if cfg.episodic:
                episodic["out.termination_logits"] = model.termination(z0, tasks, unnormalized=True)
            return {
                **episodic,
                "out.z0": z0,
                "out.next_z": model.next(z0, action, tasks),
                "out.reward_logits": logits,
                "out.reward_value": math.two_hot_inv(logits, cfg),
                "out.q_all_logits": model.Q(z0, action, tasks, return_type="all"),
                "out.q_all_target_logits": model.Q(
                    z0, action, tasks, return_type="all", target=True
                ),
                "out.pi_mean_raw": mean_raw,
                "out.pi_log_std": info["log_std"],
                "out.pi_action": pi_action,
                "out.pi_entropy": info["entropy"],
                "out.pi_scaled_entropy": info["scaled_entropy"],
                "out.two_hot_of_reward": math.two_hot(reward, cfg),
                "out.soft_ce_reward": math.soft_ce(logits, reward, cfg),
            }

    outputs, draws = recorder.during("components", components)
    fixture.update(outputs)
    kinds = [kind for _, kind, _ in draws]
    assert kinds == ["randint", "randn_like"][1 - pixels :], kinds
    if pixels:
        fixture["draw.z0_shift"] = draws[0][2]
    fixture["draw.pi_eps"] = draws[-1][2]

    update_draws = []
    update_args = [batch[k] for k in ("batch.obs", "batch.action", "batch.reward", "batch.terminated")]
    for n in range(1, updates + 1):
        update = f"update{n}"
        info, draws = recorder.during(update, lambda: agent._update(*update_args, task=tasks))
        for name, kind, value in draws:
            fixture[name] = value
            update_draws.append([name, kind, list(value.shape)])
        for key, value in info.items():
            fixture[f"{update}.info.{key}"] = value.reshape(1).float()
        for key in weights:
            fixture[f"{update}.param.{key}"] = model.state_dict()[key].detach().clone()
        fixture[f"{update}.scale"] = agent.scale.value.detach().clone().reshape(-1)[:1]

    plan_draws = []
    for i, task in enumerate(range(len(MULTITASK)) if multitask else [None]):
        plan = f"plan{i + 1}"
        plan_obs = observations(task=task)
        act = lambda: agent.act(plan_obs, t0=True, task=task)
        action, draws = recorder.during(plan, act)
        for name, kind, value in draws:
            fixture[name] = value
            plan_draws.append([name, kind, list(value.shape)])
        fixture[f"{plan}.obs"] = plan_obs.reshape(1, -1)
        fixture[f"{plan}.action"] = action
        fixture[f"{plan}.prev_mean_after"] = agent._prev_mean.detach().clone()
        if multitask:
            fixture[f"{plan}.task"] = torch.tensor([task])

    fixture["batch.obs"] = obs.reshape(H + 1, B, -1)
    fixture.update({k: v for k, v in batch.items() if k != "batch.obs"})
    if multitask:
        fixture["batch.task"] = tasks
    os.makedirs(out_dir, exist_ok=True)
    contiguous = lambda d: {k: v.detach().contiguous() for k, v in d.items()}
    save_file(contiguous(weights), os.path.join(out_dir, "weights.safetensors"))
    save_file(contiguous(fixture), os.path.join(out_dir, "fixture.safetensors"))
    config = {
        k: v
        for k, v in vars(cfg).items()
        if isinstance(v, (int, float, str, bool))
        or k in ("tasks", "action_dims", "episode_lengths")
    }
    manifest = {
        "config": config,
        "weights_keys": {k: list(v.shape) for k, v in weights.items()},
        "update_draws": update_draws,
        "plan_draws": plan_draws,
    }
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"recorded {len(fixture)} tensors into {out_dir}")


def parse_settings(args):
    settings = {}
    for arg in args:
        key, sep, value = arg.partition("=")
        if not sep:
            sys.exit(f"expected key=value, got {arg!r}")
        if value.lstrip("-").isdigit():
            settings[key] = int(value)
        elif value in ("true", "false"):
            settings[key] = value == "true"
        else:
            try:
                settings[key] = float(value)
            except ValueError:
                settings[key] = value
    return settings


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], parse_settings(sys.argv[3:]))
