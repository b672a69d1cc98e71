#!/usr/bin/env python3
"""Run CPython's own asyncio tests on zuvrs, and on the stdlib loop as a control.

Runs Lib/test/test_asyncio (and a few asyncio-using modules of Lib/test) of
the interpreter it runs under, with the loop under test swapped in, and
prints a table per module: tests run / passed / failed / errors / skipped.

Usage (needs the interpreter's ``test`` package, which some distributions
ship separately, e.g. Debian's ``libpython3.X-testsuite``)::

    python3 tests/cpython/run_cpython_suite.py                  # zuvrs, scheduling modules
    python3 tests/cpython/run_cpython_suite.py --loop both      # zuvrs and the stdlib control
    python3 tests/cpython/run_cpython_suite.py --loop all       # ... and uvloop, the peer
    python3 tests/cpython/run_cpython_suite.py test_events test_tasks --failures
    python3 tests/cpython/run_cpython_suite.py --group io       # network/TLS/subprocess modules
    python3 tests/cpython/run_cpython_suite.py --only test_gather --failures
    python3 tests/cpython/run_cpython_suite.py --json out.json  # every test's outcome and traceback

Other options: ``--dev`` (children under ``-X dev``: asyncio debug mode),
``--replace-testloop`` (see below), ``--native-streams`` (asyncio's
StreamReader, StreamReaderProtocol, StreamWriter and the four stream
functions replaced by zuvrs.streams', in asyncio and asyncio.streams, on
every loop), ``--snapshot`` (run on a private copy
of the installed zuvrs, so a reinstall during the run cannot mix builds;
the zuvrs build each run imported is printed either way),
``--test-timeout``/``--module-timeout``, ``--log`` (the children's
stdout/stderr: warnings, "Task was destroyed" messages, watchdog stacks).
The scheduling group takes about 1.5 minutes for both loops.

How the loop under test gets in:

* ``asyncio.DefaultEventLoopPolicy`` is replaced by a subclass of
  ``zuvrs.EventLoopPolicy`` (control: of the stdlib policy) that counts the
  loops it makes. ``asyncio.new_event_loop()``, ``asyncio.run()``,
  ``IsolatedAsyncioTestCase`` and every ``set_event_loop_policy(None)`` in
  the suite (each module's ``tearDownModule`` does one) then give the loop
  under test. ``--loop uvloop`` does the same with uvloop's policy and
  loops, for a column of the peer.
* The per-loop-class mixins (test_events' ``EventLoopTestsMixin`` +
  ``SubprocessTestsMixin``, test_sock_lowlevel's ``BaseSockTestsMixin``,
  test_sendfile's ``SendfileTestsBase``) are instantiated once as
  ``LoopUnderTest*Tests`` whose ``create_event_loop()`` returns a loop under
  test; the selector-specific classes (EPoll/Poll/Select/Kqueue...) are
  dropped, so test ids are the same for both loops.
  ``UnixEventLoopTestsMixin`` is not used: it needs
  ``asyncio.set_child_watcher``, which only the stdlib unix policy has.
* Many tests use ``test_utils.TestLoop`` (fake time), a plain
  ``BaseEventLoop``, mocks, or ``asyncio.SelectorEventLoop()`` directly, and
  never touch the loop under test. Column ``uses`` counts the tests that
  created at least one loop under test (by the policy or the mixins).
  ``--replace-testloop`` also makes ``TestCase.new_test_loop()`` without a
  time generator return a loop under test: more coverage (test_tasks,
  test_futures), and some failures that only mean the test looks at
  BaseEventLoop internals (``loop._ready``, ``loop._run_once()``).

Each module runs in its own child process with a per-test watchdog
(``faulthandler.dump_traceback_later(exit=True)``); a test that hangs or
kills the interpreter is recorded as ``timeout``/``crash`` (its stack is in
the log) and the module is resumed after it. Outcomes are streamed to a
JSON-lines file, so nothing is lost.

Outcomes: pass, fail, error, skip, xfail, xpass, timeout, crash. With
``--failures`` a failure whose traceback has ``NotImplementedError`` is
tagged ``[NI]`` (API zuvrs does not implement yet) and the control's
outcome of the same test is shown when both loops ran.

Written against CPython 3.11's test suite (the control run also passes on
3.12 and 3.13); Python 3.14 deprecates policies and may need adjustments. Not collected by pytest (no
``test_`` prefix) and not part of tools/test.sh.
"""

