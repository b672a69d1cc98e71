"""The native TLS engine (`zuvrs._zuvrs._TlsEngine`) against stdlib SSLObjects.

Every connection is in memory: two `ssl.MemoryBIO` pairs and the bytes
shuttled between them. A "native" side is an SSLObject made by the stdlib
(`context.wrap_bio`) whose `SSL *` the engine drives; a "stdlib" side is a
plain SSLObject driven through its Python methods. Errors are compared field
by field with what a pure-stdlib pair raises in the same scenario.
"""

import gc
import os
import ssl
import struct
import sys

import pytest

zuvrs_native = pytest.importorskip("zuvrs._zuvrs")
Engine = zuvrs_native._TlsEngine

from _tls_certs import make_pki  # noqa: E402

pytest.importorskip("cryptography")

NATIVE, REASON = Engine.verdict()[:2]
pytestmark = pytest.mark.skipif(not NATIVE, reason=f"TLS engine not native here: {REASON}")

TLS12 = ssl.TLSVersion.TLSv1_2
TLS13 = ssl.TLSVersion.TLSv1_3


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def server_context(pki, cert="server", version=None, **kw):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(*getattr(pki, cert))
    if version is not None:
        ctx.minimum_version = ctx.maximum_version = version
    for k, v in kw.items():
        setattr(ctx, k, v)
    return ctx


def client_context(pki, version=None, cafile=None, **kw):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cafile=str(cafile or pki.ca))
    if version is not None:
        ctx.minimum_version = ctx.maximum_version = version
    for k, v in kw.items():
        setattr(ctx, k, v)
    return ctx


class StdSide:
    """An SSLObject driven through its Python methods (as asyncio's sslproto does)."""

    native = False

    def __init__(self, ctx, server_side, server_hostname=None, session=None):
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.sslobj = ctx.wrap_bio(
            self.incoming, self.outgoing, server_side=server_side,
            server_hostname=server_hostname, session=session,
        )

    def handshake(self):
        try:
            self.sslobj.do_handshake()
            return True
        except ssl.SSLWantReadError:
            return False

    def read(self, n=65536):
        try:
            return self.sslobj.read(n)
        except ssl.SSLWantReadError:
            return None

    def write(self, data):
        return self.sslobj.write(data)

    def shutdown(self):
        try:
            self.sslobj.unwrap()
            return "complete"
        except ssl.SSLWantReadError:
            return "sent"

    def feed(self, data):
        self.incoming.write(data)

    def feed_eof(self):
        self.incoming.write_eof()

    def take_output(self):
        return self.outgoing.read()


class NativeSide(StdSide):
    """The same objects, driven by the native engine."""

    native = True

    def __init__(self, ctx, server_side, server_hostname=None, session=None):
        super().__init__(ctx, server_side, server_hostname, session)
        self.engine = Engine.open(self.sslobj, self.incoming, self.outgoing)
        assert not isinstance(self.engine, str), self.engine

    def handshake(self):
        return self.engine.handshake()

    def read(self, n=65536):
        return self.engine.read(n)

    def write(self, data):
        return self.engine.write(data)

    def shutdown(self):
        return self.engine.shutdown()

    def feed(self, data):
        self.engine.feed(data)

    def feed_eof(self):
        self.engine.feed_eof()

    def take_output(self):
        # Alternate the two ways out, so both are exercised everywhere.
        if self.engine.output_len() % 2:
            return self.engine.take_output()
        data = self.engine.peek_output()
        self.engine.consume_output(len(data))
        return data


def pair(cctx, sctx, native=("client",), hostname="localhost", session=None):
    c = (NativeSide if "client" in native else StdSide)(cctx, False, hostname, session)
    s = (NativeSide if "server" in native else StdSide)(sctx, True)
    return c, s


def pump(a, b):
    moved = 0
    for src, dst in ((a, b), (b, a)):
        data = src.take_output()
        if data:
            dst.feed(data)
            moved += len(data)
    return moved


def drive_handshake(c, s, steps=30):
    """Runs both handshakes; returns ({side: done}, {side: exception})."""
    done, errors = {}, {}
    for _ in range(steps):
        for name, side in (("client", c), ("server", s)):
            if name in errors or done.get(name):
                continue
            try:
                done[name] = side.handshake()
            except Exception as e:  # noqa: BLE001 - compared by the caller
                errors[name] = e
        moved = pump(c, s)
        settled = all(done.get(n) or n in errors for n in ("client", "server"))
        if settled and not moved:
            break
    return done, errors


