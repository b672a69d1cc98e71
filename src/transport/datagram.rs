//! Reads for datagram and pipe transports.
//!
//! `socket.recvfrom(max_size)` allocates a `max_size` bytes object for every
//! datagram and shrinks it afterwards (a 256 KiB malloc, mremap and free per
//! packet); reading into a scratch buffer and copying exactly what arrived
//! costs a fraction of that.

use std::cell::RefCell;
use std::mem::MaybeUninit;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::dns::sockaddr_tuple;

const MAX_DATAGRAM: usize = 256 * 1024;

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = RefCell::new(vec![0; MAX_DATAGRAM]);
}

/// One datagram from an IPv4/IPv6 socket as (data, address), like
/// `sock.recvfrom(256 * 1024)`; OSError (BlockingIOError when none is
/// waiting) on failure.
#[pyfunction]
pub(crate) fn recv_datagram(py: Python<'_>, fd: i32) -> PyResult<(Bound<'_, PyBytes>, Py<PyAny>)> {
    SCRATCH.with(|buf| {
        let mut buf = buf.borrow_mut();
        let mut addr: libc::sockaddr_storage = unsafe { MaybeUninit::zeroed().assume_init() };
        let mut addrlen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        loop {
            // SAFETY: the buffer and address storage are ours and sized.
            let n = unsafe {
                libc::recvfrom(
                    fd,
                    buf.as_mut_ptr() as *mut _,
                    buf.len(),
                    0,
                    &mut addr as *mut _ as *mut libc::sockaddr,
                    &mut addrlen,
                )
            };
            if n < 0 {
                let err = std::io::Error::last_os_error();
                if err.raw_os_error() == Some(libc::EINTR) {
                    py.check_signals()?;
                    continue;
                }
                return Err(crate::errors::uv_error(-err.raw_os_error().unwrap_or(libc::EIO)));
            }
            let data = PyBytes::new(py, &buf[..n as usize]);
            let address = if addrlen == 0 {
                py.None()
            } else {
                match unsafe { sockaddr_tuple(py, &addr as *const _ as *const libc::sockaddr)? } {
                    Some(t) => t.into_any().unbind(),
                    None => py.None(),
                }
            };
            return Ok((data, address));
        }
    })
}

/// `os.read(fd, 256 * 1024)` without allocating 256 KiB for every read:
/// the bytes that arrived, copied from a scratch buffer (b"" at EOF).
#[pyfunction]
pub(crate) fn read_fd(py: Python<'_>, fd: i32) -> PyResult<Bound<'_, PyBytes>> {
    SCRATCH.with(|buf| {
        let mut buf = buf.borrow_mut();
        loop {
            // SAFETY: the buffer is ours and sized.
            let n = unsafe { libc::read(fd, buf.as_mut_ptr() as *mut _, buf.len()) };
            if n < 0 {
                let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
                if errno == libc::EINTR {
                    py.check_signals()?;
                    continue;
                }
                return Err(crate::errors::uv_error(-errno));
            }
            return Ok(PyBytes::new(py, &buf[..n as usize]));
        }
    })
}
