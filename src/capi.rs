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

// ---- end of section: transport ----

// ---- section: native streams (streams) ----

// ---- end of section: streams ----

// ---- section: Unix socket paths and accepted connections (net) ----

/// The net layer's CPython calls: the filesystem encoding of Unix socket
/// paths, `os.fspath`, and a context of its own per accepted connection.
pub(crate) mod net {
    use pyo3::prelude::*;
    use pyo3::types::{PyBytes, PyString};

    /// `bytes` decoded with the filesystem encoding, as `os.fsdecode`.
    pub(crate) fn fs_decode<'py>(py: Python<'py>, bytes: &[u8]) -> PyResult<Bound<'py, PyString>> {
        // SAFETY: GIL held (the token); a valid buffer of its length; the
        // result is a new reference to a str or NULL with an exception set.
        unsafe {
            let obj = pyo3::ffi::PyUnicode_DecodeFSDefaultAndSize(
                bytes.as_ptr() as *const libc::c_char,
                bytes.len() as pyo3::ffi::Py_ssize_t,
            );
            Ok(Bound::from_owned_ptr_or_err(py, obj)?.cast_into_unchecked())
        }
    }

    /// A str encoded with the filesystem encoding, as `os.fsencode`.
    pub(crate) fn fs_encode<'py>(s: &Bound<'py, PyString>) -> PyResult<Bound<'py, PyBytes>> {
        // SAFETY: GIL held; the result is a new reference to a bytes object
        // or NULL with an exception set.
        unsafe {
            let obj = pyo3::ffi::PyUnicode_EncodeFSDefault(s.as_ptr());
            Ok(Bound::from_owned_ptr_or_err(s.py(), obj)?.cast_into_unchecked())
        }
    }

    /// `os.fspath(obj)`: a str or bytes, or the TypeError os.fspath raises.
    pub(crate) fn fspath<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        // SAFETY: GIL held; PyOS_FSPath returns a new reference or NULL with
        // the error set.
        unsafe { Bound::from_owned_ptr_or_err(obj.py(), pyo3::ffi::PyOS_FSPath(obj.as_ptr())) }
    }

    /// `f()` run inside a fresh copy of the current context (entered
    /// before, exited after; an exit that fails is the error).
    pub(crate) fn in_context_copy<R>(py: Python<'_>, f: impl FnOnce() -> PyResult<R>) -> PyResult<R> {
        // SAFETY: GIL held; a new reference to a context, or NULL with the
        // error set.
        let ctx = unsafe { Bound::from_owned_ptr_or_err(py, pyo3::ffi::PyContext_CopyCurrent())? };
        // SAFETY: a live context, new, so not entered anywhere.
        if unsafe { pyo3::ffi::PyContext_Enter(ctx.as_ptr()) } < 0 {
            return Err(PyErr::fetch(py));
        }
        let result = f();
        // SAFETY: the context entered above, on this thread; CPython checks
        // that it is the current one.
        if unsafe { pyo3::ffi::PyContext_Exit(ctx.as_ptr()) } < 0 {
            return Err(PyErr::fetch(py));
        }
        result
    }
}

// ---- end of section: net ----
