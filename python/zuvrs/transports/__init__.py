"""zuvrs's transports, and the choice of one for a socket or pipe.

- ``_base``: NativeTransport, the one base of every transport over a
  native core (src/transport), and its write flow control
- ``_stream``: TCP and Unix stream sockets
- ``_pipes``: pipe transports on pipes, FIFOs and sockets
- ``_datagram``: UDP and Unix datagram sockets
- ``_tls``: TLS transports whose records the socket's core does natively
- ``_fallback``: the stdlib's own transports, for what a core cannot serve
"""

import os
import socket
import stat

from ._base import NativeTransport, plain_socket_io
from ._datagram import DatagramTransport
from ._fallback import FallbackDatagramTransport, FallbackSocketTransport, ReadPipeFallback, WritePipeFallback
from ._pipes import ReadPipeTransport, WritePipeTransport
from ._stream import SocketTransport

__all__ = (
    "NativeTransport",
    "SocketTransport",
    "DatagramTransport",
    "make_socket_transport",
    "native_stream_socket",
    "make_datagram_transport",
    "make_read_pipe_transport",
    "make_write_pipe_transport",
)

# The socket methods asyncio's transports call: a class that overrides one
# gets asyncio's transport, which calls it.
_STREAM_IO = ("recv", "recv_into", "send", "sendmsg")
_DATAGRAM_IO = ("send", "sendto", "recvfrom")
_DATAGRAM_FAMILIES = (socket.AF_INET, socket.AF_INET6, socket.AF_UNIX)


def native_stream_socket(sock):
    """Whether a stream socket gets a native core (see _fallback.py)."""
    return plain_socket_io(sock, _STREAM_IO)


def make_socket_transport(loop, sock, protocol, waiter=None, extra=None, server=None):
    cls = SocketTransport if native_stream_socket(sock) else FallbackSocketTransport
    return cls(loop, sock, protocol, waiter, extra, server)


def make_datagram_transport(loop, sock, protocol, address=None, waiter=None, extra=None):
    native = sock.family in _DATAGRAM_FAMILIES and plain_socket_io(sock, _DATAGRAM_IO)
    cls = DatagramTransport if native else FallbackDatagramTransport
    return cls(loop, sock, protocol, address, waiter, extra)


def _native_pipe(pipe):
    """Pipes, FIFOs and sockets get a native core; anything else goes to
    asyncio's pipe transports (character devices; they refuse the rest with
    asyncio's own ValueError)."""
    mode = os.fstat(pipe.fileno()).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def make_read_pipe_transport(loop, pipe, protocol, waiter=None, extra=None):
    cls = ReadPipeTransport if _native_pipe(pipe) else ReadPipeFallback
    return cls(loop, pipe, protocol, waiter, extra)


def make_write_pipe_transport(loop, pipe, protocol, waiter=None, extra=None):
    cls = WritePipeTransport if _native_pipe(pipe) else WritePipeFallback
    return cls(loop, pipe, protocol, waiter, extra)
