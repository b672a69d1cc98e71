//! The OpenSSL edge: the libssl / libcrypto functions the engine calls,
//! found through CPython's `_ssl`.
//!
//! zuvrs does not link OpenSSL. Every function is looked up once per process
//! through `_ssl`'s own shared object (`dlopen(_ssl.__file__, RTLD_NOLOAD)`
//! then `dlsym` on that handle, which searches `_ssl` and the libraries it
//! depends on), so the pointers we call are the definitions `_ssl` binds to.
//! Linking libssl instead would give no such guarantee: maturin's default
//! wheel repair copies a linked libssl into the wheel (a second OpenSSL in
//! the process, whose functions must never see `_ssl`'s objects), and a
//! Python whose `_ssl` brings its own OpenSSL would load two copies too.
//!
//! The proof that they are `_ssl`'s own is in verdict.rs.
//!
//! Every OpenSSL call, and every read of `_ssl`'s objects through the
//! mirrors of layout.rs, is made here, behind owners whose methods are
//! safe: `Fns` (the functions, found through `_ssl` only), `Layouts` (`_ssl`'s
//! types, once their layouts are proven to be the mirrors'), `Conn` (one
//! connection's `SSL *` and `BIO *`s, kept alive by the objects that own
//! them), and the memory TLS reads decrypt into (`Plaintext`, `UniqueBytes`,
//! `WritableBuffer`).

#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_char, c_int, c_long, c_ulong, c_void, CStr, CString};
use std::marker::PhantomData;
use std::mem::size_of;
use std::ptr::NonNull;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyModule, PyType};

use crate::uv::transport::{IoBuf, StreamOwner, UvStream};

use super::layout::{PySSLContext, PySSLMemoryBIO, PySSLSocket, SslModuleState, Tables, MODULE_STATE_POINTERS};

/// Opaque OpenSSL types: only ever handled by pointer (named as OpenSSL
/// names them).
#[allow(clippy::upper_case_acronyms)]
pub(crate) enum SSL {}
pub(crate) enum SSL_CTX {}
#[allow(clippy::upper_case_acronyms)]
pub(crate) enum BIO {}
pub(crate) enum BIO_METHOD {}

// ssl.h: SSL_get_error() results.
pub(crate) const SSL_ERROR_SSL: c_int = 1;
pub(crate) const SSL_ERROR_WANT_READ: c_int = 2;
pub(crate) const SSL_ERROR_WANT_WRITE: c_int = 3;
pub(crate) const SSL_ERROR_WANT_X509_LOOKUP: c_int = 4;
pub(crate) const SSL_ERROR_SYSCALL: c_int = 5;
pub(crate) const SSL_ERROR_ZERO_RETURN: c_int = 6;
pub(crate) const SSL_ERROR_WANT_CONNECT: c_int = 7;
// ssl.h: SSL_get_shutdown() bits.
pub(crate) const SSL_SENT_SHUTDOWN: c_int = 1;
pub(crate) const SSL_RECEIVED_SHUTDOWN: c_int = 2;
// ssl.h: SSL_ctrl() commands and SSL_MODE_* bits.
pub(crate) const SSL_CTRL_MODE: c_int = 33;
pub(crate) const SSL_CTRL_CLEAR_MODE: c_int = 78;
pub(crate) const SSL_MODE_ENABLE_PARTIAL_WRITE: c_long = 0x1;
pub(crate) const SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER: c_long = 0x2;
pub(crate) const SSL_MODE_RELEASE_BUFFERS: c_long = 0x10;
// bio.h: BIO_ctrl() commands.
pub(crate) const BIO_CTRL_INFO: c_int = 3;
pub(crate) const BIO_CTRL_PENDING: c_int = 10;
pub(crate) const BIO_C_FILE_SEEK: c_int = 128;
pub(crate) const BIO_C_FILE_TELL: c_int = 133;
// err.h: libraries; sslerr.h: reasons (checked against `_ssl`'s tables).
pub(crate) const ERR_LIB_SYS: c_int = 2;
pub(crate) const ERR_LIB_SSL: c_int = 20;
pub(crate) const SSL_R_CERTIFICATE_VERIFY_FAILED: c_int = 134;
pub(crate) const SSL_R_UNEXPECTED_EOF_WHILE_READING: c_int = 294;
// x509_vfy.h: verification results with wording of their own in `_ssl`.
pub(crate) const X509_V_ERR_HOSTNAME_MISMATCH: c_long = 62;
pub(crate) const X509_V_ERR_IP_ADDRESS_MISMATCH: c_long = 64;
// `_ssl.c`'s enum py_ssl_error beyond ssl.h's values (checked against
// ssl.SSL_ERROR_EOF / SSL_ERROR_INVALID_ERROR_CODE).
pub(crate) const PY_SSL_ERROR_EOF: c_int = 8;
pub(crate) const PY_SSL_ERROR_INVALID_ERROR_CODE: c_int = 10;

/// OpenSSL 3's ERR_GET_LIB (err.h, a static inline there).
pub(crate) fn err_get_lib(e: c_ulong) -> c_int {
    if e & 0x8000_0000 != 0 {
        ERR_LIB_SYS
    } else {
        ((e >> 23) & 0xff) as c_int
    }
}

