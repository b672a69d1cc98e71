//! The write side of a stream transport: writes are batched per loop turn.
//!
//! `write()` only queues (`bytes` by reference, never copied; other buffers
//! copied) and asks the loop for `before_poll`; before the loop next polls,
//! `flush` tries one vectored `uv_try_write` of everything queued, and what
//! the socket does not take goes to one vectored `uv_write` at a time. So a
//! response written as header + body costs one system call, like one write.
//! A large queue (over the high-water mark), a write while the loop is not
//! running, and `abort()` try the socket at once, so flow control and "what
//! the kernel took" match asyncio, where every write tries the socket; such a
//! write with nothing queued or in flight is offered to the kernel straight
//! from the caller's bytes (`write_at_once`).
//! Flow control calls `pause_writing` / `resume_writing` at the water marks.

use std::collections::VecDeque;
use std::rc::Rc;

use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyByteArray, PyBytes, PyMemoryView};
use smallvec::SmallVec;

use super::{StreamCore, StreamKind};
use crate::capi::transport::bytes_data;
use crate::errors::uv_error;
use crate::eventloop::ClientPtr;
use crate::os::transport::shutdown_write;
use crate::python;
use crate::transport::base::{Transport, LOG_THRESHOLD_FOR_CONNLOST_WRITES};
use crate::transport::buffer::BufferView;
use crate::uv::sys;
use crate::uv::transport::{IoBuf, WritePayload};

/// The most libuv takes in one write (`UV__IO_MAX_BYTES`: it refuses more
/// with EINVAL); a larger write goes out in parts.
const MAX_WRITE: usize = 0x7fff_f000;

/// The bytes a chunk holds.
enum ChunkData {
    /// An immutable `bytes`, referenced.
    Shared(Py<PyBytes>),
    /// A copy of a mutable buffer (shared by the parts of a split chunk).
    Owned(Rc<Vec<u8>>),
}

/// Bytes waiting to be written: `data[start..end]`.
pub(super) struct Chunk {
    data: ChunkData,
    start: usize,
    end: usize,
}

impl Chunk {
    /// A chunk holding `data` (ciphertext the TLS session produced).
    pub(super) fn owned(data: Vec<u8>) -> Chunk {
        let end = data.len();
        Chunk { data: ChunkData::Owned(Rc::new(data)), start: 0, end }
    }

    pub(super) fn remaining(&self) -> &[u8] {
        let all: &[u8] = match &self.data {
            ChunkData::Shared(b) => bytes_data(b),
            ChunkData::Owned(v) => v,
        };
        &all[self.start..self.end]
    }

    fn len(&self) -> usize {
        self.end - self.start
    }

    pub(super) fn advance(&mut self, n: usize) {
        self.start += n;
    }

    /// The first `n` bytes as a chunk of their own; this one keeps the rest.
    fn split_front(&mut self, py: Python<'_>, n: usize) -> Chunk {
        let data = match &self.data {
            ChunkData::Shared(b) => ChunkData::Shared(b.clone_ref(py)),
            ChunkData::Owned(v) => ChunkData::Owned(v.clone()),
        };
        let front = Chunk { data, start: self.start, end: self.start + n };
        self.start += n;
        front
    }

    /// A libuv buffer over at most `limit` of what is left.
    fn io_buf(&self, limit: usize) -> IoBuf<'_> {
        let b = self.remaining();
        IoBuf::new(&b[..b.len().min(limit)])
    }
}

/// Takes the bytes of a bytes-like object: `bytes` is referenced, other
/// buffers are copied (they may change after write() returns).
pub(super) fn to_chunk(data: &Bound<'_, PyAny>) -> PyResult<(Chunk, usize)> {
    if let Ok(b) = data.cast::<PyBytes>() {
        let n = b.as_bytes().len();
        return Ok((Chunk { data: ChunkData::Shared(b.clone().unbind()), start: 0, end: n }, n));
    }
    if data.is_instance_of::<PyByteArray>() || data.is_instance_of::<PyMemoryView>() {
        let v = BufferView::get(data, false)?.as_slice().to_vec();
        let n = v.len();
        return Ok((Chunk { data: ChunkData::Owned(Rc::new(v)), start: 0, end: n }, n));
    }
    Err(PyTypeError::new_err(format!("data argument must be a bytes-like object, not '{}'", data.get_type().name()?)))
}

/// libuv buffers over the front of `chunks`, at most MAX_WRITE bytes in all.
fn io_bufs<'a>(chunks: impl Iterator<Item = &'a Chunk>) -> SmallVec<[IoBuf<'a>; 8]> {
    let mut room = MAX_WRITE;
    let mut bufs = SmallVec::new();
    for c in chunks {
        if room == 0 {
            break;
        }
        let buf = c.io_buf(room);
        room -= buf.len();
        bufs.push(buf);
    }
    bufs
}

