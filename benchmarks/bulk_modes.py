"""Bulk TCP's two modes on this machine, per loop; and bulk to a reader in
another process.

    python3 benchmarks/bulk_modes.py --samples 20 --loops zuvrs,rloop,uvloop
    python3 benchmarks/bulk_modes.py --cross-process --loops zuvrs,uvloop \\
        --chunk-kib 1024 --notsent-lowat-kib 0,256 --samples 3
    python3 benchmarks/bulk_modes.py --pinned-rcvbuf-kib 1800 --congestion-control cubic \\
        --loops floor,zuvrs,rloop --samples 8

On loopback, one run of ``tcp_bulk_flow`` either goes at the usual speed
(the "slow" mode) or, by chance, at about twice that speed (the "fast"
mode). This is the receiver's buffer autotuning, settled early in the
connection: fast runs end with a larger SO_RCVBUF. It happens to every loop
and to the no-loop floor alike (docs/performance.md, "What the two modes
are"). A median over a handful of samples therefore depends on how many
fast samples each loop happened to draw. The default mode runs interleaved
``_sample.py`` samples, counts the fast ones per loop, and gives the median
of the slow ones, rate up to the last byte (``mib_s_to_last_byte``, which
rloop also reports, though compare.py fails it at the close).

``--cross-process``: this process writes 1 GiB through a Protocol that
stops at pause_writing (``--chunk-kib`` per write), optionally with
TCP_NOTSENT_LOWAT set on its socket (``--notsent-lowat-kib``; 0 = unset);
a plain blocking reader in a child process, pinned to the other core,
reports MiB/s. This is how the option was measured and rejected (it wins
or loses a factor of two depending on the write size).

``--pinned-rcvbuf-kib N``: tcp_bulk_flow's pattern (512 MiB in 256 KiB
writes from a Protocol that stops at pause_writing, to a Protocol reader in
the same loop) with the receiver's SO_RCVBUF set to N KiB, which the kernel
doubles and which turns its autotuning off: the mode no longer depends on
chance, so loops compare at one buffer size with a small spread. The
pseudo-loop ``floor`` is the same transfer with no loop at all
(floors.py's ``tcp_fill`` on the same pinned buffer). One fresh process per
sample, loops interleaved; rate up to the last byte.
``--congestion-control NAME`` gives the writing socket that TCP congestion
control (``cubic``, ``bbr``, ...; TCP_CONGESTION, no privilege needed)
instead of the machine's default, which every table names: on loopback the
choice moves all loops' bulk rates by more than a factor of two
(docs/performance.md, "Bulk and the congestion control"). Each pinned
sample also reports what the kernel did meanwhile (kernel_view.py: the
process's CPU share, softirqs and on which CPU, migrations, steal time,
the writer's receive-window-limited time), as medians in the table.

Every mode interleaves its samples in rounds, reversing the order on
alternate rounds, and ends with the first loop's rate over each other's,
paired within rounds, with a 95% bootstrap interval: differences of a few
per cent need that, as samples of one loop spread by 10-20%.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Dict, Iterator, List, Tuple, TypeVar, cast

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import compare  # noqa: E402
import floors  # noqa: E402
import kernel_view  # noqa: E402
import pairing  # noqa: E402
import workloads  # noqa: E402

#: A sample faster than this multiple of the loop's lowest sample is a
#: fast-mode one (the modes are about 2x apart; samples within a mode
#: spread by 20-30%).
FAST_FACTOR = 1.35

#: Linux's TCP_NOTSENT_LOWAT (the socket module does not name it on 3.10).
TCP_NOTSENT_LOWAT = 25

CROSS_TOTAL = 1024 * workloads.MIB

#: What a run of child_rates is known by (a loop, or a loop and an option).
K = TypeVar("K")

READER = r"""
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
view = memoryview(bytearray(256 * 1024))
total, got, t0 = int(sys.argv[2]), 0, None
# Stops at the last byte, not at EOF: rloop's close does not reach the peer.
while got < total:
    n = s.recv_into(view)
    if not n:
        break
    if t0 is None:
        t0 = time.perf_counter()
    got += n