def handshake(c, s):
    done, errors = drive_handshake(c, s)
    assert not errors, errors
    assert done == {"client": True, "server": True}


def read_all(side, want):
    got = bytearray()
    while len(got) < want:
        chunk = side.read()
        if not chunk:
            break
        got += chunk
    return bytes(got)


def fields(e):
    if e is None:
        return None
    return {
        "type": type(e).__name__,
        "args": e.args,
        "str": str(e),
        "reason": getattr(e, "reason", None),
        "library": getattr(e, "library", None),
        "verify_code": getattr(e, "verify_code", None),
        "verify_message": getattr(e, "verify_message", None),
        "errno": getattr(e, "errno", None),
        "context": type(e.__context__).__name__ if e.__context__ is not None else None,
    }


def records(data):
    """The (type, length) of each TLS record in `data`."""
    out, i = [], 0
    while i + 5 <= len(data):
        t, _, n = struct.unpack("!BHH", data[i:i + 5])
        out.append((t, n))
        i += 5 + n
    assert i == len(data)
    return out


# -- the verdict ------------------------------------------------------------


def test_verdict_names_the_library_ssl_uses():
    import _ssl

    native, reason, bio_seek, names = Engine.verdict()
    assert native
    assert _ssl.__file__ in reason and ssl.OPENSSL_VERSION in reason
    assert hex(ssl.OPENSSL_VERSION_NUMBER) in reason
    assert {"SSL_read_ex", "SSL_write_ex", "SSL_do_handshake", "SSL_shutdown", "BIO_write"} <= set(names)
    assert isinstance(bio_seek, bool)
    if sys.platform.startswith("linux"):
        # Every libssl / libcrypto mapped into the process is one the verdict names.
        with open("/proc/self/maps") as f:
            mapped = {line.split()[-1] for line in f if "libssl" in line or "libcrypto" in line}
        named = reason.split(" to ", 1)[1].rsplit(" (", 1)[0].split(", ")
        assert {os.path.realpath(p) for p in mapped} <= {os.path.realpath(p) for p in named}


def test_zuvrs_does_not_link_openssl():
    """zuvrs calls OpenSSL through `_ssl`'s own libraries, never a copy of its own."""
    path = zuvrs_native.__file__
    with open(path, "rb") as f:
        blob = f.read()
    assert b"libssl.so" not in blob and b"libcrypto.so" not in blob


# -- handshakes and data ----------------------------------------------------


@pytest.mark.parametrize("version", [TLS12, TLS13], ids=["tls1.2", "tls1.3"])
@pytest.mark.parametrize("native", [("client",), ("server",), ("client", "server")], ids=["client", "server", "both"])
def test_handshake_and_data(pki, version, native):
    c, s = pair(client_context(pki, version), server_context(pki, version=version), native)
    handshake(c, s)
    assert c.sslobj.version() == s.sslobj.version() == {TLS12: "TLSv1.2", TLS13: "TLSv1.3"}[version]
    for a, b in ((c, s), (s, c)):
        for size in (1, 1000, 16384, 100_000):
            payload = os.urandom(size)
            assert a.write(payload) == size
            pump(a, b)
            assert read_all(b, size) == payload
        assert b.read() is None  # nothing more: wants the peer


