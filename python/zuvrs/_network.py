"""Socket operations of zuvrs.Loop (mixed into the loop class).

asyncio.BaseEventLoop already implements create_connection, create_server,
connect_accepted_socket, the streams API and Server objects on top of a few
primitives; this module provides those primitives the way zuvrs does them:
``sock_*`` coroutines over the loop's fd watchers, accepting connections for
servers, and transports over native stream cores.
"""

import _socket
import errno
import io
import operator
import os
import socket
import sys
from asyncio import base_events, constants, exceptions, sslproto, tasks, trsock
from asyncio.log import logger

from . import _all_errors, _zuvrs
from ._process import SubprocessTransport
from ._server import NATIVE_CLIENT_TRACKING, apply_keep_alive, upgrade_server
from .transports import (
    SocketTransport,
    make_datagram_transport,
    make_read_pipe_transport,
    make_socket_transport,
    make_write_pipe_transport,
    native_stream_socket,
)
from .transports._tls import NATIVE_TLS, SSLTransport, TlsSetup, open_tls

_open_tcp = SocketTransport._open_tcp

__all__ = ("NetworkMixin",)

_ACCEPT_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_INET_FAMILIES = (socket.AF_INET, socket.AF_INET6)
_SOCK_STREAM = socket.SOCK_STREAM
_FAMILIES = {socket.AF_INET: socket.AF_INET, socket.AF_INET6: socket.AF_INET6}
_IPPROTO_TCP = socket.IPPROTO_TCP
_tcp_connect = _zuvrs.tcp_connect
_numeric_addrinfo = _zuvrs.numeric_addrinfo


def _check_socket(loop, sock):
    """The checks asyncio's sock_* methods make on their socket."""
    import ssl as _ssl

    if isinstance(sock, _ssl.SSLSocket):
        raise TypeError("Socket cannot be of type SSLSocket")
    if loop.get_debug() and sock.gettimeout() != 0:
        raise ValueError("the socket must be non-blocking")


def _ready():
    """An attempt that succeeds as soon as the fd is ready."""
    return None


def _encode_host(host):
    """The host as socket.getaddrinfo passes it to the resolver (a str or
    bytes, subclasses included; nothing else, not even a bytearray)."""
    if host is None:
        return None
    if isinstance(host, str):
        return host.encode("idna")
    if isinstance(host, bytes):
        # (One with a NUL inside is refused natively, where the socket
        # module would cut it there: see README, "bad input".)
        return bytes(host)
    raise TypeError("getaddrinfo() argument 1 must be string or None")


_C_LONG_MIN, _C_LONG_MAX = -(2**63), 2**63 - 1


def _encode_port(port):
    """The port as socket.getaddrinfo hands it to the resolver: an int as
    its digits (up to 3.11 only a C long's: OverflowError beyond), a str or
    bytes up to a NUL (the C string it becomes ends there). Only an exact
    int is a number there (a bool is "Int or String expected")."""
    if port is None:
        return None
    if type(port) is int:
        if _PORT_IS_C_LONG and not _C_LONG_MIN <= port <= _C_LONG_MAX:
            raise OverflowError("Python int too large to convert to C long")
        return str(port).encode()
    if isinstance(port, str):
        return port.encode().split(b"\0", 1)[0]
    if isinstance(port, bytes):
        return port.split(b"\0", 1)[0]
    raise OSError("Int or String expected")


# Up to 3.11 socket.getaddrinfo converts an int port to a C long; from 3.12
# on it passes the int's digits to the resolver whatever their number.
_PORT_IS_C_LONG = sys.version_info < (3, 12)


def _ssl():
    import ssl

    return ssl


def _require_unix_stream(sock):
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        raise ValueError(f"A UNIX Domain Stream Socket was expected, got {sock!r}")


def _remove_stale_socket(path):
    """Remove a leftover socket file at `path` before binding to it (stat
    and unlink are native: see src/net/unix_path.rs)."""
    try:
        if _zuvrs.path_inode(path)[1]:
            _zuvrs.unlink_path(path)
    except FileNotFoundError:
        pass
    except OSError as err:
        # The directory may only allow creating the socket.
        logger.error("Unable to check or remove stale UNIX socket %r: %r", path, err)


