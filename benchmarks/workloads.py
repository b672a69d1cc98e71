"""Benchmark workload bodies shared by the codspeed suite and compare.py.

Every workload is a function ``workload(loop_factory, size) -> dict``. It
builds a fresh loop with ``loop_factory()``, does its work on it, closes it
and returns::

    {
        "workload": name,
        "ops": size,              # units of work, for ops/s
        "parity": {...},          # what was actually done (counted on the loop)
        "expected": {...},        # what should have been done
        "ok": parity == expected and no loop errors,
        "elapsed": seconds,       # loop creation -> work -> loop.close()
        "loop_type": "module.Class",
        "loop_errors": [...],     # contexts seen by the loop's exception handler
        "info": {...},            # network workloads only: what may differ
                                  # between loops without being wrong (socket
                                  # options, reads per response, ...)
    }

A loop that lacks what a workload needs (rloop has no Unix sockets) makes
the workload raise ``Unsupported``; the sample reports it as such.

``elapsed`` covers creating the loop, running the work and closing the loop;
it excludes the parity checks done afterwards, so that checking the answer
costs every loop nothing. Callbacks are plain Python functions that count
what they do; that counting is the same for every loop.

The scheduling workloads run callbacks, timers and tasks; the network
workloads (TCP and Unix echo, bulk, short connections, getaddrinfo, split
writes, flow-controlled bulk, HTTP/1.1 keep-alive, WebSocket echo, and
the TLS 1.3 ones: echo, bulk, handshakes, HTTP, WebSocket) run a server
and its client on the same loop, in one process; see the "Network
workloads" section and "TLS material". The datagram, pipe and process
workloads (UDP echo, pipe echo, child spawns, a child's stdout through a
PIPE) follow the same rules; see the "Datagram, pipe and process
workloads" section.

Nothing here depends on a particular loop: loops are reached only through
``loop_factory`` (see ``get_loop_factory``). Runs on CPython 3.10 - 3.14.
"""

from __future__ import annotations

import asyncio
import atexit
import hashlib
import importlib
import operator
import os
import shutil
import socket
import ssl
import sys
import tempfile
import threading
import time
import zlib
from typing import Any, Callable, Dict, List, Tuple

LoopFactory = Callable[[], asyncio.AbstractEventLoop]

# --------------------------------------------------------------------------
# Loops
# --------------------------------------------------------------------------

#: Every loop the benchmarks know, in default display order.
#: ``zuvrs-streams`` is zuvrs with ``zuvrs.streams.install()`` in force (its
#: factory calls it), so that asyncio.open_connection / start_server /
#: open_unix_connection / start_unix_server give zuvrs's native streams;
#: ``rsloop`` is rsloop as it ships: importing it replaces
#: asyncio.open_connection and start_server (not the Unix ones) with its
#: own fast streams whenever the running loop is an rsloop loop.
LOOP_NAMES = ("asyncio", "uvloop", "rloop", "rsloop", "zuvrs", "zuvrs-streams")
#: the HTTP benchmarks' default loops (their servers and clients use
#: protocols, not streams, so zuvrs-streams would repeat zuvrs)
HTTP_LOOP_NAMES = ("asyncio", "uvloop", "rloop", "zuvrs")
#: loops that take part only when asked for: ``zuvrs-base`` is zuvrs as
#: built from another commit, the package in the directory that the
#: environment variable ZUVRS_BASE names (a wheel unpacked there, see
#: compare.py), for a before/after comparison of a change in one run;
#: ``zuvrs-base-streams`` the same with its native streams installed
EXTRA_LOOP_NAMES = ("zuvrs-base", "zuvrs-base-streams")
#: where zuvrs-base's package is
BASE_ENV = "ZUVRS_BASE"

#: name -> (module to import, attribute that makes a new loop)
_LOOP_MODULES = {
    "asyncio": ("asyncio", "new_event_loop"),
    "uvloop": ("uvloop", "new_event_loop"),
    "rloop": ("rloop", "new_event_loop"),
    "rsloop": ("rsloop", "new_event_loop"),
    "zuvrs": ("zuvrs", "new_event_loop"),
    "zuvrs-streams": ("zuvrs", "new_event_loop"),
    "zuvrs-base": ("zuvrs", "new_event_loop"),
    "zuvrs-base-streams": ("zuvrs", "new_event_loop"),
}

_ASYNCIO_READER = "asyncio.streams.StreamReader"

#: name -> {"tcp": class, "unix": class}: the StreamReader class that
#: asyncio.open_connection / start_server (TCP, TLS included) and
#: open_unix_connection / start_unix_server give on that loop. Every
#: stream workload records the classes its connections got, and the
#: sample fails (parity ``streams_as_claimed``) where they are not these.
STREAM_READERS: Dict[str, Dict[str, str]] = {
    "asyncio": {"tcp": _ASYNCIO_READER, "unix": _ASYNCIO_READER},
    "uvloop": {"tcp": _ASYNCIO_READER, "unix": _ASYNCIO_READER},
    "rloop": {"tcp": _ASYNCIO_READER, "unix": _ASYNCIO_READER},
    # rsloop patches only the TCP functions
    "rsloop": {"tcp": "rsloop._loop.PyFastStreamReader", "unix": _ASYNCIO_READER},
    "zuvrs": {"tcp": _ASYNCIO_READER, "unix": _ASYNCIO_READER},
    "zuvrs-streams": {"tcp": "zuvrs.streams.StreamReader",
                      "unix": "zuvrs.streams.StreamReader"},
    "zuvrs-base": {"tcp": _ASYNCIO_READER, "unix": _ASYNCIO_READER},
    "zuvrs-base-streams": {"tcp": "zuvrs.streams.StreamReader",
                           "unix": "zuvrs.streams.StreamReader"},
}

#: what a loop's column is besides "the loop" (compare.py's provenance)
LOOP_NOTES = {
    "rsloop": "as it ships: importing rsloop replaced asyncio.open_connection "
              "and start_server with its own fast streams (rsloop._loop."
              "PyFastStreamReader / PyFastStreamWriter) on rsloop loops; "
              "the Unix functions stay asyncio's",
    "zuvrs-streams": "zuvrs.new_event_loop with zuvrs.streams.install() "
                     "called first: asyncio's open_connection, start_server, "
                     "open_unix_connection and start_unix_server give "
                     "zuvrs.streams' native StreamReader / StreamWriter",
    "zuvrs-base": "zuvrs built from another commit (the package in "
                  "$ZUVRS_BASE), asyncio's streams",
    "zuvrs-base-streams": "zuvrs-base with zuvrs.streams.install()",
}


class LoopUnavailable(Exception):
    """The loop's package is not installed (or fails to import)."""


class Unsupported(Exception):
    """The loop does not implement what the workload needs (e.g. rloop has
    no Unix sockets); reported as "unsupported", not as a crash."""


def _install_zuvrs_streams() -> None:
    import zuvrs.streams

    zuvrs.streams.install()


#: name -> what the loop's factory does before it makes each loop
_LOOP_PREPARE: Dict[str, Callable[[], None]] = {
    "zuvrs-streams": _install_zuvrs_streams,
    "zuvrs-base-streams": _install_zuvrs_streams,
}


def release_loop(name: str) -> None:
    """Undo what the factory of loop ``name`` did to asyncio, where that can
    be undone (zuvrs-streams: zuvrs.streams.uninstall()); for tests that run
    several loops in one process. rsloop's import-time patches stay (they
    apply to rsloop loops only)."""
    if name in ("zuvrs-streams", "zuvrs-base-streams") and "zuvrs.streams" in sys.modules:
        sys.modules["zuvrs.streams"].uninstall()


def get_loop_factory(name: str) -> LoopFactory:
    """Return a callable that makes a new event loop of loop ``name``.

    The callable has the attributes ``loop_name`` and ``stream_readers``
    (STREAM_READERS[name]), which the workloads check their streams
    against. Raises LoopUnavailable if the loop's package is not installed
    or does not import; the message says which.
    """
    try:
        modname, attr = _LOOP_MODULES[name]
    except KeyError:
        raise ValueError(
            f"unknown loop {name!r}; known: {', '.join(LOOP_NAMES + EXTRA_LOOP_NAMES)}"
        ) from None
    if name.startswith("zuvrs-base"):
        base = os.environ.get(BASE_ENV)
        if not base or not os.path.isdir(os.path.join(base, "zuvrs")):
            raise LoopUnavailable(f"zuvrs-base: ${BASE_ENV} names no directory holding zuvrs")
        if "zuvrs" in sys.modules and not sys.modules["zuvrs"].__file__.startswith(base):
            raise LoopUnavailable("zuvrs-base: another zuvrs is imported in this process")
        sys.path.insert(0, base)
    try:
        mod = importlib.import_module(modname)
        prepare = _LOOP_PREPARE.get(name)
        if prepare is not None:
            importlib.import_module(modname + ".streams")
    except ModuleNotFoundError as exc:
        if exc.name == modname:
            raise LoopUnavailable(f"{name}: not installed") from exc
        raise LoopUnavailable(f"{name}: import failed: {exc!r}") from exc
    except Exception as exc:  # a broken build is an import error, not absence
        raise LoopUnavailable(f"{name}: import failed: {exc!r}") from exc
    try:
        make = getattr(mod, attr)
    except AttributeError:
        raise LoopUnavailable(f"{name}: {modname}.{attr} missing") from None

    if prepare is None:
        def factory() -> asyncio.AbstractEventLoop:
            return make()
    else:
        def factory() -> asyncio.AbstractEventLoop:
            prepare()
            return make()

    factory.loop_name = name  # type: ignore[attr-defined]
    factory.stream_readers = STREAM_READERS[name]  # type: ignore[attr-defined]
    return factory


def _class_name(obj: Any) -> str:
    t = type(obj)
    return f"{t.__module__}.{t.__qualname__}"


def _note_streams(info: Dict[str, Any], side: str, kind: str, reader: Any,
                  writer: Any = None) -> None:
    """Record the StreamReader (and StreamWriter) class that one side of a
    stream connection got (first call per side); ``kind`` is "tcp" (TLS
    included) or "unix". _Run.result checks them against the loop's
    STREAM_READERS."""
    streams = info.setdefault("streams", {})
    if side not in streams:
        streams[side] = {"kind": kind, "reader": _class_name(reader)}
        if writer is not None:
            streams[side]["writer"] = _class_name(writer)


def _loop_type(loop: Any) -> str:
    t = type(loop)
    s = f"{t.__module__}.{t.__qualname__}"
    sel = getattr(loop, "_selector", None)
    if sel is not None:  # stdlib selector loops: say which selector
        s += f" [{type(sel).__name__}]"
    return s


class _Run:
    """Fresh loop + timing + loop-error collection for one workload run."""

    def __init__(self, loop_factory: LoopFactory) -> None:
        self.loop_factory = loop_factory
        self.loop_errors: List[str] = []
        self.t0 = 0.0
        self.elapsed = 0.0
        self.loop: Any = None

    def _handler(self, *args: Any) -> None:
        # asyncio calls handler(loop, context); be tolerant of loops that
        # pass only the context.
        context = args[-1] if args else {}
        try:
            msg = context.get("message", "")
            exc = context.get("exception")
            self.loop_errors.append(f"{msg} {exc!r}" if exc is not None else msg)
        except Exception:  # pragma: no cover - defensive
            self.loop_errors.append(repr(context))

    def __enter__(self) -> Any:
        self.t0 = time.perf_counter()
        self.loop = self.loop_factory()
        self.loop.set_exception_handler(self._handler)
        return self.loop

    def __exit__(self, *exc: Any) -> None:
        loop = self.loop
        try:
            if not loop.is_closed():
                loop.close()
        finally:
            self.elapsed = time.perf_counter() - self.t0

    def result(self, name: str, ops: int, parity: Dict[str, Any],
               expected: Dict[str, Any],
               info: Dict[str, Any] | None = None) -> Dict[str, Any]:
        res = {
            "workload": name,
            "ops": ops,
            "parity": parity,
            "expected": expected,
            "ok": parity == expected and not self.loop_errors,
            "elapsed": self.elapsed,
            "loop_type": _loop_type(self.loop),
            "loop_errors": self.loop_errors[:5],
            "loop_error_count": len(self.loop_errors),
        }
        if info is not None:
            # what may legitimately differ between loops (socket options,
            # how reads were split, ...): reported, not part of parity
            res["info"] = info
            self._check_streams(res, info)
        return res

    def _check_streams(self, res: Dict[str, Any], info: Dict[str, Any]) -> None:
        """Where the workload recorded its streams' classes and the factory
        says which it must give (get_loop_factory), a parity entry
        ``streams_as_claimed``: a zuvrs-streams sample that got asyncio's
        reader, or an rsloop one that did not get rsloop's, fails."""
        claimed = getattr(self.loop_factory, "stream_readers", None)
        streams = info.get("streams")
        if not claimed or not isinstance(streams, dict) or not streams:
            return
        wrong = [f"{side} {d['kind']}: {d['reader']} (expected {claimed[d['kind']]})"
                 for side, d in sorted(streams.items())
                 if d["reader"] != claimed.get(d["kind"])]
        info["stream_readers"] = "; ".join(
            f"{side} {d['reader']}" for side, d in sorted(streams.items()))
        if wrong:
            info["streams_not_as_claimed"] = "; ".join(wrong)
        res["parity"]["streams_as_claimed"] = not wrong
        res["expected"]["streams_as_claimed"] = True
        res["ok"] = res["ok"] and not wrong


#: see _guard_seconds; tests lower it to fail fast
GUARD_BASE_S = 20.0


def _guard_seconds(n: int) -> float:
    """Upper bound after which a waiting workload stops its loop itself.

    A loop that loses a wake-up or a timer then reports a parity mismatch
    instead of hanging (compare.py also kills hung processes).
    """
    return GUARD_BASE_S + n * 1e-4


def _increasing(seq: List[int]) -> bool:
    return all(map(operator.lt, seq, seq[1:]))


# --------------------------------------------------------------------------
# Workloads
# --------------------------------------------------------------------------


def call_soon(loop_factory: LoopFactory, n: int = 1_000_000) -> Dict[str, Any]:
    """n call_soon(cb) scheduled in one batch from one callback, counted."""
    count = 0

    def cb() -> None:
        nonlocal count
        count += 1

    run = _Run(loop_factory)
    with run as loop:

        def schedule() -> None:
            cs = loop.call_soon
            for _ in range(n):
                cs(cb)
            cs(loop.stop)  # FIFO: runs after the n callbacks, same turn

        loop.call_soon(schedule)
        loop.run_forever()
    return run.result("call_soon", n, {"callbacks": count}, {"callbacks": n})


def call_soon_args(loop_factory: LoopFactory, n: int = 1_000_000) -> Dict[str, Any]:
    """n call_soon(cb, i, 1, 2) in one batch; checksum of the arguments."""
    count = 0
    total = 0

    def cb(a: int, b: int, c: int) -> None:
        nonlocal count, total
        count += 1
        total += a + b + c

    run = _Run(loop_factory)
    with run as loop:

        def schedule() -> None:
            cs = loop.call_soon
            for i in range(n):
                cs(cb, i, 1, 2)
            cs(loop.stop)

        loop.call_soon(schedule)
        loop.run_forever()
    expected_sum = n * (n - 1) // 2 + 3 * n
    return run.result(
        "call_soon_args", n,
        {"callbacks": count, "checksum": total},
        {"callbacks": n, "checksum": expected_sum},
    )


def timers_cancel(loop_factory: LoopFactory, n: int = 200_000) -> Dict[str, Any]:
    """n call_later (10 s + spread) scheduled then cancelled, from one
    callback; the loop then runs one more turn (where loops that keep
    cancelled timers in a heap purge them) and stops. None may fire."""
    fired = 0
    handles: List[Any] = []

    def cb() -> None:
        nonlocal fired
        fired += 1

    run = _Run(loop_factory)
    with run as loop:

        def work() -> None:
            cl = loop.call_later
            hs = [cl(10.0 + (i % 1000) * 0.001, cb) for i in range(n)]
            for h in hs:
                h.cancel()
            handles.append(hs)
            loop.call_soon(loop.stop)

        loop.call_soon(work)
        loop.run_forever()
    hs = handles[0] if handles else []
    cancelled = sum(1 for h in hs if h.cancelled())
    return run.result(
        "timers_cancel", n,
        {"scheduled": len(hs), "cancelled": cancelled, "fired": fired},
        {"scheduled": n, "cancelled": n, "fired": 0},
    )


TIMER_SPREAD_MS = 100


