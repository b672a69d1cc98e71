"""Child watchers under zuvrs.EventLoopPolicy (Python <= 3.13).

zuvrs loops watch their own children, but a process that calls
zuvrs.install() may also run stock asyncio loops (a server that builds its
own loop, a library's helper thread): up to 3.12 those take the policy's
child watcher for their subprocesses. The policy keeps one as asyncio's Unix
policy does. Every test runs the same body under asyncio's default policy
("asyncio") and under zuvrs's ("zuvrs"): see the ``flavor`` fixture.
"""

import asyncio
import subprocess
import sys
import threading
import warnings

import pytest
from _support import PY312, PY314, TIMEOUT, policy_restored

SH = "/bin/sh"

needs_watchers = pytest.mark.skipif(PY314, reason="child watchers were removed in Python 3.14")


@pytest.fixture
def installed(flavor):
    """The flavor's policy installed (zuvrs.install() for zuvrs), restored after."""
    with policy_restored():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            flavor.install()
            policy = asyncio.get_event_loop_policy()
        yield policy
        # Do not leak a watcher's threads or pidfds into later tests.
        watcher = getattr(policy, "_watcher", None)
        if watcher is not None:
            watcher.close()


async def _echo_child(text):
    proc = await asyncio.create_subprocess_exec(
        SH, "-c", f"echo {text}; exit 3", stdout=subprocess.PIPE
    )
    out, _ = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    return out, proc.returncode


def _quiet(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return fn(*args)


def test_stock_loop_subprocess_main_thread(installed):
    # Up to 3.12 asyncio's loop asks the policy for its watcher (with zuvrs
    # installed this was None: TypeError); 3.13+ it watches by itself.
    loop = asyncio.SelectorEventLoop()
    try:
        asyncio.set_event_loop(loop)
        assert loop.run_until_complete(_echo_child("stock")) == (b"stock\n", 3)
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def test_stock_loop_subprocess_not_set_as_current(installed):
    # A server running its own loop without set_event_loop (asyncio.Runner
    # with a loop_factory does the same).
    loop = asyncio.SelectorEventLoop()
    try:
        assert loop.run_until_complete(_echo_child("unset")) == (b"unset\n", 3)
    finally:
        loop.close()


def test_stock_loop_subprocess_in_thread(installed):
    results = []

    def worker():
        loop = asyncio.SelectorEventLoop()
        try:
            results.append(loop.run_until_complete(_echo_child("thread")))
        except BaseException as exc:  # reported below
            results.append(exc)
        finally:
            loop.close()

    t = threading.Thread(target=worker)
    t.start()
    t.join(TIMEOUT * 2)
    assert not t.is_alive()
    assert results == [(b"thread\n", 3)]


def test_stock_and_zuvrs_loops_side_by_side(installed, loop_factory):
    # The installed policy's loop (zuvrs under zuvrs.install()) as the main
    # thread's loop, and a stock loop in a thread, both spawning children.
    main_loop = loop_factory()
    results = []

    def worker():
        loop = asyncio.SelectorEventLoop()
        try:
            results.append(loop.run_until_complete(_echo_child("side")))
        finally:
            loop.close()

    try:
        asyncio.set_event_loop(main_loop)
        if not PY314:
            _quiet(asyncio.get_child_watcher).attach_loop(main_loop)
        t = threading.Thread(target=worker)
        t.start()
        assert main_loop.run_until_complete(_echo_child("main")) == (b"main\n", 3)
        t.join(TIMEOUT * 2)
        assert results == [(b"side\n", 3)]
    finally:
        asyncio.set_event_loop(None)
        main_loop.close()


@needs_watchers
def test_get_child_watcher_is_a_stdlib_watcher(installed, loop_factory):
    watcher = _quiet(asyncio.get_child_watcher)
    assert watcher is not None
    assert watcher is _quiet(asyncio.get_child_watcher)
    assert watcher is _quiet(installed.get_child_watcher)
    # The class asyncio's own policy picks on this Python.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        reference = asyncio.DefaultEventLoopPolicy()
        expected = type(reference.get_child_watcher())
        reference.get_child_watcher().close()
    assert type(watcher) is expected
    for lp in (asyncio.SelectorEventLoop(), loop_factory()):
        try:
            watcher.attach_loop(lp)
            with watcher:
                assert watcher.is_active()
        finally:
            lp.close()
    watcher.attach_loop(None)


@needs_watchers
def test_watcher_attached_by_set_event_loop(installed, loop_factory):
    from asyncio import unix_events

    attached = []

    with warnings.catch_warnings():
        # 3.12+: subclassing a child watcher is deprecated.
        warnings.simplefilter("ignore", DeprecationWarning)

        class Recording(unix_events.ThreadedChildWatcher):
            def attach_loop(self, loop):
                attached.append(loop)
                super().attach_loop(loop)

            def close(self):
                attached.append("closed")
                super().close()

        first = Recording()
        second = Recording()
        installed.set_child_watcher(first)
    lp = loop_factory()
    try:
        asyncio.set_event_loop(lp)
        asyncio.set_event_loop(None)
        # From another thread set_event_loop does not attach.
        t = threading.Thread(target=asyncio.set_event_loop, args=(lp,))
        t.start()
        t.join()
        _quiet(installed.set_child_watcher, second)
        assert _quiet(installed.get_child_watcher) is second
        _quiet(installed.set_child_watcher, None)
    finally:
        lp.close()
    assert attached == [lp, None, "closed", "closed"]


@needs_watchers
def test_set_child_watcher_checks_its_argument(installed):
    if not __debug__:
        pytest.skip("asyncio checks with assert")
    with pytest.raises(AssertionError):
        _quiet(installed.set_child_watcher, object())


def _recorded(fn, *args):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args)
    return result, [(w.category, str(w.message), w.filename) for w in caught]


