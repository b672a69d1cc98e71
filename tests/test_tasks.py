"""Futures, tasks, task factories, asyncio primitives, asyncgens, debug mode."""

import asyncio
import contextvars
import gc
import logging
import os
import re
import sys
import threading
import time
import warnings

import pytest
from _support import (
    PY311,
    PY312,
    PY313,
    PY314,
    collect_exceptions,
    loop_type,
    policy_restored,
    run,
    run_once,
)

# -- futures and tasks -------------------------------------------------------------

def test_create_future(loop):
    fut = loop.create_future()
    assert isinstance(fut, asyncio.Future)
    assert fut.get_loop() is loop
    assert not fut.done()
    loop.call_soon(fut.set_result, 7)
    assert run(loop, fut) == 7


def test_create_future_belongs_to_its_loop_wherever_it_is_called(loop_factory):
    """A future is the loop's whether the loop runs, does not run, or
    another loop runs in the thread (or in another thread), and in debug
    mode as out of it."""
    loop = loop_factory()
    other = loop_factory()
    try:
        assert loop.create_future().get_loop() is loop  # not running
        seen = {}

        async def main():
            seen["own"] = loop.create_future().get_loop() is loop
            seen["other"] = other.create_future().get_loop() is other
            box = []
            t = threading.Thread(target=lambda: box.append(loop.create_future().get_loop()))
            t.start()
            t.join()
            seen["thread"] = box[0] is loop
            loop.set_debug(True)
            fut = loop.create_future()
            loop.set_debug(False)
            seen["debug"] = fut.get_loop() is loop and fut._source_traceback is not None

        loop.run_until_complete(main())
        assert seen == {"own": True, "other": True, "thread": True, "debug": True}
        assert loop.create_future().get_loop() is loop  # stopped again
    finally:
        other.close()
        loop.close()


def test_create_future_uses_a_patched_future_class(loop, monkeypatch):
    """create_future makes `asyncio.futures.Future` as the module has it at
    the call, with loop= (asyncio's `futures.Future(loop=self)`)."""
    made = []

    class Recording(asyncio.Future):
        def __init__(self, *, loop=None):
            made.append(loop)
            super().__init__(loop=loop)

    monkeypatch.setattr(asyncio.futures, "Future", Recording)

    async def main():
        return loop.create_future()

    fut = loop.run_until_complete(main())
    assert type(fut) is Recording and made == [loop]
    monkeypatch.delattr(asyncio.futures, "Future")
    with pytest.raises(AttributeError):
        loop.create_future()


def test_create_task_and_future_follow_the_classes_replaced_between_calls(loop, monkeypatch):
    """asyncio looks `tasks.Task` and `futures.Future` up at every call:
    one replaced after earlier calls is made by the next, and asyncio's
    own again once it is put back."""

    class MyTask(asyncio.Task):
        pass

    class MyFuture(asyncio.Future):
        pass

    async def nothing():
        return None

    def made():
        task = loop.create_task(nothing())
        fut = loop.create_future()
        loop.run_until_complete(task)
        return type(task), type(fut)

    default = (asyncio.tasks.Task, asyncio.futures.Future)
    kinds = [made(), made()]
    with monkeypatch.context() as patch:
        patch.setattr(asyncio.tasks, "Task", MyTask)
        patch.setattr(asyncio.futures, "Future", MyFuture)
        kinds += [made(), made()]
    kinds.append(made())
    assert kinds == [default, default, (MyTask, MyFuture), (MyTask, MyFuture), default]


def test_future_done_callbacks_run_via_loop(loop):
    fut = loop.create_future()
    calls = []
    fut.add_done_callback(lambda f: calls.append(("cb", f.result())))
    fut.set_result(1)
    assert calls == []  # scheduled with call_soon, not called synchronously
    run_once(loop)
    assert calls == [("cb", 1)]


async def _two_steps():
    await asyncio.sleep(0)
    return "done"


def test_tasks_schedule_through_a_subclass_call_soon(loop_factory):
    # asyncio's Task and Future call the loop's call_soon: a subclass that
    # defines its own sees every step and done callback.
    seen = []

    class Counting(loop_type(loop_factory)):
        def call_soon(self, callback, *args, context=None):
            seen.append(callback)
            return super().call_soon(callback, *args, context=context)

    lp = Counting()
    try:
        task = lp.create_task(_two_steps())
        task.add_done_callback(lambda t: None)
        assert lp.run_until_complete(task) == "done"
        # the first step, the step after sleep(0), the done callback
        assert len(seen) >= 3
    finally:
        lp.close()


