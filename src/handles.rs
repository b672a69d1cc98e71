//! `Handle` and `TimerHandle`: a scheduled callback and how it is called.
//!
//! A handle keeps its callback, its arguments in one word (see `Args`), and
//! the context to run in, in 64 bytes; freed handles are kept for reuse by
//! their class's `HandlePool`. While a loop queues a handle the handle is
//! not tracked by the cyclic GC: the loop reports its references instead
//! (LoopCore's `__traverse__`), so a million pending callbacks cost the GC
//! nothing. A one-shot handle drops its callback as soon as it has run; when
//! the loop lets go of a handle that somebody else still holds, the handle
//! is tracked again (`release_handle`) and reports its context itself.

use std::cell::{Cell, UnsafeCell};
use std::collections::HashMap;
use std::ptr::{self, NonNull};
use std::rc::Rc;
use std::sync::{Mutex, OnceLock};

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use pyo3::PyClass;
use pyo3::{PyTraverseError, PyVisit};
use smallvec::SmallVec;

use crate::context;

/// Positional arguments of a callback in one word, so that a handle fits
/// CPython's 64-byte allocation class (one cache line, which matters when a
/// handle made by one thread is run by another): no argument, the single
/// argument inline (the common cases: task steps and future callbacks), or
/// a tagged pointer to a heap list for two or more.
pub(crate) struct Args(usize);

/// Two or more arguments.
type ArgList = SmallVec<[*mut ffi::PyObject; 4]>;

/// Set on `Args` words that point at an `ArgList` (object and box pointers are
/// at least 8-byte aligned, so bit 0 is free).
const HEAP_ARGS: usize = 1;

impl Args {
    /// Borrows (does not take) the `nargs` pointers at `args`.
    #[inline(always)]
    unsafe fn from_raw(args: *const *mut ffi::PyObject, nargs: usize) -> Args {
        unsafe {
            match nargs {
                0 => Args(0),
                1 => Args(*args as usize),
                _ => {
                    let list: Box<ArgList> =
                        Box::new(std::slice::from_raw_parts(args, nargs).iter().copied().collect());
                    Args(Box::into_raw(list) as usize | HEAP_ARGS)
                }
            }
        }
    }

    #[inline(always)]
    fn as_slice(&self) -> &[*mut ffi::PyObject] {
        if self.0 == 0 {
            &[]
        } else if self.0 & HEAP_ARGS == 0 {
            // SAFETY: the word is the one argument's pointer.
            std::slice::from_ref(unsafe { &*(&self.0 as *const usize as *const *mut ffi::PyObject) })
        } else {
            // SAFETY: a tagged pointer from Box::into_raw, owned by self.
            unsafe { (*((self.0 & !HEAP_ARGS) as *const ArgList)).as_slice() }
        }
    }
}

impl Drop for Args {
    fn drop(&mut self) {
        if self.0 & HEAP_ARGS != 0 {
            // SAFETY: made by Box::into_raw in from_raw; dropped once.
            drop(unsafe { Box::from_raw((self.0 & !HEAP_ARGS) as *mut ArgList) });
        }
    }
}

/// The owned references of a pending call: the function and its arguments.
/// Dropped only with the GIL held (handles live and die under the GIL).
pub(crate) struct Callback {
    func: NonNull<ffi::PyObject>,
    args: Args,
}

// SAFETY: the references are only touched while holding the GIL.
unsafe impl Send for Callback {}

impl Callback {
    /// Takes new references to `func` and the `nargs` objects at `args`.
    ///
    /// # Safety
    /// GIL held; `func` is valid and `args` points at `nargs` valid objects.
    #[inline(always)]
    pub(crate) unsafe fn new(func: *mut ffi::PyObject, args: *const *mut ffi::PyObject, nargs: usize) -> Callback {
        unsafe {
            for i in 0..nargs {
                ffi::Py_INCREF(*args.add(i));
            }
            ffi::Py_INCREF(func);
            Callback { func: NonNull::new_unchecked(func), args: Args::from_raw(args, nargs) }
        }
    }

