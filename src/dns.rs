//! `getaddrinfo`: address literals answered natively, names through
//! `uv_getaddrinfo` on libuv's thread pool; `getnameinfo` lookups through
//! `uv_getnameinfo` there too.
//!
//! A numeric host with a numeric port never reaches the resolver: the answer
//! is built from the parsed address, with the `socket.AddressFamily` /
//! `SocketKind` members cached (looking them up through the enums costs more
//! than the rest of the answer). Anything the fast path does not cover
//! exactly as `socket.getaddrinfo` would (service names, scope ids, flags other
//! than AI_NUMERICHOST / AI_NUMERICSERV / AI_PASSIVE, odd type / proto pairs,
//! out-of-range ports) goes to the resolver.

use std::ffi::{CStr, CString};
use std::mem::MaybeUninit;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::ptr;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

use crate::errors::uv_error;
use crate::eventloop::{LoopCore, LoopState};
use crate::uv::sys;

/// Cached enum members: AF_INET, AF_INET6, SOCK_STREAM, SOCK_DGRAM, SOCK_RAW.
struct Enums {
    af_inet: Py<PyAny>,
    af_inet6: Py<PyAny>,
    stream: Py<PyAny>,
    dgram: Py<PyAny>,
    raw: Py<PyAny>,
    socket: Py<PyModule>,
}

static ENUMS: PyOnceLock<Enums> = PyOnceLock::new();

fn enums(py: Python<'_>) -> PyResult<&Enums> {
    ENUMS.get_or_try_init(py, || {
        let socket = py.import("socket")?;
        let get = |n: &str| socket.getattr(n).map(Bound::unbind);
        Ok(Enums {
            af_inet: get("AF_INET")?,
            af_inet6: get("AF_INET6")?,
            stream: get("SOCK_STREAM")?,
            dgram: get("SOCK_DGRAM")?,
            raw: get("SOCK_RAW")?,
            socket: socket.unbind(),
        })
    })
}

impl Enums {
    fn family(&self, py: Python<'_>, af: i32) -> Py<PyAny> {
        match af {
            libc::AF_INET => self.af_inet.clone_ref(py),
            libc::AF_INET6 => self.af_inet6.clone_ref(py),
            other => self.convert(py, "AddressFamily", other),
        }
    }

    fn kind(&self, py: Python<'_>, t: i32) -> Py<PyAny> {
        match t {
            libc::SOCK_STREAM => self.stream.clone_ref(py),
            libc::SOCK_DGRAM => self.dgram.clone_ref(py),
            libc::SOCK_RAW => self.raw.clone_ref(py),
            other => self.convert(py, "SocketKind", other),
        }
    }

    /// `socket.<Enum>(value)`, or the plain int as CPython gives for
    /// values the enum does not know.
    fn convert(&self, py: Python<'_>, enum_name: &str, v: i32) -> Py<PyAny> {
        self.socket
            .bind(py)
            .getattr(enum_name)
            .and_then(|e| e.call1((v,)))
            .map(Bound::unbind)
            .unwrap_or_else(|_| v.into_pyobject(py).expect("int").into_any().unbind())
    }
}

/// The address family of a host literal in canonical form, and its text.
fn parse_host(host: &Bound<'_, PyAny>) -> Option<(i32, String)> {
    let text: String = if let Ok(s) = host.cast::<PyString>() {
        s.to_str().ok()?.to_owned()
    } else if let Ok(b) = host.cast::<PyBytes>() {
        std::str::from_utf8(b.as_bytes()).ok()?.to_owned()
    } else {
        return None;
    };
    if let Ok(a) = text.parse::<Ipv4Addr>() {
        return (a.to_string() == text).then_some((libc::AF_INET, text));
    }
    if let Ok(a) = text.parse::<Ipv6Addr>() {
        return (a.to_string() == text).then_some((libc::AF_INET6, text));
    }
    None
}

