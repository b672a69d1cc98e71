"""TLS transports: everything a TLS transport does, on the stdlib loop and on
zuvrs (whose TLS is native on 3.11+: each test also checks the path taken).

Handshakes (TLS 1.2 and 1.3), data both ways with Protocol, BufferedProtocol
and the streams API, the extra info, verification, client certificates,
ALPN, SNI, session reuse, keylog, post-handshake auth, flow control both
ways, write_eof, close / abort / is_closing, the two timeouts, every API that
takes ``ssl=``, start_tls, sendfile, and the stdlib's argument errors.
"""

import asyncio
import hashlib
import logging
import socket
import ssl
import sys

import pytest
from _support import (
    KEEP_PICKS,
    TIMEOUT,
    ChunkKeeper,
    RecordingProtocol,
    check_kept_chunks,
    check_kept_chunks_memory,
    malloc_usable_size,
    payload,
    run,
    wait_until,
)
from _tls_support import (
    SSLPROTO_311,
    TLS12,
    TLS13,
    VERSIONS,
    KiB,
    ManualTlsPeer,
    MiB,
    TlsPair,
    assert_tls_path,
    client_context,
    fd_count,
    is_zuvrs,
    server_context,
)

pytest.importorskip("cryptography")
from _tls_certs import make_pki  # noqa: E402


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


class BufferedRecorder(asyncio.BufferedProtocol):
    """A BufferedProtocol keeping what it gets (small buffers, to make the
    transport fill many of them)."""

    def __init__(self, size=4096, echo=False):
        loop = asyncio.get_running_loop()
        self.buf = bytearray(size)
        self.data = bytearray()
        self.echo = echo
        self.transport = None
        self.events = []
        self.sizes_asked = []
        self.made = loop.create_future()
        self.eof = loop.create_future()
        self.lost = loop.create_future()

    def connection_made(self, transport):
        self.transport = transport
        self.events.append("made")
        self.made.set_result(transport)

    def get_buffer(self, sizehint):
        self.sizes_asked.append(sizehint)
        return self.buf

    def buffer_updated(self, nbytes):
        chunk = bytes(self.buf[:nbytes])
        self.data += chunk
        if self.echo:
            self.transport.write(chunk)
        if not self.events or self.events[-1] != "data":
            self.events.append("data")

    def eof_received(self):
        self.events.append("eof")
        self.eof.set_result(None)

    def connection_lost(self, exc):
        self.events.append("lost")
        if not self.lost.done():
            self.lost.set_result(exc)

    @property
    def nbytes(self):
        return len(self.data)


# -- handshakes, data, extra info ----------------------------------------------------------


@SSLPROTO_311
@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_handshake_data_and_extra_info(loop, pki, version):
    """Both ends of a TLS 1.2 / 1.3 connection: the version, data both ways,
    and every piece of extra info, as the stdlib gives them."""
    sctx = server_context(pki, version=VERSIONS[version])
    cctx = client_context(pki)

    async def main():
        pair = await TlsPair.open(sctx, cctx)
        ct, st = pair.client_transport, pair.server.transport
        for t in (ct, st):
            assert isinstance(t, asyncio.Transport)
            assert "ssl" in type(t).__name__.lower()  # what CPython's and uvloop's tests look for
            assert_tls_path(loop, t)
            obj = t.get_extra_info("ssl_object")
            assert isinstance(obj, ssl.SSLObject)
            assert obj.version() == version
            assert t.get_extra_info("cipher") == obj.cipher()
            assert t.get_extra_info("cipher")[1] == version
            assert t.get_extra_info("compression") is None
            assert obj.compression() is None
            assert t.get_extra_info("nonexistent", "dflt") == "dflt"
            sock = t.get_extra_info("socket")
            assert sock is not None and sock.family == socket.AF_INET
            assert t.get_extra_info("sockname") == sock.getsockname()
            assert t.get_extra_info("peername") == sock.getpeername()
        assert ct.get_extra_info("sslcontext") is cctx
        assert st.get_extra_info("sslcontext") is sctx
        # sslproto's SSLProtocol behind the transport, as aiohttp reads it.
        assert ct._ssl_protocol._sslcontext is cctx
        assert st._ssl_protocol._sslcontext is sctx
        assert ct.get_extra_info("peername") == ("127.0.0.1", pair.port)
        assert st.get_extra_info("peername") == ct.get_extra_info("sockname")
        cobj, sobj = ct.get_extra_info("ssl_object"), st.get_extra_info("ssl_object")
        assert cobj.server_side is False and sobj.server_side is True
        assert cobj.server_hostname == "localhost" and sobj.server_hostname is None
        peercert = ct.get_extra_info("peercert")
        assert peercert == cobj.getpeercert()
        assert peercert["subject"] == ((("commonName", "localhost"),),)
        assert ("DNS", "localhost") in peercert["subjectAltName"]
        assert cobj.getpeercert(binary_form=True)[:1] == b"\x30"  # DER
        assert st.get_extra_info("peercert") is None  # no client certificate asked for
        assert cobj.selected_alpn_protocol() is None
        assert cobj.cipher() == sobj.cipher()
        binding = cobj.get_channel_binding("tls-unique")
        assert binding and binding == sobj.get_channel_binding("tls-unique")
        assert cobj.shared_ciphers() is None and sobj.shared_ciphers()
        assert cobj.pending() == 0

        ct.write(b"ping")
        await pair.server.received(4)
        st.write(b"pong" * 1000)
        await pair.client.received(4000)
        assert bytes(pair.server.data) == b"ping"
        assert bytes(pair.client.data) == b"pong" * 1000
        assert pair.server.data_types == {bytes} and pair.client.data_types == {bytes}
        ct.close()
        assert await asyncio.wait_for(pair.client.lost, TIMEOUT) is None
        assert await asyncio.wait_for(pair.server.lost, TIMEOUT) is None
        # Both ends see eof_received: the closing end when the peer's
        # close_notify answers its own.
        assert pair.client.events == ["made", "data", "eof", "lost"]
        assert pair.server.events == ["made", "data", "eof", "lost"]
        await pair.aclose()

    run(loop, main(), 20)


@SSLPROTO_311
@pytest.mark.parametrize("app", ["protocol", "buffered"])
def test_echo_large_with_protocol_kinds(loop, pki, app):
    """4 MiB through an echoing server whose protocol is a Protocol or a
    BufferedProtocol (small buffers), read back by the same kind."""
    data = payload(4 * MiB + 17, seed=11)
    factory = (lambda: RecordingProtocol(echo=True)) if app == "protocol" else (lambda: BufferedRecorder(echo=True))
    client_factory = RecordingProtocol if app == "protocol" else BufferedRecorder

    async def main():
        pair = await TlsPair.open(server_context(pki), client_context(pki), factory, client_factory)
        assert_tls_path(loop, pair.client_transport)
        for i in range(0, len(data), 100 * KiB):
            pair.client_transport.write(data[i:i + 100 * KiB])
        await wait_until(lambda: pair.client.nbytes >= len(data), 20)
        assert hashlib.sha256(pair.client.data).digest() == hashlib.sha256(data).digest()
        assert pair.server.nbytes == len(data)
        if app == "buffered":
            # sslproto asks for as much as it has undecrypted (>= 0) each time
            assert all(n >= 0 for n in pair.server.sizes_asked)
        pair.client_transport.close()
        await asyncio.wait_for(pair.client.lost, TIMEOUT)
        await asyncio.wait_for(pair.server.lost, TIMEOUT)
        assert pair.server.events[-2:] == ["eof", "lost"]
        await pair.aclose()

    run(loop, main(), 40)


