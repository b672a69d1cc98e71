//! CPython's `_ssl` objects: the mirrors of their structs, and the checks
//! made on an SSLObject before its OpenSSL pointers are read (the reads,
//! and the checks that make them sound, are ossl.rs's `Layouts` and
//! `Conn::open`).
//!
//! The C structs below mirror `Modules/_ssl.c` of CPython 3.10 to 3.14,
//! checked in the sources of v3.10.13, v3.11.7, v3.12.1, 3.13.0rc2 and
//! 3.14.7 (plus 3.10.15, 3.11.10, 3.12.6 and the 3.14 alpha tree):
//!
//! ```c
//! typedef struct { PyObject_HEAD  SSL_CTX *ctx; ... } PySSLContext;
//! typedef struct {
//!     PyObject_HEAD
//!     PyObject *Socket;          /* weakref to socket on which we're layered */
//!     SSL *ssl;
//!     PySSLContext *ctx;         /* weakref to SSL context */
//!     char shutdown_seen_zero;
//!     enum py_ssl_server_or_client socket_type;
//!     PyObject *owner;
//!     PyObject *server_hostname;
//!     _PySSLError err;           /* { int ssl; int c; } off Windows */
//!     PyObject *exc_type, *exc_value, *exc_tb;   /* 3.10, 3.11 */
//!     PyObject *exc;                             /* 3.12+ */
//! } PySSLSocket;
//! typedef struct { PyObject_HEAD  BIO *bio; int eof_written; } PySSLMemoryBIO;
//! ```
//!
//! `_ssl`'s module state (`Modules/_ssl.h`, the same versions) starts with
//! five type pointers (`_SSLContext`, `_SSLSocket`, `MemoryBIO`,
//! `SSLSession`, `Certificate`), seven exception classes (`SSLError`,
//! `SSLCertVerificationError`, `SSLZeroReturnError`, `SSLWantReadError`,
//! `SSLWantWriteError`, `SSLSyscallError`, `SSLEOFError`), then
//! `err_codes_to_names`, (3.10 / 3.11 only: `err_names_to_codes`,) and
//! `lib_codes_to_names`: the tables `_ssl` names errors from, no longer
//! module attributes since 3.12. They are read from there once the twelve
//! pointers before them are found equal to those objects and the state's
//! size (`m_size`) equal to the whole struct's: 16 pointers in 3.10, 20 in
//! 3.11 to 3.14.
//!
//! The engine reads `ssl` and `bio`, reads `eof_written`, and takes the
//! exception that `_ssl`'s callbacks (msg_callback, keylog) park in
//! `exc` for the next handshake / read / write / shutdown to raise. The
//! context's `ctx` is only read to cross-check the `SSL *`.
//!
//! Nothing is read unless: the interpreter is CPython 3.10 to 3.14 with
//! the GIL, the objects' types are exactly `_ssl._SSLSocket` and
//! `_ssl.MemoryBIO` (the context may be a subclass of `_ssl._SSLContext`:
//! subclasses extend the struct at its end), and the types' `__basicsize__`
//! equal the sizes of the mirrors (`_ssl` allocates exactly its struct).
//! After reading, the pointers must agree with what OpenSSL itself says:
//! the `SSL`'s read and write BIOs are the two MemoryBIOs', its app data is
//! the `_SSLSocket` (`SSL_set_app_data(self->ssl, self)` in newPySSLSocket)
//! and its `SSL_CTX` is the context's.

use std::ffi::{c_char, c_int};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyType};

use super::ossl::{Conn, Fns, Layouts, BIO, SSL, SSL_CTX};

#[repr(C)]
pub(crate) struct PySSLContext {
    ob_base: ffi::PyObject,
    pub(crate) ctx: *mut SSL_CTX,
}

#[repr(C)]
pub(crate) struct PySSLSocket {
    ob_base: ffi::PyObject,
    socket: *mut ffi::PyObject,
    pub(crate) ssl: *mut SSL,
    ctx: *mut ffi::PyObject,
    shutdown_seen_zero: c_char,
    socket_type: c_int,
    owner: *mut ffi::PyObject,
    server_hostname: *mut ffi::PyObject,
    err_ssl: c_int,
    err_c: c_int,
    #[cfg(not(Py_3_12))]
    pub(crate) exc_type: *mut ffi::PyObject,
    #[cfg(not(Py_3_12))]
    pub(crate) exc_value: *mut ffi::PyObject,
    #[cfg(not(Py_3_12))]
    pub(crate) exc_tb: *mut ffi::PyObject,
    #[cfg(Py_3_12)]
    pub(crate) exc: *mut ffi::PyObject,
}

