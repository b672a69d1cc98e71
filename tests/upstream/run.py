#!/usr/bin/env python3
"""Run test suites the project did not write with zuvrs as the loop, and the
same suites on the stdlib loop and on uvloop for comparison.

Suites (``--suite``, repeatable; default all):

  cpython     CPython's test_asyncio and a few asyncio-using modules of
              Lib/test, through tests/cpython/run_cpython_suite.py (the
              interpreter's own ``test`` package).
  uvloop      uvloop's tests/ from the sdist of the installed uvloop, run
              against zuvrs through the stand-in ``uvloop`` package in
              tests/upstream/stand_in/ (uvloop's ``_testbase.py`` copied
              beside it). uvloop's ``Test_UV_*`` / ``Test*UV*`` classes make
              their loops with ``uvloop.new_event_loop()`` and give the zuvrs
              column; its ``Test_AIO_*`` twins make stdlib loops and give the
              stdlib column; the same ``UV`` classes on the real uvloop give
              the uvloop column. Classes of neither family (TestPolicy,
              test_runner, ...) use ``uvloop.*`` and count for zuvrs and uvloop.
  anyio       AnyIO's tests from the sdist of the installed anyio, asyncio
              backend only: its ``[asyncio]`` parametrisation, on the loop
              that asyncio's default policy makes (the trio, uvloop and eager
              parametrisations are deselected).
  aiohttp     aiohttp's tests from the sdist of the installed aiohttp,
              ``--aiohttp-loop=pyloop`` (asyncio.new_event_loop(), i.e. the
              loop of asyncio's default policy); aiohttp's own markers for
              dev-mode, autobahn and internal tests are deselected as in its
              pytest.ini.
  asyncssh    asyncssh's tests from the sdist of the installed asyncssh
              (tests/upstream/requirements.txt pins it); they need no servers
              (its tests/util.py fakes DNS by replacing socket.getaddrinfo
              and getnameinfo; its SSH servers and agents run in the test).
  uvicorn     uvicorn's tests from the sdist of the installed uvicorn
              (tests/upstream/requirements.txt pins it), but its codspeed
              benchmarks: its HTTP/1.1, HTTP/2 and WebSocket protocols,
              servers and TLS, on the loop of the column.
  redis       redis-py's asyncio client tests (tests/test_asyncio) from the
              sdist of the installed redis, against a redis-server this run
              starts on port 6379, where some of them look for it (Debian's,
              tools/setup.sh installs it);
              what needs other servers (clusters, Redis Stack modules, the
              fault injector) is left out. The client reads and writes
              through asyncio's streams, so this suite is the one to run
              with ``--native-streams``.
  aioftp      aioftp's tests from the sdist of the installed aioftp
              (tests/upstream/requirements.txt pins it): an FTP client and
              server in one process, talking through asyncio's
              ``open_connection`` and ``start_server`` streams (plain and
              TLS, IPv4 and IPv6), so, like redis, one to run with
              ``--native-streams``.
  tornado     Tornado's tests (tornado/test/*_test.py, unittest classes that
              make their loops with ``asyncio.new_event_loop()``) from the
              sdist of the installed tornado, run from its source tree, where
              the tests live inside the package. Its IOStream and HTTP
              client and server sit on ``add_reader`` / ``add_writer``,
              ``sock_*`` calls, timers, threads, subprocesses and signals, so
              it judges the loop's lower layers rather than its transports.
  pyzmq       pyzmq's tests from the sdist of the installed pyzmq: its
              ``zmq.asyncio`` sockets watch libzmq's edge-triggered file
              descriptor with ``add_reader`` and poll it again from
              callbacks; the rest of its suite (threads, devices) runs on
              every loop alike.
  aioquic     aioquic's tests from the sdist of the installed aioquic:
              QUIC clients and servers on datagram endpoints (losses,
              retries, migration, IPv4 and IPv6), the UDP side that no other
              suite here leans on.
  websockets  websockets' asyncio and legacy tests. websockets' sdists do not
              ship its tests (its MANIFEST.in prunes them), so this suite
              needs a source tree of websockets: ``--websockets-src DIR`` (a
              checkout; its src/ goes first on sys.path so code and tests
              match); without one it is reported as not run.

Loops (``--loop``, comma-separated; default zuvrs,asyncio,uvloop): for every
suite but uvloop's, asyncio's default policy class is replaced (by the
plugin harness/zuvrs_upstream.py, or run_cpython_suite.py's own mechanism)
with zuvrs's or uvloop's, so ``asyncio.new_event_loop()``,
``asyncio.run()``, ``asyncio.Runner`` and ``IsolatedAsyncioTestCase`` give
the loop of the column, including after a suite's
``set_event_loop_policy(None)``; the asyncio column keeps the stdlib policy.

What it does: installs the test dependencies listed in
tests/upstream/requirements.txt into the interpreter it runs with (skip with
``--no-install``), downloads the sdists it needs with ``pip download`` into
target/upstream/ (kept there as a cache), runs each suite and loop in child
processes with an environment of its own (PATH of the venv and the system,
HOME under target/upstream/, C.UTF-8; nothing else is inherited), a per-test
timeout (pytest-timeout) and a watchdog that ends a child stuck in native
code (the child is then resumed after the test, which is recorded as
``timeout`` or ``crash``), and prints a table per suite and file: passed /
failed / errors / skipped per loop (xfail counts as skipped, a non-strict
xpass as passed, timeout and crash as errors).

Ratchet: tests/upstream/ratchet.json holds zuvrs's passed count per suite
and file. ``--update-ratchet`` writes this run's counts there (and
tests/upstream/RESULTS.md); it refuses to lower a count unless
``--allow-lower``. ``--check`` exits 1 when a file's passed count on zuvrs
is below the recorded one (only the files this run ran are checked).

``--ci``: zuvrs only, the suites and files in CI_SELECTION below (fast and
steady ones), then ``--check``.

Every run writes target/upstream/last-run.json (every test's outcome and
error per loop), target/upstream/last-run.md (the tables) and
target/upstream/regressions.txt (every test that passes on the stdlib loop
and not on zuvrs, with its error); the children's output is in
target/upstream/logs/.

Usage::

    tools/upstream.sh                        # everything, three loops (about 2 hours: aiohttp ~45,
                                             #   asyncssh ~55 (uvloop's hangs take its 45-minute
                                             #   budget; ~6 on the other loops), uvloop ~9,
                                             #   cpython ~7, anyio ~5, uvicorn ~7)
    tools/upstream.sh --ci                   # the CI subset, zuvrs only (about 11 minutes)
    tools/upstream.sh --ci --jobs 2          # the same, two suites at a time (about 6.5; what CI runs)
    tools/upstream.sh --suite uvloop --loop zuvrs,asyncio
    tools/upstream.sh --suite anyio --file test_taskgroups.py
    tools/upstream.sh --update-ratchet       # after a full run's worth of improvements
    tools/upstream.sh --ci --native-streams  # the CI selection with zuvrs.streams installed, against
                                             #   the ratchet of plain zuvrs
    tools/upstream.sh --asyncio-debug --loop zuvrs,asyncio --suite tornado
                                             # both loops in asyncio's debug mode, compared
"""

