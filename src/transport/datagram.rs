//! Datagram transports (UDP over AF_INET / AF_INET6, and AF_UNIX datagram
//! sockets): `DatagramCore`.
//!
//! libuv watches the socket's fd directly with a `uv_poll_t` (no second
//! epoll set, no Python fd handler), and the core does the I/O itself:
//!
//! - readable: one `recvfrom` into the loop's read buffer, then
//!   `protocol.datagram_received(bytes, addr)` (or `error_received` for an
//!   OSError) straight from libuv's callback. One datagram per readiness
//!   event, as asyncio's selector transport reads (libuv's own `uv_udp_t`
//!   reads until EAGAIN, which costs a failing `recvmsg` per wake-up).
//! - `sendto()` is a native method: `send(2)` on a connected socket,
//!   `sendto(2)` with an address net::addr parses, and Python's
//!   `socket.sendto` for any other address (names, scope ids, bad input), so
//!   resolution and every error are the socket module's own. What the kernel
//!   refuses with EAGAIN is buffered and sent when the fd is writable.
//! - A sender's address is built as `socket.recvfrom` builds it; a repeated
//!   sender gets the same object.
//!
//! The semantics are those of asyncio's `_SelectorDatagramTransport`, line by
//! line; the Python `DatagramTransport` (python/zuvrs/transports) keeps the
//! once-per-transport parts (connection_lost, error reports) and binds
//! `sendto` from here.
//!
//! Ownership: the Python socket keeps the fd; libuv only watches it. The
//! poll handle (a `UvPoll`, uv.rs) keeps a strong reference to the core in
//! its box until libuv's close callback. `_close_handle` (before the socket
//! is closed) closes it, which removes the fd from libuv's epoll set at once.

use std::collections::VecDeque;

use pyo3::exceptions::{PyBlockingIOError, PyInterruptedError, PyMemoryError, PyOSError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyMemoryView, PyTuple};

use crate::capi::transport::{bytes_data, bytes_of, traverse_state};
use crate::cell::NativeCell;
use crate::errors::{is_fatal_base, os_error, uv_error};
use crate::eventloop::{ClientPtr, LoopClient, LoopCore, LoopShared};
use crate::net::addr::{self, SockAddr};
use crate::os::transport as sock;
use crate::python;
use crate::transport::base::{HasBase, Transport, TransportBase, LOG_THRESHOLD_FOR_CONNLOST_WRITES};
use crate::transport::buffer::Bytes;
use crate::transport::readbuf;
use crate::uv::sys;
use crate::uv::transport::{LoopRef, PollOwner, UvPoll};

/// 3.13 sends empty datagrams and counts 8 header bytes per buffered one.
const SENDS_EMPTY: bool = cfg!(Py_3_13);
const HEADER_SIZE: usize = if SENDS_EMPTY { 8 } else { 0 };

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

pub(crate) struct DgramState {
    base: TransportBase,
    handle: Option<UvPoll<DatagramCore>>,
    /// The Python socket: its fd is ours to use until `_close_handle`, and
    /// its `sendto` resolves the addresses not handled natively.
    sock: Option<Py<PyAny>>,
    fd: i32,
    family: i32,
    /// asyncio's `_address` when truthy, and `(None, _address)` for its
    /// `addr not in (None, self._address)` check.
    address: Option<(Py<PyAny>, Py<PyTuple>)>,
    /// `extra['peername']` was truthy: data goes out with send(2).
    connected: bool,
    /// libuv events currently asked for (UV_READABLE | UV_WRITABLE).
    events: i32,
    writer_watched: bool,
    queue: VecDeque<Pending>,
    buffer_size: usize,
    /// The last address object sent to and its parsed form (by identity).
    last_dest: Option<(Py<PyAny>, SockAddr)>,
    /// The last sender seen and its Python form, reused while it repeats.
    last_source: Option<(SockAddr, Py<PyAny>)>,
    /// For tests: this many native send attempts report EAGAIN (loopback
    /// UDP never fills, so buffering could not be exercised otherwise).
    blocked_sends: u32,
}

impl HasBase for DgramState {
    fn base(&mut self) -> &mut TransportBase {
        &mut self.base
    }
}

