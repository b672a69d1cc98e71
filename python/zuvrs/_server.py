"""Server objects: asyncio's own Server, with what newer Pythons added.

Python 3.13 gave asyncio.Server ``close_clients()`` / ``abort_clients()`` and
``create_server(keep_alive=)``. zuvrs offers both on every Python: on older
versions the server asyncio creates is given this subclass, which tracks its
client transports.
"""

import socket
import sys
from asyncio import base_events

__all__ = ("Server", "NATIVE_CLIENT_TRACKING", "upgrade_server", "apply_keep_alive")

# 3.13+: asyncio's Server tracks clients and create_server takes keep_alive.
NATIVE_CLIENT_TRACKING = sys.version_info >= (3, 13)


class Server(base_events.Server):
    """asyncio.Server plus client tracking (close_clients, abort_clients)."""

    # asyncio's _attach / _detach (3.10 to 3.12) with the client set; a
    # transport is attached from its creation until it releases its socket,
    # and alive all that time, so a plain set does (asyncio 3.13 uses a
    # WeakSet because its transports can be dropped unreleased).

    def _attach(self, transport=None):
        assert self._sockets is not None
        self._active_count += 1
        if transport is not None:
            self._zuvrs_clients.add(transport)

    def _detach(self, transport=None):
        if transport is not None:
            self._zuvrs_clients.discard(transport)
        assert self._active_count > 0
        self._active_count -= 1
        if self._active_count == 0 and self._sockets is None:
            self._wakeup()

    def close_clients(self):
        """Close every client connection of this server."""
        for transport in list(self._zuvrs_clients):
            transport.close()

    def abort_clients(self):
        """Abort every client connection of this server (pending data dropped)."""
        for transport in list(self._zuvrs_clients):
            transport.abort()


def upgrade_server(server):
    """Give a server created by asyncio client tracking (Python < 3.13)."""
    if not NATIVE_CLIENT_TRACKING and type(server) is base_events.Server:
        server.__class__ = Server
        server._zuvrs_clients = set()
    return server


def apply_keep_alive(server):
    """SO_KEEPALIVE on the listening sockets (inherited by accepted ones)."""
    for sock in server._sockets or ():
        if sock.family != getattr(socket, "AF_UNIX", None):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