import argparse
import collections
import concurrent.futures
import contextlib
import datetime
import glob
import importlib.metadata
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CACHE = os.path.join(ROOT, "target", "upstream")
HARNESS = os.path.join(HERE, "harness")
STAND_IN = os.path.join(HERE, "stand_in")
REQUIREMENTS = os.path.join(HERE, "requirements.txt")
RATCHET = os.path.join(HERE, "ratchet.json")
RESULTS_MD = os.path.join(HERE, "RESULTS.md")
CPYTHON_RUNNER = os.path.join(ROOT, "tests", "cpython", "run_cpython_suite.py")

SUITES = ("cpython", "uvloop", "anyio", "aiohttp", "asyncssh", "uvicorn", "redis", "aioftp", "tornado", "pyzmq",
          "aioquic", "websockets")
LOOPS = ("zuvrs", "asyncio", "uvloop")
# The suites by how long their CI selection takes (--jobs starts the
# longest first): asyncssh about 3 minutes, uvicorn and CPython's 1.5,
# redis-py's 1.3, tornado's, uvloop's and aiohttp's 1, AnyIO's 0.5, aioftp's 0.3,
# aioquic's and pyzmq's 0.2.
LONGEST_FIRST = ("asyncssh", "uvicorn", "cpython", "redis", "tornado", "uvloop", "aiohttp", "anyio", "aioftp",
                 "aioquic", "pyzmq", "websockets")
assert sorted(LONGEST_FIRST) == sorted(SUITES)
COLUMNS = ("passed", "failed", "errors", "skipped")

# What --ci runs (zuvrs only): suite -> files (None: the whole suite).
# Chosen for speed and steadiness. Left out: websockets (no tests on PyPI);
# uvloop's test_tcp.py (2.5 min, two tests run into the 60 s timeout) and
# test_sockets.py (a test hangs until the watchdog); AnyIO's test_sockets.py
# (results vary from run to run on every loop, with the sandbox's IPv6) and
# test_pytest_plugin.py (slow, pytester); most of aiohttp's (its whole suite
# takes about 20 minutes per loop; its parser and helper tests do not depend
# on the loop). The selection takes about 11 minutes (asyncssh's part
# about 3, uvicorn's 1.5; pip install and the sdists' download add a few seconds on a fresh
# machine).
CI_SELECTION = {
    "cpython": None,
    "uvloop": [
        "tests/test_aiohttp.py",
        "tests/test_base.py",
        "tests/test_context.py",
        "tests/test_dealloc.py",
        "tests/test_dns.py",
        "tests/test_executors.py",
        "tests/test_pipes.py",
        "tests/test_process.py",
        "tests/test_process_spawning.py",
        "tests/test_regr1.py",
        "tests/test_runner.py",
        "tests/test_signals.py",
        "tests/test_testbase.py",
        "tests/test_udp.py",
        "tests/test_unix.py",
    ],
    "anyio": [
        "tests/streams",
        "tests/test_concurrency_utils.py",
        "tests/test_contextmanagers.py",
        "tests/test_debugging.py",
        "tests/test_eventloop.py",
        "tests/test_fileio.py",
        "tests/test_from_thread.py",
        "tests/test_functools.py",
        "tests/test_futures.py",
        "tests/test_itertools.py",
        "tests/test_lowlevel.py",
        "tests/test_signals.py",
        "tests/test_subprocesses.py",
        "tests/test_synchronization.py",
        "tests/test_taskgroups.py",
        "tests/test_tempfile.py",
        "tests/test_to_process.py",
        "tests/test_to_thread.py",
    ],
    "aiohttp": [
        "tests/test_connector.py",
        "tests/test_web_functional.py",
        "tests/test_web_websocket_functional.py",
        "tests/test_client_ws_functional.py",
        "tests/test_web_server.py",
    ],
    # What exercises the loop: connections and their DNS test doubles,
    # host-based authentication (getnameinfo), forwarding (connections
    # made and accepted), processes and channels over pipes and sockets,
    # agents over Unix sockets. Left out: test_public_key.py (key
    # generation, no loop; its RSA test takes 45 of its 60 s timeout) and
    # test_sftp.py (80 s, file operations).
    "asyncssh": [
        "tests/test_agent.py",
        "tests/test_channel.py",
        "tests/test_connection.py",
        "tests/test_connection_auth.py",
        "tests/test_forward.py",
        "tests/test_process.py",
        "tests/test_stream.py",
        "tests/test_subprocess.py",
        "tests/test_x11.py",
    ],
    # Everything that runs a server or a protocol on the loop (about 90
    # s); left out: its supervisors' reload and multiprocess tests (30 s,
    # file watching and processes, no loop of the test's).
    "uvicorn": [
        "tests/middleware",
        "tests/protocols",
        "tests/supervisors/test_signal.py",
        "tests/test_default_headers.py",
        "tests/test_lifespan.py",
        "tests/test_main.py",
        "tests/test_server.py",
        "tests/test_ssl.py",
    ],
    # The whole selection (about a minute).
    "redis": None,
    # The whole suite (about 10 s): a client and server on asyncio's streams.
    "aioftp": None,
    # The whole suite (about a minute).
    "tornado": None,
    # The files that run zmq.asyncio sockets on the loop (about 10 s).
    "pyzmq": ["tests/test_asyncio.py", "tests/test_future.py", "tests/test_auth.py"],
    # Its clients and servers on the loop's datagram endpoints (about 10 s).
    "aioquic": ["tests/test_asyncio.py"],
}

# Per-test limits, seconds: pytest-timeout's (raises in the test), then the
# watchdog's (dumps the stacks and ends the child; it is resumed).
TEST_TIMEOUT = 60
WATCHDOG = 120
# Limit for one suite on one loop, seconds.
SUITE_BUDGET = 45 * 60


# --------------------------------------------------------------------------
# environment


def log(msg):
    print(msg, flush=True)