impl DgramState {
    /// The libuv events the state calls for: readable while reading,
    /// writable while datagrams wait.
    fn wanted_events(&self) -> i32 {
        let mut want = 0;
        if self.base.wants_reading() {
            want |= sys::uv_poll_event_UV_READABLE as i32;
        }
        if self.writer_watched {
            want |= sys::uv_poll_event_UV_WRITABLE as i32;
        }
        want
    }

    /// Asks libuv for the events the state calls for.
    fn update_poll(&mut self) -> Result<(), i32> {
        let Some(h) = self.handle.as_ref() else { return Ok(()) };
        let want = self.wanted_events();
        if want == self.events {
            return Ok(());
        }
        if want == 0 {
            h.stop()?;
        } else {
            h.start(want)?;
        }
        self.events = want;
        Ok(())
    }
}

#[pyclass(module = "zuvrs._zuvrs", name = "DatagramCore", frozen)]
pub struct DatagramCore {
    /// The loop (set at creation, never changed).
    link: LoopRef,
    state: NativeCell<DgramState>,
}

impl Transport for DatagramCore {
    type State = DgramState;

    #[inline]
    fn cell(&self) -> &NativeCell<DgramState> {
        &self.state
    }

    #[inline]
    fn shared(&self) -> &LoopShared {
        self.link.get()
    }
}

impl LoopClient for DatagramCore {
    fn before_poll(&self, _py: Python<'_>) -> PyResult<()> {
        Ok(())
    }

    fn close_with_loop(&self, py: Python<'_>) {
        self.close_handle(py);
    }
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

impl DatagramCore {
    fn update_poll(&self, py: Python<'_>) -> PyResult<()> {
        self.state.with(py, |st| st.update_poll()).map_err(uv_error)
    }

    fn set_writer_watched(&self, py: Python<'_>, watched: bool) -> PyResult<()> {
        self.state
            .with(py, |st| {
                if st.writer_watched == watched {
                    return Ok(());
                }
                st.writer_watched = watched;
                st.update_poll()
            })
            .map_err(uv_error)
    }

    /// Where a datagram for `addr` goes: the parsed address, or None when
    /// Python's socket module must handle `addr`.
    fn destination(&self, py: Python<'_>, addr: &Bound<'_, PyAny>) -> Option<SockAddr> {
        let (cached, family) = self.state.with(py, |st| {
            let cached = st.last_dest.as_ref().filter(|(obj, _)| obj.as_ptr() == addr.as_ptr()).map(|(_, sa)| *sa);
            (cached, st.family)
        });
        if cached.is_some() || addr.is_none() {
            return cached;
        }
        let sa = addr::from_python(addr, family)?;
        // Only exact tuples of exact str and int, or exact str / bytes, are
        // parsed: immutable, so the same object always means the same address.
        let old = self.state.with(py, |st| st.last_dest.replace((addr.clone().unbind(), sa)));
        drop(old);
        Some(sa)
    }

    /// One send attempt, as asyncio's `sock.send(data)` (connected) or
    /// `sock.sendto(data, addr)`.
    fn try_send(&self, py: Python<'_>, data: &Bound<'_, PyAny>, addr: &Bound<'_, PyAny>) -> PyResult<Sent> {
        let (fd, connected) = self.state.with(py, |st| (st.fd, st.connected));
        if fd < 0 {
            // The socket was closed (connection_lost has run).
            return Ok(Sent::Fatal(os_error(libc::EBADF)));
        }
        let dest = if connected { None } else { self.destination(py, addr) };
        if !connected && dest.is_none() {
            let Some(sock) = self.state.with(py, |st| st.sock.as_ref().map(|s| s.clone_ref(py))) else {
                return Ok(Sent::Fatal(os_error(libc::EBADF)));
            };
            return match python::call_method(sock.bind(py), python::socket::sendto(py), (data, addr)) {
                Ok(_) => {
                    self.count_sent(py, data.len().unwrap_or(0));
                    Ok(Sent::Done)
                }
                Err(err) => classify(py, err),
            };
        }
        if self.state.with(py, |st| st.blocked_sends.checked_sub(1).map(|n| st.blocked_sends = n)).is_some() {
            return Ok(Sent::Blocked);
        }
        let buf = match Bytes::get(data) {
            Ok(b) => b,
            Err(err) => return classify(py, err),
        };
        loop {
            let sent = match &dest {
                None => sock::send(fd, buf.as_slice()),
                Some(sa) => sock::sendto(fd, buf.as_slice(), sa),
            };
            let errno = match sent {
                Ok(n) => {
                    self.count_sent(py, n);
                    return Ok(Sent::Done);
                }
                Err(errno) => errno,
            };
            match errno {
                libc::EAGAIN => return Ok(Sent::Blocked),
                // As the socket module: run signal handlers, then retry.
                libc::EINTR => {
                    if let Err(err) = py.check_signals() {
                        return classify(py, err);
                    }
                    if self.state.with(py, |st| st.fd) < 0 {
                        return Ok(Sent::Fatal(os_error(libc::EBADF)));
                    }
                }
                e => return Ok(Sent::Failed(os_error(e))),
            }
        }
    }

