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

#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_char, c_int, c_long, c_ulong, c_void, CStr};

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
pub(crate) const SSL_MODE_ENABLE_PARTIAL_WRITE: c_long = 0x1;
pub(crate) const SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER: c_long = 0x2;
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
        /// The OpenSSL functions the engine calls, as `_ssl` sees them.
        pub(crate) struct Fns {
            $(pub(crate) $name: unsafe extern "C" fn($($arg),*) -> $ret,)*
        }

        impl Fns {
            /// Resolves every function through `handle` (see verdict.rs
            /// for the rules), or says which one failed and why.
            pub(super) fn resolve(handle: *mut c_void, libs: &mut Vec<String>) -> Result<Fns, String> {
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

/// Looks `name` up from `_ssl`'s handle; refuses a name `_ssl` cannot see
/// or that the global scope defines differently. Records the library path.
fn lookup(handle: *mut c_void, name: &'static str, libs: &mut Vec<String>) -> Result<*mut c_void, String> {
    let shown = &name[..name.len() - 1];
    // SAFETY: `handle` is a live dlopen handle; `name` is NUL-terminated.
    let local = unsafe { libc::dlsym(handle, name.as_ptr() as *const c_char) };
    if local.is_null() {
        return Err(format!("_ssl does not resolve {shown} (no shared OpenSSL behind it)"));
    }
    // SAFETY: as above; RTLD_DEFAULT searches the global scope.
    let global = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr() as *const c_char) };
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
