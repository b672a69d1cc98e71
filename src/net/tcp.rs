//! Setting TCP connections up natively: connecting to an address literal
//! (the fast path of `create_connection`), accepting on a listening socket
//! (servers), and the sockname / peername a transport reports.
//!
//! asyncio does each of these in Python around socket objects: a socket
//! object per connection, `sock.connect` plus a writer callback checking
//! `SO_ERROR`, `sock.accept` plus a task per accepted connection. Here the
//! system calls are made directly on fds and only the results reach Python:
//! an fd for `_transports.py` to open a `StreamCore` on, the peer address,
//! and the exceptions asyncio would raise, with the same errno, class and
//! message.

use std::os::fd::{AsFd, AsRawFd, IntoRawFd};

use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};

use crate::capi;
use crate::errors::os_error;
use crate::eventloop::LoopCore;
use crate::net::addr::SockAddr;
use crate::os;
use crate::python;

/// `(sockname, peername)` of a connected TCP socket, as asyncio's socket
/// transports record them when created: None where the call fails.
/// `peername`, when given (the address accept returned), is kept.
#[pyfunction]
#[pyo3(signature = (fd, peername=None))]
pub(crate) fn tcp_names(py: Python<'_>, fd: i32, peername: Option<Py<PyAny>>) -> PyResult<(Py<PyAny>, Py<PyAny>)> {
    let name = |peer: bool| -> PyResult<Py<PyAny>> {
        let mut sa = SockAddr::empty();
        let rc = if peer { os::net::peer_name(fd, &mut sa) } else { os::net::sock_name(fd, &mut sa) };
        if rc.is_err() || !matches!(sa.family(), libc::AF_INET | libc::AF_INET6) {
            return Ok(py.None());
        }
        sa.python_form(py)
    };
    let sockname = name(false)?;
    let peername = match peername {
        Some(p) => p,
        None => name(true)?,
    };
    Ok((sockname, peername))
}

/// What `tcp_connect` returns: the fd, its family, and the future of a
/// connection still in progress.
type Started = (i32, i32, Option<Py<PyAny>>);

/// Starts connecting a new non-blocking TCP socket to `(host, port)` when
/// `host` is an address literal (else returns None: asyncio would resolve
/// it). Returns `(fd, family, None)` when connected at once, else
/// `(fd, family, future)`: the future completes (None, or the OSError
/// asyncio raises: "Connect call failed ...") when the connection is made
/// or fails. The caller owns the fd; on a failure to create or connect the
/// socket the fd is closed and the socket module's OSError raised.
#[pyfunction]
pub(crate) fn tcp_connect(
    py: Python<'_>,
    loop_obj: &Bound<'_, LoopCore>,
    host: &Bound<'_, PyString>,
    port: u16,
) -> PyResult<Option<Started>> {
    // As `asyncio.base_events._ipaddr_info` takes a host for a stream socket
    // of any family: IPv4, then IPv6, never with a `%` zone.
    let Ok(text) = host.to_str() else { return Ok(None) };
    let Some(sa) = SockAddr::ip(text, 0, port, 0, 0) else { return Ok(None) };
    let family = sa.family();
    // Closed when dropped, on every failure below.
    let sock = os::net::tcp_socket(family).map_err(os_error)?;
    let fd = sock.as_raw_fd();
    match os::net::connect(sock.as_fd(), &sa) {
        Ok(()) => return Ok(Some((sock.into_raw_fd(), family, None))),
        // The socket module runs signal handlers first; the connection
        // goes on asynchronously (asyncio then waits for it).
        Err(libc::EINTR) => py.check_signals()?,
        Err(libc::EINPROGRESS) => {}
        Err(errno) => return Err(os_error(errno)),
    }
    let setup = || -> PyResult<Py<PyAny>> {
        let fut = loop_obj.call_method0(pyo3::intern!(py, "create_future"))?;
        let waiter = Py::new(
            py,
            Connecting {
                loop_obj: loop_obj.clone().unbind(),
                fut: fut.clone().unbind(),
                fd,
                family,
                host: host.clone().unbind(),
                port,
            },
        )?;
        loop_obj.call_method1(pyo3::intern!(py, "_set_fd_handler"), (fd, true, waiter, PyTuple::empty(py)))?;
        Ok(fut.unbind())
    };
    let fut = setup()?;
    Ok(Some((sock.into_raw_fd(), family, Some(fut))))
}

