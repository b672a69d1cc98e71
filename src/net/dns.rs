//! `getaddrinfo`: address literals answered natively, names through
//! `uv_getaddrinfo` on libuv's thread pool; `getnameinfo` lookups through
//! `uv_getnameinfo` there too.
//!
//! A numeric host with a numeric port never reaches the resolver: the answer
//! is built from the parsed address, with the `socket.AddressFamily` /
//! `SocketKind` members cached (python.rs). Anything the fast path does not
//! cover exactly as `socket.getaddrinfo` would (service names, scope ids,
//! flags other than AI_NUMERICHOST / AI_NUMERICSERV / AI_PASSIVE, odd type /
//! proto pairs, out-of-range ports) goes to the resolver.
//!
//! A lookup in flight is a client of its loop (`uv::resolver` owns the
//! request): a loop closing first cancels it and drops its future, and its
//! completion then frees it quietly (see `UvLoop::close`, which waits for it
//! off the loop's thread).

use std::cell::Cell;
use std::ffi::{CStr, CString};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

use crate::errors::is_fatal_base;
use crate::eventloop::{LoopCore, LoopShared};
use crate::net::addr::{self, SockAddr};
use crate::os;
use crate::python;
use crate::uv::resolver::{self, AddrInfoList, Hints};
use crate::uv::sys;

/// The port of a numeric service: None, an exact int (socket.getaddrinfo
/// refuses a subclass, bool or IntEnum: "Int or String expected"), or a
/// string of digits.
fn parse_port(port: &Bound<'_, PyAny>) -> Option<u16> {
    if port.is_none() {
        return Some(0);
    }
    let digits = |t: &str| (!t.is_empty() && t.bytes().all(|c| c.is_ascii_digit())).then(|| t.parse().ok()).flatten();
    if let Ok(s) = port.cast::<PyString>() {
        return digits(s.to_str().ok()?);
    }
    if let Ok(b) = port.cast::<PyBytes>() {
        return digits(std::str::from_utf8(b.as_bytes()).ok()?);
    }
    if !port.is_exact_instance_of::<pyo3::types::PyInt>() {
        return None;
    }
    port.extract::<i64>().ok().and_then(|p| u16::try_from(p).ok())
}

/// The (type, proto) pairs getaddrinfo reports for the given hints, as glibc
/// does for a numeric host; None for combinations left to the resolver.
fn socket_kinds(socktype: i32, proto: i32) -> Option<&'static [(i32, i32)]> {
    const ALL: &[(i32, i32)] =
        &[(libc::SOCK_STREAM, libc::IPPROTO_TCP), (libc::SOCK_DGRAM, libc::IPPROTO_UDP), (libc::SOCK_RAW, 0)];
    const STREAM: &[(i32, i32)] = &[(libc::SOCK_STREAM, libc::IPPROTO_TCP)];
    const DGRAM: &[(i32, i32)] = &[(libc::SOCK_DGRAM, libc::IPPROTO_UDP)];
    const RAW: &[(i32, i32)] = &[(libc::SOCK_RAW, 0)];
    match (socktype, proto) {
        (0, 0) => Some(ALL),
        (0, libc::IPPROTO_TCP) | (libc::SOCK_STREAM, 0) | (libc::SOCK_STREAM, libc::IPPROTO_TCP) => Some(STREAM),
        (0, libc::IPPROTO_UDP) | (libc::SOCK_DGRAM, 0) | (libc::SOCK_DGRAM, libc::IPPROTO_UDP) => Some(DGRAM),
        (libc::SOCK_RAW, 0) => Some(RAW),
        _ => None,
    }
}

/// `socket.getaddrinfo` as zuvrs found it when imported (None: already
/// replaced then); see `keep_socket_getaddrinfo`.
static SOCKET_GETADDRINFO: PyOnceLock<Option<Py<PyAny>>> = PyOnceLock::new();

/// Records `socket.getaddrinfo` as zuvrs found it (None if it had been
/// replaced before): while the socket module still has it, loop.getaddrinfo
/// answers literals natively; a replacement is called as asyncio calls it.
#[pyfunction]
pub(crate) fn keep_socket_getaddrinfo(py: Python<'_>, func: Option<Py<PyAny>>) {
    let _ = SOCKET_GETADDRINFO.set(py, func);
}

/// Whether `socket.getaddrinfo` is the function recorded at import (one
/// dict look-up: this is on the fast path).
fn socket_getaddrinfo_kept(py: Python<'_>) -> bool {
    let Some(Some(kept)) = SOCKET_GETADDRINFO.get(py) else { return false };
    let Ok(socket) = python::socket_module(py) else { return false };
    matches!(socket.dict().get_item(pyo3::intern!(py, "getaddrinfo")), Ok(Some(f)) if f.is(kept))
}

/// A hint as the C int socket.getaddrinfo reads it; None for anything
/// else (the caller then lets the socket module say what is wrong).
fn hint(v: &Bound<'_, PyAny>) -> Option<i32> {
    v.extract::<i32>().ok()
}

