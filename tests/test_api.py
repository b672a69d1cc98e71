"""Module-level API: install/run/Loop/policy, subclassing, fork.

The ``flavor`` fixture maps the zuvrs API onto its asyncio equivalents
(SelectorEventLoop, DefaultEventLoopPolicy, asyncio.run), so each test runs
against both.  A few tests of zuvrs-only attributes run for zuvrs alone.
"""

import asyncio
import os
import socket
import subprocess
import sys
import threading
import warnings

import pytest
from _support import PY312, PY314, child_script, loop_type, policy_restored, run

# -- policy / install ---------------------------------------------------------

def test_install_sets_policy_and_new_event_loop(flavor):
    with policy_restored():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            flavor.install()
            policy = asyncio.get_event_loop_policy()
        assert isinstance(policy, flavor.EventLoopPolicy)
        lp = asyncio.new_event_loop()
        try:
            assert isinstance(lp, flavor.Loop)
            assert run(lp, asyncio.sleep(0, "ok")) == "ok"
        finally:
            lp.close()


def test_policy_new_event_loop(flavor):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        policy = flavor.EventLoopPolicy()
        assert isinstance(policy, asyncio.AbstractEventLoopPolicy)
    lp = policy.new_event_loop()
    try:
        assert isinstance(lp, flavor.Loop)
        assert not lp.is_running() and not lp.is_closed()
    finally:
        lp.close()


def test_new_event_loop_returns_fresh_loops(flavor):
    a, b = flavor.new_event_loop(), flavor.new_event_loop()
    try:
        assert a is not b
        assert isinstance(a, flavor.Loop) and isinstance(b, flavor.Loop)
    finally:
        a.close()
        b.close()


def test_loop_class_direct_construction(flavor):
    lp = flavor.Loop()
    try:
        assert run(lp, asyncio.sleep(0, 1)) == 1
    finally:
        lp.close()


def test_isinstance_abstract_event_loop(loop):
    assert isinstance(loop, asyncio.AbstractEventLoop)
    assert isinstance(loop, asyncio.BaseEventLoop)


# -- run() --------------------------------------------------------------------

def test_run_returns_result(flavor):
    async def main(x):
        await asyncio.sleep(0.001)
        return x + 1

    assert flavor.run(main(41)) == 42


def test_run_uses_new_loop_of_right_type_and_closes_it(flavor):
    async def main():
        return asyncio.get_running_loop()

    lp = flavor.run(main())
    assert isinstance(lp, flavor.Loop)
    assert lp.is_closed()


@pytest.mark.parametrize("debug", [True, False])
def test_run_debug(flavor, debug):
    async def main():
        return asyncio.get_running_loop().get_debug()

    assert flavor.run(main(), debug=debug) is debug


def test_run_propagates_exception(flavor):
    async def main():
        raise LookupError("from main")

    with pytest.raises(LookupError, match="from main"):
        flavor.run(main())


def test_run_cancels_leftover_tasks_and_shuts_down_asyncgens(flavor):
    log = []

    async def leftover():
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            log.append("leftover cancelled")
            raise

    async def agen():
        try:
            yield 1
            yield 2
        finally:
            log.append("agen closed")

    async def main():
        asyncio.ensure_future(leftover())
        g = agen()
        await g.__anext__()
        await asyncio.sleep(0)
        main.g = g  # keep it alive past main()
        return "main done"

    assert flavor.run(main()) == "main done"
    assert sorted(log) == ["agen closed", "leftover cancelled"]


def test_run_shuts_down_default_executor(flavor):
    threads = []

    async def main():
        def work():
            threads.append(threading.current_thread())

        await asyncio.get_running_loop().run_in_executor(None, work)

    flavor.run(main())
    assert threads and not threads[0].is_alive()


def test_run_from_running_loop_raises(flavor):
    async def inner():
        return 1

    async def main():
        coro = inner()
        try:
            flavor.run(coro)
        except RuntimeError as exc:
            return str(exc)
        finally:
            coro.close()
        return None

    msg = flavor.run(main())
    assert msg is not None and "cannot be called from a running event loop" in msg


