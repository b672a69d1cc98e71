"""call_soon, Handle, contexts and the exception handler."""

import asyncio
import contextvars
import functools
import logging
import sys
import threading

import pytest
from _support import PY312, SCHEDULERS, collect_exceptions, noop_coro, run, run_forever, run_once

# -- ordering and arguments ----------------------------------------------------

def test_call_soon_is_fifo(loop):
    calls = []
    for i in range(1000):
        loop.call_soon(calls.append, i)
    run_once(loop)
    assert calls == list(range(1000))


def test_call_soon_and_threadsafe_share_one_fifo(loop):
    calls = []
    for i in range(100):
        if i % 3:
            loop.call_soon(calls.append, i)
        else:
            loop.call_soon_threadsafe(calls.append, i)
    run_once(loop)
    assert calls == list(range(100))


@pytest.mark.parametrize("nargs", [0, 1, 2, 3, 4, 5, 100])
def test_call_soon_positional_args(loop, nargs):
    received = []
    args = tuple(object() for _ in range(nargs))
    handle = loop.call_soon(lambda *a: received.append(a), *args)
    run_once(loop)
    assert len(received) == 1
    assert len(received[0]) == nargs
    assert all(x is y for x, y in zip(received[0], args))
    assert not handle.cancelled()


class _CallableObject:
    def __init__(self, calls):
        self.calls = calls

    def __call__(self, x):
        self.calls.append(("object", x))

    def method(self, x):
        self.calls.append(("method", x))


def test_call_soon_accepts_any_callable(loop):
    calls = []
    obj = _CallableObject(calls)
    loop.call_soon(obj, 1)
    loop.call_soon(obj.method, 2)
    loop.call_soon(calls.append, ("builtin", 3))
    loop.call_soon(lambda x: calls.append(("lambda", x)), 4)
    loop.call_soon(functools.partial(obj.method), 5)
    loop.call_soon(type(obj), calls)  # a class is callable too
    run_once(loop)
    assert calls == [("object", 1), ("method", 2), ("builtin", 3), ("lambda", 4), ("method", 5)]


def test_call_soon_partial_with_kwargs(loop):
    received = []
    loop.call_soon(functools.partial(lambda a, *, b: received.append((a, b)), 1, b=2))
    run_once(loop)
    assert received == [(1, 2)]


def test_call_soon_return_value_is_ignored(loop):
    contexts = collect_exceptions(loop)
    loop.call_soon(lambda: "ignored")
    loop.call_soon(lambda: 1 / 1)
    run_once(loop)
    assert contexts == []


def test_callbacks_scheduled_during_a_turn_run_in_the_next_turn(loop):
    calls = []

    def level(n):
        calls.append(n)
        if n < 3:
            loop.call_soon(level, n + 1)

    loop.call_soon(level, 0)
    loop.call_soon(calls.append, "same-turn")
    for expected in (
        [0, "same-turn"],
        [0, "same-turn", 1],
        [0, "same-turn", 1, 2],
        [0, "same-turn", 1, 2, 3],
    ):
        run_once(loop)
        assert calls == expected


def test_long_callback_chain(loop):
    count = 0

    def step():
        nonlocal count
        count += 1
        if count < 10000:
            loop.call_soon(step)
        else:
            loop.stop()

    loop.call_soon(step)
    run_forever(loop)
    assert count == 10000


# -- Handle -------------------------------------------------------------------

def test_handle_cancel_before_run(loop):
    calls = []
    h1 = loop.call_soon(calls.append, 1)
    h2 = loop.call_soon(calls.append, 2)
    assert not h2.cancelled()
    h2.cancel()
    assert h2.cancelled()
    h2.cancel()  # idempotent
    assert h2.cancelled()
    run_once(loop)
    assert calls == [1]
    assert not h1.cancelled()


def test_handle_cancelled_by_earlier_callback_in_same_turn(loop):
    calls = []
    handles = {}

    def first():
        calls.append("first")
        handles["victim"].cancel()

    loop.call_soon(first)
    handles["victim"] = loop.call_soon(calls.append, "victim")
    loop.call_soon(calls.append, "last")
    run_once(loop)
    assert calls == ["first", "last"]
    assert handles["victim"].cancelled()


def test_handle_cancel_all_then_loop_idles(loop):
    calls = []
    handles = [loop.call_soon(calls.append, i) for i in range(100)]
    for h in handles:
        h.cancel()
    run(loop, asyncio.sleep(0.01))
    assert calls == []


