//! Stream transports over `uv_tcp_t` (TCP) and `uv_pipe_t` (Unix sockets,
//! and the pipe transports of `connect_read_pipe` / `connect_write_pipe`).
//!
//! Reads land in the loop's read buffer, itself a `bytes` object: a read
//! that fills it is passed to `protocol.data_received` as is, and a shorter
//! one as an exactly-sized copy (see `ReadBuffer`). A BufferedProtocol's
//! reads go straight into the buffer its `get_buffer()` lends. Writes are batched per loop turn: `write()`
//! only queues (`bytes` by reference, never copied; other buffers copied) and
//! links the transport into the loop's flush list; before the loop next polls,
//! `flush_all` tries one vectored `uv_try_write` per transport, and what the
//! socket does not take goes to one vectored `uv_write` at a time. So a
//! response written as header + body costs one system call, like one write. Flow control calls `pause_writing` / `resume_writing` at the water
//! marks, as asyncio's selector transports do.
//!
//! Life of the handle: `open_tcp` allocates it and keeps a strong reference
//! to the core in the handle's box, so the core lives while libuv may call
//! back; `close_handle` (after connection_lost, or when the loop closes)
//! calls `uv_close`, whose callback frees the box and that reference.

use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::mem::MaybeUninit;
use std::ptr;

use pyo3::exceptions::{PyKeyboardInterrupt, PyRuntimeError, PySystemExit, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyMemoryView};
use smallvec::SmallVec;

use crate::errors::uv_error;
use crate::eventloop::{LoopCore, LoopState};
use crate::uv::{sys, HandleBox, UvHandle};

/// asyncio's defaults for the write buffer water marks.
const DEFAULT_HIGH_WATER: usize = 64 * 1024;
/// After this many writes to a lost connection asyncio starts warning.
const LOG_THRESHOLD_FOR_CONNLOST_WRITES: u32 = 5;
/// Size of the loop's read buffer: the most one read takes.
const READ_BUF_SIZE: usize = 256 * 1024;

/// The buffer every stream of a loop reads into (libuv asks for memory
/// just before each read and reports the read at once, so one suffices).
///
/// It is a `bytes` object of READ_BUF_SIZE. A read that fills it (bulk
/// transfers) is handed to data_received without a copy; if the protocol
/// kept no reference (asyncio's StreamReader copies what it gets), the same
/// object serves the next read. Besides a copy this saves a large
/// allocation per read, which glibc serves by growing and trimming the heap:
/// page faults that cost more than the copy.
#[derive(Default)]
pub(crate) struct ReadBuffer {
    bytes: Option<Py<PyBytes>>,
}

impl ReadBuffer {
    /// Memory for the next read: READ_BUF_SIZE bytes, or None when out of
    /// memory.
    fn get(&mut self, py: Python<'_>) -> Option<*mut u8> {
        if self.bytes.is_none() {
            // SAFETY: a NULL source makes an uninitialised bytes object,
            // which only this buffer sees until a read has filled it.
            let raw =
                unsafe { pyo3::ffi::PyBytes_FromStringAndSize(ptr::null(), READ_BUF_SIZE as pyo3::ffi::Py_ssize_t) };
            if raw.is_null() {
                drop(PyErr::take(py));
                return None;
            }
            self.bytes = Some(unsafe { Bound::from_owned_ptr(py, raw).cast_into_unchecked::<PyBytes>() }.unbind());
        }
        let bytes = self.bytes.as_ref().expect("allocated above");
        Some(unsafe { pyo3::ffi::PyBytes_AsString(bytes.as_ptr()) } as *mut u8)
    }

    /// The buffer as plain scratch memory (READ_BUF_SIZE bytes) for reads
    /// that are always copied out (datagrams): MemoryError when it cannot
    /// be allocated.
    pub(crate) fn scratch(&mut self, py: Python<'_>) -> PyResult<(*mut u8, usize)> {
        self.get(py).map(|p| (p, READ_BUF_SIZE)).ok_or_else(|| pyo3::exceptions::PyMemoryError::new_err(()))
    }

    /// A copy of the first `n` bytes of the buffer (`n` at most what the
    /// last read into `scratch` put there).
    pub(crate) fn copy<'py>(&self, py: Python<'py>, n: usize) -> Bound<'py, PyBytes> {
        match self.bytes.as_ref() {
            Some(b) => PyBytes::new(py, &b.bind(py).as_bytes()[..n]),
            None => PyBytes::new(py, &[]),
        }
    }

    /// What the last read put in the buffer, as a `bytes` of its own: the
    /// buffer itself when the read filled it.
    fn take<'py>(&mut self, py: Python<'py>, n: usize) -> Option<Bound<'py, PyBytes>> {
        let bytes = self.bytes.as_ref()?.bind(py);
        if n < READ_BUF_SIZE {
            return Some(PyBytes::new(py, &bytes.as_bytes()[..n]));
        }
        self.bytes.take().map(|b| b.into_bound(py))
    }

    /// Takes back a full read's `bytes` once the protocol is done with it,
    /// if nobody else holds it.
    fn give_back(&mut self, bytes: Bound<'_, PyBytes>) {
        if self.bytes.is_some()
            || unsafe { pyo3::ffi::Py_REFCNT(bytes.as_ptr()) } != 1
            || bytes.as_bytes().len() != READ_BUF_SIZE
        {
            return;
        }
        // SAFETY: the only reference is ours, so the object can be rewritten;
        // its cached hash (if anyone hashed it) must go with the contents.
        #[allow(deprecated)]
        unsafe {
            (*(bytes.as_ptr() as *mut pyo3::ffi::PyBytesObject)).ob_shash = -1;
        }
        self.bytes = Some(bytes.unbind());
    }
}

