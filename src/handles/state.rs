//! `HandleState`: the state of a handle (its pending call and its context),
//! and debug mode's side table of where handles were created.

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use super::callback::Callback;
use crate::capi::handles::{tracebacks, ObjRef};

/// A handle's state: the pending call, and the context it runs in (kept for
/// the handle's life, as asyncio keeps it).
pub(crate) struct HandleState {
    /// None once a one-shot handle has run, or once cancelled.
    pub(super) callback: Option<Callback>,
    context: ObjRef,
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

impl HandleState {
    /// A new state owning `context` (a `contextvars.Context`, or any object
    /// with `foreign_context`). The constructors from raw pointers are in
    /// context.rs.
    #[inline(always)]
    pub(super) fn from_parts(
        cb: Callback,
        context: ObjRef,
        shared_context: bool,
        repeat: bool,
        foreign_context: bool,
    ) -> Self {
        HandleState {
            callback: Some(cb),
            context,
            shared_context,
            traced: false,
            cancelled: false,
            repeat,
            foreign_context,
        }
    }

    /// Whether the context is not a `contextvars.Context`.
    #[inline]
    pub(crate) fn has_foreign_context(&self) -> bool {
        self.foreign_context
    }

    /// Records where the handle was created (debug mode). Only for a core
    /// already in its handle: the record is keyed by the core's address.
    pub(crate) fn set_source_traceback(&mut self, py: Python<'_>, tb: Py<PyAny>) {
        tracebacks::record(py, self.key(), tb);
        self.traced = true;
    }

    /// Where the handle was created, if recorded (debug mode).
    pub(super) fn source_traceback(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        if !self.traced {
            return None;
        }
        tracebacks::get(py, self.key())
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
    /// of the handle is held while Python code runs. Asked for just before
    /// the run, so a handle about to run in a shared snapshot is noted as
    /// the running one (see `private_context`).
    #[inline]
    pub(crate) fn run_context(&self) -> (*mut ffi::PyObject, bool) {
        if self.shared_context {
            super::context::mark_running(self.address());
        }
        (self.context.as_ptr(), self.shared_context)
    }

    /// This state's address, an identity compared and never followed.
    #[inline(always)]
    fn address(&self) -> usize {
        self as *const HandleState as usize
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
        visit.call(&*self.context)
    }

    pub(crate) fn is_repeating(&self) -> bool {
        self.repeat
    }

    /// The context to show to Python code (a new reference): a shared
    /// snapshot is first replaced by a private copy, so what the caller does
    /// with it affects this handle only.
    pub(super) fn private_context(&mut self, py: Python<'_>) -> Py<PyAny> {
        let owner = self.address();
        if self.shared_context && super::context::copy_if_shared(py, &mut self.context, owner) {
            self.shared_context = false;
        }
        self.context.to_object(py)
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
            // Before the context goes, whose decref may run Python code.
            tracebacks::forget(self.key());
        }
    }
}
