"""Times the official TD-MPC2 agent's plan and update, and its online trainer, on the CPU or on
CUDA, and summarises comparisons.

Used by scripts/compare_official.sh; three subcommands:

  time OFFICIAL_CHECKOUT --model-sizes 1,5 --dims walker|dog --device cpu|cuda
          --compile true|false --threads 2 --repeats 10 --round R
      builds the official agent (the official config.yaml and model-size presets, walker-run or
      dog-run dimensions, `compile` as given) and prints one JSON line per model size in the
      form of `tdmpc2 bench --cases agent`, with "impl": "official". Without compile one
      warm-up call precedes the timed calls, as in our bench. With compile (torch.compile of
      `_update` and `_plan`, mode reduce-overhead: inductor, and CUDA graphs on CUDA) the first
      calls compile (and on CUDA record the graphs): calls are made until three in a row take at
      most 1.5 times the fastest call so far (at most 50 calls); the calls before those three
      are the warm-up ("plan_warmup_s", "plan_warmup_calls", "plan_first_call_s", "plan_settled";
      the same for update), reported apart from the medians of the timed calls that follow.
      Compiling starts from an empty inductor and Triton cache in every process (a cold start,
      as on a fresh machine). On CUDA every timed call is bracketed by torch.cuda.synchronize().
      On the CPU without compile the operators of one plan and one update are counted by
      scripts/op_count.py, the rule our bench applies to ours.
  trainer OFFICIAL_CHECKOUT --model-sizes 1 --device cpu|cuda --compile true|false --steps N
          --seed-steps S --threads 2
      runs the official OnlineTrainer (trainer/online_trainer.py; common/buffer.py on torchrl;
      envs.make_env's dm_control walker-run, one environment) for S seeding steps (random
      actions; at step S it pretrains with S updates) and then N agent steps (plan, environment
      step, update), and prints one JSON line per size: agent steps/s over the N steps (from
      the first planned step to the end: the window `tdmpc2 bench --cases loop` reports for
      ours), the rate of the median step, the leading steps that compiling slowed (the three-in-
      a-row rule above, against the median step) and the seconds of seeding and pretraining. No
      evaluation (eval_episodes=0), logs, videos, checkpoints or W&B: the official Logger is
      replaced by one that drops everything. Needs torchrl and gymnasium 0.29.1 (see
      scripts/official_env.sh).
  summary FILE
      reads the JSON lines of all rounds (ours and official) and prints the side-by-side table.

The official config is resolved as its parser does for a single state-based task (without
hydra: config.yaml, the model-size preset, the derived settings) into a dataclass, as
common/parser.py's cfg_to_dataclass makes it. train.py's TORCH_LOGS=+recompiles is not set
(its guard dumps run to thousands of lines); with compile the lines count instead what Dynamo
compiled ("dynamo": graphs, graph breaks, frames). The process sets what train.py sets before it
starts: LAZY_LEGACY_OP=0, TORCHDYNAMO_INLINE_INBUILT_NN_MODULES=1, and on CUDA
torch.set_float32_matmul_precision('high') (TF32, as our trainer on CUDA) and cudnn.benchmark.

On CUDA nothing of the official code is changed or adapted: it runs on cuda:0 as it is. To run
it on the CPU, things are adapted at run time, none of which touches its numerics:
  - the constructors hard-code `torch.device('cuda:0')`: while the agent is built, the `torch`
    name inside the official modules `tdmpc2` and `common.scale` is a view of torch whose
    `device(...)` is the CPU; it is put back before anything is timed. The trainer's buffer
    (common.buffer) keeps such a view, whose `cuda.mem_get_info()` reports no free memory, so
    that it stores and samples on the CPU;
  - its Adam optimisers are created with `capturable=True`, which torch allows only for
    accelerator tensors: the flag is turned off on the CPU (it only keeps the step count on
    the device so that CUDA graphs can capture the step).
Matmuls run at torch's default float32 precision on the CPU on both sides (neither sets it).
"""

import argparse
import atexit
import contextlib
import dataclasses
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import types
from typing import Any

