//! The unsafe edge to libuv.
//!
//! Every libuv handle zuvrs creates lives in a heap allocation owned by exactly
//! one Rust value ([`UvHandle`]). The owner starts and stops the handle; when it
//! is done it calls [`UvHandle::close`] (or `close_with`), and libuv's close
//! callback is the only place the allocation is freed. A handle's `data` field
//! points back at the state its callbacks need (the loop, or a transport core).

use std::mem::MaybeUninit;

pub(crate) use libuv_sys2 as sys;

/// An initialised `uv_loop_t` on the heap.
pub(crate) struct UvLoop {
    raw: *mut sys::uv_loop_t,
    /// The process that created the loop (see `adopt_after_fork`).
    pid: libc::pid_t,
}

impl UvLoop {
    /// Allocates and initialises a loop; a libuv error code on failure.
    pub(crate) fn new() -> Result<Self, i32> {
        // SAFETY: uv_loop_init initialises the zeroed allocation; on failure it
        // is freed here and never used again.
        unsafe {
            let raw = Box::into_raw(Box::new(MaybeUninit::<sys::uv_loop_t>::zeroed())) as *mut sys::uv_loop_t;
            let rc = sys::uv_loop_init(raw);
            if rc < 0 {
                drop(Box::from_raw(raw as *mut MaybeUninit<sys::uv_loop_t>));
                return Err(rc);
            }
            Ok(UvLoop { raw, pid: libc::getpid() })
        }
    }

    #[inline]
    pub(crate) fn raw(&self) -> *mut sys::uv_loop_t {
        self.raw
    }

    /// Milliseconds of libuv's cached loop clock, refreshed first.
    #[inline]
    pub(crate) fn now_ms(&self) -> u64 {
        // SAFETY: the loop is initialised for as long as self exists.
        unsafe {
            sys::uv_update_time(self.raw);
            sys::uv_now(self.raw)
        }
    }

    /// Whether this process is a fork of the one that made the loop.
    pub(crate) fn inherited(&self) -> bool {
        // SAFETY: getpid has no preconditions.
        unsafe { libc::getpid() != self.pid }
    }

    /// In a forked child, gives the loop kernel objects of its own before
    /// anything is closed: the epoll set (and eventfd, io_uring) the child
    /// inherited are the parent's too, and unregistering a handle from them
    /// would stop the parent's loop from seeing that fd.
    pub(crate) fn adopt_after_fork(&mut self) {
        if self.inherited() {
            // SAFETY: the loop is initialised; uv_loop_fork re-creates its
            // backend in this process. Failing that, the loop is leaked at
            // close rather than touching the parent's kernel state.
            let rc = unsafe { sys::uv_loop_fork(self.raw) };
            if rc == 0 {
                // SAFETY: as above.
                self.pid = unsafe { libc::getpid() };
            }
        }
    }

    /// Runs the close callbacks of every handle already closed, then closes
    /// and frees the loop. Handles must have been closed by their owners;
    /// requests still on libuv's thread pool (a name lookup in progress) are
    /// waited for on a thread of their own, which frees the loop after them,
    /// so closing never blocks on them. Their owners must have let go of
    /// every Python object (see net::dns).
    ///
    /// # Safety
    /// No handle of this loop may be used afterwards.
    pub(crate) unsafe fn close(self) {
        if self.inherited() {
            // uv_loop_fork failed: never touch the parent's epoll set.
            return;
        }
        // SAFETY: per the contract, every handle was closed by its owner.
        unsafe {
            // Close callbacks run on the next turn; a handful of turns is plenty,
            // since closing handles never schedules more work.
            for _ in 0..16 {
                sys::uv_run(self.raw, sys::uv_run_mode_UV_RUN_NOWAIT);
                if sys::uv_loop_close(self.raw) == 0 {
                    drop(Box::from_raw(self.raw as *mut MaybeUninit<sys::uv_loop_t>));
                    return;
                }
            }
            if (*self.raw).active_handles == 0 && (*self.raw).closing_handles.is_null() {
                // Only thread-pool work is left: its completions need the loop.
                let raw = SendPtr(self.raw);
                let spawned = std::thread::Builder::new().name("zuvrs-close".into()).spawn(move || {
                    let raw = raw;
                    // SAFETY: nobody else uses the loop any more; uv_run returns
                    // once the last request has completed.
                    sys::uv_run(raw.0, sys::uv_run_mode_UV_RUN_DEFAULT);
                    if sys::uv_loop_close(raw.0) == 0 {
                        drop(Box::from_raw(raw.0 as *mut MaybeUninit<sys::uv_loop_t>));
                    }
                });
                if spawned.is_ok() {
                    return;
                }
            }
            // A handle nobody closed: leaking the loop is safer than freeing
            // memory libuv still links to.
            eprintln!("zuvrs: libuv loop still has open handles at close; leaking it");
        }
    }
}