/// getaddrinfo on `loop_obj` answered without the resolver, or None when
/// the arguments need it, socket.getaddrinfo was replaced, or the loop is
/// in debug mode (asyncio's debug mode logs every lookup).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub(crate) fn numeric_addrinfo<'py>(
    py: Python<'py>,
    loop_obj: &Bound<'py, LoopCore>,
    host: &Bound<'py, PyAny>,
    port: &Bound<'py, PyAny>,
    family: &Bound<'py, PyAny>,
    r#type: &Bound<'py, PyAny>,
    proto: &Bound<'py, PyAny>,
    flags: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyList>>> {
    const FAST_FLAGS: i32 = libc::AI_NUMERICHOST | libc::AI_NUMERICSERV | libc::AI_PASSIVE;
    if loop_obj.get().shared().debug(py) || !socket_getaddrinfo_kept(py) {
        return Ok(None);
    }
    let (Some(family), Some(r#type), Some(proto), Some(flags)) = (hint(family), hint(r#type), hint(proto), hint(flags))
    else {
        return Ok(None);
    };
    if flags & !FAST_FLAGS != 0 {
        return Ok(None);
    }
    let text = if let Ok(s) = host.cast::<PyString>() {
        s.to_str().ok()
    } else if let Ok(b) = host.cast::<PyBytes>() {
        std::str::from_utf8(b.as_bytes()).ok()
    } else {
        None
    };
    let Some(text) = text else { return Ok(None) };
    let Some(port) = parse_port(port) else { return Ok(None) };
    let Some(kinds) = socket_kinds(r#type, proto) else { return Ok(None) };
    let Some(address) = addr::canonical_ip(text, port) else { return Ok(None) };
    let af = address.family();
    if family != 0 && family != af {
        return Ok(None);
    }
    // The literal is already the text getaddrinfo would report.
    let host_text =
        if host.is_exact_instance_of::<PyString>() { host.clone() } else { PyString::new(py, text).into_any() };
    let sockaddr = address.ip_python_form(py, host_text)?.into_any();
    let family_obj = python::address_family(py, af)?.into_bound(py);
    let empty = PyString::new(py, "");
    let items = kinds
        .iter()
        .map(|&(t, p)| {
            PyTuple::new(
                py,
                [
                    family_obj.clone(),
                    python::socket_kind(py, t)?.into_bound(py),
                    p.into_pyobject(py)?.into_any(),
                    empty.clone().into_any(),
                    sockaddr.clone(),
                ],
            )
        })
        .collect::<PyResult<Vec<_>>>()?;
    Ok(Some(PyList::new(py, items)?))
}

/// The future a resolver request (`uv::resolver`) settles; None once the
/// loop closed first.
struct Pending {
    future: Cell<Option<Py<PyAny>>>,
}

impl Pending {
    fn new(future: Py<PyAny>) -> Self {
        Pending { future: Cell::new(Some(future)) }
    }

    /// Settles the future: a socket.gaierror for a failed request (the
    /// libuv error code), else what `result` builds; nothing if the future
    /// was cancelled meanwhile. What goes wrong is handled as any error
    /// raised in a libuv callback.
    fn settle<'py>(
        &self,
        py: Python<'py>,
        shared: &LoopShared,
        result: Result<impl FnOnce() -> PyResult<Bound<'py, PyAny>>, i32>,
    ) {
        let Some(future) = self.future.take() else { return };
        let future = future.bind(py);
        let outcome = python::future_call0(future, python::FutureMethod::Cancelled)
            .and_then(|c| c.is_truthy())
            .and_then(|cancelled| {
                if cancelled {
                    return Ok(());
                }
                match result {
                    Err(status) => {
                        let exc = gaierror(py, status)?.into_value(py);
                        python::future_call1(future, python::FutureMethod::SetException, exc.bind(py).as_any())
                            .map(drop)
                    }
                    Ok(result) => python::future_call1(future, python::FutureMethod::SetResult, &result()?).map(drop),
                }
            });
        if let Err(err) = outcome {
            if is_fatal_base(py, &err) {
                shared.raise_later(py, err);
            } else {
                err.write_unraisable(py, None);
            }
        }
    }
}

impl resolver::Lookup for Pending {
    fn orphan(&self, _py: Python<'_>) {
        drop(self.future.take());
    }
}

impl resolver::AddrInfoLookup for Pending {
    fn resolved(&self, py: Python<'_>, shared: &LoopShared, result: Result<&AddrInfoList, i32>) {
        self.settle(py, shared, result.map(|list| move || Ok(addrinfo_list(py, list)?.into_any())));
    }
}

impl resolver::NameInfoLookup for Pending {
    /// (host, service), as socket.getnameinfo returns them.
    fn named(&self, py: Python<'_>, shared: &LoopShared, result: Result<(&CStr, &CStr), i32>) {
        self.settle(
            py,
            shared,
            result.map(|(host, service)| {
                move || {
                    let text = |c: &CStr| c.to_string_lossy().into_owned();
                    Ok((text(host), text(service)).into_pyobject(py)?.into_any())
                }
            }),
        );
    }
}

/// The name of the system EAI_* code for a libuv UV_EAI_* code.
fn eai_name(code: i32) -> &'static str {
    use sys::*;
    let c = |v: uv_errno_t| v;
    match code {
        x if x == c(uv_errno_t_UV_EAI_ADDRFAMILY) => "EAI_ADDRFAMILY",
        x if x == c(uv_errno_t_UV_EAI_AGAIN) => "EAI_AGAIN",
        x if x == c(uv_errno_t_UV_EAI_BADFLAGS) => "EAI_BADFLAGS",
        x if x == c(uv_errno_t_UV_EAI_FAMILY) => "EAI_FAMILY",
        x if x == c(uv_errno_t_UV_EAI_MEMORY) => "EAI_MEMORY",
        x if x == c(uv_errno_t_UV_EAI_NODATA) => "EAI_NODATA",
        x if x == c(uv_errno_t_UV_EAI_NONAME) => "EAI_NONAME",
        x if x == c(uv_errno_t_UV_EAI_OVERFLOW) => "EAI_OVERFLOW",
        x if x == c(uv_errno_t_UV_EAI_SERVICE) => "EAI_SERVICE",
        x if x == c(uv_errno_t_UV_EAI_SOCKTYPE) => "EAI_SOCKTYPE",
        _ => "EAI_FAIL",
    }
}

/// socket.gaierror for a libuv resolver error, with the system's code and
/// message as socket.getaddrinfo would raise it.
fn gaierror(py: Python<'_>, code: i32) -> PyResult<PyErr> {
    let socket = python::socket_module(py)?;
    let sys_code: i32 = socket.getattr(eai_name(code)).and_then(|v| v.extract()).unwrap_or(libc::EAI_FAIL);
    let msg = os::net::gai_strerror(sys_code);
    let exc = socket.getattr("gaierror")?.call1((sys_code, msg))?;
    Ok(PyErr::from_value(exc))
}

/// The result list of a resolved name, as socket.getaddrinfo builds it.
fn addrinfo_list<'py>(py: Python<'py>, list: &AddrInfoList) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for a in list.nodes() {
        let sa = a.address();
        if matches!(sa.family(), libc::AF_INET | libc::AF_INET6) {
            let canon = a.canonname().map(|c| c.to_string_lossy().into_owned()).unwrap_or_default();
            out.append(PyTuple::new(
                py,
                [
                    python::address_family(py, a.family())?.into_bound(py),
                    python::socket_kind(py, a.socktype())?.into_bound(py),
                    a.protocol().into_pyobject(py)?.into_any(),
                    canon.into_pyobject(py)?.into_any(),
                    sa.python_form(py)?.into_bound(py),
                ],
            )?)?;
        }
    }
    Ok(out)
}

