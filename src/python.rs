//! The Python side of the boundary, seen from Rust: every Python method the
//! native code calls, by name, and every Python object it imports, cached.
//!
//! The names are grouped by whose methods they are: the protocol's (the
//! asyncio protocol contract), the Python transport's and the loop's (zuvrs's
//! own Python code, python/zuvrs; they are listed in docs/architecture.md),
//! and those of futures and sockets. Calls go through [`call`] and
//! [`call_method`], which in debug builds check that no native state is
//! borrowed at the crossing (see `cell`): Python code may call back into the
//! object whose state is borrowed.

use pyo3::call::PyCallArgs;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyModule, PyString};

pub(crate) use crate::capi::futures::Method as FutureMethod;
use crate::cell;

/// Interned method names, one function each (`names!(foo)` gives `foo(py)`).
macro_rules! names {
    ($($name:ident),* $(,)?) => {
        $(
            #[inline]
            #[allow(dead_code)]
            pub(crate) fn $name(py: pyo3::Python<'_>) -> &pyo3::Bound<'_, pyo3::types::PyString> {
                pyo3::intern!(py, stringify!($name))
            }
        )*
    };
}

/// asyncio's protocol contract, called by the native transports.
pub(crate) mod protocol {
    names!(
        data_received,
        buffer_updated,
        get_buffer,
        eof_received,
        pause_writing,
        resume_writing,
        datagram_received,
        error_received,
    );
}

/// The Python transports of python/zuvrs/transports, called by their cores.
pub(crate) mod transport {
    names!(_fatal_error, _report_error, _call_connection_lost, _callback_failed, _core);
}

/// The loop: asyncio.BaseEventLoop's API and zuvrs.Loop's hooks (_loop.py).
pub(crate) mod event_loop {
    names!(
        call_soon,
        create_future,
        slow_callback_duration,
        _task_factory,
        _warn_slow_io,
        _warn_slow_callback,
        _report_callback_error,
        _extract_source_traceback,
        _check_thread,
        _check_callback,
        _describe_callback,
        // call_soon's keyword argument.
        context,
    );
}

/// asyncio.Future's methods.
pub(crate) mod future {
    names!(done, cancelled, result, set_result, set_exception);
}

/// What the native streams (src/streams) call on the objects a stream holds:
/// its transport, and the flow-control state of asyncio's stream protocols.
pub(crate) mod streams {
    names!(
        pause_reading,
        resume_reading,
        write,
        writelines,
        is_closing,
        exception,
        _paused,
        _connection_lost,
        _drain_helper,
        _drain_coroutine,
    );
}

/// socket.socket's methods and attributes.
pub(crate) mod socket {
    names!(fileno, family, sendto);
}

/// `obj.name(*args)`.
#[inline]
pub(crate) fn call_method<'py, A: PyCallArgs<'py>>(
    obj: &Bound<'py, PyAny>,
    name: &Bound<'py, PyString>,
    args: A,
) -> PyResult<Bound<'py, PyAny>> {
    cell::check_crossing();
    obj.call_method1(name, args)
}

/// `obj.name()`, looked up as a method (no bound method object is made,
/// which pyo3's own zero-argument call does).
#[inline]
pub(crate) fn call_method0<'py>(obj: &Bound<'py, PyAny>, name: &Bound<'py, PyString>) -> PyResult<Bound<'py, PyAny>> {
    cell::check_crossing();
    crate::capi::calls::call_method0(obj, name)
}

/// `obj.name(*args, context=context)`, as a vectorcall (asyncio's
/// `call_soon(callback, *args, context=...)` without a keyword dict).
pub(crate) fn call_method_in_context<'py>(
    obj: &Bound<'py, PyAny>,
    name: &Bound<'py, PyString>,
    args: &[&Bound<'py, PyAny>],
    context: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    cell::check_crossing();
    let py = obj.py();
    static CONTEXT: pyo3::sync::PyOnceLock<Py<pyo3::types::PyTuple>> = pyo3::sync::PyOnceLock::new();
    let kwnames =
        CONTEXT.get_or_try_init(py, || pyo3::types::PyTuple::new(py, [event_loop::context(py)]).map(Bound::unbind))?;
    crate::capi::calls::call_method_kw(obj, name, args, kwnames.bind(py), &[context])
}

