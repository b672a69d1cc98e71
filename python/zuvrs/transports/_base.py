"""NativeTransport: what every transport over a native core shares.

A native transport is an ``asyncio`` transport object whose hot methods
(write, close, pause_reading, sendto, ...) are its core's (``_core``, a
``StreamCore`` or ``DatagramCore`` from src/transport): ``CoreMethod`` class
attributes bind them on first use, so calling them runs no Python code.
What happens once per connection is here: scheduling ``connection_made``
and the start of reading, error reports, ``connection_lost`` and letting go
of the fd, flow control's limits, and the loop's registry of transports.

The core calls back into its transport by four names (src/python.rs):
``_fatal_error(exc, message)``, ``_report_error(message, exc)``,
``_call_connection_lost(exc)`` and, for datagrams, ``_callback_failed``.
"""

import asyncio
import socket
from asyncio import futures, transports
from asyncio.log import logger

from .. import _zuvrs

__all__ = ("NativeTransport", "ExtraInfo", "ASYNCIO_GET_EXTRA_INFO", "WriteFlowControl", "CoreMethod", "report_error",
           "socket_extra", "READ_SIZE")

CoreMethod = _zuvrs.CoreMethod

# The most one read takes (the native cores' read buffer).
READ_SIZE = _zuvrs.READ_SIZE

_SIZE_MAX = 2**63 - 1


def report_error(transport, exc, message, protocol, quiet=False):
    """asyncio's report of a transport's error: expected OS errors (`quiet`)
    are only logged in debug mode, anything else goes to the exception
    handler. For a fatal error the caller then closes the transport."""
    if quiet:
        if transport._loop.get_debug():
            # (The exception itself: this often runs outside its handler.)
            logger.debug("%r: %s", transport, message, exc_info=exc)
    else:
        transport._loop.call_exception_handler(
            {"message": message, "exception": exc, "transport": transport, "protocol": protocol}
        )


def socket_extra(extra, sock):
    """asyncio's extra info of a socket transport: sockname and peername."""
    try:
        extra["sockname"] = sock.getsockname()
    except OSError:
        extra["sockname"] = None
    if "peername" not in extra:
        try:
            extra["peername"] = sock.getpeername()
        except OSError:
            extra["peername"] = None


def _as_size(limit):
    """A water mark as the native core compares it: the sizes it lets
    through are the same as for asyncio's comparison with `limit` (an int,
    a float, or an int too large for the core)."""
    if limit >= _SIZE_MAX:
        return _SIZE_MAX
    return int(limit)


_BaseTransport = transports.BaseTransport
#: asyncio's own get_extra_info: BaseTransport's is something else only
#: while replaced (a test's mock).
ASYNCIO_GET_EXTRA_INFO = _BaseTransport.get_extra_info


class ExtraInfo(_BaseTransport):
    """get_extra_info of the native transports: asyncio's, and
    'zuvrs_stats', this transport's figures (a zuvrs.stats.TransportStats).

    A transport class lists it last among its bases, so that it comes after
    asyncio's transport classes in the MRO, just before BaseTransport,
    which asyncio's transports inherit the method from: a replacement of
    ``asyncio.Transport.get_extra_info`` (or ReadTransport's, ...), as tests
    make with ``unittest.mock.patch``, reaches zuvrs's transports as it
    reaches asyncio's (tests/test_transport_classes.py). One on
    BaseTransport itself is called from here.
    """

    def get_extra_info(self, name, default=None):
        if name == "zuvrs_stats":
            from ..stats import TransportStats

            return TransportStats._from_native(self._core._stats())
        if _BaseTransport.get_extra_info is not ASYNCIO_GET_EXTRA_INFO:
            # (The arguments as a caller most likely gave them, for a mock
            # that checks them.)
            return super().get_extra_info(name) if default is None else super().get_extra_info(name, default)
        return self._extra.get(name, default)


