//! `ProtocolCore`: the state and once-per-connection steps of
//! `zuvrs.streams.StreamReaderProtocol`, asyncio's `StreamReaderProtocol`
//! done natively.
//!
//! asyncio's protocol is a dozen attributes and four Python methods run on
//! every connection (`__init__`, `connection_made`, `connection_lost`,
//! `eof_received`), with a server's writer, handler task and its done
//! callback on top. Here the attributes (`_loop`, `_paused`,
//! `_connection_lost`, `_drain_waiters`, `_stream_reader_wr`,
//! `_strong_reader`, `_reject_connection`, `_stream_writer`, `_task`,
//! `_transport`, `_client_connected_cb`, `_over_ssl`, `_closed`,
//! `_source_traceback`) are properties over native fields, so asyncio's
//! other methods (`_drain_helper`, `pause_writing`, `resume_writing`,
//! `data_received`, `_replace_writer`, ...) work on them unchanged, and the
//! steps are native. Two of asyncio's objects are made on first use: the
//! deque of drain waiters and the future `wait_closed()` awaits (made done
//! if the connection is over already), so a connection nobody waits on
//! makes neither.
//!
//! A zuvrs transport feeds the protocol's native reader without Python
//! (`attach_reader`); `configure` tells this module, once, which classes
//! allow that (python/zuvrs/streams.py).

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyType, PyWeakrefReference};
use pyo3::{intern, PyTraverseError, PyVisit};

use super::none_as_absent;
use super::patched::{asyncio_if_patched, PROTOCOL};
use super::state::{self, ReaderCore};
use crate::cell::NativeCell;
use crate::python;
use crate::transport::stream::StreamCore;

/// Up to 3.12 the protocol keeps the server's writer; from 3.11 a handler
/// that fails is reported and its transport closed; from 3.13 a cancelled
/// one closes it too.
const KEEPS_SERVER_WRITER: bool = !cfg!(Py_3_13);
const REPORTS_HANDLER_FAILURE: bool = cfg!(Py_3_11);
const CANCELLED_HANDLER_CLOSES: bool = cfg!(Py_3_13);

/// The Python classes connection_made decides by (`configure`).
struct Classes {
    /// zuvrs's socket transport, its own `get_extra_info`, and the TLS
    /// transport: those whose core can feed a reader.
    socket_transport: Py<PyType>,
    socket_get_extra_info: Py<PyAny>,
    tls_transport: Py<PyType>,
    /// `zuvrs.streams.StreamReader.feed_data`, asyncio's
    /// `StreamReaderProtocol.data_received` and `.connection_made`.
    reader_feed_data: Py<PyAny>,
    data_received: Py<PyAny>,
    asyncio_connection_made: Py<PyAny>,
    /// `zuvrs.streams.StreamWriter`, a server connection's writer.
    writer_class: Py<PyAny>,
    /// `asyncio.coroutines.iscoroutine`, and what it says yes to first.
    iscoroutine: Py<PyAny>,
    coroutine_type: Py<PyAny>,
    /// `collections.deque`.
    deque: Py<PyAny>,
}

static CLASSES: PyOnceLock<Classes> = PyOnceLock::new();

fn classes(py: Python<'_>) -> PyResult<&Classes> {
    CLASSES.get(py).ok_or_else(|| PyRuntimeError::new_err("zuvrs.streams is not configured"))
}

#[derive(Default)]
struct ProtocolState {
    loop_obj: Option<Py<PyAny>>,
    paused: bool,
    connection_lost: bool,
    /// The drain waiters' deque, once made.
    drain_waiters: Option<Py<PyAny>>,
    /// A weak reference to the reader (asyncio's `_stream_reader_wr`).
    reader_wr: Option<Py<PyAny>>,
    source_traceback: Option<Py<PyAny>>,
    /// A server's reader, held until the connection is made.
    strong_reader: Option<Py<PyAny>>,
    reject_connection: bool,
    stream_writer: Option<Py<PyAny>>,
    task: Option<Py<PyAny>>,
    transport: Option<Py<PyAny>>,
    client_connected_cb: Option<Py<PyAny>>,
    over_ssl: bool,
    /// The future `wait_closed()` awaits, once made.
    closed: Option<Py<PyAny>>,
    /// The connection ended before anyone asked for that future: with
    /// this exception (None: a clean end).
    closed_by: Option<Option<Py<PyAny>>>,
}

