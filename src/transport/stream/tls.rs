//! A stream transport's TLS reader: the connection's records done natively
//! on the user's `ssl.SSLContext` (see src/tls), with the semantics of
//! asyncio's `sslproto` (3.11+), which this mirrors state by state.
//!
//! The socket's reads land in the read buffer and are fed to the session;
//! what the session decrypts reaches the application protocol from inside
//! libuv's read callback (plain: `data_received`, once per socket read with
//! all that was decrypted; buffered: `get_buffer` / `buffer_updated`).
//! Application writes wait in a plaintext backlog until the end of the turn,
//! when they are encrypted together (small writes coalesce into full
//! records) and the ciphertext joins the socket's write queue: one system
//! call per turn, as for plain transports. Write flow control is
//! sslproto's, on two levels: the socket's queue has asyncio's socket marks
//! (64 / 16 KiB), and over them the socket "pauses SSLProtocol": ciphertext
//! then stays in the session. The application's buffer
//! (`get_write_buffer_size()`, its pause_writing / resume_writing at the
//! TLS marks, 512 / 128 KiB) is the backlog and that held ciphertext, not
//! the socket's queue. The only difference left is the batching: within a
//! turn, plaintext written is still counted (sslproto encrypts and hands it
//! to the socket inside write()).
//!
//! What happens once per connection is Python (transports/_tls.py): the
//! choice of this path, the handshake's and the shutdown's timeouts, the
//! extra info and `connection_made` once the handshake is done, the
//! application's `connection_lost`. The core calls it through
//! `_tls_handshake_done()`, `_tls_handshake_failed(exc)`,
//! `_tls_shutdown_started()`, `_tls_shutdown_finished()` and `_fatal_error`.

use std::collections::VecDeque;

use pyo3::exceptions::{PyConnectionResetError, PyNotImplementedError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyMemoryView};
use smallvec::SmallVec;

use super::writer::{to_chunk, Chunk};
use super::Reader;
use super::StreamCore;
use crate::errors::{is_fatal_base, uv_error};
use crate::eventloop::ClientPtr;
use crate::python;
use crate::tls::{self, Decrypted, Handshake, Opened, Shutdown, TlsSession, UniqueBytes, WritableBuffer, Write};
use crate::transport::base::{Transport, LOG_THRESHOLD_FOR_CONNLOST_WRITES};
use crate::transport::readbuf::{self, Delivered};
use crate::uv::sys;

/// asyncio's water marks for TLS: writes (FLOW_CONTROL_HIGH_WATER_SSL_WRITE)
/// and ciphertext received but not yet decrypted (..._SSL_READ), in bytes.
const HIGH_WATER_WRITE: usize = 512 * 1024;
const HIGH_WATER_READ: usize = 256 * 1024;

/// The water marks of the socket underneath (asyncio's socket transport's
/// defaults, which sslproto never changes): over the high one the socket
/// pauses its protocol, sslproto's SSLProtocol, which then keeps ciphertext
/// in the session; at the low one it resumes it.
pub(super) const SOCKET_HIGH_WATER: usize = 64 * 1024;
const SOCKET_LOW_WATER: usize = SOCKET_HIGH_WATER / 4;

/// sslproto's `SSLProtocolState`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum TlsState {
    Handshake,
    Wrapped,
    Flushing,
    Shutdown,
    Unwrapped,
}

/// sslproto's `AppProtocolState`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum AppState {
    Init,
    Made,
    Eof,
    Lost,
}

pub(super) struct Tls {
    /// The connection's records; None once the connection is over
    /// (`tls_release_session`), when the SSLObject, its context and the
    /// BIOs are let go while the core waits for libuv's close.
    session: Option<TlsSession>,
    pub(super) state: TlsState,
    app: AppState,
    /// The application protocol is a BufferedProtocol.
    app_buffered: bool,
    /// The application transport's close() or abort() was called.
    pub(super) app_closed: bool,
    app_reading_paused: bool,
    /// sslproto's `_ssl_writing_paused`: ciphertext stays in the session's
    /// outgoing buffer (and counts in the write buffer) instead of joining
    /// the socket's queue. Set while the socket's queue is over its
    /// high-water mark (asyncio's socket transport pausing SSLProtocol), or
    /// by `transport._ssl_protocol.pause_writing()`.
    ssl_writing_paused: bool,
    /// The socket's own `_protocol_paused` (its queue went over
    /// SOCKET_HIGH_WATER and has not drained to SOCKET_LOW_WATER yet).
    socket_paused: bool,
    /// The socket's reading was paused: too much ciphertext is waiting.
    ssl_reading_paused: bool,
    /// The socket's EOF arrived.
    eof_received: bool,
    backlog: VecDeque<Chunk>,
    backlog_bytes: usize,
    /// Writes dropped once the connection closed (asyncio warns after a few).
    dropped_writes: u32,
    /// A read is due before the next poll (resume_reading, a full buffer).
    read_due: bool,
    /// Ciphertext waiting to be decrypted at which the socket's reading
    /// pauses, and resumes.
    read_high: usize,
    read_low: usize,
    /// The session holds its record buffers between records (see
    /// `keep_buffers`) and is on the loop's housekeeping list, which
    /// frees them once a period passes with no record.
    buffers_held: bool,
    /// Records went through since the last housekeeping.
    active: bool,
}

impl Tls {
    /// What the application's write buffer holds besides the socket's
    /// queue: the plaintext backlog and ciphertext not yet handed to the
    /// socket (sslproto's `_write_buffer_size + _outgoing.pending`).
    pub(super) fn unsent(&self, py: Python<'_>) -> usize {
        self.backlog_bytes + self.session.as_ref().map_or(0, |s| s.output_len(py))
    }

    /// Records go through the session now: it holds its buffers until an
    /// idle housekeeping period. True when it did not hold them: the core
    /// is to join the loop's housekeeping list (`tls_hold_buffers`).
    fn records_pass(&mut self) -> bool {
        self.active = true;
        !std::mem::replace(&mut self.buffers_held, true)
    }

    /// The live session (`with_tls` gives only connections that have one).
    fn session(&mut self) -> &mut TlsSession {
        self.session.as_mut().expect("with_tls gives connections with a live session only")
    }
}

