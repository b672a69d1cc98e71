//! `Handle` and `TimerHandle`: a scheduled callback and how it is called.
//!
//! A handle keeps its callback, its arguments in one word (`callback::Args`)
//! and the context to run in, in 64 bytes; its objects come from its class's
//! `HandlePool` (pool.rs). While a loop queues a handle the handle is not
//! tracked by the cyclic GC: the loop reports its references instead
//! (LoopCore's `__traverse__`), so a million pending callbacks cost the GC
//! nothing. A one-shot handle drops its callback as soon as it has run; when
//! the loop lets go of a handle that somebody else still holds, the handle
//! is tracked again (`let_go`) and reports its context itself.
//!
//! - callback.rs: the pending call (function and arguments)
//! - state.rs: a handle's state, in a `NativeCell`
//! - context.rs: the contexts callbacks run in, shared while unchanged
//! - pool.rs: where handle objects come from and go to

mod callback;
pub(crate) mod context;
mod pool;
mod state;

use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

pub(crate) use crate::capi::handles::let_go;
use crate::cell::NativeCell;
use crate::python;
pub(crate) use callback::Callback;
pub(crate) use context::run_in_context;
use pool::{HandlePool, Pooled, HANDLE_POOL_CAP, TIMER_HANDLE_POOL_CAP};
pub(crate) use state::HandleState;

/// The state of a handle of either class.
pub(crate) trait HasState {
    fn state_cell(&self) -> &NativeCell<HandleState>;

    /// Runs `f` on the handle's state (see `NativeCell::with`).
    #[inline(always)]
    fn with_state<R>(&self, py: Python<'_>, f: impl FnOnce(&mut HandleState) -> R) -> R {
        self.state_cell().with(py, f)
    }

    /// Records where the handle was created (debug mode).
    fn set_source_traceback(&self, py: Python<'_>, tb: Py<PyAny>) {
        self.with_state(py, |c| c.set_source_traceback(py, tb))
    }
}

/// asyncio's repr of a handle: `<Handle cancelled when=... cb(args) created at file:line>`.
fn repr_of(py: Python<'_>, kind: &str, when: Option<Py<PyAny>>, cell: &NativeCell<HandleState>) -> PyResult<String> {
    // Copied out first: formatting the callback runs Python code.
    let (cancelled, traced, callback, traceback) = cell
        .with(py, |c| (c.cancelled, c.traced, c.callback.as_ref().map(Callback::clone_refs), c.source_traceback(py)));
    let mut parts = vec![kind.to_string()];
    if cancelled {
        parts.push("cancelled".into());
    }
    if let Some(w) = when {
        parts.push(format!("when={}", w.bind(py).repr()?));
    }
    if let Some(cb) = &callback {
        let helpers = python::format_helpers(py)?;
        let func = cb.function().bind(py);
        // 3.13+ shows the arguments only in debug mode (gh-112997). asyncio
        // asks the handle's loop; a zuvrs handle has no loop reference, but
        // it records a source traceback exactly when created in debug mode.
        #[cfg(Py_3_13)]
        let src = {
            let kwargs = pyo3::types::PyDict::new(py);
            kwargs.set_item("debug", traced)?;
            crate::cell::check_crossing();
            helpers.call_method("_format_callback_source", (func, cb.args_tuple(py)), Some(&kwargs))?
        };
        #[cfg(not(Py_3_13))]
        let src = {
            let _ = traced;
            python::call_method(helpers, pyo3::intern!(py, "_format_callback_source"), (func, cb.args_tuple(py)))?
        };
        parts.push(src.extract()?);
    }
    if let Some(tb) = traceback {
        let tb = tb.bind(py);
        if tb.len()? > 0 {
            let frame = tb.get_item(-1)?;
            parts.push(format!("created at {}:{}", frame.get_item(0)?, frame.get_item(1)?));
        }
    }
    Ok(format!("<{}>", parts.join(" ")))
}

/// The handle's context for Python code (a private copy when shared).
fn context_of(py: Python<'_>, cell: &NativeCell<HandleState>) -> Py<PyAny> {
    cell.with(py, |c| c.private_context(py))
}

static HANDLE_POOL: HandlePool<Handle> = HandlePool::new(HANDLE_POOL_CAP);
static TIMER_HANDLE_POOL: HandlePool<TimerHandle> = HandlePool::new(TIMER_HANDLE_POOL_CAP);

impl Pooled for Handle {
    #[inline(always)]
    fn pool() -> &'static HandlePool<Handle> {
        &HANDLE_POOL
    }
}

