//! `TlsSession`: one TLS connection driven natively through the `SSL *` of
//! a stdlib `ssl.SSLObject`.
//!
//! The session owns references to the SSLObject, its `_ssl._SSLSocket` and
//! the two MemoryBIOs, so the OpenSSL objects they own outlive every raw
//! pointer kept here. All methods take `Python<'_>`: the GIL is held for
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
//! authentication request), which `output` / `consume_output` (no copy) or
//! `take_output` hand to the socket.

use std::ffi::{c_int, c_long, c_void};
use std::ptr::NonNull;

use pyo3::prelude::*;

use super::errors::{self, Failure, Op};
use super::layout::{self, PySSLMemoryBIO, PySSLSocket};
use super::ossl::{self, Fns, BIO, SSL};
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
    fns: &'static Fns,
    ssl: NonNull<SSL>,
    rbio: NonNull<BIO>,
    wbio: NonNull<BIO>,
    bio_seek: bool,
    sslobj: Py<PyAny>,
    sslsock: Py<PyAny>,
    incoming: Py<PyAny>,
    outgoing: Py<PyAny>,
    /// Small writes gathered into records (kept at MAX_RECORD capacity).
    scratch: Vec<u8>,
}

// SAFETY: the raw pointers are only dereferenced with the GIL held (every
// method takes `Python<'_>`), and the objects they point into are kept
// alive by the `Py` references beside them.
unsafe impl Send for TlsSession {}
// SAFETY: as for Send: shared use is serialised by the GIL.
unsafe impl Sync for TlsSession {}

