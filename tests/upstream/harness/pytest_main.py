"""Starts pytest for tests/upstream/run.py.

Run as a script, so sys.path[0] is this directory (the plugin
``zuvrs_upstream`` is importable) and not the current directory, which is
the unpacked sdist whose own source package (``uvloop/``, ``aiohttp/``)
must not shadow the installed one.

Once pytest has finished, the process exits at once: a test that failed can
leave a non-daemon thread blocked for ever (a server thread waiting in
recv), which would keep the interpreter joining it at shutdown. Such
threads are listed in the log first.
"""

import os
import sys
import threading

import pytest

if __name__ == "__main__":
    rc = pytest.main(sys.argv[1:])
    left = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if left:
        print(f"zuvrs_upstream: {len(left)} non-daemon threads still running after the session: "
              + ", ".join(t.name for t in left), file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(rc))
