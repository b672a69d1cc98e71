//! `ReadBuffer`: the bytes a native StreamReader holds (asyncio's `_buffer`).
//!
//! asyncio keeps them in a `bytearray`, and code outside asyncio reads and
//! changes that object (`len(reader._buffer)`, `reader._buffer.clear()`).
//! A bytearray costs a reader dearly, though: each read appends by resizing
//! it and takes by deleting a slice, and a bytearray emptied that way gives
//! its memory back, so every read of a round trip reallocates twice. So the
//! bytes live in a `Vec` that keeps its capacity, and become a bytearray
//! only when Python code asks for `_buffer` (or sets it): from then on that
//! object is the buffer, as in asyncio, until nothing but the reader holds
//! it any more, when the bytes move back into the `Vec`.

use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PySlice};
use pyo3::{PyTraverseError, PyVisit};

use crate::transport::buffer::Bytes;

/// An emptied buffer keeps at most this much memory (asyncio's default
/// limit), so a connection that once took a large read does not keep it.
const KEPT_CAPACITY: usize = 64 * 1024;

pub(super) enum ReadBuffer {
    /// The bytes are `data[start..]`.
    Native { data: Vec<u8>, start: usize },
    /// Python code holds (or gave) this bytearray: it is the buffer.
    Exposed(Py<PyByteArray>),
}

impl ReadBuffer {
    pub(super) fn new() -> Self {
        ReadBuffer::Native { data: Vec::new(), start: 0 }
    }

    pub(super) fn len(&self, py: Python<'_>) -> usize {
        match self {
            ReadBuffer::Native { data, start } => data.len() - start,
            ReadBuffer::Exposed(b) => b.bind_borrowed(py).len(),
        }
    }

    /// Runs `f` on the buffered bytes (a bytearray's are exported for the
    /// while, so nothing can resize it under `f`).
    pub(super) fn with_contents<R>(&self, py: Python<'_>, f: impl FnOnce(&[u8]) -> R) -> PyResult<R> {
        match self {
            ReadBuffer::Native { data, start } => Ok(f(&data[*start..])),
            ReadBuffer::Exposed(b) => {
                let b = b.bind(py).as_any();
                let view = Bytes::get(b)?;
                Ok(f(view.as_slice()))
            }
        }
    }

    /// Appends `data` (asyncio's `bytearray.extend`).
    pub(super) fn append(&mut self, py: Python<'_>, more: &[u8]) -> PyResult<()> {
        self.reclaim(py);
        match self {
            ReadBuffer::Native { data, start } => {
                // Move the bytes to the front rather than grow past taken ones.
                if *start > 0 && data.len() + more.len() > data.capacity() {
                    data.drain(..*start);
                    *start = 0;
                }
                data.extend_from_slice(more);
                Ok(())
            }
            ReadBuffer::Exposed(b) => {
                b.bind(py).call_method1(pyo3::intern!(py, "extend"), (PyBytes::new(py, more),))?;
                Ok(())
            }
        }
    }

    /// `del buffer[:n]` (`n` at most the length).
    pub(super) fn consume(&mut self, py: Python<'_>, n: usize) -> PyResult<()> {
        if n == 0 {
            return Ok(());
        }
        match self {
            ReadBuffer::Native { data, start } => {
                *start += n;
                if *start >= data.len() {
                    Self::emptied(data);
                    *start = 0;
                }
                Ok(())
            }
            ReadBuffer::Exposed(b) => b.bind(py).del_item(PySlice::new(py, 0, n as isize, 1)),
        }
    }

    /// `bytes(buffer[:n])`, then `del buffer[:n]`.
    pub(super) fn take_front<'py>(&mut self, py: Python<'py>, n: usize) -> PyResult<Bound<'py, PyBytes>> {
        let n = n.min(self.len(py));
        let data = self.with_contents(py, |bytes| PyBytes::new(py, &bytes[..n]))?;
        self.consume(py, n)?;
        Ok(data)
    }

    /// `bytes(buffer)`, then `buffer.clear()`.
    pub(super) fn take_all<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let n = self.len(py);
        self.take_front(py, n)
    }

    /// `buffer.clear()`.
    pub(super) fn clear(&mut self, py: Python<'_>) -> PyResult<()> {
        match self {
            ReadBuffer::Native { data, start } => {
                Self::emptied(data);
                *start = 0;
                Ok(())
            }
            ReadBuffer::Exposed(b) => b.bind_borrowed(py).resize(0),
        }
    }

    /// The buffer as the bytearray Python code sees (`reader._buffer`).
    pub(super) fn expose(&mut self, py: Python<'_>) -> Py<PyByteArray> {
        if let ReadBuffer::Native { data, start } = self {
            let b = PyByteArray::new(py, &data[*start..]).unbind();
            *self = ReadBuffer::Exposed(b);
        }
        match self {
            ReadBuffer::Exposed(b) => b.clone_ref(py),
            ReadBuffer::Native { .. } => unreachable!("exposed above"),
        }
    }

    /// `reader._buffer = b`: that bytearray is the buffer from now on.
    pub(super) fn replace(&mut self, b: Py<PyByteArray>) -> ReadBuffer {
        std::mem::replace(self, ReadBuffer::Exposed(b))
    }

    /// Back to the `Vec` once only the reader holds the bytearray.
    fn reclaim(&mut self, py: Python<'_>) {
        if let ReadBuffer::Exposed(b) = self {
            if crate::capi::refcount(b) == 1 {
                let data = b.bind_borrowed(py).to_vec();
                *self = ReadBuffer::Native { data, start: 0 };
            }
        }
    }

    fn emptied(data: &mut Vec<u8>) {
        if data.capacity() > KEPT_CAPACITY {
            *data = Vec::new();
        } else {
            data.clear();
        }
    }

    pub(super) fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        match self {
            ReadBuffer::Exposed(b) => visit.call(b),
            ReadBuffer::Native { .. } => Ok(()),
        }
    }
}
