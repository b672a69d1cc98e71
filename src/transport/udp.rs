//! Datagram transports (UDP over AF_INET / AF_INET6, and AF_UNIX datagram
//! sockets): `DatagramCore`.
//!
//! libuv watches the socket's fd directly with a `uv_poll_t` (no second
//! epoll set, no Python fd handler), and the core does the I/O itself:
//!
//! - readable: one `recvfrom` into the loop's scratch buffer, then
//!   `protocol.datagram_received(bytes, addr)` (or `error_received` for an
//!   OSError) straight from libuv's callback. One datagram per readiness
//!   event, as asyncio's selector transport reads (libuv's own `uv_udp_t`
//!   reads until EAGAIN, which costs a failing `recvmsg` per wake-up).
//! - `sendto()` is a native method: `send(2)` on a connected socket,
//!   `sendto(2)` with a numeric (host, port) or a Unix path / abstract name
//!   (an exact str or bytes) parsed here, and Python's `socket.sendto` for
//!   any other address (names, scope ids, bad input), so resolution and
//!   every error are the socket module's own. What the kernel refuses with
//!   EAGAIN is buffered and sent when the fd is writable.
//! - A sender's address is built as `socket.recvfrom` builds it: a tuple
//!   for IP, a str path or bytes abstract name for AF_UNIX, None for an
//!   unnamed Unix sender; a repeated sender gets the same object.
//!
//! The semantics are those of asyncio's `_SelectorDatagramTransport`, line by
//! line; the Python `DatagramTransport` (python/zuvrs/_datagram.py) keeps the
//! once-per-transport parts (connection_lost, error reports, flow control's
//! pause/resume calls) and binds `sendto` from here.
//!
//! Ownership: the Python socket keeps the fd; libuv only watches it. The
//! poll handle's box holds a strong reference to the core until libuv's close
//! callback. `_close_handle` (before the socket is closed) calls `uv_close`,
//! which removes the fd from libuv's epoll set at once.

use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::mem::MaybeUninit;

use pyo3::exceptions::{PyBlockingIOError, PyInterruptedError, PyOSError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString, PyTuple};

use crate::errors::uv_error;
use crate::eventloop::{LoopCore, LoopState};
use crate::transport::stream::is_fatal_base;
use crate::uv::{sys, HandleBox, UvHandle};

/// Largest datagram read at once (asyncio's `max_size`).
const MAX_SIZE: usize = 256 * 1024;
/// After this many sends on a lost connected endpoint asyncio warns.
const LOG_THRESHOLD_FOR_CONNLOST_WRITES: u32 = 5;
/// 3.13 sends empty datagrams and counts 8 header bytes per buffered one.
const SENDS_EMPTY: bool = cfg!(Py_3_13);
const HEADER_SIZE: isize = if SENDS_EMPTY { 8 } else { 0 };

#[repr(C)]
struct PollBox {
    /// Must stay the first field (see `HandleBox`).
    poll: sys::uv_poll_t,
    loop_state: *mut LoopState,
    /// The core, kept alive until libuv is done with the handle.
    keep_alive: Option<Py<DatagramCore>>,
}

// SAFETY: repr(C) with the uv handle first.
unsafe impl HandleBox for PollBox {}

/// A socket address as the kernel takes it: IPv4, IPv6 or Unix.
#[derive(Clone, Copy)]
struct RawAddr {
    /// Large enough for every family (a `sockaddr_in`, `sockaddr_in6` or
    /// `sockaddr_un` is a prefix).
    sa: libc::sockaddr_storage,
    len: libc::socklen_t,
}

/// Where `sun_path` starts in a `sockaddr_un` (after the family).
const SUN_PATH_OFFSET: usize = std::mem::size_of::<libc::sa_family_t>();
/// The size of `sun_path`.
const SUN_PATH_LEN: usize = std::mem::size_of::<libc::sockaddr_un>() - SUN_PATH_OFFSET;

/// The socket address types a `RawAddr` holds.
trait SockAddr {}
impl SockAddr for libc::sockaddr_in {}
impl SockAddr for libc::sockaddr_in6 {}
impl SockAddr for libc::sockaddr_un {}

impl RawAddr {
    fn zeroed() -> Self {
        // SAFETY: plain C data, valid when zeroed.
        RawAddr { sa: unsafe { MaybeUninit::zeroed().assume_init() }, len: 0 }
    }

    fn as_ptr(&self) -> *const libc::sockaddr {
        &self.sa as *const libc::sockaddr_storage as *const libc::sockaddr
    }

    fn as_mut_ptr(&mut self) -> *mut libc::sockaddr {
        &mut self.sa as *mut libc::sockaddr_storage as *mut libc::sockaddr
    }

    fn family(&self) -> i32 {
        self.sa.ss_family as i32
    }

    /// The storage as one of the socket address types.
    fn view<T: SockAddr>(&self) -> &T {
        // SAFETY: every SockAddr type is a prefix of the storage, alignment
        // included, and valid for any bytes.
        unsafe { &*(self.as_ptr() as *const T) }
    }

    fn view_mut<T: SockAddr>(&mut self) -> &mut T {
        // SAFETY: as view().
        unsafe { &mut *(self.as_mut_ptr() as *mut T) }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: len never exceeds the size of sa.
        unsafe { std::slice::from_raw_parts(self.as_ptr() as *const u8, self.len as usize) }
    }
}