/// The port of a numeric service: None, an int, or a string of digits.
fn parse_port(port: &Bound<'_, PyAny>) -> Option<u16> {
    if port.is_none() {
        return Some(0);
    }
    if let Ok(s) = port.cast::<PyString>() {
        let t = s.to_str().ok()?;
        return (!t.is_empty() && t.bytes().all(|c| c.is_ascii_digit())).then(|| t.parse().ok()).flatten();
    }
    if let Ok(b) = port.cast::<PyBytes>() {
        let t = std::str::from_utf8(b.as_bytes()).ok()?;
        return (!t.is_empty() && t.bytes().all(|c| c.is_ascii_digit())).then(|| t.parse().ok()).flatten();
    }
    if port.is_instance_of::<pyo3::types::PyBool>() {
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

/// getaddrinfo answered without the resolver, or None when the arguments
/// need it.
#[pyfunction]
#[pyo3(signature = (host, port, family=0, r#type=0, proto=0, flags=0))]
pub(crate) fn numeric_addrinfo<'py>(
    py: Python<'py>,
    host: &Bound<'py, PyAny>,
    port: &Bound<'py, PyAny>,
    family: i32,
    r#type: i32,
    proto: i32,
    flags: i32,
) -> PyResult<Option<Bound<'py, PyList>>> {
    const FAST_FLAGS: i32 = libc::AI_NUMERICHOST | libc::AI_NUMERICSERV | libc::AI_PASSIVE;
    if flags & !FAST_FLAGS != 0 {
        return Ok(None);
    }
    let Some((af, text)) = parse_host(host) else { return Ok(None) };
    let Some(port) = parse_port(port) else { return Ok(None) };
    let Some(kinds) = socket_kinds(r#type, proto) else { return Ok(None) };
    if family != 0 && family != af {
        return Ok(None);
    }
    let e = enums(py)?;
    let host_str = PyString::new(py, &text);
    let sockaddr = match af {
        libc::AF_INET => PyTuple::new(py, [host_str.into_any(), port.into_pyobject(py)?.into_any()])?,
        _ => {
            let zero = 0u32.into_pyobject(py)?.into_any();
            PyTuple::new(py, [host_str.into_any(), port.into_pyobject(py)?.into_any(), zero.clone(), zero])?
        }
    };
    let family_obj = e.family(py, af);
    let empty = PyString::new(py, "");
    let items = kinds
        .iter()
        .map(|&(t, p)| {
            PyTuple::new(
                py,
                [
                    family_obj.bind(py).clone(),
                    e.kind(py, t).into_bound(py),
                    p.into_pyobject(py).expect("int").into_any(),
                    empty.clone().into_any(),
                    sockaddr.clone().into_any(),
                ],
            )
        })
        .collect::<PyResult<Vec<_>>>()?;
    Ok(Some(PyList::new(py, items)?))
}

/// One libuv resolver request (`uv_getaddrinfo_t`, `uv_getnameinfo_t`) and
/// the future it settles; the request comes first, so libuv's pointer to it
/// is a pointer to the whole.
#[repr(C)]
struct Request<R> {
    req: R,
    loop_state: *mut LoopState,
    future: Py<PyAny>,
}

impl<R> Request<R> {
    /// A request for libuv to fill in, owned by the callback once started.
    fn start(loop_state: *mut LoopState, future: Py<PyAny>) -> *mut Request<R> {
        Box::into_raw(Box::new(Request {
            // SAFETY: a plain C struct, initialised by the libuv call.
            req: unsafe { MaybeUninit::zeroed().assume_init() },
            loop_state,
            future,
        }))
    }

    /// Takes back a request libuv has completed (`req`, as its callback got
    /// it) and settles the future: a socket.gaierror for a failed `status`,
    /// else what `result` builds; nothing if the future was cancelled
    /// meanwhile. What goes wrong is handled as any error raised in a libuv
    /// callback.
    ///
    /// # Safety
    /// `req` came from `Request::<R>::start` and libuv is done with it.
    unsafe fn finish(req: *mut R, status: i32, result: impl FnOnce(Python<'_>) -> PyResult<Bound<'_, PyAny>>) {
        unsafe {
            let r = Box::from_raw(req as *mut Request<R>);
            (*r.loop_state).gil.reacquire();
            let py = Python::assume_attached();
            let future = r.future.bind(py);
            let outcome = future.call_method0("cancelled").and_then(|c| c.is_truthy()).and_then(|cancelled| {
                if cancelled {
                    Ok(())
                } else if status < 0 {
                    future.call_method1("set_exception", (gaierror(py, status)?.into_value(py),)).map(drop)
                } else {
                    future.call_method1("set_result", (result(py)?,)).map(drop)
                }
            });
            if let Err(err) = outcome {
                if err.is_instance_of::<pyo3::exceptions::PyKeyboardInterrupt>(py)
                    || err.is_instance_of::<pyo3::exceptions::PySystemExit>(py)
                {
                    (*r.loop_state).raise_later(err);
                } else {
                    err.write_unraisable(py, None);
                }
            }
        }
    }
}

type GaiRequest = Request<sys::uv_getaddrinfo_t>;
type NameInfoRequest = Request<sys::uv_getnameinfo_t>;

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
    let socket = &enums(py)?.socket;
    let socket = socket.bind(py);
    let sys_code: i32 = socket.getattr(eai_name(code)).and_then(|v| v.extract()).unwrap_or(libc::EAI_FAIL);
    // SAFETY: gai_strerror returns a static string.
    let msg = unsafe { CStr::from_ptr(libc::gai_strerror(sys_code)) }.to_string_lossy().into_owned();
    let exc = socket.getattr("gaierror")?.call1((sys_code, msg))?;
    Ok(PyErr::from_value(exc))
}

/// The Python sockaddr of a resolved address: (host, port) for IPv4,
/// (host, port, flowinfo, scope_id) for IPv6.
pub(crate) unsafe fn sockaddr_tuple<'py>(
    py: Python<'py>,
    sa: *const libc::sockaddr,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    unsafe {
        match (*sa).sa_family as i32 {
            libc::AF_INET => {
                let a = &*(sa as *const libc::sockaddr_in);
                let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
                Ok(Some(PyTuple::new(
                    py,
                    [
                        ip.to_string().into_pyobject(py)?.into_any(),
                        u16::from_be(a.sin_port).into_pyobject(py)?.into_any(),
                    ],
                )?))
            }
            libc::AF_INET6 => {
                let a = &*(sa as *const libc::sockaddr_in6);
                let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
                Ok(Some(PyTuple::new(
                    py,
                    [
                        ip.to_string().into_pyobject(py)?.into_any(),
                        u16::from_be(a.sin6_port).into_pyobject(py)?.into_any(),
                        u32::from_be(a.sin6_flowinfo).into_pyobject(py)?.into_any(),
                        a.sin6_scope_id.into_pyobject(py)?.into_any(),
                    ],
                )?))
            }
            _ => Ok(None),
        }
    }
}