SANITIZER_ENV = ("LD_PRELOAD", "PYTHONMALLOC", "ASAN_OPTIONS", "ASAN_SYMBOLIZER_PATH", "UBSAN_OPTIONS",
                 "UBSAN_SYMBOLIZER_PATH")


def clean_env(extra=None):
    """The children's whole environment: nothing inherited."""
    home = os.path.join(CACHE, "home")
    tmp = os.path.join(CACHE, "tmp")
    os.makedirs(home, exist_ok=True)
    os.makedirs(tmp, exist_ok=True)
    env = {
        "PATH": os.pathsep.join([os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": home,
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "PYTHONNOUSERSITE": "1",
        "PYTHONFAULTHANDLER": "1",
    }
    # A sanitized run (tools/sanitize.sh --upstream) keeps its runtime and
    # options in the children, where zuvrs runs.
    for name in SANITIZER_ENV:
        if name in os.environ:
            env[name] = os.environ[name]
    if NATIVE_STREAMS:
        # The harness plugin calls zuvrs.streams.install() (it acts on zuvrs loops only).
        env["ZUVRS_UPSTREAM_NATIVE_STREAMS"] = "1"
    if ASYNCIO_DEBUG:
        env["PYTHONASYNCIODEBUG"] = "1"
    env.update(extra or {})
    return env


# --native-streams: the zuvrs column runs with zuvrs.streams' native stream
# classes (install() in the suites, the classes patched in CPython's).
NATIVE_STREAMS = False

# --asyncio-debug: every loop in asyncio's debug mode (PYTHONASYNCIODEBUG=1),
# where handles keep the traceback of where they were made and slow
# callbacks are logged; compared loop with loop, not with the ratchet.
ASYNCIO_DEBUG = False


def _reset_signals():
    """preexec_fn of the children: signal dispositions and mask as a fresh
    interactive start would have them. A command started with SIGINT or
    SIGHUP ignored (a background job, nohup, ``trap '' INT``) passes SIG_IGN
    on through exec, and the suites' Ctrl-C tests would fail on every loop.
    (The children run in sessions of their own, so no terminal signal
    reaches them either way.)"""
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError, RuntimeError):
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def pip(*args):
    cmd = [sys.executable, "-m", "pip", *args, "--disable-pip-version-check"]
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if proc.returncode:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return proc.stdout


def install_requirements():
    log("== installing test dependencies (tests/upstream/requirements.txt)")
    pip("install", "-q", "-r", REQUIREMENTS)


def git_commit():
    """The checkout's commit (the zuvrs build under test is built from it)."""
    try:
        out = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, stdin=subprocess.DEVNULL)
        return out.stdout.strip() or "?"
    except OSError:
        return "?"


def installed_version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _norm(name):
    return re.sub(r"[-_.]+", "_", name).lower()


def sdist_tree(name):
    """Unpack (downloading first if needed) the sdist of the installed
    version of ``name``; return its directory."""
    version = installed_version(name)
    if version is None:
        raise SystemExit(f"{name} is not installed in {sys.prefix} (tools/setup.sh installs it)")
    sdists = os.path.join(CACHE, "sdists")
    os.makedirs(sdists, exist_ok=True)

    def find():
        for path in glob.glob(os.path.join(sdists, "*.tar.gz")):
            base = os.path.basename(path)[: -len(".tar.gz")]
            if _norm(base) == _norm(f"{name}-{version}"):
                return path
        return None

    archive = find()
    if archive is None:
        log(f"== downloading the {name} {version} sdist")
        pip("download", "-q", "--no-deps", "--no-binary", name, f"{name}=={version}", "-d", sdists)
        archive = find()
        if archive is None:
            raise SystemExit(f"pip download gave no sdist of {name}=={version} in {sdists}")
    dest = os.path.join(CACHE, "src")
    top = os.path.basename(archive)[: -len(".tar.gz")]
    tree = os.path.join(dest, top)
    if not os.path.isdir(tree):
        os.makedirs(dest, exist_ok=True)
        with tarfile.open(archive) as tar:
            kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(dest, **kwargs)
    return tree, version


def work_copy(tree, name, drop=()):
    """A copy of an unpacked sdist without its package source (``drop``):
    the children run in it, and ``python -c`` children put their current
    directory first on sys.path, where that source would shadow the
    installed package (or the stand-in)."""
    work = os.path.join(CACHE, "work", os.path.basename(tree))
    if not os.path.isdir(work):
        tmp = work + ".tmp"
        if os.path.isdir(tmp):
            shutil.rmtree(tmp)
        shutil.copytree(tree, tmp, ignore=lambda d, names: [n for n in names if d == tree and n in drop])
        os.rename(tmp, work)
    return work


# --------------------------------------------------------------------------
# running pytest in children, resumed after a hang or crash


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# pytest plugins the project's venv has that the suites do not use:
# pytest-asyncio and pytest-aiohttp would take over async tests and loops,
# and pytest-xdist (the project's own tests' workers) would take the
# options some suites' configurations give it. A suite that does use one
# keeps it (``plugins``).
VENV_PLUGINS = ("asyncio", "aiohttp", "xdist")


def run_pytest(label, cwd, args, env_extra, budget, test_timeout=TEST_TIMEOUT, watchdog=WATCHDOG, plugins=()):
    """Run pytest in ``cwd`` until every selected test has an outcome.
    Returns ({node id: record}, notes)."""
    logs = os.path.join(CACHE, "logs")
    os.makedirs(logs, exist_ok=True)
    log_path = os.path.join(logs, f"{label}.log")
    out_path = os.path.join(CACHE, "logs", f"{label}.jsonl")
    excl_path = os.path.join(CACHE, "logs", f"{label}.exclude")
    records, notes = {}, []
    deadline = time.monotonic() + budget
    with open(log_path, "w") as logf:
        while True:
            with open(excl_path, "w") as f:
                f.write("".join(k + "\n" for k in records))
            open(out_path, "w").close()
            env = clean_env(env_extra)
            env.update(
                ZUVRS_UPSTREAM_OUT=out_path,
                ZUVRS_UPSTREAM_EXCLUDE=excl_path,
                ZUVRS_UPSTREAM_WATCHDOG=str(watchdog),
                ZUVRS_UPSTREAM_LOG=log_path,
            )
            cmd = [
                sys.executable,
                os.path.join(HARNESS, "pytest_main.py"),
                "-p", "zuvrs_upstream",
                "-p", "no:cacheprovider",
                *(arg for name in VENV_PLUGINS if name not in plugins for arg in ("-p", f"no:{name}")),
                "-q",
                "--continue-on-collection-errors",
                "-o", "faulthandler_timeout=0",
                f"--timeout={test_timeout}",
                *args,
            ]
            logf.write(f"\n===== {label}: resume after {len(records)} tests\n$ {' '.join(cmd)}\n")
            logf.flush()
            proc = subprocess.Popen(
                cmd, cwd=cwd, env=env, stdout=logf, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_reset_signals,
            )
            try:
                rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                proc.wait()
                rc = "budget"
            # Leftover children of the suite (servers, subprocesses).
            _kill_group(proc)
            started, done = None, False
            with open(out_path) as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue  # cut by the watchdog's exit
                    if rec["event"] == "start":
                        started = rec["id"]
                    elif rec["event"] == "end":
                        records[rec["id"]] = rec
                        if rec["id"] == started:
                            started = None
                    elif rec["event"] == "done":
                        done = True
            if done:
                return records, notes
            if started is None:
                records[f"<{label}>::<died>"] = {
                    "id": f"<{label}>", "outcome": "crash",
                    "details": f"pytest exited with {rc} outside any test; see {log_path}",
                }
                notes.append(f"{label}: pytest exited with {rc} outside a test")
                return records, notes
            outcome = "timeout" if rc in (1, "budget") else "crash"
            records[started] = {
                "id": started, "outcome": outcome,
                "details": f"child exited with {rc} during this test (watchdog {watchdog}s); stacks in {log_path}",
            }
            if rc == "budget" or time.monotonic() >= deadline:
                notes.append(f"{label}: stopped at the {budget}s budget; the tests after {started} did not run")
                return records, notes


