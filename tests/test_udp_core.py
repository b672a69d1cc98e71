"""The native UDP transport core: the paths test_udp.py does not reach.

Parity tests run on asyncio and zuvrs: exceptions escaping the protocol,
pause/resume of reading, addresses the core parses itself and those it hands
to the socket module (names, odd tuples, bad values), socket subclasses.
Buffered datagrams need a socket that refuses data, which loopback UDP never
does, so those tests make the zuvrs core report EAGAIN (``_block_sends``).
"""

import asyncio
import errno
import gc
import socket
import sys
import weakref

import pytest
from _support import TIMEOUT, DatagramRecorder, collect_exceptions, fd_count, recording_socket, run, wait_until
from test_udp import close_and_wait, needs_ipv6, next_item, plain_udp, recv_plain

PY313 = sys.version_info >= (3, 13)


def skip_without_pause_reading(loop):
    """asyncio's datagram transport can pause reading from 3.11 on (zuvrs's
    can on every version)."""
    if isinstance(loop, asyncio.SelectorEventLoop) and sys.version_info < (3, 11):
        pytest.skip("asyncio 3.10's datagram transport has no pause_reading")


class Exploding(DatagramRecorder):
    """Raises from datagram_received for payloads starting with b"boom",
    and from error_received."""

    def datagram_received(self, data, addr):
        super().datagram_received(data, addr)
        if data.startswith(b"boom"):
            raise ZeroDivisionError(data.decode())

    def error_received(self, exc):
        super().error_received(exc)
        raise LookupError("error_received failed")


def test_datagram_received_exception_goes_to_the_handler(loop):
    contexts = collect_exceptions(loop)

    async def main():
        t, p = await loop.create_datagram_endpoint(Exploding, local_addr=("127.0.0.1", 0))
        peer = plain_udp()
        try:
            here = t.get_extra_info("sockname")
            peer.sendto(b"boom 1", here)
            assert await next_item(p) == (b"boom 1", peer.getsockname())
            await wait_until(lambda: len(contexts) == 1)
            # The transport is not closed: the next datagram arrives.
            peer.sendto(b"fine", here)
            assert await next_item(p) == (b"fine", peer.getsockname())
            assert not t.is_closing()
        finally:
            peer.close()
        assert await close_and_wait(t, p) is None

    run(loop, main())
    assert len(contexts) == 1
    ctx = contexts[0][1]
    assert ctx["message"].startswith("Exception in callback ")
    assert "_read_ready" in ctx["message"]
    assert isinstance(ctx["exception"], ZeroDivisionError)
    assert str(ctx["exception"]) == "boom 1"
    assert isinstance(ctx["handle"], asyncio.Handle)


def test_error_received_exception_on_read_goes_to_the_handler(loop):
    contexts = collect_exceptions(loop)

    async def main():
        peer = plain_udp()
        addr = peer.getsockname()
        t, p = await loop.create_datagram_endpoint(Exploding, remote_addr=addr)
        t.sendto(b"first")
        assert (await recv_plain(peer))[0] == b"first"
        peer.close()
        t.sendto(b"refused")  # the ICMP error comes back on the read side
        item = await next_item(p)
        assert isinstance(item, ConnectionRefusedError)
        await wait_until(lambda: len(contexts) >= 1)
        assert not t.is_closing()
        assert await close_and_wait(t, p) is None

    run(loop, main())
    ctx = contexts[0][1]
    assert ctx["message"].startswith("Exception in callback ")
    assert isinstance(ctx["exception"], LookupError)


def test_error_received_exception_from_sendto_propagates(loop):
    async def main():
        t, p = await loop.create_datagram_endpoint(Exploding, local_addr=("127.0.0.1", 0))
        try:
            # EMSGSIZE: error_received is called inside sendto(), and what it
            # raises comes out of sendto().
            with pytest.raises(LookupError):
                t.sendto(b"x" * 65508, ("127.0.0.1", 9))
            assert len(p.errors) == 1 and p.errors[0].errno == errno.EMSGSIZE
            assert not t.is_closing()
        finally:
            t.close()
        await asyncio.wait_for(p.lost, TIMEOUT)

    run(loop, main())