/// Drops `obj` with a plain decref under the GIL `py` proves (dropping a
/// `Py` asks pyo3 whether the thread is attached: a thread-local read, which
/// in a shared library is a call).
#[inline(always)]
pub(crate) fn release<T>(py: Python<'_>, obj: Py<T>) {
    drop(obj.into_bound(py));
}

/// `fut.method()` on an asyncio future: the C future's own method when
/// nothing can shadow it (capi::futures::call_own), else looked up on `fut`.
#[inline]
pub(crate) fn future_call0<'py>(fut: &Bound<'py, PyAny>, method: FutureMethod) -> PyResult<Bound<'py, PyAny>> {
    cell::check_crossing();
    match crate::capi::futures::call_own(fut, method, None) {
        Some(result) => result,
        None => crate::capi::calls::call_method0(fut, future_method_name(fut.py(), method)),
    }
}

/// The interned name of a future method.
fn future_method_name(py: Python<'_>, method: FutureMethod) -> &Bound<'_, PyString> {
    match method {
        FutureMethod::Done => future::done(py),
        FutureMethod::Cancelled => future::cancelled(py),
        FutureMethod::Result => future::result(py),
        FutureMethod::SetResult => future::set_result(py),
        FutureMethod::SetException => future::set_exception(py),
    }
}

/// `fut.method(arg)` on an asyncio future, as `future_call0`.
#[inline]
pub(crate) fn future_call1<'py>(
    fut: &Bound<'py, PyAny>,
    method: FutureMethod,
    arg: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    cell::check_crossing();
    match crate::capi::futures::call_own(fut, method, Some(arg)) {
        Some(result) => result,
        None => fut.call_method1(future_method_name(fut.py(), method), (arg,)),
    }
}

