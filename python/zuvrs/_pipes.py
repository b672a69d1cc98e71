"""Pipe transports (connect_read_pipe / connect_write_pipe).

They work on pipes, FIFOs, character devices and sockets, as asyncio's Unix
pipe transports do, and watch their fd with the loop's native fd watchers.
"""

import errno
import os
import stat
from asyncio import constants, futures, transports
from asyncio.log import logger

from ._fdtransport import FdReadingMixin, FdTransportMixin
from ._zuvrs import read_fd

__all__ = ("ReadPipeTransport", "WritePipeTransport")


_NATIVE_READ_SIZE = 256 * 1024  # what read_fd reads at most


def _pipe_mode(fileno):
    return os.fstat(fileno).st_mode


class ReadPipeTransport(FdReadingMixin, transports.ReadTransport):
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
        mode = _pipe_mode(self._fileno)
        if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode)):
            self._pipe = self._fileno = self._fd = self._protocol = None
            raise ValueError("Pipe transport is for pipes/sockets only.")
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


class WritePipeTransport(FdTransportMixin, transports._FlowControlMixin, transports.WriteTransport):
    def __init__(self, loop, pipe, protocol, waiter=None, extra=None):
        super().__init__(extra, loop)
        self._extra["pipe"] = pipe
        self._pipe = pipe
        self._fileno = self._fd = pipe.fileno()
        self._protocol = protocol
        self._buffer = bytearray()
        self._conn_lost = 0
        self._closing = False  # close() or write_eof() called
        mode = _pipe_mode(self._fileno)
        is_socket = stat.S_ISSOCK(mode)
        if not (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) or is_socket):
            self._pipe = self._fileno = self._fd = self._protocol = None
            raise ValueError("Pipe transport is only for pipes, sockets and character devices")
        os.set_blocking(self._fileno, False)
        loop.call_soon(protocol.connection_made, self)
        if is_socket or stat.S_ISFIFO(mode):
            # The write end turns readable (EOF or error) when the reader
            # goes away: that is how a closed peer is noticed.
            loop.call_soon(loop._set_fd_handler, self._fileno, False, self._read_ready, ())
        if waiter is not None:
            loop.call_soon(futures._set_result_unless_cancelled, waiter, None)

    def __repr__(self):
        state = "closed" if self._pipe is None else ("closing" if self._closing else "open")
        return f"<{type(self).__name__} fd={self._fileno} {state} bufsize={len(self._buffer)}>"

    def get_write_buffer_size(self):
        return len(self._buffer)

    def _read_ready(self):
        # The reading end was closed.
        self._close(BrokenPipeError() if self._buffer else None)

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
                self._unwatch_readable()
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
            self._unwatch_readable()
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
        self._unwatch_readable()
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
