//! The unsafe edge to CPython's C API: the calls pyo3's safe API does not
//! offer, or offers only at a cost the hot paths cannot pay (borrowed
//! references, buffers, bytes filled in place, the GIL's save and restore).
//!
//! Everything here is a safe function or a safe owner type; the rest of the
//! crate uses `pyo3::ffi` only through this module, `handles::context`,
//! `handles::pool` and `eventloop::fastcall`. Each section belongs to the
//! layer that uses it.

// ---- section: calls and objects (python, handles) ----

// ---- end of section: handles ----

// ---- section: the loop (eventloop) ----

// ---- end of section: eventloop ----

// ---- section: transports (transport) ----

/// The transports' CPython calls: buffers borrowed from bytes-like objects
/// (`Py_buffer`), `bytes` filled in place (the thread's read buffer), the
/// bytes of a `bytes` without a call, the context a transport's callbacks
/// run in, and the cyclic GC's view of a core's state.
pub(crate) mod transport {
    use std::cell::RefCell;
    use std::mem::MaybeUninit;

    use pyo3::ffi;
    use pyo3::prelude::*;
    use pyo3::types::PyBytes;
    use pyo3::{PyTraverseError, PyVisit};

    use crate::cell::NativeCell;

    /// A copy of the current context (`contextvars.copy_context()`).
    pub(crate) fn copy_context(py: Python<'_>) -> PyResult<Py<PyAny>> {
        // SAFETY: GIL held (the token); a new reference, or NULL with the
        // error set.
        Ok(unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyContext_CopyCurrent())? }.unbind())
    }

    /// The bytes of a `bytes` object, read in place (no call, no GIL
    /// needed: the reference keeps the object alive, and its bytes never
    /// change).
    #[inline]
    pub(crate) fn bytes_data(b: &Py<PyBytes>) -> &[u8] {
        let p = b.as_ptr();
        // SAFETY: p is a live bytes object (or subclass instance: the same
        // layout), whose `ob_size` bytes at `ob_sval` are immutable for as
        // long as the reference is borrowed.
        unsafe {
            let len = (*(p as *mut ffi::PyVarObject)).ob_size as usize;
            let data = std::ptr::addr_of!((*(p as *mut ffi::PyBytesObject)).ob_sval) as *const u8;
            std::slice::from_raw_parts(data, len)
        }
    }

    /// `bytes(obj)`: a new `bytes` of a bytes-like object's contents (or
    /// whatever `__bytes__` returns).
    pub(crate) fn bytes_of<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        // SAFETY: GIL held; a new reference, or NULL with the error set.
        unsafe { Bound::from_owned_ptr_or_err(obj.py(), ffi::PyObject_Bytes(obj.as_ptr())) }
    }

    /// A `bytes` object that only its owner references, so its bytes can
    /// be written in place until it is handed out (`into_bytes`).
    pub(crate) struct FillBytes(Py<PyBytes>);

    impl FillBytes {
        /// A new `bytes` of `len` zero bytes: `bytes(len)`, whose memory
        /// comes from calloc (fresh pages cost no clearing), so no byte of it
        /// is ever uninitialised.
        pub(crate) fn new(py: Python<'_>, len: usize) -> PyResult<FillBytes> {
            let obj = py.get_type::<PyBytes>().call1((len,))?.cast_into_exact::<PyBytes>()?;
            // SAFETY: reading the refcount of a live object.
            if len > 0 && unsafe { ffi::Py_REFCNT(obj.as_ptr()) } != 1 {
                // (Never so for a new object. Empty bytes are shared, but
                // nothing can be written to them.)
                return Err(pyo3::exceptions::PyMemoryError::new_err(()));
            }
            Ok(FillBytes(obj.unbind()))
        }

        #[inline]
        pub(crate) fn as_slice(&self) -> &[u8] {
            bytes_data(&self.0)
        }

        #[inline]
        pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
            let s = bytes_data(&self.0);
            // SAFETY: nobody else references the object (the type's
            // invariant), so nobody sees the bytes change; `&mut self` makes
            // the borrow exclusive.
            unsafe { std::slice::from_raw_parts_mut(s.as_ptr() as *mut u8, s.len()) }
        }

        /// The object, from now on shared and immutable.
        #[inline]
        pub(crate) fn into_bytes(self, py: Python<'_>) -> Bound<'_, PyBytes> {
            self.0.into_bound(py)
        }

        /// Takes a `bytes` back for filling, if nobody else references it
        /// and it is an exact `bytes` of `len` bytes (None drops it).
        pub(crate) fn reclaim(bytes: Bound<'_, PyBytes>, len: usize) -> Option<FillBytes> {
            let p = bytes.as_ptr();
            // SAFETY: reading the refcount of a live object.
            if unsafe { ffi::Py_REFCNT(p) } != 1 || bytes_data(bytes.as_unbound()).len() != len {
                return None;
            }
            // SAFETY: reading the type of a live object.
            if unsafe { ffi::PyBytes_CheckExact(p) } == 0 {
                return None;
            }
            // SAFETY: the only reference is ours, so the object can be
            // rewritten; its cached hash (if anyone hashed it) must go with
            // the contents.
            #[allow(deprecated)]
            unsafe {
                (*(p as *mut ffi::PyBytesObject)).ob_shash = -1;
            }
            Some(FillBytes(bytes.unbind()))
        }
    }

    thread_local! {
        /// The thread's read buffer (see transport/readbuf.rs).
        static READ_BUFFER: RefCell<Option<FillBytes>> = const { RefCell::new(None) };
    }

    /// `f` on the thread's read buffer (None when there is none). `f` must
    /// not call back here (the buffer is borrowed meanwhile).
    #[inline]
    pub(crate) fn with_read_buffer<R>(f: impl FnOnce(&mut Option<FillBytes>) -> R) -> R {
        READ_BUFFER.with(|cell| f(&mut cell.borrow_mut()))
    }

    /// The memory of the thread's read buffer (made with `len` bytes if
    /// there is none), for a read into it that libuv makes right away
    /// (uv.rs); None when out of memory. The memory stays valid until the
    /// buffer leaves `with_read_buffer`'s slot, which takes code to run.
    #[inline]
    pub(crate) fn read_buffer_memory(py: Python<'_>, len: usize) -> Option<(*mut u8, usize)> {
        with_read_buffer(|slot| {
            if slot.is_none() {
                *slot = Some(FillBytes::new(py, len).ok()?);
            }
            let m = slot.as_mut()?.as_mut_slice();
            Some((m.as_mut_ptr(), m.len()))
        })
    }

    /// A buffer exported by a Python object (`Py_buffer`), released on drop.
    pub(crate) struct BufferView(Box<ffi::Py_buffer>);

    impl BufferView {
        /// A contiguous buffer of `obj`, writable when asked, whatever its
        /// item format (the bytes are what count, as for socket.recv_into).
        pub(crate) fn get(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<BufferView> {
            // SAFETY: a zeroed Py_buffer is a valid target for PyObject_GetBuffer.
            let mut view: Box<ffi::Py_buffer> = Box::new(unsafe { MaybeUninit::zeroed().assume_init() });
            let flags = if writable { ffi::PyBUF_WRITABLE } else { ffi::PyBUF_SIMPLE };
            // SAFETY: GIL held; the view is ours to fill and released in Drop.
            if unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) } < 0 {
                return Err(PyErr::fetch(obj.py()));
            }
            Ok(BufferView(view))
        }

        /// The memory's address (an opaque pointer, for code that hands it
        /// to a C library itself).
        #[inline]
        pub(crate) fn ptr(&self) -> *mut u8 {
            self.0.buf as *mut u8
        }

        #[inline]
        pub(crate) fn len(&self) -> usize {
            self.0.len as usize
        }

        /// The bytes. Their memory stays valid until the view is released
        /// (the exporter cannot resize or free it meanwhile); a mutable
        /// exporter's values change only if Python code runs.
        #[inline]
        pub(crate) fn as_slice(&self) -> &[u8] {
            if self.0.buf.is_null() {
                return &[];
            }
            // SAFETY: the exported buffer is valid for its length until
            // released.
            unsafe { std::slice::from_raw_parts(self.0.buf as *const u8, self.len()) }
        }

        /// The bytes to write to, for a writable export (None otherwise).
        #[inline]
        pub(crate) fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
            if self.0.readonly != 0 || self.0.buf.is_null() {
                return None;
            }
            // SAFETY: a writable export, valid for its length until
            // released; `&mut self` makes the borrow exclusive.
            Some(unsafe { std::slice::from_raw_parts_mut(self.0.buf as *mut u8, self.len()) })
        }
    }

    impl Drop for BufferView {
        fn drop(&mut self) {
            // SAFETY: acquired by PyObject_GetBuffer and released once, with
            // the GIL (taken if this thread does not hold it).
            Python::attach(|_py| unsafe { ffi::PyBuffer_Release(&mut *self.0) })
        }
    }

    /// `f` on the state of a core's cell, in its `__traverse__` (the GC's
    /// visitor exists only there, with the GIL held; `f` gets the state
    /// shared, so it only reads).
    #[inline]
    pub(crate) fn traverse_state<T>(
        cell: &NativeCell<T>,
        _visit: &PyVisit<'_>,
        f: impl FnOnce(&T) -> Result<(), PyTraverseError>,
    ) -> Result<(), PyTraverseError> {
        // SAFETY: GIL held (the visitor); f only reads (a shared borrow).
        unsafe { cell.peek(f) }
    }
}

// ---- end of section: transport ----

// ---- section: native streams (streams) ----

// ---- end of section: streams ----