/// What one in-flight `uv_write` holds: the chunks its buffers point into.
pub(crate) struct Outgoing {
    chunks: SmallVec<[Chunk; 4]>,
    bytes: usize,
}

impl Outgoing {
    /// The bytes the write sends.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }
}

impl WritePayload for Outgoing {
    #[inline]
    fn bufs(&self) -> SmallVec<[IoBuf<'_>; 8]> {
        io_bufs(self.chunks.iter())
    }
}

/// What is waiting to be written, and what is on its way.
#[derive(Default)]
pub(super) struct WriteQueue {
    queue: VecDeque<Chunk>,
    queued_bytes: usize,
    in_flight_bytes: usize,
    /// A `uv_write` is in flight (its completion sends the queue).
    writing: bool,
    /// Asked the loop for `before_poll` (queued data not yet tried).
    flush_pending: bool,
}

impl WriteQueue {
    /// Bytes buffered: queued plus in flight.
    pub(super) fn size(&self) -> usize {
        self.queued_bytes + self.in_flight_bytes
    }

    /// Nothing queued and nothing in flight.
    pub(super) fn is_idle(&self) -> bool {
        !self.writing && self.queue.is_empty()
    }

    pub(super) fn has_queued(&self) -> bool {
        !self.queue.is_empty()
    }

    pub(super) fn writing(&self) -> bool {
        self.writing
    }

    /// Drops what is queued (and stops counting a write in flight, which is
    /// cancelled when the handle closes); returned to drop outside a borrow.
    pub(super) fn discard(&mut self) -> VecDeque<Chunk> {
        self.queued_bytes = 0;
        self.in_flight_bytes = 0;
        std::mem::take(&mut self.queue)
    }

    /// `n` bytes from the front of the queue went out.
    fn advance(&mut self, mut n: usize) {
        self.queued_bytes -= n;
        while n > 0 {
            let front = self.queue.front_mut().expect("bytes written come from the queue");
            let len = front.len();
            if n >= len {
                n -= len;
                self.queue.pop_front();
            } else {
                front.advance(n);
                n = 0;
            }
        }
    }
}

/// Whether the running asyncio's socket `writelines()` counts a call to a
/// lost connection towards the warning as `write()` does: up to 3.11 it is a
/// `write()`; from 3.12 only where it checks `_conn_lost` itself (CPython
/// gh-136234; 3.12.1 and 3.13.0 do not). Asked once, of its code.
fn socket_writelines_counts(py: Python<'_>) -> bool {
    static COUNTS: PyOnceLock<bool> = PyOnceLock::new();
    *COUNTS.get_or_init(py, || {
        let names = py
            .import("asyncio.selector_events")
            .and_then(|m| m.getattr("_SelectorSocketTransport"))
            .and_then(|cls| cls.getattr("writelines"))
            .and_then(|f| f.getattr("__code__"))
            .and_then(|code| code.getattr("co_names"));
        match names {
            Ok(names) => names.contains("_conn_lost").unwrap_or(false),
            Err(_) => false,
        }
    })
}

/// What `write()` decided with the state borrowed.
enum WriteAction {
    Queue,
    /// Offered to the kernel at once: see write_at_once.
    AtOnce,
    /// Dropped (a lost connection): see drop_write.
    Drop,
}

impl StreamCore {
    pub(super) fn write_data(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let (chunk, len) = match to_chunk(data) {
            Ok(c) => c,
            // A bytes-like object whose memory cannot be had (a view that
            // is not contiguous): asyncio's send fails, which is a fatal
            // error of the connection, not of the call.
            Err(err) if err.is_instance_of::<pyo3::exceptions::PyBufferError>(py) => {
                return self.fatal_error(py, err, self.msg_write_error(py));
            }
            Err(err) => return Err(err),
        };
        let running = self.shared().is_running(py);
        let action = self.state.with(py, |st| -> PyResult<Option<WriteAction>> {
            if st.eof {
                return Err(PyRuntimeError::new_err("Cannot call write() after write_eof()"));
            }
            if st.sendfile_in_progress {
                return Err(PyRuntimeError::new_err("unable to write; sendfile is in progress"));
            }
            if len == 0 {
                return Ok(None);
            }
            let pipe = st.kind == StreamKind::Pipe;
            if st.base.conn_lost > 0 || st.handle.is_none() || (pipe && st.base.closing) {
                return Ok(Some(WriteAction::Drop));
            }
            // What enqueue_all would flush at once (too large to hold for
            // the turn, or no turn coming), with nothing queued or in flight.
            let w = &st.writes;
            if w.is_idle() && !w.flush_pending && (len > st.reader.socket_high_water(&st.base) || !running) {
                return Ok(Some(WriteAction::AtOnce));
            }
            Ok(Some(WriteAction::Queue))
        })?;
        match action {
            None => Ok(()),
            Some(WriteAction::Drop) => self.drop_write(py),
            Some(WriteAction::Queue) => self.enqueue_raw(py, chunk, len),
            Some(WriteAction::AtOnce) => self.write_at_once(py, chunk, len),
        }
    }