import argparse
import faulthandler
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

SCHEDULING_MODULES = [
    "test.test_asyncio.test_events",
    "test.test_asyncio.test_base_events",
    "test.test_asyncio.test_tasks",
    "test.test_asyncio.test_futures",
    "test.test_asyncio.test_futures2",
    "test.test_asyncio.test_locks",
    "test.test_asyncio.test_queues",
    "test.test_asyncio.test_timeouts",
    "test.test_asyncio.test_taskgroups",
    "test.test_asyncio.test_runners",
    "test.test_asyncio.test_waitfor",
    "test.test_asyncio.test_context",
    "test.test_asyncio.test_pep492",
    "test.test_asyncio.test_threads",
    "test.test_asyncgen",
    "test.test_contextlib_async",
    "test.test_coroutines",
]
# IsolatedAsyncioTestCase's own tests.
if sys.version_info < (3, 12):
    SCHEDULING_MODULES.append("unittest.test.test_async_case")
else:
    SCHEDULING_MODULES.append("test.test_unittest.test_async_case")

IO_MODULES = [
    "test.test_asyncio.test_sock_lowlevel",
    "test.test_asyncio.test_sendfile",
    "test.test_asyncio.test_streams",
    "test.test_asyncio.test_server",
    "test.test_asyncio.test_subprocess",
    "test.test_asyncio.test_buffered_proto",
    "test.test_asyncio.test_ssl",
    "test.test_asyncio.test_sslproto",
]

# module -> (names of the mixin bases, in order; loop classes to drop)
_SELECTOR_CLASSES = (
    "KqueueEventLoopTests",
    "EPollEventLoopTests",
    "PollEventLoopTests",
    "SelectEventLoopTests",
    "ProactorEventLoopTests",
)
MIXINS = {
    "test.test_asyncio.test_events": (("EventLoopTestsMixin", "SubprocessTestsMixin"), _SELECTOR_CLASSES),
    "test.test_asyncio.test_sock_lowlevel": (("BaseSockTestsMixin",), _SELECTOR_CLASSES),
    "test.test_asyncio.test_sendfile": (("SendfileTestsBase",), _SELECTOR_CLASSES),
}

OUTCOMES = ("pass", "fail", "error", "skip", "xfail", "xpass", "timeout", "crash")


def _zuvrs_fingerprint():
    """(package directory, short sha256 of its files) of the zuvrs imported here."""
    import hashlib

    import zuvrs

    root = os.path.dirname(zuvrs.__file__)
    digest = hashlib.sha256()
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if os.path.isfile(path) and name.endswith((".py", ".so", ".pyd")):
            digest.update(name.encode())
            with open(path, "rb") as f:
                digest.update(f.read())
    return root, digest.hexdigest()[:12]


def _short_module(name):
    return name.rsplit(".", 1)[-1]


def _full_module(name):
    """test_events -> test.test_asyncio.test_events, test_asyncgen ->
    test.test_asyncgen; dotted names are kept."""
    import importlib.util

    if "." in name:
        return name
    for candidate in ("test.test_asyncio." + name, "test." + name):
        try:
            if importlib.util.find_spec(candidate) is not None:
                return candidate
        except ImportError:
            pass
    return name


# --------------------------------------------------------------------------
# child: run one module in this process


class _Counter:
    created = 0


