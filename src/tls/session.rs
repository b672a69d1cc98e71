//! `TlsSession`: one TLS connection driven natively through the `SSL *` of
//! a stdlib `ssl.SSLObject`.
//!
//! The session owns references to the SSLObject, its `_ssl._SSLSocket` and
//! the two MemoryBIOs (these three in its `ossl::Conn`), so the OpenSSL
//! objects they own outlive the pointers the `Conn` keeps. All methods take `Python<'_>`: the GIL is held for
//! every OpenSSL call, and callbacks that `_ssl` installed (SNI, keylog,
//! msg_callback) run inside those calls and take it again with
//! `PyGILState_Ensure`, which nests on the thread that holds it (the keylog
//! callback even releases it around its file write and takes it back before
//! returning).
//!
//! Ciphertext moves through the MemoryBIOs, as with the stdlib: `feed`
//! writes what the socket received into the incoming BIO; handshake, read,
//! write and shutdown may all leave ciphertext in the outgoing BIO (a
//! read can answer a renegotiation, a key update or a post-handshake
//! authentication request), which `output_ptr` / `consume_output` (no copy) or
//! `take_output` hand to the socket.

use std::ffi::c_int;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::uv::transport::{StreamOwner, UvStream};

use super::errors::{self, Failure, Op};
use super::layout;
use super::ossl::{self, Conn, Plaintext};
use super::verdict;

/// The most plaintext one TLS record carries: the unit of write coalescing.
pub(crate) const MAX_RECORD: usize = 16 * 1024;

/// What `open` gives: a session, or why the connection must be left to
/// asyncio's sslproto.
pub(crate) enum Opened {
    Native(TlsSession),
    NotNative(String),
}

/// `handshake()`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Handshake {
    Done,
    /// More ciphertext from the peer is needed (send the output first).
    WantRead,
}

/// `read_into()`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decrypted {
    Data(usize),
    WantRead,
    /// The peer's close_notify arrived. The stdlib's read returns b"" here
    /// while our own close_notify is unsent, and raises SSLZeroReturnError
    /// once it is sent (sslproto never reads then).
    Closed,
}

/// `write()` / `write_vectored()`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Write {
    /// Bytes of plaintext taken (all of them: partial writes are not
    /// enabled, as `_ssl` leaves them).
    Written(usize),
    /// The handshake is not done and needs the peer: nothing of this call
    /// was taken; call again with the same bytes later.
    WantRead,
}

/// `shutdown()`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Shutdown {
    /// Our close_notify is in the output; the peer's has not arrived.
    Sent,
    /// Both close_notify alerts have passed.
    Complete,
}

pub(crate) struct TlsSession {
    /// The `_SSLSocket`'s `SSL *` and the MemoryBIOs' `BIO *`s, with the
    /// objects that own them.
    conn: Conn,
    bio_seek: bool,
    sslobj: Py<PyAny>,
    /// Small writes gathered into records (kept at MAX_RECORD capacity).
    scratch: Vec<u8>,
}

/// errno right now.
#[inline]
fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

impl TlsSession {
    /// Drives `sslobj` (made by `context.wrap_bio(incoming, outgoing, ...)`)
    /// natively, or says why it cannot be (the caller then uses asyncio's
    /// sslproto): another OpenSSL than `_ssl`'s, an interpreter or type
    /// whose layout is not verified, an SSLObject subclass overriding what
    /// the engine replaces, BIOs that are not the SSLObject's.
    pub(crate) fn open(
        py: Python<'_>,
        sslobj: &Bound<'_, PyAny>,
        incoming: &Bound<'_, PyAny>,
        outgoing: &Bound<'_, PyAny>,
    ) -> PyResult<Opened> {
        let verdict = verdict::verdict(py);
        let Some(fns) = verdict.fns.as_ref() else {
            return Ok(Opened::NotNative(verdict.reason.clone()));
        };
        let sslsock = match sslobj.getattr("_sslobj") {
            Ok(s) => s,
            Err(_) => return Ok(Opened::NotNative("the SSLObject has no _sslobj".into())),
        };
        let conn = match layout::open(py, fns, sslobj, &sslsock, incoming, outgoing)? {
            Ok(c) => c,
            Err(why) => return Ok(Opened::NotNative(why)),
        };
        Ok(Opened::Native(TlsSession {
            conn,
            bio_seek: verdict.bio_seek,
            sslobj: sslobj.clone().unbind(),
            scratch: Vec::new(),
        }))
    }

