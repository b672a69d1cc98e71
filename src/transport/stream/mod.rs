//! Stream transports over `uv_tcp_t` (TCP) and `uv_pipe_t` (Unix sockets,
//! and the pipe transports of `connect_read_pipe` / `connect_write_pipe`):
//! `StreamCore`.
//!
//! - here: `StreamCore` and its state, whose `Reader` says where reads go
//!   (a plain or buffered protocol, or TLS)
//! - reader.rs: the plain and buffered read paths, and what EOF and errors do
//! - writer.rs: the write queue, batched per loop turn, and flow control
//! - tls.rs: the TLS reader (records done natively; asyncio's sslproto
//!   semantics) and its writes
//! - sink.rs: `ReadSink`, native code that takes a protocol's reads instead
//!   of its `data_received` (the native asyncio streams of src/streams)
//!
//! Life of the handle (a `UvStream`, uv.rs): `open` allocates it, and its
//! box keeps a strong reference to the core, so the core lives while libuv
//! may call back; `close_handle` (after connection_lost, or when the loop
//! closes) closes it, and libuv's close callback frees the box and that
//! reference.

mod reader;
mod sink;
mod socket;
mod tls;
mod writer;

pub(crate) use sink::ReadSink;

use pyo3::exceptions::{PyConnectionError, PyRuntimeError};
use pyo3::prelude::*;

use crate::capi::transport::traverse_state;
use crate::cell::NativeCell;
use crate::errors::{is_fatal_base, os_error, uv_error};
use crate::eventloop::{ClientPtr, LoopClient, LoopCore, LoopShared};
use crate::python;
use crate::transport::base::{HasBase, Transport, TransportBase};
use crate::transport::buffer::BufferView;
use crate::uv::transport::{LoopRef, ReadInto, StreamOwner, UvStream};
use sink::Sink;
use writer::{Outgoing, WriteQueue};

/// What the stream is to asyncio.
#[derive(Clone, Copy, PartialEq, Eq)]
enum StreamKind {
    /// A socket transport (TCP, Unix).
    Socket,
    /// A pipe transport (asyncio's `_UnixReadPipeTransport` /
    /// `_UnixWritePipeTransport` semantics): EOF schedules eof_received and
    /// then closes, whatever eof_received returns; writes after close() are
    /// dropped; errors speak of a "pipe transport".
    Pipe,
}

