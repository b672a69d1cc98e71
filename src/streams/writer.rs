//! `WriterCore`: the state and hot methods of `zuvrs.streams.StreamWriter`.
//!
//! asyncio's `StreamWriter.write` is a Python frame around
//! `transport.write`, and `drain()` a coroutine even when it has nothing to
//! wait for. Here `write` / `writelines` go straight to the transport's
//! native core when it has one (a zuvrs socket or TLS transport), and
//! `drain()` returns an awaitable that is already complete (`Completed`)
//! when asyncio's drain would finish without suspending: no exception on
//! the reader, the transport not closing, and the protocol (asyncio's flow
//! control) neither paused nor disconnected. Otherwise `drain()` is asyncio's
//! own coroutine, which then raises or waits exactly as it does.
//!
//! The state is asyncio's attributes (`_transport`, `_protocol`, `_reader`,
//! `_loop`, `_complete_fut`), properties over native fields, so asyncio's
//! other methods (`close`, `wait_closed`, `start_tls`, `get_extra_info`,
//! `__del__`, ...) work on it unchanged.

use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use super::none_as_absent;
use super::ops::Completed;
use super::patched::{asyncio_if_patched, WRITER};
use super::state::ReaderCore;
use crate::cell::NativeCell;
use crate::python;
use crate::transport::methods::CoreMethod;
use crate::transport::stream::StreamCore;

#[derive(Default)]
struct WriterState {
    transport: Option<Py<PyAny>>,
    /// The transport's native core, if its `write`, `writelines` and
    /// `is_closing` are the core's.
    core: Option<Py<StreamCore>>,
    protocol: Option<Py<PyAny>>,
    /// The protocol's `_drain_helper` is asyncio's flow control's, so its
    /// `_paused` and `_connection_lost` say whether drain would wait.
    flow_control: bool,
    reader: Option<Py<PyAny>>,
    /// The reader, if it is native (its exception is read directly).
    native_reader: Option<Py<ReaderCore>>,
    loop_obj: Option<Py<PyAny>>,
    complete_fut: Option<Py<PyAny>>,
}

#[pyclass(module = "zuvrs._zuvrs", name = "StreamWriterCore", subclass, frozen)]
pub(crate) struct WriterCore {
    state: NativeCell<WriterState>,
}

/// The transport's native core, if the transport's class takes its
/// `write`, `writelines` and `is_closing` from it.
fn native_core(transport: &Bound<'_, PyAny>) -> Option<Py<StreamCore>> {
    let py = transport.py();
    let cls = transport.get_type();
    for name in [python::streams::write(py), python::streams::writelines(py), python::streams::is_closing(py)] {
        cls.getattr(name).ok()?.cast_into::<CoreMethod>().ok()?;
    }
    transport.getattr(python::transport::_core(py)).ok()?.cast_into::<StreamCore>().ok().map(Bound::unbind)
}

/// Whether `protocol`'s `_drain_helper` is asyncio's flow control's.
fn has_flow_control(protocol: &Bound<'_, PyAny>) -> bool {
    let py = protocol.py();
    let Ok(streams) = python::streams(py) else { return false };
    let Ok(helper) = protocol.get_type().getattr(python::streams::_drain_helper(py)) else { return false };
    helper.is(streams.drain_helper.bind(py))
}

