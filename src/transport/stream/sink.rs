//! `ReadSink`: native code that takes the reads of a stream meant for one
//! protocol, in place of that protocol's `data_received`.
//!
//! The native asyncio streams (src/streams) attach their reader here, so the
//! reads of a `zuvrs.streams.StreamReaderProtocol` go from the loop's read
//! buffer (or the TLS session's plaintext) straight into the reader's
//! buffer: no `bytes` object and no Python frame per read. A sink serves
//! only the protocol it was attached for: once the transport has another
//! protocol (`set_protocol`, sslproto taking over), reads go to that one.

use std::rc::Rc;

use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use super::StreamCore;
use crate::transport::readbuf;

/// What a protocol's reads go to instead of `data_received`.
pub(crate) trait ReadSink {
    /// Whether the sink still stands in for its protocol's `data_received`
    /// (false: that is to be called, as for any protocol). Asked before
    /// each read; may run Python code.
    fn serves(&self, py: Python<'_>) -> bool;

    /// Takes `data`. Must run no Python code: the read buffer is borrowed
    /// meanwhile (errors are made, not raised by Python code).
    fn take(&self, py: Python<'_>, data: &[u8]) -> PyResult<()>;

    /// After one read's bytes were taken: wakes whoever waits for them and
    /// applies flow control (may run Python code).
    fn taken(&self, py: Python<'_>) -> PyResult<()>;

    /// Reports the Python objects the sink holds to the cyclic GC.
    fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError>;
}

/// A sink and the protocol whose reads it takes.
pub(super) struct Sink {
    protocol: Py<PyAny>,
    sink: Rc<dyn ReadSink>,
}

impl Sink {
    pub(super) fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.protocol)?;
        self.sink.visit(visit)
    }
}

impl StreamCore {
    /// From now on the reads meant for `protocol` go to `sink`, for as long
    /// as `protocol` is the transport's (the application protocol, for TLS).
    pub(crate) fn attach_sink(&self, py: Python<'_>, protocol: Py<PyAny>, sink: Rc<dyn ReadSink>) {
        let old = self.state.with(py, |st| st.sink.replace(Sink { protocol, sink }));
        drop(old);
    }

    /// The sink that takes the current protocol's reads, if any.
    pub(super) fn sink(&self, py: Python<'_>) -> Option<Rc<dyn ReadSink>> {
        let sink = self.state.with(py, |st| match (&st.sink, &st.base.protocol) {
            (Some(s), Some(p)) if s.protocol.is(p) => Some(s.sink.clone()),
            _ => None,
        })?;
        sink.serves(py).then_some(sink)
    }

    /// Hands the `n` bytes the last read put in the read buffer to `sink`.
    pub(super) fn deliver_to_sink(&self, py: Python<'_>, sink: &dyn ReadSink, n: usize) -> PyResult<()> {
        readbuf::filled(n, |data| sink.take(py, data)).unwrap_or(Ok(()))?;
        sink.taken(py)
    }
}