def _loop_under_test(loop_name):
    """Install the loop under test; return a factory that counts its loops.

    Loops are counted when made by this factory (the mixin classes) or by
    the default policy, the ways a test can get a loop that is not chosen
    by the test itself; a test that calls ``asyncio.SelectorEventLoop()``
    directly runs on the stdlib loop in both runs and counts for neither.
    """
    import asyncio

    if loop_name == "zuvrs":
        import zuvrs

        make, base_policy = zuvrs.new_event_loop, zuvrs.EventLoopPolicy
    elif loop_name == "asyncio":
        make, base_policy = asyncio.SelectorEventLoop, asyncio.DefaultEventLoopPolicy
    elif loop_name == "uvloop":
        # The peer: its policy in place of the default one, as for zuvrs.
        import uvloop

        make, base_policy = uvloop.new_event_loop, uvloop.EventLoopPolicy
    else:
        raise SystemExit(f"unknown loop {loop_name!r}")

    def factory():
        _Counter.created += 1
        return make()

    class CountingPolicy(base_policy):
        def _loop_factory(self):
            return factory()

    CountingPolicy.__name__ = CountingPolicy.__qualname__ = base_policy.__name__
    # set_event_loop_policy(None), which every module's tearDownModule does,
    # re-creates asyncio.DefaultEventLoopPolicy.
    asyncio.DefaultEventLoopPolicy = CountingPolicy
    asyncio.set_event_loop_policy(None)
    return factory


def _inject_mixin_class(module, factory):
    bases, drop = MIXINS.get(module.__name__, ((), ()))
    for name in drop:
        if hasattr(module, name):
            delattr(module, name)
    if not bases:
        return
    from test.test_asyncio import utils as test_utils

    def create_event_loop(self):
        return factory()

    stem = bases[0]
    for word in ("Mixin", "TestsBase", "Tests", "Base"):
        stem = stem.replace(word, "")
    name = "LoopUnderTest" + stem + "Tests"  # EventLoopTests, SockTests, SendfileTests
    cls = type(
        name,
        tuple(getattr(module, b) for b in bases) + (test_utils.TestCase,),
        {"create_event_loop": create_event_loop, "__module__": module.__name__},
    )
    setattr(module, name, cls)


def _replace_testloop(factory):
    from test.test_asyncio import utils as test_utils

    original = test_utils.TestCase.new_test_loop

    def new_test_loop(self, gen=None):
        if gen is not None:
            return original(self, gen)
        loop = factory()
        self.set_event_loop(loop)
        return loop

    test_utils.TestCase.new_test_loop = new_test_loop


def _patch_native_streams():
    """asyncio's stream classes and functions replaced with zuvrs.streams'
    (for every loop: the classes work on any transport)."""
    import asyncio
    import asyncio.streams

    import zuvrs.streams as native

    for name in ("StreamReader", "StreamReaderProtocol", "StreamWriter", "open_connection", "start_server",
                 "open_unix_connection", "start_unix_server"):
        setattr(asyncio, name, getattr(native, name))
        setattr(asyncio.streams, name, getattr(native, name))


def _iter_tests(suite):
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            yield from _iter_tests(item)
        else:
            yield item


def _trim(text, limit=6000):
    return text if len(text) <= limit else text[:2000] + "\n...\n" + text[-(limit - 2000):]


