//! `call_soon`, `call_soon_threadsafe`, `call_later` and `call_at` as
//! vectorcall method descriptors on `LoopCore`.
//!
//! These run once per scheduled callback, so they skip pyo3's generic
//! argument handling: positional arguments are read straight from the
//! vectorcall array into the handle, and the only keyword, `context`, is
//! matched by hand. `FastArgs` is the arguments' safe view for the other
//! fast methods (tasks.rs), with `vectorcall` to pass them on.

use std::ffi::CStr;
use std::marker::PhantomData;
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};
use pyo3::Borrowed;
use smallvec::SmallVec;

use super::{LoopCore, LoopShared};
use crate::handles::{Callback, Handle, HandleState, HasState, Ready, TimerHandle};
use crate::python;

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

/// Where a call's arguments are, as vectorcall passes them: made only by
/// the entry points below, from the interpreter's arguments, which stay
/// alive for the call (`'a`).
pub(super) struct FastArgs<'a> {
    args: *const *mut ffi::PyObject,
    nargs: usize,
    /// NULL, or a tuple of str: the keyword arguments' names.
    kwnames: *mut ffi::PyObject,
    _call: PhantomData<&'a ()>,
}

impl<'a> FastArgs<'a> {
    /// The arguments of a vectorcall.
    ///
    /// # Safety
    /// As the interpreter passes them to a METH_FASTCALL | METH_KEYWORDS
    /// method, alive for `'a`.
    #[inline(always)]
    unsafe fn new(args: *const *mut ffi::PyObject, nargsf: ffi::Py_ssize_t, kwnames: *mut ffi::PyObject) -> Self {
        // SAFETY: a plain computation on the count.
        let nargs = unsafe { ffi::PyVectorcall_NARGS(nargsf as usize) } as usize;
        FastArgs { args, nargs, kwnames, _call: PhantomData }
    }

    /// Number of positional arguments.
    #[inline]
    pub(super) fn nargs(&self) -> usize {
        self.nargs
    }

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
    pub(super) fn context(&self, py: Python<'_>, method: &str) -> PyResult<Option<*mut ffi::PyObject>> {
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
    ///
    /// # Safety
    /// i < nargs + nkw.
    #[inline]
    unsafe fn arg(&self, i: usize) -> *mut ffi::PyObject {
        // SAFETY: the caller passes i < nargs + nkw (this function's contract).
        unsafe { *self.args.add(i) }
    }

    /// The i-th argument (positional first, then keyword values), borrowed
    /// for the call.
    #[inline]
    pub(super) fn object<'py>(&self, py: Python<'py>, i: usize) -> Borrowed<'a, 'py, PyAny> {
        assert!(i < self.nargs + self.nkw(), "argument {i} out of range");
        // SAFETY: in range; the interpreter's arguments live for the call.
        unsafe { Borrowed::from_ptr(py, self.arg(i)) }
    }

    /// The keyword names (an empty tuple when there are none).
    #[inline]
    pub(super) fn kwnames<'py>(&self, py: Python<'py>) -> Option<Borrowed<'a, 'py, PyTuple>> {
        // SAFETY: NULL or a live tuple, for the call.
        (!self.kwnames.is_null()).then(|| unsafe { Borrowed::from_ptr(py, self.kwnames).cast_unchecked() })
    }

    /// `callable(slf, *args, **kwargs)` with this call's arguments.
    pub(super) fn call_with_self<'py>(
        &self,
        callable: &Bound<'py, PyAny>,
        slf: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = callable.py();
        let mut all: Vec<Borrowed<'_, 'py, PyAny>> = Vec::with_capacity(self.nargs + self.nkw() + 1);
        all.push(slf.as_borrowed());
        all.extend((0..self.nargs + self.nkw()).map(|i| self.object(py, i)));
        vectorcall(callable, &all, self.kwnames(py).as_deref())
    }
}

/// `callable(*positional, **keywords)`, the keywords' values being the last
/// `kwnames.len()` of `args` (vectorcall's convention, no dict made). A
/// keyword name that is not a str is a TypeError.
pub(super) fn vectorcall<'py>(
    callable: &Bound<'py, PyAny>,
    args: &[Borrowed<'_, 'py, PyAny>],
    kwnames: Option<&Bound<'py, PyTuple>>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = callable.py();
    let nkw = kwnames.map_or(0, |k| k.len());
    if nkw > args.len() {
        return Err(PyTypeError::new_err("more keyword names than arguments"));
    }
    if let Some(names) = kwnames {
        if names.iter_borrowed().any(|n| !n.is_exact_instance_of::<PyString>()) {
            return Err(PyTypeError::new_err("keywords must be strings"));
        }
    }
    let ptrs: SmallVec<[*mut ffi::PyObject; 8]> = args.iter().map(|a| a.as_ptr()).collect();
    let names = kwnames.map_or(ptr::null_mut(), |k| k.as_ptr());
    // SAFETY: GIL held; live arguments, of which the last nkw are the values
    // of the str keywords in `names`; a new reference or NULL with the error
    // set.
    unsafe {
        let r = ffi::PyObject_Vectorcall(callable.as_ptr(), ptrs.as_ptr(), args.len() - nkw, names);
        Bound::from_owned_ptr_or_err(py, r)
    }
}

