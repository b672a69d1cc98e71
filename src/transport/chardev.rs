//! Reads for pipe transports.
//!
//! `os.read(fd, max_size)` allocates a `max_size` bytes object for every read
//! and shrinks it afterwards (a 256 KiB malloc, mremap and free per read);
//! reading into a scratch buffer and copying exactly what arrived costs a
//! fraction of that. (UDP transports read natively in udp.rs.)

use std::cell::RefCell;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::transport::readbuf::READ_SIZE as MAX_READ;

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = RefCell::new(vec![0; MAX_READ]);
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
                let errno = crate::errors::last_errno();
                if errno == libc::EINTR {
                    py.check_signals()?;
                    continue;
                }
                return Err(crate::errors::os_error(errno));
            }
            return Ok(PyBytes::new(py, &buf[..n as usize]));
        }
    })
}
