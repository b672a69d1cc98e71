"""call_soon_threadsafe, thread checks in debug mode, executors, to_thread."""

import asyncio
import concurrent.futures
import contextvars
import threading
import time
import warnings

import pytest
from _support import PY311, PY312, noop_coro, run, run_forever


def _start_threads_when_running(loop, threads):
    """Start ``threads`` from inside the loop, i.e. once it is running."""
    loop.call_soon(lambda: [t.start() for t in threads])


def test_call_soon_threadsafe_from_8_threads(loop):
    n_threads, n_calls = 8, 10_000
    total = n_threads * n_calls
    done = loop.create_future()
    last_index = [-1] * n_threads
    out_of_order = []
    wrong_thread = []
    count = 0
    loop_thread = threading.get_ident()

    def cb(tid, i):
        nonlocal count
        if last_index[tid] != i - 1:
            out_of_order.append((tid, last_index[tid], i))
        last_index[tid] = i
        if threading.get_ident() != loop_thread:
            wrong_thread.append(tid)
        count += 1
        if count == total:
            done.set_result(None)

    barrier = threading.Barrier(n_threads)

    def worker(tid):
        barrier.wait()
        for i in range(n_calls):
            loop.call_soon_threadsafe(cb, tid, i)

    threads = [threading.Thread(target=worker, args=(tid,)) for tid in range(n_threads)]
    _start_threads_when_running(loop, threads)
    try:
        run(loop, done, timeout=60)
    finally:
        for t in threads:
            t.join(10)
    assert count == total
    assert last_index == [n_calls - 1] * n_threads
    assert out_of_order == []  # FIFO per producing thread
    assert wrong_thread == []


def test_call_soon_threadsafe_wakes_idle_loop_repeatedly(loop):
    # Each call arrives while the loop is blocked waiting for I/O (the only
    # timer is the far-away guard), so every one of them needs a wake-up.
    n_threads, n_calls = 4, 50
    done = loop.create_future()
    count = 0

    def cb():
        nonlocal count
        count += 1
        if count == n_threads * n_calls:
            done.set_result(None)

    def worker():
        for _ in range(n_calls):
            time.sleep(0.002)
            loop.call_soon_threadsafe(cb)

    threads = [threading.Thread(target=worker) for _ in range(n_threads)]
    _start_threads_when_running(loop, threads)
    t0 = time.monotonic()
    try:
        run(loop, done, timeout=30)
    finally:
        for t in threads:
            t.join(10)
    assert count == n_threads * n_calls
    assert time.monotonic() - t0 < 10


def test_call_soon_threadsafe_wakes_loop_in_long_timer_promptly(loop):
    fut = loop.create_future()
    long_timer = loop.call_later(30, fut.set_result, "timer")
    latency = []

    def on_loop(t_sent):
        latency.append(time.monotonic() - t_sent)
        fut.set_result("woken")

    def worker():
        time.sleep(0.1)
        loop.call_soon_threadsafe(on_loop, time.monotonic())

    thread = threading.Thread(target=worker)
    _start_threads_when_running(loop, [thread])
    t0 = time.monotonic()
    try:
        assert run(loop, fut, timeout=60) == "woken"
    finally:
        thread.join(10)
        long_timer.cancel()
    assert latency[0] < 0.5
    assert time.monotonic() - t0 < 2.0


def test_call_soon_threadsafe_before_run(loop):
    calls = []
    thread = threading.Thread(target=lambda: loop.call_soon_threadsafe(calls.append, "x"))
    thread.start()
    thread.join()
    loop.call_soon(loop.stop)
    run_forever(loop)
    assert calls == ["x"]


def test_call_soon_threadsafe_returns_cancellable_handle(loop):
    calls = []
    handle = loop.call_soon_threadsafe(calls.append, 1)
    handle.cancel()
    assert handle.cancelled()
    loop.call_soon(loop.stop)
    run_forever(loop)
    assert calls == []


# -- debug-mode thread checks ------------------------------------------------

NON_THREADSAFE = {
    "call_soon": lambda lp: lp.call_soon(print),
    "call_later": lambda lp: lp.call_later(1, print),
    "call_at": lambda lp: lp.call_at(lp.time() + 1, print),
}


def test_debug_call_from_other_thread_raises(loop):
    loop.set_debug(True)
    done = loop.create_future()
    errors = {}

    def worker():
        for name, fn in NON_THREADSAFE.items():
            try:
                handle = fn(loop)
            except RuntimeError as exc:
                errors[name] = str(exc)
            else:
                handle.cancel()
                errors[name] = None
        loop.call_soon_threadsafe(done.set_result, None)

    thread = threading.Thread(target=worker)
    _start_threads_when_running(loop, [thread])
    try:
        run(loop, done)
    finally:
        thread.join(10)
    assert set(errors) == set(NON_THREADSAFE)
    for name, msg in errors.items():
        assert msg is not None, f"{name} did not raise"
        assert msg.startswith("Non-thread-safe operation"), (name, msg)


def test_debug_call_from_other_thread_allowed_when_not_running(loop):
    loop.set_debug(True)
    results = []

    def worker():
        try:
            results.append(loop.call_soon(print))
        except RuntimeError as exc:
            results.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert not isinstance(results[0], Exception)
    results[0].cancel()