/// The writer callback of a connecting socket: once writable, completes the
/// future with the connection's outcome (asyncio's `_sock_connect_cb`) and
/// stops watching the fd.
#[pyclass(module = "zuvrs._zuvrs", frozen)]
pub(crate) struct Connecting {
    loop_obj: Py<LoopCore>,
    fut: Py<PyAny>,
    fd: i32,
    family: i32,
    host: Py<PyString>,
    port: u16,
}

#[pymethods]
impl Connecting {
    fn __call__(&self, py: Python<'_>) -> PyResult<()> {
        let fut = self.fut.bind(py);
        if python::future_call0(fut, python::FutureMethod::Done)?.is_truthy()? {
            return Ok(());
        }
        let outcome = match os::net::socket_error(self.fd) {
            Err(libc::EAGAIN | libc::EINTR) => return Ok(()), // asyncio tries again when next writable
            Err(errno) => Err(os_error(errno)),
            Ok(0) => Ok(()),
            Ok(err) => {
                // The address as asyncio's sock_connect has it: (host, port), or
                // (host, port, flowinfo, scope_id) for IPv6.
                let host = self.host.bind(py).clone().into_any();
                let port = self.port.into_pyobject(py)?.into_any();
                let address = if self.family == libc::AF_INET6 {
                    let zero = 0u32.into_pyobject(py)?.into_any();
                    PyTuple::new(py, [host, port, zero.clone(), zero])?
                } else {
                    PyTuple::new(py, [host, port])?
                };
                let msg = format!("Connect call failed {}", address.str()?);
                Err(PyOSError::new_err((err, msg)))
            }
        };
        self.loop_obj.get().shared().clear_fd_handler(py, self.fd, true);
        match outcome {
            Ok(()) => {
                python::future_call1(fut, python::FutureMethod::SetResult, pyo3::types::PyNone::get(py).as_any())?
            }
            Err(exc) => python::future_call1(fut, python::FutureMethod::SetException, exc.into_value(py).bind(py))?,
        };
        Ok(())
    }

    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        visit.call(&self.loop_obj)?;
        visit.call(&self.fut)?;
        visit.call(&self.host)?;
        Ok(())
    }
}

/// The reader callback of a listening TCP socket: accepts up to `backlog`
/// pending connections per readiness (as asyncio does) and hands each to
/// `on_conn(fd, peername)`, run in a copy of the current context of its
/// own, as asyncio's per-connection task would be. Running out of fds or
/// memory calls `on_error(exc)` and stops; other accept errors raise (the
/// loop reports them).
#[pyclass(module = "zuvrs._zuvrs", frozen)]
pub(crate) struct Acceptor {
    fd: i32,
    backlog: i64,
    on_conn: Py<PyAny>,
    on_error: Py<PyAny>,
}

#[pymethods]
impl Acceptor {
    #[new]
    fn new(fd: i32, backlog: i64, on_conn: Py<PyAny>, on_error: Py<PyAny>) -> Self {
        Acceptor { fd, backlog, on_conn, on_error }
    }

    fn __call__(&self, py: Python<'_>) -> PyResult<()> {
        let mut accepted = 0;
        while accepted < self.backlog {
            let mut sa = SockAddr::empty();
            let conn = match os::net::accept(self.fd, &mut sa) {
                Ok(conn) => conn,
                Err(libc::EINTR) => {
                    py.check_signals()?;
                    continue;
                }
                Err(libc::EAGAIN | libc::ECONNABORTED) => return Ok(()),
                Err(e @ (libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)) => {
                    python::call(self.on_error.bind(py), (os_error(e).into_value(py),))?;
                    return Ok(());
                }
                Err(e) => return Err(os_error(e)),
            };
            accepted += 1;
            // (The connection is closed with `conn` if this fails.)
            let peer = sa.python_form(py)?;
            // From here on_conn owns the fd (and closes it if it fails).
            let fd = conn.into_raw_fd();
            capi::net::in_context_copy(py, || python::call(self.on_conn.bind(py), (fd, peer)).map(drop))?;
        }
        Ok(())
    }

    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        visit.call(&self.on_conn)?;
        visit.call(&self.on_error)?;
        Ok(())
    }
}
