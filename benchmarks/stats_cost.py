#!/usr/bin/env python3
"""What zuvrs's loop metrics cost: compare.py's workloads on two or more
zuvrs configurations, one fresh process per sample, rounds interleaved.

Usage (from the repository root)::

    # a build without the metrics, installed aside (see docs/metrics.md)
    python benchmarks/stats_cost.py --config base=/tmp/zuvrs-base \\
        --config off=:ZUVRS_STATS=0 --config on=:ZUVRS_STATS=1 --rounds 7
    python benchmarks/stats_cost.py --workloads call_soon,sleep0_one_task --repeat 7 ...
    python benchmarks/stats_cost.py --instructions --workloads call_soon --size 100000 ...

A configuration is ``NAME=PYTHONPATH[:VAR=VALUE,...]``: the samples of that
configuration run with PYTHONPATH set to the given directory (empty: the
zuvrs installed in this interpreter) and the environment variables given.
Every sample is ``benchmarks/_sample.py --loop zuvrs`` (the process
compare.py runs, with its sizes and parity checks); a failed sample stops
the run. Each round runs every configuration once, in an order rotated
from round to round, after one warm-up process per configuration.

Output: per workload, each configuration's median time, and the median,
min and max of its time over the first configuration's in the same round
(paired ratios: they keep drift of the machine out of the ratio). With
``--json``, every sample's time too.

Two diagnostics for a busy machine, where one sample's time says more about
the machine than about the build:

* ``--repeat K``: each sample process runs the workload K times (a fresh
  loop each time) and reports its fastest run.
* ``--instructions``: instructions instead of time, counted by valgrind's
  callgrind (repeatable whatever else the machine does): each configuration
  runs the workload at ``--size N`` and at 2N in fresh processes with
  PYTHONHASHSEED=0 and the cyclic GC off (a collection falls at one size
  and not the other depending on what was imported, a jump of hundreds of
  thousands of instructions), and the difference over N is the
  instructions per operation (start-up and imports cancel out). Workloads
  whose work depends on timing (timers firing, threads, bulk transfers)
  vary from run to run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import workloads  # noqa: E402

MARK = "@@ZUVRS-BENCH@@ "


def parse_config(spec: str) -> tuple[str, dict[str, str]]:
    name, sep, rest = spec.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=PYTHONPATH[:VAR=VALUE,...], not {spec!r}")
    path, _, assignments = rest.partition(":")
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if path:
        env["PYTHONPATH"] = path
    for assignment in filter(None, assignments.split(",")):
        var, eq, value = assignment.partition("=")
        if not eq:
            raise argparse.ArgumentTypeError(f"expected VAR=VALUE, not {assignment!r}")
        env[var] = value
    return name, env


# A sample process of --repeat: the workload K times, its fastest run.
REPEAT_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
import workloads
best = None
for _ in range(int(sys.argv[3])):
    res = workloads.run_workload(sys.argv[2], workloads.get_loop_factory("zuvrs"), None)
    if not res["ok"]:
        print("@@ZUVRS-BENCH@@ " + json.dumps({"ok": False, "error": str(res["parity"])}))
        sys.exit(1)
    best = res["elapsed"] if best is None else min(best, res["elapsed"])
print("@@ZUVRS-BENCH@@ " + json.dumps({"ok": True, "elapsed": best}))
"""