fn missing(method: &str, what: &str) -> PyErr {
    PyTypeError::new_err(format!("{method}() missing 1 required positional argument: '{what}'"))
}

/// Builds the state of a new handle: `callback, *args` starting at `first`,
/// and its context; in debug mode also where it was created (to attach once
/// the handle exists).
#[inline(always)]
unsafe fn make_state(
    py: Python<'_>,
    core_obj: *mut ffi::PyObject,
    shared: &LoopShared,
    debug: bool,
    a: &FastArgs,
    first: usize,
    context: Option<*mut ffi::PyObject>,
) -> PyResult<(HandleState, Option<Py<PyAny>>)> {
    // SAFETY: the caller's contract: GIL held, `a` describes live arguments, `first` < nargs.
    unsafe {
        let ctx = match context {
            Some(c) if ffi::PyContext_CheckExact(c) == 0 => {
                // As asyncio: kept, and its run() called when due.
                ffi::Py_INCREF(c);
                let cb = Callback::new(a.arg(first), a.args.add(first + 1), a.nargs - first - 1);
                let state = HandleState::with_foreign_context(cb, c);
                let traceback = if debug { Some(extract_traceback(py, core_obj)?) } else { None };
                return Ok((state, traceback));
            }
            Some(c) => {
                ffi::Py_INCREF(c);
                (c, false)
            }
            None => {
                let snap = shared.state.with(py, |st| st.ctx_cache.capture());
                if !snap.replaced.is_null() {
                    ffi::Py_DECREF(snap.replaced);
                }
                if snap.context.is_null() {
                    return Err(PyErr::fetch(py));
                }
                (snap.context, snap.shared)
            }
        };
        let cb = Callback::new(a.arg(first), a.args.add(first + 1), a.nargs - first - 1);
        let state = HandleState::new(cb, ctx.0, ctx.1, false);
        let traceback = if debug { Some(extract_traceback(py, core_obj)?) } else { None };
        Ok((state, traceback))
    }
}

/// Where a handle is made, in debug mode (`loop._extract_source_traceback()`).
fn extract_traceback(py: Python<'_>, core_obj: *mut ffi::PyObject) -> PyResult<Py<PyAny>> {
    // SAFETY: the loop object is live (the method's self).
    let obj = unsafe { Bound::from_borrowed_ptr(py, core_obj) };
    let name = python::event_loop::_extract_source_traceback(py);
    Ok(python::call_method0(&obj, name)?.unbind())
}

/// The debug-mode checks asyncio makes (thread and callback type), done by
/// the Python methods it defines for them.
fn debug_checks(slf: &Bound<'_, PyAny>, callback: *mut ffi::PyObject, method: &str, thread: bool) -> PyResult<()> {
    let py = slf.py();
    if thread {
        python::call_method0(slf, python::event_loop::_check_thread(py))?;
    }
    // SAFETY: the caller passes a borrowed, live callback.
    let cb = unsafe { Bound::from_borrowed_ptr(py, callback) };
    python::call_method(slf, python::event_loop::_check_callback(py), (cb, method))?;
    Ok(())
}

unsafe fn soon(
    py: Python<'_>,
    slf: *mut ffi::PyObject,
    a: &FastArgs,
    threadsafe: bool,
) -> PyResult<*mut ffi::PyObject> {
    // SAFETY: called by the fast entry with the GIL, a live loop (`slf`) and vectorcall's arguments.
    unsafe {
        let method = if threadsafe { "call_soon_threadsafe" } else { "call_soon" };
        let obj = Borrowed::from_ptr(py, slf); // no refcount traffic on the loop
        let shared = obj.cast_unchecked::<LoopCore>().get().shared();
        if a.nargs < 1 {
            return Err(missing(method, "callback"));
        }
        let context = a.context(py, method)?;
        let (closed, debug) = shared.state.with(py, |st| (st.closed, st.debug));
        if closed {
            return Err(crate::errors::closed_error());
        }
        if debug {
            debug_checks(&obj, a.arg(0), method, !threadsafe)?;
        }
        let (state, traceback) = make_state(py, slf, shared, debug, a, 0, context)?;
        let h = Handle::create(py, state)?;
        if let Some(tb) = traceback {
            h.get().set_source_traceback(py, tb);
        }
        let ptr = h.as_ptr();
        ffi::Py_INCREF(ptr);
        shared.push_ready(py, Ready::Soon(h.unbind()));
        if threadsafe {
            super::stats::LoopStats::add(&shared.stats.threadsafe_calls, 1);
            shared.wake(py);
        }
        Ok(ptr)
    }
}

