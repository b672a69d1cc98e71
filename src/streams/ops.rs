//! The awaitables a native StreamReader's reads return (`StreamRead`).
//!
//! `reader.readline()` and the other reads are coroutines in asyncio; here
//! each returns a `StreamRead`, an object with the coroutine protocol
//! (`send`, `throw`, `close`, `__await__`; `asyncio.iscoroutine()` is true of
//! it, so `create_task`, `wait_for` and `gather` take it). Nothing happens
//! until it is first resumed, and then what asyncio's coroutine does happens
//! in the same order: the checks, the search of the buffer, the errors with
//! their `partial` / `consumed` and what they leave in the buffer.
//!
//! A read the buffer can satisfy completes in its first step, without a
//! future. Otherwise the op does what asyncio's `_wait_for_data` does: makes
//! the reader's waiter future and yields it to the task (as `await future`
//! does), and looks at the buffer again when the task resumes it.
//!
//! The interpreter resumes an awaited op through `tp_iternext` (3.12+) or
//! `am_send` (3.10, 3.11); `install_slots` gives both types the C entry
//! points of capi.rs (`Resumable`), which answer without making an
//! exception object when the result is None or a yielded future.

use pyo3::exceptions::{PyRuntimeError, PyStopAsyncIteration, PyStopIteration, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple, PyType};
use pyo3::{PyTraverseError, PyVisit};
use smallvec::SmallVec;

use super::state::{resume_reading, ReaderCore};
use crate::capi::{install_resume_slots, Resumable, Resumed};
use crate::cell::NativeCell;
use crate::python;

/// Which read an op does.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Method {
    Read,
    ReadExactly,
    ReadUntil,
    ReadLine,
    /// `__anext__`: readline, and StopAsyncIteration at the end.
    Next,
}

type Separator = SmallVec<[u8; 16]>;

/// What readuntil's search makes of its outcomes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Until {
    /// readuntil: the errors as raised.
    Raise,
    /// readline: the partial line at EOF, ValueError over the limit.
    Line,
    /// `__anext__`: readline, and StopAsyncIteration for an empty end.
    Next,
}

/// Where a read is.
enum Kind {
    /// Not started: the method and its argument, read at the first step.
    Start(Method, Option<Py<PyAny>>),
    /// read(n), n > 0; `waited` once it has waited (it waits at most once).
    Read {
        n: usize,
        waited: bool,
    },
    /// read(-1): asyncio's loop of read(limit) calls until an empty one.
    ReadAll {
        blocks: Vec<Py<PyBytes>>,
        waited: bool,
    },
    Exactly {
        n: usize,
    },
    /// readuntil / readline: `offset` is where the next search starts; the
    /// separators are sorted by length.
    Until {
        separators: SmallVec<[Separator; 1]>,
        offset: isize,
        mode: Until,
    },
}

enum Stage {
    Ready,
    /// A step is running (Python code it called could re-enter).
    Running,
    /// Yielded this future to the task.
    Waiting(Py<PyAny>),
    Done,
}

struct OpState {
    stage: Stage,
    kind: Option<Kind>,
    /// The reader, while the op is not done (so that a finished op kept
    /// for reuse by its reader, reader.rs, makes no cycle with it).
    reader: Option<Py<ReaderCore>>,
}

/// What a step ends with.
pub(super) enum Outcome {
    Return(Py<PyAny>),
    Yield(Py<PyAny>),
}

/// What a read's first checks decide.
enum Started {
    Run(Kind),
    /// The result, already (read(0), readexactly(0)).
    Done(Py<PyAny>),
}

/// What one attempt at the buffer found.
enum Attempt {
    Return(Py<PyAny>),
    /// More data is needed; the name is the method's, for the error a
    /// second waiting read gets.
    Wait(&'static str),
}

#[pyclass(module = "zuvrs._zuvrs", name = "StreamRead", frozen)]
pub(crate) struct ReadOp {
    state: NativeCell<OpState>,
}

impl ReadOp {
    pub(super) fn new(
        py: Python<'_>,
        reader: Py<ReaderCore>,
        method: Method,
        arg: Option<Py<PyAny>>,
    ) -> PyResult<Py<ReadOp>> {
        let state = OpState { stage: Stage::Ready, kind: Some(Kind::Start(method, arg)), reader: Some(reader) };
        Py::new(py, ReadOp { state: NativeCell::new(state) })
    }

    pub(super) fn is_done(&self, py: Python<'_>) -> bool {
        self.state.with(py, |st| matches!(st.stage, Stage::Done))
    }

