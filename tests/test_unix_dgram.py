"""Unix datagram endpoints (AF_UNIX, SOCK_DGRAM), on both loops.

zuvrs gives a plain Unix datagram socket the native DatagramTransport (the
same DatagramCore as UDP); asyncio's selector transport is the reference for
every address, error and flow-control behaviour checked here. (The basic
connected exchange, flow control, close-flushes and abort-drops of a
connected Unix endpoint are in test_udp.py.)
"""

import asyncio
import errno
import os
import socket
import sys

import pytest
from _support import TIMEOUT, DatagramRecorder, collect_exceptions, fd_count, payload, recording_socket, run, wait_until
from test_udp import (
    close_and_wait,
    drain_unix_peer,
    next_item,
    recv_plain,
    skip_asyncio_313_datagram_accounting,
    sock_dir,  # noqa: F401 (fixture)
)

pytestmark = pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="no AF_UNIX")

LINUX = sys.platform.startswith("linux")
needs_abstract = pytest.mark.skipif(not LINUX, reason="abstract Unix names are Linux only")


def unix_dgram(path=None):
    """A non-blocking Unix datagram socket, bound to ``path`` if given."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if path is not None:
        s.bind(path)
    s.setblocking(False)
    return s


def abstract_name(tag):
    return f"\0zuvrs-test-{os.getpid()}-{tag}"


def is_zuvrs(loop):
    return not isinstance(loop, asyncio.SelectorEventLoop)


# -- which transport ------------------------------------------------------------------


def test_transport_is_native(loop, sock_dir):
    """A plain Unix datagram socket gets zuvrs's native transport (a silent
    fallback to the Python one fails here); a socket class that overrides
    the I/O methods keeps the Python transport."""

    class Overriding(socket.socket):
        def sendto(self, *args):
            return super().sendto(*args)

    async def main():
        t, p = await loop.create_datagram_endpoint(
            DatagramRecorder, local_addr=os.path.join(sock_dir, "native"), family=socket.AF_UNIX
        )
        sock = Overriding(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(os.path.join(sock_dir, "overriding"))
        t2, p2 = await loop.create_datagram_endpoint(DatagramRecorder, sock=sock)
        try:
            if is_zuvrs(loop):
                assert type(t).__module__ == "zuvrs.transports._datagram"
                assert type(t).__name__ == "DatagramTransport"
                assert type(t._core).__name__ == "DatagramCore"
                # asyncio's own transport, which calls the overridden methods.
                assert type(t2).__name__ == "FallbackDatagramTransport"
            else:
                assert type(t).__name__ == "_SelectorDatagramTransport"
        finally:
            t2.close()
        assert await close_and_wait(t, p) is None
        assert await asyncio.wait_for(p2.lost, TIMEOUT) is None

    run(loop, main())


def test_socket_subclass_methods_are_used(loop, sock_dir):
    calls = []

    async def main():
        path = os.path.join(sock_dir, "recording")
        sock = recording_socket(calls, socket.AF_UNIX)
        sock.bind(path)
        t, p = await loop.create_datagram_endpoint(DatagramRecorder, sock=sock)
        peer_path = os.path.join(sock_dir, "peer")
        peer = unix_dgram(peer_path)
        try:
            t.sendto(b"out", peer_path)
            assert await recv_plain(peer) == (b"out", path)
            peer.sendto(b"in", path)
            assert await next_item(p) == (b"in", peer_path)
        finally:
            peer.close()
        assert await close_and_wait(t, p) is None

    run(loop, main())
    assert calls == ["sendto", "recvfrom"]


# -- source addresses -------------------------------------------------------------------


def test_sender_addresses(loop, sock_dir):
    """datagram_received gets the sender's address as socket.recvfrom gives
    it: a str path, bytes for an abstract name (bound or autobound), None
    for an unnamed sender; replies reach each named sender."""
    server_path = os.path.join(sock_dir, "server")

    async def main():
        t, p = await loop.create_datagram_endpoint(
            lambda: DatagramRecorder(echo=True), local_addr=server_path, family=socket.AF_UNIX
        )
        named_path = os.path.join(sock_dir, "named")
        named = unix_dgram(named_path)
        unnamed = unix_dgram()
        socks = [named, unnamed]
        if LINUX:
            abstract = unix_dgram(abstract_name("sender").encode())
            auto = unix_dgram("")  # the kernel picks an abstract name
            socks += [abstract, auto]
        try:
            named.sendto(b"from a path", server_path)
            assert await next_item(p) == (b"from a path", named_path)
            assert await recv_plain(named) == (b"from a path", server_path)
            # The same sender again: the same address.
            named.sendto(b"again", server_path)
            assert await next_item(p) == (b"again", named_path)
            assert await recv_plain(named) == (b"again", server_path)

            if LINUX:
                abstract.sendto(b"from an abstract name", server_path)
                data, addr = await next_item(p)
                assert (data, addr) == (b"from an abstract name", abstract_name("sender").encode())
                assert type(addr) is bytes
                assert await recv_plain(abstract) == (b"from an abstract name", server_path)

                auto.sendto(b"autobound", server_path)
                data, addr = await next_item(p)
                assert data == b"autobound"
                assert addr == auto.getsockname() and type(addr) is bytes and addr[:1] == b"\0"
                assert await recv_plain(auto) == (b"autobound", server_path)

            # An unnamed sender cannot be answered: no echo (the recorder
            # would pass None to sendto, which is fatal), so stop echoing.
            p.echo = False
            unnamed.sendto(b"from nowhere", server_path)
            assert await next_item(p) == (b"from nowhere", None)
        finally:
            for s in socks:
                s.close()
        assert await close_and_wait(t, p) is None
        assert p.events == ["made", "datagram", "lost"]

    run(loop, main())


def test_undecodable_path(loop, sock_dir):
    """A path that is not valid UTF-8 comes back surrogate-escaped, as the
    socket module decodes it, and works as a destination."""
    server_path = os.path.join(sock_dir, "server")
    odd_path = os.path.join(sock_dir, "odd-\udcff")

    async def main():
        t, p = await loop.create_datagram_endpoint(DatagramRecorder, local_addr=server_path, family=socket.AF_UNIX)
        odd = unix_dgram(odd_path)
        try:
            odd.sendto(b"odd", server_path)
            assert await next_item(p) == (b"odd", odd_path)
            t.sendto(b"str back", odd_path)
            assert await recv_plain(odd) == (b"str back", server_path)
            t.sendto(b"bytes back", os.fsencode(odd_path))
            assert await recv_plain(odd) == (b"bytes back", server_path)
        finally:
            odd.close()
        assert await close_and_wait(t, p) is None

    run(loop, main())


# -- destinations -------------------------------------------------------------------------


def test_destination_forms(loop, sock_dir):
    """sendto() on an unconnected endpoint to a str path, a bytes path, and
    the forms only the socket module parses (bytearray, memoryview, a str
    subclass)."""
    peer_path = os.path.join(sock_dir, "peer")
    server_path = os.path.join(sock_dir, "server")

    class PathStr(str):
        pass

    async def main():
        t, p = await loop.create_datagram_endpoint(DatagramRecorder, local_addr=server_path, family=socket.AF_UNIX)
        peer = unix_dgram(peer_path)
        try:
            forms = [
                peer_path,
                os.fsencode(peer_path),
                bytearray(os.fsencode(peer_path)),
                memoryview(os.fsencode(peer_path)),
                PathStr(peer_path),
            ]
            for i, dest in enumerate(forms):
                t.sendto(b"form %d" % i, dest)
            for i in range(len(forms)):
                assert await recv_plain(peer) == (b"form %d" % i, server_path)
            # The same str object many times (a cached destination).
            for i in range(20):
                t.sendto(b"%d" % i, peer_path)
            for i in range(20):
                assert (await recv_plain(peer))[0] == b"%d" % i
        finally:
            peer.close()
        assert await close_and_wait(t, p) is None
        assert p.errors == []

    run(loop, main())


@needs_abstract
def test_abstract_endpoints(loop):
    """An endpoint bound to an abstract name (local_addr) and one connected
    to it (remote_addr); names given as str and as bytes."""
    server_name = abstract_name("server")
    client_name = abstract_name("client")

    async def main():
        st, server = await loop.create_datagram_endpoint(
            lambda: DatagramRecorder(echo=True), local_addr=server_name, family=socket.AF_UNIX
        )
        ct, client = await loop.create_datagram_endpoint(
            DatagramRecorder, local_addr=client_name, remote_addr=server_name, family=socket.AF_UNIX
        )
        other = unix_dgram()
        try:
            assert st.get_extra_info("sockname") == server_name.encode()
            assert ct.get_extra_info("sockname") == client_name.encode()
            assert ct.get_extra_info("peername") == server_name.encode()
            ct.sendto(b"connected")
            assert await next_item(client) == (b"connected", server_name.encode())
            assert await next_item(server) == (b"connected", client_name.encode())
            # remote_addr is the str given: that str passes, the bytes form
            # of the same name does not (asyncio compares with ==).
            ct.sendto(b"explicit", server_name)
            assert await next_item(client) == (b"explicit", server_name.encode())
            assert await next_item(server) == (b"explicit", client_name.encode())
            with pytest.raises(ValueError, match="Invalid address"):
                ct.sendto(b"x", server_name.encode())
            # An unconnected socket sends to the abstract name, as bytes and str.
            server.echo = False
            other.sendto(b"plain bytes name", server_name.encode())
            assert await next_item(server) == (b"plain bytes name", None)
            # And the server answers to a bytes name it was given.
            st.sendto(b"to the client", client_name.encode())
            assert await next_item(client) == (b"to the client", server_name.encode())
            st.sendto(b"to the client as str", client_name)
            assert await next_item(client) == (b"to the client as str", server_name.encode())
        finally:
            other.close()
            ct.close()
            st.close()
        assert await asyncio.wait_for(client.lost, TIMEOUT) is None
        assert await asyncio.wait_for(server.lost, TIMEOUT) is None
        assert server.errors == client.errors == []

    run(loop, main())


def test_remote_addr_unbound_sender(loop, sock_dir):
    """remote_addr only: the endpoint is unnamed, its peer sees None; a
    different address (or the same path as bytes) is refused with asyncio's
    ValueError."""
    peer_path = os.path.join(sock_dir, "peer")

    async def main():
        peer = unix_dgram(peer_path)
        t, p = await loop.create_datagram_endpoint(DatagramRecorder, remote_addr=peer_path, family=socket.AF_UNIX)
        try:
            assert t.get_extra_info("peername") == peer_path
            assert t.get_extra_info("sockname") in ("", None)
            t.sendto(b"one")
            t.sendto(b"two", peer_path)
            assert await recv_plain(peer) == (b"one", None)
            assert await recv_plain(peer) == (b"two", None)
            with pytest.raises(ValueError, match="Invalid address"):
                t.sendto(b"x", os.path.join(sock_dir, "elsewhere"))
            with pytest.raises(ValueError, match="Invalid address"):
                t.sendto(b"x", os.fsencode(peer_path))
            with pytest.raises(TypeError):
                t.sendto("not bytes")
            # (The peer cannot answer: the endpoint has no name.)
            await asyncio.sleep(0.01)
            assert p.datagrams == []
        finally:
            peer.close()
        assert await close_and_wait(t, p) is None
        assert p.events == ["made", "lost"]

    run(loop, main())


def test_socketpair_endpoint(loop):
    """sock= one end of socketpair(AF_UNIX, SOCK_DGRAM): datagrams from the
    other end arrive with None as the address. Its peer name is '' (falsy),
    so asyncio treats it as unconnected and sendto(data) without an address
    hands None to socket.sendto: a TypeError, a fatal error. zuvrs does the
    same."""
    contexts = collect_exceptions(loop)

    async def main():
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        b.setblocking(False)
        t, p = await loop.create_datagram_endpoint(DatagramRecorder, sock=a)
        try:
            assert t.get_extra_info("peername") == ""
            assert t.get_extra_info("sockname") == ""
            b.send(b"through the pair")
            assert await next_item(p) == (b"through the pair", None)
            b.send(b"twice")
            assert await next_item(p) == (b"twice", None)
            t.sendto(b"no address")
            exc = await asyncio.wait_for(p.lost, TIMEOUT)
            assert isinstance(exc, TypeError)
            assert p.errors == []
            return exc
        finally:
            b.close()
            t.abort()

    exc = run(loop, main())
    assert [c["message"] for _, c in contexts] == ["Fatal write error on datagram transport"]
    assert contexts[0][1]["exception"] is exc


def test_socketpair_endpoint_with_address(loop, sock_dir):
    """sendto(data, path) on the (connected) end of a socketpair: Linux
    sends it to that path, from an unnamed sender."""
    other_path = os.path.join(sock_dir, "other")

    async def main():
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        t, p = await loop.create_datagram_endpoint(DatagramRecorder, sock=a)
        other = unix_dgram(other_path)
        try:
            t.sendto(b"to a path", other_path)
            assert await recv_plain(other) == (b"to a path", None)
            assert not t.is_closing()
        finally:
            b.close()
            other.close()
        assert await close_and_wait(t, p) is None
        assert p.events == ["made", "lost"]

    run(loop, main())


# -- send errors -------------------------------------------------------------------------------


def test_send_errors_go_to_error_received(loop, sock_dir):
    """A missing path (ENOENT), a stale socket file (ECONNREFUSED), a path
    too long and an empty path (the socket module's own OSErrors) all go to
    error_received; the endpoint keeps working."""
    server_path = os.path.join(sock_dir, "server")
    stale_path = os.path.join(sock_dir, "stale")
    peer_path = os.path.join(sock_dir, "peer")

    async def main():
        unix_dgram(stale_path).close()  # leaves the file, nobody bound
        t, p = await loop.create_datagram_endpoint(DatagramRecorder, local_addr=server_path, family=socket.AF_UNIX)
        peer = unix_dgram(peer_path)
        try:
            t.sendto(b"x", os.path.join(sock_dir, "missing"))
            item = await next_item(p)
            assert type(item) is FileNotFoundError and item.errno == errno.ENOENT, item
            t.sendto(b"x", stale_path)
            item = await next_item(p)
            assert type(item) is ConnectionRefusedError and item.errno == errno.ECONNREFUSED, item
            t.sendto(b"x", "p" * 200)
            item = await next_item(p)
            assert type(item) is OSError and str(item) == "AF_UNIX path too long", item
            t.sendto(b"x", b"\0" + b"p" * 200)
            item = await next_item(p)
            assert type(item) is OSError and str(item) == "AF_UNIX path too long", item
            t.sendto(b"x", "")
            item = await next_item(p)
            assert isinstance(item, OSError), item
            assert not t.is_closing()
            t.sendto(b"still fine", peer_path)
            assert await recv_plain(peer) == (b"still fine", server_path)
        finally:
            peer.close()
        assert await close_and_wait(t, p) is None
        assert p.events == ["made"] + ["error"] * 5 + ["lost"]

    run(loop, main())


def test_connected_peer_goes_away(loop, sock_dir):
    """A connected endpoint whose peer closed: sends report the kernel's
    error to error_received each time, never a fatal error."""
    peer_path = os.path.join(sock_dir, "peer")

    async def main():
        peer = unix_dgram(peer_path)
        t, p = await loop.create_datagram_endpoint(DatagramRecorder, remote_addr=peer_path, family=socket.AF_UNIX)
        t.sendto(b"hello")
        assert await recv_plain(peer) == (b"hello", None)
        peer.close()
        errors = []
        for _ in range(3):
            t.sendto(b"anyone?")
            item = await next_item(p)
            assert isinstance(item, OSError), item
            errors.append(item.errno)
        assert errors[0] == errno.ECONNREFUSED
        assert set(errors) <= {errno.ECONNREFUSED, errno.ENOTCONN}
        assert not t.is_closing()
        assert await close_and_wait(t, p) is None
        return errors

    run(loop, main())


def test_malformed_address_is_fatal(loop, sock_dir):
    """A destination the socket module cannot take at all (a tuple): its
    TypeError is a fatal error of the transport."""
    contexts = collect_exceptions(loop)

    async def main():
        t, p = await loop.create_datagram_endpoint(
            DatagramRecorder, local_addr=os.path.join(sock_dir, "server"), family=socket.AF_UNIX
        )
        t.sendto(b"x", ("127.0.0.1", 9))
        exc = await asyncio.wait_for(p.lost, TIMEOUT)
        assert isinstance(exc, TypeError)
        assert p.errors == []
        return exc

    exc = run(loop, main())
    assert len(contexts) == 1
    assert contexts[0][1]["exception"] is exc


# -- flow control, close, abort -------------------------------------------------------------------


@pytest.mark.parametrize("form", ["str", "bytes", "abstract"])
def test_unconnected_flow_control(loop, sock_dir, form):
    """An unconnected endpoint sending to a peer that does not read: the
    kernel refuses (EAGAIN), datagrams are buffered with their address,
    pause_writing / resume_writing follow the water marks, and everything
    arrives in order once the peer reads."""
    skip_asyncio_313_datagram_accounting(loop)
    if form == "abstract" and not LINUX:
        pytest.skip("abstract Unix names are Linux only")
    server_path = os.path.join(sock_dir, "server")
    if form == "abstract":
        peer_addr = abstract_name(f"slow-{id(loop)}")
        bound = peer_addr
    else:
        bound = os.path.join(sock_dir, "slow")
        peer_addr = bound if form == "str" else os.fsencode(bound)

    async def main():
        peer = unix_dgram(bound)
        t, p = await loop.create_datagram_endpoint(DatagramRecorder, local_addr=server_path, family=socket.AF_UNIX)
        t.set_write_buffer_limits(high=4000, low=1000)
        sent = []
        try:
            while t.get_write_buffer_size() == 0 or len(sent) < 200:
                data = len(sent).to_bytes(4, "big") + payload(1000, seed=len(sent) % 7)
                t.sendto(data, peer_addr)
                sent.append(data)
                assert len(sent) < 100_000, "the write buffer never filled"
            assert p.pause_writing_calls == 1
            assert p.sizes_at_pause[0] > 4000
            got = await drain_unix_peer(peer, lambda got: len(got) == len(sent))
            assert got == sent
            await wait_until(lambda: p.resume_writing_calls == 1)
            assert p.sizes_at_resume[0] <= 1000
            assert t.get_write_buffer_size() == 0
            assert p.errors == []
        finally:
            peer.close()
        assert await close_and_wait(t, p) is None

    run(loop, main())


def test_close_stops_receiving_and_keeps_the_file(loop, sock_dir):
    path = os.path.join(sock_dir, "server")

    async def main():
        before = fd_count()
        t, p = await loop.create_datagram_endpoint(DatagramRecorder, local_addr=path, family=socket.AF_UNIX)
        sender = unix_dgram()
        try:
            sender.sendto(b"before", path)
            assert await next_item(p) == (b"before", None)
            sender.sendto(b"queued", path)
            t.close()
            assert t.is_closing()
            t.close()  # twice is fine
            assert await asyncio.wait_for(p.lost, TIMEOUT) is None
            assert p.datagrams == [(b"before", None)]
            assert t.get_extra_info("socket").fileno() == -1
            assert os.path.exists(path)
            # Nobody is bound any more.
            with pytest.raises(ConnectionRefusedError):
                sender.sendto(b"after", path)
        finally:
            sender.close()
        assert fd_count() == before
        assert p.events == ["made", "datagram", "lost"]

    run(loop, main())


def test_abort(loop, sock_dir):
    path = os.path.join(sock_dir, "server")

    async def main():
        t, p = await loop.create_datagram_endpoint(DatagramRecorder, local_addr=path, family=socket.AF_UNIX)
        t.abort()
        assert t.is_closing()
        assert await asyncio.wait_for(p.lost, TIMEOUT) is None
        assert p.events == ["made", "lost"]

    run(loop, main())


def test_pause_and_resume_reading(loop, sock_dir):
    if isinstance(loop, asyncio.SelectorEventLoop) and sys.version_info < (3, 11):
        pytest.skip("asyncio 3.10's datagram transport has no pause_reading")
    path = os.path.join(sock_dir, "server")

    async def main():
        t, p = await loop.create_datagram_endpoint(DatagramRecorder, local_addr=path, family=socket.AF_UNIX)
        sender = unix_dgram()
        try:
            await p.made
            await asyncio.sleep(0)
            t.pause_reading()
            assert not t.is_reading()
            sender.sendto(b"while paused", path)
            await asyncio.sleep(0.02)
            assert p.datagrams == []
            t.resume_reading()
            assert await next_item(p) == (b"while paused", None)
        finally:
            sender.close()
        assert await close_and_wait(t, p) is None

    run(loop, main())


def test_large_datagram(loop, sock_dir):
    """A datagram bigger than the default buffers (but below max_size) arrives whole."""
    path = os.path.join(sock_dir, "server")
    size = 200 * 1024

    async def main():
        t, p = await loop.create_datagram_endpoint(DatagramRecorder, local_addr=path, family=socket.AF_UNIX)
        t.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        sender = unix_dgram()
        sender.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        try:
            data = payload(size, seed=3)
            sender.setblocking(True)
            sender.sendto(data, path)
            assert await next_item(p) == (data, None)
        finally:
            sender.close()
        assert await close_and_wait(t, p) is None

    run(loop, main())


def test_endpoints_are_freed_and_leave_no_fds(loop, sock_dir):
    """Unix endpoints created, used (a datagram each way, an error, buffered
    datagrams dropped by abort) and closed: no fd left, transport and
    protocol freed."""
    import gc
    import weakref

    async def one(i):
        path = os.path.join(sock_dir, f"ep{i}")
        peer_path = os.path.join(sock_dir, f"peer{i}")
        peer = unix_dgram(peer_path)
        t, p = await loop.create_datagram_endpoint(DatagramRecorder, local_addr=path, family=socket.AF_UNIX)
        try:
            peer.sendto(b"in", path)
            assert await next_item(p) == (b"in", peer_path)
            t.sendto(b"out", peer_path)
            assert await recv_plain(peer) == (b"out", path)
            t.sendto(b"x", os.path.join(sock_dir, "missing"))
            assert isinstance(await next_item(p), FileNotFoundError)
            while t.get_write_buffer_size() == 0:
                t.sendto(payload(1000), peer_path)
            t.abort()
            assert await asyncio.wait_for(p.lost, TIMEOUT) is None
        finally:
            peer.close()
        os.unlink(path)
        os.unlink(peer_path)
        return weakref.ref(t), weakref.ref(p)

    async def main():
        await one(-1)
        before = fd_count()
        refs = [await one(i) for i in range(20)]
        await asyncio.sleep(0.01)
        assert fd_count() == before
        return refs

    refs = run(loop, main())
    run(loop, asyncio.sleep(0.01))
    gc.collect()
    assert [r() for pair in refs for r in pair] == [None] * 40
