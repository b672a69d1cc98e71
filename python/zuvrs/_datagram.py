"""Datagram transports.

UDP sockets (AF_INET / AF_INET6) and Unix datagram sockets (AF_UNIX) get a
native core (DatagramCore in src/transport/udp.rs): libuv watches the fd,
datagrams are read and delivered to the protocol from Rust, and ``sendto``
is the core's own method (numeric IP addresses and Unix paths / abstract
names are parsed natively, anything else goes through ``socket.sendto``).
A socket whose class overrides ``send``, ``sendto`` or ``recvfrom``, or of
another family, uses FdDatagramTransport, a Python transport over the
loop's fd watchers that calls the socket's own methods.
"""

import asyncio
import collections
import socket
import sys
from asyncio import constants, futures, transports, trsock
from asyncio.log import logger

from ._fdtransport import FdReadingMixin, report_error, socket_extra
from ._zuvrs import DatagramCore

__all__ = ("DatagramTransport", "FdDatagramTransport", "make_datagram_transport")

# 3.13 changed sendto(): empty datagrams are sent, and each buffered
# datagram counts 8 more bytes (its header) towards the buffer size.
_SENDS_EMPTY = sys.version_info >= (3, 13)
_HEADER_SIZE = 8 if _SENDS_EMPTY else 0

# Outcomes of one send attempt.
_SENT, _BLOCKED, _FAILED = "sent", "blocked", "failed"

_NATIVE_FAMILIES = (socket.AF_INET, socket.AF_INET6) + ((socket.AF_UNIX,) if hasattr(socket, "AF_UNIX") else ())
# The socket methods asyncio's transport calls; the native core does their
# work itself, so a socket class that overrides one gets the Python transport.
_IO_METHODS = ("send", "sendto", "recvfrom")


def _plain_io(sock):
    cls = type(sock)
    return cls is socket.socket or all(getattr(cls, m, None) is getattr(socket.socket, m) for m in _IO_METHODS)


def make_datagram_transport(loop, sock, protocol, address=None, waiter=None, extra=None):
    """The transport for a datagram socket: native for UDP and Unix
    datagram sockets of the plain socket class, else Python."""
    native = sock.family in _NATIVE_FAMILIES and _plain_io(sock)
    cls = DatagramTransport if native else FdDatagramTransport
    return cls(loop, sock, protocol, address, waiter, extra)


