#!/usr/bin/env python3
"""Time to return: walker-run at model size 5 with graphs, one named run after another within one
deadline, each watched for its first evaluation at or above the target return.

    time_to_return.py --bin TDMPC2 --out DIR --runs official-ratio,spu16 [--seconds 540]
                      [--grace 60] [--target 700] [KEY=VALUE ...]

The runs (RUNS below) differ in how many updates each agent step pays for. A run that stops at
the target is interrupted (SIGINT: the trainer saves and ends) once an evaluation reaches it;
every run is interrupted `--grace` seconds before the shared deadline and killed at it, so that
the script ends by then. Trailing KEY=VALUE overrides go to every run
after its own settings (device=cpu model_size=1 ... for a check without a GPU).

Into DIR: walker-NAME/metrics.jsonl and walker-NAME/config.yaml (for `tdmpc2 plot`), one summary
line a run in walker.jsonl (returns at 25k/50k/100k/200k agent steps, agent steps/s after
seeding, the first evaluation at the target: its step, the trainer's clock and the wall time
since the process started) and every run's log in walker.log.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

# name: (settings, whether the run ends at the target return)
RUNS = {
    # The official update-to-data ratio: one update per agent step, to 100k agent steps.
    "official-ratio": (
        "num_envs=4 steps_per_update=1 steps=100000 eval_freq=25000 eval_episodes=10",
        False,
    ),
    # One update per 4 and per 16 agent steps, until the target or 300k agent steps.
    "spu4": (
        "num_envs=16 steps_per_update=4 steps=300000 eval_freq=25000 eval_episodes=16",
        True,
    ),
    "spu16": (
        "num_envs=16 steps_per_update=16 steps=300000 eval_freq=25000 eval_episodes=16",
        True,
    ),
    # The same, each update on a batch as many times larger as it has fewer updates (so as many
    # samples per agent step as the official's), its rate scaled by the square root of that, as
    # lr_scale=sqrt does across ranks: on a GPU a larger batch costs little while the update is
    # bound by its kernel launches.
    "spu4-b1024": (
        "num_envs=16 steps_per_update=4 batch_size=1024 lr=6e-4 steps=300000 eval_freq=25000 "
        "eval_episodes=16",
        True,
    ),
    "spu16-b4096": (
        "num_envs=16 steps_per_update=16 batch_size=4096 lr=1.2e-3 steps=300000 eval_freq=25000 "
        "eval_episodes=16",
        True,
    ),
}
COMMON = "task=walker-run model_size=5 seed=1 device=cuda compile=true save_freq=100000000"
MILESTONES = (25_000, 50_000, 100_000, 200_000)
RATE_LINE = re.compile(r"\(([0-9.]+) agent steps/s after seeding\)")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", required=True, help="the tdmpc2 binary")
    parser.add_argument("--out", required=True, help="where the metrics and summaries go")
    parser.add_argument("--runs", required=True, help=f"comma-separated, of: {', '.join(RUNS)}")
    parser.add_argument("--seconds", type=float, default=540, help="deadline for all runs")
    parser.add_argument("--grace", type=float, default=60,
                        help="seconds a run has to end after SIGINT (within --seconds)")
    parser.add_argument("--target", type=float, default=700, help="the return to reach")
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE for every run, after its own")
    args = parser.parse_args()
    args.runs = [r for r in args.runs.split(",") if r]
    unknown = [r for r in args.runs if r not in RUNS]
    if unknown or not args.runs:
        parser.error(f"--runs {','.join(unknown) or '(none)'}: allowed: {', '.join(RUNS)}")
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        parser.error(f"overrides are KEY=VALUE, not: {' '.join(bad)}")
    if args.grace < 1 or args.seconds <= args.grace:
        parser.error(f"--seconds {args.seconds} --grace {args.grace}: need "
                     "1 <= grace < seconds")
    return args


class Watch:
    """The run's metrics.jsonl as it grows: its evaluations and training records."""

    def __init__(self, path):
        self.path, self.offset, self.partial = path, 0, ""
        self.evals, self.train = [], []

    def poll(self):
        try:
            with open(self.path) as f:
                f.seek(self.offset)
                text = f.read()
                self.offset = f.tell()
        except FileNotFoundError:
            return
        lines = (self.partial + text).split("\n")
        self.partial = lines.pop()
        for line in filter(str.strip, lines):
            record = json.loads(line)
            (self.evals if record.get("phase") == "eval" else self.train).append(record)


