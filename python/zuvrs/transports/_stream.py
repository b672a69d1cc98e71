"""Socket transports: TCP and Unix stream sockets over a native StreamCore.

The transport is an ``asyncio.Transport`` (through asyncio's flow-control
base, on which asyncio's sendfile fallback insists); libuv owns the
socket's fd. Connections that zuvrs accepts or connects natively have no
extra info until something asks for it (``get_extra_info('socket')``,
``'sockname'``, ``'peername'``, or ``_extra``): then their names are
fetched and the dict made, and the socket object only when it is used.
A connection that ends without anyone asking fetches its names as it lets
go of the fd, so they can still be asked for after the close, as asyncio's.
"""

import socket
from asyncio import constants, protocols, transports, trsock

from .. import _zuvrs
from .._server import NATIVE_CLIENT_TRACKING, Server
from ._base import ASYNCIO_GET_EXTRA_INFO, CoreMethod, ExtraInfo, NativeTransport, WriteFlowControl, socket_extra

__all__ = ("SocketTransport",)

_open_core = _zuvrs.StreamCore.open
_open_connected = _zuvrs.StreamCore.open_connected
_tcp_names = _zuvrs.tcp_names
_BufferedProtocol = protocols.BufferedProtocol


def _attach_to(server, transport):
    # asyncio's Server takes the transport from 3.13 on; zuvrs's own Server
    # subclass (older Pythons) accepts it too; a plain older Server does not.
    if NATIVE_CLIENT_TRACKING or isinstance(server, Server):
        server._attach(transport)
    else:
        server._attach()


class _TransportSocket(trsock.TransportSocket):
    """``get_extra_info('socket')``: asyncio's TransportSocket, whose socket
    object is made when first used for a transport opened on a bare fd (a
    connection zuvrs accepted or connected natively). The extra info stays
    a plain dict, read by asyncio's own ``get_extra_info`` (code that
    patches that method still works), at C speed."""

    # (fd, family, proto) of the socket still to be made (fd -1: the
    # transport let go of the fd, make a closed one), or None once made.
    __slots__ = ("_pending",)

    @classmethod
    def of_socket(cls, sock):
        self = cls.__new__(cls)
        self._pending = None
        self._sock = sock
        return self

    def __getattr__(self, name):
        # Reached only for attributes the object lacks: `_sock` while the
        # socket is still to be made.
        if name != "_sock" or self._pending is None:
            raise AttributeError(name)
        fd, family, proto = self._pending
        self._pending = None
        if fd < 0:
            # What asyncio's transport shows once closed: a closed socket
            # of the same kind.
            sock = socket.socket(family, socket.SOCK_STREAM, proto)
            sock.close()
        else:
            sock = socket.socket(family, socket.SOCK_STREAM, proto, fd)
            sock.setblocking(False)
        self._sock = sock
        return sock

    def _let_go(self):
        """libuv closes the fd: keep the socket object from closing it too."""
        pending = self._pending
        if pending is not None:
            self._pending = (-1,) + pending[1:]
        else:
            self._sock.detach()


_new_tsock = _TransportSocket.__new__


def _native_extra(pending):
    """The extra info of a connection zuvrs set up natively, from what its
    transport keeps until then (``_pending_extra``): ``(fd, family, proto,
    peername)`` while the fd is open (the names are fetched now, the socket
    object made on the fd when first used), or ``(-1, family, proto,
    sockname, peername)`` once the fd was let go (a closed socket object)."""
    socket_fd, family, proto = pending[:3]
    if len(pending) == 4:
        sockname, peername = _tcp_names(socket_fd, pending[3])
    else:
        sockname, peername = pending[3:]
    # (_TransportSocket's constructor for a bare fd, inline.)
    tsock = _new_tsock(_TransportSocket)
    tsock._pending = (socket_fd, family, proto)
    return {"socket": tsock, "sockname": sockname, "peername": peername}

# What the extra info of a socket transport holds, and 'zuvrs_stats' (which
# needs no dict); anything else it is asked for is the default until the
# dict is made.
_ASKED_BEFORE_MADE = frozenset(("socket", "sockname", "peername", "zuvrs_stats"))


class _SocketExtraInfo(ExtraInfo):
    """ExtraInfo that answers a name the transport's extra info never holds
    without making the dict (asyncio's streams ask every connection for
    'sslcontext')."""

    def get_extra_info(self, name, default=None):
        if transports.BaseTransport.get_extra_info is ASYNCIO_GET_EXTRA_INFO and name != "zuvrs_stats":
            # ExtraInfo's answer, without its call (connections ask often).
            extra = self._extra_dict
            if extra is None:
                if name not in _ASKED_BEFORE_MADE:
                    return default
                extra = self._extra
            return extra.get(name, default)
        return ExtraInfo.get_extra_info(self, name, default)


