"""run_forever / run_until_complete / stop / close semantics."""

import asyncio
import re
import signal
import sys
import time

import pytest
from _support import Guard, LoopFactory, noop_coro, run, run_forever, run_once

# -- stop() -------------------------------------------------------------------

def test_stop_before_run_forever_runs_scheduled_callbacks_once(loop):
    calls = []

    def first():
        calls.append("first")
        loop.call_soon(calls.append, "next-turn")

    loop.call_soon(first)
    loop.call_soon(calls.append, "second")
    loop.stop()
    loop.run_forever()
    assert calls == ["first", "second"]
    assert not loop.is_running()

    # The callback scheduled during that iteration was kept for the next run.
    run_once(loop)
    assert calls == ["first", "second", "next-turn"]


def test_stop_before_run_forever_with_nothing_scheduled_returns(loop):
    t0 = time.monotonic()
    run_once(loop)
    assert time.monotonic() - t0 < 1.0
    assert not loop.is_running()


def test_stop_flag_is_reset_after_run_forever(loop):
    run_once(loop)
    # A second run must not exit immediately because of the old stop().
    calls = []
    loop.call_later(0.05, calls.append, "timer")
    loop.call_later(0.06, loop.stop)
    run_forever(loop)
    assert calls == ["timer"]


def test_stop_during_run_finishes_current_batch(loop):
    calls = []

    def stopper():
        calls.append("stopper")
        loop.stop()
        loop.call_soon(calls.append, "scheduled-by-stopper")

    loop.call_soon(calls.append, "before")
    loop.call_soon(stopper)
    loop.call_soon(calls.append, "after")
    run_forever(loop)
    assert calls == ["before", "stopper", "after"]
    run_once(loop)
    assert calls[-1] == "scheduled-by-stopper"


def test_stop_from_timer_callback(loop):
    t0 = loop.time()
    loop.call_later(0.05, loop.stop)
    run_forever(loop)
    assert loop.time() - t0 >= 0.049


def test_stop_called_twice_stops_once(loop):
    loop.call_soon(loop.stop)
    loop.call_soon(loop.stop)
    run_forever(loop)
    # The next run_forever is not affected by the duplicate stop().
    calls = []
    loop.call_soon(calls.append, 1)
    loop.call_later(0.02, loop.stop)
    run_forever(loop)
    assert calls == [1]


# -- run_until_complete -----------------------------------------------------------

def test_run_until_complete_coroutine(loop):
    async def coro(x):
        await asyncio.sleep(0)
        return x * 2

    assert run(loop, coro(21)) == 42


def test_run_until_complete_future(loop):
    fut = loop.create_future()
    loop.call_soon(fut.set_result, "done")
    assert run(loop, fut) == "done"


def test_run_until_complete_task(loop):
    async def coro():
        return "task"

    task = loop.create_task(coro())
    assert run(loop, task) == "task"
    assert task.done()


def test_run_until_complete_awaitable(loop):
    class Awaitable:
        def __await__(self):
            yield from asyncio.sleep(0).__await__()
            return "awaited"

    assert run(loop, Awaitable()) == "awaited"


@pytest.mark.parametrize("bad", [1, "x", None, object()])
def test_run_until_complete_bad_type(loop, bad):
    with pytest.raises(TypeError, match="An asyncio.Future, a coroutine or an awaitable is required"):
        loop.run_until_complete(bad)
    assert not loop.is_running()


def test_run_until_complete_propagates_exception(loop):
    async def coro():
        await asyncio.sleep(0)
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        run(loop, coro())
    assert run(loop, asyncio.sleep(0, "again")) == "again"


def test_run_until_complete_future_of_other_loop(loop, loop_factory):
    other = loop_factory()
    try:
        fut = other.create_future()
        with pytest.raises(ValueError, match="different loop"):
            loop.run_until_complete(fut)
    finally:
        other.close()


def test_run_until_complete_stopped_early(loop):
    fut = loop.create_future()
    loop.call_soon(loop.stop)
    with pytest.raises(RuntimeError, match="Event loop stopped before Future completed."):
        loop.run_until_complete(fut)
    assert not fut.done()


def test_run_until_complete_can_be_repeated(loop):
    for i in range(20):
        assert run(loop, asyncio.sleep(0, i)) == i


def test_run_until_complete_cancelled_task(loop):
    async def forever():
        await asyncio.sleep(3600)

    task = loop.create_task(forever())
    loop.call_soon(task.cancel)
    with pytest.raises(asyncio.CancelledError):
        run(loop, task)


# -- is_running / is_closed / running-loop bookkeeping ------------------------------

def test_is_running(loop):
    seen = []

    def cb():
        seen.append(loop.is_running())
        seen.append(asyncio.get_running_loop() is loop)
        seen.append(asyncio._get_running_loop() is loop)
        loop.stop()

    assert not loop.is_running()
    loop.call_soon(cb)
    run_forever(loop)
    assert seen == [True, True, True]
    assert not loop.is_running()
    assert asyncio._get_running_loop() is None