# Walker-run as the official DMC wrapper gives it (500 steps after action repeat 2), as in
# `tdmpc2 bench --tasks walker-run`.
TASK, OBS_DIM, ACTION_DIM, EPISODE_LENGTH = "walker-run", 24, 6, 500
# --dims: the task whose dimensions are timed: (task, obs_dim, action_dim, episode_length), as
# the official dm_control wrappers give them (checked with envs.make_env).
DIMS = {"walker": (TASK, OBS_DIM, ACTION_DIM, EPISODE_LENGTH), "dog": ("dog-run", 223, 38, 500)}
# The official model-size presets both sides can time.
MODEL_SIZES = (1, 5, 19, 48)
# Compile warm-up: calls until SETTLE_CALLS in a row take at most SETTLE_FACTOR × the fastest.
SETTLE_CALLS, SETTLE_FACTOR, MAX_WARMUP_CALLS = 3, 1.5, 50


def load_average():
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except OSError:
        return None


def official_config(checkout, model_size, overrides=None, dims="walker"):
    """The official config as its parser resolves it for a single state-based task with the
    dimensions of `dims`, then `overrides` (e.g. scripts/record_parity.py's pixel settings)."""
    import yaml
    from common import MODEL_SIZE

    task, obs_dim, action_dim, episode_length = DIMS[dims]
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
        task=task,
        obs="state",
        model_size=model_size,
        compile=False,
        multitask=False,
        task_dim=0,
        tasks=[task],
        obs_shape={"state": (obs_dim,)},
        action_dim=action_dim,
        episode_length=episode_length,
        seed_steps=max(1000, 5 * episode_length),
        bin_size=(values["vmax"] - values["vmin"]) / (values["num_bins"] - 1),
        work_dir="/nonexistent",
        task_title=task.replace("-", " ").title(),
    )
    values.update(overrides or {})

    # As common/parser.py's cfg_to_dataclass: a dataclass (torch.compile guards on it).
    fields = [
        (key, Any, dataclasses.field(default_factory=lambda value_=value: value_))
        for key, value in values.items()
    ]
    Config = dataclasses.make_dataclass("Config", fields)

    def get(self, key, default=None):
        return getattr(self, key, default)

    Config.get = get
    return Config()


class _CpuTorch(types.ModuleType):
    """torch, except that every `torch.device(...)` is the CPU and no CUDA memory is free."""

    def __init__(self, torch):
        super().__init__("torch")
        self._torch = torch
        self.cuda = types.SimpleNamespace(mem_get_info=lambda *args, **kwargs: (0, 0))

    def __getattr__(self, name):
        return getattr(self._torch, name)

    def device(self, *args, **kwargs):
        return self._torch.device("cpu")

    def tensor(self, *args, **kwargs):
        # The multitask discounts are made on 'cuda:0' by name.
        kwargs.pop("device", None)
        return self._torch.tensor(*args, **kwargs)


def make_agent(cfg, device="cpu"):
    """The official agent of `cfg`: as it is on CUDA, adapted on the CPU (see the top)."""
    import torch
    import common.scale
    import tdmpc2 as official

    if device != "cpu":
        return official.TDMPC2(cfg)
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
    return agent


def build_agent(checkout, model_size, overrides=None, device="cpu", dims="walker"):
    cfg = official_config(checkout, model_size, overrides, dims)
    return make_agent(cfg, device), cfg


def torch_version(torch):
    return tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])


def work_around_randperm_pattern(torch):
    """torch 2.11's inductor fails to compile the official Q (`out[torch.randperm(num_q)[:2]]`,
    common/world_model.py) on any device: its joint-graph pattern `randperm_index_pattern` was
    traced with the slice elided, so matching raises "Not all inputs to pattern found in
    match.kwargs ... slice_shape" (pytorch/pytorch#183988, fixed by #184276). That pattern only
    swaps `index` for `_unsafe_index` (no bounds checks; the same values), so it is left
    unregistered, on torch < 2.12 only. Returns whether it was."""
    if torch_version(torch) >= (2, 12):
        return False
    from torch._inductor.fx_passes import misc_patterns

    register = misc_patterns.register_replacement

    def register_but_that(search_fn, *args, **kwargs):
        if getattr(search_fn, "__name__", "") == "randperm_index_pattern":
            return False
        return register(search_fn, *args, **kwargs)

    misc_patterns.register_replacement = register_but_that
    return True