def timers_fire(loop_factory: LoopFactory, n: int = 100_000) -> Dict[str, Any]:
    """n call_later((1 + i % 100) ms, cb, i) scheduled from one callback, all
    fire; the last one stops the loop.

    Delays start at 1 ms, not 0: uvloop turns call_later(0) into call_soon,
    which then runs after 1 ms timers that came due while the batch was
    being scheduled, so a 0 ms bucket would measure that quirk, not timers.

    Order check: with d(i) = 1 + i % 100, a timer i must fire before every timer
    j > i with d(j) >= d(i) (its deadline is earlier, or equal and it was
    scheduled first). Checked as: firing positions increase along each row
    of 100 consecutive indices and along each column of equal delay, which
    together imply the full rule.
    """
    spread = TIMER_SPREAD_MS
    fired: List[int] = []
    append = fired.append
    run = _Run(loop_factory)
    with run as loop:

        def cb(i: int) -> None:
            append(i)
            if len(fired) == n:
                loop.stop()

        def schedule() -> None:
            cl = loop.call_later
            for i in range(n):
                cl((1 + i % spread) * 0.001, cb, i)

        if n > 0:
            guard = loop.call_later((spread + 1) / 1000 + _guard_seconds(n),
                                   loop.stop)
            loop.call_soon(schedule)
            loop.run_forever()
            guard.cancel()

    # --- parity (not timed) ---
    count = len(fired)
    checksum = sum(fired)
    order_ok = False
    if count == n and checksum == n * (n - 1) // 2 and len(set(fired)) == n:
        pos = [0] * n
        for p, i in enumerate(fired):
            pos[i] = p
        order_ok = all(
            _increasing(pos[r:r + spread]) for r in range(0, n, spread)
        ) and all(_increasing(pos[d::spread]) for d in range(min(spread, n)))
    return run.result(
        "timers_fire", n,
        {"fired": count, "checksum": checksum, "order_ok": order_ok},
        {"fired": n, "checksum": n * (n - 1) // 2, "order_ok": True},
    )


SLEEP0_BATCH = 5_000


def sleep0_tasks(loop_factory: LoopFactory, n: int = 200_000) -> Dict[str, Any]:
    """n tasks each doing one sleep(0), gathered in batches of 5,000."""
    done = 0
    batches = 0

    async def task() -> int:
        nonlocal done
        await asyncio.sleep(0)
        done += 1
        return 1

    async def main() -> int:
        nonlocal batches
        total = 0
        remaining = n
        while remaining > 0:
            k = min(SLEEP0_BATCH, remaining)
            total += sum(await asyncio.gather(*[task() for _ in range(k)]))
            remaining -= k
            batches += 1
        return total

    run = _Run(loop_factory)
    with run as loop:
        total = loop.run_until_complete(main())
    return run.result(
        "sleep0_tasks", n,
        {"tasks_done": done, "results": total, "batches": batches},
        {"tasks_done": n, "results": n,
         "batches": -(-n // SLEEP0_BATCH)},
    )


def sleep0_one_task(loop_factory: LoopFactory, n: int = 200_000) -> Dict[str, Any]:
    """One task doing n sleep(0) (n loop turns)."""
    steps = 0

    async def main() -> None:
        nonlocal steps
        sleep = asyncio.sleep
        for _ in range(n):
            await sleep(0)
            steps += 1

    run = _Run(loop_factory)
    with run as loop:
        loop.run_until_complete(main())
    return run.result("sleep0_one_task", n, {"steps": steps}, {"steps": n})


def threadsafe(loop_factory: LoopFactory, n: int = 200_000) -> Dict[str, Any]:
    """n call_soon_threadsafe(cb) from another thread, counted on the loop;
    the n-th callback stops the loop."""
    count = 0
    on_loop_thread = True
    run = _Run(loop_factory)
    with run as loop:
        loop_thread = threading.get_ident()

        def cb() -> None:
            nonlocal count, on_loop_thread
            count += 1
            if count == n:
                on_loop_thread = threading.get_ident() == loop_thread
                loop.stop()

        def producer() -> None:
            cst = loop.call_soon_threadsafe
            for _ in range(n):
                cst(cb)

        thread = threading.Thread(target=producer, name="bench-producer")
        if n > 0:
            guard = loop.call_later(_guard_seconds(n), loop.stop)
            loop.call_soon(thread.start)
            loop.run_forever()
            guard.cancel()
            thread.join(_guard_seconds(n))
    return run.result(
        "threadsafe", n,
        {"callbacks": count, "on_loop_thread": on_loop_thread},
        {"callbacks": n, "on_loop_thread": True},
    )


def task_fanout(loop_factory: LoopFactory, n: int = 100_000) -> Dict[str, Any]:
    """gather() of n small coroutines (each becomes a task)."""

    async def small(i: int) -> int:
        return i

    async def main() -> int:
        return sum(await asyncio.gather(*[small(i) for i in range(n)]))

    run = _Run(loop_factory)
    with run as loop:
        total = loop.run_until_complete(main())
    return run.result(
        "task_fanout", n, {"checksum": total}, {"checksum": n * (n - 1) // 2}
    )


# --------------------------------------------------------------------------
# Network workloads
#
# Both ends run on the loop under test, in this one process: a server
# (asyncio streams or an asyncio.Protocol) and its client, over 127.0.0.1
# or a Unix socket in a fresh temporary directory. ``elapsed`` covers
# creating the loop, starting the server, connecting, the work, closing
# every connection (the server must see the client's close) and the server,
# and closing the loop.
#
# Parity is counted on the receiving side: every echoed payload compared
# with what was sent and CRC-32 checksummed, bulk bytes counted and their
# position pattern sampled, every response parsed and checked; "finished"
# and "server_saw_close" say the exchange ran to its end. What may
# legitimately differ between loops (socket options such as TCP_NODELAY and
# buffer sizes as the loop left them, how many reads a response arrived
# in) goes to ``info``, which compare.py prints next to the numbers.
#
# A stalled exchange (a lost wake-up, an EOF never delivered) is cancelled
# by a watchdog after STALL_S seconds without progress, and a close that
# does not complete is given up after CLOSE_WAIT_S: the sample then reports
# a parity mismatch quickly instead of hanging until compare.py kills it.
# --------------------------------------------------------------------------

HOST = "127.0.0.1"
ECHO_SIZE = 1024
_N_PAYLOADS = 64

#: seconds without progress after which the watchdog cancels the exchange
STALL_S = 5.0
#: seconds allowed for a close to be seen by the peer / a server to close
CLOSE_WAIT_S = 2.0


#: run _prelude() before each socket workload (compare.py --no-prelude
#: turns it off, as a diagnostic)
NETWORK_PRELUDE = True


def _prelude(loop_factory: LoopFactory, tls: bool = False) -> str:
    """One untimed TCP connection on a throwaway loop of the same kind:
    connect, echo 1 KiB, close, the server reads the EOF.

    It puts the fresh sample process past one-time allocator transients
    that any server leaves as soon as one connection has closed: with
    glibc, asyncio's 256 KiB read buffers are mmap()ed, mremap()ed and
    munmap()ed on every read (three system calls per read) until one such
    buffer is freed whole, which happens on the first read that returns
    EOF; without the prelude, asyncio's first echo in a fresh process runs
    at about half its usual speed. With ``tls``, the connection is a TLS
    one (TLS workloads), which also puts OpenSSL past its one-time setup
    (the first handshake of a process fetches its algorithms). Returns
    "ok" or what went wrong (the sample goes on either way)."""
    if not NETWORK_PRELUDE:
        return "off"
    out: List[str] = []
    skw, ckw = _tls_kwargs() if tls else ({}, {})

    async def main() -> None:
        loop = asyncio.get_running_loop()
        closed = loop.create_future()

        class Srv(asyncio.Protocol):
            def connection_made(self, tr: Any) -> None:
                self.tr = tr

            def data_received(self, data: bytes) -> None:
                self.tr.write(data)

            def connection_lost(self, exc: Any) -> None:
                _set_once(closed)

        server = await loop.create_server(Srv, HOST, 0, **skw)
        try:
            port = server.sockets[0].getsockname()[1]
            reader, writer = await asyncio.open_connection(HOST, port, **ckw)
            writer.write(b"p" * ECHO_SIZE)
            got = await asyncio.wait_for(reader.readexactly(ECHO_SIZE), 2.0)
            writer.close()
            await asyncio.wait_for(closed, 1.0)
            out.append("ok" if got == b"p" * ECHO_SIZE else "wrong echo")
        finally:
            server.close()

    loop = loop_factory()
    try:
        loop.run_until_complete(main())
    except BaseException as exc:
        out.append(f"failed: {type(exc).__name__} {exc}"[:200])
    finally:
        try:
            loop.close()
        except Exception:
            pass
    return out[-1] if out else "failed"


def _echo_payloads(size: int = ECHO_SIZE) -> List[bytes]:
    """64 distinct payloads of ``size`` bytes (1 KiB by default), used
    round-robin (a reordered, lost or repeated round trip changes the
    comparison and the checksum)."""
    return [bytes(((k * 131 + j * 7 + (j >> 8)) & 0xFF) for j in range(size))
            for k in range(_N_PAYLOADS)]


def _expected_echo_crc(n: int, payloads: List[bytes]) -> int:
    crc = 0
    for t in range(n):
        crc = zlib.crc32(payloads[t % _N_PAYLOADS], crc)
    return crc


def _socket_id(transport_or_writer: Any) -> Tuple[int, str] | None:
    """(fd, "socket:[inode]") of a connection's socket, read while it is
    open, for _note_unclosed; None if the loop exposes no socket."""
    try:
        fd = transport_or_writer.get_extra_info("socket").fileno()
        return fd, os.readlink(f"/proc/self/fd/{fd}")
    except Exception:
        return None


def _note_unclosed(info: Dict[str, Any], what: str,
                   ids: List[Tuple[int, str] | None]) -> None:
    """After a peer did not see a close in time: say whether the closed
    side's sockets are still open in this process (the same fd still names
    the same socket), i.e. the loop's close() never closed them, so no FIN
    was sent. rloop 0.5 does this: a transport's socket is closed only when
    the transport object is freed, and after close() its own maps (papaya
    hash maps, whose removed entries are reclaimed later, in batches) still
    hold two references to it, so a run's last closes never reach the peer
    while the loop runs (10 client connections closed: the server sees 0
    EOFs; 100: 96; 1,000: 989)."""
    left = []
    for sid in ids:
        if sid is None:
            continue
        fd, link = sid
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == link:
                left.append(f"fd {fd} {link}")
        except OSError:
            pass
    if left:
        info.setdefault(
            "close_not_done",
            f"{what}: closed (close() returned, is_closing()) but "
            f"{len(left)} of its sockets still open in this process "
            f"({', '.join(left[:3])}): the loop did not close them, so the "
            f"peer never saw a FIN")


def _sockopts(transport_or_writer: Any) -> Dict[str, Any]:
    """TCP_NODELAY and buffer sizes of a connection's socket as the loop
    left them (read at connection time)."""
    try:
        sock = transport_or_writer.get_extra_info("socket")
    except Exception as exc:
        return {"error": f"get_extra_info('socket'): {exc!r}"}
    if sock is None:
        return {"socket": None}
    out: Dict[str, Any] = {}
    try:
        if (sock.family in (socket.AF_INET, socket.AF_INET6)
                and sock.type == socket.SOCK_STREAM):
            out["nodelay"] = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        out["sndbuf"] = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        out["rcvbuf"] = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    except Exception as exc:
        out["error"] = repr(exc)
    return out


def _run_guarded(loop: Any, coro: Any, info: Dict[str, Any],
                 progress: Callable[[], Any], limit: float) -> None:
    """Run coro on loop as a task, under a watchdog.

    Every 0.25 s the watchdog reads ``progress()``; if it has not changed
    for STALL_S seconds, or the run has taken ``limit`` seconds, the task is
    cancelled (again, while it keeps stalling in its cleanup) and
    info["guard"] says why. The parity then shows what was not done.
    """
    task = loop.create_task(coro)
    start = loop.time()
    state: Dict[str, Any] = {"last": progress(), "since": start}

    def check() -> None:
        if task.done():
            return
        now = loop.time()
        p = progress()
        if p != state["last"]:
            state["last"] = p
            state["since"] = now
        elif now - state["since"] >= STALL_S:
            info.setdefault(
                "guard", f"no progress for {STALL_S:g} s (at {p!r}): cancelled")
            state["since"] = now
            task.cancel()
        if now - start >= limit:
            info.setdefault("guard", f"still running after {limit:g} s: cancelled")
            task.cancel()
        state["handle"] = loop.call_later(0.25, check)

    state["handle"] = loop.call_later(0.25, check)
    try:
        loop.run_until_complete(task)
    except asyncio.CancelledError:
        info.setdefault("guard", "cancelled")
    finally:
        state["handle"].cancel()


async def _bounded(aw: Any, info: Dict[str, Any], what: str,
                   seconds: float | None = None) -> bool:
    """Await aw for at most CLOSE_WAIT_S; False (and a note in info) if it
    did not complete."""
    try:
        await asyncio.wait_for(aw, CLOSE_WAIT_S if seconds is None else seconds)
        return True
    except asyncio.TimeoutError:
        info.setdefault("timeouts", []).append(
            f"{what}: not done after {CLOSE_WAIT_S if seconds is None else seconds:g} s")
        return False
    except Exception as exc:
        info.setdefault("close_errors", []).append(f"{what}: {exc!r}")
        return False


async def _close_server(server: Any, info: Dict[str, Any]) -> bool:
    server.close()
    return await _bounded(server.wait_closed(), info, "server.wait_closed()")


class _TempDir:
    """A fresh temporary directory for a Unix socket, removed afterwards."""

    def __enter__(self) -> str:
        self.path = tempfile.mkdtemp(prefix="zuvrs-bench-")
        return self.path

    def __exit__(self, *exc: Any) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _unsupported(loop: Any, what: str, exc: BaseException) -> Unsupported:
    return Unsupported(f"{_loop_type(loop)}: {what} not implemented"
                       + (f" ({exc})" if str(exc) else ""))


def _take_echo(proto: Any, data: bytes, size: int) -> bool:
    """Accumulate the echo of the one ``size``-byte payload in flight on a
    ping-pong client (attributes buf, overrun, t, payloads, matches, crc).
    True once it is complete: it is then compared, checksummed and counted
    (``t`` advances)."""
    buf = proto.buf + data if proto.buf else data
    if len(buf) < size:
        proto.buf = buf
        return False
    if len(buf) > size:  # more than the one payload in flight
        proto.overrun += 1
        buf = buf[:size]
    proto.buf = b""
    if buf == proto.payloads[proto.t % _N_PAYLOADS]:
        proto.matches += 1
    proto.crc = zlib.crc32(buf, proto.crc)
    proto.t += 1
    return True


def _set_once(fut: Any) -> None:
    if not fut.done():
        fut.set_result(None)


# ---- TLS material ----------------------------------------------------------
#
# TLS workloads run over 127.0.0.1 with a throw-away PKI: a CA and a server
# certificate for "localhost" (DNS) and 127.0.0.1 (IP), EC P-256 keys,
# ECDSA-SHA256 signatures, made with the ``cryptography`` package once per
# process into a temporary directory (removed at exit) and cached; always
# before the clock starts. Both contexts are pinned to TLS 1.3; the client
# context is ssl.create_default_context(cafile=<the CA>): it verifies the
# chain and the host name ("localhost", sent as SNI), and trusts nothing
# else. It keeps no session, so every connection is a full handshake.

#: the name the client asks for and checks
TLS_HOSTNAME = "localhost"
_TLS_FILES: Dict[str, str] = {}


def tls_material() -> Dict[str, str]:
    """Paths of the CA certificate ("ca"), the server certificate
    ("cert") and its key ("key"); made on the first call of the process."""
    if _TLS_FILES:
        return _TLS_FILES
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    d = tempfile.mkdtemp(prefix="zuvrs-bench-tls-")
    atexit.register(shutil.rmtree, d, True)
    now = datetime.datetime.now(datetime.timezone.utc)
    day = datetime.timedelta(days=1)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                            "zuvrs benchmark CA")])
    ca = (x509.CertificateBuilder()
          .subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(now - day).not_valid_after(now + 30 * day)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None),
                         critical=True)
          .add_extension(x509.KeyUsage(
              digital_signature=True, content_commitment=False,
              key_encipherment=False, data_encipherment=False,
              key_agreement=False, key_cert_sign=True, crl_sign=True,
              encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(
              ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(
                NameOID.COMMON_NAME, TLS_HOSTNAME)]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - day).not_valid_after(now + 30 * day)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None),
                           critical=True)
            .add_extension(x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .add_extension(x509.SubjectAlternativeName(
                [x509.DNSName(TLS_HOSTNAME),
                 x509.IPAddress(ipaddress.ip_address(HOST))]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    files = {"ca": os.path.join(d, "ca.pem"),
             "cert": os.path.join(d, "server.pem"),
             "key": os.path.join(d, "server.key")}
    with open(files["ca"], "wb") as f:
        f.write(ca.public_bytes(serialization.Encoding.PEM))
    with open(files["cert"], "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(files["key"], "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM,
                                  serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    _TLS_FILES.update(files)
    return _TLS_FILES


def tls_contexts() -> Tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server context, client context), TLS 1.3 only; see above."""
    m = tls_material()
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.minimum_version = ssl.TLSVersion.TLSv1_3
    server.maximum_version = ssl.TLSVersion.TLSv1_3
    server.load_cert_chain(m["cert"], m["key"])
    client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH,
                                        cafile=m["ca"])
    client.minimum_version = ssl.TLSVersion.TLSv1_3
    client.maximum_version = ssl.TLSVersion.TLSv1_3
    assert client.check_hostname and client.verify_mode == ssl.CERT_REQUIRED
    return server, client


def _tls_kwargs() -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """Keyword arguments of the server (create_server / start_server) and
    of the client (create_connection / open_connection) for TLS."""
    server, client = tls_contexts()
    return {"ssl": server}, {"ssl": client, "server_hostname": TLS_HOSTNAME}


async def _tls_call(loop: Any, tls: bool, aw: Any) -> Any:
    """Await aw (a server's creation); a loop that raises
    NotImplementedError for TLS (rloop) makes the workload Unsupported."""
    try:
        return await aw
    except NotImplementedError as exc:
        if not tls:
            raise
        raise _unsupported(loop, "TLS (ssl=SSLContext)", exc) from None


def tls_path(transport: Any) -> str:
    """Which TLS implementation a transport is: zuvrs says it
    (``_tls_path``: "native" or "sslproto: <why>"); for other loops, the
    transport's class."""
    t = getattr(transport, "transport", None) or transport  # StreamWriter
    path = getattr(t, "_tls_path", None)
    if isinstance(path, str):
        return path
    return f"{type(t).__module__}.{type(t).__qualname__}"


def _note_tls(info: Dict[str, Any], side: str, transport: Any,
              first: bool = True) -> int:
    """1 if the connection runs TLS 1.3 and (client side) its peer's
    certificate was verified and names TLS_HOSTNAME, and the handshake was
    a full one (no session resumed), else 0 (and a note in info). The
    first call per side records the TLS path, version and cipher in
    info."""
    try:
        sslobj = transport.get_extra_info("ssl_object")
        version = sslobj.version() if sslobj is not None else None
        ok = version == "TLSv1.3"
        if side == "client":
            cert = transport.get_extra_info("peercert") or {}
            ok = (ok and ("DNS", TLS_HOSTNAME) in cert.get("subjectAltName", ())
                  and not sslobj.session_reused)
        if first:
            info.setdefault(f"tls_path_{side}", tls_path(transport))
            if side == "client":
                cipher = transport.get_extra_info("cipher")
                info.setdefault("tls", f"{version} {cipher[0] if cipher else None}")
    except Exception as exc:
        info.setdefault(f"tls_error_{side}", repr(exc))
        return 0
    if not ok:
        info.setdefault(f"tls_unverified_{side}", f"version {version}")
    return int(ok)


# ---- echo over streams (TCP and Unix) ------------------------------------


def _echo_streams(name: str, loop_factory: LoopFactory, n: int,
                  unix: bool, tls: bool = False) -> Dict[str, Any]:
    payloads = _echo_payloads()
    expected_crc = _expected_echo_crc(n, payloads)
    st = {"round_trips": 0, "matches": 0, "checksum": 0, "server_bytes": 0,
          "server_errors": 0, "server_eof": False, "server_saw_close": False,
          "finished": False, "tls_verified": 0}
    info: Dict[str, Any] = {}
    # TLS: certificates and contexts made before the clock starts
    skw, ckw = _tls_kwargs() if tls else ({}, {})
    info["prelude"] = _prelude(loop_factory, tls)  # untimed

    async def main(path: str | None) -> None:
        loop = asyncio.get_running_loop()
        server_done = loop.create_future()

        async def handle(reader: Any, writer: Any) -> None:
            info["server_socket"] = _sockopts(writer)
            _note_streams(info, "server", "unix" if unix else "tcp", reader, writer)
            if tls:
                _note_tls(info, "server", writer)
            try:
                while True:
                    data = await reader.read(65536)
                    if not data:
                        st["server_eof"] = True
                        break
                    st["server_bytes"] += len(data)
                    writer.write(data)
                    await writer.drain()
            except Exception as exc:
                st["server_errors"] += 1
                info.setdefault("server_error", repr(exc))
            finally:
                writer.close()
                _set_once(server_done)

        if unix:
            try:
                server = await asyncio.start_unix_server(handle, path)
            except NotImplementedError as exc:
                raise _unsupported(loop, "create_unix_server", exc) from None
        else:
            server = await _tls_call(loop, tls, asyncio.start_server(
                handle, HOST, 0, **skw))
        try:
            if unix:
                reader, writer = await asyncio.open_unix_connection(path)
            else:
                port = server.sockets[0].getsockname()[1]
                reader, writer = await asyncio.open_connection(HOST, port, **ckw)
            info["client_socket"] = _sockopts(writer)
            client_sock = _socket_id(writer)
            _note_streams(info, "client", "unix" if unix else "tcp", reader, writer)
            if tls:
                st["tls_verified"] += _note_tls(info, "client", writer)
            try:
                crc = 0
                matches = 0
                write = writer.write
                readexactly = reader.readexactly
                crc32 = zlib.crc32
                for t in range(n):
                    p = payloads[t % _N_PAYLOADS]
                    write(p)
                    data = await readexactly(ECHO_SIZE)
                    if data == p:
                        matches += 1
                    crc = crc32(data, crc)
                    st["round_trips"] = t + 1
                st["matches"] = matches
                st["checksum"] = crc
            finally:
                writer.close()
                await _bounded(writer.wait_closed(), info, "client wait_closed()")
            # the server must see the client's close (EOF) and finish
            seen = await _bounded(server_done, info, "server handler sees EOF")
            st["server_saw_close"] = seen and st["server_eof"]
            if not seen:
                _note_unclosed(info, "the client's writer", [client_sock])
        finally:
            await _close_server(server, info)
        st["finished"] = True

    run = _Run(loop_factory)
    with run as loop:
        prog = lambda: st["round_trips"]  # noqa: E731
        if unix:
            with _TempDir() as d:
                _run_guarded(loop, main(os.path.join(d, "echo.sock")), info,
                             prog, _guard_seconds(n))
        else:
            _run_guarded(loop, main(None), info, prog, _guard_seconds(n))
    keys = ["round_trips", "matches", "checksum", "server_bytes",
            "server_errors", "server_saw_close", "finished"]
    expected = {"round_trips": n, "matches": n, "checksum": expected_crc,
                "server_bytes": n * ECHO_SIZE, "server_errors": 0,
                "server_saw_close": True, "finished": True}
    if tls:
        keys.append("tls_verified")
        expected["tls_verified"] = 1
    return run.result(name, n, {k: st[k] for k in keys}, expected, info)


def tcp_echo_streams(loop_factory: LoopFactory, n: int = 20_000) -> Dict[str, Any]:
    """n sequential round trips of 1 KiB over one TCP connection on
    127.0.0.1, asyncio streams on both ends (start_server/open_connection,
    the server does read(65536), write, drain); every echo compared with
    what was sent and CRC-32 checksummed."""
    return _echo_streams("tcp_echo_streams", loop_factory, n, unix=False)


def unix_echo_streams(loop_factory: LoopFactory, n: int = 20_000) -> Dict[str, Any]:
    """tcp_echo_streams over a Unix socket in a fresh temporary directory
    (start_unix_server/open_unix_connection). A loop without Unix sockets
    raises Unsupported."""
    return _echo_streams("unix_echo_streams", loop_factory, n, unix=True)


def tls_echo_streams(loop_factory: LoopFactory, n: int = 20_000) -> Dict[str, Any]:
    """tcp_echo_streams over TLS 1.3 (start_server(ssl=...) /
    open_connection(ssl=..., server_hostname="localhost")): the client
    verifies the chain and the host name (see tls_contexts); the TLS
    version and the peer's certificate are checked on the connection."""
    return _echo_streams("tls_echo_streams", loop_factory, n, unix=False,
                         tls=True)


# ---- echo over protocols --------------------------------------------------


class _EchoServerProtocol(asyncio.Protocol):
    def __init__(self, st: Dict[str, Any], info: Dict[str, Any],
                 closed: Any) -> None:
        self.st = st
        self.info = info
        self.closed = closed
        self.nbytes = 0

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.info["server_socket"] = _sockopts(transport)

    def data_received(self, data: bytes) -> None:
        self.nbytes += len(data)
        self.transport.write(data)

    def eof_received(self) -> None:
        self.st["server_eof"] = True
        return None  # close

    def connection_lost(self, exc: Any) -> None:
        self.st["server_bytes"] += self.nbytes
        _set_once(self.closed)


class EchoClientProtocol(asyncio.Protocol):
    """Sends payload t, waits for its 1 KiB echo, compares, checksums, sends
    t + 1; after n round trips closes and resolves ``done``."""

    def __init__(self, n: int, payloads: List[bytes], done: Any,
                 info: Dict[str, Any]) -> None:
        self.n = n
        self.payloads = payloads
        self.done = done
        self.info = info
        self.buf = b""
        self.t = 0
        self.matches = 0
        self.crc = 0
        self.overrun = 0
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.info["client_socket"] = _sockopts(transport)
        if self.n > 0:
            transport.write(self.payloads[0])
        else:
            transport.close()

    def data_received(self, data: bytes) -> None:
        if not _take_echo(self, data, ECHO_SIZE):
            return
        if self.t < self.n:
            self.transport.write(self.payloads[self.t % _N_PAYLOADS])
        else:
            self.transport.close()

    def connection_lost(self, exc: Any) -> None:
        if exc is not None:
            self.info.setdefault("client_error", repr(exc))
        _set_once(self.done)


def tcp_echo_protocol(loop_factory: LoopFactory, n: int = 20_000) -> Dict[str, Any]:
    """tcp_echo_streams with an asyncio.Protocol on both ends (the server
    writes back what it receives in data_received)."""
    payloads = _echo_payloads()
    expected_crc = _expected_echo_crc(n, payloads)
    st = {"server_bytes": 0, "server_eof": False, "server_saw_close": False,
          "finished": False}
    info: Dict[str, Any] = {}
    info["prelude"] = _prelude(loop_factory)  # untimed
    client: List[EchoClientProtocol] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server_closed = loop.create_future()
        done = loop.create_future()
        server = await loop.create_server(
            lambda: _EchoServerProtocol(st, info, server_closed), HOST, 0)
        port = server.sockets[0].getsockname()[1]
        try:
            tr, proto = await loop.create_connection(
                lambda: EchoClientProtocol(n, payloads, done, info), HOST, port)
            client.append(proto)
            client_sock = _socket_id(tr)
            try:
                await done
            finally:
                tr.close()
            seen = await _bounded(server_closed, info, "server sees the close")
            st["server_saw_close"] = seen and st["server_eof"]
            if not seen:
                _note_unclosed(info, "the client's transport", [client_sock])
        finally:
            await _close_server(server, info)
        st["finished"] = True

    run = _Run(loop_factory)
    with run as loop:
        _run_guarded(loop, main(), info,
                     lambda: client[0].t if client else 0, _guard_seconds(n))
    c = client[0] if client else None
    return run.result(
        "tcp_echo_protocol", n,
        {"round_trips": c.t if c else 0, "matches": c.matches if c else 0,
         "checksum": c.crc if c else 0, "overruns": c.overrun if c else 0,
         "server_bytes": st["server_bytes"],
         "server_saw_close": st["server_saw_close"], "finished": st["finished"]},
        {"round_trips": n, "matches": n, "checksum": expected_crc,
         "overruns": 0, "server_bytes": n * ECHO_SIZE,
         "server_saw_close": True, "finished": True},
        info,
    )


# ---- bulk -----------------------------------------------------------------

#: the stream is bytes(i % 251 for i in range(total)); a chunk is 1,024
#: periods, so every chunk is the same object, and a received piece's first,
#: middle and last bytes say whether it sits at the right position.
BULK_PERIOD = 251
BULK_CHUNK = BULK_PERIOD * 1024  # 257,024 bytes
MIB = 1 << 20

#: asyncio's TLS before 3.11 (sslproto, which zuvrs also uses there) ends a
#: connection on the peer's close_notify with connection_lost(None) alone,
#: never eof_received(); from 3.11 the protocol gets eof_received() first.
TLS_CLOSE_WITHOUT_EOF = sys.version_info < (3, 11)


class BulkReceiverProtocol(asyncio.Protocol):
    """Counts the bytes of the pattern stream and samples three bytes of
    every received piece against their position (a lost, repeated or
    reordered piece shifts the pattern unless its length is a multiple of
    251, and changes the byte count)."""

    def __init__(self, done: Any, info: Dict[str, Any],
                 tls: bool = False, total: int = 0) -> None:
        self.done = done
        self.info = info
        self.tls = tls
        self.total = total
        self.pos = 0
        self.pieces = 0
        self.mismatches = 0
        self.saw_eof = False
        self.lost_cleanly = False
        #: when the last of ``total`` bytes arrived (perf_counter)
        self.t_last = 0.0

    def connection_made(self, transport: Any) -> None:
        self.info["server_socket"] = _sockopts(transport)
        if self.tls:
            _note_tls(self.info, "server", transport)

    def data_received(self, data: bytes) -> None:
        n = len(data)
        p = self.pos
        m = n >> 1
        if (data[0] != p % BULK_PERIOD
                or data[m] != (p + m) % BULK_PERIOD
                or data[n - 1] != (p + n - 1) % BULK_PERIOD):
            self.mismatches += 1
        self.pos = p + n
        self.pieces += 1
        if self.pos == self.total:
            self.t_last = time.perf_counter()

    def eof_received(self) -> None:
        self.saw_eof = True
        return None  # close

    def connection_lost(self, exc: Any) -> None:
        if exc is not None:
            self.info.setdefault("server_error", repr(exc))
        self.lost_cleanly = exc is None
        _set_once(self.done)

    def saw_close(self) -> bool:
        """The sender's close arrived: as EOF, or on TLS before 3.11 as a
        clean connection_lost (TLS_CLOSE_WITHOUT_EOF)."""
        return self.saw_eof or (self.tls and TLS_CLOSE_WITHOUT_EOF and self.lost_cleanly)


def _bulk_info(info: Dict[str, Any], r: BulkReceiverProtocol | None, run: _Run,
               mib: int) -> None:
    """Reads and their mean size; and the throughput up to the last byte
    (``mib_s_to_last_byte``: from the loop's creation to the receiver's
    last byte, without the close), a diagnostic that is there also for a
    loop whose close never reaches the receiver."""
    if r is None or not r.pieces:
        return
    info["receiver_reads"] = r.pieces
    info["mean_read_kib"] = round(r.pos / r.pieces / 1024, 1)
    if r.t_last > run.t0:
        info["mib_s_to_last_byte"] = round(mib / (r.t_last - run.t0), 1)


def tcp_bulk(loop_factory: LoopFactory, mib: int = 1024) -> Dict[str, Any]:
    """One TCP connection streaming ``mib`` MiB: the client writes 251 KiB
    chunks through asyncio streams (write + drain, default buffer limits),
    the server's Protocol counts the bytes and samples their pattern; the
    time runs until the receiver has seen the sender's close."""
    return _bulk("tcp_bulk", loop_factory, mib, tls=False)


def tls_bulk(loop_factory: LoopFactory, mib: int = 512) -> Dict[str, Any]:
    """tcp_bulk over TLS 1.3 (the receiver is the TLS server, the streams
    writer the verifying client); the receiver sees the sender's
    close_notify as its EOF."""
    return _bulk("tls_bulk", loop_factory, mib, tls=True)


def _bulk(name: str, loop_factory: LoopFactory, mib: int,
          tls: bool) -> Dict[str, Any]:
    total = mib * MIB
    chunk = bytes(range(BULK_PERIOD)) * 1024
    info: Dict[str, Any] = {}
    skw, ckw = _tls_kwargs() if tls else ({}, {})
    info["prelude"] = _prelude(loop_factory, tls)  # untimed
    receiver: List[BulkReceiverProtocol] = []
    st = {"sent": 0, "receiver_saw_eof": False, "finished": False,
          "tls_verified": 0}

    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def factory() -> BulkReceiverProtocol:
            p = BulkReceiverProtocol(done, info, tls, total)
            receiver.append(p)
            return p

        server = await _tls_call(loop, tls, loop.create_server(
            factory, HOST, 0, **skw))
        port = server.sockets[0].getsockname()[1]
        try:
            reader, writer = await asyncio.open_connection(HOST, port, **ckw)
            info["client_socket"] = _sockopts(writer)
            client_sock = _socket_id(writer)
            _note_streams(info, "client", "tcp", reader, writer)
            if tls:
                st["tls_verified"] += _note_tls(info, "client", writer)
            try:
                full, rest = divmod(total, BULK_CHUNK)
                write = writer.write
                drain = writer.drain
                for _ in range(full):
                    write(chunk)
                    await drain()
                    st["sent"] += BULK_CHUNK
                if rest:
                    write(chunk[:rest])
                    await drain()
                    st["sent"] += rest
            finally:
                writer.close()
                await _bounded(writer.wait_closed(), info, "client wait_closed()")
            # the receiver must get every byte and then the close
            seen = await _bounded(done, info, "receiver sees the close")
            st["receiver_saw_eof"] = seen and bool(receiver and receiver[0].saw_close())
            if not seen:
                _note_unclosed(info, "the sender's writer", [client_sock])
        finally:
            await _close_server(server, info)
        st["finished"] = True

    run = _Run(loop_factory)
    with run as loop:
        _run_guarded(loop, main(), info,
                     lambda: (st["sent"], receiver[0].pos if receiver else 0),
                     _guard_seconds(mib * 100))
    r = receiver[0] if receiver else None
    _bulk_info(info, r, run, mib)
    parity = {"sent": st["sent"], "received": r.pos if r else 0,
              "sampled_mismatches": r.mismatches if r else 0,
              "connections": len(receiver),
              "receiver_saw_eof": st["receiver_saw_eof"],
              "finished": st["finished"]}
    expected = {"sent": total, "received": total, "sampled_mismatches": 0,
                "connections": 1, "receiver_saw_eof": True, "finished": True}
    if tls:
        parity["tls_verified"] = st["tls_verified"]
        expected["tls_verified"] = 1
    return run.result(name, mib, parity, expected, info)


# ---- short connections ----------------------------------------------------

SHORT_CONCURRENCY = 16


def short_connections(loop_factory: LoopFactory, n: int = 8_000) -> Dict[str, Any]:
    """n TCP connections, 16 at a time (streams on both ends): the client
    connects, sends ``REQ <i>\\n``, reads the reply to EOF and closes; the
    server reads the line, replies ``RESP <i> <48 x>\\n`` and closes."""
    return _short_connections("short_connections", loop_factory, n, tls=False)


def tls_handshakes(loop_factory: LoopFactory, n: int = 1_024) -> Dict[str, Any]:
    """short_connections over TLS 1.3: n fresh connections, 16 at a time,
    each a full handshake (no session resumption: the client context
    keeps no session), the client verifying chain and host name; then
    one small request/reply and the close (the server's close_notify is
    the client's EOF). Every connection's TLS version and verified peer
    certificate are checked."""
    return _short_connections("tls_handshakes", loop_factory, n, tls=True)


def _short_connections(name: str, loop_factory: LoopFactory, n: int,
                       tls: bool) -> Dict[str, Any]:
    pad = b"x" * 48
    st = {"served": 0, "server_errors": 0, "ok": 0, "checksum": 0,
          "client_errors": 0, "finished": False, "tls_verified": 0}
    info: Dict[str, Any] = {}
    skw, ckw = _tls_kwargs() if tls else ({}, {})
    info["prelude"] = _prelude(loop_factory, tls)  # untimed

    async def handle(reader: Any, writer: Any) -> None:
        if st["served"] == 0:
            _note_streams(info, "server", "tcp", reader, writer)
        if tls and "tls_path_server" not in info:
            _note_tls(info, "server", writer)
        try:
            line = await reader.readline()
            if line.startswith(b"REQ ") and line.endswith(b"\n"):
                writer.write(b"RESP " + line[4:-1] + b" " + pad + b"\n")
                st["served"] += 1
            else:
                st["server_errors"] += 1
                info.setdefault("bad_request", repr(line[:40]))
        except Exception as exc:
            st["server_errors"] += 1
            info.setdefault("server_error", repr(exc))
        finally:
            writer.close()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await _tls_call(loop, tls, asyncio.start_server(
            handle, HOST, 0, backlog=1024, **skw))
        port = server.sockets[0].getsockname()[1]
        next_i = 0

        async def worker() -> None:
            nonlocal next_i
            while next_i < n:
                i = next_i
                next_i += 1
                try:
                    reader, writer = await asyncio.open_connection(
                        HOST, port, **ckw)
                    if i == 0:
                        info["client_socket"] = _sockopts(writer)
                        _note_streams(info, "client", "tcp", reader, writer)
                    if tls:
                        st["tls_verified"] += _note_tls(
                            info, "client", writer, first=(i == 0))
                    try:
                        writer.write(b"REQ %d\n" % i)
                        reply = await reader.read()
                    finally:
                        writer.close()
                        await writer.wait_closed()
                    if reply == b"RESP %d " % i + pad + b"\n":
                        st["ok"] += 1
                        st["checksum"] += i
                    else:
                        st["client_errors"] += 1
                        info.setdefault("bad_reply", repr(reply[:60]))
                except Exception as exc:
                    st["client_errors"] += 1
                    info.setdefault("client_error", repr(exc))

        try:
            await asyncio.gather(*[worker() for _ in range(SHORT_CONCURRENCY)])
        finally:
            await _close_server(server, info)
        st["finished"] = True

    run = _Run(loop_factory)
    with run as loop:
        _run_guarded(loop, main(), info,
                     lambda: (st["ok"], st["client_errors"], st["served"]),
                     _guard_seconds(n * (100 if tls else 10)))
    keys = ["ok", "checksum", "served", "client_errors", "server_errors",
            "finished"]
    expected = {"ok": n, "checksum": n * (n - 1) // 2, "served": n,
                "client_errors": 0, "server_errors": 0, "finished": True}
    if tls:
        keys.append("tls_verified")
        expected["tls_verified"] = n
    return run.result(name, n, {k: st[k] for k in keys}, expected, info)


# ---- getaddrinfo ----------------------------------------------------------


def _gai_key(res: Any) -> List[Any]:
    return sorted((int(f), int(t), p, c, tuple(a)) for f, t, p, c, a in res)


def getaddrinfo_numeric(loop_factory: LoopFactory, n: int = 20_000) -> Dict[str, Any]:
    """n awaited loop.getaddrinfo() calls of a numeric address, alternating
    ('127.0.0.1', 80) and ('127.0.0.1', 80, type=SOCK_STREAM); every answer
    compared with socket.getaddrinfo's (computed first; an answer in
    another order counts as equal and is noted in info)."""
    exp_any = socket.getaddrinfo(HOST, 80)
    exp_stream = socket.getaddrinfo(HOST, 80, type=socket.SOCK_STREAM)
    key_any = _gai_key(exp_any)
    key_stream = _gai_key(exp_stream)
    st = {"calls": 0, "matches": 0, "order_differs": 0}
    info: Dict[str, Any] = {}

    async def main() -> None:
        loop = asyncio.get_running_loop()
        gai = loop.getaddrinfo
        stream = socket.SOCK_STREAM
        for i in range(n):
            if i & 1:
                r = await gai(HOST, 80, type=stream)
                exp, key = exp_stream, key_stream
            else:
                r = await gai(HOST, 80)
                exp, key = exp_any, key_any
            st["calls"] = i + 1
            if r == exp:
                st["matches"] += 1
            elif isinstance(r, (list, tuple)) and _gai_key(r) == key:
                st["matches"] += 1
                if list(r) == exp:
                    info.setdefault("note", f"answers are a {type(r).__name__}, not a list")
                else:
                    st["order_differs"] += 1
            else:
                info.setdefault("first_mismatch",
                                f"call {i}: got {r!r}, expected {exp!r}")

    run = _Run(loop_factory)
    with run as loop:
        _run_guarded(loop, main(), info, lambda: st["calls"],
                     _guard_seconds(n * 10))
    info["answers_in_other_order"] = st["order_differs"]
    return run.result(
        "getaddrinfo_numeric", n,
        {"calls": st["calls"], "matches": st["matches"]},
        {"calls": n, "matches": n},
        info,
    )


# ---- split writes ---------------------------------------------------------

SPLIT_REQ_LEN = 16  # b"GET %010d\r\n"
SPLIT_RESPONSE_LEN = 1024
_SPLIT_HEAD_PREFIX = (b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream"
                      b"\r\nX-Seq: ")


def _split_parts() -> Any:
    """(head suffix, body) so that head prefix + 10 digits + suffix + body
    is exactly SPLIT_RESPONSE_LEN bytes."""
    fixed = len(_SPLIT_HEAD_PREFIX) + 10
    for body_len in range(SPLIT_RESPONSE_LEN - fixed, 0, -1):
        suffix = b"\r\nContent-Length: %d\r\n\r\n" % body_len
        if fixed + len(suffix) + body_len == SPLIT_RESPONSE_LEN:
            body = bytes((j * 37 + 11) & 0xFF for j in range(body_len))
            return suffix, body
    raise AssertionError("no body length fits")


_SPLIT_HEAD_SUFFIX, SPLIT_BODY = _split_parts()
_SPLIT_HEAD_LEN = SPLIT_RESPONSE_LEN - len(SPLIT_BODY)


class _SplitServerProtocol(asyncio.Protocol):
    """Answers each 16-byte request with a 1 KiB response: a header (with
    the request's sequence number) and a body, as one write (header + body)
    or two (header, then body)."""

    def __init__(self, writes: int, st: Dict[str, Any], info: Dict[str, Any],
                 closed: Any) -> None:
        self.writes = writes
        self.st = st
        self.info = info
        self.closed = closed
        self.buf = b""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.info["server_socket"] = _sockopts(transport)

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        write = self.transport.write
        while len(buf) >= SPLIT_REQ_LEN:
            req = buf[:SPLIT_REQ_LEN]
            buf = buf[SPLIT_REQ_LEN:]
            header = _SPLIT_HEAD_PREFIX + req[4:14] + _SPLIT_HEAD_SUFFIX
            if self.writes == 1:
                write(header + SPLIT_BODY)
            else:
                write(header)
                write(SPLIT_BODY)
            self.st["served"] += 1
        self.buf = buf

    def eof_received(self) -> None:
        self.st["server_eof"] = True
        return None

    def connection_lost(self, exc: Any) -> None:
        _set_once(self.closed)


class SplitClientProtocol(asyncio.Protocol):
    """Sends request t, reads its 1 KiB response, checks header, sequence
    number and body, sends t + 1; counts its reads."""

    def __init__(self, n: int, done: Any) -> None:
        self.n = n
        self.done = done
        self.buf = b""
        self.t = 0
        self.ok = 0
        self.reads = 0
        self.overrun = 0
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        if self.n > 0:
            transport.write(b"GET %010d\r\n" % 0)
        else:
            transport.close()

    def data_received(self, data: bytes) -> None:
        self.reads += 1
        buf = self.buf + data if self.buf else data
        if len(buf) < SPLIT_RESPONSE_LEN:
            self.buf = buf
            return
        if len(buf) > SPLIT_RESPONSE_LEN:
            self.overrun += 1
            buf = buf[:SPLIT_RESPONSE_LEN]
        self.buf = b""
        t = self.t
        p = len(_SPLIT_HEAD_PREFIX)
        if (buf[_SPLIT_HEAD_LEN:] == SPLIT_BODY
                and buf[:p] == _SPLIT_HEAD_PREFIX
                and buf[p:p + 10] == b"%010d" % t
                and buf[p + 10:_SPLIT_HEAD_LEN] == _SPLIT_HEAD_SUFFIX):
            self.ok += 1
        t += 1
        self.t = t
        if t < self.n:
            self.transport.write(b"GET %010d\r\n" % t)
        else:
            self.transport.close()

    def connection_lost(self, exc: Any) -> None:
        _set_once(self.done)


def _split_writes(name: str, writes: int, loop_factory: LoopFactory,
                  n: int) -> Dict[str, Any]:
    st = {"served": 0, "server_eof": False, "server_saw_close": False,
          "finished": False}
    info: Dict[str, Any] = {}
    info["prelude"] = _prelude(loop_factory)  # untimed
    client: List[SplitClientProtocol] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        server_closed = loop.create_future()
        server = await loop.create_server(
            lambda: _SplitServerProtocol(writes, st, info, server_closed),
            HOST, 0)
        port = server.sockets[0].getsockname()[1]
        try:
            tr, proto = await loop.create_connection(
                lambda: SplitClientProtocol(n, done), HOST, port)
            client.append(proto)
            info["client_socket"] = _sockopts(tr)
            try:
                await done
            finally:
                tr.close()
            seen = await _bounded(server_closed, info, "server sees the close")
            st["server_saw_close"] = seen and st["server_eof"]
        finally:
            await _close_server(server, info)
        st["finished"] = True

    run = _Run(loop_factory)
    with run as loop:
        _run_guarded(loop, main(), info, lambda: client[0].t if client else 0,
                     _guard_seconds(n * 10))
    c = client[0] if client else None
    if c is not None and c.t:
        info["client_reads_per_response"] = round(c.reads / c.t, 3)
    return run.result(
        name, n,
        {"responses": c.t if c else 0, "verified": c.ok if c else 0,
         "overruns": c.overrun if c else 0, "served": st["served"],
         "server_saw_close": st["server_saw_close"], "finished": st["finished"]},
        {"responses": n, "verified": n, "overruns": 0, "served": n,
         "server_saw_close": True, "finished": True},
        info,
    )


def split_writes_one(loop_factory: LoopFactory, n: int = 20_000) -> Dict[str, Any]:
    """n request/response round trips on one TCP connection, Protocols on
    both ends; the server sends each 1 KiB response (an HTTP-like header
    with the request's sequence number + body) with ONE write()."""
    return _split_writes("split_writes_one", 1, loop_factory, n)


def split_writes_two(loop_factory: LoopFactory, n: int = 20_000) -> Dict[str, Any]:
    """split_writes_one, but the server writes the header, then the body:
    TWO write() calls per response."""
    return _split_writes("split_writes_two", 2, loop_factory, n)


# ---- bulk through a flow-controlled Protocol writer ------------------------

#: tcp_bulk_flow's write size (256 KiB): a stream position p holds the
#: byte (p % FLOW_CHUNK) % BULK_PERIOD, so every chunk is the same object
FLOW_CHUNK = 256 * 1024
#: a writer whose transport buffers more than this never honoured
#: pause_writing (a loop's high-water mark is tens of KiB)
FLOW_BUFFER_BOUND = 16 * MIB


class FlowBulkReceiverProtocol(BulkReceiverProtocol):
    """BulkReceiverProtocol for tcp_bulk_flow's stream (the BULK_PERIOD
    pattern restarting every FLOW_CHUNK bytes)."""

    def data_received(self, data: bytes) -> None:
        n = len(data)
        p = self.pos
        m = n >> 1
        c = FLOW_CHUNK
        if (data[0] != (p % c) % BULK_PERIOD
                or data[m] != ((p + m) % c) % BULK_PERIOD
                or data[n - 1] != ((p + n - 1) % c) % BULK_PERIOD):
            self.mismatches += 1
        self.pos = p + n
        self.pieces += 1
        if self.pos == self.total:
            self.t_last = time.perf_counter()


class FlowWriterProtocol(asyncio.Protocol):
    """Writes ``total`` bytes in FLOW_CHUNK writes as fast as the transport
    takes them: it stops on pause_writing() and goes on in
    resume_writing(); after the last write it closes the transport (which
    flushes first). Records the largest write buffer it saw.

    The close is scheduled (call_soon), not made inside resume_writing():
    when a protocol closes asyncio's selector transport from
    resume_writing() and its buffer is empty, _write_ready runs
    _call_connection_lost itself after close() has scheduled it too; the
    second run fails (AttributeError on the socket already set to None)
    and reaches the loop's exception handler (seen on CPython 3.11)."""

    def __init__(self, total: int, done: Any, info: Dict[str, Any]) -> None:
        self.total = total
        self.done = done
        self.info = info
        self.chunk = bytes(i % BULK_PERIOD for i in range(FLOW_CHUNK))
        self.sent = 0
        self.paused = False
        self.pauses = 0
        self.resumes = 0
        self.max_buffer = 0
        self.closing = False
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.info["client_socket"] = _sockopts(transport)
        self._write_more()

    def _write_more(self) -> None:
        tr = self.transport
        write = tr.write
        size = tr.get_write_buffer_size
        chunk = self.chunk
        c = FLOW_CHUNK
        total = self.total
        while not self.paused and self.sent < total:
            if total - self.sent >= c:
                write(chunk)
                self.sent += c
            else:
                write(chunk[:total - self.sent])
                self.sent = total
            b = size()
            if b > self.max_buffer:
                self.max_buffer = b
        if self.sent >= total and not self.closing:
            self.closing = True
            asyncio.get_running_loop().call_soon(tr.close)

    def pause_writing(self) -> None:
        self.paused = True
        self.pauses += 1

    def resume_writing(self) -> None:
        self.paused = False
        self.resumes += 1
        if self.transport is not None and not self.closing:
            self._write_more()

    def connection_lost(self, exc: Any) -> None:
        if exc is not None:
            self.info.setdefault("client_error", repr(exc))
        _set_once(self.done)


def tcp_bulk_flow(loop_factory: LoopFactory, mib: int = 512) -> Dict[str, Any]:
    """One TCP connection streaming ``mib`` MiB from a Protocol writer that
    writes 256 KiB chunks until pause_writing() and goes on at
    resume_writing() (tcp_bulk's writer is a stream's write + drain);
    the receiving Protocol counts the bytes and samples their pattern,
    the writer's transport must never have held more than 16 MiB (flow
    control honoured); the time runs until the receiver has seen the
    writer's close and the writer its connection_lost."""
    total = mib * MIB
    info: Dict[str, Any] = {}
    info["prelude"] = _prelude(loop_factory)  # untimed
    receiver: List[BulkReceiverProtocol] = []
    writer: List[FlowWriterProtocol] = []
    st = {"receiver_saw_eof": False, "writer_closed": False, "finished": False}

    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        wdone = loop.create_future()

        def factory() -> BulkReceiverProtocol:
            p = FlowBulkReceiverProtocol(done, info, total=total)
            receiver.append(p)
            return p

        server = await loop.create_server(factory, HOST, 0)
        port = server.sockets[0].getsockname()[1]
        try:
            w = FlowWriterProtocol(total, wdone, info)
            writer.append(w)
            tr, _ = await loop.create_connection(lambda: w, HOST, port)
            client_sock = _socket_id(tr)
            try:
                st["writer_closed"] = await _bounded(
                    wdone, info, "writer connection_lost()",
                    _guard_seconds(mib * 100))
            finally:
                tr.close()
            seen = await _bounded(done, info, "receiver sees the close")
            st["receiver_saw_eof"] = seen and bool(receiver and receiver[0].saw_eof)
            if not seen:
                _note_unclosed(info, "the writer's transport", [client_sock])
        finally:
            await _close_server(server, info)
        st["finished"] = True

    run = _Run(loop_factory)
    with run as loop:
        _run_guarded(loop, main(), info,
                     lambda: (writer[0].sent if writer else 0,
                              receiver[0].pos if receiver else 0),
                     _guard_seconds(mib * 100))
    r = receiver[0] if receiver else None
    w = writer[0] if writer else None
    _bulk_info(info, r, run, mib)
    if w is not None:
        info["pause_writing_calls"] = w.pauses
        info["resume_writing_calls"] = w.resumes
        info["max_write_buffer_kib"] = round(w.max_buffer / 1024, 1)
    return run.result(
        "tcp_bulk_flow", mib,
        {"sent": w.sent if w else 0, "received": r.pos if r else 0,
         "sampled_mismatches": r.mismatches if r else 0,
         "connections": len(receiver),
         "buffer_bounded": bool(w) and w.max_buffer <= FLOW_BUFFER_BOUND,
         "writer_closed": st["writer_closed"],
         "receiver_saw_eof": st["receiver_saw_eof"],
         "finished": st["finished"]},
        {"sent": total, "received": total, "sampled_mismatches": 0,
         "connections": 1, "buffer_bounded": True, "writer_closed": True,
         "receiver_saw_eof": True, "finished": True},
        info,
    )


# ---- HTTP/1.1 keep-alive ---------------------------------------------------
#
# A hand-written HTTP/1.1 server (an asyncio.Protocol, no framework) and a
# streams client, both on the loop under test. The client opens 16
# keep-alive connections (over TLS: verified, as above) and sends its share
# of the n requests on each, one at a time: ``GET /item/<seq> HTTP/1.1``
# with Host, User-Agent and Accept headers. The server parses the request
# line and headers by hand, checks them, and answers with a 4 KiB body (one
# of 64, chosen by seq) after 8 chained SHA-256 passes over it (the
# application's work: d = sha256(d + body), 8 times), whose hex digest goes
# into an X-Digest header next to X-Seq; header and body go out in one
# write. The client parses the response (status line, headers,
# Content-Length, then the body) and checks status, X-Seq, X-Digest
# (against digests computed before the clock starts) and the body. At the
# end every client closes; the server must see each close.

HTTP_CONNECTIONS = 16
HTTP_BODY_SIZE = 4096
HTTP_SHA_PASSES = 8
_HTTP_ITEM = b"/item/"


def _http_bodies() -> List[bytes]:
    return _echo_payloads(HTTP_BODY_SIZE)


def _digest8(body: bytes) -> bytes:
    """HTTP_SHA_PASSES chained SHA-256 passes over body, hex."""
    d = b""
    sha = hashlib.sha256
    for _ in range(HTTP_SHA_PASSES):
        h = sha(d)
        h.update(body)
        d = h.digest()
    return d.hex().encode()


class _HttpServerProtocol(asyncio.Protocol):
    def __init__(self, st: Dict[str, Any], info: Dict[str, Any],
                 bodies: List[bytes], closed: Any, tls: bool) -> None:
        self.st = st
        self.info = info
        self.bodies = bodies
        self.closed = closed
        self.tls = tls
        self.buf = b""
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.info.setdefault("server_socket", _sockopts(transport))
        if self.tls and "tls_path_server" not in self.info:
            _note_tls(self.info, "server", transport)

    def _bad(self, why: str) -> None:
        self.st["server_errors"] += 1
        self.info.setdefault("server_error", why[:200])
        self.transport.write(b"HTTP/1.1 400 Bad Request\r\n"
                             b"Content-Length: 0\r\nConnection: close\r\n\r\n")
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buf[:end]
            buf = buf[end + 4:]
            lines = head.split(b"\r\n")
            parts = lines[0].split(b" ")
            if len(parts) != 3:
                self._bad(f"request line {lines[0]!r}")
                return
            method, target, version = parts
            headers = {}
            for line in lines[1:]:
                k, sep, v = line.partition(b":")
                if not sep:
                    self._bad(f"header line {line!r}")
                    return
                headers[k.strip().lower()] = v.strip()
            if (method != b"GET" or version != b"HTTP/1.1"
                    or not target.startswith(_HTTP_ITEM)
                    or b"host" not in headers
                    or headers.get(b"content-length", b"0") != b"0"):
                self._bad(f"request {lines[0]!r} {sorted(headers)}")
                return
            try:
                seq = int(target[len(_HTTP_ITEM):])
            except ValueError:
                self._bad(f"target {target!r}")
                return
            body = self.bodies[seq % _N_PAYLOADS]
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream"
                b"\r\nContent-Length: %d\r\nX-Seq: %d\r\nX-Digest: %s\r\n\r\n"
                % (len(body), seq, _digest8(body)) + body)
            self.st["served"] += 1
            if headers.get(b"connection", b"").lower() == b"close":
                self.transport.close()
                break
        self.buf = buf

    def eof_received(self) -> None:
        self.st["server_eofs"] += 1
        return None  # close

    def connection_lost(self, exc: Any) -> None:
        if exc is not None:
            self.info.setdefault("server_lost", repr(exc))
        else:
            self.st["server_clean_closes"] += 1
        self.st["server_closes"] += 1
        if self.st["server_closes"] == HTTP_CONNECTIONS:
            _set_once(self.closed)


def _shares(n: int, k: int) -> List[int]:
    """n split into k shares as equal as possible."""
    q, r = divmod(n, k)
    return [q + (1 if i < r else 0) for i in range(k)]


def _http_keepalive(name: str, loop_factory: LoopFactory, n: int,
                    tls: bool) -> Dict[str, Any]:
    bodies = _http_bodies()
    digests = [_digest8(b) for b in bodies]  # the client's answers, untimed
    st = {"responses": 0, "verified": 0, "client_errors": 0, "served": 0,
          "server_errors": 0, "server_eofs": 0, "server_closes": 0,
          "server_clean_closes": 0, "server_saw_close": False, "tls_verified": 0,
          "finished": False}
    info: Dict[str, Any] = {}
    skw, ckw = _tls_kwargs() if tls else ({}, {})
    info["prelude"] = _prelude(loop_factory, tls)  # untimed
    shares = _shares(n, HTTP_CONNECTIONS)

    async def client(c: int, port: int, start: int, count: int) -> None:
        reader, writer = await asyncio.open_connection(HOST, port, **ckw)
        if c == 0:
            info["client_socket"] = _sockopts(writer)
            _note_streams(info, "client", "tcp", reader, writer)
        if tls:
            st["tls_verified"] += _note_tls(info, "client", writer, c == 0)
        host = b"Host: %s:%d\r\n" % (TLS_HOSTNAME.encode(), port)
        try:
            write = writer.write
            readuntil = reader.readuntil
            readexactly = reader.readexactly
            for seq in range(start, start + count):
                write(b"GET /item/%d HTTP/1.1\r\n" % seq + host
                      + b"User-Agent: zuvrs-bench\r\nAccept: */*\r\n\r\n")
                head = await readuntil(b"\r\n\r\n")
                lines = head[:-4].split(b"\r\n")
                headers = {}
                for line in lines[1:]:
                    k, _, v = line.partition(b":")
                    headers[k.strip().lower()] = v.strip()
                body = await readexactly(int(headers.get(b"content-length", 0)))
                st["responses"] += 1
                i = seq % _N_PAYLOADS
                if (lines[0] == b"HTTP/1.1 200 OK"
                        and headers.get(b"x-seq") == b"%d" % seq
                        and headers.get(b"x-digest") == digests[i]
                        and body == bodies[i]):
                    st["verified"] += 1
                else:
                    info.setdefault("bad_response",
                                    f"request {seq}: {head[:120]!r}")
        finally:
            writer.close()
            await _bounded(writer.wait_closed(), info, "client wait_closed()")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        closed = loop.create_future()
        server = await _tls_call(loop, tls, loop.create_server(
            lambda: _HttpServerProtocol(st, info, bodies, closed, tls),
            HOST, 0, **skw))
        port = server.sockets[0].getsockname()[1]
        try:
            starts = [sum(shares[:c]) for c in range(HTTP_CONNECTIONS)]
            results = await asyncio.gather(
                *[client(c, port, starts[c], shares[c])
                  for c in range(HTTP_CONNECTIONS)], return_exceptions=True)
            for r in results:
                if isinstance(r, BaseException):
                    if isinstance(r, asyncio.CancelledError):
                        raise r
                    st["client_errors"] += 1
                    info.setdefault("client_error", repr(r)[:200])
            seen = await _bounded(closed, info, "server sees every close")
            # Each client's close seen as EOF (on TLS before 3.11, as a
            # clean connection_lost: TLS_CLOSE_WITHOUT_EOF).
            closes = (st["server_clean_closes"] if tls and TLS_CLOSE_WITHOUT_EOF
                      else st["server_eofs"])
            st["server_saw_close"] = seen and closes == HTTP_CONNECTIONS
        finally:
            await _close_server(server, info)
        st["finished"] = True

    run = _Run(loop_factory)
    with run as loop:
        _run_guarded(loop, main(), info,
                     lambda: (st["responses"], st["served"]),
                     _guard_seconds(n * 10))
    keys = ["responses", "verified", "client_errors", "served",
            "server_errors", "server_saw_close", "finished"]
    expected = {"responses": n, "verified": n, "client_errors": 0,
                "served": n, "server_errors": 0, "server_saw_close": True,
                "finished": True}
    if tls:
        keys.append("tls_verified")
        expected["tls_verified"] = HTTP_CONNECTIONS
    return run.result(name, n, {k: st[k] for k in keys}, expected, info)


def http_keepalive(loop_factory: LoopFactory, n: int = 8_000) -> Dict[str, Any]:
    """n HTTP/1.1 requests over 16 keep-alive TCP connections (n / 16 each,
    one at a time per connection): a hand-written asyncio.Protocol server
    answering each GET with a 4 KiB body after 8 SHA-256 passes over it,
    a streams client checking status, sequence number, digest and body;
    see the section comment."""
    return _http_keepalive("http_keepalive", loop_factory, n, tls=False)


def tls_http_keepalive(loop_factory: LoopFactory,
                       n: int = 8_000) -> Dict[str, Any]:
    """http_keepalive over TLS 1.3 (16 handshakes, the client verifying
    chain and host name; the same requests, responses and SHA-256 work)."""
    return _http_keepalive("tls_http_keepalive", loop_factory, n, tls=True)


# ---- WebSocket echo ----------------------------------------------------------
#
# The ``websockets`` library's asyncio implementation on the loop under test
# (websockets.asyncio.server.serve / websockets.asyncio.client.connect,
# which call the running loop's create_server / create_connection), with
# the library's defaults (permessage-deflate offered and accepted, as a
# deployment gets it; the negotiated extensions are in info) except that
# no proxy is looked up. 16 clients, each sending its share of the n binary
# messages one at a time and awaiting the echo; message t is 32, 256 or
# 4,096 bytes (t % 3) with content chosen by t. Every echo is compared and
# CRC-32 checksummed; each client then closes (code 1000) and the server's
# handler must have ended for each. The URI is ws://localhost:<port>/ or
# wss://..., with the TCP connection made to 127.0.0.1 (host=...), so both
# send the same Host header.

WS_CONNECTIONS = 16
WS_SIZES = (32, 256, 4096)


def _ws_payloads() -> List[bytes]:
    """192 messages: index i is WS_SIZES[i % 3] bytes of pattern i % 64."""
    big = _echo_payloads(max(WS_SIZES))
    return [big[i % _N_PAYLOADS][:WS_SIZES[i % 3]]
            for i in range(3 * _N_PAYLOADS)]


def _websocket(name: str, loop_factory: LoopFactory, n: int,
               tls: bool) -> Dict[str, Any]:
    try:
        import websockets
        from websockets.asyncio.client import connect
        from websockets.asyncio.server import serve
    except ImportError as exc:
        raise RuntimeError(
            f"{name} needs websockets >= 13 (its asyncio implementation): "
            f"{exc}") from None
    payloads = _ws_payloads()
    np_ = len(payloads)
    shares = _shares(n, WS_CONNECTIONS)
    expected_crc = 0
    expected_bytes = 0
    for k in shares:
        crc = 0
        for t in range(k):
            crc = zlib.crc32(payloads[t % np_], crc)
            expected_bytes += len(payloads[t % np_])
        expected_crc += crc
    st = {"messages": 0, "matches": 0, "checksum": 0, "client_errors": 0,
          "server_messages": 0, "server_bytes": 0, "server_errors": 0,
          "handlers_done": 0, "clean_closes": 0, "tls_verified": 0,
          "finished": False}
    info: Dict[str, Any] = {"websockets": getattr(websockets, "__version__", "?")}
    skw, ckw = _tls_kwargs() if tls else ({}, {})
    info["prelude"] = _prelude(loop_factory, tls)  # untimed
    scheme = "wss" if tls else "ws"

    async def handler(ws: Any) -> None:
        try:
            if tls and "tls_path_server" not in info:
                _note_tls(info, "server", ws.transport)
            async for msg in ws:
                st["server_messages"] += 1
                st["server_bytes"] += len(msg)
                await ws.send(msg)
        except Exception as exc:
            st["server_errors"] += 1
            info.setdefault("server_error", repr(exc)[:200])
        finally:
            st["handlers_done"] += 1

    async def client(c: int, port: int, count: int) -> None:
        uri = f"{scheme}://{TLS_HOSTNAME}:{port}/"
        kw = dict(ckw)
        if tls:
            kw.pop("server_hostname")  # the URI's host name, "localhost"
        async with connect(uri, host=HOST, proxy=None, **kw) as ws:
            if c == 0:
                info["client_socket"] = _sockopts(ws.transport)
                ext = ws.response.headers.get("Sec-WebSocket-Extensions")
                info["extensions"] = ext or "none"
            if tls:
                st["tls_verified"] += _note_tls(info, "client", ws.transport,
                                                c == 0)
            crc = 0
            send = ws.send
            recv = ws.recv
            for t in range(count):
                p = payloads[t % np_]
                await send(p)
                got = await recv()
                st["messages"] += 1
                if got == p:
                    st["matches"] += 1
                crc = zlib.crc32(got if isinstance(got, bytes)
                                 else got.encode(), crc)
            st["checksum"] += crc
        if ws.close_code == 1000:
            st["clean_closes"] += 1
        else:
            info.setdefault("close", f"close code {ws.close_code}")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await _tls_call(loop, tls, serve(handler, HOST, 0, **skw))
        port = server.sockets[0].getsockname()[1]
        try:
            results = await asyncio.gather(
                *[client(c, port, shares[c]) for c in range(WS_CONNECTIONS)],
                return_exceptions=True)
            for r in results:
                if isinstance(r, BaseException):
                    if isinstance(r, asyncio.CancelledError):
                        raise r
                    st["client_errors"] += 1
                    info.setdefault("client_error", repr(r)[:200])
            # every handler must end (it saw the client's close)
            t_end = loop.time() + CLOSE_WAIT_S
            while st["handlers_done"] < WS_CONNECTIONS and loop.time() < t_end:
                await asyncio.sleep(0.001)
        finally:
            server.close()
            await _bounded(server.wait_closed(), info, "server.wait_closed()")
        st["finished"] = True

    run = _Run(loop_factory)
    with run as loop:
        _run_guarded(loop, main(), info,
                     lambda: (st["messages"], st["server_messages"]),
                     _guard_seconds(n * 10))
    keys = ["messages", "matches", "checksum", "client_errors",
            "server_messages", "server_bytes", "server_errors",
            "handlers_done", "clean_closes", "finished"]
    expected = {"messages": n, "matches": n, "checksum": expected_crc,
                "client_errors": 0, "server_messages": n,
                "server_bytes": expected_bytes, "server_errors": 0,
                "handlers_done": WS_CONNECTIONS,
                "clean_closes": WS_CONNECTIONS, "finished": True}
    if tls:
        keys.append("tls_verified")
        expected["tls_verified"] = WS_CONNECTIONS
    return run.result(name, n, {k: st[k] for k in keys}, expected, info)


def websocket(loop_factory: LoopFactory, n: int = 8_000) -> Dict[str, Any]:
    """n WebSocket echo round trips (binary messages of 32 / 256 / 4,096
    bytes in turn) over 16 ws:// connections, n / 16 each, one message
    outstanding per connection, websockets' asyncio server and client on
    the loop under test; see the section comment."""
    return _websocket("websocket", loop_factory, n, tls=False)


def tls_websocket(loop_factory: LoopFactory, n: int = 8_000) -> Dict[str, Any]:
    """websocket over wss:// (TLS 1.3, the client verifying chain and host
    name)."""
    return _websocket("tls_websocket", loop_factory, n, tls=True)


# --------------------------------------------------------------------------
# Datagram, pipe and process workloads
#
# Same rules as the network workloads: everything runs on the loop under
# test, in this one process (plus the child processes of the subprocess
# workloads); ``elapsed`` covers creating the loop, the work, closing every
# transport (and seeing it closed) and closing the loop. Parity is counted
# on the receiving side (datagrams and pipe echoes compared with what was
# sent and CRC-32 checksummed, child output counted and its pattern
# sampled, return codes checked). A stall (a lost datagram, a lost
# wake-up, a child exit never reported) is cancelled by the same watchdog
# after STALL_S seconds without progress and shows as a parity mismatch.
# --------------------------------------------------------------------------

#: bytes per datagram (udp_echo) and per message (pipe_roundtrip)
DGRAM_SIZE = 512


class _UdpEchoServerProtocol(asyncio.DatagramProtocol):
    """Sends every datagram back to where it came from."""

    def __init__(self, st: Dict[str, Any], info: Dict[str, Any],
                 closed: Any) -> None:
        self.st = st
        self.info = info
        self.closed = closed
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.info["server_socket"] = _sockopts(transport)

    def datagram_received(self, data: bytes, addr: Any) -> None:
        st = self.st
        st["server_datagrams"] += 1
        st["server_bytes"] += len(data)
        self.transport.sendto(data, addr)

    def error_received(self, exc: Exception) -> None:
        self.st["errors"] += 1
        self.info.setdefault("server_error", repr(exc))

    def connection_lost(self, exc: Any) -> None:
        if exc is not None:
            self.info.setdefault("server_lost", repr(exc))
        _set_once(self.closed)


class UdpEchoClientProtocol(asyncio.DatagramProtocol):
    """A connected datagram endpoint: sends datagram t, waits for its echo,
    compares, checksums, sends t + 1 (one datagram outstanding); after n
    round trips resolves ``done``. An echo that is not the expected payload
    still counts as a round trip (and fails the comparison)."""

    def __init__(self, n: int, payloads: List[bytes], done: Any,
                 closed: Any, st: Dict[str, Any],
                 info: Dict[str, Any]) -> None:
        self.n = n
        self.payloads = payloads
        self.done = done
        self.closed = closed
        self.st = st
        self.info = info
        self.t = 0
        self.matches = 0
        self.crc = 0
        self.unexpected = 0
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.info["client_socket"] = _sockopts(transport)
        if self.n > 0:
            transport.sendto(self.payloads[0])
        else:
            _set_once(self.done)

    def datagram_received(self, data: bytes, addr: Any) -> None:
        t = self.t
        if t >= self.n:  # an echo after the last one: a duplicate
            self.unexpected += 1
            return
        if data == self.payloads[t % _N_PAYLOADS]:
            self.matches += 1
        self.crc = zlib.crc32(data, self.crc)
        t += 1
        self.t = t
        if t < self.n:
            self.transport.sendto(self.payloads[t % _N_PAYLOADS])
        else:
            _set_once(self.done)

    def error_received(self, exc: Exception) -> None:
        self.st["errors"] += 1
        self.info.setdefault("client_error", repr(exc))

    def connection_lost(self, exc: Any) -> None:
        if exc is not None:
            self.info.setdefault("client_lost", repr(exc))
        _set_once(self.closed)


def udp_echo(loop_factory: LoopFactory, n: int = 20_000) -> Dict[str, Any]:
    """n sequential round trips of 512-byte datagrams between two
    create_datagram_endpoint endpoints on 127.0.0.1: a server bound to an
    ephemeral port that sends every datagram back (sendto(data, addr)) and
    a client connected to it (remote_addr) with one datagram outstanding;
    every echo compared with what was sent and CRC-32 checksummed. A lost
    datagram stops the exchange: the watchdog cancels it after STALL_S
    seconds and the parity shows how far it got."""
    return _dgram_echo("udp_echo", loop_factory, n, unix=False)


def unix_dgram_echo(loop_factory: LoopFactory,
                    n: int = 20_000) -> Dict[str, Any]:
    """udp_echo over Unix datagram sockets (AF_UNIX, SOCK_DGRAM) in a temp
    dir: the server bound to one path, the client bound to another (so the
    server can answer it) and connected to the server's. A loop without
    Unix datagram endpoints reports unsupported."""
    return _dgram_echo("unix_dgram_echo", loop_factory, n, unix=True)


def _unix_dgram_refused(loop: Any, d: str | None, exc: BaseException) -> None:
    """Raise Unsupported for a loop that refuses Unix datagram endpoint
    arguments asyncio takes (uvloop: a TypeError for an AF_UNIX local_addr,
    rloop: TypeError / ValueError). Not for asyncio and zuvrs: there it is
    a failure."""
    if d is None or type(loop).__module__.split(".")[0] in ("asyncio", "zuvrs"):
        return
    raise _unsupported(loop, "create_datagram_endpoint(family=AF_UNIX)",
                       exc) from None


def _dgram_echo(name: str, loop_factory: LoopFactory, n: int,
                unix: bool) -> Dict[str, Any]:
    payloads = _echo_payloads(DGRAM_SIZE)
    expected_crc = _expected_echo_crc(n, payloads)
    st = {"server_datagrams": 0, "server_bytes": 0, "errors": 0,
          "client_closed": False, "server_closed": False, "finished": False}
    info: Dict[str, Any] = {}
    info["prelude"] = _prelude(loop_factory)  # untimed
    client: List[UdpEchoClientProtocol] = []

    async def main(d: str | None) -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        client_closed = loop.create_future()
        server_closed = loop.create_future()
        if d is not None:
            server_kw: Dict[str, Any] = {
                "local_addr": os.path.join(d, "server.sock"),
                "family": socket.AF_UNIX}
        else:
            server_kw = {"local_addr": (HOST, 0)}
        try:
            s_tr, _ = await loop.create_datagram_endpoint(
                lambda: _UdpEchoServerProtocol(st, info, server_closed),
                **server_kw)
        except NotImplementedError as exc:
            raise _unsupported(loop, "create_datagram_endpoint", exc) from None
        except (TypeError, ValueError) as exc:
            _unix_dgram_refused(loop, d, exc)
            raise
        try:
            if d is not None:
                client_kw: Dict[str, Any] = {
                    "local_addr": os.path.join(d, "client.sock"),
                    "remote_addr": server_kw["local_addr"],
                    "family": socket.AF_UNIX}
            else:
                addr = s_tr.get_extra_info("sockname")
                if addr is None:
                    addr = s_tr.get_extra_info("socket").getsockname()
                client_kw = {"remote_addr": tuple(addr[:2])}
            try:
                c_tr, proto = await loop.create_datagram_endpoint(
                    lambda: UdpEchoClientProtocol(n, payloads, done,
                                                  client_closed, st, info),
                    **client_kw)
            except (TypeError, ValueError) as exc:
                _unix_dgram_refused(loop, d, exc)
                raise
            client.append(proto)
            try:
                await done
            finally:
                c_tr.close()
            st["client_closed"] = await _bounded(
                client_closed, info, "client connection_lost()")
        finally:
            s_tr.close()
            st["server_closed"] = await _bounded(
                server_closed, info, "server connection_lost()")
        st["finished"] = True

    run = _Run(loop_factory)
    with run as loop:
        prog = lambda: client[0].t if client else 0  # noqa: E731
        if unix:
            with _TempDir() as d:
                _run_guarded(loop, main(d), info, prog, _guard_seconds(n * 10))
        else:
            _run_guarded(loop, main(None), info, prog, _guard_seconds(n * 10))
    c = client[0] if client else None
    return run.result(
        name, n,
        {"round_trips": c.t if c else 0, "matches": c.matches if c else 0,
         "checksum": c.crc if c else 0,
         "unexpected": c.unexpected if c else 0,
         "server_datagrams": st["server_datagrams"],
         "server_bytes": st["server_bytes"], "errors": st["errors"],
         "client_closed": st["client_closed"],
         "server_closed": st["server_closed"], "finished": st["finished"]},
        {"round_trips": n, "matches": n, "checksum": expected_crc,
         "unexpected": 0, "server_datagrams": n,
         "server_bytes": n * DGRAM_SIZE, "errors": 0, "client_closed": True,
         "server_closed": True, "finished": True},
        info,
    )


# ---- pipes ----------------------------------------------------------------


class _PipeWriterProtocol(asyncio.BaseProtocol):
    """Protocol of a write pipe transport: notes its close."""

    def __init__(self, closed: Any, info: Dict[str, Any], what: str) -> None:
        self.closed = closed
        self.info = info
        self.what = what

    def connection_lost(self, exc: Any) -> None:
        if exc is not None:
            self.info.setdefault(f"{self.what}_error", repr(exc))
        _set_once(self.closed)


class _PipeEchoProtocol(asyncio.Protocol):
    """Reads the request pipe and writes what it reads to the reply pipe
    (``out``, a write pipe transport); on EOF closes the reply pipe."""

    def __init__(self, st: Dict[str, Any], info: Dict[str, Any],
                 closed: Any) -> None:
        self.st = st
        self.info = info
        self.closed = closed
        self.out: Any = None

    def data_received(self, data: bytes) -> None:
        self.st["echo_bytes"] += len(data)
        self.out.write(data)

    def eof_received(self) -> None:
        self.st["echo_saw_eof"] = True
        self.out.close()
        return None

    def connection_lost(self, exc: Any) -> None:
        if exc is not None:
            self.info.setdefault("echo_error", repr(exc))
        _set_once(self.closed)


class PipeClientProtocol(asyncio.Protocol):
    """Reads the reply pipe. Writes message t to the request pipe
    (``out``), waits for its 512-byte echo, compares, checksums, writes
    t + 1; after n round trips closes the request pipe (the echo side then
    sees EOF and closes the reply pipe) and resolves ``done``."""

    def __init__(self, n: int, payloads: List[bytes], done: Any,
                 closed: Any, info: Dict[str, Any]) -> None:
        self.n = n
        self.payloads = payloads
        self.done = done
        self.closed = closed
        self.info = info
        self.out: Any = None
        self.buf = b""
        self.t = 0
        self.matches = 0
        self.crc = 0
        self.overrun = 0
        self.reads = 0
        self.saw_eof = False

    def connection_made(self, transport: Any) -> None:
        if self.n > 0:
            self.out.write(self.payloads[0])
        else:
            self.out.close()
            _set_once(self.done)

    def data_received(self, data: bytes) -> None:
        self.reads += 1
        if not _take_echo(self, data, DGRAM_SIZE):
            return
        if self.t < self.n:
            self.out.write(self.payloads[self.t % _N_PAYLOADS])
        else:
            self.out.close()
            _set_once(self.done)

    def eof_received(self) -> None:
        self.saw_eof = True
        return None

    def connection_lost(self, exc: Any) -> None:
        if exc is not None:
            self.info.setdefault("client_error", repr(exc))
        _set_once(self.closed)


def pipe_roundtrip(loop_factory: LoopFactory, n: int = 20_000) -> Dict[str, Any]:
    """n sequential round trips of 512 bytes over two os.pipe() pairs, all
    four ends on the loop (connect_read_pipe / connect_write_pipe): the
    client writes a message to the request pipe, an echo protocol reading
    that pipe writes it to the reply pipe, the client reads it back,
    compares and CRC-32 checksums it. At the end the client closes the
    request pipe; the echo side must see the EOF and close the reply pipe,
    which the client must see too."""
    payloads = _echo_payloads(DGRAM_SIZE)
    expected_crc = _expected_echo_crc(n, payloads)
    st = {"echo_bytes": 0, "echo_saw_eof": False, "closed": 0,
          "finished": False}
    info: Dict[str, Any] = {}
    info["prelude"] = _prelude(loop_factory)  # untimed
    client: List[PipeClientProtocol] = []
    files: List[Any] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        lost = [loop.create_future() for _ in range(4)]
        transports: List[Any] = []
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        f_req_r = open(req_r, "rb", buffering=0)
        f_req_w = open(req_w, "wb", buffering=0)
        f_rep_r = open(rep_r, "rb", buffering=0)
        f_rep_w = open(rep_w, "wb", buffering=0)
        files.extend([f_req_r, f_req_w, f_rep_r, f_rep_w])
        handed: List[Any] = []
        try:
            echo = _PipeEchoProtocol(st, info, lost[0])
            proto = PipeClientProtocol(n, payloads, done, lost[2], info)
            client.append(proto)
            try:
                handed.append(f_rep_w)
                tr, _ = await loop.connect_write_pipe(
                    lambda: _PipeWriterProtocol(lost[1], info, "echo_writer"),
                    f_rep_w)
            except NotImplementedError as exc:
                raise _unsupported(loop, "connect_write_pipe", exc) from None
            transports.append(tr)
            echo.out = tr
            handed.append(f_req_r)
            try:
                transports.append(
                    (await loop.connect_read_pipe(lambda: echo, f_req_r))[0])
            except NotImplementedError as exc:
                raise _unsupported(loop, "connect_read_pipe", exc) from None
            handed.append(f_req_w)
            tr, _ = await loop.connect_write_pipe(
                lambda: _PipeWriterProtocol(lost[3], info, "client_writer"),
                f_req_w)
            transports.append(tr)
            proto.out = tr
            handed.append(f_rep_r)
            # connection_made writes the first message
            transports.append(
                (await loop.connect_read_pipe(lambda: proto, f_rep_r))[0])
            await done
            # every end must close: the client's writer, then (EOF) the
            # echo's reader and writer, then (EOF) the client's reader
            for what, fut in zip(("echo reader", "echo writer",
                                  "client reader", "client writer"), lost):
                if await _bounded(fut, info, f"{what} connection_lost()"):
                    st["closed"] += 1
        finally:
            for tr in transports:
                tr.close()
            for f in files:
                if f not in handed:
                    f.close()
        st["finished"] = True

    run = _Run(loop_factory)
    with run as loop:
        _run_guarded(loop, main(), info, lambda: client[0].t if client else 0,
                     _guard_seconds(n * 10))
    c = client[0] if client else None
    if c is not None and c.t:
        info["client_reads_per_round_trip"] = round(c.reads / c.t, 3)
    return run.result(
        "pipe_roundtrip", n,
        {"round_trips": c.t if c else 0, "matches": c.matches if c else 0,
         "checksum": c.crc if c else 0, "overruns": c.overrun if c else 0,
         "echo_bytes": st["echo_bytes"], "echo_saw_eof": st["echo_saw_eof"],
         "client_saw_eof": c.saw_eof if c else False,
         "closed": st["closed"], "finished": st["finished"]},
        {"round_trips": n, "matches": n, "checksum": expected_crc,
         "overruns": 0, "echo_bytes": n * DGRAM_SIZE, "echo_saw_eof": True,
         "client_saw_eof": True, "closed": 4, "finished": True},
        info,
    )


# ---- child processes --------------------------------------------------------

#: what subprocess_spawn runs
TRUE_PATH = "/bin/true" if os.path.exists("/bin/true") else (
    shutil.which("true") or "/bin/true")


def subprocess_spawn(loop_factory: LoopFactory, n: int = 500) -> Dict[str, Any]:
    """n sequential asyncio.create_subprocess_exec('/bin/true') + wait(),
    stdio inherited; every return code must be 0, and afterwards no exited
    child may be left unreaped."""
    st = {"spawned": 0, "exited": 0, "returncode_0": 0, "finished": False}
    info: Dict[str, Any] = {}
    if TRUE_PATH != "/bin/true":
        info["program"] = TRUE_PATH

    async def main() -> None:
        loop = asyncio.get_running_loop()
        exec_ = asyncio.create_subprocess_exec
        for i in range(n):
            try:
                proc = await exec_(TRUE_PATH)
            except NotImplementedError as exc:
                raise _unsupported(loop, "subprocess_exec", exc) from None
            st["spawned"] += 1
            try:
                rc = await proc.wait()
            finally:
                if proc.returncode is None:  # cancelled by the watchdog
                    try:
                        proc.kill()
                    except ProcessLookupError:
                        pass
            st["exited"] += 1
            if rc == 0:
                st["returncode_0"] += 1
            else:
                info.setdefault("first_bad_returncode", f"spawn {i}: {rc!r}")
        st["finished"] = True

    run = _Run(loop_factory)
    with run as loop:
        _run_guarded(loop, main(), info, lambda: (st["spawned"], st["exited"]),
                     _guard_seconds(n * 500))
    # every child whose wait() returned must have been reaped by the loop
    # (not timed): reap and count any exited child still left
    st["left_unreaped"] = _reap_leftovers()
    return run.result(
        "subprocess_spawn", n,
        {k: st[k] for k in ("spawned", "exited", "returncode_0",
                            "left_unreaped", "finished")},
        {"spawned": n, "exited": n, "returncode_0": n, "left_unreaped": 0,
         "finished": True},
        info,
    )


def _reap_leftovers() -> int:
    """Reap this process's exited children that nobody reaped; how many."""
    n = 0
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:  # no children at all
            return n
        if pid == 0:  # children left, none exited
            return n
        n += 1


#: the child of subprocess_pipe_output: writes argv[1] bytes of the
#: BULK_PERIOD pattern (bytes(i % 251)) to stdout in 251 KiB writes
PIPE_OUTPUT_CHILD = (
    "import os, sys\n"
    "n = int(sys.argv[1])\n"
    "c = bytes(range(251)) * 1024\n"
    "full, rest = divmod(n, len(c))\n"
    "def out(b):\n"
    "    v = memoryview(b)\n"
    "    while v:\n"
    "        v = v[os.write(1, v):]\n"
    "for _ in range(full):\n"
    "    out(c)\n"
    "if rest:\n"
    "    out(c[:rest])\n"
)
#: bytes asked of each proc.stdout.read()
PIPE_OUTPUT_READ = 256 * 1024


def _child_stdout_kind(pid: int) -> str:
    """What the child's stdout is (pipe, socket, ...), from /proc (Linux);
    loops may use socketpairs instead of pipes."""
    try:
        link = os.readlink(f"/proc/{pid}/fd/1")
    except OSError as exc:
        return f"unknown ({type(exc).__name__})"
    return link.split(":", 1)[0] if ":[" in link else link


def subprocess_pipe_output(loop_factory: LoopFactory,
                           mib: int = 256) -> Dict[str, Any]:
    """A child (this interpreter, ``-I -S -c``) writes ``mib`` MiB of the
    bulk pattern to its stdout, read through asyncio.subprocess.PIPE with
    ``await proc.stdout.read(256 KiB)`` until EOF; the bytes are counted,
    three bytes of every read sampled against their position, and the
    child's return code must be 0. The time includes starting the child
    (tens of ms, the same for every loop)."""
    total = mib * MIB
    st = {"received": 0, "sampled_mismatches": 0, "reads": 0,
          "returncode": None, "finished": False}
    info: Dict[str, Any] = {}
    info["prelude"] = _prelude(loop_factory)  # untimed

    async def main() -> None:
        loop = asyncio.get_running_loop()
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-I", "-S", "-c", PIPE_OUTPUT_CHILD, str(total),
                stdout=asyncio.subprocess.PIPE)
        except NotImplementedError as exc:
            raise _unsupported(loop, "subprocess_exec", exc) from None
        try:
            info["child_stdout"] = _child_stdout_kind(proc.pid)
            read = proc.stdout.read
            size = PIPE_OUTPUT_READ
            pos = 0
            mism = 0
            reads = 0
            while True:
                data = await read(size)
                k = len(data)
                if not k:
                    break
                m = k >> 1
                if (data[0] != pos % BULK_PERIOD
                        or data[m] != (pos + m) % BULK_PERIOD
                        or data[k - 1] != (pos + k - 1) % BULK_PERIOD):
                    mism += 1
                pos += k
                reads += 1
                st["received"] = pos
            st["sampled_mismatches"] = mism
            st["reads"] = reads
            st["returncode"] = await proc.wait()
        finally:
            if proc.returncode is None:  # cancelled by the watchdog
                try:
                    proc.kill()
                except ProcessLookupError:
                    pass
                await _bounded(proc.wait(), info, "killed child's wait()")
        st["finished"] = True

    run = _Run(loop_factory)
    with run as loop:
        _run_guarded(loop, main(), info, lambda: st["received"],
                     _guard_seconds(mib * 100))
    if st["reads"]:
        info["mean_read_kib"] = round(st["received"] / st["reads"] / 1024, 1)
    return run.result(
        "subprocess_pipe_output", mib,
        {k: st[k] for k in ("received", "sampled_mismatches", "returncode",
                            "finished")},
        {"received": total, "sampled_mismatches": 0, "returncode": 0,
         "finished": True},
        info,
    )


# --------------------------------------------------------------------------
# Servers under load from another process, a real redis-server, and memory
#
# readline_echo_load and the redis workloads put the other side in another
# process (the load generator benchmarks/_loadgen.c, redis-server), pinned
# to another CPU than the loop under test where the sample may use two
# (_cpu_pair); the sample pins itself to the first for the workload and
# restores its affinity afterwards. idle_connections holds thousands of
# idle stream connections, both ends in this process, and measures the RSS
# they cost.
# --------------------------------------------------------------------------


#: where the peer process runs (ZUVRS_BENCH_PEER_CPU; compare.py
#: --peer-cpu): "other" (the default: another CPU than the loop under
#: test), "same" (the loop's CPU: no cross-CPU wake-up per round trip, which
#: on a virtual machine can cost more than the loop's own work) or "none"
#: (nothing pinned)
PEER_CPU_MODES = ("other", "same", "none")


def _cpu_pair() -> Tuple[List[int] | None, int | None, int | None]:
    """(this process's affinity, a CPU for the loop under test, a CPU for
    the peer process), as ZUVRS_BENCH_PEER_CPU says; the CPUs are None
    where nothing is to be pinned (mode "none", or "other" with fewer than
    two CPUs available)."""
    mode = os.environ.get("ZUVRS_BENCH_PEER_CPU", "other") or "other"
    if mode not in PEER_CPU_MODES:
        raise ValueError(f"ZUVRS_BENCH_PEER_CPU={mode!r}: one of {PEER_CPU_MODES}")
    try:
        avail = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None, None, None
    if mode == "none" or (mode == "other" and len(avail) < 2):
        return avail, None, None
    if mode == "same":
        return avail, avail[0], avail[0]
    return avail, avail[0], avail[1]


def _cpus_note(own: int | None, peer: int | None, own_name: str, peer_name: str) -> str:
    if own is None:
        return "not pinned"
    same = " (the same CPU)" if own == peer else ""
    return f"{own_name} {own}, {peer_name} {peer}{same}"


def _restore_affinity(affinity: List[int] | None) -> None:
    if affinity:
        try:
            os.sched_setaffinity(0, set(affinity))
        except OSError:
            pass


def _cpu_seconds() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _wait_process(loop: Any, proc: Any, fut: Any) -> None:
    """In a thread: wait for proc, then hand (stdout, stderr, returncode)
    to fut on the loop (call_soon_threadsafe)."""
    def run() -> None:
        out, err = proc.communicate()
        try:
            loop.call_soon_threadsafe(
                lambda: fut.done() or fut.set_result((out, err, proc.returncode)))
        except RuntimeError:  # the loop is closed: the workload gave up
            pass

    threading.Thread(target=run, name="bench-peer-wait", daemon=True).start()


# ---- readline echo under load from another process -------------------------

READLINE_CONNECTIONS = 100


def readline_echo_load(loop_factory: LoopFactory,
                       n: int = 100_000) -> Dict[str, Any]:
    """A readline echo server on the loop under test (asyncio.start_server;
    per line ``await reader.readline()``, ``writer.write(line)``, ``await
    writer.drain()``), loaded from another process: benchmarks/_loadgen.c
    (the same for every loop; epoll, one recv and one send per line) opens
    100 connections and sends n / 100 lines on each, ping-pong (a line,
    then its whole echo, then the next), every echo compared and CRC-32
    checksummed, then closes them; the server must see each EOF. Server
    and client are pinned to different CPUs where two are available.

    ops / elapsed is lines per second over the client's clock (from before
    its first connect to the last echo; the client process's start-up is
    not in it). ``info`` has the client's and the server's CPU share of
    their cores over that window (a client share near 1.0 would mean the
    client, not the server, was the limit) and their CPU time per line,
    which a busy machine distorts less than lines/s."""
    import _loadgen

    conns = READLINE_CONNECTIONS
    per_conn = max(1, n // conns)
    total = per_conn * conns
    exp = _loadgen.expected(conns, per_conn)
    st = {"served": 0, "server_bytes": 0, "server_eofs": 0, "server_errors": 0,
          "handlers_done": 0, "server_saw_close": 0, "finished": False}
    client: Dict[str, Any] = {}
    info: Dict[str, Any] = {}
    info["prelude"] = _prelude(loop_factory)  # untimed
    affinity, server_cpu, client_cpu = _cpu_pair()
    info["cpus"] = _cpus_note(server_cpu, client_cpu, "server", "client")
    window: Dict[str, float] = {}

    async def main() -> None:
        loop = asyncio.get_running_loop()
        all_done = loop.create_future()
        peer = loop.create_future()

        async def handle(reader: Any, writer: Any) -> None:
            if not window:  # the first connection: the server's window opens
                window["cpu0"] = _cpu_seconds()
                window["t0"] = time.perf_counter()
                _note_streams(info, "server", "tcp", reader, writer)
            readline = reader.readline
            write = writer.write
            drain = writer.drain
            try:
                while True:
                    line = await readline()
                    if not line:
                        st["server_eofs"] += 1
                        break
                    write(line)
                    await drain()
                    st["served"] += 1
                    st["server_bytes"] += len(line)
            except Exception as exc:
                st["server_errors"] += 1
                info.setdefault("server_error", repr(exc))
            finally:
                writer.close()
                st["handlers_done"] += 1
                if st["handlers_done"] == conns:
                    window["cpu1"] = _cpu_seconds()
                    window["t1"] = time.perf_counter()
                    _set_once(all_done)

        server = await asyncio.start_server(handle, HOST, 0, backlog=1024)
        try:
            port = server.sockets[0].getsockname()[1]
            proc = _loadgen.spawn(port, conns, per_conn,
                                  None if client_cpu is None else str(client_cpu))
            _wait_process(loop, proc, peer)
            try:
                out, err, rc = await asyncio.shield(peer)
            except asyncio.CancelledError:
                proc.kill()
                raise
            client.update(_loadgen.parse(out) or {
                "errors": [f"client exit {rc}: {err.decode(errors='replace')[-300:]}"]})
            await _bounded(all_done, info, "server handlers see every EOF")
            # counted before the server closes (which ends handlers too)
            st["server_saw_close"] = st["server_eofs"]
        finally:
            await _close_server(server, info)
        st["finished"] = True

    if server_cpu is not None:
        os.sched_setaffinity(0, {server_cpu})
    try:
        run = _Run(loop_factory)
        with run as loop:
            _run_guarded(loop, main(), info, lambda: st["served"],
                         _guard_seconds(n * 100))
    finally:
        _restore_affinity(affinity)
    info["client"] = client.get("client", "no result")
    if client.get("errors"):
        info["client_errors"] = "; ".join(map(str, client["errors"]))
    if "cpu_share" in client:
        info["client_cpu_share"] = round(client["cpu_share"], 3)
    if client.get("cpu_s") and client.get("lines"):
        info["client_cpu_us_per_line"] = round(client["cpu_s"] / client["lines"] * 1e6, 2)
    if "t1" in window and window["t1"] > window["t0"]:
        # this process from its first connection to its last EOF; its CPU
        # time per line holds up better than lines/s on a busy machine
        cpu = window["cpu1"] - window["cpu0"]
        info["server_cpu_share"] = round(cpu / (window["t1"] - window["t0"]), 3)
        if st["served"]:
            info["server_cpu_us_per_line"] = round(cpu / st["served"] * 1e6, 2)
    parity = {"lines": client.get("lines", 0), "matches": client.get("matches", 0),
              "checksum": client.get("checksum", 0),
              "overruns": client.get("overruns", 0),
              "client_saw_eof": client.get("eofs", 0),
              "completed_connections": client.get("completed_connections", 0),
              "served": st["served"], "server_bytes": st["server_bytes"],
              "server_errors": st["server_errors"],
              "server_saw_close": st["server_saw_close"], "finished": st["finished"]}
    expected = {"lines": total, "matches": total, "checksum": exp["checksum"],
                "overruns": 0, "client_saw_eof": 0,
                "completed_connections": conns, "served": total,
                "server_bytes": exp["bytes"], "server_errors": 0,
                "server_saw_close": conns, "finished": True}
    res = run.result("readline_echo_load", total, parity, expected, info)
    if client.get("elapsed"):
        info["run_s"] = round(res["elapsed"], 3)
        res["elapsed"] = client["elapsed"]  # lines/s over the client's clock
    return res


# ---- redis-py's asyncio client against redis-server --------------------------
#
# Each sample starts its own redis-server (Debian's; ``redis-server`` on
# PATH or REDIS_SERVER) on a free port of 127.0.0.1, with no persistence
# (no RDB saves, no AOF) and its working directory a fresh temp dir, pinned
# to the other CPU, and stops it afterwards; all outside the clock. The
# client is redis-py's redis.asyncio.Redis with its default connection
# pool, on the loop under test; its connections come from
# asyncio.open_connection, so zuvrs-streams gets zuvrs's native streams
# and rsloop its own. The reply parser is fixed for every loop: hiredis
# (redis-py's _AsyncHiredisParser, passed explicitly), and every sample
# checks that its connection used it.

REDIS_VALUES = 64
REDIS_KEYS = 1000
REDIS_BATCH = 100


def _redis_values() -> List[bytes]:
    """64 distinct values of 32 to 977 bytes."""
    return [bytes(((k * 29 + j * 11) & 0xFF) for j in range(32 + 15 * k))
            for k in range(REDIS_VALUES)]


def _redis_modules() -> Tuple[Any, Any, Any]:
    """(redis package, redis.asyncio, the hiredis parser class); a clear
    error where redis-py or hiredis is missing."""
    try:
        import redis
        import redis.asyncio as aioredis
        from redis._parsers import _AsyncHiredisParser
        from redis.utils import HIREDIS_AVAILABLE
    except ImportError as exc:
        raise RuntimeError(f"the redis workloads need redis-py: {exc}") from None
    if not HIREDIS_AVAILABLE:
        raise RuntimeError("the redis workloads need hiredis >= 3.2 "
                           "(redis-py's hiredis parser is used for every loop)")
    return redis, aioredis, _AsyncHiredisParser


def redis_server_path() -> str | None:
    return os.environ.get("REDIS_SERVER") or shutil.which("redis-server")


class RedisServer:
    """A private redis-server on 127.0.0.1 for one sample: started in
    __enter__ (on a free port, no persistence, pinned to ``cpu``), stopped
    in __exit__ (SIGTERM, then SIGKILL)."""

    def __init__(self, cpu: int | None) -> None:
        self.cpu = cpu
        self.proc: Any = None
        self.port = 0
        self.version = ""
        self.dir = ""

    def __enter__(self) -> "RedisServer":
        import subprocess

        exe = redis_server_path()
        if exe is None:
            raise RuntimeError("redis-server not found (Debian's redis-server "
                               "package, or REDIS_SERVER=path)")
        self.version = subprocess.run([exe, "--version"], capture_output=True,
                                      text=True).stdout.strip()
        self.dir = tempfile.mkdtemp(prefix="zuvrs-bench-redis-")
        for _attempt in range(5):
            with socket.socket() as s:  # a free port (another may take it: retried)
                s.bind((HOST, 0))
                port = s.getsockname()[1]
            cmd = [exe, "--port", str(port), "--bind", HOST, "--save", "",
                   "--appendonly", "no", "--dir", self.dir, "--daemonize", "no",
                   "--protected-mode", "yes", "--logfile", "", "--loglevel", "warning",
                   "--databases", "1"]
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE,
                                         stdin=subprocess.DEVNULL)
            if self.cpu is not None:
                try:
                    os.sched_setaffinity(self.proc.pid, {self.cpu})
                except OSError:
                    pass
            if self._ready(port):
                self.port = port
                return self
            self._stop()
        raise RuntimeError(f"redis-server did not start: {self._stderr()}")

    def _ready(self, port: int) -> bool:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with socket.create_connection((HOST, port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith(b"+PONG"):
                        return True
            except OSError:
                pass
            time.sleep(0.02)
        return False

    def _stderr(self) -> str:
        try:
            return (self.proc.stderr.read() or b"").decode(errors="replace")[-300:]
        except Exception:
            return ""

    def _stop(self) -> None:
        import subprocess

        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        self.proc = None

    def __exit__(self, *exc: Any) -> None:
        self._stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def _redis(name: str, loop_factory: LoopFactory, n: int,
           pipeline: bool) -> Dict[str, Any]:
    redis, aioredis, parser_class = _redis_modules()
    values = _redis_values()
    info: Dict[str, Any] = {"redis_py": redis.__version__,
                            "parser": "hiredis (redis._parsers._AsyncHiredisParser)"}
    try:
        import hiredis
        info["hiredis"] = hiredis.__version__
    except Exception:
        pass
    st = {"commands": 0, "set_ok": 0, "matches": 0, "checksum": 0,
          "parser_as_chosen": False, "finished": False}
    if pipeline:
        batches = max(1, n // REDIS_BATCH)
        total = batches * REDIS_BATCH
        half = REDIS_BATCH // 2
        exp_crc = 0
        for b in range(batches):
            for j in range(half):
                exp_crc = zlib.crc32(values[(b * half + j) % REDIS_VALUES], exp_crc)
    else:
        total = n
        exp_crc = 0
        for i in range(n):
            exp_crc = zlib.crc32(values[i % REDIS_VALUES], exp_crc)
    info["prelude"] = _prelude(loop_factory)  # untimed
    affinity, own_cpu, peer_cpu = _cpu_pair()
    info["cpus"] = _cpus_note(own_cpu, peer_cpu, "client", "redis-server")

    def note_connection(pool: Any) -> None:
        conns = list(getattr(pool, "_available_connections", []))
        conns += list(getattr(pool, "_in_use_connections", []))
        if not conns:
            return
        c = conns[0]
        info["connections"] = len(conns)
        st["parser_as_chosen"] = type(c._parser) is parser_class
        if c._reader is not None:
            _note_streams(info, "client", "tcp", c._reader, c._writer)

    async def main(port: int) -> None:
        pool = aioredis.ConnectionPool(host=HOST, port=port,
                                       parser_class=parser_class)
        r = aioredis.Redis(connection_pool=pool)
        try:
            if pipeline:
                half = REDIS_BATCH // 2
                crc = st["checksum"]
                for b in range(total // REDIS_BATCH):
                    pipe = r.pipeline(transaction=False)
                    keys = [b"k%d" % ((b * half + j) % REDIS_KEYS) for j in range(half)]
                    vals = [values[(b * half + j) % REDIS_VALUES] for j in range(half)]
                    for k, v in zip(keys, vals):
                        pipe.set(k, v)
                    for k in keys:
                        pipe.get(k)
                    out = await pipe.execute()
                    st["commands"] += len(out)
                    st["set_ok"] += sum(1 for x in out[:half] if x is True)
                    for got, v in zip(out[half:], vals):
                        if got == v:
                            st["matches"] += 1
                        crc = zlib.crc32(got if isinstance(got, bytes) else b"", crc)
                    if b == 0:
                        note_connection(pool)
                st["checksum"] = crc
            else:
                crc = 0
                set_ = r.set
                get = r.get
                for i in range(total):
                    k = b"k%d" % (i % REDIS_KEYS)
                    v = values[i % REDIS_VALUES]
                    if await set_(k, v) is True:
                        st["set_ok"] += 1
                    got = await get(k)
                    st["commands"] += 2
                    if got == v:
                        st["matches"] += 1
                    crc = zlib.crc32(got if isinstance(got, bytes) else b"", crc)
                    if i == 0:
                        note_connection(pool)
                st["checksum"] = crc
        finally:
            await _bounded(r.aclose(), info, "Redis.aclose()")
            await _bounded(pool.disconnect(), info, "ConnectionPool.disconnect()")
        st["finished"] = True

    with RedisServer(peer_cpu) as server:
        info["redis_server"] = server.version.split(" sha=")[0]
        if own_cpu is not None:
            os.sched_setaffinity(0, {own_cpu})
        try:
            run = _Run(loop_factory)
            with run as loop:
                _run_guarded(loop, main(server.port), info, lambda: st["commands"],
                             _guard_seconds(total * 100))
        finally:
            _restore_affinity(affinity)
    if pipeline:
        gets = total // 2
        expected = {"commands": total, "set_ok": gets, "matches": gets,
                    "checksum": exp_crc, "parser_as_chosen": True, "finished": True}
    else:
        expected = {"commands": 2 * total, "set_ok": total, "matches": total,
                    "checksum": exp_crc, "parser_as_chosen": True, "finished": True}
    return run.result(name, total, dict(st), expected, info)


def redis_get_set(loop_factory: LoopFactory, n: int = 20_000) -> Dict[str, Any]:
    """n SET + GET round trips (awaited one at a time) with redis-py's
    asyncio client on the loop under test against a private redis-server
    (see the section comment): keys k0..k999, 64 values of 32-977 bytes;
    every GET's value compared and CRC-32 checksummed. ops = n pairs."""
    return _redis("redis_get_set", loop_factory, n, pipeline=False)


def redis_pipeline(loop_factory: LoopFactory, n: int = 100_000) -> Dict[str, Any]:
    """n commands in pipelines of 100 (redis-py's pipeline(transaction=False):
    50 SETs, then GETs of the same 50 keys, one execute() per batch);
    every SET's reply and every GET's value checked, the values CRC-32
    checksummed. ops = n commands."""
    return _redis("redis_pipeline", loop_factory, n, pipeline=True)


# ---- memory per idle stream connection --------------------------------------

#: connections opened at once while setting up idle_connections
IDLE_OPEN_BATCH = 64


def _rss_bytes() -> int:
    """The current RSS of this process (not the peak), from /proc."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _raise_nofile(need: int) -> Tuple[int, int] | None:
    """Raise RLIMIT_NOFILE's soft limit (and the hard one, where allowed)
    to at least ``need``; returns the limits to restore, None if nothing
    changed."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        new_hard = hard
        if hard != resource.RLIM_INFINITY and hard < need:
            new_hard = need  # needs CAP_SYS_RESOURCE; ValueError otherwise
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, new_hard))
        return soft, hard
    return None


def idle_connections(loop_factory: LoopFactory, n: int = 5_000) -> Dict[str, Any]:
    """RSS per idle stream connection pair: n TCP connections on 127.0.0.1,
    both ends in this process on the loop under test (asyncio.start_server
    / open_connection, 64 opened at a time); on each the client sends one
    line and reads the server's reply, then the server's handler waits in
    ``reader.readline()`` and the client holds its reader and writer. With
    every connection idle, after gc.collect(), the growth of the RSS over
    the RSS before the first connection (server already listening, after a
    gc.collect() too), divided by n, is the value: KiB per connection pair,
    lower is better. Then every client closes and every handler must see
    its EOF. RLIMIT_NOFILE is raised for the 2 n sockets and restored."""
    import gc

    st = {"connected": 0, "replies_ok": 0, "idle": 0, "server_eofs": 0,
          "server_saw_close": 0, "handlers_done": 0, "server_errors": 0,
          "client_errors": 0, "client_closed": 0, "finished": False}
    info: Dict[str, Any] = {}
    info["prelude"] = _prelude(loop_factory)  # untimed
    rss: Dict[str, int] = {}
    limits = _raise_nofile(2 * n + 256)
    if limits is not None:
        info["rlimit_nofile"] = f"raised from {limits[0]} for {2 * n} sockets"

    async def main() -> None:
        loop = asyncio.get_running_loop()
        all_idle = loop.create_future()
        all_done = loop.create_future()

        async def handle(reader: Any, writer: Any) -> None:
            if not st["idle"]:
                _note_streams(info, "server", "tcp", reader, writer)
            try:
                line = await reader.readline()
                if line.startswith(b"HELLO "):
                    writer.write(b"OK " + line[6:])
                    await writer.drain()
                st["idle"] += 1
                if st["idle"] == n:
                    _set_once(all_idle)
                if await reader.readline() == b"":  # idle until the close
                    st["server_eofs"] += 1
            except Exception as exc:
                st["server_errors"] += 1
                info.setdefault("server_error", repr(exc))
            finally:
                writer.close()
                st["handlers_done"] += 1
                if st["handlers_done"] == n:
                    _set_once(all_done)

        server = await asyncio.start_server(handle, HOST, 0, backlog=1024)
        port = server.sockets[0].getsockname()[1]
        held: List[Tuple[Any, Any]] = []
        client_socks: List[Tuple[int, str] | None] = []

        async def connect(i: int) -> None:
            try:
                reader, writer = await asyncio.open_connection(HOST, port)
                held.append((reader, writer))
                if i < 3:
                    client_socks.append(_socket_id(writer))
                st["connected"] += 1
                if i == 0:
                    _note_streams(info, "client", "tcp", reader, writer)
                writer.write(b"HELLO %d\n" % i)
                if await reader.readline() == b"OK %d\n" % i:
                    st["replies_ok"] += 1
            except Exception as exc:
                st["client_errors"] += 1
                info.setdefault("client_error", repr(exc)[:200])

        try:
            gc.collect()
            rss["before"] = _rss_bytes()
            for start in range(0, n, IDLE_OPEN_BATCH):
                await asyncio.gather(*[connect(i) for i in
                                       range(start, min(n, start + IDLE_OPEN_BATCH))])
            await _bounded(all_idle, info, "every handler idle")
            gc.collect()
            rss["idle"] = _rss_bytes()
            for _, writer in held:
                writer.close()
            for _, writer in held:
                if await _bounded(writer.wait_closed(), info, "client wait_closed()"):
                    st["client_closed"] += 1
            if not await _bounded(all_done, info, "server handlers see every EOF"):
                _note_unclosed(info, "the clients' writers", client_socks)
            # counted before the server closes (which ends handlers too)
            st["server_saw_close"] = st["server_eofs"]
        finally:
            for _, writer in held:
                writer.close()
            held.clear()
            await _close_server(server, info)
        st["finished"] = True

    try:
        run = _Run(loop_factory)
        with run as loop:
            _run_guarded(loop, main(), info,
                         lambda: (st["connected"], st["idle"], st["handlers_done"]),
                         _guard_seconds(n * 100))
    finally:
        if limits is not None:
            import resource

            resource.setrlimit(resource.RLIMIT_NOFILE, limits)
    if "idle" in rss:
        info["rss_before_mib"] = round(rss["before"] / MIB, 1)
        info["rss_idle_mib"] = round(rss["idle"] / MIB, 1)
    keys = ["connected", "replies_ok", "idle", "server_saw_close", "handlers_done",
            "server_errors", "client_errors", "client_closed", "finished"]
    expected = {"connected": n, "replies_ok": n, "idle": n, "server_saw_close": n,
                "handlers_done": n, "server_errors": 0, "client_errors": 0,
                "client_closed": n, "finished": True}
    res = run.result("idle_connections", n, {k: st[k] for k in keys}, expected, info)
    if "idle" in rss:
        res["value"] = (rss["idle"] - rss["before"]) / 1024 / n
        info["kib_per_pair"] = round(res["value"], 2)
    return res


# --------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------

#: name -> (function, default size, one-line description with the unit)
WORKLOADS: Dict[str, Any] = {
    "call_soon": (call_soon, 1_000_000,
                  "call_soon in one batch, no arguments (callbacks)"),
    "call_soon_args": (call_soon_args, 1_000_000,
                       "call_soon in one batch, 3 arguments (callbacks)"),
    "timers_cancel": (timers_cancel, 200_000,
                      "call_later scheduled then cancelled (timers)"),
    "timers_fire": (timers_fire, 100_000,
                    "call_later, delays 1 + i % 100 ms, all fire in order (timers)"),
    "sleep0_tasks": (sleep0_tasks, 200_000,
                     "tasks doing one sleep(0), gathered in batches of 5,000 (tasks)"),
    "sleep0_one_task": (sleep0_one_task, 200_000,
                        "one task doing sleep(0) (loop turns)"),
    "threadsafe": (threadsafe, 200_000,
                   "call_soon_threadsafe from another thread (callbacks)"),
    "task_fanout": (task_fanout, 100_000,
                    "gather of small coroutines (tasks)"),
    # network: both ends on the loop under test, one process
    "tcp_echo_streams": (tcp_echo_streams, 20_000,
                         "1 KiB echo round trips, one TCP connection, "
                         "asyncio streams (round trips)"),
    "tcp_echo_protocol": (tcp_echo_protocol, 20_000,
                          "1 KiB echo round trips, one TCP connection, "
                          "asyncio.Protocol both ends (round trips)"),
    "tcp_bulk": (tcp_bulk, 1024,
                 "MiB streamed over one TCP connection, streams writer -> "
                 "Protocol reader (MiB)"),
    "unix_echo_streams": (unix_echo_streams, 20_000,
                          "1 KiB echo round trips, one Unix socket, "
                          "asyncio streams (round trips)"),
    "short_connections": (short_connections, 8_000,
                          "TCP connections, 16 concurrent, one small "
                          "request/reply each then close (connections)"),
    "getaddrinfo_numeric": (getaddrinfo_numeric, 20_000,
                            "loop.getaddrinfo('127.0.0.1', 80[, "
                            "type=SOCK_STREAM]) alternating (calls)"),
    "split_writes_one": (split_writes_one, 20_000,
                         "request/1 KiB response round trips, response "
                         "sent as ONE write (round trips)"),
    "split_writes_two": (split_writes_two, 20_000,
                         "request/1 KiB response round trips, response "
                         "sent as header + body, TWO writes (round trips)"),
    "tcp_bulk_flow": (tcp_bulk_flow, 512,
                      "MiB streamed over one TCP connection, Protocol writer "
                      "(256 KiB writes, pause_writing/resume_writing) -> "
                      "Protocol reader (MiB)"),
    "http_keepalive": (http_keepalive, 8_000,
                       "HTTP/1.1 GETs over 16 keep-alive TCP connections, "
                       "hand-parsed Protocol server, 4 KiB bodies + 8 "
                       "SHA-256 passes each, streams client (requests)"),
    "websocket": (websocket, 8_000,
                  "websockets echo, 16 ws:// connections, messages of "
                  "32/256/4,096 bytes in turn (messages)"),
    # TLS 1.3 over 127.0.0.1, the client verifying chain and host name
    "tls_echo_streams": (tls_echo_streams, 20_000,
                         "1 KiB echo round trips, one TLS connection, "
                         "asyncio streams (round trips)"),
    "tls_bulk": (tls_bulk, 512,
                 "MiB streamed over one TLS connection, streams writer -> "
                 "Protocol reader (MiB)"),
    "tls_handshakes": (tls_handshakes, 1_024,
                       "TLS connections, 16 concurrent, a full handshake, "
                       "one small request/reply, then close (connections)"),
    "tls_http_keepalive": (tls_http_keepalive, 8_000,
                           "http_keepalive over 16 TLS connections "
                           "(requests)"),
    "tls_websocket": (tls_websocket, 8_000,
                      "websockets echo, 16 wss:// connections, messages of "
                      "32/256/4,096 bytes in turn (messages)"),
    # datagrams, pipes, child processes
    "udp_echo": (udp_echo, 20_000,
                 "512-byte datagram echo round trips between two UDP "
                 "endpoints on 127.0.0.1, one outstanding (round trips)"),
    "unix_dgram_echo": (unix_dgram_echo, 20_000,
                        "512-byte datagram echo round trips between two "
                        "Unix datagram endpoints (AF_UNIX paths in a temp "
                        "dir), one outstanding (round trips)"),
    "subprocess_spawn": (subprocess_spawn, 500,
                         "create_subprocess_exec('/bin/true') + wait(), "
                         "sequential (processes)"),
    "subprocess_pipe_output": (subprocess_pipe_output, 256,
                               "MiB written by a child to its stdout, read "
                               "through a PIPE with stdout.read(256 KiB) "
                               "(MiB)"),
    "pipe_roundtrip": (pipe_roundtrip, 20_000,
                       "512-byte echo round trips over two os.pipe() pairs, "
                       "connect_read_pipe / connect_write_pipe (round trips)"),
    # other processes: a load generator, redis-server
    "readline_echo_load": (readline_echo_load, 100_000,
                           "lines echoed by a start_server readline echo "
                           "server, 100 connections ping-pong from a load "
                           "generator in another process (lines)"),
    "redis_get_set": (redis_get_set, 20_000,
                      "SET + GET round trips, redis-py asyncio client "
                      "(hiredis parser) against redis-server (pairs)"),
    "redis_pipeline": (redis_pipeline, 100_000,
                       "commands in redis-py pipelines of 100 (50 SET + 50 "
                       "GET) against redis-server (commands)"),
    # memory
    "idle_connections": (idle_connections, 5_000,
                         "idle stream connection pairs, both ends in one "
                         "process: RSS growth per pair (KiB, lower is better)"),
}

#: unit of ``ops`` where it is not obvious from the description
UNITS: Dict[str, str] = {"tcp_bulk": "MiB", "subprocess_pipe_output": "MiB",
                         "tcp_bulk_flow": "MiB", "tls_bulk": "MiB",
                         "readline_echo_load": "lines", "redis_get_set": "pairs",
                         "redis_pipeline": "commands", "idle_connections": "pairs"}

#: workloads whose result is a measured value (the sample's ``value``), not
#: a throughput: name -> (unit, lower is better)
VALUE_WORKLOADS: Dict[str, Tuple[str, bool]] = {
    "idle_connections": ("KiB/pair", True),
}

#: (single-write workload, split-write workload): compare.py shows their
#: per-loop ratio
SPLIT_PAIR = ("split_writes_one", "split_writes_two")

#: (TLS workload, its plain counterpart): the same work over TLS 1.3 and
#: over plain TCP; compare.py shows their per-loop ratio
TLS_PAIRS = (("tls_echo_streams", "tcp_echo_streams"),
             ("tls_bulk", "tcp_bulk"),
             ("tls_http_keepalive", "http_keepalive"),
             ("tls_websocket", "websocket"))


def run_workload(name: str, loop_factory: LoopFactory, size: int | None = None
                 ) -> Dict[str, Any]:
    fn, default, _ = WORKLOADS[name]
    return fn(loop_factory, default if size is None else size)
