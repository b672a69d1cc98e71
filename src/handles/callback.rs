//! A pending call: the function and its positional arguments, as owned
//! references, and how it is called inside a context.

use std::ptr::{self, NonNull};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use pyo3::{PyTraverseError, PyVisit};
use smallvec::SmallVec;

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
        // SAFETY: the caller's contract: `args` points at `nargs` live object pointers.
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
        // SAFETY: the caller's contract (see above).
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
    pub(crate) fn clone_refs(&self) -> Callback {
        let args = self.args.as_slice();
        // SAFETY: GIL held (callbacks live under it); the references are live ones of this callback.
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
        // SAFETY: the callback holds a reference to each argument.
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
        crate::cell::check_crossing();
        // SAFETY: the caller's contract: GIL held, `ctx` a live context not entered.
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

    /// Calls `context.run(function, *args)`, asyncio's way with a context
    /// that is not a `contextvars.Context`. Returns false if it raised (the
    /// exception is left set).
    ///
    /// # Safety
    /// GIL held; `context` is a live object.
    pub(crate) unsafe fn call_through(&self, context: *mut ffi::PyObject) -> bool {
        crate::cell::check_crossing();
        // SAFETY: the caller's contract; the references are the callback's.
        unsafe {
            let run = ffi::PyObject_GetAttrString(context, c"run".as_ptr());
            if run.is_null() {
                return false;
            }
            let args = self.args.as_slice();
            let mut all: SmallVec<[*mut ffi::PyObject; 5]> = SmallVec::with_capacity(args.len() + 1);
            all.push(self.func.as_ptr());
            all.extend_from_slice(args);
            let res = ffi::PyObject_Vectorcall(run, all.as_ptr(), all.len(), ptr::null_mut());
            ffi::Py_DECREF(run);
            if res.is_null() {
                return false;
            }
            ffi::Py_DECREF(res);
            true
        }
    }

    pub(crate) fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
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
pub(crate) fn as_py(p: &*mut ffi::PyObject) -> &Py<PyAny> {
    // SAFETY: Py<T> has the layout of a non-null object pointer, and every
    // pointer passed here is non-null.
    unsafe { &*(p as *const *mut ffi::PyObject as *const Py<PyAny>) }
}