/// A datagram waiting for the socket to be writable: an immutable copy of
/// the data and the address it goes to.
struct Pending {
    data: Py<PyBytes>,
    addr: Py<PyAny>,
}

/// How one send attempt went (asyncio's try/except around `sock.sendto`).
enum Sent {
    Done,
    /// BlockingIOError / InterruptedError: try again when writable.
    Blocked,
    /// Another OSError: for `protocol.error_received`.
    Failed(PyErr),
    /// Any other exception: a fatal error of the transport.
    Fatal(PyErr),
}

struct DgramState {
    handle: Option<UvHandle<PollBox>>,
    loop_state: *mut LoopState,
    loop_obj: Py<PyAny>,
    /// The Python transport this core belongs to.
    wrapper: Py<PyAny>,
    /// The Python socket: its fd is ours to use until `_close_handle`, and
    /// its `sendto` resolves the addresses not handled natively.
    sock: Option<Py<PyAny>>,
    fd: i32,
    family: i32,
    protocol: Option<Py<PyAny>>,
    /// asyncio's `_address` when truthy, and `(None, _address)` for its
    /// `addr not in (None, self._address)` check.
    address: Option<(Py<PyAny>, Py<PyTuple>)>,
    /// `extra['peername']` was truthy: data goes out with send(2).
    connected: bool,
    /// start_reading() ran (connection_made has been called).
    started: bool,
    paused: bool,
    closing: bool,
    conn_lost: u32,
    /// libuv events currently asked for (UV_READABLE | UV_WRITABLE).
    events: i32,
    writer_watched: bool,
    queue: VecDeque<Pending>,
    buffer_size: isize,
    /// The last address object sent to and its parsed form (by identity).
    last_dest: Option<(Py<PyAny>, RawAddr)>,
    /// The last sender seen and its Python tuple, reused while it repeats.
    last_source: Option<(RawAddr, Py<PyAny>)>,
    /// For tests: this many native send attempts report EAGAIN (loopback
    /// UDP never fills, so buffering could not be exercised otherwise).
    blocked_sends: u32,
}

#[pyclass(module = "zuvrs._zuvrs", name = "DatagramCore", frozen)]
pub struct DatagramCore {
    state: UnsafeCell<DgramState>,
}

// SAFETY: touched only with the GIL held.
unsafe impl Sync for DatagramCore {}
unsafe impl Send for DatagramCore {}