def test_pause_and_resume_reading(loop):
    skip_without_pause_reading(loop)

    async def main():
        t, p = await loop.create_datagram_endpoint(DatagramRecorder, local_addr=("127.0.0.1", 0))
        peer = plain_udp()
        try:
            here = t.get_extra_info("sockname")
            await p.made
            await asyncio.sleep(0)
            assert t.is_reading()
            t.pause_reading()
            t.pause_reading()  # again: nothing changes
            assert not t.is_reading()
            for i in range(5):
                peer.sendto(b"%d" % i, here)
            await asyncio.sleep(0.05)
            assert p.datagrams == []
            t.resume_reading()
            t.resume_reading()
            assert t.is_reading()
            await wait_until(lambda: len(p.datagrams) == 5)
            assert [d for d, _ in p.datagrams] == [b"0", b"1", b"2", b"3", b"4"]
            t.close()
            assert not t.is_reading()
            t.resume_reading()  # no effect once closing
            assert not t.is_reading()
        finally:
            peer.close()
        assert await asyncio.wait_for(p.lost, TIMEOUT) is None

    run(loop, main())


def test_pause_reading_before_connection_made(loop):
    skip_without_pause_reading(loop)

    class PausesAtOnce(DatagramRecorder):
        def connection_made(self, transport):
            super().connection_made(transport)
            transport.pause_reading()

    async def main():
        t, p = await loop.create_datagram_endpoint(PausesAtOnce, local_addr=("127.0.0.1", 0))
        peer = plain_udp()
        try:
            peer.sendto(b"waits", t.get_extra_info("sockname"))
            await asyncio.sleep(0.05)
            assert p.datagrams == []
            t.resume_reading()
            assert await next_item(p) == (b"waits", peer.getsockname())
        finally:
            peer.close()
        assert await close_and_wait(t, p) is None

    run(loop, main())


def test_address_forms(loop):
    """Every form of address the socket module takes (the core parses the
    numeric ones, the socket module the rest), and the same address object
    used again and again."""

    async def main():
        t, p = await loop.create_datagram_endpoint(DatagramRecorder, local_addr=("127.0.0.1", 0))
        peer = plain_udp()
        try:
            port = peer.getsockname()[1]
            addr = ("127.0.0.1", port)
            for i in range(3):
                t.sendto(b"same object %d" % i, addr)
            t.sendto(b"equal tuple", ("127.0.0.1", port))
            t.sendto(b"by name", ("localhost", port))
            t.sendto(b"short form", ("127.1", port))
            t.sendto(b"bytes host", (b"127.0.0.1", port))

            class PortInt(int):
                pass

            class HostStr(str):
                pass

            t.sendto(b"int subclass port", ("127.0.0.1", PortInt(port)))
            t.sendto(b"str subclass host", (HostStr("127.0.0.1"), port))
            got = [(await recv_plain(peer))[0] for _ in range(9)]
            assert got == [
                b"same object 0",
                b"same object 1",
                b"same object 2",
                b"equal tuple",
                b"by name",
                b"short form",
                b"bytes host",
                b"int subclass port",
                b"str subclass host",
            ]
            assert p.errors == []
            assert not t.is_closing()
        finally:
            peer.close()
        assert await close_and_wait(t, p) is None

    run(loop, main())


