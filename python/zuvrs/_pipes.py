"""Pipe transports (connect_read_pipe / connect_write_pipe).

They work on pipes, FIFOs, character devices and sockets, as asyncio's Unix
pipe transports do. Pipes, FIFOs and sockets get a native StreamCore over a
uv_pipe_t (reads straight to the protocol, writes batched per loop turn);
character devices (ttys, /dev/null: epoll refuses some of them, and libuv
aborts on an fd epoll refuses) keep the Python transports below, which watch
their fd through the loop's own fd watchers.
"""

import errno
import os
import stat
from asyncio import constants, futures, transports
from asyncio.log import logger

from . import _zuvrs
from ._fdtransport import FdReadingMixin, FdTransportMixin, report_error
from ._zuvrs import read_fd

_CoreMethod = _zuvrs.CoreMethod

__all__ = ("make_read_pipe_transport", "make_write_pipe_transport")


_NATIVE_READ_SIZE = 256 * 1024  # what read_fd reads at most


def _transport_class(pipe, native, char_device, refusal):
    """The transport class for `pipe`'s file type; asyncio's ValueError
    (`refusal`) for anything but a pipe, FIFO, socket or character device."""
    mode = os.fstat(pipe.fileno()).st_mode
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        return native
    if stat.S_ISCHR(mode):
        return char_device
    raise ValueError(refusal)


def make_read_pipe_transport(loop, pipe, protocol, waiter=None, extra=None):
    cls = _transport_class(pipe, ReadPipeTransport, FdReadPipeTransport, "Pipe transport is for pipes/sockets only.")
    return cls(loop, pipe, protocol, waiter, extra)


def make_write_pipe_transport(loop, pipe, protocol, waiter=None, extra=None):
    cls = _transport_class(
        pipe, WritePipeTransport, FdWritePipeTransport,
        "Pipe transport is only for pipes, sockets and character devices",
    )
    return cls(loop, pipe, protocol, waiter, extra)


class _StreamPipeTransport:
    """What the native read and write pipe transports share. libuv owns a
    duplicate of the pipe's fd (closed with the handle); the pipe object
    itself is closed after connection_lost, as asyncio closes it."""

    # The core's methods, bound on an instance when first used.
    close = _CoreMethod("close")
    is_closing = _CoreMethod("is_closing")

    def _open(self, loop, pipe, protocol):
        self._extra["pipe"] = pipe
        self._loop = loop
        self._pipe = pipe
        self._fileno = pipe.fileno()
        # (uv_pipe_open makes the duplicate non-blocking, and with it the
        # pipe: they share the open file, as asyncio leaves the pipe.)
        fd = os.dup(self._fileno)
        try:
            self._core = _zuvrs.StreamCore.open(loop, fd, self, pipe=True)
        except BaseException:
            os.close(fd)
            raise
        # asyncio's pipe transports call data_received, even for a
        # BufferedProtocol.
        self._core.set_protocol(protocol, False)

    def __repr__(self):
        if self._pipe is None:
            state = "closed"
        elif self._core.is_closing():
            state = "closing"
        else:
            state = "open"
        return f"<{type(self).__name__} fd={self._fileno} {state}>"

    def set_protocol(self, protocol):
        self._core.set_protocol(protocol, False)

    def get_protocol(self):
        return self._core.get_protocol()

    def _report_error(self, message, exc):
        report_error(self, exc, message, self._core.get_protocol())

    def _quiet_error(self, exc):
        return isinstance(exc, OSError)

    def _fatal_error(self, exc, message="Fatal error on pipe transport"):
        report_error(self, exc, message, self._core.get_protocol(), self._quiet_error(exc))
        self._core._force_close(exc)

    def _call_connection_lost(self, exc):
        if self._pipe is None:
            return
        try:
            protocol = self._core.get_protocol()
            if protocol is not None:
                protocol.connection_lost(exc)
        finally:
            self._release()

    def _release(self):
        pipe, self._pipe = self._pipe, None
        pipe.close()
        self._core._close_handle()
        # Nothing calls back any more: the core lets go of this transport
        # too, so neither waits for the cyclic GC.
        self._core._forget_protocol(True)


