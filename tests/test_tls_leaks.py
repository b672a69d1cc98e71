"""TLS connections leave nothing behind: after thousands of TLS connections
opened, used and closed (client and server on the loop under test) the
process has the same file descriptors, no more gc-tracked objects of any
type (transports, stream cores, SSLObjects, _ssl sockets, MemoryBIOs,
protocols), and a flat RSS. A leaked libuv handle would keep its core (its
box holds a reference) and its fd, so both counts see it.

ZUVRS_TLS_LEAK_CONNECTIONS sets the number of measured connections
(default 2,000; 10,000 for the full run).
"""

import asyncio
import collections
import gc
import os

import pytest
from _support import RecordingProtocol, fd_count, rss_bytes, run
from _tls_support import SSLPROTO_311, MiB, assert_tls_path, client_context, server_context

pytest.importorskip("cryptography")
from _tls_certs import make_pki  # noqa: E402

CONNECTIONS = int(os.environ.get("ZUVRS_TLS_LEAK_CONNECTIONS", "2000"))
WARMUP = 300
BATCH = 25
RSS_TOLERANCE = 8 * MiB
# Far below one object per connection (what any leak costs), above the
# stdlib's own noise (weakrefs and sets of caches settling: up to ~300 seen).
OBJECT_TOLERANCE = max(600, CONNECTIONS // 4)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def _types():
    gc.collect()
    gc.collect()
    return collections.Counter(type(o).__name__ for o in gc.get_objects())


@pytest.mark.parametrize("kind", ["protocol", "streams"])
def test_tls_connections_leave_nothing_behind(loop, pki, kind):
    sctx = server_context(pki)
    cctx = client_context(pki)

    async def serve():
        if kind == "protocol":
            return await loop.create_server(lambda: RecordingProtocol(echo=True), "127.0.0.1", 0, ssl=sctx,
                                            backlog=200)

        async def handler(reader, writer):
            writer.write(await reader.readexactly(4))
            await writer.drain()
            writer.close()
            await writer.wait_closed()

        return await asyncio.start_server(handler, "127.0.0.1", 0, ssl=sctx, backlog=200)

    async def one(port, check):
        if kind == "protocol":
            t, p = await loop.create_connection(RecordingProtocol, "127.0.0.1", port, ssl=cctx,
                                                server_hostname="localhost")
            if check:
                assert_tls_path(loop, t)
            t.write(b"ping")
            await p.received(4)
            t.close()
            await p.lost
        else:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=cctx, server_hostname="localhost")
            if check:
                assert_tls_path(loop, writer.transport)
            writer.write(b"ping")
            assert await reader.readexactly(4) == b"ping"
            assert await reader.read() == b""
            writer.close()
            await writer.wait_closed()

    async def rounds(port, n):
        for i in range(0, n, BATCH):
            await asyncio.gather(*(one(port, i == 0 and j == 0) for j in range(BATCH)))
        # Let the server's ends finish closing.
        for _ in range(20):
            await asyncio.sleep(0.005)

    async def main():
        srv = await serve()
        port = srv.sockets[0].getsockname()[1]
        await rounds(port, WARMUP)
        fds0, types0, rss0 = fd_count(), _types(), rss_bytes()
        await rounds(port, CONNECTIONS)
        fds1, types1, rss1 = fd_count(), _types(), rss_bytes()
        srv.close()
        await srv.wait_closed()
        return fds0, fds1, types0, types1, rss0, rss1

    fds0, fds1, types0, types1, rss0, rss1 = run(loop, main(), 60 + CONNECTIONS * 0.05)
    grown = {name: types1[name] - types0[name] for name in types1 if types1[name] > types0[name]}
    print(f"\n{CONNECTIONS} TLS connections ({kind}): fds {fds0} -> {fds1}, "
          f"gc objects {sum(types0.values())} -> {sum(types1.values())}, "
          f"RSS {rss0 / MiB:.1f} -> {rss1 / MiB:.1f} MiB; grown types: {grown}")
    assert fds1 <= fds0
    for name in ("StreamCore", "SSLTransport", "SocketTransport", "SSLObject", "_SSLSocket", "MemoryBIO",
                 "RecordingProtocol", "StreamWriter", "StreamReader", "_SSLProtocolTransport", "SSLProtocol"):
        assert types1[name] <= types0[name], f"{types1[name] - types0[name]} more {name}"
    assert sum(types1.values()) - sum(types0.values()) < OBJECT_TOLERANCE, grown
    assert rss1 - rss0 < RSS_TOLERANCE, f"RSS grew by {(rss1 - rss0) / MiB:.1f} MiB"


