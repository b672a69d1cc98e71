"""zuvrs.stats: what a zuvrs loop measures of itself.

    snapshot = loop.stats()                  # a LoopStats (reset=True: zero afterwards)
    print(snapshot.busy, snapshot.lag.p99)
    text = zuvrs.stats.prometheus({"main": loop})   # Prometheus text format
    transport.get_extra_info("zuvrs_stats")         # a TransportStats

Counters (turns, callbacks, timers, I/O events, wake-ups, transport bytes
and calls) are always kept. Timing (busy and poll time, lag, turn lengths,
the longest turns and the slowest callbacks, transport pause times) is on
for loops made with ``stats=True``, or by default: see ``enable`` and the
``ZUVRS_STATS`` environment variable (docs/metrics.md, which also says what
each figure means and what it costs).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Union

from . import _loop_registry

__all__ = (
    "LoopStats",
    "Histogram",
    "Turn",
    "SlowCallback",
    "TransportTotals",
    "TransportStats",
    "enable",
    "enabled",
    "loops",
    "prometheus",
    "summary",
)

# Upper bounds of the histogram buckets, in seconds: 1 us, 2 us, 4 us, ...
# 2**26 us (67 s); one more bucket holds what is above.
BUCKET_BOUNDS: tuple[float, ...] = tuple((1 << k) / 1_000_000 for k in range(27))


def enable(on: bool = True) -> None:
    """Make loops created from now on time their turns (or not, with False):
    the default of ``zuvrs.new_event_loop(stats=None)``. The environment
    variable ``ZUVRS_STATS=1`` sets it at import."""
    _loop_registry.registry.stats_default = bool(on)


def enabled() -> bool:
    """Whether new loops time their turns unless told otherwise."""
    return bool(_loop_registry.registry.stats_default)


def loops() -> list[Any]:
    """The zuvrs loops of this process that are not closed, oldest first."""
    live = sorted(_loop_registry.live_loops.items(), key=lambda kv: kv[1])
    return [loop for loop, _ in live if not loop.is_closed()]


def _number(loop: Any) -> str:
    return str(_loop_registry.live_loops.get(loop, 0))


@dataclass(frozen=True)
class Histogram:
    """Durations in power-of-two buckets: ``counts[i]`` values were at most
    ``bounds[i]`` seconds (and above ``bounds[i - 1]``); the last count is
    of values above the last bound."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    #: Sum of the values, in seconds.
    sum: float
    #: The largest value, in seconds (exact).
    max: float

    @property
    def count(self) -> int:
        return sum(self.counts)

    @property
    def mean(self) -> float:
        n = self.count
        return self.sum / n if n else 0.0

    def quantile(self, q: float) -> float:
        """An estimate of the q-quantile (0 <= q <= 1), in seconds:
        interpolated inside its bucket on a log scale, so within a factor of
        two of the true value, and never above ``max``."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be between 0 and 1, not {q!r}")
        n = self.count
        if n == 0:
            return 0.0
        rank = q * n
        seen = 0
        for i, c in enumerate(self.counts):
            if c == 0 or seen + c < rank:
                seen += c
                continue
            frac = (rank - seen) / c
            hi = self.bounds[i] if i < len(self.bounds) else self.max
            lo = self.bounds[i - 1] if i > 0 else 0.0
            if lo <= 0.0:
                value = hi * frac
            else:
                value = lo * math.pow(hi / lo, frac)
            return min(value, self.max)
        return self.max

    @property
    def p50(self) -> float:
        return self.quantile(0.5)

    @property
    def p99(self) -> float:
        return self.quantile(0.99)

    def since(self, earlier: Histogram) -> Histogram:
        """What was recorded after `earlier` (a snapshot of the same
        histogram); its ``max`` is the upper bound of the highest bucket that
        grew, or this histogram's max if that is smaller."""
        counts = tuple(max(0, a - b) for a, b in zip(self.counts, earlier.counts))
        top = max((i for i, c in enumerate(counts) if c), default=None)
        if top is None:
            hi = 0.0
        elif top < len(self.bounds):
            hi = min(self.bounds[top], self.max)
        else:
            hi = self.max
        return Histogram(self.bounds, counts, max(0.0, self.sum - earlier.sum), hi)


@dataclass(frozen=True)
class Turn:
    """One of the longest turns."""

    #: How long the turn ran, in seconds (the wait in the poll left out).
    duration: float
    #: When it ended, in ``loop.time()`` (time.monotonic()) seconds.
    ended_at: float
    #: How many ready callbacks it ran (I/O callbacks run inside the poll).
    callbacks: int


