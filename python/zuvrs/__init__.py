"""zuvrs: a fast libuv-backed asyncio event loop written in Rust.

    import zuvrs
    zuvrs.run(main())                      # like asyncio.run()
    zuvrs.install()                        # make asyncio use zuvrs loops
    asyncio.run(main(), loop_factory=zuvrs.new_event_loop)   # Python 3.12+
"""

import asyncio as _asyncio
import sys as _sys
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
    "__version__",
)


def new_event_loop():
    """Return a new zuvrs event loop."""
    return Loop()


def _base_policy():
    events = _asyncio.events
    # Renamed with a leading underscore in 3.14, when policies were deprecated.
    return getattr(events, "BaseDefaultEventLoopPolicy", None) or events._BaseDefaultEventLoopPolicy


class EventLoopPolicy(_base_policy()):
    """An asyncio event loop policy whose loops are zuvrs loops.

    zuvrs loops watch their own child processes, so the child watcher API
    asyncio's Unix policy has up to 3.13 is accepted and has no effect.
    """

    def _loop_factory(self):
        return new_event_loop()

    def get_child_watcher(self):
        return getattr(self, "_child_watcher", None)

    def set_child_watcher(self, watcher):
        self._child_watcher = watcher

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
