//! Reaching the OpenSSL pointers inside CPython's `_ssl` objects.
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

use std::ffi::{c_char, c_int, c_void};
use std::mem::size_of;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyModule, PyType};

use super::ossl::{Fns, BIO, SSL, SSL_CTX};

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
struct SslModuleState {
    types: [*mut ffi::PyObject; 5],
    errors: [*mut ffi::PyObject; 7],
    err_codes_to_names: *mut ffi::PyObject,
    #[cfg(not(Py_3_12))]
    _err_names_to_codes: *mut ffi::PyObject,
    lib_codes_to_names: *mut ffi::PyObject,
}

/// `sizeof(_sslmodulestate)`, in pointers.
const MODULE_STATE_POINTERS: usize = if cfg!(Py_3_11) { 20 } else { 16 };

/// The stdlib's error tables, as `_ssl` itself uses them.
pub(crate) struct Tables {
    pub(crate) err_codes_to_names: Py<PyDict>,
    pub(crate) lib_codes_to_names: Py<PyDict>,
}

/// The `_ssl` and `ssl` objects the checks compare with, imported once.
pub(crate) struct Types {
    pub(crate) ssl_socket: Py<PyType>,
    pub(crate) memory_bio: Py<PyType>,
    pub(crate) context: Py<PyType>,
    pub(crate) ssl_object: Py<PyType>,
    /// SSLObject's methods whose work the engine does instead: a subclass
    /// that overrides any of them is not driven natively.
    pub(crate) driven: Vec<(&'static str, Py<PyAny>)>,
    /// `_ssl`'s error tables (None when unusable).
    pub(crate) tables: Option<Tables>,
    /// Why the layouts cannot be used in this interpreter, if so.
    pub(crate) unusable: Option<String>,
}

pub(crate) const DRIVEN_METHODS: [&str; 5] = ["do_handshake", "read", "write", "pending", "unwrap"];

static TYPES: PyOnceLock<Types> = PyOnceLock::new();

pub(crate) fn types(py: Python<'_>) -> PyResult<&'static Types> {
    TYPES.get_or_try_init(py, || {
        let m = py.import("_ssl")?;
        let ssl = py.import("ssl")?;
        let get = |name: &str| -> PyResult<Py<PyType>> { Ok(m.getattr(name)?.cast_into::<PyType>()?.unbind()) };
        let ssl_object = ssl.getattr("SSLObject")?.cast_into::<PyType>()?;
        let mut driven = Vec::new();
        for name in DRIVEN_METHODS {
            driven.push((name, ssl_object.getattr(name)?.unbind()));
        }
        let t = Types {
            ssl_socket: get("_SSLSocket")?,
            memory_bio: get("MemoryBIO")?,
            context: get("_SSLContext")?,
            ssl_object: ssl_object.unbind(),
            driven,
            tables: None,
            unusable: None,
        };
        let mut unusable = check_interpreter(py, &t)?;
        let mut tables = None;
        if unusable.is_none() {
            match read_tables(py, &m, &ssl)? {
                Ok(t) => tables = Some(t),
                Err(why) => unusable = Some(why),
            }
        }
        Ok(Types { unusable, tables, ..t })
    })
}

/// Reads the error tables out of `_ssl`'s module state (see the module doc).
fn read_tables(py: Python<'_>, m: &Bound<'_, PyModule>, ssl: &Bound<'_, PyModule>) -> PyResult<Result<Tables, String>> {
    let mut expected = Vec::new();
    for name in ["_SSLContext", "_SSLSocket", "MemoryBIO", "SSLSession", "Certificate"] {
        expected.push(m.getattr(name)?);
    }
    for name in [
        "SSLError",
        "SSLCertVerificationError",
        "SSLZeroReturnError",
        "SSLWantReadError",
        "SSLWantWriteError",
        "SSLSyscallError",
        "SSLEOFError",
    ] {
        expected.push(ssl.getattr(name)?);
    }
    // SAFETY: `m` is the live `_ssl` module; PyModule_GetDef / GetState
    // return its definition and state (or NULL), which live as long as it.
    let (size, state) = unsafe {
        let def = ffi::PyModule_GetDef(m.as_ptr());
        if def.is_null() {
            ffi::PyErr_Clear();
            return Ok(Err("_ssl has no module definition".into()));
        }
        ((*def).m_size, ffi::PyModule_GetState(m.as_ptr()) as *const SslModuleState)
    };
    let want = (MODULE_STATE_POINTERS * size_of::<*mut c_void>()) as ffi::Py_ssize_t;
    if state.is_null() || size != want {
        return Ok(Err(format!("_ssl's module state is {size} bytes, not the {want} of the verified layout")));
    }
    // SAFETY: the state is at least `want` bytes (its m_size), more than
    // the prefix read here; its twelve first words are only compared.
    let st = unsafe { &*state };
    let prefix = st.types.iter().chain(st.errors.iter());
    if !prefix.zip(&expected).all(|(p, o)| *p == o.as_ptr()) {
        return Ok(Err("_ssl's module state does not start with its types and exceptions".into()));
    }
    // SAFETY: the prefix matched the verified layout, so these two words
    // are the state's owned references to the tables (alive with the
    // module, which the `ssl` module keeps); Bound takes new references.
    let (codes, libs) = unsafe {
        (
            Bound::from_borrowed_ptr_or_opt(py, st.err_codes_to_names),
            Bound::from_borrowed_ptr_or_opt(py, st.lib_codes_to_names),
        )
    };
    let (Some(codes), Some(libs)) = (codes, libs) else {
        return Ok(Err("_ssl's error tables are missing".into()));
    };
    match (codes.cast_into::<PyDict>(), libs.cast_into::<PyDict>()) {
        (Ok(c), Ok(l)) => Ok(Ok(Tables { err_codes_to_names: c.unbind(), lib_codes_to_names: l.unbind() })),
        _ => Ok(Err("_ssl's error tables are not dicts".into())),
    }
}

/// The interpreter-wide conditions: version, and the types' sizes.
fn check_interpreter(py: Python<'_>, t: &Types) -> PyResult<Option<String>> {
    let sys = py.import("sys")?;
    let vi = sys.getattr("version_info")?;
    let (major, minor): (u32, u32) = (vi.get_item(0)?.extract()?, vi.get_item(1)?.extract()?);
    let implementation: String = sys.getattr("implementation")?.getattr("name")?.extract()?;
    if implementation != "cpython" {
        return Ok(Some(format!("{implementation}: _ssl's layouts are only verified for CPython")));
    }
    if major != 3 || !(10..=14).contains(&minor) {
        return Ok(Some(format!("CPython {major}.{minor}: _ssl's layouts are verified for 3.10 to 3.14")));
    }
    for (ty, want, what) in [
        (&t.ssl_socket, size_of::<PySSLSocket>(), "_ssl._SSLSocket"),
        (&t.memory_bio, size_of::<PySSLMemoryBIO>(), "_ssl.MemoryBIO"),
    ] {
        let got: usize = ty.bind(py).getattr("__basicsize__")?.extract()?;
        if got != want {
            return Ok(Some(format!("{what} is {got} bytes, not the {want} of the verified layout")));
        }
    }
    Ok(None)
}

/// The pointers of one connection, read and cross-checked.
pub(crate) struct Pointers {
    pub(crate) ssl: *mut SSL,
    pub(crate) rbio: *mut BIO,
    pub(crate) wbio: *mut BIO,
}

/// `type(obj) is ty`.
fn is_exact(obj: &Bound<'_, PyAny>, ty: &Py<PyType>) -> bool {
    obj.get_type().as_ptr() == ty.as_ptr()
}

/// Checks an SSLObject and its parts, and reads their OpenSSL pointers;
/// `Err(reason)` when they cannot be used.
pub(crate) fn read_pointers(
    py: Python<'_>,
    fns: &Fns,
    sslobj: &Bound<'_, PyAny>,
    sslsock: &Bound<'_, PyAny>,
    incoming: &Bound<'_, PyAny>,
    outgoing: &Bound<'_, PyAny>,
) -> PyResult<Result<Pointers, String>> {
    let t = types(py)?;
    if let Some(why) = &t.unusable {
        return Ok(Err(why.clone()));
    }
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
    if !is_exact(sslsock, &t.ssl_socket) {
        return Ok(Err(format!("SSLObject._sslobj is a {}, not an _ssl._SSLSocket", sslsock.get_type().name()?)));
    }
    for (bio, what) in [(incoming, "incoming"), (outgoing, "outgoing")] {
        if !is_exact(bio, &t.memory_bio) {
            return Ok(Err(format!("the {what} BIO is a {}, not an ssl.MemoryBIO", bio.get_type().name()?)));
        }
    }
    let context = sslsock.getattr("context")?;
    if !context.is_instance(t.context.bind(py))? {
        return Ok(Err("the SSLObject's context is not an _ssl._SSLContext".into()));
    }
    // SAFETY: the types were checked exactly (the context: a subclass of
    // _SSLContext, whose struct starts with PySSLContext's) and their sizes
    // against the mirrors; the objects are alive (borrowed for this call).
    let (p, sock_ptr, ctx) = unsafe {
        let sock = &*(sslsock.as_ptr() as *const PySSLSocket);
        let p = Pointers {
            ssl: sock.ssl,
            rbio: (*(incoming.as_ptr() as *const PySSLMemoryBIO)).bio,
            wbio: (*(outgoing.as_ptr() as *const PySSLMemoryBIO)).bio,
        };
        (p, sslsock.as_ptr() as *mut c_void, (*(context.as_ptr() as *const PySSLContext)).ctx)
    };
    if p.ssl.is_null() || p.rbio.is_null() || p.wbio.is_null() || ctx.is_null() {
        return Ok(Err("an OpenSSL pointer of the SSLObject is NULL".into()));
    }
    // SAFETY: `p.ssl` is the live SSL of the _SSLSocket (owned by it until
    // its dealloc; we hold a reference); these are read-only accessors.
    let (rbio, wbio, app, sctx) = unsafe {
        (
            (fns.SSL_get_rbio)(p.ssl),
            (fns.SSL_get_wbio)(p.ssl),
            (fns.SSL_get_ex_data)(p.ssl, 0),
            (fns.SSL_get_SSL_CTX)(p.ssl),
        )
    };
    if rbio != p.rbio || wbio != p.wbio {
        return Ok(Err("the SSLObject does not read and write the MemoryBIOs given".into()));
    }
    if app != sock_ptr || sctx != ctx {
        return Ok(Err("the SSL * read from _ssl._SSLSocket does not point back to it".into()));
    }
    Ok(Ok(p))
}