@dataclass(frozen=True)
class SlowCallback:
    """One of the slowest callbacks, named as asyncio's debug mode would
    name it in "Executing ... took N seconds"."""

    #: How long it ran, in seconds.
    duration: float
    #: When it began, in ``loop.time()`` (time.monotonic()) seconds.
    started_at: float
    #: The handle's repr, a task's repr for a task step, or for a protocol
    #: callback run from a transport's read, ``<Handle Transport._read_ready()>``.
    name: str
    #: A task step's coroutine (its qualified name), else None.
    coroutine: str | None
    #: Where that coroutine is suspended now ("file:line"), None once done.
    location: str | None
    #: The protocol's class, for a protocol callback run by a read.
    protocol: str | None


@dataclass(frozen=True)
class TransportTotals:
    """The loop's transports together (those closed included)."""

    bytes_read: int
    bytes_written: int
    #: Read system calls (each read libuv made for a stream, each
    #: recvfrom for a datagram socket).
    reads: int
    #: Writes: each direct write attempt and each write request handed to
    #: libuv (which makes at least one system call for it), each send.
    writes: int
    #: Time reading was paused (pause_reading()), pauses that ended.
    reading_paused_seconds: float
    #: Time the protocol was told to pause writing, pauses that ended.
    writing_paused_seconds: float


@dataclass(frozen=True)
class TransportStats:
    """One transport's figures: ``transport.get_extra_info('zuvrs_stats')``
    (for TLS, those of the socket underneath: ciphertext)."""

    bytes_read: int
    bytes_written: int
    reads: int
    writes: int
    #: The most bytes its write buffer held (queued and in flight).
    write_buffer_high: int
    #: Time spent paused so far (a pause in progress included); timed only
    #: while the loop's stats are on.
    reading_paused_seconds: float
    writing_paused_seconds: float

    @classmethod
    def _from_native(cls, d: Mapping[str, Any]) -> TransportStats:
        return cls(**{f.name: d[f.name] for f in fields(cls)})


@dataclass(frozen=True)
class LoopStats:
    """A snapshot of ``loop.stats()``. Counts and seconds run from the
    loop's creation, or from the last ``stats(reset=True)``."""

    #: Whether the loop times its turns (the figures marked "timed" are
    #: zero or empty otherwise).
    enabled: bool
    #: The clock timing uses: "tsc" (the CPU's counter) or "monotonic".
    clock: str
    #: ``loop.time()`` when the snapshot was taken.
    taken_at: float
    #: Turns (iterations) of the loop.
    turns: int
    #: Ready callbacks run (call_soon, call_later, futures' callbacks, task
    #: steps, add_reader callbacks, ...; cancelled ones are not run).
    callbacks: int
    #: Timers (call_later / call_at) that ran, and that were cancelled
    #: before running.
    timers_fired: int
    timers_cancelled: int
    #: I/O events: libuv callbacks with I/O (a read, a write completed, a
    #: datagram socket ready) and fd watchers found ready.
    io_events: int
    #: call_soon_threadsafe calls, and the times they woke the loop (several
    #: calls before the loop wakes make one wake-up).
    threadsafe_calls: int
    wakeups: int
    #: Timed: time inside run_forever / run_until_complete, and the part of
    #: it spent waiting in the poll for I/O, timers or wake-ups.
    run_seconds: float
    poll_seconds: float
    #: Timed: how late callbacks started against when they were due.
    lag: Histogram
    #: Timed: how long turns took (the wait in the poll left out).
    turn_time: Histogram
    #: Timed: the longest turns, and the slowest callbacks (at least 1 ms),
    #: longest first, over the last one to two minutes.
    longest_turns: tuple[Turn, ...]
    slowest_callbacks: tuple[SlowCallback, ...]
    transports: TransportTotals
    #: Callbacks waiting to run, and timers scheduled, at the snapshot.
    ready: int
    timers: int

    @property
    def busy_seconds(self) -> float:
        """Time spent running: callbacks, protocol callbacks and the loop's
        own work (run_seconds - poll_seconds)."""
        return max(0.0, self.run_seconds - self.poll_seconds)

    @property
    def busy(self) -> float:
        """The share of the running time spent busy (0..1)."""
        return self.busy_seconds / self.run_seconds if self.run_seconds > 0 else 0.0

    @classmethod
    def _from_native(cls, d: Mapping[str, Any], taken_at: float) -> LoopStats:
        def hist(key: str) -> Histogram:
            counts, total, top = d[key]
            return Histogram(BUCKET_BOUNDS, tuple(counts), total, top)

        return cls(
            enabled=d["enabled"],
            clock=d["clock"],
            taken_at=taken_at,
            turns=d["turns"],
            callbacks=d["callbacks"],
            timers_fired=d["timers_fired"],
            timers_cancelled=d["timers_cancelled"],
            io_events=d["io_events"],
            threadsafe_calls=d["threadsafe_calls"],
            wakeups=d["wakeups"],
            run_seconds=d["run_seconds"],
            poll_seconds=d["poll_seconds"],
            lag=hist("lag"),
            turn_time=hist("turn_time"),
            longest_turns=tuple(Turn(*t) for t in d["longest_turns"]),
            slowest_callbacks=tuple(SlowCallback(*s) for s in d["slowest"]),
            transports=TransportTotals(**d["transports"]),
            ready=d["ready"],
            timers=d["timers"],
        )