/// The libuv stream behind a transport: TCP, or a pipe for Unix sockets.
#[repr(C)]
union StreamHandle {
    tcp: std::mem::ManuallyDrop<sys::uv_tcp_t>,
    pipe: std::mem::ManuallyDrop<sys::uv_pipe_t>,
}

#[repr(C)]
struct StreamBox {
    /// Must stay the first field (see `HandleBox`); both variants start
    /// with `uv_stream_t`.
    handle: StreamHandle,
    loop_state: *mut LoopState,
    /// The core, kept alive until libuv is done with the handle.
    keep_alive: Option<Py<StreamCore>>,
}

// SAFETY: repr(C) with the uv handle first.
unsafe impl HandleBox for StreamBox {}

/// Bytes waiting to be written.
enum Chunk {
    /// An immutable `bytes`, referenced, from `offset` on.
    Shared(Py<PyBytes>, usize),
    /// A copy of a mutable buffer.
    Owned(Vec<u8>, usize),
}

impl Chunk {
    fn remaining(&self, _py: Python<'_>) -> &[u8] {
        match self {
            // SAFETY: a bytes object's buffer is immutable and lives as long
            // as the reference this chunk holds.
            Chunk::Shared(b, off) => unsafe {
                let p = b.as_ptr();
                let data = pyo3::ffi::PyBytes_AsString(p) as *const u8;
                let len = pyo3::ffi::PyBytes_Size(p) as usize;
                &std::slice::from_raw_parts(data, len)[*off..]
            },
            Chunk::Owned(v, off) => &v[*off..],
        }
    }

    fn advance(&mut self, n: usize) {
        match self {
            Chunk::Shared(_, off) | Chunk::Owned(_, off) => *off += n,
        }
    }
}

/// One in-flight `uv_write` and the buffers it points into.
#[repr(C)]
struct WriteReq {
    req: sys::uv_write_t,
    chunks: SmallVec<[Chunk; 4]>,
    bytes: usize,
}

struct StreamState {
    handle: Option<UvHandle<StreamBox>>,
    loop_state: *mut LoopState,
    loop_obj: Py<PyAny>,
    /// The Python transport (an asyncio.Transport) this core belongs to.
    wrapper: Py<PyAny>,
    protocol: Option<Py<PyAny>>,
    buffered: bool,
    /// start_reading() was called (connection_made has run).
    started: bool,
    reading: bool,
    paused: bool,
    closing: bool,
    conn_lost: u32,
    eof: bool,
    shutdown_sent: bool,
    queue: VecDeque<Chunk>,
    queued_bytes: usize,
    in_flight_bytes: usize,
    writing: bool,
    /// Registered in the loop's flush list (queued data not yet tried).
    flush_pending: bool,
    /// Future resolved once everything written has gone out (sendfile).
    drain_waiter: Option<Py<PyAny>>,
    /// BufferedProtocol: the buffer get_buffer() returned, which libuv is
    /// reading into, or why get_buffer() failed.
    read_view: Option<BufferView>,
    get_buffer_error: Option<PyErr>,
    /// loop.sendfile() owns the socket for now: write() must refuse.
    sendfile_in_progress: bool,
    high_water: usize,
    low_water: usize,
    protocol_paused: bool,
    /// A pipe transport (asyncio's `_UnixReadPipeTransport` /
    /// `_UnixWritePipeTransport` semantics): EOF schedules eof_received and
    /// then closes, whatever eof_received returns; writes after close() are
    /// dropped; errors speak of a "pipe transport".
    pipe_mode: bool,
    /// Writes dropped before connection_lost was scheduled (pipes).
    dropped_writes: u32,
}

#[pyclass(module = "zuvrs._zuvrs", name = "StreamCore", frozen)]
pub struct StreamCore {
    state: UnsafeCell<StreamState>,
}

// SAFETY: touched only with the GIL held.
unsafe impl Sync for StreamCore {}
unsafe impl Send for StreamCore {}

pub(crate) fn is_fatal_base(py: Python<'_>, err: &PyErr) -> bool {
    err.is_instance_of::<PyKeyboardInterrupt>(py) || err.is_instance_of::<PySystemExit>(py)
}

impl StreamCore {
    /// # Safety
    /// GIL held; no reference kept across calls into Python or libuv.
    #[allow(clippy::mut_from_ref)]
    #[inline]
    unsafe fn st(&self) -> &mut StreamState {
        unsafe { &mut *self.state.get() }
    }

    fn stream_ptr(&self) -> Option<*mut sys::uv_stream_t> {
        unsafe { self.st().handle.as_ref().map(|h| h.raw() as *mut sys::uv_stream_t) }
    }

    /// The loop state (GIL held; same borrowing rules as `st`).
    #[allow(clippy::mut_from_ref)]
    fn loop_state(&self) -> &mut LoopState {
        unsafe { &mut *self.st().loop_state }
    }

    /// Reports an exception raised by Python code run from a libuv callback:
    /// KeyboardInterrupt and SystemExit stop the loop and propagate.
    fn fail_in_callback(&self, py: Python<'_>, err: PyErr) {
        if is_fatal_base(py, &err) {
            self.loop_state().raise_later(err);
        } else {
            // Reporting itself failed: the exception handler raised. Nothing
            // better to do than the unraisable hook.
            err.write_unraisable(py, None);
        }
    }

    /// `wrapper._fatal_error(exc, message)` (asyncio's transport contract).
    fn fatal_error(&self, py: Python<'_>, exc: PyErr, message: &str) -> PyResult<()> {
        let wrapper = unsafe { self.st().wrapper.clone_ref(py) };
        wrapper.call_method1(py, pyo3::intern!(py, "_fatal_error"), (exc.into_value(py), message))?;
        Ok(())
    }