print(got, time.perf_counter() - (t0 or 0.0))
"""


def split_modes(rates: List[float]) -> Dict[str, float]:
    """Median of all samples, median of the slow-mode ones, and how many
    are fast-mode ones."""
    floor = min(rates)
    slow = [r for r in rates if r < floor * FAST_FACTOR]
    return {"median": statistics.median(rates), "slow_median": statistics.median(slow),
            "fast": len(rates) - len(slow), "samples": len(rates)}


def round_orders(keys: List[K], samples: int) -> Iterator[Tuple[int, List[K]]]:
    """The rounds of an interleaved run: every key once per round, in the
    given order and reversed on alternate rounds (a fixed order gives each
    position's bias, such as what the previous sample left in the
    kernel's buffers, to one key)."""
    for i in range(samples):
        yield i, (keys if i % 2 == 0 else keys[::-1])


def by_key(rounds: List[Dict[K, float]], keys: List[K]) -> Dict[K, List[float]]:
    """The rates of each key over the rounds (where its sample worked)."""
    return {key: [r[key] for r in rounds if key in r] for key in keys}


def paired_ratios(rounds: List[Dict[K, float]], keys: List[K]) -> str:
    """The first key's rate over each other's, as the median of the ratios
    within a round, with a 95% bootstrap interval (rounds where both
    worked)."""
    first = pairing.rounds_figures(rounds, keys[0])
    parts = [f"{keys[0]}/{other} {pairing.fmt_paired(p)}" for other in keys[1:]
             if (p := pairing.paired_ratio(first, pairing.rounds_figures(rounds, other)))]
    return ("Paired, median of the ratios within a round [95% bootstrap]: " + ", ".join(parts)) if parts else ""


def in_process(loops: List[str], samples: int) -> int:
    rounds: List[Dict[str, float]] = []
    for i, order in round_orders(loops, samples):
        rounds.append({})
        for loop in order:
            s = compare.run_sample(sys.executable, loop, "tcp_bulk_flow", 512, 120, None, False)
            rate = (s.get("info") or {}).get("mib_s_to_last_byte")
            if not rate:
                print(f"{loop}: sample {i + 1} gave no rate ({s.get('error', 'no result')})", file=sys.stderr)
                continue
            rounds[-1][loop] = float(rate)
            print(f"[{i + 1}/{samples}] {loop:8} {rate:8.0f} MiB/s", file=sys.stderr, flush=True)
    rates = by_key(rounds, loops)
    print(congestion_control_line())
    print("| loop | median MiB/s | slow-mode median | fast samples |")
    print("|---|---:|---:|---:|")
    for loop in loops:
        if rates[loop]:
            m = split_modes(rates[loop])
            print(f"| {loop} | {m['median']:,.0f} | {m['slow_median']:,.0f} | {m['fast']} of {m['samples']} |")
    print(paired_ratios(rounds, loops))
    return 0


class _Writer(asyncio.Protocol):
    """Writes `total` bytes in `chunk` writes, stopping at
    pause_writing(); closes after the last one."""

    def __init__(self, chunk: int, lowat: int, done: "asyncio.Future[None]",
                 total: int = CROSS_TOTAL) -> None:
        self.chunk = bytes(chunk)
        self.lowat = lowat
        self.done = done
        self.total = total
        self.sent = 0
        self.paused = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses.
        self.transport = cast(asyncio.Transport, transport)
        if self.lowat:
            self.transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT, self.lowat)
        self._write_more()

    def _write_more(self) -> None:
        tr = self.transport
        assert tr is not None
        while not self.paused and self.sent < self.total:
            tr.write(self.chunk)
            self.sent += len(self.chunk)
        if self.sent >= self.total and not tr.is_closing():
            tr.close()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._write_more()

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


def cross_process_sample(loop_name: str, chunk: int, lowat: int) -> float:
    """One cross-process run; MiB/s as the reader saw it."""
    loop = workloads.get_loop_factory(loop_name)()
    cores = sorted(os.sched_getaffinity(0))
    reader_cpu = str(cores[-1])

    async def main() -> float:
        done = loop.create_future()
        server = await loop.create_server(lambda: _Writer(chunk, lowat, done), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        # A plain child process, polled: not every loop runs subprocesses.
        argv = ["taskset", "-c", reader_cpu, sys.executable, "-c", READER, str(port), str(CROSS_TOTAL)]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE)
        try:
            while proc.poll() is None:
                await asyncio.sleep(0.05)
            try:
                await asyncio.wait_for(done, 10)
            except asyncio.TimeoutError:
                print(f"{loop_name}: the writer's transport never called connection_lost", file=sys.stderr)
        finally:
            server.close()
        out = proc.stdout.read() if proc.stdout else b""
        got, secs = out.split()
        if int(got) != CROSS_TOTAL:
            raise RuntimeError(f"the reader got {int(got)} of {CROSS_TOTAL} bytes")
        return int(got) / float(secs) / workloads.MIB

    try:
        if len(cores) > 1:
            os.sched_setaffinity(0, {cores[0]})
        return loop.run_until_complete(main())
    finally:
        loop.close()
        os.sched_setaffinity(0, cores)