// The C library's address text conversions (the socket module's own), which
// the libc crate does not declare.
extern "C" {
    fn inet_pton(af: libc::c_int, src: *const libc::c_char, dst: *mut libc::c_void) -> libc::c_int;
    fn inet_ntop(
        af: libc::c_int,
        src: *const libc::c_void,
        dst: *mut libc::c_char,
        size: libc::socklen_t,
    ) -> *const libc::c_char;
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// asyncio's classification of an exception raised by a send attempt.
fn classify(py: Python<'_>, err: PyErr) -> PyResult<Sent> {
    if is_fatal_base(py, &err) {
        Err(err)
    } else if err.is_instance_of::<PyBlockingIOError>(py) || err.is_instance_of::<PyInterruptedError>(py) {
        Ok(Sent::Blocked)
    } else if err.is_instance_of::<PyOSError>(py) {
        Ok(Sent::Failed(err))
    } else {
        Ok(Sent::Fatal(err))
    }
}

/// An exact int in `lo..=hi`, or None (the socket module then decides).
fn small_int(obj: &Bound<'_, PyAny>, lo: i64, hi: i64) -> Option<i64> {
    // SAFETY: type check only.
    if unsafe { pyo3::ffi::PyLong_CheckExact(obj.as_ptr()) } == 0 {
        return None;
    }
    let v: i64 = obj.extract().ok()?;
    (lo..=hi).contains(&v).then_some(v)
}

/// The host of an address tuple parsed as the socket module parses a
/// numeric one (`inet_pton` on the ASCII string), or None for anything
/// else: a name, a scope id, bytes, a non-ASCII string (IDNA), a str
/// subclass.
fn numeric_host(obj: &Bound<'_, PyAny>, family: i32, out: *mut libc::c_void) -> bool {
    let Ok(s) = obj.cast_exact::<PyString>() else { return false };
    let Ok(text) = s.to_str() else { return false };
    if !text.is_ascii() || text.len() >= 64 || text.contains('\0') || (family == libc::AF_INET6 && text.contains('%')) {
        return false;
    }
    let mut buf = [0u8; 64];
    buf[..text.len()].copy_from_slice(text.as_bytes());
    // SAFETY: buf is NUL-terminated; out holds an in_addr / in6_addr.
    unsafe { inet_pton(family, buf.as_ptr() as *const libc::c_char, out) == 1 }
}

/// A numeric (host, port) / (host, port, flowinfo, scope_id) tuple as a
/// socket address, or None when Python's socket module must look at it.
fn parse_address(addr: &Bound<'_, PyAny>, family: i32) -> Option<RawAddr> {
    if family == libc::AF_UNIX {
        return parse_unix_address(addr);
    }
    let t = addr.cast_exact::<PyTuple>().ok()?;
    let mut raw = RawAddr::zeroed();
    if family == libc::AF_INET {
        if t.len() != 2 {
            return None;
        }
        let port = small_int(&t.get_item(1).ok()?, 0, 0xffff)?;
        let sin = raw.view_mut::<libc::sockaddr_in>();
        if !numeric_host(&t.get_item(0).ok()?, family, &mut sin.sin_addr as *mut _ as *mut libc::c_void) {
            return None;
        }
        sin.sin_family = libc::AF_INET as libc::sa_family_t;
        sin.sin_port = (port as u16).to_be();
        raw.len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    } else {
        if !(2..=4).contains(&t.len()) {
            return None;
        }
        let port = small_int(&t.get_item(1).ok()?, 0, 0xffff)?;
        let flowinfo = if t.len() > 2 { small_int(&t.get_item(2).ok()?, 0, 0xfffff)? } else { 0 };
        let scope_id = if t.len() > 3 { small_int(&t.get_item(3).ok()?, 0, u32::MAX as i64)? } else { 0 };
        let sin6 = raw.view_mut::<libc::sockaddr_in6>();
        if !numeric_host(&t.get_item(0).ok()?, family, &mut sin6.sin6_addr as *mut _ as *mut libc::c_void) {
            return None;
        }
        sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
        sin6.sin6_port = (port as u16).to_be();
        sin6.sin6_flowinfo = (flowinfo as u32).to_be();
        sin6.sin6_scope_id = scope_id as u32;
        raw.len = std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t;
    }
    Some(raw)
}

/// A Unix socket path as the socket module builds it from an exact str
/// (encoded with the filesystem encoding) or exact bytes: a path with a
/// NUL after it, or a Linux abstract name (a leading NUL byte) taken as
/// is. None for anything else (an empty or too long path, a str the
/// filesystem encoding refuses, other types), which the socket module then
/// accepts or rejects itself.
fn parse_unix_address(addr: &Bound<'_, PyAny>) -> Option<RawAddr> {
    let py = addr.py();
    let encoded;
    let path: &[u8] = if let Ok(b) = addr.cast_exact::<PyBytes>() {
        b.as_bytes()
    } else if addr.cast_exact::<PyString>().is_ok() {
        // SAFETY: a new reference or NULL with an exception set.
        let obj = unsafe { pyo3::ffi::PyUnicode_EncodeFSDefault(addr.as_ptr()) };
        if obj.is_null() {
            drop(PyErr::take(py));
            return None;
        }
        // SAFETY: owned new reference to a bytes object.
        encoded = unsafe { Bound::from_owned_ptr(py, obj) }.cast_into::<PyBytes>().ok()?;
        encoded.as_bytes()
    } else {
        return None;
    };
    let abstract_name = path.first() == Some(&0);
    if path.is_empty() || (abstract_name && path.len() > SUN_PATH_LEN) || (!abstract_name && path.len() >= SUN_PATH_LEN)
    {
        return None;
    }
    let mut raw = RawAddr::zeroed();
    let sun = raw.view_mut::<libc::sockaddr_un>();
    sun.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, src) in sun.sun_path.iter_mut().zip(path) {
        *dst = *src as libc::c_char;
    }
    // A path counts its terminating NUL (already there: zeroed storage).
    raw.len = (SUN_PATH_OFFSET + path.len() + usize::from(!abstract_name)) as libc::socklen_t;
    Some(raw)
}

/// A sender's address as `socket.recvfrom` gives it: (host, port) or
/// (host, port, flowinfo, scope_id), the host as `inet_ntop` prints it;
/// for a Unix socket its path (a str) or abstract name (bytes).
fn source_address(py: Python<'_>, raw: &RawAddr) -> PyResult<Py<PyAny>> {
    let family = raw.family();
    if family == libc::AF_UNIX {
        return source_unix(py, raw);
    }
    let mut text = [0 as libc::c_char; 64];
    let (src, port) = if family == libc::AF_INET {
        let sin = raw.view::<libc::sockaddr_in>();
        (&sin.sin_addr as *const _ as *const libc::c_void, u16::from_be(sin.sin_port))
    } else if family == libc::AF_INET6 {
        let sin6 = raw.view::<libc::sockaddr_in6>();
        (&sin6.sin6_addr as *const _ as *const libc::c_void, u16::from_be(sin6.sin6_port))
    } else {
        return Ok(py.None());
    };
    // SAFETY: src is an in_addr / in6_addr; text has room for either.
    let host = unsafe {
        if inet_ntop(family, src, text.as_mut_ptr(), text.len() as libc::socklen_t).is_null() {
            return Err(uv_error(-errno()));
        }
        std::ffi::CStr::from_ptr(text.as_ptr()).to_str().unwrap_or_default().to_owned()
    };
    let t = if family == libc::AF_INET {
        (host, port).into_pyobject(py)?.into_any()
    } else {
        let sin6 = raw.view::<libc::sockaddr_in6>();
        (host, port, u32::from_be(sin6.sin6_flowinfo), sin6.sin6_scope_id).into_pyobject(py)?.into_any()
    };
    Ok(t.unbind())
}