    /// Makes a finished op (`is_done`) a new read of `reader`: reader.rs
    /// reuses the op of its last read when nothing else holds it.
    pub(super) fn reuse(&self, py: Python<'_>, reader: Py<ReaderCore>, method: Method, arg: Option<Py<PyAny>>) {
        let old = self.state.with(py, |st| {
            std::mem::replace(
                st,
                OpState { stage: Stage::Ready, kind: Some(Kind::Start(method, arg)), reader: Some(reader) },
            )
        });
        drop(old);
    }

    /// One step: the first one (`value` must be None), or the one after
    /// the yielded future completed.
    pub(super) fn advance(&self, py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<Outcome> {
        let (stage, reader) = self.state.with(py, |st| {
            (std::mem::replace(&mut st.stage, Stage::Running), st.reader.as_ref().map(|r| r.clone_ref(py)))
        });
        let reader = match reader {
            Some(reader) => reader.into_bound(py),
            None => {
                self.state.with(py, |st| st.stage = Stage::Done);
                return Err(PyRuntimeError::new_err("cannot reuse already awaited coroutine"));
            }
        };
        let reader = reader.get();
        match stage {
            Stage::Ready if !value.is_none() => {
                self.state.with(py, |st| st.stage = Stage::Ready);
                return Err(PyTypeError::new_err("can't send non-None value to a just-started coroutine"));
            }
            Stage::Ready => {}
            Stage::Running => return Err(PyValueError::new_err("coroutine already executing")),
            Stage::Done => {
                self.state.with(py, |st| st.stage = Stage::Done);
                return Err(PyRuntimeError::new_err("cannot reuse already awaited coroutine"));
            }
            Stage::Waiting(future) => {
                let future = future.into_bound(py);
                // asyncio's _wait_for_data: `finally: self._waiter = None`.
                if let Some(old) = reader.state.with(py, |st| st.waiter.take()) {
                    python::release(py, old);
                }
                if let Err(err) = python::future_call0(&future, python::FutureMethod::Result) {
                    let spent = reader.state.with(py, |st| st.spent.forget(&future));
                    drop(spent);
                    self.finish(py);
                    return Err(err);
                }
            }
        }
        let mut kind = self.state.with(py, |st| st.kind.take()).expect("an op that is not done has its kind");
        let result = run(py, reader, &mut kind);
        match &result {
            Ok(Outcome::Yield(future)) => {
                let future = future.clone_ref(py);
                self.state.with(py, |st| {
                    st.stage = Stage::Waiting(future);
                    st.kind = Some(kind);
                });
            }
            _ => {
                self.finish(py);
                drop(kind);
            }
        }
        result
    }

    /// The op is over: nothing is held any more.
    fn finish(&self, py: Python<'_>) {
        let (stage, kind, reader) =
            self.state.with(py, |st| (std::mem::replace(&mut st.stage, Stage::Done), st.kind.take(), st.reader.take()));
        if let Stage::Waiting(future) = stage {
            python::release(py, future);
        }
        if let Some(reader) = reader {
            python::release(py, reader);
        }
        drop(kind);
    }

    /// `throw()`: the read ends with `err` raised where it waited (its
    /// waiter forgotten, as asyncio's `finally` does).
    fn throw_in(&self, py: Python<'_>, err: PyErr) -> PyErr {
        let (stage, reader) = self.state.with(py, |st| {
            (std::mem::replace(&mut st.stage, Stage::Done), st.reader.as_ref().map(|r| r.clone_ref(py)))
        });
        match (stage, reader) {
            (Stage::Running, _) => {
                self.state.with(py, |st| st.stage = Stage::Running);
                return PyValueError::new_err("coroutine already executing");
            }
            (Stage::Waiting(future), Some(reader)) => {
                let future = future.into_bound(py);
                let old = reader.get().state.with(py, |st| (st.waiter.take(), st.spent.forget(&future)));
                drop(old);
            }
            _ => {}
        }
        self.finish(py);
        err
    }
}

/// Attempts until the read completes, fails or must wait (then the
/// waiter future is made and returned, as `_wait_for_data` does).
fn run(py: Python<'_>, reader: &ReaderCore, kind: &mut Kind) -> PyResult<Outcome> {
    if let Kind::Start(method, arg) = kind {
        let (method, arg) = (*method, arg.take());
        match start(py, reader, method, arg)? {
            Started::Run(started) => *kind = started,
            Started::Done(value) => return Ok(Outcome::Return(value)),
        }
    }
    match attempt(py, reader, kind)? {
        Attempt::Return(value) => Ok(Outcome::Return(value)),
        Attempt::Wait(name) => wait_for_data(py, reader, name).map(Outcome::Yield),
    }
}

/// The checks a read makes before it looks at the buffer: the read to
/// do, or its result already.
fn start(py: Python<'_>, reader: &ReaderCore, method: Method, arg: Option<Py<PyAny>>) -> PyResult<Started> {
    let empty = || Started::Done(PyBytes::new(py, b"").into_any().unbind());
    Ok(match method {
        Method::Read => {
            raise_exception(py, reader)?;
            let n: isize = match arg {
                Some(a) => a.into_bound(py).extract()?,
                None => -1,
            };
            match n {
                0 => empty(),
                n if n < 0 => Started::Run(Kind::ReadAll { blocks: Vec::new(), waited: false }),
                n => Started::Run(Kind::Read { n: n as usize, waited: false }),
            }
        }
        Method::ReadExactly => {
            let n: isize = arg.expect("readexactly takes n").into_bound(py).extract()?;
            if n < 0 {
                return Err(PyValueError::new_err("readexactly size can not be less than zero"));
            }
            raise_exception(py, reader)?;
            if n == 0 {
                empty()
            } else {
                Started::Run(Kind::Exactly { n: n as usize })
            }
        }
        Method::ReadUntil => {
            let separators = separators(py, arg)?;
            raise_exception(py, reader)?;
            Started::Run(Kind::Until { separators, offset: 0, mode: Until::Raise })
        }
        Method::ReadLine | Method::Next => {
            raise_exception(py, reader)?;
            let mode = if method == Method::Next { Until::Next } else { Until::Line };
            Started::Run(Kind::Until {
                separators: SmallVec::from_elem(SmallVec::from_slice(b"\n"), 1),
                offset: 0,
                mode,
            })
        }
    })
}

/// `if self._exception is not None: raise self._exception`.
fn raise_exception(py: Python<'_>, reader: &ReaderCore) -> PyResult<()> {
    match reader.state.with(py, |st| st.exception.as_ref().map(|e| e.clone_ref(py))) {
        Some(exc) => Err(PyErr::from_value(exc.into_bound(py))),
        None => Ok(()),
    }
}

fn attempt(py: Python<'_>, reader: &ReaderCore, kind: &mut Kind) -> PyResult<Attempt> {
    match kind {
        Kind::Start(..) => unreachable!("started before the first attempt"),
        Kind::Read { n, waited } => {
            if !*waited && reader.state.with(py, |st| st.len(py) == 0 && !st.eof) {
                *waited = true;
                return Ok(Attempt::Wait("read"));
            }
            let data = reader.state.with(py, |st| st.buffer.take_front(py, *n))?;
            reader.maybe_resume_transport(py)?;
            Ok(Attempt::Return(data.into_any().unbind()))
        }
        Kind::ReadAll { blocks, waited } => loop {
            // Each turn is one of asyncio's read(self._limit) calls.
            if !*waited {
                raise_exception(py, reader)?;
                if reader.state.with(py, |st| st.limit > 0 && st.len(py) == 0 && !st.eof) {
                    *waited = true;
                    return Ok(Attempt::Wait("read"));
                }
            }
            *waited = false;
            let block = reader.state.with(py, |st| st.buffer.take_front(py, st.limit.max(0) as usize))?;
            reader.maybe_resume_transport(py)?;
            if block.as_bytes().is_empty() {
                let joined = PyBytes::new(py, b"").call_method1(pyo3::intern!(py, "join"), (&*blocks,))?;
                return Ok(Attempt::Return(joined.unbind()));
            }
            blocks.push(block.unbind());
        },
        Kind::Exactly { n } => {
            let n = *n;
            let found = reader.state.with(py, |st| -> PyResult<Option<Result<(), Bound<'_, PyBytes>>>> {
                if st.len(py) >= n {
                    return Ok(Some(Ok(())));
                }
                if st.eof {
                    return Ok(Some(Err(st.buffer.take_all(py)?)));
                }
                Ok(None)
            })?;
            match found {
                None => Ok(Attempt::Wait("readexactly")),
                Some(Err(partial)) => Err(incomplete_read_error(py, partial, Some(n))?),
                Some(Ok(())) => {
                    let data = reader.state.with(py, |st| st.buffer.take_front(py, n))?;
                    reader.maybe_resume_transport(py)?;
                    Ok(Attempt::Return(data.into_any().unbind()))
                }
            }
        }
        Kind::Until { separators, offset, mode } => until(py, reader, separators, offset, *mode),
    }
}

/// readuntil's loop, asyncio's steps: search from `offset`; past the
/// limit without a match, LimitOverrunError; at EOF, IncompleteReadError
/// with all there is; else wait and search again.
fn until(
    py: Python<'_>,
    reader: &ReaderCore,
    separators: &[Separator],
    offset: &mut isize,
    mode: Until,
) -> PyResult<Attempt> {
    let shortest = separators[0].len() as isize;
    let longest = separators[separators.len() - 1].len() as isize;
    let step = reader.state.with(py, |st| -> PyResult<Searched<'_>> {
        let limit = st.limit;
        let searched = st.buffer.with_contents(py, |buf| {
            let buflen = buf.len() as isize;
            if buflen - *offset >= shortest {
                if let Some(found) = find_earliest_end(buf, separators, *offset as usize) {
                    return Some(Searched::Found(found));
                }
                *offset = (buflen + 1 - longest).max(0);
                if *offset > limit {
                    return Some(Searched::Overrun("Separator is not found, and chunk exceed the limit", *offset));
                }
            }
            None
        })?;
        if let Some(searched) = searched {
            return Ok(searched);
        }
        if st.eof {
            return Ok(Searched::Eof(st.buffer.take_all(py)?));
        }
        Ok(Searched::Nothing)
    })?;
    let (start, end) = match step {
        Searched::Nothing => return Ok(Attempt::Wait("readuntil")),
        Searched::Eof(partial) => {
            return match mode {
                Until::Raise => Err(incomplete_read_error(py, partial, None)?),
                Until::Next if partial.as_bytes().is_empty() => Err(PyStopAsyncIteration::new_err(())),
                Until::Line | Until::Next => Ok(Attempt::Return(partial.into_any().unbind())),
            };
        }
        Searched::Overrun(message, consumed) => return Err(overrun(py, reader, mode, message, consumed)?),
        Searched::Found(found) => found,
    };
    if start as isize > reader.state.with(py, |st| st.limit) {
        return Err(overrun(py, reader, mode, "Separator is found, but chunk is longer than limit", start as isize)?);
    }
    let chunk = reader.state.with(py, |st| st.buffer.take_front(py, end))?;
    reader.maybe_resume_transport(py)?;
    Ok(Attempt::Return(chunk.into_any().unbind()))
}