@pytest.mark.parametrize("version", [TLS12, TLS13], ids=["tls1.2", "tls1.3"])
def test_extra_info_after_native_handshake(pki, version):
    """What get_extra_info serves (the SSLObject's own methods) after a native handshake."""
    results = []
    for native in ((), ("client", "server")):
        sctx = server_context(pki, version=version, verify_mode=ssl.CERT_REQUIRED)
        sctx.load_verify_locations(cafile=str(pki.ca))
        sctx.set_alpn_protocols(["h2", "http/1.1"])
        cctx = client_context(pki, version)
        cctx.load_cert_chain(*pki.client)
        cctx.set_alpn_protocols(["h2"])
        c, s = pair(cctx, sctx, native)
        handshake(c, s)
        info = {}
        for name, side in (("client", c), ("server", s)):
            o = side.sslobj
            info[name] = {
                "peercert": o.getpeercert(),
                "peercert_der_len": len(o.getpeercert(True)),
                "cipher": o.cipher(),
                "compression": o.compression(),
                "version": o.version(),
                "alpn": o.selected_alpn_protocol(),
                "shared_ciphers": o.shared_ciphers(),
                "server_side": o.server_side,
                "server_hostname": o.server_hostname,
                "pending": o.pending(),
            }
            cb = o.get_channel_binding("tls-unique")
            info[name]["channel_binding"] = None if cb is None else len(cb)
        if version == TLS12:
            assert c.sslobj.get_channel_binding() == s.sslobj.get_channel_binding()
        results.append(info)
    assert results[0] == results[1]
    assert results[1]["client"]["alpn"] == "h2"
    assert dict(x[0] for x in results[1]["server"]["peercert"]["subject"])["commonName"] == "zuvrs client"


def test_client_certificate_required_and_missing(pki):
    sctx = server_context(pki, version=TLS12, verify_mode=ssl.CERT_REQUIRED)
    sctx.load_verify_locations(cafile=str(pki.ca))
    outcomes = []
    for native in ((), ("server",), ("client", "server")):
        c, s = pair(client_context(pki, TLS12), sctx, native)  # no client certificate
        done, errors = drive_handshake(c, s)
        outcomes.append({k: fields(v) for k, v in errors.items()})
    assert "server" in outcomes[0]
    assert outcomes[0] == outcomes[1] == outcomes[2]


def test_alpn(pki):
    sctx = server_context(pki)
    sctx.set_alpn_protocols(["http/1.1", "h2"])
    cctx = client_context(pki)
    cctx.set_alpn_protocols(["h2", "http/1.1"])
    c, s = pair(cctx, sctx, ("client", "server"))
    handshake(c, s)
    assert c.sslobj.selected_alpn_protocol() == s.sslobj.selected_alpn_protocol() == "http/1.1"


def test_sni_callback_switches_context(pki):
    alt = server_context(pki, cert="alt_server")
    seen = []

    def sni(sslobj, name, ctx):
        seen.append((type(sslobj).__name__, name))
        if name == "alt.example":
            sslobj.context = alt

    sctx = server_context(pki)
    sctx.sni_callback = sni
    c, s = pair(client_context(pki), sctx, ("client", "server"), hostname="alt.example")
    handshake(c, s)
    assert seen == [("SSLObject", "alt.example")]
    assert s.sslobj.context is alt
    assert dict(x[0] for x in c.sslobj.getpeercert()["subject"])["commonName"] == "alt.example"


def test_sni_callback_error_parity(pki):
    def sni(sslobj, name, ctx):
        return ssl.ALERT_DESCRIPTION_ACCESS_DENIED

    outcomes = []
    for native in ((), ("client", "server")):
        sctx = server_context(pki)
        sctx.sni_callback = sni
        c, s = pair(client_context(pki), sctx, native)
        outcomes.append({k: fields(v) for k, v in drive_handshake(c, s)[1].items()})
    assert set(outcomes[0]) == {"client", "server"}
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("version", [TLS12, TLS13], ids=["tls1.2", "tls1.3"])
def test_session_reuse(pki, version):
    sctx = server_context(pki, version=version)
    cctx = client_context(pki, version)
    c, s = pair(cctx, sctx, ("client", "server"))
    handshake(c, s)
    s.write(b"hello")  # TLS 1.3 tickets arrive after the handshake: read them
    pump(c, s)
    assert c.read() == b"hello"
    session = c.sslobj.session
    assert session is not None and not c.sslobj.session_reused
    c2, s2 = pair(cctx, sctx, ("client", "server"), session=session)
    handshake(c2, s2)
    assert c2.sslobj.session_reused and s2.sslobj.session_reused


@pytest.mark.parametrize("version", [TLS12, TLS13], ids=["tls1.2", "tls1.3"])
def test_keylog_written(pki, tmp_path, version):
    path = tmp_path / "keys.log"
    cctx = client_context(pki, version)
    cctx.keylog_filename = str(path)
    c, s = pair(cctx, server_context(pki, version=version), ("client",))
    handshake(c, s)
    text = path.read_text()
    assert ("CLIENT_RANDOM" if version == TLS12 else "CLIENT_HANDSHAKE_TRAFFIC_SECRET") in text