    fn msg_read_error(&self) -> &'static str {
        if unsafe { self.st().pipe_mode } {
            "Fatal read error on pipe transport"
        } else {
            "Fatal read error on socket transport"
        }
    }

    fn msg_write_error(&self) -> &'static str {
        if unsafe { self.st().pipe_mode } {
            "Fatal write error on pipe transport"
        } else {
            "Fatal write error on socket transport"
        }
    }

    fn start_read(&self) -> Result<(), i32> {
        let st = unsafe { self.st() };
        if st.reading || !st.started || st.paused || st.closing {
            return Ok(());
        }
        let Some(stream) = self.stream_ptr() else { return Ok(()) };
        let rc = unsafe { sys::uv_read_start(stream, Some(on_alloc), Some(on_read)) };
        if rc < 0 {
            return Err(rc);
        }
        unsafe { self.st().reading = true };
        Ok(())
    }

    fn stop_read(&self) {
        let st = unsafe { self.st() };
        if st.reading {
            st.reading = false;
            if let Some(stream) = self.stream_ptr() {
                unsafe { sys::uv_read_stop(stream) };
            }
        }
    }

    fn buffer_size(&self) -> usize {
        let st = unsafe { self.st() };
        st.queued_bytes + st.in_flight_bytes
    }

    /// Schedules `wrapper._call_connection_lost(exc)` on the loop.
    fn schedule_connection_lost(&self, py: Python<'_>, exc: Option<Py<PyAny>>) -> PyResult<()> {
        let (loop_obj, wrapper) = unsafe {
            let st = self.st();
            (st.loop_obj.clone_ref(py), st.wrapper.clone_ref(py))
        };
        let cb = wrapper.getattr(py, pyo3::intern!(py, "_call_connection_lost"))?;
        loop_obj.call_method1(py, pyo3::intern!(py, "call_soon"), (cb, exc))?;
        Ok(())
    }

    fn maybe_pause_protocol(&self, py: Python<'_>) -> PyResult<()> {
        let st = unsafe { self.st() };
        if st.protocol_paused || self.buffer_size() <= st.high_water {
            return Ok(());
        }
        st.protocol_paused = true;
        let Some(protocol) = st.protocol.as_ref().map(|p| p.clone_ref(py)) else { return Ok(()) };
        if let Err(err) = protocol.call_method0(py, pyo3::intern!(py, "pause_writing")) {
            if is_fatal_base(py, &err) {
                return Err(err);
            }
            self.report(py, "protocol.pause_writing() failed", err)?;
        }
        Ok(())
    }

    fn maybe_resume_protocol(&self, py: Python<'_>) -> PyResult<()> {
        let st = unsafe { self.st() };
        if !st.protocol_paused || self.buffer_size() > st.low_water {
            return Ok(());
        }
        st.protocol_paused = false;
        let Some(protocol) = st.protocol.as_ref().map(|p| p.clone_ref(py)) else { return Ok(()) };
        if let Err(err) = protocol.call_method0(py, pyo3::intern!(py, "resume_writing")) {
            if is_fatal_base(py, &err) {
                return Err(err);
            }
            self.report(py, "protocol.resume_writing() failed", err)?;
        }
        Ok(())
    }

    /// `wrapper._report_error(message, exc)`: the loop's exception handler
    /// with the transport and protocol in the context.
    fn report(&self, py: Python<'_>, message: &str, err: PyErr) -> PyResult<()> {
        let wrapper = unsafe { self.st().wrapper.clone_ref(py) };
        wrapper.call_method1(py, pyo3::intern!(py, "_report_error"), (message, err.into_value(py)))?;
        Ok(())
    }

    /// Queues `chunk`; unless a write is in flight (its completion sends the
    /// queue), the transport joins the loop's flush list for this turn.
    fn enqueue(&self, py: Python<'_>, chunk: Chunk, len: usize) -> PyResult<()> {
        let st = unsafe { self.st() };
        st.queue.push_back(chunk);
        st.queued_bytes += len;
        if !st.writing && (st.queued_bytes > st.high_water || !self.loop_state().is_running()) {
            // Too much to hold until the end of the turn, or no turn coming
            // (the loop is not running): try the socket now, so flow control
            // reflects what the kernel could not take, as in asyncio where
            // every write tries the socket at once.
            self.flush(py)?;
            return self.maybe_pause_protocol(py);
        }
        if !st.writing && !st.flush_pending {
            st.flush_pending = true;
            let me = unsafe { Bound::from_borrowed_ptr(py, self.py_ptr()) }.cast_into::<StreamCore>()?.unbind();
            self.loop_state().flush_list.push(me);
        }
        self.maybe_pause_protocol(py)
    }

    /// The Python object of this core.
    fn py_ptr(&self) -> *mut pyo3::ffi::PyObject {
        // The keep-alive reference in the handle box is this very object.
        let st = unsafe { self.st() };
        let h = st.handle.as_ref().expect("open stream");
        unsafe { (*h.raw()).keep_alive.as_ref().expect("kept alive").as_ptr() }
    }

    /// End of turn: one vectored try-write of everything queued; the rest
    /// goes to `uv_write`.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let st = unsafe { self.st() };
        st.flush_pending = false;
        if st.writing || st.queue.is_empty() {
            return Ok(());
        }
        let Some(stream) = self.stream_ptr() else { return Ok(()) };
        let bufs: SmallVec<[sys::uv_buf_t; 8]> = st
            .queue
            .iter()
            .map(|c| {
                let b = c.remaining(py);
                unsafe { sys::uv_buf_init(b.as_ptr() as *mut _, b.len() as u32) }
            })
            .collect();
        let n = unsafe { sys::uv_try_write(stream, bufs.as_ptr(), bufs.len() as u32) };
        if n < 0 && n != sys::uv_errno_t_UV_EAGAIN {
            let dropped: Vec<Chunk> = st.queue.drain(..).collect();
            st.queued_bytes = 0;
            drop(dropped);
            return self.fatal_error(py, uv_error(n), self.msg_write_error());
        }
        let mut done = n.max(0) as usize;
        st.queued_bytes -= done;
        while done > 0 {
            let front = st.queue.front_mut().expect("bytes written come from the queue");
            let len = front.remaining(py).len();
            if done >= len {
                done -= len;
                st.queue.pop_front();
            } else {
                front.advance(done);
                done = 0;
            }
        }
        self.submit(py)?;
        self.maybe_resume_protocol(py)?;
        self.after_drain(py)
    }

    /// Once nothing is left to write: wake a drain waiter, finish a pending
    /// close, or send EOF.
    fn after_drain(&self, py: Python<'_>) -> PyResult<()> {
        let st = unsafe { self.st() };
        if st.writing || !st.queue.is_empty() {
            return Ok(());
        }
        if let Some(waiter) = st.drain_waiter.take() {
            let waiter = waiter.bind(py);
            if !waiter.call_method0(pyo3::intern!(py, "done"))?.is_truthy()? {
                waiter.call_method1(pyo3::intern!(py, "set_result"), (py.None(),))?;
            }
        }
        let st = unsafe { self.st() };
        if st.closing && st.conn_lost == 0 {
            st.conn_lost += 1;
            return self.schedule_connection_lost(py, None);
        }
        self.maybe_shutdown();
        Ok(())
    }

    /// Starts one vectored `uv_write` of everything queued, unless one is
    /// already in flight.
    fn submit(&self, py: Python<'_>) -> PyResult<()> {
        let st = unsafe { self.st() };
        if st.writing || st.queue.is_empty() {
            return Ok(());
        }
        let Some(stream) = self.stream_ptr() else { return Ok(()) };
        let mut req = Box::new(WriteReq {
            // SAFETY: initialised by uv_write below.
            req: unsafe { MaybeUninit::zeroed().assume_init() },
            chunks: st.queue.drain(..).collect(),
            bytes: st.queued_bytes,
        });
        st.in_flight_bytes += st.queued_bytes;
        st.queued_bytes = 0;
        let bufs: SmallVec<[sys::uv_buf_t; 4]> = req
            .chunks
            .iter()
            .map(|c| {
                let b = c.remaining(py);
                unsafe { sys::uv_buf_init(b.as_ptr() as *mut _, b.len() as u32) }
            })
            .collect();
        let me = self as *const StreamCore;
        req.req.data = me as *mut _;
        let raw = Box::into_raw(req);
        // SAFETY: the buffers point into chunks owned by the request, which
        // lives until on_write frees it.
        let rc = unsafe { sys::uv_write(&mut (*raw).req, stream, bufs.as_ptr(), bufs.len() as u32, Some(on_write)) };
        if rc < 0 {
            let req = unsafe { Box::from_raw(raw) };
            let st = unsafe { self.st() };
            st.in_flight_bytes -= req.bytes;
            drop(req);
            return self.fatal_error(py, uv_error(rc), self.msg_write_error());
        }
        st.writing = true;
        Ok(())
    }

    /// Sends EOF (shutdown of the write side) once nothing is left to write.
    fn maybe_shutdown(&self) {
        let st = unsafe { self.st() };
        if !st.eof || st.shutdown_sent || st.writing || !st.queue.is_empty() {
            return;
        }
        let Some(stream) = self.stream_ptr() else { return };
        st.shutdown_sent = true;
        let req = Box::into_raw(Box::new(unsafe { MaybeUninit::<sys::uv_shutdown_t>::zeroed().assume_init() }));
        let rc = unsafe { sys::uv_shutdown(req, stream, Some(on_shutdown)) };
        if rc < 0 {
            drop(unsafe { Box::from_raw(req) });
        }
    }

    /// asyncio's `_force_close`: drop pending data, stop reading, and
    /// schedule connection_lost(exc).
    fn force_close(&self, py: Python<'_>, exc: Option<Py<PyAny>>) -> PyResult<()> {
        let st = unsafe { self.st() };
        if st.conn_lost > 0 {
            return Ok(());
        }
        let dropped: Vec<Chunk> = st.queue.drain(..).collect();
        st.queued_bytes = 0;
        // A write still in flight is cancelled when the handle closes; it no
        // longer counts as buffered.
        st.in_flight_bytes = 0;
        st.closing = true;
        st.conn_lost += 1;
        let waiter = st.drain_waiter.take();
        self.stop_read();
        drop(dropped);
        if let Some(waiter) = waiter {
            let waiter = waiter.bind(py);
            if !waiter.call_method0(pyo3::intern!(py, "done"))?.is_truthy()? {
                let exc = pyo3::exceptions::PyConnectionError::new_err("Connection is closed by peer");
                waiter.call_method1(pyo3::intern!(py, "set_exception"), (exc.into_value(py),))?;
            }
        }
        // An in-flight write is cancelled by closing the handle.
        self.schedule_connection_lost(py, exc)
    }

    /// Closes the libuv handle (and with it the fd); called after
    /// connection_lost or when the loop closes.
    pub(crate) fn close_handle(&self) {
        let st = unsafe { self.st() };
        st.reading = false;
        if let Some(h) = st.handle.take() {
            let me = self as *const StreamCore;
            unsafe { (*st.loop_state).streams.remove(&me) };
            h.close_with(on_closed);
        }
    }

    fn on_read(&self, py: Python<'_>, nread: isize) {
        let st = unsafe { self.st() };
        let view = st.read_view.take();
        if let Some(err) = st.get_buffer_error.take() {
            self.stop_read();
            let res = if is_fatal_base(py, &err) {
                Err(err)
            } else {
                self.fatal_error(py, err, "Fatal error: protocol.get_buffer() call failed.")
            };
            if let Err(err) = res {
                self.fail_in_callback(py, err);
            }
            return;
        }
        if let Some(view) = view {
            // The data is already in the protocol's buffer.
            drop(view);
            if nread > 0 {
                if let Err(err) = self.buffer_updated(py, nread as usize) {
                    self.fail_in_callback(py, err);
                }
                return;
            }
        }
        let result = if nread > 0 {
            let full = nread as usize == READ_BUF_SIZE && unsafe { self.st().pipe_mode };
            self.deliver(py, nread as usize)
                .and_then(|()| if full { self.hold_reading_until_next_poll(py) } else { Ok(()) })
        } else if nread == sys::uv_errno_t_UV_EOF as isize {
            self.on_eof(py)
        } else if nread < 0 {
            self.stop_read();
            self.fatal_error(py, uv_error(nread as i32), self.msg_read_error())
        } else {
            Ok(())
        };
        if let Err(err) = result {
            self.fail_in_callback(py, err);
        }
    }

    /// After a pipe read that filled the buffer (more is likely waiting),
    /// reading pauses until just before the next poll: one full read per
    /// turn, as asyncio's one read per readiness event. Otherwise libuv reads
    /// up to 32 times in a row, and asyncio's subprocess protocols, which
    /// pass data on in a later callback, cannot pause the flow in time: a
    /// fast child then fills memory with megabytes. Sockets keep libuv's
    /// bursts (their protocols pause synchronously; holding back halves
    /// bulk TCP throughput, measured with benchmarks/compare.py tcp_bulk).
    fn hold_reading_until_next_poll(&self, py: Python<'_>) -> PyResult<()> {
        if !unsafe { self.st().reading } {
            return Ok(());
        }
        self.stop_read();
        let me = unsafe { Bound::from_borrowed_ptr(py, self.py_ptr()) }.cast_into::<StreamCore>()?.unbind();
        self.loop_state().rearm_list.push(me);
        Ok(())
    }

    /// Hands `n` bytes from the read buffer to `protocol.data_received`.
    fn deliver(&self, py: Python<'_>, n: usize) -> PyResult<()> {
        let Some(protocol) = (unsafe { self.st().protocol.as_ref().map(|p| p.clone_ref(py)) }) else { return Ok(()) };
        let Some(bytes) = self.loop_state().read_buf.take(py, n) else { return Ok(()) };
        let result = protocol.call_method1(py, pyo3::intern!(py, "data_received"), (&bytes,));
        self.loop_state().read_buf.give_back(bytes);
        match result {
            Ok(_) => Ok(()),
            Err(err) if is_fatal_base(py, &err) => Err(err),
            Err(err) => self.fatal_error(py, err, "Fatal error: protocol.data_received() call failed."),
        }
    }

    /// `n` bytes landed in a BufferedProtocol's buffer.
    fn buffer_updated(&self, py: Python<'_>, n: usize) -> PyResult<()> {
        let Some(protocol) = (unsafe { self.st().protocol.as_ref().map(|p| p.clone_ref(py)) }) else { return Ok(()) };
        match protocol.call_method1(py, pyo3::intern!(py, "buffer_updated"), (n,)) {
            Ok(_) => Ok(()),
            Err(err) if is_fatal_base(py, &err) => Err(err),
            Err(err) => self.fatal_error(py, err, "Fatal error: protocol.buffer_updated() call failed."),
        }
    }

    fn on_eof(&self, py: Python<'_>) -> PyResult<()> {
        self.stop_read();
        if unsafe { self.st().pipe_mode } {
            return self.pipe_eof(py);
        }
        let Some(protocol) = (unsafe { self.st().protocol.as_ref().map(|p| p.clone_ref(py)) }) else { return Ok(()) };
        match protocol.call_method0(py, pyo3::intern!(py, "eof_received")) {
            Ok(keep_open) => {
                if !keep_open.is_truthy(py)? {
                    self.close(py)?;
                }
                Ok(())
            }
            Err(err) if is_fatal_base(py, &err) => Err(err),
            Err(err) => self.fatal_error(py, err, "Fatal error: protocol.eof_received() call failed."),
        }
    }

    /// A read pipe's EOF: asyncio schedules eof_received() and then
    /// connection_lost(None); the transport is closing from now on.
    fn pipe_eof(&self, py: Python<'_>) -> PyResult<()> {
        let st = unsafe { self.st() };
        st.closing = true;
        st.conn_lost += 1;
        if let Some(protocol) = st.protocol.as_ref().map(|p| p.clone_ref(py)) {
            let loop_obj = st.loop_obj.clone_ref(py);
            let cb = protocol.getattr(py, pyo3::intern!(py, "eof_received"))?;
            loop_obj.call_method1(py, pyo3::intern!(py, "call_soon"), (cb,))?;
        }
        self.schedule_connection_lost(py, None)
    }

    fn on_write_done(&self, py: Python<'_>, bytes: usize, status: i32) -> PyResult<()> {
        let st = unsafe { self.st() };
        st.writing = false;
        st.in_flight_bytes = st.in_flight_bytes.saturating_sub(bytes);
        if status == sys::uv_errno_t_UV_ECANCELED || st.handle.is_none() {
            return Ok(());
        }
        if status < 0 {
            return self.fatal_error(py, uv_error(status), self.msg_write_error());
        }
        self.submit(py)?;
        self.maybe_resume_protocol(py)?;
        self.after_drain(py)
    }
}