/// LimitOverrunError(message, consumed); readline turns it into
/// ValueError(message), first dropping the line (through its newline,
/// if that is where the overrun stopped) or else the whole buffer.
fn overrun(py: Python<'_>, reader: &ReaderCore, mode: Until, message: &str, consumed: isize) -> PyResult<PyErr> {
    let overrun = PyErr::from_value(python::streams(py)?.limit_overrun_error.bind(py).call1((message, consumed))?);
    if mode == Until::Raise {
        return Ok(overrun);
    }
    reader.state.with(py, |st| {
        let at = consumed.max(0) as usize;
        if st.buffer.with_contents(py, |buf| buf.get(at..).is_some_and(|rest| rest.starts_with(b"\n")))? {
            st.buffer.consume(py, at + 1)
        } else {
            st.buffer.clear(py)
        }
    })?;
    reader.maybe_resume_transport(py)?;
    let err = PyValueError::new_err(message.to_owned());
    err.set_context(py, Some(overrun));
    Ok(err)
}

/// asyncio's `_wait_for_data(func_name)` up to its `await`: the checks,
/// reading resumed if this reader paused it, and the waiter future made
/// and marked as awaited (what `await future` does before it yields).
fn wait_for_data(py: Python<'_>, reader: &ReaderCore, name: &str) -> PyResult<Py<PyAny>> {
    let checked = reader.state.with(py, |st| {
        if st.waiter.is_some() {
            return Err(PyRuntimeError::new_err(format!(
                "{name}() called while another coroutine is already waiting for incoming data"
            )));
        }
        if st.eof {
            return Err(pyo3::exceptions::PyAssertionError::new_err("_wait_for_data after EOF"));
        }
        let resume = st.paused.then(|| st.transport.as_ref().map(|t| t.clone_ref(py)));
        st.paused = false;
        Ok((resume, st.loop_obj.as_ref().map(|l| l.clone_ref(py))))
    });
    let (resume, loop_obj) = checked?;
    if let Some(transport) = resume {
        resume_reading(py, transport)?;
    }
    let loop_obj = loop_obj.unwrap_or_else(|| py.None()).into_bound(py);
    let renews = crate::eventloop::own_create_future(&loop_obj);
    let future = match renews.then(|| renewed_waiter(py, reader, &loop_obj)).transpose()?.flatten() {
        Some(future) => future,
        None => {
            let future = python::call_method0(&loop_obj, python::event_loop::create_future(py))?;
            if renews {
                let old = reader.state.with(py, |st| st.spent.keep(&future));
                drop(old);
            }
            future
        }
    };
    crate::capi::futures::mark_blocking(&future)?;
    let future = future.unbind();
    let old = reader.state.with(py, |st| st.waiter.replace(future.clone_ref(py)));
    drop(old);
    Ok(future)
}