impl WriterCore {
    /// Whether asyncio's drain() would complete without suspending. Any
    /// error on the way says no: the coroutine then raises it when awaited.
    fn drains_at_once(&self, py: Python<'_>) -> bool {
        let (native_reader, reader, core, transport, protocol) = self.state.with(py, |st| {
            let protocol = if st.flow_control { st.protocol.as_ref().map(|p| p.clone_ref(py)) } else { None };
            (
                st.native_reader.as_ref().map(|r| r.clone_ref(py)),
                st.reader.as_ref().map(|r| r.clone_ref(py)),
                st.core.as_ref().map(|c| c.clone_ref(py)),
                st.transport.as_ref().map(|t| t.clone_ref(py)),
                protocol,
            )
        });
        let Some(protocol) = protocol else { return false };
        let reader_failed = match (native_reader, reader) {
            (Some(r), _) => r.get().state.with(py, |st| st.exception.is_some()),
            (None, Some(r)) => {
                python::call_method0(r.bind(py), python::streams::exception(py)).map_or(true, |exc| !exc.is_none())
            }
            (None, None) => false,
        };
        if reader_failed {
            return false;
        }
        let closing = match (core, transport) {
            (Some(core), _) => core.get().is_closing(py),
            (None, Some(t)) => python::call_method0(t.bind(py), python::streams::is_closing(py))
                .map_or(true, |c| c.is_truthy().unwrap_or(true)),
            (None, None) => true,
        };
        if closing {
            return false;
        }
        let protocol = protocol.bind(py);
        if let Some((lost, paused)) = super::protocol::flow_state(protocol) {
            return !lost && !paused;
        }
        let flag = |name| protocol.getattr(name).map_or(true, |v| v.is_truthy().unwrap_or(true));
        !flag(python::streams::_connection_lost(py)) && !flag(python::streams::_paused(py))
    }

    fn transport_or_none(&self, py: Python<'_>) -> (Option<Py<StreamCore>>, Py<PyAny>) {
        self.state.with(py, |st| {
            (
                st.core.as_ref().map(|c| c.clone_ref(py)),
                st.transport.as_ref().map_or_else(|| py.None(), |t| t.clone_ref(py)),
            )
        })
    }
}

#[pymethods]
impl WriterCore {
    /// The state asyncio's `StreamWriter.__init__` then sets.
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn new(_args: &Bound<'_, PyAny>, _kwargs: Option<&Bound<'_, PyAny>>) -> Self {
        WriterCore { state: NativeCell::new(WriterState::default()) }
    }

    /// What asyncio's `__init__(transport, protocol, reader, loop)` sets,
    /// but the completed future (made when first asked for).
    fn _set_up(
        &self,
        py: Python<'_>,
        transport: Option<Py<PyAny>>,
        protocol: Option<Py<PyAny>>,
        reader: Option<Py<PyAny>>,
        loop_obj: Option<Py<PyAny>>,
    ) {
        self.set_transport(py, transport);
        self.set_protocol(py, protocol);
        self.set_reader(py, reader);
        self.set_loop(py, loop_obj);
    }

    fn write(slf: &Bound<'_, Self>, data: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        asyncio_if_patched!(WRITER, slf, "write", (data,));
        let py = slf.py();
        match slf.get().transport_or_none(py) {
            (Some(core), _) => core.get().write(py, data)?,
            (None, transport) => drop(python::call_method(transport.bind(py), python::streams::write(py), (data,))?),
        }
        Ok(py.None())
    }

    fn writelines(slf: &Bound<'_, Self>, data: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        asyncio_if_patched!(WRITER, slf, "writelines", (data,));
        let py = slf.py();
        match slf.get().transport_or_none(py) {
            (Some(core), _) => core.get().writelines(py, data)?,
            (None, transport) => {
                drop(python::call_method(transport.bind(py), python::streams::writelines(py), (data,))?)
            }
        }
        Ok(py.None())
    }

    /// `await writer.drain()`: complete at once when asyncio's would be,
    /// else asyncio's coroutine (the class's `_drain_coroutine`: asyncio's
    /// `StreamWriter.drain`, python/zuvrs/streams.py).
    fn drain(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        asyncio_if_patched!(WRITER, slf, "drain", ());
        let py = slf.py();
        if slf.get().drains_at_once(py) {
            return Ok(Completed::get(py)?.into_any());
        }
        let coroutine_function = slf.get_type().getattr(python::streams::_drain_coroutine(py))?;
        Ok(python::call(&coroutine_function, (slf,))?.unbind())
    }

    #[getter(_transport)]
    fn get_transport(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.state.with(py, |st| st.transport.as_ref().map(|t| t.clone_ref(py)))
    }