def test_msg_callback_runs_and_its_error_is_raised_like_the_stdlib(pki):
    calls = []

    def quiet(conn, direction, version, content_type, msg_type, data):
        calls.append((direction, msg_type))

    cctx = client_context(pki)
    cctx._msg_callback = quiet
    c, s = pair(cctx, server_context(pki), ("client",))
    handshake(c, s)
    assert ("write", ssl._TLSMessageType.CLIENT_HELLO) in calls

    def failing(conn, direction, version, content_type, msg_type, data):
        raise ValueError("from msg_callback")

    outcomes = []
    for native in ((), ("client",)):
        cctx = client_context(pki)
        cctx._msg_callback = failing
        c, s = pair(cctx, server_context(pki), native)
        done, errors = drive_handshake(c, s)
        e = errors.get("client")
        outcomes.append((done, fields(e), c.sslobj.version()))
    assert outcomes[0][1]["type"] == "ValueError"
    assert outcomes[0] == outcomes[1]


def test_post_handshake_auth(pki):
    sctx = server_context(pki, version=TLS13, verify_mode=ssl.CERT_REQUIRED, post_handshake_auth=True)
    sctx.load_verify_locations(cafile=str(pki.ca))
    cctx = client_context(pki, TLS13, post_handshake_auth=True)
    cctx.load_cert_chain(*pki.client)
    c, s = pair(cctx, sctx, ("server",))
    handshake(c, s)
    assert s.sslobj.getpeercert() is None  # not asked for during the handshake
    s.sslobj.verify_client_post_handshake()
    assert s.handshake()  # sends the CertificateRequest
    pump(c, s)
    assert c.read() is None  # the client answers with its certificate
    pump(c, s)
    assert s.read() is None
    assert dict(x[0] for x in s.sslobj.getpeercert()["subject"])["commonName"] == "zuvrs client"


def test_large_and_small_writes_coalesce(pki):
    c, s = pair(client_context(pki), server_context(pki), ("client",))
    handshake(c, s)
    eng = c.engine
    small = [bytes([i % 256]) * 10 for i in range(1000)]  # 10,000 bytes
    assert eng.write_many(small) == (10_000, False)
    out = eng.take_output()
    assert [t for t, _ in records(out)] == [23]  # one application-data record
    s.feed(out)
    assert read_all(s, 10_000) == b"".join(small)

    pieces = [os.urandom(1000) for _ in range(100)] + [os.urandom(200_000)] + [b"x"] * 3
    total = sum(map(len, pieces))
    assert eng.write_many(pieces) == (total, False)
    out = eng.take_output()
    lengths = [n for t, n in records(out)]
    assert len(lengths) <= total // 16384 + 3  # full records, not one per piece
    s.feed(out)
    assert read_all(s, total) == b"".join(pieces)

    big = os.urandom(4 * 1024 * 1024)
    assert eng.write(big) == len(big)
    pump(c, s)
    assert read_all(s, len(big)) == big


def test_write_before_handshake_wants_read(pki):
    c, s = pair(client_context(pki), server_context(pki), ("client",))
    assert c.engine.write(b"early") is None
    assert c.engine.write_many([b"a", b"b"]) == (0, True)
    handshake(c, s)
    assert c.engine.write(b"now") == 3


def test_read_into_buffer(pki):
    c, s = pair(client_context(pki), server_context(pki), ("client",))
    handshake(c, s)
    s.write(b"0123456789")
    pump(c, s)
    buf = bytearray(4)
    assert c.engine.read_into(buf) == 4 and buf == b"0123"
    assert c.engine.pending() == 6 and c.engine.has_pending()
    big = memoryview(bytearray(100))
    assert c.engine.read_into(big[10:]) == 6 and bytes(big[10:16]) == b"456789"
    assert c.engine.read_into(bytearray(10)) is None
    with pytest.raises(ValueError):
        c.engine.read_into(b"readonly")


def test_output_view_and_take_agree(pki):
    c, s = pair(client_context(pki), server_context(pki), ("client",))
    handshake(c, s)
    c.engine.write(b"a" * 3000)
    n = c.engine.output_len()
    view = c.engine.peek_output()
    assert len(view) == n
    c.engine.consume_output(100)
    rest = c.engine.take_output()
    assert view[100:] == rest and c.engine.output_len() == 0
    s.feed(view)
    assert read_all(s, 3000) == b"a" * 3000


