//! Whether the native TLS engine may run in this process: the proof that the
//! OpenSSL functions found in ossl.rs are the ones CPython's `_ssl` calls,
//! computed once and cached with its reason (`verdict`):
//! - `_ssl` is a shared object of its own (not built into the interpreter),
//!   found already loaded;
//! - each function resolves from `_ssl`'s handle, and where the global
//!   scope (searched first by the dynamic linker for `_ssl`'s own
//!   references) defines the name too, to the same address;
//! - `OpenSSL_version_num()` through those pointers equals
//!   `ssl.OPENSSL_VERSION_NUMBER`, and is 3.0 or newer (the error codes,
//!   EOF semantics and memory-BIO seeking below are OpenSSL 3's);
//! - the error codes this module hard-codes equal the ones `_ssl` was built
//!   with (its `err_codes_to_names` / `lib_codes_to_names` tables, read from
//!   its module state, and `ssl.SSL_ERROR_*`);
//! - a memory BIO can be consumed by seeking (probed on a private BIO), else
//!   output is consumed by reading it out.

use std::ffi::{c_char, c_int, c_void, CString};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyTuple;

use super::layout;
use super::ossl::*;

/// Whether the engine may run in this process, and why (or why not).
pub(crate) struct Verdict {
    pub(crate) fns: Option<Fns>,
    pub(crate) reason: String,
    /// Output can be consumed by seeking the memory BIO (no copy).
    pub(crate) bio_seek: bool,
}

static VERDICT: PyOnceLock<Verdict> = PyOnceLock::new();

