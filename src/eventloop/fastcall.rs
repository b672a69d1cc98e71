//! `call_soon`, `call_soon_threadsafe`, `call_later` and `call_at` as
//! vectorcall method descriptors on `LoopCore`.
//!
//! These run once per scheduled callback, so they skip pyo3's generic
//! argument handling: positional arguments are read straight from the
//! vectorcall array into the handle, and the only keyword, `context`, is
//! matched by hand.

use std::ffi::CStr;
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyString;
use pyo3::Borrowed;

use super::LoopCore;
use crate::handles::{Callback, Handle, HandleCore, HasCore, Ready, TimerHandle};

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

/// Where a call's arguments are, as vectorcall passes them.
pub(super) struct FastArgs {
    pub(super) args: *const *mut ffi::PyObject,
    pub(super) nargs: usize,
    pub(super) kwnames: *mut ffi::PyObject,
}

impl FastArgs {
    /// Number of keyword arguments.
    #[inline]
    pub(super) fn nkw(&self) -> usize {
        if self.kwnames.is_null() {
            0
        } else {
            unsafe { ffi::PyTuple_GET_SIZE(self.kwnames) as usize }
        }
    }

    /// True if every keyword name is one of `allowed`.
    pub(super) fn keywords_within(&self, allowed: &[&str]) -> bool {
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
    unsafe fn context(&self, py: Python<'_>, method: &str) -> PyResult<Option<*mut ffi::PyObject>> {
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
    #[inline]
    pub(super) unsafe fn arg(&self, i: usize) -> *mut ffi::PyObject {
        unsafe { *self.args.add(i) }
    }
}

fn missing(method: &str, what: &str) -> PyErr {
    PyTypeError::new_err(format!("{method}() missing 1 required positional argument: '{what}'"))
}

/// Builds the state of a new handle: `callback, *args` starting at `first`,
/// and its context; in debug mode also where it was created (to attach once
/// the handle exists).
#[inline(always)]
unsafe fn make_core(
    py: Python<'_>,
    core_obj: *mut ffi::PyObject,
    core: &LoopCore,
    a: &FastArgs,
    first: usize,
    context: Option<*mut ffi::PyObject>,
) -> PyResult<(HandleCore, Option<Py<PyAny>>)> {
    unsafe {
        let ctx = match context {
            Some(c) => {
                if ffi::PyContext_CheckExact(c) == 0 {
                    let t = Bound::from_borrowed_ptr(py, c).get_type().name()?;
                    return Err(PyTypeError::new_err(format!("an instance of Context was expected, got {t}")));
                }
                ffi::Py_INCREF(c);
                (c, false)
            }
            None => {
                let snap = core.st().ctx_cache.capture();
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
        let hc = HandleCore::new(cb, ctx.0, ctx.1, false);
        let mut traceback = None;
        if core.debug() {
            let obj = Bound::from_borrowed_ptr(py, core_obj);
            traceback = Some(obj.call_method0("_extract_source_traceback")?.unbind());
        }
        Ok((hc, traceback))
    }
}

/// The debug-mode checks asyncio makes (thread and callback type), done by
/// the Python methods it defines for them.
fn debug_checks(slf: &Bound<'_, PyAny>, callback: *mut ffi::PyObject, method: &str, thread: bool) -> PyResult<()> {
    if thread {
        slf.call_method0("_check_thread")?;
    }
    let cb = unsafe { Bound::from_borrowed_ptr(slf.py(), callback) };
    slf.call_method1("_check_callback", (cb, method))?;
    Ok(())
}

unsafe fn soon(
    py: Python<'_>,
    slf: *mut ffi::PyObject,
    a: &FastArgs,
    threadsafe: bool,
) -> PyResult<*mut ffi::PyObject> {
    unsafe {
        let method = if threadsafe { "call_soon_threadsafe" } else { "call_soon" };
        let obj = Borrowed::from_ptr(py, slf); // no refcount traffic on the loop
        let core = obj.cast_unchecked::<LoopCore>().get();
        if a.nargs < 1 {
            return Err(missing(method, "callback"));
        }
        let context = a.context(py, method)?;
        core.check_open()?;
        if core.debug() {
            debug_checks(&obj, a.arg(0), method, !threadsafe)?;
        }
        let (hc, traceback) = make_core(py, slf, core, a, 0, context)?;
        let h = Handle::create(py, hc)?;
        if let Some(tb) = traceback {
            h.get().set_source_traceback(tb);
        }
        let ptr = h.as_ptr();
        ffi::Py_INCREF(ptr);
        core.push_ready(Ready::Soon(h.unbind()));
        if threadsafe {
            core.wake();
        }
        Ok(ptr)
    }
}

unsafe fn at(py: Python<'_>, slf: *mut ffi::PyObject, a: &FastArgs, relative: bool) -> PyResult<*mut ffi::PyObject> {
    unsafe {
        let (method, what) = if relative { ("call_later", "delay") } else { ("call_at", "when") };
        let obj = Borrowed::from_ptr(py, slf);
        let core = obj.cast_unchecked::<LoopCore>().get();
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
        let t = Bound::from_borrowed_ptr(py, t);
        let mut when: f64 = t.extract().map_err(|_| {
            PyTypeError::new_err(format!(
                "unsupported operand type(s) for +: 'float' and '{}'",
                t.get_type().name().map(|n| n.to_string()).unwrap_or_default()
            ))
        })?;
        if relative {
            when += super::monotonic();
        }
        core.check_open()?;
        if core.debug() {
            debug_checks(&obj, a.arg(1), "call_at", true)?;
        }
        let (hc, traceback) = make_core(py, slf, core, a, 1, context)?;
        let st = core.st();
        let h = TimerHandle::create(py, when, hc, st.timers.book())?;
        if let Some(tb) = traceback {
            h.get().set_source_traceback(tb);
        }
        let ptr = h.as_ptr();
        ffi::Py_INCREF(ptr);
        core.st().timers.push(h.unbind(), when);
        Ok(ptr)
    }
}

macro_rules! fast_entry {
    ($name:ident, $imp:ident, $flag:expr) => {
        unsafe extern "C" fn $name(
            slf: *mut ffi::PyObject,
            args: *const *mut ffi::PyObject,
            nargsf: ffi::Py_ssize_t,
            kwnames: *mut ffi::PyObject,
        ) -> *mut ffi::PyObject {
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
        let descr = unsafe { Bound::from_owned_ptr(py, descr) };
        let name = unsafe { CStr::from_ptr(def.ml_name) }.to_str().expect("ascii");
        ty.setattr(name, descr)?;
    }
    Ok(())
}
