//! The stdlib's exceptions, built natively.
//!
//! A failed OpenSSL call raises what `_ssl`'s `PySSL_SetError` and
//! `fill_and_set_sslerror` would have raised for the same call on the same
//! `SSL *`: the class from `SSL_get_error` and the last queued error
//! (`SSLZeroReturnError`, `SSLWantReadError`, `SSLWantWriteError`,
//! `SSLSyscallError`, `SSLEOFError`, `SSLCertVerificationError`, `SSLError`,
//! or `OSError`), `args == (ssl_errno, message)`, `library` and `reason`
//! looked up in `_ssl.lib_codes_to_names` / `err_codes_to_names`,
//! `verify_code` / `verify_message` (with `_ssl`'s hostname and IP address
//! mismatch wording) for a failed verification, and an exception that a
//! callback parked on the `_SSLSocket` chained as `__context__`.
//!
//! The message ends in `(_ssl.c:NNN)`, the line of `_ssl.c` that raised it.
//! Each of do_handshake / read / write / shutdown raises from one line; the
//! lines are learnt once per process, on the first error, from the stdlib
//! itself (a throw-away client SSLObject raising SSLWantReadError from each
//! method, and SSLError from `unwrap()` before its handshake), so messages
//! match the stdlib's exactly.
//!
//! Differences between Python versions, as in their `_ssl.c`:
//! - 3.10: SSL_ERROR_SYSCALL with a queued CERTIFICATE_VERIFY_FAILED is a
//!   plain SSLError (3.11+: SSLCertVerificationError).
//! - 3.10 to 3.12: SSL_ERROR_SYSCALL with an empty queue is SSLEOFError
//!   when the call returned 0 (SSL_read_ex / SSL_write_ex always do), else
//!   SSLSyscallError ("Some I/O error occurred"); 3.13+: `OSError(errno)`
//!   when errno is set, else SSLEOFError.
//! - 3.14: errors of library SYS are `OSError(reason)`; a missing reason
//!   string reads "unknown error (0x...)" and a verify message is appended
//!   even when the reason has no name.
//! - All (OpenSSL 3): UNEXPECTED_EOF_WHILE_READING is SSLEOFError
//!   ("EOF occurred in violation of protocol", errno SSL_ERROR_EOF).

use std::borrow::Cow;
use std::ffi::{c_int, c_long, c_ulong, CStr};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple};

use super::layout::{self, Tables};
use super::ossl::*;

/// The `_SSLSocket` method whose C implementation the call replaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Handshake = 0,
    Read = 1,
    Write = 2,
    Shutdown = 3,
}

/// What a failed call left: its return value as `_ssl` passes it on,
/// `SSL_get_error`'s verdict and errno, both taken right after the call.
pub(crate) struct Failure {
    pub(crate) op: Op,
    /// Read up to 3.12 only (3.13's PySSL_SetError dropped it).
    #[cfg_attr(Py_3_13, allow(dead_code))]
    pub(crate) ret: c_int,
    pub(crate) ssl_error: c_int,
    /// Read from 3.13 on only.
    #[cfg_attr(not(Py_3_13), allow(dead_code))]
    pub(crate) errno: c_int,
}

/// The stdlib's exception classes and tables.
struct Classes {
    ssl_error: Py<PyAny>,
    cert_verification: Py<PyAny>,
    zero_return: Py<PyAny>,
    want_read: Py<PyAny>,
    want_write: Py<PyAny>,
    syscall: Py<PyAny>,
    eof: Py<PyAny>,
    tables: &'static Tables,
}

static CLASSES: PyOnceLock<Classes> = PyOnceLock::new();
static LINES: PyOnceLock<[u32; 4]> = PyOnceLock::new();

