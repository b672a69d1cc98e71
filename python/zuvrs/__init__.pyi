import asyncio
import contextvars
import sys
from collections.abc import Coroutine
from typing import Any, Callable, TypeVar

from typing_extensions import deprecated

from . import stats as stats
from .stats import LoopStats

if sys.version_info >= (3, 11):
    from typing import TypeVarTuple, Unpack
else:
    from typing_extensions import TypeVarTuple, Unpack
if sys.version_info >= (3, 14):
    from asyncio.events import _BaseDefaultEventLoopPolicy as _BasePolicy
else:
    from asyncio.events import BaseDefaultEventLoopPolicy as _BasePolicy
    from asyncio.unix_events import AbstractChildWatcher

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")

__version__: str

def libuv_version() -> tuple[int, int, int]: ...

class Handle:
    def cancel(self) -> None: ...
    def cancelled(self) -> bool: ...
    def get_context(self) -> contextvars.Context: ...

class TimerHandle:
    def cancel(self) -> None: ...
    def cancelled(self) -> bool: ...
    def when(self) -> float: ...
    def get_context(self) -> contextvars.Context: ...
    def __lt__(self, other: TimerHandle) -> bool: ...
    def __le__(self, other: TimerHandle) -> bool: ...
    def __gt__(self, other: TimerHandle) -> bool: ...
    def __ge__(self, other: TimerHandle) -> bool: ...

class Loop(asyncio.BaseEventLoop):
    def __init__(self, *, stats: bool | None = None) -> None: ...
    def stats(self, reset: bool = False) -> LoopStats: ...
    def call_soon(  # type: ignore[override]
        self,
        callback: Callable[[Unpack[_Ts]], object],
        *args: Unpack[_Ts],
        context: contextvars.Context | None = None,
    ) -> Handle: ...
    def call_soon_threadsafe(  # type: ignore[override]
        self,
        callback: Callable[[Unpack[_Ts]], object],
        *args: Unpack[_Ts],
        context: contextvars.Context | None = None,
    ) -> Handle: ...
    def call_later(  # type: ignore[override]
        self,
        delay: float,
        callback: Callable[[Unpack[_Ts]], object],
        *args: Unpack[_Ts],
        context: contextvars.Context | None = None,
    ) -> TimerHandle: ...
    def call_at(  # type: ignore[override]
        self,
        when: float,
        callback: Callable[[Unpack[_Ts]], object],
        *args: Unpack[_Ts],
        context: contextvars.Context | None = None,
    ) -> TimerHandle: ...

class EventLoopPolicy(_BasePolicy):
    def get_event_loop(self) -> asyncio.AbstractEventLoop: ...
    def set_event_loop(self, loop: asyncio.AbstractEventLoop | None) -> None: ...
    def new_event_loop(self) -> Loop: ...
    # Up to 3.13, as asyncio's Unix policy: the watcher serves stock asyncio
    # loops (zuvrs loops watch their own children).
    if sys.version_info >= (3, 12) and sys.version_info < (3, 14):
        @deprecated("Deprecated since Python 3.12; removed in Python 3.14.")
        def get_child_watcher(self) -> AbstractChildWatcher: ...
        @deprecated("Deprecated since Python 3.12; removed in Python 3.14.")
        def set_child_watcher(self, watcher: AbstractChildWatcher | None) -> None: ...
    elif sys.version_info < (3, 12):
        def get_child_watcher(self) -> AbstractChildWatcher: ...
        def set_child_watcher(self, watcher: AbstractChildWatcher | None) -> None: ...

def new_event_loop(*, stats: bool | None = None) -> Loop: ...
def install() -> None: ...
def run(
    main: Coroutine[Any, Any, _T],
    *,
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
    debug: bool | None = None,
) -> _T: ...
