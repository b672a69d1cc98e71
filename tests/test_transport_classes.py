"""zuvrs's transports behave as asyncio's transport classes where code
outside the loop reaches them through those classes: a method that
asyncio's transports inherit from ``asyncio.Transport`` and its relatives,
replaced there (as tests do with ``unittest.mock.patch``), is what a
transport of either loop then runs.

websockets' suite patches ``asyncio.Transport.get_extra_info`` to give its
connections made-up addresses; zuvrs's transports defined their own
``get_extra_info`` ahead of asyncio's classes and ignored the patch.
"""

import asyncio
import os
import socket
from asyncio import selector_events, unix_events
from unittest import mock

import pytest
from _support import LoopFactory, run

MADE_UP = ("made-up", 1234)

# The classes a patch can go on: those asyncio's transports inherit
# get_extra_info through (from BaseTransport). Which they are depends on
# the Python version (the selector's datagram transport is no
# asyncio.DatagramTransport on 3.11), so they are read off asyncio's own.
_ASYNCIO_CLASSES = {
    "tcp": selector_events._SelectorSocketTransport,
    "unix": selector_events._SelectorSocketTransport,
    "udp": selector_events._SelectorDatagramTransport,
    "read_pipe": unix_events._UnixReadPipeTransport,
    "write_pipe": unix_events._UnixWritePipeTransport,
}
_BASES = ("Transport", "ReadTransport", "WriteTransport", "DatagramTransport", "BaseTransport")
CASES = [(kind, base) for kind, cls in _ASYNCIO_CLASSES.items() for base in _BASES
         if issubclass(cls, getattr(asyncio, base))]


async def _transport_of(kind: str, closers: list) -> asyncio.BaseTransport:
    """A transport of `kind` on the running loop, made the way users make
    them (a TCP one accepted by a server the loop runs)."""
    loop = asyncio.get_running_loop()
    if kind == "tcp":
        accepted: "asyncio.Future[asyncio.BaseTransport]" = loop.create_future()

        class Server(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                accepted.set_result(transport)

        server = await loop.create_server(Server, "127.0.0.1", 0)
        closers.append(server.close)
        client, _ = await loop.create_connection(asyncio.Protocol, *server.sockets[0].getsockname()[:2])
        closers.append(client.close)
        transport = await accepted
        closers.append(transport.close)
        return transport
    if kind == "unix":
        a, b = socket.socketpair()
        closers.append(b.close)
        transport, _ = await loop.create_connection(asyncio.Protocol, sock=a)
    elif kind == "udp":
        transport, _ = await loop.create_datagram_endpoint(asyncio.DatagramProtocol, local_addr=("127.0.0.1", 0))
    else:
        r, w = os.pipe()
        if kind == "read_pipe":
            closers.append(lambda: os.close(w))
            transport, _ = await loop.connect_read_pipe(asyncio.Protocol, os.fdopen(r, "rb", 0))
        else:
            closers.append(lambda: os.close(r))
            transport, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(w, "wb", 0))
    closers.append(transport.close)
    return transport


def _check_transport(loop_factory: LoopFactory, kind: str, check) -> None:
    """Runs `check(transport)` on a transport of `kind` on a new loop of
    the kind under test, then closes everything."""

    async def main() -> None:
        closers: list = []
        try:
            check(await _transport_of(kind, closers))
        finally:
            for close in reversed(closers):
                close()
            await asyncio.sleep(0)

    loop = loop_factory()
    try:
        run(loop, main())
    finally:
        loop.close()


@pytest.mark.parametrize("kind,base", CASES)
def test_patched_get_extra_info_reaches_the_transport(loop_factory: LoopFactory, kind: str, base: str) -> None:
    """``patch("asyncio.<Base>.get_extra_info")`` answers every name a
    transport is asked for while the patch holds, the names a transport
    has (``peername``) and those it has not (``sslcontext``) alike; the
    transport's own answers come back once the patch is gone."""

    def check(transport: asyncio.BaseTransport) -> None:
        # Asked before the patch, so both loops have made their extra
        # info (zuvrs makes a native connection's on first ask).
        before = transport.get_extra_info("sockname")
        with mock.patch(f"asyncio.{base}.get_extra_info") as patched:
            patched.return_value = MADE_UP
            assert transport.get_extra_info("peername") == MADE_UP
            assert transport.get_extra_info("sslcontext") == MADE_UP
            patched.assert_called_with("sslcontext")
        assert transport.get_extra_info("sockname") == before
        assert transport.get_extra_info("sslcontext") is None

    _check_transport(loop_factory, kind, check)


@pytest.mark.parametrize("base", ["Transport", "BaseTransport"])
def test_patched_get_extra_info_on_a_fresh_native_connection(loop_factory: LoopFactory, base: str) -> None:
    """websockets' case: a connection whose extra info nobody asked for yet
    (zuvrs has not made it) answers from a patched ``asyncio.Transport``
    (or BaseTransport) too, then from its own once the patch is gone."""

    def check(transport: asyncio.BaseTransport) -> None:
        with mock.patch(f"asyncio.{base}.get_extra_info") as patched:
            patched.return_value = MADE_UP
            assert transport.get_extra_info("sockname") == MADE_UP
            assert transport.get_extra_info("sslcontext") == MADE_UP
            assert transport.get_extra_info("socket") == MADE_UP
        assert transport.get_extra_info("peername")[0] == "127.0.0.1"
        assert transport.get_extra_info("sslcontext") is None

    _check_transport(loop_factory, "tcp", check)
