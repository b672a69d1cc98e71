"""TLS over TCP transports (asyncio's sslproto on top of the loop's transports).

The certificate is a throw-away self-signed one for "localhost" made by the
test (with the ``cryptography`` package, else the ``openssl`` CLI).
"""

import asyncio
import datetime
import hashlib
import ipaddress
import shutil
import socket
import ssl
import subprocess
import sys

import pytest
from _support import TIMEOUT, RecordingProtocol, numbered_chunks, payload, run

KiB = 1024
MiB = 1024 * KiB


def _make_cert_cryptography(cert_path, key_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def _make_cert_openssl(cert_path, key_path):
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", str(key_path), "-out", str(cert_path), "-days", "30",
            "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )


@pytest.fixture(scope="module")
def cert_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    try:
        _make_cert_cryptography(cert, key)
    except ImportError:
        if shutil.which("openssl") is None:
            pytest.skip("neither the cryptography package nor the openssl CLI is available")
        _make_cert_openssl(cert, key)
    return cert, key


@pytest.fixture
def server_ctx(cert_files):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(*cert_files)
    return ctx


@pytest.fixture
def client_ctx(cert_files):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the peer and its name
    ctx.load_verify_locations(cafile=str(cert_files[0]))
    return ctx


async def _read_http_message(reader):
    """(head lines, body) of one HTTP/1.1 message with a Content-Length."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")[:-2]
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    body = await reader.readexactly(length)
    return lines, body


def test_https_like_echo_streams(loop, server_ctx, client_ctx):
    """POST bodies over TLS to an echoing HTTP/1.1-ish server, keep-alive."""
    bodies = [b"", b"small", payload(64 * KiB, seed=1), payload(MiB + 3, seed=2)]

    async def main():
        server_info = {}

        async def handler(reader, writer):
            server_info["ssl_object"] = writer.get_extra_info("ssl_object")
            server_info["peername"] = writer.get_extra_info("peername")
            try:
                while True:
                    try:
                        lines, body = await _read_http_message(reader)
                    except asyncio.IncompleteReadError as exc:
                        assert exc.partial == b""
                        break
                    assert lines[0] == "POST /echo HTTP/1.1"
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                        b"Content-Length: %d\r\n\r\n" % len(body)
                    )
                    writer.write(body)
                    await writer.drain()
            finally:
                writer.close()

        srv = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=server_ctx)
        port = srv.sockets[0].getsockname()[1]
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=client_ctx, server_hostname="localhost"), TIMEOUT
        )
        sslobj = writer.get_extra_info("ssl_object")
        assert sslobj is not None
        assert sslobj.version().startswith("TLS")
        assert writer.get_extra_info("peercert")["subject"] == ((("commonName", "localhost"),),)
        assert writer.get_extra_info("cipher") is not None
        assert writer.get_extra_info("sslcontext") is client_ctx
        assert writer.get_extra_info("peername") == ("127.0.0.1", port)
        for body in bodies:
            writer.write(
                b"POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n" % len(body) + body
            )
            await writer.drain()
            lines, got = await asyncio.wait_for(_read_http_message(reader), 10)
            assert lines[0] == "HTTP/1.1 200 OK"
            assert hashlib.sha256(got).digest() == hashlib.sha256(body).digest()
        assert server_info["ssl_object"] is not None
        assert server_info["peername"] == writer.get_extra_info("sockname")
        writer.close()
        await asyncio.wait_for(writer.wait_closed(), TIMEOUT)
        srv.close()
        await asyncio.wait_for(srv.wait_closed(), TIMEOUT)

    run(loop, main(), 30)


def _buffers_held(writer):
    """On zuvrs, whether the connection's native TLS session holds its
    record buffers; None on other loops."""
    core = getattr(writer.transport, "_core", None)
    return None if core is None else core._tls_buffers_held()


def test_idle_connection_gives_back_its_record_buffers(loop, server_ctx, client_ctx):
    """Echo, idle past the loop's housekeeping period, echo again: the data
    is intact on every loop. On zuvrs the native session keeps OpenSSL's
    record buffers while records pass and frees them once a period passes
    without any; a session with ciphertext still waiting (its reader
    paused) keeps them, and its data arrives intact afterwards."""
    small, big = payload(KiB, seed=4), payload(256 * KiB, seed=5)

    async def main():
        server_writers = []
        gate = asyncio.Event()

        async def echo(reader, writer):
            server_writers.append(writer)
            try:
                while True:
                    n = int.from_bytes(await reader.readexactly(4), "big")
                    if n == 0:
                        break
                    if n == len(big):
                        await gate.wait()  # the client's data waits meanwhile
                    writer.write(await reader.readexactly(n))
                    await writer.drain()
            finally:
                writer.close()

        srv = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=server_ctx, limit=KiB)
        port = srv.sockets[0].getsockname()[1]
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=client_ctx, server_hostname="localhost"), TIMEOUT
        )

        async def echoed(data):
            writer.write(len(data).to_bytes(4, "big") + data)
            got = await asyncio.wait_for(reader.readexactly(len(data)), TIMEOUT)
            assert got == data

        async def released(*writers):
            while any(_buffers_held(w) for w in writers):
                await asyncio.sleep(0.05)

        await echoed(small)
        (swriter,) = server_writers
        assert _buffers_held(writer) in (None, True)
        assert _buffers_held(swriter) in (None, True)
        await asyncio.wait_for(released(writer, swriter), 5)
        await echoed(small)
        assert _buffers_held(writer) in (None, True)

        # The server's reader pauses with ciphertext still waiting: its
        # session keeps the buffers over idle periods.
        writer.write(len(big).to_bytes(4, "big") + big)
        await writer.drain()
        await asyncio.sleep(2.5)
        assert _buffers_held(swriter) in (None, True)
        gate.set()
        got = await asyncio.wait_for(reader.readexactly(len(big)), TIMEOUT)
        assert got == big
        await echoed(small)

        writer.write((0).to_bytes(4, "big"))
        writer.close()
        await asyncio.wait_for(writer.wait_closed(), TIMEOUT)
        srv.close()
        await asyncio.wait_for(srv.wait_closed(), TIMEOUT)

    run(loop, main(), 30)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="zuvrs's native TLS is 3.11+ (asyncio's sslproto on 3.10)")
def test_housekeeping_stops_once_no_connection_holds_buffers(server_ctx, client_ctx):
    """zuvrs only (its turn count): once the TLS connections are gone, the
    loop's housekeeping timer stops, so an idle loop is not woken every
    second. Over 3.5 idle seconds the loop that had TLS connections turns
    at most twice more than a loop that never had any (its timer's last
    round finds nobody, and stops it); a timer left running would add
    three."""
    zuvrs = pytest.importorskip("zuvrs")

    async def tls_exchange():
        async def echo(reader, writer):
            writer.write(await reader.readexactly(5))
            await writer.drain()
            await reader.read()  # the client's close
            writer.close()

        srv = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=server_ctx)
        port = srv.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_ctx, server_hostname="localhost"
        )
        writer.write(b"hello")
        assert await asyncio.wait_for(reader.readexactly(5), TIMEOUT) == b"hello"
        assert _buffers_held(writer)
        writer.close()
        await asyncio.wait_for(writer.wait_closed(), TIMEOUT)
        srv.close()
        await asyncio.wait_for(srv.wait_closed(), TIMEOUT)

    def idle_turns(lp):
        before = lp.stats().turns
        lp.run_until_complete(asyncio.sleep(3.5))
        return lp.stats().turns - before

    control = zuvrs.new_event_loop()
    lp = zuvrs.new_event_loop()
    try:
        lp.run_until_complete(asyncio.wait_for(tls_exchange(), 30))
        assert idle_turns(lp) <= idle_turns(control) + 2
    finally:
        lp.close()
        control.close()


def test_tls_protocol_echo(loop, server_ctx, client_ctx):
    chunks = list(numbered_chunks(payload(256 * KiB, seed=3), 16))  # 4 MiB
    total = sum(map(len, chunks))

    async def main():
        accepted = []

        def factory():
            p = RecordingProtocol(echo=True)
            accepted.append(p)
            return p

        srv = await loop.create_server(factory, "127.0.0.1", 0, ssl=server_ctx)
        port = srv.sockets[0].getsockname()[1]
        t, client = await asyncio.wait_for(
            loop.create_connection(
                RecordingProtocol, "127.0.0.1", port, ssl=client_ctx, server_hostname="localhost"
            ),
            TIMEOUT,
        )
        assert isinstance(t, asyncio.Transport)
        assert t.get_extra_info("ssl_object") is not None
        t.writelines(chunks[:8])
        for c in chunks[8:]:
            t.write(c)
        await client.received(total, timeout=20)
        assert client.nbytes == total
        assert client.sha.hexdigest() == hashlib.sha256(b"".join(chunks)).hexdigest()
        server = accepted[0]
        assert server.nbytes == total
        t.close()
        assert await asyncio.wait_for(client.lost, TIMEOUT) is None
        await asyncio.wait_for(server.lost, TIMEOUT)
        assert "eof" in server.events or server.lost.result() is None
        srv.close()
        await asyncio.wait_for(srv.wait_closed(), TIMEOUT)

    run(loop, main(), 30)


def test_tls_wrong_hostname_fails_verification(loop, server_ctx, client_ctx):
    async def main():
        srv = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0, ssl=server_ctx)
        port = srv.sockets[0].getsockname()[1]
        try:
            with pytest.raises(ssl.SSLCertVerificationError):
                await asyncio.wait_for(
                    loop.create_connection(
                        asyncio.Protocol, "127.0.0.1", port, ssl=client_ctx, server_hostname="wrong.example"
                    ),
                    TIMEOUT,
                )
        finally:
            srv.close()
            await srv.wait_closed()

    loop.set_exception_handler(lambda lp, ctx: None)  # the server logs the failed handshake
    run(loop, main())


@pytest.mark.skipif(sys.version_info < (3, 11), reason="StreamWriter.start_tls() is 3.11+")
def test_start_tls_upgrades_plain_connection(loop, server_ctx, client_ctx):
    async def main():
        server_done = asyncio.get_running_loop().create_future()

        async def handler(reader, writer):
            try:
                assert await reader.readline() == b"STARTTLS\r\n"
                writer.write(b"OK go ahead\r\n")
                await writer.start_tls(server_ctx)
                assert writer.get_extra_info("ssl_object") is not None
                while True:
                    line = await reader.readline()
                    if not line:
                        break
                    writer.write(b"tls:" + line)
                    await writer.drain()
                server_done.set_result(True)
            except BaseException as exc:
                if not server_done.done():
                    server_done.set_exception(exc)
                raise
            finally:
                writer.close()

        srv = await asyncio.start_server(handler, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert writer.get_extra_info("ssl_object") is None
        writer.write(b"STARTTLS\r\n")
        assert await asyncio.wait_for(reader.readline(), TIMEOUT) == b"OK go ahead\r\n"
        await asyncio.wait_for(writer.start_tls(client_ctx, server_hostname="localhost"), TIMEOUT)
        assert writer.get_extra_info("ssl_object").version().startswith("TLS")
        for i in range(100):
            writer.write(b"line %d\r\n" % i)
            await writer.drain()
            assert await asyncio.wait_for(reader.readline(), TIMEOUT) == b"tls:line %d\r\n" % i
        big = payload(16 * KiB, seed=5).hex().encode() + b"\r\n"  # under the 64 KiB line limit
        writer.write(big)
        assert await asyncio.wait_for(reader.readline(), TIMEOUT) == b"tls:" + big
        assert writer.can_write_eof() is False  # TLS transports cannot half-close
        writer.close()
        await asyncio.wait_for(writer.wait_closed(), TIMEOUT)
        assert await asyncio.wait_for(server_done, TIMEOUT) is True
        srv.close()
        await asyncio.wait_for(srv.wait_closed(), TIMEOUT)

    run(loop, main(), 20)


def test_loop_start_tls_with_protocols(loop, server_ctx, client_ctx):
    """loop.start_tls() on both ends of a plain protocol connection."""

    async def main():
        accepted = []

        def factory():
            p = RecordingProtocol()
            accepted.append(p)
            return p

        srv = await loop.create_server(factory, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        t, client = await loop.create_connection(RecordingProtocol, "127.0.0.1", port)
        while not accepted or not accepted[0].made.done():
            await asyncio.sleep(0.001)
        server = accepted[0]
        server_tls = asyncio.ensure_future(
            loop.start_tls(server.transport, server, server_ctx, server_side=True)
        )
        await asyncio.sleep(0)
        client_t = await asyncio.wait_for(
            loop.start_tls(t, client, client_ctx, server_hostname="localhost"), TIMEOUT
        )
        server_t = await asyncio.wait_for(server_tls, TIMEOUT)
        assert client_t.get_extra_info("ssl_object") is not None
        assert server_t.get_extra_info("ssl_object") is not None
        client_t.write(b"over tls")
        await server.received(8)
        server_t.write(b"and back")
        await client.received(8)
        assert bytes(server.data) == b"over tls"
        assert bytes(client.data) == b"and back"
        client_t.close()
        await asyncio.wait_for(client.lost, TIMEOUT)
        await asyncio.wait_for(server.lost, TIMEOUT)
        srv.close()
        await asyncio.wait_for(srv.wait_closed(), TIMEOUT)

    run(loop, main(), 20)


def test_server_ssl_handshake_timeout(loop, server_ctx):
    """A client that never starts the handshake is dropped after
    ssl_handshake_timeout."""
    loop.set_exception_handler(lambda lp, ctx: None)

    async def main():
        srv = await loop.create_server(
            asyncio.Protocol, "127.0.0.1", 0, ssl=server_ctx, ssl_handshake_timeout=0.3
        )
        port = srv.sockets[0].getsockname()[1]
        sock = socket.socket()
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, ("127.0.0.1", port))
            start = loop.time()
            try:
                data = await asyncio.wait_for(loop.sock_recv(sock, 100), TIMEOUT)
            except ConnectionResetError:
                data = b""
            elapsed = loop.time() - start
            assert data == b""
            return elapsed
        finally:
            sock.close()
            srv.close()
            await srv.wait_closed()

    elapsed = run(loop, main())
    assert 0.2 < elapsed < 3


def test_client_ssl_handshake_timeout(loop, client_ctx):
    """A server that never answers the handshake: create_connection fails
    with ConnectionAbortedError after ssl_handshake_timeout."""

    async def main():
        srv = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0)  # plain, silent
        port = srv.sockets[0].getsockname()[1]
        try:
            start = loop.time()
            with pytest.raises(ConnectionAbortedError):
                await asyncio.wait_for(
                    loop.create_connection(
                        asyncio.Protocol, "127.0.0.1", port,
                        ssl=client_ctx, server_hostname="localhost", ssl_handshake_timeout=0.3,
                    ),
                    TIMEOUT,
                )
            return loop.time() - start
        finally:
            srv.close()
            await srv.wait_closed()

    elapsed = run(loop, main())
    assert 0.2 < elapsed < 3