@pytest.mark.parametrize("keep", ["all", "some", "none"])
def test_data_received_bytes_stay_what_they_were(loop, pki, keep):
    """What a protocol keeps of the decrypted `bytes` keeps its contents
    while later records arrive (messages of 70-250 KiB, each sent once the
    previous one was answered)."""

    async def main():
        pair = await TlsPair.open(server_context(pki), client_context(pki),
                                  client_factory=lambda: ChunkKeeper(KEEP_PICKS[keep]))
        assert_tls_path(loop, pair.client_transport)
        try:
            await check_kept_chunks(pair.server, pair.client, KEEP_PICKS[keep])
        finally:
            await pair.aclose()

    run(loop, main(), 20)


def test_kept_data_costs_about_its_size(loop, pki):
    if malloc_usable_size() is None:
        pytest.skip("needs glibc's malloc_usable_size")

    async def main():
        pair = await TlsPair.open(server_context(pki), client_context(pki),
                                  client_factory=lambda: ChunkKeeper(KEEP_PICKS["all"]))
        try:
            await check_kept_chunks_memory(pair.server, pair.client)
        finally:
            await pair.aclose()

    run(loop, main(), 20)


def test_streams_api(loop, pki):
    """open_connection / start_server with ssl: lines, exact reads, drain,
    and EOF through close_notify."""

    async def main():
        got = loop.create_future()

        async def handler(reader, writer):
            assert_tls_path(loop, writer.transport)
            lines = []
            while True:
                line = await reader.readline()
                if not line:
                    break
                lines.append(line)
                writer.write(line.upper())
                await writer.drain()
            got.set_result(lines)
            writer.close()
            await writer.wait_closed()

        srv = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=server_context(pki))
        port = srv.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_context(pki), server_hostname="localhost"
        )
        assert_tls_path(loop, writer.transport)
        assert writer.get_extra_info("ssl_object").version() in ("TLSv1.2", "TLSv1.3")
        for i in range(50):
            writer.write(b"line %d\n" % i)
        await writer.drain()
        for i in range(50):
            assert await reader.readexactly(len(b"LINE %d\n" % i)) == b"LINE %d\n" % i
        writer.close()
        await writer.wait_closed()
        assert len(await asyncio.wait_for(got, TIMEOUT)) == 50
        assert await reader.read() == b""
        srv.close()
        await srv.wait_closed()

    run(loop, main(), 20)


# -- verification -------------------------------------------------------------------------


def test_verify_mode_none_accepts_unknown_ca(loop, pki):
    cctx = client_context(pki, check_hostname=False, verify_mode=ssl.CERT_NONE)

    async def main():
        pair = await TlsPair.open(server_context(pki, "unknown_ca"), cctx)
        assert_tls_path(loop, pair.client_transport)
        obj = pair.client_transport.get_extra_info("ssl_object")
        # With CERT_NONE the stdlib does not validate, and getpeercert()
        # gives an empty dict (the binary form is there).
        assert pair.client_transport.get_extra_info("peercert") == {}
        assert obj.getpeercert(binary_form=True)
        assert obj.context.verify_mode == ssl.CERT_NONE
        await pair.aclose()

    run(loop, main())


def test_check_hostname_off_accepts_wrong_host(loop, pki):
    cctx = client_context(pki, check_hostname=False)

    async def main():
        pair = await TlsPair.open(server_context(pki, "wrong_host"), cctx)
        assert_tls_path(loop, pair.client_transport)
        cert = pair.client_transport.get_extra_info("peercert")
        assert cert["subject"] == ((("commonName", "wrong.example"),),)
        await pair.aclose()

    run(loop, main())


def test_server_hostname_other_than_host(loop, pki):
    """Connecting to 127.0.0.1 while verifying "localhost": SNI and the name
    check use server_hostname."""
    names = []
    sctx = server_context(pki)
    sctx.sni_callback = lambda obj, name, ctx: names.append(name)

    async def main():
        pair = await TlsPair.open(sctx, client_context(pki), server_hostname="localhost")
        assert names == ["localhost"]
        assert pair.server.transport.get_extra_info("ssl_object").server_hostname is None
        await pair.aclose()

    run(loop, main())


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_client_certificate_required(loop, pki, version):
    sctx = server_context(pki, version=VERSIONS[version], verify_mode=ssl.CERT_REQUIRED)
    sctx.load_verify_locations(cafile=str(pki.ca))
    cctx = client_context(pki, cert="client")

    async def main():
        pair = await TlsPair.open(sctx, cctx)
        st = pair.server.transport
        assert_tls_path(loop, st)
        cert = st.get_extra_info("peercert")
        assert cert["subject"] == ((("commonName", "zuvrs client"),),)
        assert cert == st.get_extra_info("ssl_object").getpeercert()
        pair.client_transport.write(b"hello")
        await pair.server.received(5)
        await pair.aclose()

    run(loop, main())


@SSLPROTO_311
def test_client_certificate_missing_tls12(loop, pki, caplog):
    """CERT_REQUIRED and no client certificate: the server's handshake fails
    (PEER_DID_NOT_RETURN_A_CERTIFICATE, logged in debug mode) and, as
    sslproto sends no alert on a failed handshake (the socket closes at
    once), the client's ends with ConnectionResetError."""
    sctx = server_context(pki, version=TLS12, verify_mode=ssl.CERT_REQUIRED)
    sctx.load_verify_locations(cafile=str(pki.ca))

    async def main():
        made = []
        srv = await loop.create_server(lambda: made.append(1) or asyncio.Protocol(), "127.0.0.1", 0, ssl=sctx)
        port = srv.sockets[0].getsockname()[1]
        with pytest.raises(ConnectionResetError) as info:
            await asyncio.wait_for(
                loop.create_connection(asyncio.Protocol, "127.0.0.1", port, ssl=client_context(pki),
                                       server_hostname="localhost"),
                TIMEOUT,
            )
        assert info.value.args == ()
        await asyncio.sleep(0.05)
        srv.close()
        await srv.wait_closed()
        return made

    loop.set_debug(True)
    contexts = []
    loop.set_exception_handler(lambda lp, ctx: contexts.append(ctx))
    with caplog.at_level(logging.DEBUG, logger="asyncio"):
        assert run(loop, main()) == [1]
    failures = [r.exc_info[1] for r in caplog.records if r.getMessage().endswith(": SSL handshake failed")]
    # The server's (its SSLError) and the client's (ConnectionResetError).
    assert sorted(type(e).__name__ for e in failures) == ["ConnectionResetError", "SSLError"]
    exc = next(e for e in failures if isinstance(e, ssl.SSLError))
    assert exc.reason == "PEER_DID_NOT_RETURN_A_CERTIFICATE" and exc.library == "SSL"
    # In debug mode the server reports the failed connection.
    assert [c["message"] for c in contexts] == ["Error on transport creation for incoming connection"]
    assert contexts[0]["exception"] is exc


# -- ALPN, SNI, sessions, keylog, post-handshake auth ---------------------------------------


def test_alpn(loop, pki):
    sctx = server_context(pki)
    sctx.set_alpn_protocols(["h2", "http/1.1"])
    cctx = client_context(pki)
    cctx.set_alpn_protocols(["http/1.1", "spdy/3"])

    async def main():
        pair = await TlsPair.open(sctx, cctx)
        for t in (pair.client_transport, pair.server.transport):
            assert_tls_path(loop, t)
            assert t.get_extra_info("ssl_object").selected_alpn_protocol() == "http/1.1"
        await pair.aclose()

    run(loop, main())