    pub(crate) fn sslobj(&self) -> &Py<PyAny> {
        &self.sslobj
    }

    /// The stdlib objects, for the cyclic GC.
    pub(crate) fn objects(&self) -> [&Py<PyAny>; 4] {
        let [sslsock, incoming, outgoing] = self.conn.objects();
        [&self.sslobj, sslsock, incoming, outgoing]
    }

    /// Clears errors other code left in this thread's OpenSSL queue:
    /// SSL_get_error reads any queued error as the call's.
    #[inline]
    fn clear_stale_errors(&self) {
        let fns = self.conn.fns();
        if fns.err_peek_error() != 0 {
            fns.err_clear_error();
        }
    }

    /// The failure of the call that just returned `ret` (errno first, as
    /// `_ssl`'s `_PySSL_errno` takes it).
    #[inline]
    fn failure_of(&self, py: Python<'_>, op: Op, ret: c_int) -> Failure {
        let errno = errno();
        let ssl_error = self.conn.get_error(py, ret);
        Failure { op, ret, ssl_error, errno }
    }

    fn raise(&self, py: Python<'_>, f: Failure) -> PyErr {
        errors::failure(py, &self.conn, f)
    }

    /// After a successful call: `_ssl` raises an exception a callback
    /// parked during it.
    fn parked(&self, py: Python<'_>) -> PyResult<()> {
        match self.conn.take_parked(py) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// After a WANT_READ: `_ssl` raises SSLWantReadError with the parked
    /// exception as its context, and asyncio's sslproto swallows both.
    fn drop_parked(&self, py: Python<'_>) {
        drop(self.conn.take_parked(py));
    }

    /// Ciphertext from the socket into the incoming BIO
    /// (`MemoryBIO.write`).
    pub(crate) fn feed(&mut self, py: Python<'_>, data: &[u8]) -> PyResult<()> {
        if self.conn.incoming_eof_written(py) {
            return Err(errors::plain_ssl_error(py, "cannot write() after write_eof()"));
        }
        for chunk in data.chunks(c_int::MAX as usize) {
            let n = self.conn.feed(py, chunk);
            if n < 0 || n as usize != chunk.len() {
                // A memory BIO only fails to grow when out of memory.
                return Err(pyo3::exceptions::PyMemoryError::new_err("failed to grow the incoming BIO"));
            }
        }
        Ok(())
    }

    /// The peer closed its end (`MemoryBIO.write_eof()`: the stdlib's own
    /// method, once per connection).
    pub(crate) fn feed_eof(&mut self, py: Python<'_>) -> PyResult<()> {
        self.conn.incoming().bind(py).call_method0("write_eof").map(drop)
    }

    /// `SSL_do_handshake` (also what sends a TLS 1.3 post-handshake
    /// CertificateRequest after `sslobj.verify_client_post_handshake()`).
    pub(crate) fn handshake(&mut self, py: Python<'_>) -> PyResult<Handshake> {
        self.clear_stale_errors();
        // Callbacks take the GIL we hold (nested).
        let ret = self.conn.do_handshake(py);
        if ret == 1 {
            self.parked(py)?;
            return Ok(Handshake::Done);
        }
        let f = self.failure_of(py, Op::Handshake, ret);
        if f.ssl_error == ossl::SSL_ERROR_WANT_READ {
            self.drop_parked(py);
            return Ok(Handshake::WantRead);
        }
        Err(self.raise(py, f))
    }

    /// Whether the handshake has completed.
    pub(crate) fn is_handshake_done(&self, py: Python<'_>) -> bool {
        self.conn.is_init_finished(py)
    }

    /// Decrypts into `buf` (the loop's read buffer, or a BufferedProtocol's
    /// `get_buffer()` memory) with one `SSL_read_ex`.
    pub(crate) fn read_into<'b>(&mut self, py: Python<'_>, buf: impl Into<Plaintext<'b>>) -> PyResult<Decrypted> {
        let buf = buf.into();
        if buf.is_empty() {
            return Ok(Decrypted::Data(0));
        }
        self.clear_stale_errors();
        let (ret, n) = self.conn.read(py, buf);
        if ret == 1 {
            self.parked(py)?;
            return Ok(Decrypted::Data(n));
        }
        let f = self.failure_of(py, Op::Read, 0);
        match f.ssl_error {
            ossl::SSL_ERROR_WANT_READ => {
                self.drop_parked(py);
                Ok(Decrypted::WantRead)
            }
            // The stdlib's read returns b"" here, leaving parked exceptions
            // for the next call.
            ossl::SSL_ERROR_ZERO_RETURN => Ok(Decrypted::Closed),
            _ => Err(self.raise(py, f)),
        }
    }