def by_file(records, key=lambda tid: tid):
    """{file: {test key: record}} from node ids ``file::...``."""
    files = collections.defaultdict(dict)
    for tid, rec in records.items():
        path = tid.split("::", 1)[0]
        files[path][key(tid)] = rec
    return files


def file_args(files, default):
    return list(files) if files else list(default)


# --------------------------------------------------------------------------
# suites: each returns ({loop: {file: {test key: record}}}, source, notes)


def _uv_family(tid):
    parts = tid.split("::")
    cls = parts[1] if len(parts) > 2 else ""
    if "AIO" in cls:
        return "asyncio"
    if "UV" in cls:
        return "uv"
    return "neutral"


def _uv_key(tid):
    # Test_AIO_TCP::test_x and Test_UV_TCP::test_x are the same test.
    parts = tid.split("::")
    if len(parts) > 2:
        parts[1] = parts[1].replace("AIO", "UV")
    return "::".join(parts)


def suite_uvloop(loops, files, args):
    tree, version = sdist_tree("uvloop")
    work = work_copy(tree, "uvloop", drop=("uvloop",))
    stand_in = os.path.join(CACHE, "stand-in")
    if os.path.isdir(stand_in):
        shutil.rmtree(stand_in)
    shutil.copytree(STAND_IN, stand_in, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(tree, "uvloop", "_testbase.py"), os.path.join(stand_in, "uvloop", "_testbase.py"))
    targets = file_args(files, ["tests"])
    results, notes = {}, []
    common = ["-p", "no:codspeed", *targets]
    if "zuvrs" in loops or "asyncio" in loops:
        deselect = []
        if "zuvrs" not in loops:
            deselect.append(r"::(?!\w*AIO)\w+::")  # all but the AIO classes
        if "asyncio" not in loops:
            deselect.append(r"::\w*AIO\w*::")
        recs, n = run_pytest(
            "uvloop-standin", work, common,
            {"ZUVRS_UPSTREAM_LOOP": "suite", "PYTHONPATH": stand_in,
             "ZUVRS_UPSTREAM_DESELECT": "|".join(deselect)},
            SUITE_BUDGET,
        )
        notes += n
        if "zuvrs" in loops:
            results["zuvrs"] = by_file({t: r for t, r in recs.items() if _uv_family(t) != "asyncio"}, _uv_key)
        if "asyncio" in loops:
            results["asyncio"] = by_file({t: r for t, r in recs.items() if _uv_family(t) == "asyncio"}, _uv_key)
    if "uvloop" in loops:
        recs, n = run_pytest(
            "uvloop-real", work, common,
            {"ZUVRS_UPSTREAM_LOOP": "suite", "ZUVRS_UPSTREAM_DESELECT": r"::\w*AIO\w*::"},
            SUITE_BUDGET,
        )
        notes += n
        results["uvloop"] = by_file({t: r for t, r in recs.items() if _uv_family(t) != "asyncio"}, _uv_key)
    return results, f"uvloop {version} sdist", notes


def sdist_suite(name, loops, files, pytest_args, default_files, env=None, drop=None, plugins=()):
    """Runs an sdist's tests on each loop: pytest with ``pytest_args`` and
    the selected files (``default_files`` when none), in a copy of the
    sdist without its package source (``drop``, default the package);
    ``plugins``: those of VENV_PLUGINS the suite uses."""
    tree, version = sdist_tree(name)
    work = work_copy(tree, name, drop=drop or (name,))
    results, notes = {}, []
    for loop in loops:
        recs, n = run_pytest(
            f"{name}-{loop}", work,
            [*pytest_args, *file_args(files, default_files)],
            {"ZUVRS_UPSTREAM_LOOP": loop, **(env or {})},
            SUITE_BUDGET,
            plugins=plugins,
        )
        notes += n
        results[loop] = by_file(recs)
    return results, f"{name} {version} sdist", notes


def suite_anyio(loops, files, args):
    return sdist_suite(
        "anyio", loops, files, ["-p", "no:codspeed"], ["tests"], drop=("src",),
        env={
            # As in AnyIO's own runs: its configuration names the plugins
            # it needs (-p anyio, pytest_mock, timeout), and the pytest
            # sessions its pytester tests start must not load the other
            # plugins of this venv (pytest-asyncio, pytest-aiohttp).
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            # AnyIO's conftest parametrises anyio_backend with asyncio,
            # asyncio+uvloop, asyncio+eager (3.12+) and trio: keep asyncio.
            "ZUVRS_UPSTREAM_DESELECT": r"[\[-](asyncio\+uvloop|asyncio\+eager|asyncio\+winloop|trio)[\]-]",
        })


def suite_aiohttp(loops, files, args):
    return sdist_suite(
        "aiohttp", loops, files,
        [
            # aiohttp's pytest.ini adds xdist, coverage and doctests; keep
            # only its marker selection.
            "-o", "addopts=",
            "-m", "not dev_mode and not autobahn and not internal",
            "--aiohttp-loop=pyloop",
        ],
        ["tests"])


def suite_asyncssh(loops, files, args):
    # (Its tox.ini's [pytest] section names tests/; its coverage options
    # are tox's, not pytest's.)
    return sdist_suite("asyncssh", loops, files, ["-p", "no:codspeed"], ["tests"])