def test_sni_callback_switches_context(loop, pki):
    alt = server_context(pki, "alt_server")
    seen = []

    def sni(sslobj, name, ctx):
        seen.append((type(sslobj).__name__, name))
        if name == "alt.example":
            sslobj.context = alt

    sctx = server_context(pki)
    sctx.sni_callback = sni

    async def main():
        pair = await TlsPair.open(sctx, client_context(pki), server_hostname="alt.example")
        assert_tls_path(loop, pair.client_transport)
        cert = pair.client_transport.get_extra_info("peercert")
        assert cert["subject"] == ((("commonName", "alt.example"),),)
        # The SSLObject's context is the one the callback chose; the
        # transport's sslcontext stays the one it was given.
        sobj = pair.server.transport.get_extra_info("ssl_object")
        assert sobj.context is alt
        assert pair.server.transport.get_extra_info("sslcontext") is sctx
        await pair.aclose()
        pair2 = await TlsPair.open(sctx, client_context(pki), server_hostname="localhost")
        cert = pair2.client_transport.get_extra_info("peercert")
        assert cert["subject"] == ((("commonName", "localhost"),),)
        await pair2.aclose()

    run(loop, main())
    assert seen == [("SSLObject", "alt.example"), ("SSLObject", "localhost")]


def test_sni_callback_alert_fails_handshake(loop, pki):
    sctx = server_context(pki)
    sctx.sni_callback = lambda obj, name, ctx: ssl.ALERT_DESCRIPTION_ACCESS_DENIED

    async def main():
        srv = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0, ssl=sctx)
        port = srv.sockets[0].getsockname()[1]
        # The server's handshake fails; it sends no alert (sslproto's way).
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(
                loop.create_connection(asyncio.Protocol, "127.0.0.1", port, ssl=client_context(pki),
                                       server_hostname="localhost"),
                TIMEOUT,
            )
        srv.close()
        await srv.wait_closed()

    run(loop, main())


class _SessionContext(ssl.SSLContext):
    """A client context that resumes `session` (asyncio's APIs take no
    session: the context's wrap_bio passes it)."""

    session = None

    def wrap_bio(self, incoming, outgoing, server_side=False, server_hostname=None, session=None):
        return super().wrap_bio(incoming, outgoing, server_side=server_side, server_hostname=server_hostname,
                                session=session or self.session)


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_session_reuse(loop, pki, version):
    sctx = server_context(pki, version=VERSIONS[version])
    cctx = _SessionContext(ssl.PROTOCOL_TLS_CLIENT)
    cctx.load_verify_locations(cafile=str(pki.ca))

    async def main():
        pair = await TlsPair.open(sctx, cctx, server_factory=lambda: RecordingProtocol(echo=True))
        assert_tls_path(loop, pair.client_transport)
        # TLS 1.3 tickets come after the handshake: a round trip reads them.
        pair.client_transport.write(b"x")
        await pair.client.received(1)
        obj = pair.client_transport.get_extra_info("ssl_object")
        assert obj.session_reused is False
        session = obj.session
        assert session is not None and session.has_ticket
        pair.client_transport.close()
        await asyncio.wait_for(pair.client.lost, TIMEOUT)
        await pair.aclose()

        cctx.session = session
        pair = await TlsPair.open(sctx, cctx)
        assert_tls_path(loop, pair.client_transport)
        for t in (pair.client_transport, pair.server.transport):
            assert t.get_extra_info("ssl_object").session_reused is True
        assert pair.client_transport.get_extra_info("ssl_object").session.id == session.id or version == "TLSv1.3"
        await pair.aclose()

    run(loop, main())


def test_keylog_filename(loop, pki, tmp_path):
    path = tmp_path / "keys.log"
    cctx = client_context(pki)
    cctx.keylog_filename = str(path)

    async def main():
        for version in (TLS12, TLS13):
            pair = await TlsPair.open(server_context(pki, version=version), cctx)
            assert_tls_path(loop, pair.client_transport)
            pair.client_transport.write(b"k")
            await pair.server.received(1)
            await pair.aclose()

    run(loop, main())
    lines = path.read_text().splitlines()
    labels = {line.split()[0] for line in lines if line and not line.startswith("#")}
    assert "CLIENT_RANDOM" in labels  # TLS 1.2
    assert {"CLIENT_HANDSHAKE_TRAFFIC_SECRET", "SERVER_TRAFFIC_SECRET_0"} <= labels  # TLS 1.3


def test_post_handshake_auth(loop, pki):
    """TLS 1.3 post-handshake authentication: the server asks for the client
    certificate after the handshake; it arrives with the client's next
    records."""
    sctx = server_context(pki, version=TLS13, verify_mode=ssl.CERT_REQUIRED, post_handshake_auth=True)
    sctx.load_verify_locations(cafile=str(pki.ca))
    cctx = client_context(pki, cert="client", post_handshake_auth=True)

    async def main():
        pair = await TlsPair.open(sctx, cctx)
        st, ct = pair.server.transport, pair.client_transport
        assert_tls_path(loop, st)
        sobj = st.get_extra_info("ssl_object")
        assert sobj.getpeercert() is None
        sobj.verify_client_post_handshake()
        st.write(b"who are you?")
        await pair.client.received(12)
        ct.write(b"me")
        await pair.server.received(2)
        cert = sobj.getpeercert()
        assert cert is not None and cert["subject"] == ((("commonName", "zuvrs client"),),)
        # (peercert in the extra info is the handshake's, as sslproto keeps it.)
        assert st.get_extra_info("peercert") is None
        await pair.aclose()

    run(loop, main())


# -- flow control ---------------------------------------------------------------------------


@SSLPROTO_311
def test_buffer_limits(loop, pki):
    """asyncio's TLS water marks (512 KiB writes, 256 KiB reads, a quarter
    for the low marks) and its checks of new ones."""

    async def main():
        pair = await TlsPair.open(server_context(pki), client_context(pki))
        t = pair.client_transport
        assert_tls_path(loop, t)
        assert t.get_write_buffer_limits() == (128 * KiB, 512 * KiB)
        assert t.get_read_buffer_limits() == (64 * KiB, 256 * KiB)
        assert t.get_write_buffer_size() == 0
        assert t.get_read_buffer_size() == 0
        t.set_write_buffer_limits(high=64 * KiB)
        assert t.get_write_buffer_limits() == (16 * KiB, 64 * KiB)
        t.set_write_buffer_limits(low=1000)
        assert t.get_write_buffer_limits() == (1000, 4000)
        t.set_write_buffer_limits()
        assert t.get_write_buffer_limits() == (128 * KiB, 512 * KiB)
        with pytest.raises(ValueError, match=r"high \(10\) must be >= low \(20\) must be >= 0"):
            t.set_write_buffer_limits(high=10, low=20)
        with pytest.raises(ValueError, match=r"high \(-1\) must be >= low"):
            t.set_read_buffer_limits(high=-1)
        t.set_read_buffer_limits(high=100 * KiB)
        assert t.get_read_buffer_limits() == (25 * KiB, 100 * KiB)
        t.set_read_buffer_limits(high=7, low=3)
        assert t.get_read_buffer_limits() == (3, 7)
        assert pair.client.pause_writing_calls == 0
        # sslproto pauses the application as soon as the (empty) buffer
        # reaches a high-water mark of 0.
        t.set_write_buffer_limits(high=0)
        assert pair.client.pause_writing_calls == 1
        assert t.get_write_buffer_limits() == (0, 0)
        await pair.aclose()

    run(loop, main())


def test_pause_and_resume_writing_at_the_marks(loop, pki):
    """A writer whose peer does not read is paused at the high-water mark and
    resumed at or below the low one, with get_write_buffer_size() saying so."""
    high, low = 256 * KiB, 64 * KiB
    chunk = payload(16 * KiB, seed=4)

    async def main():
        pair = await TlsPair.open(server_context(pki), client_context(pki),
                                  server_factory=lambda: RecordingProtocol(keep_data=False))
        t, client = pair.client_transport, pair.client
        assert_tls_path(loop, t)
        pair.server.transport.pause_reading()
        t.set_write_buffer_limits(high=high, low=low)
        written = 0
        while not client.writing_paused and written < 256 * MiB:
            t.write(chunk)
            written += len(chunk)
            await asyncio.sleep(0)
        assert client.pause_writing_calls == 1
        assert client.sizes_at_pause[0] >= high
        assert t.get_write_buffer_size() >= high
        assert t._protocol_paused is True  # what loop.sendfile's fallback reads
        pair.server.transport.resume_reading()
        await client.until(lambda: client.resume_writing_calls == 1, 20)
        assert client.sizes_at_resume[0] <= low
        assert t._protocol_paused is False
        await pair.server.received(written, 30)
        assert pair.server.nbytes == written
        assert t.get_write_buffer_size() == 0
        await pair.aclose()
        return written

    run(loop, main(), 60)