/// Starts resolving (`host`, `port`) (bytes or None) on `loop`'s libuv
/// thread pool; `future` gets the result list or a socket.gaierror.
#[pyfunction]
#[pyo3(signature = (loop_obj, future, host, port, family, r#type, proto, flags))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn resolve(
    py: Python<'_>,
    loop_obj: &Bound<'_, LoopCore>,
    future: Py<PyAny>,
    host: Option<&[u8]>,
    port: Option<&[u8]>,
    family: i32,
    r#type: i32,
    proto: i32,
    flags: i32,
) -> PyResult<()> {
    let shared = loop_obj.get().shared();
    shared.uv_loop(py)?; // a closed loop refuses first
    let cstr = |b: Option<&[u8]>| -> PyResult<Option<CString>> {
        b.map(|b| CString::new(b).map_err(|_| pyo3::exceptions::PyValueError::new_err("embedded null byte")))
            .transpose()
    };
    let (node, service) = (cstr(host)?, cstr(port)?);
    let hints = Hints { family, socktype: r#type, protocol: proto, flags };
    resolver::getaddrinfo(py, shared, Pending::new(future), node.as_deref(), service.as_deref(), &hints)
}

/// Starts `getnameinfo` of a numeric address (as socket.getnameinfo with
/// NI_NUMERICHOST | NI_NUMERICSERV printed it: IPv6 scope suffixes are
/// ignored here, `scope_id` carries the scope) on libuv's thread pool.
#[pyfunction]
#[pyo3(signature = (loop_obj, future, host, port, flowinfo, scope_id, flags))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn name_info(
    py: Python<'_>,
    loop_obj: &Bound<'_, LoopCore>,
    future: Py<PyAny>,
    host: &str,
    port: u16,
    flowinfo: u32,
    scope_id: u32,
    flags: i32,
) -> PyResult<()> {
    let shared = loop_obj.get().shared();
    shared.uv_loop(py)?; // a closed loop refuses first
    let bare = host.split('%').next().unwrap_or(host);
    let sa = SockAddr::ip(bare, 0, port, flowinfo, scope_id)
        .ok_or_else(|| pyo3::exceptions::PyValueError::new_err(format!("not a numeric address: {host:?}")))?;
    resolver::getnameinfo(py, shared, Pending::new(future), &sa, flags)
}