impl Pooled for TimerHandle {
    #[inline(always)]
    fn pool() -> &'static HandlePool<TimerHandle> {
        &TIMER_HANDLE_POOL
    }
}

/// A callback scheduled with `call_soon`, or a reader/writer/signal callback.
/// Made through `HANDLE_POOL`. Weak references work, as to asyncio's.
#[pyclass(module = "zuvrs", name = "Handle", frozen, weakref)]
pub struct Handle {
    state: NativeCell<HandleState>,
}

impl HasState for Handle {
    #[inline]
    fn state_cell(&self) -> &NativeCell<HandleState> {
        &self.state
    }
}

impl Handle {
    #[inline(always)]
    pub(crate) fn create(py: Python<'_>, state: HandleState) -> PyResult<Bound<'_, Handle>> {
        HANDLE_POOL.create(py, Handle { state: NativeCell::new(state) })
    }

    /// Cancels from Rust (loop close, remove_reader).
    pub(crate) fn cancel_now(&self, py: Python<'_>) {
        // The references are dropped after the borrow ends.
        let dropped = self.state.with(py, |c| c.cancel());
        drop(dropped);
    }
}

#[pymethods]
impl Handle {
    #[new]
    fn py_new() -> PyResult<Self> {
        Err(PyTypeError::new_err("zuvrs.Handle cannot be created directly; use loop.call_soon()"))
    }

    /// Cancels the call; a no-op if it already ran or was cancelled.
    fn cancel(&self, py: Python<'_>) {
        self.cancel_now(py);
    }

    fn cancelled(&self, py: Python<'_>) -> bool {
        self.state.with(py, |c| c.cancelled)
    }

    /// The context the callback runs in.
    fn get_context(&self, py: Python<'_>) -> Py<PyAny> {
        context_of(py, &self.state)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.state.traverse(&visit, |c| c.visit(&visit))
    }

    /// Where the handle was created, in debug mode (else None).
    #[getter]
    fn _source_traceback(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.state.with(py, |c| c.source_traceback(py))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        repr_of(py, "Handle", None, &self.state)
    }
}

/// Count of cancelled timers still sitting in a loop's heap, shared between the
/// loop and its timer handles so the heap knows when to compact; and how many
/// timers were cancelled before they ran (the loop's stats).
pub(crate) struct TimerBook {
    pub(crate) cancelled_in_heap: Cell<usize>,
    pub(crate) cancelled_total: Cell<u64>,
}

/// A callback scheduled with `call_later` / `call_at`.
/// Made through `TIMER_HANDLE_POOL`.
#[pyclass(module = "zuvrs", name = "TimerHandle", frozen, weakref)]
pub struct TimerHandle {
    state: NativeCell<HandleState>,
    when: f64,
    /// call_at was given an int: when() gives one back (asyncio keeps the
    /// object it was given; aiohttp's timeouts pass whole seconds).
    when_is_int: bool,
    /// True while the handle sits in the loop's timer heap. (Only touched
    /// with the GIL held; an atomic, relaxed, costs a plain load and store
    /// and keeps the class `Sync` without a promise.)
    scheduled: AtomicBool,
    /// The loop's book, shared with its timer heap (an `Rc`, so only
    /// touched through the cell, with the GIL).
    book: NativeCell<Rc<TimerBook>>,
}

impl HasState for TimerHandle {
    #[inline]
    fn state_cell(&self) -> &NativeCell<HandleState> {
        &self.state
    }
}

impl TimerHandle {
    #[inline]
    pub(crate) fn create<'py>(
        py: Python<'py>,
        when: f64,
        when_is_int: bool,
        state: HandleState,
        book: &Rc<TimerBook>,
    ) -> PyResult<Bound<'py, TimerHandle>> {
        TIMER_HANDLE_POOL.create(
            py,
            TimerHandle {
                state: NativeCell::new(state),
                when,
                when_is_int,
                scheduled: AtomicBool::new(true),
                book: NativeCell::new(book.clone()),
            },
        )
    }

    #[inline]
    pub(crate) fn is_cancelled(&self, py: Python<'_>) -> bool {
        self.state.with(py, |c| c.cancelled)
    }

    /// The deadline as a float, or as an int when call_at was given one.
    fn when_object(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        if self.when_is_int {
            return crate::capi::handles::int_of_float(py, self.when);
        }
        Ok(pyo3::types::PyFloat::new(py, self.when).into_any().unbind())
    }

    /// Called by the heap when the handle leaves it.
    #[inline]
    pub(crate) fn unschedule(&self) {
        self.scheduled.store(false, Ordering::Relaxed);
    }

    pub(crate) fn cancel_now(&self, py: Python<'_>) {
        let dropped = self.state.with(py, |c| {
            if !c.cancelled {
                let heap = self.scheduled.load(Ordering::Relaxed);
                let pending = c.callback.is_some();
                self.book.with(py, |book| {
                    if heap {
                        book.cancelled_in_heap.set(book.cancelled_in_heap.get() + 1);
                    }
                    if pending {
                        book.cancelled_total.set(book.cancelled_total.get() + 1);
                    }
                });
            }
            c.cancel()
        });
        drop(dropped);
    }

    /// The deadline, in loop time.
    #[inline]
    pub(crate) fn deadline(&self) -> f64 {
        self.when
    }
}

