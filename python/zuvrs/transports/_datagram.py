"""Datagram transports: UDP (AF_INET / AF_INET6) and Unix datagram sockets
over a native DatagramCore.

libuv watches the fd, datagrams are read and handed to the protocol from
Rust, and ``sendto`` is the core's own method (numeric IP addresses and
Unix paths / abstract names are parsed natively, anything else goes through
``socket.sendto``). The socket keeps its fd; the core's libuv watch on it is
closed before the socket is.
"""

import asyncio
from asyncio import transports, trsock

from .._zuvrs import DatagramCore
from ._base import READ_SIZE, CoreMethod, ExtraInfo, NativeTransport, WriteFlowControl, socket_extra

__all__ = ("DatagramTransport",)


class DatagramTransport(NativeTransport, WriteFlowControl, transports._FlowControlMixin, asyncio.DatagramTransport,
                        ExtraInfo):
    """A UDP or Unix datagram transport over a DatagramCore."""

    max_size = READ_SIZE  # largest datagram read at once

    sendto = CoreMethod("sendto")
    pause_reading = CoreMethod("pause_reading")
    resume_reading = CoreMethod("resume_reading")
    is_reading = CoreMethod("is_reading")

    def __init__(self, loop, sock, protocol, address=None, waiter=None, extra=None):
        # The flow control is the core's: skip _FlowControlMixin.__init__.
        transports.BaseTransport.__init__(self, extra)
        self._loop = loop
        self._extra["socket"] = trsock.TransportSocket(sock)
        socket_extra(self._extra, sock)
        self._sock = sock
        self._fd = self._sock_fd = sock.fileno()
        self._address = address
        self._core = DatagramCore.open(loop, sock, self, address, bool(self._extra["peername"]))
        self._core.set_protocol(protocol)
        self._start(protocol, waiter)

    def __repr__(self):
        return f"<{type(self).__name__} fd={self._sock_fd} {self._state()}>"

    def set_protocol(self, protocol):
        self._core.set_protocol(protocol)

    def abort(self):
        self._core._force_close(None)

    def _read_ready(self):
        """Read one datagram (libuv calls the core directly)."""
        self._core._read_ready()

    def _sendto_ready(self):
        """Send what is buffered (libuv calls the core directly)."""
        self._core._sendto_ready()

    _write_ready = _sendto_ready  # (the name errors are reported under)

    def _let_go_of_fd(self, core):
        sock, self._sock = self._sock, None
        # libuv stops watching the fd before the socket closes it.
        core._close_handle()
        sock.close()
