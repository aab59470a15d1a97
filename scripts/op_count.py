"""Counts the torch operators a call dispatches: the one rule by which `tdmpc2 bench --cases
agent` counts ours (the binary embeds this file and runs it in its interpreter, which shares
the process's libtorch) and scripts/compare_official.py counts the official code's.

Every `aten::` event torch's profiler records is an operator; `top_level` leaves out those
called inside another operator (aten::addmm inside aten::linear, say); `host_syncs` counts the
operators that must wait for the device to hand a value to the host (a scalar read, or a
nonzero whose size depends on the data): a CUDA graph cannot hold them.

With TDMPC2_OP_DETAIL set, each count also prints its operators by name, by caller and by
profiled self time to stderr; TDMPC2_OP_SHAPES=<operator> adds that operator's input shapes."""

import os

# libkineto, which starts with the first profile, logs its CPU-only start-up as errors.
os.environ.setdefault("KINETO_LOG_LEVEL", "5")

import torch  # noqa: E402


def start(record_shapes=False):
    record_shapes = record_shapes or bool(os.environ.get("TDMPC2_OP_SHAPES"))
    profile = torch.autograd.profiler.profile(record_shapes=record_shapes)
    profile.__enter__()
    return profile


def start_trace():
    return start(record_shapes=True)


def stop_trace(profile):
    """Every operator recorded since `start_trace`, in order, with its scalar arguments: two
    calls whose traces are equal dispatch the same work with the same host values, so a graph
    captured from one replays the other."""
    profile.__exit__(None, None, None)
    return [
        f"{e.name}{list(getattr(e, 'concrete_inputs', None) or [])}"
        for e in profile.function_events
        if e.name.startswith("aten::")
    ]


def _inside_an_operator(event):
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return True
        parent = parent.cpu_parent
    return False


HOST_SYNCS = ("aten::_local_scalar_dense", "aten::nonzero")


def stop(profile):
    """(operators, top-level operators, host syncs) recorded since `start`."""
    profile.__exit__(None, None, None)
    ops = [e for e in profile.function_events if e.name.startswith("aten::")]
    top_level = sum(1 for e in ops if not _inside_an_operator(e))
    if os.environ.get("TDMPC2_OP_DETAIL"):
        import collections
        import sys

        every = collections.Counter(e.name for e in ops)
        top = collections.Counter(e.name for e in ops if not _inside_an_operator(e))
        print(f"operators ({len(ops)} in all, {top_level} top-level):", file=sys.stderr)
        for name, n in every.most_common():
            print(f"  {n:6d} {top[name]:6d} {name}", file=sys.stderr)
        def root(e):
            r = e
            while e.cpu_parent is not None:
                e = e.cpu_parent
                if e.name.startswith("aten::"):
                    r = e
            return r.name
        inside = collections.Counter((root(e), e.name) for e in ops if _inside_an_operator(e))
        for (r, name), n in inside.most_common(40):
            print(f"  {n:6d} {r} > {name}", file=sys.stderr)
        # Self time under the profiler (which adds its own per-operator cost): where time goes.
        spent = collections.Counter()
        for e in ops:
            spent[e.name] += e.self_cpu_time_total
        if os.environ.get("TDMPC2_OP_SHAPES"):
            shaped = collections.Counter(
                (e.name, str(e.input_shapes), str(getattr(e, "concrete_inputs", "")))
                for e in ops if e.name == os.environ["TDMPC2_OP_SHAPES"])
            for key, n in shaped.most_common(30):
                print(f"  {n:6d} {key}", file=sys.stderr)
        total = sum(spent.values())
        print(f"self time by operator ({total / 1e3:.1f} ms in all, profiled):", file=sys.stderr)
        for name, us in spent.most_common(25):
            print(f"  {us / 1e3:8.2f} ms {every[name]:6d} {name}", file=sys.stderr)
    return len(ops), top_level, sum(1 for e in ops if e.name in HOST_SYNCS)


def count(call):
    """(operators, top-level operators, host syncs) of one `call()`."""
    profile = start()
    try:
        call()
    finally:
        counts = stop(profile)
    return counts


def start_kernels():
    profile = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    )
    profile.__enter__()
    return profile


def stop_kernels(profile):
    """[(name, launches, device µs)] of every kernel, copy and set the device ran since
    `start_kernels`, the most device time first: where a call's GPU time goes."""
    import collections

    profile.__exit__(None, None, None)
    launches, spent = collections.Counter(), collections.Counter()
    for e in profile.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            launches[e.name] += 1
            spent[e.name] += e.time_range.elapsed_us()
    return [(name, launches[name], float(us)) for name, us in spent.most_common()]