#[pyclass(module = "zuvrs._zuvrs", name = "StreamReaderProtocolCore", subclass, frozen)]
pub(crate) struct ProtocolCore {
    state: NativeCell<ProtocolState>,
}

/// `fut.set_result(None)`, or `fut.set_exception(exc)`.
fn settle(fut: &Bound<'_, PyAny>, exc: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
    let py = fut.py();
    match exc {
        None => python::future_call1(fut, python::FutureMethod::SetResult, pyo3::types::PyNone::get(py).as_any()),
        Some(exc) => python::future_call1(fut, python::FutureMethod::SetException, exc),
    }
    .map(drop)
}

/// An optional field's value for Python (None when absent).
fn or_none(py: Python<'_>, value: &Option<Py<PyAny>>) -> Py<PyAny> {
    value.as_ref().map_or_else(|| py.None(), |v| v.clone_ref(py))
}

impl ProtocolCore {
    /// asyncio's `connection_lost` (this class's and FlowControlMixin's),
    /// with the closing future made only if it is wanted.
    fn lose_connection(&self, py: Python<'_>, exc: &Bound<'_, PyAny>) -> PyResult<()> {
        let exc = (!exc.is_none()).then_some(exc);
        if let Some(reader) = self.reader(py)? {
            match exc {
                None => python::call_method0(&reader, intern!(py, "feed_eof"))?,
                Some(exc) => python::call_method(&reader, intern!(py, "set_exception"), (exc,))?,
            };
        }
        let closed = self.state.with(py, |st| {
            let closed = st.closed.as_ref().map(|c| c.clone_ref(py));
            if closed.is_none() {
                st.closed_by = Some(exc.map(|e| e.clone().unbind()));
            }
            closed
        });
        if let Some(closed) = closed {
            let closed = closed.bind(py);
            if !python::future_call0(closed, python::FutureMethod::Done)?.is_truthy()? {
                settle(closed, exc)?;
            }
        }
        let waiters = self.state.with(py, |st| {
            st.connection_lost = true;
            if st.paused {
                st.drain_waiters.as_ref().map(|w| w.clone_ref(py))
            } else {
                None
            }
        });
        if let Some(waiters) = waiters {
            for waiter in waiters.bind(py).try_iter()? {
                let waiter = waiter?;
                if !python::future_call0(&waiter, python::FutureMethod::Done)?.is_truthy()? {
                    settle(&waiter, exc)?;
                }
            }
        }
        let old = self
            .state
            .with(py, |st| (st.reader_wr.take(), st.stream_writer.take(), st.task.take(), st.transport.take()));
        drop(old);
        Ok(())
    }

    /// An optional field, as Python sees it (None when absent).
    fn field(&self, py: Python<'_>, f: fn(&mut ProtocolState) -> &mut Option<Py<PyAny>>) -> Py<PyAny> {
        self.state.with(py, |st| or_none(py, f(st)))
    }

    /// Sets an optional field (None, or a deletion, makes it absent).
    fn set_field(&self, py: Python<'_>, f: fn(&mut ProtocolState) -> &mut Option<Py<PyAny>>, value: Option<Py<PyAny>>) {
        let old = self.state.with(py, |st| std::mem::replace(f(st), none_as_absent(py, value)));
        drop(old);
    }

    /// Sets a flag to the truth of `value` (a deletion clears it).
    fn set_flag(
        &self,
        py: Python<'_>,
        f: fn(&mut ProtocolState) -> &mut bool,
        value: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let value = value.map_or(Ok(false), |v| v.is_truthy())?;
        self.state.with(py, |st| *f(st) = value);
        Ok(())
    }