class ReadPipeTransport(_StreamPipeTransport, transports.ReadTransport):
    pause_reading = _CoreMethod("pause_reading")
    resume_reading = _CoreMethod("resume_reading")
    is_reading = _CoreMethod("is_reading")

    def __init__(self, loop, pipe, protocol, waiter=None, extra=None):
        super().__init__(extra)
        self._open(loop, pipe, protocol)
        loop.call_soon(protocol.connection_made, self)
        # Reading starts only once connection_made() has run.
        loop.call_soon(self._core.start_reading)
        if waiter is not None:
            loop.call_soon(futures._set_result_unless_cancelled, waiter, None)

    def _quiet_error(self, exc):
        # A pty whose other side closed reads EIO: an ordinary end.
        return isinstance(exc, OSError) and exc.errno == errno.EIO


class WritePipeTransport(_StreamPipeTransport, transports._FlowControlMixin, transports.WriteTransport):
    write = _CoreMethod("write")
    writelines = _CoreMethod("writelines")
    get_write_buffer_size = _CoreMethod("get_write_buffer_size")

    def __init__(self, loop, pipe, protocol, waiter=None, extra=None):
        # The flow control is the core's: skip _FlowControlMixin.__init__.
        transports.BaseTransport.__init__(self, extra)
        self._open(loop, pipe, protocol)
        loop.call_soon(protocol.connection_made, self)
        # The write end turns readable (EOF or error) when the reader goes
        # away: that is how a closed peer is noticed with nothing to write.
        self._watching_peer = False
        loop.call_soon(self._watch_peer)
        if waiter is not None:
            loop.call_soon(futures._set_result_unless_cancelled, waiter, None)

    @property
    def _protocol_paused(self):
        return self._core._protocol_paused()

    def _watch_peer(self):
        if self._pipe is not None and not self._core.is_closing():
            self._watching_peer = True
            self._loop._set_fd_handler(self._fileno, False, self._peer_closed, ())

    def _peer_closed(self):
        if self._loop.get_debug():
            logger.info("%r was closed by peer", self)
        self._unwatch_peer()
        self._core._force_close(BrokenPipeError() if self._core.get_write_buffer_size() else None)

    def _unwatch_peer(self):
        if self._watching_peer:
            self._watching_peer = False
            if not self._loop.is_closed():
                self._loop._clear_fd_handler(self._fileno, False)

    def can_write_eof(self):
        return True

    def write_eof(self):
        # A pipe has no half-close: EOF is closing once the buffer is out.
        self._core.close()

    def abort(self):
        self._core.abort()

    def get_write_buffer_limits(self):
        return self._core.get_write_buffer_limits()

    def set_write_buffer_limits(self, high=None, low=None):
        self._core.set_write_buffer_limits(high, low)

    def _release(self):
        self._unwatch_peer()
        super()._release()


# -- character devices: Python transports over the loop's fd watchers -----------------
# (make_*_pipe_transport checked the file type. A character device has no
# reader that can go away, so the write side watches nothing but its
# writability, as asyncio's does for it.)


class FdReadPipeTransport(FdReadingMixin, transports.ReadTransport):
    max_size = 256 * 1024  # most bytes read per readiness event

    def __init__(self, loop, pipe, protocol, waiter=None, extra=None):
        super().__init__(extra)
        self._extra["pipe"] = pipe
        self._loop = loop
        self._pipe = pipe
        self._fileno = self._fd = pipe.fileno()
        self._protocol = protocol
        self._closing = False
        self._paused = False
        os.set_blocking(self._fileno, False)
        loop.call_soon(protocol.connection_made, self)
        loop.call_soon(self._start_reading)
        if waiter is not None:
            loop.call_soon(futures._set_result_unless_cancelled, waiter, None)

    def __repr__(self):
        state = "closed" if self._pipe is None else ("closing" if self._closing else "open")
        return f"<{type(self).__name__} fd={self._fileno} {state}>"

    def _start_reading(self):
        if self.is_reading():
            self._watch_readable(self._read_ready)

    def _read_ready(self):
        try:
            # Like os.read(fd, max_size) without a max_size object per read.
            data = read_fd(self._fileno) if self.max_size == _NATIVE_READ_SIZE else os.read(self._fileno, self.max_size)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._fatal_error(exc, "Fatal read error on pipe transport")
            return
        if data:
            self._protocol.data_received(data)
            return
        if self._loop.get_debug():
            logger.info("%r was closed by peer", self)
        self._closing = True
        self._unwatch_readable()
        self._loop.call_soon(self._protocol.eof_received)
        self._loop.call_soon(self._call_connection_lost, None)

    def close(self):
        if not self._closing:
            self._close(None)

    def _fatal_error(self, exc, message="Fatal error on pipe transport"):
        self._report_fatal(exc, message, quiet=isinstance(exc, OSError) and exc.errno == errno.EIO)
        self._close(exc)

    def _close(self, exc):
        self._closing = True
        self._unwatch_readable()
        self._loop.call_soon(self._call_connection_lost, exc)

    def _call_connection_lost(self, exc):
        try:
            self._protocol.connection_lost(exc)
        finally:
            self._pipe.close()
            self._pipe = None
            self._protocol = None