/// A loop pointer handed to the thread that finishes its requests.
struct SendPtr(*mut sys::uv_loop_t);
// SAFETY: the thread is the loop's only user from then on.
unsafe impl Send for SendPtr {}

/// Marker for types whose first field is a libuv handle (`#[repr(C)]`), so a
/// pointer to the value is also a pointer to its `uv_handle_t`.
///
/// # Safety
/// Implementors must be `#[repr(C)]` with the libuv handle as first field.
pub(crate) unsafe trait HandleBox: Sized {}

// SAFETY: the libuv handle types are their own first field.
unsafe impl HandleBox for sys::uv_timer_t {}
// SAFETY: as above.
unsafe impl HandleBox for sys::uv_async_t {}
// SAFETY: as above.
unsafe impl HandleBox for sys::uv_prepare_t {}
// SAFETY: as above.
unsafe impl HandleBox for sys::uv_poll_t {}

/// Owner of one heap-allocated libuv handle (or a struct starting with one).
pub(crate) struct UvHandle<T: HandleBox> {
    raw: *mut T,
}

impl<T: HandleBox> UvHandle<T> {
    /// A zeroed allocation; the caller runs the matching `uv_*_init` on it.
    pub(crate) fn zeroed() -> Self {
        // SAFETY: libuv handle structs are plain C data, valid when zeroed
        // until initialised.
        let raw = Box::into_raw(Box::new(unsafe { MaybeUninit::<T>::zeroed().assume_init() }));
        UvHandle { raw }
    }

    /// Takes a value whose first field is the (not yet initialised) handle.
    pub(crate) fn new(value: T) -> Self {
        UvHandle { raw: Box::into_raw(Box::new(value)) }
    }

    #[inline]
    pub(crate) fn raw(&self) -> *mut T {
        self.raw
    }

    #[inline]
    pub(crate) fn as_handle(&self) -> *mut sys::uv_handle_t {
        self.raw as *mut sys::uv_handle_t
    }

    /// Sets the handle's `data` back-pointer.
    pub(crate) fn set_data<D>(&self, data: *const D) {
        // SAFETY: the handle is allocated; data is only read by our callbacks.
        unsafe { (*self.as_handle()).data = data as *mut _ }
    }

    /// Asks libuv to close the handle; its close callback frees the memory.
    /// An owner whose init call failed uses [`UvHandle::free_uninit`] instead.
    pub(crate) fn close(self) {
        self.close_with(free_after_close::<T>)
    }

    /// Asks libuv to close the handle with a close callback of the owner's,
    /// which must free the allocation (`Box::from_raw` of `*mut T`).
    pub(crate) fn close_with(self, on_closed: unsafe extern "C" fn(*mut sys::uv_handle_t)) {
        // SAFETY: the handle was initialised; after uv_close nobody but the
        // close callback touches the allocation.
        unsafe {
            let h = self.as_handle();
            if sys::uv_is_closing(h) == 0 {
                sys::uv_close(h, Some(on_closed));
            }
        }
    }

    /// Frees a handle whose `uv_*_init` failed (libuv never saw it).
    pub(crate) fn free_uninit(self) {
        // SAFETY: libuv holds no pointer to an uninitialised handle.
        unsafe { drop(Box::from_raw(self.raw)) }
    }
}