def prepare(args):
    """What train.py sets before torch starts, an empty compile cache, the official modules on
    the path; returns torch, the device name and a synchronising function."""
    os.environ.setdefault("LAZY_LEGACY_OP", "0")
    os.environ.setdefault("TORCHDYNAMO_INLINE_INBUILT_NN_MODULES", "1")
    if args.compile:
        cache = tempfile.mkdtemp(prefix="tdmpc2_official_compile.")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        os.environ["TRITON_CACHE_DIR"] = os.path.join(cache, "triton")
        atexit.register(shutil.rmtree, cache, True)
    sys.path.insert(0, os.path.join(os.path.abspath(args.checkout), "tdmpc2"))
    import torch

    torch.set_num_threads(args.threads)
    args.randperm_workaround = args.compile and work_around_randperm_pattern(torch)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("compare_official.py: --device cuda: torch sees no GPU")
        torch.set_float32_matmul_precision("high")
        torch.backends.cudnn.benchmark = True
        return torch, "Cuda(0)", torch.cuda.synchronize
    return torch, "Cpu", lambda: None


def timed_ms(f, sync):
    sync()
    start = time.perf_counter()
    f()
    sync()
    return (time.perf_counter() - start) * 1e3


def settled_at(times, reference):
    """The index of the first of SETTLE_CALLS calls in a row that each take at most
    SETTLE_FACTOR × `reference`, or None."""
    for i in range(len(times) - SETTLE_CALLS + 1):
        if all(t <= SETTLE_FACTOR * reference for t in times[i : i + SETTLE_CALLS]):
            return i
    return None


def time_calls(repeats, f, sync, compiled):
    """(ms of `repeats` timed calls, ms of each warm-up call before them, settled): one warm-up
    call, or with `compiled` the calls until SETTLE_CALLS in a row settle (those not counted)."""
    if not compiled:
        return [timed_ms(f, sync) for _ in range(repeats + 1)][1:], None, True
    calls, settled = [], False
    while len(calls) < MAX_WARMUP_CALLS:
        calls.append(timed_ms(f, sync))
        # The first call always compiles: it is warm-up whatever it took.
        if len(calls) > SETTLE_CALLS and settled_at(calls[-SETTLE_CALLS:], min(calls)) == 0:
            settled = True
            break
    warmup = calls[:-SETTLE_CALLS]
    return [timed_ms(f, sync) for _ in range(repeats)], warmup, settled


def dynamo_counts(torch):
    """What Dynamo has compiled in this process: graphs, graph breaks and frames."""
    from torch._dynamo.utils import counters

    return {
        "graphs": counters["stats"]["unique_graphs"],
        "graph_breaks": sum(counters["graph_break"].values()),
        "frames": counters["frames"]["ok"],
    }


def since(after, before):
    return {key: after[key] - before[key] for key in after}


