//! Errors: errno values and the Python exceptions made from them.
//!
//! Every OSError zuvrs raises for a failed system call or libuv request is
//! built here, with the errno and message the same failure gives in the
//! `os` and `socket` modules (OSError's constructor picks the subclass:
//! ConnectionRefusedError, PermissionError, ...).

use pyo3::exceptions::{PyKeyboardInterrupt, PyOSError, PyRuntimeError, PySystemExit};
use pyo3::prelude::*;

use crate::os;
use crate::uv;

/// The calling thread's errno, right after a failed system call.
#[inline]
pub(crate) fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// `OSError(errno, strerror(errno))`, as the socket module raises it.
pub(crate) fn os_error(errno: i32) -> PyErr {
    let msg = os::net::strerror(errno);
    let msg = if msg.is_empty() { uv::strerror(-errno) } else { msg };
    PyOSError::new_err((errno, msg))
}

/// The OSError for a libuv error code (a negative errno on Unix).
#[inline]
pub(crate) fn uv_error(code: i32) -> PyErr {
    os_error(uv::errno_of(code))
}

/// asyncio's `RuntimeError('Event loop is closed')`.
pub(crate) fn closed_error() -> PyErr {
    PyRuntimeError::new_err("Event loop is closed")
}

/// KeyboardInterrupt and SystemExit: raised in a callback, they stop the
/// loop and propagate out of `run_forever` instead of being reported.
#[inline]
pub(crate) fn is_fatal_base(py: Python<'_>, err: &PyErr) -> bool {
    err.is_instance_of::<PyKeyboardInterrupt>(py) || err.is_instance_of::<PySystemExit>(py)
}
