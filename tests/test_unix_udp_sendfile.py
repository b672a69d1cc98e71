"""Unix stream sockets, UDP endpoints and sendfile, on both loops."""

import asyncio
import hashlib
import os
import socket
import sys

import pytest
from _support import (
    TIMEOUT,
    RecordingProtocol,
    TcpPair,
    payload,
    run,
    unused_tcp_port,
)

MiB = 1024 * 1024

needs_unix = pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="no AF_UNIX")


@pytest.fixture
def sock_path(tmp_path):
    # Unix socket paths are limited to ~108 bytes; tmp_path may be long.
    import tempfile

    d = tempfile.mkdtemp(prefix="zuvrs-")
    path = os.path.join(d, "s")
    yield path
    if os.path.exists(path):
        os.unlink(path)
    os.rmdir(d)


# -- Unix stream sockets ---------------------------------------------------------------


@needs_unix
def test_unix_streams_echo(loop, sock_path):
    data = payload(MiB, seed=1)

    async def main():
        async def handler(reader, writer):
            while chunk := await reader.read(65536):
                writer.write(chunk)
                await writer.drain()
            writer.close()

        srv = await asyncio.start_unix_server(handler, sock_path)
        try:
            assert srv.sockets[0].family == socket.AF_UNIX
            reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(sock_path), TIMEOUT)
            writer.write(data)
            writer.write_eof()
            got = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            await asyncio.wait_for(writer.wait_closed(), TIMEOUT)
            return got
        finally:
            srv.close()
            await srv.wait_closed()

    assert hashlib.sha256(run(loop, main(), 20)).digest() == hashlib.sha256(data).digest()


@needs_unix
def test_unix_connection_protocols(loop, sock_path):
    async def main():
        accepted = []

        def factory():
            p = RecordingProtocol(echo=True)
            accepted.append(p)
            return p

        srv = await loop.create_unix_server(factory, sock_path)
        try:
            t, client = await asyncio.wait_for(loop.create_unix_connection(RecordingProtocol, sock_path), TIMEOUT)
            assert isinstance(t, asyncio.Transport)
            assert t.get_extra_info("peername") == sock_path
            assert t.get_extra_info("socket").family == socket.AF_UNIX
            t.write(b"over unix")
            await client.received(9)
            assert bytes(client.data) == b"over unix"
            assert t.can_write_eof()
            t.write_eof()
            assert await asyncio.wait_for(client.lost, TIMEOUT) is None
            assert client.events == ["made", "data", "eof", "lost"]
            assert await asyncio.wait_for(accepted[0].lost, TIMEOUT) is None
        finally:
            srv.close()
            await srv.wait_closed()

    run(loop, main())


# -- UDP ---------------------------------------------------------------------------------


class DatagramRecorder(asyncio.DatagramProtocol):
    def __init__(self, echo=False):
        loop = asyncio.get_running_loop()
        self.echo = echo
        self.transport = None
        self.datagrams = []
        self.errors = []
        self.got = asyncio.Queue()
        self.lost = loop.create_future()

    def connection_made(self, transport):
        self.transport = transport

    def datagram_received(self, data, addr):
        self.datagrams.append((data, addr))
        if self.echo:
            self.transport.sendto(data, addr)
        self.got.put_nowait((data, addr))

    def error_received(self, exc):
        self.errors.append(exc)
        self.got.put_nowait(exc)

    def connection_lost(self, exc):
        self.lost.set_result(exc)


def test_udp_endpoint_echo(loop):
    async def main():
        st, server = await loop.create_datagram_endpoint(
            lambda: DatagramRecorder(echo=True), local_addr=("127.0.0.1", 0)
        )
        server_addr = st.get_extra_info("sockname")
        ct, client = await loop.create_datagram_endpoint(DatagramRecorder, remote_addr=server_addr)
        try:
            # (asyncio's selector UDP transport is not a DatagramTransport subclass.)
            assert isinstance(ct, asyncio.BaseTransport)
            assert ct.get_extra_info("peername") == server_addr
            client_addr = ct.get_extra_info("sockname")
            for i in range(20):
                msg = b"datagram %d" % i
                ct.sendto(msg)
                assert await asyncio.wait_for(client.got.get(), TIMEOUT) == (msg, server_addr)
            big = payload(60000, seed=2)
            ct.sendto(big)
            assert await asyncio.wait_for(client.got.get(), TIMEOUT) == (big, server_addr)
            assert server.datagrams[0] == (b"datagram 0", client_addr)
            assert ct.get_write_buffer_size() == 0
        finally:
            ct.close()
            st.close()
        assert await asyncio.wait_for(client.lost, TIMEOUT) is None
        assert await asyncio.wait_for(server.lost, TIMEOUT) is None

    run(loop, main())


def test_udp_connected_refused_goes_to_error_received(loop):
    port = unused_tcp_port()  # almost surely nothing on this UDP port either

    async def main():
        ct, client = await loop.create_datagram_endpoint(DatagramRecorder, remote_addr=("127.0.0.1", port))
        try:
            ct.sendto(b"anyone?")
            item = await asyncio.wait_for(client.got.get(), TIMEOUT)
            assert isinstance(item, ConnectionRefusedError)
            assert not ct.is_closing()
        finally:
            ct.close()
        await asyncio.wait_for(client.lost, TIMEOUT)

    run(loop, main())


