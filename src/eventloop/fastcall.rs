//! `call_soon`, `call_soon_threadsafe`, `call_later` and `call_at` as
//! vectorcall method descriptors on `LoopCore`.
//!
//! These run once per scheduled callback, so they skip pyo3's generic
//! argument handling: positional arguments are read straight from the
//! vectorcall array into the handle, and the only keyword, `context`, is
//! matched by hand.

use std::ffi::CStr;
use std::ptr;

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::Borrowed;

use super::args::FastArgs;
use super::{LoopCore, LoopShared};
use crate::handles::{Callback, Handle, HandleState, HasState, Ready, TimerHandle};
use crate::python;

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
                let a = FastArgs { args, nargs: ffi::PyVectorcall_NARGS(nargsf as usize) as usize, kwnames };
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

fast_entry!(call_soon, soon, false);
fast_entry!(call_soon_threadsafe, soon, true);
fast_entry!(call_later, at, true);
fast_entry!(call_at, at, false);
fast_entry!(create_task, tasks_create_task, false);
fast_entry!(create_future, tasks_create_future, false);

use super::tasks::{create_future as tasks_create_future, create_task as tasks_create_task};

const FLAGS: i32 = ffi::METH_FASTCALL | ffi::METH_KEYWORDS;

fn method_def(name: &'static CStr, f: ffi::PyCFunctionFastWithKeywords, doc: &'static CStr) -> ffi::PyMethodDef {
    ffi::PyMethodDef {
        ml_name: name.as_ptr(),
        ml_meth: ffi::PyMethodDefPointer { PyCFunctionFastWithKeywords: f },
        ml_flags: FLAGS,
        ml_doc: doc.as_ptr(),
    }
}

/// Adds the fast methods to `LoopCore` as method descriptors.
pub(crate) fn install_fast_methods(py: Python<'_>) -> PyResult<()> {
    let defs: [ffi::PyMethodDef; 6] = [
        method_def(c"call_soon", call_soon, c"call_soon(callback, *args, context=None)\n--\n\nSchedule callback to run on the next turn of the loop."),
        method_def(c"call_soon_threadsafe", call_soon_threadsafe, c"call_soon_threadsafe(callback, *args, context=None)\n--\n\nLike call_soon(), callable from any thread; wakes the loop."),
        method_def(c"call_later", call_later, c"call_later(delay, callback, *args, context=None)\n--\n\nSchedule callback to run after delay seconds."),
        method_def(c"call_at", call_at, c"call_at(when, callback, *args, context=None)\n--\n\nSchedule callback to run at loop time when."),
        method_def(c"create_task", create_task, c"create_task(coro, *, name=None, context=None)\n--\n\nSchedule the execution of a coroutine object; return a Task."),
        method_def(c"create_future", create_future, c"create_future()\n--\n\nCreate a Future object attached to the loop."),
    ];
    let ty = py.get_type::<LoopCore>();
    for def in defs {
        // The descriptor keeps a pointer to its PyMethodDef for the life of
        // the type: leak it deliberately (a few small structs per process).
        let def: &'static mut ffi::PyMethodDef = Box::leak(Box::new(def));
        // SAFETY: the type object is a live heap type; the def is 'static.
        let descr = unsafe { ffi::PyDescr_NewMethod(ty.as_ptr() as *mut ffi::PyTypeObject, def) };
        if descr.is_null() {
            return Err(PyErr::fetch(py));
        }
        // SAFETY: a new reference, checked for NULL above.
        let descr = unsafe { Bound::from_owned_ptr(py, descr) };
        // SAFETY: ml_name is one of the static C strings above.
        let name = unsafe { CStr::from_ptr(def.ml_name) }.to_str().expect("ascii");
        ty.setattr(name, descr)?;
    }
    Ok(())
}
