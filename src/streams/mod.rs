//! Native asyncio streams: the cores of `zuvrs.streams.StreamReader` and
//! `StreamWriter` (python/zuvrs/streams.py), whose classes derive from
//! these and from asyncio's own, so they are asyncio's classes with the
//! per-read and per-write work done here.
//!
//! - state.rs: `ReaderCore`'s state (a StreamReader's buffer, limit, EOF,
//!   exception and waiter) and the steps that feed and wake it
//! - reader.rs: `ReaderCore`'s Python-facing methods, `feed_data` and
//!   friends and the reads
//! - buffer.rs: `ReadBuffer`, the reader's bytes (a `Vec`, or the
//!   `bytearray` Python code was given as `_buffer`)
//! - ops.rs: the awaitables the reads return (`StreamRead`), and the
//!   already complete one a drain with nothing to wait for returns
//! - writer.rs: `WriterCore`, write and writelines straight to the
//!   transport's core, drain without a coroutine frame
//! - protocol.rs: `ProtocolCore`, a StreamReaderProtocol's state and its
//!   once-per-connection steps (connection_made, connection_lost, a
//!   server's writer and handler task)
//! - patched.rs: `PatchWatch`, which has the native methods call asyncio's
//!   own where those are patched on asyncio's classes
//!
//! A zuvrs transport feeds a reader without Python: `attach_reader` makes
//! the reader the sink of its protocol's reads (transport/stream/sink.rs).
//! This layer sits above the transports.

mod buffer;
mod ops;
mod patched;
mod protocol;
mod reader;
mod state;
mod writer;

use pyo3::prelude::*;

pub(crate) use ops::{Completed, ReadOp};
pub(crate) use state::ReaderCore;
pub(crate) use writer::WriterCore;

use crate::transport::stream::StreamCore;

/// From now on the reads the transport of `core` has for `protocol` are
/// appended to `reader` natively, as `protocol.data_received` would feed
/// them (python/zuvrs/streams.py attaches only where that is all it does).
#[pyfunction]
pub(crate) fn attach_reader(py: Python<'_>, core: &Bound<'_, StreamCore>, protocol: Py<PyAny>, reader: Py<ReaderCore>) {
    core.get().attach_sink(py, protocol, state::sink(reader));
}

/// An attribute set to None is held as absent (a deleted one too).
fn none_as_absent(py: Python<'_>, value: Option<Py<PyAny>>) -> Option<Py<PyAny>> {
    value.filter(|v| !v.is_none(py))
}

/// The stream classes and functions of the `_zuvrs` module.
pub(crate) fn register(m: &Bound<'_, pyo3::types::PyModule>) -> PyResult<()> {
    m.add_class::<ReaderCore>()?;
    m.add_class::<WriterCore>()?;
    m.add_class::<ReadOp>()?;
    m.add_class::<Completed>()?;
    m.add_function(wrap_pyfunction!(attach_reader, m)?)?;
    m.add_function(wrap_pyfunction!(patched::watch_asyncio_patches, m)?)?;
    m.add_function(wrap_pyfunction!(patched::asyncio_patch_looks, m)?)?;
    protocol::register(m)?;
    ops::install_slots(m.py());
    reader::install_entries(m.py())?;
    writer::install_entries(m.py())
}