class FdWritePipeTransport(FdTransportMixin, transports._FlowControlMixin, transports.WriteTransport):
    def __init__(self, loop, pipe, protocol, waiter=None, extra=None):
        super().__init__(extra, loop)
        self._extra["pipe"] = pipe
        self._pipe = pipe
        self._fileno = self._fd = pipe.fileno()
        self._protocol = protocol
        self._buffer = bytearray()
        self._conn_lost = 0
        self._closing = False  # close() or write_eof() called
        os.set_blocking(self._fileno, False)
        loop.call_soon(protocol.connection_made, self)
        if waiter is not None:
            loop.call_soon(futures._set_result_unless_cancelled, waiter, None)

    def __repr__(self):
        state = "closed" if self._pipe is None else ("closing" if self._closing else "open")
        return f"<{type(self).__name__} fd={self._fileno} {state} bufsize={len(self._buffer)}>"

    def get_write_buffer_size(self):
        return len(self._buffer)

    def write(self, data):
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"data argument must be a bytes-like object, not {type(data).__name__!r}")
        if isinstance(data, bytearray):
            data = memoryview(data)
        if not data:
            return
        if self._conn_lost or self._closing:
            if self._conn_lost >= constants.LOG_THRESHOLD_FOR_CONNLOST_WRITES:
                logger.warning("pipe closed by peer or os.write(pipe, data) raised exception.")
            self._conn_lost += 1
            return
        if not self._buffer:
            try:
                n = os.write(self._fileno, data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                self._conn_lost += 1
                self._fatal_error(exc, "Fatal write error on pipe transport")
                return
            if n == len(data):
                return
            if n > 0:
                data = memoryview(data)[n:]
            self._watch_writable(self._write_ready)
        self._buffer += data
        self._maybe_pause_protocol()

    def _write_ready(self):
        try:
            n = os.write(self._fileno, self._buffer)
        except (BlockingIOError, InterruptedError):
            return
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._buffer.clear()
            self._conn_lost += 1
            self._unwatch_writable()
            self._fatal_error(exc, "Fatal write error on pipe transport")
            return
        if n == len(self._buffer):
            self._buffer.clear()
            self._unwatch_writable()
            self._maybe_resume_protocol()  # may write more
            if self._closing and not self._buffer:
                self._call_connection_lost(None)
            return
        if n > 0:
            del self._buffer[:n]

    def can_write_eof(self):
        return True

    def write_eof(self):
        if self._closing:
            return
        self._closing = True
        if not self._buffer:
            self._loop.call_soon(self._call_connection_lost, None)

    def close(self):
        if self._pipe is not None and not self._closing:
            # Closing a write pipe is sending EOF once the buffer is out.
            self.write_eof()

    def abort(self):
        self._close(None)

    def _fatal_error(self, exc, message="Fatal error on pipe transport"):
        self._report_fatal(exc, message, quiet=isinstance(exc, OSError))
        self._close(exc)

    def _close(self, exc=None):
        self._closing = True
        self._unwatch_writable()
        self._buffer.clear()
        self._loop.call_soon(self._call_connection_lost, exc)

    def _call_connection_lost(self, exc):
        if self._pipe is None:
            return
        try:
            self._protocol.connection_lost(exc)
        finally:
            self._pipe.close()
            self._pipe = None
            self._protocol = None