def _require_get_context(handle, loop_name):
    if not hasattr(handle, "get_context") and loop_name == "asyncio":
        pytest.skip("asyncio.Handle.get_context() is new in 3.12")
    assert PY312 or loop_name == "zuvrs" or hasattr(handle, "get_context")


def test_handles_take_weak_references(loop):
    # asyncio's Handle and TimerHandle take weak references; a weakref's
    # callback runs when the last reference goes, and a handle freed and
    # made again starts with none.
    import gc
    import weakref

    died = []
    for make in (lambda: loop.call_soon(lambda: None),
                 lambda: loop.call_later(60, lambda: None)):
        for _ in range(3):
            handle = make()
            ref = weakref.ref(handle, lambda r: died.append(r))
            assert ref() is handle
            assert weakref.getweakrefcount(handle) == 1
            handle.cancel()
            run_once(loop)
            del handle
            gc.collect()
            assert ref() is None
    assert len(died) == 6


def test_handle_get_context_default_is_a_copy(loop, loop_name):
    var = contextvars.ContextVar("var", default="default")
    token = var.set("at-schedule")
    try:
        h = loop.call_soon(print)
        _require_get_context(h, loop_name)
        ctx = h.get_context()
        assert isinstance(ctx, contextvars.Context)
        assert ctx[var] == "at-schedule"
        var.set("changed")
        assert ctx[var] == "at-schedule"
        h.cancel()
    finally:
        var.reset(token)


# -- contexts ------------------------------------------------------------------

@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
def test_handle_get_context_explicit(loop, loop_name, scheduler):
    ctx = contextvars.Context()
    h = SCHEDULERS[scheduler](loop, print, context=ctx)
    _require_get_context(h, loop_name)
    assert h.get_context() is ctx
    h.cancel()
    assert h.get_context() is ctx  # cancel() does not drop the context


@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
def test_context_kwarg(loop, scheduler):
    var = contextvars.ContextVar("var", default="default")
    ctx = contextvars.Context()
    ctx.run(var.set, "in-ctx")
    seen = []

    def cb():
        seen.append(var.get())
        var.set("mutated")
        loop.stop()

    SCHEDULERS[scheduler](loop, cb, context=ctx)
    run_forever(loop)
    assert seen == ["in-ctx"]
    # The mutation happened inside ctx, not in the caller's context.
    assert var.get() == "default"
    assert ctx[var] == "mutated"


@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
def test_default_context_is_copied_at_call_time(loop, scheduler):
    var = contextvars.ContextVar("var", default="default")
    token = var.set("at-schedule")
    seen = []

    def cb():
        seen.append(var.get())
        var.set("mutated-in-callback")
        loop.stop()

    try:
        SCHEDULERS[scheduler](loop, cb)
        var.set("after-schedule")
        run_forever(loop)
        assert seen == ["at-schedule"]
        assert var.get() == "after-schedule"
    finally:
        var.reset(token)


def test_each_callback_gets_its_own_context_copy(loop):
    var = contextvars.ContextVar("var", default=0)
    seen = []

    def cb():
        seen.append(var.get())
        var.set(var.get() + 1)

    for _ in range(3):
        loop.call_soon(cb)
    run_once(loop)
    assert seen == [0, 0, 0]


def test_shared_explicit_context_accumulates(loop):
    var = contextvars.ContextVar("var", default=0)
    ctx = contextvars.Context()
    seen = []

    def cb():
        seen.append(var.get())
        var.set(var.get() + 1)

    for _ in range(3):
        loop.call_soon(cb, context=ctx)
    run_once(loop)
    assert seen == [0, 1, 2]
    assert ctx[var] == 3


# -- exceptions in callbacks ------------------------------------------------------

def test_exception_in_callback_goes_to_handler(loop):
    contexts = collect_exceptions(loop)
    exc = ValueError("boom")
    calls = []

    def bad():
        raise exc

    handle = loop.call_soon(bad)
    loop.call_soon(calls.append, "after")
    loop.call_later(0.01, calls.append, "timer")
    loop.call_later(0.02, loop.stop)
    run_forever(loop)
    assert calls == ["after", "timer"]
    assert len(contexts) == 1
    lp, ctx = contexts[0]
    assert lp is loop
    assert ctx["message"].startswith("Exception in callback")
    assert ctx["exception"] is exc
    assert ctx["handle"] is handle


class _CustomBaseException(BaseException):
    pass


@pytest.mark.parametrize("exc_type", [asyncio.CancelledError, GeneratorExit, _CustomBaseException],
                         ids=["CancelledError", "GeneratorExit", "custom-BaseException"])