/// Called by the loop before it polls: flushes every transport written to
/// during this turn and resumes the reads held back after a full read.
pub(crate) fn flush_all(py: Python<'_>, loop_state: *mut LoopState) -> PyResult<()> {
    let held = std::mem::take(unsafe { &mut (*loop_state).rearm_list });
    for core in held {
        let core = core.get();
        // Unless paused or closed meanwhile.
        if let Err(rc) = core.start_read() {
            if let Err(err) = core.fatal_error(py, uv_error(rc), core.msg_read_error()) {
                if is_fatal_base(py, &err) {
                    return Err(err);
                }
                err.write_unraisable(py, None);
            }
        }
    }
    loop {
        let batch = std::mem::take(unsafe { &mut (*loop_state).flush_list });
        if batch.is_empty() {
            return Ok(());
        }
        for core in batch {
            if let Err(err) = core.get().flush(py) {
                if is_fatal_base(py, &err) {
                    return Err(err);
                }
                err.write_unraisable(py, None);
            }
        }
    }
}

/// A buffer exported by a Python object (`Py_buffer`), released on drop.
struct BufferView(Box<pyo3::ffi::Py_buffer>);

// SAFETY: only used with the GIL held.
unsafe impl Send for BufferView {}

impl BufferView {
    /// A contiguous buffer of `obj`, writable when asked, whatever its
    /// item format (the bytes are what count, as for socket.recv_into).
    fn get(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<BufferView> {
        let mut view: Box<pyo3::ffi::Py_buffer> = Box::new(unsafe { MaybeUninit::zeroed().assume_init() });
        let flags = if writable { pyo3::ffi::PyBUF_WRITABLE } else { pyo3::ffi::PyBUF_SIMPLE };
        // SAFETY: view is a valid Py_buffer to fill; released in Drop.
        if unsafe { pyo3::ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) } < 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        Ok(BufferView(view))
    }