# -- closing ----------------------------------------------------------------


@pytest.mark.parametrize("native", [("client",), ("server",)], ids=["native-client", "native-server"])
def test_close_notify_both_ways(pki, native):
    c, s = pair(client_context(pki), server_context(pki), native)
    handshake(c, s)
    nat, std = (c, s) if "client" in native else (s, c)
    # native first
    assert nat.shutdown() == "sent"
    assert nat.engine.shutdown_state() == (True, False)
    pump(c, s)
    assert std.read() == b""  # close_notify, as b""
    assert std.shutdown() == "complete"
    pump(c, s)
    assert nat.shutdown() == "complete"
    assert nat.engine.shutdown_state() == (True, True)

    # stdlib first
    c, s = pair(client_context(pki), server_context(pki), native)
    handshake(c, s)
    nat, std = (c, s) if "client" in native else (s, c)
    std.write(b"last words")
    assert std.shutdown() == "sent"
    pump(c, s)
    assert nat.read() == b"last words"
    assert nat.read() == b""  # Closed
    assert nat.engine.shutdown_state() == (False, True)
    assert nat.shutdown() == "complete"
    pump(c, s)
    assert std.shutdown() == "complete"


@pytest.mark.parametrize("version", [TLS12, TLS13], ids=["tls1.2", "tls1.3"])
def test_data_after_our_close_notify(pki, version):
    """We sent close_notify; the peer still sends data, then its close_notify.

    OpenSSL 3's SSL_shutdown (the stdlib's unwrap()) fails on that data with
    APPLICATION_DATA_AFTER_CLOSE_NOTIFY (asyncio's sslproto reports it as a
    fatal error), and the connection is broken after it; SSL_read still
    returns it, and the shutdown then completes. Native and stdlib alike.
    """
    outcomes = []
    for native, use_read in (((), False), (("client",), False), ((), True), (("client",), True)):
        c, s = pair(client_context(pki, version), server_context(pki, version=version), native)
        handshake(c, s)
        assert c.shutdown() == "sent"
        s.write(b"late data")  # sent before the server saw our close_notify
        pump(c, s)
        got = []
        if use_read:
            got.append(c.read())
        try:
            got.append(c.shutdown())
        except ssl.SSLError as e:
            got.append(fields(e))
        assert s.read() == b""
        assert s.shutdown() == "complete"
        pump(c, s)
        try:
            got.append(c.shutdown())
        except ssl.SSLError as e:
            got.append(fields(e))
        outcomes.append(got)
    assert outcomes[0] == outcomes[1]
    assert outcomes[2] == outcomes[3]
    assert outcomes[0][0]["reason"] == "APPLICATION_DATA_AFTER_CLOSE_NOTIFY"
    assert outcomes[0][1]["reason"] == "SHUTDOWN_WHILE_IN_INIT"
    assert outcomes[2] == [b"late data", "sent", "complete"]


def test_data_after_peer_close_notify(pki):
    c, s = pair(client_context(pki), server_context(pki), ("client",))
    handshake(c, s)
    assert s.shutdown() == "sent"
    pump(c, s)
    c.feed(b"\x17\x03\x03\x00\x05junk!")  # anything after close_notify is left unread
    assert c.read() == b""
    assert c.read() == b""
    assert c.engine.incoming_len() == 10


@pytest.mark.parametrize("ignore_eof", [False, True], ids=["strict", "OP_IGNORE_UNEXPECTED_EOF"])
def test_unexpected_eof_parity(pki, ignore_eof):
    outcomes = []
    for native in ((), ("client",)):
        cctx = client_context(pki)
        if ignore_eof:
            cctx.options |= ssl.OP_IGNORE_UNEXPECTED_EOF
        c, s = pair(cctx, server_context(pki), native)
        handshake(c, s)
        s.write(b"partial")
        out = s.take_output()
        c.feed(out[:-3])  # a truncated record, then the connection ends
        c.feed_eof()
        try:
            outcomes.append(("read", c.read()))
        except ssl.SSLError as e:
            outcomes.append(fields(e))
    if ignore_eof:
        assert outcomes[0] == ("read", b"")  # taken as a close
    else:
        assert outcomes[0]["type"] == "SSLEOFError"
    assert outcomes[0] == outcomes[1]