def test_base_exceptions_other_than_exit_go_to_handler(loop, exc_type):
    # Only SystemExit and KeyboardInterrupt escape from a callback.
    contexts = collect_exceptions(loop)
    calls = []

    def bad():
        raise exc_type()

    handle = loop.call_soon(bad)
    loop.call_soon(calls.append, "after")
    run_once(loop)
    assert calls == ["after"]
    assert len(contexts) == 1
    assert isinstance(contexts[0][1]["exception"], exc_type)
    assert contexts[0][1]["handle"] is handle


def test_exception_context_has_source_traceback_in_debug(loop):
    loop.set_debug(True)
    contexts = collect_exceptions(loop)
    loop.call_soon(lambda: 1 / 0)
    run_once(loop)
    assert len(contexts) == 1
    tb = contexts[0][1].get("source_traceback")
    assert tb, contexts[0][1]
    # The traceback ends at the line that scheduled the callback (this test).
    assert any(frame.name == "test_exception_context_has_source_traceback_in_debug" for frame in tb)


@pytest.mark.parametrize("kind", ["call_soon", "call_later"])
def test_source_traceback_in_debug_only(loop, kind):
    def schedule():
        if kind == "call_soon":
            return loop.call_soon(print)
        return loop.call_later(10, print)

    handle = schedule()
    assert handle._source_traceback is None
    assert "created at" not in repr(handle)
    handle.cancel()
    loop.set_debug(True)
    handle = schedule()
    tb = handle._source_traceback
    assert tb and tb[-1].name == "schedule"
    assert f"created at {tb[-1].filename}:{tb[-1].lineno}" in repr(handle)
    # Kept while the handle lives, also after it was cancelled.
    handle.cancel()
    assert handle._source_traceback is tb or handle._source_traceback == tb
    assert "created at" in repr(handle)


def test_source_traceback_released_with_its_handle(loop):
    loop.set_debug(True)
    handles = [loop.call_soon(print, i) for i in range(3)] + [loop.call_later(10, print)]
    tbs = [h._source_traceback for h in handles]
    for h in handles:
        h.cancel()
    run_once(loop)
    before = [sys.getrefcount(tb) for tb in tbs]
    del h, handles
    assert [sys.getrefcount(tb) for tb in tbs] == [n - 1 for n in before]


def test_handle_repr(loop):
    def my_callback():
        pass

    h = loop.call_soon(my_callback)
    t = loop.call_later(10, my_callback)
    assert "my_callback" in repr(h)
    assert "my_callback" in repr(t)
    assert "when=" in repr(t)
    h.cancel()
    t.cancel()
    assert "cancelled" in repr(h)
    assert "cancelled" in repr(t)


@pytest.mark.parametrize("debug", [False, True])
def test_callback_args_in_repr_and_error_message(loop, debug):
    # 3.13+ lists the arguments only in debug mode (gh-112997); before 3.13
    # always. Compared against what asyncio's own Handle shows on this Python.
    def failing(*args):
        raise ValueError("boom")

    loop.set_debug(debug)
    contexts = collect_exceptions(loop)
    h = loop.call_soon(failing, 1, "secret")
    t = loop.call_later(10, failing, 2, "secret")
    shown = "secret" in repr(h), "secret" in repr(t)
    run_once(loop)
    t.cancel()
    reference = asyncio.SelectorEventLoop()
    try:
        reference.set_debug(debug)
        expected = "secret" in repr(asyncio.Handle(failing, (1, "secret"), reference))
    finally:
        reference.close()
    assert shown == (expected, expected)
    assert len(contexts) == 1
    assert ("secret" in contexts[0][1]["message"]) is expected


def test_exception_in_timer_callback_goes_to_handler(loop):
    contexts = collect_exceptions(loop)

    def bad():
        raise KeyError("timer")

    handle = loop.call_later(0.001, bad)
    loop.call_later(0.02, loop.stop)
    run_forever(loop)
    assert len(contexts) == 1
    ctx = contexts[0][1]
    assert ctx["message"].startswith("Exception in callback")
    assert isinstance(ctx["exception"], KeyError)
    assert ctx["handle"] is handle


def test_many_failing_callbacks_loop_keeps_running(loop):
    contexts = collect_exceptions(loop)
    for i in range(100):
        loop.call_soon(lambda i=i: 1 / 0)
    assert run(loop, asyncio.sleep(0.01, "alive")) == "alive"
    assert len(contexts) == 100
    assert all(isinstance(c["exception"], ZeroDivisionError) for _, c in contexts)


