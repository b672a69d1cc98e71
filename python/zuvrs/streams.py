"""Native asyncio streams.

``StreamReader``, ``StreamReaderProtocol`` and ``StreamWriter`` here are
subclasses of asyncio's own classes (``isinstance`` checks and type hints
hold) whose per-read and per-write work is native (src/streams):

- ``StreamReader``: the buffer (``_buffer`` is a real ``bytearray``, made
  when first asked for and kept while anything holds it), limit,
  EOF, exception and waiter are native, and so are ``read``,
  ``readexactly``, ``readline``, ``readuntil`` (a tuple of separators from
  3.13), ``__anext__``, ``feed_data``, ``feed_eof``, ``at_eof``,
  ``exception`` and ``set_exception``. A read the buffer can satisfy
  completes without creating a future. The reads return awaitables with the
  coroutine protocol, which do what asyncio's coroutines do, error for error.
- ``StreamReaderProtocol``: on a zuvrs transport (TCP, Unix, TLS), the
  transport appends what it reads to the reader directly, with no
  ``data_received`` frame; flow control is asyncio's (reading pauses above
  twice the limit and resumes at or below it). Its state and its steps
  once per connection (``connection_made``, with a server's writer and
  handler task, ``connection_lost``, ``eof_received``) are native.
- ``StreamWriter``: ``write`` / ``writelines`` go straight to a zuvrs
  transport's core, and ``drain()`` is complete at once (no coroutine frame)
  when writing is not paused and there is nothing to raise.

They work on any loop and transport (what is not a zuvrs transport is fed
through ``data_received`` as in asyncio). Use them through this module's
``open_connection``, ``start_server``, ``open_unix_connection`` and
``start_unix_server`` (asyncio's signatures and results), or ``install()``,
which makes asyncio's own four functions use them whenever the running loop
is a zuvrs loop (``uninstall()`` undoes it). Importing zuvrs changes nothing
in asyncio.

A subclass of ``StreamReader`` that overrides one of the methods others are
built on (``readuntil``, ``feed_data``, ``_wait_for_data``, ...) gets
asyncio's own versions of the methods that depend on it, so its override is
called as it would be under asyncio.
"""

import asyncio
import collections.abc
import functools
import sys
from asyncio import events, format_helpers
from asyncio import streams as _aio
from collections.abc import Awaitable, Callable
from typing import Any, Union

from . import _zuvrs
from .transports import SocketTransport
from .transports._tls import SSLTransport

__all__ = (
    "StreamReader",
    "StreamReaderProtocol",
    "StreamWriter",
    "open_connection",
    "start_server",
    "open_unix_connection",
    "start_unix_server",
    "install",
    "uninstall",
    "installed",
)

_DEFAULT_LIMIT = 2**16  # asyncio's

# A server's callback: a function or coroutine function of (reader, writer).
_ClientConnected = Callable[["StreamReader", "StreamWriter"], Union[Awaitable[None], None]]

# The reads' awaitables are coroutines as far as asyncio can tell.
collections.abc.Coroutine.register(_zuvrs.StreamRead)
collections.abc.Coroutine.register(_zuvrs.Completed)

# Which methods each native one stands in for asyncio's on top of: when a
# subclass overrides one of those, the method is asyncio's for it.
_BUILT_ON = {
    "readuntil": ("_wait_for_data", "_maybe_resume_transport"),
    "read": ("_wait_for_data", "_maybe_resume_transport"),
    "readexactly": ("_wait_for_data", "_maybe_resume_transport"),
    "readline": ("readuntil", "_wait_for_data", "_maybe_resume_transport"),
    "__anext__": ("readline",),
    "feed_data": ("_wakeup_waiter",),
    "feed_eof": ("_wakeup_waiter",),
}


class StreamReader(_zuvrs.StreamReaderCore, _aio.StreamReader):
    """asyncio.StreamReader with its state and reads native."""

    def __init__(self, limit=_DEFAULT_LIMIT, loop=None):
        if loop is None or type(limit) is not int or limit <= 0:
            # asyncio's own: its errors, its choice of loop and warnings.
            super().__init__(limit, loop)
            return
        self._set_up(limit, loop)
        if loop.get_debug():
            self._source_traceback = format_helpers.extract_stack(sys._getframe(1))

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name, bases in _BUILT_ON.items():
            if name in cls.__dict__:
                continue
            if any(getattr(cls, base) is not getattr(StreamReader, base) for base in bases):
                setattr(cls, name, getattr(_aio.StreamReader, name))


