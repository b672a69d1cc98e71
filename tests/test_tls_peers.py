"""TLS against real peers that nobody here wrote: OpenSSL's s_server and
s_client, nginx (as a server, and as a client proxying to the loop under
test), uvicorn serving https on the loop under test read by httpx, and
aiohttp serving https read by aiohttp's client, both on the loop under test.

Each test skips (saying why) where its program or package is missing.
Ports: the peers listen on port 0 and say which they got (s_server,
uvicorn, aiohttp), or bind one the kernel just gave out and retry (nginx).
"""

import asyncio
import gc
import hashlib
import re
import subprocess
import sys
import threading
import time

import pytest
from _support import TIMEOUT, RecordingProtocol, payload, run, wait_until
from _tls_support import (
    SSLPROTO_311,
    TLS12,
    KiB,
    MiB,
    assert_tls_path,
    client_context,
    require_binary,
    server_context,
    unused_port,
)

pytest.importorskip("cryptography")
from _tls_certs import make_pki  # noqa: E402


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


class Child:
    """A peer process whose output is collected by a thread (so a pipe never
    fills), with a way to wait for a line."""

    def __init__(self, args, stdin=subprocess.DEVNULL, env=None, cwd=None):
        self.proc = subprocess.Popen(args, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env=env, cwd=cwd)
        self.lines = []
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append(line.decode("utf-8", "replace"))
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def wait_for(self, pattern, timeout=20):
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for line in self.lines:
                    m = rx.search(line)
                    if m:
                        return m
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self.thread.is_alive()):
                    raise AssertionError(f"{pattern!r} not seen; output: {''.join(self.lines)[-2000:]}")
                self.cond.wait(min(left, 0.1))

    def output(self):
        return "".join(self.lines)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.thread.join(5)
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.stdout.close()


# -- openssl s_server / s_client ---------------------------------------------------------------


def _s_server(pki, *extra):
    openssl = require_binary("openssl")
    cert, key = pki.server
    child = Child([openssl, "s_server", "-accept", "127.0.0.1:0", "-cert", str(cert), "-key", str(key), "-rev",
                   *extra])
    port = int(child.wait_for(r"ACCEPT 127\.0\.0\.1:(\d+)").group(1))
    return child, port


@SSLPROTO_311
@pytest.mark.parametrize("flag,version", [("-tls1_2", "TLSv1.2"), ("-tls1_3", "TLSv1.3")])
def test_client_to_openssl_s_server(loop, pki, flag, version):
    child, port = _s_server(pki, flag, "-alpn", "h2,http/1.1")
    cctx = client_context(pki)
    cctx.set_alpn_protocols(["http/1.1"])

    async def main():
        t, p = await loop.create_connection(RecordingProtocol, "127.0.0.1", port, ssl=cctx,
                                            server_hostname="localhost")
        assert_tls_path(loop, t)
        obj = t.get_extra_info("ssl_object")
        assert obj.version() == version
        assert obj.selected_alpn_protocol() == "http/1.1"
        assert t.get_extra_info("peercert")["subject"] == ((("commonName", "localhost"),),)
        line = payload(6000, seed=31).hex().encode()  # one long line, many records
        t.write(line + b"\n")
        await p.received(len(line) + 1, 20)
        assert bytes(p.data) == line[::-1] + b"\n"
        t.write(b"CLOSE\n")  # s_server sends close_notify
        assert await asyncio.wait_for(p.lost, TIMEOUT) is None
        assert p.events[-2:] == ["eof", "lost"]

    try:
        run(loop, main(), 30)
    finally:
        child.stop()


def test_client_certificate_to_openssl_s_server(loop, pki):
    child, port = _s_server(pki, "-Verify", "1", "-CAfile", str(pki.ca), "-verify_return_error")

    async def main():
        t, p = await loop.create_connection(RecordingProtocol, "127.0.0.1", port,
                                            ssl=client_context(pki, cert="client"), server_hostname="localhost")
        assert_tls_path(loop, t)
        t.write(b"abc\n")
        await p.received(4)
        assert bytes(p.data) == b"cba\n"
        t.abort()

    try:
        run(loop, main(), 30)
        child.wait_for(r"zuvrs client")  # s_server prints the client's subject
    finally:
        child.stop()


