"""zuvrs: a fast libuv-backed asyncio event loop written in Rust.

    import zuvrs
    zuvrs.run(main())                      # like asyncio.run()
    zuvrs.install()                        # make asyncio use zuvrs loops
    asyncio.run(main(), loop_factory=zuvrs.new_event_loop)   # Python 3.12+
"""

import asyncio as _asyncio
import sys as _sys
import threading as _threading
import warnings as _warnings

from . import _zuvrs
from ._loop import Loop
from ._runner import run
from ._zuvrs import Handle, TimerHandle, libuv_version

__version__ = _zuvrs.__version__

__all__ = (
    "Loop",
    "Handle",
    "TimerHandle",
    "EventLoopPolicy",
    "new_event_loop",
    "install",
    "run",
    "libuv_version",
    "stats",
    "__version__",
)


def __getattr__(name):
    # zuvrs.stats is imported when first used (it costs start-up time).
    if name == "stats":
        import importlib

        return importlib.import_module(".stats", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def new_event_loop(*, stats=None):
    """Return a new zuvrs event loop; `stats`: whether it times its turns
    for ``loop.stats()`` (None: zuvrs.stats.enabled(); docs/metrics.md)."""
    return Loop(stats=stats)


def _base_policy():
    events = _asyncio.events
    # Renamed with a leading underscore in 3.14, when policies were deprecated.
    return getattr(events, "BaseDefaultEventLoopPolicy", None) or events._BaseDefaultEventLoopPolicy


class EventLoopPolicy(_base_policy()):
    """An asyncio event loop policy whose loops are zuvrs loops.

    zuvrs loops watch their own child processes. Up to Python 3.13 the
    policy still keeps a child watcher as asyncio's Unix policy does (made
    lazily: a PidfdChildWatcher where pidfds work on 3.12+, else a
    ThreadedChildWatcher), for the stock asyncio loops of the same process,
    which use it for their subprocesses up to 3.12.
    """

    def _loop_factory(self):
        return new_event_loop()

    if _sys.version_info < (3, 14):
        # asyncio's _UnixDefaultEventLoopPolicy, same behaviour and warnings.

        def __init__(self):
            super().__init__()
            self._watcher = None

        def _init_watcher(self):
            from asyncio import unix_events

            with _asyncio.events._lock:
                if self._watcher is None:
                    if _sys.version_info >= (3, 12) and unix_events.can_use_pidfd():
                        self._watcher = unix_events.PidfdChildWatcher()
                    else:
                        self._watcher = unix_events.ThreadedChildWatcher()
                        if (_sys.version_info < (3, 12)
                                and _threading.current_thread() is _threading.main_thread()):
                            self._watcher.attach_loop(self._local._loop)

        def set_event_loop(self, loop):
            """Set the event loop; from the main thread, also attach the child
            watcher (if one was made) to it, as asyncio's Unix policy does."""
            super().set_event_loop(loop)
            if self._watcher is not None and _threading.current_thread() is _threading.main_thread():
                self._watcher.attach_loop(loop)

        def get_child_watcher(self):
            """The watcher for the child processes of stock asyncio loops
            (zuvrs loops do not use it), made on first use."""
            if self._watcher is None:
                self._init_watcher()
            if _sys.version_info >= (3, 12):
                _warnings._deprecated(
                    "get_child_watcher",
                    "{name!r} is deprecated as of Python 3.12 and will be "
                    "removed in Python {remove}.",
                    remove=(3, 14),
                )
            return self._watcher

        def set_child_watcher(self, watcher):
            """Set the watcher for the child processes of stock asyncio loops."""
            from asyncio import unix_events

            assert watcher is None or isinstance(watcher, unix_events.AbstractChildWatcher)
            if self._watcher is not None:
                self._watcher.close()
            self._watcher = watcher
            if _sys.version_info >= (3, 12):
                _warnings._deprecated(
                    "set_child_watcher",
                    "{name!r} is deprecated as of Python 3.12 and will be "
                    "removed in Python {remove}.",
                    remove=(3, 14),
                )

    def __repr__(self):
        return f"<{type(self).__name__}>"


def install():
    """Make asyncio create zuvrs loops (sets EventLoopPolicy).

    On Python 3.12+ prefer ``asyncio.run(main(), loop_factory=zuvrs.new_event_loop)``
    or ``zuvrs.run(main())``; event loop policies are deprecated from 3.14.
    """
    with _warnings.catch_warnings():
        if _sys.version_info >= (3, 14):
            _warnings.simplefilter("ignore", DeprecationWarning)
        _asyncio.set_event_loop_policy(EventLoopPolicy())
