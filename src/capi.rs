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

/// The reference count of a live object (asked to tell whether anything
/// but its holder has it; pyo3 deprecates its own accessor).
#[inline]
pub(crate) fn refcount<T>(obj: &pyo3::Py<T>) -> isize {
    // SAFETY: `obj` is a live reference, so its header can be read.
    unsafe { pyo3::ffi::Py_REFCNT(obj.as_ptr()) }
}

/// What resuming a native awaitable gives.
pub(crate) enum Resumed {
    /// The value to hand to the task (a future it is to wait for).
    Yield(pyo3::Py<pyo3::PyAny>),
    /// The awaitable is done, with this result.
    Return(pyo3::Py<pyo3::PyAny>),
}

/// A pyclass the interpreter resumes through C slots of its own rather than
/// through pyo3's `__next__` trampoline, which would make a StopIteration
/// through a boxed error for every result.
pub(crate) trait Resumable: pyo3::PyClass {
    /// One step; `value` is what was sent in (None for `next()`).
    fn resume(slf: &pyo3::Bound<'_, Self>, value: &pyo3::Bound<'_, pyo3::PyAny>) -> pyo3::PyResult<Resumed>;
}

/// Puts `T`'s resumption slots in place: `tp_iternext` (how 3.12+ resume
/// an awaited object) and `am_send` (3.10, 3.11).
pub(crate) fn install_resume_slots<T: Resumable>(py: pyo3::Python<'_>) {
    use pyo3::types::PyTypeMethods;
    let tp = py.get_type::<T>();
    // SAFETY: GIL held; a heap type made by pyo3, whose tp_as_async points
    // at its own (writable) slots; no instance is being resumed meanwhile.
    unsafe {
        let raw = tp.as_type_ptr();
        (*raw).tp_iternext = Some(resume_next::<T>);
        if let Some(async_slots) = (*raw).tp_as_async.as_mut() {
            async_slots.am_send = Some(resume_send::<T>);
        }
        pyo3::ffi::PyType_Modified(raw);
    }
}

/// `am_send`: the result or yielded value in `*result`, as the interpreter
/// expects; an error is raised, not returned.
unsafe extern "C" fn resume_send<T: Resumable>(
    slf: *mut pyo3::ffi::PyObject,
    arg: *mut pyo3::ffi::PyObject,
    result: *mut *mut pyo3::ffi::PyObject,
) -> pyo3::ffi::PySendResult {
    use pyo3::prelude::*;
    // SAFETY: CPython calls the slot with the GIL held, on a live instance
    // of the type it was installed on (T), with a valid result pointer.
    unsafe {
        let py = Python::assume_attached();
        let obj = Bound::from_borrowed_ptr(py, slf).cast_into_unchecked::<T>();
        let arg = if arg.is_null() { py.None().into_bound(py) } else { Bound::from_borrowed_ptr(py, arg) };
        match T::resume(&obj, &arg) {
            Ok(Resumed::Return(value)) => {
                *result = value.into_ptr();
                pyo3::ffi::PySendResult::PYGEN_RETURN
            }
            Ok(Resumed::Yield(value)) => {
                *result = value.into_ptr();
                pyo3::ffi::PySendResult::PYGEN_NEXT
            }
            Err(err) => {
                err.restore(py);
                *result = std::ptr::null_mut();
                pyo3::ffi::PySendResult::PYGEN_ERROR
            }
        }
    }
}

/// `tp_iternext`: the value to yield, or NULL with StopIteration(result)
/// set (nothing set for a None result).
unsafe extern "C" fn resume_next<T: Resumable>(slf: *mut pyo3::ffi::PyObject) -> *mut pyo3::ffi::PyObject {
    use pyo3::prelude::*;
    // SAFETY: as for resume_send.
    unsafe {
        let py = Python::assume_attached();
        let obj = Bound::from_borrowed_ptr(py, slf).cast_into_unchecked::<T>();
        match T::resume(&obj, &py.None().into_bound(py)) {
            Ok(Resumed::Yield(value)) => value.into_ptr(),
            Ok(Resumed::Return(value)) => {
                let value = value.into_bound(py);
                if value.is_none() {
                    // No exception: a None result.
                } else if value.is_instance_of::<pyo3::types::PyTuple>()
                    || value.is_instance_of::<pyo3::exceptions::PyBaseException>()
                {
                    // StopIteration's constructor would take these apart:
                    // the exception made first, with the value as its one argument.
                    match py.get_type::<pyo3::exceptions::PyStopIteration>().call1((value,)) {
                        Ok(exc) => pyo3::ffi::PyErr_SetObject(pyo3::ffi::PyExc_StopIteration, exc.as_ptr()),
                        Err(err) => err.restore(py),
                    }
                } else {
                    pyo3::ffi::PyErr_SetObject(pyo3::ffi::PyExc_StopIteration, value.as_ptr());
                }
                std::ptr::null_mut()
            }
            Err(err) => {
                err.restore(py);
                std::ptr::null_mut()
            }
        }
    }
}

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