/// What `tls_send_from_session` did with the session's ciphertext.
enum Sent {
    /// The socket took all of it (or there was none).
    All,
    /// Some may be left (not tried, or partly taken).
    Unknown,
    /// The socket failed: the connection is ending, nothing more goes.
    Failed,
}

/// What the core does next after a step that ran with the state borrowed.
enum Next {
    Nothing,
    Handshake,
    Read,
    Flush,
    Shutdown,
}

impl StreamCore {
    /// The TLS state, if this is a TLS transport whose session is live (`f`
    /// on it).
    fn with_tls<R>(&self, py: Python<'_>, f: impl FnOnce(&mut Tls) -> R) -> Option<R> {
        self.state.with(py, |st| match &mut st.reader {
            Reader::Tls(tls) if tls.session.is_some() => Some(f(tls)),
            _ => None,
        })
    }

    /// As `with_tls`, also once the connection is over (for what needs
    /// only its state, not the session).
    fn with_tls_state<R>(&self, py: Python<'_>, f: impl FnOnce(&mut Tls) -> R) -> Option<R> {
        self.state.with(py, |st| match &mut st.reader {
            Reader::Tls(tls) => Some(f(tls)),
            _ => None,
        })
    }

    /// The connection is over (its connection_lost ran): the session goes,
    /// and with it the SSLObject, its context and the BIOs, as asyncio's
    /// SSLProtocol lets them go then. The core itself lives on until
    /// libuv's close of the handle, which completes only on the loop's next
    /// turn (CPython's test_ssl checks that the context is freed once
    /// run_until_complete returns). What is left answers as a closed TLS
    /// transport.
    pub(super) fn tls_release_session(&self, py: Python<'_>) {
        let session = self.state.with(py, |st| match &mut st.reader {
            Reader::Tls(tls) => tls.session.take(),
            _ => None,
        });
        drop(session);
    }

    pub(super) fn is_tls(&self, py: Python<'_>) -> bool {
        self.state.with(py, |st| matches!(st.reader, Reader::Tls(_)))
    }

