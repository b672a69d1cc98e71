//! `HandleState`: the state of a handle (its pending call and its context),
//! and debug mode's side table of where handles were created.

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::{Mutex, OnceLock};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use super::callback::{as_py, Callback};

/// A handle's state: the pending call, and the context it runs in (kept for
/// the handle's life, as asyncio keeps it).
pub(crate) struct HandleState {
    /// None once a one-shot handle has run, or once cancelled.
    pub(super) callback: Option<Callback>,
    context: NonNull<ffi::PyObject>,
    /// The context is a loop snapshot other handles may share (see context.rs).
    shared_context: bool,
    /// Has a source traceback in `source_tracebacks()` (debug mode only).
    pub(super) traced: bool,
    pub(super) cancelled: bool,
    /// Reader, writer and signal handles run every time their event fires and
    /// keep their callback until cancelled.
    repeat: bool,
    /// `context=` was not a `contextvars.Context`: as asyncio, the handle
    /// keeps it and calls its `run()` when the callback is due (where the
    /// error, if any, is reported).
    foreign_context: bool,
}

// SAFETY: only touched while holding the GIL.
unsafe impl Send for HandleState {}

impl HandleState {
    /// Takes ownership of the reference to `context`.
    ///
    /// # Safety
    /// `context` is a live `contextvars.Context`.
    #[inline(always)]
    pub(crate) unsafe fn new(cb: Callback, context: *mut ffi::PyObject, shared_context: bool, repeat: bool) -> Self {
        HandleState {
            callback: Some(cb),
            // SAFETY: the caller's contract: `context` is a live (non-null) context.
            context: unsafe { NonNull::new_unchecked(context) },
            shared_context,
            traced: false,
            cancelled: false,
            repeat,
            foreign_context: false,
        }
    }

    /// A state whose `context` is any object (see `foreign_context`).
    ///
    /// # Safety
    /// As for `new`, `context` being any live object.
    pub(crate) unsafe fn with_foreign_context(cb: Callback, context: *mut ffi::PyObject) -> Self {
        // SAFETY: per the contract.
        let mut state = unsafe { HandleState::new(cb, context, false, false) };
        state.foreign_context = true;
        state
    }

    /// Whether the context is not a `contextvars.Context`.
    #[inline]
    pub(crate) fn has_foreign_context(&self) -> bool {
        self.foreign_context
    }

    /// Records where the handle was created (debug mode). Only for a core
    /// already in its handle: the record is keyed by the core's address.
    pub(crate) fn set_source_traceback(&mut self, tb: Py<PyAny>) {
        let old = source_tracebacks().insert(self.key(), tb.into_ptr() as usize);
        self.traced = true;
        if let Some(old) = old {
            // SAFETY: GIL held; the table owned this reference.
            unsafe { ffi::Py_DECREF(old as *mut ffi::PyObject) }
        }
    }

    /// Where the handle was created, if recorded (debug mode).
    pub(super) fn source_traceback(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        if !self.traced {
            return None;
        }
        let tb = source_tracebacks().get(&self.key()).copied()?;
        // SAFETY: the table holds a reference to this object.
        Some(unsafe { Bound::from_borrowed_ptr(py, tb as *mut ffi::PyObject) }.unbind())
    }

    #[inline]
    fn key(&self) -> usize {
        self as *const HandleState as usize
    }

    /// The call to make now: moved out for one-shot handles, shared for
    /// repeating ones or when `keep` (debug mode keeps it for the slow-callback
    /// report), None when cancelled.
    #[inline]
    pub(crate) fn take_for_run(&mut self, keep: bool) -> Option<Callback> {
        if self.cancelled {
            return None;
        }
        if self.repeat || keep {
            self.callback.as_ref().map(Callback::clone_refs)
        } else {
            self.callback.take()
        }
    }

    /// The context to run in as (context, shared); copied out so no borrow
    /// of the handle is held while Python code runs.
    #[inline]
    pub(crate) fn run_context(&self) -> (*mut ffi::PyObject, bool) {
        (self.context.as_ptr(), self.shared_context)
    }

    /// Puts a copy of a taken callback back (for error reports); true if it
    /// did, and the caller then calls `finish_run`.
    pub(crate) fn show_callback(&mut self, cb: &Callback) -> bool {
        if self.callback.is_some() || self.cancelled {
            return false;
        }
        self.callback = Some(cb.clone_refs());
        true
    }

    /// After a run with `keep`: a one-shot handle lets go of its callback
    /// (returned, to drop outside any borrow).
    pub(crate) fn finish_run(&mut self) -> Option<Callback> {
        if self.repeat {
            None
        } else {
            self.callback.take()
        }
    }

    /// Reports the references of this handle to the cyclic GC (for the loop
    /// while it queues the handle, for the handle itself afterwards).
    pub(crate) fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Some(cb) = &self.callback {
            cb.visit(visit)?;
        }
        // The source traceback (a list of frame summaries, never pointing
        // back at handles) is not reported: it cannot close a cycle.
        visit.call(as_py(&self.context.as_ptr()))
    }

    pub(crate) fn is_repeating(&self) -> bool {
        self.repeat
    }

    /// The context to show to Python code: a shared snapshot is first
    /// replaced by a private copy, so what the caller does with it affects
    /// this handle only.
    pub(super) fn private_context(&mut self) -> *mut ffi::PyObject {
        // SAFETY: GIL held (`&mut self` is only reached through NativeCell::with); the context is live.
        unsafe {
            if self.shared_context && ffi::Py_REFCNT(self.context.as_ptr()) > 1 {
                let copy = ffi::PyContext_Copy(self.context.as_ptr());
                if !copy.is_null() {
                    let old = std::mem::replace(&mut self.context, NonNull::new_unchecked(copy));
                    self.shared_context = false;
                    ffi::Py_DECREF(old.as_ptr());
                } else {
                    ffi::PyErr_Clear();
                }
            }
            self.context.as_ptr()
        }
    }

    /// Marks cancelled and returns the references to drop (outside any borrow).
    pub(super) fn cancel(&mut self) -> Option<Callback> {
        self.cancelled = true;
        self.callback.take()
    }
}

impl Drop for HandleState {
    fn drop(&mut self) {
        if self.traced {
            // Taken out before the decref, which may run Python code.
            let tb = source_tracebacks().remove(&self.key());
            if let Some(tb) = tb {
                // SAFETY: GIL held; the table owned this reference.
                unsafe { ffi::Py_DECREF(tb as *mut ffi::PyObject) }
            }
        }
        // SAFETY: handles are dropped with the GIL held.
        unsafe { ffi::Py_DECREF(self.context.as_ptr()) }
    }
}

/// Source tracebacks of debug-mode handles (owned object pointers), by core
/// address: kept out of the handle so that a handle stays within 64 bytes.
/// Raw pointers, because a handle's value is dropped by `HandlePool::dealloc`
/// outside pyo3's trampolines, where pyo3 would defer dropping a `Py<T>`.
fn source_tracebacks() -> std::sync::MutexGuard<'static, HashMap<usize, usize>> {
    static TRACEBACKS: OnceLock<Mutex<HashMap<usize, usize>>> = OnceLock::new();
    TRACEBACKS.get_or_init(|| Mutex::new(HashMap::new())).lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
