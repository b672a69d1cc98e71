//! `ReaderCore`'s methods: those of `zuvrs.streams.StreamReader`, asyncio's
//! `StreamReader` done natively (its state and the steps that change it are
//! in state.rs).
//!
//! The state is asyncio's, attribute for attribute (`_buffer`, `_limit`,
//! `_eof`, `_waiter`, `_exception`, `_transport`, `_paused`, `_loop` are
//! properties over it, so code that reads or sets them works unchanged), and
//! `_buffer` is a real `bytearray` that keeps its identity while Python code
//! holds it (buffer.rs): code that holds `reader._buffer`, searches it or
//! clears it sees what asyncio would show.
//! The reads (`read`, `readline`, `readuntil`, `readexactly`, `__anext__`)
//! return the awaitables of ops.rs.
//!
//! A transport feeds the reader without Python (`ReadSink`, attached by
//! `attach_reader` in mod.rs); `feed_data` is the same step for Python
//! callers.

use pyo3::exceptions::PyAssertionError;
use pyo3::prelude::*;
use pyo3::types::PyByteArray;
use pyo3::{PyTraverseError, PyVisit};

use super::buffer::ReadBuffer;
use super::none_as_absent;
use super::ops::{Method, ReadOp};
use super::patched::{asyncio_if_patched, READER};
use super::state::{ReaderCore, ReaderState, DEFAULT_LIMIT};
use crate::cell::NativeCell;
use crate::python;
use crate::transport::buffer::Bytes;

impl ReaderCore {
    /// The op of a read: the last one made again, if only this reader
    /// holds it (a finished op holds nothing), else a new one.
    fn op(slf: &Bound<'_, Self>, method: Method, arg: Option<Py<PyAny>>) -> PyResult<Py<ReadOp>> {
        let py = slf.py();
        let spare = slf.get().state.with(py, |st| st.spare.as_ref().map(|op| op.clone_ref(py)));
        if let Some(op) = spare.and_then(|op| op.into_bound(py).cast_into::<ReadOp>().ok()).map(Bound::unbind) {
            // Two references (the slot's and this one): nobody else has it.
            let unshared = crate::capi::refcount(&op) == 2;
            if unshared && op.get().is_done(py) {
                op.get().reuse(py, slf.clone().unbind(), method, arg);
                return Ok(op);
            }
        }
        let op = ReadOp::new(py, slf.clone().unbind(), method, arg)?;
        let old = slf.get().state.with(py, |st| st.spare.replace(op.clone_ref(py).into_any()));
        drop(old);
        Ok(op)
    }
}

/// `method(arg)`, or `method()` when the caller gave no argument (the
/// method's own default applies).
fn call_with_optional<'py>(method: &Bound<'py, PyAny>, arg: Option<&Py<PyAny>>) -> PyResult<Bound<'py, PyAny>> {
    match arg {
        Some(arg) => method.call1((arg,)),
        None => method.call0(),
    }
}

#[pymethods]
impl ReaderCore {
    /// The state asyncio's `StreamReader.__init__` then sets (its arguments
    /// are that method's).
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn new(_py: Python<'_>, _args: &Bound<'_, PyAny>, _kwargs: Option<&Bound<'_, PyAny>>) -> Self {
        ReaderCore {
            state: NativeCell::new(ReaderState {
                buffer: ReadBuffer::new(),
                limit: DEFAULT_LIMIT,
                eof: false,
                waiter: None,
                exception: None,
                transport: None,
                paused: false,
                loop_obj: None,
                spare: None,
                spent: Default::default(),
            }),
        }
    }

    /// What asyncio's `__init__(limit, loop)` sets besides the fresh state,
    /// for an int limit > 0 and a loop (zuvrs.streams checks them).
    fn _set_up(&self, py: Python<'_>, limit: isize, loop_obj: Py<PyAny>) {
        let old = self.state.with(py, |st| {
            st.limit = limit;
            st.loop_obj.replace(loop_obj)
        });
        drop(old);
    }

    fn exception(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        asyncio_if_patched!(READER, slf, "exception", ());
        Ok(slf.get().get_exception(slf.py()).unwrap_or_else(|| slf.py().None()))
    }

    fn set_exception(slf: &Bound<'_, Self>, exc: Py<PyAny>) -> PyResult<Py<PyAny>> {
        asyncio_if_patched!(READER, slf, "set_exception", (&exc,));
        let py = slf.py();
        let (old, waiter) = slf.get().state.with(py, |st| (st.exception.replace(exc.clone_ref(py)), st.waiter.take()));
        drop(old);
        if let Some(waiter) = waiter {
            let waiter = waiter.bind(py);
            if !python::future_call0(waiter, python::FutureMethod::Cancelled)?.is_truthy()? {
                python::future_call1(waiter, python::FutureMethod::SetException, exc.bind(py))?;
            }
        }
        Ok(py.None())
    }

