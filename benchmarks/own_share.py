"""How much of a workload's time is the loop's own code, and what that caps.

    python3 benchmarks/own_share.py                      # the default workloads, zuvrs
    python3 benchmarks/own_share.py --workloads udp_echo --loops zuvrs,uvloop --repeats 5
    python3 benchmarks/own_share.py --ratios docs/benchmarks/compare-....md

Samples ``benchmarks/_sample.py`` runs with ``perf record`` (Linux perf, CPU
clock at a fixed frequency) and counts the samples that fall in the loop's own
shared object (for zuvrs that includes the libuv it links statically), in the
kernel, in the interpreter and elsewhere. Start-up and the untimed prelude
are taken out by subtracting a run of the same workload at a tiny size: the
shares are of the CPU time the extra operations cost.

The point: a workload whose time is mostly the kernel's system calls and the
interpreter running asyncio's own Python code cannot be sped up much by the
loop. If the loop's code cost nothing, the run would take ``1 - share`` of
its time, so against a rival loop the ratio could at most reach
``measured ratio / (1 - share)`` (the *ceiling*), provided both loops make
the same system calls (check with ``strace -c``). With ``--ratios`` the
measured zuvrs/uvloop ratios are read from a ``compare.py`` markdown report
and the ceilings printed next to them.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import workloads  # noqa: E402

#: the workloads whose targets are closest to the kernel's floor
DEFAULT_WORKLOADS = ["sleep0_tasks", "tcp_echo_streams", "tcp_echo_protocol",
                     "tcp_bulk", "udp_echo"]

#: a substring of each loop's own shared object, as perf names it (its
#: file name: uvloop's is ``loop.cpython-*.so``)
OWN_DSO = {"zuvrs": "_zuvrs.", "zuvrs-streams": "_zuvrs.", "uvloop": "loop.cpython-",
           "rloop": "_rloop.", "rsloop": "_loop.cpython-"}

#: the tiny size whose profile is subtracted (start-up, prelude, set-up)
BASE_FRACTION = 0.02

GROUPS = ("own", "kernel", "python", "other")


def _group(dso: str, loop: str) -> str:
    if OWN_DSO[loop] in dso:
        return "own"
    if dso.startswith("[kernel"):
        return "kernel"
    if "libpython" in dso or dso.startswith("python"):
        return "python"
    return "other"


def dso_samples(python: str, loop: str, workload: str, size: int, freq: int) -> Dict[str, int]:
    """perf samples per shared object (as perf names it) for one run of the
    workload."""
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "perf.data")
        cmd = ["perf", "record", "-q", "-F", str(freq), "-o", data, "--",
               python, os.path.join(HERE, "_sample.py"), "--loop", loop,
               "--workload", workload, "--size", str(size)]
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[6:])} failed: {r.stderr.strip()[-300:]}")
        rep = subprocess.run(["perf", "report", "-i", data, "--stdio", "-n",
                              "--no-children", "--sort", "dso"],
                             capture_output=True, text=True, timeout=300)
    counts: Dict[str, int] = {}
    # lines look like: "    61.06%         12345  [kernel.kallsyms]"
    for line in rep.stdout.splitlines():
        m = re.match(r"\s*[\d.]+%\s+(\d+)\s+(\S.*?)\s*$", line)
        if m:
            counts[m.group(2)] = counts.get(m.group(2), 0) + int(m.group(1))
    return counts


def profile(python: str, loop: str, workload: str, size: int, freq: int) -> Dict[str, int]:
    """perf samples per group for one run of the workload."""
    counts = dict.fromkeys(GROUPS, 0)
    for dso, n in dso_samples(python, loop, workload, size, freq).items():
        counts[_group(dso, loop)] += n
    return counts


def shares(python: str, loop: str, workload: str, size: int, freq: int) -> Dict[str, float]:
    """Each group's share of the samples the workload's extra size costs."""
    base_size = max(1, int(size * BASE_FRACTION))
    full = profile(python, loop, workload, size, freq)
    base = profile(python, loop, workload, base_size, freq)
    extra = {g: max(0, full[g] - base[g]) for g in GROUPS}
    total = sum(extra.values())
    if total <= 0:
        raise RuntimeError(f"{workload}: no samples beyond the baseline run")
    return {g: extra[g] / total for g in GROUPS}


def read_ratios(path: str) -> Dict[str, Dict[str, float]]:
    """Median ratios over uvloop from a compare.py markdown report: for each
    ``<loop>/uvloop`` column (zuvrs, zuvrs-streams, ...), workload -> ratio."""
    out: Dict[str, Dict[str, float]] = {}
    with open(path) as f:
        text = f.read()
    # the summary table: | workload | size | ...loops... | zuvrs/uvloop | ...
    head = None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if head is None and "zuvrs/uvloop" in cells:
            head = cells
            continue
        if head is not None:
            if len(cells) != len(head):
                if out:
                    break
                continue
            for i, col in enumerate(head):
                if not col.endswith("/uvloop"):
                    continue
                m = re.match(r"([\d.]+)x", cells[i])
                if m:
                    out.setdefault(col[: -len("/uvloop")], {})[cells[0]] = float(m.group(1))
    return out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS))
    ap.add_argument("--loops", default="zuvrs")
    ap.add_argument("--scale", type=float, default=2.0,
                    help="multiply each workload's default size (default 2)")
    ap.add_argument("--repeats", type=int, default=3, help="profiles per cell (median)")
    ap.add_argument("--freq", type=int, default=4000, help="perf sampling frequency (Hz)")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--ratios", help="a compare.py markdown report for the ceilings")
    ap.add_argument("--markdown", help="also write the table to this file")
    a = ap.parse_args(argv)
    if not shutil.which("perf"):
        print("own_share.py needs Linux perf (Debian: linux-perf)", file=sys.stderr)
        return 2
    ratios = read_ratios(a.ratios) if a.ratios else {}
    loops = [x for x in a.loops.split(",") if x]
    wnames = [x for x in a.workloads.split(",") if x]
    for w in wnames:
        if w not in workloads.WORKLOADS:
            ap.error(f"unknown workload {w!r}")
    for l in loops:
        if l not in OWN_DSO:
            ap.error(f"no shared object known for loop {l!r}")

    head = ["workload", "size", "loop", "own code", "kernel", "interpreter", "other"]
    if ratios:
        head += ["measured over uvloop", "ceiling"]
    rows = []
    for w in wnames:
        size = max(1, int(workloads.WORKLOADS[w][1] * a.scale))
        for l in loops:
            runs = [shares(a.python, l, w, size, a.freq) for _ in range(a.repeats)]
            med = {g: statistics.median(r[g] for r in runs) for g in GROUPS}
            own = [r["own"] for r in runs]
            row = [w, f"{size:,}", l,
                   f"{med['own']:.1%} ({min(own):.1%}..{max(own):.1%})",
                   f"{med['kernel']:.1%}", f"{med['python']:.1%}", f"{med['other']:.1%}"]
            if ratios:
                r = ratios.get(l, {}).get(w)
                row += [f"{r:.2f}x" if r else "",
                        f"{r / (1 - med['own']):.2f}x" if r else ""]
            rows.append(row)
            print("  ".join(row), file=sys.stderr, flush=True)
    lines = [report_title("own-code share"),
             "",
             f"perf record -F {a.freq}; {a.repeats} profiles per row (median, own-code "
             f"min..max); start-up removed by subtracting a run at "
             f"{BASE_FRACTION:.0%} of the size."
             + (f" Measured ratios from `{a.ratios}`." if a.ratios else ""),
             ""]
    notes = (["ceiling = measured / (1 - own share): the ratio over uvloop "
              "if the loop's own code (zuvrs's: libuv and the native streams included) "
              "took no time at all."] if ratios else [])
    write_report(lines, head, rows, notes, a.markdown)
    return 0


def report_title(what: str) -> str:
    """A report's first line: what, when, which Python, how many cores."""
    return f"# {what}: {datetime.now():%Y-%m-%d %H:%M:%S}, python {sys.version.split()[0]}, {os.cpu_count()} cores"


def write_report(preamble: List[str], head: List[str], rows: List[List[str]], notes: List[str],
                 markdown: Optional[str]) -> None:
    """Prints the preamble lines, the table and the notes (and writes them
    to `markdown` if given)."""
    lines = preamble + ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += [""] + notes if notes else []
    text = "\n".join(lines) + "\n"
    print(text)
    if markdown:
        with open(markdown, "w") as f:
            f.write(text)


if __name__ == "__main__":
    sys.exit(main())
