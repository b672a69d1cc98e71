//! The read side of a stream transport: where reads go, and what each
//! outcome of a read (data, EOF, error) does.
//!
//! A transport's `Reader` (mod.rs) is one of: a plain protocol, whose reads
//! land in the loop's read buffer (readbuf.rs) and reach `data_received` from
//! inside libuv's read callback; a BufferedProtocol, whose reads go straight
//! into the buffer its `get_buffer()` lends; or TLS (tls.rs).

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use super::{Reader, StreamCore, StreamKind};
use crate::errors::{is_fatal_base, uv_error};
use crate::eventloop::ClientPtr;
use crate::python;
use crate::transport::base::Transport;
use crate::transport::buffer::BufferView;
use crate::transport::readbuf::{self, READ_SIZE};
use crate::uv::sys;
use crate::uv::transport::ReadInto;

impl StreamCore {
    pub(super) fn start_read(&self, py: Python<'_>) -> Result<(), i32> {
        self.state.with(py, |st| {
            if st.reading || !st.base.wants_reading() {
                return Ok(());
            }
            let Some(stream) = &st.handle else { return Ok(()) };
            stream.read_start()?;
            st.reading = true;
            Ok(())
        })
    }

    pub(super) fn stop_read(&self, py: Python<'_>) {
        self.state.with(py, |st| {
            if st.reading {
                st.reading = false;
                if let Some(stream) = &st.handle {
                    stream.read_stop();
                }
            }
        })
    }

    /// libuv wants memory for a read. A BufferedProtocol lends its own buffer
    /// (`get_buffer(-1)`, as asyncio asks before each recv_into); otherwise
    /// the loop's read buffer.
    pub(super) fn read_target(&self, py: Python<'_>) -> ReadInto<BufferView> {
        let (protocol, tls) = self.state.with(py, |st| match st.reader {
            Reader::Buffered { .. } => (st.base.protocol.as_ref().map(|p| p.clone_ref(py)), false),
            Reader::Plain => (None, false),
            Reader::Tls(_) => (None, true),
        });
        // (TLS: the socket's reads reach the application only through the
        // handshake, whose end calls it as sslproto does.)
        if !tls && self.first_read_waits(py) {
            self.state.with(py, |st| st.read_waits = true);
            // Read nothing now: libuv reports UV_ENOBUFS, and the fd, still
            // readable, comes up again at the next poll.
            return ReadInto::Nothing;
        }
        if let Some(protocol) = protocol {
            let view = {
                let _context = self.protocol_context(py);
                lend_buffer(protocol.bind(py))
            };
            let (lent, unused) = self.state.with(py, |st| {
                let Reader::Buffered { error } = &mut st.reader else {
                    // The protocol changed meanwhile: read nothing this time.
                    return (ReadInto::Nothing, view.ok());
                };
                match view {
                    Ok(v) => (ReadInto::Lent(v), None),
                    Err(e) => {
                        // Nothing lent makes libuv report UV_ENOBUFS.
                        *error = Some(Box::new(e));
                        (ReadInto::Nothing, None)
                    }
                }
            });
            drop(unused);
            return lent;
        }
        // (libuv reports UV_ENOBUFS if it cannot be made.)
        ReadInto::ReadBuffer(READ_SIZE)
    }