@SSLPROTO_311
def test_client_closes_to_openssl_s_server(loop, pki):
    """Our close_notify: s_server answers with its own (it is a full TLS
    shutdown, not a reset), and our connection_lost is clean."""
    child, port = _s_server(pki)

    async def main():
        t, p = await loop.create_connection(RecordingProtocol, "127.0.0.1", port, ssl=client_context(pki),
                                            server_hostname="localhost")
        t.write(b"xy\n")
        await p.received(3)
        t.close()
        assert await asyncio.wait_for(p.lost, TIMEOUT) is None
        assert p.events == ["made", "data", "eof", "lost"]

    try:
        run(loop, main(), 30)
    finally:
        child.stop()


class _Server:
    """A TLS server on the loop under test whose connections greet, answer
    each line, and close on b"bye"."""

    def __init__(self):
        self.protocols = []

    def factory(self):
        server = self

        class Proto(RecordingProtocol):
            def connection_made(self, transport):
                super().connection_made(transport)
                server.protocols.append(self)
                transport.write(b"hello from the server\n")

            def data_received(self, data):
                super().data_received(data)
                if b"bye" in self.data:
                    self.transport.write(b"goodbye\n")
                    self.transport.close()
                elif self.data.endswith(b"\n"):
                    self.transport.write(b"got %d bytes\n" % len(self.data))

        return Proto()


def _s_client(pki, port, *extra, cert=None):
    openssl = require_binary("openssl")
    args = [openssl, "s_client", "-connect", f"127.0.0.1:{port}", "-servername", "localhost",
            "-CAfile", str(pki.ca), "-verify_return_error", "-verify_hostname", "localhost", *extra]
    if cert is not None:
        args += ["-cert", str(cert[0]), "-key", str(cert[1])]
    return Child(args, stdin=subprocess.PIPE)


@pytest.mark.parametrize("flag,version", [("-tls1_2", "TLSv1.2"), ("-tls1_3", "TLSv1.3")])
def test_openssl_s_client_to_server(loop, pki, flag, version):
    server = _Server()

    async def main():
        srv = await loop.create_server(server.factory, "127.0.0.1", 0, ssl=server_context(pki))
        port = srv.sockets[0].getsockname()[1]
        child = _s_client(pki, port, flag, "-quiet")
        try:
            await loop.run_in_executor(None, child.wait_for, r"hello from the server")
            await wait_until(lambda: server.protocols)
            p = server.protocols[0]
            assert_tls_path(loop, p.transport)
            assert p.transport.get_extra_info("ssl_object").version() == version
            child.proc.stdin.write(b"line one\n")
            child.proc.stdin.flush()
            await loop.run_in_executor(None, child.wait_for, r"got 9 bytes")
            child.proc.stdin.write(b"bye\n")
            child.proc.stdin.flush()
            await loop.run_in_executor(None, child.wait_for, r"goodbye")
            # Our close_notify makes s_client exit.
            rc = await loop.run_in_executor(None, child.proc.wait, 10)
            assert rc == 0, child.output()
            assert await asyncio.wait_for(p.lost, TIMEOUT) is None
        finally:
            child.stop()
        srv.close()
        await srv.wait_closed()

    run(loop, main(), 40)


@SSLPROTO_311
def test_openssl_s_client_closes_first(loop, pki):
    """s_client ends (stdin EOF with -no_ign_eof): its close_notify reaches
    the server's application as eof_received, then connection_lost(None)."""
    server = _Server()

    async def main():
        srv = await loop.create_server(server.factory, "127.0.0.1", 0, ssl=server_context(pki))
        port = srv.sockets[0].getsockname()[1]
        child = _s_client(pki, port, "-quiet", "-no_ign_eof")
        try:
            await loop.run_in_executor(None, child.wait_for, r"hello from the server")
            await wait_until(lambda: server.protocols)
            child.proc.stdin.close()
            child.proc.stdin = None
            p = server.protocols[0]
            assert await asyncio.wait_for(p.lost, TIMEOUT) is None
            assert p.events == ["made", "eof", "lost"]
        finally:
            child.stop()
        srv.close()
        await srv.wait_closed()

    run(loop, main(), 40)