    fn reader<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(wr) = self.state.with(py, |st| st.reader_wr.as_ref().map(|w| w.clone_ref(py))) else {
            return Ok(None);
        };
        let reader = python::call(wr.bind(py), ())?;
        Ok((!reader.is_none()).then_some(reader))
    }

    /// Whether `transport`'s extra info says 'sslcontext' (a connection
    /// zuvrs set up natively, whose extra info is not made, has none:
    /// asking would make it for nothing).
    fn is_over_ssl(&self, py: Python<'_>, transport: &Bound<'_, PyAny>, c: &Classes) -> PyResult<bool> {
        if transport.get_type().is(c.socket_transport.bind(py))
            && transport.getattr(intern!(py, "_extra_dict"))?.is_none()
            && c.socket_transport.bind(py).getattr(intern!(py, "get_extra_info"))?.is(c.socket_get_extra_info.bind(py))
        {
            return Ok(false);
        }
        let ctx = python::call_method(transport, intern!(py, "get_extra_info"), ("sslcontext",))?;
        Ok(!ctx.is_none())
    }

    /// The reads of `transport` for this protocol go to `reader` natively,
    /// where that is all `data_received` would do with them.
    fn attach_reader(
        slf: &Bound<'_, Self>,
        transport: &Bound<'_, PyAny>,
        reader: &Bound<'_, PyAny>,
        c: &Classes,
    ) -> PyResult<()> {
        let py = slf.py();
        let Ok(native) = reader.cast::<ReaderCore>() else { return Ok(()) };
        let feeds =
            transport.is_instance(c.socket_transport.bind(py))? || transport.is_instance(c.tls_transport.bind(py))?;
        if !feeds
            || !reader.get_type().getattr(intern!(py, "feed_data"))?.is(c.reader_feed_data.bind(py))
            || !slf.get_type().getattr(intern!(py, "data_received"))?.is(c.data_received.bind(py))
            || !state::sink_serves(py)
        {
            return Ok(());
        }
        let core = transport.getattr(python::transport::_core(py))?;
        let core = core.cast::<StreamCore>()?;
        core.get().attach_sink(py, slf.clone().into_any().unbind(), state::sink(native.clone().unbind()));
        Ok(())
    }

    /// A server's connection: its writer and the handler run (a coroutine
    /// as a task), as asyncio does on this Python.
    fn serve(
        slf: &Bound<'_, Self>,
        transport: &Bound<'_, PyAny>,
        reader: Option<&Bound<'_, PyAny>>,
        handler: &Bound<'_, PyAny>,
        c: &Classes,
    ) -> PyResult<()> {
        let py = slf.py();
        let me = slf.get();
        let loop_obj = me.state.with(py, |st| or_none(py, &st.loop_obj));
        let reader = reader.map_or_else(|| py.None().into_bound(py), |r| r.clone());
        let writer = python::call(c.writer_class.bind(py), (transport, slf, &reader, &loop_obj))?;
        if KEEPS_SERVER_WRITER {
            let old = me.state.with(py, |st| st.stream_writer.replace(writer.clone().unbind()));
            drop(old);
        }
        let result = python::call(handler, (&reader, &writer))?;
        let coroutine = result.get_type().is(c.coroutine_type.bind(py))
            || python::call(c.iscoroutine.bind(py), (&result,))?.is_truthy()?;
        if coroutine {
            let task = python::call_method(loop_obj.bind(py), intern!(py, "create_task"), (&result,))?;
            let old = me.state.with(py, |st| st.task.replace(task.clone().unbind()));
            drop(old);
            if REPORTS_HANDLER_FAILURE {
                let done = HandlerDone { loop_obj: loop_obj.clone_ref(py), transport: transport.clone().unbind() };
                python::call_method(&task, intern!(py, "add_done_callback"), (Py::new(py, done)?,))?;
            }
        }
        let old = me.state.with(py, |st| st.strong_reader.take());
        drop(old);
        Ok(())
    }

    /// The `wait_closed()` future, made now if it was not.
    fn closed_future(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let (closed, loop_obj) =
            self.state.with(py, |st| (st.closed.as_ref().map(|c| c.clone_ref(py)), or_none(py, &st.loop_obj)));
        if let Some(closed) = closed {
            return Ok(closed);
        }
        let fut = python::call_method0(loop_obj.bind(py), python::event_loop::create_future(py))?;
        let ended = self.state.with(py, |st| {
            st.closed = Some(fut.clone().unbind());
            st.closed_by.take()
        });
        if let Some(exc) = ended {
            // The connection is over already: with its outcome.
            settle(&fut, exc.as_ref().map(|e| e.bind(py)))?;
        }
        Ok(fut.unbind())
    }
}

/// A server handler task's done callback (asyncio's, from 3.11): a handler
/// that failed is reported and its transport closed (from 3.13, a
/// cancelled one closes it too).
#[pyclass(module = "zuvrs._zuvrs", frozen)]
struct HandlerDone {
    loop_obj: Py<PyAny>,
    transport: Py<PyAny>,
}

