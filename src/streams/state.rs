//! `ReaderCore`'s native state and the steps that change it: the buffer
//! fed (by the transport's `ReadSink` or `feed_data`), the waiting read
//! woken, reading paused over twice the limit and resumed at it.
//!
//! reader.rs has the Python-facing methods, and ops.rs the reads, which
//! use these steps.

use std::rc::Rc;

use pyo3::exceptions::{PyAssertionError, PyNotImplementedError};
use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use super::buffer::ReadBuffer;
use super::patched::{PROTOCOL, READER};
use crate::cell::NativeCell;
use crate::python;
use crate::transport::stream::ReadSink;

/// asyncio's `_DEFAULT_LIMIT`.
pub(super) const DEFAULT_LIMIT: isize = 64 * 1024;

pub(crate) struct ReaderState {
    /// asyncio's `_buffer` (see buffer.rs).
    pub(super) buffer: ReadBuffer,
    pub(super) limit: isize,
    pub(super) eof: bool,
    /// The future a read waits on (asyncio's `_waiter`).
    pub(super) waiter: Option<Py<PyAny>>,
    pub(super) exception: Option<Py<PyAny>>,
    pub(super) transport: Option<Py<PyAny>>,
    /// Reading was paused by this reader (over twice the limit).
    pub(super) paused: bool,
    pub(super) loop_obj: Option<Py<PyAny>>,
    /// The op (a `StreamRead` of ops.rs) of the last read, made again for
    /// the next read if nothing else holds it by then (reads in a loop
    /// allocate no op).
    pub(super) spare: Option<Py<PyAny>>,
    /// The waiters of the last reads, renewed for later ones when nothing
    /// else holds them by then (ops.rs `renewed_waiter`).
    pub(super) spent: SpentWaiters,
}

/// How many past waiters a reader keeps: at a wait, the last one is still
/// held by the handle that woke the task (see ops.rs), so two.
pub(super) const SPENT_WAITERS: usize = 2;

/// A reader's past waiters, replaced in turn.
#[derive(Default)]
pub(crate) struct SpentWaiters {
    slots: [Option<Py<PyAny>>; SPENT_WAITERS],
    next: usize,
}

impl SpentWaiters {
    pub(super) fn get(&self, py: Python<'_>, slot: usize) -> Option<Py<PyAny>> {
        self.slots[slot].as_ref().map(|f| f.clone_ref(py))
    }

    /// Keeps a newly made waiter in place of the oldest one, which is
    /// returned (for the caller to drop outside the reader's state: freeing
    /// a future can run Python code).
    pub(super) fn keep(&mut self, future: &Bound<'_, PyAny>) -> Option<Py<PyAny>> {
        let old = self.slots[self.next].replace(future.clone().unbind());
        self.next = (self.next + 1) % SPENT_WAITERS;
        old
    }

    /// Lets go of `future` if it is kept (a waiter that ended otherwise
    /// than with its result is not renewed, so that what it holds, such as
    /// a cancelled task's exception, lives no longer than under asyncio);
    /// returned for the caller to drop, as `keep`'s.
    pub(super) fn forget(&mut self, future: &Bound<'_, PyAny>) -> Option<Py<PyAny>> {
        let slot = self.slots.iter_mut().find(|f| f.as_ref().is_some_and(|f| f.is(future)))?;
        slot.take()
    }

    pub(super) fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.slots.iter().try_for_each(|f| visit.call(f))
    }

    pub(super) fn take(&mut self) -> [Option<Py<PyAny>>; SPENT_WAITERS] {
        std::mem::take(&mut self.slots)
    }
}

impl ReaderState {
    pub(super) fn len(&self, py: Python<'_>) -> usize {
        self.buffer.len(py)
    }
}

#[pyclass(module = "zuvrs._zuvrs", name = "StreamReaderCore", subclass, frozen)]
pub(crate) struct ReaderCore {
    pub(super) state: NativeCell<ReaderState>,
}

