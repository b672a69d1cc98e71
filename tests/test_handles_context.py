"""The context a callback runs in, when the callback takes it or lets go of it.

A callback scheduled without ``context=`` may run in a snapshot zuvrs shares
between handles (src/handles/context.rs). These run the same bodies on
asyncio and zuvrs: a callback that asks its own handle for its context
(which gives the handle a private copy), schedules more callbacks (which
replaces the loop's snapshot), sets a ContextVar, drops the context or the
handle, and collects garbage, must see what asyncio's callbacks see, and
must leave the thread in a live context (a zuvrs regression: the snapshot
could be left as the thread's context after its last reference was gone).

The loop is stopped from the callbacks themselves, and the guard timer runs
in a context of its own, so that nothing else holds the snapshot.
"""

import contextvars
import gc

import pytest
from _support import TIMEOUT

var = contextvars.ContextVar("var", default="unset")


def context_of(handle):
    """The handle's context (asyncio's get_context() is 3.12+)."""
    get = getattr(handle, "get_context", None)
    return get() if get is not None else handle._context


def run_until_stopped(loop):
    guard = loop.call_later(TIMEOUT, loop.stop, context=contextvars.Context())
    try:
        loop.run_forever()
    finally:
        guard.cancel()


SCHEDULE = ["call_soon", "call_later", "call_soon_threadsafe"]


def schedule(loop, how, cb, *args):
    if how == "call_later":
        return loop.call_later(0, cb, *args)
    return getattr(loop, how)(cb, *args)


@pytest.mark.parametrize("how", SCHEDULE)
@pytest.mark.parametrize("set_var", [False, True], ids=["get", "set"])
@pytest.mark.parametrize("keep", ["keep_ctx", "drop_ctx", "drop_handle", "gc"])
def test_callback_takes_its_context_then_schedules(loop, how, set_var, keep):
    seen = []
    kept = []
    holder = {}

    def later():
        seen.append(("later", var.get()))
        loop.stop()

    def cb():
        if set_var:
            var.set("in-cb")
        ctx = context_of(holder["h"])
        schedule(loop, how, later)
        seen.append(("cb", var.get(), ctx.get(var, "missing")))
        if keep == "keep_ctx":
            kept.append(ctx)
        del ctx
        if keep in ("drop_handle", "gc"):
            holder.clear()
        if keep == "gc":
            gc.collect()

    holder["h"] = schedule(loop, how, cb)
    run_until_stopped(loop)
    inner = "in-cb" if set_var else "unset"
    ctx_value = "in-cb" if set_var else "missing"
    # `later` was scheduled from inside the callback: it runs in a copy of
    # the callback's context.
    assert seen == [("cb", inner, ctx_value), ("later", inner)]
    # The thread is back in a live context of its own.
    assert var.get() == "unset"
    token = var.set("outside")
    assert var.get() == "outside"
    assert contextvars.copy_context().get(var) == "outside"
    var.reset(token)
    if keep == "keep_ctx":
        assert kept[0].get(var, "missing") == ctx_value


@pytest.mark.parametrize("set_var", [False, True], ids=["get", "set"])
def test_many_callbacks_take_their_contexts(loop, set_var):
    """Each of many callbacks sharing one snapshot privatises it while running."""
    seen = []
    handles = []
    n = 50

    def cb(i):
        if set_var:
            var.set(i)
        ctx = context_of(handles[i])
        seen.append((i, var.get(), ctx.get(var, "missing")))
        loop.call_soon(seen.append, ("next", i, var.get()))
        handles[i] = None
        if i == n - 1:
            loop.call_soon(loop.stop)

    for i in range(n):
        handles.append(loop.call_soon(cb, i))
    run_until_stopped(loop)
    cbs = [s for s in seen if s[0] != "next"]
    nexts = [s for s in seen if s[0] == "next"]
    if set_var:
        assert cbs == [(i, i, i) for i in range(n)]
        assert nexts == [("next", i, i) for i in range(n)]
    else:
        assert cbs == [(i, "unset", "missing") for i in range(n)]
        assert nexts == [("next", i, "unset") for i in range(n)]
    assert var.get() == "unset"


def test_handle_dropped_before_it_runs(loop):
    """A handle nobody holds (the loop's reference only) takes its context."""
    seen = []
    box = []

    def cb():
        var.set("cb")
        box.append(contextvars.copy_context())
        loop.call_later(0, after)

    def after():
        seen.append((var.get(), box[0].get(var)))
        box.clear()
        gc.collect()
        loop.stop()

    loop.call_soon(cb)
    gc.collect()
    run_until_stopped(loop)
    assert seen == [("cb", "cb")]
    assert var.get() == "unset"


def test_context_taken_after_the_run(loop):
    """get_context() once the callback has run: the handle's own context."""
    done = []

    def cb():
        done.append(var.get())
        loop.stop()

    token = var.set("before")
    try:
        h = loop.call_soon(cb)
        var.set("changed")
        run_until_stopped(loop)
        ctx = context_of(h)
        assert done == ["before"]
        assert ctx.get(var) == "before"
        assert ctx is context_of(h)
        # Setting a variable in it does not reach callbacks scheduled since.
        ctx.run(var.set, "in-ctx")
        loop.call_soon(lambda: (done.append(var.get()), loop.stop()))
        run_until_stopped(loop)
        assert done == ["before", "changed"]
    finally:
        var.reset(token)


@pytest.mark.parametrize("how", SCHEDULE)
def test_a_sibling_handles_context_taken_during_a_run(loop, how):
    """A callback that sets a variable and then asks another pending
    handle (scheduled from the same context) for its context gets that
    handle's context as it was scheduled: what the running callback set is
    its own, and neither the copy nor the sibling's run sees it."""
    seen = {}
    handles = {}

    def first():
        var.set("first")
        ctx = context_of(handles["second"])
        seen["copy"] = ctx.get(var, "missing")
        seen["in_first"] = var.get()

    def second():
        seen["second"] = var.get()
        loop.stop()

    handles["first"] = schedule(loop, how, first)
    handles["second"] = schedule(loop, how, second)
    run_until_stopped(loop)
    assert seen == {"copy": "missing", "in_first": "first", "second": "unset"}
    assert var.get() == "unset"


@pytest.mark.parametrize("how", SCHEDULE)
@pytest.mark.parametrize("sibling", [False, True], ids=["alone", "sibling"])
def test_own_context_taken_during_the_run_is_the_running_one(loop, how, sibling):
    """asyncio's handle runs its callback in the handle's context, so the
    context a callback takes from its own handle is the one it runs in:
    what the callback sets afterwards shows in it, during the run and
    after; a sibling scheduled from the same context sees none of it."""
    seen = {}
    handles = {}

    def cb():
        var.set("before")
        ctx = context_of(handles["cb"])
        seen["taken"] = ctx.get(var, "missing")
        var.set("after")
        seen["live"] = ctx.get(var, "missing")
        seen["same"] = ctx is context_of(handles["cb"])
        seen["inside"] = var.get()
        if not sibling:
            loop.call_soon(loop.stop)

    def other():
        seen["sibling"] = var.get()
        loop.stop()

    handles["cb"] = schedule(loop, how, cb)
    if sibling:
        schedule(loop, how, other)
    run_until_stopped(loop)
    expected = {"taken": "before", "live": "after", "same": True, "inside": "after"}
    if sibling:
        expected["sibling"] = "unset"
    assert seen == expected
    assert context_of(handles["cb"]).get(var, "missing") == "after"
    assert var.get() == "unset"