def test_openssl_s_client_with_certificate_and_alpn(loop, pki):
    server = _Server()
    sctx = server_context(pki, verify_mode=__import__("ssl").CERT_REQUIRED)
    sctx.load_verify_locations(cafile=str(pki.ca))
    sctx.set_alpn_protocols(["x-zuvrs", "http/1.1"])

    async def main():
        srv = await loop.create_server(server.factory, "127.0.0.1", 0, ssl=sctx)
        port = srv.sockets[0].getsockname()[1]
        child = _s_client(pki, port, "-quiet", "-alpn", "x-zuvrs", cert=pki.client)
        try:
            await loop.run_in_executor(None, child.wait_for, r"hello from the server")
            await wait_until(lambda: server.protocols)
            t = server.protocols[0].transport
            assert_tls_path(loop, t)
            assert t.get_extra_info("peercert")["subject"] == ((("commonName", "zuvrs client"),),)
            assert t.get_extra_info("ssl_object").selected_alpn_protocol() == "x-zuvrs"
        finally:
            child.stop()
        srv.close()
        await srv.wait_closed()

    run(loop, main(), 40)


def _renegotiation_outcome(loop, pki):
    server = _Server()

    async def main():
        srv = await loop.create_server(server.factory, "127.0.0.1", 0, ssl=server_context(pki, version=TLS12))
        port = srv.sockets[0].getsockname()[1]
        child = _s_client(pki, port, "-tls1_2")
        try:
            await loop.run_in_executor(None, child.wait_for, r"hello from the server")
            await wait_until(lambda: server.protocols)
            child.proc.stdin.write(b"R\n")  # s_client's command: renegotiate
            child.proc.stdin.flush()
            p = server.protocols[0]
            exc = await asyncio.wait_for(p.lost, TIMEOUT)
            rc = await loop.run_in_executor(None, child.proc.wait, 10)
        finally:
            child.stop()
        srv.close()
        await srv.wait_closed()
        return p.events, type(exc).__name__, getattr(exc, "reason", None), rc

    return run(loop, main(), 40)


def test_openssl_s_client_renegotiation_refused_as_the_stdlib(loop, pki):
    """s_client asks for a TLS 1.2 renegotiation (its "R" command): OpenSSL
    3 refuses client-initiated renegotiation; what the server's application
    then sees is what it sees on the stdlib loop."""
    got = _renegotiation_outcome(loop, pki)
    ref_loop = asyncio.SelectorEventLoop()
    try:
        ref = _renegotiation_outcome(ref_loop, pki)
    finally:
        ref_loop.close()
    assert got == ref
    events, exc_type, reason, rc = got
    assert events == ["made", "lost"] and exc_type == "SSLError"


# -- nginx -------------------------------------------------------------------------------------

_NGINX_CONF = """\
daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log {d}/access.log;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    server {{
        listen 127.0.0.1:{tls_port} ssl;
        server_name localhost;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        ssl_protocols TLSv1.2 TLSv1.3;
        keepalive_requests 1000;
        location = /hello {{ default_type text/plain; return 200 "hello from nginx\\n"; }}
        location /files/ {{ alias {d}/files/; }}
        location = /echo {{ proxy_pass http://127.0.0.1:1; }}
    }}
    server {{
        listen 127.0.0.1:{plain_port};
        location / {{
            proxy_pass https://127.0.0.1:{upstream_port};
            proxy_ssl_server_name on;
            proxy_ssl_name localhost;
            proxy_ssl_verify on;
            proxy_ssl_trusted_certificate {ca};
            proxy_ssl_session_reuse on;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"""