class _Recorder(unittest.TestResult):
    """Streams one JSON line per event to ``out``."""

    def __init__(self, out, watchdog):
        super().__init__()
        self._out = out
        self._watchdog = watchdog
        self._current = None  # [id, outcome, details, created_at_start, t0]

    def _emit(self, **record):
        self._out.write(json.dumps(record) + "\n")
        self._out.flush()

    def startTest(self, test):
        super().startTest(test)
        self._current = [test.id(), "pass", "", _Counter.created, time.monotonic()]
        self._emit(event="start", id=test.id())
        if self._watchdog:
            faulthandler.dump_traceback_later(self._watchdog, exit=True)

    def stopTest(self, test):
        if self._watchdog:
            faulthandler.cancel_dump_traceback_later()
        tid, outcome, details, created, t0 = self._current
        self._emit(
            event="end",
            id=tid,
            outcome=outcome,
            details=details,
            uses=_Counter.created - created,
            seconds=round(time.monotonic() - t0, 3),
        )
        self._current = None
        super().stopTest(test)

    def _set(self, test, outcome, details=""):
        if self._current is None or self._current[0] != test.id():
            # setUpClass/setUpModule/tearDown* errors: a test of their own.
            self._emit(event="end", id=test.id(), outcome=outcome, details=details, uses=0, seconds=0)
            return
        # Keep the worst: a failing subtest or cleanup must not be hidden.
        if self._current[1] in ("pass", "skip") or outcome in ("fail", "error"):
            if self._current[1] in ("fail", "error") and outcome in ("fail", "error"):
                self._current[2] += "\n" + details
                return
            self._current[1] = outcome
            self._current[2] = details

    def addError(self, test, err):
        self._set(test, "error", _trim(self._exc_info_to_string(err, test)))

    def addFailure(self, test, err):
        self._set(test, "fail", _trim(self._exc_info_to_string(err, test)))

    def addSubTest(self, test, subtest, err):
        if err is not None:
            kind = "fail" if issubclass(err[0], test.failureException) else "error"
            self._set(test, kind, _trim(f"[{subtest._subDescription()}]\n" + self._exc_info_to_string(err, test)))

    def addSkip(self, test, reason):
        self._set(test, "skip", reason)

    def addExpectedFailure(self, test, err):
        self._set(test, "xfail")

    def addUnexpectedSuccess(self, test):
        self._set(test, "xpass")


def child_main(args):
    # A suite started from a background job of a non-interactive shell
    # (``... &`` in a script, ``nohup ... &``) inherits SIGINT ignored, and
    # Python, asyncio and zuvrs all keep an inherited SIG_IGN: the tests that
    # interrupt themselves (test_runners' interrupt_main() tests) would wait
    # forever on either loop. They get what an interactive shell gives.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    factory = _loop_under_test(args.loop)
    if args.replace_testloop:
        _replace_testloop(factory)
    if args.native_streams:
        _patch_native_streams()
    import importlib

    module = importlib.import_module(args.child)
    _inject_mixin_class(module, factory)
    suite = unittest.defaultTestLoader.loadTestsFromModule(module)
    exclude = set()
    if args.exclude:
        with open(args.exclude) as f:
            exclude = {line.strip() for line in f if line.strip()}
    tests = [t for t in _iter_tests(suite) if t.id() not in exclude]
    if args.only:
        tests = [t for t in tests if any(s in t.id() for s in args.only)]
    with open(args.out, "a") as out:
        if args.loop == "zuvrs":
            root, fingerprint = _zuvrs_fingerprint()
            out.write(json.dumps({"event": "env", "zuvrs": root, "fingerprint": fingerprint}) + "\n")
        result = _Recorder(out, args.watchdog)
        # The suite's own output (warnings, logging) goes to stderr, which
        # the parent keeps in the log file.
        unittest.TestSuite(tests).run(result)
        out.write(json.dumps({"event": "done"}) + "\n")
    return 0


# --------------------------------------------------------------------------
# parent: one child per module, resumed after a hang or crash


