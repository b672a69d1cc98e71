"""TLS transports: the application's side of a TLS connection whose
records a socket transport's native core does (src/transport/stream/tls.rs),
on the user's own ``ssl.SSLContext``.

The stdlib makes the connection's objects (``context.wrap_bio(...)`` with
two ``ssl.MemoryBIO``), so verification, ``check_hostname``, SNI callbacks,
ALPN, sessions and ``get_extra_info('ssl_object')`` are the stdlib's own;
the core drives the ``SSL *`` behind them with no Python call per record.
The semantics are those of asyncio's ``sslproto`` (3.11+); this module does
what it does once per connection: choosing this path, the handshake's and
the shutdown's timeouts, the extra info, ``connection_made`` and
``connection_lost`` of the application protocol, and the waiter.

Where the core cannot prove it drives the very OpenSSL the ``ssl`` module
uses, or cannot handle the objects (another layout, an SSLObject subclass
that overrides what the core replaces), and on Python 3.10 (whose sslproto
is the older design), the connection goes to asyncio's ``sslproto`` over
the socket transport instead, as before. ``_tls_path`` on the transport
says which path it took ("native", or "sslproto: <why>"), and asyncio's
logger says it at debug level.
"""

import ssl
import sys
from asyncio import constants, exceptions, futures, protocols, sslproto, transports
from asyncio.log import logger

from ._base import CoreMethod, report_error

__all__ = ("SSLTransport", "TlsSetup", "open_tls", "NATIVE_TLS")

# asyncio's sslproto was rewritten in 3.11 (after uvloop's): that is the
# state machine the core mirrors. 3.10 keeps its own sslproto.
NATIVE_TLS = sys.version_info >= (3, 11)

_HIGH_WATER_WRITE_KIB = 512
_HIGH_WATER_READ_KIB = 256


def _check_timeouts(handshake, shutdown):
    """sslproto's defaults and checks of the two timeouts."""
    if handshake is None:
        handshake = constants.SSL_HANDSHAKE_TIMEOUT
    elif handshake <= 0:
        raise ValueError(f"ssl_handshake_timeout should be a positive number, got {handshake}")
    if shutdown is None:
        shutdown = constants.SSL_SHUTDOWN_TIMEOUT
    elif shutdown <= 0:
        raise ValueError(f"ssl_shutdown_timeout should be a positive number, got {shutdown}")
    return handshake, shutdown


def _limits(high, low, kib):
    """sslproto's ``add_flowcontrol_defaults`` (its errors included)."""
    return sslproto.add_flowcontrol_defaults(high, low, kib)


class TlsSetup:
    """What asyncio's ``SSLProtocol.__init__`` checks and makes for one
    connection (the timeouts, a default context, the SSLObject), made before
    any transport is touched: an error here leaves the socket as it was, as
    with asyncio, where the SSLProtocol is made before its transport."""

    __slots__ = ("protocol", "sslcontext", "server_side", "server_hostname", "handshake_timeout",
                 "shutdown_timeout", "sslobj", "incoming", "outgoing")

    def __init__(self, protocol, sslcontext, *, server_side, server_hostname, ssl_handshake_timeout,
                 ssl_shutdown_timeout):
        self.handshake_timeout, self.shutdown_timeout = _check_timeouts(ssl_handshake_timeout, ssl_shutdown_timeout)
        if not sslcontext:
            sslcontext = sslproto._create_transport_context(server_side, server_hostname)
        self.protocol = protocol
        self.sslcontext = sslcontext
        self.server_side = server_side
        self.server_hostname = server_hostname if server_hostname and not server_side else None
        self.sslobj = self.incoming = self.outgoing = None
        if NATIVE_TLS:
            self.incoming = ssl.MemoryBIO()
            self.outgoing = ssl.MemoryBIO()
            self.sslobj = sslcontext.wrap_bio(self.incoming, self.outgoing, server_side=server_side,
                                              server_hostname=self.server_hostname)


def open_tls(loop, socket_transport, setup, waiter, *, call_connection_made, on_fallback):
    """TLS as `setup` (a TlsSetup) says on `socket_transport` (a zuvrs
    SocketTransport not yet started, or one in use, for start_tls).

    Returns the native TLS transport, or calls ``on_fallback(why)`` (which
    sets up asyncio's sslproto) and returns what it returns.
    """
    if not NATIVE_TLS:
        return on_fallback("asyncio's sslproto before 3.11")
    protocol = setup.protocol
    buffered = isinstance(protocol, protocols.BufferedProtocol)
    core = socket_transport._core
    why = core._start_tls(setup.sslobj, setup.incoming, setup.outgoing, protocol, buffered, call_connection_made)
    if why is not None:
        if loop.get_debug():
            logger.debug("%r: TLS through asyncio's sslproto: %s", socket_transport, why)
        return on_fallback(why)
    tls = SSLTransport(loop, socket_transport, setup.sslcontext, setup.sslobj, waiter, setup.handshake_timeout,
                       setup.shutdown_timeout)
    core._set_wrapper(tls)
    # The socket transport's close() is the socket's, as asyncio's under
    # sslproto (what Server.close_clients() and start_tls's caller reach):
    # no close_notify, the socket closes once its queue is out.
    socket_transport.close = core._close_socket
    socket_transport.is_closing = core._socket_is_closing
    if loop.get_debug():
        logger.debug("%r: native TLS", tls)
    return tls