def sample(python: str, workload: str, env: dict[str, str], timeout: float, repeat: int = 1) -> float:
    if repeat > 1:
        cmd = [python, "-c", REPEAT_CHILD, HERE, workload, str(repeat)]
    else:
        cmd = [python, os.path.join(HERE, "_sample.py"), "--loop", "zuvrs", "--workload", workload]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in out.stdout.splitlines() if line.startswith(MARK)]
    if not lines:
        raise SystemExit(f"{workload}: no result\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    res = json.loads(lines[-1][len(MARK):])
    if not res.get("ok"):
        raise SystemExit(f"{workload}: sample failed: {res.get('error')}")
    return float(res["elapsed"])


def instructions(python: str, workload: str, env: dict[str, str], size: int, timeout: float) -> float:
    """Instructions per operation of `workload` (see --instructions)."""
    counts = []
    for n in (size, 2 * size):
        cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
               python, os.path.join(HERE, "_sample.py"), "--loop", "zuvrs", "--workload", workload, "--size", str(n),
               "--no-gc"]
        out = subprocess.run(cmd, env=dict(env, PYTHONHASHSEED="0"), capture_output=True, text=True,
                             timeout=timeout * 50)
        refs = [line for line in out.stderr.splitlines() if "I   refs:" in line]
        if out.returncode != 0 or not refs:
            raise SystemExit(f"{workload}: callgrind failed\n{out.stderr[-2000:]}")
        counts.append(int(refs[-1].split(":")[1].replace(",", "")))
    return (counts[1] - counts[0]) / size


def instructions_table(a: argparse.Namespace, configs: list[tuple[str, dict[str, str]]]) -> int:
    names = [n for n, _ in configs]
    print(f"| workload | size | {' | '.join(f'{n} (instr/op)' for n in names)} | "
          + " | ".join(f"{n}/{names[0]}" for n in names[1:]) + " |")
    print("|---|---:|" + "---:|" * (2 * len(names) - 1))
    for w in a.workloads.split(","):
        size = a.size or max(1, workloads.WORKLOADS[w][1] // 10)
        per_op = [instructions(a.python, w, env, size, a.timeout) for _, env in configs]
        ratios = [f"{x / per_op[0]:.3f}" for x in per_op[1:]]
        print(f"| {w} | {size:,} | " + " | ".join(f"{x:.0f}" for x in per_op) + " | " + " | ".join(ratios) + " |",
              flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", action="append", type=parse_config, required=True,
                    help="NAME=PYTHONPATH[:VAR=VALUE,...] (repeat; the first is the reference)")
    ap.add_argument("--workloads", default=",".join(workloads.WORKLOADS),
                    help="comma-separated (default: all of compare.py's)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--json", help="write every sample's time here")
    ap.add_argument("--repeat", type=int, default=1, metavar="K",
                    help="diagnostic: each sample runs the workload K times and reports its fastest run")
    ap.add_argument("--instructions", action="store_true",
                    help="diagnostic: instructions per operation under callgrind instead of times")
    ap.add_argument("--size", type=int, help="with --instructions: N (default: a tenth of compare.py's size)")
    a = ap.parse_args(argv)
    configs: list[tuple[str, dict[str, str]]] = a.config
    if a.instructions:
        return instructions_table(a, configs)
    names = [n for n, _ in configs]
    ref = names[0]
    report: dict[str, dict[str, list[float]]] = {}
    print(f"| workload | {' | '.join(f'{n} (ms)' for n in names)} | "
          + " | ".join(f"{n}/{ref} median [min..max]" for n in names[1:]) + " |")
    print("|---|" + "---:|" * (2 * len(names) - 1))
    for w in a.workloads.split(","):
        for _, env in configs:
            sample(a.python, w, env, a.timeout, a.repeat)
        times: dict[str, list[float]] = {n: [] for n in names}
        for r in range(a.rounds):
            k = r % len(configs)
            for name, env in configs[k:] + configs[:k]:
                times[name].append(sample(a.python, w, env, a.timeout, a.repeat))
                print(f"  {w} round {r + 1}/{a.rounds} {name}: {times[name][-1] * 1e3:.1f} ms",
                      file=sys.stderr, flush=True)
        report[w] = times
        cells = [f"{statistics.median(times[n]) * 1e3:.1f}" for n in names]
        for n in names[1:]:
            ratios = [b / a_ for a_, b in zip(times[ref], times[n])]
            cells.append(f"{statistics.median(ratios):.3f} [{min(ratios):.3f}..{max(ratios):.3f}]")
        print(f"| {w} | " + " | ".join(cells) + " |", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"configs": names, "rounds": a.rounds, "times": report}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