/// A Unix sender's address as CPython's `makesockaddr` gives it on Linux:
/// an abstract name (leading NUL) as bytes of the length the kernel
/// reported, a path as a str decoded with the filesystem encoding up to
/// its NUL (an unnamed sender reports no address at all: None, handled by
/// the caller).
fn source_unix(py: Python<'_>, raw: &RawAddr) -> PyResult<Py<PyAny>> {
    let n = (raw.len as usize).saturating_sub(SUN_PATH_OFFSET).min(SUN_PATH_LEN);
    let sun = raw.view::<libc::sockaddr_un>();
    // SAFETY: sun_path holds SUN_PATH_LEN bytes.
    let path = unsafe { std::slice::from_raw_parts(sun.sun_path.as_ptr() as *const u8, SUN_PATH_LEN) };
    if n > 0 && path[0] == 0 {
        return Ok(PyBytes::new(py, &path[..n]).into_any().unbind());
    }
    let end = path[..n].iter().position(|&b| b == 0).unwrap_or(n);
    // SAFETY: a valid buffer of `end` bytes; a new reference or NULL.
    unsafe {
        let obj = pyo3::ffi::PyUnicode_DecodeFSDefaultAndSize(
            path.as_ptr() as *const libc::c_char,
            end as pyo3::ffi::Py_ssize_t,
        );
        Ok(Bound::from_owned_ptr_or_err(py, obj)?.unbind())
    }
}

/// The bytes of a bytes-like object for one system call.
enum Data<'a> {
    Bytes(&'a [u8]),
    View(Box<pyo3::ffi::Py_buffer>),
}

impl Data<'_> {
    fn get<'a>(obj: &'a Bound<'_, PyAny>) -> PyResult<Data<'a>> {
        if let Ok(b) = obj.cast::<PyBytes>() {
            return Ok(Data::Bytes(b.as_bytes()));
        }
        // SAFETY: zeroed Py_buffer filled by PyObject_GetBuffer, released in Drop.
        let mut view: Box<pyo3::ffi::Py_buffer> = Box::new(unsafe { MaybeUninit::zeroed().assume_init() });
        if unsafe { pyo3::ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, pyo3::ffi::PyBUF_SIMPLE) } < 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        Ok(Data::View(view))
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            Data::Bytes(s) => s,
            // SAFETY: the exported buffer is valid until released.
            Data::View(v) => unsafe { std::slice::from_raw_parts(v.buf as *const u8, v.len as usize) },
        }
    }
}

impl Drop for Data<'_> {
    fn drop(&mut self) {
        if let Data::View(v) = self {
            // SAFETY: acquired by PyObject_GetBuffer, with the GIL held.
            unsafe { pyo3::ffi::PyBuffer_Release(&mut **v) }
        }
    }
}

impl DatagramCore {
    /// # Safety
    /// GIL held; no reference kept across calls into Python or libuv.
    #[allow(clippy::mut_from_ref)]
    #[inline]
    unsafe fn st(&self) -> &mut DgramState {
        unsafe { &mut *self.state.get() }
    }

    #[allow(clippy::mut_from_ref)]
    fn loop_state(&self) -> &mut LoopState {
        unsafe { &mut *self.st().loop_state }
    }

    fn wrapper(&self, py: Python<'_>) -> Py<PyAny> {
        unsafe { self.st().wrapper.clone_ref(py) }
    }

    fn protocol(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        unsafe { self.st().protocol.as_ref().map(|p| p.clone_ref(py)) }
    }

    /// Asks libuv for the events the state calls for: readable while
    /// reading, writable while datagrams wait.
    fn update_poll(&self) -> PyResult<()> {
        let st = unsafe { self.st() };
        let Some(h) = st.handle.as_ref() else { return Ok(()) };
        let mut want = 0;
        if st.started && !st.paused && !st.closing {
            want |= sys::uv_poll_event_UV_READABLE as i32;
        }
        if st.writer_watched {
            want |= sys::uv_poll_event_UV_WRITABLE as i32;
        }
        if want == st.events {
            return Ok(());
        }
        // SAFETY: the handle is open (it leaves the state before uv_close).
        let rc = unsafe {
            if want == 0 {
                sys::uv_poll_stop(&mut (*h.raw()).poll)
            } else {
                sys::uv_poll_start(&mut (*h.raw()).poll, want, Some(on_poll))
            }
        };
        if rc < 0 {
            return Err(uv_error(rc));
        }
        st.events = want;
        Ok(())
    }

    fn watch_writable(&self) -> PyResult<()> {
        let st = unsafe { self.st() };
        if !st.writer_watched {
            st.writer_watched = true;
            self.update_poll()?;
        }
        Ok(())
    }

    fn unwatch_writable(&self) -> PyResult<()> {
        let st = unsafe { self.st() };
        if st.writer_watched {
            st.writer_watched = false;
            self.update_poll()?;
        }
        Ok(())
    }

    /// Where a datagram for `addr` goes: the parsed address, or None when
    /// Python's socket module must handle `addr`.
    fn destination(&self, addr: &Bound<'_, PyAny>) -> Option<RawAddr> {
        let st = unsafe { self.st() };
        if let Some((obj, raw)) = &st.last_dest {
            if obj.as_ptr() == addr.as_ptr() {
                return Some(*raw);
            }
        }
        if addr.is_none() {
            return None;
        }
        let raw = parse_address(addr, st.family)?;
        // Only exact tuples of exact str and int get here: immutable, so
        // the same object always means the same address.
        st.last_dest = Some((addr.clone().unbind(), raw));
        Some(raw)
    }

