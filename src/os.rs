//! The unsafe edge to the operating system (libc): sockets, socket
//! addresses, file descriptors, epoll, processes.
//!
//! Everything here is a safe function or a safe owner type over a libc call;
//! the rest of the crate calls libc only through this module. Each section
//! belongs to the layer that uses it.

// ---- section: name resolution and socket set-up (net) ----

/// Socket addresses, TCP sockets, getaddrinfo result lists and errno text,
/// for `net` (which re-exports `SockAddr`) and the transports.
pub(crate) mod net {
    use std::ffi::{c_void, CStr};
    use std::marker::PhantomData;
    use std::mem::MaybeUninit;
    use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

    use crate::errors::last_errno;

    // The C library's address text conversions, which the libc crate does
    // not declare.
    extern "C" {
        fn inet_pton(af: libc::c_int, src: *const libc::c_char, dst: *mut c_void) -> libc::c_int;
        fn inet_ntop(
            af: libc::c_int,
            src: *const c_void,
            dst: *mut libc::c_char,
            size: libc::socklen_t,
        ) -> *const libc::c_char;
    }

    /// Longer than any IPv4 or IPv6 address text (INET6_ADDRSTRLEN is 46).
    pub(crate) const TEXT_MAX: usize = 64;

    /// The room in a `SockAddr`.
    const CAPACITY: libc::socklen_t = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;

    /// The socket address types a `SockAddr` can be viewed as.
    ///
    /// # Safety
    /// Implementors are plain C data valid for any bytes, no larger and no
    /// more aligned than `sockaddr_storage`.
    pub(crate) unsafe trait Family {}
    // SAFETY: a prefix of sockaddr_storage, plain C data.
    unsafe impl Family for libc::sockaddr_in {}
    // SAFETY: as above.
    unsafe impl Family for libc::sockaddr_in6 {}
    // SAFETY: as above.
    unsafe impl Family for libc::sockaddr_un {}

    /// A socket address as the kernel takes and gives it.
    #[derive(Clone, Copy)]
    pub(crate) struct SockAddr {
        /// Large enough for every family (a `sockaddr_in`, `sockaddr_in6`
        /// or `sockaddr_un` is a prefix).
        pub(super) storage: libc::sockaddr_storage,
        /// The address's length: never more than the storage (what reads
        /// `len` bytes from `storage` relies on it).
        pub(super) len: libc::socklen_t,
    }

    impl SockAddr {
        /// An empty address, ready for the kernel to fill (`len` is the room).
        #[inline]
        pub(crate) fn empty() -> Self {
            SockAddr {
                // SAFETY: plain C data, valid when zeroed.
                storage: unsafe { MaybeUninit::zeroed().assume_init() },
                len: CAPACITY,
            }
        }

        #[inline]
        pub(crate) fn as_ptr(&self) -> *const libc::sockaddr {
            &self.storage as *const libc::sockaddr_storage as *const libc::sockaddr
        }

        #[inline]
        pub(crate) fn as_mut_ptr(&mut self) -> *mut libc::sockaddr {
            &mut self.storage as *mut libc::sockaddr_storage as *mut libc::sockaddr
        }

        /// The address's length (at most the storage's size).
        #[inline]
        pub(crate) fn len(&self) -> libc::socklen_t {
            self.len
        }

        /// Sets the length (cut to the storage's size).
        #[inline]
        pub(crate) fn set_len(&mut self, len: usize) {
            self.len = len.min(CAPACITY as usize) as libc::socklen_t;
        }

        #[inline]
        pub(crate) fn family(&self) -> i32 {
            self.storage.ss_family as i32
        }

        /// Lets a system call (`recvfrom`, `accept`, ...) write an address:
        /// `f` gets the storage and its length, set to the room; the length
        /// it reports back is cut to the room.
        #[inline]
        pub(crate) fn fill<R>(&mut self, f: impl FnOnce(*mut libc::sockaddr, *mut libc::socklen_t) -> R) -> R {
            self.len = CAPACITY;
            let r = f(self.as_mut_ptr(), &mut self.len);
            self.len = self.len.min(CAPACITY);
            r
        }

        /// The bytes the kernel reported (for comparing two addresses).
        #[inline]
        pub(crate) fn bytes(&self) -> &[u8] {
            // (Cut again: the length is never trusted to fit.)
            let n = self.len.min(CAPACITY) as usize;
            // SAFETY: n is within the storage, which is plain bytes.
            unsafe { std::slice::from_raw_parts(self.as_ptr() as *const u8, n) }
        }

        /// The storage as a `sockaddr_in`, `sockaddr_in6` or `sockaddr_un`.
        #[inline]
        pub(crate) fn view<T: Family>(&self) -> &T {
            // SAFETY: every Family type is a prefix of the storage, alignment
            // included, and valid for any bytes.
            unsafe { &*(self.as_ptr() as *const T) }
        }