/// Where a stream's reads go.
enum Reader {
    /// `protocol.data_received(bytes)`, from the loop's read buffer.
    Plain,
    /// An asyncio.BufferedProtocol: libuv reads into the buffer lent by
    /// `get_buffer()` (held by the stream while the read is under way),
    /// then `buffer_updated(n)`; `error` is why no read could be made, with
    /// the message asyncio reports it under (boxed: rare, and a `PyErr`
    /// would make every stream's state larger by its size).
    Buffered { error: Option<Box<(PyErr, &'static str)>> },
    /// A TLS connection (tls.rs): the socket's reads feed the session, and
    /// the application protocol (plain or buffered) gets what it decrypts.
    Tls(Box<tls::Tls>),
}

impl Reader {
    fn for_protocol(buffered: bool) -> Reader {
        if buffered {
            Reader::Buffered { error: None }
        } else {
            Reader::Plain
        }
    }

    /// Over this many queued bytes, writes try the socket at once: the
    /// transport's high water mark, or for TLS the socket's own mark (the
    /// TLS marks are the application's).
    fn socket_high_water(&self, base: &TransportBase) -> usize {
        match self {
            Reader::Tls(_) => tls::SOCKET_HIGH_WATER,
            _ => base.high_water,
        }
    }
}

pub(crate) struct StreamState {
    base: TransportBase,
    handle: Option<UvStream<StreamCore>>,
    kind: StreamKind,
    reader: Reader,
    /// libuv is reading (uv_read_start is in force).
    reading: bool,
    /// Reading was held back after a full read, to resume before the poll.
    rearm: bool,
    /// This poll's read was left in the kernel for callbacks queued before
    /// it (`Transport::first_read_waits`): libuv's UV_ENOBUFS is ours.
    read_waits: bool,
    /// write_eof() was called; `shutdown_sent` once the EOF went out.
    eof: bool,
    shutdown_sent: bool,
    writes: WriteQueue,
    /// Future resolved once everything written has gone out (sendfile).
    drain_waiter: Option<Py<PyAny>>,
    /// loop.sendfile() owns the socket for now: write() must refuse.
    sendfile_in_progress: bool,
    /// Writes dropped before connection_lost was scheduled (pipes).
    dropped_writes: u32,
    /// The connection ended because a write failed.
    write_failed: bool,
    /// Native code that takes the reads meant for one protocol (sink.rs).
    sink: Option<Sink>,
    /// The connection ends with the core's `_end` (socket.rs), not with
    /// the Python transport's `_call_connection_lost`.
    native_end: bool,
    /// The protocol kept a short read's `bytes`, which was the loop's read
    /// buffer: short reads are copied for this transport from now on
    /// (readbuf.rs).
    copy_short_reads: bool,
}

impl HasBase for StreamState {
    fn base(&mut self) -> &mut TransportBase {
        &mut self.base
    }
}

impl StreamState {
    /// The core's own Python object (the handle box keeps it), while open.
    fn object(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.handle.as_ref()?.owner(py).map(Py::into_any)
    }
}

#[pyclass(module = "zuvrs._zuvrs", name = "StreamCore", frozen)]
pub struct StreamCore {
    /// The loop (set at creation, never changed).
    link: LoopRef,
    state: NativeCell<StreamState>,
}

impl Transport for StreamCore {
    type State = StreamState;

    #[inline]
    fn cell(&self) -> &NativeCell<StreamState> {
        &self.state
    }

    #[inline]
    fn shared(&self) -> &LoopShared {
        self.link.get()
    }

    fn connection_lost_callback<'py>(&self, wrapper: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = wrapper.py();
        if self.state.with(py, |st| st.native_end) {
            if let Some(me) = self.state.with(py, |st| st.object(py)) {
                return me.bind(py).getattr(pyo3::intern!(py, "_end"));
            }
        }
        wrapper.getattr(python::transport::_call_connection_lost(py))
    }
}

/// The stream's libuv callbacks (uv.rs's trampolines call these).
impl StreamOwner for StreamCore {
    type Lent = BufferView;
    type Write = Outgoing;

    #[inline]
    fn lend(&self, py: Python<'_>) -> ReadInto<BufferView> {
        self.read_target(py)
    }

    #[inline]
    fn read_done(&self, py: Python<'_>, nread: isize, lent: Option<BufferView>) {
        let scope = self.begin_io(py);
        self.on_read(py, nread, lent);
        self.leave_io(py, scope);
    }

    #[inline]
    fn write_done(&self, py: Python<'_>, write: Outgoing, status: i32) {
        let bytes = write.bytes();
        drop(write);
        if let Err(err) = self.on_write_done(py, bytes, status) {
            self.fail_in_callback(py, err);
        }
    }
}

impl LoopClient for StreamCore {
    /// Resumes a held read and flushes what this turn wrote.
    fn before_poll(&self, py: Python<'_>) -> PyResult<()> {
        if let Err(err) = self.rearm_read(py) {
            if is_fatal_base(py, &err) {
                return Err(err);
            }
            err.write_unraisable(py, None);
        }
        if self.is_tls(py) {
            self.tls_before_poll(py)?;
        }
        self.flush(py)
    }

    fn close_with_loop(&self, py: Python<'_>) {
        self.close_handle(py);
    }

    /// A TLS connection idle for a period gives back its record buffers.
    fn housekeeping(&self, py: Python<'_>) -> bool {
        self.tls_housekeeping(py)
    }
}

impl StreamCore {
    fn kind(&self, py: Python<'_>) -> StreamKind {
        self.state.with(py, |st| st.kind)
    }

    /// What write flow control counts (and get_write_buffer_size says): the
    /// queue and what is in flight; for TLS, as sslproto, the plaintext not
    /// yet encrypted and the ciphertext held in the session (the socket's
    /// queue has flow control of its own: tls.rs).
    fn buffer_size(&self, py: Python<'_>) -> usize {
        self.state.with(py, |st| match &st.reader {
            Reader::Tls(t) => t.unsent(py),
            _ => st.writes.size(),
        })
    }