def time_official(args):
    torch, device_name, sync = prepare(args)
    torch.manual_seed(args.seed)
    task, obs_dim, action_dim, _ = DIMS[args.dims]
    device = "cpu" if args.device == "cpu" else "cuda"
    for size in args.model_sizes:
        if args.compile:
            torch._dynamo.reset()  # each size compiles afresh (and within the recompile limit)
        load_before = load_average()
        compiled_before = dynamo_counts(torch)
        overrides = {"compile": args.compile}
        # The constructor prints the episode length and discount.
        with contextlib.redirect_stdout(io.StringIO()):
            agent, cfg = build_agent(args.checkout, size, overrides, device, args.dims)
        h, b = cfg.horizon, cfg.batch_size
        on = agent.device
        batch = (
            torch.randn(h + 1, b, obs_dim, device=on),
            torch.rand(h, b, action_dim, device=on) * 2 - 1,
            torch.randn(h, b, 1, device=on),
            torch.zeros(h, b, 1, device=on),
            None,
        )
        buffer = types.SimpleNamespace(sample=lambda: batch)
        # As the environment gives it: on the CPU; `act` moves it.
        obs = torch.randn(obs_dim)

        update_times, update_warmup, update_settled = time_calls(
            args.repeats, lambda: agent.update(buffer), sync, args.compile
        )
        first = [True]

        def plan():
            t0, first[0] = first[0], False
            agent.act(obs, t0=t0)

        plan_times, plan_warmup, plan_settled = time_calls(args.repeats, plan, sync, args.compile)
        line = {
            "case": "agent",
            "impl": "official",
            "round": args.round,
            "model_size": size,
            "task": task,
            "obs_dim": obs_dim,
            "action_dim": action_dim,
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
        }
        if args.device == "cpu" and not args.compile:
            import op_count  # beside this file

            plan_ops = op_count.count(plan)
            update_ops = op_count.count(lambda: agent.update(buffer))
            line["plan_ops"] = dict(zip(("ops", "top_level", "host_syncs"), plan_ops))
            line["update_ops"] = dict(zip(("ops", "top_level", "host_syncs"), update_ops))
        for call, warmup, settled in (
            ("plan", plan_warmup, plan_settled),
            ("update", update_warmup, update_settled),
        ):
            if warmup is not None:
                line[f"{call}_warmup_s"] = sum(warmup) / 1e3
                line[f"{call}_warmup_calls"] = len(warmup)
                line[f"{call}_first_call_s"] = warmup[0] / 1e3
                line[f"{call}_settled"] = settled
        if args.compile:
            line["dynamo"] = since(dynamo_counts(torch), compiled_before)
        line.update(
            {
                "compile": args.compile,
                "inductor_randperm_workaround": args.randperm_workaround,
                "device": device_name,
                "threads": torch.get_num_threads(),
                "batch_size": b,
                "torch": torch.__version__,
                "load_average": [load_before, load_average()],
            }
        )
        if args.device == "cuda":
            line["gpu"] = torch.cuda.get_device_name(0)
            line["tf32"] = torch.get_float32_matmul_precision() != "highest"
        print(json.dumps(line), flush=True)
        del agent, batch, buffer
        if args.device == "cuda":
            torch.cuda.empty_cache()


class _NoLogger:
    """The official Logger's calls that the online trainer makes, dropping everything."""

    video = None

    def log(self, metrics, category="train"):
        pass

    def finish(self, agent=None):
        pass


def time_trainer(args):
    import warnings

    warnings.filterwarnings("ignore")  # as train.py
    torch, device_name, sync = prepare(args)
    import common.buffer
    from common.seed import set_seed
    from envs import make_env
    from trainer.online_trainer import OnlineTrainer

    device = "cpu" if args.device == "cpu" else "cuda"
    for size in args.model_sizes:
        if args.compile:
            torch._dynamo.reset()
        load_before = load_average()
        compiled_before = dynamo_counts(torch)
        log = io.StringIO()  # the trainer's prints (the architecture, the buffer's size)
        overrides = {
            "compile": args.compile,
            "seed": args.seed,
            "eval_episodes": 0,
            "save_video": False,
            "save_agent": False,
            "save_csv": False,
            "enable_wandb": False,
        }
        cfg = official_config(args.checkout, size, overrides, "walker")
        real_torch = common.buffer.torch
        try:
            with contextlib.redirect_stdout(log):
                set_seed(cfg.seed)
                env = make_env(cfg)  # sets the dimensions and seed_steps from the environment
                cfg.seed_steps = args.seed_steps
                cfg.steps = args.seed_steps + args.steps
                agent = make_agent(cfg, device)
                if device == "cpu":
                    common.buffer.torch = _CpuTorch(torch)
                buffer = common.buffer.Buffer(cfg)
                trainer = OnlineTrainer(
                    cfg=cfg, env=env, agent=agent, buffer=buffer, logger=_NoLogger()
                )
                marks, updates = [], []
                act, update = agent.act, agent.update

                def timed_act(*a, **k):
                    marks.append(time.perf_counter())
                    return act(*a, **k)

                def timed_update(*a, **k):
                    if not updates:
                        sync()
                        updates.append(time.perf_counter())
                    return update(*a, **k)

                agent.act, agent.update = timed_act, timed_update
                start = time.perf_counter()
                trainer.train()
                sync()
                end = time.perf_counter()
        except BaseException:
            sys.stderr.write(log.getvalue())
            raise
        finally:
            common.buffer.torch = real_torch
        if len(marks) != args.steps or not updates:
            raise SystemExit(
                f"compare_official.py trainer: expected {args.steps} planned steps after "
                f"{args.seed_steps} seeding steps, saw {len(marks)} (updates: {len(updates)})"
            )
        steps_ms = [(b - a) * 1e3 for a, b in zip(marks, marks[1:] + [end])]
        median = statistics.median(steps_ms)
        warm = settled_at(steps_ms, median)
        warm = len(steps_ms) if warm is None else warm
        line = {
            "case": "trainer",
            "impl": "official",
            "task": cfg.task,
            "model_size": size,
            "num_envs": 1,
            "seed_steps": args.seed_steps,
            "steps": args.steps,
            "agent_steps_per_second": args.steps / (end - marks[0]),
            "steady_agent_steps_per_second": 1e3 / median,
            "step_ms_median": median,
            "step_ms_min": min(steps_ms),
            "warmup_steps": warm,
            "warmup_s": sum(steps_ms[:warm]) / 1e3,
            "seeding_s": updates[0] - start,
            "pretraining_s": marks[0] - updates[0],
            "compile": args.compile,
            "inductor_randperm_workaround": args.randperm_workaround,
            "device": device_name,
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "load_average": [load_before, load_average()],
        }
        if args.compile:
            line["dynamo"] = since(dynamo_counts(torch), compiled_before)
        if args.device == "cuda":
            line["gpu"] = torch.cuda.get_device_name(0)
        print(json.dumps(line), flush=True)
        del trainer, agent, buffer, env
        if args.device == "cuda":
            torch.cuda.empty_cache()