def test_tasks_schedule_through_a_patched_call_soon(loop):
    # mock.patch.object(loop, "call_soon") replaces it for asyncio's C Task
    # too, and the loop works as before once the patch is undone.
    from unittest import mock

    with mock.patch.object(loop, "call_soon", wraps=loop.call_soon) as patched:
        assert run(loop, _two_steps()) == "done"
    calls_then = patched.call_count
    assert calls_then >= 2
    assert run(loop, _two_steps()) == "done"
    assert patched.call_count == calls_then  # the patch is gone


def test_create_task(loop):
    async def coro():
        await asyncio.sleep(0)
        return asyncio.current_task()

    task = loop.create_task(coro())
    assert isinstance(task, asyncio.Task)
    assert task.get_loop() is loop
    assert run(loop, task) is task


def test_create_task_name(loop):
    async def coro():
        return asyncio.current_task().get_name()

    task = loop.create_task(coro(), name="my-task")
    assert task.get_name() == "my-task"
    assert run(loop, task) == "my-task"
    unnamed = loop.create_task(coro())
    assert re.fullmatch(r"Task-\d+", unnamed.get_name())
    run(loop, unnamed)


@pytest.mark.skipif(not PY311, reason="create_task(context=) is 3.11+")
def test_create_task_context(loop):
    var = contextvars.ContextVar("var", default="default")
    ctx = contextvars.Context()
    ctx.run(var.set, "from-ctx")

    async def coro():
        seen = var.get()
        var.set("changed-in-task")
        return seen

    task = loop.create_task(coro(), context=ctx)
    assert run(loop, task) == "from-ctx"
    assert ctx[var] == "changed-in-task"
    assert var.get() == "default"


def test_create_task_copies_current_context(loop):
    var = contextvars.ContextVar("var", default="default")

    async def coro():
        seen = var.get()
        var.set("task-local")
        return seen

    token = var.set("outer")
    try:
        task = loop.create_task(coro())
        var.set("after")
        assert run(loop, task) == "outer"
        assert var.get() == "after"
    finally:
        var.reset(token)


def test_task_cancel(loop):
    started = []

    async def forever():
        started.append(True)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            started.append("cancelled")
            raise

    async def main():
        task = asyncio.ensure_future(forever())
        await asyncio.sleep(0)
        task.cancel("reason")
        with pytest.raises(asyncio.CancelledError):
            await task
        return task.cancelled()

    assert run(loop, main()) is True
    assert started == [True, "cancelled"]


def test_all_tasks_and_current_task(loop):
    async def child():
        await asyncio.sleep(0.01)

    async def main():
        t = asyncio.ensure_future(child())
        tasks = asyncio.all_tasks()
        me = asyncio.current_task()
        await t
        return tasks, me

    tasks, me = run(loop, main())
    assert me in tasks
    assert len(tasks) == 2
    assert asyncio.all_tasks(loop) == set()


def test_task_exception_never_retrieved_reported(loop):
    contexts = collect_exceptions(loop)

    async def fail():
        raise ValueError("never retrieved")

    task = loop.create_task(fail())
    run_once(loop)
    assert task.done()
    del task
    gc.collect()
    assert len(contexts) == 1
    ctx = contexts[0][1]
    assert ctx["message"] == "Task exception was never retrieved"
    assert isinstance(ctx["exception"], ValueError)


# -- task factories -------------------------------------------------------------

def test_set_get_task_factory(loop):
    assert loop.get_task_factory() is None
    calls = []

    def factory(lp, coro):
        calls.append(lp)
        return asyncio.Task(coro, loop=lp)

    loop.set_task_factory(factory)
    assert loop.get_task_factory() is factory

    async def coro():
        return "made"

    task = loop.create_task(coro())
    assert run(loop, task) == "made"
    # run_until_complete of a coroutine goes through create_task too
    assert run(loop, coro()) == "made"
    assert calls == [loop, loop]
    loop.set_task_factory(None)
    assert loop.get_task_factory() is None
    with pytest.raises(TypeError, match="task factory must be a callable or None"):
        loop.set_task_factory(1)