    /// The write queue grew: the protocol may have to pause (for TLS, the
    /// socket's pause of SSLProtocol).
    fn queue_grew(&self, py: Python<'_>) -> PyResult<()> {
        if self.is_tls(py) {
            self.tls_socket_queue_grew(py);
            return Ok(());
        }
        self.pause_protocol_if_needed(py, self.buffer_size(py))
    }

    /// The write queue shrank: the protocol may resume (for TLS, the
    /// socket's resume of SSLProtocol).
    fn queue_shrank(&self, py: Python<'_>) -> PyResult<()> {
        if self.is_tls(py) {
            return self.tls_socket_queue_shrank(py);
        }
        self.resume_protocol_if_needed(py, self.buffer_size(py))
    }

    fn socket_pause_reading(&self, py: Python<'_>) {
        let pause = self.state.with(py, |st| {
            let pause = !st.base.closing && !st.base.paused;
            st.base.paused |= pause;
            pause
        });
        if pause {
            self.stop_read(py);
        }
    }

    fn socket_resume_reading(&self, py: Python<'_>) -> PyResult<()> {
        let resume = self.state.with(py, |st| {
            let resume = !st.base.closing && st.base.paused;
            st.base.paused &= !resume;
            resume
        });
        if resume {
            self.note_read_start(py);
            self.start_read(py).map_err(uv_error)?;
        }
        Ok(())
    }

    /// Drops what the kernel will not take at once (data written this turn
    /// is offered to it first, as asyncio's write() would have) and closes.
    fn socket_abort(&self, py: Python<'_>) -> PyResult<()> {
        if self.state.with(py, |st| st.base.conn_lost == 0 && !st.writes.writing() && st.writes.has_queued()) {
            self.flush(py)?;
        }
        self.force_close(py, None)
    }