def digits_for(value):
    """Decimals that give milliseconds three significant digits or so (CPU: 100s, GPU: 1s)."""
    return 0 if value >= 100 else 1 if value >= 10 else 2


def spread(values, digits=0):
    low, high = min(values), max(values)
    fmt = f"{{:.{digits}f}}"
    return fmt.format(low) if fmt.format(low) == fmt.format(high) else f"{fmt.format(low)}–{fmt.format(high)}"


def agent_lines(lines):
    """The `agent` lines by (impl, model size); ours timed as CUDA graphs (`bench --cases
    graphs`, one environment) in the same form, with our fused kernels as impl "ours_fused"."""
    by = {}
    for line in lines:
        if line.get("case") == "graphs" and line.get("num_envs") == 1:
            line = dict(
                line,
                impl="ours_fused" if line.get("fused_kernels") else line["impl"],
                case="agent",
                plan_ms=line["plan_ms"]["graph"],
                plan_ms_min=line["plan_ms"]["graph_min"],
                update_ms=line["update_ms"]["graph"],
                update_ms_min=line["update_ms"]["graph_min"],
                graphs=True,
            )
        if line.get("case") == "agent":
            by.setdefault((line["impl"], line["model_size"]), []).append(line)
    return by


def setting(lines, key, default="?"):
    values = sorted({str(l[key]) for l in lines if key in l})
    return ",".join(values) if values else default