unsafe fn at(py: Python<'_>, slf: *mut ffi::PyObject, a: &FastArgs, relative: bool) -> PyResult<*mut ffi::PyObject> {
    // SAFETY: as for `soon`.
    unsafe {
        let (method, what) = if relative { ("call_later", "delay") } else { ("call_at", "when") };
        let obj = Borrowed::from_ptr(py, slf);
        let shared = obj.cast_unchecked::<LoopCore>().get().shared();
        if a.nargs < 1 {
            return Err(missing(method, what));
        }
        if a.nargs < 2 {
            return Err(missing(method, "callback"));
        }
        let context = a.context(py, method)?;
        let t = a.arg(0);
        if t == ffi::Py_None() {
            return Err(PyTypeError::new_err(if relative { "delay must not be None" } else { "when cannot be None" }));
        }
        let (when, when_is_int) =
            if relative { (deadline_after(py, &obj, shared, t)?, false) } else { absolute_deadline(py, t)? };
        let (closed, debug) = shared.state.with(py, |st| (st.closed, st.debug));
        if closed {
            return Err(crate::errors::closed_error());
        }
        if debug {
            debug_checks(&obj, a.arg(1), "call_at", true)?;
        }
        let (state, traceback) = make_state(py, slf, shared, debug, a, 1, context)?;
        let book = shared.state.with(py, |st| st.timers.book().clone());
        let h = TimerHandle::create(py, when, when_is_int, state, &book)?;
        if let Some(tb) = traceback {
            h.get().set_source_traceback(py, tb);
        }
        let ptr = h.as_ptr();
        ffi::Py_INCREF(ptr);
        shared.state.with(py, |st| st.timers.push(h.unbind(), when));
        Ok(ptr)
    }
}

/// `loop.time() + delay`, as asyncio's call_later computes it: a float or an
/// int directly (a huge int raises OverflowError), anything else through
/// Python's `+` (TypeError for a Decimal, an object with `__radd__` works).
///
/// # Safety
/// GIL held; `delay` is a live object.
unsafe fn deadline_after(
    py: Python<'_>,
    slf: &Bound<'_, PyAny>,
    shared: &LoopShared,
    delay: *mut ffi::PyObject,
) -> PyResult<f64> {
    let now = super::loop_time(py, slf, shared)?;
    // SAFETY: type checks and conversions of a live object.
    unsafe {
        if ffi::PyFloat_CheckExact(delay) != 0 {
            return Ok(ffi::PyFloat_AS_DOUBLE(delay) + now);
        }
        if ffi::PyLong_CheckExact(delay) != 0 {
            let d = ffi::PyLong_AsDouble(delay);
            if d == -1.0 && !ffi::PyErr_Occurred().is_null() {
                return Err(PyErr::fetch(py));
            }
            return Ok(d + now);
        }
        let now = pyo3::types::PyFloat::new(py, now);
        let sum = Bound::from_owned_ptr_or_err(py, ffi::PyNumber_Add(now.as_ptr(), delay))?;
        sum.extract()
    }
}

/// The deadline of call_at: any number (asyncio keeps the object; zuvrs
/// its float value, and whether it was an int).
///
/// # Safety
/// GIL held; `when` is a live object.
unsafe fn absolute_deadline(py: Python<'_>, when: *mut ffi::PyObject) -> PyResult<(f64, bool)> {
    // SAFETY: a borrowed live object.
    let t = unsafe { Bound::from_borrowed_ptr(py, when) };
    // SAFETY: a type check of a live object.
    let is_int = unsafe { ffi::PyLong_Check(when) } != 0;
    t.extract().map(|w| (w, is_int)).map_err(|_| {
        PyTypeError::new_err(format!(
            "unsupported operand type(s) for +: 'float' and '{}'",
            t.get_type().name().map(|n| n.to_string()).unwrap_or_default()
        ))
    })
}

macro_rules! fast_entry {
    ($name:ident, $imp:ident, $flag:expr) => {
        unsafe extern "C" fn $name(
            slf: *mut ffi::PyObject,
            args: *const *mut ffi::PyObject,
            nargsf: ffi::Py_ssize_t,
            kwnames: *mut ffi::PyObject,
        ) -> *mut ffi::PyObject {
            // SAFETY: CPython calls a method descriptor with the GIL held and vectorcall's arguments.
            unsafe {
                let py = Python::assume_attached();
                let a = FastArgs::new(args, nargsf, kwnames);
                match $imp(py, slf, &a, $flag) {
                    Ok(p) => p,
                    Err(e) => {
                        e.restore(py);
                        ptr::null_mut()
                    }
                }
            }
        }
    };
}

