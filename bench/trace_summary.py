#!/usr/bin/env python3
"""Self time per operator in Kineto traces (flowtrain's profiles/*.json, or torch.profiler's).

    bench/trace_summary.py TRACE.json [TRACE.json ...] [--top 25] [--by name|shapes|parent]
                           [--steps N]

Self time is an op's duration minus the durations of the ops nested directly inside it on the
same thread (what Perfetto calls "self"). `--by shapes` keys by name and input shapes (the trace
needs `profile.record_shapes=true`), `--by parent` by name and the op it was called from
(e.g. aten::cat under SplitWithSizesBackward0). Times are divided by `--steps` (the number of
profiled steps in each file, flowtrain's `profile.num_steps`) to give ms per step.

Only the standard library: it runs in any Python 3, with or without torch.
"""
import argparse
import collections
import json
import sys


def cpu_ops(path):
    try:
        with open(path) as f:
            trace = json.load(f)
    except (OSError, ValueError) as err:  # missing, unreadable, or cut short (a run killed mid-write)
        sys.exit(f"trace_summary: {path}: {err}")
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [e for e in events
            if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation", "python_function")
            and "dur" in e]


def self_times(events, by):
    """Yields (key, self_us) for every op, nesting resolved per (pid, tid) by time containment."""
    threads = collections.defaultdict(list)
    for e in events:
        threads[(e.get("pid"), e.get("tid"))].append(e)
    for ops in threads.values():
        # Parents first: earlier start, and at equal start the longer one encloses the shorter.
        ops.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []  # open ops: [event, its parent's name, its children's summed duration]

        def pop():
            event, parent, children = stack.pop()
            return key_of(event, parent, by), event["dur"] - children

        for e in ops:
            while stack and e["ts"] >= stack[-1][0]["ts"] + stack[-1][0]["dur"]:
                yield pop()
            if stack:
                stack[-1][2] += e["dur"]
            stack.append([e, stack[-1][0]["name"] if stack else "", 0.0])
        while stack:
            yield pop()


def key_of(event, parent, by):
    name = event["name"]
    if by == "shapes":
        dims = event.get("args", {}).get("Input Dims")
        return f"{name} {dims}" if dims else name
    if by == "parent":
        return f"{name} <- {parent}" if parent else name
    return name


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--by", choices=("name", "shapes", "parent"), default="name")
    parser.add_argument("--steps", type=int, default=1, help="profiled steps per trace file")
    args = parser.parse_args()
    if args.steps < 1:
        sys.exit("trace_summary: --steps must be >= 1")

    total = collections.Counter()
    calls = collections.Counter()
    for path in args.traces:
        for key, self_us in self_times(cpu_ops(path), args.by):
            total[key] += self_us
            calls[key] += 1
    per_step = len(args.traces) * args.steps
    all_ms = sum(total.values()) / 1000 / per_step
    print(f"{len(args.traces)} trace(s) x {args.steps} step(s); self time of all ops: {all_ms:.1f} ms/step")
    print(f"{'ms/step':>9} {'%':>6} {'calls/step':>10}  op")
    for key, us in total.most_common(args.top):
        ms = us / 1000 / per_step
        print(f"{ms:9.2f} {100 * ms / all_ms:6.1f} {calls[key] / per_step:10.1f}  {key}")


if __name__ == "__main__":
    main()
