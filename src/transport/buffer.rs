//! Borrowing the bytes of a bytes-like object (the buffer protocol) for the
//! length of a system call, or for a read into a BufferedProtocol's memory.

use std::mem::MaybeUninit;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// A buffer exported by a Python object (`Py_buffer`), released on drop
/// (with the GIL held: views live only on the loop's thread, in its state).
pub(crate) struct BufferView(Box<pyo3::ffi::Py_buffer>);

// SAFETY: only created and dropped with the GIL held.
unsafe impl Send for BufferView {}

impl BufferView {
    /// A contiguous buffer of `obj`, writable when asked, whatever its item
    /// format (the bytes are what count, as for socket.recv_into).
    pub(crate) fn get(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<BufferView> {
        // SAFETY: a zeroed Py_buffer is a valid target for PyObject_GetBuffer.
        let mut view: Box<pyo3::ffi::Py_buffer> = Box::new(unsafe { MaybeUninit::zeroed().assume_init() });
        let flags = if writable { pyo3::ffi::PyBUF_WRITABLE } else { pyo3::ffi::PyBUF_SIMPLE };
        // SAFETY: view is ours to fill; released in Drop.
        if unsafe { pyo3::ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) } < 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        Ok(BufferView(view))
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.0.buf as *mut u8
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len as usize
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: the exported buffer is valid until released.
        unsafe { std::slice::from_raw_parts(self.0.buf as *const u8, self.0.len as usize) }
    }
}

impl Drop for BufferView {
    fn drop(&mut self) {
        // SAFETY: acquired by PyObject_GetBuffer; dropped with the GIL held.
        unsafe { pyo3::ffi::PyBuffer_Release(&mut *self.0) }
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
