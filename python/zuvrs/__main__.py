"""python -m zuvrs: run a script or a module with zuvrs as asyncio's loop.

    python -m zuvrs app.py [args]       like `python app.py [args]`
    python -m zuvrs -m module [args]    like `python -m module [args]`
    python -m zuvrs -c code [args]      like `python -c code [args]`
    python -m zuvrs --version           zuvrs's version
    python -m zuvrs --info              versions and build details for a bug report
    python -m zuvrs --stats 10 app.py   like `python app.py`, with a line of loop
                                        metrics on stderr every 10 s (docs/metrics.md)

The program runs with ``zuvrs.install()`` done, so ``asyncio.run()``,
``asyncio.new_event_loop()`` and everything built on them (uvicorn's
``--loop asyncio``, Hypercorn's asyncio worker, IsolatedAsyncioTestCase...)
get zuvrs loops. ``sys.argv`` is what Python would set: the script's path
(or the module's file, or ``-c``) followed by the arguments.
"""

import os
import sys

USAGE = """\
usage: python -m zuvrs [--version | --info]
       python -m zuvrs [--stats INTERVAL] [-m module | -c code | script] [args ...]

Runs a Python program with zuvrs installed as asyncio's event loop
(zuvrs.install()), with sys.argv as Python would set it.

  script       run a Python file (or a directory or zip file with __main__.py)
  -m module    run a library module as a script, like python -m
  -c code      run a program passed as a string, like python -c
  --stats INTERVAL
               time the loops' turns (zuvrs.stats.enable()) and print a line
               of each open loop's figures to stderr every INTERVAL seconds:
               busy share, turns, callbacks and I/O events per second, lag
               p50 / p99 / max, bytes per second read and written, queued
               callbacks and timers, and the slowest callback of the interval
  --version    print zuvrs's version and exit
  --info       print zuvrs, libuv, OpenSSL and Python versions, the build
               and the platform (for bug reports) and exit
  -h, --help   print this message and exit
"""


def info():
    """The lines `python -m zuvrs --info` prints, as (label, value) pairs."""
    import platform
    import ssl
    import sysconfig

    import zuvrs
    from zuvrs import _zuvrs

    libuv = ".".join(str(n) for n in zuvrs.libuv_version())
    impl = platform.python_implementation()
    gil = ""
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        enabled = sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True
        gil = ", free-threaded build, GIL " + ("enabled" if enabled else "disabled")
    return [
        ("zuvrs", zuvrs.__version__),
        ("libuv", libuv),
        ("OpenSSL", ssl.OPENSSL_VERSION),
        ("Python", f"{platform.python_version()} ({impl}{gil})"),
        ("Python build", " ".join(sys.version.split())),
        ("executable", sys.executable),
        ("build profile", _zuvrs.BUILD_PROFILE),
        ("context sharing", _zuvrs.CONTEXT_SHARING),
        ("platform", platform.platform()),
        ("zuvrs location", os.path.dirname(os.path.abspath(zuvrs.__file__))),
    ]


def _fail(message):
    sys.stderr.write(f"python -m zuvrs: {message}\n")
    sys.stderr.write("try 'python -m zuvrs --help'\n")
    return 2


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        sys.stderr.write(USAGE)
        return 2
    first = args[0]
    if first in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0
    if first == "--version":
        import zuvrs

        print(f"zuvrs {zuvrs.__version__}")
        return 0
    if first == "--info":
        rows = info()
        width = max(len(label) for label, _ in rows)
        for label, value in rows:
            print(f"{label + ':':<{width + 1}} {value}")
        return 0
    if first == "--stats" or first.startswith("--stats="):
        if first == "--stats":
            if len(args) < 2:
                return _fail("argument expected for the --stats option")
            value, args = args[1], args[2:]
        else:
            value, args = first.split("=", 1)[1], args[1:]
        try:
            interval = float(value)
        except ValueError:
            interval = float("nan")
        if not interval > 0 or interval == float("inf"):
            return _fail(f"--stats takes a number of seconds above zero, not {value!r}")
        if not args:
            return _fail("a program to run is needed after --stats INTERVAL")
        _start_stats_reporter(interval)
        first = args[0]
    if first == "--":
        args = args[1:]
        if not args:
            return _fail("a script is needed after --")
        return _run_script(args[0], args[1:])
    if first in ("-m", "-c"):
        if len(args) < 2:
            return _fail(f"argument expected for the {first} option")
        if first == "-m":
            return _run_module(args[1], args[2:])
        return _run_code(args[1], args[2:])
    if first.startswith("-m") or first.startswith("-c"):
        # -mmodule / -ccode, as Python accepts them.
        if first[1] == "m":
            return _run_module(first[2:], args[1:])
        return _run_code(first[2:], args[1:])
    if first.startswith("-") and first != "-":
        return _fail(f"unknown option {first}")
    return _run_script(first, args[1:])


