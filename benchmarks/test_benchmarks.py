"""pytest-codspeed suite: every scheduling workload on every loop.

    python3 -m pytest benchmarks -q                # plain tests: bodies + parity
    python3 -m pytest benchmarks --codspeed        # timings (pytest-codspeed)

Each benchmark is parametrised by loop (asyncio, uvloop, rloop, zuvrs); a
loop whose package is not importable is skipped. Sizes are small so that
the plain run takes a few seconds; ZUVRS_BENCH_SCALE=<float> multiplies
them, ZUVRS_BENCH_LOOPS=asyncio,zuvrs restricts the loops. The workload bodies are shared with compare.py (workloads.py); the
cross-loop comparison in fresh processes is compare.py's job.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads  # noqa: E402

#: small sizes for CI (the full sizes are workloads.WORKLOADS[...][1])
SIZES = {
    "call_soon": 20_000,
    "call_soon_args": 20_000,
    "timers_cancel": 5_000,
    "timers_fire": 2_000,  # ~0.1 s of waiting regardless of size
    "sleep0_tasks": 10_000,  # two batches of 5,000
    "sleep0_one_task": 5_000,
    "threadsafe": 5_000,
    "task_fanout": 5_000,
}
assert set(SIZES) == set(workloads.WORKLOADS), "a workload has no test size"

_SCALE = float(os.environ.get("ZUVRS_BENCH_SCALE", "1") or 1)


def _size(name: str) -> int:
    return max(1, int(SIZES[name] * _SCALE))


#: the module a loop's class must come from (checks the factory is right)
_LOOP_MODULE_PREFIX = {
    "asyncio": "asyncio.",
    "uvloop": "uvloop",
    "rloop": "rloop",
    "zuvrs": "zuvrs",
}


#: ZUVRS_BENCH_LOOPS=asyncio,zuvrs restricts the loops (default: all)
_LOOPS = tuple(
    x.strip() for x in os.environ.get("ZUVRS_BENCH_LOOPS", "").split(",") if x.strip()
) or workloads.LOOP_NAMES


@pytest.fixture(params=_LOOPS)
def loop_name(request: pytest.FixtureRequest) -> str:
    try:
        workloads.get_loop_factory(request.param)
    except workloads.LoopUnavailable as exc:
        pytest.skip(str(exc))
    return request.param


def _check(result: dict, loop_name: str) -> None:
    assert result["ok"], (
        f"{result['workload']} on {loop_name}: parity {result['parity']} != "
        f"expected {result['expected']}; loop errors: {result['loop_errors']}"
    )
    assert result["loop_type"].startswith(_LOOP_MODULE_PREFIX[loop_name]), (
        f"{loop_name} factory made a {result['loop_type']}"
    )


def _bench(benchmark, name: str, loop_name: str) -> None:
    factory = workloads.get_loop_factory(loop_name)
    fn = workloads.WORKLOADS[name][0]
    result = benchmark(fn, factory, _size(name))
    _check(result, loop_name)


@pytest.mark.benchmark
def test_call_soon(benchmark, loop_name: str) -> None:
    _bench(benchmark, "call_soon", loop_name)


@pytest.mark.benchmark
def test_call_soon_args(benchmark, loop_name: str) -> None:
    _bench(benchmark, "call_soon_args", loop_name)


@pytest.mark.benchmark
def test_timers_cancel(benchmark, loop_name: str) -> None:
    _bench(benchmark, "timers_cancel", loop_name)


@pytest.mark.benchmark
def test_timers_fire(benchmark, loop_name: str) -> None:
    _bench(benchmark, "timers_fire", loop_name)


@pytest.mark.benchmark
def test_sleep0_tasks(benchmark, loop_name: str) -> None:
    _bench(benchmark, "sleep0_tasks", loop_name)


@pytest.mark.benchmark
def test_sleep0_one_task(benchmark, loop_name: str) -> None:
    _bench(benchmark, "sleep0_one_task", loop_name)


@pytest.mark.benchmark
def test_threadsafe(benchmark, loop_name: str) -> None:
    _bench(benchmark, "threadsafe", loop_name)


@pytest.mark.benchmark
def test_task_fanout(benchmark, loop_name: str) -> None:
    _bench(benchmark, "task_fanout", loop_name)


def test_every_workload_has_a_benchmark() -> None:
    names = {n[len("test_"):] for n in globals() if n.startswith("test_")}
    missing = set(workloads.WORKLOADS) - names
    assert not missing, f"workloads without a codspeed benchmark: {missing}"


@pytest.mark.parametrize(
    "name", ["call_soon", "call_soon_args", "timers_fire", "threadsafe"])
def test_parity_catches_lost_callbacks(name: str, monkeypatch) -> None:
    """The parity check must fail when work is lost: a stdlib loop whose
    call_soon / call_later / call_soon_threadsafe silently replace every
    other benchmark callback by a no-op. (In the task workloads, lost work
    means a task that never finishes: a hang, which compare.py reports as a
    timeout; timers_cancel counts fired timers, and cancelled() flags.)"""
    import asyncio

    monkeypatch.setattr(workloads, "GUARD_BASE_S", 0.5)

    def noop(*args: object) -> None:
        pass

    class Lossy(asyncio.SelectorEventLoop):  # type: ignore[misc, valid-type]
        _n = 0

        def _maybe_drop(self, cb):  # type: ignore[no-untyped-def]
            # the benchmark callbacks are all named "cb"
            if getattr(cb, "__name__", "") == "cb":
                self._n += 1
                if self._n % 2 == 0:
                    return noop
            return cb

        def call_soon(self, cb, *args, context=None):  # type: ignore[override]
            return super().call_soon(self._maybe_drop(cb), *args, context=context)

        def call_later(self, delay, cb, *args, context=None):  # type: ignore[override]
            return super().call_later(delay, self._maybe_drop(cb), *args,
                                      context=context)

        def call_soon_threadsafe(self, cb, *args, context=None):  # type: ignore[override]
            return super().call_soon_threadsafe(self._maybe_drop(cb), *args,
                                                context=context)

    result = workloads.WORKLOADS[name][0](Lossy, 200)
    assert not result["ok"], f"{name}: parity did not catch lost callbacks"


def test_order_check_catches_misordered_timers() -> None:
    """timers_fire's order check must fail on a loop that fires timers in
    the wrong order (here: delays reversed), although every timer fires."""
    import asyncio

    class Reversed(asyncio.SelectorEventLoop):  # type: ignore[misc, valid-type]
        def call_later(self, delay, cb, *args, context=None):  # type: ignore[override]
            if getattr(cb, "__name__", "") == "cb":
                delay = 0.102 - delay
            return super().call_later(delay, cb, *args, context=context)

    result = workloads.timers_fire(Reversed, 300)
    assert result["parity"]["fired"] == 300
    assert result["parity"]["order_ok"] is False
    assert not result["ok"]