@pytest.mark.parametrize(
    "addr, error",
    [
        (("127.0.0.1", 70000), OverflowError),
        (("127.0.0.1", -1), OverflowError),
        (["127.0.0.1", 9], TypeError),
        (("127.0.0.1", "9"), TypeError),
        (("127.0.0.1",), TypeError),
        ((b"127.0.0.1\0", 9), (TypeError, ValueError)),
        (None, TypeError),
    ],
)
def test_bad_addresses_are_fatal(loop, addr, error):
    contexts = collect_exceptions(loop)

    async def main():
        t, p = await loop.create_datagram_endpoint(DatagramRecorder, local_addr=("127.0.0.1", 0))
        t.sendto(b"x", addr)
        exc = await asyncio.wait_for(p.lost, TIMEOUT)
        assert isinstance(exc, error), exc
        assert t.is_closing()
        assert p.errors == []
        return exc

    exc = run(loop, main())
    assert len(contexts) == 1
    assert contexts[0][1]["message"] == "Fatal write error on datagram transport"
    assert contexts[0][1]["exception"] is exc


def test_unresolvable_name_goes_to_error_received(loop):
    async def main():
        t, p = await loop.create_datagram_endpoint(DatagramRecorder, local_addr=("127.0.0.1", 0))
        try:
            t.sendto(b"x", ("no-such-host.invalid", 9))
            item = await next_item(p)
            assert isinstance(item, socket.gaierror), item
            assert not t.is_closing()
        finally:
            t.close()
        await asyncio.wait_for(p.lost, TIMEOUT)

    run(loop, main())


def test_invalid_address_message(loop):
    async def main():
        peer = plain_udp()
        addr = peer.getsockname()
        t, p = await loop.create_datagram_endpoint(DatagramRecorder, remote_addr=addr)
        try:
            with pytest.raises(ValueError) as info:
                t.sendto(b"x", ("127.0.0.1", 1))
            assert str(info.value) == f"Invalid address: must be None or {addr}"
            with pytest.raises(TypeError) as info:
                t.sendto("text")
            assert str(info.value) == "data argument must be a bytes-like object, not 'str'"
            # An equal address (not the same object) and a list equal to
            # nothing are told apart as asyncio does.
            t.sendto(b"equal", tuple(list(addr)))
            with pytest.raises(ValueError):
                t.sendto(b"x", list(addr))
            assert (await recv_plain(peer))[0] == b"equal"
        finally:
            peer.close()
        assert await close_and_wait(t, p) is None

    run(loop, main())


def test_connected_send_ignores_address_of_sock(loop):
    """A connected sock= endpoint without remote_addr sends to its peer
    whatever address sendto() is given (asyncio uses sock.send())."""

    async def main():
        peer = plain_udp()
        other = plain_udp()
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.connect(peer.getsockname())
        t, p = await loop.create_datagram_endpoint(DatagramRecorder, sock=sock)
        try:
            t.sendto(b"to the peer", other.getsockname())
            assert (await recv_plain(peer))[0] == b"to the peer"
            await asyncio.sleep(0.02)
            with pytest.raises(BlockingIOError):
                other.recvfrom(100)
        finally:
            peer.close()
            other.close()
        assert await close_and_wait(t, p) is None

    run(loop, main())


@needs_ipv6
def test_ipv6_address_forms(loop):
    async def main():
        t, p = await loop.create_datagram_endpoint(DatagramRecorder, local_addr=("::1", 0))
        peer = plain_udp("::1")
        try:
            port = peer.getsockname()[1]
            t.sendto(b"2-tuple", ("::1", port))
            t.sendto(b"3-tuple", ("::1", port, 0))
            t.sendto(b"4-tuple", ("::1", port, 0, 0))
            t.sendto(b"long form", ("0:0:0:0:0:0:0:1", port))
            # A name the socket module resolves (for an AF_INET6 socket).
            t.sendto(b"by name", ("localhost" if _localhost_has_ipv6() else "::1", port))
            got = [await recv_plain(peer) for _ in range(5)]
            assert [d for d, _ in got] == [b"2-tuple", b"3-tuple", b"4-tuple", b"long form", b"by name"]
            here = t.get_extra_info("sockname")
            assert all(a[:2] == here[:2] for _, a in got)
            # Received addresses are 4-tuples, as socket.recvfrom gives them.
            peer.sendto(b"back", here)
            data, addr = await next_item(p)
            assert data == b"back" and addr == peer.getsockname() and len(addr) == 4
        finally:
            peer.close()
        assert await close_and_wait(t, p) is None

    run(loop, main())