    /// One send attempt, as asyncio's `sock.send(data)` (connected) or
    /// `sock.sendto(data, addr)`.
    fn try_send(&self, py: Python<'_>, data: &Bound<'_, PyAny>, addr: &Bound<'_, PyAny>) -> PyResult<Sent> {
        let (fd, connected) = unsafe {
            let st = self.st();
            (st.fd, st.connected)
        };
        if fd < 0 {
            // The socket was closed (connection_lost has run).
            return Ok(Sent::Fatal(uv_error(-libc::EBADF)));
        }
        let dest = if connected { None } else { self.destination(addr) };
        if !connected && dest.is_none() {
            let Some(sock) = (unsafe { self.st().sock.as_ref().map(|s| s.clone_ref(py)) }) else {
                return Ok(Sent::Fatal(uv_error(-libc::EBADF)));
            };
            return match sock.call_method1(py, pyo3::intern!(py, "sendto"), (data, addr)) {
                Ok(_) => Ok(Sent::Done),
                Err(err) => classify(py, err),
            };
        }
        let st = unsafe { self.st() };
        if st.blocked_sends > 0 {
            st.blocked_sends -= 1;
            return Ok(Sent::Blocked);
        }
        let buf = match Data::get(data) {
            Ok(b) => b,
            Err(err) => return classify(py, err),
        };
        let bytes = buf.as_slice();
        loop {
            // SAFETY: the buffer is exported for the duration of the call;
            // the address is a valid sockaddr of its length.
            let n = unsafe {
                match &dest {
                    None => libc::send(fd, bytes.as_ptr() as *const _, bytes.len(), 0),
                    Some(raw) => libc::sendto(fd, bytes.as_ptr() as *const _, bytes.len(), 0, raw.as_ptr(), raw.len),
                }
            };
            if n >= 0 {
                return Ok(Sent::Done);
            }
            match errno() {
                libc::EAGAIN => return Ok(Sent::Blocked),
                // As the socket module: run signal handlers, then retry.
                libc::EINTR => {
                    if let Err(err) = py.check_signals() {
                        return classify(py, err);
                    }
                    if unsafe { self.st().fd } < 0 {
                        return Ok(Sent::Fatal(uv_error(-libc::EBADF)));
                    }
                }
                e => return Ok(Sent::Failed(uv_error(-e))),
            }
        }
    }

    /// `protocol.error_received(exc)`.
    fn error_received(&self, py: Python<'_>, exc: PyErr) -> PyResult<()> {
        if let Some(protocol) = self.protocol(py) {
            protocol.call_method1(py, pyo3::intern!(py, "error_received"), (exc.into_value(py),))?;
        }
        Ok(())
    }

    /// `wrapper._fatal_error(exc, message)`.
    fn fatal_error(&self, py: Python<'_>, exc: PyErr, message: &str) -> PyResult<()> {
        if unsafe { self.st().wrapper.is_none(py) } {
            return Ok(()); // the transport has finished: a late write is dropped
        }
        self.wrapper(py).call_method1(py, pyo3::intern!(py, "_fatal_error"), (exc.into_value(py), message))?;
        Ok(())
    }

    /// asyncio's `_read_ready`: one datagram to the protocol.
    fn read_ready(&self, py: Python<'_>) -> PyResult<()> {
        let st = unsafe { self.st() };
        if st.conn_lost > 0 || st.fd < 0 {
            return Ok(());
        }
        let fd = st.fd;
        let mut src = RawAddr::zeroed();
        let n = loop {
            // The loop's scratch buffer (re-derived: signal handlers may
            // have run Python code since the last attempt).
            let (buf, size) = self.loop_state().read_buf.scratch(py)?;
            src.len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            // SAFETY: the scratch buffer and address storage are sized.
            let n = unsafe { libc::recvfrom(fd, buf as *mut _, size.min(MAX_SIZE), 0, src.as_mut_ptr(), &mut src.len) };
            if n >= 0 {
                break n as usize;
            }
            match errno() {
                libc::EAGAIN => return Ok(()),
                libc::EINTR => {
                    if let Err(err) = py.check_signals() {
                        if is_fatal_base(py, &err) {
                            return Err(err);
                        }
                        if err.is_instance_of::<PyOSError>(py) {
                            return self.error_received(py, err);
                        }
                        return self.fatal_error(py, err, "Fatal read error on datagram transport");
                    }
                    if unsafe { self.st().fd } < 0 {
                        return Ok(());
                    }
                }
                e => return self.error_received(py, uv_error(-e)),
            }
        };
        let data = self.loop_state().read_buf.copy(py, n);
        let st = unsafe { self.st() };
        let addr = match &st.last_source {
            Some((raw, t)) if raw.len == src.len && raw.bytes() == src.bytes() => t.clone_ref(py),
            _ => {
                let t = if src.len == 0 { py.None() } else { source_address(py, &src)? };
                st.last_source = Some((src, t.clone_ref(py)));
                t
            }
        };
        if let Some(protocol) = self.protocol(py) {
            protocol.call_method1(py, pyo3::intern!(py, "datagram_received"), (data, addr))?;
        }
        Ok(())
    }

