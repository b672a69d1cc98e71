"""zuvrs.Loop: the public loop class.

The native base (``_zuvrs.LoopCore``) owns the libuv loop and everything
that runs per callback: the turn, the ready queue, timers, fd watchers and
the ``call_*`` methods. asyncio's ``BaseEventLoop`` supplies the rest of
the loop API that is not about I/O (tasks, futures, executors, exception
handling, async generators, debug mode), so those behave exactly as in the
stdlib. This module adds the glue between them: run_forever's set-up,
close, add_reader/add_writer argument handling and signals.
"""

import asyncio
import errno
import os
import signal
import socket
import sys
import threading
import weakref
from asyncio import coroutines, events, format_helpers
from asyncio.log import logger

from . import _loop_registry, _zuvrs
from ._all_errors import AllErrorsMixin
from ._network import NetworkMixin
from ._process import ChildReaper

__all__ = ("Loop",)


def _fileobj_to_fd(fileobj):
    """A file descriptor from an int or an object with fileno(), with the
    errors asyncio's selector loop raises."""
    if isinstance(fileobj, int):
        fd = fileobj
    else:
        try:
            fd = int(fileobj.fileno())
        except (AttributeError, TypeError, ValueError):
            raise ValueError(f"Invalid file object: {fileobj!r}") from None
    if fd < 0:
        raise ValueError(f"Invalid file descriptor: {fd}")
    return fd


# 3.13+ lists a callback's arguments in reprs and error messages only in
# debug mode (gh-112997): _format_callback_source() takes debug=.
_FORMAT_TAKES_DEBUG = sys.version_info >= (3, 13)

# The largest descriptor the selector's C int takes.
_C_INT_MAX = 2**31 - 1

# Before 3.12, asyncio's C Task and Future fetch `loop.call_soon` as an
# attribute for every callback they schedule with a context (every task
# step, every done callback), which makes and frees a bound method each time;
# 3.12 calls it as a method. Up to 3.11 the loop keeps one bound method in
# its instance dict, where that lookup finds it (docs/performance.md has the
# measured effect).
_CACHE_CALL_SOON = sys.version_info < (3, 12)

# asyncio.iscoroutinefunction() is deprecated from 3.14 (DeprecationWarning
# on every call); asyncio itself uses the private, silent one.
_iscoroutinefunction = getattr(coroutines, "_iscoroutinefunction", None) or coroutines.iscoroutinefunction


def _ignore_signal(signum, frame):
    """Python-level handler for signals the loop dispatches itself: the C
    handler has already written the signal number to the wakeup socket."""


# The write ends of the loops' wakeup sockets. Signal bytes are forwarded to
# the wakeup fd a loop displaced only when that is not one of these: a loop's
# bytes are for the loop that holds the wakeup fd, and two loops forwarding
# to each other would pass the same bytes back and forth.
_LOOP_WAKEUP_SOCKETS: "weakref.WeakSet[socket.socket]" = weakref.WeakSet()


def _is_loop_wakeup_fd(fd):
    return any(sock.fileno() == fd for sock in _LOOP_WAKEUP_SOCKETS)


# The task classes whose steps the slowest-callbacks list names by the task
# (as asyncio's debug mode does): the C Task and the pure-Python one.
_TASK_TYPES = tuple({asyncio.Task, getattr(asyncio.tasks, "_PyTask", asyncio.Task)})


