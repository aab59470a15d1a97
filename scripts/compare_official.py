"""Times the official TD-MPC2 agent's plan and update on the CPU, and summarises comparisons.

Used by scripts/compare_official.sh; two subcommands:

  time OFFICIAL_CHECKOUT --model-sizes 1,5 --threads 2 --repeats 10 --round R
      builds the official agent (walker-run dimensions, the official config.yaml and model-size
      presets, compile=false) and prints one JSON line per model size in the form of
      `tdmpc2 bench --cases agent`, with "impl": "official"; the operators of one plan and one
      update are counted by scripts/op_count.py, the rule our bench applies to ours.
  summary FILE
      reads the JSON lines of all rounds (ours and official) and prints the side-by-side table.

Nothing of the official code is changed. To run it on the CPU, two things are adapted at run
time, neither of which touches its numerics:
  - the constructors hard-code `torch.device('cuda:0')`: while the agent is built, the `torch`
    name inside the official modules `tdmpc2` and `common.scale` is a view of torch whose
    `device(...)` is the CPU; it is put back before anything is timed;
  - its Adam optimisers are created with `capturable=True`, which torch allows only for
    accelerator tensors: the flag is turned off on the CPU (it only keeps the step count on
    the device so that CUDA graphs can capture the step).
Matmuls run at torch's default float32 precision on both sides (the official train.py asks for
"high", i.e. TF32 on CUDA; neither side sets it on the CPU).
"""

import argparse
import json
import os
import statistics
import sys
import time
import types

import op_count  # beside this file

# Walker-run as the official DMC wrapper gives it (500 steps after action repeat 2), as in
# `tdmpc2 bench --tasks walker-run`.
TASK, OBS_DIM, ACTION_DIM, EPISODE_LENGTH = "walker-run", 24, 6, 500


def load_average():
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except OSError:
        return None


def official_config(checkout, model_size, overrides=None):
    """The official config as its parser resolves it for a single state-based task, then
    `overrides` (e.g. scripts/record_parity.py's pixel settings)."""
    import yaml
    from common import MODEL_SIZE

    with open(os.path.join(checkout, "tdmpc2", "config.yaml")) as f:
        raw = yaml.safe_load(f)
    values = {}
    for key, value in raw.items():
        if key == "defaults":
            continue
        # OmegaConf reads `3e-4` as a float; PyYAML (YAML 1.1) as a string.
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                pass
        values[key] = value
    if model_size not in MODEL_SIZE:
        raise SystemExit(
            f"model size {model_size} is not in the official presets {sorted(MODEL_SIZE)}"
        )
    values.update(MODEL_SIZE[model_size])
    values.update(
        task=TASK,
        obs="state",
        model_size=model_size,
        compile=False,
        multitask=False,
        task_dim=0,
        tasks=[TASK],
        obs_shape={"state": (OBS_DIM,)},
        action_dim=ACTION_DIM,
        episode_length=EPISODE_LENGTH,
        seed_steps=max(1000, 5 * EPISODE_LENGTH),
        bin_size=(values["vmax"] - values["vmin"]) / (values["num_bins"] - 1),
        work_dir="/nonexistent",
        task_title=TASK.replace("-", " ").title(),
    )
    values.update(overrides or {})

    class Config(types.SimpleNamespace):
        def get(self, key, default=None):
            return getattr(self, key, default)

    return Config(**values)


class _CpuTorch(types.ModuleType):
    """torch, except that every `torch.device(...)` is the CPU."""

    def __init__(self, torch):
        super().__init__("torch")
        self._torch = torch

    def __getattr__(self, name):
        return getattr(self._torch, name)

    def device(self, *args, **kwargs):
        return self._torch.device("cpu")

    def tensor(self, *args, **kwargs):
        # The multitask discounts are made on 'cuda:0' by name.
        kwargs.pop("device", None)
        return self._torch.tensor(*args, **kwargs)