/// `func(*args)`.
#[inline]
pub(crate) fn call<'py, A: PyCallArgs<'py>>(func: &Bound<'py, PyAny>, args: A) -> PyResult<Bound<'py, PyAny>> {
    cell::check_crossing();
    func.call1(args)
}

/// The modules and objects the native code imports, each imported once.
struct Imports {
    socket: Py<PyModule>,
    logger: Py<PyAny>,
    /// The `__dict__` of asyncio.tasks and asyncio.futures: a module's dict
    /// is fixed for its life, and reading it directly costs a fraction of
    /// the module's attribute lookup.
    asyncio_tasks: Py<PyDict>,
    asyncio_futures: Py<PyDict>,
    base_event_loop: Py<PyAny>,
    format_helpers: Py<PyModule>,
    getsizeof: Py<PyAny>,
    /// asyncio.streams' pieces the native streams defer to or raise.
    streams: StreamsImports,
    /// socket.AddressFamily / SocketKind members (their lookup through the
    /// enums costs more than the rest of a getaddrinfo answer).
    af_inet: Py<PyAny>,
    af_inet6: Py<PyAny>,
    sock_stream: Py<PyAny>,
    sock_dgram: Py<PyAny>,
    sock_raw: Py<PyAny>,
}

/// From asyncio: the exceptions stream reads raise, and the Python code the
/// native streams hand over to where they take no shortcut.
pub(crate) struct StreamsImports {
    pub(crate) incomplete_read_error: Py<PyAny>,
    pub(crate) limit_overrun_error: Py<PyAny>,
    /// `asyncio.streams.FlowControlMixin._drain_helper`.
    pub(crate) drain_helper: Py<PyAny>,
}

static IMPORTS: PyOnceLock<Imports> = PyOnceLock::new();

fn imports(py: Python<'_>) -> PyResult<&Imports> {
    IMPORTS.get_or_try_init(py, || {
        let socket = py.import("socket")?;
        let attr = |m: &Bound<'_, PyModule>, n: &str| m.getattr(n).map(Bound::unbind);
        Ok(Imports {
            logger: py.import("asyncio.log")?.getattr("logger")?.unbind(),
            asyncio_tasks: py.import("asyncio.tasks")?.dict().unbind(),
            asyncio_futures: py.import("asyncio.futures")?.dict().unbind(),
            base_event_loop: py.import("asyncio")?.getattr("BaseEventLoop")?.unbind(),
            format_helpers: py.import("asyncio.format_helpers")?.unbind(),
            getsizeof: py.import("sys")?.getattr("getsizeof")?.unbind(),
            streams: {
                let exceptions = py.import("asyncio.exceptions")?;
                let streams = py.import("asyncio.streams")?;
                StreamsImports {
                    incomplete_read_error: attr(&exceptions, "IncompleteReadError")?,
                    limit_overrun_error: attr(&exceptions, "LimitOverrunError")?,
                    drain_helper: streams.getattr("FlowControlMixin")?.getattr("_drain_helper")?.unbind(),
                }
            },
            af_inet: attr(&socket, "AF_INET")?,
            af_inet6: attr(&socket, "AF_INET6")?,
            sock_stream: attr(&socket, "SOCK_STREAM")?,
            sock_dgram: attr(&socket, "SOCK_DGRAM")?,
            sock_raw: attr(&socket, "SOCK_RAW")?,
            socket: socket.unbind(),
        })
    })
}

/// The `socket` module.
pub(crate) fn socket_module(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    Ok(imports(py)?.socket.bind(py))
}

/// `asyncio.log.logger`.
pub(crate) fn logger(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    Ok(imports(py)?.logger.bind(py))
}

/// `asyncio.tasks.Task` as the module has it now (so a patched one is used).
pub(crate) fn asyncio_task_type(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    static SEEN: SeenAttr = SeenAttr::new();
    SEEN.get(imports(py)?.asyncio_tasks.bind(py), pyo3::intern!(py, "Task"), "asyncio.tasks")
}

/// `asyncio.futures.Future` as the module has it now.
pub(crate) fn asyncio_future_type(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    static SEEN: SeenAttr = SeenAttr::new();
    SEEN.get(imports(py)?.asyncio_futures.bind(py), pyo3::intern!(py, "Future"), "asyncio.futures")
}

/// One attribute of one module, as `module_attr` reads it, remembered with
/// the module dict's version: while the dict has not changed, the value is
/// the one read then (a dict lookup per future made is about 150
/// instructions). Read afresh every time where the version cannot be read.
struct SeenAttr(cell::NativeCell<Option<(u64, Py<PyAny>)>>);

impl SeenAttr {
    const fn new() -> Self {
        SeenAttr(cell::NativeCell::new(None))
    }

    #[inline]
    fn get<'py>(
        &self,
        dict: &Bound<'py, PyDict>,
        name: &Bound<'py, PyString>,
        module: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = dict.py();
        let version = crate::capi::dicts::version(dict);
        let seen = self.0.with(py, |seen| match (seen, version) {
            (Some((at, value)), Some(now)) if *at == now => Some(value.clone_ref(py)),
            _ => None,
        });
        if let Some(value) = seen {
            return Ok(value.into_bound(py));
        }
        let value = module_attr(dict, name, module)?;
        if let Some(now) = version {
            let old = self.0.with(py, |seen| seen.replace((now, value.clone().unbind())));
            drop(old);
        }
        Ok(value)
    }
}

/// `module.name`, read from the module's dict (`module` names it in the
/// AttributeError a deleted attribute gives, as the module's lookup would).
#[inline]
fn module_attr<'py>(
    dict: &Bound<'py, PyDict>,
    name: &Bound<'py, PyString>,
    module: &str,
) -> PyResult<Bound<'py, PyAny>> {
    dict.get_item(name)?.ok_or_else(|| {
        pyo3::exceptions::PyAttributeError::new_err(format!("module '{module}' has no attribute '{name}'"))
    })
}

/// `asyncio.BaseEventLoop`.
pub(crate) fn base_event_loop(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    Ok(imports(py)?.base_event_loop.bind(py))
}

