//! `add_reader` / `add_writer`: a selector inside the loop.
//!
//! The descriptors users watch live in a private epoll set, and libuv polls
//! only that set's own fd (one `uv_poll_t`). Registering and unregistering
//! are immediate `epoll_ctl` calls, so errors surface at once (PermissionError
//! for a regular file, EBADF for a closed fd) exactly as with asyncio's
//! selector, a descriptor closed while watched simply drops out of the set,
//! and libuv never sees a user's fd: a fd closed behind its back cannot make
//! libuv abort, and a transport's fd (owned by a libuv stream) can be watched
//! too (sendfile waits for it to be writable).
//!
//! When the set is ready, its events queue the matching reader and writer
//! handles on the ready queue, as asyncio's selector loop does, so they run in
//! the loop's turn in order with everything else.

use std::collections::HashMap;

use pyo3::prelude::*;

use super::stats::LoopStats;
use super::LoopShared;
use crate::errors::last_errno;
use crate::handles::{Handle, Ready};
use crate::uv::{sys, UvHandle};

/// Which side of a descriptor a handler watches.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Read,
    Write,
}

#[derive(Default)]
struct Entry {
    reader: Option<Py<Handle>>,
    writer: Option<Py<Handle>>,
}

impl Entry {
    fn slot(&mut self, side: Side) -> &mut Option<Py<Handle>> {
        match side {
            Side::Read => &mut self.reader,
            Side::Write => &mut self.writer,
        }
    }

    fn mask(&self) -> u32 {
        let mut m = 0;
        if self.reader.is_some() {
            m |= libc::EPOLLIN as u32;
        }
        if self.writer.is_some() {
            m |= libc::EPOLLOUT as u32;
        }
        m
    }
}

pub(crate) struct FdWatchers {
    epfd: i32,
    /// libuv's watch on `epfd`; its data points at the loop.
    poll: Option<UvHandle<sys::uv_poll_t>>,
    polling: bool,
    entries: HashMap<i32, Entry>,
    /// The process that made the set. A forked child shares the epoll set
    /// with its parent: it must never unregister anything from it.
    pid: libc::pid_t,
}

impl FdWatchers {
    /// A new, empty selector on `uv_loop`; a positive errno on failure.
    pub(crate) fn new(uv_loop: *mut sys::uv_loop_t, shared: *const LoopShared) -> Result<Self, i32> {
        // SAFETY: plain system calls; the poll handle is initialised on an
        // open loop and owned by the returned value.
        unsafe {
            let epfd = libc::epoll_create1(libc::EPOLL_CLOEXEC);
            if epfd < 0 {
                return Err(last_errno());
            }
            let poll = UvHandle::<sys::uv_poll_t>::zeroed();
            let rc = sys::uv_poll_init(uv_loop, poll.raw(), epfd);
            if rc < 0 {
                poll.free_uninit();
                libc::close(epfd);
                return Err(-rc);
            }
            sys::uv_unref(poll.as_handle());
            poll.set_data(shared);
            Ok(FdWatchers { epfd, poll: Some(poll), polling: false, entries: HashMap::new(), pid: libc::getpid() })
        }
    }

    /// Sets (or replaces) the handler of one side of `fd`; returns the old
    /// one, or a positive errno if the kernel refused the descriptor.
    pub(crate) fn set(&mut self, fd: i32, side: Side, handle: Py<Handle>) -> Result<Option<Py<Handle>>, i32> {
        let entry = self.entries.entry(fd).or_default();
        let before = entry.mask();
        let old = entry.slot(side).replace(handle);
        let after = entry.mask();
        if before != after {
            let op = if before == 0 { libc::EPOLL_CTL_ADD } else { libc::EPOLL_CTL_MOD };
            let mut ev = libc::epoll_event { events: after, u64: fd as u64 };
            // SAFETY: epfd is ours; the kernel validates fd.
            if unsafe { libc::epoll_ctl(self.epfd, op, fd, &mut ev) } < 0 {
                let err = last_errno();
                let entry = self.entries.get_mut(&fd).expect("present");
                let mine = std::mem::replace(entry.slot(side), old);
                if entry.mask() == 0 {
                    self.entries.remove(&fd);
                }
                drop(mine);
                return Err(err);
            }
        }
        self.update_polling();
        Ok(old)
    }

    /// Removes the handler of one side of `fd`, returning it.
    pub(crate) fn clear(&mut self, fd: i32, side: Side) -> Option<Py<Handle>> {
        let entry = self.entries.get_mut(&fd)?;
        let old = entry.slot(side).take()?;
        let mask = entry.mask();
        let mut ev = libc::epoll_event { events: mask, u64: fd as u64 };
        // SAFETY: as in set(). A descriptor already closed has left the set:
        // the error is expected and ignored, as selectors do.
        unsafe {
            if mask == 0 {
                libc::epoll_ctl(self.epfd, libc::EPOLL_CTL_DEL, fd, &mut ev);
            } else {
                libc::epoll_ctl(self.epfd, libc::EPOLL_CTL_MOD, fd, &mut ev);
            }
        }
        if mask == 0 {
            self.entries.remove(&fd);
        }
        self.update_polling();
        Some(old)
    }