def test_task_factory_receives_kwargs_like_reference(loop):
    received = []

    def factory(lp, coro, **kwargs):
        received.append((lp, dict(kwargs)))
        return asyncio.Task(coro, loop=lp, **kwargs)

    loop.set_task_factory(factory)

    async def coro():
        return "x"

    task = loop.create_task(coro())
    run(loop, task)
    named = loop.create_task(coro(), name="named")
    run(loop, named)
    assert named.get_name() == "named"
    assert all(lp is loop for lp, _ in received)
    if PY314:
        assert [kw for _, kw in received] == [{}, {"name": "named"}]
    elif not PY313:
        # 3.10-3.12: the factory gets (loop, coro); name is set afterwards.
        assert [kw for _, kw in received] == [{}, {}]
    else:
        assert received[0][1] == {}

    if PY311:
        ctx = contextvars.Context()
        with_ctx = loop.create_task(coro(), context=ctx)
        run(loop, with_ctx)
        assert received[-1][1]["context"] is ctx
        if not PY313:
            assert received[-1][1] == {"context": ctx}


@pytest.mark.skipif(not PY312, reason="eager tasks are 3.12+")
def test_eager_task_factory(loop):
    loop.set_task_factory(asyncio.eager_task_factory)
    order = []

    async def eager():
        order.append("eager-body")
        return "eager-result"

    async def main():
        task = asyncio.get_running_loop().create_task(eager())
        order.append("after-create")
        # Ran to completion synchronously inside create_task.
        return task.done(), await task

    assert run(loop, main()) == (True, "eager-result")
    assert order == ["eager-body", "after-create"]


@pytest.mark.skipif(not PY312, reason="eager tasks are 3.12+")
def test_eager_task_that_blocks(loop):
    loop.set_task_factory(asyncio.eager_task_factory)

    async def blocks():
        await asyncio.sleep(0.01)
        return "later"

    async def main():
        task = asyncio.ensure_future(blocks())
        assert not task.done()
        return await task

    assert run(loop, main()) == "later"


# -- asyncio primitives on the loop ---------------------------------------------------

def test_gather(loop):
    async def value(x, delay):
        await asyncio.sleep(delay)
        return x

    async def fail():
        raise ValueError("in gather")

    async def main():
        results = await asyncio.gather(value(1, 0.02), value(2, 0.0), value(3, 0.01))
        mixed = await asyncio.gather(value(4, 0), fail(), return_exceptions=True)
        return results, mixed

    results, mixed = run(loop, main())
    assert results == [1, 2, 3]
    assert mixed[0] == 4 and isinstance(mixed[1], ValueError)


def test_wait_for(loop):
    async def main():
        fast = await asyncio.wait_for(asyncio.sleep(0.001, "fast"), 1)
        t0 = time.monotonic()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.sleep(10), 0.05)
        return fast, time.monotonic() - t0

    fast, elapsed = run(loop, main())
    assert fast == "fast"
    assert 0.045 <= elapsed < 1.0


def test_wait_first_completed(loop):
    async def main():
        slow = asyncio.ensure_future(asyncio.sleep(10))
        quick = asyncio.ensure_future(asyncio.sleep(0.01, "q"))
        done, pending = await asyncio.wait({slow, quick}, return_when=asyncio.FIRST_COMPLETED)
        slow.cancel()
        return done == {quick}, pending == {slow}, quick.result()

    assert run(loop, main()) == (True, True, "q")


def test_shield(loop):
    async def main():
        inner = asyncio.ensure_future(asyncio.sleep(0.02, "inner"))
        outer = asyncio.shield(inner)
        outer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await outer
        return await inner

    assert run(loop, main()) == "inner"


@pytest.mark.skipif(not PY311, reason="asyncio.timeout is 3.11+")
def test_timeout(loop):
    async def main():
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await asyncio.sleep(10)
        elapsed = time.monotonic() - t0
        async with asyncio.timeout(1):
            ok = await asyncio.sleep(0, "ok")
        async with asyncio.timeout_at(asyncio.get_running_loop().time() + 1) as cm:
            when = cm.when()
        return elapsed, ok, when

    elapsed, ok, when = run(loop, main())
    assert 0.045 <= elapsed < 1.0
    assert ok == "ok"
    assert when is not None


@pytest.mark.skipif(not PY311, reason="TaskGroup is 3.11+")
def test_task_group(loop):
    async def value(x):
        await asyncio.sleep(0.001 * x)
        return x

    async def fail():
        await asyncio.sleep(0.005)
        raise ValueError("tg")

    async def main():
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(value(i)) for i in range(5)]
        results = [t.result() for t in tasks]
        cancelled = []

        async def victim():
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                cancelled.append(True)
                raise

        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(victim())
                tg.create_task(fail())
        except BaseException as eg:  # ExceptionGroup on 3.11+
            return results, eg, cancelled
        return results, None, cancelled

    results, eg, cancelled = run(loop, main())
    assert results == [0, 1, 2, 3, 4]
    assert type(eg).__name__ == "ExceptionGroup"
    assert [type(e) for e in eg.exceptions] == [ValueError]
    assert cancelled == [True]