/// OpenSSL 3's ERR_GET_REASON (err.h, a static inline there).
pub(crate) fn err_get_reason(e: c_ulong) -> c_int {
    if e & 0x8000_0000 != 0 {
        (e & 0x7fff_ffff) as c_int
    } else {
        (e & 0x7f_ffff) as c_int
    }
}

macro_rules! openssl_functions {
    ($($name:ident: fn($($arg:ty),*) -> $ret:ty;)*) => {
        /// The OpenSSL functions the engine calls, as `_ssl` sees them. Only
        /// `Fns::resolve` makes one.
        pub(crate) struct Fns {
            $($name: unsafe extern "C" fn($($arg),*) -> $ret,)*
        }

        impl Fns {
            /// Resolves every function through `handle` (see verdict.rs
            /// for the rules), or says which one failed and why.
            fn resolve_all(handle: &Loaded, libs: &mut Vec<String>) -> Result<Fns, String> {
                Ok(Fns {
                    $($name: {
                        let p = lookup(handle, concat!(stringify!($name), "\0"), libs)?;
                        // SAFETY: `p` is the address of the C function of that
                        // name in OpenSSL 3, whose prototype is the one
                        // declared here (ssl.h / bio.h / err.h / crypto.h).
                        unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> $ret>(p) }
                    },)*
                })
            }
        }

        /// The names `Fns` holds, for tests and the verdict's reason.
        pub(crate) const FUNCTION_NAMES: &[&str] = &[$(stringify!($name)),*];
    };
}

openssl_functions! {
    SSL_do_handshake: fn(*mut SSL) -> c_int;
    SSL_read_ex: fn(*mut SSL, *mut c_void, usize, *mut usize) -> c_int;
    SSL_write_ex: fn(*mut SSL, *const c_void, usize, *mut usize) -> c_int;
    SSL_shutdown: fn(*mut SSL) -> c_int;
    SSL_get_error: fn(*const SSL, c_int) -> c_int;
    SSL_pending: fn(*const SSL) -> c_int;
    SSL_get_shutdown: fn(*const SSL) -> c_int;
    SSL_get_verify_result: fn(*const SSL) -> c_long;
    SSL_get_rbio: fn(*const SSL) -> *mut BIO;
    SSL_get_wbio: fn(*const SSL) -> *mut BIO;
    SSL_get_SSL_CTX: fn(*const SSL) -> *mut SSL_CTX;
    SSL_get_ex_data: fn(*const SSL, c_int) -> *mut c_void;
    SSL_ctrl: fn(*mut SSL, c_int, c_long, *mut c_void) -> c_long;
    SSL_is_init_finished: fn(*const SSL) -> c_int;
    SSL_renegotiate: fn(*mut SSL) -> c_int;
    SSL_key_update: fn(*mut SSL, c_int) -> c_int;
    SSL_free_buffers: fn(*mut SSL) -> c_int;
    BIO_write: fn(*mut BIO, *const c_void, c_int) -> c_int;
    BIO_read: fn(*mut BIO, *mut c_void, c_int) -> c_int;
    BIO_ctrl: fn(*mut BIO, c_int, c_long, *mut c_void) -> c_long;
    BIO_s_mem: fn() -> *const BIO_METHOD;
    BIO_new: fn(*const BIO_METHOD) -> *mut BIO;
    BIO_free: fn(*mut BIO) -> c_int;
    ERR_peek_error: fn() -> c_ulong;
    ERR_peek_last_error: fn() -> c_ulong;
    ERR_clear_error: fn() -> ();
    ERR_reason_error_string: fn(c_ulong) -> *const c_char;
    X509_verify_cert_error_string: fn(c_long) -> *const c_char;
    OpenSSL_version_num: fn() -> c_ulong;
}

/// A handle `dlopen` returned for an object already loaded (kept: the
/// functions found through it are used for the life of the process).
struct Loaded(*mut c_void);

impl Fns {
    /// Finds every function through the shared object at `path` (`_ssl`'s
    /// `__file__`), which must be loaded already; also the libraries they
    /// live in. The names are OpenSSL's public API: any object that defines
    /// them defines them with the prototypes declared here.
    pub(crate) fn resolve(path: &str) -> Result<(Fns, Vec<String>), String> {
        let cpath = CString::new(path).map_err(|_| "_ssl's path has a NUL byte".to_string())?;
        // SAFETY: RTLD_NOLOAD only returns a handle to an object already loaded
        // (adding a reference, which is kept: the functions are used for the
        // life of the process); no constructor runs.
        let handle = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        if handle.is_null() {
            return Err(format!("{path} is not loaded under that name"));
        }
        let mut libs = Vec::new();
        let fns = Fns::resolve_all(&Loaded(handle), &mut libs)?;
        Ok((fns, libs))
    }

    /// `OpenSSL_version_num()`.
    pub(crate) fn openssl_version_num(&self) -> c_ulong {
        // SAFETY: no arguments; returns a number.
        unsafe { (self.OpenSSL_version_num)() }
    }

    /// The first error in this thread's OpenSSL queue (0: none).
    #[inline]
    pub(crate) fn err_peek_error(&self) -> c_ulong {
        // SAFETY: reads the calling thread's error queue.
        unsafe { (self.ERR_peek_error)() }
    }

    /// The last error in this thread's OpenSSL queue (0: none).
    #[inline]
    pub(crate) fn err_peek_last_error(&self) -> c_ulong {
        // SAFETY: as above.
        unsafe { (self.ERR_peek_last_error)() }
    }