unsafe fn addrinfo_list<'py>(py: Python<'py>, mut ai: *const libc::addrinfo) -> PyResult<Bound<'py, PyList>> {
    let e = enums(py)?;
    let out = PyList::empty(py);
    unsafe {
        while !ai.is_null() {
            let a = &*ai;
            if let Some(addr) = sockaddr_tuple(py, a.ai_addr)? {
                let canon = if a.ai_canonname.is_null() {
                    String::new()
                } else {
                    CStr::from_ptr(a.ai_canonname).to_string_lossy().into_owned()
                };
                out.append(PyTuple::new(
                    py,
                    [
                        e.family(py, a.ai_family).into_bound(py),
                        e.kind(py, a.ai_socktype).into_bound(py),
                        a.ai_protocol.into_pyobject(py)?.into_any(),
                        canon.into_pyobject(py)?.into_any(),
                        addr.into_any(),
                    ],
                )?)?;
            }
            ai = a.ai_next;
        }
    }
    Ok(out)
}

unsafe extern "C" fn on_resolved(req: *mut sys::uv_getaddrinfo_t, status: i32, res: *mut sys::addrinfo) {
    unsafe {
        GaiRequest::finish(req, status, |py| Ok(addrinfo_list(py, res as *const libc::addrinfo)?.into_any()));
        if !res.is_null() {
            sys::uv_freeaddrinfo(res);
        }
    }
}