#[pymethods]
impl HandlerDone {
    fn __call__(&self, py: Python<'_>, task: &Bound<'_, PyAny>) -> PyResult<()> {
        let transport = self.transport.bind(py);
        let close = intern!(py, "close");
        if CANCELLED_HANDLER_CLOSES && python::future_call0(task, python::FutureMethod::Cancelled)?.is_truthy()? {
            python::call_method0(transport, close)?;
            return Ok(());
        }
        let exc = python::call_method0(task, intern!(py, "exception"))?;
        if exc.is_none() {
            return Ok(());
        }
        let context = PyDict::new(py);
        context.set_item("message", "Unhandled exception in client_connected_cb")?;
        context.set_item("exception", exc)?;
        context.set_item("transport", transport)?;
        python::call_method(self.loop_obj.bind(py), intern!(py, "call_exception_handler"), (context,))?;
        python::call_method0(transport, close)?;
        Ok(())
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.loop_obj)?;
        visit.call(&self.transport)
    }
}

#[pymethods]
impl ProtocolCore {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn new(_args: &Bound<'_, PyAny>, _kwargs: Option<&Bound<'_, PyAny>>) -> Self {
        ProtocolCore { state: NativeCell::new(ProtocolState::default()) }
    }

    /// The classes connection_made decides by (zuvrs.streams, once).
    #[staticmethod]
    #[allow(clippy::too_many_arguments)]
    fn _configure(
        py: Python<'_>,
        socket_transport: Py<PyType>,
        tls_transport: Py<PyType>,
        reader_feed_data: Py<PyAny>,
        writer_class: Py<PyAny>,
    ) -> PyResult<()> {
        let asyncio_protocol = py.import("asyncio.streams")?.getattr("StreamReaderProtocol")?;
        let classes = Classes {
            socket_get_extra_info: socket_transport.bind(py).getattr("get_extra_info")?.unbind(),
            socket_transport,
            tls_transport,
            reader_feed_data,
            data_received: asyncio_protocol.getattr("data_received")?.unbind(),
            asyncio_connection_made: asyncio_protocol.getattr("connection_made")?.unbind(),
            writer_class,
            iscoroutine: py.import("asyncio.coroutines")?.getattr("iscoroutine")?.unbind(),
            coroutine_type: py.import("types")?.getattr("CoroutineType")?.unbind(),
            deque: py.import("collections")?.getattr("deque")?.unbind(),
        };
        let _ = CLASSES.set(py, classes);
        Ok(())
    }

    /// asyncio's `__init__(stream_reader, client_connected_cb, loop)` for a
    /// given loop, without the objects made on first use.
    fn _set_up(
        &self,
        py: Python<'_>,
        stream_reader: &Bound<'_, PyAny>,
        client_connected_cb: &Bound<'_, PyAny>,
        loop_obj: Py<PyAny>,
    ) -> PyResult<()> {
        let (reader_wr, source_traceback) = if stream_reader.is_none() {
            (None, None)
        } else {
            let wr = PyWeakrefReference::new(stream_reader)?.into_any().unbind();
            let tb = stream_reader.getattr(intern!(py, "_source_traceback"))?;
            (Some(wr), none_as_absent(py, Some(tb.unbind())))
        };
        let cb = none_as_absent(py, Some(client_connected_cb.clone().unbind()));
        let strong = cb.is_some().then(|| stream_reader.clone().unbind());
        let old = self.state.with(py, |st| {
            std::mem::replace(
                st,
                ProtocolState {
                    loop_obj: Some(loop_obj),
                    reader_wr,
                    source_traceback,
                    strong_reader: none_as_absent(py, strong),
                    client_connected_cb: cb,
                    ..ProtocolState::default()
                },
            )
        });
        drop(old);
        Ok(())
    }

    /// asyncio's steps without the server's own (they would make asyncio's
    /// writer): the rejection check (asyncio's own code), the transport
    /// given to the protocol and the reader, whether it is TLS, the
    /// transport feeding the reader natively; then a server's writer and
    /// handler.
    fn connection_made(slf: &Bound<'_, Self>, transport: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        asyncio_if_patched!(PROTOCOL, slf, "connection_made", (transport,));
        let py = slf.py();
        let me = slf.get();
        let c = classes(py)?;
        let (reject, handler) =
            me.state.with(py, |st| (st.reject_connection, st.client_connected_cb.as_ref().map(|h| h.clone_ref(py))));
        if reject {
            // asyncio's own, without the server's part.
            me.state.with(py, |st| st.client_connected_cb = None);
            let made = python::call(c.asyncio_connection_made.bind(py), (slf, transport));
            me.state.with(py, |st| st.client_connected_cb = handler);
            return made.map(Bound::unbind);
        }
        let old = me.state.with(py, |st| st.transport.replace(transport.clone().unbind()));
        drop(old);
        let reader = me.reader(py)?;
        if let Some(reader) = &reader {
            python::call_method(reader, intern!(py, "set_transport"), (transport,))?;
        }
        let over_ssl = me.is_over_ssl(py, transport, c)?;
        me.state.with(py, |st| st.over_ssl = over_ssl);
        if let Some(reader) = &reader {
            Self::attach_reader(slf, transport, reader, c)?;
        }
        if let Some(handler) = handler {
            Self::serve(slf, transport, reader.as_ref(), handler.bind(py), c)?;
        }
        Ok(py.None())
    }