    fn msg_read_error(&self, py: Python<'_>) -> &'static str {
        match self.kind(py) {
            StreamKind::Pipe => "Fatal read error on pipe transport",
            StreamKind::Socket => "Fatal read error on socket transport",
        }
    }

    fn msg_write_error(&self, py: Python<'_>) -> &'static str {
        match self.kind(py) {
            StreamKind::Pipe => "Fatal write error on pipe transport",
            StreamKind::Socket => "Fatal write error on socket transport",
        }
    }

    /// asyncio's `close()`: stop reading; connection_lost once the buffer
    /// is sent.
    fn close_transport(&self, py: Python<'_>) -> PyResult<()> {
        if self.state.with(py, |st| std::mem::replace(&mut st.base.closing, true)) {
            return Ok(());
        }
        self.stop_read(py);
        let lose = self.state.with(py, |st| {
            let idle = st.writes.is_idle();
            if idle {
                st.base.conn_lost += 1;
            }
            idle
        });
        if lose {
            self.schedule_connection_lost(py, None)?;
        }
        Ok(())
    }

    /// asyncio's `_force_close`: drop pending data, stop reading, and
    /// schedule connection_lost(exc). A write still in flight is cancelled
    /// when the handle closes.
    fn force_close(&self, py: Python<'_>, exc: Option<Py<PyAny>>) -> PyResult<()> {
        let taken = self.state.with(py, |st| {
            if st.base.conn_lost > 0 {
                return None;
            }
            st.base.closing = true;
            st.base.conn_lost += 1;
            Some((st.writes.discard(), st.drain_waiter.take()))
        });
        let Some((dropped, waiter)) = taken else { return Ok(()) };
        self.stop_read(py);
        drop(dropped);
        if let Some(waiter) = waiter {
            let waiter = waiter.bind(py);
            if !python::future_call0(waiter, python::FutureMethod::Done)?.is_truthy()? {
                let exc = PyConnectionError::new_err("Connection is closed by peer");
                python::future_call1(waiter, python::FutureMethod::SetException, exc.into_value(py).bind(py))?;
            }
        }
        self.schedule_connection_lost(py, exc)
    }

    /// Closes the libuv handle (and with it the fd); called after
    /// connection_lost or when the loop closes.
    fn close_handle(&self, py: Python<'_>) {
        let handle = self.state.with(py, |st| {
            st.reading = false;
            st.handle.take()
        });
        if let Some(h) = handle {
            self.shared().unregister(py, ClientPtr(self));
            h.close();
        }
    }
}

#[pymethods]
impl StreamCore {
    /// Wraps a connected stream socket's fd (libuv takes the fd over) for
    /// the Python transport `wrapper`: TCP, or a Unix socket when `unix`.
    ///
    /// With `pipe`, `fd` is a pipe, FIFO or socket of a pipe transport; it
    /// must be one epoll accepts (libuv aborts on an fd epoll refuses).
    #[staticmethod]
    #[pyo3(signature = (loop_obj, fd, wrapper, unix=false, pipe=false))]
    pub(super) fn open(
        py: Python<'_>,
        loop_obj: &Bound<'_, LoopCore>,
        fd: i32,
        wrapper: Py<PyAny>,
        unix: bool,
        pipe: bool,
    ) -> PyResult<Py<StreamCore>> {
        let unix = unix || pipe;
        let link = LoopRef::new(loop_obj);
        // A closed loop refuses before anything is made.
        link.get().uv_loop(py)?;
        let core = Py::new(
            py,
            StreamCore {
                link,
                state: NativeCell::new(StreamState {
                    base: TransportBase::new(py, loop_obj.clone().into_any().unbind(), wrapper)?,
                    handle: None,
                    kind: if pipe { StreamKind::Pipe } else { StreamKind::Socket },
                    reader: Reader::Plain,
                    reading: false,
                    rearm: false,
                    read_waits: false,
                    eof: false,
                    shutdown_sent: false,
                    writes: WriteQueue::default(),
                    drain_waiter: None,
                    sendfile_in_progress: false,
                    dropped_writes: 0,
                    write_failed: false,
                    sink: None,
                    native_end: false,
                    copy_short_reads: false,
                }),
            },
        )?;
        let me = core.get();
        // (TCP gets TCP_NODELAY, as asyncio sets it on every TCP transport.)
        let h = UvStream::open(py, &me.link, &core, fd, unix)?;
        me.state.with(py, |st| st.handle = Some(h));
        me.shared().register(py, ClientPtr(me as *const StreamCore));
        Ok(core)
    }

    /// A core on a TCP connection zuvrs accepted or connected, for the
    /// plain socket transport `transport` (`plain`: of the class itself),
    /// with its protocol connected and connection_made scheduled: see
    /// socket.rs.
    #[staticmethod]
    #[pyo3(signature = (loop_obj, fd, transport, protocol, waiter, server, plain))]
    #[allow(clippy::too_many_arguments)]
    fn open_connected(
        py: Python<'_>,
        loop_obj: &Bound<'_, LoopCore>,
        fd: &Bound<'_, pyo3::types::PyInt>,
        transport: &Bound<'_, PyAny>,
        protocol: &Bound<'_, PyAny>,
        waiter: Option<&Bound<'_, PyAny>>,
        server: Option<&Bound<'_, PyAny>>,
        plain: bool,
    ) -> PyResult<Py<StreamCore>> {
        Self::open_tcp_connected(py, loop_obj, fd, transport, protocol, waiter, server, plain)
    }

    /// Starts delivering data (asyncio starts reading after connection_made).
    fn start_reading(&self, py: Python<'_>) -> PyResult<()> {
        self.state.with(py, |st| st.base.started = true);
        self.note_read_start(py);
        self.start_read(py).map_err(uv_error)
    }

    /// Pauses reading (for TLS: decrypting; the socket goes on reading).
    fn pause_reading(&self, py: Python<'_>) {
        self.reading_paused(py, true);
        if self.is_tls(py) {
            self.tls_pause_reading(py)
        } else {
            self.socket_pause_reading(py)
        }
    }

    fn resume_reading(&self, py: Python<'_>) -> PyResult<()> {
        self.reading_paused(py, false);
        if self.is_tls(py) {
            self.tls_resume_reading(py);
            Ok(())
        } else {
            self.socket_resume_reading(py)
        }
    }

    fn is_reading(&self, py: Python<'_>) -> bool {
        if self.is_tls(py) {
            return self.tls_is_reading(py);
        }
        self.state.with(py, |st| !st.base.paused && !st.base.closing)
    }

    pub(crate) fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        if self.is_tls(py) {
            return self.tls_write(py, data);
        }
        self.write_data(py, data)
    }

    /// Writes every item, or nothing if one of them is not bytes-like.
    pub(crate) fn writelines(&self, py: Python<'_>, list_of_data: &Bound<'_, PyAny>) -> PyResult<()> {
        if self.is_tls(py) {
            return self.tls_writelines(py, list_of_data);
        }
        self.write_lines(py, list_of_data)
    }

    /// Sends EOF once the buffer is out (TLS has no half-close:
    /// NotImplementedError, as asyncio's TLS transport).
    fn write_eof(&self, py: Python<'_>) -> PyResult<()> {
        if self.is_tls(py) {
            return Err(self.tls_write_eof());
        }
        if self.state.with(py, |st| st.base.closing || st.eof) {
            return Ok(());
        }
        // asyncio's write() has tried the socket already: offer it what this
        // turn wrote, so that EOF goes out now when nothing is left, and a
        // failure is the connection's before write_eof() as there.
        if self.state.with(py, |st| st.base.conn_lost == 0 && !st.writes.writing() && st.writes.has_queued()) {
            self.flush(py)?;
        }
        let send = self.state.with(py, |st| {
            let send = !st.base.closing && !st.eof;
            st.eof |= send;
            send
        });
        if send {
            if let Some(errno) = self.maybe_shutdown(py) {
                return Err(os_error(errno));
            }
        }
        Ok(())
    }

    fn can_write_eof(&self, py: Python<'_>) -> bool {
        !self.is_tls(py)
    }

    /// Closes once the buffer is out (for TLS: the TLS shutdown first).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if self.is_tls(py) {
            return self.tls_close(py);
        }
        self.close_transport(py)
    }