    /// A write that `enqueue_all` would flush at once, with nothing queued
    /// or in flight (write_data decides): the kernel is offered the
    /// caller's bytes straight away, and only what it leaves is queued. A
    /// bulk writer's every write then costs its system call and little else.
    fn write_at_once(&self, py: Python<'_>, mut chunk: Chunk, len: usize) -> PyResult<()> {
        let io = &self.shared().stats.io;
        let n = self.state.with(py, |st| {
            st.base.stats.buffered(len);
            // (write_data saw the handle open; no code ran since.)
            let n = st.handle.as_ref().map_or(0, |stream| stream.try_write(&[chunk.io_buf(MAX_WRITE)]));
            st.base.stats.wrote(io, 1, n.max(0) as usize);
            n
        });
        if n < 0 && n != sys::uv_errno_t_UV_EAGAIN {
            drop(chunk);
            return self.write_failed(py, n);
        }
        let taken = n.max(0) as usize;
        if taken == len {
            return Ok(());
        }
        chunk.advance(taken);
        self.state.with(py, |st| {
            st.writes.queue.push_back(chunk);
            st.writes.queued_bytes += len - taken;
        });
        self.submit(py)?;
        self.queue_grew(py)
    }

    /// A write dropped, as asyncio drops writes to a lost connection (and,
    /// for pipes, to a closing one), warning after a few.
    fn drop_write(&self, py: Python<'_>) -> PyResult<()> {
        let warn = self.state.with(py, |st| {
            // (A pipe's end counts in asyncio only when a write failed:
            // not after close(), write_eof(), abort() or its reader
            // going away.)
            let pipe = st.kind == StreamKind::Pipe;
            let graceful = u32::from(pipe && st.base.conn_lost > 0 && !st.write_failed);
            let warn =
                (st.base.conn_lost + st.dropped_writes).saturating_sub(graceful) >= LOG_THRESHOLD_FOR_CONNLOST_WRITES;
            // conn_lost doubles as "connection_lost scheduled": count
            // drops separately while that has not happened yet.
            if st.base.conn_lost > 0 {
                st.base.conn_lost += 1;
            } else {
                st.dropped_writes += 1;
            }
            warn
        });
        if !warn {
            return Ok(());
        }
        let message = if self.kind(py) == StreamKind::Pipe {
            "pipe closed by peer or os.write(pipe, data) raised exception."
        } else {
            "socket.send() raised exception."
        };
        python::call_method(python::logger(py)?, pyo3::intern!(py, "warning"), (message,))?;
        Ok(())
    }

    /// Writes every item, or nothing if one of them is not bytes-like.
    pub(super) fn write_lines(&self, py: Python<'_>, list_of_data: &Bound<'_, PyAny>) -> PyResult<()> {
        // Up to 3.11 asyncio's writelines() is one write() of the items
        // joined (pipes' on every version): to a lost connection that is one
        // dropped write, counted once towards the warning.
        let pipe = self.state.with(py, |st| st.kind == StreamKind::Pipe);
        let joined = pipe || !cfg!(Py_3_12);
        if self.state.with(py, |st| st.eof) {
            return Err(PyRuntimeError::new_err(if joined {
                "Cannot call write() after write_eof()"
            } else {
                "Cannot call writelines() after write_eof()"
            }));
        }
        if !joined && self.state.with(py, |st| st.sendfile_in_progress) {
            return Err(PyRuntimeError::new_err("unable to writelines; sendfile is in progress"));
        }
        let items: Vec<Bound<'_, PyAny>> = list_of_data.try_iter()?.collect::<PyResult<_>>()?;
        let mut total = 0;
        for item in &items {
            total += to_chunk(item)?.1;
        }
        if joined && total > 0 && self.dropping(py) {
            if let Some(item) = items.iter().find(|item| item.len().is_ok_and(|n| n > 0)) {
                return self.write_data(py, item);
            }
        }
        // From 3.12 the socket transport has a writelines() of its own,
        // which does not look at the lost connection: it neither counts
        // towards the warning nor warns (it then fails from its internals,
        // which zuvrs does not copy: the items are dropped). Where the
        // running asyncio's writelines() checks it as write() does
        // (CPython gh-136234), one call is one dropped write.
        if !joined && !items.is_empty() && self.dropping(py) {
            if !socket_writelines_counts(py) {
                return Ok(());
            }
            return self.drop_write(py);
        }
        if self.dropping(py) || self.state.with(py, |st| st.sendfile_in_progress) {
            for item in &items {
                self.write_data(py, item)?;
            }
            return Ok(());
        }
        // One write of all the items, as asyncio's (one send of the items
        // joined up to 3.11, one sendmsg from 3.12): whether to try the
        // socket at once is decided for them together.
        let mut chunks = Vec::with_capacity(items.len());
        for item in &items {
            let (chunk, len) = to_chunk(item)?;
            if len > 0 {
                chunks.push((chunk, len));
            }
        }
        self.enqueue_all(py, chunks)
    }