    fn connection_lost(slf: &Bound<'_, Self>, exc: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        asyncio_if_patched!(PROTOCOL, slf, "connection_lost", (exc,));
        slf.get().lose_connection(slf.py(), exc)?;
        Ok(slf.py().None())
    }

    /// asyncio's: the reader's EOF; False keeps a TLS transport open (it
    /// closes itself), True closes a plain one.
    fn eof_received(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        asyncio_if_patched!(PROTOCOL, slf, "eof_received", ());
        let py = slf.py();
        let me = slf.get();
        if let Some(reader) = me.reader(py)? {
            python::call_method0(&reader, intern!(py, "feed_eof"))?;
        }
        let keep_open = !me.state.with(py, |st| st.over_ssl);
        Ok(pyo3::types::PyBool::new(py, keep_open).to_owned().into_any().unbind())
    }

    fn _get_close_waiter(slf: &Bound<'_, Self>, stream: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        asyncio_if_patched!(PROTOCOL, slf, "_get_close_waiter", (stream,));
        slf.get().closed_future(slf.py())
    }

    #[getter(_stream_reader)]
    fn get_stream_reader(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        Ok(self.reader(py)?.map(Bound::unbind))
    }

    #[getter(_closed)]
    fn get_closed(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.closed_future(py)
    }

    #[setter(_closed)]
    fn set_closed(&self, py: Python<'_>, fut: Option<Py<PyAny>>) {
        self.set_field(py, |st| &mut st.closed, fut);
    }

    /// The closing future if it was made (None otherwise): what `__del__`
    /// looks at.
    #[getter(_closed_future)]
    fn get_closed_future(&self, py: Python<'_>) -> Py<PyAny> {
        self.field(py, |st| &mut st.closed)
    }

    #[getter(_drain_waiters)]
    fn get_drain_waiters(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        if let Some(w) = self.state.with(py, |st| st.drain_waiters.as_ref().map(|w| w.clone_ref(py))) {
            return Ok(w);
        }
        let deque = python::call(classes(py)?.deque.bind(py), ())?.unbind();
        self.state.with(py, |st| st.drain_waiters = Some(deque.clone_ref(py)));
        Ok(deque)
    }

    #[setter(_drain_waiters)]
    fn set_drain_waiters(&self, py: Python<'_>, waiters: Option<Py<PyAny>>) {
        self.set_field(py, |st| &mut st.drain_waiters, waiters);
    }

    #[getter(_loop)]
    fn get_loop(&self, py: Python<'_>) -> Py<PyAny> {
        self.field(py, |st| &mut st.loop_obj)
    }

    #[setter(_loop)]
    fn set_loop(&self, py: Python<'_>, value: Option<Py<PyAny>>) {
        self.set_field(py, |st| &mut st.loop_obj, value);
    }

    #[getter(_paused)]
    fn get_paused(&self, py: Python<'_>) -> bool {
        self.state.with(py, |st| st.paused)
    }

    #[setter(_paused)]
    fn set_paused(&self, py: Python<'_>, value: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        self.set_flag(py, |st| &mut st.paused, value)
    }

    #[getter(_connection_lost)]
    fn get_connection_lost(&self, py: Python<'_>) -> bool {
        self.state.with(py, |st| st.connection_lost)
    }

    #[setter(_connection_lost)]
    fn set_connection_lost(&self, py: Python<'_>, value: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        self.set_flag(py, |st| &mut st.connection_lost, value)
    }

    #[getter(_reject_connection)]
    fn get_reject_connection(&self, py: Python<'_>) -> bool {
        self.state.with(py, |st| st.reject_connection)
    }

    #[setter(_reject_connection)]
    fn set_reject_connection(&self, py: Python<'_>, value: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        self.set_flag(py, |st| &mut st.reject_connection, value)
    }

