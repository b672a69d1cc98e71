//! Turning libuv error codes into the OSError subclasses Python raises.

use pyo3::exceptions::PyOSError;
use pyo3::PyErr;

use crate::uv;

/// An OSError for a libuv error code, with the errno and message the
/// corresponding system call failure would give (PyOSError picks the
/// subclass, e.g. PermissionError for EPERM).
pub(crate) fn uv_error(code: i32) -> PyErr {
    let errno = uv::errno_of(code);
    // SAFETY: strerror returns a static string for any errno.
    let msg = unsafe { std::ffi::CStr::from_ptr(libc::strerror(errno)) }.to_string_lossy().into_owned();
    let msg = if msg.is_empty() { uv::strerror(code) } else { msg };
    PyOSError::new_err((errno, msg))
}
