//! The unsafe edge to the operating system (libc): sockets, socket
//! addresses, file descriptors, epoll, processes.
//!
//! Everything here is a safe function or a safe owner type over a libc call;
//! the rest of the crate calls libc only through this module. Each section
//! belongs to the layer that uses it.

// ---- section: name resolution and socket set-up (net) ----

// ---- end of section: net ----

// ---- section: fd watchers and process (eventloop) ----

// ---- end of section: eventloop ----

// ---- section: datagram and stream sockets (transport) ----

// ---- end of section: transport ----

// ---- section: searching bytes (streams) ----

/// Where `needle` first occurs in `hay` (libc's memchr for one byte,
/// memmem for more): several times faster than a byte loop on long lines.
pub(crate) fn find_bytes(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    if hay.len() < needle.len() {
        return None;
    }
    // SAFETY: both are live slices of the lengths given; the result is null
    // or points into `hay`.
    let at = unsafe {
        if needle.len() == 1 {
            libc::memchr(hay.as_ptr().cast(), needle[0] as i32, hay.len()) as *const u8
        } else {
            libc::memmem(hay.as_ptr().cast(), hay.len(), needle.as_ptr().cast(), needle.len()) as *const u8
        }
    };
    (!at.is_null()).then(|| at as usize - hay.as_ptr() as usize)
}

// ---- end of section: streams ----