def suite_uvicorn(loops, files, args):
    # Its pyproject's addopts run pytest-xdist with 8 workers; one process
    # here. tests/benchmarks are codspeed's, not tests.
    return sdist_suite(
        "uvicorn", loops, files,
        ["-o", "addopts=-rxXs --strict-markers", "-p", "no:codspeed", "--ignore=tests/benchmarks"],
        ["tests"])


# What redis-py's asyncio tests need that one plain redis-server is not:
# clusters and sentinels' replicas, the Redis Stack modules (another
# server, on 6479), the fault injector of test_scenario, the clusters of
# test_multidb; and Entra ID's client libraries (test_credentials.py).
REDIS_LEFT_OUT = (
    "test_cluster.py", "test_cluster_transaction.py", "test_bloom.py", "test_json.py", "test_search.py",
    "test_timeseries.py", "test_vsets.py", "test_scenario", "test_multidb", "test_credentials.py",
)


# Some of redis-py's tests connect to the default port whatever URL they
# are given (a pool made with no arguments), so the server takes it.
REDIS_PORT = 6379


@contextlib.contextmanager
def redis_server(notes):
    """A redis-server on 127.0.0.1:6379 (a free port, with a note in
    `notes`, if that is taken), no persistence, DEBUG allowed (the tests of
    a server that is loading or out of memory fake it with DEBUG ERROR);
    its URL."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server is not installed (tools/setup.sh installs it)")
    with socket.socket() as s:
        # (As redis-server binds: connections of an earlier run left in
        # TIME_WAIT do not keep it from the port.)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", REDIS_PORT))
        except OSError:
            s.bind(("127.0.0.1", 0))
            notes.append(f"redis: port {REDIS_PORT} is taken; the tests that use the default port fail")
        port = s.getsockname()[1]
    work = os.path.join(CACHE, "redis-server")
    os.makedirs(work, exist_ok=True)
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", work,
         "--enable-debug-command", "yes"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"redis-server did not start on port {port}")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def suite_redis(loops, files, args):
    # Its pyproject's pytest options: pytest-asyncio in auto mode, "-s".
    notes = []
    with redis_server(notes) as url:
        results, source, more = sdist_suite(
            "redis", loops, files,
            ["-p", "no:codspeed", f"--redis-url={url}",
             *(f"--ignore=tests/test_asyncio/{left_out}" for left_out in REDIS_LEFT_OUT)],
            ["tests/test_asyncio"], plugins=("asyncio",))
    return results, source, notes + more


def suite_aioftp(loops, files, args):
    # Its pyproject's addopts stop at the first failure (-x) and measure
    # coverage; keep its import mode and its "-p no:anyio". Its tests are
    # pytest-asyncio's, in strict mode (its ini option).
    return sdist_suite(
        "aioftp", loops, files,
        ["-o", "addopts=--import-mode=importlib", "-p", "no:anyio", "-p", "no:codspeed"],
        ["tests"], drop=("src",), plugins=("asyncio",))


def suite_pyzmq(loops, files, args):
    # Its pytest.ini: importlib import mode, tests/ on sys.path,
    # pytest-asyncio in auto mode.
    return sdist_suite("pyzmq", loops, files, ["-p", "no:codspeed"], ["tests"],
                       drop=("zmq",), plugins=("asyncio",))


def suite_aioquic(loops, files, args):
    # unittest classes (IsolatedAsyncioTestCase for the loop's part); its
    # pyproject has no pytest configuration.
    return sdist_suite("aioquic", loops, files,
                       ["-c", empty_ini("aioquic"), "--rootdir", ".", "-p", "no:codspeed"],
                       ["tests"], drop=("src",))


def empty_ini(name):
    """An empty pytest configuration file for a suite that has none: without
    one pytest would take the first it finds above the suite's tree (this
    project's)."""
    ini = os.path.join(CACHE, f"{name}-pytest.ini")
    with open(ini, "w") as f:
        f.write("[pytest]\n")
    return ini


def suite_tornado(loops, files, args):
    # Its tests are modules of the package (tornado/test/*_test.py), so the
    # sdist's package stays in the work copy and is what they import (its
    # optional C speedups unbuilt). Its own runner (tornado.test.runtests)
    # silences the access log, which the tests expect (harness/
    # tornado_setup.py does the same), and turns warnings into errors,
    # which is left to pytest's defaults here, the same on every loop.
    return sdist_suite(
        "tornado", loops, files,
        ["-c", empty_ini("tornado"), "--rootdir", ".", "-o", "python_files=*_test.py",
         "-p", "no:codspeed", "-p", "tornado_setup"],
        ["tornado/test"], drop=("docs", "demos"))


def suite_websockets(loops, files, args):
    src = args.websockets_src
    if not src:
        return None, None, [
            "websockets: not run; its sdists ship no tests (MANIFEST.in prunes tests/), "
            "pass --websockets-src DIR (a websockets source checkout)"
        ]
    src = os.path.abspath(src)
    version = "?"
    vfile = os.path.join(src, "src", "websockets", "version.py")
    if os.path.exists(vfile):
        m = re.search(r'^tag = version = commit = "([^"]+)"', open(vfile).read(), re.M)
        if m:
            version = m.group(1)
    # websockets has no pytest configuration (see empty_ini).
    ini = empty_ini("websockets")
    results, notes = {}, []
    for loop in loops:
        recs, n = run_pytest(
            f"websockets-{loop}", src,
            ["-c", ini, "--rootdir", src, "-p", "no:codspeed",
             *file_args(files, ["tests/asyncio", "tests/legacy"])],
            {"ZUVRS_UPSTREAM_LOOP": loop, "PYTHONPATH": os.path.join(src, "src"),
             "WEBSOCKETS_TESTS_TIMEOUT_FACTOR": str(args.websockets_timeout_factor)},
            SUITE_BUDGET,
        )
        notes += n
        results[loop] = by_file(recs)
    return results, f"websockets {version} source tree", notes


