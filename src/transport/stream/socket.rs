//! The once-per-connection steps of a socket transport, done natively: what
//! `SocketTransport` (python/zuvrs/transports/_stream.py) would otherwise
//! run as several Python frames on every short connection.
//!
//! - letting go of the fd (`let_go_of_fd`): the extra info made after the
//!   close keeps the names (fetched now, while the fd is open, for a
//!   connection whose extra info nobody asked for yet), the handle is
//!   closed (and with it the fd), the server forgets the connection;
//! - the end (`end`), for a plain `SocketTransport` (`end_natively`): the
//!   protocol's `connection_lost`, then the fd let go, the protocol and
//!   transport dropped and the transport taken out of the loop's registry,
//!   which is `_call_connection_lost` and `_release_fd` of the Python class.
//!
//! A subclass of `SocketTransport`, and the TLS transport that takes over a
//! socket, keep their Python methods: the end is scheduled as their
//! `_call_connection_lost`.

use std::os::fd::AsRawFd;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt, PyTuple};

use super::StreamCore;
use crate::eventloop::LoopCore;
use crate::net::tcp::tcp_names;
use crate::os;
use crate::python;
use crate::transport::base::Transport;

impl StreamCore {
    /// `SocketTransport._open_tcp` past making the Python object: a core on
    /// the connected TCP socket `fd` (which it owns from now on, closed
    /// here if no core can be made) for `transport`, then what
    /// `SocketTransport._connect` and `_start` do: the protocol set (a plain
    /// SocketTransport, `plain`, ending natively), the server told, the
    /// transport in the loop's registry, and scheduled as asyncio's
    /// transport schedules them: `connection_made` (in the transport's
    /// context), the start of reading, the waiter's result.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn open_tcp_connected(
        py: Python<'_>,
        loop_obj: &Bound<'_, LoopCore>,
        fd_obj: &Bound<'_, PyInt>,
        transport: &Bound<'_, PyAny>,
        protocol: &Bound<'_, PyAny>,
        waiter: Option<&Bound<'_, PyAny>>,
        server: Option<&Bound<'_, PyAny>>,
        plain: bool,
    ) -> PyResult<Py<StreamCore>> {
        let fd: i32 = fd_obj.extract()?;
        let core = match StreamCore::open(py, loop_obj, fd, transport.clone().unbind(), false, false) {
            Ok(core) => core,
            Err(err) => {
                os::net::close_owned(fd);
                return Err(err);
            }
        };
        let me = core.get();
        let buffered = protocol.is_instance(python::buffered_protocol_class(py)?)?;
        me.set_protocol(py, protocol.clone().unbind(), buffered);
        if plain {
            me.end_natively(py);
        }
        if let Some(server) = server {
            python::attach_to_server(server, transport)?;
        }
        let registry = loop_obj.getattr(intern!(py, "_native_transports"))?;
        // (Keyed by the transport's own `_fd` object, as asyncio's `_start`
        // does: no int of its own per connection.)
        registry.cast::<PyDict>()?.set_item(fd_obj, transport)?;
        let call_soon = python::event_loop::call_soon(py);
        let context = me.with_base(py, |b| b.context.clone_ref(py));
        let made = protocol.getattr(intern!(py, "connection_made"))?;
        python::call_method_in_context(loop_obj, call_soon, &[&made, transport], context.bind(py))?;
        let start = core.bind(py).getattr(intern!(py, "start_reading"))?;
        python::call_method(loop_obj, call_soon, (start,))?;
        if let Some(waiter) = waiter {
            python::call_method(loop_obj, call_soon, (python::set_result_unless_cancelled(py)?, waiter, py.None()))?;
        }
        Ok(core)
    }

    /// The fd the handle owns, while it is open.
    fn raw_fd(&self, py: Python<'_>) -> Option<i32> {
        self.state.with(py, |st| st.handle.as_ref().and_then(|h| h.fd()).map(|fd| fd.as_raw_fd()))
    }

    /// `SocketTransport._let_go_of_fd`: the socket object (if one was made)
    /// lets go of the fd, or the names of a connection whose extra info is
    /// not made yet are fetched for it; then the handle closes the fd and
    /// the server, if any, forgets the transport.
    pub(super) fn let_go_of_fd(&self, py: Python<'_>, transport: &Bound<'_, PyAny>) -> PyResult<()> {
        let pending_name = intern!(py, "_pending_extra");
        let pending = transport.getattr(pending_name)?;
        if pending.is_none() {
            // The extra info is made: its socket object must not close the
            // fd libuv closes.
            let extra = transport.getattr(intern!(py, "_extra_dict"))?;
            let tsock = extra.get_item(intern!(py, "socket"))?;
            python::call_method0(&tsock, intern!(py, "_let_go"))?;
        } else {
            let pending = pending.cast::<PyTuple>()?;
            if pending.len() == 4 {
                // (fd, family, proto, peername): still open, nobody asked.
                // The names are fetched while the fd is, for the extra info
                // made after the close (its socket object a closed one).
                let fd: i32 = pending.get_item(0)?.extract()?;
                let peername = pending.get_item(3)?;
                let peername = (!peername.is_none()).then(|| peername.unbind());
                let (sockname, peername) = tcp_names(py, fd, peername)?;
                let closed = (-1, pending.get_item(1)?, pending.get_item(2)?, sockname, peername);
                transport.setattr(pending_name, closed)?;
            }
        }
        self.close_handle(py);
        let server_name = intern!(py, "_server");
        let server = transport.getattr(server_name)?;
        if !server.is_none() {
            transport.setattr(server_name, py.None())?;
            python::detach_from_server(&server, transport)?;
        }
        Ok(())
    }

    /// `NativeTransport._release_fd(True)` for a socket transport: the fd
    /// let go, the protocol and transport dropped (nothing calls back any
    /// more), and the transport out of the loop's registry.
    fn release_finished(&self, py: Python<'_>, transport: &Bound<'_, PyAny>) -> PyResult<()> {
        let released = intern!(py, "_released");
        if transport.getattr(released)?.is_truthy()? {
            return Ok(());
        }
        transport.setattr(released, true)?;
        let fd = self.raw_fd(py);
        let let_go = self.let_go_of_fd(py, transport);
        self.forget_protocol(py, true);
        let_go?;
        let Some(fd) = fd else { return Ok(()) };
        let loop_obj = self.with_base(py, |b| b.loop_obj.clone_ref(py));
        let registry = loop_obj.bind(py).getattr(intern!(py, "_native_transports"))?;
        let registry = registry.cast::<PyDict>()?;
        if let Some(t) = registry.get_item(fd)? {
            if t.is(transport) {
                registry.del_item(fd)?;
            }
        }
        Ok(())
    }

    /// The end of this connection is this core's `_end` rather than the
    /// Python transport's `_call_connection_lost` (a plain SocketTransport,
    /// whose protocol is connected).
    pub(super) fn end_natively(&self, py: Python<'_>) {
        self.state.with(py, |st| st.native_end = true);
    }

    /// `SocketTransport._call_connection_lost(exc)`: the protocol's
    /// `connection_lost(exc)`, then (whatever it raised) the fd let go and
    /// the transport released.
    pub(super) fn end(&self, py: Python<'_>, exc: &Bound<'_, PyAny>) -> PyResult<()> {
        let transport = self.wrapper(py);
        let transport = transport.bind(py);
        if transport.is_none() {
            return Ok(());
        }
        let lost = match self.protocol(py) {
            Some(protocol) => python::call_method(protocol.bind(py), intern!(py, "connection_lost"), (exc,)).map(drop),
            None => Ok(()),
        };
        let released = self.release_finished(py, transport);
        // As a `finally:` would: an error of the release replaces the
        // protocol's.
        released.and(lost)
    }
}
