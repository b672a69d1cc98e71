"""pytest plugin loaded (``-p zuvrs_upstream``) into every upstream suite run
by tests/upstream/run.py. Configured by environment variables that run.py
sets for the child it starts (nothing is read from the environment the
command itself inherited):

ZUVRS_UPSTREAM_LOOP      zuvrs | asyncio | uvloop | suite
    zuvrs / uvloop: asyncio's default policy is replaced by that loop's
    (``asyncio.DefaultEventLoopPolicy`` itself, so ``set_event_loop_policy
    (None)`` in a suite gives it again), so ``asyncio.new_event_loop()``,
    ``asyncio.run()``, ``asyncio.Runner`` and ``IsolatedAsyncioTestCase``
    make loops of that kind. asyncio: the stdlib's own policy, untouched.
    suite: the suite picks its loops itself (uvloop's suite, run against the
    stand-in ``uvloop`` package or the real one).
ZUVRS_UPSTREAM_OUT       JSON-lines file: one record per test (start, end)
ZUVRS_UPSTREAM_EXCLUDE   file of node ids not to run (tests already recorded
                         before the previous child died)
ZUVRS_UPSTREAM_DESELECT  regular expression; matching node ids are deselected
ZUVRS_UPSTREAM_WATCHDOG  seconds per test before the process dumps every
                         thread's stack to ZUVRS_UPSTREAM_LOG and exits
ZUVRS_UPSTREAM_LOG       file for the watchdog's stack dumps
ZUVRS_UPSTREAM_NATIVE_STREAMS  1: zuvrs.streams.install() (asyncio's stream
                         functions use native streams on zuvrs loops)
"""

import asyncio
import faulthandler
import json
import os
import re
import sys
import time

import pytest

_LOOP = os.environ.get("ZUVRS_UPSTREAM_LOOP", "suite")


class _Counter:
    created = 0


def _install_policy(name):
    if name == "zuvrs":
        import zuvrs

        base = zuvrs.EventLoopPolicy
    elif name == "uvloop":
        import uvloop

        base = uvloop.EventLoopPolicy
    elif name in ("asyncio", "suite"):
        return
    else:
        raise SystemExit(f"ZUVRS_UPSTREAM_LOOP={name!r}: expected zuvrs, uvloop, asyncio or suite")

    class Policy(base):
        def new_event_loop(self):
            _Counter.created += 1
            return super().new_event_loop()

    Policy.__name__ = Policy.__qualname__ = base.__name__
    Policy.__module__ = base.__module__
    # events._init_event_loop_policy() imports asyncio.DefaultEventLoopPolicy
    # (asyncio._DefaultEventLoopPolicy from 3.14) every time the policy is
    # reset with set_event_loop_policy(None).
    for attr in ("DefaultEventLoopPolicy", "_DefaultEventLoopPolicy"):
        if attr in vars(asyncio):
            setattr(asyncio, attr, Policy)
    asyncio.DefaultEventLoopPolicy = Policy
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        asyncio.set_event_loop_policy(None)


_install_policy(_LOOP)

if os.environ.get("ZUVRS_UPSTREAM_NATIVE_STREAMS") == "1" and _LOOP in ("zuvrs", "suite"):
    import zuvrs.streams

    zuvrs.streams.install()


def _trim(text, limit=4000):
    text = text or ""
    return text if len(text) <= limit else text[:1500] + "\n...\n" + text[-(limit - 1500):]


class _Recorder:
    def __init__(self):
        self.out = open(os.environ["ZUVRS_UPSTREAM_OUT"], "a", buffering=1)
        self.watchdog = float(os.environ.get("ZUVRS_UPSTREAM_WATCHDOG") or 0)
        log = os.environ.get("ZUVRS_UPSTREAM_LOG")
        self.log = open(log, "a", buffering=1) if log else sys.__stderr__
        self.current = {}  # nodeid -> [outcome, details, created at start, t0]
        exclude = os.environ.get("ZUVRS_UPSTREAM_EXCLUDE")
        self.exclude = set()
        if exclude and os.path.exists(exclude):
            with open(exclude) as f:
                self.exclude = {line.rstrip("\n") for line in f if line.strip()}
        pattern = os.environ.get("ZUVRS_UPSTREAM_DESELECT")
        self.deselect = re.compile(pattern) if pattern else None

    def emit(self, **record):
        self.out.write(json.dumps(record) + "\n")

    # -- selection

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        keep, drop = [], []
        for item in items:
            if item.nodeid in self.exclude or (self.deselect and self.deselect.search(item.nodeid)):
                drop.append(item)
            else:
                keep.append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep

    def pytest_collectreport(self, report):
        if report.failed:
            nodeid = report.nodeid or "<collection>"
            self.emit(event="end", id=nodeid + "::<collection>", outcome="error",
                      details=_trim(report.longreprtext), uses=0, seconds=0)

    # -- running

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        self.current[item.nodeid] = ["pass", "", _Counter.created, time.monotonic()]
        self.emit(event="start", id=item.nodeid)
        if self.watchdog:
            faulthandler.dump_traceback_later(self.watchdog, exit=True, file=self.log)
        try:
            yield
        finally:
            if self.watchdog:
                faulthandler.cancel_dump_traceback_later()
            state = self.current.pop(item.nodeid, None)
            if state is not None:
                outcome, details, created, t0 = state
                self.emit(event="end", id=item.nodeid, outcome=outcome, details=details,
                          uses=_Counter.created - created, seconds=round(time.monotonic() - t0, 3))

    def pytest_runtest_logreport(self, report):
        state = self.current.get(report.nodeid)
        if state is None:
            return
        outcome = state[0]
        xfail = hasattr(report, "wasxfail")
        if report.when == "call":
            if report.failed:
                new = "fail"
            elif report.skipped:
                new = "xfail" if xfail else "skip"
            else:
                new = "xpass" if xfail else "pass"
        elif report.failed:  # setup or teardown
            new = "error"
        elif report.skipped:  # skipped in setup
            new = "xfail" if xfail else "skip"
        else:
            return
        # Keep the worst outcome (a failing subtest or teardown is not hidden
        # by a later passing report).
        rank = {"pass": 0, "xpass": 1, "skip": 1, "xfail": 1, "fail": 2, "error": 2}
        if rank[new] > rank[outcome] or (outcome == "pass" and new != "pass"):
            state[0] = new
            if new in ("fail", "error"):
                state[1] = _trim(report.longreprtext)
            elif new == "skip" and isinstance(report.longrepr, tuple):
                state[1] = str(report.longrepr[2])
        elif new in ("fail", "error") and outcome in ("fail", "error"):
            state[1] = _trim(state[1] + "\n" + report.longreprtext)

    def pytest_sessionfinish(self, session, exitstatus):
        self.emit(event="done", exitstatus=int(exitstatus))


def pytest_configure(config):
    if os.environ.get("ZUVRS_UPSTREAM_OUT"):
        config.pluginmanager.register(_Recorder(), "zuvrs_upstream_recorder")
