"""The loop's sock_* coroutines on non-blocking sockets (and name lookups)."""

import asyncio
import errno
import hashlib
import socket
import ssl
import struct

import pytest
from _support import TIMEOUT, payload, run, unused_tcp_port

MiB = 1024 * 1024


def skip_if_loop_lacks(loop, method):
    """asyncio has sock_sendto/sock_recvfrom/sock_recvfrom_into from 3.11
    (zuvrs has them on every Python): skip the reference where it lacks one."""
    if not hasattr(loop, method):
        pytest.skip(f"asyncio has loop.{method}() from 3.11")


def tcp_socket_pair():
    """Two connected non-blocking TCP sockets over 127.0.0.1."""
    with socket.create_server(("127.0.0.1", 0)) as lsock:
        a = socket.create_connection(lsock.getsockname())
        b, _ = lsock.accept()
    a.setblocking(False)
    b.setblocking(False)
    return a, b


@pytest.fixture
def tcp_socks():
    a, b = tcp_socket_pair()
    yield a, b
    a.close()
    b.close()


@pytest.fixture
def udp_socks():
    socks = []
    for _ in range(2):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        s.setblocking(False)
        socks.append(s)
    yield tuple(socks)
    for s in socks:
        s.close()


@pytest.fixture
def listener():
    lsock = socket.create_server(("127.0.0.1", 0))
    lsock.setblocking(False)
    yield lsock
    lsock.close()


async def _not_done_after(aw, delay=0.02):
    """Start ``aw`` as a task and check it is still pending after ``delay``."""
    task = asyncio.ensure_future(aw)
    await asyncio.sleep(delay)
    assert not task.done()
    return task


# -- TCP ---------------------------------------------------------------------------


def test_sock_recv(loop, tcp_socks):
    a, b = tcp_socks

    async def main():
        # Data already there.
        b.send(b"ready")
        assert await loop.sock_recv(a, 100) == b"ready"
        # Waiting for data.
        task = await _not_done_after(loop.sock_recv(a, 100))
        b.send(b"later")
        assert await asyncio.wait_for(task, TIMEOUT) == b"later"
        # At most n bytes.
        b.send(b"0123456789")
        await asyncio.sleep(0.01)
        assert await loop.sock_recv(a, 4) == b"0123"
        assert await loop.sock_recv(a, 100) == b"456789"
        # EOF.
        task = await _not_done_after(loop.sock_recv(a, 100))
        b.shutdown(socket.SHUT_WR)
        assert await asyncio.wait_for(task, TIMEOUT) == b""

    run(loop, main())


def test_sock_recv_into(loop, tcp_socks):
    a, b = tcp_socks

    async def main():
        buf = bytearray(10)
        task = await _not_done_after(loop.sock_recv_into(a, buf))
        b.send(b"hello")
        assert await asyncio.wait_for(task, TIMEOUT) == 5
        assert buf == b"hello\0\0\0\0\0"
        b.send(b"0123456789abc")
        await asyncio.sleep(0.01)
        view = memoryview(buf)[2:6]
        assert await loop.sock_recv_into(a, view) == 4
        assert buf == b"he0123\0\0\0\0"
        b.close()
        assert await asyncio.wait_for(loop.sock_recv_into(a, buf), TIMEOUT) == 9
        assert buf[:9] == b"456789abc"
        assert await asyncio.wait_for(loop.sock_recv_into(a, buf), TIMEOUT) == 0

    run(loop, main())


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_sock_sendall_large_payload(loop, tcp_socks, kind):
    a, b = tcp_socks
    data = payload(32 * MiB, seed=11)
    expected = hashlib.sha256(data).hexdigest()

    async def main():
        async def receive():
            h = hashlib.sha256()
            n = 0
            while n < len(data):
                chunk = await loop.sock_recv(b, 256 * 1024)
                assert chunk, "early EOF"
                h.update(chunk)
                n += len(chunk)
            return n, h.hexdigest()

        receiver = asyncio.ensure_future(receive())
        assert await asyncio.wait_for(loop.sock_sendall(a, kind(data)), 20) is None
        return await asyncio.wait_for(receiver, 20)

    assert run(loop, main(), 30) == (len(data), expected)