def test_is_running_inside_coroutine(loop):
    async def coro():
        return loop.is_running(), asyncio.get_running_loop() is loop

    assert run(loop, coro()) == (True, True)
    assert not loop.is_running()


def test_is_closed(loop):
    assert not loop.is_closed()
    loop.close()
    assert loop.is_closed()


def test_close_twice_is_fine(loop):
    loop.close()
    loop.close()
    assert loop.is_closed()


def test_close_after_running(loop):
    run(loop, asyncio.sleep(0.01))
    loop.close()
    assert loop.is_closed()
    assert not loop.is_running()


def test_asyncgen_hooks_restored_after_run(loop):
    before = sys.get_asyncgen_hooks()
    inside = []

    def cb():
        inside.append(sys.get_asyncgen_hooks())
        loop.stop()

    loop.call_soon(cb)
    run_forever(loop)
    assert sys.get_asyncgen_hooks() == before
    # While running, the loop installs its own hooks (for shutdown_asyncgens).
    assert inside[0].firstiter is not None
    assert inside[0].finalizer is not None
    assert inside[0] != before


# -- RuntimeError messages ------------------------------------------------------------

def test_run_forever_while_running(loop):
    errors = []

    def cb():
        try:
            loop.run_forever()
        except RuntimeError as exc:
            errors.append(str(exc))
        loop.stop()

    loop.call_soon(cb)
    run_forever(loop)
    assert errors == ["This event loop is already running"]


def test_run_until_complete_while_running(loop):
    errors = []

    def cb():
        fut = loop.create_future()
        try:
            loop.run_until_complete(fut)
        except RuntimeError as exc:
            errors.append(str(exc))
        loop.stop()

    loop.call_soon(cb)
    run_forever(loop)
    assert errors == ["This event loop is already running"]


INNER_RUNS = {
    "run_forever": lambda lp: lp.run_forever(),
    "run_until_complete": lambda lp: lp.run_until_complete(lp.create_future()),
}


# One method per test: CPython 3.13.0 clears the running loop after a failed
# nested run_forever(), which would hide a second check in the same callback.
@pytest.mark.parametrize("method", sorted(INNER_RUNS))
@pytest.mark.parametrize("inner_kind", ["same", "reference"])
def test_run_while_another_loop_is_running(loop, loop_factory, inner_kind, method):
    inner = loop_factory() if inner_kind == "same" else LoopFactory("asyncio")()
    errors = []

    def cb():
        try:
            INNER_RUNS[method](inner)
        except RuntimeError as exc:
            errors.append(str(exc))
        loop.stop()

    try:
        loop.call_soon(cb)
        run_forever(loop)
    finally:
        inner.close()
    assert errors == ["Cannot run the event loop while another loop is running"]


def test_other_loop_cannot_run_inside_reference_loop(loop):
    # The reverse direction: the loop under test is the inner one.
    outer = LoopFactory("asyncio")()
    errors = []

    def cb():
        try:
            loop.run_forever()
        except RuntimeError as exc:
            errors.append(str(exc))
        outer.stop()

    try:
        outer.call_soon(cb)
        run_forever(outer)
    finally:
        outer.close()
    assert errors == ["Cannot run the event loop while another loop is running"]
    assert not loop.is_running()


def test_close_running_loop(loop):
    errors = []

    def cb():
        try:
            loop.close()
        except RuntimeError as exc:
            errors.append(str(exc))
        loop.stop()

    loop.call_soon(cb)
    run_forever(loop)
    assert errors == ["Cannot close a running event loop"]
    assert not loop.is_closed()
    assert run(loop, asyncio.sleep(0, "usable")) == "usable"


CLOSED_LOOP_OPERATIONS = {
    "call_soon": lambda lp: lp.call_soon(print),
    "call_later": lambda lp: lp.call_later(1, print),
    "call_at": lambda lp: lp.call_at(lp.time() + 1, print),
    "call_soon_threadsafe": lambda lp: lp.call_soon_threadsafe(print),
    "run_forever": lambda lp: lp.run_forever(),
    "run_until_complete": lambda lp: lp.run_until_complete(lp.create_future()),
    "run_in_executor": lambda lp: lp.run_in_executor(None, print),
    "add_reader": lambda lp: lp.add_reader(0, print),
    "add_writer": lambda lp: lp.add_writer(1, print),
    "add_signal_handler": lambda lp: lp.add_signal_handler(signal.SIGUSR1, print),
}


@pytest.mark.parametrize("operation", sorted(CLOSED_LOOP_OPERATIONS))
def test_closed_loop_raises(loop, operation):
    loop.close()
    with pytest.raises(RuntimeError, match="^Event loop is closed$"):
        CLOSED_LOOP_OPERATIONS[operation](loop)


