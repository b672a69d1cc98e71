//! zuvrs: a libuv-backed asyncio event loop.

mod context;
mod dns;
mod errors;
mod eventloop;
mod handles;
mod tls;
mod transport;
mod uv;

use pyo3::prelude::*;

#[pymodule(gil_used = true)]
fn _zuvrs(m: &Bound<'_, PyModule>) -> PyResult<()> {
    context::check_layout();
    m.add_class::<eventloop::LoopCore>()?;
    m.add_class::<handles::Handle>()?;
    m.add_class::<handles::TimerHandle>()?;
    m.add_class::<transport::stream::StreamCore>()?;
    m.add_class::<transport::udp::DatagramCore>()?;
    m.add_class::<transport::methods::CoreMethod>()?;
    m.add_class::<transport::tcp::Acceptor>()?;
    m.add_class::<transport::tcp::Connecting>()?;
    m.add_class::<tls::TlsEngine>()?;
    eventloop::install_fast_methods(m.py())?;
    m.add_function(wrap_pyfunction!(libuv_version, m)?)?;
    m.add_function(wrap_pyfunction!(dns::numeric_addrinfo, m)?)?;
    m.add_function(wrap_pyfunction!(transport::datagram::read_fd, m)?)?;
    m.add_function(wrap_pyfunction!(transport::tcp::tcp_connect, m)?)?;
    m.add_function(wrap_pyfunction!(transport::tcp::tcp_names, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("BUILD_PROFILE", if cfg!(debug_assertions) { "debug" } else { "release" })?;
    // How callbacks' default contexts are taken (see context.rs), for tests
    // and benchmark provenance.
    m.add("CONTEXT_SHARING", context::sharing_mode())?;
    Ok(())
}

/// The version of the libuv zuvrs runs on, as (major, minor, patch).
#[pyfunction]
fn libuv_version() -> (u32, u32, u32) {
    uv::version()
}