class StreamReaderProtocol(_zuvrs.StreamReaderProtocolCore, _aio.StreamReaderProtocol):
    """asyncio.StreamReaderProtocol with its state and once-per-connection
    steps native (src/streams/protocol.rs): a zuvrs transport feeds its
    native reader directly, and its server connections get zuvrs writers.

    Two of asyncio's per-connection objects are made when first used: the
    deque of drain waiters (a drain only waits while writing is paused) and
    the future ``wait_closed()`` awaits (made done if the connection is over
    already). A connection that nobody waits on makes neither."""

    def __init__(self, stream_reader, client_connected_cb=None, loop=None):
        if loop is None:
            # asyncio's choice of loop, with its warnings.
            super().__init__(stream_reader, client_connected_cb)
            return
        self._set_up(stream_reader, client_connected_cb, loop)

    def __del__(self):
        # asyncio's: an exception the closing future holds is taken, so it
        # is not reported (nothing to do if it was never made).
        closed = self._closed_future
        if closed is not None and closed.done() and not closed.cancelled():
            closed.exception()


class StreamWriter(_zuvrs.StreamWriterCore, _aio.StreamWriter):
    """asyncio.StreamWriter whose write, writelines and drain are native
    (and whose unused completed future, ``_complete_fut``, is made only if
    something asks for it)."""

    def __init__(self, transport, protocol, reader, loop):
        assert reader is None or isinstance(reader, _aio.StreamReader)
        self._set_up(transport, protocol, reader, loop)

    # What drain() returns when it has to wait or raise.
    _drain_coroutine = _aio.StreamWriter.drain


# The methods each native class defines ahead of asyncio's, and what they
# are built on: one patched on asyncio's class while the program runs
# (mock.patch.object(asyncio.StreamWriter, "write")) is asyncio's for the
# native class too, as it would be for asyncio's own streams
# (src/streams/patched.rs). The protocol's data_received and the reader's
# feed_data are what a transport feeding the reader natively stands in for.
_NATIVE_METHODS = {
    _zuvrs.StreamReaderCore: (
        _aio.StreamReader,
        ("read", "readexactly", "readline", "readuntil", "__anext__", "feed_data", "feed_eof", "at_eof",
         "exception", "set_exception", "set_transport", "_maybe_resume_transport", "_wakeup_waiter",
         "_wait_for_data"),
        _BUILT_ON,
    ),
    _zuvrs.StreamWriterCore: (_aio.StreamWriter, ("write", "writelines", "drain"), {}),
    _zuvrs.StreamReaderProtocolCore: (
        _aio.StreamReaderProtocol,
        ("connection_made", "connection_lost", "eof_received", "_get_close_waiter", "data_received"),
        {},
    ),
}
for _core, (_asyncio_class, _names, _built_on) in _NATIVE_METHODS.items():
    _zuvrs.watch_asyncio_patches(_core, _asyncio_class, _names, _built_on)
del _core, _asyncio_class, _names, _built_on

# What the protocol's connection_made decides by: the transports whose core
# can feed a reader natively (and SocketTransport's own get_extra_info,
# read there), the reader whose feed_data that is, the server's writer.
_zuvrs.StreamReaderProtocolCore._configure(SocketTransport, SSLTransport, StreamReader.feed_data, StreamWriter)


# -- the four functions -------------------------------------------------------


async def open_connection(
    host: Any = None, port: Any = None, *, limit: int = _DEFAULT_LIMIT, **kwds: Any
) -> tuple[StreamReader, StreamWriter]:
    """asyncio.open_connection with native streams."""
    return await _open_connection(events.get_running_loop(), host, port, limit=limit, **kwds)


async def _open_connection(loop, host=None, port=None, *, limit=_DEFAULT_LIMIT, **kwds):
    reader = StreamReader(limit=limit, loop=loop)
    protocol = StreamReaderProtocol(reader, loop=loop)
    transport, _ = await loop.create_connection(lambda: protocol, host, port, **kwds)
    writer = StreamWriter(transport, protocol, reader, loop)
    return reader, writer