@pytest.fixture
def nginx(pki, tmp_path):
    """nginx serving https (and proxying plain http to an https upstream
    on the loop under test, port given by the test), as a child of the test."""
    binary = require_binary("nginx")
    started = []

    def start(upstream_port=1):
        d = tmp_path / "nginx"
        (d / "files").mkdir(parents=True, exist_ok=True)
        for _attempt in range(5):
            tls_port, plain_port = unused_port(), unused_port()
            conf = d / "nginx.conf"
            conf.write_text(_NGINX_CONF.format(d=d, tls_port=tls_port, plain_port=plain_port,
                                               upstream_port=upstream_port, cert=pki.server[0], key=pki.server[1],
                                               ca=pki.ca))
            child = Child([binary, "-p", str(d), "-c", str(conf), "-e", str(d / "startup.log")])
            started.append(child)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and child.proc.poll() is None:
                try:
                    import socket

                    with socket.create_connection(("127.0.0.1", tls_port), timeout=0.2):
                        pass
                    with socket.create_connection(("127.0.0.1", plain_port), timeout=0.2):
                        pass
                    return d, tls_port, plain_port
                except OSError:
                    time.sleep(0.05)
            child.stop()
            log = (d / "error.log").read_text() if (d / "error.log").exists() else ""
            if "Address already in use" not in log:
                pytest.fail(f"nginx did not start: {child.output()} {log[-2000:]}")
        pytest.fail("nginx found no free port")

    yield start
    for child in started:
        child.stop()


async def _http_get(reader, writer, path):
    writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0]
    length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
    return status, await reader.readexactly(length)


def test_client_to_nginx(loop, pki, nginx):
    d, tls_port, _ = nginx()
    big = payload(3 * MiB + 7, seed=32)
    (d / "files" / "big.bin").write_bytes(big)

    async def main():
        for version in ("TLSv1.2", "TLSv1.3"):
            cctx = client_context(pki, version=getattr(__import__("ssl").TLSVersion, version.replace(".", "_")))
            reader, writer = await asyncio.open_connection("127.0.0.1", tls_port, ssl=cctx,
                                                          server_hostname="localhost")
            assert_tls_path(loop, writer.transport)
            assert writer.get_extra_info("ssl_object").version() == version
            for _ in range(20):  # keep-alive
                status, body = await _http_get(reader, writer, "/hello")
                assert status == b"HTTP/1.1 200 OK" and body == b"hello from nginx\n"
            status, body = await _http_get(reader, writer, "/files/big.bin")
            assert status == b"HTTP/1.1 200 OK"
            assert hashlib.sha256(body).digest() == hashlib.sha256(big).digest()
            writer.close()
            await writer.wait_closed()

    run(loop, main(), 60)


def test_nginx_proxies_to_our_tls_server(loop, pki, nginx):
    """nginx as the TLS client: plain HTTP into nginx, nginx over TLS (with
    verification, SNI and session reuse) to an HTTP server on the loop under
    test, reusing its upstream connections."""
    seen = []

    async def main():
        async def handler(reader, writer):
            seen.append(writer.transport)
            try:
                while True:
                    try:
                        head = await reader.readuntil(b"\r\n\r\n")
                    except asyncio.IncompleteReadError:
                        break
                    path = head.split(b" ", 2)[1]
                    body = b"upstream saw " + path + b" over " + writer.get_extra_info("ssl_object").version().encode()
                    if path == b"/big":
                        body = payload(MiB, seed=33)
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
                    await writer.drain()
            finally:
                writer.close()

        srv = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=server_context(pki))
        upstream = srv.sockets[0].getsockname()[1]
        _, _, plain_port = await loop.run_in_executor(None, nginx, upstream)
        reader, writer = await asyncio.open_connection("127.0.0.1", plain_port)
        for i in range(10):
            status, body = await _http_get(reader, writer, f"/r{i}")
            assert status == b"HTTP/1.1 200 OK", body
            assert body.startswith(b"upstream saw /r%d over TLSv1." % i)
        status, body = await _http_get(reader, writer, "/big")
        assert body == payload(MiB, seed=33)
        writer.close()
        await writer.wait_closed()
        assert seen
        for t in seen:
            assert_tls_path(loop, t)
        srv.close()
        await srv.wait_closed()

    run(loop, main(), 60)


# -- uvicorn and httpx -------------------------------------------------------------------------