def _ssl_timeouts(handshake, shutdown):
    """Keyword arguments for BaseEventLoop's connection set-up (3.10 has no
    ssl_shutdown_timeout)."""
    kw = {"ssl_handshake_timeout": handshake}
    if shutdown is not None:
        kw["ssl_shutdown_timeout"] = shutdown
    return kw


def _server_timeouts(handshake, shutdown):
    """Positional SSL timeouts for base_events.Server on this Python."""
    import sys

    if sys.version_info >= (3, 11):
        return (handshake, shutdown)
    return (handshake,)


_NUMERIC_NAME_INFO = socket.NI_NUMERICHOST | socket.NI_NUMERICSERV

# The socket module's own getaddrinfo / getnameinfo (None if another was
# already in place when zuvrs was imported). While socket's attributes are
# these, zuvrs answers natively; a program or test that replaces one (a DNS
# test double, an IPv4-only wrapper, a resolver patched in) is obeyed as
# asyncio obeys it: the replacement runs in the default executor.
_SOCKET_GETADDRINFO = socket.getaddrinfo if getattr(socket.getaddrinfo, "__module__", None) == "socket" else None
_SOCKET_GETNAMEINFO = _socket.getnameinfo if socket.getnameinfo is _socket.getnameinfo else None
_zuvrs.keep_socket_getaddrinfo(_SOCKET_GETADDRINFO)


# create_unix_server's cleanup_socket default: asyncio's from 3.13 (before
# that asyncio left the socket file behind).
_CLEANUP_SOCKET_DEFAULT = sys.version_info >= (3, 13)


