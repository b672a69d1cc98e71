"""What the kernel allows: process workloads measured with no event loop.

    python3 benchmarks/floors.py                       # spawn and pipe output, 5 samples
    python3 benchmarks/floors.py --workloads spawn --samples 7 --loops uvloop,zuvrs

For ``subprocess_spawn`` and ``subprocess_pipe_output`` (benchmarks/workloads.py)
this runs the same work with plain blocking system calls, in fresh processes
interleaved with samples of the loops, and prints per contender the median,
min and max time, and the ratio a loop could reach against uvloop if it cost
nothing at all (uvloop's median / the floor's median). A speed target above
that ceiling cannot be met on this machine by any loop.

Floors (each sample is a fresh process, as for the loops):

* ``spawn/posix_spawn``: ``os.posix_spawn('/bin/true')`` + ``os.waitpid``,
  sequential: the kernel's spawn-and-exit cost plus a thin Python call.
* ``spawn/Popen``: ``subprocess.Popen(['/bin/true']).wait()``.
* ``pipe_output/pipe``: the workload's child writes the same bytes to a real
  pipe (1 MiB, as zuvrs widens it) that is read with blocking
  ``os.read(fd, 256 KiB)`` until EOF, child start included as in the workload.
* ``pipe_output/pipe_default``: the same with the pipe at the kernel's
  default size (64 KiB on Linux).
* ``pipe_output/socketpair``: the same through a Unix socketpair (what uvloop
  gives a child; the spec asks for real pipes).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compare  # noqa: E402
import workloads  # noqa: E402

MARKER = compare.MARKER

#: workload -> (loop workload name, size, floor variants)
WORKLOADS = {
    "spawn": ("subprocess_spawn", 500, ("posix_spawn", "Popen")),
    "pipe_output": ("subprocess_pipe_output", 256, ("pipe", "pipe_default", "socketpair")),
}


def floor_spawn(variant: str, n: int) -> float:
    path = workloads.TRUE_PATH
    t0 = time.perf_counter()
    if variant == "posix_spawn":
        env = os.environ
        for _ in range(n):
            pid = os.posix_spawn(path, [path], env)
            _, status = os.waitpid(pid, 0)
            if os.waitstatus_to_exitcode(status) != 0:
                raise RuntimeError("child failed")
    else:
        for _ in range(n):
            if subprocess.Popen([path]).wait() != 0:
                raise RuntimeError("child failed")
    return time.perf_counter() - t0


def floor_pipe_output(variant: str, mib: int) -> float:
    total = mib * workloads.MIB
    t0 = time.perf_counter()
    if variant in ("pipe", "pipe_default"):
        rfd, wfd = os.pipe()
        if variant == "pipe" and hasattr(fcntl, "F_SETPIPE_SZ"):
            fcntl.fcntl(rfd, fcntl.F_SETPIPE_SZ, 1024 * 1024)
    else:
        a, b = socket.socketpair()
        rfd, wfd = a.detach(), b.detach()
    child = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", workloads.PIPE_OUTPUT_CHILD, str(total)],
        stdout=wfd)
    os.close(wfd)
    got = 0
    size = workloads.PIPE_OUTPUT_READ
    while True:
        data = os.read(rfd, size)
        if not data:
            break
        got += len(data)
    os.close(rfd)
    if child.wait() != 0 or got != total:
        raise RuntimeError(f"child failed or short read ({got} of {total})")
    return time.perf_counter() - t0


def run_floor(workload: str, variant: str, size: int) -> Dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--floor", workload,
           "--variant", variant, "--size", str(size)]
    r = compare._run_child(cmd, 600)
    data = r["json"] or {}
    if not data.get("ok"):
        return {"ok": False, "error": r["stderr_tail"][-300:] or "failed"}
    return data


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default="spawn,pipe_output")
    ap.add_argument("--loops", default="uvloop,zuvrs")
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--floor", help=argparse.SUPPRESS)
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.floor:  # one floor sample, in this fresh process
        fn = floor_spawn if args.floor == "spawn" else floor_pipe_output
        elapsed = fn(args.variant, args.size)
        print(MARKER + json.dumps({"ok": True, "elapsed": elapsed}))
        return 0

    loops = compare._csv(args.loops)
    print(f"# floors: {time.strftime('%Y-%m-%d %H:%M:%S')}, python {sys.version.split()[0]}, "
          f"{os.cpu_count()} cores, commit {compare.repo_info()['commit'][:12]}")
    for name in compare._csv(args.workloads):
        workload, size, variants = WORKLOADS[name]
        contenders = [("floor", v) for v in variants] + [("loop", l) for l in loops]
        times: Dict[str, List[float]] = {f"{k}:{v}": [] for k, v in contenders}
        errors: Dict[str, str] = {}
        for rnd in range(args.samples):
            k = rnd % len(contenders)
            for kind, what in contenders[k:] + contenders[:k]:  # rotate the order
                if kind == "floor":
                    s = run_floor(name, what, size)
                else:
                    s = compare.run_sample(sys.executable, what, workload, size,
                                           600, None, False)
                key = f"{kind}:{what}"
                if s.get("ok"):
                    times[key].append(s["elapsed"])
                else:
                    errors[key] = s.get("error", "failed")
        print(f"\n## {name} ({workload}, size {size}, {args.samples} samples)\n")
        print("| contender | median s | min | max | uvloop / this |")
        print("|---|---:|---:|---:|---:|")
        uv = times.get("loop:uvloop")
        uv_med = statistics.median(uv) if uv else None
        for key, ts in times.items():
            if not ts:
                print(f"| {key} | {errors.get(key, 'no samples')} | | | |")
                continue
            med = statistics.median(ts)
            r = f"{uv_med / med:.2f}x" if uv_med else "n/a"
            print(f"| {key} | {med:.4f} | {min(ts):.4f} | {max(ts):.4f} | {r} |")
        print("\nFor a floor row, `uvloop / this` is the highest zuvrs/uvloop ratio "
              "any loop could reach on this machine.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