    /// Empties this thread's OpenSSL error queue.
    #[inline]
    pub(crate) fn err_clear_error(&self) {
        // SAFETY: as above.
        unsafe { (self.ERR_clear_error)() }
    }

    /// OpenSSL's text for an error's reason, if it has one.
    pub(crate) fn err_reason_error_string(&self, e: c_ulong) -> Option<String> {
        // SAFETY: a lookup in OpenSSL's static tables (NULL when absent).
        unsafe { static_str((self.ERR_reason_error_string)(e)) }
    }

    /// OpenSSL's text for a certificate verification result.
    pub(crate) fn x509_verify_cert_error_string(&self, code: c_long) -> Option<String> {
        // SAFETY: as above.
        unsafe { static_str((self.X509_verify_cert_error_string)(code)) }
    }

    /// Whether seeking a memory BIO past n bytes consumes them, as OpenSSL 3's
    /// mem BIO does (`BIO_seek` moves its read pointer; the next write
    /// compacts). Probed on a private BIO: write "abcdef", seek 2 further, then
    /// expect "cdef" pending, and "cdefgh" after writing "gh".
    pub(crate) fn probe_bio_seek(&self) -> bool {
        let f = self;
        // SAFETY: a BIO made and freed here; every call is on it.
        unsafe {
            let b = (f.BIO_new)((f.BIO_s_mem)());
            if b.is_null() {
                return false;
            }
            let view = |b: *mut BIO| {
                let mut p: *mut c_char = std::ptr::null_mut();
                let n = (f.BIO_ctrl)(b, BIO_CTRL_INFO, 0, &mut p as *mut _ as *mut c_void);
                if p.is_null() || n < 0 {
                    Vec::new()
                } else {
                    std::slice::from_raw_parts(p as *const u8, n as usize).to_vec()
                }
            };
            let mut ok = (f.BIO_write)(b, b"abcdef".as_ptr() as *const c_void, 6) == 6;
            let tell = (f.BIO_ctrl)(b, BIO_C_FILE_TELL, 0, std::ptr::null_mut());
            ok &= tell >= 0 && (f.BIO_ctrl)(b, BIO_C_FILE_SEEK, tell + 2, std::ptr::null_mut()) >= 0;
            ok &= (f.BIO_ctrl)(b, BIO_CTRL_PENDING, 0, std::ptr::null_mut()) == 4 && view(b) == b"cdef";
            ok &= (f.BIO_write)(b, b"gh".as_ptr() as *const c_void, 2) == 2 && view(b) == b"cdefgh";
            (f.BIO_free)(b);
            ok
        }
    }
}

/// A copy of a static C string OpenSSL returned, if not NULL.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string that outlives the call.
unsafe fn static_str(p: *const c_char) -> Option<String> {
    if p.is_null() {
        None
    } else {
        // SAFETY: the caller's contract.
        Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }
}

/// Looks `name` up from `_ssl`'s handle; refuses a name `_ssl` cannot see
/// or that the global scope defines differently. Records the library path.
fn lookup(handle: &Loaded, name: &'static str, libs: &mut Vec<String>) -> Result<*mut c_void, String> {
    let shown = name.trim_end_matches('\0');
    let cname = CStr::from_bytes_with_nul(name.as_bytes()).map_err(|_| format!("{shown}: not a C name"))?;
    // SAFETY: `handle` is a live dlopen handle; `cname` is NUL-terminated.
    let local = unsafe { libc::dlsym(handle.0, cname.as_ptr()) };
    if local.is_null() {
        return Err(format!("_ssl does not resolve {shown} (no shared OpenSSL behind it)"));
    }
    // SAFETY: as above; RTLD_DEFAULT searches the global scope.
    let global = unsafe { libc::dlsym(libc::RTLD_DEFAULT, cname.as_ptr()) };
    if !global.is_null() && global != local {
        return Err(format!(
            "{shown} is defined twice: {} (global scope) and {} (_ssl's libraries)",
            library_of(global),
            library_of(local)
        ));
    }
    let lib = library_of(local);
    if !libs.contains(&lib) {
        libs.push(lib);
    }
    Ok(local)
}

/// The path of the shared object that contains `addr`.
fn library_of(addr: *const c_void) -> String {
    // SAFETY: dladdr fills `info` for an address in a loaded object and
    // leaves it untouched (returning 0) otherwise; dli_fname then points to
    // a string owned by the dynamic linker, alive while the object is.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(addr, &mut info) == 0 || info.dli_fname.is_null() {
            return format!("{addr:p}");
        }
        CStr::from_ptr(info.dli_fname).to_string_lossy().into_owned()
    }
}

/// `OSError` from an errno value, as `PyErr_SetFromErrno` makes it.
#[cfg(Py_3_13)]
pub(crate) fn os_error(py: Python<'_>, errno: c_int) -> PyErr {
    // SAFETY: sets errno for this thread, then lets CPython build the
    // exception from it (it always sets one and returns NULL).
    unsafe {
        *libc::__errno_location() = errno;
        ffi::PyErr_SetFromErrno(ffi::PyExc_OSError);
    }
    PyErr::fetch(py)
}

// ---- _ssl's objects, read through the mirrors of layout.rs ----