def run_module(module, loop, args, log, env=None, seen=None):
    """Return {test id: record} for every test of module; adds the zuvrs
    builds the children imported to the set ``seen``."""
    records = {}
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "out.jsonl")
        excl_path = os.path.join(tmp, "exclude.txt")
        deadline = time.monotonic() + args.module_timeout
        while True:
            with open(excl_path, "w") as f:
                f.write("\n".join(records))
            cmd = [
                sys.executable,
                "-X", "faulthandler",
                *(["-X", "dev"] if args.dev else []),
                os.path.abspath(__file__),
                "--child", module,
                "--loop", loop,
                "--out", out_path,
                "--exclude", excl_path,
                "--watchdog", str(args.test_timeout),
            ]
            if args.replace_testloop:
                cmd.append("--replace-testloop")
            if args.native_streams:
                cmd.append("--native-streams")
            for s in args.only or ():
                cmd += ["--only", s]
            open(out_path, "w").close()
            log.write(f"\n===== {loop} {module} (resume after {len(records)} tests)\n")
            log.flush()
            try:
                proc = subprocess.run(
                    cmd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    timeout=max(1.0, deadline - time.monotonic()),
                )
                rc = proc.returncode
            except subprocess.TimeoutExpired:
                rc = "module-timeout"
            started, done = None, False
            with open(out_path) as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue  # a line cut by the watchdog's exit
                    if rec["event"] == "start":
                        started = rec["id"]
                    elif rec["event"] == "end":
                        records[rec["id"]] = rec
                        if rec["id"] == started:
                            started = None
                    elif rec["event"] == "done":
                        done = True
                    elif rec["event"] == "env" and seen is not None:
                        seen.add((rec["zuvrs"], rec["fingerprint"]))
            if done:
                return records
            if started is None:
                # Died outside any test (import error, module fixture...).
                records[f"{module}.<module>"] = {
                    "id": f"{module}.<module>",
                    "outcome": "crash",
                    "details": f"child exited with {rc} outside a test; see the log",
                    "uses": 0,
                }
                return records
            outcome = "timeout" if rc in (1, "module-timeout") else "crash"
            records[started] = {
                "id": started,
                "outcome": outcome,
                "details": f"child exited with {rc} during this test; see the log for its stack",
                "uses": None,
            }
            if rc == "module-timeout" or time.monotonic() >= deadline:
                return records


def summarize(records):
    counts = dict.fromkeys(OUTCOMES, 0)
    uses = 0
    for rec in records.values():
        counts[rec["outcome"]] += 1
        if rec.get("uses"):
            uses += 1
    return counts, uses


def print_table(results, loops, file=sys.stdout):
    cols = ("run", "pass", "fail", "error", "skip", "other", "uses")
    head = f"{'module':28}" + "".join(f" | {loop:^41}" for loop in loops)
    sub = f"{'':28}" + "".join(" | " + " ".join(f"{c:>5}" for c in cols) for _ in loops)
    print(head, file=file)
    print(sub, file=file)
    print("-" * len(sub), file=file)
    totals = {loop: dict.fromkeys(cols, 0) for loop in loops}
    modules = list(dict.fromkeys(m for loop in loops for m in results[loop]))
    for module in modules:
        row = f"{_short_module(module):28}"
        for loop in loops:
            counts, uses = summarize(results[loop].get(module, {}))
            vals = {
                "run": sum(counts.values()),
                "pass": counts["pass"],
                "fail": counts["fail"],
                "error": counts["error"],
                "skip": counts["skip"],
                "other": counts["xfail"] + counts["xpass"] + counts["timeout"] + counts["crash"],
                "uses": uses,
            }
            for c in cols:
                totals[loop][c] += vals[c]
            row += " | " + " ".join(f"{vals[c]:>5}" for c in cols)
        print(row, file=file)
    print("-" * len(sub), file=file)
    print(f"{'TOTAL':28}" + "".join(" | " + " ".join(f"{totals[l][c]:>5}" for c in cols) for l in loops), file=file)
    print("other = xfail + xpass + timeout + crash; uses = tests that created a loop under test", file=file)