def test_eof_during_handshake_parity(pki):
    outcomes = []
    for native in ((), ("client",), ("server",)):
        c, s = pair(client_context(pki), server_context(pki), native)
        side = c if "client" in native or not native else s
        if side is s:
            c.handshake()
            s.feed(c.take_output()[:20])
        else:
            c.handshake()
        side.feed_eof()
        try:
            side.handshake()
            outcomes.append(("no error", side is c))
        except ssl.SSLError as e:
            outcomes.append((fields(e), side is c))
    assert outcomes[0][0]["type"] == "SSLEOFError"
    assert outcomes[0] == outcomes[1]
    # the server side, against a stdlib server fed the same
    c, s = pair(client_context(pki), server_context(pki), ())
    c.handshake()
    s.feed(c.take_output()[:20])
    s.feed_eof()
    with pytest.raises(ssl.SSLError) as std:
        s.handshake()
    assert outcomes[2] == (fields(std.value), False)


def test_feed_after_eof_is_the_stdlibs_error(pki):
    c, s = pair(client_context(pki), server_context(pki), ("client",))
    c.feed_eof()
    with pytest.raises(ssl.SSLError) as native:
        c.feed(b"x")
    with pytest.raises(ssl.SSLError) as std:
        s.feed_eof()
        s.incoming.write(b"x")
    assert fields(native.value) == fields(std.value)
    assert c.incoming.eof