    /// Plaintext already decrypted and not yet read (`SSL_pending`).
    pub(crate) fn pending(&self, py: Python<'_>) -> usize {
        self.conn.pending(py).max(0) as usize
    }

    /// Ciphertext fed and not yet processed.
    pub(crate) fn incoming_len(&self, py: Python<'_>) -> usize {
        self.conn.incoming_pending(py)
    }

    /// Whether a `read_into` may yield more without new input.
    pub(crate) fn has_pending(&self, py: Python<'_>) -> bool {
        self.pending(py) > 0 || self.incoming_len(py) > 0
    }

    /// Encrypts `data` with one `SSL_write_ex` (records of up to 16 KiB).
    pub(crate) fn write(&mut self, py: Python<'_>, data: &[u8]) -> PyResult<Write> {
        self.clear_stale_errors();
        self.write_raw(py, data)
    }

    fn write_raw(&mut self, py: Python<'_>, data: &[u8]) -> PyResult<Write> {
        let (ret, n) = self.conn.write(py, data);
        if ret == 1 {
            self.parked(py)?;
            return Ok(Write::Written(n));
        }
        let f = self.failure_of(py, Op::Write, 0);
        if f.ssl_error == ossl::SSL_ERROR_WANT_READ {
            self.drop_parked(py);
            return Ok(Write::WantRead);
        }
        Err(self.raise(py, f))
    }

    /// Encrypts many application buffers as few records as possible:
    /// buffers are gathered into full 16 KiB records; a buffer of at least
    /// a record, or the last one, met with nothing gathered is encrypted in
    /// place. Returns
    /// the bytes taken (all, unless a WantRead stopped it: nothing of the
    /// record being written was taken then) and whether it stopped so.
    pub(crate) fn write_vectored(&mut self, py: Python<'_>, bufs: &[&[u8]]) -> PyResult<(usize, Write)> {
        self.clear_stale_errors();
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        let result = self.write_gathered(py, bufs, &mut scratch);
        scratch.clear();
        self.scratch = scratch;
        result
    }

    fn write_gathered(&mut self, py: Python<'_>, bufs: &[&[u8]], scratch: &mut Vec<u8>) -> PyResult<(usize, Write)> {
        let mut taken = 0usize;
        for (i, buf) in bufs.iter().enumerate() {
            let mut rest: &[u8] = buf;
            // (The last buffer, with nothing gathered before it, has nothing
            // to be gathered with: written from where it is, uncopied.)
            let last = i + 1 == bufs.len();
            while !rest.is_empty() {
                if scratch.is_empty() && (last || rest.len() >= MAX_RECORD) {
                    match self.write_raw(py, rest)? {
                        Write::Written(n) => {
                            taken += n;
                            rest = &rest[n..];
                        }
                        Write::WantRead => return Ok((taken, Write::WantRead)),
                    }
                    continue;
                }
                if scratch.capacity() < MAX_RECORD {
                    scratch.reserve_exact(MAX_RECORD - scratch.len());
                }
                let room = MAX_RECORD - scratch.len();
                let k = room.min(rest.len());
                scratch.extend_from_slice(&rest[..k]);
                rest = &rest[k..];
                if scratch.len() == MAX_RECORD {
                    match self.write_raw(py, scratch)? {
                        Write::Written(n) => taken += n,
                        Write::WantRead => return Ok((taken, Write::WantRead)),
                    }
                    scratch.clear();
                }
            }
        }
        if !scratch.is_empty() {
            match self.write_raw(py, scratch)? {
                Write::Written(n) => taken += n,
                Write::WantRead => return Ok((taken, Write::WantRead)),
            }
        }
        Ok((taken, Write::Written(taken)))
    }

    /// Ciphertext waiting in the outgoing BIO.
    pub(crate) fn output_len(&self, py: Python<'_>) -> usize {
        self.conn.output_pending(py)
    }

    /// One try-write of the waiting ciphertext to `stream`, in place (see
    /// `Conn::try_write_output`): None when there is none, else the bytes
    /// the socket took or libuv's error, and the bytes that were waiting.
    /// Then `consume_sent` what it took.
    #[inline]
    pub(crate) fn try_write_output<C: StreamOwner>(
        &self,
        py: Python<'_>,
        stream: &UvStream<C>,
    ) -> Option<(i32, usize)> {
        self.conn.try_write_output(py, stream)
    }