class SSLTransport(transports._FlowControlMixin, transports.Transport):
    """The application's transport of a native TLS connection (named as
    asyncio's and uvloop's are, with "SSL": code and tests look for it).

    Its methods are the socket core's, which dispatches them to its TLS
    reader (write encrypts, close sends close_notify, pause_reading stops
    decrypting, ...). `_socket` is the socket transport underneath: the
    extra info TLS does not add comes from it, and it lets go of the fd.
    """

    _start_tls_compatible = True
    _sendfile_compatible = constants._SendfileMode.FALLBACK
    _tls_path = "native"
    _lost = False  # connection_lost ran (the socket's extra info is gone)

    write = CoreMethod("write")
    writelines = CoreMethod("writelines")
    write_eof = CoreMethod("write_eof")  # NotImplementedError, as asyncio's
    abort = CoreMethod("abort")
    is_closing = CoreMethod("is_closing")
    pause_reading = CoreMethod("pause_reading")
    resume_reading = CoreMethod("resume_reading")
    is_reading = CoreMethod("is_reading")
    get_write_buffer_size = CoreMethod("get_write_buffer_size")

    def __init__(self, loop, socket_transport, sslcontext, sslobj, waiter, handshake_timeout, shutdown_timeout):
        # The flow control is the core's: skip _FlowControlMixin.__init__.
        self._loop = loop
        self._socket = socket_transport
        self._core = socket_transport._core
        self._sslobj = sslobj
        # As uvloop's SSL transport has it (and asyncio's SSLProtocol, see
        # _ssl_protocol); aiohttp reads either.
        self._sslcontext = sslcontext
        self._extra = {"sslcontext": sslcontext}
        self._waiter = waiter
        self._handshake_timeout = handshake_timeout
        self._shutdown_timeout = shutdown_timeout
        self._handshake_timer = None
        self._shutdown_timer = None
        self._handshake_start = None

    def __repr__(self):
        state = self._core._tls_state() or "UNWRAPPED"
        return f"<{type(self).__name__} fd={self._socket._sock_fd} {state}>"

    # -- the application's API ------------------------------------------------------

    def close(self):
        if not self._core._tls_app_closed():
            self._core.close()
            return
        # Closed again: asyncio's TLS transport then lets go of its
        # SSLProtocol, and so of the connection's context and SSLObject
        # (which a protocol keeping its transport would otherwise keep
        # alive; CPython's test_ssl checks the context is freed).
        self._sslobj = self._sslcontext = None
        self._extra = {}

    def get_extra_info(self, name, default=None):
        if name in self._extra:
            return self._extra[name]
        if name == "uvloop.sslproto":
            # uvloop's name for its SSLProtocol (its tests pause and resume
            # the socket side through it): what ``_ssl_protocol`` gives.
            return self._ssl_protocol
        if self._lost:
            # sslproto drops its socket transport in connection_lost.
            return default
        return self._socket.get_extra_info(name, default)

    def set_protocol(self, protocol):
        self._core.set_protocol(protocol, isinstance(protocol, protocols.BufferedProtocol))

    def get_protocol(self):
        return self._core.get_protocol()

    def can_write_eof(self):
        return False

    @property
    def _protocol_paused(self):
        return self._core._protocol_paused()

    def get_write_buffer_limits(self):
        return self._core.get_write_buffer_limits()

    def set_write_buffer_limits(self, high=None, low=None):
        high, low = _limits(high, low, _HIGH_WATER_WRITE_KIB)
        self._core._set_water_marks(high, low)

    def set_read_buffer_limits(self, high=None, low=None):
        high, low = _limits(high, low, _HIGH_WATER_READ_KIB)
        self._core._tls_set_read_limits(high, low)

    def get_read_buffer_limits(self):
        return self._core._tls_read_limits()

    def get_read_buffer_size(self):
        return self._core._tls_read_buffer_size()

    def _force_close(self, exc):
        self._core._force_close(exc)

    # -- sslproto's test hooks (CPython's and uvloop's TLS tests use them) ------------

    @property
    def _ssl_protocol(self):
        """What of sslproto's SSLProtocol tests reach: its socket-side flow
        control (``pause_writing()`` / ``resume_writing()``)."""
        return _SslProtocolFlow(self._core, self._sslcontext)

    def _test__append_write_backlog(self, data):
        # sslproto's: plaintext joins the backlog without being written.
        self._core._tls_append_write_backlog(data)

    # -- once per connection, called by the core ---------------------------------------

    def _begin(self):
        """sslproto's connection_made: the handshake starts, and its timeout."""
        loop = self._loop
        if loop.get_debug():
            logger.debug("%r starts SSL handshake", self)
            self._handshake_start = loop.time()
        self._handshake_timer = loop.call_later(self._handshake_timeout, self._check_handshake_timeout)
        self._core._tls_start_handshake()

    def _check_handshake_timeout(self):
        if self._core._tls_handshaking():
            msg = (
                f"SSL handshake is taking longer than {self._handshake_timeout} seconds: aborting the connection"
            )
            self._fatal_error(ConnectionAbortedError(msg))

    def _tls_handshake_done(self, call_connection_made):
        """The handshake is done: the extra info, the application's
        connection_made, the waiter. False if the peer's certificate could
        not be had (the connection failed)."""
        self._cancel_handshake_timer()
        sslobj = self._sslobj
        try:
            peercert = sslobj.getpeercert()
        except Exception as exc:
            self._tls_handshake_failed(exc)
            return False
        if self._handshake_start is not None:
            dt = self._loop.time() - self._handshake_start
            logger.debug("%r: SSL handshake took %.1f ms", self, dt * 1e3)
        self._extra.update(peercert=peercert, cipher=sslobj.cipher(), compression=sslobj.compression(),
                           ssl_object=sslobj)
        if call_connection_made:
            self._core.get_protocol().connection_made(self)
        self._wakeup_waiter()
        return True

    def _tls_handshake_failed(self, exc):
        self._cancel_handshake_timer()
        if isinstance(exc, ssl.CertificateError):
            msg = "SSL handshake failed on verifying the certificate"
        else:
            msg = "SSL handshake failed"
        self._fatal_error(exc, msg)
        self._wakeup_waiter(exc)

    def _tls_shutdown_started(self):
        self._shutdown_timer = self._loop.call_later(self._shutdown_timeout, self._check_shutdown_timeout)

    def _check_shutdown_timeout(self):
        if self._core._tls_shutting_down():
            self._core._force_close(exceptions.TimeoutError("SSL shutdown timed out"))

    def _tls_shutdown_finished(self):
        if self._shutdown_timer is not None:
            self._shutdown_timer.cancel()
            self._shutdown_timer = None

    def _fatal_error(self, exc, message="Fatal error on transport"):
        # sslproto's: the socket closes with exc; an OSError is logged in
        # debug mode only, a cancellation not at all.
        protocol = self._core.get_protocol()
        self._core._force_close(exc)
        if isinstance(exc, OSError):
            if self._loop.get_debug():
                # (exc_info is the exception: this runs outside its handler.)
                logger.debug("%r: %s", self._socket, message, exc_info=exc)
        elif not isinstance(exc, exceptions.CancelledError):
            report_error(self._socket, exc, message, protocol)

    def _report_error(self, message, exc):
        report_error(self, exc, message, self._core.get_protocol())

    def _call_connection_lost(self, exc):
        """The socket's connection is over (sslproto's connection_lost)."""
        self._lost = True
        try:
            protocol = self._core.get_protocol()
            if self._core._tls_connection_lost() and protocol is not None:
                self._loop.call_soon(protocol.connection_lost, exc, context=self._core._protocol_context())
        finally:
            self._socket._release_fd(True)
            self._wakeup_waiter(exc)
            self._cancel_handshake_timer()
            self._tls_shutdown_finished()

    def _release_fd(self, finished=False):
        # (A loop closing with the connection open.)
        self._socket._release_fd(finished)

    def _cancel_handshake_timer(self):
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None

    def _wakeup_waiter(self, exc=None):
        waiter, self._waiter = self._waiter, None
        if waiter is None or waiter.cancelled():
            return
        if exc is not None:
            waiter.set_exception(exc)
        else:
            futures._set_result_unless_cancelled(waiter, None)


class _SslProtocolFlow:
    """sslproto's ``SSLProtocol.pause_writing()`` / ``resume_writing()`` of
    a native TLS connection: while paused, the socket takes no ciphertext,
    which stays in the TLS session (counted by ``get_write_buffer_size()``);
    resuming hands it to the socket. They assert as sslproto's do. And
    ``_sslcontext``, the connection's context."""

    __slots__ = ("_core", "_sslcontext")

    def __init__(self, core, sslcontext):
        self._core = core
        self._sslcontext = sslcontext

    def pause_writing(self):
        if not self._core._tls_pause_ssl_writing():
            raise AssertionError

    def resume_writing(self):
        if not self._core._tls_resume_ssl_writing():
            raise AssertionError