    fn as_slice(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.0.buf as *const u8, self.0.len as usize) }
    }

    fn len(&self) -> usize {
        self.0.len as usize
    }
}

impl Drop for BufferView {
    fn drop(&mut self) {
        // SAFETY: acquired by PyObject_GetBuffer; dropped with the GIL held.
        unsafe { pyo3::ffi::PyBuffer_Release(&mut *self.0) }
    }
}

/// libuv wants memory for a read. A BufferedProtocol lends its own buffer
/// (`get_buffer(-1)`, as asyncio asks before each recv_into); otherwise the
/// loop's scratch buffer.
unsafe fn read_target(core: &StreamCore, buf: *mut sys::uv_buf_t) {
    unsafe {
        let st = core.st();
        if st.buffered {
            if let Some(protocol) = st.protocol.as_ref() {
                let py = Python::assume_attached();
                let protocol = protocol.clone_ref(py);
                let view = protocol
                    .call_method1(py, pyo3::intern!(py, "get_buffer"), (-1,))
                    .and_then(|b| BufferView::get(b.bind(py), true))
                    .and_then(|v| {
                        if v.len() == 0 {
                            Err(PyRuntimeError::new_err("get_buffer() returned an empty buffer"))
                        } else {
                            Ok(v)
                        }
                    });
                let st = core.st();
                match view {
                    Ok(v) => {
                        *buf = sys::uv_buf_init(v.0.buf as *mut _, v.len().min(u32::MAX as usize) as u32);
                        st.read_view = Some(v);
                    }
                    Err(e) => {
                        // A zero-length buffer makes libuv report UV_ENOBUFS.
                        st.get_buffer_error = Some(e);
                        *buf = sys::uv_buf_init(ptr::null_mut(), 0);
                    }
                }
                return;
            }
        }
        let py = Python::assume_attached();
        *buf = match core.loop_state().read_buf.get(py) {
            Some(p) => sys::uv_buf_init(p as *mut _, READ_BUF_SIZE as u32),
            // libuv reports UV_ENOBUFS for an empty buffer.
            None => sys::uv_buf_init(ptr::null_mut(), 0),
        };
    }
}