@pytest.mark.parametrize("method", ["create_task", "run_until_complete"])
def test_closed_loop_rejects_coroutine(loop, method):
    loop.close()
    coro = noop_coro()
    try:
        with pytest.raises(RuntimeError, match="^Event loop is closed$"):
            getattr(loop, method)(coro)
    finally:
        coro.close()


def test_closed_loop_operations_that_do_not_raise(loop):
    loop.close()
    # asyncio allows these on a closed loop.
    assert loop.remove_reader(0) is False
    assert loop.remove_writer(1) is False
    assert loop.remove_signal_handler(signal.SIGUSR1) is False
    assert isinstance(loop.time(), float)
    fut = loop.create_future()
    assert not fut.done()
    loop.set_debug(True)
    assert loop.get_debug() is True
    loop.stop()  # only sets a flag in asyncio
    loop.close()


# -- time() -------------------------------------------------------------------------

def test_time_is_monotonic_and_tracks_time_monotonic(loop):
    time.sleep(0.1)  # the loop clock must not be cached from creation time
    values = [loop.time() for _ in range(1000)]
    assert values == sorted(values)
    assert isinstance(values[0], float)
    assert abs(loop.time() - time.monotonic()) < 0.05


def test_time_advances_within_one_iteration(loop):
    stamps = []

    def slow():
        stamps.append(loop.time())
        time.sleep(0.05)

    loop.call_soon(slow)
    loop.call_soon(lambda: stamps.append(loop.time()))
    run_once(loop)
    assert stamps[1] - stamps[0] >= 0.045


def test_time_while_running_tracks_time_monotonic(loop):
    async def coro():
        await asyncio.sleep(0.05)
        return loop.time(), time.monotonic()

    loop_t, mono_t = run(loop, coro())
    assert abs(loop_t - mono_t) < 0.05


# -- repr ----------------------------------------------------------------------------

def _state(lp):
    m = re.search(r"running=(\w+) closed=(\w+) debug=(\w+)>$", repr(lp))
    assert m, repr(lp)
    return m.groups()


def test_repr(loop):
    # asyncio uses the bare class name; a module-qualified one is accepted.
    assert re.match(rf"<(\w+\.)*{type(loop).__name__} ", repr(loop)), repr(loop)
    assert _state(loop) == ("False", "False", "False")
    seen = []
    loop.call_soon(lambda: seen.append(_state(loop)))
    run_once(loop)
    assert seen == [("True", "False", "False")]
    loop.set_debug(True)
    assert _state(loop) == ("False", "False", "True")
    loop.set_debug(False)
    loop.close()
    assert _state(loop) == ("False", "True", "False")


# -- BaseException in a coroutine ----------------------------------------------------

@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit])
def test_base_exception_from_coroutine_propagates(loop, exc_type):
    async def coro():
        await asyncio.sleep(0)
        raise exc_type()

    with pytest.raises(exc_type):
        with Guard(loop):
            loop.run_until_complete(coro())
    assert not loop.is_running()
    assert run(loop, asyncio.sleep(0, "ok")) == "ok"


def test_loop_driven_by_hand_inside_its_own_poll_refuses():
    # A protocol callback runs inside the loop's poll (uv_run): driving the
    # same loop from there is refused, not a re-entered uv_run; the loop
    # goes on afterwards.
    import socket

    import zuvrs

    loop = zuvrs.new_event_loop()
    a, b = socket.socketpair()
    seen = []

    class Proto(asyncio.Protocol):
        def data_received(self, data):
            try:
                loop._run_once()
            except RuntimeError as e:
                seen.append(str(e))
            else:
                seen.append("ran")

    try:
        transport, _ = loop.run_until_complete(loop.create_unix_connection(Proto, sock=a))
        b.sendall(b"x")
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            loop.run_until_complete(asyncio.sleep(0.01))
        assert seen == ["the event loop is already polling"]
        transport.close()
        loop.run_until_complete(asyncio.sleep(0))
    finally:
        b.close()
        loop.close()


def test_loop_closed_inside_its_own_poll_closes_after_it():
    # close() from a protocol callback of a loop driven by hand (so not
    # "running"): libuv's loop is freed once its poll has returned.
    import socket

    import zuvrs

    loop = zuvrs.new_event_loop()
    a, b = socket.socketpair()
    closed = []

    class Proto(asyncio.Protocol):
        def data_received(self, data):
            loop.close()
            closed.append(loop.is_closed())

    try:
        loop.run_until_complete(loop.create_unix_connection(Proto, sock=a))
        b.sendall(b"x")
        deadline = time.monotonic() + 5
        while not closed and time.monotonic() < deadline:
            loop._run_once()
        assert closed == [True]
        with pytest.raises(RuntimeError):
            loop._run_once()
    finally:
        b.close()
        loop.close()