    /// One datagram of `n` bytes went out.
    fn count_sent(&self, py: Python<'_>, n: usize) {
        let io = &self.shared().stats.io;
        self.state.with(py, |st| st.base.stats.wrote(io, 1, n));
    }

    /// `protocol.error_received(exc)` (also from sendto(), so the protocol's
    /// context is made current here).
    fn error_received(&self, py: Python<'_>, exc: PyErr) -> PyResult<()> {
        if let Some(protocol) = self.protocol(py) {
            let _context = self.protocol_context(py);
            python::call_method(protocol.bind(py), python::protocol::error_received(py), (exc.into_value(py),))?;
        }
        Ok(())
    }

    /// asyncio's `_read_ready`: one datagram to the protocol.
    fn read_ready(&self, py: Python<'_>) -> PyResult<()> {
        let fd = self.state.with(py, |st| if st.base.conn_lost > 0 { -1 } else { st.fd });
        if fd < 0 {
            return Ok(());
        }
        let mut src;
        let n = loop {
            // Into the loop's read buffer (asked for again: signal handlers
            // may have run Python code since the last attempt).
            src = SockAddr::empty();
            let received = readbuf::with_memory(py, |buf| sock::recvfrom(fd, buf, &mut src))
                .ok_or_else(|| PyMemoryError::new_err(()))?;
            let errno = match received {
                Ok(n) => {
                    let io = &self.shared().stats.io;
                    self.state.with(py, |st| st.base.stats.read(io, n));
                    break n;
                }
                Err(errno) => errno,
            };
            match errno {
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
                    if self.state.with(py, |st| st.fd) < 0 {
                        return Ok(());
                    }
                }
                e => return self.error_received(py, os_error(e)),
            }
        };
        let data = readbuf::copy(py, n);
        let cached = self.state.with(py, |st| match &st.last_source {
            Some((sa, obj)) if sa.bytes() == src.bytes() => Some(obj.clone_ref(py)),
            _ => None,
        });
        let addr = match cached {
            Some(a) => a,
            None => {
                let a = src.python_form(py)?;
                let old = self.state.with(py, |st| st.last_source.replace((src, a.clone_ref(py))));
                drop(old);
                a
            }
        };
        if let Some(protocol) = self.protocol(py) {
            python::call_method(protocol.bind(py), python::protocol::datagram_received(py), (data, addr))?;
        }
        Ok(())
    }

    /// asyncio's `_sendto_ready`: the buffered datagrams, in order.
    fn sendto_ready(&self, py: Python<'_>) -> PyResult<()> {
        loop {
            let Some(item) = self.state.with(py, |st| {
                let item = st.queue.pop_front()?;
                st.buffer_size = st.buffer_size.saturating_sub(item.data.bind(py).as_bytes().len() + HEADER_SIZE);
                Some(item)
            }) else {
                break;
            };
            match self.try_send(py, item.data.bind(py).as_any(), item.addr.bind(py))? {
                Sent::Done => {}
                Sent::Blocked => {
                    self.state.with(py, |st| {
                        st.buffer_size += item.data.bind(py).as_bytes().len() + HEADER_SIZE;
                        st.queue.push_front(item);
                    });
                    break;
                }
                Sent::Failed(exc) => return self.error_received(py, exc),
                Sent::Fatal(exc) => return self.fatal_error(py, exc, "Fatal write error on datagram transport"),
            }
        }
        // May append to the buffer.
        self.resume_protocol_if_needed(py, self.state.with(py, |st| st.buffer_size))?;
        if self.state.with(py, |st| st.queue.is_empty()) {
            self.set_writer_watched(py, false)?;
            if self.state.with(py, |st| st.base.closing) {
                let wrapper = self.wrapper(py);
                python::call_method(wrapper.bind(py), python::transport::_call_connection_lost(py), (py.None(),))?;
            }
        }
        Ok(())
    }