/// One of the reader's last waiters made new (`eventloop::renew_future`),
/// if one can be: nothing but the reader holds it, and the loop's
/// `create_future` (its own, the caller checked) makes C futures. asyncio
/// makes a future for every wait; this saves its making and freeing. (The
/// last waiter is still held by the handle whose callback is running, the
/// task's wakeup: the one before it is the one renewed.)
fn renewed_waiter<'py>(
    py: Python<'py>,
    reader: &ReaderCore,
    loop_obj: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    for slot in 0..super::state::SPENT_WAITERS {
        let Some(fut) = reader.state.with(py, |st| st.spent.get(py, slot)) else { continue };
        let fut = fut.into_bound(py);
        if crate::capi::futures::reusable(&fut) && crate::eventloop::renew_future(loop_obj, &fut)? {
            return Ok(Some(fut));
        }
    }
    Ok(None)
}

/// What readuntil's search of the buffer found.
enum Searched<'py> {
    Found((usize, usize)),
    Overrun(&'static str, isize),
    Eof(Bound<'py, PyBytes>),
    Nothing,
}

/// The match of any separator that ends first (the shortest one on a tie),
/// searching from `from`: (start, end).
fn find_earliest_end(buf: &[u8], separators: &[Separator], from: usize) -> Option<(usize, usize)> {
    let mut best: Option<(usize, usize)> = None;
    for sep in separators {
        if let Some(start) = find(buf, sep, from) {
            let end = start + sep.len();
            if best.is_none_or(|(_, e)| end < e) {
                best = Some((start, end));
            }
        }
    }
    best
}

/// The first `needle` in `hay[from..]`, as an index into `hay`.
fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    crate::os::find_bytes(hay.get(from..)?, needle).map(|at| from + at)
}