unsafe extern "C" fn on_alloc(handle: *mut sys::uv_handle_t, _suggested: usize, buf: *mut sys::uv_buf_t) {
    // SAFETY: data is the live core; the buffer handed out is consumed by
    // on_read before the next allocation.
    unsafe {
        let core = &*((*handle).data as *const StreamCore);
        core.loop_state().gil.reacquire();
        read_target(core, buf);
    }
}

unsafe extern "C" fn on_read(stream: *mut sys::uv_stream_t, nread: isize, _buf: *const sys::uv_buf_t) {
    unsafe {
        let core = &*((*stream).data as *const StreamCore);
        let ls = core.loop_state();
        ls.gil.reacquire();
        ls.io_seen = true;
        let started = ls.debug_clock();
        let py = Python::assume_attached();
        core.on_read(py, nread);
        if let Some(started) = started {
            // (References cloned: no state borrow across Python code.)
            let (loop_obj, transport) = {
                let st = core.st();
                (st.loop_obj.clone_ref(py), st.wrapper.clone_ref(py))
            };
            crate::eventloop::warn_if_slow_io(py, &loop_obj, &transport, started);
        }
    }
}

unsafe extern "C" fn on_write(req: *mut sys::uv_write_t, status: i32) {
    unsafe {
        let req = Box::from_raw(req as *mut WriteReq);
        let core = &*(req.req.data as *const StreamCore);
        let ls = core.loop_state();
        ls.gil.reacquire();
        ls.io_seen = true;
        let py = Python::assume_attached();
        let bytes = req.bytes;
        drop(req);
        if let Err(err) = core.on_write_done(py, bytes, status) {
            core.fail_in_callback(py, err);
        }
    }
}

unsafe extern "C" fn on_shutdown(req: *mut sys::uv_shutdown_t, _status: i32) {
    unsafe { drop(Box::from_raw(req)) };
}

unsafe extern "C" fn on_closed(handle: *mut sys::uv_handle_t) {
    // SAFETY: the box came from UvHandle<StreamBox>; this is its one close
    // callback. Dropping keep_alive needs the GIL.
    unsafe {
        let b = Box::from_raw(handle as *mut StreamBox);
        (*b.loop_state).gil.reacquire();
        drop(b);
    }
}

