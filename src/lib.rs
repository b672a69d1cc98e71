//! zuvrs: a libuv-backed asyncio event loop.
//!
//! The layers, each depending only on those above it in this list:
//! - `uv`, `os`, `capi`, `errors`, `cell`, `python`: the edges (libuv, libc,
//!   CPython's C API, errno, the native state accessor, the Python objects
//!   and methods Rust uses)
//! - `handles`: scheduled callbacks, their contexts and allocation
//! - `eventloop`: the loop, its turn, timers, fd watchers and fast methods
//! - `net`: socket addresses, name resolution, TCP set-up
//! - `tls`: the TLS engine (OpenSSL records on a stdlib SSLObject's `SSL *`)
//! - `transport`: the native halves of asyncio transports
//! - `streams`: asyncio's StreamReader and StreamWriter, natively
//!
//! and this file, the `_zuvrs` module.

mod capi;
mod cell;
mod errors;
mod eventloop;
mod handles;
mod net;
mod os;
mod python;
mod streams;
mod tls;
mod transport;
mod uv;

use pyo3::prelude::*;

#[pymodule(gil_used = true)]
fn _zuvrs(m: &Bound<'_, PyModule>) -> PyResult<()> {
    handles::context::check_layout();
    m.add_class::<eventloop::LoopCore>()?;
    m.add_class::<handles::Handle>()?;
    m.add_class::<handles::TimerHandle>()?;
    m.add_class::<transport::stream::StreamCore>()?;
    m.add_class::<transport::datagram::DatagramCore>()?;
    m.add_class::<transport::methods::CoreMethod>()?;
    m.add_class::<net::tcp::Acceptor>()?;
    m.add_class::<net::tcp::Connecting>()?;
    m.add_class::<tls::TlsEngine>()?;
    streams::register(m)?;
    eventloop::install_fast_methods(m.py())?;
    m.add_function(wrap_pyfunction!(libuv_version, m)?)?;
    m.add_function(wrap_pyfunction!(net::dns::numeric_addrinfo, m)?)?;
    m.add_function(wrap_pyfunction!(net::dns::keep_socket_getaddrinfo, m)?)?;
    m.add_function(wrap_pyfunction!(net::dns::resolve, m)?)?;
    m.add_function(wrap_pyfunction!(net::dns::name_info, m)?)?;
    m.add_function(wrap_pyfunction!(net::tcp::tcp_connect, m)?)?;
    m.add_function(wrap_pyfunction!(net::tcp::tcp_names, m)?)?;
    m.add_function(wrap_pyfunction!(net::unix_path::path_inode, m)?)?;
    m.add_function(wrap_pyfunction!(net::unix_path::unlink_path, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("BUILD_PROFILE", if cfg!(debug_assertions) { "debug" } else { "release" })?;
    // The most one read takes, for the Python transports that read themselves.
    m.add("READ_SIZE", transport::readbuf::READ_SIZE)?;
    // How callbacks' default contexts are taken (see handles/context.rs), for
    // tests and benchmark provenance.
    m.add("CONTEXT_SHARING", handles::context::sharing_mode())?;
    Ok(())
}

/// The version of the libuv zuvrs runs on, as (major, minor, patch).
#[pyfunction]
fn libuv_version() -> (u32, u32, u32) {
    uv::version()
}