/// readuntil's separators, as asyncio reads its argument: one bytes-like
/// separator, or from 3.13 a tuple of them (tried shortest first); an empty
/// one is a ValueError.
fn separators(py: Python<'_>, arg: Option<Py<PyAny>>) -> PyResult<SmallVec<[Separator; 1]>> {
    let Some(arg) = arg else { return Ok(SmallVec::from_elem(SmallVec::from_slice(b"\n"), 1)) };
    let arg = arg.into_bound(py);
    let one = |obj: &Bound<'_, PyAny>| -> PyResult<Separator> {
        let bytes = crate::transport::buffer::Bytes::get(obj)?;
        Ok(SmallVec::from_slice(bytes.as_slice()))
    };
    let mut separators: SmallVec<[Separator; 1]> = SmallVec::new();
    match arg.cast::<PyTuple>() {
        Ok(tuple) if cfg!(Py_3_13) => {
            for item in tuple.iter() {
                separators.push(one(&item)?);
            }
            if separators.is_empty() {
                return Err(PyValueError::new_err("Separator should contain at least one element"));
            }
            // (A stable sort, as sorted() is.)
            separators.sort_by_key(|s| s.len());
        }
        _ => separators.push(one(&arg)?),
    }
    if separators[0].is_empty() {
        return Err(PyValueError::new_err("Separator should be at least one-byte string"));
    }
    Ok(separators)
}

/// IncompleteReadError(partial, expected).
fn incomplete_read_error(py: Python<'_>, partial: Bound<'_, PyBytes>, expected: Option<usize>) -> PyResult<PyErr> {
    let exc = python::streams(py)?.incomplete_read_error.bind(py).call1((partial, expected))?;
    Ok(PyErr::from_value(exc))
}