def suite_cpython(loops, files, args):
    results, notes = {}, []
    logs = os.path.join(CACHE, "logs")
    os.makedirs(logs, exist_ok=True)
    for loop in loops:
        out = os.path.join(logs, f"cpython-{loop}.json")
        cmd = [sys.executable, CPYTHON_RUNNER, "--loop", loop, "--json", out,
               "--log", os.path.join(logs, f"cpython-{loop}.log")]
        if NATIVE_STREAMS and loop == "zuvrs":
            cmd.append("--native-streams")
        cmd += [f.replace(".py", "") for f in files] if files else ["--group", "all"]
        if os.path.exists(out):
            os.unlink(out)
        with open(os.path.join(logs, f"cpython-{loop}.out"), "w") as f:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=clean_env(), stdout=f, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_reset_signals)
            try:
                rc = proc.wait(timeout=SUITE_BUDGET)
            except subprocess.TimeoutExpired:
                rc = "budget"
            _kill_group(proc)
            proc.wait()
        if rc or not os.path.exists(out):
            notes.append(f"cpython {loop}: run_cpython_suite.py exited with {rc}")
            continue
        with open(out) as f:
            data = json.load(f)[loop]
        results[loop] = {module.rsplit(".", 1)[-1]: recs for module, recs in data.items()}
    return results, f"CPython {platform.python_version()} Lib/test", notes


SUITE_FUNCS = {
    "cpython": suite_cpython,
    "uvloop": suite_uvloop,
    "anyio": suite_anyio,
    "aiohttp": suite_aiohttp,
    "asyncssh": suite_asyncssh,
    "uvicorn": suite_uvicorn,
    "redis": suite_redis,
    "aioftp": suite_aioftp,
    "tornado": suite_tornado,
    "pyzmq": suite_pyzmq,
    "aioquic": suite_aioquic,
    "websockets": suite_websockets,
}


# --------------------------------------------------------------------------
# counting, tables, ratchet


def count(records):
    c = dict.fromkeys(COLUMNS, 0)
    for rec in records.values():
        o = rec["outcome"]
        if o in ("pass", "xpass"):
            c["passed"] += 1
        elif o == "fail":
            c["failed"] += 1
        elif o in ("skip", "xfail"):
            c["skipped"] += 1
        else:  # error, timeout, crash
            c["errors"] += 1
    return c


def cell(c):
    return "/".join(str(c[k]) for k in COLUMNS) if c else "-"


def suite_rows(files_by_loop, loops):
    files = sorted({f for loop in loops for f in files_by_loop.get(loop, {})})
    rows, totals = [], {loop: dict.fromkeys(COLUMNS, 0) for loop in loops}
    for f in files:
        row = [f]
        for loop in loops:
            recs = files_by_loop.get(loop, {}).get(f)
            if recs is None:
                row.append(None)
                continue
            c = count(recs)
            for k in COLUMNS:
                totals[loop][k] += c[k]
            row.append(c)
        rows.append(row)
    return rows, totals


def text_table(suite, source, files_by_loop, loops):
    rows, totals = suite_rows(files_by_loop, loops)
    width = max([len(r[0]) for r in rows] + [5])
    lines = [
        f"== {suite} ({source}): passed/failed/errors/skipped",
        f"{'file':{width}}" + "".join(f" | {loop:>20}" for loop in loops),
    ]
    lines.append("-" * len(lines[-1]))
    for r in rows:
        lines.append(f"{r[0]:{width}}" + "".join(f" | {cell(c):>20}" for c in r[1:]))
    lines.append("-" * len(lines[1]))
    lines.append(f"{'TOTAL':{width}}" + "".join(f" | {cell(totals[l]):>20}" for l in loops))
    return "\n".join(lines)


# Printed under each suite's table in the markdown.
SUITE_NOTES = {
    "cpython": "Through tests/cpython/run_cpython_suite.py (`--group all`). Most of uvloop's errors "
               "here come from test_utils.TestCase's teardown, which reads `loop._default_executor`, "
               "an attribute of asyncio's BaseEventLoop that uvloop's loop does not have.",
    "uvloop": "zuvrs runs uvloop's `UV` classes through the stand-in `uvloop` package "
              "(tests/upstream/stand_in/). test_fs_event.py and test_libuv_api.py import "
              "uvloop-only extensions and fail to import there.",
    "anyio": "The `[asyncio]` parametrisation only. Most failures on every loop are this "
             "machine's: names that do not resolve in its sandbox, IPv6.",
    "aiohttp": "`--aiohttp-loop=pyloop` with asyncio's default policy replaced. The failures on "
               "every loop are this machine's (file-permission tests run as root, "
               "`import aiohttp.worker` without gunicorn).",
    "asyncssh": "Its tests/util.py replaces socket.getaddrinfo and getnameinfo with test doubles, "
                "which a loop must call as asyncio does. gssapi and python-pkcs11 are not installed "
                "(their tests skip); test_known_hosts_not_readable and "
                "test_trusted_x509_certs_not_readable fail on every loop here (run as root), and so "
                "do nine SFTP and SCP tests of file permissions.",
    "uvicorn": "Its tests/ but tests/benchmarks (codspeed's), one process (its pyproject's "
               "addopts run pytest-xdist), on the loop asyncio's replaced policy makes (AnyIO's "
               "pytest plugin runs them). test_asyncio_run__default_loop_factory asserts that the "
               "default loop is the stdlib's, so it fails wherever the policy is replaced.",
    "redis": "Its tests/test_asyncio against one redis-server (Debian's 7.0) on port 6379, DEBUG allowed; "
             "left out: what needs a cluster, the Redis Stack modules, the fault injector or Entra "
             "ID's libraries. The failures on every loop are commands and options this server "
             "version does not have, and the sentinels a few tests expect.",
    "aioftp": "Its tests/ (pytest-asyncio, strict mode) without its pyproject's -x and coverage "
              "options. Its client imports open_connection by name when it is imported, after "
              "the harness's install() under --native-streams, so both ends use native streams then.",
    "tornado": "Its tornado/test/*_test.py under pytest, from the sdist's source tree, with the "
               "access log silenced as its own runner does (harness/tornado_setup.py); warnings are "
               "not made errors here.",
    "pyzmq": "Its tests/ under its pytest.ini (pytest-asyncio in auto mode); zmq.asyncio's "
             "sockets watch libzmq's file descriptor with add_reader. The C extension is the "
             "installed wheel's.",
    "aioquic": "Its tests/ (unittest classes; test_asyncio.py runs QUIC clients and servers on "
               "datagram endpoints) against the installed wheel's C extension.",
    "websockets": "Its tests/asyncio and tests/legacy, from a source tree (websockets' sdists "
                  "ship no tests), run with WEBSOCKETS_TESTS_TIMEOUT_FACTOR=5.",
}