    /// A write failed with libuv's `code`. A pipe whose reader went away
    /// (EPIPE) ends as asyncio's does: its watch of the pipe, polled before
    /// its writes, sees the reader go and closes with a bare
    /// BrokenPipeError() (data was left to write), unreported.
    fn write_failed(&self, py: Python<'_>, code: i32) -> PyResult<()> {
        if code == sys::uv_errno_t_UV_EPIPE && self.kind(py) == StreamKind::Pipe {
            let exc = pyo3::exceptions::PyBrokenPipeError::new_err(()).into_value(py).into_any();
            return self.force_close(py, Some(exc));
        }
        self.state.with(py, |st| st.write_failed = true);
        self.fatal_error(py, uv_error(code), self.msg_write_error(py))
    }

    /// Whether write() drops what it is given (see write_data).
    fn dropping(&self, py: Python<'_>) -> bool {
        self.state.with(py, |st| {
            st.base.conn_lost > 0 || st.handle.is_none() || (st.kind == StreamKind::Pipe && st.base.closing)
        })
    }

    /// Queues `chunk`; unless a write is in flight (its completion sends the
    /// queue), the transport asks to be flushed before the next poll.
    pub(super) fn enqueue_raw(&self, py: Python<'_>, chunk: Chunk, len: usize) -> PyResult<()> {
        // (One chunk, no vector: a write per turn is the common case.)
        self.enqueue_all(py, std::iter::once((chunk, len)))
    }

    /// Queues `chunks` as one write (see enqueue_raw).
    fn enqueue_all<I>(&self, py: Python<'_>, chunks: I) -> PyResult<()>
    where
        I: IntoIterator<Item = (Chunk, usize)>,
        I::IntoIter: ExactSizeIterator,
    {
        let chunks = chunks.into_iter();
        if chunks.len() == 0 {
            return Ok(());
        }
        let running = self.shared().is_running(py);
        let (flush_now, ask, me) = self.state.with(py, |st| {
            let high = st.reader.socket_high_water(&st.base);
            let w = &mut st.writes;
            for (chunk, len) in chunks {
                w.queue.push_back(chunk);
                w.queued_bytes += len;
            }
            st.base.stats.buffered(w.size());
            if w.writing {
                return (false, false, None);
            }
            if w.queued_bytes > high || !running {
                // Too much to hold until the end of the turn, or no turn
                // coming (the loop is not running): try the socket now, so
                // flow control reflects what the kernel could not take, as
                // in asyncio where every write tries the socket at once.
                return (true, false, None);
            }
            if w.flush_pending {
                return (false, false, None);
            }
            w.flush_pending = true;
            (false, true, st.object(py))
        });
        if flush_now {
            self.flush(py)?;
        } else if ask {
            if let Some(me) = me {
                self.shared().before_poll(py, me, ClientPtr(self));
            }
        }
        self.queue_grew(py)
    }

    /// One vectored try-write of everything queued; the rest goes to
    /// `uv_write`.
    pub(super) fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let io = &self.shared().stats.io;
        let failed = self.state.with(py, |st| {
            st.writes.flush_pending = false;
            let stream = st.handle.as_ref();
            let w = &mut st.writes;
            if w.writing || w.queue.is_empty() {
                return Ok(false);
            }
            let Some(stream) = stream else { return Ok(false) };
            // (libuv writes at most IOV_MAX of the buffers.)
            let n = stream.try_write(&io_bufs(w.queue.iter()));
            st.base.stats.wrote(io, 1, n.max(0) as usize);
            if n < 0 && n != sys::uv_errno_t_UV_EAGAIN {
                return Err((n, w.discard()));
            }
            w.advance(n.max(0) as usize);
            Ok(true)
        });
        match failed {
            Ok(false) => Ok(()),
            Ok(true) => {
                self.submit(py)?;
                self.queue_shrank(py)?;
                self.after_drain(py)
            }
            Err((code, dropped)) => {
                drop(dropped);
                self.write_failed(py, code)
            }
        }
    }