/// The process's verdict, computed on first use (and logged to asyncio's
/// logger at debug level).
pub(crate) fn verdict(py: Python<'_>) -> &'static Verdict {
    VERDICT.get_or_init(py, || {
        let v = match compute(py) {
            Ok((fns, reason)) => {
                let bio_seek = probe_bio_seek(&fns);
                Verdict { fns: Some(fns), reason, bio_seek }
            }
            Err(reason) => Verdict { fns: None, reason, bio_seek: false },
        };
        if let Ok(logger) = py.import("logging").and_then(|l| l.call_method1("getLogger", ("asyncio",))) {
            let state = if v.fns.is_some() { "native" } else { "not native (asyncio's sslproto)" };
            let _ = logger.call_method1("debug", ("zuvrs TLS engine: %s: %s", state, v.reason.as_str()));
        }
        v
    })
}

fn compute(py: Python<'_>) -> Result<(Fns, String), String> {
    if cfg!(any(PyPy, GraalPy, Py_GIL_DISABLED)) {
        return Err("not CPython with the GIL: _ssl's object layouts are only verified there".into());
    }
    let pyerr = |e: PyErr| format!("cannot inspect _ssl: {e}");
    let ssl_mod = py.import("_ssl").map_err(pyerr)?;
    let file: String = match ssl_mod.getattr("__file__") {
        Ok(f) => f.extract().map_err(pyerr)?,
        Err(_) => return Err("_ssl is built into the interpreter: the OpenSSL it uses cannot be told apart".into()),
    };
    let cfile = CString::new(file.clone()).map_err(|_| "_ssl's path has a NUL byte".to_string())?;
    // SAFETY: RTLD_NOLOAD only returns a handle to an object already loaded
    // (adding a reference, which is kept: the functions are used for the
    // life of the process); no constructor runs.
    let handle = unsafe { libc::dlopen(cfile.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if handle.is_null() {
        return Err(format!("{file} is not loaded under that name"));
    }
    let mut libs = Vec::new();
    let fns = Fns::resolve(handle, &mut libs)?;

    // SAFETY: a plain function of the verified library.
    let ours = unsafe { (fns.OpenSSL_version_num)() } as u64;
    let theirs: u64 =
        py.import("ssl").and_then(|m| m.getattr("OPENSSL_VERSION_NUMBER")).and_then(|v| v.extract()).map_err(pyerr)?;
    if ours != theirs {
        return Err(format!("OpenSSL_version_num() is {ours:#x} but ssl.OPENSSL_VERSION_NUMBER is {theirs:#x}"));
    }
    if ours < 0x3000_0000 {
        return Err(format!("OpenSSL {ours:#x} is older than 3.0 (only OpenSSL 3's behaviour is mirrored)"));
    }
    check_constants(py).map_err(|e| match e {
        Constants::Differ(s) => s,
        Constants::Py(e) => pyerr(e),
    })?;
    let version: String =
        py.import("ssl").and_then(|m| m.getattr("OPENSSL_VERSION")).and_then(|v| v.extract()).map_err(pyerr)?;
    Ok((
        fns,
        format!(
            "{} OpenSSL functions resolve through {file} to {} ({version}, {ours:#x})",
            FUNCTION_NAMES.len(),
            libs.join(", ")
        ),
    ))
}

enum Constants {
    Differ(String),
    Py(PyErr),
}

impl From<PyErr> for Constants {
    fn from(e: PyErr) -> Self {
        Constants::Py(e)
    }
}

/// The codes this module hard-codes, against the ones `_ssl` was built with.
fn check_constants(py: Python<'_>) -> Result<(), Constants> {
    let types = layout::types(py)?;
    let Some(tables) = &types.tables else {
        return Err(Constants::Differ(types.unusable.clone().unwrap_or_default()));
    };
    let names = tables.err_codes_to_names.bind(py);
    for (reason, code) in [
        ("CERTIFICATE_VERIFY_FAILED", SSL_R_CERTIFICATE_VERIFY_FAILED),
        ("UNEXPECTED_EOF_WHILE_READING", SSL_R_UNEXPECTED_EOF_WHILE_READING),
    ] {
        let key = PyTuple::new(py, [ERR_LIB_SSL, code])?;
        let got: Option<String> = names.get_item(key)?.map(|v| v.extract()).transpose()?;
        if got.as_deref() != Some(reason) {
            return Err(Constants::Differ(format!("_ssl names error ({ERR_LIB_SSL}, {code}) {got:?}, not {reason}")));
        }
    }
    let libs = tables.lib_codes_to_names.bind(py);
    for (code, name) in [(ERR_LIB_SSL, "SSL"), (ERR_LIB_SYS, "SYS")] {
        let got: Option<String> = libs.get_item(code)?.map(|v| v.extract()).transpose()?;
        if got.as_deref() != Some(name) {
            return Err(Constants::Differ(format!("_ssl names library {code} {got:?}, not {name}")));
        }
    }
    let ssl = py.import("ssl")?;
    for (name, code) in [
        ("SSL_ERROR_SSL", SSL_ERROR_SSL),
        ("SSL_ERROR_WANT_READ", SSL_ERROR_WANT_READ),
        ("SSL_ERROR_WANT_WRITE", SSL_ERROR_WANT_WRITE),
        ("SSL_ERROR_WANT_X509_LOOKUP", SSL_ERROR_WANT_X509_LOOKUP),
        ("SSL_ERROR_SYSCALL", SSL_ERROR_SYSCALL),
        ("SSL_ERROR_ZERO_RETURN", SSL_ERROR_ZERO_RETURN),
        ("SSL_ERROR_WANT_CONNECT", SSL_ERROR_WANT_CONNECT),
        ("SSL_ERROR_EOF", PY_SSL_ERROR_EOF),
        ("SSL_ERROR_INVALID_ERROR_CODE", PY_SSL_ERROR_INVALID_ERROR_CODE),
    ] {
        let got: c_int = ssl.getattr(name)?.extract()?;
        if got != code {
            return Err(Constants::Differ(format!("ssl.{name} is {got}, not {code}")));
        }
    }
    Ok(())
}

/// Whether seeking a memory BIO past n bytes consumes them, as OpenSSL 3's
/// mem BIO does (`BIO_seek` moves its read pointer; the next write
/// compacts). Probed on a private BIO: write "abcdef", seek 2 further, then
/// expect "cdef" pending, and "cdefgh" after writing "gh".
fn probe_bio_seek(f: &Fns) -> bool {
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