/// `_ssl`'s types, proven in this interpreter to have the layouts of
/// layout.rs's mirrors, and the error tables read from its module state.
/// Only `Layouts::verify` makes one: objects of exactly these types (the
/// context: of a subclass) may be read through the mirrors.
pub(crate) struct Layouts {
    ssl_socket: Py<PyType>,
    memory_bio: Py<PyType>,
    context: Py<PyType>,
    tables: Tables,
}

impl Layouts {
    /// Checks the interpreter, the types' sizes and `_ssl`'s module state
    /// (see layout.rs); `Err(reason)` when the layouts cannot be used.
    pub(crate) fn verify(py: Python<'_>) -> PyResult<Result<Layouts, String>> {
        let (m, ssl) = (py.import("_ssl")?, py.import("ssl")?);
        let get = |name: &str| -> PyResult<Py<PyType>> { Ok(m.getattr(name)?.cast_into::<PyType>()?.unbind()) };
        let (ssl_socket, memory_bio, context) = (get("_SSLSocket")?, get("MemoryBIO")?, get("_SSLContext")?);
        if let Some(why) = check_interpreter(py, &ssl_socket, &memory_bio)? {
            return Ok(Err(why));
        }
        Ok(read_tables(py, &m, &ssl)?.map(|tables| Layouts { ssl_socket, memory_bio, context, tables }))
    }

    /// `_ssl`'s error tables.
    pub(crate) fn tables(&self) -> &Tables {
        &self.tables
    }
}

/// The interpreter-wide conditions: version, and the types' sizes.
fn check_interpreter(py: Python<'_>, ssl_socket: &Py<PyType>, memory_bio: &Py<PyType>) -> PyResult<Option<String>> {
    if cfg!(Py_GIL_DISABLED) {
        // (`Conn` relies on the GIL to serialise its users.)
        return Ok(Some("free-threaded CPython: _ssl's layouts are only verified with the GIL".into()));
    }
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
        (ssl_socket, size_of::<PySSLSocket>(), "_ssl._SSLSocket"),
        (memory_bio, size_of::<PySSLMemoryBIO>(), "_ssl.MemoryBIO"),
    ] {
        let got: usize = ty.bind(py).getattr("__basicsize__")?.extract()?;
        if got != want {
            return Ok(Some(format!("{what} is {got} bytes, not the {want} of the verified layout")));
        }
    }
    Ok(None)
}

/// Reads the error tables out of `_ssl`'s module state (see layout.rs).
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

/// `type(obj) is ty`.
fn is_exact(obj: &Bound<'_, PyAny>, ty: &Py<PyType>) -> bool {
    obj.get_type().as_ptr() == ty.as_ptr()
}

// ---- one connection ----

/// One connection's OpenSSL objects: the `SSL *` of an `_ssl._SSLSocket`
/// and the `BIO *`s of its two `MemoryBIO`s, read through the verified
/// layouts and cross-checked with OpenSSL. The objects that own them are
/// held, so the pointers stay valid as long as the `Conn`: `_ssl` frees
/// them only when those objects are deallocated.
pub(crate) struct Conn {
    fns: &'static Fns,
    ssl: NonNull<SSL>,
    rbio: NonNull<BIO>,
    wbio: NonNull<BIO>,
    sslsock: Py<PyAny>,
    incoming: Py<PyAny>,
    outgoing: Py<PyAny>,
}

// SAFETY: the pointers are only used with the GIL held (every method that
// uses them takes `Python<'_>`, and `Layouts::verify` refuses free-threaded
// builds, so the GIL serialises every user), and the objects they point
// into are kept alive by the `Py` references beside them.
unsafe impl Send for Conn {}
// SAFETY: as for Send: shared use is serialised by the GIL.
unsafe impl Sync for Conn {}

