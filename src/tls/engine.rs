//! `_zuvrs._TlsEngine`: a private Python face of `TlsSession`, so tests can
//! drive a native session against a stdlib `SSLObject` peer in memory.
//! Transports use `TlsSession` directly.

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use pyo3::{PyTraverseError, PyVisit};

use super::ossl::{self, Plaintext};
use super::session::{Decrypted, Handshake, Opened, Shutdown, TlsSession, Write};
use super::verdict;

#[pyclass(module = "zuvrs._zuvrs", name = "_TlsEngine")]
pub struct TlsEngine {
    session: Option<TlsSession>,
    /// Reused by read(), so a call costs no zeroed allocation.
    buf: Vec<u8>,
}

impl TlsEngine {
    fn s(&mut self) -> PyResult<&mut TlsSession> {
        self.session.as_mut().ok_or_else(|| PyValueError::new_err("the engine was cleared"))
    }
}

#[pymethods]
impl TlsEngine {
    /// `_TlsEngine.open(sslobj, incoming, outgoing)`: an engine driving the
    /// SSLObject natively, or the reason (a str) why it would not be.
    #[staticmethod]
    fn open(
        py: Python<'_>,
        sslobj: &Bound<'_, PyAny>,
        incoming: &Bound<'_, PyAny>,
        outgoing: &Bound<'_, PyAny>,
    ) -> PyResult<Py<PyAny>> {
        Ok(match TlsSession::open(py, sslobj, incoming, outgoing)? {
            Opened::Native(s) => Py::new(py, TlsEngine { session: Some(s), buf: Vec::new() })?.into_any(),
            Opened::NotNative(why) => why.into_pyobject(py)?.into_any().unbind(),
        })
    }

    /// The process's verdict: (native, reason, output consumed by seeking,
    /// names of the OpenSSL functions resolved through `_ssl`).
    #[staticmethod]
    fn verdict(py: Python<'_>) -> (bool, String, bool, Vec<&'static str>) {
        let v = verdict::verdict(py);
        (v.fns.is_some(), v.reason.clone(), v.bio_seek, ossl::FUNCTION_NAMES.to_vec())
    }

    #[getter]
    fn sslobj(&mut self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(self.s()?.sslobj().clone_ref(py))
    }

    fn feed(&mut self, py: Python<'_>, data: &[u8]) -> PyResult<()> {
        self.s()?.feed(py, data)
    }

    fn feed_eof(&mut self, py: Python<'_>) -> PyResult<()> {
        self.s()?.feed_eof(py)
    }

