//! The arguments of a vectorcall method, read where the interpreter put
//! them (no argument tuple, no keyword dict): what the fast loop methods
//! (fastcall.rs, tasks.rs) share.

use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyString;

/// A `"context"` string that is not the interned one: asyncio's C Task and
/// Future pass their own (`Py_BuildValue`) for every callback they
/// schedule, which identity then recognises without comparing text. It is
/// kept alive (one reference, never released) so that its address cannot
/// be reused by another object.
static CONTEXT_ALIAS: AtomicPtr<ffi::PyObject> = AtomicPtr::new(ptr::null_mut());

/// Whether `name` spells "context"; remembers the first such object that
/// is not the interned string as `CONTEXT_ALIAS`.
#[cold]
unsafe fn is_context_alias(name: *mut ffi::PyObject) -> bool {
    // SAFETY: `name` is a live str (a keyword name the interpreter passed).
    unsafe {
        if ffi::PyUnicode_CompareWithASCIIString(name, c"context".as_ptr()) != 0 {
            return false;
        }
        // Exact str only: a subclass could change under us. The GIL
        // serialises this store.
        if ffi::PyUnicode_CheckExact(name) != 0 && CONTEXT_ALIAS.load(Ordering::Relaxed).is_null() {
            ffi::Py_INCREF(name);
            CONTEXT_ALIAS.store(name, Ordering::Relaxed);
        }
        true
    }
}

/// Where a call's arguments are, as vectorcall passes them.
pub(super) struct FastArgs {
    pub(super) args: *const *mut ffi::PyObject,
    pub(super) nargs: usize,
    pub(super) kwnames: *mut ffi::PyObject,
}

impl FastArgs {
    /// Number of keyword arguments.
    #[inline]
    pub(super) fn nkw(&self) -> usize {
        if self.kwnames.is_null() {
            0
        } else {
            // SAFETY: kwnames is a live tuple when not null (vectorcall's contract).
            unsafe { ffi::PyTuple_GET_SIZE(self.kwnames) as usize }
        }
    }

    /// True if every keyword name is one of `allowed`.
    pub(super) fn keywords_within(&self, allowed: &[&str]) -> bool {
        // SAFETY: i < the tuple's size; its items are live str objects.
        (0..self.nkw()).all(|i| unsafe {
            let name = ffi::PyTuple_GET_ITEM(self.kwnames, i as ffi::Py_ssize_t);
            let mut size: ffi::Py_ssize_t = 0;
            let p = ffi::PyUnicode_AsUTF8AndSize(name, &mut size);
            if p.is_null() {
                ffi::PyErr_Clear();
                return false;
            }
            let s = std::slice::from_raw_parts(p as *const u8, size as usize);
            allowed.iter().any(|a| a.as_bytes() == s)
        })
    }

    /// The `context=` keyword (None when absent or None); any other keyword
    /// is a TypeError naming `method`, as for a Python function.
    pub(super) unsafe fn context(&self, py: Python<'_>, method: &str) -> PyResult<Option<*mut ffi::PyObject>> {
        // SAFETY: vectorcall's contract: kwnames' values follow the positional arguments.
        unsafe {
            if self.kwnames.is_null() {
                return Ok(None);
            }
            let n = ffi::PyTuple_GET_SIZE(self.kwnames) as usize;
            // Keyword names from Python code are interned: try identity
            // first, then the other "context" object seen before.
            let interned = pyo3::intern!(py, "context").as_ptr();
            let mut ctx = None;
            for i in 0..n {
                let name = ffi::PyTuple_GET_ITEM(self.kwnames, i as ffi::Py_ssize_t);
                if name == interned || name == CONTEXT_ALIAS.load(Ordering::Relaxed) || is_context_alias(name) {
                    let v = *self.args.add(self.nargs + i);
                    ctx = if v == ffi::Py_None() { None } else { Some(v) };
                } else {
                    let name = Bound::from_borrowed_ptr(py, name).cast_into::<PyString>()?;
                    return Err(PyTypeError::new_err(format!(
                        "{method}() got an unexpected keyword argument '{name}'"
                    )));
                }
            }
            Ok(ctx)
        }
    }

    /// The i-th argument (positional first, then keyword values).
    #[inline]
    pub(super) unsafe fn arg(&self, i: usize) -> *mut ffi::PyObject {
        // SAFETY: the caller passes i < nargs + nkw (this function's contract).
        unsafe { *self.args.add(i) }
    }
}