impl Conn {
    /// Checks the `_SSLSocket` behind an SSLObject and its two MemoryBIOs,
    /// and reads their OpenSSL pointers; `Err(reason)` when they cannot be
    /// used.
    pub(crate) fn open(
        py: Python<'_>,
        fns: &'static Fns,
        layouts: &Layouts,
        sslsock: &Bound<'_, PyAny>,
        incoming: &Bound<'_, PyAny>,
        outgoing: &Bound<'_, PyAny>,
    ) -> PyResult<Result<Conn, String>> {
        if !is_exact(sslsock, &layouts.ssl_socket) {
            return Ok(Err(format!("SSLObject._sslobj is a {}, not an _ssl._SSLSocket", sslsock.get_type().name()?)));
        }
        for (bio, what) in [(incoming, "incoming"), (outgoing, "outgoing")] {
            if !is_exact(bio, &layouts.memory_bio) {
                return Ok(Err(format!("the {what} BIO is a {}, not an ssl.MemoryBIO", bio.get_type().name()?)));
            }
        }
        let context = sslsock.getattr("context")?;
        if !context.is_instance(layouts.context.bind(py))? {
            return Ok(Err("the SSLObject's context is not an _ssl._SSLContext".into()));
        }
        // SAFETY: the types were checked exactly (the context: a subclass of
        // _SSLContext, whose struct starts with PySSLContext's) and their sizes
        // against the mirrors; the objects are alive (borrowed for this call).
        let (ssl, rbio, wbio, ctx) = unsafe {
            (
                (*(sslsock.as_ptr() as *const PySSLSocket)).ssl,
                (*(incoming.as_ptr() as *const PySSLMemoryBIO)).bio,
                (*(outgoing.as_ptr() as *const PySSLMemoryBIO)).bio,
                (*(context.as_ptr() as *const PySSLContext)).ctx,
            )
        };
        let (Some(ssl), Some(rbio), Some(wbio), false) =
            (NonNull::new(ssl), NonNull::new(rbio), NonNull::new(wbio), ctx.is_null())
        else {
            return Ok(Err("an OpenSSL pointer of the SSLObject is NULL".into()));
        };
        // SAFETY: `ssl` is the live SSL of the _SSLSocket (owned by it until
        // its dealloc; we hold a reference); these are read-only accessors.
        let (got_rbio, got_wbio, app, sctx) = unsafe {
            (
                (fns.SSL_get_rbio)(ssl.as_ptr()),
                (fns.SSL_get_wbio)(ssl.as_ptr()),
                (fns.SSL_get_ex_data)(ssl.as_ptr(), 0),
                (fns.SSL_get_SSL_CTX)(ssl.as_ptr()),
            )
        };
        if got_rbio != rbio.as_ptr() || got_wbio != wbio.as_ptr() {
            return Ok(Err("the SSLObject does not read and write the MemoryBIOs given".into()));
        }
        if app != sslsock.as_ptr() as *mut c_void || sctx != ctx {
            return Ok(Err("the SSL * read from _ssl._SSLSocket does not point back to it".into()));
        }
        // SAFETY: the verified live SSL; SSL_get_mode is SSL_ctrl(MODE, 0).
        let mode = unsafe { (fns.SSL_ctrl)(ssl.as_ptr(), SSL_CTRL_MODE, 0, std::ptr::null_mut()) };
        if mode & SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER == 0 {
            return Ok(Err("the SSL does not accept moving write buffers".into()));
        }
        let _ = SSL_MODE_ENABLE_PARTIAL_WRITE; // handled either way: write() reports what it took
        Ok(Ok(Conn {
            fns,
            ssl,
            rbio,
            wbio,
            sslsock: sslsock.clone().unbind(),
            incoming: incoming.clone().unbind(),
            outgoing: outgoing.clone().unbind(),
        }))
    }

