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
    pid: std::cell::Cell<libc::pid_t>,
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
            Ok(UvLoop { raw, pid: std::cell::Cell::new(crate::os::eventloop::pid()) })
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
        crate::os::eventloop::pid() != self.pid.get()
    }

    /// In a forked child, gives the loop kernel objects of its own before
    /// anything is closed: the epoll set (and eventfd, io_uring) the child
    /// inherited are the parent's too, and unregistering a handle from them
    /// would stop the parent's loop from seeing that fd.
    pub(crate) fn adopt_after_fork(&self) {
        if self.inherited() {
            // SAFETY: the loop is initialised; uv_loop_fork re-creates its
            // backend in this process. Failing that, the loop is leaked at
            // close rather than touching the parent's kernel state.
            let rc = unsafe { sys::uv_loop_fork(self.raw) };
            if rc == 0 {
                self.pid.set(crate::os::eventloop::pid());
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

// ---- section: streams, TCP, pipes, UDP, writes, shutdown (transport) ----

/// The transports' libuv handles as owners: a core's stream (`uv_tcp_t`,
/// or `uv_pipe_t` for Unix sockets and pipes) with its reads and write
/// requests, and the `uv_poll_t` watching a datagram socket.
///
/// A handle lives in a box that also holds the loop state its callbacks
/// take the GIL back from and a strong reference to its core (a frozen
/// pyclass), at which the handle's `data` points: the core lives until
/// libuv's close callback, which runs after every other callback of the
/// handle and frees the box. The trampolines here recover the core and call
/// its safe methods (`StreamOwner`, `PollOwner`) with the GIL held.
pub(crate) mod transport {
    use std::cell::Cell;
    use std::marker::PhantomData;
    use std::mem::{ManuallyDrop, MaybeUninit};
    use std::os::fd::BorrowedFd;
    use std::ptr::{self, NonNull};

    use pyo3::prelude::*;
    use pyo3::pyclass::boolean_struct::True;
    use pyo3::{PyClass, PyTraverseError, PyVisit};
    use smallvec::SmallVec;

    use super::{sys, HandleBox, UvHandle};
    use crate::capi::transport::read_buffer_memory;
    use crate::errors::uv_error;
    use crate::eventloop::{LoopCore, LoopShared};

    /// The loop a transport core lives on: a strong reference to its
    /// `LoopCore`, and the address of the state that core keeps boxed, which
    /// stays put for as long as the reference is held.
    pub(crate) struct LoopRef {
        core: Py<LoopCore>,
        shared: NonNull<LoopShared>,
    }

    // SAFETY: a shared reference to a LoopShared, which is Sync, and a Py.
    unsafe impl Send for LoopRef {}
    // SAFETY: as above.
    unsafe impl Sync for LoopRef {}

    impl LoopRef {
        pub(crate) fn new(core: &Bound<'_, LoopCore>) -> Self {
            LoopRef { shared: NonNull::from(core.get().shared()), core: core.clone().unbind() }
        }

        #[inline]
        pub(crate) fn get(&self) -> &LoopShared {
            // SAFETY: `core` keeps the LoopCore alive, and a frozen pyclass's
            // boxed state is neither replaced nor freed before the object.
            unsafe { self.shared.as_ref() }
        }

        /// Reports the reference to the cyclic GC.
        pub(crate) fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
            visit.call(&self.core)
        }
    }

    /// Bytes for libuv to write: a `uv_buf_t` over a borrowed slice.
    #[repr(transparent)]
    #[derive(Clone, Copy)]
    pub(crate) struct IoBuf<'a> {
        buf: sys::uv_buf_t,
        _bytes: PhantomData<&'a [u8]>,
    }

    impl<'a> IoBuf<'a> {
        #[inline]
        pub(crate) fn new(bytes: &'a [u8]) -> Self {
            IoBuf { buf: super::buf(bytes.as_ptr(), bytes.len()), _bytes: PhantomData }
        }

        #[inline]
        pub(crate) fn len(&self) -> usize {
            self.buf.len
        }
    }

    /// Memory lent to libuv for one read, which the stream's box holds
    /// until the read is done.
    pub(crate) trait LendMemory: 'static {
        /// Where the read goes.
        fn memory(&mut self) -> &mut [u8];
    }

    /// Where a stream's next read goes.
    pub(crate) enum ReadInto<L> {
        /// Nowhere: nothing is read now (libuv reports UV_ENOBUFS).
        Nothing,
        /// The thread's read buffer (capi.rs), made with this many bytes if
        /// there is none.
        ReadBuffer(usize),
        /// Memory of the owner's, held by the stream until the read is done.
        Lent(L),
    }

    /// What a write request holds until libuv is done with it.
    pub(crate) trait WritePayload: 'static {
        /// The bytes to write, borrowed from the payload.
        fn bufs(&self) -> SmallVec<[IoBuf<'_>; 8]>;
    }

    /// A transport core's side of its stream's callbacks, each called with
    /// the GIL held, inside uv_run.
    pub(crate) trait StreamOwner: PyClass<Frozen = True> + Sync {
        type Lent: LendMemory;
        type Write: WritePayload;

        /// Where the next read goes. libuv reads right after, so a stop or
        /// close of the stream asked for meanwhile waits for that read's end.
        fn lend(&self, py: Python<'_>) -> ReadInto<Self::Lent>;

        /// A read is done: `nread` bytes landed where `lend` said (`lent`,
        /// if it lent memory), or libuv's code (0: nothing to read after
        /// all, UV_EOF, UV_ENOBUFS, an error).
        fn read_done(&self, py: Python<'_>, nread: isize, lent: Option<Self::Lent>);

        /// A write request finished with `status`; `write` is what it held.
        fn write_done(&self, py: Python<'_>, write: Self::Write, status: i32);
    }

    /// A datagram core's side of its poll handle's callback.
    pub(crate) trait PollOwner: PyClass<Frozen = True> + Sync {
        /// The fd is ready for `events`, or in error (`status` < 0).
        fn poll_ready(&self, py: Python<'_>, status: i32, events: i32);
    }

    /// A handle and what its callbacks need; the handle comes first, so
    /// libuv's pointer to it is a pointer to the box.
    #[repr(C)]
    struct CoreBox<H, C, X> {
        handle: H,
        /// The loop the handle is on.
        shared: *const LoopShared,
        /// The core, kept alive until libuv is done with the handle.
        owner: Option<Py<C>>,
        extra: X,
    }

    // SAFETY: repr(C) with the libuv handle first (H is a uv_poll_t or
    // StreamHandle, the only ones this module boxes).
    unsafe impl<H, C, X> HandleBox for CoreBox<H, C, X> {}

    impl<H, C, X> CoreBox<H, C, X> {
        fn new(shared: &LoopShared, extra: X) -> Self {
            CoreBox {
                // SAFETY: libuv handle structs are plain C data, valid when
                // zeroed until initialised.
                handle: unsafe { MaybeUninit::zeroed().assume_init() },
                shared,
                owner: None,
                extra,
            }
        }
    }

    /// The close callback of every core's handle: frees the box, and with it
    /// the reference that kept the core alive.
    unsafe extern "C" fn on_closed<H, C, X>(handle: *mut sys::uv_handle_t) {
        // SAFETY: the box came from a UvHandle<CoreBox<H, C, X>>; this is its
        // one close callback, run inside uv_run on the loop's thread (the
        // loop state outlives its handles).
        unsafe {
            let b = Box::from_raw(handle as *mut CoreBox<H, C, X>);
            let _py = (*b.shared).reacquire_gil();
            drop(b);
        }
    }

    /// The libuv stream behind a transport: TCP, or a pipe.
    #[repr(C)]
    union StreamHandle {
        tcp: ManuallyDrop<sys::uv_tcp_t>,
        pipe: ManuallyDrop<sys::uv_pipe_t>,
    }

    /// What a stream does once the read under way is done.
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Deferred {
        Nothing,
        Stop,
        Close,
    }

    /// A stream's state besides the handle.
    struct StreamExtra<L> {
        /// The owner's memory the read under way goes to, from `on_alloc` to
        /// `on_read` (only the trampolines touch it).
        lent: Option<L>,
        flags: ReadFlags,
    }

    struct ReadFlags {
        /// In `StreamOwner::lend`: libuv reads when it returns and calls
        /// `on_read` whatever happened meanwhile (stopping the stream there
        /// would have it call a read callback it no longer has).
        lending: Cell<bool>,
        /// A stop or close asked for while lending.
        deferred: Cell<Deferred>,
    }

    type StreamBox<C> = CoreBox<StreamHandle, C, StreamExtra<<C as StreamOwner>::Lent>>;

    /// A transport's stream: started and stopped reading, written, closed
    /// once (a stream dropped unclosed is leaked, never freed under libuv).
    pub(crate) struct UvStream<C: StreamOwner> {
        handle: UvHandle<StreamBox<C>>,
    }

    impl<C: StreamOwner> UvStream<C> {
        /// Takes over `fd`, a connected stream socket, for `owner`: a
        /// `uv_pipe_t` with `pipe` (Unix sockets, pipes, FIFOs), else a
        /// `uv_tcp_t` with TCP_NODELAY, as asyncio sets it (a stream socket
        /// that is not TCP refuses the option; that is fine). libuv owns the
        /// fd from then on and closes it with the handle.
        pub(crate) fn open(py: Python<'_>, link: &LoopRef, owner: &Py<C>, fd: i32, pipe: bool) -> PyResult<Self> {
            let shared = link.get();
            let uv_loop = shared.uv_loop(py)?;
            let flags = ReadFlags { lending: Cell::new(false), deferred: Cell::new(Deferred::Nothing) };
            let extra = StreamExtra { lent: None, flags };
            let h = UvHandle::new(StreamBox::<C>::new(shared, extra));
            let raw = h.raw();
            // SAFETY: a fresh allocation on the open loop of `shared`; if the
            // init fails it is freed directly (libuv never saw it), after
            // that only closed. No callback runs before reading or writing
            // starts, and by then `data` and the owner are set.
            unsafe {
                let rc = if pipe {
                    sys::uv_pipe_init(uv_loop, &mut *(*raw).handle.pipe, 0)
                } else {
                    sys::uv_tcp_init(uv_loop, &mut *(*raw).handle.tcp)
                };
                if rc < 0 {
                    h.free_uninit();
                    return Err(uv_error(rc));
                }
                let rc = if pipe {
                    sys::uv_pipe_open(&mut *(*raw).handle.pipe, fd)
                } else {
                    sys::uv_tcp_open(&mut *(*raw).handle.tcp, fd)
                };
                if rc < 0 {
                    h.close_with(on_closed::<StreamHandle, C, StreamExtra<C::Lent>>);
                    return Err(uv_error(rc));
                }
                if !pipe {
                    sys::uv_tcp_nodelay(&mut *(*raw).handle.tcp, 1);
                }
                (*raw).owner = Some(owner.clone_ref(py));
            }
            h.set_data(owner.get() as *const C);
            Ok(UvStream { handle: h })
        }

        #[inline]
        fn stream(&self) -> *mut sys::uv_stream_t {
            self.handle.raw() as *mut sys::uv_stream_t
        }

        #[inline]
        fn flags(&self) -> &ReadFlags {
            // SAFETY: the box lives as long as self; the flags are Cells.
            unsafe { &(*self.handle.raw()).extra.flags }
        }

        /// The core the box keeps alive.
        pub(crate) fn owner(&self, py: Python<'_>) -> Option<Py<C>> {
            // SAFETY: the box lives as long as self; `owner` is only written
            // in open().
            unsafe { (*self.handle.raw()).owner.as_ref().map(|o| o.clone_ref(py)) }
        }

        /// Starts reading: the owner's `lend` and `read_done` from now on.
        #[inline]
        pub(crate) fn read_start(&self) -> Result<(), i32> {
            let deferred = &self.flags().deferred;
            if deferred.get() == Deferred::Stop {
                // Stopped while lending: libuv never stopped.
                deferred.set(Deferred::Nothing);
                return Ok(());
            }
            // SAFETY: an open stream whose data is its owner, of the type the
            // callbacks expect.
            let rc = unsafe { sys::uv_read_start(self.stream(), Some(on_alloc::<C>), Some(on_read::<C>)) };
            if rc < 0 {
                return Err(rc);
            }
            Ok(())
        }

        #[inline]
        pub(crate) fn read_stop(&self) {
            let flags = self.flags();
            if flags.lending.get() {
                flags.deferred.set(Deferred::Stop);
                return;
            }
            // SAFETY: an open stream.
            unsafe { sys::uv_read_stop(self.stream()) };
        }

        /// Writes what the socket takes at once: the bytes written, or a
        /// libuv error (UV_EAGAIN when it takes none).
        #[inline]
        pub(crate) fn try_write(&self, bufs: &[IoBuf<'_>]) -> i32 {
            // SAFETY: an open stream; the buffers are borrowed for the call
            // (an IoBuf is a uv_buf_t).
            unsafe { sys::uv_try_write(self.stream(), bufs.as_ptr() as *const sys::uv_buf_t, bufs.len() as u32) }
        }

        /// Starts a `uv_write` of the payload's bytes; the owner's
        /// `write_done` gets the payload back. A request libuv refuses is
        /// given back at once, with the error.
        #[inline]
        pub(crate) fn write(&self, payload: C::Write) -> Result<(), (i32, C::Write)> {
            let req = Box::into_raw(Box::new(WriteReq {
                // SAFETY: plain C data, initialised by uv_write.
                req: unsafe { MaybeUninit::zeroed().assume_init() },
                payload,
            }));
            // SAFETY: the request is ours until uv_write takes it, then
            // libuv's until on_write frees it. Its buffers point into the
            // payload it owns, which nothing touches meanwhile (libuv copies
            // the list of buffers itself).
            unsafe {
                let rc = {
                    let bufs = (*req).payload.bufs();
                    sys::uv_write(
                        &mut (*req).req,
                        self.stream(),
                        bufs.as_ptr() as *const sys::uv_buf_t,
                        bufs.len() as u32,
                        Some(on_write::<C>),
                    )
                };
                if rc < 0 {
                    let req = Box::from_raw(req);
                    return Err((rc, req.payload));
                }
            }
            Ok(())
        }

        /// The stream's fd, borrowed from the handle that owns it.
        pub(crate) fn fd(&self) -> Option<BorrowedFd<'_>> {
            let mut fd: sys::uv_os_fd_t = -1;
            // SAFETY: an open stream; uv_fileno only reads its fd.
            if unsafe { sys::uv_fileno(self.handle.as_handle(), &mut fd) } < 0 || fd < 0 {
                return None;
            }
            // SAFETY: the handle owns the fd until it is closed, which takes
            // self, so not while the borrow lasts.
            Some(unsafe { BorrowedFd::borrow_raw(fd) })
        }

        /// Closes the stream and its fd (while lending memory for a read:
        /// once the read is done). The close callback frees the box and the
        /// reference to the owner.
        pub(crate) fn close(self) {
            let flags = self.flags();
            if flags.lending.get() {
                flags.deferred.set(Deferred::Close);
                return;
            }
            self.handle.close_with(on_closed::<StreamHandle, C, StreamExtra<C::Lent>>);
        }
    }

    /// One `uv_write` in flight and what its buffers point into.
    #[repr(C)]
    struct WriteReq<P> {
        req: sys::uv_write_t,
        payload: P,
    }

    unsafe extern "C" fn on_alloc<C: StreamOwner>(
        handle: *mut sys::uv_handle_t,
        _suggested: usize,
        buf: *mut sys::uv_buf_t,
    ) {
        let bx = handle as *mut StreamBox<C>;
        // SAFETY: a stream UvStream::<C> opened: its box is alive until the
        // close callback, its data is the owner, which the box keeps alive;
        // inside uv_run on the loop's thread. libuv reads into the buffer as
        // soon as this returns and then calls on_read, no code in between:
        // the thread's read buffer stays where it is, and the owner's memory
        // stays in the box until then. No reference into the box is held
        // while the owner's code runs (including drops).
        unsafe {
            let py = (*(*bx).shared).reacquire_gil();
            let owner = &*((*handle).data as *const C);
            (*bx).extra.flags.lending.set(true);
            *buf = match owner.lend(py) {
                ReadInto::Nothing => super::buf(ptr::null(), 0),
                ReadInto::ReadBuffer(len) => match read_buffer_memory(py, len) {
                    Some((p, n)) => super::buf(p, n),
                    None => super::buf(ptr::null(), 0),
                },
                ReadInto::Lent(lent) => {
                    let old = (*bx).extra.lent.replace(lent);
                    drop(old);
                    match &mut (*bx).extra.lent {
                        Some(l) => {
                            let m = l.memory();
                            super::buf(m.as_ptr(), m.len())
                        }
                        None => super::buf(ptr::null(), 0),
                    }
                }
            };
            (*bx).extra.flags.lending.set(false);
        }
    }

    unsafe extern "C" fn on_read<C: StreamOwner>(
        stream: *mut sys::uv_stream_t,
        nread: isize,
        _buf: *const sys::uv_buf_t,
    ) {
        let bx = stream as *mut StreamBox<C>;
        // SAFETY: as for on_alloc; libuv is done with the memory lent. The
        // box lives on after a close asked for by the owner's code (until
        // the close callback, in a later phase of uv_run).
        unsafe {
            let py = (*(*bx).shared).enter_io();
            let owner = &*((*stream).data as *const C);
            let lent = (*bx).extra.lent.take();
            owner.read_done(py, nread, lent);
            match (*bx).extra.flags.deferred.replace(Deferred::Nothing) {
                Deferred::Nothing => {}
                Deferred::Stop => {
                    sys::uv_read_stop(stream);
                }
                Deferred::Close => UvHandle { raw: bx }.close_with(on_closed::<StreamHandle, C, StreamExtra<C::Lent>>),
            }
        }
    }

    unsafe extern "C" fn on_write<C: StreamOwner>(req: *mut sys::uv_write_t, status: i32) {
        // SAFETY: the request came from UvStream::<C>::write and libuv is
        // done with it; its stream's box is alive (libuv cancels pending
        // writes before the close callback); inside uv_run on the loop's
        // thread.
        unsafe {
            let stream = (*req).handle;
            let bx = stream as *mut StreamBox<C>;
            let py = (*(*bx).shared).enter_io();
            let owner = &*((*stream).data as *const C);
            let req = Box::from_raw(req as *mut WriteReq<C::Write>);
            owner.write_done(py, req.payload, status);
        }
    }

    type PollBox<C> = CoreBox<sys::uv_poll_t, C, ()>;

    /// A poll handle watching a socket its owner keeps (libuv only polls
    /// the fd); closed once (dropped unclosed, it is leaked).
    pub(crate) struct UvPoll<C: PollOwner> {
        handle: UvHandle<PollBox<C>>,
    }

    impl<C: PollOwner> UvPoll<C> {
        /// Watches `fd` for `owner` (nothing is asked for until `start`).
        pub(crate) fn open(py: Python<'_>, link: &LoopRef, owner: &Py<C>, fd: i32) -> PyResult<Self> {
            let shared = link.get();
            let uv_loop = shared.uv_loop(py)?;
            let h = UvHandle::new(PollBox::<C>::new(shared, ()));
            let raw = h.raw();
            // SAFETY: a fresh allocation on the open loop of `shared`; an
            // init failure frees it directly (libuv never saw it). No
            // callback runs before `start`, and by then `data` and the owner
            // are set.
            unsafe {
                let rc = sys::uv_poll_init(uv_loop, &mut (*raw).handle, fd);
                if rc < 0 {
                    h.free_uninit();
                    return Err(uv_error(rc));
                }
                (*raw).owner = Some(owner.clone_ref(py));
            }
            h.set_data(owner.get() as *const C);
            Ok(UvPoll { handle: h })
        }

        /// Asks for `events` (UV_READABLE, UV_WRITABLE) from now on.
        #[inline]
        pub(crate) fn start(&self, events: i32) -> Result<(), i32> {
            let known = (sys::uv_poll_event_UV_READABLE
                | sys::uv_poll_event_UV_WRITABLE
                | sys::uv_poll_event_UV_DISCONNECT
                | sys::uv_poll_event_UV_PRIORITIZED) as i32;
            // SAFETY: an open poll handle whose data is its owner, of the
            // type the callback expects; libuv asserts on unknown events.
            let rc = unsafe {
                sys::uv_poll_start(self.handle.raw() as *mut sys::uv_poll_t, events & known, Some(on_poll::<C>))
            };
            if rc < 0 {
                return Err(rc);
            }
            Ok(())
        }

        #[inline]
        pub(crate) fn stop(&self) -> Result<(), i32> {
            // SAFETY: an open poll handle.
            let rc = unsafe { sys::uv_poll_stop(self.handle.raw() as *mut sys::uv_poll_t) };
            if rc < 0 {
                return Err(rc);
            }
            Ok(())
        }

        /// Stops watching (at once) and closes the handle; the close callback
        /// frees the box and the reference to the owner.
        pub(crate) fn close(self) {
            self.handle.close_with(on_closed::<sys::uv_poll_t, C, ()>);
        }
    }

    unsafe extern "C" fn on_poll<C: PollOwner>(handle: *mut sys::uv_poll_t, status: i32, events: i32) {
        let bx = handle as *mut PollBox<C>;
        // SAFETY: a poll handle UvPoll::<C> opened: its box is alive until
        // the close callback, its data is the owner, which the box keeps
        // alive; inside uv_run on the loop's thread.
        unsafe {
            let py = (*(*bx).shared).enter_io();
            let owner = &*((*handle).data as *const C);
            owner.poll_ready(py, status, events);
        }
    }
}

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

// ---- section: the loop's own handles: async, prepare, timer, fd poll (eventloop) ----

/// The libuv loop of a `LoopCore` and its own handles, with one owner
/// ([`LoopHandles`], kept in the loop's `LoopShared`) and one close path;
/// the GIL's hand-off around the poll; the calls into the loop's clients.
///
/// The handles' callbacks find the loop's `LoopShared` in the libuv loop's
/// `data`, which `LoopShared::run_uv` sets for the length of its `uv_run`
/// (and clears after): no callback of these handles can run outside it, and
/// none outlives the state it reaches. A close asked for from inside that
/// `uv_run` (Python code closing the loop from a protocol callback) waits
/// for it to return.
pub(crate) mod eventloop {
    use std::cell::{Cell, OnceCell};
    use std::ptr;

    use pyo3::prelude::*;

    use super::{sys, UvHandle, UvLoop};
    use crate::eventloop::{ClientPtr, LoopShared};
    use crate::os::eventloop::EpollSet;

    /// How `LoopShared::run_uv` polls.
    #[derive(Clone, Copy, PartialEq, Eq)]
    pub(crate) enum RunMode {
        /// Whatever is ready now.
        NoWait,
        /// Blocks until something happens (I/O, a wake-up, the timer).
        Once,
    }

    /// The epoll set behind the fd watchers, and libuv's watch on it.
    struct FdPoll {
        poll: UvHandle<sys::uv_poll_t>,
        set: EpollSet,
        polling: Cell<bool>,
    }

    struct Inner {
        uv: UvLoop,
        /// Wakes the poll for `call_soon_threadsafe`; also keeps the loop
        /// alive, so an idle `run_forever` blocks instead of spinning.
        wake: UvHandle<sys::uv_async_t>,
        /// Releases the GIL right before the poll (unreferenced).
        prepare: UvHandle<sys::uv_prepare_t>,
        /// Bounds the poll at the earliest timer deadline (unreferenced); its
        /// callback is empty, the heap is processed after `uv_run` returns.
        timer: UvHandle<sys::uv_timer_t>,
        /// Repeats while clients want housekeeping (unreferenced); its
        /// callback only marks it due, run after `uv_run` returns.
        housekeeping: UvHandle<sys::uv_timer_t>,
        /// Made at the first `add_reader` / `add_writer`.
        fds: OnceCell<FdPoll>,
        /// In `uv_run` (which must not be re-entered).
        running: Cell<bool>,
        /// Closed while running: closes when `uv_run` returns.
        close_asked: Cell<bool>,
    }

    /// The loop's libuv loop and handles; null once closed. Every method
    /// takes the GIL token.
    pub(crate) struct LoopHandles {
        inner: Cell<*mut Inner>,
    }

    // SAFETY: the cell and the handles are only reached with the GIL held
    // (every method takes the token), or by libuv's callbacks on the thread
    // running `uv_run` (inside `run_uv`, which holds the GIL or handed it
    // over to nobody else's use of these). uv_async_send, the one call made
    // from other threads, is thread-safe.
    unsafe impl Sync for LoopHandles {}
    // SAFETY: as above; the allocations are not tied to a thread.
    unsafe impl Send for LoopHandles {}

    impl LoopHandles {
        /// A new libuv loop with its handles; a libuv error code on failure.
        pub(crate) fn new() -> Result<Self, i32> {
            let uv = UvLoop::new()?;
            let wake = UvHandle::<sys::uv_async_t>::zeroed();
            let prepare = UvHandle::<sys::uv_prepare_t>::zeroed();
            let timer = UvHandle::<sys::uv_timer_t>::zeroed();
            let housekeeping = UvHandle::<sys::uv_timer_t>::zeroed();
            // SAFETY: fresh handles initialised on the fresh loop (prepare and
            // timer inits cannot fail). If the first init fails, nothing is
            // on the loop: the handles are freed directly and the loop closed.
            unsafe {
                let rc = sys::uv_async_init(uv.raw(), wake.raw(), Some(on_wake));
                if rc < 0 {
                    wake.free_uninit();
                    prepare.free_uninit();
                    timer.free_uninit();
                    housekeeping.free_uninit();
                    uv.close();
                    return Err(rc);
                }
                sys::uv_prepare_init(uv.raw(), prepare.raw());
                sys::uv_unref(prepare.as_handle());
                sys::uv_timer_init(uv.raw(), timer.raw());
                sys::uv_unref(timer.as_handle());
                sys::uv_timer_init(uv.raw(), housekeeping.raw());
                sys::uv_unref(housekeeping.as_handle());
            }
            let inner = Inner {
                uv,
                wake,
                prepare,
                timer,
                housekeeping,
                fds: OnceCell::new(),
                running: Cell::new(false),
                close_asked: Cell::new(false),
            };
            Ok(LoopHandles { inner: Cell::new(Box::into_raw(Box::new(inner))) })
        }

        /// The open loop's handles. A borrow does not outlive the method
        /// that takes it, and none runs code that could close the loop but
        /// `run` (which defers the close).
        #[inline(always)]
        fn get(&self) -> Option<&Inner> {
            // SAFETY: null, or the allocation `new` made, freed only by
            // `close_now`, which no borrow outlives (see above).
            unsafe { self.inner.get().as_ref() }
        }

        /// The libuv loop, while open (for the transports' handles, made on
        /// it in uv.rs).
        #[inline]
        pub(crate) fn raw_loop(&self, _py: Python<'_>) -> Option<*mut sys::uv_loop_t> {
            self.get().map(|i| i.uv.raw())
        }

        /// Wakes the poll (from any thread).
        #[inline]
        pub(crate) fn wake(&self, _py: Python<'_>) {
            if let Some(i) = self.get() {
                // SAFETY: an open async handle; uv_async_send is thread-safe.
                unsafe { sys::uv_async_send(i.wake.raw()) };
            }
        }

        /// Makes the current `uv_run` return as soon as it can.
        #[inline]
        pub(crate) fn stop(&self, _py: Python<'_>) {
            if let Some(i) = self.get() {
                // SAFETY: an open loop.
                unsafe { sys::uv_stop(i.uv.raw()) };
            }
        }

        /// Starts the prepare handle (the GIL's release before each poll);
        /// false if the loop is closed.
        pub(crate) fn prepare_start(&self, _py: Python<'_>) -> bool {
            let Some(i) = self.get() else { return false };
            // SAFETY: an open prepare handle; its callback finds the loop
            // state in the loop's data (or nothing).
            unsafe { sys::uv_prepare_start(i.prepare.raw(), Some(on_prepare)) };
            true
        }

        pub(crate) fn prepare_stop(&self, _py: Python<'_>) {
            if let Some(i) = self.get() {
                // SAFETY: an open prepare handle.
                unsafe { sys::uv_prepare_stop(i.prepare.raw()) };
            }
        }

        /// Arms the timer to end the poll `delay_ms` from libuv's clock.
        #[inline]
        pub(crate) fn timer_start(&self, _py: Python<'_>, delay_ms: u64) {
            if let Some(i) = self.get() {
                // SAFETY: an open timer handle with an empty callback.
                unsafe { sys::uv_timer_start(i.timer.raw(), Some(on_timer), delay_ms, 0) };
            }
        }

        /// Whether the timer is armed and has not fired yet.
        #[inline]
        pub(crate) fn timer_active(&self, _py: Python<'_>) -> bool {
            // SAFETY: an open timer handle.
            self.get().is_some_and(|i| unsafe { sys::uv_is_active(i.timer.as_handle()) } != 0)
        }

        #[inline]
        pub(crate) fn timer_stop(&self, _py: Python<'_>) {
            if let Some(i) = self.get() {
                // SAFETY: an open timer handle.
                unsafe { sys::uv_timer_stop(i.timer.raw()) };
            }
        }

        /// Starts the housekeeping timer, every `period_ms` (unless it runs).
        pub(crate) fn housekeeping_start(&self, _py: Python<'_>, period_ms: u64) {
            if let Some(i) = self.get() {
                // SAFETY: an open timer handle; its callback finds the loop
                // state in the loop's data (or nothing).
                unsafe {
                    if sys::uv_is_active(i.housekeeping.as_handle()) == 0 {
                        sys::uv_timer_start(i.housekeeping.raw(), Some(on_housekeeping), period_ms, period_ms);
                    }
                }
            }
        }

        pub(crate) fn housekeeping_stop(&self, _py: Python<'_>) {
            if let Some(i) = self.get() {
                // SAFETY: an open timer handle.
                unsafe { sys::uv_timer_stop(i.housekeeping.raw()) };
            }
        }

        /// libuv's clock (ms), refreshed; None once closed.
        #[inline]
        pub(crate) fn now_ms(&self, _py: Python<'_>) -> Option<u64> {
            self.get().map(|i| i.uv.now_ms())
        }

        /// See `UvLoop::adopt_after_fork`.
        pub(crate) fn adopt_after_fork(&self, _py: Python<'_>) {
            if let Some(i) = self.get() {
                i.uv.adopt_after_fork();
            }
        }

        /// Makes the fd watchers' epoll set and libuv's (unreferenced)
        /// watch on it, if not made yet: a positive errno on failure, or
        /// EBADF for a closed loop.
        pub(crate) fn fds_open(&self, _py: Python<'_>) -> Result<(), i32> {
            let Some(i) = self.get() else { return Err(libc::EBADF) };
            if i.fds.get().is_some() {
                return Ok(());
            }
            let set = EpollSet::new()?;
            let poll = UvHandle::<sys::uv_poll_t>::zeroed();
            // SAFETY: a fresh handle on the open loop, over the set's fd,
            // which lives as long as the handle (they close together); an
            // init failure frees it directly.
            unsafe {
                let rc = sys::uv_poll_init(i.uv.raw(), poll.raw(), set.raw_fd());
                if rc < 0 {
                    poll.free_uninit();
                    return Err(super::errno_of(rc));
                }
                sys::uv_unref(poll.as_handle());
            }
            let made = i.fds.set(FdPoll { poll, set, polling: Cell::new(false) });
            debug_assert!(made.is_ok(), "made once");
            Ok(())
        }

        /// The epoll set, once `fds_open` made it. (Private: no borrow of
        /// the handles leaves this type, so none outlives a close.)
        #[inline]
        fn fd_set(&self) -> Option<&EpollSet> {
            self.get()?.fds.get().map(|f| &f.set)
        }

        /// `EpollSet::add` on the fd watchers' set (EBADF before
        /// `fds_open`, or once closed).
        #[inline]
        pub(crate) fn fd_add(&self, _py: Python<'_>, fd: i32, events: u32) -> Result<(), i32> {
            self.fd_set().map_or(Err(libc::EBADF), |s| s.add(fd, events))
        }

        /// `EpollSet::modify` on the fd watchers' set.
        #[inline]
        pub(crate) fn fd_modify(&self, _py: Python<'_>, fd: i32, events: u32) -> Result<(), i32> {
            self.fd_set().map_or(Err(libc::EBADF), |s| s.modify(fd, events))
        }

        /// `EpollSet::delete` on the fd watchers' set.
        #[inline]
        pub(crate) fn fd_delete(&self, _py: Python<'_>, fd: i32) -> Result<(), i32> {
            self.fd_set().map_or(Err(libc::EBADF), |s| s.delete(fd))
        }

        /// `EpollSet::ready` on the fd watchers' set (0 without one).
        #[inline]
        pub(crate) fn fds_ready(&self, _py: Python<'_>, events: &mut [libc::epoll_event]) -> usize {
            self.fd_set().map_or(0, |s| s.ready(events))
        }

        /// Has libuv watch the epoll set from now on (once).
        pub(crate) fn fds_watch(&self, _py: Python<'_>) {
            let Some(f) = self.get().and_then(|i| i.fds.get()) else { return };
            if f.polling.replace(true) {
                return;
            }
            // SAFETY: an open poll handle; its callback finds the loop state
            // in the loop's data (or nothing).
            unsafe { sys::uv_poll_start(f.poll.raw(), sys::uv_poll_event_UV_READABLE as i32, Some(on_fds)) };
        }

        /// Closes every handle, then the loop (while `run` runs: once it
        /// returns). Afterwards every method does nothing.
        pub(crate) fn close(&self, _py: Python<'_>) {
            let Some(i) = self.get() else { return };
            if i.running.get() {
                i.close_asked.set(true);
                return;
            }
            self.close_now();
        }

        fn close_now(&self) {
            let raw = self.inner.replace(ptr::null_mut());
            if raw.is_null() {
                return;
            }
            // SAFETY: the allocation `new` made, no longer reachable through
            // self, and no borrow of it is live (not running).
            let inner = unsafe { Box::from_raw(raw) };
            let Inner { uv, wake, prepare, timer, housekeeping, fds, .. } = *inner;
            if let Some(f) = fds.into_inner() {
                // uv_close stops watching the set's fd at once; the fd
                // closes after.
                f.poll.close();
                drop(f.set);
            }
            wake.close();
            prepare.close();
            timer.close();
            housekeeping.close();
            // SAFETY: every handle of the loop's own is closed; the
            // transports' and lookups' were closed by their owners first
            // (the loop's clients), and no method reaches the loop again.
            unsafe { uv.close() };
        }

        /// One `uv_run` of the open loop, the callbacks finding `shared` in
        /// the loop's data; false (nothing run) if closed or already running.
        #[inline(always)]
        fn run(&self, shared: &LoopShared, mode: RunMode) -> bool {
            let Some(i) = self.get() else { return false };
            if i.running.replace(true) {
                return false;
            }
            let raw = i.uv.raw();
            let mode = match mode {
                RunMode::NoWait => sys::uv_run_mode_UV_RUN_NOWAIT,
                RunMode::Once => sys::uv_run_mode_UV_RUN_ONCE,
            };
            // SAFETY: the open loop, not re-entered (`running`), on the
            // thread holding the GIL. Its handles' callbacks reach `shared`
            // through its data only while it runs; the GIL the prepare
            // callback gives away is taken back below at the latest.
            unsafe {
                (*raw).data = shared as *const LoopShared as *mut libc::c_void;
                sys::uv_run(raw, mode);
                (*raw).data = ptr::null_mut();
                shared.reacquire_gil();
            }
            i.running.set(false);
            if i.close_asked.get() {
                self.close_now();
            }
            true
        }
    }

    impl LoopShared {
        /// One `uv_run` of the loop (`may_block`: the GIL goes to other
        /// threads for the poll); false, with nothing run, if the loop is
        /// closed or already running. Native state must not be borrowed
        /// (libuv's callbacks borrow it; debug builds check).
        #[inline(always)]
        pub(crate) fn run_uv(&self, _py: Python<'_>, mode: RunMode, may_block: bool) -> bool {
            crate::cell::check_crossing();
            self.gil().set_release_before_poll(may_block);
            self.uv().run(self, mode)
        }

        /// Gives the GIL away for the poll, if the poll may block.
        ///
        /// # Safety
        /// In the prepare callback, inside `run` (the loop's thread, holding
        /// the GIL; nothing touches Python until it is taken back).
        #[inline(always)]
        unsafe fn release_gil_for_poll(&self) {
            let gil = self.gil();
            if gil.release_before_poll() && !gil.thread().is_saved() {
                gil.wait_begins();
                // SAFETY: per the contract.
                unsafe { gil.thread().save() };
            }
        }

        /// The first step of every libuv callback that touches Python
        /// objects: takes the GIL back if the poll gave it away, and tells
        /// the turn that I/O happened.
        ///
        /// # Safety
        /// Called on the loop thread, inside `uv_run`.
        #[inline(always)]
        pub(crate) unsafe fn enter_io(&self) -> Python<'_> {
            // SAFETY: per the contract.
            let py = unsafe { self.reacquire_gil() };
            self.io_happened();
            py
        }

        /// Takes the GIL back in a libuv callback that saw no I/O (a close
        /// callback), or after `uv_run`.
        ///
        /// # Safety
        /// As for `enter_io`.
        #[inline(always)]
        pub(crate) unsafe fn reacquire_gil(&self) -> Python<'_> {
            let gil = self.gil();
            // SAFETY: per the contract, the thread that gave it away (the
            // prepare callback of this loop's `uv_run`), if any did; then
            // the GIL is held.
            unsafe {
                if gil.thread().restore() {
                    gil.wait_over(Python::assume_attached());
                }
                Python::assume_attached()
            }
        }
    }

    /// The loop state of a loop handle's callback: null outside `run`.
    ///
    /// # Safety
    /// `handle` is a live handle of a loop made by `LoopHandles::new`.
    #[inline(always)]
    unsafe fn shared_of<'a, H>(handle: *mut H) -> Option<&'a LoopShared> {
        // SAFETY: per the contract; the data is set by `run` from a live
        // reference for the length of uv_run, the only time callbacks run.
        unsafe {
            let uv_loop = (*(handle as *mut sys::uv_handle_t)).loop_;
            ((*uv_loop).data as *const LoopShared).as_ref()
        }
    }

    unsafe extern "C" fn on_prepare(handle: *mut sys::uv_prepare_t) {
        // SAFETY: the loop's prepare handle, inside `run`.
        unsafe {
            if let Some(shared) = shared_of(handle) {
                shared.release_gil_for_poll();
            }
        }
    }

    unsafe extern "C" fn on_wake(handle: *mut sys::uv_async_t) {
        // SAFETY: the loop's async handle, inside `run` (maybe without the
        // GIL: `woken` only counts, atomically).
        if let Some(shared) = unsafe { shared_of(handle) } {
            shared.woken();
        }
    }

    unsafe extern "C" fn on_timer(_handle: *mut sys::uv_timer_t) {}

    unsafe extern "C" fn on_housekeeping(handle: *mut sys::uv_timer_t) {
        // SAFETY: the loop's housekeeping timer, inside `run` (maybe
        // without the GIL: it only sets a loop-thread flag).
        if let Some(shared) = unsafe { shared_of(handle) } {
            shared.housekeeping_due();
        }
    }

    unsafe extern "C" fn on_fds(handle: *mut sys::uv_poll_t, _status: i32, _events: i32) {
        // SAFETY: the loop's fd poll, inside `run`, on the loop's thread.
        unsafe {
            if let Some(shared) = shared_of(handle) {
                let py = shared.enter_io();
                shared.fds_ready(py);
            }
        }
    }

    /// `client.before_poll`, at the end of the turn; `keep_alive` is the
    /// client's object, kept alive until then (`LoopShared::before_poll`).
    #[inline]
    pub(crate) fn client_before_poll(py: Python<'_>, client: ClientPtr, keep_alive: &Py<PyAny>) -> PyResult<()> {
        let _ = keep_alive;
        // SAFETY: ClientPtr's contract: a client asking for before_poll is
        // kept alive by `keep_alive` until it ran.
        unsafe { (*client.0).before_poll(py) }
    }

    /// `client.housekeeping`, for a client on the housekeeping list.
    pub(crate) fn client_housekeeping(py: Python<'_>, client: ClientPtr) -> bool {
        // SAFETY: ClientPtr's contract: a client on the housekeeping list is
        // registered, hence alive (unregistering takes it off the list).
        unsafe { (*client.0).housekeeping(py) }
    }

    /// `client.close_with_loop`, for a client registered at the loop's close.
    pub(crate) fn client_close_with_loop(py: Python<'_>, client: ClientPtr) {
        // SAFETY: ClientPtr's contract: a registered client is alive (it
        // unregisters before it is freed).
        unsafe { (*client.0).close_with_loop(py) }
    }

    // SAFETY: the loop thread's cells (`io_seen`, `turns`, `poll_wanted`, the
    // GIL hand-off) are only touched on the loop's thread, inside uv_run and
    // around it; the state is in a NativeCell and the libuv handles in
    // LoopHandles (GIL held); the stats' counters are touched with the GIL
    // held, but for `wakeups`, an atomic.
    unsafe impl Sync for LoopShared {}
    // SAFETY: as above.
    unsafe impl Send for LoopShared {}
}

// ---- end of section: eventloop ----