async def start_server(
    client_connected_cb: _ClientConnected, host: Any = None, port: Any = None, *, limit: int = _DEFAULT_LIMIT,
    **kwds: Any,
) -> asyncio.Server:
    """asyncio.start_server with native streams."""
    return await _start_server(events.get_running_loop(), client_connected_cb, host, port, limit=limit, **kwds)


async def _start_server(loop, client_connected_cb, host=None, port=None, *, limit=_DEFAULT_LIMIT, **kwds):
    return await loop.create_server(_protocol_factory(client_connected_cb, limit, loop), host, port, **kwds)


async def open_unix_connection(
    path: Any = None, *, limit: int = _DEFAULT_LIMIT, **kwds: Any
) -> tuple[StreamReader, StreamWriter]:
    """asyncio.open_unix_connection with native streams."""
    return await _open_unix_connection(events.get_running_loop(), path, limit=limit, **kwds)


async def _open_unix_connection(loop, path=None, *, limit=_DEFAULT_LIMIT, **kwds):
    reader = StreamReader(limit=limit, loop=loop)
    protocol = StreamReaderProtocol(reader, loop=loop)
    transport, _ = await loop.create_unix_connection(lambda: protocol, path, **kwds)
    writer = StreamWriter(transport, protocol, reader, loop)
    return reader, writer


async def start_unix_server(
    client_connected_cb: _ClientConnected, path: Any = None, *, limit: int = _DEFAULT_LIMIT, **kwds: Any
) -> asyncio.Server:
    """asyncio.start_unix_server with native streams."""
    return await _start_unix_server(events.get_running_loop(), client_connected_cb, path, limit=limit, **kwds)


async def _start_unix_server(loop, client_connected_cb, path=None, *, limit=_DEFAULT_LIMIT, **kwds):
    return await loop.create_unix_server(_protocol_factory(client_connected_cb, limit, loop), path, **kwds)


def _protocol_factory(client_connected_cb, limit, loop):
    def factory():
        reader = StreamReader(limit=limit, loop=loop)
        return StreamReaderProtocol(reader, client_connected_cb, loop=loop)

    return factory


# -- install() ------------------------------------------------------------------

_FUNCTIONS = {
    "open_connection": open_connection,
    "start_server": start_server,
    "open_unix_connection": open_unix_connection,
    "start_unix_server": start_unix_server,
}

# The same, given the running loop (install()'s dispatch has asked for it
# already; each ask costs a getpid() system call before 3.12).
_ON_LOOP = {
    "open_connection": _open_connection,
    "start_server": _start_server,
    "open_unix_connection": _open_unix_connection,
    "start_unix_server": _start_unix_server,
}

# name -> asyncio's function, while installed.
_replaced: dict[str, Any] = {}


def _on_zuvrs_loops(name, native, original):
    """asyncio's function `name`, which is `native` when the running loop
    is a zuvrs loop."""
    from ._loop import Loop

    on_loop = _ON_LOOP[name]

    @functools.wraps(original)
    async def dispatch(*args, **kwargs):
        loop = events.get_running_loop()
        if isinstance(loop, Loop):
            return await on_loop(loop, *args, **kwargs)
        return await original(*args, **kwargs)

    dispatch._zuvrs_native = native
    return dispatch


def install() -> None:
    """Makes asyncio's open_connection, start_server, open_unix_connection
    and start_unix_server use native streams whenever the running loop is a
    zuvrs loop (other loops get asyncio's as before). Call it before code
    that imported those functions by name (``from asyncio import
    open_connection``) has done so, or that code keeps asyncio's."""
    for name, native in _FUNCTIONS.items():
        if name in _replaced:
            continue
        original = getattr(_aio, name)
        dispatch = _on_zuvrs_loops(name, native, original)
        _replaced[name] = original
        setattr(_aio, name, dispatch)
        setattr(asyncio, name, dispatch)


def uninstall() -> None:
    """Puts asyncio's own functions back (where install() put its own)."""
    for name, original in list(_replaced.items()):
        for module in (_aio, asyncio):
            if getattr(getattr(module, name), "_zuvrs_native", None) is _FUNCTIONS[name]:
                setattr(module, name, original)
        del _replaced[name]


def installed() -> bool:
    """Whether install() is in force."""
    return bool(_replaced)