class NativeTransport:
    """The part of a transport that is the same over every native core.

    Subclasses set ``_core`` and ``_fd`` (the descriptor the loop's registry
    knows it by) and define ``_let_go_of_fd()``; they start with
    ``_start()``.
    """

    close = CoreMethod("close")
    is_closing = CoreMethod("is_closing")

    def _start(self, protocol, waiter, then=None, read=True, register=True):
        """Schedules, as asyncio does, the protocol's connection_made (if a
        protocol is given), then `then`, the start of reading (unless not
        `read`) and the waiter; `register` puts the transport in the loop's
        registry of native transports by fd (as asyncio's ``_transports``:
        socket transports, not pipes)."""
        loop = self._loop
        if register:
            loop._native_transports[self._fd] = self
        if protocol is not None:
            # Every protocol callback runs in the context the transport was
            # made in (the core's copy of it), as uvloop runs them.
            loop.call_soon(protocol.connection_made, self, context=self._core._protocol_context())
        if then is not None:
            loop.call_soon(then)
        if read:
            # Reading starts only once connection_made() has run.
            loop.call_soon(self._core.start_reading)
        if waiter is not None:
            loop.call_soon(futures._set_result_unless_cancelled, waiter, None)

    def get_protocol(self):
        return self._core.get_protocol()

    @property
    def _paused(self):
        # asyncio's transports' attribute (pause_reading() in force), which
        # code and tests outside asyncio read.
        return self._core._reading_paused()

    # -- errors and the end ------------------------------------------------------

    def _quiet_error(self, exc):
        """Whether a fatal error is an expected one (logged in debug mode only)."""
        return isinstance(exc, OSError)

    def _fatal_error(self, exc, message="Fatal error on transport"):
        report_error(self, exc, message, self._core.get_protocol(), self._quiet_error(exc))
        self._core._force_close(exc)

    def _report_error(self, message, exc):
        report_error(self, exc, message, self._core.get_protocol())

    def _force_close(self, exc):
        self._core._force_close(exc)

    def _callback_failed(self, exc, writing):
        # Protocol code asyncio runs straight from an fd callback raised (a
        # datagram or read pipe protocol): reported as the loop reports a
        # failing callback, named after asyncio's callback.
        callback = self._write_ready if writing else self._read_ready
        handle = asyncio.Handle(callback, (), self._loop)
        self._loop._report_callback_error(handle, exc, callback, ())

    def _call_connection_lost(self, exc):
        try:
            protocol = self._core.get_protocol()
            if protocol is not None:
                protocol.connection_lost(exc)
        finally:
            self._release_fd(True)

    def _release_fd(self, finished=False):
        """Closes the core's libuv handle and lets go of the fd (a loop
        closing with the transport open does this too); `finished`
        (connection_lost has run) lets the core forget this transport as
        well, so neither waits for the cyclic GC."""
        if self._released:
            return
        self._released = True
        core = self._core
        self._let_go_of_fd(core)
        core._forget_protocol(finished)
        transports = self._loop._native_transports
        if transports.get(self._fd) is self:
            del transports[self._fd]

    _released = False

    def _let_go_of_fd(self, core):
        """Closes the libuv handle and deals with the fd's owner (socket or
        pipe object) in the order its kind needs."""
        raise NotImplementedError

    def _state(self):
        if self._released:
            return "closed"
        return "closing" if self._core.is_closing() else "open"


class WriteFlowControl:
    """Flow control of a transport that writes: the core's, at asyncio's
    water marks (``_FlowControlMixin``'s rules, also for floats and very
    large limits, which asyncio accepts)."""

    get_write_buffer_size = CoreMethod("get_write_buffer_size")

    # asyncio's water marks as given (the core compares with their sizes).
    _limits = None


    @property
    def _protocol_paused(self):
        return self._core._protocol_paused()

    def get_write_buffer_limits(self):
        if self._limits is None:
            return self._core.get_write_buffer_limits()
        return self._limits

    def set_write_buffer_limits(self, high=None, low=None):
        if high is None:
            high = 64 * 1024 if low is None else 4 * low
        if low is None:
            low = high // 4
        if not high >= low >= 0:
            raise ValueError(f"high ({high!r}) must be >= low ({low!r}) must be >= 0")
        self._limits = (low, high)
        self._core._set_water_marks(_as_size(high), _as_size(low))


def plain_socket_io(sock, methods):
    """Whether `sock`'s class leaves the I/O `methods` as socket.socket has
    them (a native core does their work itself, bypassing an override)."""
    cls = type(sock)
    return cls is socket.socket or all(getattr(cls, m, None) is getattr(socket.socket, m, None) for m in methods)