@SSLPROTO_311
def test_write_flow_control_counts_what_sslproto_counts(loop, pki):
    """sslproto's accounting: the application's write buffer is the backlog
    and the ciphertext held back while the socket's own buffer is over its
    mark; what the socket holds is not counted. A huge write to a peer that
    does not read therefore pauses nothing; the writes after it pile up in
    the TLS session and pause the application at 512 KiB; once the socket
    drains, all of it goes and the application resumes at a buffer of 0."""
    chunk = payload(100 * KiB, seed=12)

    async def main():
        pair = await TlsPair.open(server_context(pki), client_context(pki),
                                  server_factory=lambda: RecordingProtocol(keep_data=False))
        t, client = pair.client_transport, pair.client
        assert_tls_path(loop, t)
        pair.server.transport.pause_reading()
        big = payload(16 * MiB, seed=13)
        t.write(big)  # more than the kernel takes: the socket keeps the rest
        assert t.get_write_buffer_size() == 0
        await asyncio.sleep(0.05)
        assert client.pause_writing_calls == 0
        writes = 0
        while not client.writing_paused:
            t.write(chunk)
            writes += 1
            await asyncio.sleep(0)
            if not client.writing_paused:
                # The ciphertext of every write so far is held in the session.
                assert writes * len(chunk) <= t.get_write_buffer_size() < writes * (len(chunk) + 1024)
            assert writes < 20
        assert writes == 6  # 6 x 100 KiB (+ record overhead) is the first >= 512 KiB
        assert client.sizes_at_pause == [t.get_write_buffer_size()]
        assert client.sizes_at_pause[0] >= 512 * KiB
        pair.server.transport.resume_reading()
        await client.until(lambda: client.resume_writing_calls == 1, 30)
        assert client.sizes_at_resume == [0]
        await pair.server.received(len(big) + writes * len(chunk), 30)
        await pair.aclose()

    run(loop, main(), 60)


@SSLPROTO_311
def test_pause_and_resume_reading(loop, pki):
    """pause_reading() stops data_received (the socket goes on reading
    ciphertext up to the read high-water mark); resume_reading() delivers
    it all."""
    data = payload(2 * MiB, seed=5)

    async def main():
        pair = await TlsPair.open(server_context(pki), client_context(pki))
        t, client = pair.client_transport, pair.client
        assert_tls_path(loop, t)
        assert t.is_reading() is True
        t.pause_reading()
        assert t.is_reading() is False
        t.pause_reading()  # twice is fine
        pair.server.transport.write(data)
        await asyncio.sleep(0.3)
        assert client.nbytes == 0
        pending = t.get_read_buffer_size()
        assert 0 < pending < 1 * MiB  # bounded by the read high-water mark (and a read)
        t.resume_reading()
        assert t.is_reading() is True
        t.resume_reading()
        await client.received(len(data), 20)
        assert bytes(client.data) == data
        assert t.get_read_buffer_size() == 0
        await pair.aclose()

    run(loop, main(), 30)


def test_resume_reading_delivers_in_a_later_callback(loop, pki):
    """sslproto's resume_reading schedules the read: nothing is delivered
    from inside resume_reading()."""

    async def main():
        pair = await TlsPair.open(server_context(pki), client_context(pki))
        t, client = pair.client_transport, pair.client
        assert_tls_path(loop, t)
        t.pause_reading()
        pair.server.transport.write(b"held")
        await asyncio.sleep(0.1)
        assert client.nbytes == 0
        t.resume_reading()
        assert client.nbytes == 0
        await client.received(4)
        await pair.aclose()

    run(loop, main())


def test_write_eof_and_can_write_eof(loop, pki):
    async def main():
        pair = await TlsPair.open(server_context(pki), client_context(pki))
        t = pair.client_transport
        assert_tls_path(loop, t)
        assert t.can_write_eof() is False
        with pytest.raises(NotImplementedError):
            t.write_eof()
        t.write(b"still open")
        await pair.server.received(10)
        await pair.aclose()

    run(loop, main())


def test_write_type_errors(loop, pki):
    async def main():
        pair = await TlsPair.open(server_context(pki), client_context(pki))
        t = pair.client_transport
        with pytest.raises(TypeError, match="data: expecting a bytes-like instance, got str"):
            t.write("text")
        with pytest.raises(TypeError, match="got int"):
            t.write(1)
        t.write(b"")
        t.write(bytearray(b"ab"))
        t.write(memoryview(b"cd"))
        t.writelines([b"e", bytearray(b"f"), memoryview(b"g")])
        await pair.server.received(7)
        assert bytes(pair.server.data) == b"abcdefg"
        assert t.get_write_buffer_size() == 0
        await pair.aclose()

    run(loop, main())


# -- close, abort ----------------------------------------------------------------------------


@SSLPROTO_311
def test_close_sends_close_notify_both_ways(loop, pki):
    async def main():
        pair = await TlsPair.open(server_context(pki), client_context(pki))
        t = pair.client_transport
        assert_tls_path(loop, t)
        assert t.is_closing() is False
        t.close()
        assert t.is_closing() is True
        t.close()  # a second close is harmless
        assert await asyncio.wait_for(pair.server.lost, TIMEOUT) is None
        assert await asyncio.wait_for(pair.client.lost, TIMEOUT) is None
        assert pair.server.events == ["made", "eof", "lost"]
        assert pair.client.events == ["made", "eof", "lost"]
        assert pair.server.transport.is_closing() is True
        await pair.aclose()

    run(loop, main())


@SSLPROTO_311
def test_server_closes_first(loop, pki):
    async def main():
        pair = await TlsPair.open(server_context(pki), client_context(pki))
        pair.server.transport.write(b"bye")
        pair.server.transport.close()
        assert await asyncio.wait_for(pair.client.lost, TIMEOUT) is None
        assert await asyncio.wait_for(pair.server.lost, TIMEOUT) is None
        assert bytes(pair.client.data) == b"bye"
        assert pair.client.events == ["made", "data", "eof", "lost"]
        assert pair.client_transport.is_closing() is True
        await pair.aclose()

    run(loop, main())


@SSLPROTO_311
def test_eof_received_returning_true_warns(loop, pki, caplog):
    async def main():
        pair = await TlsPair.open(server_context(pki), client_context(pki),
                                  server_factory=lambda: RecordingProtocol(eof_result=True))
        pair.client_transport.close()
        await asyncio.wait_for(pair.server.lost, TIMEOUT)
        await asyncio.wait_for(pair.client.lost, TIMEOUT)
        assert pair.server.events.count("eof") == 1
        await pair.aclose()

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        run(loop, main())
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs.count("returning true from eof_received() has no effect when using ssl") == 1


@SSLPROTO_311
def test_writes_after_close_are_dropped_with_a_warning(loop, pki, caplog):
    async def main():
        pair = await TlsPair.open(server_context(pki), client_context(pki))
        t = pair.client_transport
        t.write(b"before")
        t.close()
        for _ in range(10):
            t.write(b"after")
        await asyncio.wait_for(pair.server.lost, TIMEOUT)
        assert bytes(pair.server.data) == b"before"
        await pair.aclose()

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        run(loop, main())
    assert [r.getMessage() for r in caplog.records].count("SSL connection is closed") == 5