@needs_ipv6
@pytest.mark.parametrize("addr", [("::1", 9, 0x100000), ("::1", 9, 0, 0, 0), ("::1", 9, -1)])
def test_ipv6_bad_addresses_are_fatal(loop, addr):
    contexts = collect_exceptions(loop)

    async def main():
        t, p = await loop.create_datagram_endpoint(DatagramRecorder, local_addr=("::1", 0))
        t.sendto(b"x", addr)
        exc = await asyncio.wait_for(p.lost, TIMEOUT)
        assert exc is not None and not isinstance(exc, OSError)
        return exc

    exc = run(loop, main())
    assert [c["exception"] for _, c in contexts] == [exc]


def _localhost_has_ipv6():
    try:
        return any(ai[0] == socket.AF_INET6 for ai in socket.getaddrinfo("localhost", 9, type=socket.SOCK_DGRAM))
    except OSError:
        return False


def test_socket_subclass_methods_are_used(loop):
    """A socket class overriding sendto/recvfrom gets them called, as asyncio
    calls them."""
    calls = []

    async def main():
        sock = recording_socket(calls, socket.AF_INET)
        sock.bind(("127.0.0.1", 0))
        t, p = await loop.create_datagram_endpoint(DatagramRecorder, sock=sock)
        peer = plain_udp()
        try:
            t.sendto(b"out", peer.getsockname())
            assert (await recv_plain(peer))[0] == b"out"
            peer.sendto(b"in", sock.getsockname())
            assert await next_item(p) == (b"in", peer.getsockname())
        finally:
            peer.close()
        assert await close_and_wait(t, p) is None

    run(loop, main())
    assert calls == ["sendto", "recvfrom"]


def test_closing_the_loop_closes_open_udp_sockets(loop_factory):
    loop = loop_factory()
    if loop_factory.name != "zuvrs":
        loop.close()
        pytest.skip("asyncio leaves transports open when the loop closes")

    async def main():
        t, p = await loop.create_datagram_endpoint(DatagramRecorder, local_addr=("127.0.0.1", 0))
        await p.made
        return t, p

    before = fd_count()
    t, p = loop.run_until_complete(main())
    sock = t.get_extra_info("socket")
    loop.close()
    assert sock.fileno() == -1
    assert fd_count() < before + 1
    del t, p, sock
    gc.collect()


def test_transport_and_protocol_are_freed(loop):
    async def main():
        t, p = await loop.create_datagram_endpoint(DatagramRecorder, local_addr=("127.0.0.1", 0))
        peer = plain_udp()
        peer.sendto(b"x", t.get_extra_info("sockname"))
        await next_item(p)
        t.sendto(b"y", peer.getsockname())
        await recv_plain(peer)
        peer.close()
        await close_and_wait(t, p)
        return weakref.ref(t), weakref.ref(p)

    rt, rp = run(loop, main())
    run(loop, asyncio.sleep(0.01))
    gc.collect()
    assert rt() is None
    assert rp() is None


# -- buffered datagrams (zuvrs: the core is made to see a full socket) ------------------


@pytest.fixture
def zloop(loop_factory):
    if loop_factory.name != "zuvrs":
        pytest.skip("needs the zuvrs core's test hook")
    lp = loop_factory()
    yield lp
    if not lp.is_closed():
        lp.close()


async def _buffered(loop, count, limits=None, connected=True):
    peer = plain_udp()
    if connected:
        t, p = await loop.create_datagram_endpoint(DatagramRecorder, remote_addr=peer.getsockname())
    else:
        t, p = await loop.create_datagram_endpoint(DatagramRecorder, local_addr=("127.0.0.1", 0))
    if limits:
        t.set_write_buffer_limits(**limits)
    t._core._block_sends(count)
    return t, p, peer