/// Borrows the bytes of a bytes-like object: `bytes` is referenced, other
/// buffers are copied (they may change after write() returns).
fn to_chunk(data: &Bound<'_, PyAny>) -> PyResult<(Chunk, usize)> {
    if let Ok(b) = data.cast::<PyBytes>() {
        let n = b.as_bytes().len();
        return Ok((Chunk::Shared(b.clone().unbind(), 0), n));
    }
    if data.is_instance_of::<PyByteArray>() || data.is_instance_of::<PyMemoryView>() {
        let v = BufferView::get(data, false)?.as_slice().to_vec();
        let n = v.len();
        return Ok((Chunk::Owned(v, 0), n));
    }
    Err(PyTypeError::new_err(format!("data argument must be a bytes-like object, not '{}'", data.get_type().name()?)))
}

#[pymethods]
impl StreamCore {
    /// Wraps a connected stream socket's fd (libuv takes the fd over) for
    /// the Python transport `wrapper`: TCP, or a Unix socket when `unix`.
    #[staticmethod]
    ///
    /// With `pipe`, `fd` is a pipe, FIFO or socket of a pipe transport; it
    /// must be one epoll accepts (libuv aborts on an fd epoll refuses).
    #[pyo3(signature = (loop_obj, fd, wrapper, unix=false, pipe=false))]
    fn open(
        py: Python<'_>,
        loop_obj: &Bound<'_, PyAny>,
        fd: i32,
        wrapper: Py<PyAny>,
        unix: bool,
        pipe: bool,
    ) -> PyResult<Py<StreamCore>> {
        let unix = unix || pipe;
        let core_loop = loop_obj.cast::<LoopCore>()?.get();
        let loop_state = core_loop.state_ptr();
        let uv_loop =
            unsafe { (*loop_state).uv_loop() }.ok_or_else(|| PyRuntimeError::new_err("Event loop is closed"))?;
        let core = Py::new(
            py,
            StreamCore {
                state: UnsafeCell::new(StreamState {
                    handle: None,
                    loop_state,
                    loop_obj: loop_obj.clone().unbind(),
                    wrapper,
                    protocol: None,
                    buffered: false,
                    started: false,
                    reading: false,
                    paused: false,
                    closing: false,
                    conn_lost: 0,
                    eof: false,
                    shutdown_sent: false,
                    queue: VecDeque::new(),
                    queued_bytes: 0,
                    in_flight_bytes: 0,
                    writing: false,
                    flush_pending: false,
                    drain_waiter: None,
                    read_view: None,
                    get_buffer_error: None,
                    sendfile_in_progress: false,
                    high_water: DEFAULT_HIGH_WATER,
                    low_water: DEFAULT_HIGH_WATER / 4,
                    protocol_paused: false,
                    pipe_mode: pipe,
                    dropped_writes: 0,
                }),
            },
        )?;
        let me = core.get() as *const StreamCore;
        let h = UvHandle::new(StreamBox {
            // SAFETY: initialised by uv_tcp_init / uv_pipe_init below.
            handle: unsafe { MaybeUninit::zeroed().assume_init() },
            loop_state,
            keep_alive: None,
        });
        // SAFETY: fresh allocation on an open loop; on failure after init
        // the handle is closed, never freed directly.
        unsafe {
            let raw = h.raw();
            let rc = if unix {
                sys::uv_pipe_init(uv_loop, &mut *(*raw).handle.pipe, 0)
            } else {
                sys::uv_tcp_init(uv_loop, &mut *(*raw).handle.tcp)
            };
            if rc < 0 {
                h.free_uninit();
                return Err(uv_error(rc));
            }
            h.set_data(me as *mut StreamCore);
            let rc = if unix {
                sys::uv_pipe_open(&mut *(*raw).handle.pipe, fd)
            } else {
                sys::uv_tcp_open(&mut *(*raw).handle.tcp, fd)
            };
            if rc < 0 {
                h.close_with(on_closed);
                return Err(uv_error(rc));
            }
            if !unix {
                // As asyncio does for every TCP transport. A stream socket
                // that is not TCP refuses the option; that is fine.
                sys::uv_tcp_nodelay(&mut *(*raw).handle.tcp, 1);
            }
            (*raw).keep_alive = Some(core.clone_ref(py));
            (*core.get().state.get()).handle = Some(h);
            (*loop_state).streams.insert(me);
        }
        Ok(core)
    }

    /// Starts delivering data (asyncio starts reading after connection_made).
    fn start_reading(&self) -> PyResult<()> {
        unsafe { self.st().started = true };
        self.start_read().map_err(uv_error)
    }

    fn pause_reading(&self) {
        let st = unsafe { self.st() };
        if st.closing || st.paused {
            return;
        }
        st.paused = true;
        self.stop_read();
    }

    fn resume_reading(&self) -> PyResult<()> {
        let st = unsafe { self.st() };
        if st.closing || !st.paused {
            return Ok(());
        }
        st.paused = false;
        self.start_read().map_err(uv_error)
    }