def test_failed_handshakes_leave_nothing_behind(loop, pki):
    """Handshakes that fail (an unknown CA) leave nothing either."""
    sctx = server_context(pki, "unknown_ca")
    cctx = client_context(pki)
    n = max(200, CONNECTIONS // 10)

    async def main():
        srv = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0, ssl=sctx, backlog=200)
        port = srv.sockets[0].getsockname()[1]

        async def one():
            try:
                await loop.create_connection(asyncio.Protocol, "127.0.0.1", port, ssl=cctx,
                                             server_hostname="localhost")
            except OSError:
                return
            raise AssertionError("the handshake should fail")

        async def rounds(k):
            for _ in range(0, k, BATCH):
                await asyncio.gather(*(one() for _ in range(BATCH)))
            for _ in range(20):
                await asyncio.sleep(0.005)

        await rounds(100)
        fds0, types0 = fd_count(), _types()
        await rounds(n)
        fds1, types1 = fd_count(), _types()
        srv.close()
        await srv.wait_closed()
        return fds0, fds1, types0, types1

    loop.set_exception_handler(lambda lp, ctx: None)
    fds0, fds1, types0, types1 = run(loop, main(), 120)
    assert fds1 <= fds0
    grown = {name: types1[name] - types0[name] for name in types1 if types1[name] > types0[name]}
    for name in ("StreamCore", "SSLTransport", "SocketTransport", "SSLObject", "_SSLSocket", "MemoryBIO"):
        assert types1[name] <= types0[name], grown
    assert sum(types1.values()) - sum(types0.values()) < OBJECT_TOLERANCE, grown


def test_a_cancelled_handshake_frees_the_context_at_once(loop, pki):
    """A connection whose handshake is cut short by a timeout lets go of the
    SSLContext by the time run_until_complete returns, with no garbage
    collection (CPython's test_ssl asks this of asyncio: the connection's
    objects must not wait for the loop's next turn)."""
    import socket
    import weakref

    listener = socket.create_server(("127.0.0.1", 0))  # accepts, never answers
    host, port = listener.getsockname()[:2]
    ctx = client_context(pki)

    async def connect(ctx):
        with pytest.raises((ConnectionRefusedError, asyncio.TimeoutError)):
            await asyncio.wait_for(loop.create_connection(asyncio.Protocol, host, port, ssl=ctx,
                                                          server_hostname="localhost"), 0.1)

    with listener:
        loop.run_until_complete(connect(ctx))
        ref = weakref.ref(ctx)
        del ctx
    assert ref() is None


@SSLPROTO_311
def test_a_closed_connection_kept_by_its_protocol_frees_the_context_at_once(loop, pki):
    """A protocol that keeps its TLS transport, which it closes after the
    peer's close_notify: the SSLContext is gone once run_until_complete
    returns, with no garbage collection (CPython's test_ssl's
    test_create_connection_memory_leak, with the peer on the loop)."""
    import weakref

    sctx = server_context(pki)
    cctx = client_context(pki)

    class Server(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport = transport
            transport.write(b"O")

        def data_received(self, data):
            self.transport.close()  # close_notify to the client

    class Client(asyncio.Protocol):
        def __init__(self, got, eof):
            self.got, self.eof = got, eof

        def connection_made(self, transport):
            self.transport = transport  # kept, as CPython's test does

        def data_received(self, data):
            self.got.set_result(data)

        def eof_received(self):
            self.eof.set_result(True)

    async def serve():
        return await loop.create_server(Server, "127.0.0.1", 0, ssl=sctx)

    srv = loop.run_until_complete(serve())
    port = srv.sockets[0].getsockname()[1]

    async def client(ctx):
        got, eof = loop.create_future(), loop.create_future()
        transport, _ = await loop.create_connection(lambda: Client(got, eof), "127.0.0.1", port, ssl=ctx,
                                                    server_hostname="localhost")
        assert await got == b"O"
        transport.write(b"hello")
        await eof
        transport.close()

    loop.run_until_complete(asyncio.wait_for(client(cctx), 10))
    ref = weakref.ref(cctx)
    del cctx
    assert ref() is None
    srv.close()
    loop.run_until_complete(srv.wait_closed())