unsafe extern "C" fn free_after_close<T: HandleBox>(handle: *mut sys::uv_handle_t) {
    // SAFETY: the allocation came from Box<T> in UvHandle and this is its one
    // close callback.
    unsafe { drop(Box::from_raw(handle as *mut T)) }
}

/// A libuv buffer over `len` bytes at `base`. (libuv's `uv_buf_init` takes
/// an `unsigned int` length, which would cut a buffer of 4 GiB or more.)
#[inline]
pub(crate) fn buf(base: *const u8, len: usize) -> sys::uv_buf_t {
    sys::uv_buf_t { base: base as *mut libc::c_char, len }
}

/// A libuv error code (negative errno on Unix) as a positive errno.
#[inline]
pub(crate) fn errno_of(code: i32) -> i32 {
    -code
}

/// The text libuv gives for an error code.
pub(crate) fn strerror(code: i32) -> String {
    // SAFETY: uv_strerror returns a static C string for any code.
    unsafe {
        let p = sys::uv_strerror(code);
        if p.is_null() {
            return format!("libuv error {code}");
        }
        std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// libuv's version as (major, minor, patch).
pub(crate) fn version() -> (u32, u32, u32) {
    // SAFETY: plain function returning a number.
    let v = unsafe { sys::uv_version() };
    ((v >> 16) & 0xff, (v >> 8) & 0xff, v & 0xff)
}

// ---- section: loop handles: async, prepare, timer, poll, signal (eventloop) ----

// ---- end of section: eventloop ----

// ---- section: streams, TCP, pipes, UDP, writes, shutdown (transport) ----

// ---- end of section: transport ----

// ---- section: name resolution requests (net) ----

/// libuv's name lookups on its thread pool (`uv_getaddrinfo`,
/// `uv_getnameinfo`) as owners.
///
/// A request lives in a heap allocation libuv owns from the start to the
/// completion, which frees it. While in flight it is a client of its loop:
/// a loop closing first cancels it and makes the lookup let go of its
/// Python objects ([`Lookup::orphan`]); its completion then only frees it,
/// maybe on the thread that finishes the loop's requests (`UvLoop::close`),
/// without the GIL. A lookup whose loop is open completes on the loop's
/// thread with the GIL, in its `resolved` / `named` method.
pub(crate) mod resolver {
    use std::cell::{Cell, UnsafeCell};
    use std::ffi::CStr;
    use std::mem::MaybeUninit;
    use std::ptr;

    use pyo3::prelude::*;

    use super::sys;
    use crate::errors::uv_error;
    use crate::eventloop::{ClientPtr, LoopClient, LoopShared};
    use crate::os::net::{AddrInfoNodes, SockAddr};

    /// What a lookup carries to its completion (the future it settles).
    /// `Send`: an orphaned lookup is dropped on the thread that finishes
    /// its loop's requests.
    pub(crate) trait Lookup: Send + 'static {
        /// The loop is closing first: let go of every Python object now.
        fn orphan(&self, py: Python<'_>);
    }

    /// A lookup started with [`getaddrinfo`].
    pub(crate) trait AddrInfoLookup: Lookup {
        /// The result list, or the libuv error code (UV_EAI_*).
        fn resolved(&self, py: Python<'_>, shared: &LoopShared, result: Result<&AddrInfoList, i32>);
    }

    /// A lookup started with [`getnameinfo`].
    pub(crate) trait NameInfoLookup: Lookup {
        /// `(host, service)`, or the libuv error code (UV_EAI_*).
        fn named(&self, py: Python<'_>, shared: &LoopShared, result: Result<(&CStr, &CStr), i32>);
    }

    /// The hints of a getaddrinfo lookup, as `socket.getaddrinfo` takes them.
    pub(crate) struct Hints {
        pub(crate) family: i32,
        pub(crate) socktype: i32,
        pub(crate) protocol: i32,
        pub(crate) flags: i32,
    }

    /// One libuv request and its lookup; the request comes first, so
    /// libuv's pointer to it is a pointer to the whole.
    #[repr(C)]
    struct Request<R, S> {
        /// Written by libuv (and its worker thread) while in flight.
        req: UnsafeCell<R>,
        /// Null once the loop closed first (the request is orphaned).
        shared: Cell<*const LoopShared>,
        lookup: S,
    }

    impl<R: 'static, S: Lookup> Request<R, S> {
        /// A request for libuv to fill in, registered with the loop.
        fn new(py: Python<'_>, shared: &LoopShared, lookup: S) -> *mut Self {
            let req = Box::into_raw(Box::new(Request {
                // SAFETY: a plain C struct, initialised by the libuv call.
                req: UnsafeCell::new(unsafe { MaybeUninit::zeroed().assume_init() }),
                shared: Cell::new(shared),
                lookup,
            }));
            shared.register(py, ClientPtr(req as *const dyn LoopClient));
            req
        }

        /// Frees a request libuv refused to start.
        ///
        /// # Safety
        /// `req` came from `new` with `shared`, and libuv does not know it.
        unsafe fn abandon(py: Python<'_>, shared: &LoopShared, req: *mut Self) {
            shared.unregister(py, ClientPtr(req as *const dyn LoopClient));
            // SAFETY: per the contract.
            drop(unsafe { Box::from_raw(req) });
        }

        /// Takes back a request libuv has completed (`req`, as its callback
        /// got it): with the GIL and its loop, or None (and freed) if the
        /// loop closed first.
        ///
        /// # Safety
        /// `req` came from `Request::<R, S>::new` and libuv is done with it.
        unsafe fn finish<'a>(req: *mut R) -> Option<(Python<'a>, &'a LoopShared, Box<Self>)> {
            // SAFETY: per the contract; req is the first field.
            let r = unsafe { Box::from_raw(req as *mut Self) };
            let shared = r.shared.get();
            if shared.is_null() {
                return None; // orphaned: no Python object left, maybe no GIL either
            }
            // SAFETY: a request that is not orphaned completes on its open
            // loop's thread, inside uv_run (the loop orphans every request
            // before it closes), so the loop's state is alive and the GIL
            // can be taken back.
            let (shared, py) = unsafe {
                let shared = &*shared;
                (shared, shared.reacquire_gil())
            };
            shared.unregister(py, ClientPtr(&*r as *const Self as *const dyn LoopClient));
            Some((py, shared, r))
        }
    }

    impl<R: 'static, S: Lookup> LoopClient for Request<R, S> {
        fn before_poll(&self, _py: Python<'_>) -> PyResult<()> {
            Ok(())
        }

        fn close_with_loop(&self, py: Python<'_>) {
            self.shared.set(ptr::null());
            // SAFETY: a registered request is in flight on this loop;
            // uv_cancel refuses one a worker is already running (it then
            // completes normally).
            unsafe { sys::uv_cancel(self.req.get() as *mut sys::uv_req_t) };
            self.lookup.orphan(py);
        }
    }

    /// A getaddrinfo result list, freed when dropped.
    pub(crate) struct AddrInfoList {
        head: *mut sys::addrinfo,
    }

    impl AddrInfoList {
        /// The list's nodes.
        #[inline]
        pub(crate) fn nodes(&self) -> AddrInfoNodes<'_> {
            // SAFETY: head is null or libuv's result list (the C library's
            // addrinfo), freed only when self is dropped.
            unsafe { AddrInfoNodes::new(self.head as *const libc::addrinfo) }
        }
    }

    impl Drop for AddrInfoList {
        fn drop(&mut self) {
            if !self.head.is_null() {
                // SAFETY: the list libuv handed over, freed once.
                unsafe { sys::uv_freeaddrinfo(self.head) };
            }
        }
    }

    /// Starts resolving `node` / `service` on the loop's thread pool;
    /// `lookup.resolved` gets the outcome. The OSError of a request libuv
    /// refuses (or RuntimeError for a closed loop) is returned instead.
    pub(crate) fn getaddrinfo<S: AddrInfoLookup>(
        py: Python<'_>,
        shared: &LoopShared,
        lookup: S,
        node: Option<&CStr>,
        service: Option<&CStr>,
        hints: &Hints,
    ) -> PyResult<()> {
        let uv_loop = shared.uv_loop(py)?;
        let hints = sys::addrinfo {
            ai_flags: hints.flags,
            ai_family: hints.family,
            ai_socktype: hints.socktype,
            ai_protocol: hints.protocol,
            ai_addrlen: 0,
            ai_addr: ptr::null_mut(),
            ai_canonname: ptr::null_mut(),
            ai_next: ptr::null_mut(),
        };
        let req = Request::<sys::uv_getaddrinfo_t, S>::new(py, shared, lookup);
        // SAFETY: the loop is open (uv_loop said so, and cannot close while
        // we hold the GIL); libuv copies node, service and hints before
        // returning, and owns the request until its callback.
        let rc = unsafe {
            sys::uv_getaddrinfo(
                uv_loop,
                req as *mut sys::uv_getaddrinfo_t,
                Some(on_addrinfo::<S>),
                node.map_or(ptr::null(), |c| c.as_ptr()),
                service.map_or(ptr::null(), |c| c.as_ptr()),
                &hints,
            )
        };
        if rc < 0 {
            // SAFETY: libuv refused the request.
            unsafe { Request::abandon(py, shared, req) };
            return Err(uv_error(rc));
        }
        Ok(())
    }

    unsafe extern "C" fn on_addrinfo<S: AddrInfoLookup>(
        req: *mut sys::uv_getaddrinfo_t,
        status: i32,
        res: *mut sys::addrinfo,
    ) {
        // Freed last, after the lookup saw it.
        let list = AddrInfoList { head: res };
        // SAFETY: libuv is done with the request, which getaddrinfo::<S> made.
        if let Some((py, shared, r)) = unsafe { Request::<_, S>::finish(req) } {
            r.lookup.resolved(py, shared, if status < 0 { Err(status) } else { Ok(&list) });
        }
    }

    /// Starts `getnameinfo` of an IP address on the loop's thread pool;
    /// `lookup.named` gets the outcome. Errors as for [`getaddrinfo`].
    pub(crate) fn getnameinfo<S: NameInfoLookup>(
        py: Python<'_>,
        shared: &LoopShared,
        lookup: S,
        addr: &SockAddr,
        flags: i32,
    ) -> PyResult<()> {
        let uv_loop = shared.uv_loop(py)?;
        let req = Request::<sys::uv_getnameinfo_t, S>::new(py, shared, lookup);
        // SAFETY: as in getaddrinfo; libuv copies the address (a storage
        // large enough for any family) before returning.
        let rc = unsafe {
            sys::uv_getnameinfo(
                uv_loop,
                req as *mut sys::uv_getnameinfo_t,
                Some(on_nameinfo::<S>),
                addr.as_ptr() as *const sys::sockaddr,
                flags,
            )
        };
        if rc < 0 {
            // SAFETY: libuv refused the request.
            unsafe { Request::abandon(py, shared, req) };
            return Err(uv_error(rc));
        }
        Ok(())
    }

    unsafe extern "C" fn on_nameinfo<S: NameInfoLookup>(
        req: *mut sys::uv_getnameinfo_t,
        status: i32,
        host: *const libc::c_char,
        service: *const libc::c_char,
    ) {
        // SAFETY: libuv is done with the request, which getnameinfo::<S> made.
        let Some((py, shared, r)) = (unsafe { Request::<_, S>::finish(req) }) else { return };
        let result = if status < 0 {
            Err(status)
        } else if host.is_null() || service.is_null() {
            Err(sys::uv_errno_t_UV_EAI_FAIL)
        } else {
            // SAFETY: on success, NUL-terminated buffers of the request,
            // which lives until r is dropped.
            Ok(unsafe { (CStr::from_ptr(host), CStr::from_ptr(service)) })
        };
        r.lookup.named(py, shared, result);
    }
}

// ---- end of section: net ----
