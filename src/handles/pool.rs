//! `HandlePool`: where handle objects come from and go to.
//!
//! Freed handles of a class are kept for reuse in place of pyo3's free list,
//! and new ones are allocated the way `PyObject_GC_New` would, without
//! counting towards the cyclic GC's next collection (see `alloc_fresh`).
//! This is the one place that knows CPython's object layout around a
//! handle.

use std::cell::{Cell, UnsafeCell};
use std::marker::PhantomData;
use std::ptr;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::PyClass;

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
/// GIL-protected: only touched from `dealloc` and `create`. One pool per
/// class (`Pooled::pool`), so an object can only go back to its own.
pub(super) struct HandlePool<T> {
    free: UnsafeCell<Vec<*mut ffi::PyObject>>,
    /// Where the Rust value starts in the object: 0 until the first object
    /// made by pyo3 shows it, `usize::MAX` if the layout is not the plain
    /// one this relies on.
    offset: Cell<usize>,
    /// Whether fresh objects are allocated here rather than by
    /// `PyObject_GC_New` (see `alloc_fresh`): set with `offset` when CPython
    /// is seen to put exactly a `PyGC_Head` before a GC object.
    own_alloc: Cell<bool>,
    /// Where the object's weak reference list is (the class takes weak
    /// references, as asyncio's handles do), or 0 for none.
    weaklist: Cell<usize>,
    /// At most this many freed objects are kept.
    cap: usize,
    class: PhantomData<fn() -> T>,
}

// SAFETY: accessed with the GIL held only (the module declares gil_used).
unsafe impl<T> Sync for HandlePool<T> {}

/// A pyclass whose objects come from a `HandlePool`: frozen (no borrow
/// flag to initialise) and shareable, as pyo3 requires of frozen classes.
pub(super) trait Pooled:
    PyClass<Frozen = pyo3::pyclass::boolean_struct::True> + Sync + Into<pyo3::PyClassInitializer<Self>>
{
    /// The class's pool (a static).
    fn pool() -> &'static HandlePool<Self>;
}

/// The class's `tp_dealloc` once its layout is known (see `dealloc`).
unsafe extern "C" fn dealloc_pooled<T: Pooled>(obj: *mut ffi::PyObject) {
    // SAFETY: installed as T's tp_dealloc only (learn_layout); CPython calls
    // it with the GIL held, on an object of T whose refcount reached zero.
    unsafe { T::pool().dealloc(obj) }
}

/// Freed `Handle`s kept (2 MiB at most): a thread feeding
/// `call_soon_threadsafe` queues tens of thousands between two GIL
/// switches, and reuse skips pymalloc and the GC's allocation count.
pub(super) const HANDLE_POOL_CAP: usize = 32768;
/// Freed `TimerHandle`s kept (768 KiB at most).
pub(super) const TIMER_HANDLE_POOL_CAP: usize = 8192;

impl<T: Pooled> HandlePool<T> {
    pub(super) const fn new(cap: usize) -> Self {
        HandlePool {
            free: UnsafeCell::new(Vec::new()),
            offset: Cell::new(0),
            own_alloc: Cell::new(false),
            weaklist: Cell::new(0),
            cap,
            class: PhantomData,
        }
    }

    /// A new, untracked object of `T` holding `value`; pyo3 makes it
    /// (`Bound::new`) until the layout is known.
    #[inline(always)]
    pub(super) fn create<'py>(&self, py: Python<'py>, value: T) -> PyResult<Bound<'py, T>> {
        let offset = self.offset.get();
        if offset == 0 || offset == usize::MAX {
            let obj = Bound::new(py, value)?;
            untrack(&obj);
            if offset == 0 {
                self.learn_layout(&obj);
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
                None => {
                    let obj = self.alloc_fresh(py, tp)?;
                    let weaklist = self.weaklist.get();
                    if weaklist != 0 {
                        // No weak references yet (a fresh allocation is not
                        // zeroed). A pooled object's list is already empty:
                        // `dealloc` cleared it, which leaves it null.
                        ptr::write((obj as *mut u8).add(weaklist) as *mut *mut ffi::PyObject, ptr::null_mut());
                    }
                    obj
                }
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
    /// same way. A handle that is tracked later (`let_go`) is an
    /// ordinary GC object from then on, and is untracked again before it dies.
    ///
    /// # Safety
    /// GIL held; `tp` is the pool's class and its layout is known.
    #[inline(always)]
    unsafe fn alloc_fresh(&self, py: Python<'_>, tp: *mut ffi::PyTypeObject) -> PyResult<*mut ffi::PyObject> {
        // SAFETY: the caller's contract: GIL held, `tp` the pool's class with its layout known.
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
    /// object header, the value and, right after it, the weak reference
    /// list (no borrow flag or dict to initialise).
    #[cold]
    fn learn_layout(&self, obj: &Bound<'_, T>) {
        let start = obj.as_ptr() as usize;
        let value = obj.get() as *const T as usize;
        // SAFETY: reading the sizes of a live type object.
        let (basic, weaklist) = unsafe {
            let tp = ffi::Py_TYPE(obj.as_ptr());
            ((*tp).tp_basicsize as usize, (*tp).tp_weaklistoffset)
        };
        let value_end = value.wrapping_sub(start) + std::mem::size_of::<T>();
        let weak_slot = std::mem::size_of::<*mut ffi::PyObject>();
        let (plain, weaklist) = if value <= start {
            (false, 0)
        } else if weaklist == 0 {
            (value_end == basic, 0)
        } else {
            let off = weaklist as usize;
            (weaklist > 0 && off >= value_end && off + weak_slot == basic && value_end + weak_slot >= basic, off)
        };
        self.weaklist.set(if plain { weaklist } else { 0 });
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
                (*tp).tp_dealloc = Some(dealloc_pooled::<T>);
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
    unsafe fn dealloc(&self, obj: *mut ffi::PyObject) {
        // SAFETY: the caller's contract: GIL held, `obj` a dead object of `T` at the learned offset.
        unsafe {
            // Untracked before the value's destructor can run Python code
            // (a handle released while still referenced is tracked again).
            if ffi::PyObject_GC_IsTracked(obj) != 0 {
                ffi::PyObject_GC_UnTrack(obj.cast());
            }
            let weaklist = self.weaklist.get();
            if weaklist != 0 && !(*((obj as *mut u8).add(weaklist) as *mut *mut ffi::PyObject)).is_null() {
                // Weak references die (and their callbacks run) first, as
                // in CPython's own deallocators.
                ffi::PyObject_ClearWeakRefs(obj);
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
        // SAFETY: the caller's contract: GIL held, `obj` a dead object of the pool's class.
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
    let total: usize = crate::python::getsizeof(py).ok()?.call1((obj,)).ok()?.extract().ok()?;
    let own: usize = obj.call_method0("__sizeof__").ok()?.extract().ok()?;
    total.checked_sub(own)
}