        #[inline]
        pub(crate) fn view_mut<T: Family>(&mut self) -> &mut T {
            // SAFETY: as view().
            unsafe { &mut *(self.as_mut_ptr() as *mut T) }
        }

        /// `sun_path` of the storage as bytes (all of it; the length says
        /// how much is the address).
        #[inline]
        pub(crate) fn sun_path(&self) -> &[u8] {
            let path = &self.view::<libc::sockaddr_un>().sun_path;
            // SAFETY: c_char and u8 have the same size; the array is in self.
            unsafe { std::slice::from_raw_parts(path.as_ptr() as *const u8, path.len()) }
        }
    }

    /// An address's text with a NUL after it, as `inet_pton` reads it.
    pub(crate) struct HostText([u8; TEXT_MAX]);

    impl HostText {
        /// None for a text too long for any address, or holding a NUL.
        #[inline]
        pub(crate) fn new(host: &str) -> Option<Self> {
            if host.len() >= TEXT_MAX || host.contains('\0') {
                return None;
            }
            let mut text = [0u8; TEXT_MAX];
            text[..host.len()].copy_from_slice(host.as_bytes());
            Some(HostText(text))
        }

        /// The IPv4 address `inet_pton` reads in the text, if any.
        #[inline]
        pub(crate) fn ipv4(&self) -> Option<libc::in_addr> {
            let mut a = libc::in_addr { s_addr: 0 };
            // SAFETY: the text is NUL-terminated; inet_pton writes at most
            // an in_addr for AF_INET.
            let rc = unsafe { inet_pton(libc::AF_INET, self.0.as_ptr() as *const _, &mut a as *mut _ as *mut c_void) };
            (rc == 1).then_some(a)
        }

        /// The IPv6 address `inet_pton` reads in the text, if any.
        #[inline]
        pub(crate) fn ipv6(&self) -> Option<libc::in6_addr> {
            let mut a = libc::in6_addr { s6_addr: [0; 16] };
            // SAFETY: as above, for an in6_addr.
            let rc = unsafe { inet_pton(libc::AF_INET6, self.0.as_ptr() as *const _, &mut a as *mut _ as *mut c_void) };
            (rc == 1).then_some(a)
        }
    }

    /// `f(text)` with an IPv6 address printed by `inet_ntop` into a buffer
    /// on the stack (no allocation); None if inet_ntop fails (errno says why).
    #[inline]
    pub(crate) fn with_ipv6_text<R>(addr: &libc::in6_addr, f: impl FnOnce(&str) -> R) -> Option<R> {
        let mut text = [0 as libc::c_char; TEXT_MAX];
        // SAFETY: addr is an in6_addr; text has room for its text and NUL.
        let p = unsafe {
            inet_ntop(libc::AF_INET6, addr as *const _ as *const c_void, text.as_mut_ptr(), TEXT_MAX as libc::socklen_t)
        };
        if p.is_null() {
            return None;
        }
        // SAFETY: inet_ntop wrote a NUL-terminated string into text.
        let host = unsafe { CStr::from_ptr(text.as_ptr()) };
        // inet_ntop prints ASCII only.
        Some(f(host.to_str().unwrap_or_default()))
    }

    /// A new non-blocking, close-on-exec TCP socket; the errno on failure.
    #[inline]
    pub(crate) fn tcp_socket(family: i32) -> Result<OwnedFd, i32> {
        // SAFETY: a plain system call.
        let fd = unsafe {
            libc::socket(family, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, libc::IPPROTO_TCP)
        };
        if fd < 0 {
            return Err(last_errno());
        }
        // SAFETY: a new descriptor nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// `connect(2)` of a socket to `addr`; the errno when not connected at
    /// once (EINPROGRESS for a non-blocking socket on its way).
    #[inline]
    pub(crate) fn connect(fd: BorrowedFd<'_>, addr: &SockAddr) -> Result<(), i32> {
        // SAFETY: the address is valid for its length.
        if unsafe { libc::connect(fd.as_raw_fd(), addr.as_ptr(), addr.len()) } == 0 {
            Ok(())
        } else {
            Err(last_errno())
        }
    }

    /// The pending error of a socket (`SO_ERROR`, 0 for none); the errno
    /// if it cannot be read.
    #[inline]
    pub(crate) fn socket_error(fd: RawFd) -> Result<i32, i32> {
        let mut err: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: err and len are valid for an int option.
        let rc = unsafe {
            libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_ERROR, &mut err as *mut _ as *mut c_void, &mut len)
        };
        if rc < 0 {
            Err(last_errno())
        } else {
            Ok(err)
        }
    }