    /// True when done, False when it needs the peer.
    fn handshake(&mut self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.s()?.handshake(py)? == Handshake::Done)
    }

    fn is_handshake_done(&mut self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.s()?.is_handshake_done(py))
    }

    /// bytes read; None: wants the peer; b"": close_notify received.
    #[pyo3(signature = (size = 65536))]
    fn read(&mut self, py: Python<'_>, size: usize) -> PyResult<Option<Py<PyBytes>>> {
        let mut buf = std::mem::take(&mut self.buf);
        buf.resize(size, 0);
        let got = self.s().and_then(|s| s.read_into(py, &mut buf[..]));
        let out = match got {
            Ok(Decrypted::Data(n)) => Ok(Some(PyBytes::new(py, &buf[..n]).unbind())),
            Ok(Decrypted::Closed) => Ok(Some(PyBytes::new(py, b"").unbind())),
            Ok(Decrypted::WantRead) => Ok(None),
            Err(e) => Err(e),
        };
        self.buf = buf;
        out
    }

    /// Into a writable buffer: the count; None: wants the peer; 0: closed.
    fn read_into(&mut self, py: Python<'_>, buffer: PyBuffer<u8>) -> PyResult<Option<usize>> {
        // None: read-only or not C-contiguous. (The buffer is held for this
        // call, so it cannot be resized meanwhile.)
        let Some(mem) = Plaintext::of_buffer(&buffer) else {
            return Err(PyValueError::new_err("a writable contiguous buffer is needed"));
        };
        Ok(match self.s()?.read_into(py, mem)? {
            Decrypted::Data(n) => Some(n),
            Decrypted::Closed => Some(0),
            Decrypted::WantRead => None,
        })
    }

    /// Bytes taken; None: the handshake needs the peer first.
    fn write(&mut self, py: Python<'_>, data: &[u8]) -> PyResult<Option<usize>> {
        Ok(match self.s()?.write(py, data)? {
            Write::Written(n) => Some(n),
            Write::WantRead => None,
        })
    }

    /// (bytes taken, wants the peer) for a list of bytes.
    fn write_many(&mut self, py: Python<'_>, bufs: Vec<Vec<u8>>) -> PyResult<(usize, bool)> {
        let slices: Vec<&[u8]> = bufs.iter().map(|b| b.as_slice()).collect();
        let (n, w) = self.s()?.write_vectored(py, &slices)?;
        Ok((n, w == Write::WantRead))
    }

    fn pending(&mut self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.s()?.pending(py))
    }

    fn incoming_len(&mut self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.s()?.incoming_len(py))
    }

    fn has_pending(&mut self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.s()?.has_pending(py))
    }

    fn output_len(&mut self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.s()?.output_len(py))
    }

    /// The waiting ciphertext, taken (one copy).
    fn take_output(&mut self, py: Python<'_>) -> PyResult<Py<PyBytes>> {
        let mut out = Vec::new();
        self.s()?.take_output(py, &mut out);
        Ok(PyBytes::new(py, &out).unbind())
    }

    /// A copy of the waiting ciphertext, left in place.
    fn peek_output(&mut self, py: Python<'_>) -> PyResult<Py<PyBytes>> {
        Ok(self.s()?.output_bytes(py).unbind())
    }

    fn consume_output(&mut self, py: Python<'_>, n: usize) -> PyResult<()> {
        self.s()?.consume_output(py, n);
        Ok(())
    }

    /// "sent" (close_notify out, the peer's not in) or "complete".
    fn shutdown(&mut self, py: Python<'_>) -> PyResult<&'static str> {
        Ok(match self.s()?.shutdown(py)? {
            Shutdown::Sent => "sent",
            Shutdown::Complete => "complete",
        })
    }

    /// (close_notify sent, close_notify received).
    fn shutdown_state(&mut self, py: Python<'_>) -> PyResult<(bool, bool)> {
        Ok(self.s()?.shutdown_state(py))
    }

    fn _renegotiate(&mut self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.s()?.start_renegotiation(py)? == Handshake::Done)
    }

    fn _key_update(&mut self, py: Python<'_>) -> PyResult<()> {
        self.s()?.request_key_update(py)
    }

    /// A measurement loop in native code: `count` times, write `chunk`
    /// here, move the ciphertext to `peer` (zero-copy view + consume) and
    /// read it there until it wants more. Returns the plaintext bytes read.
    fn _pump(&mut self, py: Python<'_>, peer: &Bound<'_, TlsEngine>, chunk: &[u8], count: usize) -> PyResult<usize> {
        let mut peer = peer.borrow_mut();
        let peer = peer.s()?;
        let me = self.s()?;
        let mut buf = vec![0u8; 64 * 1024];
        let mut total = 0usize;
        for _ in 0..count {
            if me.write(py, chunk)? != Write::Written(chunk.len()) {
                return Err(PyValueError::new_err("write did not complete"));
            }
            let n = me.output_to(py, peer)?;
            me.consume_output(py, n);
            loop {
                match peer.read_into(py, &mut buf[..])? {
                    Decrypted::Data(n) => total += n,
                    Decrypted::WantRead => break,
                    Decrypted::Closed => return Ok(total),
                }
            }
        }
        Ok(total)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Some(s) = &self.session {
            for o in s.objects() {
                visit.call(o)?;
            }
        }
        Ok(())
    }

    fn __clear__(&mut self) {
        self.session = None;
    }
}