    #[setter(_transport)]
    fn set_transport(&self, py: Python<'_>, transport: Option<Py<PyAny>>) {
        let transport = none_as_absent(py, transport);
        let core = transport.as_ref().and_then(|t| native_core(t.bind(py)));
        let old = self
            .state
            .with(py, |st| (std::mem::replace(&mut st.transport, transport), std::mem::replace(&mut st.core, core)));
        drop(old);
    }

    #[getter(_protocol)]
    fn get_protocol(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.state.with(py, |st| st.protocol.as_ref().map(|p| p.clone_ref(py)))
    }

    #[setter(_protocol)]
    fn set_protocol(&self, py: Python<'_>, protocol: Option<Py<PyAny>>) {
        let protocol = none_as_absent(py, protocol);
        let flow_control = protocol.as_ref().is_some_and(|p| has_flow_control(p.bind(py)));
        let old = self.state.with(py, |st| {
            st.flow_control = flow_control;
            std::mem::replace(&mut st.protocol, protocol)
        });
        drop(old);
    }

    #[getter(_reader)]
    fn get_reader(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.state.with(py, |st| st.reader.as_ref().map(|r| r.clone_ref(py)))
    }

    #[setter(_reader)]
    fn set_reader(&self, py: Python<'_>, reader: Option<Py<PyAny>>) {
        let reader = none_as_absent(py, reader);
        let native = reader.as_ref().and_then(|r| r.bind(py).cast::<ReaderCore>().ok().map(|r| r.clone().unbind()));
        let old = self.state.with(py, |st| {
            (std::mem::replace(&mut st.reader, reader), std::mem::replace(&mut st.native_reader, native))
        });
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

    /// asyncio's writer keeps a completed future it never uses; this one
    /// is made when first asked for.
    #[getter(_complete_fut)]
    fn get_complete_fut(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let (fut, loop_obj) = self.state.with(py, |st| {
            (st.complete_fut.as_ref().map(|f| f.clone_ref(py)), st.loop_obj.as_ref().map(|l| l.clone_ref(py)))
        });
        if let Some(fut) = fut {
            return Ok(fut);
        }
        let loop_obj = loop_obj.unwrap_or_else(|| py.None());
        let fut = python::call_method0(loop_obj.bind(py), python::event_loop::create_future(py))?;
        python::future_call1(&fut, python::FutureMethod::SetResult, pyo3::types::PyNone::get(py).as_any())?;
        let fut = fut.unbind();
        self.state.with(py, |st| st.complete_fut = Some(fut.clone_ref(py)));
        Ok(fut)
    }

    #[setter(_complete_fut)]
    fn set_complete_fut(&self, py: Python<'_>, fut: Option<Py<PyAny>>) {
        let old = self.state.with(py, |st| std::mem::replace(&mut st.complete_fut, none_as_absent(py, fut)));
        drop(old);
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.state.traverse(&visit, |st| {
            visit.call(&st.transport)?;
            visit.call(&st.core)?;
            visit.call(&st.protocol)?;
            visit.call(&st.reader)?;
            visit.call(&st.native_reader)?;
            visit.call(&st.loop_obj)?;
            visit.call(&st.complete_fut)
        })
    }

    fn __clear__(&self, py: Python<'_>) {
        let old = self.state.with(py, std::mem::take);
        drop(old);
    }
}

/// The writes' C entries (capi::methods): one call per write, pyo3's
/// argument handling skipped for a call by position or by name.
mod entries {
    use super::WriterCore;
    use crate::capi::methods::c_method;

    c_method!(Write: WriterCore, c"write"(c"data") 1..=1, |slf, arg| WriterCore::write(slf, &arg.expect("one argument")));
    c_method!(WriteLines: WriterCore, c"writelines"(c"data") 1..=1, |slf, arg| WriterCore::writelines(slf, &arg.expect("one argument")));
    c_method!(Drain: WriterCore, c"drain"(c"") 0..=0, |slf, _arg| WriterCore::drain(slf));
}

/// Puts the writes' C entries on the writer's class.
pub(super) fn install_entries(py: Python<'_>) -> PyResult<()> {
    use crate::capi::methods::install;
    install::<entries::Write>(py)?;
    install::<entries::WriteLines>(py)?;
    install::<entries::Drain>(py)
}