    /// Starts one vectored `uv_write` of everything queued, unless one is
    /// already in flight.
    fn submit(&self, py: Python<'_>) -> PyResult<()> {
        let io = &self.shared().stats.io;
        let failed = self.state.with(py, |st| {
            let stream = st.handle.as_ref()?;
            let w = &mut st.writes;
            if w.writing || w.queue.is_empty() {
                return None;
            }
            // At most MAX_WRITE bytes per request: a larger chunk is split,
            // and the rest goes with the next request.
            let mut chunks: SmallVec<[Chunk; 4]> = SmallVec::new();
            let mut bytes = 0;
            while bytes < MAX_WRITE {
                let Some(front) = w.queue.front_mut() else { break };
                let room = MAX_WRITE - bytes;
                if front.len() > room {
                    chunks.push(front.split_front(py, room));
                    bytes += room;
                    break;
                }
                bytes += front.len();
                chunks.push(w.queue.pop_front().expect("front exists"));
            }
            w.in_flight_bytes += bytes;
            w.queued_bytes -= bytes;
            // The request holds the chunks until libuv is done with them.
            if let Err((rc, req)) = stream.write(Outgoing { chunks, bytes }) {
                // libuv refused the request: it is still ours.
                w.in_flight_bytes -= req.bytes;
                return Some((rc, req));
            }
            w.writing = true;
            st.base.stats.wrote(io, 1, 0);
            None
        });
        match failed {
            None => Ok(()),
            Some((rc, req)) => {
                drop(req);
                self.write_failed(py, rc)
            }
        }
    }

    /// Once nothing is left to write: wake a drain waiter, finish a pending
    /// close, or send EOF.
    pub(super) fn after_drain(&self, py: Python<'_>) -> PyResult<()> {
        let Some(waiter) = self.state.with(py, |st| st.writes.is_idle().then(|| st.drain_waiter.take())) else {
            return Ok(());
        };
        if let Some(waiter) = waiter {
            let waiter = waiter.bind(py);
            if !python::future_call0(waiter, python::FutureMethod::Done)?.is_truthy()? {
                python::future_call1(waiter, python::FutureMethod::SetResult, pyo3::types::PyNone::get(py).as_any())?;
            }
        }
        let lose = self.state.with(py, |st| {
            let lose = st.base.closing && st.base.conn_lost == 0;
            if lose {
                st.base.conn_lost += 1;
            }
            lose
        });
        if lose {
            return self.schedule_connection_lost(py, None);
        }
        // (An error here is asyncio's failing _write_ready: not reported.)
        self.maybe_shutdown(py);
        Ok(())
    }

    /// Sends EOF (shutdown of the write side) once nothing is left to write:
    /// `shutdown(2)` at once, as asyncio's `sock.shutdown(SHUT_WR)`, so an
    /// error reaches write_eof()'s caller as there (the errno of a failure;
    /// after a drain asyncio's callback would fail, which is not copied).
    pub(super) fn maybe_shutdown(&self, py: Python<'_>) -> Option<i32> {
        self.state.with(py, |st| {
            if !st.eof || st.shutdown_sent || !st.writes.is_idle() {
                return None;
            }
            let stream = st.handle.as_ref()?;
            st.shutdown_sent = true;
            // On the stream's own socket: libuv has nothing in flight on it
            // (the queue is idle) and only reads from it from now on.
            shutdown_write(stream.fd()?).err()
        })
    }

    pub(super) fn on_write_done(&self, py: Python<'_>, bytes: usize, status: i32) -> PyResult<()> {
        let io = &self.shared().stats.io;
        let closed = self.state.with(py, |st| {
            if status >= 0 {
                st.base.stats.wrote(io, 0, bytes);
            }
            st.writes.writing = false;
            st.writes.in_flight_bytes = st.writes.in_flight_bytes.saturating_sub(bytes);
            st.handle.is_none()
        });
        if status == sys::uv_errno_t_UV_ECANCELED || closed {
            return Ok(());
        }
        if status < 0 {
            return self.write_failed(py, status);
        }
        self.submit(py)?;
        self.queue_shrank(py)?;
        self.after_drain(py)
    }
}