def child_rates(runs: Dict[K, List[str]], samples: int, timeout: float,
                views: Dict[K, List[Dict[str, float]]] | None = None) -> List[Dict[K, float]]:
    """Runs each of `runs` (this script's arguments for one sample, which
    prints its MiB/s last, alone or as a JSON object's ``mib_s``)
    `samples` times, interleaved (round_orders), each in a fresh process
    as compare.py's samples are; per round, the rate of each run that did
    not fail. The rest of a JSON result goes to `views`, per run."""
    rounds: List[Dict[K, float]] = []
    for i, order in round_orders(list(runs), samples):
        rounds.append({})
        for key in order:
            cmd = [sys.executable, os.path.abspath(__file__), *runs[key]]
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            if out.returncode != 0:
                print(f"{key} failed: {out.stderr.strip()[-300:]}", file=sys.stderr)
                continue
            last = out.stdout.strip().splitlines()[-1]
            if last.startswith("{"):
                result = json.loads(last)
                rate = float(result.pop("mib_s"))
                if views is not None:
                    views.setdefault(key, []).append(result)
            else:
                rate = float(last)
            rounds[-1][key] = rate
            print(f"[{i + 1}/{samples}] {key}: {rate:8.0f} MiB/s", file=sys.stderr, flush=True)
    return rounds


def spread(r: List[float]) -> str:
    """median (min-max)"""
    return f"{statistics.median(r):,.0f} ({min(r):,.0f}-{max(r):,.0f})"


def cross_process(loops: List[str], samples: int, chunk_kib: int, lowats_kib: List[int]) -> int:
    runs = {(loop, lowat): ["--one-cross", loop, "--chunk-kib", str(chunk_kib),
                            "--notsent-lowat-kib", str(lowat)]
            for loop in loops for lowat in lowats_kib}
    rates = by_key(child_rates(runs, samples, 120), list(runs))
    print(f"Writes of {chunk_kib} KiB")
    print(congestion_control_line())
    print("| loop | TCP_NOTSENT_LOWAT | MiB/s, median (min-max) |")
    print("|---|---:|---:|")
    for (loop, lowat), r in rates.items():
        if r:
            print(f"| {loop} | {str(lowat) + ' KiB' if lowat else 'unset'} | {spread(r)} |")
    return 0

PINNED_TOTAL = 512 * workloads.MIB


class _PinnedReceiver(asyncio.Protocol):
    """Counts `total` bytes on a socket whose SO_RCVBUF it pins; `done`
    gets the moment the last byte came."""

    def __init__(self, rcvbuf: int, total: int, done: "asyncio.Future[float]") -> None:
        self.rcvbuf = rcvbuf
        self.total = total
        self.done = done
        self.got = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.rcvbuf)

    def data_received(self, data: bytes) -> None:
        self.got += len(data)
        if self.got >= self.total and not self.done.done():
            self.done.set_result(time.perf_counter())