class SocketTransport(NativeTransport, WriteFlowControl, transports._FlowControlMixin, _SocketExtraInfo):
    """A TCP or Unix stream socket transport over a StreamCore."""

    _sendfile_compatible = constants._SendfileMode.TRY_NATIVE
    _start_tls_compatible = True

    write = CoreMethod("write")
    writelines = CoreMethod("writelines")
    pause_reading = CoreMethod("pause_reading")
    resume_reading = CoreMethod("resume_reading")
    is_reading = CoreMethod("is_reading")
    write_eof = CoreMethod("write_eof")
    abort = CoreMethod("abort")

    # The extra info (see the module docstring): the dict once made, and
    # until then the (fd, family, proto, peername) to make it from.
    _extra_dict = None
    _pending_extra = None

    @property
    def _extra(self):
        extra = self._extra_dict
        if extra is None:
            extra = self._extra_dict = self._make_extra()
        return extra

    @_extra.setter
    def _extra(self, extra):
        self._extra_dict = extra
        self._pending_extra = None

    def _make_extra(self):
        """The extra info of a connection zuvrs set up natively."""
        pending, self._pending_extra = self._pending_extra, None
        return _native_extra(pending)

    def __init__(self, loop, sock, protocol, waiter=None, extra=None, server=None):
        self._open_socket(loop, sock, extra)
        # A user's socket may have no peer; one zuvrs accepted or connected
        # (_open_tcp) always has one.
        self._connect(self._core, protocol, waiter, server, self._unconnected_socket_check())

    def _open_socket(self, loop, sock, extra):
        self._extra = dict(extra or ())
        self._extra["socket"] = _TransportSocket.of_socket(sock)
        socket_extra(self._extra, sock)
        self._loop = loop
        self._fd = self._sock_fd = sock.fileno()
        self._server = None
        # The core sets TCP_NODELAY on TCP sockets, as asyncio does.
        self._core = _open_core(loop, self._fd, self, sock.family == socket.AF_UNIX)

    @classmethod
    def _unconnected(cls, loop, sock, extra=None):
        """A transport over `sock` with no protocol yet (TLS decides what it
        carries: transports/_tls.py)."""
        self = cls.__new__(cls)
        self._open_socket(loop, sock, extra)
        return self

    def _carry_tls(self, tls, server):
        """The socket carries the native TLS transport `tls`: registered and
        attached as a connection, started once the handshake can begin."""
        self._server = server
        self._protocol_connected = True
        if server is not None:
            _attach_to(server, self)
        self._start(None, None, then=tls._begin)

    @classmethod
    def _open_tcp(cls, loop, fd, family, proto, protocol, waiter=None, peername=None, server=None):
        """A transport over the connected TCP socket `fd` (from accept or
        connect; the transport owns it from now on, closing it if this
        fails), with `protocol` connected: what ``__init__`` and
        ``_connect`` do, the core doing all but the attributes
        (src/transport/stream/socket.rs). The socket object behind
        get_extra_info('socket') is only made when asked for."""
        self = cls.__new__(cls)
        self._loop = loop
        self._fd = self._sock_fd = fd
        self._pending_extra = (fd, family, proto, peername)
        self._server = server
        self._protocol_connected = True
        self._core = _open_connected(loop, fd, self, protocol, waiter, server, cls is SocketTransport)
        return self

    def _connect(self, core, protocol, waiter, server, then=None):
        self._server = server
        self._core = core
        core.set_protocol(protocol, isinstance(protocol, _BufferedProtocol))
        self._protocol_connected = True
        if type(self) is SocketTransport:
            # The end is this class's, done by the core (a subclass's own
            # _call_connection_lost is called).
            core._end_natively()
        if server is not None:
            _attach_to(server, self)
        self._start(protocol, waiter, then=then)

    def _unconnected_socket_check(self):
        """For a socket with no peer (a user's socket never connected), what
        asyncio's first read meets: the kernel's error (EINVAL, ENOTCONN),
        reported as its read error once connection_made has run. libuv sees
        the socket's hang-up as an end of file instead. None otherwise."""
        if self._extra.get("peername") is not None:
            return None
        sock = self._extra["socket"]._sock
        try:
            sock.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as exc:
            error = exc
            return lambda: self._fatal_error(error, "Fatal read error on socket transport")
        return None

    def _socket(self):
        """The socket object (made now if this transport was opened on a
        bare fd); None once the transport has released its fd."""
        if self._released:
            return None
        return self._extra["socket"]._sock

    def can_write_eof(self):
        return True

    def set_protocol(self, protocol):
        self._core.set_protocol(protocol, isinstance(protocol, _BufferedProtocol))
        self._protocol_connected = True

    def _wait_drained(self):
        """A future resolved once everything written has been sent."""
        fut = self._loop.create_future()
        self._core._wait_drained(fut)
        return fut

    def __repr__(self):
        info = [type(self).__name__]
        state = self._state()
        if state != "open":
            info.append(state)
        info.append(f"fd={self._sock_fd}")
        return "<{}>".format(" ".join(info))

    def _call_connection_lost(self, exc):
        try:
            if self._protocol_connected:
                protocol = self._core.get_protocol()
                if protocol is not None:
                    protocol.connection_lost(exc)
        finally:
            self._release_fd(True)

    def _let_go_of_fd(self, core):
        # The names kept for after the close, the handle closed, the server
        # told (src/transport/stream/socket.rs).
        core._let_go_of_fd(self)