/// An entry point calling a safe method body: `$imp(py, slf, shared, args)`.
macro_rules! safe_entry {
    ($name:ident, $imp:path) => {
        unsafe extern "C" fn $name(
            slf: *mut ffi::PyObject,
            args: *const *mut ffi::PyObject,
            nargsf: ffi::Py_ssize_t,
            kwnames: *mut ffi::PyObject,
        ) -> *mut ffi::PyObject {
            // SAFETY: CPython calls a method descriptor of LoopCore with the
            // GIL held, an instance of LoopCore (it checks the type) and
            // vectorcall's arguments.
            unsafe {
                let py = Python::assume_attached();
                let a = FastArgs::new(args, nargsf, kwnames);
                let obj = Borrowed::from_ptr(py, slf);
                let shared = obj.cast_unchecked::<LoopCore>().get().shared();
                match $imp(py, &obj, shared, &a) {
                    Ok(r) => r.into_ptr(),
                    Err(e) => {
                        e.restore(py);
                        ptr::null_mut()
                    }
                }
            }
        }
    };
}

fast_entry!(call_soon, soon, false);
fast_entry!(call_soon_threadsafe, soon, true);
fast_entry!(call_later, at, true);
fast_entry!(call_at, at, false);
safe_entry!(create_task, super::tasks::create_task);
safe_entry!(create_future, super::tasks::create_future);

const FLAGS: i32 = ffi::METH_FASTCALL | ffi::METH_KEYWORDS;

fn method_def(name: &'static CStr, f: ffi::PyCFunctionFastWithKeywords, doc: &'static CStr) -> ffi::PyMethodDef {
    ffi::PyMethodDef {
        ml_name: name.as_ptr(),
        ml_meth: ffi::PyMethodDefPointer { PyCFunctionFastWithKeywords: f },
        ml_flags: FLAGS,
        ml_doc: doc.as_ptr(),
    }
}

/// `get_debug()`: asyncio's C future asks it of its loop on every creation.
unsafe extern "C" fn get_debug(slf: *mut ffi::PyObject, _: *mut ffi::PyObject) -> *mut ffi::PyObject {
    // SAFETY: CPython calls a method descriptor of LoopCore with the GIL
    // held and an instance of LoopCore (it checks the type); the result is
    // a new reference to a bool.
    unsafe {
        let py = Python::assume_attached();
        let on = Borrowed::from_ptr(py, slf).cast_unchecked::<LoopCore>().get().shared().debug(py);
        let result = if on { ffi::Py_True() } else { ffi::Py_False() };
        ffi::Py_INCREF(result);
        result
    }
}

/// Adds the fast methods to `LoopCore` as method descriptors.
pub(crate) fn install_fast_methods(py: Python<'_>) -> PyResult<()> {
    let no_args = ffi::PyMethodDef {
        ml_name: c"get_debug".as_ptr(),
        ml_meth: ffi::PyMethodDefPointer { PyCFunction: get_debug },
        ml_flags: ffi::METH_NOARGS,
        ml_doc: c"get_debug()\n--\n\nWhether the loop is in debug mode.".as_ptr(),
    };
    let defs: [ffi::PyMethodDef; 7] = [
        no_args,
        method_def(c"call_soon", call_soon, c"call_soon(callback, *args, context=None)\n--\n\nSchedule callback to run on the next turn of the loop."),
        method_def(c"call_soon_threadsafe", call_soon_threadsafe, c"call_soon_threadsafe(callback, *args, context=None)\n--\n\nLike call_soon(), callable from any thread; wakes the loop."),
        method_def(c"call_later", call_later, c"call_later(delay, callback, *args, context=None)\n--\n\nSchedule callback to run after delay seconds."),
        method_def(c"call_at", call_at, c"call_at(when, callback, *args, context=None)\n--\n\nSchedule callback to run at loop time when."),
        method_def(c"create_task", create_task, c"create_task(coro, *, name=None, context=None)\n--\n\nSchedule the execution of a coroutine object; return a Task."),
        method_def(c"create_future", create_future, c"create_future()\n--\n\nCreate a Future object attached to the loop."),
    ];
    let ty = py.get_type::<LoopCore>();
    for def in defs {
        // SAFETY: ml_name is one of the static C strings above.
        let name = unsafe { CStr::from_ptr(def.ml_name) }.to_str().expect("ascii");
        let descr = crate::capi::methods::method_descriptor(&ty, def)?;
        ty.setattr(name, descr)?;
    }
    Ok(())
}