/// errno right now.
fn errno() -> c_int {
    // SAFETY: errno is thread-local.
    unsafe { *libc::__errno_location() }
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
        let p = match layout::read_pointers(py, fns, sslobj, &sslsock, incoming, outgoing)? {
            Ok(p) => p,
            Err(why) => return Ok(Opened::NotNative(why)),
        };
        // SAFETY: the verified live SSL; SSL_get_mode is SSL_ctrl(MODE, 0).
        let mode = unsafe { (fns.SSL_ctrl)(p.ssl, ossl::SSL_CTRL_MODE, 0, std::ptr::null_mut()) };
        if mode & ossl::SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER == 0 {
            return Ok(Opened::NotNative("the SSL does not accept moving write buffers".into()));
        }
        let _ = ossl::SSL_MODE_ENABLE_PARTIAL_WRITE; // handled either way: write() reports what it took
        Ok(Opened::Native(TlsSession {
            fns,
            // Non-null: checked by read_pointers.
            ssl: NonNull::new(p.ssl).expect("checked"),
            rbio: NonNull::new(p.rbio).expect("checked"),
            wbio: NonNull::new(p.wbio).expect("checked"),
            bio_seek: verdict.bio_seek,
            sslobj: sslobj.clone().unbind(),
            sslsock: sslsock.unbind(),
            incoming: incoming.clone().unbind(),
            outgoing: outgoing.clone().unbind(),
            scratch: Vec::new(),
        }))
    }

    pub(crate) fn sslobj(&self) -> &Py<PyAny> {
        &self.sslobj
    }

    /// The stdlib objects, for the cyclic GC.
    pub(crate) fn objects(&self) -> [&Py<PyAny>; 4] {
        [&self.sslobj, &self.sslsock, &self.incoming, &self.outgoing]
    }

    fn sock_struct(&self) -> *mut PySSLSocket {
        self.sslsock.as_ptr() as *mut PySSLSocket
    }

    /// Clears errors other code left in this thread's OpenSSL queue:
    /// SSL_get_error reads any queued error as the call's.
    #[inline]
    fn clear_stale_errors(&self) {
        // SAFETY: thread-local queue accessors.
        unsafe {
            if (self.fns.ERR_peek_error)() != 0 {
                (self.fns.ERR_clear_error)();
            }
        }
    }

    /// The failure of the call that just returned `ret` (errno first, as
    /// `_ssl`'s `_PySSL_errno` takes it).
    #[inline]
    fn failure_of(&self, op: Op, ret: c_int) -> Failure {
        let errno = errno();
        // SAFETY: the live SSL (see the struct's invariant).
        let ssl_error = unsafe { (self.fns.SSL_get_error)(self.ssl.as_ptr(), ret) };
        Failure { op, ret, ssl_error, errno }
    }

    fn raise(&self, py: Python<'_>, f: Failure) -> PyErr {
        // SAFETY: the verified live pointers of this connection; GIL held.
        unsafe { errors::failure(py, self.fns, self.ssl.as_ptr(), self.sock_struct(), self.sslsock.bind(py), f) }
    }

    /// After a successful call: `_ssl` raises an exception a callback
    /// parked during it.
    fn parked(&self, py: Python<'_>) -> PyResult<()> {
        // SAFETY: verified layout; GIL held.
        match unsafe { errors::take_parked(py, self.sock_struct()) } {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// After a WANT_READ: `_ssl` raises SSLWantReadError with the parked
    /// exception as its context, and asyncio's sslproto swallows both.
    fn drop_parked(&self, py: Python<'_>) {
        // SAFETY: as `parked`.
        drop(unsafe { errors::take_parked(py, self.sock_struct()) });
    }

    /// Ciphertext from the socket into the incoming BIO
    /// (`MemoryBIO.write`).
    pub(crate) fn feed(&mut self, py: Python<'_>, data: &[u8]) -> PyResult<()> {
        // SAFETY: the incoming MemoryBIO's verified layout; read only.
        if unsafe { (*(self.incoming.as_ptr() as *const PySSLMemoryBIO)).eof_written } != 0 {
            return Err(errors::plain_ssl_error(py, "cannot write() after write_eof()"));
        }
        for chunk in data.chunks(c_int::MAX as usize) {
            // SAFETY: the live read BIO; a memory BIO copies the bytes.
            let n = unsafe {
                (self.fns.BIO_write)(self.rbio.as_ptr(), chunk.as_ptr() as *const c_void, chunk.len() as c_int)
            };
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
        self.incoming.bind(py).call_method0("write_eof").map(drop)
    }

    /// `SSL_do_handshake` (also what sends a TLS 1.3 post-handshake
    /// CertificateRequest after `sslobj.verify_client_post_handshake()`).
    pub(crate) fn handshake(&mut self, py: Python<'_>) -> PyResult<Handshake> {
        self.clear_stale_errors();
        // SAFETY: the live SSL; callbacks take the GIL we hold (nested).
        let ret = unsafe { (self.fns.SSL_do_handshake)(self.ssl.as_ptr()) };
        if ret == 1 {
            self.parked(py)?;
            return Ok(Handshake::Done);
        }
        let f = self.failure_of(Op::Handshake, ret);
        if f.ssl_error == ossl::SSL_ERROR_WANT_READ {
            self.drop_parked(py);
            return Ok(Handshake::WantRead);
        }
        Err(self.raise(py, f))
    }

    /// Whether the handshake has completed.
    pub(crate) fn is_handshake_done(&self, _py: Python<'_>) -> bool {
        // SAFETY: the live SSL; a read-only accessor.
        unsafe { (self.fns.SSL_is_init_finished)(self.ssl.as_ptr()) == 1 }
    }

    /// Decrypts into `buf` (the loop's read buffer, or a BufferedProtocol's
    /// `get_buffer()` memory) with one `SSL_read_ex`.
    pub(crate) fn read_into(&mut self, py: Python<'_>, buf: &mut [u8]) -> PyResult<Decrypted> {
        if buf.is_empty() {
            return Ok(Decrypted::Data(0));
        }
        self.clear_stale_errors();
        let mut n = 0usize;
        // SAFETY: the live SSL; `buf` is writable for its length.
        let ret =
            unsafe { (self.fns.SSL_read_ex)(self.ssl.as_ptr(), buf.as_mut_ptr() as *mut c_void, buf.len(), &mut n) };
        if ret == 1 {
            self.parked(py)?;
            return Ok(Decrypted::Data(n));
        }
        let f = self.failure_of(Op::Read, 0);
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
    pub(crate) fn pending(&self, _py: Python<'_>) -> usize {
        // SAFETY: the live SSL; read-only.
        unsafe { (self.fns.SSL_pending)(self.ssl.as_ptr()) }.max(0) as usize
    }

    /// Ciphertext fed and not yet processed.
    pub(crate) fn incoming_len(&self, _py: Python<'_>) -> usize {
        // SAFETY: the live read BIO; read-only.
        unsafe { (self.fns.BIO_ctrl)(self.rbio.as_ptr(), ossl::BIO_CTRL_PENDING, 0, std::ptr::null_mut()) }.max(0)
            as usize
    }

    /// Whether a `read_into` may yield more without new input.
    pub(crate) fn has_pending(&self, py: Python<'_>) -> bool {
        self.pending(py) > 0 || self.incoming_len(py) > 0
    }

    /// Encrypts `data` with one `SSL_write_ex` (records of up to 16 KiB).
    pub(crate) fn write(&mut self, py: Python<'_>, data: &[u8]) -> PyResult<Write> {
        self.clear_stale_errors();
        self.write_raw(py, data.as_ptr(), data.len())
    }

    fn write_raw(&mut self, py: Python<'_>, ptr: *const u8, len: usize) -> PyResult<Write> {
        let mut n = 0usize;
        // SAFETY: the live SSL; `ptr` is readable for `len` bytes (the
        // SSL accepts a moving buffer on a retry, checked in `open`).
        let ret = unsafe { (self.fns.SSL_write_ex)(self.ssl.as_ptr(), ptr as *const c_void, len, &mut n) };
        if ret == 1 {
            self.parked(py)?;
            return Ok(Write::Written(n));
        }
        let f = self.failure_of(Op::Write, 0);
        if f.ssl_error == ossl::SSL_ERROR_WANT_READ {
            self.drop_parked(py);
            return Ok(Write::WantRead);
        }
        Err(self.raise(py, f))
    }

    /// Encrypts many application buffers as few records as possible:
    /// buffers are gathered into full 16 KiB records; a buffer of at least
    /// a record met with nothing gathered is encrypted in place. Returns
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
        for buf in bufs {
            let mut rest: &[u8] = buf;
            while !rest.is_empty() {
                if scratch.is_empty() && rest.len() >= MAX_RECORD {
                    match self.write_raw(py, rest.as_ptr(), rest.len())? {
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
                    match self.write_raw(py, scratch.as_ptr(), scratch.len())? {
                        Write::Written(n) => taken += n,
                        Write::WantRead => return Ok((taken, Write::WantRead)),
                    }
                    scratch.clear();
                }
            }
        }
        if !scratch.is_empty() {
            match self.write_raw(py, scratch.as_ptr(), scratch.len())? {
                Write::Written(n) => taken += n,
                Write::WantRead => return Ok((taken, Write::WantRead)),
            }
        }
        Ok((taken, Write::Written(taken)))
    }

    /// Ciphertext waiting in the outgoing BIO.
    pub(crate) fn output_len(&self, _py: Python<'_>) -> usize {
        // SAFETY: the live write BIO; read-only.
        unsafe { (self.fns.BIO_ctrl)(self.wbio.as_ptr(), ossl::BIO_CTRL_PENDING, 0, std::ptr::null_mut()) }.max(0)
            as usize
    }

    /// The ciphertext waiting, in place (valid until the next call on the
    /// session: any of them may append to, or move, the BIO's memory; no
    /// Python code may run while it is held, since `sslobj` / `outgoing`
    /// methods could do the same). Hand it to the socket, then
    /// `consume_output` what the socket took.
    pub(crate) fn output<'a>(&'a self, _py: Python<'a>) -> &'a [u8] {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: BIO_get_mem_data: a pointer to the unread bytes of the
        // live write BIO and their count, stable while nothing writes it.
        unsafe {
            let n = (self.fns.BIO_ctrl)(self.wbio.as_ptr(), ossl::BIO_CTRL_INFO, 0, &mut p as *mut _ as *mut c_void);
            if p.is_null() || n <= 0 {
                return &[];
            }
            std::slice::from_raw_parts(p as *const u8, n as usize)
        }
    }

    /// Drops the first `n` bytes of the output (what the socket took).
    pub(crate) fn consume_output(&mut self, _py: Python<'_>, n: usize) {
        let wbio = self.wbio.as_ptr();
        let n = n.min(self.output_len(_py));
        if n == 0 {
            return;
        }
        // SAFETY: the live write BIO. Seeking moves its read pointer
        // (probed at start-up); otherwise the bytes are read out.
        unsafe {
            if self.bio_seek {
                let tell = (self.fns.BIO_ctrl)(wbio, ossl::BIO_C_FILE_TELL, 0, std::ptr::null_mut());
                if tell >= 0
                    && (self.fns.BIO_ctrl)(wbio, ossl::BIO_C_FILE_SEEK, tell + n as c_long, std::ptr::null_mut()) >= 0
                {
                    return;
                }
            }
            let mut sink = [0u8; 4096];
            let mut left = n;
            while left > 0 {
                let k = left.min(sink.len());
                let got = (self.fns.BIO_read)(wbio, sink.as_mut_ptr() as *mut c_void, k as c_int);
                if got <= 0 {
                    break;
                }
                left -= got as usize;
            }
        }
    }

    /// Appends the waiting ciphertext to `out` (one copy); returns its size.
    pub(crate) fn take_output(&mut self, py: Python<'_>, out: &mut Vec<u8>) -> usize {
        let n = self.output_len(py);
        if n == 0 {
            return 0;
        }
        out.reserve(n);
        let spare = out.spare_capacity_mut();
        let want = n.min(c_int::MAX as usize);
        // SAFETY: the live write BIO copies at most `want` bytes into the
        // reserved spare capacity, and says how many.
        let got = unsafe { (self.fns.BIO_read)(self.wbio.as_ptr(), spare.as_mut_ptr() as *mut c_void, want as c_int) };
        if got <= 0 {
            return 0;
        }
        // SAFETY: `got` bytes were initialised just above.
        unsafe { out.set_len(out.len() + got as usize) };
        got as usize
    }

    /// `SSL_shutdown` as the stdlib's `unwrap()` calls it: close_notify out,
    /// then (the second call) a look for the peer's in the input.
    pub(crate) fn shutdown(&mut self, py: Python<'_>) -> PyResult<Shutdown> {
        self.clear_stale_errors();
        let ssl = self.ssl.as_ptr();
        let mut zeros = 0;
        loop {
            // SAFETY: the live SSL. (`_ssl` turns read-ahead off before the
            // second call; it is off with memory BIOs already.)
            let ret = unsafe { (self.fns.SSL_shutdown)(ssl) };
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
            let f = self.failure_of(Op::Shutdown, ret);
            if f.ssl_error == ossl::SSL_ERROR_WANT_READ {
                self.drop_parked(py);
                return Ok(Shutdown::Sent);
            }
            return Err(self.raise(py, f));
        }
    }

    /// `SSL_get_shutdown`: which close_notify alerts have passed.
    pub(crate) fn shutdown_state(&self, _py: Python<'_>) -> (bool, bool) {
        // SAFETY: the live SSL; read-only.
        let s = unsafe { (self.fns.SSL_get_shutdown)(self.ssl.as_ptr()) };
        (s & ossl::SSL_SENT_SHUTDOWN != 0, s & ossl::SSL_RECEIVED_SHUTDOWN != 0)
    }

    /// Test hooks: a TLS 1.2 renegotiation / a TLS 1.3 key update request
    /// from this side (the stdlib cannot start either).
    pub(crate) fn start_renegotiation(&mut self, py: Python<'_>) -> PyResult<Handshake> {
        self.clear_stale_errors();
        // SAFETY: the live SSL.
        if unsafe { (self.fns.SSL_renegotiate)(self.ssl.as_ptr()) } != 1 {
            let f = self.failure_of(Op::Handshake, 0);
            return Err(self.raise(py, Failure { ssl_error: ossl::SSL_ERROR_SSL, ..f }));
        }
        self.handshake(py)
    }

    pub(crate) fn request_key_update(&mut self, py: Python<'_>) -> PyResult<()> {
        self.clear_stale_errors();
        // SAFETY: the live SSL; 1 = SSL_KEY_UPDATE_REQUESTED.
        if unsafe { (self.fns.SSL_key_update)(self.ssl.as_ptr(), 1) } != 1 {
            let f = self.failure_of(Op::Handshake, 0);
            return Err(self.raise(py, Failure { ssl_error: ossl::SSL_ERROR_SSL, ..f }));
        }
        Ok(())
    }
}