_ASGI_APP = '''
import asyncio, gc, json

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["path"] == "/info":
        loop = asyncio.get_running_loop()
        paths = sorted({getattr(o, "_tls_path", None) for o in gc.get_objects()
                        if type(o).__name__ in ("SSLTransport", "_SSLProtocolTransport")}, key=str)
        body = json.dumps({"loop": type(loop).__module__ + "." + type(loop).__name__,
                           "scheme": scope["scheme"], "paths": paths}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/octet-stream")]})
    await send({"type": "http.response.body", "body": body})
'''


def test_uvicorn_https_read_by_httpx(loop_name, pki, tmp_path):
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    (tmp_path / "tlsapp.py").write_text(_ASGI_APP)
    loop_arg = "zuvrs:new_event_loop" if loop_name == "zuvrs" else "asyncio"
    child = Child([sys.executable, "-m", "uvicorn", "tlsapp:app", "--app-dir", str(tmp_path), "--loop", loop_arg,
                   "--host", "127.0.0.1", "--port", "0", "--ssl-certfile", str(pki.server[0]),
                   "--ssl-keyfile", str(pki.server[1]), "--log-level", "info"])
    try:
        port = int(child.wait_for(r"Uvicorn running on https://127\.0\.0\.1:(\d+)").group(1))
        data = payload(2 * MiB, seed=34)
        with httpx.Client(verify=client_context(pki), base_url=f"https://localhost:{port}", timeout=30) as client:
            for _ in range(5):
                r = client.post("/echo", content=b"ping")
                assert r.status_code == 200 and r.content == b"ping"
            r = client.post("/echo", content=data)
            assert hashlib.sha256(r.content).digest() == hashlib.sha256(data).digest()
            info = client.get("/info").json()
        assert info["scheme"] == "https"
        if loop_name == "zuvrs":
            assert info["loop"] == "zuvrs._loop.Loop"
            expected = "native" if sys.version_info >= (3, 11) else None
            if expected:
                assert info["paths"] == [expected]
        else:
            assert info["loop"].startswith("asyncio.")
    finally:
        child.stop()


# -- aiohttp -------------------------------------------------------------------------------------


def test_aiohttp_server_and_client(loop, pki):
    aiohttp = pytest.importorskip("aiohttp")
    from aiohttp import web

    big = payload(4 * MiB + 9, seed=35)

    async def main():
        transports = []

        async def hello(request):
            transports.append(request.transport)
            return web.Response(text="hello over " + request.transport.get_extra_info("ssl_object").version())

        async def echo(request):
            return web.Response(body=await request.read())

        async def stream(request):
            resp = web.StreamResponse()
            await resp.prepare(request)
            for i in range(0, len(big), 64 * KiB):
                await resp.write(big[i:i + 64 * KiB])
            await resp.write_eof()
            return resp

        app = web.Application(client_max_size=16 * MiB)
        app.router.add_get("/hello", hello)
        app.router.add_post("/echo", echo)
        app.router.add_get("/stream", stream)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_context(pki))
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            async with aiohttp.ClientSession() as session:
                for _ in range(10):
                    async with session.get(f"https://localhost:{port}/hello", ssl=client_context(pki)) as r:
                        assert r.status == 200
                        assert (await r.text()).startswith("hello over TLSv1.")
                # The client's pooled connection and the server's.
                live = [o for o in gc.get_objects()
                        if type(o).__name__ in ("SSLTransport", "_SSLProtocolTransport")
                        and getattr(o, "_loop", None) is loop and not o.is_closing()]
                assert len(live) >= 2
                for t in live:
                    assert_tls_path(loop, t)
                async with session.post(f"https://localhost:{port}/echo", data=big, ssl=client_context(pki)) as r:
                    assert hashlib.sha256(await r.read()).digest() == hashlib.sha256(big).digest()
                async with session.get(f"https://localhost:{port}/stream", ssl=client_context(pki)) as r:
                    got = bytearray()
                    async for chunk in r.content.iter_chunked(100 * KiB):
                        got += chunk
                    assert bytes(got) == big
            for t in transports:
                assert_tls_path(loop, t)
        finally:
            await runner.cleanup()

    run(loop, main(), 60)