    /// A read is done (`StreamOwner::read_done`); `view` is the buffer a
    /// BufferedProtocol lent for it.
    pub(super) fn on_read(&self, py: Python<'_>, nread: isize, view: Option<BufferView>) {
        let io = &self.shared().stats.io;
        let (get_buffer_error, tls, waits) = self.state.with(py, |st| {
            if nread != sys::uv_errno_t_UV_ENOBUFS as isize {
                st.base.stats.read(io, nread.max(0) as usize);
            }
            let waits = std::mem::take(&mut st.read_waits);
            match &mut st.reader {
                Reader::Buffered { error } => (error.take().map(|e| *e), false, waits),
                Reader::Plain => (None, false, waits),
                Reader::Tls(_) => (None, true, waits),
            }
        });
        if waits {
            return;
        }
        if tls && nread > 0 {
            if let Err(err) = self.tls_received(py, nread as usize) {
                self.fail_in_callback(py, err);
            }
            return;
        }
        if let Some((err, message)) = get_buffer_error {
            self.stop_read(py);
            let message = if message.is_empty() { self.msg_read_error(py) } else { message };
            let res = if is_fatal_base(py, &err) { Err(err) } else { self.fatal_error(py, err, message) };
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
            let full = nread as usize == READ_SIZE && self.kind(py) == StreamKind::Pipe;
            self.deliver(py, nread as usize)
                .and_then(|()| if full { self.hold_reading_until_next_poll(py) } else { Ok(()) })
        } else if nread == sys::uv_errno_t_UV_EOF as isize {
            self.on_eof(py)
        } else if nread < 0 {
            self.stop_read(py);
            self.fatal_error(py, uv_error(nread as i32), self.msg_read_error(py))
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
        let me = self.state.with(py, |st| {
            if !st.reading {
                return None;
            }
            st.rearm = true;
            st.object(py)
        });
        let Some(me) = me else { return Ok(()) };
        self.stop_read(py);
        self.shared().before_poll(py, me, ClientPtr(self));
        Ok(())
    }

    /// Resumes a read held back by `hold_reading_until_next_poll`, unless
    /// paused or closed meanwhile.
    pub(super) fn rearm_read(&self, py: Python<'_>) -> PyResult<()> {
        if !self.state.with(py, |st| std::mem::take(&mut st.rearm)) {
            return Ok(());
        }
        match self.start_read(py) {
            Ok(()) => Ok(()),
            Err(rc) => self.fatal_error(py, uv_error(rc), self.msg_read_error(py)),
        }
    }

    /// Hands `n` bytes from the read buffer to `protocol.data_received`, or
    /// to the sink that takes the protocol's reads (sink.rs).
    #[inline]
    fn deliver(&self, py: Python<'_>, n: usize) -> PyResult<()> {
        let result = match self.sink(py) {
            Some(sink) => self.deliver_to_sink(py, &*sink, n),
            None => {
                let (protocol, copy_short) =
                    self.state.with(py, |st| (st.base.protocol.as_ref().map(|p| p.clone_ref(py)), st.copy_short_reads));
                let Some(protocol) = protocol else { return Ok(()) };
                let Some(data) = readbuf::deliver(py, n, copy_short) else { return Ok(()) };
                let result =
                    python::call_method(protocol.bind(py), python::protocol::data_received(py), (data.bytes(),));
                if data.give_back() {
                    self.state.with(py, |st| st.copy_short_reads = true);
                }
                result.map(drop)
            }
        };
        match result {
            Ok(_) => Ok(()),
            Err(err) if is_fatal_base(py, &err) => Err(err),
            // asyncio's read pipe calls the protocol straight from its fd
            // callback: the loop reports the exception and reading goes on.
            Err(err) if self.kind(py) == StreamKind::Pipe => self.callback_failed(py, err, false),
            Err(err) => self.fatal_error(py, err, "Fatal error: protocol.data_received() call failed."),
        }
    }

    /// `n` bytes landed in a BufferedProtocol's buffer.
    fn buffer_updated(&self, py: Python<'_>, n: usize) -> PyResult<()> {
        let Some(protocol) = self.protocol(py) else { return Ok(()) };
        match python::call_method(protocol.bind(py), python::protocol::buffer_updated(py), (n,)) {
            Ok(_) => Ok(()),
            Err(err) if is_fatal_base(py, &err) => Err(err),
            Err(err) => self.fatal_error(py, err, "Fatal error: protocol.buffer_updated() call failed."),
        }
    }

    fn on_eof(&self, py: Python<'_>) -> PyResult<()> {
        self.stop_read(py);
        if self.kind(py) == StreamKind::Pipe {
            return self.pipe_eof(py);
        }
        if self.is_tls(py) {
            return match self.tls_socket_eof(py) {
                Ok(true) => Ok(()),
                Ok(false) => self.close_transport(py),
                Err(err) if is_fatal_base(py, &err) => Err(err),
                Err(err) => {
                    self.close_transport(py)?;
                    self.fatal_error(py, err, "Fatal error: protocol.eof_received() call failed.")
                }
            };
        }
        let Some(protocol) = self.protocol(py) else { return Ok(()) };
        match python::call_method0(protocol.bind(py), python::protocol::eof_received(py)) {
            Ok(keep_open) => {
                if !keep_open.is_truthy()? {
                    self.close_transport(py)?;
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
        let (protocol, loop_obj) = self.state.with(py, |st| {
            st.base.closing = true;
            st.base.conn_lost += 1;
            (st.base.protocol.as_ref().map(|p| p.clone_ref(py)), st.base.loop_obj.clone_ref(py))
        });
        if let Some(protocol) = protocol {
            let cb = protocol.bind(py).getattr(python::protocol::eof_received(py))?;
            python::call_method(loop_obj.bind(py), python::event_loop::call_soon(py), (cb,))?;
        }
        self.schedule_connection_lost(py, None)
    }
}

/// What asyncio's `_read_ready__get_buffer` does before its `recv_into`:
/// `get_buffer(-1)` and a check that the buffer is not empty (failures are
/// "Fatal error: protocol.get_buffer() call failed."), then the writable
/// memory, whose absence `recv_into` reports as a TypeError (reported as a
/// read error: the empty message stands for the transport's own).
fn lend_buffer(protocol: &Bound<'_, PyAny>) -> Result<BufferView, (PyErr, &'static str)> {
    let py = protocol.py();
    const GET_BUFFER_FAILED: &str = "Fatal error: protocol.get_buffer() call failed.";
    let buf =
        python::call_method(protocol, python::protocol::get_buffer(py), (-1,)).map_err(|e| (e, GET_BUFFER_FAILED))?;
    match buf.len() {
        Ok(0) => return Err((PyRuntimeError::new_err("get_buffer() returned an empty buffer"), GET_BUFFER_FAILED)),
        Err(e) => return Err((e, GET_BUFFER_FAILED)),
        Ok(_) => {}
    }
    BufferView::get(&buf, true).map_err(|e| {
        if e.is_instance_of::<pyo3::exceptions::PyBufferError>(py) {
            let name = buf.get_type().name().map(|n| n.to_string()).unwrap_or_default();
            let msg = format!("recv_into() argument 1 must be read-write bytes-like object, not {name}");
            (pyo3::exceptions::PyTypeError::new_err(msg), "")
        } else {
            (e, "")
        }
    })
}
