//! Borrowing the bytes of a bytes-like object (the buffer protocol) for the
//! length of a system call, or for a read into a BufferedProtocol's memory.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// A buffer exported by a Python object (`Py_buffer`), released on drop.
pub(crate) use crate::capi::transport::BufferView;
use crate::uv::transport::LendMemory;

/// A BufferedProtocol's buffer, lent to libuv for a read into it.
impl LendMemory for BufferView {
    #[inline]
    fn memory(&mut self) -> &mut [u8] {
        // (A view asked for writable is writable: nothing is read otherwise.)
        self.as_mut_slice().unwrap_or_default()
    }
}

/// The bytes of a bytes-like object for one system call: `bytes` directly,
/// anything else through its buffer.
pub(crate) enum Bytes<'a> {
    Plain(&'a [u8]),
    View(BufferView),
}

impl<'a> Bytes<'a> {
    pub(crate) fn get(obj: &'a Bound<'_, PyAny>) -> PyResult<Bytes<'a>> {
        if let Ok(b) = obj.cast::<PyBytes>() {
            return Ok(Bytes::Plain(b.as_bytes()));
        }
        BufferView::get(obj, false).map(Bytes::View)
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Plain(s) => s,
            Bytes::View(v) => v.as_slice(),
        }
    }
}