class DatagramTransport(transports._FlowControlMixin, asyncio.DatagramTransport):
    """A UDP or Unix datagram transport over a native DatagramCore.

    ``sendto``, ``get_write_buffer_size`` and ``is_closing`` are the core's
    bound methods; the core calls the protocol itself when a datagram
    arrives. Flow control (the water marks, pause_writing/resume_writing)
    is asyncio's own mixin, called by the core when its buffer changes.
    The socket keeps its fd; the core's libuv watch on it is closed before
    the socket is.
    """

    max_size = 256 * 1024  # largest datagram read at once

    def __init__(self, loop, sock, protocol, address=None, waiter=None, extra=None):
        # The flow control is the core's: skip _FlowControlMixin.__init__.
        transports.BaseTransport.__init__(self, extra)
        self._loop = loop
        self._extra["socket"] = trsock.TransportSocket(sock)
        socket_extra(self._extra, sock)
        self._sock = sock
        self._sock_fd = sock.fileno()
        self._address = address
        self._protocol = protocol
        core = DatagramCore.open(loop, sock, self, address, bool(self._extra["peername"]))
        self._core = core
        self.sendto = core.sendto
        self.get_write_buffer_size = core.get_write_buffer_size
        self.is_closing = core.is_closing
        core.set_protocol(protocol)
        loop._transports[self._sock_fd] = self
        loop.call_soon(protocol.connection_made, self)
        # Reading starts only once connection_made() has run.
        loop.call_soon(core.start_reading)
        if waiter is not None:
            loop.call_soon(futures._set_result_unless_cancelled, waiter, None)

    def __repr__(self):
        state = "closed" if self._sock is None else ("closing" if self._core.is_closing() else "open")
        return f"<{type(self).__name__} fd={self._sock_fd} {state}>"

    def set_protocol(self, protocol):
        self._protocol = protocol
        self._core.set_protocol(protocol)

    def get_protocol(self):
        return self._protocol

    def is_reading(self):
        return self._core.is_reading()

    # Flow control is the core's (asyncio's rules, natively).
    @property
    def _protocol_paused(self):
        return self._core._protocol_paused()

    def get_write_buffer_limits(self):
        return self._core.get_write_buffer_limits()

    def set_write_buffer_limits(self, high=None, low=None):
        self._core.set_write_buffer_limits(high, low)

    def _report_error(self, message, exc):
        report_error(self, exc, message, self._protocol)

    def pause_reading(self):
        self._core.pause_reading()

    def resume_reading(self):
        self._core.resume_reading()

    def close(self):
        self._core.close()

    def abort(self):
        self._core._force_close(None)

    def _force_close(self, exc):
        self._core._force_close(exc)

    def _fatal_error(self, exc, message="Fatal error on transport"):
        report_error(self, exc, message, self._protocol, isinstance(exc, OSError))
        self._core._force_close(exc)

    def _read_ready(self):
        """Read one datagram (libuv calls the core directly)."""
        self._core._read_ready()

    def _sendto_ready(self):
        """Send what is buffered (libuv calls the core directly)."""
        self._core._sendto_ready()

    def _callback_failed(self, exc, writing):
        # An exception escaped the protocol while the core handled the fd
        # being ready: reported as asyncio reports its fd callback failing.
        callback = self._sendto_ready if writing else self._read_ready
        handle = asyncio.Handle(callback, (), self._loop)
        self._loop._report_callback_error(handle, exc, callback, ())

    def _call_connection_lost(self, exc):
        try:
            self._protocol.connection_lost(exc)
        finally:
            self._release(True)

    def _release(self, finished=False):
        """Close the fd and forget the protocol; `finished` (connection_lost
        has run) lets the core forget this transport as well."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        # libuv stops watching the fd before the socket closes it.
        self._core._close_handle()
        if self._loop._transports.get(self._sock_fd) is self:
            del self._loop._transports[self._sock_fd]
        sock.close()
        self._core._forget_protocol(finished)
        self._protocol = None


class FdDatagramTransport(FdReadingMixin, transports._FlowControlMixin, asyncio.DatagramTransport):
    """A datagram transport in Python over the loop's fd watchers, calling
    the socket's own methods: datagram sockets whose class overrides send,
    sendto or recvfrom."""

    max_size = 256 * 1024  # largest datagram read at once

    def __init__(self, loop, sock, protocol, address=None, waiter=None, extra=None):
        super().__init__(extra, loop)
        self._extra["socket"] = trsock.TransportSocket(sock)
        socket_extra(self._extra, sock)
        self._sock = sock
        self._sock_fd = self._fd = sock.fileno()
        self._protocol = protocol
        self._address = address
        self._buffer = collections.deque()
        self._buffer_size = 0
        self._closing = False
        self._paused = False
        self._conn_lost = 0
        loop._transports[self._sock_fd] = self
        loop.call_soon(protocol.connection_made, self)
        loop.call_soon(self._start_reading)
        if waiter is not None:
            loop.call_soon(futures._set_result_unless_cancelled, waiter, None)

    def __repr__(self):
        state = "closed" if self._sock is None else ("closing" if self._closing else "open")
        return f"<{type(self).__name__} fd={self._sock_fd} {state}>"

    def get_write_buffer_size(self):
        return self._buffer_size

    # -- reading --------------------------------------------------------------

    def _start_reading(self):
        if not self._closing and not self._paused and self._sock is not None:
            self._watch_readable(self._read_ready)

    def _read_ready(self):
        if self._conn_lost:
            return
        try:
            data, addr = self._sock.recvfrom(self.max_size)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._protocol.error_received(exc)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, "Fatal read error on datagram transport")
        else:
            self._protocol.datagram_received(data, addr)

    # -- writing ----------------------------------------------------------------

    def sendto(self, data, addr=None):
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"data argument must be a bytes-like object, not {type(data).__name__!r}")
        if not data and not _SENDS_EMPTY:
            return
        if self._address:
            if addr not in (None, self._address):
                raise ValueError(f"Invalid address: must be None or {self._address}")
            addr = self._address
        if self._conn_lost and self._address:
            if self._conn_lost >= constants.LOG_THRESHOLD_FOR_CONNLOST_WRITES:
                logger.warning("socket.send() raised exception.")
            self._conn_lost += 1
            return
        if not self._buffer:
            outcome = self._try_send(data, addr)
            if outcome is not _BLOCKED:
                return
            self._watch_writable(self._sendto_ready)
        # Buffer an immutable copy.
        self._buffer.append((bytes(data), addr))
        self._buffer_size += len(data) + _HEADER_SIZE
        self._maybe_pause_protocol()

    def _try_send(self, data, addr):
        """Send one datagram: _SENT, _BLOCKED (the socket is full), or
        _FAILED (the error went to error_received / _fatal_error)."""
        try:
            if self._extra["peername"]:
                self._sock.send(data)
            else:
                self._sock.sendto(data, addr)
            return _SENT
        except (BlockingIOError, InterruptedError):
            return _BLOCKED
        except OSError as exc:
            self._protocol.error_received(exc)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, "Fatal write error on datagram transport")
        return _FAILED

    def _sendto_ready(self):
        while self._buffer:
            data, addr = self._buffer.popleft()
            self._buffer_size -= len(data) + _HEADER_SIZE
            outcome = self._try_send(data, addr)
            if outcome is _BLOCKED:
                self._buffer.appendleft((data, addr))
                self._buffer_size += len(data) + _HEADER_SIZE
                break
            if outcome is _FAILED:
                return
        self._maybe_resume_protocol()
        if not self._buffer:
            self._unwatch_writable()
            if self._closing:
                self._call_connection_lost(None)

    # -- closing ----------------------------------------------------------------

    def close(self):
        if self._closing:
            return
        self._closing = True
        self._unwatch_readable()
        if not self._buffer:
            self._conn_lost += 1
            self._unwatch_writable()
            self._loop.call_soon(self._call_connection_lost, None)

    def abort(self):
        self._force_close(None)

    def _fatal_error(self, exc, message="Fatal error on transport"):
        self._report_fatal(exc, message, quiet=isinstance(exc, OSError))
        self._force_close(exc)

    def _force_close(self, exc):
        if self._conn_lost:
            return
        if self._buffer:
            self._buffer.clear()
            self._buffer_size = 0
            self._unwatch_writable()
        if not self._closing:
            self._closing = True
            self._unwatch_readable()
        self._conn_lost += 1
        self._loop.call_soon(self._call_connection_lost, exc)

    def _call_connection_lost(self, exc):
        try:
            self._protocol.connection_lost(exc)
        finally:
            self._release()

    def _release(self):
        sock, self._sock = self._sock, None
        if sock is None:
            return
        if self._loop._transports.get(self._sock_fd) is self:
            del self._loop._transports[self._sock_fd]
        sock.close()
        self._protocol = None