    fn _wakeup_waiter(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        asyncio_if_patched!(READER, slf, "_wakeup_waiter", ());
        slf.get().wakeup_waiter(slf.py())?;
        Ok(slf.py().None())
    }

    fn set_transport(slf: &Bound<'_, Self>, transport: Py<PyAny>) -> PyResult<Py<PyAny>> {
        asyncio_if_patched!(READER, slf, "set_transport", (&transport,));
        slf.get().state.with(slf.py(), |st| {
            if st.transport.is_some() {
                return Err(PyAssertionError::new_err("Transport already set"));
            }
            st.transport = Some(transport);
            Ok(())
        })?;
        Ok(slf.py().None())
    }

    fn _maybe_resume_transport(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        asyncio_if_patched!(READER, slf, "_maybe_resume_transport", ());
        slf.get().maybe_resume_transport(slf.py())?;
        Ok(slf.py().None())
    }

    fn feed_eof(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        asyncio_if_patched!(READER, slf, "feed_eof", ());
        let py = slf.py();
        slf.get().state.with(py, |st| st.eof = true);
        slf.get().wakeup_waiter(py)?;
        Ok(py.None())
    }

    fn at_eof(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        asyncio_if_patched!(READER, slf, "at_eof", ());
        let py = slf.py();
        let at_eof = slf.get().state.with(py, |st| st.eof && st.len(py) == 0);
        Ok(pyo3::types::PyBool::new(py, at_eof).to_owned().into_any().unbind())
    }

    fn feed_data(slf: &Bound<'_, Self>, data: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        asyncio_if_patched!(READER, slf, "feed_data", (data,));
        let py = slf.py();
        let me = slf.get();
        if me.state.with(py, |st| st.eof) {
            return Err(PyAssertionError::new_err("feed_data after feed_eof"));
        }
        if !data.is_truthy()? {
            return Ok(py.None());
        }
        match Bytes::get(data) {
            Ok(bytes) => me.append(py, bytes.as_slice())?,
            // Not bytes-like: what bytearray.extend makes of it (an
            // iterable of ints, or its TypeError).
            Err(_) => {
                let buffer = me.state.with(py, |st| st.buffer.expose(py));
                python::call_method(buffer.bind(py).as_any(), pyo3::intern!(py, "extend"), (data,))?;
            }
        }
        me.after_feed(py)?;
        Ok(py.None())
    }

    #[pyo3(signature = (n = None))]
    fn read(slf: &Bound<'_, Self>, n: Option<Py<PyAny>>) -> PyResult<Py<PyAny>> {
        if let Some(method) = READER.asyncio_method(slf.as_any(), "read")? {
            return Ok(call_with_optional(&method, n.as_ref())?.unbind());
        }
        Ok(Self::op(slf, Method::Read, n)?.into_any())
    }

    fn readline(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        asyncio_if_patched!(READER, slf, "readline", ());
        Ok(Self::op(slf, Method::ReadLine, None)?.into_any())
    }

    #[pyo3(signature = (separator = None))]
    fn readuntil(slf: &Bound<'_, Self>, separator: Option<Py<PyAny>>) -> PyResult<Py<PyAny>> {
        if let Some(method) = READER.asyncio_method(slf.as_any(), "readuntil")? {
            return Ok(call_with_optional(&method, separator.as_ref())?.unbind());
        }
        Ok(Self::op(slf, Method::ReadUntil, separator)?.into_any())
    }

    fn readexactly(slf: &Bound<'_, Self>, n: Py<PyAny>) -> PyResult<Py<PyAny>> {
        asyncio_if_patched!(READER, slf, "readexactly", (&n,));
        Ok(Self::op(slf, Method::ReadExactly, Some(n))?.into_any())
    }

    fn __anext__(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        asyncio_if_patched!(READER, slf, "__anext__", ());
        Ok(Self::op(slf, Method::Next, None)?.into_any())
    }

    #[getter(_buffer)]
    fn get_buffer(&self, py: Python<'_>) -> Py<PyByteArray> {
        self.state.with(py, |st| st.buffer.expose(py))
    }

    #[setter(_buffer)]
    fn set_buffer(&self, py: Python<'_>, buffer: Py<PyByteArray>) {
        let old = self.state.with(py, |st| st.buffer.replace(buffer));
        drop(old);
    }

    #[getter(_limit)]
    fn get_limit(&self, py: Python<'_>) -> isize {
        self.state.with(py, |st| st.limit)
    }

    #[setter(_limit)]
    fn set_limit(&self, py: Python<'_>, limit: isize) {
        self.state.with(py, |st| st.limit = limit)
    }