/// The exception `throw(typ, val, tb)` raises, as a generator makes it.
fn thrown(
    py: Python<'_>,
    typ: &Bound<'_, PyAny>,
    val: Option<&Bound<'_, PyAny>>,
    tb: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyErr> {
    let val = val.filter(|v| !v.is_none());
    let exc = if let Ok(cls) = typ.cast::<PyType>() {
        match val {
            Some(v) if v.is_instance(cls)? => v.clone(),
            Some(v) => cls.call1((v,))?.into_any(),
            None => cls.call0()?.into_any(),
        }
    } else {
        if val.is_some() {
            return Err(PyTypeError::new_err("instance exception may not have a separate value"));
        }
        typ.clone()
    };
    if let Some(tb) = tb.filter(|t| !t.is_none()) {
        exc.call_method1(pyo3::intern!(py, "with_traceback"), (tb,))?;
    }
    Ok(PyErr::from_value(exc))
}

#[pymethods]
impl ReadOp {
    fn send(&self, py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        match self.advance(py, value)? {
            Outcome::Yield(future) => Ok(future),
            Outcome::Return(value) => Err(PyStopIteration::new_err((value,))),
        }
    }

    #[pyo3(signature = (typ, val = None, tb = None))]
    fn throw(
        &self,
        py: Python<'_>,
        typ: &Bound<'_, PyAny>,
        val: Option<&Bound<'_, PyAny>>,
        tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let err = thrown(py, typ, val, tb)?;
        Err(self.throw_in(py, err))
    }

    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if self.state.with(py, |st| matches!(st.stage, Stage::Running)) {
            return Err(PyValueError::new_err("coroutine already executing"));
        }
        let _ = self.throw_in(py, PyStopIteration::new_err(()));
        Ok(())
    }

    fn __await__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        match self.advance(py, &py.None().into_bound(py))? {
            Outcome::Yield(future) => Ok(Some(future)),
            Outcome::Return(value) => Err(PyStopIteration::new_err((value,))),
        }
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.state.traverse(&visit, |st| {
            visit.call(&st.reader)?;
            if let Stage::Waiting(future) = &st.stage {
                visit.call(future)?;
            }
            match &st.kind {
                Some(Kind::Start(_, arg)) => visit.call(arg),
                Some(Kind::ReadAll { blocks, .. }) => blocks.iter().try_for_each(|b| visit.call(b)),
                _ => Ok(()),
            }
        })
    }

    fn __clear__(&self, py: Python<'_>) {
        self.finish(py);
    }
}

impl Resumable for ReadOp {
    fn resume(slf: &Bound<'_, Self>, value: &Bound<'_, PyAny>) -> PyResult<Resumed> {
        Ok(match slf.get().advance(slf.py(), value)? {
            Outcome::Yield(future) => Resumed::Yield(future),
            Outcome::Return(value) => Resumed::Return(value),
        })
    }
}

/// An awaitable already complete with None: what `drain()` returns when
/// there is nothing to wait for (one object, shared; it keeps no state).
#[pyclass(module = "zuvrs._zuvrs", name = "Completed", frozen)]
pub(crate) struct Completed;

impl Completed {
    pub(super) fn get(py: Python<'_>) -> PyResult<Py<Completed>> {
        static ONE: pyo3::sync::PyOnceLock<Py<Completed>> = pyo3::sync::PyOnceLock::new();
        ONE.get_or_try_init(py, || Py::new(py, Completed)).map(|c| c.clone_ref(py))
    }
}

#[pymethods]
impl Completed {
    fn send(&self, _value: &Bound<'_, PyAny>) -> PyResult<()> {
        Err(PyStopIteration::new_err(()))
    }

    #[pyo3(signature = (typ, val = None, tb = None))]
    fn throw(
        &self,
        py: Python<'_>,
        typ: &Bound<'_, PyAny>,
        val: Option<&Bound<'_, PyAny>>,
        tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        Err(thrown(py, typ, val, tb)?)
    }

    fn close(&self) {}

    fn __await__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__(&self) -> PyResult<()> {
        Err(PyStopIteration::new_err(()))
    }

    fn __repr__(&self) -> &'static str {
        "<zuvrs.streams completed awaitable>"
    }
}

impl Resumable for Completed {
    fn resume(slf: &Bound<'_, Self>, _value: &Bound<'_, PyAny>) -> PyResult<Resumed> {
        Ok(Resumed::Return(slf.py().None()))
    }
}

/// Puts capi.rs's resumption slots into the types, in place of pyo3's
/// `__next__` trampolines.
pub(super) fn install_slots(py: Python<'_>) {
    install_resume_slots::<ReadOp>(py);
    install_resume_slots::<Completed>(py);
}