class NetworkMixin:
    # -- transports -------------------------------------------------------

    def _make_socket_transport(self, sock, protocol, waiter=None, *, extra=None, server=None):
        self._ensure_fd_no_transport(sock)
        return make_socket_transport(self, sock, protocol, waiter, extra, server)

    def _make_datagram_transport(self, sock, protocol, address=None, waiter=None, extra=None):
        return make_datagram_transport(self, sock, protocol, address, waiter, extra)

    def _make_read_pipe_transport(self, pipe, protocol, waiter=None, extra=None):
        return make_read_pipe_transport(self, pipe, protocol, waiter, extra)

    def _make_write_pipe_transport(self, pipe, protocol, waiter=None, extra=None):
        return make_write_pipe_transport(self, pipe, protocol, waiter, extra)

    async def _make_subprocess_transport(self, protocol, args, shell, stdin, stdout, stderr, bufsize,
                                         extra=None, **kwargs):
        waiter = self.create_future()
        transport = SubprocessTransport(
            self, protocol, args, shell, stdin, stdout, stderr, bufsize, waiter=waiter, extra=extra, **kwargs
        )
        self._child_reaper.watch(transport.get_pid(), transport._process_exited)
        try:
            await waiter
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException:
            transport.close()
            await transport._wait()
            raise
        return transport

    def _make_ssl_transport(self, rawsock, protocol, sslcontext, waiter=None, *, server_side=False,
                            server_hostname=None, extra=None, server=None, **timeouts):
        """A TLS transport over `rawsock`: native (transports/_tls.py) when
        the socket is served by a native core and the TLS objects allow it,
        else asyncio's sslproto over the socket transport."""

        def with_sslproto(why):
            ssl_protocol = sslproto.SSLProtocol(
                self, protocol, sslcontext, waiter, server_side, server_hostname, **timeouts
            )
            if socket_transport is None:
                self._make_socket_transport(rawsock, ssl_protocol, extra=extra, server=server)
            else:
                socket_transport._connect(socket_transport._core, ssl_protocol, None, server)
            transport = ssl_protocol._app_transport
            transport._tls_path = f"sslproto: {why}"
            return transport

        socket_transport = None
        if not NATIVE_TLS:
            return with_sslproto("asyncio's sslproto before 3.11")
        if not native_stream_socket(rawsock):
            return with_sslproto("the socket's class overrides its I/O methods")
        self._ensure_fd_no_transport(rawsock)
        # SSLProtocol's checks and objects first: an error leaves rawsock alone.
        setup = TlsSetup(
            protocol, sslcontext, server_side=server_side, server_hostname=server_hostname,
            ssl_handshake_timeout=timeouts.get("ssl_handshake_timeout"),
            ssl_shutdown_timeout=timeouts.get("ssl_shutdown_timeout"),
        )
        socket_transport = SocketTransport._unconnected(self, rawsock, extra)
        transport = open_tls(self, socket_transport, setup, waiter, call_connection_made=True,
                             on_fallback=with_sslproto)
        if isinstance(transport, SSLTransport):
            socket_transport._carry_tls(transport, server)
        return transport

    async def start_tls(self, transport, protocol, sslcontext, *, server_side=False, server_hostname=None,
                        ssl_handshake_timeout=None, ssl_shutdown_timeout=None):
        """asyncio's start_tls; native TLS on a zuvrs socket transport (the
        handshake starts at once, and data that arrives meanwhile waits in
        the TLS session), asyncio's sslproto otherwise."""
        timeouts = _ssl_timeouts(ssl_handshake_timeout, ssl_shutdown_timeout)

        async def with_sslproto(why):
            tls = await super(NetworkMixin, self).start_tls(
                transport, protocol, sslcontext, server_side=server_side, server_hostname=server_hostname, **timeouts
            )
            # (None when the transport closed before the upgrade, as asyncio
            # returns it.)
            if tls is not None:
                tls._tls_path = f"sslproto: {why}"
            return tls

        if not NATIVE_TLS:
            return await with_sslproto("asyncio's sslproto before 3.11")
        if not (type(transport) is SocketTransport and isinstance(sslcontext, _ssl().SSLContext)
                and not transport.is_closing()):
            return await with_sslproto("the transport or the context is not zuvrs's own")
        setup = TlsSetup(
            protocol, sslcontext, server_side=server_side, server_hostname=server_hostname,
            ssl_handshake_timeout=ssl_handshake_timeout, ssl_shutdown_timeout=ssl_shutdown_timeout,
        )
        waiter = self.create_future()
        fallback = []
        tls = open_tls(self, transport, setup, waiter, call_connection_made=False, on_fallback=fallback.append)
        if fallback:
            return await with_sslproto(fallback[0])
        begin = self.call_soon(tls._begin)
        transport._core._resume_socket_reading()
        try:
            await waiter
        except BaseException:
            # As asyncio: the socket closes (what is queued still goes out).
            begin.cancel()
            transport._core._close_socket()
            raise
        return tls

    def _ensure_fd_no_transport(self, fd):
        fileno = fd
        if not isinstance(fileno, int):
            try:
                fileno = int(fileno.fileno())
            except (AttributeError, TypeError, ValueError):
                raise ValueError(f"Invalid file object: {fd!r}") from None
        transport = self._native_transports.get(fileno) or self._transports.get(fileno)
        if transport is not None and not transport.is_closing():
            raise RuntimeError(f"File descriptor {fd!r} is used by transport {transport!r}")

    # -- connecting -----------------------------------------------------------

    async def create_connection(self, protocol_factory, host=None, port=None, **kwargs):
        """asyncio's create_connection; a plain TCP connection to an address
        literal (no other option, not in debug mode) is made natively, with
        the same steps, results and errors as asyncio's for that case."""
        if kwargs or type(host) is not str or type(port) is not int or not 0 <= port <= 0xFFFF or self._debug:
            if _all_errors.EMULATED and "all_errors" in kwargs:
                return await _all_errors.create_connection_all_errors(
                    super().create_connection, protocol_factory, host, port, **kwargs)
            return await super().create_connection(protocol_factory, host, port, **kwargs)
        started = _tcp_connect(self, host, port)
        if started is None:
            # Not an address literal: resolve it.
            return await super().create_connection(protocol_factory, host, port, **kwargs)
        fd, family, fut = started
        try:
            if fut is not None:
                await fut
            protocol = protocol_factory()
        except BaseException:
            if fut is not None and not self.is_closed():
                self._clear_fd_handler(fd, True)
            os.close(fd)
            raise
        finally:
            # This frame is in the traceback of the connection's error, which
            # the future holds: let go of it, or the two make a cycle.
            fut = started = None
        waiter = self.create_future()
        transport = _open_tcp(self, fd, _FAMILIES[family], _IPPROTO_TCP, protocol, waiter)
        try:
            await waiter
        except BaseException:
            transport.close()
            raise
        return transport, protocol

    # -- servers ------------------------------------------------------------

    async def create_server(self, protocol_factory, host=None, port=None, *, keep_alive=None,
                            start_serving=True, **kwargs):
        """asyncio's create_server; `keep_alive` and Server.close_clients() /
        abort_clients() on every Python (asyncio has them from 3.13)."""
        if NATIVE_CLIENT_TRACKING:
            return await super().create_server(
                protocol_factory, host, port, keep_alive=keep_alive, start_serving=start_serving, **kwargs
            )
        server = await super().create_server(protocol_factory, host, port, start_serving=False, **kwargs)
        upgrade_server(server)
        if keep_alive:
            apply_keep_alive(server)
        if start_serving:
            await server.start_serving()
        return server

    def _start_serving(self, protocol_factory, sock, sslcontext=None, server=None, backlog=100, *timeouts):
        if sslcontext is None and not self._debug and sock.family in _INET_FAMILIES:
            # Plain TCP: accepted natively, each connection set up at once.
            on_conn = self._tcp_accepted_cb(protocol_factory, sock, server)

            def on_error(exc):
                self._accept_failed(exc, protocol_factory, sock, sslcontext, server, backlog, *timeouts)

            self._set_fd_handler(sock.fileno(), False, _zuvrs.Acceptor(sock.fileno(), backlog, on_conn, on_error), ())
            return
        self._set_fd_handler(
            sock.fileno(), False, self._accept_connections,
            (protocol_factory, sock, sslcontext, server, backlog) + tuple(timeouts),
        )

    def _tcp_accepted_cb(self, protocol_factory, sock, server):
        """The per-connection set-up of a TCP server: asyncio's
        _accept_connection2 (errors reported in debug mode only)."""
        family = sock.family
        proto = sock.proto

        def on_conn(fd, peername):
            protocol = None
            try:
                protocol = protocol_factory()
            except (SystemExit, KeyboardInterrupt):
                os.close(fd)
                raise
            except BaseException as exc:
                os.close(fd)
                self._accept_setup_failed(exc, protocol, None)
                return
            try:
                _open_tcp(self, fd, family, proto, protocol, None, peername, server)
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                self._accept_setup_failed(exc, protocol, None)

        return on_conn

    def _accept_setup_failed(self, exc, protocol, transport):
        if self._debug:
            context = {
                "message": "Error on transport creation for incoming connection",
                "exception": exc,
            }
            if protocol is not None:
                context["protocol"] = protocol
            if transport is not None:
                context["transport"] = transport
            self.call_exception_handler(context)

    def _accept_failed(self, exc, protocol_factory, sock, sslcontext, server, backlog, *timeouts):
        """Out of fds or memory: stop accepting for a moment (Linux keeps
        reporting the socket readable) and log it, as asyncio does."""
        self.call_exception_handler(
            {
                "message": "socket.accept() out of system resource",
                "exception": exc,
                "socket": trsock.TransportSocket(sock),
            }
        )
        self._clear_fd_handler(sock.fileno(), False)
        self.call_later(
            constants.ACCEPT_RETRY_DELAY, self._start_serving,
            protocol_factory, sock, sslcontext, server, backlog, *timeouts,
        )

    def _stop_serving(self, sock):
        if not self.is_closed():
            self._clear_fd_handler(sock.fileno(), False)
        socket_file = self._unix_socket_files.pop(sock, None)
        sock.close()
        if socket_file is not None:
            path, inode = socket_file
            try:
                if _zuvrs.path_inode(path)[0] == inode:
                    _zuvrs.unlink_path(path)
            except OSError:
                pass

    def _accept_connections(self, protocol_factory, sock, sslcontext, server, backlog, *timeouts):
        # Drain up to `backlog` pending connections per readiness event.
        for _ in range(backlog):
            try:
                conn, addr = sock.accept()
                conn.setblocking(False)
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno not in _ACCEPT_OUT_OF_RESOURCES:
                    raise
                self._accept_failed(exc, protocol_factory, sock, sslcontext, server, backlog, *timeouts)
                return
            self.create_task(
                self._set_up_accepted(protocol_factory, conn, {"peername": addr}, sslcontext, server, timeouts)
            )

    async def _set_up_accepted(self, protocol_factory, conn, extra, sslcontext, server, timeouts):
        protocol = transport = None
        try:
            protocol = protocol_factory()
            waiter = self.create_future()
            if sslcontext:
                names = ("ssl_handshake_timeout", "ssl_shutdown_timeout")
                transport = self._make_ssl_transport(
                    conn, protocol, sslcontext, waiter=waiter, server_side=True,
                    extra=extra, server=server, **dict(zip(names, timeouts)),
                )
            else:
                transport = self._make_socket_transport(conn, protocol, waiter=waiter, extra=extra, server=server)
            try:
                await waiter
            except BaseException:
                transport.close()
                raise
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._accept_setup_failed(exc, protocol, transport)

    # -- sendfile ----------------------------------------------------------------

    async def _sock_sendfile_native(self, sock, file, offset, count):
        """Zero-copy sock_sendfile with os.sendfile; SendfileNotAvailableError
        (so asyncio falls back to reading and sending) when it cannot apply."""
        try:
            fileno = file.fileno()
        except (AttributeError, io.UnsupportedOperation):
            raise exceptions.SendfileNotAvailableError("not a regular file") from None
        try:
            fsize = os.fstat(fileno).st_size
        except OSError:
            raise exceptions.SendfileNotAvailableError("not a regular file") from None
        if not (count or fsize):
            return 0
        fd = sock.fileno()
        sent = 0
        try:
            while not count or sent < count:
                chunk = count - sent if count else fsize
                try:
                    n = os.sendfile(fd, fileno, offset + sent, chunk)
                except (BlockingIOError, InterruptedError):
                    await self._wait_fd(fd, True, _ready)
                    continue
                except OSError as exc:
                    if exc.errno == errno.ENOTCONN and type(exc) is not ConnectionError:
                        exc = ConnectionError("socket is not connected", errno.ENOTCONN)
                    if sent == 0:
                        raise exceptions.SendfileNotAvailableError("os.sendfile call failed") from exc
                    raise exc
                if n == 0:
                    break
                sent += n
        finally:
            if sent > 0:
                # As asyncio does: the file position follows what was sent.
                os.lseek(fileno, offset + sent, os.SEEK_SET)
        return sent

    async def _sendfile_native(self, transp, file, offset, count):
        """loop.sendfile() on a zuvrs socket transport: wait until its
        buffer is empty, then sendfile straight into the socket."""
        sock = transp._socket() if isinstance(transp, SocketTransport) else None
        if sock is None:
            raise exceptions.SendfileNotAvailableError("not a socket transport")
        fd = transp._sock_fd
        resume_reading = transp.is_reading()
        transp.pause_reading()
        transp._core._set_sendfile_in_progress(True)
        try:
            await transp._wait_drained()
            del self._native_transports[fd]
            try:
                return await self.sock_sendfile(sock, file, offset, count, fallback=False)
            finally:
                self._native_transports[fd] = transp
        finally:
            transp._core._set_sendfile_in_progress(False)
            if resume_reading:
                transp.resume_reading()

    # -- name resolution ------------------------------------------------------

    async def getaddrinfo(self, host, port, *, family=0, type=0, proto=0, flags=0):
        """socket.getaddrinfo() without blocking the loop: address literals
        are answered at once, names are resolved on libuv's thread pool.
        A replaced socket.getaddrinfo, and debug mode (which logs each
        lookup), take asyncio's way: the function in the executor."""
        # (None also when socket.getaddrinfo was replaced or in debug mode:
        # checked natively, for the fast path.)
        infos = _numeric_addrinfo(self, host, port, family, type, proto, flags)
        if infos is not None:
            return infos
        if socket.getaddrinfo is not _SOCKET_GETADDRINFO or self._debug:
            return await super().getaddrinfo(host, port, family=family, type=type, proto=proto, flags=flags)
        fut = self.create_future()
        try:
            _zuvrs.resolve(self, fut, _encode_host(host), _encode_port(port), family, type, proto, flags)
        except (OSError, TypeError, OverflowError):
            # Arguments libuv refused (an empty host, no host nor port) or
            # that are not what the socket module takes: its own answer,
            # with its errors and messages.
            return await self.run_in_executor(None, socket.getaddrinfo, host, port, family, type, proto, flags)
        return await fut

    async def getnameinfo(self, sockaddr, flags=0):
        """socket.getnameinfo() without blocking the loop: numeric answers at
        once, name lookups on libuv's thread pool; a replaced
        socket.getnameinfo runs in the executor, as asyncio runs it."""
        getnameinfo = _SOCKET_GETNAMEINFO
        if socket.getnameinfo is not getnameinfo:
            return await super().getnameinfo(sockaddr, flags)
        flags = operator.index(flags)  # (socket.getnameinfo's TypeError)
        if flags & _NUMERIC_NAME_INFO == _NUMERIC_NAME_INFO:
            # Needs no lookup (the host must be numeric in any case).
            return getnameinfo(sockaddr, flags)
        # socket.getnameinfo checks the arguments and flags as the stdlib
        # would (its errors are the stdlib's) and prints the address for the
        # lookup. (NI_NAMEREQD would make a numeric answer an error.)
        host, port = getnameinfo(sockaddr, (flags & ~socket.NI_NAMEREQD) | _NUMERIC_NAME_INFO)
        # (As socket.getnameinfo reads them: C unsigned ints, unchecked.)
        flowinfo = sockaddr[2] & 0xFFFFFFFF if len(sockaddr) > 2 else 0
        scope_id = sockaddr[3] & 0xFFFFFFFF if len(sockaddr) > 3 else 0
        fut = self.create_future()
        _zuvrs.name_info(self, fut, host, int(port), flowinfo, scope_id, flags)
        return await fut

    # -- Unix sockets -----------------------------------------------------------

    async def create_unix_connection(self, protocol_factory, path=None, *, ssl=None, sock=None,
                                     server_hostname=None, ssl_handshake_timeout=None,
                                     ssl_shutdown_timeout=None):
        """Connect to a Unix domain stream socket at `path` (or use `sock`)."""
        if ssl:
            if server_hostname is None:
                raise ValueError("you have to pass server_hostname when using ssl")
        else:
            if server_hostname is not None:
                raise ValueError("server_hostname is only meaningful with ssl")
            if ssl_handshake_timeout is not None:
                raise ValueError("ssl_handshake_timeout is only meaningful with ssl")
            if ssl_shutdown_timeout is not None:
                raise ValueError("ssl_shutdown_timeout is only meaningful with ssl")
        if path is not None:
            if sock is not None:
                raise ValueError("path and sock can not be specified at the same time")
            path = os.fspath(path)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0)
            try:
                sock.setblocking(False)
                await self.sock_connect(sock, path)
            except BaseException:
                sock.close()
                raise
        else:
            if sock is None:
                raise ValueError("no path and sock were specified")
            _require_unix_stream(sock)
            sock.setblocking(False)
        return await self._create_connection_transport(
            sock, protocol_factory, ssl, server_hostname, **_ssl_timeouts(ssl_handshake_timeout, ssl_shutdown_timeout)
        )

    async def create_unix_server(self, protocol_factory, path=None, *, sock=None, backlog=100, ssl=None,
                                 ssl_handshake_timeout=None, ssl_shutdown_timeout=None,
                                 start_serving=True, cleanup_socket=_CLEANUP_SOCKET_DEFAULT):
        """Serve on a Unix domain stream socket at `path` (or on `sock`).

        With `cleanup_socket` the socket file is removed when the server
        closes, if it is still ours. asyncio has the option, on by default,
        from Python 3.13; zuvrs accepts it on every Python, with asyncio's
        default for the running one (older ones leave the file).
        """
        if isinstance(ssl, bool):
            raise TypeError("ssl argument must be an SSLContext or None")
        if ssl_handshake_timeout is not None and not ssl:
            raise ValueError("ssl_handshake_timeout is only meaningful with ssl")
        if ssl_shutdown_timeout is not None and not ssl:
            raise ValueError("ssl_shutdown_timeout is only meaningful with ssl")
        if path is not None:
            if sock is not None:
                raise ValueError("path and sock can not be specified at the same time")
            path = os.fspath(path)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                if path[0] not in (0, "\x00"):
                    # (A path with a NUL inside is refused there, as os.stat
                    # refuses it in asyncio, before it can be bound truncated.)
                    _remove_stale_socket(path)
                sock.bind(path)
            except OSError as exc:
                sock.close()
                if exc.errno == errno.EADDRINUSE:
                    raise OSError(errno.EADDRINUSE, f"Address {path!r} is already in use") from None
                raise
            except BaseException:
                sock.close()
                raise
        else:
            if sock is None:
                raise ValueError("path was not specified, and no sock specified")
            _require_unix_stream(sock)
        if cleanup_socket:
            name = sock.getsockname()
            if isinstance(name, (str, bytes)) and name and name[0] not in (0, "\x00"):
                try:
                    self._unix_socket_files[sock] = (name, _zuvrs.path_inode(name)[0])
                except OSError:
                    pass
        sock.setblocking(False)
        server = base_events.Server(
            self, [sock], protocol_factory, ssl, backlog,
            *_server_timeouts(ssl_handshake_timeout, ssl_shutdown_timeout),
        )
        upgrade_server(server)
        if start_serving:
            server._start_serving()
            # One turn, so the listening socket is watched before we return.
            await tasks.sleep(0)
        return server

    # -- sock_* coroutines --------------------------------------------------

    def _wait_fd(self, fd, write, attempt):
        """A future resolved by repeating `attempt()` whenever fd is ready
        (readable, or writable when `write`) until it stops raising
        BlockingIOError / InterruptedError."""
        def on_ready(fut):
            try:
                if fut.done():
                    return
                try:
                    result = attempt()
                except (BlockingIOError, InterruptedError):
                    return
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as exc:
                    fut.set_exception(exc)
                else:
                    fut.set_result(result)
            finally:
                # The exception's traceback holds this frame: without this
                # the future and its exception would refer to each other
                # (a cycle asyncio's sock_* methods avoid the same way).
                fut = None

        def cleanup(_):
            # Unless another operation has taken the fd over meanwhile
            # (which cancelled our handle).
            if not handle.cancelled() and not self.is_closed():
                self._clear_fd_handler(fd, write)

        fut = self.create_future()
        self._ensure_fd_no_transport(fd)
        handle = self._set_fd_handler(fd, write, on_ready, (fut,))
        fut.add_done_callback(cleanup)
        return fut

    async def _sock_call(self, sock, write, attempt):
        """`attempt()` now, and again each time `sock` is ready until it no
        longer raises BlockingIOError / InterruptedError."""
        _check_socket(self, sock)
        try:
            return attempt()
        except (BlockingIOError, InterruptedError):
            pass
        return await self._wait_fd(sock.fileno(), write, attempt)

    async def sock_recv(self, sock, n):
        return await self._sock_call(sock, False, lambda: sock.recv(n))

    async def sock_recv_into(self, sock, buf):
        return await self._sock_call(sock, False, lambda: sock.recv_into(buf))

    async def sock_recvfrom(self, sock, bufsize):
        return await self._sock_call(sock, False, lambda: sock.recvfrom(bufsize))

    async def sock_recvfrom_into(self, sock, buf, nbytes=0):
        return await self._sock_call(sock, False, lambda: sock.recvfrom_into(buf, nbytes or len(buf)))

    async def sock_sendall(self, sock, data):
        # As asyncio's: the data as given first (a view that is not
        # contiguous fails there, with the socket module's BufferError).
        _check_socket(self, sock)
        try:
            sent = sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        if sent == len(data):
            return
        view = memoryview(data)
        total = len(view)
        progress = [sent]

        def attempt():
            n = sock.send(view[progress[0]:])
            progress[0] += n
            if progress[0] < total:
                raise BlockingIOError
            return None

        await self._wait_fd(sock.fileno(), True, attempt)

    async def sock_sendto(self, sock, data, address):
        return await self._sock_call(sock, True, lambda: sock.sendto(data, address))

    async def sock_connect(self, sock, address):
        _check_socket(self, sock)
        if sock.family == socket.AF_INET or (socket.has_ipv6 and sock.family == socket.AF_INET6):
            resolved = await self._ensure_resolved(
                address, family=sock.family, type=sock.type, proto=sock.proto, loop=self
            )
            _, _, _, _, address = resolved[0]
        try:
            sock.connect(address)
            return
        except (BlockingIOError, InterruptedError):
            pass

        def check_connected():
            err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err != 0:
                raise OSError(err, f"Connect call failed {address}")

        await self._wait_fd(sock.fileno(), True, check_connected)

    async def sock_accept(self, sock):
        def attempt():
            conn, address = sock.accept()
            conn.setblocking(False)
            return conn, address

        return await self._sock_call(sock, False, attempt)