    /// Closes at once, dropping what the kernel will not take now.
    fn abort(&self, py: Python<'_>) -> PyResult<()> {
        if self.is_tls(py) {
            return self.tls_app_abort(py);
        }
        self.socket_abort(py)
    }

    /// Closes the socket once its queue is out (the end of a TLS shutdown).
    fn _close_socket(&self, py: Python<'_>) -> PyResult<()> {
        self.close_transport(py)
    }

    /// asyncio's `_force_close(exc)`.
    fn _force_close(&self, py: Python<'_>, exc: Option<Py<PyAny>>) -> PyResult<()> {
        self.force_close(py, exc)
    }

    pub(crate) fn is_closing(&self, py: Python<'_>) -> bool {
        self.state.with(py, |st| match &st.reader {
            // 3.14's TLS transport is also closing when its socket is.
            Reader::Tls(t) => t.app_closed || (cfg!(Py_3_14) && st.base.closing),
            _ => st.base.closing,
        })
    }

    /// Whether the socket itself is closing (the plain transport under a
    /// TLS one: asyncio's socket transport's `is_closing()`).
    fn _socket_is_closing(&self, py: Python<'_>) -> bool {
        self.state.with(py, |st| st.base.closing)
    }

    /// Frees the libuv handle and fd (after connection_lost ran).
    fn _close_handle(&self, py: Python<'_>) {
        self.close_handle(py);
    }

    /// `SocketTransport._let_go_of_fd()` (socket.rs).
    fn _let_go_of_fd(&self, py: Python<'_>, transport: &Bound<'_, PyAny>) -> PyResult<()> {
        self.let_go_of_fd(py, transport)
    }

    /// The end of this connection is this core's `_end` rather than the
    /// Python transport's `_call_connection_lost` (socket.rs).
    fn _end_natively(&self, py: Python<'_>) {
        self.end_natively(py);
    }

    /// `SocketTransport._call_connection_lost(exc)`, natively (socket.rs).
    fn _end(&self, py: Python<'_>, exc: &Bound<'_, PyAny>) -> PyResult<()> {
        self.end(py, exc)
    }