    /// A second owner of the same references (for handles that run many times).
    #[inline]
    fn clone_refs(&self) -> Callback {
        let args = self.args.as_slice();
        unsafe {
            ffi::Py_INCREF(self.func.as_ptr());
            for &a in args {
                ffi::Py_INCREF(a);
            }
            Callback { func: self.func, args: Args::from_raw(args.as_ptr(), args.len()) }
        }
    }

    #[inline]
    pub(crate) fn func(&self) -> *mut ffi::PyObject {
        self.func.as_ptr()
    }

    /// The positional arguments as a new tuple (for repr and error reports).
    pub(crate) fn args_tuple<'py>(&self, py: Python<'py>) -> Bound<'py, PyTuple> {
        let items = self.args.as_slice().iter().map(|&a| unsafe { Bound::from_borrowed_ptr(py, a) });
        PyTuple::new(py, items).expect("tuple of borrowed objects")
    }

    /// Calls the function inside `ctx`. Returns false if it raised (the
    /// exception is left set).
    ///
    /// # Safety
    /// GIL held; `ctx` is a live context.
    #[inline]
    pub(crate) unsafe fn call_in(&self, ctx: *mut ffi::PyObject) -> bool {
        unsafe {
            if ffi::PyContext_Enter(ctx) < 0 {
                return false;
            }
            let args = self.args.as_slice();
            let res = ffi::PyObject_Vectorcall(self.func.as_ptr(), args.as_ptr(), args.len(), ptr::null_mut());
            let exited = ffi::PyContext_Exit(ctx) == 0;
            if res.is_null() {
                return false;
            }
            ffi::Py_DECREF(res);
            exited
        }
    }

    fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(as_py(&self.func.as_ptr()))?;
        for a in self.args.as_slice() {
            visit.call(as_py(a))?;
        }
        Ok(())
    }
}

impl Drop for Callback {
    fn drop(&mut self) {
        // SAFETY: callbacks are dropped with the GIL held (see type docs).
        unsafe {
            ffi::Py_DECREF(self.func.as_ptr());
            for &a in self.args.as_slice() {
                ffi::Py_DECREF(a);
            }
        }
    }
}

/// Views an object pointer as `&Py<PyAny>` for `PyVisit`.
#[inline]
fn as_py(p: &*mut ffi::PyObject) -> &Py<PyAny> {
    // SAFETY: Py<T> has the layout of a non-null object pointer, and every
    // pointer passed here is non-null.
    unsafe { &*(p as *const *mut ffi::PyObject as *const Py<PyAny>) }
}

/// A handle's state: the pending call, and the context it runs in (kept for
/// the handle's life, as asyncio keeps it).
pub(crate) struct HandleCore {
    /// None once a one-shot handle has run, or once cancelled.
    callback: Option<Callback>,
    context: NonNull<ffi::PyObject>,
    /// The context is a loop snapshot other handles may share (see context.rs).
    shared_context: bool,
    /// Has a source traceback in `source_tracebacks()` (debug mode only).
    traced: bool,
    cancelled: bool,
    /// Reader, writer and signal handles run every time their event fires and
    /// keep their callback until cancelled.
    repeat: bool,
}

// SAFETY: only touched while holding the GIL.
unsafe impl Send for HandleCore {}

