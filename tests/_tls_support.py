"""Helpers shared by the TLS transport tests (tests/test_tls_*.py).

- contexts on the PKI of ``_tls_certs`` (CA, server, client, expired,
  wrong-host and unknown-CA certificates);
- ``assert_tls_path``: on zuvrs, the connection took the native path
  (3.11+; 3.10 falls back to asyncio's sslproto by design);
- ``TlsPair``: a TLS server and one client connection on the loop under test;
- ``ManualTlsPeer``: a peer that drives a stdlib ``SSLObject`` by hand over a
  plain TCP protocol, so a test can make it misbehave (never answer
  close_notify, send data after it, stop mid-handshake, ...);
- ``error_fields``: what of an exception must be the same on both loops.
"""

import asyncio
import os
import shutil
import socket
import ssl
import sys

import pytest
from _support import TIMEOUT, RecordingProtocol, wait_until

NATIVE_EXPECTED = sys.version_info >= (3, 11)

TLS12 = ssl.TLSVersion.TLSv1_2
TLS13 = ssl.TLSVersion.TLSv1_3
VERSIONS = {"TLSv1.2": TLS12, "TLSv1.3": TLS13}

KiB = 1024
MiB = 1024 * KiB


def server_context(pki, cert="server", version=None, **attrs):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(*(str(p) for p in getattr(pki, cert)))
    if version is not None:
        ctx.minimum_version = ctx.maximum_version = version
    for k, v in attrs.items():
        setattr(ctx, k, v)
    return ctx


def client_context(pki, version=None, cafile=None, cert=None, **attrs):
    """A verifying client context (CERT_REQUIRED, check_hostname) trusting
    the test CA; `cert` names a client certificate of the PKI."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cafile=str(cafile or pki.ca))
    if cert is not None:
        ctx.load_cert_chain(*(str(p) for p in getattr(pki, cert)))
    if version is not None:
        ctx.minimum_version = ctx.maximum_version = version
    for k, v in attrs.items():
        setattr(ctx, k, v)
    return ctx


def is_zuvrs(loop):
    return type(loop).__module__.startswith("zuvrs")


def assert_tls_path(loop, transport):
    """On zuvrs, the TLS transport is the native one from 3.11 on (asyncio's
    sslproto on 3.10, by design). Nothing to check on the stdlib loop."""
    if not is_zuvrs(loop):
        assert not hasattr(transport, "_tls_path")
        return
    path = getattr(transport, "_tls_path", None)
    if NATIVE_EXPECTED:
        assert path == "native", f"TLS took {path!r}"
    else:
        assert path is not None and path.startswith("sslproto"), path


def unused_port(host="127.0.0.1"):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def listening_socket(host="127.0.0.1"):
    """A bound, listening socket on a free port (nothing races for it)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, 0))
    s.listen(100)
    return s


def require_binary(name):
    # Debian installs servers (nginx) in sbin, which a user's PATH may lack.
    path = shutil.which(name) or shutil.which(name, path="/usr/local/sbin:/usr/sbin:/sbin")
    if path is None:
        pytest.skip(f"{name} is not installed")
    return path


def error_fields(exc):
    """What of an exception the stdlib fixes: type, args, str, and the
    SSLError / SSLCertVerificationError attributes."""
    if exc is None:
        return None
    if isinstance(exc, type):
        return (exc.__name__,)
    fields = [type(exc).__name__, exc.args, str(exc)]
    for name in ("reason", "library", "verify_code", "verify_message", "errno", "strerror"):
        fields.append((name, getattr(exc, name, None)))
    return tuple(fields)


class TlsPair:
    """A TLS server on the loop under test and one client connection to it."""

    def __init__(self):
        self.srv = None
        self.port = None
        self.accepted = []
        self.client = None
        self.client_transport = None

    @property
    def server(self):
        return self.accepted[0]

    @classmethod
    async def open(cls, server_ctx, client_ctx, server_factory=RecordingProtocol,
                   client_factory=RecordingProtocol, *, server_hostname="localhost",
                   server_kwargs=None, client_kwargs=None):
        loop = asyncio.get_running_loop()
        self = cls()

        def factory():
            proto = server_factory()
            self.accepted.append(proto)
            return proto

        self.srv = await loop.create_server(factory, "127.0.0.1", 0, ssl=server_ctx, **(server_kwargs or {}))
        self.port = self.srv.sockets[0].getsockname()[1]
        self.client_transport, self.client = await asyncio.wait_for(
            loop.create_connection(
                client_factory, "127.0.0.1", self.port, ssl=client_ctx, server_hostname=server_hostname,
                **(client_kwargs or {}),
            ),
            TIMEOUT,
        )
        await wait_until(lambda: self.accepted and getattr(self.accepted[0], "transport", None) is not None)
        return self

    async def aclose(self):
        for proto in (self.client, *self.accepted):
            t = getattr(proto, "transport", None)
            lost = getattr(proto, "lost", None)
            if t is not None and not (lost is not None and lost.done()):
                t.abort()
        self.srv.close()
        await asyncio.wait_for(self.srv.wait_closed(), TIMEOUT)
        for _ in range(3):
            await asyncio.sleep(0)