    /// Resolves `future` once the write buffer is empty (now, if it is).
    fn _wait_drained(&self, py: Python<'_>, future: Py<PyAny>) -> PyResult<()> {
        let set = self.state.with(py, |st| {
            if st.drain_waiter.is_some() {
                return false;
            }
            st.drain_waiter = Some(future);
            true
        });
        if !set {
            return Err(PyRuntimeError::new_err("Empty waiter is already set"));
        }
        self.after_drain(py)
    }

    /// Marks loop.sendfile() running on this transport (writes refused).
    fn _set_sendfile_in_progress(&self, py: Python<'_>, active: bool) {
        self.state.with(py, |st| st.sendfile_in_progress = active)
    }

    /// Whether the protocol was told to pause writing.
    fn _protocol_paused(&self, py: Python<'_>) -> bool {
        self.state.with(py, |st| st.base.protocol_paused)
    }

    /// Whether pause_reading() is in force (asyncio's transports' `_paused`).
    fn _reading_paused(&self, py: Python<'_>) -> bool {
        self.state.with(py, |st| st.base.paused)
    }

    fn get_write_buffer_size(&self, py: Python<'_>) -> usize {
        self.buffer_size(py)
    }

    /// `get_extra_info('zuvrs_stats')`'s figures.
    fn _stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        self.stats_dict(py)
    }

    fn get_write_buffer_limits(&self, py: Python<'_>) -> (usize, usize) {
        self.state.with(py, |st| (st.base.low_water, st.base.high_water))
    }

    /// The write buffer's water marks, in bytes (see transports/_base.py).
    /// A TLS transport may also resume the protocol (sslproto's
    /// `_control_app_writing`, tls.rs).
    fn _set_water_marks(&self, py: Python<'_>, high: usize, low: usize) -> PyResult<()> {
        if self.is_tls(py) {
            return self.tls_set_water_marks(py, high, low);
        }
        self.set_water_marks(py, high, low, self.buffer_size(py))
    }

    /// Sets the protocol; `buffered` when it is an asyncio.BufferedProtocol.
    fn set_protocol(&self, py: Python<'_>, protocol: Py<PyAny>, buffered: bool) {
        let old = self.state.with(py, |st| {
            match &mut st.reader {
                Reader::Tls(_) => {}
                reader => *reader = Reader::for_protocol(buffered),
            }
            (st.base.protocol.replace(protocol), st.sink.take())
        });
        drop(old);
        self.tls_set_app_buffered(py, buffered);
    }

    /// Switches the transport to TLS with the application `protocol`, on
    /// `sslobj` (from `context.wrap_bio(incoming, outgoing, ...)`): None, or
    /// why the connection cannot be native (then nothing changed). The
    /// handshake starts with `_tls_start_handshake()`.
    #[pyo3(signature = (sslobj, incoming, outgoing, protocol, buffered, call_connection_made=true))]
    #[allow(clippy::too_many_arguments)]
    fn _start_tls(
        &self,
        py: Python<'_>,
        sslobj: &Bound<'_, PyAny>,
        incoming: &Bound<'_, PyAny>,
        outgoing: &Bound<'_, PyAny>,
        protocol: Py<PyAny>,
        buffered: bool,
        call_connection_made: bool,
    ) -> PyResult<Option<String>> {
        if self.kind(py) != StreamKind::Socket || self.is_tls(py) {
            return Ok(Some("not a plain socket transport".into()));
        }
        self.begin_tls(py, sslobj, incoming, outgoing, protocol, buffered, call_connection_made)
    }

    fn _tls_start_handshake(&self, py: Python<'_>) -> PyResult<()> {
        self.tls_start_handshake(py)
    }

    /// The socket's connection_lost has run: whether the application's
    /// connection_lost is due (asyncio's rules); the TLS state ends.
    fn _tls_connection_lost(&self, py: Python<'_>) -> bool {
        self.tls_connection_lost(py)
    }

    /// Whether the handshake is still going (its timeout fired).
    fn _tls_handshaking(&self, py: Python<'_>) -> bool {
        self.tls_handshaking(py)
    }

    /// Whether the shutdown is still going (its timeout fired).
    fn _tls_shutting_down(&self, py: Python<'_>) -> bool {
        self.tls_shutting_down(py)
    }

    /// Makes `wrapper` the Python transport this core calls back (a TLS
    /// transport takes over from the socket transport it started on).
    fn _set_wrapper(&self, py: Python<'_>, wrapper: Py<PyAny>) {
        let old = self.state.with(py, |st| {
            // The new transport ends the connection its own way.
            st.native_end = false;
            std::mem::replace(&mut st.base.wrapper, wrapper)
        });
        drop(old);
    }

    /// Resumes the socket's reading (start_tls: a paused transport's
    /// handshake needs the peer's bytes).
    fn _resume_socket_reading(&self, py: Python<'_>) -> PyResult<()> {
        self.socket_resume_reading(py)
    }

    fn _tls_set_read_limits(&self, py: Python<'_>, high: usize, low: usize) -> PyResult<()> {
        self.tls_set_read_limits(py, high, low)
    }

    fn _tls_read_limits(&self, py: Python<'_>) -> (usize, usize) {
        self.tls_read_limits(py)
    }

    fn _tls_read_buffer_size(&self, py: Python<'_>) -> usize {
        self.tls_read_buffer_size(py)
    }

    /// sslproto's `pause_writing()` / `resume_writing()` (its socket's flow
    /// control; tests reach them through `transport._ssl_protocol`): False
    /// if already so.
    fn _tls_pause_ssl_writing(&self, py: Python<'_>) -> bool {
        self.tls_pause_ssl_writing(py)
    }

    fn _tls_resume_ssl_writing(&self, py: Python<'_>) -> PyResult<bool> {
        self.tls_resume_ssl_writing(py)
    }

    /// sslproto's `_test__append_write_backlog(data)`.
    fn _tls_append_write_backlog(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        self.tls_append_write_backlog(py, data)
    }

    /// Whether the TLS application transport is closed (see tls.rs).
    fn _tls_app_closed(&self, py: Python<'_>) -> bool {
        self.tls_app_closed(py)
    }

    /// Whether the TLS session holds its record buffers between records
    /// (tests: the loop's housekeeping frees them after an idle period).
    fn _tls_buffers_held(&self, py: Python<'_>) -> bool {
        self.tls_buffers_held(py)
    }

    /// asyncio's name of the TLS state (None for a plain transport).
    fn _tls_state(&self, py: Python<'_>) -> Option<&'static str> {
        self.tls_state_name(py)
    }

    fn get_protocol(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.protocol(py)
    }

    /// The context the protocol's callbacks run in (for those the Python
    /// transport schedules: connection_made).
    fn _protocol_context(&self, py: Python<'_>) -> Py<PyAny> {
        self.with_base(py, |b| b.context.clone_ref(py))
    }

    /// Drops the protocol (after connection_lost), breaking the cycle
    /// transport -> protocol -> transport. With `transport` (the connection
    /// is over: nothing calls back into the transport any more), drops the
    /// transport too, so transport and core are freed by reference counting
    /// rather than left to the cyclic GC.
    #[pyo3(signature = (transport=false))]
    fn _forget_protocol(&self, py: Python<'_>, transport: bool) {
        self.forget_protocol(py, transport);
    }

    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        self.link.visit(&visit)?;
        traverse_state(&self.state, &visit, |st| {
            st.base.visit(&visit)?;
            if let Some(sink) = &st.sink {
                sink.visit(&visit)?;
            }
            visit.call(&st.drain_waiter)
        })
    }
}

impl StreamCore {
    /// See `_forget_protocol`.
    fn forget_protocol(&self, py: Python<'_>, transport: bool) {
        let old = self.state.with(py, |st| {
            let wrapper = transport.then(|| std::mem::replace(&mut st.base.wrapper, py.None()));
            (st.base.protocol.take(), wrapper, st.sink.take())
        });
        drop(old);
        if transport {
            self.tls_release_session(py);
        }
    }
}

#[cfg(test)]
mod tests {
    /// Every connection holds a `Reader`: a variant that is rare (a
    /// BufferedProtocol's error, TLS) must not make it larger than a
    /// pointer and its tag, or every idle connection pays for it.
    #[test]
    fn a_reader_is_two_words() {
        assert!(std::mem::size_of::<super::Reader>() <= 2 * std::mem::size_of::<usize>());
    }
}
