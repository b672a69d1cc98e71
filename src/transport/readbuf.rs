//! The buffer reads land in: one per thread, shared by every transport of
//! the loop running there (libuv asks for memory just before each read and
//! reports the read at once, so one suffices).
//!
//! It is a `bytes` object of `READ_SIZE`, filled in place while nobody else
//! references it (capi.rs keeps it: `with_read_buffer`; libuv reads into it
//! through `ReadInto::ReadBuffer`). A read that fills it (bulk transfers) is
//! handed to `data_received` without a copy; if the protocol kept no
//! reference (asyncio's StreamReader copies what it gets), the same object
//! serves the next read. Besides a copy this saves a large allocation per
//! read, which glibc serves by growing and trimming the heap: page faults
//! that cost more than the copy. Shorter reads are copied into an exactly
//! sized `bytes`.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::capi::transport::{with_read_buffer, FillBytes};

/// The most one read takes (asyncio's `max_size` for sockets, pipes and
/// datagrams).
pub(crate) const READ_SIZE: usize = 256 * 1024;

/// `f` on the buffer, made first if needed (None when out of memory).
#[inline]
fn with_buffer<R>(py: Python<'_>, f: impl FnOnce(&mut FillBytes) -> R) -> Option<R> {
    with_read_buffer(|slot| {
        if slot.is_none() {
            *slot = Some(FillBytes::new(py, READ_SIZE).ok()?);
        }
        slot.as_mut().map(f)
    })
}

/// Memory for the next read: READ_SIZE bytes, or None when out of memory
/// (an opaque pointer, for code that hands it to a C library itself).
pub(crate) fn memory(py: Python<'_>) -> Option<*mut u8> {
    with_buffer(py, |b| b.as_mut_slice().as_mut_ptr())
}

/// `f` on the buffer's READ_SIZE bytes, to fill them (None when out of
/// memory). `f` must not use the buffer otherwise.
pub(crate) fn with_memory<R>(py: Python<'_>, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
    with_buffer(py, |b| f(b.as_mut_slice()))
}

/// `f` on the first `n` bytes the last read put in the buffer (None when
/// there is no buffer).
pub(crate) fn filled<R>(n: usize, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
    with_read_buffer(|slot| {
        let all = slot.as_ref()?.as_slice();
        Some(f(&all[..n.min(all.len())]))
    })
}

/// A copy of the first `n` bytes the last read put in the buffer.
pub(crate) fn copy<'py>(py: Python<'py>, n: usize) -> Bound<'py, PyBytes> {
    with_read_buffer(|slot| match slot {
        Some(b) => PyBytes::new(py, &b.as_slice()[..n]),
        None => PyBytes::new(py, &[]),
    })
}

/// What the last read put in the buffer, as a `bytes` of its own: the
/// buffer itself when the read filled it.
pub(crate) fn take(py: Python<'_>, n: usize) -> Option<Bound<'_, PyBytes>> {
    if n < READ_SIZE {
        return with_read_buffer(|slot| slot.as_ref().map(|b| PyBytes::new(py, &b.as_slice()[..n])));
    }
    with_read_buffer(|slot| slot.take()).map(|b| b.into_bytes(py))
}

/// Takes back a full read's `bytes` once the protocol is done with it, if
/// nobody else holds it.
pub(crate) fn give_back(bytes: Bound<'_, PyBytes>) {
    let Some(buffer) = FillBytes::reclaim(bytes, READ_SIZE) else { return };
    let unused = with_read_buffer(|slot| if slot.is_none() { slot.replace(buffer) } else { Some(buffer) });
    drop(unused);
}