    /// A socket's own address (`getsockname`) into `sa`; the errno on
    /// failure. (Filled in place: a `SockAddr` returned in a `Result` is
    /// copied once more.)
    #[inline]
    pub(crate) fn sock_name(fd: RawFd, sa: &mut SockAddr) -> Result<(), i32> {
        name_into(fd, sa, libc::getsockname)
    }

    /// A connected socket's peer address (`getpeername`) into `sa`; the
    /// errno on failure.
    #[inline]
    pub(crate) fn peer_name(fd: RawFd, sa: &mut SockAddr) -> Result<(), i32> {
        name_into(fd, sa, libc::getpeername)
    }

    /// `getsockname` or `getpeername` (`call`) into `sa`.
    #[inline]
    fn name_into(
        fd: RawFd,
        sa: &mut SockAddr,
        call: unsafe extern "C" fn(libc::c_int, *mut libc::sockaddr, *mut libc::socklen_t) -> libc::c_int,
    ) -> Result<(), i32> {
        // SAFETY: the storage is as large as the length says; both calls
        // write at most that much and report the length they wrote.
        let rc = sa.fill(|p, len| unsafe { call(fd, p, len) });
        if rc < 0 {
            Err(last_errno())
        } else {
            Ok(())
        }
    }

    /// Closes `fd`, which the caller owns and gives up (a connection handed
    /// over as a plain number, whose set-up failed).
    pub(crate) fn close_owned(fd: RawFd) {
        // SAFETY: the caller owns the descriptor and no one uses it after.
        drop(unsafe { OwnedFd::from_raw_fd(fd) });
    }

    /// A connection accepted on a listening socket, as a non-blocking,
    /// close-on-exec socket, its peer's address into `peer`; the errno on
    /// failure.
    #[inline]
    pub(crate) fn accept(fd: RawFd, peer: &mut SockAddr) -> Result<OwnedFd, i32> {
        // SAFETY: the storage is as large as the length says.
        let conn = peer.fill(|p, len| unsafe { libc::accept4(fd, p, len, libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) });
        if conn < 0 {
            return Err(last_errno());
        }
        // SAFETY: a new descriptor nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(conn) })
    }

    /// The nodes of a getaddrinfo result list, borrowed from its owner.
    pub(crate) struct AddrInfoNodes<'a> {
        next: *const libc::addrinfo,
        _list: PhantomData<&'a libc::addrinfo>,
    }

    impl AddrInfoNodes<'_> {
        /// # Safety
        /// `head` is null or the head of a list made by getaddrinfo, not
        /// freed while the nodes are borrowed.
        #[inline]
        pub(crate) unsafe fn new(head: *const libc::addrinfo) -> Self {
            AddrInfoNodes { next: head, _list: PhantomData }
        }
    }

    impl<'a> Iterator for AddrInfoNodes<'a> {
        type Item = AddrInfo<'a>;

        #[inline]
        fn next(&mut self) -> Option<AddrInfo<'a>> {
            // SAFETY: null or a node of the list (the contract of new()),
            // which outlives 'a.
            let node = unsafe { self.next.as_ref()? };
            self.next = node.ai_next;
            Some(AddrInfo(node))
        }
    }

    /// One node of a getaddrinfo result list.
    #[derive(Clone, Copy)]
    pub(crate) struct AddrInfo<'a>(&'a libc::addrinfo);

    impl<'a> AddrInfo<'a> {
        #[inline]
        pub(crate) fn family(&self) -> i32 {
            self.0.ai_family
        }

        #[inline]
        pub(crate) fn socktype(&self) -> i32 {
            self.0.ai_socktype
        }

        #[inline]
        pub(crate) fn protocol(&self) -> i32 {
            self.0.ai_protocol
        }

        /// The canonical name, when the node has one.
        #[inline]
        pub(crate) fn canonname(&self) -> Option<&'a CStr> {
            // SAFETY: a NUL-terminated string of the list, when not null.
            (!self.0.ai_canonname.is_null()).then(|| unsafe { CStr::from_ptr(self.0.ai_canonname) })
        }

        /// The node's address, copied (cut to a `SockAddr`'s room).
        #[inline]
        pub(crate) fn address(&self) -> SockAddr {
            let mut sa = SockAddr::empty();
            let len = (self.0.ai_addrlen as usize).min(CAPACITY as usize);
            if !self.0.ai_addr.is_null() {
                // SAFETY: ai_addr holds ai_addrlen bytes; the storage has room.
                unsafe { std::ptr::copy_nonoverlapping(self.0.ai_addr as *const u8, sa.as_mut_ptr() as *mut u8, len) };
            }
            sa.set_len(len);
            sa
        }
    }

    /// `strerror(errno)`: the C library's message for an errno.
    pub(crate) fn strerror(errno: i32) -> String {
        // SAFETY: strerror returns a valid C string for any errno, read
        // before any other call on this thread could change it.
        unsafe { CStr::from_ptr(libc::strerror(errno)) }.to_string_lossy().into_owned()
    }

    /// `gai_strerror(code)`: the C library's message for an EAI_* code.
    pub(crate) fn gai_strerror(code: i32) -> String {
        // SAFETY: gai_strerror returns a static string.
        unsafe { CStr::from_ptr(libc::gai_strerror(code)) }.to_string_lossy().into_owned()
    }
}