def pinned_sample(loop_name: str, rcvbuf: int, total: int = PINNED_TOTAL, cc: str = "") -> Dict[str, float]:
    """One pinned-buffer run of `total` bytes (whole MiB) in this process,
    the writer on congestion control `cc` (else the machine's): MiB/s to
    the last byte (``mib_s``) and what the kernel did meanwhile
    (kernel_view: its figures, and the writing socket's TCP_INFO times,
    which the floor does not report)."""
    mib = total / workloads.MIB
    if loop_name == "floor":
        before = kernel_view.snapshot()
        seconds = floors.floor_bulk_flow("tcp_fill", total // workloads.MIB, rcvbuf=rcvbuf, cc=cc)
        return {"mib_s": mib / seconds, **kernel_view.since(before)}
    loop = workloads.get_loop_factory(loop_name)()

    async def main() -> Dict[str, float]:
        last = loop.create_future()
        closed = loop.create_future()
        # The sockets made here, to be on `cc` from the first segment.
        listener = socket.create_server(("127.0.0.1", 0))
        client = socket.socket()
        if cc:
            for s in (listener, client):
                floors.set_congestion_control(s, cc)
        address = listener.getsockname()
        server = await loop.create_server(lambda: _PinnedReceiver(rcvbuf, total, last), sock=listener)
        # The writer closes its transport after its last write, before the
        # last byte arrives: TCP_INFO is read through a descriptor of our own.
        watch = client.dup()
        before = kernel_view.snapshot()
        client.connect(address)
        client.setblocking(False)
        tr, _ = await loop.create_connection(
            lambda: _Writer(workloads.FLOW_CHUNK, 0, closed, total), sock=client)
        try:
            t1 = await asyncio.wait_for(last, 120)
            view = kernel_view.since(before)
            return {"mib_s": mib / (t1 - before.wall), **view, **kernel_view.tcp_chrono(watch)}
        finally:
            watch.close()
            # (asyncio's transport, closed by the writer and drained, fails
            # an abort() once connection_lost has run.)
            if not tr.is_closing():
                tr.abort()
            server.close()

    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


def congestion_control_line(cc: str = "") -> str:
    """What the table's writers ran on."""
    host = floors.host_congestion_control()
    if cc and cc != host:
        return f"TCP congestion control: {cc} (this machine's default: {host})"
    return f"TCP congestion control: {host}, this machine's default"


#: The kernel's figures the pinned table shows (kernel_view), as headers.
PINNED_VIEW = {"cpu_busy": "CPU busy", "hrtimer": "HRTIMER softirqs", "net_rx": "NET_RX softirqs",
               "elsewhere": "softirqs on the other CPU", "migrations": "migrations",
               "rwnd_limited_ms": "rwnd-limited ms", "steal_ms": "steal ms"}


def view_cell(values: List[float], key: str) -> str:
    """The median of one kernel figure over a loop's samples."""
    if not values:
        return ""
    m = statistics.median(values)
    if key in ("cpu_busy", "elsewhere"):
        return f"{m:.0%}"
    return f"{m:,.0f}"


def pinned(loops: List[str], samples: int, rcvbuf_kib: int, cc: str = "") -> int:
    runs = {loop: ["--one-pinned", loop, "--pinned-rcvbuf-kib", str(rcvbuf_kib), "--congestion-control", cc]
            for loop in loops}
    views: Dict[str, List[Dict[str, float]]] = {}
    rounds = child_rates(runs, samples, 180, views)
    print(f"SO_RCVBUF pinned at {rcvbuf_kib} KiB (the kernel doubles it)")
    print(congestion_control_line(cc))
    print("| loop | MiB/s, median (min-max) | " + " | ".join(PINNED_VIEW.values()) + " |")
    print("|---|---:|" + "---:|" * len(PINNED_VIEW))
    for loop, r in by_key(rounds, loops).items():
        if r:
            cells = [view_cell([v[k] for v in views.get(loop, []) if k in v], k) for k in PINNED_VIEW]
            print(f"| {loop} | {spread(r)} | " + " | ".join(cells) + " |")
    print("Kernel figures: medians per sample, read from /proc and the writer's TCP_INFO around the "
          "transfer, no tracing (benchmarks/kernel_view.py).")
    print(paired_ratios(rounds, loops))
    return 0

def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--loops", default="zuvrs,rloop,uvloop")
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--cross-process", action="store_true")
    ap.add_argument("--chunk-kib", type=int, default=256)
    ap.add_argument("--notsent-lowat-kib", default="0")
    ap.add_argument("--pinned-rcvbuf-kib", type=int, default=0)
    ap.add_argument("--congestion-control", default="",
                    help="the writer's TCP congestion control (pinned mode; default: the machine's)")
    ap.add_argument("--one-cross", help=argparse.SUPPRESS)
    ap.add_argument("--one-pinned", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    lowats = [int(v) for v in args.notsent_lowat_kib.split(",")]
    if args.one_cross:
        print(cross_process_sample(args.one_cross, args.chunk_kib * 1024, lowats[0] * 1024))
        return 0
    if args.one_pinned:
        print(json.dumps(pinned_sample(args.one_pinned, args.pinned_rcvbuf_kib * 1024, cc=args.congestion_control)))
        return 0
    loops = args.loops.split(",")
    if args.pinned_rcvbuf_kib:
        return pinned(loops, args.samples, args.pinned_rcvbuf_kib, args.congestion_control)
    if args.congestion_control:
        ap.error("--congestion-control applies to --pinned-rcvbuf-kib runs (else set the machine's default)")
    if args.cross_process:
        return cross_process(loops, args.samples, args.chunk_kib, lowats)
    return in_process(loops, args.samples)


if __name__ == "__main__":
    sys.exit(main())