    /// An exception that escaped a readiness callback: KeyboardInterrupt
    /// and SystemExit stop the loop; the rest goes to the exception handler
    /// as asyncio reports a failing fd callback.
    fn readiness_failed(&self, py: Python<'_>, err: PyErr, writing: bool) {
        if is_fatal_base(py, &err) {
            self.shared().raise_later(py, err);
            return;
        }
        if let Err(err) = self.callback_failed(py, err, writing) {
            self.fail_in_callback(py, err);
        }
    }

    /// libuv reported the fd ready (or, with `error`, an error pending on
    /// it: as a selector does, both sides are woken to collect it).
    fn on_ready(&self, py: Python<'_>, readable: bool, writable: bool, error: bool) {
        if error {
            // libuv stopped watching; ask again once the error is collected.
            self.state.with(py, |st| st.events = 0);
        }
        // (A first datagram may wait for the callbacks already queued: the
        // poll is level-triggered, so the next poll sees it again.)
        if readable && self.state.with(py, |st| st.base.wants_reading()) && !self.first_read_waits(py) {
            if let Err(err) = self.read_ready(py) {
                self.readiness_failed(py, err, false);
            }
        }
        if writable && self.state.with(py, |st| st.writer_watched) {
            if let Err(err) = self.sendto_ready(py) {
                self.readiness_failed(py, err, true);
            }
        }
        if error {
            if let Err(err) = self.update_poll(py) {
                self.readiness_failed(py, err, false);
            }
        }
    }

    /// asyncio's `_force_close(exc)`.
    fn force_close(&self, py: Python<'_>, exc: Option<Py<PyAny>>) -> PyResult<()> {
        let dropped = self.state.with(py, |st| {
            if st.base.conn_lost > 0 {
                return Ok(None);
            }
            let dropped = std::mem::take(&mut st.queue);
            st.buffer_size = 0;
            st.writer_watched = false;
            st.base.closing = true;
            st.base.conn_lost += 1;
            st.update_poll().map(|()| Some(dropped))
        });
        let Some(dropped) = dropped.map_err(uv_error)? else { return Ok(()) };
        drop(dropped);
        self.schedule_connection_lost(py, exc)
    }

    /// Closes the poll handle (libuv stops watching the fd at once); the
    /// Python socket closes the fd afterwards.
    fn close_handle(&self, py: Python<'_>) {
        let handle = self.state.with(py, |st| {
            st.fd = -1;
            st.events = 0;
            st.handle.take()
        });
        if let Some(h) = handle {
            self.shared().unregister(py, ClientPtr(self));
            h.close();
        }
    }
}

/// The poll handle's callback (uv.rs's trampoline calls this).
impl PollOwner for DatagramCore {
    #[inline]
    fn poll_ready(&self, py: Python<'_>, status: i32, events: i32) {
        let scope = self.begin_io(py);
        let error = status < 0;
        let readable = error || events & sys::uv_poll_event_UV_READABLE as i32 != 0;
        let writable = error || events & sys::uv_poll_event_UV_WRITABLE as i32 != 0;
        self.on_ready(py, readable, writable, error);
        self.leave_io(py, scope);
    }
}