/// Starts resolving (`host`, `port`) (bytes or None) on libuv's thread
/// pool; `future` gets the result list or a socket.gaierror.
pub(crate) fn resolve(
    core: &LoopCore,
    future: Py<PyAny>,
    host: Option<&[u8]>,
    port: Option<&[u8]>,
    hints: (i32, i32, i32, i32),
) -> PyResult<()> {
    let loop_state = core.state_ptr();
    let uv_loop = unsafe { (*loop_state).uv_loop() }.ok_or_else(|| PyRuntimeError::new_err("Event loop is closed"))?;
    let cstr = |b: Option<&[u8]>| -> PyResult<Option<CString>> {
        b.map(|b| CString::new(b).map_err(|_| pyo3::exceptions::PyValueError::new_err("embedded null byte")))
            .transpose()
    };
    let (node, service) = (cstr(host)?, cstr(port)?);
    let (family, socktype, proto, flags) = hints;
    let mut ai: libc::addrinfo = unsafe { MaybeUninit::zeroed().assume_init() };
    ai.ai_family = family;
    ai.ai_socktype = socktype;
    ai.ai_protocol = proto;
    ai.ai_flags = flags;
    let req = GaiRequest::start(loop_state, future);
    // SAFETY: libuv copies node, service and hints before returning.
    let rc = unsafe {
        sys::uv_getaddrinfo(
            uv_loop,
            &mut (*req).req,
            Some(on_resolved),
            node.as_ref().map_or(ptr::null(), |c| c.as_ptr()),
            service.as_ref().map_or(ptr::null(), |c| c.as_ptr()),
            &ai as *const libc::addrinfo as *const sys::addrinfo,
        )
    };
    if rc < 0 {
        drop(unsafe { Box::from_raw(req) });
        return Err(uv_error(rc));
    }
    Ok(())
}

/// Completes `future` with (host, service) or a socket.gaierror, as
/// socket.getnameinfo would return or raise.
unsafe extern "C" fn on_name_info(
    req: *mut sys::uv_getnameinfo_t,
    status: i32,
    host: *const libc::c_char,
    service: *const libc::c_char,
) {
    unsafe {
        NameInfoRequest::finish(req, status, |py| {
            let text = |p: *const libc::c_char| CStr::from_ptr(p).to_string_lossy().into_owned();
            Ok((text(host), text(service)).into_pyobject(py)?.into_any())
        });
    }
}

/// Starts `getnameinfo` of a numeric address (as socket.getnameinfo with
/// NI_NUMERICHOST | NI_NUMERICSERV printed it: IPv6 scope suffixes are
/// ignored here, `scope_id` carries the scope) on libuv's thread pool.
pub(crate) fn name_info(
    core: &LoopCore,
    future: Py<PyAny>,
    host: &str,
    port: u16,
    flowinfo: u32,
    scope_id: u32,
    flags: i32,
) -> PyResult<()> {
    let loop_state = core.state_ptr();
    let uv_loop = unsafe { (*loop_state).uv_loop() }.ok_or_else(|| PyRuntimeError::new_err("Event loop is closed"))?;
    let bare = host.split('%').next().unwrap_or(host);
    let ip: std::net::IpAddr = bare
        .parse()
        .map_err(|_| pyo3::exceptions::PyValueError::new_err(format!("not a numeric address: {host:?}")))?;
    let mut storage: libc::sockaddr_storage = unsafe { MaybeUninit::zeroed().assume_init() };
    match ip {
        std::net::IpAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is large and aligned enough.
            let sa = unsafe { &mut *(&mut storage as *mut _ as *mut libc::sockaddr_in) };
            sa.sin_family = libc::AF_INET as libc::sa_family_t;
            sa.sin_port = port.to_be();
            sa.sin_addr.s_addr = u32::from(v4).to_be();
        }
        std::net::IpAddr::V6(v6) => {
            let sa = unsafe { &mut *(&mut storage as *mut _ as *mut libc::sockaddr_in6) };
            sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sa.sin6_port = port.to_be();
            sa.sin6_flowinfo = flowinfo.to_be();
            sa.sin6_addr.s6_addr = v6.octets();
            sa.sin6_scope_id = scope_id;
        }
    }
    let req = NameInfoRequest::start(loop_state, future);
    // SAFETY: libuv copies the address before returning.
    let rc = unsafe {
        sys::uv_getnameinfo(
            uv_loop,
            &mut (*req).req,
            Some(on_name_info),
            &storage as *const _ as *const sys::sockaddr,
            flags,
        )
    };
    if rc < 0 {
        drop(unsafe { Box::from_raw(req) });
        return Err(uv_error(rc));
    }
    Ok(())
}