    fn is_reading(&self) -> bool {
        let st = unsafe { self.st() };
        !st.paused && !st.closing
    }

    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let (chunk, len) = to_chunk(data)?;
        let st = unsafe { self.st() };
        if st.eof {
            return Err(PyRuntimeError::new_err("Cannot call write() after write_eof()"));
        }
        if st.sendfile_in_progress {
            return Err(PyRuntimeError::new_err("unable to write; sendfile is in progress"));
        }
        if len == 0 {
            return Ok(());
        }
        if st.conn_lost > 0 || st.handle.is_none() || (st.pipe_mode && st.closing) {
            // Dropped, as asyncio drops writes to a lost connection (and, for
            // pipes, to a closing one), warning after a few.
            let dropped = st.conn_lost + st.dropped_writes;
            if dropped >= LOG_THRESHOLD_FOR_CONNLOST_WRITES {
                let logger = py.import("asyncio.log")?.getattr("logger")?;
                let message = if st.pipe_mode {
                    "pipe closed by peer or os.write(pipe, data) raised exception."
                } else {
                    "socket.send() raised exception."
                };
                logger.call_method1("warning", (message,))?;
            }
            // conn_lost doubles as "connection_lost scheduled": count drops
            // separately while that has not happened yet.
            if st.conn_lost > 0 {
                st.conn_lost += 1;
            } else {
                st.dropped_writes += 1;
            }
            return Ok(());
        }
        self.enqueue(py, chunk, len)
    }

    /// Writes every item, or nothing if one of them is not bytes-like.
    fn writelines(&self, py: Python<'_>, list_of_data: &Bound<'_, PyAny>) -> PyResult<()> {
        if unsafe { self.st().eof } {
            return Err(PyRuntimeError::new_err("Cannot call write() after write_eof()"));
        }
        let items: Vec<Bound<'_, PyAny>> = list_of_data.try_iter()?.collect::<PyResult<_>>()?;
        for item in &items {
            to_chunk(item)?;
        }
        for item in &items {
            self.write(py, item)?;
        }
        Ok(())
    }

    fn write_eof(&self) {
        let st = unsafe { self.st() };
        if st.closing || st.eof {
            return;
        }
        st.eof = true;
        self.maybe_shutdown();
    }

    fn can_write_eof(&self) -> bool {
        true
    }

    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let st = unsafe { self.st() };
        if st.closing {
            return Ok(());
        }
        st.closing = true;
        self.stop_read();
        let st = unsafe { self.st() };
        if !st.writing && st.queue.is_empty() {
            st.conn_lost += 1;
            self.schedule_connection_lost(py, None)?;
        }
        Ok(())
    }

    /// Drops what the kernel will not take at once (data written this turn
    /// is offered to it first, as asyncio's write() would have) and closes.
    fn abort(&self, py: Python<'_>) -> PyResult<()> {
        let st = unsafe { self.st() };
        if st.conn_lost == 0 && !st.writing && !st.queue.is_empty() {
            self.flush(py)?;
        }
        self.force_close(py, None)
    }

    /// asyncio's `_force_close(exc)`.
    fn _force_close(&self, py: Python<'_>, exc: Option<Py<PyAny>>) -> PyResult<()> {
        self.force_close(py, exc)
    }

    fn is_closing(&self) -> bool {
        unsafe { self.st().closing }
    }

    /// Frees the libuv handle and fd (after connection_lost ran).
    fn _close_handle(&self) {
        self.close_handle();
    }

    /// Resolves `future` once the write buffer is empty (now, if it is).
    fn _wait_drained(&self, py: Python<'_>, future: Py<PyAny>) -> PyResult<()> {
        let st = unsafe { self.st() };
        if st.drain_waiter.is_some() {
            return Err(PyRuntimeError::new_err("Empty waiter is already set"));
        }
        st.drain_waiter = Some(future);
        self.after_drain(py)
    }

    /// Marks loop.sendfile() running on this transport (writes refused).
    fn _set_sendfile_in_progress(&self, active: bool) {
        unsafe { self.st().sendfile_in_progress = active };
    }

    /// Whether the protocol was told to pause writing.
    fn _protocol_paused(&self) -> bool {
        unsafe { self.st().protocol_paused }
    }

    fn get_write_buffer_size(&self) -> usize {
        self.buffer_size()
    }

    fn get_write_buffer_limits(&self) -> (usize, usize) {
        let st = unsafe { self.st() };
        (st.low_water, st.high_water)
    }

    #[pyo3(signature = (high=None, low=None))]
    fn set_write_buffer_limits(&self, py: Python<'_>, high: Option<isize>, low: Option<isize>) -> PyResult<()> {
        let high = match (high, low) {
            (Some(h), _) => h,
            (None, Some(l)) => 4 * l,
            (None, None) => DEFAULT_HIGH_WATER as isize,
        };
        let low = low.unwrap_or(high / 4);
        if !(high >= low && low >= 0) {
            return Err(PyValueError::new_err(format!("high ({high}) must be >= low ({low}) must be >= 0")));
        }
        let st = unsafe { self.st() };
        st.high_water = high as usize;
        st.low_water = low as usize;
        self.maybe_pause_protocol(py)
    }

    /// Sets the protocol; `buffered` when it is an asyncio.BufferedProtocol.
    fn set_protocol(&self, protocol: Py<PyAny>, buffered: bool) {
        let st = unsafe { self.st() };
        let old = st.protocol.replace(protocol);
        st.buffered = buffered;
        drop(old);
    }

    fn get_protocol(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        unsafe { self.st().protocol.as_ref().map(|p| p.clone_ref(py)) }
    }

    /// Drops the protocol (after connection_lost), breaking the cycle
    /// transport -> protocol -> transport. With `transport` (the connection
    /// is over: nothing calls back into the transport any more), drops the
    /// transport too, so transport and core are freed by reference counting
    /// rather than left to the cyclic GC.
    #[pyo3(signature = (transport=false))]
    fn _forget_protocol(&self, py: Python<'_>, transport: bool) {
        let st = unsafe { self.st() };
        let old = st.protocol.take();
        let wrapper = transport.then(|| std::mem::replace(&mut st.wrapper, py.None()));
        drop(old);
        drop(wrapper);
    }

    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        let st = unsafe { &*self.state.get() };
        visit.call(&st.loop_obj)?;
        visit.call(&st.wrapper)?;
        visit.call(&st.protocol)?;
        visit.call(&st.drain_waiter)?;
        Ok(())
    }
}
