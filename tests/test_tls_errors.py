"""TLS errors as the stdlib raises them.

Each scenario runs on the loop under test and, as the reference, on a fresh
stdlib selector loop; what the application sees (the exception from
create_connection, the protocol's callbacks, connection_lost's argument,
the debug log of the failed handshake, the exception handler's contexts)
must be the same: the exception types, args, messages, ``reason``,
``library``, ``verify_code`` and ``verify_message``.
"""

import asyncio
import logging
import socket
import ssl

import pytest
from _support import TIMEOUT, RecordingProtocol, run, wait_until
from _tls_support import (
    SSLPROTO_311,
    TLS12,
    TLS13,
    ManualTlsPeer,
    assert_tls_path,
    client_context,
    error_fields,
    server_context,
)

pytest.importorskip("cryptography")
from _tls_certs import make_pki  # noqa: E402


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


class _LogCapture(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


def outcome_on(loop, scenario):
    """Runs ``scenario(loop)`` (a coroutine function) in debug mode on
    `loop`; returns (its result, the failure messages logged by asyncio with
    their exceptions, the exception handler's contexts)."""
    contexts = []
    loop.set_exception_handler(lambda lp, ctx: contexts.append(ctx))
    loop.set_debug(True)
    logger = logging.getLogger("asyncio")
    handler = _LogCapture()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        result = run(loop, scenario(loop), 20)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    logged = sorted(
        (r.getMessage().rsplit(": ", 1)[-1], error_fields(r.exc_info[1] if r.exc_info else None))
        for r in handler.records
        if "failed" in r.getMessage() or "Fatal" in r.getMessage()
    )
    handled = sorted((c["message"], error_fields(c.get("exception"))) for c in contexts)
    return result, logged, handled


def assert_same_as_stdlib(loop, scenario):
    got = outcome_on(loop, scenario)
    ref_loop = asyncio.SelectorEventLoop()
    try:
        ref = outcome_on(ref_loop, scenario)
    finally:
        ref_loop.close()
    assert got == ref
    return got


async def connect_outcome(loop, port, cctx, server_hostname="localhost"):
    """What create_connection gives: the exception's fields, or the
    transport's TLS details."""
    try:
        t, p = await asyncio.wait_for(
            loop.create_connection(RecordingProtocol, "127.0.0.1", port, ssl=cctx, server_hostname=server_hostname),
            TIMEOUT,
        )
    except Exception as exc:
        return ("raised", error_fields(exc))
    assert_tls_path(loop, t)
    obj = t.get_extra_info("ssl_object")
    info = ("connected", obj.version(), obj.selected_alpn_protocol())
    t.close()
    await asyncio.wait_for(p.lost, TIMEOUT)
    return info


def tls_server_scenario(sctx, cctx, server_hostname="localhost"):
    async def scenario(loop):
        accepted = []

        def factory():
            p = RecordingProtocol()
            accepted.append(p)
            return p

        srv = await loop.create_server(factory, "127.0.0.1", 0, ssl=sctx)
        port = srv.sockets[0].getsockname()[1]
        result = await connect_outcome(loop, port, cctx, server_hostname)
        await asyncio.sleep(0.1)  # the server's side of a failure
        srv.close()
        await srv.wait_closed()
        return result, [p.events for p in accepted]

    return scenario


# -- certificate verification ----------------------------------------------------------------


@pytest.mark.parametrize(
    "cert,code,message",
    [
        ("expired", 10, "certificate has expired"),
        ("wrong_host", 62, "Hostname mismatch, certificate is not valid for 'localhost'."),
        ("unknown_ca", 20, "unable to get local issuer certificate"),
    ],
)
@pytest.mark.parametrize("version", [TLS12, TLS13])
def test_certificate_verification_errors(loop, pki, cert, code, message, version):
    sctx = server_context(pki, cert, version=version)
    result, logged, handled = assert_same_as_stdlib(loop, tls_server_scenario(sctx, client_context(pki)))
    (kind, fields), server_events = result
    assert kind == "raised"
    assert fields[0] == "SSLCertVerificationError"
    assert ("verify_code", code) in fields and ("verify_message", message) in fields
    assert ("reason", "CERTIFICATE_VERIFY_FAILED") in fields and ("library", "SSL") in fields
    assert any(m == "SSL handshake failed on verifying the certificate" for m, _ in logged)
    assert server_events == [[]]  # the server's application never saw a connection
    # The server's failure (the client sent no alert) is only logged; in
    # debug mode the server reports the connection it could not set up.
    assert [m for m, _ in handled] == ["Error on transport creation for incoming connection"]


def test_wrong_host_with_check_hostname_off_but_verify_required(loop, pki):
    cctx = client_context(pki, check_hostname=False)
    result, _, _ = assert_same_as_stdlib(loop, tls_server_scenario(server_context(pki, "wrong_host"), cctx))
    assert result[0][0] == "connected"


# -- handshake failures ----------------------------------------------------------------------


def test_protocol_version_mismatch(loop, pki):
    sctx = server_context(pki)
    sctx.minimum_version = TLS13
    cctx = client_context(pki)
    cctx.maximum_version = TLS12
    result, logged, handled = assert_same_as_stdlib(loop, tls_server_scenario(sctx, cctx))
    (kind, fields), _ = result
    assert kind == "raised"
    reasons = [dict(f[3:]).get("reason") for _, f in logged if f and len(f) > 3]
    assert "UNSUPPORTED_PROTOCOL" in reasons


def test_no_shared_cipher_tls12(loop, pki):
    sctx = server_context(pki, version=TLS12)
    sctx.set_ciphers("ECDHE-ECDSA-CHACHA20-POLY1305")
    cctx = client_context(pki, version=TLS12)
    cctx.set_ciphers("ECDHE-ECDSA-AES128-GCM-SHA256")
    result, logged, handled = assert_same_as_stdlib(loop, tls_server_scenario(sctx, cctx))
    (kind, fields), _ = result
    assert kind == "raised" and fields[0] == "ConnectionResetError"
    reasons = [dict(f[3:]).get("reason") for _, f in logged if f and len(f) > 3]
    assert "NO_SHARED_CIPHER" in reasons


def test_alpn_without_overlap_is_no_error(loop, pki):
    sctx = server_context(pki)
    sctx.set_alpn_protocols(["h2"])
    cctx = client_context(pki)
    cctx.set_alpn_protocols(["http/1.1"])
    result, _, _ = assert_same_as_stdlib(loop, tls_server_scenario(sctx, cctx))
    assert result[0][0] == "connected" and result[0][2] is None


def test_client_garbage_instead_of_a_hello(loop, pki):
    """A client that speaks HTTP to a TLS server: the server's handshake fails
    (no alert is sent) and it goes on serving."""

    async def scenario(loop):
        srv = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0, ssl=server_context(pki))
        port = srv.sockets[0].getsockname()[1]
        sock = socket.socket()
        sock.setblocking(False)
        await loop.sock_connect(sock, ("127.0.0.1", port))
        await loop.sock_sendall(sock, b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        got = b""
        while True:
            try:
                chunk = await asyncio.wait_for(loop.sock_recv(sock, 1000), TIMEOUT)
            except ConnectionResetError:
                break
            if not chunk:
                break
            got += chunk
        sock.close()
        ok = await connect_outcome(loop, port, client_context(pki))
        srv.close()
        await srv.wait_closed()
        return got, ok[0]

    (got, ok), logged, handled = assert_same_as_stdlib(loop, scenario)
    assert got == b"" and ok == "connected"
    assert any(f and ("reason", "HTTP_REQUEST") in f for _, f in logged)


def test_server_garbage_instead_of_a_hello(loop, pki):
    class Garbage(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport = transport

        def data_received(self, data):
            self.transport.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    async def scenario(loop):
        srv = await loop.create_server(Garbage, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        result = await connect_outcome(loop, port, client_context(pki))
        srv.close()
        await srv.wait_closed()
        return result

    result, logged, _ = assert_same_as_stdlib(loop, scenario)
    assert result[0] == "raised" and result[1][0] == "SSLError"
    assert ("reason", "WRONG_VERSION_NUMBER") in result[1]


@pytest.mark.parametrize("after", [1, 100])
def test_server_closes_mid_handshake(loop, pki, after):
    """A server that reads some of the ClientHello and closes: the client's
    create_connection raises ConnectionResetError (sslproto raises the class
    on the socket's EOF)."""

    class Closer(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport = transport
            self.n = 0
            if after == 0:
                transport.close()

        def data_received(self, data):
            self.n += len(data)
            if self.n >= after:
                self.transport.close()

    async def scenario(loop):
        srv = await loop.create_server(Closer, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        result = await connect_outcome(loop, port, client_context(pki))
        srv.close()
        await srv.wait_closed()
        return result

    result, logged, handled = assert_same_as_stdlib(loop, scenario)
    assert result in (("raised", ("ConnectionResetError", (), "", ("reason", None), ("library", None),
                                  ("verify_code", None), ("verify_message", None), ("errno", None),
                                  ("strerror", None))),)
    assert handled == []


@SSLPROTO_311
def test_client_closes_mid_handshake(loop, pki):
    """A client that sends half a ClientHello and closes: the server's
    handshake ends (logged in debug mode) and it keeps serving."""

    async def scenario(loop):
        srv = await loop.create_server(RecordingProtocol, "127.0.0.1", 0, ssl=server_context(pki))
        port = srv.sockets[0].getsockname()[1]
        # A real ClientHello, cut short.
        inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
        obj = client_context(pki).wrap_bio(inc, out, server_hostname="localhost")
        with pytest.raises(ssl.SSLWantReadError):
            obj.do_handshake()
        hello = out.read()
        sock = socket.socket()
        sock.setblocking(False)
        await loop.sock_connect(sock, ("127.0.0.1", port))
        await loop.sock_sendall(sock, hello[: len(hello) // 2])
        await asyncio.sleep(0.05)
        sock.close()
        await asyncio.sleep(0.1)
        ok = await connect_outcome(loop, port, client_context(pki))
        srv.close()
        await srv.wait_closed()
        return ok[0]

    result, logged, handled = assert_same_as_stdlib(loop, scenario)
    assert result == "connected"
    assert ("SSL handshake failed", ("ConnectionResetError",)) in logged or any(
        m == "SSL handshake failed" for m, _ in logged
    )


# -- after the handshake ----------------------------------------------------------------------


def _manual_server_scenario(pki, behaviour, version=None):
    """A ManualTlsPeer server doing `behaviour(peer)` once the handshake is
    done; returns what the client application saw."""

    async def scenario(loop):
        peers = []

        def factory():
            p = ManualTlsPeer(server_context(pki, version=version), True)
            peers.append(p)
            return p

        srv = await loop.create_server(factory, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        t, p = await loop.create_connection(RecordingProtocol, "127.0.0.1", port, ssl=client_context(pki),
                                            server_hostname="localhost")
        assert_tls_path(loop, t)
        await wait_until(lambda: peers and peers[0].done.done())
        behaviour(peers[0])
        exc = await asyncio.wait_for(p.lost, TIMEOUT)
        peers[0].transport.close()
        srv.close()
        await srv.wait_closed()
        return p.events, bytes(p.data), error_fields(exc), t.is_closing()

    return scenario


def test_peer_unexpected_eof(loop, pki):
    """The server closes TCP without close_notify: sslproto treats the EOF
    as the end (eof_received, then connection_lost(None))."""

    def behaviour(peer):
        peer.send(b"last words")
        peer.transport.close()

    result, logged, handled = assert_same_as_stdlib(loop, _manual_server_scenario(pki, behaviour))
    events, data, exc, closing = result
    assert events == ["made", "data", "eof", "lost"] and data == b"last words" and exc is None
    assert handled == []


def test_peer_resets(loop, pki):
    def behaviour(peer):
        sock = peer.transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        peer.transport.abort()

    result, logged, handled = assert_same_as_stdlib(loop, _manual_server_scenario(pki, behaviour))
    events, data, exc, closing = result
    assert exc is not None and exc[0] == "ConnectionResetError"
    assert handled == []


@SSLPROTO_311
@pytest.mark.parametrize("together", [True, False], ids=["one-segment", "two-segments"])
def test_data_after_close_notify(loop, pki, together):
    """A peer that sends close_notify and then more data: what came before
    is delivered, the rest is not, and the connection ends cleanly."""

    def behaviour(peer):
        peer.send(b"before")
        if together:
            peer.sslobj.write(b"x")  # a record, then close_notify, then a record: one write
            try:
                peer.sslobj.unwrap()
            except ssl.SSLWantReadError:
                pass
            raw = peer.outgoing.read()
            peer.transport.write(raw + raw[:0])
        else:
            peer.send_close_notify()
        # Records after close_notify, made by a second session's worth of
        # bytes: garbage from TLS's point of view.
        peer.transport.write(b"\x17\x03\x03\x00\x05after")

    result, logged, handled = assert_same_as_stdlib(loop, _manual_server_scenario(pki, behaviour))
    events, data, exc, closing = result
    assert data.startswith(b"before")
    assert events[-2:] == ["eof", "lost"]


@SSLPROTO_311
def test_client_initiated_renegotiation_tls12(loop, pki):
    """A TLS 1.2 client asks to renegotiate: OpenSSL 3's server refuses
    (client-initiated renegotiation is off), the client fails on that and
    alerts, and the server's application gets connection_lost with the
    alert's SSLError."""
    zuvrs_native = pytest.importorskip("zuvrs._zuvrs")
    engine_cls = zuvrs_native._TlsEngine
    if not engine_cls.verdict()[0]:
        pytest.skip("no native engine to drive a renegotiating client")

    class Renegotiator(asyncio.Protocol):
        def __init__(self):
            loop = asyncio.get_running_loop()
            self.inc, self.out = ssl.MemoryBIO(), ssl.MemoryBIO()
            obj = client_context(pki, version=TLS12).wrap_bio(self.inc, self.out, server_hostname="localhost")
            self.engine = engine_cls.open(obj, self.inc, self.out)
            self.done = loop.create_future()
            self.errors = []

        def connection_made(self, transport):
            self.transport = transport
            self._pump()

        def _flush(self):
            out = self.engine.take_output()
            if out:
                self.transport.write(out)

        def _pump(self):
            try:
                if not self.done.done():
                    if self.engine.handshake():
                        self.done.set_result(None)
                else:
                    self.engine.read()
            except ssl.SSLError as exc:
                self.errors.append(error_fields(exc))
            self._flush()

        def data_received(self, data):
            self.engine.feed(data)
            self._pump()

        def renegotiate(self):
            try:
                self.engine._renegotiate()
            except ssl.SSLError as exc:
                self.errors.append(error_fields(exc))
            self._flush()

    async def scenario(loop):
        accepted = []

        def factory():
            p = RecordingProtocol()
            accepted.append(p)
            return p

        srv = await loop.create_server(factory, "127.0.0.1", 0, ssl=server_context(pki, version=TLS12))
        port = srv.sockets[0].getsockname()[1]
        ct, client = await loop.create_connection(Renegotiator, "127.0.0.1", port)
        await asyncio.wait_for(client.done, TIMEOUT)
        await wait_until(lambda: accepted and accepted[0].transport is not None)
        assert_tls_path(loop, accepted[0].transport)
        client.renegotiate()
        exc = await asyncio.wait_for(accepted[0].lost, TIMEOUT)
        ct.close()
        srv.close()
        await srv.wait_closed()
        return accepted[0].events, error_fields(exc), client.errors

    result, logged, handled = assert_same_as_stdlib(loop, scenario)
    events, exc, client_errors = result
    assert events == ["made", "lost"]
    assert exc[0] == "SSLError" and ("reason", "SSLV3_ALERT_HANDSHAKE_FAILURE") in exc
    assert client_errors and ("reason", "NO_RENEGOTIATION") in client_errors[0]
    assert [m for m, _ in logged] == ["Fatal error on SSL protocol"]


# -- the application's callbacks raising ------------------------------------------------------


class _Boom(Exception):
    pass


@pytest.mark.parametrize("where", ["connection_made", "data_received", "eof_received", "get_buffer",
                                   "buffer_updated", "pause_writing"])
@SSLPROTO_311
def test_application_callback_raising(loop, pki, where):
    """An exception from the application's protocol: the same report (the
    exception handler's message and exception) and the same end of the
    connection as on the stdlib loop."""

    def make_protocol():
        buffered = where in ("get_buffer", "buffer_updated")
        base = asyncio.BufferedProtocol if buffered else asyncio.Protocol

        class App(base):
            def __init__(self):
                self.lost = asyncio.get_running_loop().create_future()
                self.buf = bytearray(1024)

            def connection_made(self, transport):
                self.transport = transport
                if where == "connection_made":
                    raise _Boom("connection_made")
                transport.set_write_buffer_limits(high=0)  # every write pauses
                transport.write(b"hi")

            def data_received(self, data):
                if where == "data_received":
                    raise _Boom("data_received")

            def get_buffer(self, n):
                if where == "get_buffer":
                    raise _Boom("get_buffer")
                return self.buf

            def buffer_updated(self, n):
                if where == "buffer_updated":
                    raise _Boom("buffer_updated")

            def eof_received(self):
                if where == "eof_received":
                    raise _Boom("eof_received")

            def pause_writing(self):
                if where == "pause_writing":
                    raise _Boom("pause_writing")

            def connection_lost(self, exc):
                if not self.lost.done():
                    self.lost.set_result(exc)

        return App()

    async def scenario(loop):
        peers = []

        def factory():
            p = ManualTlsPeer(server_context(pki), True)
            peers.append(p)
            return p

        srv = await loop.create_server(factory, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        try:
            t, p = await asyncio.wait_for(
                loop.create_connection(make_protocol, "127.0.0.1", port, ssl=client_context(pki),
                                       server_hostname="localhost"),
                TIMEOUT,
            )
        except Exception as exc:
            result = ("raised", error_fields(exc))
        else:
            await wait_until(lambda: peers and peers[0].done.done())
            peers[0].send(b"data for the app")
            await asyncio.sleep(0.05)
            if where == "eof_received":
                peers[0].send_close_notify()
            try:
                exc = await asyncio.wait_for(p.lost, 1)
            except asyncio.TimeoutError:
                result = ("open", t.is_closing())
                t.abort()
            else:
                result = ("lost", error_fields(exc))
        await asyncio.sleep(0.05)
        for peer in peers:
            peer.transport.close()
        srv.close()
        await srv.wait_closed()
        return result

    result, logged, handled = assert_same_as_stdlib(loop, scenario)
    if where != "pause_writing":
        assert any(e and e[0] == "_Boom" for _, e in handled), handled
