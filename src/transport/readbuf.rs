//! The buffer reads land in: one per thread, shared by every transport of
//! the loop running there (libuv asks for memory just before each read and
//! reports the read at once, so one suffices).
//!
//! It is a `bytes` object of `READ_SIZE`. A read that fills it (bulk
//! transfers) is handed to `data_received` without a copy; if the protocol
//! kept no reference (asyncio's StreamReader copies what it gets), the same
//! object serves the next read. Besides a copy this saves a large allocation
//! per read, which glibc serves by growing and trimming the heap: page
//! faults that cost more than the copy. Shorter reads are copied into an
//! exactly sized `bytes`.

use std::cell::RefCell;
use std::ptr;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// The most one read takes (asyncio's `max_size` for sockets, pipes and
/// datagrams).
pub(crate) const READ_SIZE: usize = 256 * 1024;

thread_local! {
    static BUFFER: RefCell<Option<Py<PyBytes>>> = const { RefCell::new(None) };
}

/// Memory for the next read: READ_SIZE bytes, or None when out of memory.
pub(crate) fn memory(py: Python<'_>) -> Option<*mut u8> {
    BUFFER.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            // SAFETY: a NULL source makes an uninitialised bytes object,
            // which only this buffer sees until a read has filled it.
            let raw = unsafe { pyo3::ffi::PyBytes_FromStringAndSize(ptr::null(), READ_SIZE as pyo3::ffi::Py_ssize_t) };
            if raw.is_null() {
                drop(PyErr::take(py));
                return None;
            }
            // SAFETY: a new reference to a bytes object.
            *slot = Some(unsafe { Bound::from_owned_ptr(py, raw).cast_into_unchecked::<PyBytes>() }.unbind());
        }
        let bytes = slot.as_ref().expect("allocated above");
        // SAFETY: the object is a live bytes; its buffer is ours to fill.
        Some(unsafe { pyo3::ffi::PyBytes_AsString(bytes.as_ptr()) } as *mut u8)
    })
}

/// The buffer as scratch memory for reads that are always copied out
/// (datagrams): MemoryError when it cannot be allocated.
pub(crate) fn scratch(py: Python<'_>) -> PyResult<*mut u8> {
    memory(py).ok_or_else(|| pyo3::exceptions::PyMemoryError::new_err(()))
}

/// `f` on the first `n` bytes the last read put in the buffer (None when
/// there is no buffer).
pub(crate) fn filled<R>(n: usize, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
    BUFFER.with(|cell| {
        let slot = cell.borrow();
        let b = slot.as_ref()?;
        // SAFETY: a live bytes object of READ_SIZE bytes; n <= READ_SIZE.
        let all =
            unsafe { std::slice::from_raw_parts(pyo3::ffi::PyBytes_AsString(b.as_ptr()) as *const u8, READ_SIZE) };
        Some(f(&all[..n.min(READ_SIZE)]))
    })
}

/// A copy of the first `n` bytes the last read put in the buffer.
pub(crate) fn copy<'py>(py: Python<'py>, n: usize) -> Bound<'py, PyBytes> {
    BUFFER.with(|cell| match cell.borrow().as_ref() {
        Some(b) => PyBytes::new(py, &b.bind(py).as_bytes()[..n]),
        None => PyBytes::new(py, &[]),
    })
}

/// What the last read put in the buffer, as a `bytes` of its own: the
/// buffer itself when the read filled it.
pub(crate) fn take(py: Python<'_>, n: usize) -> Option<Bound<'_, PyBytes>> {
    if n < READ_SIZE {
        return BUFFER.with(|cell| cell.borrow().as_ref().map(|b| PyBytes::new(py, &b.bind(py).as_bytes()[..n])));
    }
    BUFFER.with(|cell| cell.borrow_mut().take()).map(|b| b.into_bound(py))
}

/// Takes back a full read's `bytes` once the protocol is done with it, if
/// nobody else holds it.
pub(crate) fn give_back(bytes: Bound<'_, PyBytes>) {
    // SAFETY: reading the refcount of a live object.
    if unsafe { pyo3::ffi::Py_REFCNT(bytes.as_ptr()) } != 1 || bytes.as_bytes().len() != READ_SIZE {
        return;
    }
    BUFFER.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_some() {
            return;
        }
        // SAFETY: the only reference is ours, so the object can be
        // rewritten; its cached hash (if anyone hashed it) must go with the
        // contents.
        #[allow(deprecated)]
        unsafe {
            (*(bytes.as_ptr() as *mut pyo3::ffi::PyBytesObject)).ob_shash = -1;
        }
        *slot = Some(bytes.unbind());
    })
}