    #[getter(_eof)]
    fn get_eof(&self, py: Python<'_>) -> bool {
        self.state.with(py, |st| st.eof)
    }

    #[setter(_eof)]
    fn set_eof(&self, py: Python<'_>, eof: &Bound<'_, PyAny>) -> PyResult<()> {
        let eof = eof.is_truthy()?;
        self.state.with(py, |st| st.eof = eof);
        Ok(())
    }

    #[getter(_paused)]
    fn get_paused(&self, py: Python<'_>) -> bool {
        self.state.with(py, |st| st.paused)
    }

    #[setter(_paused)]
    fn set_paused(&self, py: Python<'_>, paused: &Bound<'_, PyAny>) -> PyResult<()> {
        let paused = paused.is_truthy()?;
        self.state.with(py, |st| st.paused = paused);
        Ok(())
    }

    #[getter(_waiter)]
    fn get_waiter(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.state.with(py, |st| st.waiter.as_ref().map(|w| w.clone_ref(py)))
    }

    #[setter(_waiter)]
    fn set_waiter(&self, py: Python<'_>, waiter: Option<Py<PyAny>>) {
        let old = self.state.with(py, |st| std::mem::replace(&mut st.waiter, none_as_absent(py, waiter)));
        drop(old);
    }

    #[getter(_exception)]
    fn get_exception(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.state.with(py, |st| st.exception.as_ref().map(|e| e.clone_ref(py)))
    }

    #[setter(_exception)]
    fn set_exception_attr(&self, py: Python<'_>, exc: Option<Py<PyAny>>) {
        let old = self.state.with(py, |st| std::mem::replace(&mut st.exception, none_as_absent(py, exc)));
        drop(old);
    }

    #[getter(_transport)]
    fn get_transport(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.state.with(py, |st| st.transport.as_ref().map(|t| t.clone_ref(py)))
    }

    #[setter(_transport)]
    fn set_transport_attr(&self, py: Python<'_>, transport: Option<Py<PyAny>>) {
        let old = self.state.with(py, |st| std::mem::replace(&mut st.transport, none_as_absent(py, transport)));
        drop(old);
    }

    #[getter(_loop)]
    fn get_loop(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.state.with(py, |st| st.loop_obj.as_ref().map(|l| l.clone_ref(py)))
    }

    #[setter(_loop)]
    fn set_loop(&self, py: Python<'_>, loop_obj: Option<Py<PyAny>>) {
        let old = self.state.with(py, |st| std::mem::replace(&mut st.loop_obj, none_as_absent(py, loop_obj)));
        drop(old);
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.state.traverse(&visit, |st| {
            st.buffer.visit(&visit)?;
            visit.call(&st.waiter)?;
            visit.call(&st.exception)?;
            visit.call(&st.transport)?;
            visit.call(&st.loop_obj)?;
            visit.call(&st.spare)?;
            st.spent.traverse(&visit)
        })
    }

    fn __clear__(&self, py: Python<'_>) {
        let old = self.state.with(py, |st| {
            (st.waiter.take(), st.exception.take(), st.transport.take(), st.loop_obj.take(), st.spent.take())
        });
        drop(old);
    }
}

/// The reads' C entries (capi::methods): one call per read, pyo3's
/// argument handling skipped for a call by position or by name.
mod entries {
    use pyo3::prelude::*;
    use pyo3::Borrowed;

    use super::ReaderCore;
    use crate::capi::methods::c_method;

    fn owned(arg: Option<Borrowed<'_, '_, PyAny>>) -> Option<Py<PyAny>> {
        arg.map(|a| a.to_owned().unbind())
    }

    c_method!(Read: ReaderCore, c"read"(c"n") 0..=1, |slf, arg| ReaderCore::read(slf, owned(arg)));
    c_method!(ReadExactly: ReaderCore, c"readexactly"(c"n") 1..=1, |slf, arg| ReaderCore::readexactly(
        slf,
        owned(arg).expect("one argument")
    ));
    c_method!(ReadLine: ReaderCore, c"readline"(c"") 0..=0, |slf, _arg| ReaderCore::readline(slf));
    c_method!(ReadUntil: ReaderCore, c"readuntil"(c"separator") 0..=1, |slf, arg| ReaderCore::readuntil(
        slf,
        owned(arg)
    ));
}

/// Puts the reads' C entries on the reader's class.
pub(super) fn install_entries(py: Python<'_>) -> PyResult<()> {
    use crate::capi::methods::install;
    install::<entries::Read>(py)?;
    install::<entries::ReadExactly>(py)?;
    install::<entries::ReadLine>(py)?;
    install::<entries::ReadUntil>(py)
}
