"""How close TLS could come to plain TCP on this machine: the OpenSSL floor.

    python3 benchmarks/tls_ceiling.py                       # zuvrs, 3 profiles per cell
    python3 benchmarks/tls_ceiling.py --loops zuvrs,uvloop --repeats 5

For each TLS workload and its plain twin (``workloads.TLS_PAIRS``, both at
the TLS workload's size), this profiles one run of each with ``perf record``
(as ``own_share.py`` does, start-up removed by subtracting a run at 2% of
the size) and counts the CPU time spent in OpenSSL (libssl and libcrypto).
The TLS run must do what the plain run does plus the record layer's work:
whatever the loop, its time is at least ``plain + (OpenSSL in the TLS run -
OpenSSL in the plain run)`` (the plain HTTP workload hashes its bodies with
libcrypto too, hence the difference). So

    ceiling (TLS / plain throughput) = plain / (plain + OpenSSL's extra)

is the best TLS / plain ratio any loop could reach here, next to the ratio
the same profiles measure (CPU time of the plain run / of the TLS run).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import own_share  # noqa: E402
import workloads  # noqa: E402


def _is_openssl(dso: str) -> bool:
    return dso.startswith("libssl.") or dso.startswith("libcrypto.")


def extra_cpu(python: str, loop: str, workload: str, size: int, freq: int) -> Dict[str, float]:
    """CPU seconds the workload's size beyond the baseline costs: in all,
    and in OpenSSL."""
    full = own_share.dso_samples(python, loop, workload, size, freq)
    base = own_share.dso_samples(python, loop, workload, max(1, int(size * own_share.BASE_FRACTION)), freq)

    def seconds(pick) -> float:
        n = sum(v for k, v in full.items() if pick(k)) - sum(v for k, v in base.items() if pick(k))
        return max(0, n) / freq

    return {"total": seconds(lambda _: True), "openssl": seconds(_is_openssl)}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loops", default="zuvrs")
    ap.add_argument("--pairs", default=",".join(t for t, _ in workloads.TLS_PAIRS),
                    help="TLS workloads (each with its plain twin)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply each TLS workload's default size")
    ap.add_argument("--repeats", type=int, default=3, help="profiles per cell (median)")
    ap.add_argument("--freq", type=int, default=4000, help="perf sampling frequency (Hz)")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--markdown", help="also write the table to this file")
    a = ap.parse_args(argv)
    twins = dict(workloads.TLS_PAIRS)
    pairs = [p for p in a.pairs.split(",") if p]
    for p in pairs:
        if p not in twins:
            ap.error(f"not a TLS workload with a plain twin: {p!r}")
    loops = [x for x in a.loops.split(",") if x]

    head = ["TLS workload / plain", "size", "loop", "plain CPU s", "TLS CPU s", "OpenSSL extra s",
            "TLS / plain measured", "ceiling"]
    rows = []
    for tls in pairs:
        plain = twins[tls]
        size = max(1, int(workloads.WORKLOADS[tls][1] * a.scale))
        for loop in loops:
            runs = []
            for _ in range(a.repeats):
                p = extra_cpu(a.python, loop, plain, size, a.freq)
                t = extra_cpu(a.python, loop, tls, size, a.freq)
                crypto = max(0.0, t["openssl"] - p["openssl"])
                runs.append((p["total"], t["total"], crypto))
            p_s, t_s, c_s = (statistics.median(r[i] for r in runs) for i in range(3))
            ceilings = [r[0] / (r[0] + r[2]) for r in runs]
            row = [f"{tls} / {plain}", f"{size:,}", loop, f"{p_s:.3f}", f"{t_s:.3f}", f"{c_s:.3f}",
                   f"{p_s / t_s:.2f}", f"{statistics.median(ceilings):.2f} "
                   f"({min(ceilings):.2f}..{max(ceilings):.2f})"]
            rows.append(row)
            print("  ".join(row), file=sys.stderr, flush=True)
    lines = [own_share.report_title("TLS / plain ceiling"),
             "",
             f"perf record -F {a.freq}; {a.repeats} profile pairs per row (median; ceiling "
             f"min..max); start-up removed by subtracting a run at {own_share.BASE_FRACTION:.0%} of the size.",
             ""]
    own_share.write_report(lines, head, rows, [
        "ceiling = plain / (plain + OpenSSL extra): the TLS / plain throughput ratio if "
        "the TLS run cost nothing beyond the plain run but OpenSSL's records and handshakes."], a.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
