//! `create_task` and `create_future` without a Python frame.
//!
//! asyncio's versions are Python functions in `BaseEventLoop`; every task a
//! server creates pays for that frame. The fast path builds asyncio's own
//! (C) `Task` / `Future` exactly as `BaseEventLoop` does; anything unusual (a
//! task factory, debug mode, keywords other than `name` and `context`) goes to
//! `BaseEventLoop`'s own method, so behaviour never differs.

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString, PyTuple};
use smallvec::SmallVec;

use super::args::FastArgs;
use super::LoopCore;
use crate::python;

/// Keyword names accepted on the fast path, by Python version.
#[cfg(Py_3_11)]
const FAST_KEYWORDS: &[&str] = &["name", "context"];
#[cfg(not(Py_3_11))]
const FAST_KEYWORDS: &[&str] = &["name"];

/// Calls `BaseEventLoop.create_task(self, *args, **kwargs)` unchanged.
unsafe fn create_task_slow(py: Python<'_>, slf: *mut ffi::PyObject, a: &FastArgs) -> PyResult<*mut ffi::PyObject> {
    // SAFETY: the caller's contract, as for create_task.
    unsafe {
        let base = python::base_event_loop(py)?.getattr(pyo3::intern!(py, "create_task"))?;
        // Prepend self to the positional arguments.
        let mut args: Vec<*mut ffi::PyObject> = Vec::with_capacity(a.nargs + a.nkw() + 1);
        args.push(slf);
        for i in 0..a.nargs + a.nkw() {
            args.push(a.arg(i));
        }
        let r = ffi::PyObject_Vectorcall(base.as_ptr(), args.as_ptr(), a.nargs + 1, a.kwnames);
        if r.is_null() {
            Err(PyErr::fetch(py))
        } else {
            Ok(r)
        }
    }
}

pub(super) unsafe fn create_task(
    py: Python<'_>,
    slf: *mut ffi::PyObject,
    a: &FastArgs,
    _: bool,
) -> PyResult<*mut ffi::PyObject> {
    // SAFETY: called by the fast entry with the GIL, a live loop (`slf`) and vectorcall's arguments.
    unsafe {
        let obj = Bound::from_borrowed_ptr(py, slf);
        let shared = obj.cast_unchecked::<LoopCore>().get().shared();
        if a.nargs != 1 || shared.debug(py) || !a.keywords_within(FAST_KEYWORDS) {
            return create_task_slow(py, slf, a);
        }
        shared.check_open(py)?;
        if !obj.getattr(python::event_loop::_task_factory(py))?.is_none() {
            return create_task_slow(py, slf, a);
        }
        let task_type = python::asyncio_tasks(py)?.getattr(pyo3::intern!(py, "Task"))?;
        // Task(coro, loop=self, <the caller's keywords>); the usual call has
        // no keywords and allocates nothing here.
        let nkw = a.nkw();
        let mut args: SmallVec<[*mut ffi::PyObject; 4]> = SmallVec::with_capacity(nkw + 2);
        args.push(a.arg(0));
        args.push(slf);
        let kwnames = if nkw == 0 {
            loop_only(py).clone()
        } else {
            let mut names: SmallVec<[Bound<'_, PyString>; 3]> = SmallVec::with_capacity(nkw + 1);
            names.push(pyo3::intern!(py, "loop").clone());
            for i in 0..nkw {
                args.push(a.arg(1 + i));
                names.push(
                    Bound::from_borrowed_ptr(py, ffi::PyTuple_GET_ITEM(a.kwnames, i as ffi::Py_ssize_t))
                        .cast_into_unchecked(),
                );
            }
            PyTuple::new(py, names)?
        };
        let r = ffi::PyObject_Vectorcall(task_type.as_ptr(), args.as_ptr(), 1, kwnames.as_ptr());
        if r.is_null() {
            Err(PyErr::fetch(py))
        } else {
            Ok(r)
        }
    }
}

/// The keyword-name tuple `("loop",)`.
fn loop_only(py: Python<'_>) -> &Bound<'_, PyTuple> {
    static LOOP_ONLY: PyOnceLock<Py<PyTuple>> = PyOnceLock::new();
    LOOP_ONLY.get_or_init(py, || PyTuple::new(py, [pyo3::intern!(py, "loop")]).expect("tuple").unbind()).bind(py)
}

/// `Future(loop=self)`: called with a keyword dict the loop keeps (a call
/// with keyword names would build that dict for every future).
pub(super) unsafe fn create_future(
    py: Python<'_>,
    slf: *mut ffi::PyObject,
    a: &FastArgs,
    _: bool,
) -> PyResult<*mut ffi::PyObject> {
    // SAFETY: as for create_task.
    unsafe {
        if a.nargs != 0 || a.nkw() != 0 {
            return Err(pyo3::exceptions::PyTypeError::new_err(
                "BaseEventLoop.create_future() takes 1 positional argument but more were given",
            ));
        }
        let future_type = python::asyncio_futures(py)?.getattr(pyo3::intern!(py, "Future"))?;
        let obj = Bound::from_borrowed_ptr(py, slf);
        let shared = obj.cast_unchecked::<LoopCore>().get().shared();
        let kwargs = match shared.state.with(py, |st| st.future_kwargs.as_ref().map(|k| k.clone_ref(py))) {
            Some(kwargs) => kwargs,
            None => {
                let kwargs = PyDict::new(py);
                kwargs.set_item(pyo3::intern!(py, "loop"), &obj)?;
                let kwargs = kwargs.unbind();
                // A closed loop makes no futures, so it keeps none (close drops it).
                if !shared.state.with(py, |st| st.closed) {
                    let old = shared.state.with(py, |st| st.future_kwargs.replace(kwargs.clone_ref(py)));
                    drop(old);
                }
                kwargs
            }
        };
        let r = ffi::PyObject_Call(future_type.as_ptr(), empty_tuple(py).as_ptr(), kwargs.as_ptr());
        if r.is_null() {
            Err(PyErr::fetch(py))
        } else {
            Ok(r)
        }
    }
}

fn empty_tuple(py: Python<'_>) -> &Bound<'_, PyTuple> {
    static EMPTY: PyOnceLock<Py<PyTuple>> = PyOnceLock::new();
    EMPTY.get_or_init(py, || PyTuple::empty(py).unbind()).bind(py)
}