def test_sock_sendall_empty_and_small(loop, tcp_socks):
    a, b = tcp_socks

    async def main():
        assert await loop.sock_sendall(a, b"") is None
        assert await loop.sock_sendall(a, b"small") is None
        await asyncio.sleep(0.01)
        assert await loop.sock_recv(b, 100) == b"small"

    run(loop, main())


def test_sock_sendall_to_reset_peer(loop, tcp_socks):
    a, b = tcp_socks

    async def main():
        b.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        b.close()
        await asyncio.sleep(0.05)
        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            await asyncio.wait_for(loop.sock_sendall(a, payload(8 * MiB)), TIMEOUT)

    run(loop, main())


def test_sock_connect_and_accept(loop, listener):
    addr = listener.getsockname()

    async def main():
        accept = await _not_done_after(loop.sock_accept(listener))
        client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        client.setblocking(False)
        try:
            assert await asyncio.wait_for(loop.sock_connect(client, addr), TIMEOUT) is None
            conn, peer = await asyncio.wait_for(accept, TIMEOUT)
            with conn:
                assert conn.gettimeout() == 0  # accepted sockets are non-blocking
                assert peer == client.getsockname()
                assert client.getpeername() == addr
                await loop.sock_sendall(client, b"to server")
                assert await asyncio.wait_for(loop.sock_recv(conn, 100), TIMEOUT) == b"to server"
                await loop.sock_sendall(conn, b"to client")
                assert await asyncio.wait_for(loop.sock_recv(client, 100), TIMEOUT) == b"to client"
        finally:
            client.close()
        # A connection already waiting is accepted at once.
        with socket.create_connection(addr) as c2:
            conn, peer = await asyncio.wait_for(loop.sock_accept(listener), TIMEOUT)
            conn.close()
            assert peer == c2.getsockname()

    run(loop, main())


def test_sock_connect_resolves_names(loop, listener):
    port = listener.getsockname()[1]

    async def main():
        client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        client.setblocking(False)
        try:
            await asyncio.wait_for(loop.sock_connect(client, ("localhost", port)), TIMEOUT)
            assert client.getpeername() == ("127.0.0.1", port)
        finally:
            client.close()

    run(loop, main())


def test_sock_connect_refused(loop):
    port = unused_tcp_port()

    async def main():
        client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        client.setblocking(False)
        try:
            with pytest.raises(ConnectionRefusedError) as ei:
                await asyncio.wait_for(loop.sock_connect(client, ("127.0.0.1", port)), TIMEOUT)
            assert ei.value.errno == errno.ECONNREFUSED
        finally:
            client.close()

    run(loop, main())


# -- UDP --------------------------------------------------------------------------


def test_sock_sendto_recvfrom(loop, udp_socks):
    skip_if_loop_lacks(loop, "sock_sendto")
    a, b = udp_socks
    a_addr, b_addr = a.getsockname(), b.getsockname()

    async def main():
        assert await loop.sock_sendto(a, b"dgram", b_addr) == 5
        assert await asyncio.wait_for(loop.sock_recvfrom(b, 100), TIMEOUT) == (b"dgram", a_addr)
        task = await _not_done_after(loop.sock_recvfrom(a, 100))
        assert await loop.sock_sendto(b, bytearray(b"reply"), a_addr) == 5
        assert await asyncio.wait_for(task, TIMEOUT) == (b"reply", b_addr)
        # Datagram boundaries are kept; a short buffer truncates.
        await loop.sock_sendto(a, b"one", b_addr)
        await loop.sock_sendto(a, b"second", b_addr)
        await asyncio.sleep(0.01)
        assert await loop.sock_recvfrom(b, 100) == (b"one", a_addr)
        assert await loop.sock_recvfrom(b, 3) == (b"sec", a_addr)
        big = payload(60000, seed=4)
        assert await loop.sock_sendto(a, memoryview(big), b_addr) == len(big)
        assert await asyncio.wait_for(loop.sock_recvfrom(b, 65536), TIMEOUT) == (big, a_addr)

    run(loop, main())