class ManualTlsPeer(asyncio.Protocol):
    """One end of a TLS connection driven by hand: a stdlib SSLObject over
    MemoryBIOs on a plain TCP transport.

    ``answer_close_notify``: answer the other side's close_notify with ours
    (what a well-behaved peer does). ``handshake_limit``: stop feeding the
    handshake after this many bytes from the other side (a peer that never
    finishes). Decrypted data collects in ``data``; ``done`` resolves when
    the handshake completes, ``close_notify`` when the other side's arrives,
    ``lost`` with connection_lost's argument.
    """

    def __init__(self, ctx, server_side, server_hostname=None, *, answer_close_notify=True,
                 start_handshake=True):
        loop = asyncio.get_running_loop()
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.sslobj = ctx.wrap_bio(self.incoming, self.outgoing, server_side=server_side,
                                   server_hostname=server_hostname)
        self.answer_close_notify = answer_close_notify
        self.start_handshake = start_handshake
        self.transport = None
        self.data = bytearray()
        self.raw = bytearray()  # every byte received
        self.done = loop.create_future()
        self.close_notify = loop.create_future()
        self.lost = loop.create_future()
        self.errors = []
        self.ignore_input = False
        # The first `plain_expected` bytes received are plaintext (a STARTTLS
        # answer): they go to `plain`, not to TLS.
        self.plain_expected = 0
        self.plain = bytearray()

    def connection_made(self, transport):
        self.transport = transport
        if self.start_handshake:
            self._step()

    def _flush(self):
        out = self.outgoing.read()
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(out)

    def _step(self):
        if not self.done.done():
            try:
                self.sslobj.do_handshake()
            except ssl.SSLWantReadError:
                self._flush()
                return
            except ssl.SSLError as exc:
                self.errors.append(exc)
                self._flush()
                self.done.set_exception(exc)
                return
            self._flush()
            self.done.set_result(None)
        while True:
            try:
                chunk = self.sslobj.read(256 * 1024)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                chunk = b""
            except ssl.SSLError as exc:
                self.errors.append(exc)
                break
            if not chunk:
                if not self.close_notify.done():
                    self.close_notify.set_result(None)
                    if self.answer_close_notify:
                        self.send_close_notify()
                break
            self.data += chunk
        self._flush()

    def data_received(self, data):
        self.raw += data
        if self.plain_expected:
            k = min(self.plain_expected, len(data))
            self.plain += data[:k]
            self.plain_expected -= k
            data = data[k:]
        if self.ignore_input or not data:
            return
        self.incoming.write(data)
        self._step()

    def eof_received(self):
        return True  # keep our side open (tests close it)

    def connection_lost(self, exc):
        if not self.lost.done():
            self.lost.set_result(exc)

    def send(self, data):
        self.sslobj.write(data)
        self._flush()

    def send_close_notify(self):
        try:
            self.sslobj.unwrap()
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLError as exc:
            self.errors.append(exc)
        self._flush()


def fd_count():
    return len(os.listdir("/proc/self/fd"))


# asyncio's sslproto was rewritten in 3.11; zuvrs's native TLS follows the
# new one. On 3.10 both loops run 3.10's sslproto, which behaves otherwise
# (reports, flow control, shutdown, the timeouts' errors) on the stdlib loop
# too: the tests that assert 3.11+'s behaviour carry this mark, the others
# run on 3.10 as parity tests of zuvrs's sslproto fallback.
SSLPROTO_311 = pytest.mark.skipif(
    sys.version_info < (3, 11), reason="asserts asyncio's sslproto of 3.11+ (3.10's differs on the stdlib loop too)"
)