def test_abort(loop, pki):
    async def main():
        pair = await TlsPair.open(server_context(pki), client_context(pki))
        t = pair.client_transport
        assert_tls_path(loop, t)
        t.abort()
        assert t.is_closing() is True
        t.write(b"dropped")
        assert await asyncio.wait_for(pair.client.lost, TIMEOUT) is None
        exc = await asyncio.wait_for(pair.server.lost, TIMEOUT)
        assert exc is None or isinstance(exc, ConnectionResetError)
        assert pair.client.events == ["made", "lost"]
        # The server saw the socket's EOF without close_notify: sslproto
        # still calls eof_received.
        assert pair.server.events in (["made", "eof", "lost"], ["made", "lost"])
        assert pair.server.nbytes == 0
        await pair.aclose()

    run(loop, main())


@SSLPROTO_311
def test_close_with_pending_data_delivers_everything(loop, pki):
    data = payload(8 * MiB + 5, seed=6)

    async def main():
        pair = await TlsPair.open(server_context(pki), client_context(pki),
                                  server_factory=lambda: RecordingProtocol(keep_data=False))
        t = pair.client_transport
        t.write(data)
        t.close()
        assert await asyncio.wait_for(pair.server.lost, 30) is None
        assert pair.server.nbytes == len(data)
        assert pair.server.sha.digest() == hashlib.sha256(data).digest()
        assert pair.server.events[-2:] == ["eof", "lost"]
        await asyncio.wait_for(pair.client.lost, TIMEOUT)
        await pair.aclose()

    run(loop, main(), 40)


@pytest.mark.parametrize("size", [10, 100 * KiB, 1 * MiB])
def test_close_while_reading_paused_delivers_pending_writes(loop, pki, size):
    """Writes made while the application has paused reading, then close():
    every byte reaches the peer before close_notify."""
    data = payload(size, seed=7)

    async def main():
        pair = await TlsPair.open(server_context(pki), client_context(pki))
        t = pair.client_transport
        t.pause_reading()
        t.write(data)
        t.close()
        assert await asyncio.wait_for(pair.server.lost, 20) is None
        assert pair.server.nbytes == len(data)
        assert bytes(pair.server.data) == data
        await pair.aclose()

    run(loop, main(), 30)


def test_protocol_of_a_closed_connection(loop, pki):
    async def main():
        pair = await TlsPair.open(server_context(pki), client_context(pki))
        t = pair.client_transport
        assert t.get_protocol() is pair.client
        other = RecordingProtocol()
        t.set_protocol(other)
        assert t.get_protocol() is other
        pair.server.transport.write(b"to the new one")
        await other.received(14)
        assert pair.client.nbytes == 0
        t.set_protocol(pair.client)
        t.close()
        await asyncio.wait_for(pair.client.lost, TIMEOUT)
        assert not other.lost.done()
        await pair.aclose()

    run(loop, main())


# -- timeouts ----------------------------------------------------------------------------------


@SSLPROTO_311
@pytest.mark.parametrize("name", ["ssl_handshake_timeout", "ssl_shutdown_timeout"])
@pytest.mark.parametrize("value", [0, -1.5])
def test_timeouts_must_be_positive(loop, pki, name, value):
    async def main():
        srv = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0, ssl=server_context(pki))
        port = srv.sockets[0].getsockname()[1]
        await asyncio.sleep(0)
        before = fd_count()
        with pytest.raises(ValueError, match=f"^{name} should be a positive number, got {value}$"):
            await loop.create_connection(asyncio.Protocol, "127.0.0.1", port, ssl=client_context(pki),
                                         server_hostname="localhost", **{name: value})
        # A plain connection's start_tls refuses it too, and the connection
        # stays usable.
        t, p = await loop.create_connection(RecordingProtocol, "127.0.0.1", port)
        with pytest.raises(ValueError, match=f"^{name} should be a positive number, got {value}$"):
            await loop.start_tls(t, p, client_context(pki), server_hostname="localhost", **{name: value})
        assert not t.is_closing()
        t.close()
        await p.lost
        srv.close()
        await srv.wait_closed()
        await asyncio.sleep(0.05)
        import gc

        gc.collect()
        return before

    before = run(loop, main())
    loop.close()
    assert fd_count() <= before


def test_client_handshake_timeout(loop, pki):
    """A server that never answers the ClientHello."""

    async def main():
        srv = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0)  # plain and silent
        port = srv.sockets[0].getsockname()[1]
        start = loop.time()
        with pytest.raises(ConnectionAbortedError) as info:
            await loop.create_connection(asyncio.Protocol, "127.0.0.1", port, ssl=client_context(pki),
                                         server_hostname="localhost", ssl_handshake_timeout=0.3)
        elapsed = loop.time() - start
        assert str(info.value) == "SSL handshake is taking longer than 0.3 seconds: aborting the connection"
        srv.close()
        await srv.wait_closed()
        return elapsed

    contexts = []
    loop.set_exception_handler(lambda lp, ctx: contexts.append(ctx))
    assert 0.25 < run(loop, main()) < 3
    assert contexts == []  # an OSError: asyncio only logs it in debug mode


def test_server_handshake_timeout_keeps_serving(loop, pki):
    """A client that connects and never speaks is dropped after the timeout;
    meanwhile and afterwards the server serves others."""

    async def main():
        pair = await TlsPair.open(server_context(pki), client_context(pki),
                                  server_factory=lambda: RecordingProtocol(echo=True),
                                  server_kwargs={"ssl_handshake_timeout": 0.4})
        silent = socket.socket()
        silent.setblocking(False)
        await loop.sock_connect(silent, ("127.0.0.1", pair.port))
        start = loop.time()
        recv = asyncio.ensure_future(loop.sock_recv(silent, 100))
        # Others are served while the silent one waits.
        for i in range(3):
            t, p = await loop.create_connection(RecordingProtocol, "127.0.0.1", pair.port,
                                                ssl=client_context(pki), server_hostname="localhost")
            t.write(b"hello %d" % i)
            await p.received(7)
            t.close()
            await p.lost
        try:
            data = await asyncio.wait_for(recv, TIMEOUT)
        except ConnectionResetError:
            data = b""
        elapsed = loop.time() - start
        assert data == b""
        silent.close()
        pair.client_transport.write(b"still here")
        await pair.client.received(10)
        await pair.aclose()
        return elapsed

    assert 0.3 < run(loop, main(), 20) < 4


