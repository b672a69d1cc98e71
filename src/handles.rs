//! `Handle` and `TimerHandle`: a scheduled callback and how it is called.
//!
//! A handle keeps its callback, up to three arguments inline, and the context
//! to run in. Handles are not tracked by the cyclic GC (see
//! `untrack`): to keep that sound a one-shot handle drops every reference it
//! holds as soon as it has run or is cancelled, and the loop cancels whatever it
//! still queues when it closes, so no reference cycle can live through one.

use std::cell::{Cell, UnsafeCell};
use std::ptr::{self, NonNull};
use std::rc::Rc;

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use smallvec::SmallVec;

use crate::context;

/// Positional arguments of a callback; up to three stay inline, which keeps a
/// handle in CPython's 96-byte allocation class.
pub(crate) type ArgVec = SmallVec<[*mut ffi::PyObject; 3]>;

/// The owned references of a pending call. Dropped only with the GIL held
/// (handles live and die under the GIL).
pub(crate) struct Callback {
    func: NonNull<ffi::PyObject>,
    args: ArgVec,
    context: *mut ffi::PyObject,
    /// The context is a loop snapshot other handles may share (see `context`).
    shared_context: bool,
}

// SAFETY: the references are only touched while holding the GIL.
unsafe impl Send for Callback {}

impl Callback {
    /// Takes new references to `func` and `args`, and owns the reference to
    /// `context` passed in.
    ///
    /// # Safety
    /// GIL held; `args` points at `nargs` valid objects; `context` is a
    /// `contextvars.Context` (the caller makes sure of that).
    #[inline]
    pub(crate) unsafe fn new(
        func: *mut ffi::PyObject,
        args: *const *mut ffi::PyObject,
        nargs: usize,
        context: *mut ffi::PyObject,
        shared_context: bool,
    ) -> Callback {
        unsafe {
            let mut v = ArgVec::with_capacity(nargs);
            for i in 0..nargs {
                let a = *args.add(i);
                ffi::Py_INCREF(a);
                v.push(a);
            }
            ffi::Py_INCREF(func);
            Callback { func: NonNull::new_unchecked(func), args: v, context, shared_context }
        }
    }

    /// A second owner of the same references (for handles that run many times).
    #[inline]
    fn clone_refs(&self) -> Callback {
        unsafe {
            ffi::Py_INCREF(self.func.as_ptr());
            ffi::Py_INCREF(self.context);
            for &a in &self.args {
                ffi::Py_INCREF(a);
            }
        }
        Callback { func: self.func, args: self.args.clone(), context: self.context, shared_context: self.shared_context }
    }

    #[inline]
    pub(crate) fn func(&self) -> *mut ffi::PyObject {
        self.func.as_ptr()
    }

    /// The positional arguments as a new tuple (for repr and error reports).
    pub(crate) fn args_tuple<'py>(&self, py: Python<'py>) -> Bound<'py, PyTuple> {
        let items = self.args.iter().map(|&a| unsafe { Bound::from_borrowed_ptr(py, a) });
        PyTuple::new(py, items).expect("tuple of borrowed objects")
    }

    /// Runs the callback inside its context. Returns false if it raised (the
    /// exception is left set).
    ///
    /// # Safety
    /// GIL held.
    #[inline]
    pub(crate) unsafe fn call(&self) -> bool {
        unsafe {
            let (ctx, owned) = context::for_run(self.context, self.shared_context);
            if ctx.is_null() {
                return false;
            }
            let ok = Self::call_in(ctx, self.func.as_ptr(), &self.args);
            if owned {
                ffi::Py_DECREF(ctx);
            }
            ok
        }
    }

    #[inline]
    unsafe fn call_in(ctx: *mut ffi::PyObject, func: *mut ffi::PyObject, args: &ArgVec) -> bool {
        unsafe {
            if ffi::PyContext_Enter(ctx) < 0 {
                return false;
            }
            let res = ffi::PyObject_Vectorcall(func, args.as_ptr(), args.len(), ptr::null_mut());
            let exited = ffi::PyContext_Exit(ctx) == 0;
            if res.is_null() {
                return false;
            }
            ffi::Py_DECREF(res);
            exited
        }
    }

    /// The context to show to Python code: a shared snapshot is first
    /// replaced by a private copy, so what the caller does with it affects
    /// this handle only.
    fn private_context(&mut self) -> *mut ffi::PyObject {
        unsafe {
            if self.shared_context && ffi::Py_REFCNT(self.context) > 1 {
                let copy = ffi::PyContext_Copy(self.context);
                if !copy.is_null() {
                    let old = std::mem::replace(&mut self.context, copy);
                    self.shared_context = false;
                    ffi::Py_DECREF(old);
                }
            }
            self.context
        }
    }
}