# -- sendfile ---------------------------------------------------------------------------


@pytest.fixture
def data_file(tmp_path):
    data = payload(5 * MiB + 123, seed=3)
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    return path, data


def test_loop_sendfile_over_tcp(loop, data_file):
    path, data = data_file

    async def main():
        pair = await TcpPair.open()
        try:
            with open(path, "rb") as f:
                sent = await asyncio.wait_for(loop.sendfile(pair.client.transport, f), 10)
                assert sent == len(data)
                assert f.tell() == len(data)
                sent = await asyncio.wait_for(loop.sendfile(pair.client.transport, f, 100, 1000), 10)
                assert sent == 1000
            await pair.server.received(len(data) + 1000, timeout=10)
            # The transport still works afterwards.
            pair.client.transport.write(b"tail")
            await pair.server.received(len(data) + 1004)
            return bytes(pair.server.data)
        finally:
            await pair.aclose()

    got = run(loop, main(), 20)
    assert got == data + data[100:1100] + b"tail"


def test_sock_sendfile(loop, data_file):
    path, data = data_file

    async def main():
        with socket.create_server(("127.0.0.1", 0)) as lsock:
            a = socket.create_connection(lsock.getsockname())
            b, _ = lsock.accept()
        a.setblocking(False)
        b.setblocking(False)
        try:

            async def receive(n):
                chunks = []
                while n:
                    chunk = await loop.sock_recv(b, min(n, 256 * 1024))
                    assert chunk
                    chunks.append(chunk)
                    n -= len(chunk)
                return b"".join(chunks)

            receiver = asyncio.ensure_future(receive(len(data) - 10))
            with open(path, "rb") as f:
                sent = await asyncio.wait_for(loop.sock_sendfile(a, f, 10), 10)
                assert sent == len(data) - 10
                assert f.tell() == len(data)
            return await asyncio.wait_for(receiver, 10)
        finally:
            a.close()
            b.close()

    assert run(loop, main(), 20) == data[10:]


@needs_unix
def test_unix_server_socket_file_after_close(loop, sock_path):
    """The socket file outlives the server before 3.13 and is removed with
    it from 3.13 (cleanup_socket's default), as asyncio does on each."""

    async def main():
        srv = await loop.create_unix_server(asyncio.Protocol, sock_path)
        assert os.path.exists(sock_path)
        srv.close()
        await srv.wait_closed()
        await asyncio.sleep(0)
        return os.path.exists(sock_path)

    assert run(loop, main()) is (sys.version_info < (3, 13))


@needs_unix
def test_unix_server_stale_socket_file_is_replaced(loop, sock_path):
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(sock_path)
    stale.close()

    async def main():
        srv = await loop.create_unix_server(asyncio.Protocol, sock_path)
        try:
            transport, _ = await asyncio.wait_for(loop.create_unix_connection(asyncio.Protocol, sock_path), TIMEOUT)
            transport.close()
        finally:
            srv.close()
            await srv.wait_closed()

    run(loop, main())


@needs_unix
@pytest.mark.parametrize("cleanup", [True, False])
def test_unix_server_cleanup_socket_option(loop, loop_name, sock_path, cleanup):
    """cleanup_socket= chooses (asyncio has the option from 3.13, zuvrs on
    every Python); a file put in the socket's place meanwhile is left."""
    if loop_name == "asyncio" and sys.version_info < (3, 13):
        pytest.skip("asyncio has cleanup_socket from 3.13")

    async def main(replace):
        srv = await loop.create_unix_server(asyncio.Protocol, sock_path, cleanup_socket=cleanup)
        if replace:
            os.unlink(sock_path)
            with open(sock_path, "w"):
                pass
        srv.close()
        await srv.wait_closed()
        await asyncio.sleep(0)
        kept = os.path.exists(sock_path)
        if kept:
            os.unlink(sock_path)
        return kept

    assert run(loop, main(False)) is (not cleanup)
    assert run(loop, main(True)) is True


@needs_unix
def test_unix_server_makes_no_python_os_calls(loop, loop_name, sock_path, monkeypatch):
    """zuvrs checks and removes the socket file natively, as uvloop does:
    no os.stat / os.unlink from Python, which blocking-call detectors
    (blockbuster, in aiohttp's tests) patch and allow only from asyncio's
    own create_unix_server and _stop_serving."""
    if loop_name == "asyncio":
        pytest.skip("asyncio calls os.stat and os.unlink itself (the detectors allow it)")
    calls = []
    real_stat, real_unlink, real_remove = os.stat, os.unlink, os.remove

    def spy(name, real):
        def call(*args, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)

        return call

    stale = socket.socket(socket.AF_UNIX)
    stale.bind(sock_path)
    stale.close()

    async def main():
        monkeypatch.setattr(os, "stat", spy("stat", real_stat))
        monkeypatch.setattr(os, "unlink", spy("unlink", real_unlink))
        monkeypatch.setattr(os, "remove", spy("remove", real_remove))
        srv = await loop.create_unix_server(asyncio.Protocol, sock_path, cleanup_socket=True)
        srv.close()
        await srv.wait_closed()
        monkeypatch.undo()

    run(loop, main())
    assert calls == []
    assert not os.path.exists(sock_path)