def stop(process, grace):
    """SIGINT (the trainer saves and ends), the process killed after `grace` seconds, and then
    whatever is left of its group (environment workers)."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=max(grace, 0.1))
    except subprocess.TimeoutExpired:
        pass
    reap(process)


def reap(process):
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def first_at(evals, target):
    return next((e for e in evals if e["episode_reward"] >= target), None)


def seed_steps(config_path):
    try:
        with open(config_path) as f:
            match = re.search(r"^seed_steps: *([0-9]+)", f.read(), re.M)
        return int(match.group(1)) if match else 0
    except FileNotFoundError:
        return 0


def rate_after_seeding(log_text, train, seeded):
    """The trainer's own figure when it finished; else from the training records after seeding
    (evaluations included)."""
    found = RATE_LINE.findall(log_text)
    if found:
        return float(found[-1]), "trainer"
    after = [r for r in train if r["step"] > seeded]
    if len(after) >= 2 and after[-1]["elapsed_time"] > after[0]["elapsed_time"]:
        steps = after[-1]["step"] - after[0]["step"]
        return steps / (after[-1]["elapsed_time"] - after[0]["elapsed_time"]), "records"
    return None, None


def keep(run_dir, saved):
    """Copies what `tdmpc2 plot` reads of the run into the output folder."""
    os.makedirs(saved, exist_ok=True)
    for kept in ("metrics.jsonl", "config.yaml"):
        if os.path.exists(os.path.join(run_dir, kept)):
            shutil.copy(os.path.join(run_dir, kept), saved)


# Seconds between copies of a running run's metrics (a device call killed outright keeps them).
KEEP_EVERY = 30


def run_one(args, name, deadline, scratch):
    settings, ends_at_target = RUNS[name]
    run_dir = os.path.join(scratch, f"walker-{name}")
    command = [args.bin, "train", *COMMON.split(), *settings.split(), *args.overrides]
    command.append(f"run_dir={run_dir}")
    log_path = os.path.join(scratch, f"walker-{name}.log")
    saved = os.path.join(args.out, f"walker-{name}")
    print(f"[time_to_return] {name}: {' '.join(command[1:])}", flush=True)
    started = time.monotonic()
    with open(log_path, "w") as log:
        # A group of its own (not a session), so that it and its environment workers can be
        # killed together, and a signal to the caller's group still reaches them.
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, process_group=0
        )
        watch, reached, why = Watch(os.path.join(run_dir, "metrics.jsonl")), None, "finished"
        kept_at = time.monotonic()
        try:
            while process.poll() is None:
                time.sleep(1)
                watch.poll()
                if time.monotonic() - kept_at >= KEEP_EVERY:
                    keep(run_dir, saved)
                    kept_at = time.monotonic()
                if reached is None:
                    hit = first_at(watch.evals, args.target)
                    if hit is not None:
                        reached = {
                            "step": hit["step"],
                            "elapsed_time": hit["elapsed_time"],
                            "wall_s": round(time.monotonic() - started, 1),
                        }
                        print(f"[time_to_return] {name}: {hit['episode_reward']:.1f} at step "
                              f"{hit['step']}, {reached['wall_s']} s", flush=True)
                        if ends_at_target:
                            why = "target"
                            stop(process, deadline - time.monotonic())
                if process.poll() is None and time.monotonic() >= deadline - args.grace:
                    why = "deadline"
                    stop(process, deadline - time.monotonic())
            reap(process)
        except BaseException:
            # Killed from outside (the device's limit): what the run logged still comes back.
            stop(process, grace=5)
            keep(run_dir, saved)
            with open(log_path) as f, open(os.path.join(args.out, "walker.log"), "a") as out:
                out.write(f"===== {name} (interrupted): {' '.join(command)}\n{f.read()}\n")
            raise
    watch.poll()
    wall = time.monotonic() - started
    if reached is None and first_at(watch.evals, args.target) is not None:
        # Written as the run ended, between two looks: its wall time is the run's at most.
        hit = first_at(watch.evals, args.target)
        reached = {"step": hit["step"], "elapsed_time": hit["elapsed_time"],
                   "wall_s": round(wall, 1)}
    with open(log_path) as f:
        log_text = f.read()
    if process.returncode != 0 and why == "finished":
        why = f"failed (exit {process.returncode})"
    keep(run_dir, saved)
    rate, rate_from = rate_after_seeding(
        log_text, watch.train, seed_steps(os.path.join(run_dir, "config.yaml"))
    )
    # The first evaluation at or past each milestone, with its own step.
    at = {}
    for milestone in MILESTONES:
        hit = next((e for e in watch.evals if e["step"] >= milestone), None)
        at[str(milestone)] = None if hit is None else [hit["step"], round(hit["episode_reward"], 1)]
    summary = {
        "run": name,
        "settings": " ".join([COMMON, settings, *args.overrides]),
        "ended": why,
        "wall_s": round(wall, 1),
        "last_logged_step": max([r["step"] for r in watch.evals + watch.train], default=0),
        "returns_at": at,
        "target": args.target,
        "first_at_target": reached,
        "steps_per_s_after_seeding": None if rate is None else round(rate, 1),
        "rate_from": rate_from,
        "evaluations": [
            [e["step"], round(e["episode_reward"], 1), round(e["elapsed_time"], 1)]
            for e in watch.evals
        ],
    }
    if why.startswith("failed"):
        summary["error"] = ([l for l in log_text.splitlines() if l.strip()] or [""])[-1]
    with open(os.path.join(args.out, "walker.jsonl"), "a") as f:
        f.write(json.dumps(summary) + "\n")
    with open(os.path.join(args.out, "walker.log"), "a") as f:
        f.write(f"===== {name}: {' '.join(command)}\n{log_text}\n")
    shown = {k: v for k, v in summary.items() if k not in ("run", "settings", "evaluations")}
    print(f"[time_to_return] {name}: {json.dumps(shown)}", flush=True)
    return why.startswith("failed")


def main():
    args = parse_args()
    # A SIGTERM (the device's time limit) ends the runs as Ctrl-C would: through the cleanup.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not os.access(args.bin, os.X_OK):
        sys.exit(f"--bin {args.bin}: not an executable")
    os.makedirs(args.out, exist_ok=True)
    deadline = time.monotonic() + args.seconds
    failed = False
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.runs:
            if time.monotonic() >= deadline - args.grace - 30:
                print(f"[time_to_return] {name}: skipped, the deadline is near", flush=True)
                failed = True
                continue
            failed |= run_one(args, name, deadline, scratch)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