fn classes(py: Python<'_>) -> PyResult<&'static Classes> {
    CLASSES.get_or_try_init(py, || {
        let ssl = py.import("ssl")?;
        let get = |n: &str| ssl.getattr(n).map(Bound::unbind);
        let tables = layout::types(py)?
            .layouts
            .as_ref()
            .map(Layouts::tables)
            .map_err(|_| pyo3::exceptions::PyRuntimeError::new_err("_ssl's error tables are unusable"))?;
        Ok(Classes {
            ssl_error: get("SSLError")?,
            cert_verification: get("SSLCertVerificationError")?,
            zero_return: get("SSLZeroReturnError")?,
            want_read: get("SSLWantReadError")?,
            want_write: get("SSLWantWriteError")?,
            syscall: get("SSLSyscallError")?,
            eof: get("SSLEOFError")?,
            tables,
        })
    })
}

const PROBE: &CStr = c"
def probe():
    import re, ssl
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    def line(call):
        obj = ctx.wrap_bio(ssl.MemoryBIO(), ssl.MemoryBIO())
        try:
            call(obj)
        except ssl.SSLError as e:
            m = re.search(r'\\(_ssl\\.c:(\\d+)\\)$', str(e))
            return int(m.group(1)) if m else 0
        return 0
    return [line(lambda o: o.do_handshake()), line(lambda o: o.read(1)),
            line(lambda o: o.write(b'x')), line(lambda o: o.unwrap())]
";

/// The `_ssl.c` line each operation raises from (0 where unknown).
fn lines(py: Python<'_>) -> [u32; 4] {
    *LINES.get_or_init(py, || {
        let learn = || -> PyResult<[u32; 4]> {
            let globals = PyDict::new(py);
            py.run(PROBE, Some(&globals), None)?;
            let got: Vec<u32> = globals.get_item("probe")?.expect("defined").call0()?.extract()?;
            Ok([got[0], got[1], got[2], got[3]])
        };
        learn().unwrap_or([0; 4])
    })
}

/// `PySSL_ChainExceptions`: the parked exception becomes the `__context__`
/// of `err`.
fn chain(py: Python<'_>, err: PyErr, parked: Option<PyErr>) -> PyErr {
    if parked.is_some() {
        err.set_context(py, parked);
    }
    err
}

/// The exception `_ssl` raises for `f` on this connection (and clears
/// OpenSSL's error queue, as `_ssl` does).
pub(crate) fn failure(py: Python<'_>, conn: &Conn, f: Failure) -> PyErr {
    let fns = conn.fns();
    let e: c_ulong = fns.err_peek_last_error();
    let (lib, reason) = (err_get_lib(e), err_get_reason(e));
    let c = match classes(py) {
        Ok(c) => c,
        Err(err) => return err,
    };
    let mut ty = &c.ssl_error;
    let mut errstr: Option<Cow<'static, str>> = None;
    let mut p: c_int;
    match f.ssl_error {
        SSL_ERROR_ZERO_RETURN => {
            errstr = Some("TLS/SSL connection has been closed (EOF)".into());
            ty = &c.zero_return;
            p = SSL_ERROR_ZERO_RETURN;
        }
        SSL_ERROR_WANT_READ => {
            errstr = Some("The operation did not complete (read)".into());
            ty = &c.want_read;
            p = SSL_ERROR_WANT_READ;
        }
        SSL_ERROR_WANT_WRITE => {
            errstr = Some("The operation did not complete (write)".into());
            ty = &c.want_write;
            p = SSL_ERROR_WANT_WRITE;
        }
        SSL_ERROR_WANT_X509_LOOKUP => {
            errstr = Some("The operation did not complete (X509 lookup)".into());
            p = SSL_ERROR_WANT_X509_LOOKUP;
        }
        SSL_ERROR_WANT_CONNECT => {
            errstr = Some("The operation did not complete (connect)".into());
            p = SSL_ERROR_WANT_CONNECT;
        }
        SSL_ERROR_SYSCALL => {
            if e == 0 {
                #[cfg(not(Py_3_13))]
                {
                    // An SSLObject has no socket: only `ret` decides.
                    if f.ret == 0 {
                        p = PY_SSL_ERROR_EOF;
                        ty = &c.eof;
                        errstr = Some("EOF occurred in violation of protocol".into());
                    } else {
                        p = SSL_ERROR_SYSCALL;
                        ty = &c.syscall;
                        errstr = Some("Some I/O error occurred".into());
                    }
                }
                #[cfg(Py_3_13)]
                {
                    fns.err_clear_error();
                    if f.errno != 0 {
                        return os_error(py, f.errno);
                    }
                    p = PY_SSL_ERROR_EOF;
                    ty = &c.eof;
                    errstr = Some("EOF occurred in violation of protocol".into());
                }
            } else {
                #[cfg(Py_3_11)]
                if lib == ERR_LIB_SSL && reason == SSL_R_CERTIFICATE_VERIFY_FAILED {
                    ty = &c.cert_verification;
                }
                #[cfg(Py_3_14)]
                if lib == ERR_LIB_SYS {
                    return os_error(py, reason);
                }
                p = SSL_ERROR_SYSCALL;
            }
        }
        SSL_ERROR_SSL => {
            p = SSL_ERROR_SSL;
            if e == 0 {
                errstr = Some("A failure in the SSL library occurred".into());
            }
            if lib == ERR_LIB_SSL && reason == SSL_R_CERTIFICATE_VERIFY_FAILED {
                ty = &c.cert_verification;
            }
            if lib == ERR_LIB_SSL && reason == SSL_R_UNEXPECTED_EOF_WHILE_READING {
                p = PY_SSL_ERROR_EOF;
                ty = &c.eof;
                errstr = Some("EOF occurred in violation of protocol".into());
            }
            #[cfg(Py_3_14)]
            if lib == ERR_LIB_SYS {
                return os_error(py, reason);
            }
        }
        _ => {
            p = PY_SSL_ERROR_INVALID_ERROR_CODE;
            errstr = Some("Invalid error code".into());
        }
    }
    let is_verify = ty.is(&c.cert_verification);
    let verify_code: c_long = if is_verify { conn.get_verify_result(py) } else { 0 };
    let line = lines(py)[f.op as usize];
    let sslsock = conn.sslsock().bind(py);
    let err =
        fill(py, fns, c, ty, p, errstr, line, e, is_verify.then_some(verify_code), sslsock).unwrap_or_else(|err| err);
    fns.err_clear_error();
    chain(py, err, conn.take_parked(py))
}

/// `fill_and_set_sslerror`.
#[allow(clippy::too_many_arguments)]
fn fill(
    py: Python<'_>,
    fns: &Fns,
    c: &Classes,
    ty: &Py<PyAny>,
    p: c_int,
    mut errstr: Option<Cow<'static, str>>,
    line: u32,
    e: c_ulong,
    verify_code: Option<c_long>,
    sslsock: &Bound<'_, PyAny>,
) -> PyResult<PyErr> {
    let mut reason_obj: Option<Bound<'_, PyAny>> = None;
    let mut lib_obj: Option<Bound<'_, PyAny>> = None;
    if e != 0 {
        let (lib, reason) = (err_get_lib(e), err_get_reason(e));
        reason_obj = c.tables.err_codes_to_names.bind(py).get_item(PyTuple::new(py, [lib, reason])?)?;
        lib_obj = c.tables.lib_codes_to_names.bind(py).get_item(lib)?;
        if errstr.is_none() {
            errstr = fns.err_reason_error_string(e).map(Cow::Owned);
        }
    }
    #[cfg(not(Py_3_14))]
    let errstr: Cow<'static, str> = errstr.unwrap_or(Cow::Borrowed("unknown error"));
    #[cfg(Py_3_14)]
    let errstr: Cow<'static, str> = errstr.unwrap_or_else(|| Cow::Owned(format!("unknown error ({e:#x})")));

    let verify_obj: Option<Bound<'_, PyAny>> = match verify_code {
        None => None,
        Some(code) => Some(match code {
            X509_V_ERR_HOSTNAME_MISMATCH | X509_V_ERR_IP_ADDRESS_MISMATCH => {
                let host = sslsock.getattr("server_hostname")?.str()?;
                let what = if code == X509_V_ERR_HOSTNAME_MISMATCH { "Hostname" } else { "IP address" };
                format!("{what} mismatch, certificate is not valid for '{host}'.").into_pyobject(py)?.into_any()
            }
            _ => match fns.x509_verify_cert_error_string(code) {
                Some(s) => s.into_pyobject(py)?.into_any(),
                None => py.None().into_bound(py),
            },
        }),
    };

    let s = |o: &Bound<'_, PyAny>| -> PyResult<String> { Ok(o.str()?.to_string()) };
    #[cfg(not(Py_3_14))]
    let msg = match (&verify_obj, &reason_obj, &lib_obj) {
        (Some(v), Some(r), Some(l)) => format!("[{}: {}] {errstr}: {} (_ssl.c:{line})", s(l)?, s(r)?, s(v)?),
        (_, Some(r), Some(l)) => format!("[{}: {}] {errstr} (_ssl.c:{line})", s(l)?, s(r)?),
        (_, None, Some(l)) => format!("[{}] {errstr} (_ssl.c:{line})", s(l)?),
        _ => format!("{errstr} (_ssl.c:{line})"),
    };
    #[cfg(Py_3_14)]
    let msg = {
        let mut m = String::new();
        if let Some(l) = &lib_obj {
            m.push('[');
            m.push_str(&s(l)?);
            if let Some(r) = &reason_obj {
                m.push_str(": ");
                m.push_str(&s(r)?);
            }
            m.push_str("] ");
        }
        m.push_str(&errstr);
        if let Some(v) = &verify_obj {
            m.push_str(": ");
            m.push_str(&s(v)?);
        }
        m.push_str(&format!(" (_ssl.c:{line})"));
        m
    };

    let value = ty.bind(py).call1((err_get_reason(p as c_ulong), msg))?;
    value.setattr("reason", reason_obj.unwrap_or_else(|| py.None().into_bound(py)))?;
    value.setattr("library", lib_obj.unwrap_or_else(|| py.None().into_bound(py)))?;
    if let Some(code) = verify_code {
        value.setattr("verify_code", code)?;
        value.setattr("verify_message", verify_obj.unwrap_or_else(|| py.None().into_bound(py)))?;
    }
    Ok(PyErr::from_value(value))
}

/// `SSLError(message)`, as `PyErr_SetString(PySSLErrorObject, message)`.
pub(crate) fn plain_ssl_error(py: Python<'_>, message: &str) -> PyErr {
    match classes(py) {
        Ok(c) => match c.ssl_error.bind(py).call1((message,)) {
            Ok(v) => PyErr::from_value(v),
            Err(e) => e,
        },
        Err(e) => e,
    }
}

/// Whether asyncio's sslproto treats `err` as "try again later"
/// (`SSLAgainErrors = (SSLWantReadError, SSLSyscallError)`).
#[allow(dead_code)] // for the TLS transport
pub(crate) fn is_again(py: Python<'_>, err: &PyErr) -> bool {
    match classes(py) {
        Ok(c) => {
            let v = err.value(py);
            v.is_instance(c.want_read.bind(py)).unwrap_or(false) || v.is_instance(c.syscall.bind(py)).unwrap_or(false)
        }
        Err(_) => false,
    }
}