def build_agent(checkout, model_size, overrides=None):
    import torch
    import common.scale
    import tdmpc2 as official

    cfg = official_config(checkout, model_size, overrides)
    modules = [official, common.scale]
    for module in modules:
        module.torch = _CpuTorch(torch)
    try:
        agent = official.TDMPC2(cfg)
    finally:
        for module in modules:
            module.torch = torch
    for optim in (agent.optim, agent.pi_optim):
        optim.defaults["capturable"] = False
        for group in optim.param_groups:
            group["capturable"] = False
    return agent, cfg


def time_ms(repeats, f):
    """Milliseconds of each of `repeats` calls after one warm-up call."""
    f()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        f()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def time_official(args):
    checkout = os.path.abspath(args.checkout)
    sys.path.insert(0, os.path.join(checkout, "tdmpc2"))
    import contextlib
    import io

    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    for size in args.model_sizes:
        load_before = load_average()
        # The constructor prints the episode length and discount.
        with contextlib.redirect_stdout(io.StringIO()):
            agent, cfg = build_agent(checkout, size)
        h, b = cfg.horizon, cfg.batch_size
        batch = (
            torch.randn(h + 1, b, OBS_DIM),
            torch.rand(h, b, ACTION_DIM) * 2 - 1,
            torch.randn(h, b, 1),
            torch.zeros(h, b, 1),
            None,
        )
        buffer = types.SimpleNamespace(sample=lambda: batch)
        obs = torch.randn(OBS_DIM)

        update_times = time_ms(args.repeats, lambda: agent.update(buffer))
        first = [True]

        def plan():
            t0, first[0] = first[0], False
            agent.act(obs, t0=t0)

        plan_times = time_ms(args.repeats, plan)
        plan_ops = op_count.count(plan)
        update_ops = op_count.count(lambda: agent.update(buffer))
        line = {
            "case": "agent",
            "impl": "official",
            "round": args.round,
            "model_size": size,
            "task": TASK,
            "obs_dim": OBS_DIM,
            "action_dim": ACTION_DIM,
            "iterations": cfg.iterations,
            "num_samples": cfg.num_samples,
            "num_elites": cfg.num_elites,
            "num_pi_trajs": cfg.num_pi_trajs,
            "horizon": cfg.horizon,
            "num_params": agent.model.total_params,
            "plan_ms": statistics.median(plan_times),
            "update_ms": statistics.median(update_times),
            "plan_ms_min": min(plan_times),
            "update_ms_min": min(update_times),
            "plan_ops": dict(zip(("ops", "top_level", "host_syncs"), plan_ops)),
            "update_ops": dict(zip(("ops", "top_level", "host_syncs"), update_ops)),
            "device": "Cpu",
            "threads": torch.get_num_threads(),
            "batch_size": b,
            "torch": torch.__version__,
            "load_average": [load_before, load_average()],
        }
        print(json.dumps(line), flush=True)


def spread(values, digits=0):
    low, high = min(values), max(values)
    fmt = f"{{:.{digits}f}}"
    return fmt.format(low) if fmt.format(low) == fmt.format(high) else f"{fmt.format(low)}–{fmt.format(high)}"