impl HandleCore {
    /// Takes ownership of the reference to `context`.
    ///
    /// # Safety
    /// `context` is a live `contextvars.Context`.
    #[inline(always)]
    pub(crate) unsafe fn new(cb: Callback, context: *mut ffi::PyObject, shared_context: bool, repeat: bool) -> Self {
        HandleCore {
            callback: Some(cb),
            context: unsafe { NonNull::new_unchecked(context) },
            shared_context,
            traced: false,
            cancelled: false,
            repeat,
        }
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
    fn source_traceback(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        if !self.traced {
            return None;
        }
        let tb = source_tracebacks().get(&self.key()).copied()?;
        // SAFETY: the table holds a reference to this object.
        Some(unsafe { Bound::from_borrowed_ptr(py, tb as *mut ffi::PyObject) }.unbind())
    }

    #[inline]
    fn key(&self) -> usize {
        self as *const HandleCore as usize
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
    fn private_context(&mut self) -> *mut ffi::PyObject {
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
    fn cancel(&mut self) -> Option<Callback> {
        self.cancelled = true;
        self.callback.take()
    }
}

impl Drop for HandleCore {
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

/// Runs `cb` in the handle's context (see context.rs for shared snapshots).
///
/// # Safety
/// GIL held; `ctx` stays alive for the call (the caller holds the handle).
#[inline]
pub(crate) unsafe fn run_in_context(cb: &Callback, ctx: *mut ffi::PyObject, shared: bool) -> bool {
    unsafe { context::run_in(ctx, shared, |c| cb.call_in(c)) }
}

/// Lets go of a handle the loop no longer queues. Queued handles are not
/// tracked by the GC (the loop reports their references); one that somebody
/// else still holds is tracked from now on, so a cycle through its context
/// can still be collected.
#[inline]
pub(crate) fn release_handle<T>(handle: Py<T>) {
    let p = handle.into_ptr();
    // SAFETY: GIL held by every caller; the object is a live pyo3 instance
    // and this was our reference (a plain decref: Py's drop would first ask
    // pyo3 whether the thread is attached, on every callback).
    unsafe {
        if ffi::Py_REFCNT(p) > 1 && ffi::PyObject_GC_IsTracked(p) == 0 {
            ffi::PyObject_GC_Track(p as *mut _);
        }
        ffi::Py_DECREF(p);
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

    /// Records where the handle was created (debug mode).
    fn set_source_traceback(&self, tb: Py<PyAny>) {
        // SAFETY: GIL held; no other borrow of the core is live.
        unsafe { self.core().set_source_traceback(tb) }
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
        // 3.13+ shows the arguments only in debug mode (gh-112997). asyncio
        // asks the handle's loop; a zuvrs handle has no loop reference, but
        // it records a source traceback exactly when created in debug mode.
        #[cfg(Py_3_13)]
        let src = {
            let kwargs = pyo3::types::PyDict::new(py);
            kwargs.set_item("debug", core.traced)?;
            helpers.call_method("_format_callback_source", (func, cb.args_tuple(py)), Some(&kwargs))?
        };
        #[cfg(not(Py_3_13))]
        let src = helpers.call_method1("_format_callback_source", (func, cb.args_tuple(py)))?;
        parts.push(src.extract()?);
    }
    if let Some(tb) = core.source_traceback(py) {
        let tb = tb.bind(py);
        if tb.len()? > 0 {
            let frame = tb.get_item(-1)?;
            parts.push(format!("created at {}:{}", frame.get_item(0)?, frame.get_item(1)?));
        }
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

/// Freed handles of one class kept for reuse, in place of pyo3's free list
/// (whose lock and slot lookups were a tenth of `call_soon_threadsafe`'s
/// cost). Once the first object has shown a plain layout, the class's
/// `tp_dealloc` is `dealloc`, which puts objects here; `create` takes them
/// back and writes the new contents in place. Until then (or for another
/// layout) pyo3 makes and frees the objects and nothing is pooled.
/// GIL-protected: only touched from `dealloc` and `create`.
struct HandlePool {
    free: UnsafeCell<Vec<*mut ffi::PyObject>>,
    /// Where the Rust value starts in the object: 0 until the first object
    /// made by pyo3 shows it, `usize::MAX` if the layout is not the plain
    /// one this relies on.
    offset: Cell<usize>,
    /// The class's `tp_dealloc` once the layout is known (see `dealloc`).
    dealloc: unsafe extern "C" fn(*mut ffi::PyObject),
    /// Whether fresh objects are allocated here rather than by
    /// `PyObject_GC_New` (see `alloc_fresh`): set with `offset` when CPython
    /// is seen to put exactly a `PyGC_Head` before a GC object.
    own_alloc: Cell<bool>,
    /// At most this many freed objects are kept.
    cap: usize,
}

// SAFETY: accessed with the GIL held only (the module declares gil_used).
unsafe impl Sync for HandlePool {}

/// Freed `Handle`s kept (2 MiB at most): a thread feeding
/// `call_soon_threadsafe` queues tens of thousands between two GIL
/// switches, and reuse skips pymalloc and the GC's allocation count.
const HANDLE_POOL_CAP: usize = 32768;
/// Freed `TimerHandle`s kept (768 KiB at most).
const TIMER_HANDLE_POOL_CAP: usize = 8192;

impl HandlePool {
    const fn new(dealloc: unsafe extern "C" fn(*mut ffi::PyObject), cap: usize) -> Self {
        HandlePool {
            free: UnsafeCell::new(Vec::new()),
            offset: Cell::new(0),
            dealloc,
            own_alloc: Cell::new(false),
            cap,
        }
    }

    /// A new, untracked object of `T` holding `value`; pyo3 makes it
    /// (`Bound::new`) until the layout is known.
    #[inline(always)]
    fn create<'py, T>(&self, py: Python<'py>, value: T) -> PyResult<Bound<'py, T>>
    where
        T: PyClass<Frozen = pyo3::pyclass::boolean_struct::True> + Sync + Into<pyo3::PyClassInitializer<T>>,
    {
        let offset = self.offset.get();
        if offset == 0 || offset == usize::MAX {
            let obj = Bound::new(py, value)?;
            untrack(&obj);
            if offset == 0 {
                self.learn_layout::<T>(&obj);
            }
            return Ok(obj);
        }
        // SAFETY: GIL held. A pooled object is a freed, untracked `T` whose
        // contents were dropped; PyObject_Init makes it live again (refcount
        // 1, a reference to its type, which `dealloc` let go of). A fresh
        // one comes from `alloc_fresh` and goes back through `free`. The
        // layout check in learn_layout makes `offset` the place of the whole
        // Rust value.
        unsafe {
            let tp = T::type_object_raw(py);
            let obj = match (*self.free.get()).pop() {
                Some(obj) => {
                    ffi::PyObject_Init(obj, tp);
                    obj
                }
                None => self.alloc_fresh(py, tp)?,
            };
            ptr::write((obj as *mut u8).add(offset) as *mut T, value);
            Ok(Bound::from_owned_ptr(py, obj).cast_into_unchecked())
        }
    }

    /// A new, untracked, uninitialised object of the pool's class.
    ///
    /// `PyObject_GC_New` counts every GC object it makes towards the next
    /// collection, and only `PyObject_GC_Del` takes the count back. A burst
    /// of queued handles (a thread feeding `call_soon_threadsafe`, a batch of
    /// timers) made that way set off a collection every 700 handles, and a
    /// full one every 70,000, although queued handles are never tracked and
    /// no collection can find anything in them. When CPython's layout allows
    /// (`own_alloc`), the object is allocated here as `PyObject_GC_New` would,
    /// PyGC_Head zeroed (untracked), but uncounted; `free` releases it the
    /// same way. A handle that is tracked later (`release_handle`) is an
    /// ordinary GC object from then on, and is untracked again before it dies.
    ///
    /// # Safety
    /// GIL held; `tp` is the pool's class and its layout is known.
    #[inline(always)]
    unsafe fn alloc_fresh(&self, py: Python<'_>, tp: *mut ffi::PyTypeObject) -> PyResult<*mut ffi::PyObject> {
        unsafe {
            let obj = if self.own_alloc.get() {
                let size = GC_HEAD_SIZE + (*tp).tp_basicsize as usize;
                let mem = ffi::PyObject_Malloc(size) as *mut usize;
                if mem.is_null() {
                    return Err(pyo3::exceptions::PyMemoryError::new_err(()));
                }
                // PyGC_Head { _gc_next, _gc_prev } = 0: not tracked.
                mem.write(0);
                mem.add(1).write(0);
                let obj = mem.byte_add(GC_HEAD_SIZE) as *mut ffi::PyObject;
                ffi::PyObject_Init(obj, tp);
                obj
            } else {
                // Untracked and not zeroed (the value is written whole).
                ffi::PyObject_GC_New::<ffi::PyObject>(tp)
            };
            if obj.is_null() {
                return Err(PyErr::fetch(py));
            }
            Ok(obj)
        }
    }

    /// Records where pyo3 put the value, if the object is nothing but the
    /// object header and the value (no borrow flag, dict or weakref slot to
    /// initialise).
    #[cold]
    fn learn_layout<T: PyClass<Frozen = pyo3::pyclass::boolean_struct::True> + Sync>(&self, obj: &Bound<'_, T>) {
        let start = obj.as_ptr() as usize;
        let value = obj.get() as *const T as usize;
        // SAFETY: reading the size of a live type object.
        let basic = unsafe { (*ffi::Py_TYPE(obj.as_ptr())).tp_basicsize } as usize;
        let plain = value > start && value - start + std::mem::size_of::<T>() == basic;
        self.offset.set(if plain { value - start } else { usize::MAX });
        // Free-threaded builds keep GC objects in a heap of their own, where
        // the collector finds them; there only PyObject_GC_New will do.
        let gc_heap_apart = cfg!(Py_GIL_DISABLED);
        self.own_alloc.set(plain && !gc_heap_apart && gc_header_size(obj.as_any()) == Some(GC_HEAD_SIZE));
        if plain {
            // SAFETY: GIL held; our class, and `dealloc` handles every object
            // of this layout (the one pyo3 made included).
            unsafe {
                let tp = ffi::Py_TYPE(obj.as_ptr());
                (*tp).tp_dealloc = Some(self.dealloc);
                ffi::PyType_Modified(tp);
            }
        }
    }

    /// `tp_dealloc` for a plain layout: what pyo3's does (untrack, drop the
    /// value in place, free, let go of the type), without its lookups. The
    /// values hold raw references released with `ffi::Py_DECREF`: a `Py<T>`
    /// dropped here, outside pyo3's trampolines, would only be queued.
    ///
    /// # Safety
    /// GIL held; `obj` is an object of `T` whose refcount reached zero.
    #[inline(always)]
    unsafe fn dealloc<T>(&self, obj: *mut ffi::PyObject) {
        unsafe {
            // Untracked before the value's destructor can run Python code
            // (a handle released while still referenced is tracked again).
            if ffi::PyObject_GC_IsTracked(obj) != 0 {
                ffi::PyObject_GC_UnTrack(obj.cast());
            }
            let tp = ffi::Py_TYPE(obj);
            ptr::drop_in_place((obj as *mut u8).add(self.offset.get()) as *mut T);
            self.free(obj.cast());
            ffi::Py_DECREF(tp.cast());
        }
    }

    /// Keeps a dead object for reuse, or gives it back to CPython.
    ///
    /// # Safety
    /// GIL held; `obj` is a dead object of the pool's class (contents dropped).
    #[inline(always)]
    unsafe fn free(&self, obj: *mut std::ffi::c_void) {
        unsafe {
            let free = &mut *self.free.get();
            if free.len() < self.cap {
                free.push(obj.cast());
            } else if self.own_alloc.get() {
                // Untracked (see `dealloc`): the header is all there is to free.
                ffi::PyObject_Free(obj.byte_sub(GC_HEAD_SIZE));
            } else {
                ffi::PyObject_GC_Del(obj);
            }
        }
    }
}

/// Size of CPython's `PyGC_Head` (two words) on the builds whose layout
/// `alloc_fresh` relies on.
const GC_HEAD_SIZE: usize = 2 * std::mem::size_of::<usize>();

/// How many bytes CPython keeps before a GC object, as `sys.getsizeof`
/// reports them (it adds them to `__sizeof__`); None if either fails.
fn gc_header_size(obj: &Bound<'_, PyAny>) -> Option<usize> {
    let py = obj.py();
    let total: usize = py.import("sys").ok()?.getattr("getsizeof").ok()?.call1((obj,)).ok()?.extract().ok()?;
    let own: usize = obj.call_method0("__sizeof__").ok()?.extract().ok()?;
    total.checked_sub(own)
}

static HANDLE_POOL: HandlePool = HandlePool::new(dealloc_handle, HANDLE_POOL_CAP);
static TIMER_HANDLE_POOL: HandlePool = HandlePool::new(dealloc_timer_handle, TIMER_HANDLE_POOL_CAP);

unsafe extern "C" fn dealloc_handle(obj: *mut ffi::PyObject) {
    unsafe { HANDLE_POOL.dealloc::<Handle>(obj) }
}

unsafe extern "C" fn dealloc_timer_handle(obj: *mut ffi::PyObject) {
    unsafe { TIMER_HANDLE_POOL.dealloc::<TimerHandle>(obj) }
}

/// A callback scheduled with `call_soon`, or a reader/writer/signal callback.
/// Made through `HANDLE_POOL`.
#[pyclass(module = "zuvrs", name = "Handle", frozen)]
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
    #[inline(always)]
    pub(crate) fn create(py: Python<'_>, core: HandleCore) -> PyResult<Bound<'_, Handle>> {
        HANDLE_POOL.create(py, Handle { core: UnsafeCell::new(core) })
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

    /// The context the callback runs in.
    fn get_context(&self, py: Python<'_>) -> Py<PyAny> {
        unsafe { Bound::from_borrowed_ptr(py, self.core().private_context()).unbind() }
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        unsafe { &*self.core.get() }.visit(&visit)
    }

    /// Where the handle was created, in debug mode (else None).
    #[getter]
    fn _source_traceback(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        unsafe { self.core().source_traceback(py) }
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
/// Made through `TIMER_HANDLE_POOL`.
#[pyclass(module = "zuvrs", name = "TimerHandle", frozen)]
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
        core: HandleCore,
        book: &Rc<TimerBook>,
    ) -> PyResult<Bound<'py, TimerHandle>> {
        TIMER_HANDLE_POOL.create(
            py,
            TimerHandle {
                core: UnsafeCell::new(core),
                when,
                scheduled: Cell::new(true),
                book: SharedBook(book.clone()),
            },
        )
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

    /// The context the callback runs in.
    fn get_context(&self, py: Python<'_>) -> Py<PyAny> {
        unsafe { Bound::from_borrowed_ptr(py, self.core().private_context()).unbind() }
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        unsafe { &*self.core.get() }.visit(&visit)
    }

    /// Where the handle was created, in debug mode (else None).
    #[getter]
    fn _source_traceback(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        unsafe { self.core().source_traceback(py) }
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
    #[allow(clippy::mut_from_ref)]
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

    /// Lets go of the handle (see `release_handle`).
    #[inline]
    pub(crate) fn release(self) {
        match self {
            Ready::Soon(h) => release_handle(h),
            Ready::Timer(h) => release_handle(h),
        }
    }
}

// A Handle must stay within CPython's 64-byte allocation class (with the
// object and GC headers, 32 bytes): see `Args` and the memory target in the
// README.
const _: () = assert!(std::mem::size_of::<HandleCore>() <= 32);