impl Drop for Callback {
    fn drop(&mut self) {
        // SAFETY: callbacks are dropped with the GIL held (see type docs).
        unsafe {
            ffi::Py_DECREF(self.func.as_ptr());
            ffi::Py_DECREF(self.context);
            for &a in &self.args {
                ffi::Py_DECREF(a);
            }
        }
    }
}

/// What a handle needs besides its identity: the pending call and its state.
pub(crate) struct HandleCore {
    callback: Option<Callback>,
    cancelled: bool,
    /// Reader, writer and signal handles run every time their event fires and
    /// keep their callback until cancelled.
    repeat: bool,
}

impl HandleCore {
    fn new(cb: Callback, repeat: bool) -> Self {
        HandleCore { callback: Some(cb), cancelled: false, repeat }
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

    /// After a run with `keep`: a one-shot handle lets go of its references
    /// (returned, to drop outside any borrow).
    pub(crate) fn finish_run(&mut self) -> Option<Callback> {
        if self.repeat {
            None
        } else {
            self.callback.take()
        }
    }

    /// Marks cancelled and returns the references to drop (outside any borrow).
    fn cancel(&mut self) -> Option<Callback> {
        self.cancelled = true;
        self.callback.take()
    }
}

/// Gives `&mut HandleCore` access to a handle under the GIL.
pub(crate) trait HasCore {
    fn core_cell(&self) -> &UnsafeCell<HandleCore>;

    /// # Safety
    /// GIL held, and the reference must not live across a call into Python.
    #[allow(clippy::mut_from_ref)]
    #[inline]
    unsafe fn core(&self) -> &mut HandleCore {
        unsafe { &mut *self.core_cell().get() }
    }
}

fn repr_of(py: Python<'_>, kind: &str, when: Option<f64>, core: &HandleCore) -> PyResult<String> {
    let mut parts = vec![kind.to_string()];
    if core.cancelled {
        parts.push("cancelled".into());
    }
    if let Some(w) = when {
        parts.push(format!("when={}", py_float_repr(py, w)?));
    }
    if let Some(cb) = &core.callback {
        let helpers = py.import("asyncio.format_helpers")?;
        let func = unsafe { Bound::from_borrowed_ptr(py, cb.func()) };
        let src = helpers.call_method1("_format_callback_source", (func, cb.args_tuple(py)))?;
        parts.push(src.extract()?);
    }
    Ok(format!("<{}>", parts.join(" ")))
}

fn py_float_repr(py: Python<'_>, v: f64) -> PyResult<String> {
    Ok(pyo3::types::PyFloat::new(py, v).repr()?.to_string())
}

/// Removes a freshly created handle from the cyclic GC (see module docs).
#[inline]
fn untrack<T>(obj: &Bound<'_, T>) {
    // SAFETY: the object was just created and is fully initialised.
    unsafe { ffi::PyObject_GC_UnTrack(obj.as_ptr() as *mut _) }
}

/// A callback scheduled with `call_soon`, or a reader/writer/signal callback.
#[pyclass(module = "zuvrs", name = "Handle", frozen, freelist = 8192)]
pub struct Handle {
    core: UnsafeCell<HandleCore>,
}

// SAFETY: all access to `core` happens with the GIL held (zuvrs does not
// declare support for free-threaded builds).
unsafe impl Sync for Handle {}

impl HasCore for Handle {
    #[inline]
    fn core_cell(&self) -> &UnsafeCell<HandleCore> {
        &self.core
    }
}

impl Handle {
    #[inline]
    pub(crate) fn create(py: Python<'_>, cb: Callback, repeat: bool) -> PyResult<Bound<'_, Handle>> {
        let h = Bound::new(py, Handle { core: UnsafeCell::new(HandleCore::new(cb, repeat)) })?;
        untrack(&h);
        Ok(h)
    }

    /// Cancels from Rust (loop close, remove_reader).
    pub(crate) fn cancel_now(&self) {
        // SAFETY: GIL held by every caller; the references are dropped after
        // the borrow ends.
        let dropped = unsafe { self.core().cancel() };
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
    fn cancel(&self) {
        self.cancel_now();
    }

    fn cancelled(&self) -> bool {
        unsafe { self.core().cancelled }
    }

    /// The context the callback runs in (None once it has run or was cancelled).
    fn get_context(&self, py: Python<'_>) -> Py<PyAny> {
        match unsafe { &mut self.core().callback } {
            Some(cb) => unsafe { Bound::from_borrowed_ptr(py, cb.private_context()).unbind() },
            None => py.None(),
        }
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        repr_of(py, "Handle", None, unsafe { self.core() })
    }
}

/// Count of cancelled timers still sitting in a loop's heap, shared between the
/// loop and its timer handles so the heap knows when to compact.
pub(crate) struct TimerBook {
    pub(crate) cancelled_in_heap: Cell<usize>,
}

/// `Rc<TimerBook>` that may sit in a pyclass.
pub(crate) struct SharedBook(pub(crate) Rc<TimerBook>);
// SAFETY: only touched with the GIL held.
unsafe impl Send for SharedBook {}
unsafe impl Sync for SharedBook {}

/// A callback scheduled with `call_later` / `call_at`.
#[pyclass(module = "zuvrs", name = "TimerHandle", frozen, freelist = 8192)]
pub struct TimerHandle {
    core: UnsafeCell<HandleCore>,
    when: f64,
    /// True while the handle sits in the loop's timer heap.
    scheduled: Cell<bool>,
    book: SharedBook,
}

// SAFETY: GIL-protected, as for Handle.
unsafe impl Sync for TimerHandle {}

impl HasCore for TimerHandle {
    #[inline]
    fn core_cell(&self) -> &UnsafeCell<HandleCore> {
        &self.core
    }
}

impl TimerHandle {
    #[inline]
    pub(crate) fn create<'py>(
        py: Python<'py>,
        when: f64,
        cb: Callback,
        book: &Rc<TimerBook>,
    ) -> PyResult<Bound<'py, TimerHandle>> {
        let h = Bound::new(
            py,
            TimerHandle {
                core: UnsafeCell::new(HandleCore::new(cb, false)),
                when,
                scheduled: Cell::new(true),
                book: SharedBook(book.clone()),
            },
        )?;
        untrack(&h);
        Ok(h)
    }