@SSLPROTO_311
def test_shutdown_timeout(loop, pki):
    """A peer that never answers our close_notify: connection_lost gets
    TimeoutError('SSL shutdown timed out') after ssl_shutdown_timeout."""

    async def main():
        peers = []

        def factory():
            p = ManualTlsPeer(server_context(pki), True, answer_close_notify=False)
            peers.append(p)
            return p

        srv = await loop.create_server(factory, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        t, p = await loop.create_connection(RecordingProtocol, "127.0.0.1", port, ssl=client_context(pki),
                                            server_hostname="localhost", ssl_shutdown_timeout=0.3)
        assert_tls_path(loop, t)
        t.write(b"data")
        await wait_until(lambda: peers and peers[0].data == b"data")
        start = loop.time()
        t.close()
        exc = await asyncio.wait_for(p.lost, TIMEOUT)
        elapsed = loop.time() - start
        assert type(exc) is TimeoutError and str(exc) == "SSL shutdown timed out"
        await asyncio.wait_for(peers[0].close_notify, TIMEOUT)  # ours went out
        assert p.events == ["made", "lost"]
        peers[0].transport.close()
        srv.close()
        await srv.wait_closed()
        return elapsed

    assert 0.25 < run(loop, main()) < 3


# -- every API that takes ssl= ---------------------------------------------------------------


def test_unix_connection_and_server(loop, pki, tmp_path):
    path = str(tmp_path / "tls.sock")

    async def main():
        accepted = []

        def factory():
            p = RecordingProtocol(echo=True)
            accepted.append(p)
            return p

        srv = await loop.create_unix_server(factory, path, ssl=server_context(pki))
        with pytest.raises(ValueError, match="you have to pass server_hostname when using ssl"):
            await loop.create_unix_connection(asyncio.Protocol, path, ssl=client_context(pki))
        t, p = await loop.create_unix_connection(RecordingProtocol, path, ssl=client_context(pki),
                                                 server_hostname="localhost")
        assert_tls_path(loop, t)
        await wait_until(lambda: accepted and accepted[0].transport is not None)
        assert_tls_path(loop, accepted[0].transport)
        assert t.get_extra_info("peername") == path
        assert t.get_extra_info("socket").family == socket.AF_UNIX
        assert t.get_extra_info("ssl_object").version() in ("TLSv1.2", "TLSv1.3")
        data = payload(300 * KiB, seed=8)
        t.write(data)
        await p.received(len(data))
        assert bytes(p.data) == data
        t.close()
        assert await p.lost is None
        assert await accepted[0].lost is None
        srv.close()
        await srv.wait_closed()

    run(loop, main(), 20)


def test_unix_streams(loop, pki, tmp_path):
    path = str(tmp_path / "tls-streams.sock")

    async def main():
        async def handler(reader, writer):
            writer.write(await reader.readexactly(5))
            await writer.drain()
            writer.close()

        srv = await asyncio.start_unix_server(handler, path, ssl=server_context(pki))
        reader, writer = await asyncio.open_unix_connection(path, ssl=client_context(pki),
                                                            server_hostname="localhost")
        assert_tls_path(loop, writer.transport)
        writer.write(b"hello")
        assert await reader.read() == b"hello"
        writer.close()
        await writer.wait_closed()
        srv.close()
        await srv.wait_closed()

    run(loop, main())


def test_connect_accepted_socket(loop, pki):
    async def main():
        lsock = socket.create_server(("127.0.0.1", 0))
        lsock.setblocking(False)
        port = lsock.getsockname()[1]
        connecting = asyncio.ensure_future(
            loop.create_connection(RecordingProtocol, "127.0.0.1", port, ssl=client_context(pki),
                                   server_hostname="localhost")
        )
        conn, _ = await loop.sock_accept(lsock)
        st, sp = await loop.connect_accepted_socket(lambda: RecordingProtocol(echo=True), conn,
                                                    ssl=server_context(pki))
        assert_tls_path(loop, st)
        ct, cp = await connecting
        assert st.get_extra_info("ssl_object").server_side is True
        assert st.get_extra_info("socket").fileno() == conn.fileno()
        ct.write(b"accepted")
        await cp.received(8)
        ct.close()
        assert await sp.lost is None
        lsock.close()

    run(loop, main())


@SSLPROTO_311
def test_connect_accepted_socket_argument_errors(loop, pki):
    async def main():
        a, b = socket.socketpair()
        try:
            with pytest.raises(ValueError, match="ssl_handshake_timeout is only meaningful with ssl"):
                await loop.connect_accepted_socket(asyncio.Protocol, a, ssl_handshake_timeout=1)
            with pytest.raises(ValueError, match="ssl_shutdown_timeout is only meaningful with ssl"):
                await loop.connect_accepted_socket(asyncio.Protocol, a, ssl_shutdown_timeout=1)
        finally:
            a.close()
            b.close()

    run(loop, main())


def test_create_connection_on_a_connected_socket(loop, pki):
    async def main():
        pair = await TlsPair.open(server_context(pki), client_context(pki),
                                  server_factory=lambda: RecordingProtocol(echo=True))
        sock = socket.create_connection(("127.0.0.1", pair.port))
        sock.setblocking(False)
        with pytest.raises(ValueError, match="You must set server_hostname when using ssl without a host"):
            await loop.create_connection(asyncio.Protocol, sock=sock, ssl=client_context(pki))
        t, p = await loop.create_connection(RecordingProtocol, sock=sock, ssl=client_context(pki),
                                            server_hostname="localhost")
        assert_tls_path(loop, t)
        t.write(b"on my socket")
        await p.received(12)
        t.close()
        await p.lost
        await pair.aclose()

    run(loop, main())


@SSLPROTO_311
def test_ssl_argument_errors(loop, pki):
    """The stdlib's own checks of ssl=, server_hostname= and the timeouts
    (the same on both loops: BaseEventLoop makes them)."""

    async def main():
        srv = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        with pytest.raises(ValueError, match="server_hostname is only meaningful with ssl"):
            await loop.create_connection(asyncio.Protocol, "127.0.0.1", port, server_hostname="localhost")
        with pytest.raises(ValueError, match="ssl_handshake_timeout is only meaningful with ssl"):
            await loop.create_connection(asyncio.Protocol, "127.0.0.1", port, ssl_handshake_timeout=1)
        with pytest.raises(ValueError, match="ssl_shutdown_timeout is only meaningful with ssl"):
            await loop.create_connection(asyncio.Protocol, "127.0.0.1", port, ssl_shutdown_timeout=1)
        with pytest.raises(TypeError, match="ssl argument must be an SSLContext or None"):
            await loop.create_server(asyncio.Protocol, "127.0.0.1", 0, ssl=True)
        with pytest.raises(ValueError, match="ssl_handshake_timeout is only meaningful with ssl"):
            await loop.create_server(asyncio.Protocol, "127.0.0.1", 0, ssl_handshake_timeout=1)
        with pytest.raises(ValueError, match="server_hostname is only meaningful with ssl"):
            await loop.create_unix_connection(asyncio.Protocol, "/nonexistent", server_hostname="x")
        t, p = await loop.create_connection(RecordingProtocol, "127.0.0.1", port)
        with pytest.raises(TypeError, match="sslcontext is expected to be an instance of ssl.SSLContext"):
            await loop.start_tls(t, p, True)
        assert not t.is_closing()
        t.close()
        await p.lost
        srv.close()
        await srv.wait_closed()

    run(loop, main())


def test_ssl_true_uses_a_default_context(loop, pki):
    """ssl=True: a default verifying context, which does not know our CA."""

    async def main():
        srv = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0, ssl=server_context(pki))
        port = srv.sockets[0].getsockname()[1]
        with pytest.raises(ssl.SSLCertVerificationError) as info:
            await loop.create_connection(asyncio.Protocol, "127.0.0.1", port, ssl=True, server_hostname="localhost")
        assert info.value.verify_code == 20  # unable to get local issuer certificate
        srv.close()
        await srv.wait_closed()

    run(loop, main())


@pytest.mark.parametrize("value", [0, -1])
def test_server_with_an_invalid_timeout_refuses_each_connection(loop, pki, value):
    """create_server does not check the timeouts: each connection's set-up
    fails (reported in debug mode only), the server goes on accepting, and
    the socket is left as it was (asyncio leaves it to the GC)."""

    async def main():
        loop.set_debug(True)
        srv = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0, ssl=server_context(pki),
                                       ssl_handshake_timeout=value)
        port = srv.sockets[0].getsockname()[1]
        socks = []
        for i in range(3):
            sock = socket.socket()
            sock.setblocking(False)
            await loop.sock_connect(sock, ("127.0.0.1", port))
            socks.append(sock)
            await wait_until(lambda n=i + 1: len(contexts) == n)
        for sock in socks:
            sock.close()
        srv.close()
        await srv.wait_closed()

    contexts = []
    loop.set_exception_handler(lambda lp, ctx: contexts.append(ctx))
    import gc
    import warnings

    before = fd_count()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        run(loop, main())
        assert [c["message"] for c in contexts] == ["Error on transport creation for incoming connection"] * 3
        assert all(isinstance(c["exception"], ValueError) for c in contexts)
        contexts.clear()
        loop.close()
        gc.collect()
    assert fd_count() <= before