def _install():
    import zuvrs

    zuvrs.install()


def _start_stats_reporter(interval, stream=None):
    """--stats: loops made from now on time their turns, and a daemon
    thread writes a summary line of each open loop every `interval` seconds
    (figures since its previous line; the first covers the loop's life)."""
    import threading
    import time
    import weakref

    from zuvrs import stats

    stats.enable()
    out = stream if stream is not None else sys.stderr
    previous = weakref.WeakKeyDictionary()

    def report():
        while True:
            time.sleep(interval)
            try:
                live = stats.loops()
            except RuntimeError:  # loops made meanwhile by another thread
                continue
            for loop in live:
                try:
                    now = loop.stats()
                except Exception:  # closed meanwhile
                    continue
                line = stats.summary(now, previous.get(loop), stats._number(loop))
                previous[loop] = now
                try:
                    out.write(line + "\n")
                    out.flush()
                except (OSError, ValueError):  # stderr closed
                    return

    threading.Thread(target=report, name="zuvrs-stats", daemon=True).start()


def _run_script(path, args):
    import runpy

    if path == "-":
        return _run_code(sys.stdin.read(), args, argv0="-", filename="<stdin>")
    if not os.path.exists(path):
        sys.stderr.write(
            f"{sys.executable}: can't open file {os.path.abspath(path)!r}: "
            f"[Errno 2] No such file or directory\n"
        )
        return 2
    sys.argv[:] = [path, *args]
    if os.path.isdir(path) or _is_zip(path):
        # A directory or zip file with __main__.py: as Python does, it goes
        # first on sys.path (in place of the current directory) and its
        # __main__ module runs as `python -m __main__` would.
        if _first_path_entry_is_ours():
            sys.path[0] = os.path.abspath(path)
        else:
            sys.path.insert(0, os.path.abspath(path))
        _install()
        runpy._run_module_as_main("__main__", alter_argv=False)
        return 0
    # As `python script.py`: the script's directory comes first on sys.path
    # (in place of the current directory `python -m zuvrs` put there), the
    # script is __main__ for good, its __file__ and code are named by its
    # absolute path while sys.argv[0] stays as given.
    import builtins
    import io
    import types
    from importlib.machinery import SourceFileLoader

    filename = os.path.abspath(path)
    if _first_path_entry_is_ours():
        sys.path[0] = os.path.dirname(filename)
    with io.open_code(filename) as f:
        source = f.read()
    module = types.ModuleType("__main__")
    module.__dict__.update(
        __file__=filename,
        __cached__=None,
        __builtins__=builtins,
        __loader__=SourceFileLoader("__main__", filename),
    )
    sys.modules["__main__"] = module
    _install()
    exec(compile(source, filename, "exec"), module.__dict__)
    return 0


def _first_path_entry_is_ours():
    # `python -m zuvrs` put the current directory first on sys.path, unless
    # Python runs with -P / PYTHONSAFEPATH (3.11+) or -I.
    return not (getattr(sys.flags, "safe_path", False) or sys.flags.isolated)


def _is_zip(path):
    import zipfile

    return zipfile.is_zipfile(path)


def _run_module(name, args):
    import runpy

    if not name:
        return _fail("argument expected for the -m option")
    # As `python -m module`: argv[0] is "-m" while the module is found, then
    # the module's file; the module replaces __main__ for good.
    sys.argv[:] = ["-m", *args]
    _install()
    run_as_main = getattr(runpy, "_run_module_as_main", None)
    if run_as_main is not None:
        run_as_main(name, alter_argv=True)
    else:  # pragma: no cover - every CPython has it
        runpy.run_module(name, run_name="__main__", alter_sys=True)
    return 0


def _run_code(code, args, argv0="-c", filename="<string>"):
    import builtins
    import types

    sys.argv[:] = [argv0, *args]
    # As `python -c`: the current directory ('') comes first on sys.path.
    if _first_path_entry_is_ours():
        sys.path[0] = ""
    module = types.ModuleType("__main__")
    module.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = module
    _install()
    exec(compile(code, filename, "exec"), module.__dict__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