def test_exception_in_callback_logged_by_default_handler(loop, caplog):
    exc = RuntimeError("logged boom")

    def bad_callback():
        raise exc

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        loop.call_soon(bad_callback)
        run_once(loop)
    records = [r for r in caplog.records if r.name == "asyncio"]
    assert len(records) == 1
    assert records[0].levelno == logging.ERROR
    lines = records[0].getMessage().splitlines()
    assert lines[0].startswith("Exception in callback")
    assert "bad_callback" in lines[0]
    # The default handler also prints the handle, which names the callback.
    handle_lines = [ln for ln in lines if ln.startswith("handle: ")]
    assert len(handle_lines) == 1 and "bad_callback" in handle_lines[0], lines
    assert records[0].exc_info[1] is exc


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit])
def test_base_exception_in_callback_propagates_from_run_forever(loop, exc_type):
    contexts = collect_exceptions(loop)
    calls = []

    def bad():
        raise exc_type()

    loop.call_soon(calls.append, "before")
    loop.call_soon(bad)
    loop.call_soon(calls.append, "after")
    with pytest.raises(exc_type):
        run_forever(loop)
    assert not loop.is_running()
    assert calls == ["before"]
    assert contexts == []
    # The loop is still usable and the remaining callback was not lost.
    run_once(loop)
    assert calls == ["before", "after"]


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit])
def test_base_exception_in_callback_propagates_from_run_until_complete(loop, exc_type):
    def bad():
        raise exc_type()

    fut = loop.create_future()
    loop.call_soon(bad)
    with pytest.raises(exc_type):
        run(loop, fut)
    assert not loop.is_running()
    loop.call_soon(fut.set_result, "finished")
    assert run(loop, fut) == "finished"


# -- exception handler API ---------------------------------------------------------

def test_set_get_exception_handler(loop):
    assert loop.get_exception_handler() is None

    def handler(lp, ctx):
        pass

    loop.set_exception_handler(handler)
    assert loop.get_exception_handler() is handler
    loop.set_exception_handler(None)
    assert loop.get_exception_handler() is None
    with pytest.raises(TypeError, match="A callable object or None is expected"):
        loop.set_exception_handler(1)
    assert loop.get_exception_handler() is None


def test_call_exception_handler_with_custom_handler(loop):
    contexts = collect_exceptions(loop)
    context = {"message": "custom", "exception": ValueError("x"), "extra": 42}
    loop.call_exception_handler(context)
    assert len(contexts) == 1
    lp, got = contexts[0]
    assert lp is loop
    assert got == context


def test_call_exception_handler_default_logs(loop, caplog):
    exc = ValueError("the exception")
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        loop.call_exception_handler({"message": "hello from test", "exception": exc})
    records = [r for r in caplog.records if r.name == "asyncio"]
    assert len(records) == 1
    assert records[0].levelno == logging.ERROR
    assert records[0].getMessage().startswith("hello from test")
    assert records[0].exc_info[1] is exc


def test_default_exception_handler_direct_call(loop, caplog):
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        loop.default_exception_handler({"message": "direct call", "custom_key": "custom_value"})
    records = [r for r in caplog.records if r.name == "asyncio"]
    assert len(records) == 1
    text = records[0].getMessage()
    assert text.startswith("direct call")
    assert "custom_key: 'custom_value'" in text


def test_custom_handler_can_delegate_to_default(loop, caplog):
    seen = []

    def handler(lp, ctx):
        seen.append(ctx["message"])
        lp.default_exception_handler(ctx)

    loop.set_exception_handler(handler)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        loop.call_soon(lambda: 1 / 0)
        run_once(loop)
    assert len(seen) == 1 and seen[0].startswith("Exception in callback")
    records = [r for r in caplog.records if r.name == "asyncio"]
    assert len(records) == 1
    assert isinstance(records[0].exc_info[1], ZeroDivisionError)


def test_failing_exception_handler_is_logged(loop, caplog):
    def handler(lp, ctx):
        raise RuntimeError("handler failed")

    loop.set_exception_handler(handler)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        loop.call_soon(lambda: 1 / 0)
        loop.call_soon(loop.stop)
        run_forever(loop)
    messages = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert any("Unhandled error in exception handler" in m for m in messages), messages
    assert not loop.is_running()


# -- argument checking ------------------------------------------------------------

def test_call_soon_without_callback(loop):
    with pytest.raises(TypeError):
        loop.call_soon()