    /// asyncio's `_sendto_ready`: the buffered datagrams, in order.
    fn sendto_ready(&self, py: Python<'_>) -> PyResult<()> {
        loop {
            let st = unsafe { self.st() };
            let Some(item) = st.queue.pop_front() else { break };
            let size = item.data.bind(py).as_bytes().len() as isize + HEADER_SIZE;
            st.buffer_size -= size;
            let outcome = self.try_send(py, item.data.bind(py).as_any(), item.addr.bind(py))?;
            match outcome {
                Sent::Done => {}
                Sent::Blocked => {
                    let st = unsafe { self.st() };
                    st.queue.push_front(item);
                    st.buffer_size += size;
                    break;
                }
                Sent::Failed(exc) => return self.error_received(py, exc),
                Sent::Fatal(exc) => return self.fatal_error(py, exc, "Fatal write error on datagram transport"),
            }
        }
        // May append to the buffer.
        self.wrapper(py).call_method0(py, pyo3::intern!(py, "_maybe_resume_protocol"))?;
        let st = unsafe { self.st() };
        if st.queue.is_empty() {
            self.unwatch_writable()?;
            if unsafe { self.st().closing } {
                self.wrapper(py).call_method1(py, pyo3::intern!(py, "_call_connection_lost"), (py.None(),))?;
            }
        }
        Ok(())
    }

    /// Schedules `wrapper._call_connection_lost(exc)`.
    fn schedule_connection_lost(&self, py: Python<'_>, exc: Option<Py<PyAny>>) -> PyResult<()> {
        let st = unsafe { self.st() };
        let loop_obj = st.loop_obj.clone_ref(py);
        let cb = st.wrapper.getattr(py, pyo3::intern!(py, "_call_connection_lost"))?;
        loop_obj.call_method1(py, pyo3::intern!(py, "call_soon"), (cb, exc))?;
        Ok(())
    }

    /// An exception that escaped a readiness callback: KeyboardInterrupt
    /// and SystemExit stop the loop; the rest goes to the exception handler
    /// as asyncio reports a failing fd callback.
    fn callback_failed(&self, py: Python<'_>, err: PyErr, writing: bool) {
        if is_fatal_base(py, &err) {
            self.loop_state().raise_later(err);
            return;
        }
        let res =
            self.wrapper(py).call_method1(py, pyo3::intern!(py, "_callback_failed"), (err.into_value(py), writing));
        if let Err(err) = res {
            if is_fatal_base(py, &err) {
                self.loop_state().raise_later(err);
            } else {
                err.write_unraisable(py, None);
            }
        }
    }

    /// libuv reported the fd ready (or, with `error`, an error pending on
    /// it: as a selector does, both sides are woken to collect it).
    fn on_ready(&self, py: Python<'_>, readable: bool, writable: bool, error: bool) {
        if error {
            // libuv stopped watching; ask again once the error is collected.
            unsafe { self.st().events = 0 };
        }
        if readable {
            let reading = unsafe {
                let st = self.st();
                st.started && !st.paused && !st.closing
            };
            if reading {
                if let Err(err) = self.read_ready(py) {
                    self.callback_failed(py, err, false);
                }
            }
        }
        if writable && unsafe { self.st().writer_watched } {
            if let Err(err) = self.sendto_ready(py) {
                self.callback_failed(py, err, true);
            }
        }
        if error {
            if let Err(err) = self.update_poll() {
                self.callback_failed(py, err, false);
            }
        }
    }

    /// asyncio's `_force_close(exc)`.
    fn force_close(&self, py: Python<'_>, exc: Option<Py<PyAny>>) -> PyResult<()> {
        let st = unsafe { self.st() };
        if st.conn_lost > 0 {
            return Ok(());
        }
        let dropped: VecDeque<Pending> = std::mem::take(&mut st.queue);
        st.buffer_size = 0;
        st.writer_watched = false;
        st.closing = true;
        st.conn_lost += 1;
        self.update_poll()?;
        drop(dropped);
        self.schedule_connection_lost(py, exc)
    }

    /// Closes the poll handle (libuv stops watching the fd at once); the
    /// Python socket closes the fd afterwards.
    pub(crate) fn close_handle(&self) {
        let st = unsafe { self.st() };
        st.fd = -1;
        st.events = 0;
        if let Some(h) = st.handle.take() {
            let me = self as *const DatagramCore;
            unsafe { (*st.loop_state).datagrams.remove(&me) };
            h.close_with(on_closed);
        }
    }
}

unsafe extern "C" fn on_poll(handle: *mut sys::uv_poll_t, status: i32, events: i32) {
    // SAFETY: data is the live core: the box keeps it alive until the close
    // callback, which runs after every poll callback of the handle.
    unsafe {
        let core = &*((*handle).data as *const DatagramCore);
        let ls = core.loop_state();
        ls.gil.reacquire();
        ls.io_seen = true;
        let py = Python::assume_attached();
        let error = status < 0;
        let readable = error || events & sys::uv_poll_event_UV_READABLE as i32 != 0;
        let writable = error || events & sys::uv_poll_event_UV_WRITABLE as i32 != 0;
        let started = ls.debug_clock();
        core.on_ready(py, readable, writable, error);
        if let Some(started) = started {
            // (References cloned: no state borrow across Python code.)
            let (loop_obj, transport) = {
                let st = core.st();
                (st.loop_obj.clone_ref(py), st.wrapper.clone_ref(py))
            };
            crate::eventloop::warn_if_slow_io(py, &loop_obj, &transport, started);
        }
    }
}