def print_failures(results, loops, file=sys.stdout):
    bad = ("fail", "error", "timeout", "crash", "xpass")
    for loop in loops:
        control = results.get("asyncio", {}) if loop != "asyncio" else {}
        for module, records in results[loop].items():
            for tid, rec in sorted(records.items()):
                if rec["outcome"] not in bad:
                    continue
                ctl = control.get(module, {}).get(tid, {}).get("outcome")
                ni = " [NI]" if "NotImplementedError" in rec.get("details", "") else ""
                note = f" (asyncio: {ctl})" if ctl else ""
                print(f"\n--- [{loop}] {rec['outcome'].upper()}{ni}: {tid}{note}", file=file)
                if rec.get("details"):
                    print(rec["details"].rstrip(), file=file)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("modules", nargs="*", help="e.g. test_events or test.test_asyncgen (default: --group)")
    p.add_argument(
        "--loop",
        default="zuvrs",
        choices=("zuvrs", "asyncio", "uvloop", "both", "all"),
        help="both: asyncio and zuvrs; all: asyncio, zuvrs and uvloop (the peer, its policy swapped in the same way)",
    )
    p.add_argument("--group", default="scheduling", choices=("scheduling", "io", "all"))
    p.add_argument("--only", action="append", help="run only tests whose id contains this (repeatable)")
    p.add_argument("--replace-testloop", action="store_true", help="new_test_loop() without gen -> loop under test")
    p.add_argument("--dev", action="store_true", help="run the tests under -X dev (asyncio debug mode, more warnings)")
    p.add_argument(
        "--native-streams",
        action="store_true",
        help="asyncio's stream classes and functions replaced by zuvrs.streams' (on every loop)",
    )
    p.add_argument("--test-timeout", type=float, default=60.0, help="per-test watchdog, seconds")
    p.add_argument("--module-timeout", type=float, default=600.0, help="per-module limit, seconds")
    p.add_argument("--failures", action="store_true", help="print every failure's traceback")
    p.add_argument("--json", help="write {loop: {module: {test id: record}}} here")
    p.add_argument("--log", help="child output (default: a temporary file, path printed)")
    p.add_argument(
        "--snapshot",
        action="store_true",
        help="copy the installed zuvrs package to a temporary directory first and run on that copy "
        "(results stay consistent if zuvrs is reinstalled during the run)",
    )
    # child mode
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--exclude", help=argparse.SUPPRESS)
    p.add_argument("--watchdog", type=float, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.child:
        return child_main(args)

    if args.modules:
        modules = [_full_module(m) for m in args.modules]
    else:
        modules = {"scheduling": SCHEDULING_MODULES, "io": IO_MODULES, "all": SCHEDULING_MODULES + IO_MODULES}[args.group]
    loops = {"both": ["asyncio", "zuvrs"], "all": ["asyncio", "zuvrs", "uvloop"]}.get(args.loop, [args.loop])
    log_path = args.log or tempfile.mkstemp(prefix="cpython-suite-", suffix=".log")[1]
    results = {loop: {} for loop in loops}
    env, seen = None, set()
    snapshot = None
    if args.snapshot and "zuvrs" in loops:
        import zuvrs

        snapshot = tempfile.mkdtemp(prefix="zuvrs-snapshot-")
        shutil.copytree(
            os.path.dirname(zuvrs.__file__),
            os.path.join(snapshot, "zuvrs"),
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [snapshot, env.get("PYTHONPATH")]))
    try:
        with open(log_path, "w") as log:
            for module in modules:
                for loop in loops:
                    t0 = time.monotonic()
                    records = run_module(module, loop, args, log, env, seen)
                    results[loop][module] = records
                    counts, _ = summarize(records)
                    brief = " ".join(f"{k}={v}" for k, v in counts.items() if v)
                    print(f"{loop:8} {_short_module(module):24} {time.monotonic() - t0:6.1f}s  {brief}", flush=True)
    finally:
        if snapshot:
            shutil.rmtree(snapshot, ignore_errors=True)
    print(f"\nchild output: {log_path}")
    for root, fingerprint in sorted(seen):
        print(f"zuvrs imported from {root} (files sha256 {fingerprint})")
    if len({fp for _, fp in seen}) > 1:
        print("WARNING: zuvrs changed during the run; results mix builds (use --snapshot)")
    print()
    print_table(results, loops)
    if args.failures:
        print_failures(results, loops)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