    #[inline]
    pub(crate) fn fns(&self) -> &'static Fns {
        self.fns
    }

    /// The `_ssl._SSLSocket`.
    pub(crate) fn sslsock(&self) -> &Py<PyAny> {
        &self.sslsock
    }

    /// The incoming `MemoryBIO`.
    pub(crate) fn incoming(&self) -> &Py<PyAny> {
        &self.incoming
    }

    /// The objects held, for the cyclic GC.
    pub(crate) fn objects(&self) -> [&Py<PyAny>; 3] {
        [&self.sslsock, &self.incoming, &self.outgoing]
    }

    /// `SSL_do_handshake`. OpenSSL runs the callbacks `_ssl` installed
    /// inside; they take the GIL, which nests on this thread.
    #[inline]
    pub(crate) fn do_handshake(&self, _py: Python<'_>) -> c_int {
        // SAFETY: the live SSL (see the struct); GIL held.
        unsafe { (self.fns.SSL_do_handshake)(self.ssl.as_ptr()) }
    }

    /// `SSL_read_ex` into `buf`: its return value and the bytes written.
    #[inline]
    pub(crate) fn read(&self, _py: Python<'_>, buf: Plaintext<'_>) -> (c_int, usize) {
        let mut n = 0usize;
        // SAFETY: the live SSL; `buf` is writable for its length (see
        // Plaintext), and OpenSSL writes at most that much.
        let ret = unsafe { (self.fns.SSL_read_ex)(self.ssl.as_ptr(), buf.ptr as *mut c_void, buf.len, &mut n) };
        (ret, n)
    }

    /// `SSL_write_ex` of `data`: its return value and the bytes taken.
    #[inline]
    pub(crate) fn write(&self, _py: Python<'_>, data: &[u8]) -> (c_int, usize) {
        let mut n = 0usize;
        // SAFETY: the live SSL; `data` is readable for its length (the SSL
        // accepts a moving buffer on a retry, checked in `open`).
        let ret =
            unsafe { (self.fns.SSL_write_ex)(self.ssl.as_ptr(), data.as_ptr() as *const c_void, data.len(), &mut n) };
        (ret, n)
    }

    /// `SSL_shutdown`.
    #[inline]
    pub(crate) fn shutdown(&self, _py: Python<'_>) -> c_int {
        // SAFETY: the live SSL. (`_ssl` turns read-ahead off before the
        // second call; it is off with memory BIOs already.)
        unsafe { (self.fns.SSL_shutdown)(self.ssl.as_ptr()) }
    }

    /// `SSL_get_error` for a call that returned `ret`.
    #[inline]
    pub(crate) fn get_error(&self, _py: Python<'_>, ret: c_int) -> c_int {
        // SAFETY: the live SSL.
        unsafe { (self.fns.SSL_get_error)(self.ssl.as_ptr(), ret) }
    }

    /// `SSL_pending`.
    #[inline]
    pub(crate) fn pending(&self, _py: Python<'_>) -> c_int {
        // SAFETY: the live SSL; read-only.
        unsafe { (self.fns.SSL_pending)(self.ssl.as_ptr()) }
    }

    /// `SSL_get_shutdown`.
    #[inline]
    pub(crate) fn get_shutdown(&self, _py: Python<'_>) -> c_int {
        // SAFETY: the live SSL; read-only.
        unsafe { (self.fns.SSL_get_shutdown)(self.ssl.as_ptr()) }
    }

    /// `SSL_get_verify_result`.
    pub(crate) fn get_verify_result(&self, _py: Python<'_>) -> c_long {
        // SAFETY: the live SSL; read-only.
        unsafe { (self.fns.SSL_get_verify_result)(self.ssl.as_ptr()) }
    }

    /// `SSL_is_init_finished`.
    #[inline]
    pub(crate) fn is_init_finished(&self, _py: Python<'_>) -> bool {
        // SAFETY: the live SSL; read-only.
        unsafe { (self.fns.SSL_is_init_finished)(self.ssl.as_ptr()) == 1 }
    }

    /// `SSL_renegotiate`.
    pub(crate) fn renegotiate(&self, _py: Python<'_>) -> c_int {
        // SAFETY: the live SSL.
        unsafe { (self.fns.SSL_renegotiate)(self.ssl.as_ptr()) }
    }

    /// `SSL_key_update` (OpenSSL refuses an unknown `kind`).
    pub(crate) fn key_update(&self, _py: Python<'_>, kind: c_int) -> c_int {
        // SAFETY: the live SSL.
        unsafe { (self.fns.SSL_key_update)(self.ssl.as_ptr(), kind) }
    }

    /// Clears `SSL_MODE_RELEASE_BUFFERS` (which `_ssl` sets on every
    /// context): the record buffers stay between records instead of a
    /// malloc and free of some 17 KB per record each way.
    pub(crate) fn keep_record_buffers(&self, _py: Python<'_>) {
        // SAFETY: the live SSL; SSL_CTRL_CLEAR_MODE only clears mode bits.
        unsafe {
            (self.fns.SSL_ctrl)(self.ssl.as_ptr(), SSL_CTRL_CLEAR_MODE, SSL_MODE_RELEASE_BUFFERS, std::ptr::null_mut())
        };
    }

    /// `SSL_free_buffers`: the record buffers are freed (the next record
    /// allocates them again); false when a record is partly processed.
    /// Call it only with no plaintext pending and no ciphertext waiting
    /// in the incoming BIO (OpenSSL releases before 3.0.14 freed a
    /// buffer still in use otherwise, CVE-2024-4741).
    pub(crate) fn free_record_buffers(&self, _py: Python<'_>) -> bool {
        // SAFETY: the live SSL, between calls (no record in flight).
        unsafe { (self.fns.SSL_free_buffers)(self.ssl.as_ptr()) == 1 }
    }

    /// Whether `write_eof()` was called on the incoming MemoryBIO.
    #[inline]
    pub(crate) fn incoming_eof_written(&self, _py: Python<'_>) -> bool {
        // SAFETY: the incoming MemoryBIO's verified layout; read only.
        unsafe { (*(self.incoming.as_ptr() as *const PySSLMemoryBIO)).eof_written != 0 }
    }

    /// `BIO_write` of `data` (at most `c_int::MAX` bytes of it) into the
    /// incoming BIO: the bytes taken, or a negative value.
    #[inline]
    pub(crate) fn feed(&self, _py: Python<'_>, data: &[u8]) -> c_int {
        let len = data.len().min(c_int::MAX as usize) as c_int;
        // SAFETY: the live read BIO; a memory BIO copies the bytes.
        unsafe { (self.fns.BIO_write)(self.rbio.as_ptr(), data.as_ptr() as *const c_void, len) }
    }

    /// Ciphertext fed and not yet processed.
    #[inline]
    pub(crate) fn incoming_pending(&self, _py: Python<'_>) -> usize {
        // SAFETY: the live read BIO; read-only.
        let n = unsafe { (self.fns.BIO_ctrl)(self.rbio.as_ptr(), BIO_CTRL_PENDING, 0, std::ptr::null_mut()) };
        n.max(0) as usize
    }

    /// Ciphertext waiting in the outgoing BIO.
    #[inline]
    pub(crate) fn output_pending(&self, _py: Python<'_>) -> usize {
        // SAFETY: the live write BIO; read-only.
        let n = unsafe { (self.fns.BIO_ctrl)(self.wbio.as_ptr(), BIO_CTRL_PENDING, 0, std::ptr::null_mut()) };
        n.max(0) as usize
    }

    /// Where the waiting ciphertext is, in place, and its size (NULL and 0
    /// when there is none). The memory stays valid only until the outgoing
    /// BIO is next written or read: by any call on this connection, or by
    /// Python code through the SSLObject or the MemoryBIO. Hence a raw
    /// pointer, for a system call made before anything else runs.
    #[inline]
    pub(crate) fn output_ptr(&self, _py: Python<'_>) -> (*const u8, usize) {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: BIO_get_mem_data: a pointer to the unread bytes of the
        // live write BIO and their count.
        let n = unsafe { (self.fns.BIO_ctrl)(self.wbio.as_ptr(), BIO_CTRL_INFO, 0, &mut p as *mut _ as *mut c_void) };
        if p.is_null() || n <= 0 {
            return (std::ptr::null(), 0);
        }
        (p as *const u8, n as usize)
    }

    /// One `uv_try_write` of the waiting ciphertext to `stream`, straight
    /// from the BIO's memory (no copy), left in place: None when there is
    /// none, else the bytes the socket took or libuv's error (UV_EAGAIN when
    /// it took none), and the bytes that were waiting. Only the system call
    /// runs while the memory is lent.
    #[inline]
    pub(crate) fn try_write_output<C: StreamOwner>(
        &self,
        py: Python<'_>,
        stream: &UvStream<C>,
    ) -> Option<(i32, usize)> {
        let (p, n) = self.output_ptr(py);
        if n == 0 {
            return None;
        }
        // SAFETY: output_ptr's bytes stay valid until the outgoing BIO is
        // next touched, by this connection or by Python code; neither runs
        // before the write below returns.
        let bytes = unsafe { std::slice::from_raw_parts(p, n) };
        Some((stream.try_write(&[IoBuf::new(bytes)]), n))
    }

    /// A copy of the waiting ciphertext, left in place.
    pub(crate) fn output_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let (p, n) = self.output_ptr(py);
        if n == 0 {
            return PyBytes::new(py, &[]);
        }
        // SAFETY: `p` holds `n` bytes until the BIO is next used, and
        // making a bytes object runs no Python code.
        PyBytes::new(py, unsafe { std::slice::from_raw_parts(p, n) })
    }

    /// The waiting ciphertext (at most `c_int::MAX` bytes of it) written
    /// into `peer`'s incoming BIO, left in place here: (`BIO_write`'s
    /// result, the bytes it was given).
    pub(crate) fn output_into(&self, py: Python<'_>, peer: &Conn) -> (c_int, usize) {
        let (p, n) = self.output_ptr(py);
        let n = n.min(c_int::MAX as usize);
        if n == 0 {
            return (0, 0);
        }
        if peer.rbio == self.wbio {
            // One MemoryBIO on both ends: writing it could move the bytes
            // being read.
            // SAFETY: as in `output_bytes`; copied before the write.
            let copy = unsafe { std::slice::from_raw_parts(p, n) }.to_vec();
            return (peer.feed(py, &copy), n);
        }
        // SAFETY: `p` holds `n` bytes of another BIO, which this write
        // (a copy into the peer's memory BIO) does not change.
        (unsafe { (self.fns.BIO_write)(peer.rbio.as_ptr(), p as *const c_void, n as c_int) }, n)
    }

    /// Drops the first `n` bytes of the output; `seek`: by moving the
    /// BIO's read pointer (see `Fns::probe_bio_seek`), else by reading
    /// them out.
    pub(crate) fn consume_output(&self, py: Python<'_>, n: usize, seek: bool) {
        self.drop_output(py, n.min(self.output_pending(py)), seek);
    }

    /// `consume_output` of `n` bytes the caller knows are waiting (no
    /// look at the BIO's size first).
    pub(crate) fn drop_output(&self, _py: Python<'_>, n: usize, seek: bool) {
        let wbio = self.wbio.as_ptr();
        if n == 0 {
            return;
        }
        // SAFETY: the live write BIO; reads go into a local buffer, at most
        // its size each.
        unsafe {
            if seek {
                let tell = (self.fns.BIO_ctrl)(wbio, BIO_C_FILE_TELL, 0, std::ptr::null_mut());
                if tell >= 0
                    && (self.fns.BIO_ctrl)(wbio, BIO_C_FILE_SEEK, tell + n as c_long, std::ptr::null_mut()) >= 0
                {
                    return;
                }
            }
            let mut sink = [0u8; 4096];
            let mut left = n;
            while left > 0 {
                let k = left.min(sink.len());
                let got = (self.fns.BIO_read)(wbio, sink.as_mut_ptr() as *mut c_void, k as c_int);
                if got <= 0 {
                    break;
                }
                left -= got as usize;
            }
        }
    }

    /// Appends the waiting ciphertext to `out` (one copy); returns its size.
    pub(crate) fn read_output(&self, py: Python<'_>, out: &mut Vec<u8>) -> usize {
        let n = self.output_pending(py);
        if n == 0 {
            return 0;
        }
        out.reserve(n);
        let spare = out.spare_capacity_mut();
        let want = n.min(spare.len()).min(c_int::MAX as usize);
        // SAFETY: the live write BIO copies at most `want` bytes into the
        // reserved spare capacity, and says how many.
        let got = unsafe { (self.fns.BIO_read)(self.wbio.as_ptr(), spare.as_mut_ptr() as *mut c_void, want as c_int) };
        if got <= 0 {
            return 0;
        }
        // SAFETY: `got` (<= `want`) bytes were initialised just above.
        unsafe { out.set_len(out.len() + got as usize) };
        got as usize
    }

    /// Takes the exception a callback (msg_callback, keylog) parked on the
    /// `_SSLSocket` for the next call to raise, if any.
    pub(crate) fn take_parked(&self, py: Python<'_>) -> Option<PyErr> {
        let sock = self.sslsock.as_ptr() as *mut PySSLSocket;
        // SAFETY: the verified layout of the live _SSLSocket; GIL held. The
        // field's reference moves to us and the field is cleared, as
        // PySSL_ChainExceptions does.
        #[cfg(Py_3_12)]
        unsafe {
            let exc = (*sock).exc;
            if exc.is_null() {
                return None;
            }
            (*sock).exc = std::ptr::null_mut();
            Some(PyErr::from_value(Bound::from_owned_ptr(py, exc)))
        }
        // SAFETY: as above, for the (type, value, traceback) triple of 3.10/3.11.
        #[cfg(not(Py_3_12))]
        unsafe {
            let t = (*sock).exc_type;
            if t.is_null() {
                return None;
            }
            let (v, tb) = ((*sock).exc_value, (*sock).exc_tb);
            (*sock).exc_type = std::ptr::null_mut();
            (*sock).exc_value = std::ptr::null_mut();
            (*sock).exc_tb = std::ptr::null_mut();
            // The three references move into the error indicator, and out of
            // it normalised.
            ffi::PyErr_Restore(t, v, tb);
            PyErr::take(py)
        }
    }
}