unsafe extern "C" fn on_closed(handle: *mut sys::uv_handle_t) {
    // SAFETY: the box came from UvHandle<PollBox>; this is its one close
    // callback. Dropping keep_alive needs the GIL.
    unsafe {
        let b = Box::from_raw(handle as *mut PollBox);
        (*b.loop_state).gil.reacquire();
        drop(b);
    }
}

#[pymethods]
impl DatagramCore {
    /// A core watching the UDP socket `sock` (AF_INET or AF_INET6) for the
    /// Python transport `wrapper`. `address` is asyncio's `_address` (the
    /// remote_addr), `connected` whether the socket has a peer name.
    #[staticmethod]
    fn open(
        py: Python<'_>,
        loop_obj: &Bound<'_, PyAny>,
        sock: &Bound<'_, PyAny>,
        wrapper: Py<PyAny>,
        address: &Bound<'_, PyAny>,
        connected: bool,
    ) -> PyResult<Py<DatagramCore>> {
        let loop_state = loop_obj.cast::<LoopCore>()?.get().state_ptr();
        let uv_loop =
            unsafe { (*loop_state).uv_loop() }.ok_or_else(|| PyRuntimeError::new_err("Event loop is closed"))?;
        let fd: i32 = sock.call_method0("fileno")?.extract()?;
        let family: i32 = sock.getattr("family")?.extract()?;
        if family != libc::AF_INET && family != libc::AF_INET6 && family != libc::AF_UNIX {
            return Err(PyValueError::new_err("an AF_INET, AF_INET6 or AF_UNIX socket is required"));
        }
        let address = if address.is_truthy()? {
            let allowed = PyTuple::new(py, [py.None().into_bound(py), address.clone()])?;
            Some((address.clone().unbind(), allowed.unbind()))
        } else {
            None
        };
        let core = Py::new(
            py,
            DatagramCore {
                state: UnsafeCell::new(DgramState {
                    handle: None,
                    loop_state,
                    loop_obj: loop_obj.clone().unbind(),
                    wrapper,
                    sock: Some(sock.clone().unbind()),
                    fd,
                    family,
                    protocol: None,
                    address,
                    connected,
                    started: false,
                    paused: false,
                    closing: false,
                    conn_lost: 0,
                    events: 0,
                    writer_watched: false,
                    queue: VecDeque::new(),
                    buffer_size: 0,
                    last_dest: None,
                    last_source: None,
                    blocked_sends: 0,
                }),
            },
        )?;
        let me = core.get() as *const DatagramCore;
        let h = UvHandle::new(PollBox {
            // SAFETY: initialised by uv_poll_init below.
            poll: unsafe { MaybeUninit::zeroed().assume_init() },
            loop_state,
            keep_alive: None,
        });
        // SAFETY: fresh allocation on an open loop; an init failure frees
        // it directly (libuv never saw it).
        unsafe {
            let raw = h.raw();
            let rc = sys::uv_poll_init(uv_loop, &mut (*raw).poll, fd);
            if rc < 0 {
                h.free_uninit();
                return Err(uv_error(rc));
            }
            h.set_data(me as *mut DatagramCore);
            (*raw).keep_alive = Some(core.clone_ref(py));
            (*core.get().state.get()).handle = Some(h);
            (*loop_state).datagrams.insert(me);
        }
        Ok(core)
    }

    /// Starts delivering datagrams (after connection_made has run).
    fn start_reading(&self) -> PyResult<()> {
        unsafe { self.st().started = true };
        self.update_poll()
    }

    fn pause_reading(&self) -> PyResult<()> {
        let st = unsafe { self.st() };
        if st.paused || st.closing {
            return Ok(());
        }
        st.paused = true;
        self.update_poll()
    }

    fn resume_reading(&self) -> PyResult<()> {
        let st = unsafe { self.st() };
        if st.closing || !st.paused {
            return Ok(());
        }
        st.paused = false;
        self.update_poll()
    }

    fn is_reading(&self) -> bool {
        let st = unsafe { self.st() };
        !st.paused && !st.closing
    }

    fn is_closing(&self) -> bool {
        unsafe { self.st().closing }
    }

    fn get_write_buffer_size(&self) -> isize {
        unsafe { self.st().buffer_size }
    }