#[pymethods]
impl TimerHandle {
    #[new]
    fn py_new() -> PyResult<Self> {
        Err(PyTypeError::new_err("zuvrs.TimerHandle cannot be created directly; use loop.call_later()"))
    }

    fn cancel(&self, py: Python<'_>) {
        self.cancel_now(py);
    }

    fn cancelled(&self, py: Python<'_>) -> bool {
        self.is_cancelled(py)
    }

    /// The absolute time (in `loop.time()` terms) the callback is due.
    fn when(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.when_object(py)
    }

    /// asyncio's attribute for `when()`, which code such as aiohttp's
    /// timeout helpers reads.
    #[getter]
    fn _when(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.when_object(py)
    }

    /// The context the callback runs in.
    fn get_context(&self, py: Python<'_>) -> Py<PyAny> {
        context_of(py, &self.state)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.state.traverse(&visit, |c| c.visit(&visit))
    }

    /// Where the handle was created, in debug mode (else None).
    #[getter]
    fn _source_traceback(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.state.with(py, |c| c.source_traceback(py))
    }

    fn __hash__(&self) -> u64 {
        // Same rule as asyncio: timer handles hash by deadline.
        self.when.to_bits()
    }

    fn __richcmp__(&self, other: &Bound<'_, PyAny>, op: pyo3::basic::CompareOp) -> Py<PyAny> {
        let py = other.py();
        let Ok(other) = other.cast::<TimerHandle>() else {
            return py.NotImplemented();
        };
        let o = other.get();
        use pyo3::basic::CompareOp::*;
        let r = match op {
            Lt => self.when < o.when,
            Le => self.when <= o.when || std::ptr::eq(self, o),
            Gt => self.when > o.when,
            Ge => self.when >= o.when || std::ptr::eq(self, o),
            Eq => std::ptr::eq(self, o),
            Ne => !std::ptr::eq(self, o),
        };
        r.into_pyobject(py).expect("bool").to_owned().into_any().unbind()
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        repr_of(py, "TimerHandle", Some(self.when_object(py)?), &self.state)
    }
}

/// A queued handle of either kind.
pub(crate) enum Ready {
    Soon(Py<Handle>),
    Timer(Py<TimerHandle>),
}

impl Ready {
    /// Runs `f` on the handle's state (see `NativeCell::with`).
    #[inline(always)]
    pub(crate) fn with_state<R>(&self, py: Python<'_>, f: impl FnOnce(&mut HandleState) -> R) -> R {
        match self {
            Ready::Soon(h) => h.get().with_state(py, f),
            Ready::Timer(h) => h.get().with_state(py, f),
        }
    }

    #[inline]
    pub(crate) fn as_ptr(&self) -> *mut pyo3::ffi::PyObject {
        match self {
            Ready::Soon(h) => h.as_ptr(),
            Ready::Timer(h) => h.as_ptr(),
        }
    }

    pub(crate) fn cancel(&self, py: Python<'_>) {
        match self {
            Ready::Soon(h) => h.get().cancel_now(py),
            Ready::Timer(h) => h.get().cancel_now(py),
        }
    }

    /// Lets go of the handle (see `let_go`).
    #[inline]
    pub(crate) fn let_go(self) {
        match self {
            Ready::Soon(h) => let_go(h),
            Ready::Timer(h) => let_go(h),
        }
    }
}

// A Handle must stay within CPython's 64-byte allocation class (with the
// object and GC headers, 32 bytes): see `callback::Args` and the memory
// target in docs/performance.md. (Debug builds add a borrow flag to the cell.)
#[cfg(not(debug_assertions))]
const _: () = assert!(std::mem::size_of::<NativeCell<HandleState>>() <= 32);
