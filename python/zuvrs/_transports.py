"""Socket transports: asyncio.Transport objects over a native StreamCore.

The transport is an ``asyncio.Transport`` subclass (so ``isinstance`` checks
hold); its hot methods (write, writelines, close, pause_reading, ...) are the
native core's bound methods set on the instance, so calling them runs no
Python code. What happens once per connection (connection_made and
connection_lost, error reports, server bookkeeping) is here.
"""

import asyncio
import os
import socket
from asyncio import constants, futures, protocols, transports, trsock

from . import _zuvrs
from ._fdtransport import report_error, socket_extra
from ._server import NATIVE_CLIENT_TRACKING, Server

__all__ = ("SocketTransport",)

_open_core = _zuvrs.StreamCore.open
_tcp_names = _zuvrs.tcp_names
_start_reading = _zuvrs.StreamCore.start_reading
_CoreMethod = _zuvrs.CoreMethod
_BufferedProtocol = protocols.BufferedProtocol


def _attach_to(server, transport):
    # asyncio's Server takes the transport from 3.13 on; zuvrs's own Server
    # subclass (older Pythons) accepts it too; a plain older Server does not.
    if NATIVE_CLIENT_TRACKING or isinstance(server, Server):
        server._attach(transport)
    else:
        server._attach()


def _detach_from(server, transport):
    if NATIVE_CLIENT_TRACKING or isinstance(server, Server):
        server._detach(transport)
    else:
        server._detach()


class SocketTransport(transports._FlowControlMixin):
    """A TCP or Unix stream socket transport; libuv owns the socket's fd.

    It derives from asyncio's flow-control transport base (an
    asyncio.Transport) because asyncio's sendfile fallback insists on it; the
    flow control itself is the native core's.
    """

    _sendfile_compatible = constants._SendfileMode.TRY_NATIVE
    _start_tls_compatible = True

    # The native core's methods, bound on an instance when first used (so
    # calling them runs no Python code). The rest of the API forwards from
    # Python (methods below).
    write = _CoreMethod("write")
    writelines = _CoreMethod("writelines")
    close = _CoreMethod("close")
    is_closing = _CoreMethod("is_closing")
    pause_reading = _CoreMethod("pause_reading")
    resume_reading = _CoreMethod("resume_reading")
    get_write_buffer_size = _CoreMethod("get_write_buffer_size")

    # The family and protocol of the socket object still to be made, for a
    # transport opened on a bare fd (None: made, or never needed).
    _sock_family = None

    def __init__(self, loop, sock, protocol, waiter=None, extra=None, server=None):
        asyncio.BaseTransport.__init__(self, extra)
        self._extra["socket"] = trsock.TransportSocket(sock)
        socket_extra(self._extra, sock)
        self._loop = loop
        self._sock = sock
        self._sock_fd = fd = sock.fileno()
        self._released = False
        # The core sets TCP_NODELAY on TCP sockets, as asyncio does.
        core = _zuvrs.StreamCore.open(loop, fd, self, sock.family == socket.AF_UNIX)
        self._start(core, protocol, waiter, server)

    @classmethod
    def _open_tcp(cls, loop, fd, family, proto, protocol, waiter=None, peername=None, server=None):
        """A transport over the connected TCP socket `fd` (from accept or
        connect; the transport owns it from now on, closing it if this
        fails). The socket object behind get_extra_info('socket') is only
        made when asked for."""
        self = cls.__new__(cls)
        try:
            self._extra = extra = {}
            self._loop = loop
            self._sock = None
            self._sock_fd = fd
            self._sock_family = family
            self._sock_proto = proto
            self._released = False
            extra["sockname"], extra["peername"] = _tcp_names(fd, peername)
            core = _open_core(loop, fd, self, False)
        except BaseException:
            os.close(fd)
            raise
        self._start(core, protocol, waiter, server)
        return self

    def _start(self, core, protocol, waiter, server):
        loop = self._loop
        self._server = server
        self._core = core
        core.set_protocol(protocol, isinstance(protocol, _BufferedProtocol))
        self._protocol_connected = True
        if server is not None:
            _attach_to(server, self)
        loop._stream_transports[self._sock_fd] = self
        loop.call_soon(protocol.connection_made, self)
        # Reading starts only once connection_made() has run.
        loop.call_soon(_start_reading, core)
        if waiter is not None:
            loop.call_soon(futures._set_result_unless_cancelled, waiter, None)

    def get_extra_info(self, name, default=None):
        if name == "socket" and self._sock_family is not None:
            self._socket()
        return self._extra.get(name, default)

    def _socket(self):
        """The socket object (made now if this transport was opened on a
        bare fd); None once the transport has released its fd."""
        family = self._sock_family
        if family is not None:
            self._sock_family = None
            proto = self._sock_proto
            if self._released:
                # What asyncio's transport shows once closed: a closed
                # socket of the same kind.
                sock = socket.socket(family, socket.SOCK_STREAM, proto)
                sock.close()
            else:
                sock = socket.socket(family, socket.SOCK_STREAM, proto, self._sock_fd)
                sock.setblocking(False)
                self._sock = sock
            self._extra["socket"] = trsock.TransportSocket(sock)
        return self._sock

    @property
    def _protocol_paused(self):
        return self._core._protocol_paused()

    def write_eof(self):
        self._core.write_eof()

    def can_write_eof(self):
        return True

    def abort(self):
        self._core.abort()

    def is_reading(self):
        return self._core.is_reading()

    def get_write_buffer_limits(self):
        return self._core.get_write_buffer_limits()

    def set_write_buffer_limits(self, high=None, low=None):
        self._core.set_write_buffer_limits(high, low)

    def get_protocol(self):
        return self._core.get_protocol()

    def _force_close(self, exc):
        self._core._force_close(exc)

    def _wait_drained(self):
        """A future resolved once everything written has been sent."""
        fut = self._loop.create_future()
        self._core._wait_drained(fut)
        return fut

    def __repr__(self):
        info = [type(self).__name__]
        if self._released:
            info.append("closed")
        elif self._core.is_closing():
            info.append("closing")
        info.append(f"fd={self._sock_fd}")
        return "<{}>".format(" ".join(info))

    def set_protocol(self, protocol):
        self._core.set_protocol(protocol, isinstance(protocol, protocols.BufferedProtocol))
        self._protocol_connected = True

    def _fatal_error(self, exc, message="Fatal error on transport"):
        report_error(self, exc, message, self._core.get_protocol(), isinstance(exc, OSError))
        self._core._force_close(exc)

    def _report_error(self, message, exc):
        report_error(self, exc, message, self._core.get_protocol())

    def _call_connection_lost(self, exc):
        try:
            if self._protocol_connected:
                protocol = self._core.get_protocol()
                if protocol is not None:
                    protocol.connection_lost(exc)
        finally:
            self._release(True)

    def _release(self, finished=False):
        """Free the fd (libuv closes it) and forget the protocol and server;
        `finished` (connection_lost has run) lets the core forget this
        transport as well."""
        if self._released:
            return
        self._released = True
        sock, self._sock = self._sock, None
        if sock is not None:
            # libuv owns the fd: keep the socket object from closing it too.
            sock.detach()
        core = self._core
        core._close_handle()
        core._forget_protocol(finished)
        transports = self._loop._stream_transports
        if transports.get(self._sock_fd) is self:
            del transports[self._sock_fd]
        server, self._server = self._server, None
        if server is not None:
            _detach_from(server, self)
