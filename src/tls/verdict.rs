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

use std::ffi::c_int;

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
                let bio_seek = fns.probe_bio_seek();
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
    let (fns, libs) = Fns::resolve(&file)?;

    let ours = fns.openssl_version_num();
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
    let tables = match &layout::types(py)?.layouts {
        Ok(layouts) => layouts.tables(),
        Err(why) => return Err(Constants::Differ(why.clone())),
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