@pytest.mark.skipif(PY314, reason="3.14 changed what asyncio.run accepts")
def test_run_rejects_non_coroutine(flavor):
    with pytest.raises(ValueError, match="a coroutine was expected"):
        flavor.run(1)


def test_zuvrs_run_loop_factory():
    """zuvrs.run(main, loop_factory=...) as uvloop.run takes it: the
    factory's loop (a zuvrs.Loop subclass here) runs main; a loop that is
    not a zuvrs loop is refused with TypeError and main is closed."""
    import zuvrs

    class Mine(zuvrs.Loop):
        pass

    async def main():
        return asyncio.get_running_loop()

    lp = zuvrs.run(main(), loop_factory=Mine)
    assert type(lp) is Mine and lp.is_closed()

    coro = main()
    with pytest.raises(TypeError, match="non-zuvrs event loop"):
        zuvrs.run(coro, loop_factory=asyncio.SelectorEventLoop)
    assert coro.cr_frame is None  # closed


def test_run_twice_sequentially(flavor):
    async def main(i):
        await asyncio.sleep(0)
        return i

    assert [flavor.run(main(i)) for i in range(3)] == [0, 1, 2]


@pytest.mark.skipif(not PY312, reason="asyncio.run(loop_factory=) is 3.12+")
def test_stdlib_run_with_loop_factory(loop_factory):
    async def main():
        return asyncio.get_running_loop()

    lp = asyncio.run(main(), loop_factory=loop_factory)
    assert type(lp) is loop_type(loop_factory)
    assert lp.is_closed()


# -- subclassing -------------------------------------------------------------------

def test_loop_subclass(flavor):
    class MyLoop(flavor.Loop):
        def __init__(self):
            super().__init__()
            self.custom_attribute = "set in __init__"

        def extra(self):
            return 42

        def call_soon_twice(self, cb, *args):
            self.call_soon(cb, *args)
            return self.call_soon(cb, *args)

    lp = MyLoop()
    try:
        assert isinstance(lp, flavor.Loop)
        assert isinstance(lp, asyncio.AbstractEventLoop)
        assert lp.extra() == 42
        assert lp.custom_attribute == "set in __init__"
        calls = []
        lp.call_soon_twice(calls.append, "x")
        assert run(lp, asyncio.sleep(0, "ok")) == "ok"
        assert calls == ["x", "x"]
        assert type(lp).__name__ in repr(lp)
    finally:
        lp.close()


def test_loop_subclass_override_is_honoured(flavor):
    created = []

    class MyLoop(flavor.Loop):
        def create_future(self):
            fut = super().create_future()
            created.append(fut)
            return fut

    lp = MyLoop()
    try:
        async def main():
            await asyncio.sleep(0.001)  # asyncio.sleep uses loop.create_future()

        run(lp, main())
        assert created
    finally:
        lp.close()


# -- fork ----------------------------------------------------------------------------

def test_fork_child_runs_new_loop(loop, loop_factory):
    # Use the parent loop first so its state (fds, threads) exists at fork time.
    assert run(loop, asyncio.sleep(0.001, "parent")) == "parent"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads, 3.12+
        pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 1
        try:
            child = loop_factory()
            fut = child.create_future()
            child.call_later(0.01, fut.set_result, "timer")
            child.call_later(5, child.stop)
            ok = child.run_until_complete(fut) == "timer"
            ok = ok and child.run_until_complete(asyncio.sleep(0.001, 7)) == 7
            child.close()
            code = 0 if ok else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status), status
    assert os.WEXITSTATUS(status) == 0
    # The parent loop still works after the fork.
    assert run(loop, asyncio.sleep(0.001, "after")) == "after"


# -- zuvrs-only attributes ----------------------------------------------------------------

def test_zuvrs_version():
    zuvrs = pytest.importorskip("zuvrs")
    assert isinstance(zuvrs.__version__, str) and zuvrs.__version__
    try:
        from importlib.metadata import PackageNotFoundError, version
        assert version("zuvrs") == zuvrs.__version__
    except PackageNotFoundError:
        pass


def test_zuvrs_libuv_version():
    zuvrs = pytest.importorskip("zuvrs")
    assert zuvrs.libuv_version()


