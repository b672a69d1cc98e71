"""Datagram transports (UDP and Unix datagram sockets).

The socket stays a Python socket object; the loop's native fd watcher tells
when it is readable or writable. This is correct for every socket family
asyncio supports; a native per-datagram path is a later optimisation.
"""

import asyncio
import collections
import socket
import sys
from asyncio import constants, futures, transports, trsock
from asyncio.log import logger

from ._fdtransport import FdReadingMixin, socket_extra
from ._zuvrs import recv_datagram

__all__ = ("DatagramTransport",)

# 3.13 changed sendto(): empty datagrams are sent, and each buffered
# datagram counts 8 more bytes (its header) towards the buffer size.
_SENDS_EMPTY = sys.version_info >= (3, 13)
_HEADER_SIZE = 8 if _SENDS_EMPTY else 0

# Outcomes of one send attempt.
_SENT, _BLOCKED, _FAILED = "sent", "blocked", "failed"


class DatagramTransport(FdReadingMixin, transports._FlowControlMixin, asyncio.DatagramTransport):
    max_size = 256 * 1024  # largest datagram read at once

    def __init__(self, loop, sock, protocol, address=None, waiter=None, extra=None):
        super().__init__(extra, loop)
        self._extra["socket"] = trsock.TransportSocket(sock)
        socket_extra(self._extra, sock)
        self._sock = sock
        self._sock_fd = self._fd = sock.fileno()
        # IP datagrams are read natively (no 256 KiB bytes per packet).
        self._native_recv = sock.family in (socket.AF_INET, socket.AF_INET6)
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
            if self._native_recv:
                data, addr = recv_datagram(self._sock_fd)
            else:
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