impl ReaderCore {
    /// `feed_data`'s first step: the bytes appended (asyncio asserts that
    /// no data follows EOF). Runs no Python code.
    pub(super) fn append(&self, py: Python<'_>, data: &[u8]) -> PyResult<()> {
        self.state.with(py, |st| {
            if st.eof {
                return Err(PyAssertionError::new_err("feed_data after feed_eof"));
            }
            st.buffer.append(py, data)
        })
    }

    /// `feed_data`'s last steps: the waiting read woken, and reading paused
    /// once over twice the limit.
    pub(super) fn after_feed(&self, py: Python<'_>) -> PyResult<()> {
        self.wakeup_waiter(py)?;
        let transport = self.state.with(py, |st| {
            if st.paused || st.len(py) as isize <= st.limit.saturating_mul(2) {
                return None;
            }
            st.transport.as_ref().map(|t| t.clone_ref(py))
        });
        let Some(transport) = transport else { return Ok(()) };
        match python::call_method0(transport.bind(py), python::streams::pause_reading(py)) {
            Ok(_) => self.state.with(py, |st| st.paused = true),
            Err(err) if err.is_instance_of::<PyNotImplementedError>(py) => {
                // The transport cannot pause: buffer everything, and stop asking.
                let old = self.state.with(py, |st| st.transport.take());
                drop(old);
            }
            Err(err) => return Err(err),
        }
        Ok(())
    }

    /// asyncio's `_wakeup_waiter`.
    pub(super) fn wakeup_waiter(&self, py: Python<'_>) -> PyResult<()> {
        let Some(waiter) = self.state.with(py, |st| st.waiter.take()) else { return Ok(()) };
        let waiter = &waiter.into_bound(py);
        if !python::future_call0(waiter, python::FutureMethod::Cancelled)?.is_truthy()? {
            python::future_call1(waiter, python::FutureMethod::SetResult, pyo3::types::PyNone::get(py).as_any())?;
        }
        Ok(())
    }

    /// asyncio's `_maybe_resume_transport`: reading resumes once the buffer
    /// is down to the limit.
    pub(super) fn maybe_resume_transport(&self, py: Python<'_>) -> PyResult<()> {
        let transport = self.state.with(py, |st| {
            if !st.paused || st.len(py) as isize > st.limit {
                return None;
            }
            st.paused = false;
            Some(st.transport.as_ref().map(|t| t.clone_ref(py)))
        });
        match transport {
            None => Ok(()),
            Some(t) => resume_reading(py, t),
        }
    }
}

/// `transport.resume_reading()` (asyncio calls it on whatever `_transport`
/// is, None included).
pub(super) fn resume_reading(py: Python<'_>, transport: Option<Py<PyAny>>) -> PyResult<()> {
    let transport = transport.unwrap_or_else(|| py.None());
    python::call_method0(transport.bind(py), python::streams::resume_reading(py))?;
    Ok(())
}

/// The reader as the sink of its protocol's reads (sink.rs in
/// transport/stream): a read is appended as `feed_data` would.
struct ReaderSink(Py<ReaderCore>);

impl ReadSink for ReaderSink {
    fn serves(&self, py: Python<'_>) -> bool {
        sink_serves(py)
    }

    fn take(&self, py: Python<'_>, data: &[u8]) -> PyResult<()> {
        self.0.get().append(py, data)
    }

    fn taken(&self, py: Python<'_>) -> PyResult<()> {
        self.0.get().after_feed(py)
    }

    fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.0)
    }
}

/// Whether a sink can stand in for a native protocol's `data_received`
/// feeding its native reader's `feed_data`: neither patched on asyncio's
/// class (patched.rs).
pub(super) fn sink_serves(py: Python<'_>) -> bool {
    PROTOCOL.is_own(py, "data_received") && READER.is_own(py, "feed_data")
}

/// `reader` as the sink of a transport's reads.
pub(super) fn sink(reader: Py<ReaderCore>) -> Rc<dyn ReadSink> {
    Rc::new(ReaderSink(reader))
}