#[repr(C)]
pub(crate) struct PySSLMemoryBIO {
    ob_base: ffi::PyObject,
    pub(crate) bio: *mut BIO,
    pub(crate) eof_written: c_int,
}

/// The start of `_sslmodulestate`.
#[repr(C)]
pub(crate) struct SslModuleState {
    pub(crate) types: [*mut ffi::PyObject; 5],
    pub(crate) errors: [*mut ffi::PyObject; 7],
    pub(crate) err_codes_to_names: *mut ffi::PyObject,
    #[cfg(not(Py_3_12))]
    _err_names_to_codes: *mut ffi::PyObject,
    pub(crate) lib_codes_to_names: *mut ffi::PyObject,
}

/// `sizeof(_sslmodulestate)`, in pointers.
pub(crate) const MODULE_STATE_POINTERS: usize = if cfg!(Py_3_11) { 20 } else { 16 };

/// The stdlib's error tables, as `_ssl` itself uses them.
pub(crate) struct Tables {
    pub(crate) err_codes_to_names: Py<PyDict>,
    pub(crate) lib_codes_to_names: Py<PyDict>,
}

/// The `_ssl` and `ssl` objects the checks compare with, imported once.
pub(crate) struct Types {
    pub(crate) ssl_object: Py<PyType>,
    /// SSLObject's methods whose work the engine does instead: a subclass
    /// that overrides any of them is not driven natively.
    pub(crate) driven: Vec<(&'static str, Py<PyAny>)>,
    /// `_ssl`'s verified layouts and error tables, or why the layouts
    /// cannot be used in this interpreter.
    pub(crate) layouts: Result<Layouts, String>,
}

pub(crate) const DRIVEN_METHODS: [&str; 5] = ["do_handshake", "read", "write", "pending", "unwrap"];

static TYPES: PyOnceLock<Types> = PyOnceLock::new();

pub(crate) fn types(py: Python<'_>) -> PyResult<&'static Types> {
    TYPES.get_or_try_init(py, || {
        let ssl = py.import("ssl")?;
        let ssl_object = ssl.getattr("SSLObject")?.cast_into::<PyType>()?;
        let mut driven = Vec::new();
        for name in DRIVEN_METHODS {
            driven.push((name, ssl_object.getattr(name)?.unbind()));
        }
        let layouts = Layouts::verify(py)?;
        Ok(Types { ssl_object: ssl_object.unbind(), driven, layouts })
    })
}

/// Checks an SSLObject and its parts, and reads their OpenSSL pointers;
/// `Err(reason)` when they cannot be used.
pub(crate) fn open(
    py: Python<'_>,
    fns: &'static Fns,
    sslobj: &Bound<'_, PyAny>,
    sslsock: &Bound<'_, PyAny>,
    incoming: &Bound<'_, PyAny>,
    outgoing: &Bound<'_, PyAny>,
) -> PyResult<Result<Conn, String>> {
    let t = types(py)?;
    let layouts = match &t.layouts {
        Ok(l) => l,
        Err(why) => return Ok(Err(why.clone())),
    };
    // A subclass may add anything but what the engine does instead; the
    // methods are compared with SSLObject's as first seen (which also
    // catches them being replaced on SSLObject itself later).
    let cls = sslobj.get_type();
    if cls.as_ptr() != t.ssl_object.as_ptr() && !cls.is_subclass(t.ssl_object.bind(py))? {
        return Ok(Err(format!("{} is not an ssl.SSLObject", cls.name()?)));
    }
    for (name, base) in &t.driven {
        if cls.getattr(*name)?.as_ptr() != base.as_ptr() {
            return Ok(Err(format!("{} overrides SSLObject.{name}", cls.name()?)));
        }
    }
    Conn::open(py, fns, layouts, sslsock, incoming, outgoing)
}