def test_queue(loop):
    async def main():
        q = asyncio.Queue(maxsize=3)
        got = []

        async def producer():
            for i in range(20):
                await q.put(i)
            await q.put(None)

        async def consumer():
            while (item := await q.get()) is not None:
                got.append(item)
                q.task_done()
            q.task_done()

        await asyncio.gather(producer(), consumer())
        await q.join()
        return got

    assert run(loop, main()) == list(range(20))


def test_lock(loop):
    async def main():
        lock = asyncio.Lock()
        inside = 0
        max_inside = 0

        async def worker():
            nonlocal inside, max_inside
            async with lock:
                inside += 1
                max_inside = max(max_inside, inside)
                await asyncio.sleep(0.001)
                inside -= 1

        await asyncio.gather(*(worker() for _ in range(10)))
        return max_inside, lock.locked()

    assert run(loop, main()) == (1, False)


def test_event(loop):
    async def main():
        event = asyncio.Event()
        order = []

        async def waiter(i):
            await event.wait()
            order.append(i)

        tasks = [asyncio.ensure_future(waiter(i)) for i in range(3)]
        await asyncio.sleep(0.01)
        assert order == []
        event.set()
        await asyncio.gather(*tasks)
        return sorted(order)

    assert run(loop, main()) == [0, 1, 2]


def test_semaphore(loop):
    async def main():
        sem = asyncio.Semaphore(3)
        inside = 0
        max_inside = 0

        async def worker():
            nonlocal inside, max_inside
            async with sem:
                inside += 1
                max_inside = max(max_inside, inside)
                await asyncio.sleep(0.002)
                inside -= 1

        await asyncio.gather(*(worker() for _ in range(12)))
        return max_inside

    assert run(loop, main()) == 3


def test_condition(loop):
    async def main():
        cond = asyncio.Condition()
        items = []

        async def consumer():
            async with cond:
                await cond.wait_for(lambda: items)
                return items.pop()

        task = asyncio.ensure_future(consumer())
        await asyncio.sleep(0.001)
        async with cond:
            items.append("item")
            cond.notify()
        return await task

    assert run(loop, main()) == "item"


# -- runners -----------------------------------------------------------------------

@pytest.mark.skipif(not PY311, reason="asyncio.Runner is 3.11+")
def test_runner_with_loop_factory(loop_factory):
    async def main():
        return asyncio.get_running_loop()

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        lp = runner.run(main())
        assert runner.get_loop() is lp
        assert type(lp) is loop_type(loop_factory)
        assert runner.run(asyncio.sleep(0, "second")) == "second"
    assert lp.is_closed()


def test_run_via_policy(loop_factory):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        base = asyncio.DefaultEventLoopPolicy

        class Policy(base):
            def new_event_loop(self):
                return loop_factory()

    async def main():
        return asyncio.get_running_loop()

    with policy_restored():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            asyncio.set_event_loop_policy(Policy())
        lp = asyncio.run(main())
    assert type(lp) is loop_type(loop_factory)
    assert lp.is_closed()


# -- async generators ------------------------------------------------------------------

def _agen_factory(log):
    async def agen():
        try:
            yield 1
            yield 2
        finally:
            log.append("closed")
    return agen


def test_shutdown_asyncgens(loop):
    log = []
    agen = _agen_factory(log)

    async def start():
        g = agen()
        assert await g.__anext__() == 1
        return g

    g = run(loop, start())
    assert log == []
    run(loop, loop.shutdown_asyncgens())
    assert log == ["closed"]
    assert g.ag_frame is None  # finished
    # A second call is a no-op.
    run(loop, loop.shutdown_asyncgens())


def test_asyncgen_after_shutdown_warns(loop):
    log = []
    agen = _agen_factory(log)
    run(loop, loop.shutdown_asyncgens())

    async def start():
        g = agen()
        with pytest.warns(ResourceWarning, match="shutdown_asyncgens"):
            await g.__anext__()
        await g.aclose()

    run(loop, start())
    assert log == ["closed"]


def test_asyncgen_finalizer_hook_runs_aclose(loop):
    log = []
    agen = _agen_factory(log)

    async def main():
        g = agen()
        await g.__anext__()
        del g  # not exhausted: the loop's finalizer hook schedules aclose()
        gc.collect()
        for _ in range(10):
            if log:
                break
            await asyncio.sleep(0)
        return list(log)

    assert run(loop, main()) == ["closed"]