def summary(args):
    lines = []
    with open(args.file) as f:
        for text in f:
            text = text.strip()
            if text.startswith("{"):
                lines.append(json.loads(text))
    by = agent_lines(lines)
    sizes = sorted({size for _, size in by})
    official = [l for (impl, _), ls in by.items() if impl == "official" for l in ls]
    ours = [l for (impl, _), ls in by.items() if impl == "ours" for l in ls]
    compiled = any(l.get("compile") for l in official)
    device = setting(official, "device")
    gpu = setting(official, "gpu", "")
    dims = ", ".join(
        sorted({f"{l['task']} dims (obs {l['obs_dim']}, action {l['action_dim']})" for l in official})
    )
    ours_mode = (
        "CUDA graphs (bench --cases graphs)"
        if any(l.get("graphs") for l in ours)
        else "eager (bench --cases agent)"
    )
    print()
    print(
        f"{device}{' (' + gpu + ')' if gpu else ''}, {dims or 'no official lines'}, batch 256,"
        f" threads {setting(lines, 'threads')}; official compile={str(compiled).lower()}"
        + (" (torch.compile, mode reduce-overhead)" if compiled else "")
        + f", ours {ours_mode}"
    )
    print(
        "ms per call: the lowest of the rounds' medians (range over rounds), each round's"
        " ratio of medians, and the fastest single call of all rounds (ours / official);"
        " ratio = official / ours"
        + (
            "; warm-up: the official compile warm-up in s (range over rounds) and its calls,"
            " apart from the medians"
            if compiled
            else ""
        )
    )
    header = (
        f"{'size':>4}  {'call':<13}  {'ours':>17}  {'official':>17}  {'ratio':>6}  "
        f"{'per round':<22}  {'fastest':>15}  {'ratio':>6}"
        + (f"  {'warm-up s':>16}" if compiled else "")
    )
    print(header)
    print("-" * len(header))
    rows = []
    fused = any(impl == "ours_fused" for impl, _ in by)
    variants = [("ours", "")] + ([("ours_fused", " fused")] if fused else [])
    for size, (impl, label) in ((size, v) for size in sizes for v in variants):
        ours, theirs = by.get((impl, size), []), by.get(("official", size), [])
        if not ours or not theirs:
            print(f"{size:>4}  missing measurements ({impl} {len(ours)}, official {len(theirs)})")
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
            da, db = digits_for(min(a)), digits_for(min(b))
            ours_text = f"{min(a):.{da}f} ({spread(a, da)})"
            theirs_text = f"{min(b):.{db}f} ({spread(b, db)})"
            per_round_text = " ".join(f"{x:.2f}" for x in per_round)
            fastest_text = f"{a_min:.{digits_for(a_min)}f} / {b_min:.{digits_for(b_min)}f}"
            warmup = [l[f"{call}_warmup_s"] for l in theirs if f"{call}_warmup_s" in l]
            calls = [l[f"{call}_warmup_calls"] for l in theirs if f"{call}_warmup_calls" in l]
            unsettled = sum(1 for l in theirs if l.get(f"{call}_settled") is False)
            warmup_text = ""
            if compiled:
                warmup_text = (
                    f"{spread(warmup, 1)} ({spread(calls)} calls)" if warmup else "-"
                ) + ("!" if unsettled else "")
            print(
                f"{size:>4}  {call + label:<13}  {ours_text:>17}  {theirs_text:>17}  {ratio:>5.2f}×  "
                f"{per_round_text:<22}  {fastest_text:>15}  {b_min / a_min:>5.2f}×"
                + (f"  {warmup_text:>16}" if compiled else "")
            )
            row = {
                "case": "compare",
                "model_size": size,
                "call": call,
                "fused_kernels": impl == "ours_fused",
                "device": device,
                "compile": compiled,
                "ours_ms": a,
                "official_ms": b,
                "ratio": ratio,
                "ratio_per_round": per_round,
                "ours_ms_min": a_min,
                "official_ms_min": b_min,
                "ratio_min": b_min / a_min,
            }
            if warmup:
                row.update(official_warmup_s=warmup, official_warmup_calls=calls)
            rows.append(row)
    if compiled and any(l.get(f"{c}_settled") is False for l in official for c in ("plan", "update")):
        print(f"!: in some round the calls did not settle within {MAX_WARMUP_CALLS} calls")
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
    rows += trainer_summary(lines)
    loads = [x for l in lines for x in (l.get("load_average") or []) if x is not None]
    if loads:
        print(f"1-minute load average during the runs: {min(loads):.2f}–{max(loads):.2f}")
    # The parameter counts must agree, else the two models differ.
    for size in sizes:
        counts = {impl: {l["num_params"] for l in by.get((impl, size), []) if "num_params" in l}
                  for impl in ("ours", "official")}
        if counts["ours"] and counts["official"] and counts["ours"] != counts["official"]:
            print(f"warning: size {size} parameter counts differ: ours {counts['ours']}, official {counts['official']}")
    for row in rows:
        print(json.dumps(row))