    #[inline]
    pub(crate) fn is_cancelled(&self) -> bool {
        unsafe { self.core().cancelled }
    }

    /// Called by the heap when the handle leaves it.
    #[inline]
    pub(crate) fn unschedule(&self) {
        self.scheduled.set(false);
    }

    pub(crate) fn cancel_now(&self) {
        let dropped = unsafe {
            let core = self.core();
            if !core.cancelled && self.scheduled.get() {
                let c = &self.book.0.cancelled_in_heap;
                c.set(c.get() + 1);
            }
            core.cancel()
        };
        drop(dropped);
    }
}

#[pymethods]
impl TimerHandle {
    #[new]
    fn py_new() -> PyResult<Self> {
        Err(PyTypeError::new_err("zuvrs.TimerHandle cannot be created directly; use loop.call_later()"))
    }

    fn cancel(&self) {
        self.cancel_now();
    }

    fn cancelled(&self) -> bool {
        self.is_cancelled()
    }

    /// The absolute time (in `loop.time()` terms) the callback is due.
    fn when(&self) -> f64 {
        self.when
    }

    fn get_context(&self, py: Python<'_>) -> Py<PyAny> {
        match unsafe { &mut self.core().callback } {
            Some(cb) => unsafe { Bound::from_borrowed_ptr(py, cb.private_context()).unbind() },
            None => py.None(),
        }
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
        repr_of(py, "TimerHandle", Some(self.when), unsafe { self.core() })
    }
}

/// A queued handle of either kind.
pub(crate) enum Ready {
    Soon(Py<Handle>),
    Timer(Py<TimerHandle>),
}

impl Ready {
    /// # Safety
    /// GIL held; the reference must not live across a call into Python.
    #[inline]
    pub(crate) unsafe fn core(&self) -> &mut HandleCore {
        unsafe {
            match self {
                Ready::Soon(h) => h.get().core(),
                Ready::Timer(h) => h.get().core(),
            }
        }
    }

    #[inline]
    pub(crate) fn as_ptr(&self) -> *mut ffi::PyObject {
        match self {
            Ready::Soon(h) => h.as_ptr(),
            Ready::Timer(h) => h.as_ptr(),
        }
    }

    pub(crate) fn cancel(&self) {
        match self {
            Ready::Soon(h) => h.get().cancel_now(),
            Ready::Timer(h) => h.get().cancel_now(),
        }
    }
}

// A handle must stay within CPython's 96-byte allocation class (with the GC
// header pyo3 gives every class): see the memory target in the README.
const _: () = assert!(std::mem::size_of::<HandleCore>() <= 64);
