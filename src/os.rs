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

/// The transports' socket calls: a datagram socket's sends and receives,
/// and the write side's shutdown of a stream. Each returns the errno of a
/// failure; the fds are borrowed, never closed.
pub(crate) mod transport {
    use std::os::fd::{AsRawFd, BorrowedFd, RawFd};

    use crate::errors::last_errno;
    use crate::net::addr::SockAddr;

    /// The room in a `SockAddr` (a `sockaddr_storage`).
    const ADDR_ROOM: libc::socklen_t = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;

    /// The count a call returned, or its errno.
    #[inline]
    fn count(n: isize) -> Result<usize, i32> {
        if n < 0 {
            Err(last_errno())
        } else {
            Ok(n as usize)
        }
    }

    /// `send(2)` of `data` on a connected socket: the bytes sent.
    #[inline]
    pub(crate) fn send(fd: RawFd, data: &[u8]) -> Result<usize, i32> {
        // SAFETY: the kernel reads at most data.len() bytes of data.
        count(unsafe { libc::send(fd, data.as_ptr() as *const libc::c_void, data.len(), 0) })
    }

    /// `sendto(2)` of `data` to `addr`: the bytes sent.
    #[inline]
    pub(crate) fn sendto(fd: RawFd, data: &[u8], addr: &SockAddr) -> Result<usize, i32> {
        let to = addr.bytes();
        // SAFETY: the kernel reads at most data.len() bytes of data and
        // to.len() of the address (it copies them, alignment aside).
        count(unsafe {
            libc::sendto(
                fd,
                data.as_ptr() as *const libc::c_void,
                data.len(),
                0,
                to.as_ptr() as *const libc::sockaddr,
                to.len() as libc::socklen_t,
            )
        })
    }

    /// `recvfrom(2)` into `buf`, the sender's address into `from`: the
    /// bytes received.
    #[inline]
    pub(crate) fn recvfrom(fd: RawFd, buf: &mut [u8], from: &mut SockAddr) -> Result<usize, i32> {
        from.len = ADDR_ROOM;
        // SAFETY: the kernel writes at most buf.len() bytes to buf and
        // ADDR_ROOM to the address, a sockaddr_storage of that size.
        let n = unsafe {
            libc::recvfrom(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0, from.as_mut_ptr(), &mut from.len)
        };
        from.len = from.len.min(ADDR_ROOM);
        count(n)
    }

    /// `shutdown(2)` of a socket's write side (EOF for its peer).
    pub(crate) fn shutdown_write(fd: BorrowedFd<'_>) -> Result<(), i32> {
        // SAFETY: a plain system call on a live fd.
        if unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_WR) } < 0 {
            return Err(last_errno());
        }
        Ok(())
    }
}

// ---- end of section: transport ----
