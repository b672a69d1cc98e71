//! The socket file of a Unix server: what asyncio checks with `os.stat`
//! and removes with `os.unlink` in `create_unix_server` and when the server
//! stops. The same system calls, made here: blocking-call detectors (such
//! as blockbuster, which aiohttp's tests use) patch `os.stat` and allow it
//! only from asyncio's own functions, as a native loop's calls are out of
//! their sight.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

use crate::capi;
use crate::errors::os_error;

/// A path as `os.fsencode` gives it: str, bytes or a path-like object.
/// One with a NUL inside is refused with the ValueError of the `os`
/// function `func` (it would be another path to the kernel).
fn fs_path(path: &Bound<'_, PyAny>, func: &str) -> PyResult<PathBuf> {
    let fspath = capi::net::fspath(path)?;
    let (encoded, was_str) = match fspath.cast::<PyString>() {
        Ok(s) => (capi::net::fs_encode(s)?.into_any(), true),
        Err(_) => (fspath, false),
    };
    let bytes = encoded.cast::<PyBytes>()?.as_bytes();
    if bytes.contains(&0) {
        // The os module's messages: up to 3.12 its str converter's own for
        // a str, the path converter's for bytes (and from 3.13 for both).
        let message = if was_str && !cfg!(Py_3_13) {
            "embedded null byte".to_owned()
        } else {
            format!("{func}: embedded null character in path")
        };
        return Err(PyValueError::new_err(message));
    }
    Ok(PathBuf::from(OsStr::from_bytes(bytes)))
}

fn io_error(err: std::io::Error) -> PyErr {
    os_error(err.raw_os_error().unwrap_or(libc::EIO))
}

/// `stat(path)`'s inode and whether the file is a socket; OSError (with the
/// errno: FileNotFoundError, PermissionError, ...) if it cannot be had.
#[pyfunction]
pub(crate) fn path_inode(py: Python<'_>, path: &Bound<'_, PyAny>) -> PyResult<(u64, bool)> {
    let path = fs_path(path, "stat")?;
    let meta = py.detach(|| std::fs::metadata(&path)).map_err(io_error)?;
    Ok((meta.ino(), meta.file_type().is_socket()))
}

/// `unlink(path)`; OSError with the errno on failure.
#[pyfunction]
pub(crate) fn unlink_path(py: Python<'_>, path: &Bound<'_, PyAny>) -> PyResult<()> {
    let path = fs_path(path, "unlink")?;
    py.detach(|| std::fs::remove_file(&path)).map_err(io_error)
}