// ---- memory TLS reads decrypt into ----

/// Memory `Conn::read` may write plaintext into: a slice borrowed
/// mutably, or memory a Python object exports (a BufferedProtocol's
/// buffer), which only OpenSSL touches, never Rust code: other threads may
/// write it too.
pub(crate) struct Plaintext<'a> {
    ptr: *mut u8,
    len: usize,
    _mem: PhantomData<&'a mut [u8]>,
}

impl<'a> Plaintext<'a> {
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The memory of `buffer`; None unless it is writable and C-contiguous.
    pub(crate) fn of_buffer(buffer: &'a pyo3::buffer::PyBuffer<u8>) -> Option<Plaintext<'a>> {
        if buffer.readonly() {
            return None;
        }
        let mem = buffer.as_slice_ptr()?;
        Some(Plaintext { ptr: mem.as_ptr() as *mut u8, len: mem.len(), _mem: PhantomData })
    }
}

impl<'a> From<&'a mut [u8]> for Plaintext<'a> {
    #[inline]
    fn from(buf: &'a mut [u8]) -> Self {
        Plaintext { ptr: buf.as_mut_ptr(), len: buf.len(), _mem: PhantomData }
    }
}

/// A `bytes` object nobody else holds, so that its contents may be written
/// (the loop's read buffer, while TLS reads decrypt into it).
pub(crate) struct UniqueBytes {
    bytes: Py<PyBytes>,
    /// Its storage and size.
    data: *mut u8,
    len: usize,
}