# -- Prometheus ------------------------------------------------------------------

LoopsArg = Union[Any, Iterable[Any], Mapping[str, Any], None]


def _labelled(loops_arg: LoopsArg) -> list[tuple[str, Any]]:
    if loops_arg is None:
        return [(_number(loop), loop) for loop in loops()]
    if isinstance(loops_arg, Mapping):
        return [(str(name), loop) for name, loop in loops_arg.items()]
    if hasattr(loops_arg, "_stats"):
        loops_arg = [loops_arg]
    return [(_number(loop), loop) for loop in loops_arg]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(x: float) -> str:
    if isinstance(x, bool):
        return "1" if x else "0"
    if isinstance(x, int):
        return str(x)
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return repr(float(x))


_COUNTERS = (
    ("zuvrs_loop_turns_total", "Turns (iterations) of the event loop.", lambda s: s.turns),
    ("zuvrs_loop_callbacks_total", "Ready callbacks the loop ran.", lambda s: s.callbacks),
    ("zuvrs_loop_timers_fired_total", "Timers (call_later, call_at) that ran.", lambda s: s.timers_fired),
    ("zuvrs_loop_timers_cancelled_total", "Timers cancelled before they ran.", lambda s: s.timers_cancelled),
    ("zuvrs_loop_io_events_total", "I/O events the loop handled.", lambda s: s.io_events),
    ("zuvrs_loop_threadsafe_calls_total", "call_soon_threadsafe calls.", lambda s: s.threadsafe_calls),
    ("zuvrs_loop_wakeups_total", "Times other threads woke the loop.", lambda s: s.wakeups),
    ("zuvrs_loop_run_seconds_total", "Time the loop ran (timed).", lambda s: s.run_seconds),
    ("zuvrs_loop_poll_seconds_total", "Time the loop waited in the poll (timed).", lambda s: s.poll_seconds),
    ("zuvrs_loop_busy_seconds_total", "Time the loop was busy: run minus poll (timed).", lambda s: s.busy_seconds),
)

_GAUGES = (
    ("zuvrs_loop_stats_enabled", "Whether the loop times its turns.", lambda s: int(s.enabled)),
    ("zuvrs_loop_ready_callbacks", "Callbacks waiting to run.", lambda s: s.ready),
    ("zuvrs_loop_scheduled_timers", "Timers scheduled.", lambda s: s.timers),
    (
        "zuvrs_loop_slowest_callback_seconds",
        "The slowest callback of the last one to two minutes (at least 1 ms; timed).",
        lambda s: s.slowest_callbacks[0].duration if s.slowest_callbacks else 0.0,
    ),
    (
        "zuvrs_loop_longest_turn_seconds",
        "The longest turn of the last one to two minutes (timed).",
        lambda s: s.longest_turns[0].duration if s.longest_turns else 0.0,
    ),
)

_TRANSPORT_COUNTERS = (
    ("zuvrs_transport_bytes_total", "Bytes the loop's transports read and wrote.", "bytes_read", "bytes_written"),
    ("zuvrs_transport_calls_total", "Read and write calls of the loop's transports.", "reads", "writes"),
    (
        "zuvrs_transport_paused_seconds_total",
        "Time the loop's transports spent with reading paused, or their protocols told to pause writing (timed).",
        "reading_paused_seconds",
        "writing_paused_seconds",
    ),
)

_HISTOGRAMS = (
    ("zuvrs_loop_lag_seconds", "How late callbacks started against when they were due (timed).", "lag"),
    ("zuvrs_loop_turn_duration_seconds", "How long turns took, waiting in the poll left out (timed).", "turn_time"),
)


