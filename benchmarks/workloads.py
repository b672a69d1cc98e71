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
    }

``elapsed`` covers creating the loop, running the work and closing the loop;
it excludes the parity checks done afterwards, so that checking the answer
costs every loop nothing. Callbacks are plain Python functions that count
what they do; that counting is the same for every loop.

Nothing here depends on a particular loop: loops are reached only through
``loop_factory`` (see ``get_loop_factory``). Runs on CPython 3.10 - 3.14.
"""

from __future__ import annotations

import asyncio
import importlib
import operator
import threading
import time
from typing import Any, Callable, Dict, List

LoopFactory = Callable[[], asyncio.AbstractEventLoop]

# --------------------------------------------------------------------------
# Loops
# --------------------------------------------------------------------------

#: Every loop the benchmarks know, in default display order.
LOOP_NAMES = ("asyncio", "uvloop", "rloop", "zuvrs")

#: name -> (module to import, attribute that makes a new loop)
_LOOP_MODULES = {
    "asyncio": ("asyncio", "new_event_loop"),
    "uvloop": ("uvloop", "new_event_loop"),
    "rloop": ("rloop", "new_event_loop"),
    "zuvrs": ("zuvrs", "new_event_loop"),
}


class LoopUnavailable(Exception):
    """The loop's package is not installed (or fails to import)."""


class Unsupported(Exception):
    """The loop does not implement what the workload needs (e.g. rloop has
    no Unix sockets); reported as "unsupported", not as a crash."""


def get_loop_factory(name: str) -> LoopFactory:
    """Return the ``new_event_loop`` callable of loop ``name``.

    Raises LoopUnavailable if its package is not installed or does not
    import; the message says which.
    """
    try:
        modname, attr = _LOOP_MODULES[name]
    except KeyError:
        raise ValueError(
            f"unknown loop {name!r}; known: {', '.join(LOOP_NAMES)}"
        ) from None
    try:
        mod = importlib.import_module(modname)
    except ModuleNotFoundError as exc:
        if exc.name == modname:
            raise LoopUnavailable(f"{name}: not installed") from exc
        raise LoopUnavailable(f"{name}: import failed: {exc!r}") from exc
    except Exception as exc:  # a broken build is an import error, not absence
        raise LoopUnavailable(f"{name}: import failed: {exc!r}") from exc
    try:
        return getattr(mod, attr)
    except AttributeError:
        raise LoopUnavailable(f"{name}: {modname}.{attr} missing") from None


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
        return res


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
}


def run_workload(name: str, loop_factory: LoopFactory, size: int | None = None
                 ) -> Dict[str, Any]:
    fn, default, _ = WORKLOADS[name]
    return fn(loop_factory, default if size is None else size)
