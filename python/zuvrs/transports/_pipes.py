"""Pipe transports (connect_read_pipe / connect_write_pipe) on pipes, FIFOs
and sockets: a native StreamCore over a uv_pipe_t, with asyncio's Unix pipe
semantics (EOF schedules eof_received then connection_lost, write_eof is
close, writes after close are dropped).

libuv owns a duplicate of the pipe's fd (closed with the handle); the pipe
object itself is closed after connection_lost, as asyncio closes it.
"""

import errno
import os
from asyncio import transports
from asyncio.log import logger

from .. import _zuvrs
from ._base import CoreMethod, ExtraInfo, NativeTransport, WriteFlowControl

__all__ = ("ReadPipeTransport", "WritePipeTransport")


class _PipeTransport(NativeTransport):
    def _open(self, loop, pipe, protocol):
        self._extra["pipe"] = pipe
        self._loop = loop
        self._pipe = pipe
        self._fd = self._fileno = pipe.fileno()
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
        return f"<{type(self).__name__} fd={self._fileno} {self._state()}>"

    def set_protocol(self, protocol):
        self._core.set_protocol(protocol, False)

    def _fatal_error(self, exc, message="Fatal error on pipe transport"):
        NativeTransport._fatal_error(self, exc, message)

    def _let_go_of_fd(self, core):
        pipe, self._pipe = self._pipe, None
        pipe.close()
        core._close_handle()


class ReadPipeTransport(_PipeTransport, transports.ReadTransport, ExtraInfo):
    pause_reading = CoreMethod("pause_reading")
    resume_reading = CoreMethod("resume_reading")
    is_reading = CoreMethod("is_reading")

    def __init__(self, loop, pipe, protocol, waiter=None, extra=None):
        transports.ReadTransport.__init__(self, extra)
        self._open(loop, pipe, protocol)
        self._start(protocol, waiter, register=False)

    def _read_ready(self):
        """The read callback, as asyncio's read pipe names it (the core reads
        natively; an exception from data_received is reported under this
        name)."""

    def _quiet_error(self, exc):
        # A pty whose other side closed reads EIO: an ordinary end.
        return isinstance(exc, OSError) and exc.errno == errno.EIO


class WritePipeTransport(_PipeTransport, WriteFlowControl, transports._FlowControlMixin, transports.WriteTransport,
                         ExtraInfo):
    write = CoreMethod("write")
    writelines = CoreMethod("writelines")
    abort = CoreMethod("abort")

    def __init__(self, loop, pipe, protocol, waiter=None, extra=None):
        # The flow control is the core's: skip _FlowControlMixin.__init__.
        transports.BaseTransport.__init__(self, extra)
        self._open(loop, pipe, protocol)
        # The write end turns readable (EOF or error) when the reader goes
        # away: that is how a closed peer is noticed with nothing to write.
        self._watching_peer = False
        self._start(protocol, waiter, then=self._watch_peer, read=False, register=False)

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

    def _let_go_of_fd(self, core):
        self._unwatch_peer()
        super()._let_go_of_fd(core)