    /// A copy of the waiting ciphertext, left in place.
    pub(crate) fn output_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        self.conn.output_bytes(py)
    }

    /// The waiting ciphertext fed to `peer`'s input with no copy in
    /// between, left in place here (then `consume_output`); its size.
    pub(crate) fn output_to(&self, py: Python<'_>, peer: &mut TlsSession) -> PyResult<usize> {
        if peer.conn.incoming_eof_written(py) {
            return Err(errors::plain_ssl_error(py, "cannot write() after write_eof()"));
        }
        let (n, len) = self.conn.output_into(py, &peer.conn);
        if n < 0 || n as usize != len {
            return Err(pyo3::exceptions::PyMemoryError::new_err("failed to grow the incoming BIO"));
        }
        Ok(len)
    }

    /// Drops the first `n` bytes of the output (what the socket took).
    pub(crate) fn consume_output(&mut self, py: Python<'_>, n: usize) {
        self.conn.consume_output(py, n, self.bio_seek);
    }

    /// Drops the `n` bytes `try_write_output` says the socket took (at
    /// most what was waiting: no look at the output's size first).
    pub(crate) fn consume_sent(&mut self, py: Python<'_>, n: usize) {
        self.conn.drop_output(py, n, self.bio_seek);
    }

    /// Appends the waiting ciphertext to `out` (one copy); returns its size.
    pub(crate) fn take_output(&mut self, py: Python<'_>, out: &mut Vec<u8>) -> usize {
        self.conn.read_output(py, out)
    }

    /// The record buffers stay allocated between records (see
    /// `release_buffers` for giving them back when the connection idles).
    pub(crate) fn keep_buffers(&mut self, py: Python<'_>) {
        self.conn.keep_record_buffers(py);
    }

    /// Gives the record buffers back, if nothing is pending in them or in
    /// the incoming BIO; whether they went.
    pub(crate) fn release_buffers(&mut self, py: Python<'_>) -> bool {
        if self.has_pending(py) {
            return false;
        }
        self.conn.free_record_buffers(py)
    }

    /// `SSL_shutdown` as the stdlib's `unwrap()` calls it: close_notify out,
    /// then (the second call) a look for the peer's in the input.
    pub(crate) fn shutdown(&mut self, py: Python<'_>) -> PyResult<Shutdown> {
        self.clear_stale_errors();
        let mut zeros = 0;
        loop {
            let ret = self.conn.shutdown(py);
            if ret > 0 {
                self.parked(py)?;
                return Ok(Shutdown::Complete);
            }
            if ret == 0 {
                zeros += 1;
                if zeros > 1 {
                    // `_ssl` gives up after two zeros and unwrap() returns.
                    self.parked(py)?;
                    return Ok(Shutdown::Complete);
                }
                continue;
            }
            let f = self.failure_of(py, Op::Shutdown, ret);
            if f.ssl_error == ossl::SSL_ERROR_WANT_READ {
                self.drop_parked(py);
                return Ok(Shutdown::Sent);
            }
            return Err(self.raise(py, f));
        }
    }

    /// `SSL_get_shutdown`: which close_notify alerts have passed.
    pub(crate) fn shutdown_state(&self, py: Python<'_>) -> (bool, bool) {
        let s = self.conn.get_shutdown(py);
        (s & ossl::SSL_SENT_SHUTDOWN != 0, s & ossl::SSL_RECEIVED_SHUTDOWN != 0)
    }

    /// Test hooks: a TLS 1.2 renegotiation / a TLS 1.3 key update request
    /// from this side (the stdlib cannot start either).
    pub(crate) fn start_renegotiation(&mut self, py: Python<'_>) -> PyResult<Handshake> {
        self.clear_stale_errors();
        if self.conn.renegotiate(py) != 1 {
            let f = self.failure_of(py, Op::Handshake, 0);
            return Err(self.raise(py, Failure { ssl_error: ossl::SSL_ERROR_SSL, ..f }));
        }
        self.handshake(py)
    }

    pub(crate) fn request_key_update(&mut self, py: Python<'_>) -> PyResult<()> {
        self.clear_stale_errors();
        // 1 = SSL_KEY_UPDATE_REQUESTED.
        if self.conn.key_update(py, 1) != 1 {
            let f = self.failure_of(py, Op::Handshake, 0);
            return Err(self.raise(py, Failure { ssl_error: ossl::SSL_ERROR_SSL, ..f }));
        }
        Ok(())
    }
}
