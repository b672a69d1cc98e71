"""Small helpers shared by the zuvrs parity tests.

Every test in this directory runs the same body on the stdlib selector loop
("asyncio") and on zuvrs ("zuvrs"); asyncio is the reference behaviour.
"""

import asyncio
import contextlib
import gc
import json
import os
import subprocess
import sys
import textwrap
import warnings

PY311 = sys.version_info >= (3, 11)
PY312 = sys.version_info >= (3, 12)
PY313 = sys.version_info >= (3, 13)
PY314 = sys.version_info >= (3, 14)

LOOP_NAMES = ("asyncio", "zuvrs")

# Default guard for anything that could hang.
TIMEOUT = 5.0


class LoopFactory:
    """A callable making a fresh event loop, tagged with the loop's name."""

    def __init__(self, name):
        self.name = name

    def __call__(self):
        if self.name == "asyncio":
            # What asyncio.new_event_loop() returns on Linux under the default
            # policy; spelled out so that a leaked policy (zuvrs.install())
            # can never silently turn the reference loop into a zuvrs loop.
            return asyncio.SelectorEventLoop()
        import zuvrs

        return zuvrs.new_event_loop()

    def __repr__(self):
        return f"LoopFactory({self.name!r})"


async def noop_coro():
    """A coroutine function (for 'coroutines cannot be used with ...' checks)."""


# The four ways to schedule a plain callback, as f(loop, callback, *args, **kw);
# the timer variants use a deadline that is already due.
SCHEDULERS = {
    "call_soon": lambda lp, cb, *args, **kw: lp.call_soon(cb, *args, **kw),
    "call_soon_threadsafe": lambda lp, cb, *args, **kw: lp.call_soon_threadsafe(cb, *args, **kw),
    "call_later": lambda lp, cb, *args, **kw: lp.call_later(0, cb, *args, **kw),
    "call_at": lambda lp, cb, *args, **kw: lp.call_at(lp.time(), cb, *args, **kw),
}


def loop_type(factory):
    """The class of the loops ``factory`` makes."""
    lp = factory()
    lp.close()
    return type(lp)


class Guard:
    """Stop ``loop`` after ``timeout`` seconds so a broken loop cannot hang.

    Used as a context manager around run_forever()/run_until_complete().
    On exit it cancels the guard timer and fails the test if it fired while
    the body completed normally (run_until_complete() already fails on its
    own with 'Event loop stopped before Future completed.').
    """

    def __init__(self, loop, timeout=TIMEOUT):
        self.loop = loop
        self.timeout = timeout
        self.fired = False
        self.handle = None

    def _fire(self):
        self.fired = True
        self.loop.stop()

    def __enter__(self):
        self.handle = self.loop.call_later(self.timeout, self._fire)
        return self

    def __exit__(self, exc_type, exc, tb):
        self.handle.cancel()
        if exc_type is None and self.fired:
            raise AssertionError(f"loop guard fired after {self.timeout}s")
        return False


def run(loop, aw, timeout=TIMEOUT):
    """run_until_complete(aw) with a guard timer."""
    with Guard(loop, timeout):
        return loop.run_until_complete(aw)


def run_forever(loop, timeout=TIMEOUT):
    """run_forever() that must be stopped by the test within ``timeout``."""
    with Guard(loop, timeout):
        loop.run_forever()


def run_once(loop):
    """Run exactly one loop iteration (stop() before run_forever())."""
    loop.stop()
    loop.run_forever()


def collect_exceptions(loop):
    """Install an exception handler that records contexts; return the list."""
    contexts = []
    loop.set_exception_handler(lambda lp, ctx: contexts.append((lp, ctx)))
    return contexts


@contextlib.contextmanager
def policy_restored():
    """Save and restore the global asyncio event loop policy."""
    with warnings.catch_warnings():
        # The policy system is deprecated on 3.14+.
        warnings.simplefilter("ignore", DeprecationWarning)
        saved = asyncio.get_event_loop_policy()
    try:
        yield
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            asyncio.set_event_loop_policy(saved)
            asyncio.set_event_loop(None)


# -- process metrics (Linux) -------------------------------------------------

def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def fd_count():
    return len(os.listdir("/proc/self/fd"))


def gc_object_count():
    gc.collect()
    gc.collect()
    return len(gc.get_objects())


# -- child interpreters --------------------------------------------------------

def child_script(loop_name, body):
    """Source of a child program; ``body`` may use ``run`` and ``new_loop``.

    ``run(coro)`` is asyncio.run or zuvrs.run; ``new_loop()`` makes a loop
    of the kind under test.  SIGINT is reset to Python's default handler
    because a child started from a non-interactive shell may inherit
    SIG_IGN.
    """
    if loop_name == "asyncio":
        header = (
            "import asyncio\n"
            "run = asyncio.run\n"
            "new_loop = asyncio.SelectorEventLoop\n"
        )
    else:
        header = (
            "import asyncio, zuvrs\n"
            "run = zuvrs.run\n"
            "new_loop = zuvrs.new_event_loop\n"
        )
    prologue = "import signal, sys\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
    return prologue + header + textwrap.dedent(body)


def spawn_child(loop_name, body, **kwargs):
    return subprocess.Popen(
        [sys.executable, "-c", child_script(loop_name, body)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def run_child(loop_name, body, timeout=20):
    """Run a child program to completion; returns subprocess.CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-c", child_script(loop_name, body)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def last_json_line(text):
    """The JSON document printed on the last non-empty line of ``text``."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert lines, "child printed nothing"
    return json.loads(lines[-1])
