"""What the kernel did around one benchmark sample, read from /proc and
TCP_INFO before and after it: no tracing, so the sample runs as it would
unobserved (on loopback, kernel tracing changes which loop is ahead in
bulk; docs/performance.md, "Bulk and the congestion control").

    before = kernel_view.snapshot()
    ...  # the sample
    view = kernel_view.since(before)        # plus tcp_chrono(sock)

What it gives, and why each figure is there:

- ``cpu_busy``: this process's CPU time over the wall time. A one-process
  loopback transfer is CPU-bound; below 1.0 the process waited, for a
  pacing timer or for the other CPU.
- ``hrtimer`` and ``net_rx``: softirqs raised during the sample, on every
  CPU. On a BBR socket the sender's pacing runs from hrtimer softirqs;
  each loopback packet raises NET_RX on the CPU that sends it.
- ``elsewhere``: the share of those softirqs raised on a CPU other than
  the one the process ended on: work the other core did for the transfer.
- ``migrations``: how often the scheduler moved this process.
- ``steal_ms``: time the hypervisor gave the machine's CPUs to others.
- ``tcp_chrono``: the writing socket's own account (TCP_INFO, in ms):
  how long it had data to send (``busy_ms``) and how much of that the
  receiver's window (``rwnd_limited_ms``) or the send buffer
  (``sndbuf_limited_ms``) held it back. Granularity: one jiffy.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any, Dict, List

SOFTIRQS = ("HRTIMER", "NET_RX")

#: struct tcp_info (linux/tcp.h) up to tcpi_sndbuf_limited: 8 u8, 24 u32,
#: 4 u64, 6 u32, then delivery_rate, busy_time, rwnd_limited and
#: sndbuf_limited (u64, µs).
_TCP_INFO = struct.Struct("=8B24I4Q6I4Q")
_CHRONO = ("busy_ms", "rwnd_limited_ms", "sndbuf_limited_ms")


@dataclass
class Snapshot:
    wall: float
    cpu: float
    steal_ticks: int
    softirqs: Dict[str, List[int]]
    migrations: float


def _softirqs() -> Dict[str, List[int]]:
    out: Dict[str, List[int]] = {}
    try:
        with open("/proc/softirqs") as f:
            for line in f.read().splitlines()[1:]:
                name, *counts = line.split()
                if name.rstrip(":") in SOFTIRQS:
                    out[name.rstrip(":")] = [int(c) for c in counts]
    except OSError:
        pass
    return out


def _steal_ticks() -> int:
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8])  # cpu user nice system idle iowait irq softirq steal
    except (OSError, IndexError, ValueError):
        return 0


def _migrations() -> float:
    try:
        with open("/proc/self/sched") as f:
            for line in f:
                if line.startswith("se.nr_migrations"):
                    return float(line.split(":")[1])
    except OSError:
        pass
    return 0.0


def _current_cpu() -> int:
    """The CPU this process last ran on (field 39 of /proc/self/stat)."""
    try:
        with open("/proc/self/stat") as f:
            stat = f.read()
        return int(stat.rsplit(")", 1)[1].split()[36])
    except (OSError, IndexError, ValueError):
        return -1


def snapshot() -> Snapshot:
    return Snapshot(time.perf_counter(), time.process_time(), _steal_ticks(), _softirqs(), _migrations())


def since(before: Snapshot) -> Dict[str, float]:
    """What the kernel did from `before` to now (see the module comment)."""
    after = snapshot()
    here = _current_cpu()
    wall = after.wall - before.wall
    view: Dict[str, float] = {
        "cpu_busy": (after.cpu - before.cpu) / wall if wall > 0 else 0.0,
        "steal_ms": (after.steal_ticks - before.steal_ticks) * 1000 / os.sysconf("SC_CLK_TCK"),
        "migrations": after.migrations - before.migrations,
    }
    total = other = 0
    for name in SOFTIRQS:
        per_cpu = [b - a for a, b in zip(before.softirqs.get(name, []), after.softirqs.get(name, []))]
        view[name.lower()] = sum(per_cpu)
        total += sum(per_cpu)
        other += sum(n for cpu, n in enumerate(per_cpu) if cpu != here)
    view["elsewhere"] = other / total if total else 0.0
    return view


def tcp_chrono(sock: Any) -> Dict[str, float]:
    """The socket's busy, receive-window-limited and send-buffer-limited
    times (ms); empty where TCP_INFO is shorter (kernels before 4.10)."""
    dup = socket.socket(fileno=os.dup(sock.fileno()))
    try:
        raw = dup.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO.size)
    finally:
        dup.close()
    if len(raw) < _TCP_INFO.size:
        return {}
    fields = _TCP_INFO.unpack(raw)
    return {name: us / 1000 for name, us in zip(_CHRONO, fields[-3:])}