// ---- end of section: net ----

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

// ---- section: clocks, the fd watchers' epoll set, the process (eventloop) ----

/// The loop's libc calls: the monotonic clock (and the CPU's time-stamp
/// counter the stats clock reads), the process id a fork check compares,
/// and the private epoll set behind `add_reader` / `add_writer`.
pub(crate) mod eventloop {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

    use crate::errors::last_errno;

    /// `clock_gettime(CLOCK_MONOTONIC)`, the clock of `time.monotonic()`.
    #[inline(always)]
    pub(crate) fn monotonic_timespec() -> libc::timespec {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes the timespec we pass.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        ts
    }

    /// The CPU's time-stamp counter.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(crate) fn read_tsc() -> u64 {
        // SAFETY: RDTSC has no preconditions on x86-64.
        unsafe { core::arch::x86_64::_rdtsc() }
    }

    /// The calling thread's id (what `threading.get_ident()` gives on Linux).
    #[inline(always)]
    pub(crate) fn current_thread() -> u64 {
        // SAFETY: pthread_self has no preconditions and cannot fail.
        unsafe { libc::pthread_self() as u64 }
    }

    /// This process's id.
    #[inline]
    pub(crate) fn pid() -> libc::pid_t {
        // SAFETY: getpid has no preconditions.
        unsafe { libc::getpid() }
    }

    /// An epoll set of our own, closed when dropped. The descriptors it
    /// watches are only numbers to it: the kernel validates each one, and
    /// one closed while watched drops out of the set.
    pub(crate) struct EpollSet {
        fd: OwnedFd,
    }

    /// An empty epoll event, for `EpollSet::ready`'s buffer.
    pub(crate) const NO_EVENT: libc::epoll_event = libc::epoll_event { events: 0, u64: 0 };

    impl EpollSet {
        /// A new, empty set (close-on-exec); an errno on failure.
        pub(crate) fn new() -> Result<Self, i32> {
            // SAFETY: a plain system call.
            let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
            if fd < 0 {
                return Err(last_errno());
            }
            // SAFETY: a fresh fd nobody else owns.
            Ok(EpollSet { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
        }

        /// The set's own fd (for libuv to poll).
        #[inline]
        pub(crate) fn raw_fd(&self) -> RawFd {
            self.fd.as_raw_fd()
        }

        /// `epoll_ctl(op, fd)` with `events`, the event's data being `fd`.
        #[inline]
        fn ctl(&self, op: i32, fd: RawFd, events: u32) -> Result<(), i32> {
            let mut ev = libc::epoll_event { events, u64: fd as u64 };
            // SAFETY: the set's fd is ours; the kernel validates `fd` and
            // only reads the event.
            if unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), op, fd, &mut ev) } < 0 {
                return Err(last_errno());
            }
            Ok(())
        }

        /// Adds `fd` for `events` (EPOLLIN, EPOLLOUT).
        #[inline]
        pub(crate) fn add(&self, fd: RawFd, events: u32) -> Result<(), i32> {
            self.ctl(libc::EPOLL_CTL_ADD, fd, events)
        }

        /// Changes the events `fd` is watched for.
        #[inline]
        pub(crate) fn modify(&self, fd: RawFd, events: u32) -> Result<(), i32> {
            self.ctl(libc::EPOLL_CTL_MOD, fd, events)
        }

        /// Removes `fd` from the set.
        #[inline]
        pub(crate) fn delete(&self, fd: RawFd) -> Result<(), i32> {
            self.ctl(libc::EPOLL_CTL_DEL, fd, 0)
        }

        /// The events ready now (no waiting), written to the front of
        /// `events`: how many there are.
        #[inline]
        pub(crate) fn ready(&self, events: &mut [libc::epoll_event]) -> usize {
            let room = events.len().min(i32::MAX as usize) as i32;
            // SAFETY: the set's fd is ours; the kernel writes at most
            // `room` events to the buffer.
            let n = unsafe { libc::epoll_wait(self.fd.as_raw_fd(), events.as_mut_ptr(), room, 0) };
            n.max(0) as usize
        }
    }
}

// ---- end of section: eventloop ----