# -- start_tls -------------------------------------------------------------------------------


class _StartTlsServer(asyncio.Protocol):
    """A plain server protocol that upgrades to TLS on b"STARTTLS\\r\\n":
    it pauses reading, answers, and calls start_tls at once (the peer's
    ClientHello may already be waiting in the socket)."""

    def __init__(self, ctx, answer=b"OK\r\n"):
        loop = asyncio.get_running_loop()
        self.ctx = ctx
        self.answer = answer
        self.tls = loop.create_future()
        self.app = RecordingProtocol(echo=True)
        self.plain = bytearray()

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.plain += data
        if self.plain.endswith(b"STARTTLS\r\n"):
            self.transport.pause_reading()
            self.transport.write(self.answer)
            asyncio.ensure_future(self._upgrade())

    async def _upgrade(self):
        loop = asyncio.get_running_loop()
        try:
            t = await loop.start_tls(self.transport, self.app, self.ctx, server_side=True)
        except BaseException as exc:
            self.tls.set_exception(exc)
            raise
        self.app.connection_made(t)
        self.tls.set_result(t)


@SSLPROTO_311
def test_start_tls_server_with_client_hello_buffered(loop, pki):
    """The client sends its ClientHello right after reading the plaintext
    answer; the server calls start_tls with reading paused, so the hello
    may be waiting in the socket already. Every byte of TLS is kept."""

    async def main():
        servers = []

        def factory():
            p = _StartTlsServer(server_context(pki))
            servers.append(p)
            return p

        srv = await loop.create_server(factory, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"STARTTLS\r\n")
        assert await reader.readexactly(4) == b"OK\r\n"
        await writer.start_tls(client_context(pki), server_hostname="localhost")
        assert_tls_path(loop, writer.transport)
        st = await asyncio.wait_for(servers[0].tls, TIMEOUT)
        assert_tls_path(loop, st)
        writer.write(b"secret")
        assert await reader.readexactly(6) == b"secret"
        assert bytes(servers[0].plain) == b"STARTTLS\r\n"
        writer.close()
        await writer.wait_closed()
        srv.close()
        await srv.wait_closed()

    run(loop, main())


def test_start_tls_server_with_hello_before_the_answer_is_read(loop, pki):
    """A client that sends its ClientHello right after its plaintext line,
    before reading the answer: the server paused reading in data_received,
    so the hello waits in the socket while start_tls sets up, and is kept."""

    async def main():
        servers = []

        def factory():
            p = _StartTlsServer(server_context(pki))
            servers.append(p)
            return p

        srv = await loop.create_server(factory, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]

        def client_factory():
            p = ManualTlsPeer(client_context(pki), False, "localhost", start_handshake=False)
            p.plain_expected = 4  # b"OK\r\n"
            return p

        ct, peer = await loop.create_connection(client_factory, "127.0.0.1", port)
        ct.write(b"STARTTLS\r\n")
        await wait_until(lambda: servers and servers[0].plain)
        peer._step()  # the ClientHello, whether or not the answer came yet
        await asyncio.wait_for(peer.done, TIMEOUT)
        assert bytes(peer.plain) == b"OK\r\n"
        st = await asyncio.wait_for(servers[0].tls, TIMEOUT)
        assert_tls_path(loop, st)
        peer.send(b"ping")
        await servers[0].app.received(4)
        await wait_until(lambda: peer.data == b"ping")
        assert bytes(servers[0].plain) == b"STARTTLS\r\n"
        ct.close()
        srv.close()
        await srv.wait_closed()

    run(loop, main())