def test_shutdown_asyncgens_reports_errors(loop):
    contexts = collect_exceptions(loop)

    async def bad_agen():
        try:
            yield 1
        finally:
            raise ValueError("in aclose")

    async def start():
        g = bad_agen()
        await g.__anext__()
        return g

    g = run(loop, start())
    run(loop, loop.shutdown_asyncgens())
    assert len(contexts) == 1
    ctx = contexts[0][1]
    assert "asynchronous generator" in ctx["message"]
    assert isinstance(ctx["exception"], ValueError)
    assert ctx["asyncgen"] is g


# -- debug mode ------------------------------------------------------------------

def _default_debug():
    return bool(sys.flags.dev_mode or (
        not sys.flags.ignore_environment and os.environ.get("PYTHONASYNCIODEBUG")))


def test_get_set_debug(loop):
    assert loop.get_debug() is _default_debug()
    loop.set_debug(True)
    assert loop.get_debug() is True
    loop.set_debug(False)
    assert loop.get_debug() is False


def test_slow_callback_duration_default(loop):
    assert loop.slow_callback_duration == 0.1
    loop.slow_callback_duration = 0.25
    assert loop.slow_callback_duration == 0.25


def test_slow_callback_warning_in_debug(loop, caplog):
    loop.set_debug(True)
    loop.slow_callback_duration = 0.02

    def slow():
        time.sleep(0.05)

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        loop.call_soon(slow)
        run_once(loop)
    warnings_ = [r for r in caplog.records if r.name == "asyncio" and r.levelno == logging.WARNING]
    assert len(warnings_) == 1
    assert re.fullmatch(r"Executing .*slow.* took \d+\.\d{3} seconds", warnings_[0].getMessage(), re.S), \
        warnings_[0].getMessage()


def test_slow_task_step_warning_in_debug(loop, caplog):
    loop.set_debug(True)
    loop.slow_callback_duration = 0.02

    async def slow_coro():
        time.sleep(0.05)

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        run(loop, slow_coro())
    messages = [r.getMessage() for r in caplog.records
                if r.name == "asyncio" and r.levelno == logging.WARNING]
    assert any(re.match(r"Executing .*Task.* took \d+\.\d{3} seconds", m, re.S) for m in messages), messages


def test_no_slow_callback_warning_without_debug(loop, caplog):
    loop.set_debug(False)
    loop.slow_callback_duration = 0.01
    with caplog.at_level(logging.WARNING, logger="asyncio"):
        loop.call_soon(time.sleep, 0.03)
        run_once(loop)
    assert [r for r in caplog.records if r.name == "asyncio"] == []


def test_debug_tracks_coroutine_origin(loop):
    # In debug mode, asyncio tracks coroutine origins while running.
    loop.set_debug(True)

    async def main():
        return sys.get_coroutine_origin_tracking_depth()

    assert run(loop, main()) > 0
    assert sys.get_coroutine_origin_tracking_depth() == 0


def _slow_io_warnings(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "asyncio" and r.levelno == logging.WARNING
            and re.match(r"Executing <Handle .*_read_ready.* took \d+\.\d{3} seconds", r.getMessage(), re.S)]


@pytest.mark.parametrize("kind", ["tcp", "pipe", "udp"])
def test_slow_protocol_callback_warning_in_debug(loop, caplog, kind):
    """A protocol callback run by a transport's reading (data_received,
    datagram_received) that takes too long is reported in debug mode, as
    asyncio reports its transport's slow _read_ready."""
    import os
    import socket

    loop.set_debug(True)
    loop.slow_callback_duration = 0.02

    class Slow(asyncio.Protocol):
        def __init__(self):
            self.got = loop.create_future()

        def data_received(self, data):
            time.sleep(0.05)
            if not self.got.done():
                self.got.set_result(data)

        def datagram_received(self, data, addr):
            self.data_received(data)

    async def main():
        if kind == "tcp":
            a, b = socket.socketpair()
            t, p = await loop.create_connection(Slow, sock=a)
            b.send(b"x")
        elif kind == "pipe":
            r, w = os.pipe()
            t, p = await loop.connect_read_pipe(Slow, open(r, "rb", buffering=0))
            os.write(w, b"x")
        else:
            t, p = await loop.create_datagram_endpoint(Slow, local_addr=("127.0.0.1", 0))
            b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            b.sendto(b"x", t.get_extra_info("sockname"))
        assert await asyncio.wait_for(p.got, 5) == b"x"
        t.close()
        if kind == "pipe":
            os.close(w)
        else:
            b.close()
        await asyncio.sleep(0)

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        run(loop, main())
    assert len(_slow_io_warnings(caplog)) == 1, [r.getMessage() for r in caplog.records]
