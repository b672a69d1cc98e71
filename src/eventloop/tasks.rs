//! `create_task` and `create_future` without a Python frame.
//!
//! asyncio's versions are Python functions in `BaseEventLoop`; every task a
//! server creates pays for that frame. The fast path builds asyncio's own
//! (C) `Task` / `Future` exactly as `BaseEventLoop` does; anything unusual (a
//! task factory, debug mode, keywords other than `name` and `context`) goes to
//! `BaseEventLoop`'s own method, so behaviour never differs.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple};
use pyo3::Borrowed;
use smallvec::SmallVec;

use super::fastcall::{vectorcall, FastArgs};
use super::LoopShared;
use crate::capi::futures;
use crate::python;

/// Keyword names accepted on the fast path, by Python version.
#[cfg(Py_3_11)]
const FAST_KEYWORDS: &[&str] = &["name", "context"];
#[cfg(not(Py_3_11))]
const FAST_KEYWORDS: &[&str] = &["name"];

/// Calls `BaseEventLoop.create_task(self, *args, **kwargs)` unchanged.
fn create_task_slow<'py>(py: Python<'py>, slf: &Bound<'py, PyAny>, a: &FastArgs<'_>) -> PyResult<Bound<'py, PyAny>> {
    let base = python::base_event_loop(py)?.getattr(pyo3::intern!(py, "create_task"))?;
    a.call_with_self(&base, slf)
}

pub(super) fn create_task<'py>(
    py: Python<'py>,
    slf: &Bound<'py, PyAny>,
    shared: &LoopShared,
    a: &FastArgs<'_>,
) -> PyResult<Bound<'py, PyAny>> {
    if a.nargs() != 1 || shared.debug(py) || !a.keywords_within(FAST_KEYWORDS) {
        return create_task_slow(py, slf, a);
    }
    shared.check_open(py)?;
    if !slf.getattr(python::event_loop::_task_factory(py))?.is_none() {
        return create_task_slow(py, slf, a);
    }
    let task_type = python::asyncio_task_type(py)?;
    // Task(coro, loop=self, <the caller's keywords>); the usual call has
    // no keywords and allocates nothing here.
    let nkw = a.nkw();
    let mut args: SmallVec<[Borrowed<'_, 'py, PyAny>; 4]> = SmallVec::with_capacity(nkw + 2);
    args.push(a.object(py, 0));
    args.push(slf.as_borrowed());
    let kwnames = match a.kwnames(py) {
        None => loop_only(py).clone(),
        Some(names) => {
            let mut all: SmallVec<[Bound<'py, PyAny>; 3]> = SmallVec::with_capacity(nkw + 1);
            all.push(pyo3::intern!(py, "loop").clone().into_any());
            for i in 0..nkw {
                args.push(a.object(py, 1 + i));
                all.push(names.get_borrowed_item(i)?.to_owned());
            }
            PyTuple::new(py, all)?
        }
    };
    vectorcall(&task_type, &args, Some(&kwnames))
}

/// The keyword-name tuple `("loop",)`.
fn loop_only(py: Python<'_>) -> &Bound<'_, PyTuple> {
    static LOOP_ONLY: PyOnceLock<Py<PyTuple>> = PyOnceLock::new();
    LOOP_ONLY.get_or_init(py, || PyTuple::new(py, [pyo3::intern!(py, "loop")]).expect("tuple").unbind()).bind(py)
}

/// `Future(loop=self)`: called with a keyword dict the loop keeps (a call
/// with keyword names would build that dict for every future).
pub(super) fn create_future<'py>(
    py: Python<'py>,
    slf: &Bound<'py, PyAny>,
    shared: &LoopShared,
    a: &FastArgs<'_>,
) -> PyResult<Bound<'py, PyAny>> {
    if a.nargs() != 0 || a.nkw() != 0 {
        return Err(pyo3::exceptions::PyTypeError::new_err(
            "BaseEventLoop.create_future() takes 1 positional argument but more were given",
        ));
    }
    let future_type = python::asyncio_future_type(py)?;
    // Before 3.12 the C future finds the running loop through a holder it
    // checks against getpid(), a system call per future: there the keyword
    // is cheaper.
    if cfg!(Py_3_12) && futures::layout_known() && shared.runs_here(py) && futures::is_c_future_type(&future_type) {
        // This loop is the thread's running loop, which a C future made
        // without `loop=` takes: no keyword to parse. Checked all the same.
        let fut = future_type.call0()?;
        if futures::belongs_to(&fut, slf) {
            return Ok(fut);
        }
    }
    let kwargs = future_kwargs(py, slf, shared)?;
    let fut = future_type.call(empty_tuple(py), Some(kwargs.bind(py)))?;
    futures::learn_layout(&fut, slf);
    Ok(fut)
}

/// `{"loop": slf}`, the keywords of this loop's futures.
fn future_kwargs(py: Python<'_>, slf: &Bound<'_, PyAny>, shared: &LoopShared) -> PyResult<Py<PyDict>> {
    if let Some(kwargs) = shared.state.with(py, |st| st.future_kwargs.as_ref().map(|k| k.clone_ref(py))) {
        return Ok(kwargs);
    }
    let kwargs = PyDict::new(py);
    kwargs.set_item(pyo3::intern!(py, "loop"), slf)?;
    let kwargs = kwargs.unbind();
    // A closed loop makes no futures, so it keeps none (close drops it).
    if !shared.state.with(py, |st| st.closed) {
        let old = shared.state.with(py, |st| st.future_kwargs.replace(kwargs.clone_ref(py)));
        drop(old);
    }
    Ok(kwargs)
}

/// `fut` (see `eventloop::renew_future`) made what `create_future` makes,
/// by the C future's own `__init__`, which clears what the future held:
/// Ok(false), `fut` untouched, where `create_future` would make another
/// type of future (`asyncio.futures.Future` replaced).
pub(super) fn renew_future<'py>(
    py: Python<'py>,
    slf: &Bound<'py, PyAny>,
    shared: &LoopShared,
    fut: &Bound<'py, PyAny>,
) -> PyResult<bool> {
    if !futures::is_c_future_type(&python::asyncio_future_type(py)?) {
        return Ok(false);
    }
    // As in create_future: without `loop=` where that is cheaper.
    if cfg!(Py_3_12) && futures::layout_known() && shared.runs_here(py) {
        futures::reinit(fut, empty_tuple(py), None)?;
        if futures::belongs_to(fut, slf) {
            return Ok(true);
        }
    }
    futures::reinit(fut, empty_tuple(py), Some(future_kwargs(py, slf, shared)?.bind(py)))?;
    Ok(true)
}

fn empty_tuple(py: Python<'_>) -> &Bound<'_, PyTuple> {
    static EMPTY: PyOnceLock<Py<PyTuple>> = PyOnceLock::new();
    EMPTY.get_or_init(py, || PyTuple::empty(py).unbind()).bind(py)
}