impl UniqueBytes {
    /// `bytes`, if this is its only reference.
    pub(crate) fn new(bytes: Bound<'_, PyBytes>) -> Result<UniqueBytes, Bound<'_, PyBytes>> {
        let ob = bytes.as_ptr();
        // SAFETY: reading the refcount of a live object.
        if unsafe { ffi::Py_REFCNT(ob) } != 1 {
            return Err(bytes);
        }
        // SAFETY: a live bytes object: its storage is inline (`ob_sval`), of
        // its size.
        let (data, len) = unsafe {
            ((ob as *mut u8).add(std::mem::offset_of!(ffi::PyBytesObject, ob_sval)), ffi::Py_SIZE(ob).max(0) as usize)
        };
        Ok(UniqueBytes { bytes: bytes.unbind(), data, len })
    }

    /// The contents, to write.
    #[inline]
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the storage of the object we hold, which nobody else can
        // reach: ours is its only reference (checked in `new`, and never
        // shared since; `into_bytes` gives it up).
        unsafe { std::slice::from_raw_parts_mut(self.data, self.len) }
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The object, written: its cached hash (if it was ever hashed) goes.
    pub(crate) fn into_bytes(self, py: Python<'_>) -> Bound<'_, PyBytes> {
        // SAFETY: ours is the only reference, so the field can be written.
        #[allow(deprecated)]
        unsafe {
            (*(self.bytes.as_ptr() as *mut ffi::PyBytesObject)).ob_shash = -1;
        }
        self.bytes.into_bound(py)
    }
}

/// A writable buffer exported by a Python object (a BufferedProtocol's
/// `get_buffer()`), whatever its item format (the bytes are what count),
/// released on drop; it cannot outlive the GIL token it was made with.
pub(crate) struct WritableBuffer<'py> {
    view: Box<ffi::Py_buffer>,
    _gil: PhantomData<Python<'py>>,
}

impl<'py> WritableBuffer<'py> {
    pub(crate) fn get(obj: &Bound<'py, PyAny>) -> PyResult<WritableBuffer<'py>> {
        let mut view = Box::new(ffi::Py_buffer::new());
        // SAFETY: `view` is ours to fill; released in Drop.
        if unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, ffi::PyBUF_WRITABLE) } < 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        Ok(WritableBuffer { view, _gil: PhantomData })
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.view.len.max(0) as usize
    }

    /// The memory from byte `offset` on (none past the end).
    #[inline]
    pub(crate) fn plaintext_from(&self, offset: usize) -> Plaintext<'_> {
        let len = self.len().saturating_sub(offset);
        if self.view.buf.is_null() || len == 0 {
            return Plaintext { ptr: std::ptr::NonNull::dangling().as_ptr(), len: 0, _mem: PhantomData };
        }
        // The exporter keeps `len()` writable, contiguous bytes at `buf`
        // until the buffer is released (PyBUF_WRITABLE without strides asks
        // for exactly that); `offset` is within them.
        Plaintext { ptr: (self.view.buf as *mut u8).wrapping_add(offset), len, _mem: PhantomData }
    }
}

impl Drop for WritableBuffer<'_> {
    fn drop(&mut self) {
        // SAFETY: acquired by PyObject_GetBuffer; the 'py lifetime keeps the
        // value within the GIL's scope.
        unsafe { ffi::PyBuffer_Release(&mut *self.view) }
    }
}