    /// The (reader, writer) handles of `fd`.
    pub(crate) fn get(&self, fd: i32) -> (Option<&Py<Handle>>, Option<&Py<Handle>>) {
        match self.entries.get(&fd) {
            Some(e) => (e.reader.as_ref(), e.writer.as_ref()),
            None => (None, None),
        }
    }

    pub(crate) fn handlers(&self) -> impl Iterator<Item = &Py<Handle>> {
        self.entries.values().flat_map(|e| e.reader.iter().chain(e.writer.iter()))
    }

    /// Whether this process is a fork of the one that made the set.
    fn inherited(&self) -> bool {
        // SAFETY: getpid has no preconditions.
        unsafe { libc::getpid() != self.pid }
    }

    /// Unregisters everything, handing the handlers to the caller.
    pub(crate) fn take_all(&mut self) -> Vec<Py<Handle>> {
        let mut out = Vec::new();
        let shared_with_parent = self.inherited();
        for (fd, e) in self.entries.drain() {
            if !shared_with_parent {
                let mut ev = libc::epoll_event { events: 0, u64: 0 };
                // SAFETY: epfd is ours; a closed fd has left the set already.
                unsafe { libc::epoll_ctl(self.epfd, libc::EPOLL_CTL_DEL, fd, &mut ev) };
            }
            out.extend(e.reader);
            out.extend(e.writer);
        }
        self.update_polling();
        out
    }

    /// Polls `epfd` from the first registration on. An empty set never
    /// reports anything, so the watch stays (starting and stopping it per
    /// registration would cost libuv epoll_ctl calls on every connection).
    fn update_polling(&mut self) {
        let want = !self.entries.is_empty();
        if !want || self.polling {
            return;
        }
        let Some(poll) = &self.poll else { return };
        // SAFETY: the poll handle is initialised and owned here.
        unsafe { sys::uv_poll_start(poll.raw(), sys::uv_poll_event_UV_READABLE as i32, Some(on_ready)) };
        self.polling = true;
    }

    /// Queues the handlers of every ready descriptor; returns how many
    /// descriptors were ready.
    fn dispatch(&mut self, py: Python<'_>, ready: &mut std::collections::VecDeque<Ready>) -> u64 {
        const MAX_EVENTS: usize = 256;
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; MAX_EVENTS];
        // SAFETY: epfd is ours; the buffer holds MAX_EVENTS entries.
        let n = unsafe { libc::epoll_wait(self.epfd, events.as_mut_ptr(), MAX_EVENTS as i32, 0) };
        for ev in &events[..n.max(0) as usize] {
            let fd = ev.u64 as i32;
            let Some(entry) = self.entries.get(&fd) else { continue };
            let bits = ev.events;
            // As selectors.EpollSelector: anything but a pure EPOLLOUT wakes
            // the reader, anything but a pure EPOLLIN wakes the writer.
            if bits & !(libc::EPOLLOUT as u32) != 0 {
                if let Some(h) = &entry.reader {
                    ready.push_back(Ready::Soon(h.clone_ref(py)));
                }
            }
            if bits & !(libc::EPOLLIN as u32) != 0 {
                if let Some(h) = &entry.writer {
                    ready.push_back(Ready::Soon(h.clone_ref(py)));
                }
            }
        }
        n.max(0) as u64
    }

    /// Closes libuv's watch and the epoll set (loop close; in a forked
    /// child, only this process's copy of the set's fd).
    pub(crate) fn close(mut self) {
        if let Some(poll) = self.poll.take() {
            poll.close();
        }
        // SAFETY: libuv stopped watching epfd when its handle closed (uv_close
        // unregisters at once); the fd is ours.
        unsafe { libc::close(self.epfd) };
    }
}

unsafe extern "C" fn on_ready(handle: *mut sys::uv_poll_t, _status: i32, _events: i32) {
    // SAFETY: data is the live loop (the handle closes with the loop).
    let shared = unsafe { &*((*handle).data as *const LoopShared) };
    // SAFETY: on the loop thread, inside uv_run.
    let py = unsafe { shared.enter_io() };
    let events = shared.state.with(py, |st| match st.uv.as_mut().and_then(|p| p.fds.as_mut()) {
        Some(fds) => fds.dispatch(py, &mut st.ready),
        None => 0,
    });
    // Each ready descriptor is an I/O event; enter_io counted one already
    // (taken back, wrapping, when none was ready).
    LoopStats::add(&shared.stats.io_events, events.wrapping_sub(1));
}
