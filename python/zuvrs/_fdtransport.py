"""What the Python-level transports (datagrams, pipes) share: watching their
fd through the loop's fd watchers, protocol access and error reports."""

from asyncio.log import logger

__all__ = ("FdTransportMixin", "FdReadingMixin", "report_error", "socket_extra")


def report_error(transport, exc, message, protocol, quiet=False):
    """asyncio's report of a transport's error: expected OS errors (`quiet`)
    are only logged in debug mode, anything else goes to the exception
    handler. For a fatal error the caller then closes the transport."""
    if quiet:
        if transport._loop.get_debug():
            logger.debug("%r: %s", transport, message, exc_info=True)
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


class FdTransportMixin:
    """Needs `_loop`, `_protocol`, `_closing` and `_fd` (the watched fd)."""

    _writer_watched = False

    def set_protocol(self, protocol):
        self._protocol = protocol

    def get_protocol(self):
        return self._protocol

    def is_closing(self):
        return self._closing

    def _watch_readable(self, callback):
        self._loop._set_fd_handler(self._fd, False, callback, ())

    def _unwatch_readable(self):
        if self._fd is not None and not self._loop.is_closed():
            self._loop._clear_fd_handler(self._fd, False)

    def _watch_writable(self, callback):
        if not self._writer_watched:
            self._writer_watched = True
            self._loop._set_fd_handler(self._fd, True, callback, ())

    def _unwatch_writable(self):
        if self._writer_watched:
            self._writer_watched = False
            if not self._loop.is_closed():
                self._loop._clear_fd_handler(self._fd, True)

    def _report_fatal(self, exc, message, quiet):
        report_error(self, exc, message, self._protocol, quiet)


class FdReadingMixin(FdTransportMixin):
    """Pausing and resuming reading; needs `_paused` and `_start_reading()`."""

    def is_reading(self):
        return not self._paused and not self._closing

    def pause_reading(self):
        if not self.is_reading():
            return
        self._paused = True
        self._unwatch_readable()

    def resume_reading(self):
        if self._closing or not self._paused:
            return
        self._paused = False
        self._start_reading()