@needs_watchers
def test_deprecation_warnings(installed):
    watcher, got = _recorded(asyncio.get_child_watcher)
    _, got_policy = _recorded(installed.get_child_watcher)
    _, set_warnings = _recorded(installed.set_child_watcher, watcher)
    if PY312:
        assert got == [
            (
                DeprecationWarning,
                "'get_child_watcher' is deprecated as of Python 3.12 and will be removed in Python 3.14.",
                asyncio.events.__file__,
            )
        ]
        assert got_policy == [
            (
                DeprecationWarning,
                "'get_child_watcher' is deprecated as of Python 3.12 and will be removed in Python 3.14.",
                __file__,
            )
        ]
        assert set_warnings == [
            (
                DeprecationWarning,
                "'set_child_watcher' is deprecated as of Python 3.12 and will be removed in Python 3.14.",
                __file__,
            )
        ]
    else:
        assert got == got_policy == set_warnings == []


def test_child_watcher_api_present_as_in_asyncio(installed):
    # 3.14 removed child watchers from the policy as from asyncio.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        reference = asyncio.DefaultEventLoopPolicy()
    for name in ("get_child_watcher", "set_child_watcher"):
        assert hasattr(installed, name) == hasattr(reference, name)
    assert hasattr(asyncio, "get_child_watcher") == (sys.version_info < (3, 14))


@needs_watchers
def test_zuvrs_loops_do_not_use_the_watcher():
    # zuvrs loops watch their own children (pidfds): a watcher that records
    # its use is never asked.
    from asyncio import unix_events

    import zuvrs

    calls = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)

        class Recording(unix_events.ThreadedChildWatcher):
            def add_child_handler(self, *args):
                calls.append(args)
                super().add_child_handler(*args)

    with policy_restored():
        zuvrs.install()
        policy = asyncio.get_event_loop_policy()
        _quiet(policy.set_child_watcher, Recording())
        lp = zuvrs.new_event_loop()
        try:
            asyncio.set_event_loop(lp)
            assert lp.run_until_complete(_echo_child("own")) == (b"own\n", 3)
        finally:
            asyncio.set_event_loop(None)
            lp.close()
            _quiet(policy.set_child_watcher, None)
    assert calls == []
