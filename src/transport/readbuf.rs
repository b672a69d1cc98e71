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
//! that cost more than the copy.
//!
//! A shorter read of at least `LEND_MIN` bytes (the last read of a bulk
//! transfer's burst) is handed out the same way, the buffer's length cut to
//! the read's in place (`FillBytes::cut`) and restored when it comes back.
//! A protocol that keeps such a `bytes` keeps all the buffer's memory, at
//! most READ_SIZE / LEND_MIN times what it holds: the transport then copies
//! short reads for it from then on (`Delivered::give_back`), so that costs
//! one buffer per transport at most. Shorter reads are copied into an
//! exactly sized `bytes`.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::capi::transport::{with_read_buffer, CutBytes, FillBytes};

/// The most one read takes (asyncio's `max_size` for sockets, pipes and
/// datagrams).
pub(crate) const READ_SIZE: usize = 256 * 1024;

/// The shortest read handed out in the buffer itself rather than copied.
pub(crate) const LEND_MIN: usize = READ_SIZE / 4;

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

/// What a read put in the buffer, as the `bytes` a protocol gets.
pub(crate) enum Delivered<'py> {
    /// The buffer itself, cut to the read's length.
    Lent(CutBytes<'py>),
    /// A copy.
    Copied(Bound<'py, PyBytes>),
}

impl<'py> Delivered<'py> {
    #[inline]
    pub(crate) fn bytes(&self) -> &Bound<'py, PyBytes> {
        match self {
            Delivered::Lent(cut) => cut.bytes(),
            Delivered::Copied(b) => b,
        }
    }

    /// Back once the protocol is done with it: the buffer serves the next
    /// read if nobody kept it. True if the protocol kept a short read's
    /// buffer (copy short reads for it from now on).
    pub(crate) fn give_back(self) -> bool {
        let Delivered::Lent(cut) = self else { return false };
        let short = cut.is_short();
        match cut.reclaim() {
            Ok(buffer) => {
                put_back(buffer);
                false
            }
            Err(_kept) => short,
        }
    }
}

/// Whether a read of `n` bytes is handed out in the buffer itself.
#[inline]
fn lends(n: usize, copy_short: bool) -> bool {
    n == READ_SIZE || (n >= LEND_MIN && !copy_short)
}

/// The buffer back in the thread's slot (dropped if another took its place).
fn put_back(buffer: FillBytes) {
    let unused = with_read_buffer(|slot| if slot.is_none() { slot.replace(buffer) } else { Some(buffer) });
    drop(unused);
}

/// What the last read (`n` bytes) put in the buffer, for a protocol: the
/// buffer itself when the read filled it or, unless `copy_short`, when it
/// holds at least LEND_MIN bytes; otherwise a copy.
pub(crate) fn deliver(py: Python<'_>, n: usize, copy_short: bool) -> Option<Delivered<'_>> {
    if !lends(n, copy_short) {
        return with_read_buffer(|slot| slot.as_ref().map(|b| Delivered::Copied(PyBytes::new(py, &b.as_slice()[..n]))));
    }
    with_read_buffer(|slot| slot.take()).map(|b| Delivered::Lent(b.cut(py, n)))
}

/// What a read put in `buffer` (the read buffer, taken out whole with
/// `take_whole`, its first `n` bytes filled), for a protocol, handed out as
/// `deliver` does; a buffer not handed out goes back.
pub(crate) fn deliver_taken<'py>(
    py: Python<'py>,
    buffer: Bound<'py, PyBytes>,
    n: usize,
    copy_short: bool,
) -> Delivered<'py> {
    if !lends(n, copy_short) {
        let data = PyBytes::new(py, &buffer.as_bytes()[..n]);
        give_back(buffer);
        return Delivered::Copied(data);
    }
    match FillBytes::reclaim(buffer, READ_SIZE) {
        Ok(filled) => Delivered::Lent(filled.cut(py, n)),
        // (Not the read buffer alone: handed out as it is, a copy.)
        Err(other) => Delivered::Copied(PyBytes::new(py, &other.as_bytes()[..n])),
    }
}

/// The buffer itself, whole, as a `bytes` of its own (None when there is
/// none).
pub(crate) fn take_whole(py: Python<'_>) -> Option<Bound<'_, PyBytes>> {
    with_read_buffer(|slot| slot.take()).map(|b| b.into_bytes(py))
}

/// Takes back a full read's `bytes` once the protocol is done with it, if
/// nobody else holds it.
pub(crate) fn give_back(bytes: Bound<'_, PyBytes>) {
    if let Ok(buffer) = FillBytes::reclaim(bytes, READ_SIZE) {
        put_back(buffer);
    }
}
