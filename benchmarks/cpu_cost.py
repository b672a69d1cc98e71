#!/usr/bin/env python3
"""CPU time per operation of a workload on each loop: a diagnostic for a
busy machine, where wall-clock throughput mostly says how much CPU the
other processes left (compare.py's figures are the headline; this explains
them).

    python3 benchmarks/cpu_cost.py --loops rloop,zuvrs --workload tcp_bulk --size 4096
    python3 benchmarks/cpu_cost.py --loops uvloop,zuvrs --workload short_connections --size 8000 --samples 5

Each sample is a fresh ``benchmarks/_sample.py`` process (as in compare.py,
loops interleaved, their order rotated every round), at ``--size`` and at
a small ``--base`` size; the process's user and system CPU time come from
``getrusage(RUSAGE_CHILDREN)`` around it. The cost of the extra
operations is median(CPU at size) - median(CPU at base), divided by the
extra operations: start-up, imports and the untimed prelude cancel out.
A sample whose parity failed is counted (its CPU was spent) and flagged.
The CPU is the sample process's and that of the child processes it waited
for (getrusage counts waited-for descendants): readline_echo_load's load
generator and the redis workloads' redis-server are in it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from typing import Any, Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import workloads  # noqa: E402
from _sample import MARKER  # noqa: E402


def run_once(python: str, loop: str, workload: str, size: int,
             extra: List[str]) -> Tuple[float, float, Dict[str, Any]]:
    """(user s, system s, the sample's result) of one fresh sample."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run([python, os.path.join(HERE, "_sample.py"), "--loop", loop,
                        "--workload", workload, "--size", str(size)] + extra,
                       capture_output=True, text=True, timeout=600)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    res: Dict[str, Any] = {"ok": False, "error": f"exit {r.returncode}, no result"}
    for line in r.stdout.splitlines():
        if line.startswith(MARKER):
            res = json.loads(line[len(MARKER):])
    return after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime, res


def measure(python: str, loops: List[str], workload: str, size: int, base: int,
            samples: int, extra: List[str]) -> Dict[str, Dict[str, Any]]:
    out: Dict[str, Dict[str, Any]] = {
        l: {"size": [], "base": [], "bad": 0, "rates": []} for l in loops}
    for r in range(samples):
        k = r % len(loops)
        for l in loops[k:] + loops[:k]:
            for which, n in (("size", size), ("base", base)):
                u, s, res = run_once(python, l, workload, n, extra)
                out[l][which].append((u, s))
                if which == "size":
                    if not res.get("ok"):
                        out[l]["bad"] += 1
                    elif res.get("elapsed"):
                        out[l]["rates"].append(res["ops"] / res["elapsed"])
            sys.stderr.write(f"round {r + 1}/{samples} {l} done\n")
    return out


def summarise(out: Dict[str, Dict[str, Any]], size: int, base: int) -> Dict[str, Dict[str, float]]:
    rows = {}
    for l, d in out.items():
        med = {which: (statistics.median(u for u, _ in d[which]),
                       statistics.median(s for _, s in d[which])) for which in ("size", "base")}
        extra_ops = size - base
        user = (med["size"][0] - med["base"][0]) / extra_ops
        system = (med["size"][1] - med["base"][1]) / extra_ops
        rows[l] = {"user": user, "system": system, "total": user + system,
                   "bad": d["bad"], "n": len(d["size"]),
                   "rate": statistics.median(d["rates"]) if d["rates"] else None}
    return rows


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loops", default="uvloop,zuvrs")
    ap.add_argument("--workload", required=True, choices=sorted(workloads.WORKLOADS))
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--base", type=int, default=None,
                    help="the small size subtracted (default: size / 50, at least 1)")
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--no-prelude", action="store_true")
    ap.add_argument("--python", default=sys.executable)
    a = ap.parse_args(argv)
    loops = [x.strip() for x in a.loops.split(",") if x.strip()]
    base = a.base if a.base is not None else max(1, a.size // 50)
    if base >= a.size:
        ap.error("--base must be smaller than --size")
    extra = ["--no-prelude"] if a.no_prelude else []
    rows = summarise(measure(a.python, loops, a.workload, a.size, base, a.samples, extra),
                     a.size, base)
    unit = workloads.UNITS.get(a.workload, "op")
    unit = unit[:-1] if unit.endswith("s") else unit  # per line, per pair
    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "n/a"
    print(f"# CPU per {unit}: {a.workload}, size {a.size:,} minus {base:,}, "
          f"{a.samples} samples per loop and size (load average now {load})\n")
    print(f"| loop | user µs/{unit} | system µs/{unit} | total µs/{unit} | "
          f"median throughput ({unit}/s, wall clock) | failed samples |")
    print("|---|---:|---:|---:|---:|---:|")
    for l, r in rows.items():
        rate = "-" if r["rate"] is None else f"{r['rate']:,.0f}"
        print(f"| {l} | {r['user'] * 1e6:.2f} | {r['system'] * 1e6:.2f} | "
              f"{r['total'] * 1e6:.2f} | {rate} | {r['bad']}/{r['n']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