def test_start_tls_client_and_server_data_exchange(loop, pki):
    """loop.start_tls() on both ends of a plain connection, then a large
    exchange and close."""
    data = payload(3 * MiB, seed=9)

    async def main():
        pair_srv = []
        srv = await loop.create_server(lambda: pair_srv.append(RecordingProtocol(echo=True)) or pair_srv[-1],
                                       "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        t, client = await loop.create_connection(RecordingProtocol, "127.0.0.1", port)
        await wait_until(lambda: pair_srv and pair_srv[0].transport is not None)
        server = pair_srv[0]
        server_tls = asyncio.ensure_future(loop.start_tls(server.transport, server, server_context(pki),
                                                          server_side=True))
        client_t = await loop.start_tls(t, client, client_context(pki), server_hostname="localhost")
        server_t = await server_tls
        assert_tls_path(loop, client_t)
        assert_tls_path(loop, server_t)
        server.transport = server_t  # the echo goes through TLS
        assert t.is_closing() is False
        client_t.write(data)
        await client.received(len(data), 20)
        assert hashlib.sha256(client.data).digest() == hashlib.sha256(data).digest()
        client_t.close()
        assert await client.lost is None
        assert await server.lost is None
        srv.close()
        await srv.wait_closed()

    run(loop, main(), 30)


def test_start_tls_handshake_failure(loop, pki):
    """start_tls whose handshake fails raises the SSL error; the plain
    transport underneath is closed."""

    async def main():
        pair_srv = []
        srv = await loop.create_server(lambda: pair_srv.append(RecordingProtocol()) or pair_srv[-1],
                                       "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        t, client = await loop.create_connection(RecordingProtocol, "127.0.0.1", port)
        await wait_until(lambda: pair_srv and pair_srv[0].transport is not None)
        server = pair_srv[0]
        server_tls = asyncio.ensure_future(loop.start_tls(server.transport, server,
                                                          server_context(pki, "wrong_host"), server_side=True))
        with pytest.raises(ssl.SSLCertVerificationError) as info:
            await loop.start_tls(t, client, client_context(pki), server_hostname="localhost")
        assert info.value.verify_code == 62  # hostname mismatch
        with pytest.raises(ConnectionResetError):
            await server_tls
        assert t.is_closing()
        srv.close()
        await srv.wait_closed()

    run(loop, main())


def test_start_tls_cancelled_during_handshake(loop, pki):
    async def main():
        srv = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0)  # never answers
        port = srv.sockets[0].getsockname()[1]
        t, client = await loop.create_connection(RecordingProtocol, "127.0.0.1", port)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(loop.start_tls(t, client, client_context(pki), server_hostname="localhost"), 0.2)
        assert t.is_closing()
        # The socket closes; the protocol, whose connection_made start_tls
        # never called again, gets no connection_lost (sslproto's rule).
        await asyncio.sleep(0.1)
        assert not client.lost.done()
        srv.close()
        await srv.wait_closed()

    run(loop, main())


def test_start_tls_on_a_transport_closed_before_the_upgrade_returns_none(loop, pki):
    # asyncio returns None (aiohttp checks for it: "Failed to start TLS").
    async def main():
        srv = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        t, client = await loop.create_connection(RecordingProtocol, "127.0.0.1", port)
        t.close()
        assert await loop.start_tls(t, client, client_context(pki), server_hostname="localhost") is None
        srv.close()
        await srv.wait_closed()

    run(loop, main())


# -- sendfile ----------------------------------------------------------------------------------


def test_sendfile_over_tls(loop, pki, tmp_path):
    """loop.sendfile on a TLS transport: asyncio's fallback (read and write),
    then the transport is the application's again."""
    data = payload(5 * MiB + 123, seed=10)
    path = tmp_path / "file.bin"
    path.write_bytes(data)

    async def main():
        pair = await TlsPair.open(server_context(pki), client_context(pki),
                                  server_factory=lambda: RecordingProtocol(keep_data=False))
        t = pair.client_transport
        assert_tls_path(loop, t)
        with open(path, "rb") as f:
            sent = await loop.sendfile(t, f)
            assert sent == len(data)
            assert f.tell() == len(data)
        with open(path, "rb") as f:
            assert await loop.sendfile(t, f, offset=100, count=1000) == 1000
            assert f.tell() == 1100
        assert t.get_protocol() is pair.client
        assert t.is_reading()
        t.write(b"after")
        await pair.server.received(len(data) + 1005, 30)
        expected = hashlib.sha256(data + data[100:1100] + b"after").digest()
        assert pair.server.sha.digest() == expected
        pair.server.transport.write(b"reply")
        await pair.client.received(5)
        await pair.aclose()

    run(loop, main(), 40)


@SSLPROTO_311
def test_invalid_timeout_leaves_the_socket_usable(loop, pki):
    """create_connection(sock=..., ssl=...) refusing a timeout leaves the
    caller's socket as it was: it can carry a TLS connection afterwards."""

    async def main():
        pair = await TlsPair.open(server_context(pki), client_context(pki),
                                  server_factory=lambda: RecordingProtocol(echo=True))
        sock = socket.create_connection(("127.0.0.1", pair.port))
        sock.setblocking(False)
        fd = sock.fileno()
        for kw in ({"ssl_handshake_timeout": 0}, {"ssl_shutdown_timeout": -1}):
            with pytest.raises(ValueError):
                await loop.create_connection(asyncio.Protocol, sock=sock, ssl=client_context(pki),
                                             server_hostname="localhost", **kw)
            assert sock.fileno() == fd
        t, p = await loop.create_connection(RecordingProtocol, sock=sock, ssl=client_context(pki),
                                            server_hostname="localhost")
        assert_tls_path(loop, t)
        t.write(b"reused")
        await p.received(6)
        t.close()
        assert await p.lost is None
        await pair.aclose()
        await asyncio.sleep(0.05)
        # New descriptors take the numbers just freed: closing the loop must
        # not close them (nothing of the refused set-ups holds a number).
        return [socket.socketpair() for _ in range(4)]

    pairs = run(loop, main())
    loop.close()
    for a, b in pairs:
        a.send(b"x")
        assert b.recv(1) == b"x"
        a.close()
        b.close()


def test_extra_info_and_protocol_once_the_connection_is_lost(loop, pki):
    """After connection_lost, sslproto still gives the TLS extra info but no
    longer the socket's (its transport is gone), and no protocol."""

    async def main():
        pair = await TlsPair.open(server_context(pki), client_context(pki))
        t = pair.client_transport
        seen = {}
        lost = pair.client.connection_lost

        def connection_lost(exc):
            seen.update(peername=t.get_extra_info("peername"), socket=t.get_extra_info("socket"),
                        cipher=t.get_extra_info("cipher"), obj=t.get_extra_info("ssl_object"),
                        ctx=t.get_extra_info("sslcontext"), dflt=t.get_extra_info("sockname", "dflt"))
            lost(exc)

        pair.client.connection_lost = connection_lost
        t.close()
        await pair.client.lost
        assert seen["peername"] is None and seen["socket"] is None and seen["dflt"] == "dflt"
        assert seen["cipher"] is not None and isinstance(seen["obj"], ssl.SSLObject) and seen["ctx"] is not None
        assert t.get_protocol() is None
        assert t.is_closing()
        await pair.aclose()

    run(loop, main())


def test_closing_the_plain_transport_under_tls(loop, pki):
    """After start_tls, the plain transport underneath closes the socket
    itself (no close_notify; as asyncio's socket transport, which is what
    Server.close_clients() closes): the TLS application gets
    connection_lost without eof_received, the peer sees an EOF."""

    async def main():
        accepted = []
        srv = await loop.create_server(lambda: accepted.append(RecordingProtocol()) or accepted[-1],
                                       "127.0.0.1", 0, ssl=server_context(pki))
        port = srv.sockets[0].getsockname()[1]
        plain, app = await loop.create_connection(RecordingProtocol, "127.0.0.1", port)
        tls = await loop.start_tls(plain, app, client_context(pki), server_hostname="localhost")
        assert_tls_path(loop, tls)
        await wait_until(lambda: accepted and accepted[0].transport is not None)
        tls.write(b"x")
        await accepted[0].received(1)
        plain.close()
        assert await asyncio.wait_for(app.lost, TIMEOUT) is None
        assert app.events == ["made", "lost"]
        assert await asyncio.wait_for(accepted[0].lost, TIMEOUT) is None
        assert accepted[0].events == ["made", "data", "eof", "lost"]
        srv.close()
        await srv.wait_closed()

    run(loop, main())


@pytest.mark.skipif(sys.version_info < (3, 13), reason="Server.close_clients() is 3.13+")
@pytest.mark.parametrize("how", ["close_clients", "abort_clients"])
def test_server_close_clients(loop, pki, how):
    async def main():
        accepted = []
        srv = await loop.create_server(lambda: accepted.append(RecordingProtocol()) or accepted[-1],
                                       "127.0.0.1", 0, ssl=server_context(pki))
        port = srv.sockets[0].getsockname()[1]
        t, p = await loop.create_connection(RecordingProtocol, "127.0.0.1", port, ssl=client_context(pki),
                                            server_hostname="localhost")
        await wait_until(lambda: accepted and accepted[0].transport is not None)
        srv.close()
        getattr(srv, how)()
        assert await asyncio.wait_for(accepted[0].lost, TIMEOUT) is None
        assert accepted[0].events == ["made", "lost"]
        exc = await asyncio.wait_for(p.lost, TIMEOUT)
        assert exc is None or isinstance(exc, ConnectionResetError)
        await srv.wait_closed()

    run(loop, main())


class CountingSocket(socket.socket):
    """A socket class that overrides send (zuvrs's native core would bypass
    it, so zuvrs gives such sockets asyncio's transport)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.sends = 0

    def send(self, data, *args):
        self.sends += 1
        return super().send(data, *args)


async def connected_counting_socket(loop, pki):
    """A TLS echo server, and a CountingSocket connected to it."""
    pair = await TlsPair.open(server_context(pki), client_context(pki),
                              server_factory=lambda: RecordingProtocol(echo=True))
    sock = CountingSocket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", pair.port))
    return pair, sock


def test_socket_class_overriding_io_gets_sslproto(loop, pki):
    """A socket whose class overrides recv/send is served by asyncio's own
    transport and sslproto on zuvrs (the native core would bypass the
    overrides), which says so in _tls_path; it works the same."""

    async def main():
        pair, sock = await connected_counting_socket(loop, pki)
        t, p = await loop.create_connection(RecordingProtocol, sock=sock, ssl=client_context(pki),
                                            server_hostname="localhost")
        if is_zuvrs(loop) and sys.version_info >= (3, 11):
            assert t._tls_path == "sslproto: the socket's class overrides its I/O methods"
        t.write(b"through sslproto")
        await p.received(16)
        assert sock.sends > 0
        t.close()
        await p.lost
        await pair.aclose()

    run(loop, main())


def test_start_tls_on_a_transport_zuvrs_does_not_serve_gets_sslproto(loop, pki):
    """start_tls on a transport that is not zuvrs's own socket transport (a
    socket class overriding its I/O gets asyncio's) goes through asyncio's
    sslproto on zuvrs, which says so in _tls_path; the exchange works the
    same."""

    async def main():
        pair, sock = await connected_counting_socket(loop, pki)
        t, p = await loop.create_connection(RecordingProtocol, sock=sock)
        tls = await loop.start_tls(t, p, client_context(pki), server_hostname="localhost")
        if is_zuvrs(loop) and sys.version_info >= (3, 11):
            assert tls._tls_path == "sslproto: the transport or the context is not zuvrs's own"
        tls.write(b"after start_tls")
        await p.received(15)
        assert p.data == b"after start_tls"
        tls.close()
        await p.lost
        await pair.aclose()

    run(loop, main())