def test_loop_runs_in_non_main_thread(loop):
    calls = []
    started = threading.Event()

    def cb(tag):
        calls.append((tag, threading.current_thread().name, asyncio.get_running_loop() is loop))

    loop.call_soon(cb, "scheduled-before")
    loop.call_soon(started.set)

    def target():
        with_guard = loop.call_later(10, loop.stop)
        try:
            loop.run_forever()
        finally:
            with_guard.cancel()

    thread = threading.Thread(target=target, name="loop-thread")
    thread.start()
    assert started.wait(5)
    loop.call_soon_threadsafe(cb, "threadsafe")
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    assert not thread.is_alive()
    assert calls == [("scheduled-before", "loop-thread", True), ("threadsafe", "loop-thread", True)]


def test_loop_created_and_run_in_thread(loop_factory):
    result = []

    def target():
        lp = loop_factory()
        try:
            result.append(run(lp, asyncio.sleep(0.01, "in-thread")))
        finally:
            lp.close()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(10)
    assert result == ["in-thread"]


# -- executors ----------------------------------------------------------------

def test_run_in_executor_default(loop):
    main = threading.get_ident()

    def work(a, b):
        return a + b, threading.get_ident()

    value, tid = run(loop, loop.run_in_executor(None, work, 2, 3))
    assert value == 5
    assert tid != main


def test_run_in_executor_exception(loop):
    def work():
        raise ValueError("in executor")

    with pytest.raises(ValueError, match="in executor"):
        run(loop, loop.run_in_executor(None, work))


def test_run_in_executor_returns_future(loop):
    fut = loop.run_in_executor(None, time.sleep, 0)
    assert isinstance(fut, asyncio.Future)
    assert fut.get_loop() is loop
    run(loop, fut)


def test_run_in_executor_custom_executor(loop):
    with concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="custom") as ex:
        async def main():
            return await asyncio.gather(
                *(loop.run_in_executor(ex, lambda: threading.current_thread().name) for _ in range(8))
            )

        names = run(loop, main())
    assert len(names) == 8
    assert all(n.startswith("custom") for n in names)


def test_run_in_executor_many_concurrent(loop):
    async def main():
        t0 = time.monotonic()
        results = await asyncio.gather(
            *(loop.run_in_executor(None, lambda i=i: (time.sleep(0.01), i)[1]) for i in range(50))
        )
        return results, time.monotonic() - t0

    results, elapsed = run(loop, main(), timeout=30)
    assert results == list(range(50))
    assert elapsed < 5


def test_run_in_executor_debug_rejects_coroutine_function(loop):
    loop.set_debug(True)
    with pytest.raises(TypeError, match="coroutines cannot be used with run_in_executor"):
        loop.run_in_executor(None, noop_coro)


def test_set_default_executor(loop):
    class CountingExecutor(concurrent.futures.ThreadPoolExecutor):
        submitted = 0

        def submit(self, *args, **kwargs):
            CountingExecutor.submitted += 1
            return super().submit(*args, **kwargs)

    ex = CountingExecutor(max_workers=1, thread_name_prefix="counting")
    try:
        loop.set_default_executor(ex)
        name = run(loop, loop.run_in_executor(None, lambda: threading.current_thread().name))
        assert name.startswith("counting")
        assert CountingExecutor.submitted == 1
    finally:
        ex.shutdown(wait=True)


@pytest.mark.skipif(not PY311, reason="TypeError for non-ThreadPoolExecutor since 3.11")
def test_set_default_executor_rejects_non_thread_pool(loop):
    with pytest.raises(TypeError, match="ThreadPoolExecutor"):
        loop.set_default_executor(object())


def test_shutdown_default_executor(loop):
    threads = []

    def work():
        threads.append(threading.current_thread())
        return "worked"

    async def main():
        assert await loop.run_in_executor(None, work) == "worked"
        await loop.shutdown_default_executor()

    run(loop, main())
    assert threads and not threads[0].is_alive()
    with pytest.raises(RuntimeError, match="Executor shutdown has been called"):
        loop.run_in_executor(None, work)
    # A non-default executor can still be used.
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        assert run(loop, loop.run_in_executor(ex, work)) == "worked"


def test_shutdown_default_executor_unused(loop):
    run(loop, loop.shutdown_default_executor())
    with pytest.raises(RuntimeError, match="Executor shutdown has been called"):
        loop.run_in_executor(None, print)


@pytest.mark.skipif(not PY312, reason="timeout parameter is 3.12+")
def test_shutdown_default_executor_with_timeout(loop):
    threads = []

    async def main():
        await loop.run_in_executor(None, lambda: threads.append(threading.current_thread()))
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # joined in time: no warning
            await loop.shutdown_default_executor(timeout=5)

    run(loop, main())
    assert threads and not threads[0].is_alive()


# -- asyncio.to_thread -----------------------------------------------------------

def test_to_thread(loop):
    var = contextvars.ContextVar("var", default="default")

    def work(a, *, b):
        return a * b, var.get(), threading.get_ident()

    async def main():
        var.set("propagated")
        return await asyncio.to_thread(work, 6, b=7)

    value, seen, tid = run(loop, main())
    assert value == 42
    assert seen == "propagated"
    assert tid != threading.get_ident()


def test_to_thread_exception(loop):
    def work():
        raise KeyError("thread")

    with pytest.raises(KeyError):
        run(loop, asyncio.to_thread(work))