    /// Switches the transport to TLS on `sslobj` (made by
    /// `context.wrap_bio(incoming, outgoing, ...)`) for the application
    /// `protocol`; None, or why it cannot be native (then nothing changed).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn begin_tls(
        &self,
        py: Python<'_>,
        sslobj: &Bound<'_, PyAny>,
        incoming: &Bound<'_, PyAny>,
        outgoing: &Bound<'_, PyAny>,
        protocol: Py<PyAny>,
        buffered: bool,
        call_connection_made: bool,
    ) -> PyResult<Option<String>> {
        let mut session = match TlsSession::open(py, sslobj, incoming, outgoing)? {
            Opened::Native(s) => s,
            Opened::NotNative(why) => return Ok(Some(why)),
        };
        session.keep_buffers(py);
        let tls = Box::new(Tls {
            session: Some(session),
            state: TlsState::Unwrapped,
            app: if call_connection_made { AppState::Init } else { AppState::Made },
            app_buffered: buffered,
            app_closed: false,
            app_reading_paused: false,
            ssl_writing_paused: false,
            socket_paused: false,
            ssl_reading_paused: false,
            eof_received: false,
            backlog: VecDeque::new(),
            backlog_bytes: 0,
            dropped_writes: 0,
            read_due: false,
            read_high: HIGH_WATER_READ,
            read_low: HIGH_WATER_READ / 4,
            buffers_held: false,
            active: false,
        });
        let old = self.state.with(py, |st| {
            st.base.high_water = HIGH_WATER_WRITE;
            st.base.low_water = HIGH_WATER_WRITE / 4;
            st.base.pause_on_reaching_high = true;
            (std::mem::replace(&mut st.reader, Reader::Tls(tls)), st.base.protocol.replace(protocol))
        });
        drop(old);
        Ok(None)
    }

    /// sslproto's `_start_handshake` (its `connection_made`).
    pub(super) fn tls_start_handshake(&self, py: Python<'_>) -> PyResult<()> {
        let start = self.with_tls(py, |t| {
            let start = t.state == TlsState::Unwrapped && t.app != AppState::Lost;
            if start {
                t.state = TlsState::Handshake;
            }
            start
        });
        if start == Some(true) {
            if self.with_tls(py, Tls::records_pass) == Some(true) {
                self.tls_hold_buffers(py);
            }
            self.tls_handshake(py)?;
        }
        Ok(())
    }

    /// The session holds its record buffers from now on: the loop's
    /// housekeeping frees them after an idle period.
    #[cold]
    fn tls_hold_buffers(&self, py: Python<'_>) {
        self.shared().want_housekeeping(py, ClientPtr(self));
    }

    pub(super) fn tls_buffers_held(&self, py: Python<'_>) -> bool {
        self.with_tls(py, |t| t.buffers_held).unwrap_or(false)
    }

    /// The loop's housekeeping: a session idle since the last one gives
    /// its record buffers back (when nothing is pending in them). True
    /// while they are held.
    pub(super) fn tls_housekeeping(&self, py: Python<'_>) -> bool {
        self.with_tls_state(py, |t| {
            if std::mem::take(&mut t.active) {
                return true;
            }
            let released = t.session.as_mut().is_none_or(|s| s.release_buffers(py));
            t.buffers_held = !released;
            t.buffers_held
        })
        .unwrap_or(false)
    }

    fn tls_handshake(&self, py: Python<'_>) -> PyResult<()> {
        let outcome = self.with_tls(py, |t| t.session().handshake(py));
        match outcome {
            None => Ok(()),
            Some(Ok(Handshake::WantRead)) => self.tls_process_outgoing(py),
            Some(Ok(Handshake::Done)) => {
                let call_made = self
                    .with_tls(py, |t| {
                        t.state = TlsState::Wrapped;
                        let due = t.app == AppState::Init;
                        if due {
                            t.app = AppState::Made;
                        }
                        due
                    })
                    .unwrap_or(false);
                // The extra info, the application's connection_made and the
                // waiter: Python, once per connection. False: the peer's
                // certificate could not be read (the connection failed).
                let wrapper = self.wrapper(py);
                let name = pyo3::intern!(py, "_tls_handshake_done");
                match python::call_method(wrapper.bind(py), name, (call_made,)) {
                    Ok(ok) if ok.is_truthy()? => self.tls_do_read(py),
                    Ok(_) => {
                        self.with_tls(py, |t| t.state = TlsState::Unwrapped);
                        Ok(())
                    }
                    Err(err) if is_fatal_base(py, &err) => Err(err),
                    // The application's connection_made raised: in asyncio
                    // it escapes SSLProtocol.buffer_updated, and the socket
                    // transport reports it so.
                    Err(err) => self.tls_fatal_error(py, err, "Fatal error: protocol.buffer_updated() call failed."),
                }
            }
            Some(Err(err)) if tls::is_again(py, &err) => self.tls_process_outgoing(py),
            Some(Err(err)) => self.tls_handshake_failed(py, err),
        }
    }

    /// sslproto's `_on_handshake_complete(exc)` for a failure. As there,
    /// the alert the session wrote for the peer stays in the session: the
    /// socket closes at once, and the peer sees the connection end (a
    /// ConnectionResetError in its handshake) exactly as with asyncio.
    fn tls_handshake_failed(&self, py: Python<'_>, err: PyErr) -> PyResult<()> {
        self.with_tls(py, |t| t.state = TlsState::Unwrapped);
        let wrapper = self.wrapper(py);
        python::call_method(wrapper.bind(py), pyo3::intern!(py, "_tls_handshake_failed"), (err.into_value(py),))?;
        Ok(())
    }

    /// The socket read `n` bytes into the read buffer.
    pub(super) fn tls_received(&self, py: Python<'_>, n: usize) -> PyResult<()> {
        let (next, hold) = self.state.with(py, |st| -> PyResult<(Next, bool)> {
            let Reader::Tls(t) = &mut st.reader else { return Ok((Next::Nothing, false)) };
            let Some(session) = t.session.as_mut() else { return Ok((Next::Nothing, false)) };
            readbuf::filled(n, |data| session.feed(py, data)).unwrap_or(Ok(()))?;
            let next = match t.state {
                TlsState::Handshake => Next::Handshake,
                TlsState::Wrapped => Next::Read,
                TlsState::Flushing => Next::Flush,
                TlsState::Shutdown => Next::Shutdown,
                TlsState::Unwrapped => Next::Nothing,
            };
            Ok((next, t.records_pass()))
        })?;
        if hold {
            self.tls_hold_buffers(py);
        }
        self.tls_run(py, next)
    }

    fn tls_run(&self, py: Python<'_>, next: Next) -> PyResult<()> {
        match next {
            Next::Nothing => Ok(()),
            Next::Handshake => self.tls_handshake(py),
            Next::Read => self.tls_do_read(py),
            Next::Flush => self.tls_do_flush(py),
            Next::Shutdown => self.tls_do_shutdown(py),
        }
    }

    /// sslproto's `_do_read`, errors included.
    fn tls_do_read(&self, py: Python<'_>) -> PyResult<()> {
        match self.tls_read_step(py) {
            Err(err) if !is_fatal_base(py, &err) => self.tls_fatal_error(py, err, "Fatal error on SSL protocol"),
            other => other,
        }
    }

    fn tls_read_step(&self, py: Python<'_>) -> PyResult<()> {
        let Some((readable, paused, buffered)) = self.with_tls(py, |t| {
            (matches!(t.state, TlsState::Wrapped | TlsState::Flushing), t.app_reading_paused, t.app_buffered)
        }) else {
            return Ok(());
        };
        if !readable {
            return Ok(());
        }
        if !paused {
            let closed = if buffered { self.tls_read_buffered(py)? } else { self.tls_read_copied(py)? };
            if closed {
                // close_notify
                self.tls_call_eof_received(py)?;
                self.tls_start_shutdown(py)?;
            }
            if self.with_tls(py, |t| !t.backlog.is_empty()) == Some(true) {
                self.tls_do_write(py)?;
            } else {
                self.tls_process_outgoing(py)?;
            }
        }
        self.tls_control_reading(py)
    }

    /// Decrypts everything available and hands it to `data_received` in
    /// one call; true if the peer's close_notify arrived. Records are
    /// decrypted one after another into the read buffer, so a socket read's
    /// worth (the usual case) reaches the protocol in the buffer itself
    /// when it holds at least a quarter of it (readbuf.rs), else with one
    /// copy; more than a buffer's worth is joined.
    fn tls_read_copied(&self, py: Python<'_>) -> PyResult<bool> {
        // The read buffer, taken out for its bytes to be written (this is
        // its only reference, as between reads); None when out of memory.
        let taken = readbuf::memory(py).and_then(|_| readbuf::take_whole(py)).map(UniqueBytes::new);
        let Some(Ok(mut plain)) = taken else {
            return Err(pyo3::exceptions::PyMemoryError::new_err(()));
        };
        let size = plain.len();
        let mut joined: Vec<u8> = Vec::new();
        // Decrypted bytes at the start of the read buffer.
        let mut filled = 0usize;
        let mut closed = false;
        let mut failed = None;
        loop {
            if filled == size {
                joined.extend_from_slice(plain.as_mut_slice());
                filled = 0;
            }
            let buf = &mut plain.as_mut_slice()[filled..];
            let got = self.with_tls(py, |t| {
                let got = t.session().read_into(py, buf);
                (got, t.session().has_pending(py))
            });
            match got {
                Some((Ok(Decrypted::Data(n)), more)) if n > 0 => {
                    filled += n;
                    if !more {
                        break;
                    }
                }
                Some((Ok(Decrypted::Closed), _)) => {
                    closed = true;
                    break;
                }
                Some((Err(err), _)) if !tls::is_again(py, &err) => {
                    failed = Some(err);
                    break;
                }
                _ => break,
            }
        }
        // What was decrypted before an error still reaches the application.
        self.tls_deliver(py, plain, filled, joined)?;
        match failed {
            Some(err) => Err(err),
            None => Ok(closed),
        }
    }

    /// `data_received` (or the protocol's sink) with what was read: the
    /// `last` bytes at the start of the read buffer `plain`, after those
    /// `joined` before them. The read buffer goes back before any Python
    /// code runs, unless it is handed to the protocol
    /// (`readbuf::deliver_taken`).
    fn tls_deliver(&self, py: Python<'_>, mut plain: UniqueBytes, last: usize, mut joined: Vec<u8>) -> PyResult<()> {
        if last == 0 && joined.is_empty() {
            readbuf::give_back(plain.into_bytes(py));
            return Ok(());
        }
        if let Some(sink) = self.sink(py) {
            let joined_taken = if joined.is_empty() { Ok(()) } else { sink.take(py, &joined) };
            let took = joined_taken.and_then(|()| sink.take(py, &plain.as_mut_slice()[..last]));
            readbuf::give_back(plain.into_bytes(py));
            took?;
            return sink.taken(py);
        }
        let Some(protocol) = self.protocol(py) else {
            readbuf::give_back(plain.into_bytes(py));
            return Ok(());
        };
        let data = if joined.is_empty() {
            let copy_short = self.state.with(py, |st| st.copy_short_reads);
            readbuf::deliver_taken(py, plain.into_bytes(py), last, copy_short)
        } else {
            joined.extend_from_slice(&plain.as_mut_slice()[..last]);
            readbuf::give_back(plain.into_bytes(py));
            Delivered::Copied(PyBytes::new(py, &joined))
        };
        let result = python::call_method(protocol.bind(py), python::protocol::data_received(py), (data.bytes(),));
        if data.give_back() {
            self.state.with(py, |st| st.copy_short_reads = true);
        }
        result.map(drop)
    }

    /// sslproto's `_do_read__buffered`; true if close_notify arrived.
    fn tls_read_buffered(&self, py: Python<'_>) -> PyResult<bool> {
        let Some(protocol) = self.protocol(py) else { return Ok(false) };
        let want = self.with_tls(py, |t| t.session().incoming_len(py)).unwrap_or(0);
        let buf = python::call_method(protocol.bind(py), python::protocol::get_buffer(py), (want,))?;
        let view = WritableBuffer::get(&buf)?;
        let wants = view.len();
        let mut offset = 0;
        let mut again = false;
        // An empty buffer: sslproto reads into it all the same, and
        // SSLObject.read(0) returns 0 at once, which it takes for
        // close_notify (eof_received, then the TLS shutdown).
        let mut closed = wants == 0;
        while offset < wants {
            let got = self.with_tls(py, |t| t.session().read_into(py, view.plaintext_from(offset)));
            match got {
                Some(Ok(Decrypted::Data(n))) if n > 0 => offset += n,
                Some(Ok(Decrypted::Closed)) => {
                    closed = true;
                    break;
                }
                Some(Err(err)) if !tls::is_again(py, &err) => {
                    drop(view);
                    if offset > 0 {
                        python::call_method(protocol.bind(py), python::protocol::buffer_updated(py), (offset,))?;
                    }
                    return Err(err);
                }
                _ => break,
            }
        }
        if offset == wants && wants > 0 {
            // The buffer is full: more may be waiting (sslproto calls
            // _do_read again soon; here, before the next poll).
            again = true;
        }
        drop(view);
        if offset > 0 {
            python::call_method(protocol.bind(py), python::protocol::buffer_updated(py), (offset,))?;
        }
        if again && !closed {
            self.ask_before_poll(py, true);
        }
        Ok(closed)
    }

    /// sslproto's `_call_eof_received`.
    fn tls_call_eof_received(&self, py: Python<'_>) -> PyResult<()> {
        let call = self.with_tls(py, |t| {
            let call = t.app == AppState::Made;
            if call {
                t.app = AppState::Eof;
            }
            call
        });
        if call != Some(true) {
            return Ok(());
        }
        let Some(protocol) = self.protocol(py) else { return Ok(()) };
        match python::call_method0(protocol.bind(py), python::protocol::eof_received(py)) {
            Ok(keep_open) => {
                if keep_open.is_truthy()? {
                    python::call_method(
                        python::logger(py)?,
                        pyo3::intern!(py, "warning"),
                        ("returning true from eof_received() has no effect when using ssl",),
                    )?;
                }
                Ok(())
            }
            Err(err) if is_fatal_base(py, &err) => Err(err),
            Err(err) => self.tls_fatal_error(py, err, "Error calling eof_received()"),
        }
    }

    /// sslproto's `_start_shutdown` (the application transport's close()).
    fn tls_start_shutdown(&self, py: Python<'_>) -> PyResult<()> {
        self.tls_write_backlog_now(py)?;
        let Some(state) = self.with_tls(py, |t| {
            let state = t.state;
            if !matches!(state, TlsState::Flushing | TlsState::Shutdown | TlsState::Unwrapped) {
                t.app_closed = true;
                if state != TlsState::Handshake {
                    t.state = TlsState::Flushing;
                }
            }
            state
        }) else {
            return Ok(());
        };
        match state {
            TlsState::Flushing | TlsState::Shutdown | TlsState::Unwrapped => Ok(()),
            TlsState::Handshake => self.tls_abort(py),
            TlsState::Wrapped => {
                let wrapper = self.wrapper(py);
                python::call_method0(wrapper.bind(py), pyo3::intern!(py, "_tls_shutdown_started"))?;
                self.tls_do_flush(py)
            }
        }
    }

    /// sslproto's `_do_flush`: what is still to read, then the shutdown.
    fn tls_do_flush(&self, py: Python<'_>) -> PyResult<()> {
        self.tls_do_read(py)?;
        let shut = self.with_tls(py, |t| {
            let go = t.state == TlsState::Flushing;
            if go {
                t.state = TlsState::Shutdown;
            }
            go
        });
        if shut == Some(true) {
            self.tls_do_shutdown(py)?;
        }
        Ok(())
    }

    /// sslproto's `_do_shutdown`.
    fn tls_do_shutdown(&self, py: Python<'_>) -> PyResult<()> {
        let outcome = self.with_tls(py, |t| {
            if t.state != TlsState::Shutdown {
                return None;
            }
            if t.eof_received {
                return Some(Ok(Shutdown::Complete));
            }
            Some(t.session().shutdown(py))
        });
        match outcome.flatten() {
            None => Ok(()),
            Some(Ok(Shutdown::Sent)) => self.tls_process_outgoing(py),
            Some(Err(err)) if tls::is_again(py, &err) => self.tls_process_outgoing(py),
            Some(Err(err)) => self.tls_shutdown_complete(py, Some(err)),
            Some(Ok(Shutdown::Complete)) => {
                self.tls_process_outgoing(py)?;
                self.tls_call_eof_received(py)?;
                self.tls_shutdown_complete(py, None)
            }
        }
    }

    /// sslproto's `_on_shutdown_complete`: the socket closes once what is
    /// queued has gone (or the error is fatal).
    fn tls_shutdown_complete(&self, py: Python<'_>, err: Option<PyErr>) -> PyResult<()> {
        let wrapper = self.wrapper(py);
        python::call_method0(wrapper.bind(py), pyo3::intern!(py, "_tls_shutdown_finished"))?;
        match err {
            Some(err) => self.tls_fatal_error(py, err, "Fatal error on transport"),
            None => {
                let (loop_obj, me) = self.state.with(py, |st| (st.base.loop_obj.clone_ref(py), st.object(py)));
                let Some(me) = me else { return Ok(()) };
                let close = me.bind(py).getattr(pyo3::intern!(py, "_close_socket"))?;
                python::call_method(loop_obj.bind(py), python::event_loop::call_soon(py), (close,))?;
                Ok(())
            }
        }
    }

    /// sslproto's `_abort`: the socket goes at once.
    pub(super) fn tls_abort(&self, py: Python<'_>) -> PyResult<()> {
        self.with_tls(py, |t| t.state = TlsState::Unwrapped);
        self.socket_abort(py)
    }

    /// sslproto's `eof_received`: the socket's EOF. Returns whether the
    /// socket stays open (only while the application has paused reading).
    pub(super) fn tls_socket_eof(&self, py: Python<'_>) -> PyResult<bool> {
        let Some(state) = self.with_tls(py, |t| {
            t.eof_received = true;
            t.state
        }) else {
            return Ok(false);
        };
        match state {
            TlsState::Handshake => {
                let err = PyConnectionResetError::new_err(());
                self.tls_handshake_failed(py, err).map(|()| false)
            }
            TlsState::Wrapped => {
                self.tls_write_backlog_now(py)?;
                let paused = self.with_tls(py, |t| {
                    t.state = TlsState::Flushing;
                    t.app_reading_paused
                });
                if paused == Some(true) {
                    return Ok(true);
                }
                self.tls_do_flush(py).map(|()| false)
            }
            TlsState::Flushing => self
                .tls_do_write(py)
                .and_then(|()| {
                    self.with_tls(py, |t| t.state = TlsState::Shutdown);
                    self.tls_do_shutdown(py)
                })
                .map(|()| false),
            TlsState::Shutdown => self.tls_do_shutdown(py).map(|()| false),
            TlsState::Unwrapped => Ok(false),
        }
    }

    /// The application's write(): sslproto's `_write_appdata`.
    pub(super) fn tls_write(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        if !(data.is_instance_of::<PyBytes>()
            || data.is_instance_of::<PyByteArray>()
            || data.is_instance_of::<PyMemoryView>())
        {
            return Err(PyTypeError::new_err(format!(
                "data: expecting a bytes-like instance, got {}",
                data.get_type().name()?
            )));
        }
        if data.len()? == 0 {
            return Ok(());
        }
        self.tls_write_appdata(py, std::slice::from_ref(data))
    }

    pub(super) fn tls_writelines(&self, py: Python<'_>, list_of_data: &Bound<'_, PyAny>) -> PyResult<()> {
        let items: Vec<Bound<'_, PyAny>> = list_of_data.try_iter()?.collect::<PyResult<_>>()?;
        self.tls_write_appdata(py, &items)
    }

    fn tls_write_appdata(&self, py: Python<'_>, items: &[Bound<'_, PyAny>]) -> PyResult<()> {
        let Some((state, dropped)) = self.with_tls_state(py, |t| (t.state, t.dropped_writes)) else { return Ok(()) };
        if matches!(state, TlsState::Flushing | TlsState::Shutdown | TlsState::Unwrapped) {
            if dropped >= LOG_THRESHOLD_FOR_CONNLOST_WRITES {
                python::call_method(python::logger(py)?, pyo3::intern!(py, "warning"), ("SSL connection is closed",))?;
            }
            self.with_tls_state(py, |t| t.dropped_writes += 1);
            return Ok(());
        }
        let mut chunks: SmallVec<[(Chunk, usize); 4]> = SmallVec::with_capacity(items.len());
        for item in items {
            chunks.push(to_chunk(item)?);
        }
        let (over, ask) = self
            .state
            .with(py, |st| {
                let high = st.base.high_water;
                let Reader::Tls(t) = &mut st.reader else { return None };
                let was_empty = t.backlog.is_empty();
                // (An empty item is nothing to encrypt: in the backlog it
                // would stop the encryption of everything behind it.)
                for (chunk, len) in chunks.into_iter().filter(|(_, len)| *len > 0) {
                    t.backlog.push_back(chunk);
                    t.backlog_bytes += len;
                }
                Some((t.unsent(py) >= high, was_empty && t.state == TlsState::Wrapped))
            })
            .unwrap_or((false, false));
        if state == TlsState::Wrapped {
            if over || !self.shared().is_running(py) {
                // As asyncio, which encrypts and writes at once: now.
                let wrote = self.tls_do_write(py);
                if let Err(err) = wrote {
                    if is_fatal_base(py, &err) {
                        return Err(err);
                    }
                    return self.tls_fatal_error(py, err, "Fatal error on SSL protocol");
                }
            } else if ask {
                // Encrypted with the rest of the turn's writes before the poll
                // (and flow control looks at them then, as sslproto does once
                // it has encrypted them).
                self.ask_before_poll(py, false);
            }
        }
        Ok(())
    }

    /// sslproto's `_do_write`: the backlog encrypted, the ciphertext queued.
    pub(super) fn tls_do_write(&self, py: Python<'_>) -> PyResult<()> {
        let written = self.with_tls(py, |t| {
            if t.backlog.is_empty() {
                return Ok(false);
            }
            let hold = t.records_pass();
            let Some(session) = t.session.as_mut() else { return Ok(hold) };
            let bufs: SmallVec<[&[u8]; 8]> = t.backlog.iter().map(|c| c.remaining()).collect();
            let (taken, _stopped) = match session.write_vectored(py, &bufs) {
                Ok(r) => r,
                Err(err) if tls::is_again(py, &err) => (0, Write::WantRead),
                Err(err) => return Err(err),
            };
            drop(bufs);
            // Drop what was taken from the front of the backlog.
            let mut left = taken;
            t.backlog_bytes -= taken;
            while left > 0 {
                let front = t.backlog.front_mut().expect("taken from the backlog");
                let len = front.remaining().len();
                if left >= len {
                    left -= len;
                    t.backlog.pop_front();
                } else {
                    front.advance(left);
                    left = 0;
                }
            }
            Ok(hold)
        });
        match written {
            // (A failed write ends the connection, and its session.)
            Some(Err(err)) => return Err(err),
            Some(Ok(true)) => self.tls_hold_buffers(py),
            _ => {}
        }
        self.tls_process_outgoing(py)
    }

    /// Before the connection leaves WRAPPED (close(), the socket's EOF): the
    /// writes of this turn not yet encrypted are, as sslproto would have
    /// encrypted them in write(). What follows (close_notify) comes after.
    fn tls_write_backlog_now(&self, py: Python<'_>) -> PyResult<()> {
        if self.with_tls(py, |t| t.state == TlsState::Wrapped && !t.backlog.is_empty()) != Some(true) {
            return Ok(());
        }
        match self.tls_do_write(py) {
            Err(err) if !is_fatal_base(py, &err) => self.tls_fatal_error(py, err, "Fatal error on SSL protocol"),
            other => other,
        }
    }

    /// sslproto's `pause_writing()` (called by its socket transport; here,
    /// by tests through `transport._ssl_protocol`): the ciphertext stays in
    /// the session. False if it was paused already (sslproto asserts).
    pub(super) fn tls_pause_ssl_writing(&self, py: Python<'_>) -> bool {
        self.with_tls(py, |t| !std::mem::replace(&mut t.ssl_writing_paused, true)).unwrap_or(false)
    }

    /// sslproto's `resume_writing()`: what the session holds goes to the
    /// socket. False if it was not paused.
    pub(super) fn tls_resume_ssl_writing(&self, py: Python<'_>) -> PyResult<bool> {
        if self.with_tls(py, |t| std::mem::replace(&mut t.ssl_writing_paused, false)) != Some(true) {
            return Ok(false);
        }
        self.tls_process_outgoing(py)?;
        Ok(true)
    }

    /// sslproto's `_test__append_write_backlog(data)`: plaintext joins the
    /// backlog without being written (a later write or read sends it).
    pub(super) fn tls_append_write_backlog(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let (chunk, len) = to_chunk(data)?;
        self.with_tls(py, |t| {
            t.backlog.push_back(chunk);
            t.backlog_bytes += len;
        });
        Ok(())
    }

    /// When the socket has nothing queued or in flight, the kernel takes
    /// what it can of the ciphertext straight from the session's memory
    /// (no copy into the write queue: a third of tls_bulk's copying).
    fn tls_send_from_session(&self, py: Python<'_>) -> PyResult<Sent> {
        let io = &self.shared().stats.io;
        let sent = self.state.with(py, |st| {
            let Some(stream) = st.handle.as_ref() else { return Ok(Sent::Unknown) };
            if st.base.conn_lost != 0 || !st.writes.is_idle() {
                return Ok(Sent::Unknown);
            }
            let Reader::Tls(t) = &mut st.reader else { return Ok(Sent::Unknown) };
            if t.ssl_writing_paused {
                return Ok(Sent::Unknown);
            }
            let Some(session) = t.session.as_mut() else { return Ok(Sent::Unknown) };
            let Some((n, waiting)) = session.try_write_output(py, stream) else { return Ok(Sent::All) };
            st.base.stats.wrote(io, 1, n.max(0) as usize);
            if n == sys::uv_errno_t_UV_EAGAIN {
                return Ok(Sent::Unknown);
            }
            if n >= 0 {
                session.consume_sent(py, n as usize);
                return Ok(if n as usize == waiting { Sent::All } else { Sent::Unknown });
            }
            // As a failed socket write: what was to go is dropped.
            session.consume_sent(py, waiting);
            Err(n)
        });
        match sent {
            Err(code) => {
                self.fatal_error(py, uv_error(code), self.msg_write_error(py))?;
                Ok(Sent::Failed)
            }
            Ok(sent) => Ok(sent),
        }
    }

    /// sslproto's `_process_outgoing`: the session's ciphertext joins the
    /// socket's write queue (unless `_ssl_protocol.pause_writing()` holds
    /// it in the session).
    fn tls_process_outgoing(&self, py: Python<'_>) -> PyResult<()> {
        let mut out = Vec::new();
        let n = match self.tls_send_from_session(py)? {
            Sent::Failed => return Ok(()),
            Sent::All => 0,
            Sent::Unknown => self
                .with_tls(py, |t| if t.ssl_writing_paused { 0 } else { t.session().take_output(py, &mut out) })
                .unwrap_or(0),
        };
        if n > 0 {
            // A lost socket drops what it is given, as asyncio's socket
            // transport does (warning after a few).
            let warn = self.state.with(py, |st| {
                if st.base.conn_lost == 0 && st.handle.is_some() {
                    return None;
                }
                let warn = st.base.conn_lost >= LOG_THRESHOLD_FOR_CONNLOST_WRITES;
                st.base.conn_lost += 1;
                Some(warn)
            });
            match warn {
                None => self.enqueue_raw(py, Chunk::owned(out), n)?,
                Some(true) => {
                    python::call_method(
                        python::logger(py)?,
                        pyo3::intern!(py, "warning"),
                        ("socket.send() raised exception.",),
                    )?;
                }
                Some(false) => {}
            }
        }
        // All the ciphertext went to the socket, unless it is held in the
        // session: the application's buffer is the backlog.
        let size = self
            .with_tls_state(py, |t| if t.ssl_writing_paused { t.unsent(py) } else { t.backlog_bytes })
            .unwrap_or_else(|| self.buffer_size(py));
        self.tls_control_app_writing_at(py, size)
    }

    /// sslproto's `_control_app_writing`: the application's pause_writing
    /// at the high-water mark, or else its resume_writing at the low one,
    /// on what the application's write buffer holds (backlog and ciphertext
    /// held in the session; not the socket's queue). Called where sslproto
    /// calls it: after handing ciphertext to the socket, and when the
    /// limits change.
    pub(super) fn tls_control_app_writing(&self, py: Python<'_>) -> PyResult<()> {
        self.tls_control_app_writing_at(py, self.buffer_size(py))
    }

    /// `tls_control_app_writing` with the application's buffer `size`.
    fn tls_control_app_writing_at(&self, py: Python<'_>, size: usize) -> PyResult<()> {
        let call = self.state.with(py, |st| {
            let b = &mut st.base;
            if size >= b.high_water && !b.protocol_paused {
                b.protocol_paused = true;
                Some((true, b.protocol.as_ref().map(|p| p.clone_ref(py))))
            } else if size <= b.low_water && b.protocol_paused {
                b.protocol_paused = false;
                Some((false, b.protocol.as_ref().map(|p| p.clone_ref(py))))
            } else {
                None
            }
        });
        match call {
            None => Ok(()),
            Some((true, protocol)) => {
                self.tell_protocol(py, protocol, python::protocol::pause_writing(py), "protocol.pause_writing() failed")
            }
            Some((false, protocol)) => self.tell_protocol(
                py,
                protocol,
                python::protocol::resume_writing(py),
                "protocol.resume_writing() failed",
            ),
        }
    }

    /// The socket's queue grew (writer.rs): over SOCKET_HIGH_WATER the
    /// socket pauses SSLProtocol (asyncio's `_maybe_pause_protocol` on the
    /// socket transport): ciphertext stays in the session from now on.
    pub(super) fn tls_socket_queue_grew(&self, py: Python<'_>) {
        self.state.with(py, |st| {
            let queued = st.writes.size();
            if let Reader::Tls(t) = &mut st.reader {
                if queued > SOCKET_HIGH_WATER && !t.socket_paused {
                    t.socket_paused = true;
                    t.ssl_writing_paused = true;
                }
            }
        })
    }

    /// The socket's queue shrank (writer.rs): down to SOCKET_LOW_WATER the
    /// socket resumes SSLProtocol, whose `resume_writing` hands the session's
    /// ciphertext to the socket (and may resume the application).
    pub(super) fn tls_socket_queue_shrank(&self, py: Python<'_>) -> PyResult<()> {
        let resume = self.state.with(py, |st| {
            let queued = st.writes.size();
            match &mut st.reader {
                Reader::Tls(t) if t.socket_paused && queued <= SOCKET_LOW_WATER => {
                    t.socket_paused = false;
                    t.ssl_writing_paused = false;
                    true
                }
                _ => false,
            }
        });
        if resume {
            self.tls_process_outgoing(py)?;
        }
        Ok(())
    }

    /// `set_write_buffer_limits` (checked in Python): sslproto's new marks,
    /// then `_control_app_writing`.
    pub(super) fn tls_set_water_marks(&self, py: Python<'_>, high: usize, low: usize) -> PyResult<()> {
        // sslproto compares the marks with what its write() left: this
        // turn's writes encrypted, as there.
        self.tls_write_backlog_now(py)?;
        self.state.with(py, |st| {
            st.base.high_water = high;
            st.base.low_water = low;
        });
        self.tls_control_app_writing(py)
    }

    /// sslproto's `_control_ssl_reading`: the socket's reading pauses while
    /// too much ciphertext waits to be decrypted (the application paused).
    fn tls_control_reading(&self, py: Python<'_>) -> PyResult<()> {
        let change = self.with_tls(py, |t| {
            let size = t.session().incoming_len(py);
            if size >= t.read_high && !t.ssl_reading_paused {
                t.ssl_reading_paused = true;
                Some(true)
            } else if size <= t.read_low && t.ssl_reading_paused {
                t.ssl_reading_paused = false;
                Some(false)
            } else {
                None
            }
        });
        match change.flatten() {
            Some(true) => {
                self.socket_pause_reading(py);
                Ok(())
            }
            Some(false) => self.socket_resume_reading(py),
            None => Ok(()),
        }
    }

    /// The application's pause_reading(): decrypting stops.
    pub(super) fn tls_pause_reading(&self, py: Python<'_>) {
        self.with_tls_state(py, |t| t.app_reading_paused = true);
    }

    /// The application's resume_reading(): decrypting goes on, from the
    /// next turn (sslproto's `call_soon(resume)`).
    pub(super) fn tls_resume_reading(&self, py: Python<'_>) {
        if self.with_tls_state(py, |t| std::mem::replace(&mut t.app_reading_paused, false)) == Some(true) {
            self.ask_before_poll(py, true);
        }
    }

    pub(super) fn tls_is_reading(&self, py: Python<'_>) -> bool {
        self.with_tls_state(py, |t| !t.app_reading_paused).unwrap_or(false)
    }

    /// The work asked for before the poll: a resumed or pending read, and
    /// the turn's writes encrypted.
    pub(super) fn tls_before_poll(&self, py: Python<'_>) -> PyResult<()> {
        let next = self.with_tls(py, |t| {
            let read = std::mem::take(&mut t.read_due);
            let next = match (read, t.state) {
                (true, TlsState::Wrapped) => Next::Read,
                (true, TlsState::Flushing) => Next::Flush,
                (true, TlsState::Shutdown) => Next::Shutdown,
                _ => Next::Nothing,
            };
            (next, !t.backlog.is_empty() && t.state == TlsState::Wrapped)
        });
        let Some((next, write)) = next else { return Ok(()) };
        // Run from the loop's turn, outside any libuv callback of this core:
        // what reaches the application runs in its protocol's context.
        let _context = self.protocol_context(py);
        let result = self.tls_run(py, next).and_then(|()| if write { self.tls_do_write(py) } else { Ok(()) });
        match result {
            Err(err) if !is_fatal_base(py, &err) => self.tls_fatal_error(py, err, "Fatal error on SSL protocol"),
            other => other,
        }
    }

    /// Asks for `tls_before_poll` (with a read when `read`).
    fn ask_before_poll(&self, py: Python<'_>, read: bool) {
        let me = self.state.with(py, |st| {
            if let Reader::Tls(t) = &mut st.reader {
                t.read_due |= read;
            }
            st.object(py)
        });
        if let Some(me) = me {
            self.shared().before_poll(py, me, ClientPtr(self));
        }
    }

    /// sslproto's `_fatal_error`: the transport's `_fatal_error` (report,
    /// then the socket closes with `exc`). What the application wrote
    /// earlier in this turn is offered to the socket first: asyncio had
    /// encrypted and sent it in write(), before the error.
    fn tls_fatal_error(&self, py: Python<'_>, err: PyErr, message: &str) -> PyResult<()> {
        self.tls_offer_pending(py)?;
        self.fatal_error(py, err, message)
    }

    /// The turn's unencrypted writes encrypted (if the session still can)
    /// and the socket's queue offered to the kernel once, before a fatal
    /// error drops what is left (as `abort()` does for a plain socket).
    fn tls_offer_pending(&self, py: Python<'_>) -> PyResult<()> {
        let write = self.with_tls(py, |t| !t.backlog.is_empty() && t.state == TlsState::Wrapped);
        if write == Some(true) {
            match self.tls_do_write(py) {
                Err(err) if is_fatal_base(py, &err) => return Err(err),
                // The session failed too: the rest is dropped with the socket.
                _ => {}
            }
        }
        if self.state.with(py, |st| st.base.conn_lost == 0 && !st.writes.writing() && st.writes.has_queued()) {
            self.flush(py)?;
        }
        Ok(())
    }

    /// The application's close(): the TLS shutdown (a second close() is a
    /// no-op).
    pub(super) fn tls_close(&self, py: Python<'_>) -> PyResult<()> {
        if self.with_tls_state(py, |t| std::mem::replace(&mut t.app_closed, true)) != Some(false) {
            return Ok(());
        }
        // The transport is closed whatever the state (asyncio's close() sets
        // `_closed` itself): also after the peer's EOF left it flushing.
        self.tls_start_shutdown(py)
    }

    /// The application's transport is closed (closed or aborted, its peer
    /// began the shutdown, or the connection is over): sslproto's
    /// `_SSLProtocolTransport._closed`. True for a plain transport.
    pub(super) fn tls_app_closed(&self, py: Python<'_>) -> bool {
        self.with_tls_state(py, |t| t.app_closed).unwrap_or(true)
    }

    /// The application's abort().
    pub(super) fn tls_app_abort(&self, py: Python<'_>) -> PyResult<()> {
        // sslproto encrypted this turn's writes in write() and its socket
        // transport offered them to the kernel, which abort() leaves sent.
        self.tls_write_backlog_now(py)?;
        self.with_tls_state(py, |t| t.app_closed = true);
        self.tls_abort(py)
    }

    pub(super) fn tls_write_eof(&self) -> PyErr {
        PyNotImplementedError::new_err(())
    }

    /// The socket's connection_lost ran: sslproto's `connection_lost`.
    /// Returns whether the application's connection_lost is due.
    pub(super) fn tls_connection_lost(&self, py: Python<'_>) -> bool {
        let dropped = self.with_tls(py, |t| {
            let due = t.state != TlsState::Handshake && matches!(t.app, AppState::Made | AppState::Eof);
            if due {
                t.app = AppState::Lost;
            }
            t.state = TlsState::Unwrapped;
            t.app_closed = true;
            t.backlog_bytes = 0;
            // sslproto's connection_lost counts towards the warning about
            // writes to a closed connection.
            t.dropped_writes += 1;
            // sslproto's `self._outgoing.read()`.
            let n = t.session().output_len(py);
            t.session().consume_output(py, n);
            (due, std::mem::take(&mut t.backlog))
        });
        match dropped {
            Some((due, backlog)) => {
                drop(backlog);
                due
            }
            None => false,
        }
    }

    /// The handshake timeout fired: true if the handshake is still going.
    pub(super) fn tls_handshaking(&self, py: Python<'_>) -> bool {
        self.with_tls(py, |t| t.state == TlsState::Handshake).unwrap_or(false)
    }

    /// The shutdown timeout fired: true if the shutdown is still going.
    pub(super) fn tls_shutting_down(&self, py: Python<'_>) -> bool {
        self.with_tls(py, |t| matches!(t.state, TlsState::Flushing | TlsState::Shutdown)).unwrap_or(false)
    }

    pub(super) fn tls_state_name(&self, py: Python<'_>) -> Option<&'static str> {
        self.with_tls_state(py, |t| match t.state {
            TlsState::Handshake => "DO_HANDSHAKE",
            TlsState::Wrapped => "WRAPPED",
            TlsState::Flushing => "FLUSHING",
            TlsState::Shutdown => "SHUTDOWN",
            TlsState::Unwrapped => "UNWRAPPED",
        })
    }

    /// asyncio's read buffer limits of a TLS transport (checked in Python).
    pub(super) fn tls_set_read_limits(&self, py: Python<'_>, high: usize, low: usize) -> PyResult<()> {
        self.with_tls_state(py, |t| {
            t.read_high = high;
            t.read_low = low;
        });
        self.tls_control_reading(py)
    }

    pub(super) fn tls_read_limits(&self, py: Python<'_>) -> (usize, usize) {
        self.with_tls_state(py, |t| (t.read_low, t.read_high)).unwrap_or((0, 0))
    }

    /// Ciphertext received and not yet decrypted.
    pub(super) fn tls_read_buffer_size(&self, py: Python<'_>) -> usize {
        self.with_tls(py, |t| t.session().incoming_len(py)).unwrap_or(0)
    }

    /// The application protocol changes (set_protocol, sendfile's fallback).
    pub(super) fn tls_set_app_buffered(&self, py: Python<'_>, buffered: bool) {
        self.with_tls_state(py, |t| t.app_buffered = buffered);
    }
}