def test_buffered_datagrams_flow_control(zloop):
    header = 8 if PY313 else 0

    async def main():
        t, p, peer = await _buffered(zloop, 40, limits={"high": 5000, "low": 1000}, connected=False)
        dest = peer.getsockname()
        try:
            sent = [b"%04d" % i + b"." * 196 for i in range(30)]
            for i, data in enumerate(sent):
                t.sendto(bytearray(data) if i % 2 else data, dest)
            # The first attempt found the socket full: everything is queued.
            assert t.get_write_buffer_size() == 30 * (200 + header)
            assert p.pause_writing_calls == 1
            assert p.sizes_at_pause[0] > 5000
            # The core keeps retrying when writable; after 40 blocked
            # attempts the socket takes everything.
            got = [(await recv_plain(peer))[0] for _ in range(30)]
            assert got == sent
            assert t.get_write_buffer_size() == 0
            await wait_until(lambda: p.resume_writing_calls == 1)
            assert p.sizes_at_resume[0] <= 1000
        finally:
            peer.close()
        assert await close_and_wait(t, p) is None

    run(zloop, main())


def test_close_sends_buffered_datagrams_first(zloop):
    async def main():
        t, p, peer = await _buffered(zloop, 25)
        try:
            for i in range(10):
                t.sendto(b"d%d" % i)
            t.close()
            assert t.is_closing()
            assert not p.lost.done()
            got = [(await recv_plain(peer))[0] for _ in range(10)]
            assert got == [b"d%d" % i for i in range(10)]
            assert await asyncio.wait_for(p.lost, TIMEOUT) is None
            assert t.get_write_buffer_size() == 0
        finally:
            peer.close()

    run(zloop, main())


def test_abort_drops_buffered_datagrams(zloop):
    async def main():
        t, p, peer = await _buffered(zloop, 1000)
        try:
            for i in range(10):
                t.sendto(b"d%d" % i)
            assert t.get_write_buffer_size() > 0
            t.abort()
            assert t.get_write_buffer_size() == 0
            assert await asyncio.wait_for(p.lost, TIMEOUT) is None
            await asyncio.sleep(0.02)
            with pytest.raises(BlockingIOError):
                peer.recvfrom(100)
        finally:
            peer.close()

    run(zloop, main())


def test_buffered_send_error_goes_to_error_received(zloop):
    async def main():
        t, p, peer = await _buffered(zloop, 3, connected=False)
        try:
            t.sendto(b"first", peer.getsockname())
            t.sendto(b"x" * 65508, peer.getsockname())  # EMSGSIZE once sent
            t.sendto(b"third", peer.getsockname())
            assert (await recv_plain(peer))[0] == b"first"
            item = await next_item(p)
            assert isinstance(item, OSError) and item.errno == errno.EMSGSIZE
            # Sending goes on with the rest of the buffer.
            assert (await recv_plain(peer))[0] == b"third"
            await wait_until(lambda: t.get_write_buffer_size() == 0)
        finally:
            peer.close()
        assert await close_and_wait(t, p) is None

    run(zloop, main())


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit])
def test_base_exceptions_from_the_protocol_stop_the_loop(loop, exc_type):
    class Interrupts(DatagramRecorder):
        def datagram_received(self, data, addr):
            super().datagram_received(data, addr)
            raise exc_type("stop")

    made = []

    async def main():
        t, p = await loop.create_datagram_endpoint(Interrupts, local_addr=("127.0.0.1", 0))
        made.append((t, p))
        peer = plain_udp()
        try:
            peer.sendto(b"x", t.get_extra_info("sockname"))
            await asyncio.sleep(TIMEOUT)
        finally:
            peer.close()

    task = None
    try:
        task = loop.create_task(main())
        with pytest.raises(exc_type):
            loop.run_until_complete(task)
        t, p = made[0]
        assert p.datagrams and p.datagrams[0][0] == b"x"
        assert not t.is_closing()
        t.close()
        task.cancel()
        loop.run_until_complete(asyncio.wait_for(p.lost, TIMEOUT))
    finally:
        if task is not None and not task.done():
            task.cancel()