    #[getter(_over_ssl)]
    fn get_over_ssl(&self, py: Python<'_>) -> bool {
        self.state.with(py, |st| st.over_ssl)
    }

    #[setter(_over_ssl)]
    fn set_over_ssl(&self, py: Python<'_>, value: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        self.set_flag(py, |st| &mut st.over_ssl, value)
    }

    #[getter(_stream_reader_wr)]
    fn get_stream_reader_wr(&self, py: Python<'_>) -> Py<PyAny> {
        self.field(py, |st| &mut st.reader_wr)
    }

    #[setter(_stream_reader_wr)]
    fn set_stream_reader_wr(&self, py: Python<'_>, value: Option<Py<PyAny>>) {
        self.set_field(py, |st| &mut st.reader_wr, value);
    }

    #[getter(_source_traceback)]
    fn get_source_traceback(&self, py: Python<'_>) -> Py<PyAny> {
        self.field(py, |st| &mut st.source_traceback)
    }

    #[setter(_source_traceback)]
    fn set_source_traceback(&self, py: Python<'_>, value: Option<Py<PyAny>>) {
        self.set_field(py, |st| &mut st.source_traceback, value);
    }

    #[getter(_strong_reader)]
    fn get_strong_reader(&self, py: Python<'_>) -> Py<PyAny> {
        self.field(py, |st| &mut st.strong_reader)
    }

    #[setter(_strong_reader)]
    fn set_strong_reader(&self, py: Python<'_>, value: Option<Py<PyAny>>) {
        self.set_field(py, |st| &mut st.strong_reader, value);
    }

    #[getter(_stream_writer)]
    fn get_stream_writer(&self, py: Python<'_>) -> Py<PyAny> {
        self.field(py, |st| &mut st.stream_writer)
    }

    #[setter(_stream_writer)]
    fn set_stream_writer(&self, py: Python<'_>, value: Option<Py<PyAny>>) {
        self.set_field(py, |st| &mut st.stream_writer, value);
    }

    #[getter(_task)]
    fn get_task(&self, py: Python<'_>) -> Py<PyAny> {
        self.field(py, |st| &mut st.task)
    }

    #[setter(_task)]
    fn set_task(&self, py: Python<'_>, value: Option<Py<PyAny>>) {
        self.set_field(py, |st| &mut st.task, value);
    }

    #[getter(_transport)]
    fn get_transport(&self, py: Python<'_>) -> Py<PyAny> {
        self.field(py, |st| &mut st.transport)
    }

    #[setter(_transport)]
    fn set_transport(&self, py: Python<'_>, value: Option<Py<PyAny>>) {
        self.set_field(py, |st| &mut st.transport, value);
    }

    #[getter(_client_connected_cb)]
    fn get_client_connected_cb(&self, py: Python<'_>) -> Py<PyAny> {
        self.field(py, |st| &mut st.client_connected_cb)
    }

    #[setter(_client_connected_cb)]
    fn set_client_connected_cb(&self, py: Python<'_>, value: Option<Py<PyAny>>) {
        self.set_field(py, |st| &mut st.client_connected_cb, value);
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.state.traverse(&visit, |st| {
            visit.call(&st.loop_obj)?;
            visit.call(&st.drain_waiters)?;
            visit.call(&st.reader_wr)?;
            visit.call(&st.source_traceback)?;
            visit.call(&st.strong_reader)?;
            visit.call(&st.stream_writer)?;
            visit.call(&st.task)?;
            visit.call(&st.transport)?;
            visit.call(&st.client_connected_cb)?;
            visit.call(&st.closed)?;
            if let Some(Some(exc)) = &st.closed_by {
                visit.call(exc)?;
            }
            Ok(())
        })
    }

    fn __clear__(&self, py: Python<'_>) {
        let old = self.state.with(py, std::mem::take);
        drop(old);
    }
}

/// The protocol's flow control, read by a native writer's drain:
/// `(connection_lost, paused)`, if `protocol` is a native one.
pub(crate) fn flow_state(protocol: &Bound<'_, PyAny>) -> Option<(bool, bool)> {
    let core = protocol.cast::<ProtocolCore>().ok()?;
    Some(core.get().state.with(protocol.py(), |st| (st.connection_lost, st.paused)))
}

/// The module's classes of this file.
pub(super) fn register(m: &Bound<'_, pyo3::types::PyModule>) -> PyResult<()> {
    m.add_class::<ProtocolCore>()?;
    m.add_class::<HandlerDone>()
}