def test_call_soon_unknown_kwarg(loop):
    with pytest.raises(TypeError):
        loop.call_soon(print, foo=1)
    with pytest.raises(TypeError):
        loop.call_soon_threadsafe(print, foo=1)
    with pytest.raises(TypeError):
        loop.call_later(0, print, foo=1)
    with pytest.raises(TypeError):
        loop.call_at(0, print, foo=1)


def test_call_later_call_at_missing_callback(loop):
    with pytest.raises(TypeError):
        loop.call_later(1)
    with pytest.raises(TypeError):
        loop.call_at(1)


@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
def test_debug_rejects_non_callable(loop, scheduler):
    loop.set_debug(True)
    with pytest.raises(TypeError, match="a callable object was expected by"):
        SCHEDULERS[scheduler](loop, 1)


@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
def test_debug_rejects_coroutine_function(loop, scheduler):
    loop.set_debug(True)
    with pytest.raises(TypeError, match="coroutines cannot be used with"):
        SCHEDULERS[scheduler](loop, noop_coro)
    coro = noop_coro()
    try:
        with pytest.raises(TypeError, match="coroutines cannot be used with"):
            SCHEDULERS[scheduler](loop, coro)
    finally:
        coro.close()


def test_non_debug_non_callable_fails_when_run(loop):
    # Without debug mode asyncio accepts the object and fails at call time.
    contexts = collect_exceptions(loop)
    handle = loop.call_soon(1)
    run_once(loop)
    assert len(contexts) == 1
    ctx = contexts[0][1]
    assert isinstance(ctx["exception"], TypeError)
    assert ctx["handle"] is handle


def test_context_set_in_callback_is_seen_by_callbacks_it_schedules(loop):
    """A callback scheduled without context= from inside a callback sees the
    variables that callback set; callbacks scheduled alongside it do not."""
    var = contextvars.ContextVar("chain", default="unset")
    seen = []

    def second(tag):
        seen.append((tag, var.get()))

    def first():
        var.set("set-in-first")
        loop.call_soon(second, "child")

    loop.call_soon(first)
    loop.call_soon(second, "sibling")
    loop.call_soon(second, "sibling2")
    loop.call_later(0.05, loop.stop)
    loop.run_forever()
    assert ("child", "set-in-first") in seen
    assert ("sibling", "unset") in seen
    assert ("sibling2", "unset") in seen
    assert var.get() == "unset"


def test_default_context_follows_the_current_context_across_switches(loop):
    """Callbacks scheduled without context= run in a copy of the context
    current at scheduling time, however often that switches: between the
    thread's own context, contexts entered with Context.run, and other
    threads' contexts."""
    var = contextvars.ContextVar("var", default="unset")
    seen = []

    def record(label):
        seen.append((label, var.get()))

    token = var.set("main")
    try:
        ctx_a = contextvars.copy_context()
        ctx_a.run(var.set, "a")
        ctx_b = contextvars.Context()
        order = []

        def schedule(label, where):
            order.append((label, where))
            if where == "main":
                loop.call_soon(record, label)
            elif where == "a":
                ctx_a.run(loop.call_soon, record, label)
            elif where == "b":
                ctx_b.run(loop.call_soon, record, label)
            else:
                def in_thread():
                    var.set("thread")
                    loop.call_soon_threadsafe(record, label)
                t = threading.Thread(target=in_thread)
                t.start()
                t.join()

        plan = ["main", "a", "main", "a", "a", "b", "thread", "main", "thread", "b", "main"]
        for i, where in enumerate(plan):
            schedule(i, where)
        var.set("main-changed")
        schedule(len(plan), "main")
        loop.call_soon(loop.stop)
        run_forever(loop)
    finally:
        var.reset(token)
    expected_value = {"main": "main", "a": "a", "b": "unset", "thread": "thread"}
    expected = [(i, expected_value[w]) for i, w in enumerate(plan)] + [(len(plan), "main-changed")]
    assert seen == expected


def test_context_sharing_reads_the_current_context_in_place():
    """On the CPython versions it was verified on, the current context is
    read where the thread state keeps it (no copy per call_soon); anywhere
    else zuvrs may fall back to copying, which is slower but equivalent."""
    import zuvrs._zuvrs as native

    assert native.CONTEXT_SHARING in ("read", "copy", "off")
    gil_enabled = getattr(sys, "_is_gil_enabled", lambda: True)()
    if (3, 10) <= sys.version_info[:2] <= (3, 13) and gil_enabled:
        assert native.CONTEXT_SHARING == "read"
