import asyncio
import faulthandler
import os
import signal
import sys
import types
import warnings

import pytest

# Make the shared helpers importable under any --import-mode.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from _support import LOOP_NAMES, LoopFactory  # noqa: E402

# A hard per-test watchdog: a loop that deadlocks inside native code cannot be
# interrupted by the Guard timers, so dump every thread's stack and exit.
WATCHDOG_SECONDS = 120


def pytest_addoption(parser):
    parser.addoption(
        "--zuvrs-only", action="store_true",
        help="deselect the stdlib loop's half of the parity tests (a run that checks another build of "
             "zuvrs, such as the debug build: that half tests nothing of it)",
    )


def _on_the_stdlib_loop_only(item):
    """A parity test's stdlib half: run on asyncio's loop, with asyncio's
    streams (the native streams on asyncio's loop are zuvrs code)."""
    params = getattr(item, "callspec", None)
    params = params.params if params else {}
    loop = params.get("loop_factory", params.get("loop_name"))
    return loop == "asyncio" and params.get("streams") != "native"


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--zuvrs-only"):
        return
    kept, dropped = [], []
    for item in items:
        (dropped if _on_the_stdlib_loop_only(item) else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(autouse=True)
def _watchdog(request):
    if request.config.getini("faulthandler_timeout"):
        yield  # pytest's own faulthandler watchdog is configured
        return
    faulthandler.dump_traceback_later(WATCHDOG_SECONDS, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.fixture
def sigint_default():
    """SIGINT handled by Python's default handler (KeyboardInterrupt) during
    the test, as in an interpreter started from an interactive shell.

    A suite started from a shell that ignores SIGINT (a background job of a
    non-interactive shell, ``trap '' INT``) inherits SIG_IGN, and Python,
    asyncio and zuvrs all leave an ignored SIGINT ignored, so a test that
    expects ``default_int_handler`` must set it. The disposition the test
    found is restored afterwards.
    """
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        # None: a handler not installed from Python, which cannot be put back.
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)


@pytest.fixture(params=LOOP_NAMES)
def loop_factory(request):
    """A zero-argument callable making a new loop of the kind under test."""
    if request.param == "zuvrs":
        pytest.importorskip("zuvrs")
    return LoopFactory(request.param)


@pytest.fixture
def loop_name(loop_factory):
    return loop_factory.name


@pytest.fixture
def loop(loop_factory):
    lp = loop_factory()
    try:
        yield lp
    finally:
        if not lp.is_closed():
            lp.close()
        asyncio.set_event_loop(None)


@pytest.fixture
def flavor(loop_name):
    """The module-level API of the loop under test, uvloop style.

    For asyncio the equivalents are the selector loop, the default policy
    and asyncio.run, so API tests can compare zuvrs against them.
    """
    if loop_name == "asyncio":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            policy_cls = asyncio.DefaultEventLoopPolicy

        def install():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                asyncio.set_event_loop_policy(policy_cls())

        return types.SimpleNamespace(
            name="asyncio",
            Loop=asyncio.SelectorEventLoop,
            new_event_loop=asyncio.SelectorEventLoop,
            EventLoopPolicy=policy_cls,
            install=install,
            run=asyncio.run,
        )
    import zuvrs

    return types.SimpleNamespace(
        name="zuvrs",
        Loop=zuvrs.Loop,
        new_event_loop=zuvrs.new_event_loop,
        EventLoopPolicy=zuvrs.EventLoopPolicy,
        install=zuvrs.install,
        run=zuvrs.run,
    )