def summary(args):
    lines = []
    with open(args.file) as f:
        for text in f:
            text = text.strip()
            if text.startswith("{"):
                lines.append(json.loads(text))
    by = {}
    for line in lines:
        if line.get("case") == "agent":
            by.setdefault((line["impl"], line["model_size"]), []).append(line)
    sizes = sorted({size for _, size in by})
    print()
    print(
        "CPU, walker-run dims, batch 256, threads "
        + ",".join(sorted({str(l["threads"]) for l in lines if "threads" in l}))
        + "; ms per call: the lowest of the rounds' medians (range over rounds), each round's"
        + " ratio of medians, and the fastest single call of all rounds (ours / official);"
        + " ratio = official / ours"
    )
    header = (
        f"{'size':>4}  {'call':<6}  {'ours':>15}  {'official':>16}  {'ratio':>6}  "
        f"{'per round':<22}  {'fastest':>13}  {'ratio':>6}"
    )
    print(header)
    print("-" * len(header))
    rows = []
    for size in sizes:
        ours, theirs = by.get(("ours", size), []), by.get(("official", size), [])
        if not ours or not theirs:
            print(f"{size:>4}  missing measurements (ours {len(ours)}, official {len(theirs)})")
            continue
        rounds = sorted(set(l["round"] for l in ours) & set(l["round"] for l in theirs))
        for call in ("plan", "update"):
            a = [l[f"{call}_ms"] for l in ours]
            b = [l[f"{call}_ms"] for l in theirs]
            a_min = min(l[f"{call}_ms_min"] for l in ours)
            b_min = min(l[f"{call}_ms_min"] for l in theirs)
            # Other load only slows calls down: the least disturbed round is the best estimate.
            ratio = min(b) / min(a)
            per_round = [
                next(l for l in theirs if l["round"] == r)[f"{call}_ms"]
                / next(l for l in ours if l["round"] == r)[f"{call}_ms"]
                for r in rounds
            ]
            ours_text = f"{min(a):.0f} ({spread(a)})"
            theirs_text = f"{min(b):.0f} ({spread(b)})"
            per_round_text = " ".join(f"{x:.2f}" for x in per_round)
            print(
                f"{size:>4}  {call:<6}  {ours_text:>15}  {theirs_text:>16}  {ratio:>5.2f}×  "
                f"{per_round_text:<22}  {a_min:>5.0f} / {b_min:<5.0f}  {b_min / a_min:>5.2f}×"
            )
            rows.append(
                {
                    "case": "compare",
                    "model_size": size,
                    "call": call,
                    "ours_ms": a,
                    "official_ms": b,
                    "ratio": ratio,
                    "ratio_per_round": per_round,
                    "ours_ms_min": a_min,
                    "official_ms_min": b_min,
                    "ratio_min": b_min / a_min,
                }
            )
    ops_rows = []
    for size in sizes:
        ours, theirs = by.get(("ours", size), []), by.get(("official", size), [])
        for call in ("plan", "update"):
            a = next((l[f"{call}_ops"] for l in ours if f"{call}_ops" in l), None)
            b = next((l[f"{call}_ops"] for l in theirs if f"{call}_ops" in l), None)
            if a and b:
                ops_rows.append((size, call, a, b))
    if ops_rows:
        print()
        print("operators per call (torch's profiler, scripts/op_count.py): all, top-level and"
              " host syncs; ratio = ours / official")
        header = f"{'size':>4}  {'call':<6}  {'ours':>18}  {'official':>18}  {'ratio':>13}"
        print(header)
        print("-" * len(header))
        for size, call, a, b in ops_rows:
            print(
                f"{size:>4}  {call:<6}  {a['ops']:>6} {a['top_level']:>6} {a['host_syncs']:>4}  "
                f"{b['ops']:>6} {b['top_level']:>6} {b['host_syncs']:>4}  "
                f"{a['ops'] / b['ops']:>6.2f} {a['top_level'] / b['top_level']:>6.2f}"
            )
            rows.append({"case": "compare_ops", "model_size": size, "call": call,
                         "ours": a, "official": b, "ratio": a["ops"] / b["ops"],
                         "ratio_top_level": a["top_level"] / b["top_level"]})
    loads = [x for l in lines for x in (l.get("load_average") or []) if x is not None]
    if loads:
        print(f"1-minute load average during the runs: {min(loads):.2f}–{max(loads):.2f}")
    # The parameter counts must agree, else the two models differ.
    for size in sizes:
        counts = {impl: {l["num_params"] for l in by.get((impl, size), [])} for impl in ("ours", "official")}
        if counts["ours"] and counts["official"] and counts["ours"] != counts["official"]:
            print(f"warning: size {size} parameter counts differ: ours {counts['ours']}, official {counts['official']}")
    for row in rows:
        print(json.dumps(row))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("time")
    t.add_argument("checkout")
    t.add_argument("--model-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 5])
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--repeats", type=int, default=10)
    t.add_argument("--round", type=int, default=1)
    t.add_argument("--seed", type=int, default=1)
    s = sub.add_parser("summary")
    s.add_argument("file")
    args = parser.parse_args()
    if args.command == "time":
        time_official(args)
    else:
        summary(args)


if __name__ == "__main__":
    main()