def trainer_summary(lines):
    """The trainer lines: ours (`bench --cases loop`, one row per environment count, and with
    our fused kernels where they were measured) against the official OnlineTrainer (one
    environment)."""
    ours = {}
    for l in lines:
        if l.get("case") == "loop" and l.get("impl") == "ours":
            fused = "fused_kernels=true" in (l.get("settings") or [])
            ours[(l["model_size"], l.get("num_envs", 1), fused)] = l
    theirs = {l["model_size"]: l for l in lines if l.get("case") == "trainer"}
    if not ours and not theirs:
        return []
    rows = []
    some = next(iter(theirs.values()), None) or next(iter(ours.values()))
    print()
    print(
        f"trainer: agent steps/s on walker-run after seeding (official: 1 environment,"
        f" {setting(list(theirs.values()), 'seed_steps')} seeding steps; ours: 500 seeding steps"
        " an environment, one update per vector step), over"
        f" {setting(list(theirs.values()), 'steps')} steps (from the first planned step to the"
        f" end), {some.get('device')}, compile={str(some.get('compile')).lower()}; steady: the"
        " median step's rate; warm-up: the leading steps slower than 1.5× the median step;"
        " speed-up = ours / official"
    )
    header = (
        f"{'size':>4}  {'ours run':<12}  {'ours':>8}  {'official':>8}  {'speed-up':>8}  {'steady':>8}  "
        f"{'warm-up':>16}  {'seeding s':>9}  {'pretrain s':>10}"
    )
    print(header)
    print("-" * len(header))
    for size in sorted({key[0] for key in ours} | set(theirs)):
        b = theirs.get(size)
        variants = sorted(key for key in ours if key[0] == size) or [(size, 1, False)]
        for row, key in enumerate(variants):
            _, envs, fused = key
            a = ours.get(key)
            a_rate = a["agent_steps_per_second"] if a else None
            b_rate = b["agent_steps_per_second"] if b else None
            label = f"{envs} env{'s' if envs > 1 else ''}{' fused' if fused else ''}"
            cells = [
                f"{a_rate:.1f}" if a_rate else "-",
                f"{b_rate:.1f}" if b_rate else "-",
                f"{a_rate / b_rate:.2f}×" if a_rate and b_rate else "-",
                f"{b['steady_agent_steps_per_second']:.1f}" if b else "-",
                f"{b['warmup_s']:.1f} s ({b['warmup_steps']} st)" if b else "-",
                f"{b['seeding_s']:.1f}" if b else "-",
                f"{b['pretraining_s']:.1f}" if b else "-",
            ]
            if row > 0:
                cells[3:] = [""] * 4  # the official trainer's own figures, once a size
            print(
                f"{size:>4}  {label:<12}  {cells[0]:>8}  {cells[1]:>8}  {cells[2]:>8}  "
                f"{cells[3]:>8}  {cells[4]:>16}  {cells[5]:>9}  {cells[6]:>10}".rstrip()
            )
            rows.append(
                {
                    "case": "compare_trainer",
                    "model_size": size,
                    "num_envs": envs,
                    "fused_kernels": fused,
                    "ours_agent_steps_per_second": a_rate,
                    "official_agent_steps_per_second": b_rate,
                    "official_steady_agent_steps_per_second": b and b["steady_agent_steps_per_second"],
                    "speedup": a_rate / b_rate if a_rate and b_rate else None,
                }
            )
    return rows


def flag(text):
    if text not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")
    return text == "true"


def sizes(text):
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or any(v not in MODEL_SIZES for v in values):
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of {', '.join(map(str, MODEL_SIZES))}, got '{text}'"
        )
    return values


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("time", "trainer"):
        t = sub.add_parser(name)
        t.add_argument("checkout")
        t.add_argument("--model-sizes", type=sizes, default=[1, 5])
        t.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
        t.add_argument("--compile", type=flag, default=False)
        t.add_argument("--threads", type=int, default=2)
        t.add_argument("--seed", type=int, default=1)
        if name == "time":
            t.add_argument("--dims", choices=sorted(DIMS), default="walker")
            t.add_argument("--repeats", type=int, default=10)
            t.add_argument("--round", type=int, default=1)
        else:
            t.add_argument("--steps", type=int, default=100)
            t.add_argument("--seed-steps", type=int, default=EPISODE_LENGTH)
    s = sub.add_parser("summary")
    s.add_argument("file")
    args = parser.parse_args()
    if args.command == "time":
        time_official(args)
    elif args.command == "trainer":
        if args.steps < 1 or args.seed_steps < EPISODE_LENGTH:
            parser.error(f"trainer needs --steps >= 1 and --seed-steps >= {EPISODE_LENGTH} (one episode)")
        time_trainer(args)
    else:
        summary(args)


if __name__ == "__main__":
    main()
