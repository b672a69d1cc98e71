"""A stand-in ``uvloop`` package whose public names are zuvrs's.

tests/upstream/run.py puts a copy of this directory first on sys.path (and
PYTHONPATH, for the child processes the tests start) only while it runs
uvloop's own test suite against zuvrs, with uvloop's ``_testbase.py`` from
the uvloop sdist copied beside it. uvloop's ``UVTestCase`` then makes its
loops with ``uvloop.new_event_loop()`` and policies with
``uvloop.EventLoopPolicy()``, which are zuvrs's.

The names are plain aliases, so a test that calls ``uvloop.run(...,
loop_factory=...)`` or checks ``isinstance(loop, uvloop.Loop)`` sees exactly
what a program that swaps ``import uvloop`` for zuvrs would see.
Extensions only uvloop has (``uvloop.loop.libuv_get_loop_t_ptr``,
``FileSystemEvent``, ...) are missing on purpose.
"""

import zuvrs as _zuvrs
from zuvrs import EventLoopPolicy, Loop, install, new_event_loop, run

__version__ = _zuvrs.__version__

__all__ = ("new_event_loop", "run", "install", "EventLoopPolicy", "Loop")