class Loop(_zuvrs.LoopCore, AllErrorsMixin, NetworkMixin, asyncio.BaseEventLoop):
    """A libuv event loop implementing asyncio.AbstractEventLoop.

    `stats`: whether the loop times its turns for ``stats()`` (None: the
    default of zuvrs.stats.enable(), see docs/metrics.md).
    """

    def __init__(self, *, stats=None):
        asyncio.BaseEventLoop.__init__(self)
        self._stats_on = _loop_registry.registry.stats_default if stats is None else bool(stats)
        _loop_registry.register(self)
        self._signal_handlers = {}
        # Socket pair whose write end is the signal wakeup fd; created lazily.
        self._wakeup_r = self._wakeup_w = None
        # The wakeup fd that was set before this loop claimed it, or None
        # while the loop does not hold it.
        self._wakeup_previous = None
        # Where the signal bytes the loop reads are forwarded while it holds
        # the wakeup fd: the program's own wakeup fd (None if there was none).
        self._wakeup_forward = None
        # fd -> open socket transport, as asyncio keeps it (add_reader and
        # friends refuse a transport's fd). asyncio's own transports, which
        # zuvrs uses for what a native core cannot serve, register in
        # _transports, which must be weak (they never remove themselves);
        # native transports remove themselves when they let go of their
        # fd, from a plain dict (a weak one costs about 1.5 us a connection).
        self._transports = weakref.WeakValueDictionary()
        self._native_transports = {}
        # fd -> the object add_reader / add_writer was given for it (not an int).
        self._watched_objects = {}
        # Listening Unix socket -> (path, inode), removed when the server closes.
        self._unix_socket_files = {}
        self._child_reaper = ChildReaper(self)
        if _CACHE_CALL_SOON and type(self).call_soon is _zuvrs.LoopCore.call_soon:
            # (not when a subclass defines its own call_soon)
            self.__dict__["call_soon"] = _zuvrs.LoopCore.call_soon.__get__(self)
        if type(self).time is not _zuvrs.LoopCore.time:
            self._set_python_clock(True)
        if type(self).create_future is not _zuvrs.LoopCore.create_future:
            self._set_python_futures(True)

    # asyncio's loop reads its own time() for its timers, so code that
    # patches loop.time (tests, mostly: mock.patch.object(loop, "time"))
    # steers them; the native timers follow a patched time() likewise.
    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if name == "time":
            self._set_python_clock(True)
        elif name == "create_future":
            self._set_python_futures(True)

    def __delattr__(self, name):
        super().__delattr__(name)
        if name == "time":
            self._set_python_clock(type(self).time is not _zuvrs.LoopCore.time)
        elif name == "create_future":
            self._set_python_futures(type(self).create_future is not _zuvrs.LoopCore.create_future)

    # -- running ---------------------------------------------------------

    def run_forever(self):
        """Run until stop() is called."""
        self._check_closed()
        self._check_running()
        self._set_coroutine_origin_tracking(self._debug)
        old_agen_hooks = sys.get_asyncgen_hooks()
        in_main_thread = threading.current_thread() is threading.main_thread()
        try:
            self._thread_id = threading.get_ident()
            if in_main_thread:
                # Wake the poll for Ctrl-C and other Python-handled signals.
                self._claim_wakeup_fd(quiet=True)
            sys.set_asyncgen_hooks(
                firstiter=self._asyncgen_firstiter_hook,
                finalizer=self._asyncgen_finalizer_hook,
            )
            events._set_running_loop(self)
            self._run_loop()
        finally:
            self._stopping = False
            self._thread_id = None
            events._set_running_loop(None)
            self._set_coroutine_origin_tracking(False)
            sys.set_asyncgen_hooks(*old_agen_hooks)
            if in_main_thread:
                self._release_wakeup_fd()

    def close(self):
        """Close the loop: drop pending callbacks and free libuv resources."""
        if self.is_running():
            raise RuntimeError("Cannot close a running event loop")
        if self._closed:
            return
        # In a forked child, the loop first gets kernel objects of its own:
        # every handle closed below would otherwise be unregistered from
        # the epoll set the parent still uses.
        self._adopt_after_fork()
        if sys.is_finalizing():
            self._signal_handlers.clear()
        else:
            for sig in list(self._signal_handlers):
                self.remove_signal_handler(sig)
        asyncio.BaseEventLoop.close(self)
        self._child_reaper.close()
        # Native transports still open lose their fd with the loop (libuv
        # closes it); asyncio's own transports are left as asyncio leaves them.
        for transport in list(self._native_transports.values()):
            transport._release_fd()
        self._free_core()
        self._watched_objects.clear()
        if self.__dict__.get("call_soon") == _zuvrs.LoopCore.call_soon.__get__(self):
            # The cached bound method refers to the loop: drop the cycle.
            del self.__dict__["call_soon"]
        for sock in (self._wakeup_r, self._wakeup_w):
            if sock is not None:
                sock.close()
        self._wakeup_r = self._wakeup_w = None

    # -- metrics -------------------------------------------------------------

    def stats(self, reset=False):
        """A snapshot of the loop's figures (a zuvrs.stats.LoopStats); with
        `reset`, they start again from zero afterwards."""
        from .stats import LoopStats

        return LoopStats._from_native(self._stats(reset), self.time())

    def _describe_callback(self, handle, callback):
        # A callback of the slowest list, named as debug mode names it: its
        # handle, or for a task step the task, with the task's coroutine
        # and where that is suspended now.
        try:
            owner = getattr(callback, "__self__", None)
            if not isinstance(owner, _TASK_TYPES):
                return str(handle), None, None
            coro = owner.get_coro()
            qualname = getattr(coro, "__qualname__", None) or type(coro).__qualname__
            frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
            where = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else None
            return repr(owner), qualname, where
        except Exception:
            name = getattr(callback, "__qualname__", None) or type(callback).__qualname__
            return f"<{type(handle).__name__} {name}()>", None, None

    # -- hooks called by the native core ------------------------------------

    def _report_callback_error(self, handle, exc, callback, args):
        if _FORMAT_TAKES_DEBUG:
            source = format_helpers._format_callback_source(callback, args, debug=self.get_debug())
        else:
            source = format_helpers._format_callback_source(callback, args)
        context = {
            "message": f"Exception in callback {source}",
            "exception": exc,
            "handle": handle,
        }
        if handle._source_traceback:
            context["source_traceback"] = handle._source_traceback
        self.call_exception_handler(context)

    def _extract_source_traceback(self):
        # Debug mode: where call_soon/call_later was called. The native
        # call_* methods have no frame, so the caller is the frame above.
        return format_helpers.extract_stack(sys._getframe(1))

    def _warn_slow_callback(self, handle, callback, seconds):
        owner = getattr(callback, "__self__", None)
        what = repr(owner) if isinstance(owner, asyncio.Task) else str(handle)
        logger.warning("Executing %s took %.3f seconds", what, seconds)

    def _warn_slow_io(self, transport, seconds):
        # A protocol callback run from a native transport's I/O took too
        # long (debug mode): asyncio would report its _read_ready handle.
        logger.warning("Executing <Handle %s._read_ready()> took %.3f seconds", type(transport).__name__, seconds)

    # -- file descriptor watching ---------------------------------------------
    # (_add_reader and friends are asyncio's selector-loop names, which its
    # own transports call: see transports/_fallback.py.)

    def _add_reader(self, fd, callback, *args):
        self._check_closed()
        return self._set_fd_handler(fd, False, callback, args)

    def _remove_reader(self, fd):
        if self.is_closed():
            return False
        return self._clear_fd_handler(fd, False)

    def _add_writer(self, fd, callback, *args):
        self._check_closed()
        return self._set_fd_handler(fd, True, callback, args)

    def _remove_writer(self, fd):
        if self.is_closed():
            return False
        return self._clear_fd_handler(fd, True)

    def add_reader(self, fd, callback, *args):
        """Call callback(*args) whenever fd is readable."""
        self._watch(fd, False, callback, args)

    def remove_reader(self, fd):
        """Stop watching fd for reading; True if it was watched."""
        return self._unwatch(fd, False)

    def add_writer(self, fd, callback, *args):
        """Call callback(*args) whenever fd is writable."""
        self._watch(fd, True, callback, args)

    def remove_writer(self, fd):
        """Stop watching fd for writing; True if it was watched."""
        return self._unwatch(fd, True)

    def _watch(self, fileobj, write, callback, args):
        self._ensure_fd_no_transport(fileobj)
        fd = _fileobj_to_fd(fileobj)
        self._check_closed()
        if fd > _C_INT_MAX:
            raise OverflowError("Python int too large to convert to C int")
        self._set_fd_handler(fd, write, callback, args)
        if fileobj is not fd:
            # As the selector keeps it: a socket closed meanwhile is still
            # found (by identity) when its watch is removed.
            self._watched_objects.setdefault(fd, fileobj)

    def _unwatch(self, fileobj, write):
        self._ensure_fd_no_transport(fileobj)
        try:
            fd = _fileobj_to_fd(fileobj)
        except ValueError:
            fd = next((f for f, obj in self._watched_objects.items() if obj is fileobj), None)
            if fd is None:
                raise
        if self.is_closed() or fd > _C_INT_MAX:
            return False
        removed = self._clear_fd_handler(fd, write)
        if fd in self._watched_objects and self._fd_handlers(fd) == (None, None):
            del self._watched_objects[fd]
        return removed

    # -- signals ----------------------------------------------------------------

    def _ensure_wakeup_socket(self):
        if self._wakeup_r is None:
            r, w = socket.socketpair()
            r.setblocking(False)
            w.setblocking(False)
            self._wakeup_r, self._wakeup_w = r, w
            _LOOP_WAKEUP_SOCKETS.add(w)
            self._set_fd_handler(r.fileno(), False, self._drain_wakeup_socket, ())

    def _claim_wakeup_fd(self, quiet=False):
        """Point signal.set_wakeup_fd at this loop (main thread only).

        A wakeup fd the program had set keeps receiving the signal bytes:
        the loop forwards what it reads to it (see _forward_signal_bytes)
        and puts it back when it lets go.
        """
        if self._wakeup_previous is not None:
            return
        self._ensure_wakeup_socket()
        try:
            previous = signal.set_wakeup_fd(self._wakeup_w.fileno(), warn_on_full_buffer=False)
        except (ValueError, OSError) as exc:
            if quiet:
                return
            raise RuntimeError(str(exc)) from None
        self._wakeup_previous = previous
        if previous >= 0 and not _is_loop_wakeup_fd(previous):
            self._wakeup_forward = previous

    def _release_wakeup_fd(self):
        """Give the wakeup fd back once neither a run nor a handler needs it."""
        if self._wakeup_previous is None or self._signal_handlers or self.is_running():
            return
        previous, forward = self._wakeup_previous, self._wakeup_forward
        self._wakeup_previous = self._wakeup_forward = None
        mine = self._wakeup_w.fileno()
        try:
            current = signal.set_wakeup_fd(previous)
        except (ValueError, OSError) as exc:
            logger.info("set_wakeup_fd(%s) failed: %s", previous, exc)
            # Do not leave this loop's socket, closed with the loop, as the
            # wakeup fd.
            current = signal.set_wakeup_fd(-1)
        if current != mine:
            # Somebody (the program, another loop) set a wakeup fd of their
            # own while this loop held it: it stays, as with asyncio, whose
            # run_forever does not touch the wakeup fd.
            try:
                signal.set_wakeup_fd(current)
            except (ValueError, OSError) as exc:
                logger.info("set_wakeup_fd(%s) failed: %s", current, exc)
        # Signals that arrived since the last drain (say, in the run's last
        # turn, which does not poll again) still reach the program's fd.
        leftover = self._read_wakeup_socket()
        if leftover and forward is not None:
            self._forward_signal_bytes(forward, leftover)

    def _read_wakeup_socket(self):
        """Everything waiting in the wakeup socket (b"" if nothing)."""
        chunks = []
        while True:
            try:
                data = self._wakeup_r.recv(4096)
            except InterruptedError:
                continue
            except (BlockingIOError, OSError):
                break
            if not data:
                break
            chunks.append(data)
        return b"".join(chunks)

    @staticmethod
    def _forward_signal_bytes(fd, data):
        """Write signal numbers read from the wakeup socket to the program's
        wakeup fd, which the C signal handler would have written them to.
        As the C handler does, bytes that do not fit (the fd must be
        non-blocking) and errors (a closed fd) are dropped."""
        while data:
            try:
                data = data[os.write(fd, data):]
            except InterruptedError:
                continue
            except OSError:
                return

    def _drain_wakeup_socket(self):
        # Running this Python function also lets the interpreter run any
        # pending Python-level signal handler (e.g. raise KeyboardInterrupt).
        data = self._read_wakeup_socket()
        if data:
            if self._wakeup_forward is not None:
                self._forward_signal_bytes(self._wakeup_forward, data)
            for signum in data:
                handle = self._signal_handlers.get(signum)
                if handle is None:
                    continue
                if handle._cancelled:
                    self.remove_signal_handler(signum)
                else:
                    self.call_soon(handle._run)

    @staticmethod
    def _validate_signal(sig):
        if not isinstance(sig, int):
            raise TypeError(f"sig must be an int, not {sig!r}")
        if sig not in signal.valid_signals():
            raise ValueError(f"invalid signal number {sig}")

    def add_signal_handler(self, sig, callback, *args):
        """Call callback(*args) in the loop whenever signal sig arrives."""
        if coroutines.iscoroutine(callback) or _iscoroutinefunction(callback):
            raise TypeError("coroutines cannot be used with add_signal_handler()")
        self._validate_signal(sig)
        self._check_closed()
        self._claim_wakeup_fd()
        self._signal_handlers[sig] = events.Handle(callback, args, self, None)
        try:
            signal.signal(sig, _ignore_signal)
            signal.siginterrupt(sig, False)
        except OSError as exc:
            del self._signal_handlers[sig]
            self._release_wakeup_fd()
            if exc.errno == errno.EINVAL:
                raise RuntimeError(f"sig {sig:d} cannot be caught") from None
            raise

    def remove_signal_handler(self, sig):
        """Remove the handler of signal sig; True if there was one."""
        self._validate_signal(sig)
        if self._signal_handlers.pop(sig, None) is None:
            return False
        default = signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL
        try:
            signal.signal(sig, default)
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                raise RuntimeError(f"sig {sig:d} cannot be caught") from None
            raise
        self._release_wakeup_fd()
        return True
