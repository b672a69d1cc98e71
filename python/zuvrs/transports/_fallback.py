"""Where a native core cannot serve, the stdlib's own transports do.

Two kinds of descriptor are not given a native core:

- sockets whose class overrides the I/O methods the stdlib's transports call
  (``recv``, ``send``, ``recv_into``, ``sendmsg`` for streams; ``send``,
  ``sendto``, ``recvfrom`` for datagrams): a core reads and writes the fd
  itself and would bypass the override;
- character devices (ttys, /dev/null) as pipes: epoll refuses some of them,
  and libuv aborts on an fd epoll refuses.

For those zuvrs uses asyncio's selector and Unix pipe transports as they
are, over the loop's fd watchers (``_add_reader`` and friends, which
``Loop`` provides for them), so their behaviour is the stdlib's by
construction. The one thing they need that zuvrs has not is
``loop._selector``, which their ``__repr__`` reads: the small subclasses
below describe the watch from the loop's own fd watchers instead.
"""

from asyncio import selector_events, unix_events

__all__ = ("FallbackSocketTransport", "FallbackDatagramTransport", "ReadPipeFallback", "WritePipeFallback")


class _WatchRepr:
    """asyncio's selector-transport repr, with the polling state read from
    the loop's fd watchers."""

    def __repr__(self):
        info = [type(self).__name__]
        if self._sock is None:
            info.append("closed")
        elif self._closing:
            info.append("closing")
        info.append(f"fd={self._sock_fd}")
        loop = self._loop
        if loop is not None and not loop.is_closed():
            reader, writer = loop._fd_handlers(self._sock_fd)
            info.append("read=polling" if reader is not None else "read=idle")
            state = "polling" if writer is not None else "idle"
            info.append(f"write=<{state}, bufsize={self.get_write_buffer_size()}>")
        return "<{}>".format(" ".join(info))


class FallbackSocketTransport(_WatchRepr, selector_events._SelectorSocketTransport):  # type: ignore[name-defined]
    """asyncio's socket transport, for a socket class overriding its I/O."""


class FallbackDatagramTransport(_WatchRepr, selector_events._SelectorDatagramTransport):  # type: ignore[name-defined]
    """asyncio's datagram transport, for a socket class overriding its I/O."""


# asyncio's pipe transports read loop._selector with getattr(): used as is.
ReadPipeFallback = unix_events._UnixReadPipeTransport  # type: ignore[attr-defined]
WritePipeFallback = unix_events._UnixWritePipeTransport  # type: ignore[attr-defined]