/// `asyncio.format_helpers`.
pub(crate) fn format_helpers(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    Ok(imports(py)?.format_helpers.bind(py))
}

/// What the native streams take from asyncio.
pub(crate) fn streams(py: Python<'_>) -> PyResult<&StreamsImports> {
    Ok(&imports(py)?.streams)
}

/// `sys.getsizeof`.
pub(crate) fn getsizeof(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    Ok(imports(py)?.getsizeof.bind(py))
}

/// `socket.AddressFamily(af)` (the cached member for AF_INET / AF_INET6),
/// or the plain int for a value the enum does not know, as CPython gives.
pub(crate) fn address_family(py: Python<'_>, af: i32) -> PyResult<Py<PyAny>> {
    let i = imports(py)?;
    Ok(match af {
        libc::AF_INET => i.af_inet.clone_ref(py),
        libc::AF_INET6 => i.af_inet6.clone_ref(py),
        other => enum_member(py, "AddressFamily", other)?,
    })
}

/// `socket.SocketKind(kind)`, cached for stream, datagram and raw sockets.
pub(crate) fn socket_kind(py: Python<'_>, kind: i32) -> PyResult<Py<PyAny>> {
    let i = imports(py)?;
    Ok(match kind {
        libc::SOCK_STREAM => i.sock_stream.clone_ref(py),
        libc::SOCK_DGRAM => i.sock_dgram.clone_ref(py),
        libc::SOCK_RAW => i.sock_raw.clone_ref(py),
        other => enum_member(py, "SocketKind", other)?,
    })
}

fn enum_member(py: Python<'_>, enum_name: &str, v: i32) -> PyResult<Py<PyAny>> {
    let member = socket_module(py)?.getattr(enum_name).and_then(|e| e.call1((v,)));
    Ok(match member {
        Ok(m) => m.unbind(),
        Err(_) => v.into_pyobject(py)?.into_any().unbind(),
    })
}

/// `server._detach(transport)` as the transport's server sees it: from
/// 3.13 asyncio's Server tracks its transports; before, zuvrs's own Server
/// subclass does (python/zuvrs/_server.py), and asyncio's plain one takes
/// no argument.
pub(crate) fn detach_from_server(server: &Bound<'_, PyAny>, transport: &Bound<'_, PyAny>) -> PyResult<()> {
    server_count(server, transport, pyo3::intern!(server.py(), "_detach"))
}

/// `server._attach(transport)`, asyncio's count of a server's connections
/// (with the transport where the server tracks them, as above).
pub(crate) fn attach_to_server(server: &Bound<'_, PyAny>, transport: &Bound<'_, PyAny>) -> PyResult<()> {
    server_count(server, transport, pyo3::intern!(server.py(), "_attach"))
}

fn server_count(server: &Bound<'_, PyAny>, transport: &Bound<'_, PyAny>, method: &Bound<'_, PyString>) -> PyResult<()> {
    if cfg!(Py_3_13) || server.is_instance(zuvrs_server_class(server.py())?)? {
        call_method(server, method, (transport,))?;
    } else {
        call_method0(server, method)?;
    }
    Ok(())
}

/// `zuvrs._server.Server`.
fn zuvrs_server_class(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static SERVER: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    Ok(SERVER.get_or_try_init(py, || py.import("zuvrs._server")?.getattr("Server").map(Bound::unbind))?.bind(py))
}

/// `asyncio.BufferedProtocol`.
pub(crate) fn buffered_protocol_class(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static CLASS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    Ok(CLASS.get_or_try_init(py, || py.import("asyncio")?.getattr("BufferedProtocol").map(Bound::unbind))?.bind(py))
}

/// `asyncio.futures._set_result_unless_cancelled`: what a transport
/// schedules to complete its waiter.
pub(crate) fn set_result_unless_cancelled(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static FUNC: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    Ok(FUNC
        .get_or_try_init(py, || {
            py.import("asyncio.futures")?.getattr("_set_result_unless_cancelled").map(Bound::unbind)
        })?
        .bind(py))
}