def test_zuvrs_handle_types():
    zuvrs = pytest.importorskip("zuvrs")
    lp = zuvrs.new_event_loop()
    try:
        h = lp.call_soon(print)
        t = lp.call_later(10, print)
        assert isinstance(h, zuvrs.Handle)
        assert isinstance(t, zuvrs.TimerHandle)
        for handle in (h, t):
            assert handle.get_context() is not None
            assert not handle.cancelled()
            handle.cancel()
            assert handle.cancelled()
        assert isinstance(t.when(), float)
    finally:
        lp.close()


def test_zuvrs_exports():
    zuvrs = pytest.importorskip("zuvrs")
    for name in ("Loop", "new_event_loop", "EventLoopPolicy", "install", "run",
                 "libuv_version", "__version__"):
        assert hasattr(zuvrs, name), name
    assert issubclass(zuvrs.Loop, asyncio.AbstractEventLoop)


def test_child_closing_inherited_loop_leaves_parent_serving(loop):
    # A server and a reader on the parent's loop; the child closes its copy
    # of the loop (the usual reset after fork) and exits. The parent's loop
    # must keep accepting and watching: the kernel objects are shared.
    class Echo(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport = transport

        def data_received(self, data):
            self.transport.write(data)

    async def echo_once(port, payload):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(payload)
        got = await r.readexactly(len(payload))
        w.close()
        await w.wait_closed()
        return got

    server = run(loop, loop.create_server(Echo, "127.0.0.1", 0))
    port = server.sockets[0].getsockname()[1]
    a, b = socket.socketpair()
    seen = []
    loop.add_reader(a.fileno(), lambda: seen.append(a.recv(10)))
    # A connection open across the fork: both of its ends are transports
    # the child's copy of the loop closes.
    reader, writer = run(loop, asyncio.open_connection("127.0.0.1", port))
    try:
        assert run(loop, echo_once(port, b"before")) == b"before"
        writer.write(b"one")
        assert run(loop, asyncio.wait_for(reader.readexactly(3), 5)) == b"one"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads, 3.12+
            pid = os.fork()
        if pid == 0:  # child: never return into pytest
            try:
                loop.close()
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        assert run(loop, echo_once(port, b"after")) == b"after"
        writer.write(b"two")
        assert run(loop, asyncio.wait_for(reader.readexactly(3), 5)) == b"two"
        writer.close()
        run(loop, writer.wait_closed())
        b.send(b"ping")
        run(loop, asyncio.wait_for(_until(lambda: seen), 5))
        assert seen == [b"ping"]
    finally:
        loop.remove_reader(a.fileno())
        a.close()
        b.close()
        server.close()
        run(loop, server.wait_closed())


async def _until(condition):
    while not condition():
        await asyncio.sleep(0.005)


def test_close_with_lookups_in_flight_leaks_nothing(loop_name):
    # 500 lookups still on the resolver's threads when the loop closes: the
    # loop's descriptors are freed and nothing is printed.
    body = """
        import os
        def fds():
            return len(os.listdir("/proc/self/fd"))
        # (libuv makes process-wide descriptors with its first loop: a lock
        # pipe for signals. A first loop makes them before the count.)
        new_loop().close()
        before = fds()
        lp = new_loop()
        for _ in range(500):
            lp.create_task(lp.getaddrinfo("localhost", 80))
        lp.call_soon(lp.stop)
        lp.run_forever()
        lp.close()
        del lp
        import gc, time
        gc.collect()
        deadline = time.monotonic() + 10
        while fds() > before and time.monotonic() < deadline:
            time.sleep(0.05)
        print("fds", before, fds())
    """
    env = dict(os.environ, UV_THREADPOOL_SIZE="1")
    proc = subprocess.run(
        [sys.executable, "-c", child_script(loop_name, body)], capture_output=True, text=True, timeout=60, env=env
    )
    assert proc.returncode == 0, proc.stderr
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("fds")][-1]
    _, before, after = line.split()
    if loop_name == "zuvrs":
        # (The stdlib loop's close() does not wait for its executor threads,
        # which go on resolving: one of their descriptors is sometimes still
        # open here, on every Python. zuvrs frees its own at close.)
        assert int(after) <= int(before), proc.stdout
    assert "open handles" not in proc.stderr and "RuntimeError" not in proc.stderr, proc.stderr