    /// asyncio's `DatagramTransport.sendto`.
    #[pyo3(signature = (data, addr=None))]
    fn sendto(&self, py: Python<'_>, data: &Bound<'_, PyAny>, addr: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let p = data.as_ptr();
        // SAFETY: type checks only.
        let is_bytes = unsafe { pyo3::ffi::PyBytes_Check(p) } != 0;
        if !is_bytes && unsafe { pyo3::ffi::PyByteArray_Check(p) == 0 && pyo3::ffi::PyMemoryView_Check(p) == 0 } {
            let name = data.get_type().name()?;
            return Err(PyTypeError::new_err(format!(
                "data argument must be a bytes-like object, not {}",
                name.repr()?
            )));
        }
        if !SENDS_EMPTY {
            let empty = if is_bytes { (unsafe { pyo3::ffi::PyBytes_Size(p) }) == 0 } else { !data.is_truthy()? };
            if empty {
                return Ok(());
            }
        }
        let none = py.None().into_bound(py);
        let mut addr = addr.cloned().unwrap_or(none);
        // Held by reference count, not borrowed from the state: comparing
        // runs Python code (__eq__).
        let address =
            unsafe { self.st().address.as_ref().map(|(a, allowed)| (a.clone_ref(py), allowed.clone_ref(py))) };
        if let Some((address, allowed)) = address {
            let address = address.into_bound(py);
            if !(addr.is_none() || addr.is(&address) || allowed.bind(py).contains(&addr)?) {
                return Err(PyValueError::new_err(format!("Invalid address: must be None or {}", address.str()?)));
            }
            addr = address;
        }
        let st = unsafe { self.st() };
        if st.conn_lost > 0 && st.address.is_some() {
            if st.conn_lost >= LOG_THRESHOLD_FOR_CONNLOST_WRITES {
                let logger = py.import("asyncio.log")?.getattr("logger")?;
                logger.call_method1("warning", ("socket.send() raised exception.",))?;
            }
            unsafe { self.st().conn_lost += 1 };
            return Ok(());
        }
        if st.queue.is_empty() {
            // Attempt to send it right away first.
            match self.try_send(py, data, &addr)? {
                Sent::Done => return Ok(()),
                Sent::Blocked => self.watch_writable()?,
                Sent::Failed(exc) => return self.error_received(py, exc),
                Sent::Fatal(exc) => return self.fatal_error(py, exc, "Fatal write error on datagram transport"),
            }
        }
        // Ensure that what is buffered is immutable: bytes(data).
        // SAFETY: PyObject_Bytes returns a new reference or NULL.
        let copy = unsafe { Bound::from_owned_ptr_or_err(py, pyo3::ffi::PyObject_Bytes(p))? }.cast_into::<PyBytes>()?;
        let size = data.len()? as isize + HEADER_SIZE;
        let st = unsafe { self.st() };
        st.queue.push_back(Pending { data: copy.unbind(), addr: addr.unbind() });
        st.buffer_size += size;
        self.wrapper(py).call_method0(py, pyo3::intern!(py, "_maybe_pause_protocol"))?;
        Ok(())
    }

    /// asyncio's `close()`: stop reading; connection_lost once the buffer
    /// is sent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let st = unsafe { self.st() };
        if st.closing {
            return Ok(());
        }
        st.closing = true;
        self.update_poll()?;
        let st = unsafe { self.st() };
        if st.queue.is_empty() {
            st.conn_lost += 1;
            st.writer_watched = false;
            self.update_poll()?;
            self.schedule_connection_lost(py, None)?;
        }
        Ok(())
    }

    /// asyncio's `_force_close(exc)`: drop the buffer and close.
    #[pyo3(signature = (exc=None))]
    fn _force_close(&self, py: Python<'_>, exc: Option<Py<PyAny>>) -> PyResult<()> {
        self.force_close(py, exc)
    }

    /// The read and write readiness callbacks, for code that calls them
    /// by hand (the loop calls them natively).
    fn _read_ready(&self, py: Python<'_>) -> PyResult<()> {
        self.read_ready(py)
    }

    fn _sendto_ready(&self, py: Python<'_>) -> PyResult<()> {
        if unsafe { self.st().queue.is_empty() } {
            return Ok(());
        }
        self.sendto_ready(py)
    }

    /// Stops watching the fd and frees the libuv handle; call before the
    /// socket is closed.
    fn _close_handle(&self) {
        self.close_handle();
        let st = unsafe { self.st() };
        let old = (st.sock.take(), st.last_dest.take(), st.last_source.take());
        drop(old);
    }

    /// For tests: the next `count` native send attempts find the socket
    /// full (EAGAIN), as a real one does under load.
    fn _block_sends(&self, count: u32) {
        unsafe { self.st().blocked_sends = count };
    }

    fn set_protocol(&self, protocol: Py<PyAny>) {
        let old = unsafe { self.st().protocol.replace(protocol) };
        drop(old);
    }

    /// Drops the protocol; once connection_lost has run (`finished`), the
    /// transport too, which breaks the transport <-> core cycle.
    fn _forget_protocol(&self, py: Python<'_>, finished: bool) {
        let st = unsafe { self.st() };
        let old = st.protocol.take();
        let wrapper = finished.then(|| std::mem::replace(&mut st.wrapper, py.None()));
        drop(old);
        drop(wrapper);
    }

    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        let st = unsafe { &*self.state.get() };
        visit.call(&st.loop_obj)?;
        visit.call(&st.wrapper)?;
        visit.call(&st.sock)?;
        visit.call(&st.protocol)?;
        if let Some((a, allowed)) = &st.address {
            visit.call(a)?;
            visit.call(allowed)?;
        }
        for p in &st.queue {
            visit.call(&p.data)?;
            visit.call(&p.addr)?;
        }
        if let Some((obj, _)) = &st.last_dest {
            visit.call(obj)?;
        }
        if let Some((_, t)) = &st.last_source {
            visit.call(t)?;
        }
        Ok(())
    }
}