@pytest.mark.parametrize(
    "garbage", [b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x16\x03\x01\x00\x05hello", os.urandom(64)],
    ids=["http", "bad-hello", "random"],
)
def test_garbage_instead_of_client_hello(pki, garbage):
    outcomes = []
    for cls in (StdSide, NativeSide):
        s = cls(server_context(pki), True)
        s.feed(garbage)
        try:
            outcomes.append(("done", s.handshake()))
        except ssl.SSLError as e:
            outcomes.append(fields(e))
        outcomes[-1] = (outcomes[-1], s.take_output())
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("case", ["expired", "wrong_host", "unknown_ca", "ip_mismatch"])
@pytest.mark.parametrize("version", [TLS12, TLS13], ids=["tls1.2", "tls1.3"])
def test_verification_failures_match_the_stdlib(pki, case, version):
    certs = {"expired": "expired", "wrong_host": "wrong_host", "unknown_ca": "unknown_ca", "ip_mismatch": "wrong_host"}
    cert = certs[case]
    host = "127.0.0.2" if case == "ip_mismatch" else "localhost"
    outcomes = []
    for native in ((), ("client",), ("server",), ("client", "server")):
        server = server_context(pki, cert=cert, version=version)
        c, s = pair(client_context(pki, version), server, native, hostname=host)
        done, errors = drive_handshake(c, s)
        outcomes.append({k: fields(v) for k, v in errors.items()})
    client_error = outcomes[0]["client"]
    assert client_error["type"] == "SSLCertVerificationError"
    assert client_error["verify_code"] == {
        "expired": 10, "wrong_host": 62, "unknown_ca": 20, "ip_mismatch": 64}[case]
    for o in outcomes[1:]:
        assert o == outcomes[0]


# -- what is not driven natively --------------------------------------------


def test_sslobject_subclasses(pki):
    class Plain(ssl.SSLObject):
        pass

    class Overriding(ssl.SSLObject):
        def do_handshake(self):  # e.g. truststore verifies here
            return super().do_handshake()

    class PlainContext(ssl.SSLContext):
        pass

    for cls, native in ((Plain, True), (Overriding, False)):
        ctx = client_context(pki)
        ctx.sslobject_class = cls
        inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
        obj = ctx.wrap_bio(inc, out, server_hostname="localhost")
        got = Engine.open(obj, inc, out)
        assert isinstance(got, str) != native, got
        if not native:
            assert "overrides SSLObject.do_handshake" in got

    original = ssl.SSLObject.read
    try:
        ssl.SSLObject.read = lambda self, *a: original(self, *a)  # patched after first use
        ctx = client_context(pki)
        inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
        got = Engine.open(ctx.wrap_bio(inc, out, server_hostname="localhost"), inc, out)
        assert "overrides SSLObject.read" in got
    finally:
        ssl.SSLObject.read = original

    class WrappingContext(ssl.SSLContext):
        def wrap_bio(self, *a, **kw):
            return super().wrap_bio(*a, **kw)

    for ctx_cls in (PlainContext, WrappingContext):
        ctx = ctx_cls(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(cafile=str(pki.ca))
        inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
        obj = ctx.wrap_bio(inc, out, server_hostname="localhost")
        assert not isinstance(Engine.open(obj, inc, out), str)
        s = StdSide(server_context(pki), True)
        e = Engine.open(obj, inc, out)
        c = NativeSide.__new__(NativeSide)
        c.incoming, c.outgoing, c.sslobj, c.engine = inc, out, obj, e
        handshake(c, s)


def test_not_native_for_foreign_objects(pki):
    ctx = client_context(pki)
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_hostname="localhost")
    assert "MemoryBIOs given" in Engine.open(obj, ssl.MemoryBIO(), out)
    assert "MemoryBIOs given" in Engine.open(obj, out, inc)
    assert "no _sslobj" in Engine.open(object(), inc, out)

    class Fake:
        _sslobj = object()

    assert isinstance(Engine.open(Fake(), inc, out), str)


# -- renegotiation and key updates -------------------------------------------


def test_server_renegotiation_tls12(pki):
    """A TLS 1.2 server asks for renegotiation; a stdlib client (OpenSSL 3 defaults) goes along,
    inside its read() calls; data flows on."""
    hellos = []

    def record(conn, direction, version, content_type, msg_type, data):
        if direction == "write" and msg_type == ssl._TLSMessageType.CLIENT_HELLO:
            hellos.append(1)

    cctx = client_context(pki, TLS12)
    cctx._msg_callback = record
    c, s = pair(cctx, server_context(pki, version=TLS12), ("server",))
    handshake(c, s)
    assert s.engine._renegotiate() is True  # HelloRequest out; the server does not wait
    pump(c, s)
    assert c.read() is None  # the client answers with a new ClientHello
    for _ in range(4):
        pump(c, s)
        assert s.read() is None
        assert c.read() is None
    assert len(hellos) == 2
    s.write(b"after")
    c.write(b"too")
    pump(c, s)
    assert c.read() == b"after" and s.read() == b"too"


def test_client_renegotiation_refused_tls12(pki):
    """OpenSSL 3 servers refuse client-initiated renegotiation unless allowed."""
    outcomes = []
    c, s = pair(client_context(pki, TLS12), server_context(pki, version=TLS12), ("client",))
    handshake(c, s)
    assert c.engine._renegotiate() is False
    pump(c, s)
    for side in (s, c, s, c):
        try:
            outcomes.append(side.read())
        except ssl.SSLError as e:
            outcomes.append(fields(e))
        pump(c, s)
    errors = [o for o in outcomes if isinstance(o, dict)]
    assert errors and errors[0]["reason"] == "NO_RENEGOTIATION", outcomes


def test_renegotiation_is_not_tls13(pki):
    c, s = pair(client_context(pki, TLS13), server_context(pki, version=TLS13), ("client",))
    handshake(c, s)
    with pytest.raises(ssl.SSLError) as e:
        c.engine._renegotiate()
    assert e.value.reason == "WRONG_SSL_VERSION"


def test_key_update_tls13(pki):
    c, s = pair(client_context(pki, TLS13), server_context(pki, version=TLS13), ("client",))
    handshake(c, s)
    c.engine._key_update()
    c.write(b"ping")
    pump(c, s)
    assert s.read() == b"ping"  # the server updates its keys too
    s.write(b"pong")
    pump(c, s)
    assert c.read() == b"pong"


# -- resources ----------------------------------------------------------------


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_sessions_do_not_leak(pki):
    cctx = client_context(pki)

    def churn(n):
        for _ in range(n):
            inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
            obj = cctx.wrap_bio(inc, out, server_hostname="localhost")
            eng = Engine.open(obj, inc, out)
            eng.handshake()  # a ClientHello out
            eng.take_output()
            del eng, obj, inc, out

    churn(1000)
    gc.collect()
    objects, rss = len(gc.get_objects()), _rss()
    churn(10_000)
    gc.collect()
    assert len(gc.get_objects()) - objects < 100
    assert _rss() - rss < 8 * 1024 * 1024