#[pymethods]
impl DatagramCore {
    /// A core watching the datagram socket `sock` (AF_INET, AF_INET6 or
    /// AF_UNIX) for the Python transport `wrapper`. `address` is asyncio's
    /// `_address` (the remote_addr), `connected` whether the socket has a
    /// peer name.
    #[staticmethod]
    fn open(
        py: Python<'_>,
        loop_obj: &Bound<'_, LoopCore>,
        sock: &Bound<'_, PyAny>,
        wrapper: Py<PyAny>,
        address: &Bound<'_, PyAny>,
        connected: bool,
    ) -> PyResult<Py<DatagramCore>> {
        let link = LoopRef::new(loop_obj);
        // A closed loop refuses before anything is asked of the socket.
        link.get().uv_loop(py)?;
        let fd: i32 = python::call_method0(sock, python::socket::fileno(py))?.extract()?;
        let family: i32 = sock.getattr(python::socket::family(py))?.extract()?;
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
                link,
                state: NativeCell::new(DgramState {
                    base: TransportBase::new(py, loop_obj.clone().into_any().unbind(), wrapper)?,
                    handle: None,
                    sock: Some(sock.clone().unbind()),
                    fd,
                    family,
                    address,
                    connected,
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
        let me = core.get();
        let h = UvPoll::open(py, &me.link, &core, fd)?;
        me.state.with(py, |st| st.handle = Some(h));
        me.shared().register(py, ClientPtr(me as *const DatagramCore));
        Ok(core)
    }

    /// Starts delivering datagrams (after connection_made has run).
    fn start_reading(&self, py: Python<'_>) -> PyResult<()> {
        self.state.with(py, |st| st.base.started = true);
        self.note_read_start(py);
        self.update_poll(py)
    }

    fn pause_reading(&self, py: Python<'_>) -> PyResult<()> {
        self.reading_paused(py, true);
        let changed = self.state.with(py, |st| {
            let change = !st.base.paused && !st.base.closing;
            st.base.paused |= change;
            change
        });
        if changed {
            self.update_poll(py)?;
        }
        Ok(())
    }

    fn resume_reading(&self, py: Python<'_>) -> PyResult<()> {
        self.reading_paused(py, false);
        let changed = self.state.with(py, |st| {
            let change = !st.base.closing && st.base.paused;
            st.base.paused &= !change;
            change
        });
        if changed {
            self.note_read_start(py);
            self.update_poll(py)?;
        }
        Ok(())
    }

    fn is_reading(&self, py: Python<'_>) -> bool {
        self.state.with(py, |st| !st.base.paused && !st.base.closing)
    }

    fn is_closing(&self, py: Python<'_>) -> bool {
        self.state.with(py, |st| st.base.closing)
    }

    fn get_write_buffer_size(&self, py: Python<'_>) -> usize {
        self.state.with(py, |st| st.buffer_size)
    }

    fn get_write_buffer_limits(&self, py: Python<'_>) -> (usize, usize) {
        self.state.with(py, |st| (st.base.low_water, st.base.high_water))
    }

    /// The write buffer's water marks, in bytes (see transports/_base.py).
    fn _set_water_marks(&self, py: Python<'_>, high: usize, low: usize) -> PyResult<()> {
        self.set_water_marks(py, high, low, self.state.with(py, |st| st.buffer_size))
    }

    /// Whether the protocol was told to pause writing.
    fn _protocol_paused(&self, py: Python<'_>) -> bool {
        self.state.with(py, |st| st.base.protocol_paused)
    }

    /// `get_extra_info('zuvrs_stats')`'s figures.
    fn _stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        self.stats_dict(py)
    }

    /// Whether pause_reading() is in force (asyncio's transports' `_paused`).
    fn _reading_paused(&self, py: Python<'_>) -> bool {
        self.state.with(py, |st| st.base.paused)
    }

    /// asyncio's `DatagramTransport.sendto`.
    #[pyo3(signature = (data, addr=None))]
    fn sendto(&self, py: Python<'_>, data: &Bound<'_, PyAny>, addr: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let bytes = data.cast::<PyBytes>().ok();
        if bytes.is_none() && !data.is_instance_of::<PyByteArray>() && !data.is_instance_of::<PyMemoryView>() {
            let name = data.get_type().name()?;
            return Err(PyTypeError::new_err(format!(
                "data argument must be a bytes-like object, not {}",
                name.repr()?
            )));
        }
        if !SENDS_EMPTY {
            let empty = match bytes {
                Some(b) => bytes_data(b.as_unbound()).is_empty(),
                None => !data.is_truthy()?,
            };
            if empty {
                return Ok(());
            }
        }
        let none = py.None().into_bound(py);
        let mut addr = addr.cloned().unwrap_or(none);
        // Held by reference count, not borrowed from the state: comparing
        // runs Python code (__eq__).
        let address =
            self.state.with(py, |st| st.address.as_ref().map(|(a, allowed)| (a.clone_ref(py), allowed.clone_ref(py))));
        if let Some((address, allowed)) = &address {
            let address = address.bind(py);
            if !(addr.is_none() || addr.is(address) || allowed.bind(py).contains(&addr)?) {
                return Err(PyValueError::new_err(format!("Invalid address: must be None or {}", address.str()?)));
            }
            addr = address.clone();
        }
        let (conn_lost, queued) = self.state.with(py, |st| (st.base.conn_lost, !st.queue.is_empty()));
        if conn_lost > 0 && address.is_some() {
            if conn_lost >= LOG_THRESHOLD_FOR_CONNLOST_WRITES {
                python::call_method(
                    python::logger(py)?,
                    pyo3::intern!(py, "warning"),
                    ("socket.send() raised exception.",),
                )?;
            }
            self.state.with(py, |st| st.base.conn_lost += 1);
            return Ok(());
        }
        if !queued {
            // Attempt to send it right away first.
            match self.try_send(py, data, &addr)? {
                Sent::Done => return Ok(()),
                Sent::Blocked => self.set_writer_watched(py, true)?,
                Sent::Failed(exc) => return self.error_received(py, exc),
                Sent::Fatal(exc) => return self.fatal_error(py, exc, "Fatal write error on datagram transport"),
            }
        }
        // Ensure that what is buffered is immutable: bytes(data).
        let copy = bytes_of(data)?.cast_into::<PyBytes>()?;
        let size = data.len()? + HEADER_SIZE;
        let buffered = self.state.with(py, |st| {
            st.queue.push_back(Pending { data: copy.unbind(), addr: addr.unbind() });
            st.buffer_size += size;
            st.base.stats.buffered(st.buffer_size);
            st.buffer_size
        });
        self.pause_protocol_if_needed(py, buffered)
    }

    /// asyncio's `close()`: stop reading; connection_lost once the buffer
    /// is sent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let lose = self.state.with(py, |st| {
            if st.base.closing {
                return Ok(false);
            }
            st.base.closing = true;
            st.update_poll()?;
            if !st.queue.is_empty() {
                return Ok(false);
            }
            st.base.conn_lost += 1;
            st.writer_watched = false;
            st.update_poll()?;
            Ok(true)
        });
        if lose.map_err(uv_error)? {
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
        if self.state.with(py, |st| st.queue.is_empty()) {
            return Ok(());
        }
        self.sendto_ready(py)
    }

    /// Stops watching the fd and frees the libuv handle; call before the
    /// socket is closed.
    fn _close_handle(&self, py: Python<'_>) {
        self.close_handle(py);
        let old = self.state.with(py, |st| (st.sock.take(), st.last_dest.take(), st.last_source.take()));
        drop(old);
    }

    /// For tests: the next `count` native send attempts find the socket
    /// full (EAGAIN), as a real one does under load.
    fn _block_sends(&self, py: Python<'_>, count: u32) {
        self.state.with(py, |st| st.blocked_sends = count)
    }

    fn get_protocol(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.protocol(py)
    }

    /// The context the protocol's callbacks run in (for those the Python
    /// transport schedules: connection_made).
    fn _protocol_context(&self, py: Python<'_>) -> Py<PyAny> {
        self.with_base(py, |b| b.context.clone_ref(py))
    }

    fn set_protocol(&self, py: Python<'_>, protocol: Py<PyAny>) {
        let old = self.state.with(py, |st| st.base.protocol.replace(protocol));
        drop(old);
    }

    /// Drops the protocol; once connection_lost has run (`finished`), the
    /// transport too, which breaks the transport <-> core cycle.
    fn _forget_protocol(&self, py: Python<'_>, finished: bool) {
        let old = self.state.with(py, |st| {
            let wrapper = finished.then(|| std::mem::replace(&mut st.base.wrapper, py.None()));
            (st.base.protocol.take(), wrapper)
        });
        drop(old);
    }

    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        self.link.visit(&visit)?;
        traverse_state(&self.state, &visit, |st| {
            st.base.visit(&visit)?;
            visit.call(&st.sock)?;
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
        })
    }
}