def prometheus(loops: LoopsArg = None) -> str:
    """The figures of `loops` in Prometheus's text exposition format
    (version 0.0.4): a loop, loops, a mapping of names to loops (the names
    become the ``loop`` label; otherwise it is the loop's number in this
    process, in order of creation), or None for every open zuvrs loop.
    Taking them resets nothing."""
    taken = [(name, loop.stats()) for name, loop in _labelled(loops)]
    out: list[str] = []

    def family(name: str, kind: str, help_text: str) -> None:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")

    for name, help_text, get in _COUNTERS:
        family(name, "counter", help_text)
        for label, s in taken:
            out.append(f'{name}{{loop="{_escape(label)}"}} {_num(get(s))}')
    for name, help_text, get in _GAUGES:
        family(name, "gauge", help_text)
        for label, s in taken:
            out.append(f'{name}{{loop="{_escape(label)}"}} {_num(get(s))}')
    for name, help_text, read, write in _TRANSPORT_COUNTERS:
        family(name, "counter", help_text)
        for label, s in taken:
            for direction, attr in (("read", read), ("write", write)):
                value = getattr(s.transports, attr)
                out.append(f'{name}{{loop="{_escape(label)}",direction="{direction}"}} {_num(value)}')
    for name, help_text, attr in _HISTOGRAMS:
        family(name, "histogram", help_text)
        for label, s in taken:
            h: Histogram = getattr(s, attr)
            loop_label = f'loop="{_escape(label)}"'
            cumulative = 0
            for bound, count in zip(h.bounds, h.counts):
                cumulative += count
                out.append(f'{name}_bucket{{{loop_label},le="{_num(bound)}"}} {cumulative}')
            cumulative += h.counts[-1]
            out.append(f'{name}_bucket{{{loop_label},le="+Inf"}} {cumulative}')
            out.append(f"{name}_sum{{{loop_label}}} {_num(h.sum)}")
            out.append(f"{name}_count{{{loop_label}}} {cumulative}")
    return "\n".join(out) + "\n"


# -- The one-line summary (python -m zuvrs --stats) ----------------------------


def _seconds(x: float) -> str:
    if x >= 1.0:
        return f"{x:.2f}s"
    if x >= 1e-3:
        return f"{x * 1e3:.1f}ms"
    return f"{x * 1e6:.0f}us"


def _rate(n: float, seconds: float) -> str:
    r = n / seconds if seconds > 0 else 0.0
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if r >= scale:
            return f"{r / scale:.1f}{unit}"
    return f"{r:.0f}"


def _bytes_rate(n: float, seconds: float) -> str:
    r = n / seconds if seconds > 0 else 0.0
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if r >= scale:
            return f"{r / scale:.1f}{unit}/s"
    return f"{r:.0f}B/s"


def summary(now: LoopStats, before: LoopStats | None = None, label: str = "") -> str:
    """One line on what a loop did between two snapshots (or since its
    start): busy share, turns, callbacks and I/O per second, lag p50 / p99 /
    max, bytes per second each way, and the slowest callback of the
    interval."""
    if before is None:
        before = LoopStats._from_native(_ZERO, 0.0)
        wall = now.run_seconds
    else:
        wall = now.taken_at - before.taken_at
    run = now.run_seconds - before.run_seconds
    busy = max(0.0, run - (now.poll_seconds - before.poll_seconds))
    lag = now.lag.since(before.lag)
    parts = [f"zuvrs loop {label}:" if label else "zuvrs loop:"]
    if now.enabled:
        share = busy / run if run > 0 else 0.0
        parts.append(f"busy {share * 100:.0f}%")
    parts.append(f"turns {_rate(now.turns - before.turns, wall)}/s")
    parts.append(f"callbacks {_rate(now.callbacks - before.callbacks, wall)}/s")
    parts.append(f"io {_rate(now.io_events - before.io_events, wall)}/s")
    if now.enabled:
        parts.append(f"lag p50 {_seconds(lag.p50)} p99 {_seconds(lag.p99)} max {_seconds(lag.max)}")
    t, b = now.transports, before.transports
    read, written = t.bytes_read - b.bytes_read, t.bytes_written - b.bytes_written
    parts.append(f"in {_bytes_rate(read, wall)} out {_bytes_rate(written, wall)}")
    parts.append(f"ready {now.ready} timers {now.timers}")
    recent = [c for c in now.slowest_callbacks if c.started_at >= before.taken_at]
    if recent:
        slow = max(recent, key=lambda c: c.duration)
        parts.append(f"slowest {_seconds(slow.duration)} {slow.name}")
    elif not now.enabled:
        parts.append("(timing off)")
    return " ".join(parts)


_ZERO: dict[str, Any] = {
    "enabled": False,
    "clock": "",
    "turns": 0,
    "callbacks": 0,
    "timers_fired": 0,
    "timers_cancelled": 0,
    "io_events": 0,
    "threadsafe_calls": 0,
    "wakeups": 0,
    "run_seconds": 0.0,
    "poll_seconds": 0.0,
    "lag": ([0] * (len(BUCKET_BOUNDS) + 1), 0.0, 0.0),
    "turn_time": ([0] * (len(BUCKET_BOUNDS) + 1), 0.0, 0.0),
    "longest_turns": [],
    "slowest": [],
    "transports": {
        "bytes_read": 0,
        "bytes_written": 0,
        "reads": 0,
        "writes": 0,
        "reading_paused_seconds": 0.0,
        "writing_paused_seconds": 0.0,
    },
    "ready": 0,
    "timers": 0,
}