def test_sock_recvfrom_into(loop, udp_socks):
    skip_if_loop_lacks(loop, "sock_recvfrom_into")
    a, b = udp_socks
    a_addr, b_addr = a.getsockname(), b.getsockname()

    async def main():
        buf = bytearray(16)
        task = await _not_done_after(loop.sock_recvfrom_into(b, buf))
        await loop.sock_sendto(a, b"hello", b_addr)
        assert await asyncio.wait_for(task, TIMEOUT) == (5, a_addr)
        assert buf[:5] == b"hello"
        # nbytes limits the read (the rest of the datagram is discarded).
        await loop.sock_sendto(a, b"abcdefgh", b_addr)
        await asyncio.sleep(0.01)
        buf = bytearray(16)
        assert await loop.sock_recvfrom_into(b, buf, 3) == (3, a_addr)
        assert buf == b"abc" + bytes(13)
        # nbytes=0 means the whole buffer.
        await loop.sock_sendto(a, b"xyz", b_addr)
        await asyncio.sleep(0.01)
        view = memoryview(buf)[4:]
        assert await loop.sock_recvfrom_into(b, view, 0) == (3, a_addr)
        assert buf[4:7] == b"xyz"

    run(loop, main())


# -- cancellation ----------------------------------------------------------------------


def test_cancelled_sock_recv_leaves_no_reader(loop, tcp_socks):
    a, b = tcp_socks

    async def main():
        task = await _not_done_after(loop.sock_recv(a, 10))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # No reader is left on the fd ...
        assert loop.remove_reader(a.fileno()) is False
        # ... so add_reader works and the data was not consumed.
        got = loop.create_future()
        loop.add_reader(a.fileno(), lambda: got.done() or got.set_result(a.recv(100)))
        b.send(b"for the reader")
        assert await asyncio.wait_for(got, TIMEOUT) == b"for the reader"
        assert loop.remove_reader(a.fileno()) is True
        # And sock_recv works again.
        b.send(b"again")
        assert await asyncio.wait_for(loop.sock_recv(a, 100), TIMEOUT) == b"again"
        assert loop.remove_reader(a.fileno()) is False

    run(loop, main())


def test_cancelled_sock_accept_leaves_no_reader(loop, listener):
    async def main():
        task = await _not_done_after(loop.sock_accept(listener))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert loop.remove_reader(listener.fileno()) is False
        with socket.create_connection(listener.getsockname()):
            conn, _ = await asyncio.wait_for(loop.sock_accept(listener), TIMEOUT)
            conn.close()

    run(loop, main())