def previous_sections(path=RESULTS_MD):
    """{suite: (its row of the totals table, its section)} of an existing
    RESULTS.md: what it keeps for suites this machine has no saved run of."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        text = f.read()
    out = {}
    for suite in SUITES:
        row = re.search(rf"^\| {suite} \|.*$", text, re.M)
        section = re.search(rf"^## {suite}\n.*?(?=^## |\Z)", text, re.M | re.S)
        if row and section:
            out[suite] = (row.group(0), section.group(0).rstrip("\n"))
    return out


def markdown(results, sources, loops, notes, meta, kept=None):
    """The tables as markdown; `kept` ({suite: (totals row, section)}, see
    previous_sections) stands in for suites without results."""
    kept = {s: v for s, v in (kept or {}).items() if s not in results}
    out = [
        "# Upstream test suites on zuvrs",
        "",
        "Generated by `tools/upstream.sh` (tests/upstream/run.py); do not edit.",
        f"Each cell is passed / failed / errors / skipped. {meta}",
        "",
        "xfail counts as skipped, a non-strict xpass as passed, a timeout or a crash as an error.",
        "In uvloop's suite the stdlib column is its `AIO` test classes and the zuvrs and uvloop",
        "columns its `UV` classes (and the classes of neither family, which use `uvloop.*`),",
        "so the stdlib column has fewer tests.",
        "",
        "## Totals",
        "",
        "| suite | source | " + " | ".join(loops) + " |",
        "|---|---|" + "---:|" * len(loops),
    ]
    for suite in SUITES:
        if suite in kept:
            out.append(kept[suite][0])
        if suite not in results:
            continue
        _, totals = suite_rows(results[suite], loops)
        cells = [cell(totals[loop]) if loop in results[suite] else "-" for loop in loops]
        out.append(f"| {suite} | {sources[suite]} | " + " | ".join(cells) + " |")
    for suite in SUITES:
        if suite in kept:
            out += [""] + kept[suite][1].split("\n")
        if suite not in results:
            continue
        rows, totals = suite_rows(results[suite], loops)
        out += ["", f"## {suite}", "", "| file | " + " | ".join(loops) + " |", "|---|" + "---:|" * len(loops)]
        for r in rows:
            out.append(f"| {r[0]} | " + " | ".join(cell(c) for c in r[1:]) + " |")
        out.append("| **total** | " + " | ".join(cell(totals[l]) for l in loops) + " |")
        if suite in SUITE_NOTES:
            out += ["", SUITE_NOTES[suite]]
    if notes:
        out += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(out) + "\n"


def regressions(results):
    """Tests that pass on the stdlib loop and not on zuvrs."""
    lines = []
    for suite in SUITES:
        res = results.get(suite, {})
        if "zuvrs" not in res or "asyncio" not in res:
            continue
        for f in sorted(res["asyncio"]):
            for key, ctl in sorted(res["asyncio"][f].items()):
                if ctl["outcome"] not in ("pass", "xpass"):
                    continue
                rec = res["zuvrs"].get(f, {}).get(key)
                if rec is None or rec["outcome"] in ("pass", "xpass", "skip", "xfail"):
                    continue
                lines.append(f"--- [{suite}] {rec['outcome'].upper()}: {rec.get('id', key)}")
                lines.append((rec.get("details") or "").rstrip())
                lines.append("")
    return "\n".join(lines)


def load_ratchet():
    if os.path.exists(RATCHET):
        with open(RATCHET) as f:
            return json.load(f)
    return {"suites": {}}


def passed_counts(results):
    return {
        suite: {f: count(recs)["passed"] for f, recs in sorted(res["zuvrs"].items())}
        for suite, res in results.items()
        if "zuvrs" in res
    }


def check_ratchet(results, selection):
    """Files of the suites run (all of a suite's recorded files, or those of
    its selection) whose zuvrs passed count is below the recorded one; a
    file that gave no result at all counts as 0."""
    ratchet = load_ratchet()["suites"]
    now = passed_counts(results)
    bad = []
    for suite, files in selection.items():
        got = now.get(suite, {})
        for f, recorded in ratchet.get(suite, {}).items():
            if files and not any(f == x or f.startswith(x.rstrip("/") + "/") for x in files):
                continue  # not part of this run
            n = got.get(f, 0)
            if n < recorded:
                bad.append(f"{suite} {f}: {n} passed on zuvrs, ratchet has {recorded}")
    return bad


def update_ratchet(results, allow_lower, meta):
    ratchet = load_ratchet()
    now = passed_counts(results)
    lower = []
    for suite, files in now.items():
        old = ratchet["suites"].get(suite, {})
        for f, n in files.items():
            if n < old.get(f, 0):
                lower.append(f"{suite} {f}: {old[f]} -> {n}")
    if lower and not allow_lower:
        return lower
    for suite, files in now.items():
        ratchet["suites"].setdefault(suite, {}).update(files)
        ratchet["suites"][suite] = dict(sorted(ratchet["suites"][suite].items()))
    ratchet["about"] = (
        "zuvrs's passed count per upstream test file (tests/upstream/run.py); "
        "tools/upstream.sh --check fails when a file's count falls below this."
    )
    ratchet["recorded_with"] = meta
    with open(RATCHET, "w") as f:
        json.dump({"about": ratchet["about"], "recorded_with": ratchet["recorded_with"], "suites": ratchet["suites"]},
                  f, indent=1, sort_keys=False)
        f.write("\n")
    return []


# --------------------------------------------------------------------------


def load_saved(suites, loops):
    """The latest whole-suite run of each suite and loop (saved by every run
    that ran a suite whole): (results, sources, notes)."""
    results, sources, notes = {}, {}, []
    for suite in suites:
        res, commit = {}, None
        for loop in loops:
            path = os.path.join(CACHE, "results", f"{suite}.{loop}.json")
            if os.path.exists(path):
                with open(path) as f:
                    data = json.load(f)
                res[loop], sources[suite] = data["files"], data["source"]
                notes += data["notes"]
                if loop == "zuvrs" and data.get("commit"):
                    commit = data["commit"]
        if res and commit:
            sources[suite] += f"; zuvrs column: commit {commit}"
        if res:
            results[suite] = res
    return results, sources, list(dict.fromkeys(notes))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--suite", action="append", choices=SUITES, help="suite to run (repeatable; default all)")
    p.add_argument("--loop", default=",".join(LOOPS), help="comma-separated: zuvrs,asyncio,uvloop")
    p.add_argument("--file", action="append", default=[],
                   help="a test file of the suite (tests/test_x.py, or a CPython module name); repeatable")
    p.add_argument("--ci", action="store_true", help="zuvrs only, the CI selection, then --check")
    p.add_argument("--check", action="store_true", help="exit 1 if a file's zuvrs passed count fell below the ratchet")
    p.add_argument("--update-ratchet", action="store_true", help="record this run's zuvrs counts (and RESULTS.md)")
    p.add_argument("--allow-lower", action="store_true", help="let --update-ratchet lower counts")
    p.add_argument("--markdown", help="also write the tables as markdown here")
    p.add_argument("--no-install", action="store_true", help="do not pip install tests/upstream/requirements.txt")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: tables, regressions, --check and --update-ratchet from the latest saved "
                        "whole-suite runs of each suite and loop (target/upstream/results/)")
    p.add_argument("--websockets-src", help="a websockets source tree (its sdists have no tests)")
    p.add_argument("--websockets-timeout-factor", type=float, default=5.0,
                   help="WEBSOCKETS_TESTS_TIMEOUT_FACTOR for its tests (default 5: this machine is slow)")
    p.add_argument("--jobs", type=int, default=1,
                   help="run this many suites at once (default 1; each suite's tests still run one at a time)")
    p.add_argument("--native-streams", action="store_true",
                   help="the zuvrs column with native streams (zuvrs.streams.install(); CPython's suite with the "
                        "classes patched in); with --check, compared with the ratchet of plain zuvrs")
    p.add_argument("--asyncio-debug", action="store_true",
                   help="every loop in asyncio's debug mode (PYTHONASYNCIODEBUG=1): compare the loops' columns; "
                        "the ratchet records runs without it")
    args = p.parse_args(argv)
    if args.asyncio_debug:
        if args.update_ratchet or args.check or args.ci:
            p.error("--asyncio-debug: the ratchet records runs without debug mode")
        global ASYNCIO_DEBUG
        ASYNCIO_DEBUG = True
    if args.native_streams:
        if args.update_ratchet:
            p.error("--native-streams: the ratchet records zuvrs without them")
        global NATIVE_STREAMS
        NATIVE_STREAMS = True

    loops = [l for l in args.loop.split(",") if l]
    for l in loops:
        if l not in LOOPS:
            p.error(f"unknown loop {l!r}")
    suites = args.suite or list(SUITES)
    selection = {s: args.file for s in suites}
    if args.ci:
        loops = ["zuvrs"]
        suites = [s for s in (args.suite or CI_SELECTION) if s in CI_SELECTION]
        selection = {s: CI_SELECTION[s] for s in suites}
        args.check = True
    loops = [l for l in LOOPS if l in loops]  # table order

    os.makedirs(CACHE, exist_ok=True)
    if not args.no_install and not args.report_only:
        install_requirements()
    import zuvrs  # noqa: F401  (fail early if it is not installed)

    t_start = time.monotonic()
    results, sources, notes, timings = {}, {}, [], {}
    saved = os.path.join(CACHE, "results")
    os.makedirs(saved, exist_ok=True)

    def run_suite(suite):
        t0 = time.monotonic()
        log(f"== {suite}: {', '.join(loops)}")
        res, source, n = SUITE_FUNCS[suite](loops, selection[suite], args)
        seconds = time.monotonic() - t0
        for note in n:
            log(f"   note: {note}")
        if res is not None:
            # Only plain whole-suite runs are kept for RESULTS.md and --report-only.
            if not selection[suite] and not NATIVE_STREAMS and not ASYNCIO_DEBUG:
                for loop, files in res.items():
                    with open(os.path.join(saved, f"{suite}.{loop}.json"), "w") as f:
                        json.dump({"source": source, "notes": n, "commit": git_commit(),
                                   "seconds": round(seconds), "files": files}, f)
            log(f"== {suite}: {seconds:.0f}s\n" + text_table(suite, source, res, loops))
        return res, source, n, seconds

    if args.report_only:
        for suite in suites:
            r, so, n = load_saved([suite], loops)
            results.update(r)
            sources.update(so)
            notes += n
    else:
        # With --jobs, the longest suites start first; the tables come in
        # the usual order at the end either way.
        order = sorted(suites, key=LONGEST_FIRST.index) if args.jobs > 1 else suites
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            runs = dict(zip(order, pool.map(run_suite, order)))
        for suite in suites:
            res, source, n, seconds = runs[suite]
            notes += n
            if res is not None:
                results[suite], sources[suite] = res, source
                timings[suite] = seconds

    notes = list(dict.fromkeys(notes))
    meta = (
        f"CPython {platform.python_version()}, zuvrs {installed_version('zuvrs')}, "
        f"uvloop {installed_version('uvloop')}, {datetime.date.today().isoformat()}"
    )
    total = time.monotonic() - t_start
    log("")
    for suite in results:
        log(text_table(suite, sources[suite], results[suite], loops))
        log("")
    log("time: " + ", ".join(f"{s} {t:.0f}s" for s, t in timings.items()) + f"; total {total:.0f}s")

    with open(os.path.join(CACHE, "last-run.json"), "w") as f:
        json.dump({"meta": meta, "loops": loops, "sources": sources, "notes": notes, "results": results}, f)
    md = markdown(results, sources, loops, notes, meta)
    with open(os.path.join(CACHE, "last-run.md"), "w") as f:
        f.write(md)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(md)
    reg = regressions(results)
    with open(os.path.join(CACHE, "regressions.txt"), "w") as f:
        f.write(reg)
    n_reg = reg.count("\n--- [") + reg.startswith("--- [")
    log(f"{n_reg} tests pass on the stdlib loop and not on zuvrs: target/upstream/regressions.txt")

    rc = 0
    if args.update_ratchet:
        lower = update_ratchet(results, args.allow_lower, meta)
        if lower:
            log("not updating the ratchet: these counts would go down (--allow-lower to accept):")
            for line in lower:
                log("  " + line)
            rc = 1
        else:
            # RESULTS.md shows every suite and loop: the latest whole-suite
            # run of each (this one's included); a suite never run whole
            # here keeps what RESULTS.md had for it.
            all_results, all_sources, all_notes = load_saved(SUITES, LOOPS)
            kept = previous_sections()
            # A suite saved here on some loops only keeps its section (a
            # table with columns missing would hide what they showed).
            for suite in [s for s, r in all_results.items() if set(r) != set(LOOPS) and s in kept]:
                del all_results[suite]
            with open(RESULTS_MD, "w") as f:
                f.write(markdown(all_results, all_sources, list(LOOPS), all_notes, meta, kept))
            log("ratchet and RESULTS.md updated")
    if args.check:
        bad = check_ratchet(results, {s: selection[s] for s in suites if "zuvrs" in loops})
        if bad:
            log("RATCHET: zuvrs passes fewer tests than recorded in tests/upstream/ratchet.json:")
            for line in bad:
                log("  " + line)
            rc = 1
        else:
            log("ratchet: no file below its recorded count")
    return rc


if __name__ == "__main__":
    sys.exit(main())