def test_cancelled_sock_sendall_leaves_no_writer(loop, tcp_socks):
    a, b = tcp_socks

    async def main():
        # The peer does not read, so this blocks once the kernel buffers fill.
        task = await _not_done_after(loop.sock_sendall(a, payload(64 * MiB)), 0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert loop.remove_writer(a.fileno()) is False

    run(loop, main())


# -- argument checks -------------------------------------------------------------------


def _calls(sock, addr):
    """Every sock_* method, as (name, f(loop) -> coroutine)."""
    return {
        "sock_recv": lambda lp: lp.sock_recv(sock, 10),
        "sock_recv_into": lambda lp: lp.sock_recv_into(sock, bytearray(10)),
        "sock_recvfrom": lambda lp: lp.sock_recvfrom(sock, 10),
        "sock_recvfrom_into": lambda lp: lp.sock_recvfrom_into(sock, bytearray(10)),
        "sock_sendall": lambda lp: lp.sock_sendall(sock, b"x"),
        "sock_sendto": lambda lp: lp.sock_sendto(sock, b"x", addr),
        "sock_connect": lambda lp: lp.sock_connect(sock, addr),
        "sock_accept": lambda lp: lp.sock_accept(sock),
    }


METHODS = sorted(_calls(None, None))


@pytest.mark.parametrize("method", METHODS)
def test_debug_mode_rejects_blocking_socket(loop, method):
    skip_if_loop_lacks(loop, method)
    loop.set_debug(True)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        assert sock.gettimeout() is None  # blocking
        coro = _calls(sock, ("127.0.0.1", unused_tcp_port()))[method](loop)
        with pytest.raises(ValueError, match="non-blocking"):
            run(loop, coro)
    finally:
        sock.close()


@pytest.mark.parametrize("method", METHODS)
def test_ssl_socket_rejected(loop, method):
    skip_if_loop_lacks(loop, method)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    sock = ctx.wrap_socket(socket.socket(), do_handshake_on_connect=False)
    sock.setblocking(False)
    try:
        coro = _calls(sock, ("127.0.0.1", unused_tcp_port()))[method](loop)
        with pytest.raises(TypeError, match="SSLSocket"):
            run(loop, coro)
    finally:
        sock.close()


# -- name lookups ----------------------------------------------------------------------------


def test_getaddrinfo_and_getnameinfo(loop):
    async def main():
        infos = await asyncio.wait_for(
            loop.getaddrinfo("127.0.0.1", 80, type=socket.SOCK_STREAM), TIMEOUT
        )
        names = await asyncio.wait_for(
            loop.getnameinfo(("127.0.0.1", 80), socket.NI_NUMERICHOST | socket.NI_NUMERICSERV), TIMEOUT
        )
        local = await asyncio.wait_for(loop.getaddrinfo("localhost", "http", family=socket.AF_INET), TIMEOUT)
        return infos, names, local

    infos, names, local = run(loop, main())
    assert infos == socket.getaddrinfo("127.0.0.1", 80, type=socket.SOCK_STREAM)
    assert names == ("127.0.0.1", "80")
    assert local == socket.getaddrinfo("localhost", "http", family=socket.AF_INET)


NAME_INFO_CASES = [
    (("127.0.0.1", 80), 0),
    (("127.0.0.1", 80), socket.NI_NUMERICHOST),
    (("127.0.0.1", 80), socket.NI_NUMERICSERV),
    (("127.0.0.1", 53), socket.NI_DGRAM),
    (("127.0.0.1", 22), socket.NI_NAMEREQD),
    (("127.0.0.1", 65000), 0),
    (("::1", 443, 0, 0), 0),
    (("::1", 443), socket.NI_NUMERICHOST | socket.NI_NUMERICSERV),
    (("::1", 8080, 0, 0), socket.NI_NUMERICSERV),
    # bad input: the stdlib's exceptions
    (("localhost", 80), 0),
    (("127.0.0.1", 70000), 0),
    (("127.0.0.1", 80, 0, 0), 0),
    (("127.0.0.1",), 0),
    ("127.0.0.1", 0),
    (("127.0.0.1", "80"), 0),
    (("127.0.0.1", 80), "flags"),
    (("127.0.0.1", 80), 1.5),
    (("127.0.0.1", 80), 2**40),
    (("127.0.0.1", 80), 1 << 20),
]


def _outcome(call):
    try:
        return ("ok", call())
    except Exception as exc:
        return ("raised", type(exc), exc.args)


@pytest.mark.parametrize("sockaddr,flags", NAME_INFO_CASES)
def test_getnameinfo_matches_socket_module(loop, sockaddr, flags):
    expected = _outcome(lambda: socket.getnameinfo(sockaddr, flags))

    async def main():
        try:
            return ("ok", await asyncio.wait_for(loop.getnameinfo(sockaddr, flags), TIMEOUT))
        except Exception as exc:
            return ("raised", type(exc), exc.args)

    assert run(loop, main()) == expected


def test_getaddrinfo_error(loop):
    async def main():
        with pytest.raises(socket.gaierror):
            await asyncio.wait_for(
                loop.getaddrinfo("no-such-host.invalid", 80, flags=socket.AI_NUMERICHOST), TIMEOUT
            )

    run(loop, main())
