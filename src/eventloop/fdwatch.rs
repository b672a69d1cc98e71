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
use crate::handles::{Handle, Ready};
use crate::os::eventloop::{pid, NO_EVENT};
use crate::uv::eventloop::LoopHandles;

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

/// The handlers of the watched descriptors. The epoll set itself, and
/// libuv's watch on it, are the loop's (`LoopHandles`), and close with it.
pub(crate) struct FdWatchers {
    entries: HashMap<i32, Entry>,
    /// The process that made the set. A forked child shares the epoll set
    /// with its parent: it must never unregister anything from it.
    pid: libc::pid_t,
}

impl FdWatchers {
    /// No descriptor watched yet (the loop's `fds_open` made the set).
    pub(crate) fn new() -> Self {
        FdWatchers { entries: HashMap::new(), pid: pid() }
    }

    /// Sets (or replaces) the handler of one side of `fd`; returns the old
    /// one, or a positive errno if the kernel refused the descriptor.
    pub(crate) fn set(
        &mut self,
        py: Python<'_>,
        uv: &LoopHandles,
        fd: i32,
        side: Side,
        handle: Py<Handle>,
    ) -> Result<Option<Py<Handle>>, i32> {
        let entry = self.entries.entry(fd).or_default();
        let before = entry.mask();
        let old = entry.slot(side).replace(handle);
        let after = entry.mask();
        if before != after {
            let done = if before == 0 { uv.fd_add(py, fd, after) } else { uv.fd_modify(py, fd, after) };
            if let Err(err) = done {
                let entry = self.entries.get_mut(&fd).expect("present");
                let mine = std::mem::replace(entry.slot(side), old);
                if entry.mask() == 0 {
                    self.entries.remove(&fd);
                }
                drop(mine);
                return Err(err);
            }
        }
        self.update_polling(py, uv);
        Ok(old)
    }

    /// Removes the handler of one side of `fd`, returning it.
    pub(crate) fn clear(&mut self, py: Python<'_>, uv: &LoopHandles, fd: i32, side: Side) -> Option<Py<Handle>> {
        let entry = self.entries.get_mut(&fd)?;
        let old = entry.slot(side).take()?;
        let mask = entry.mask();
        // A descriptor already closed has left the set: the error is
        // expected and ignored, as selectors do.
        let _ = if mask == 0 { uv.fd_delete(py, fd) } else { uv.fd_modify(py, fd, mask) };
        if mask == 0 {
            self.entries.remove(&fd);
        }
        self.update_polling(py, uv);
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
        pid() != self.pid
    }

    /// Unregisters everything, handing the handlers to the caller.
    pub(crate) fn take_all(&mut self, py: Python<'_>, uv: &LoopHandles) -> Vec<Py<Handle>> {
        let mut out = Vec::new();
        let shared_with_parent = self.inherited();
        for (fd, e) in self.entries.drain() {
            if !shared_with_parent {
                // A closed fd has left the set already.
                let _ = uv.fd_delete(py, fd);
            }
            out.extend(e.reader);
            out.extend(e.writer);
        }
        out
    }

    /// Polls the set from the first registration on. An empty set never
    /// reports anything, so the watch stays (starting and stopping it per
    /// registration would cost libuv epoll_ctl calls on every connection).
    fn update_polling(&mut self, py: Python<'_>, uv: &LoopHandles) {
        if !self.entries.is_empty() {
            uv.fds_watch(py);
        }
    }

    /// Queues the handlers of every ready descriptor; returns how many
    /// descriptors were ready.
    fn dispatch(&mut self, py: Python<'_>, uv: &LoopHandles, ready: &mut std::collections::VecDeque<Ready>) -> u64 {
        const MAX_EVENTS: usize = 256;
        let mut events = [NO_EVENT; MAX_EVENTS];
        let n = uv.fds_ready(py, &mut events);
        for ev in &events[..n] {
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
        n as u64
    }
}

impl LoopShared {
    /// The epoll set is ready (libuv's poll callback, with the GIL): the
    /// ready descriptors' handlers join the ready queue.
    pub(crate) fn fds_ready(&self, py: Python<'_>) {
        let uv = &self.uv;
        let events = self.state.with(py, |st| match st.uv.as_mut().and_then(|p| p.fds.as_mut()) {
            Some(fds) => fds.dispatch(py, uv, &mut st.ready),
            None => 0,
        });
        // Each ready descriptor is an I/O event; enter_io counted one already
        // (taken back, wrapping, when none was ready).
        LoopStats::add(&self.stats.io_events, events.wrapping_sub(1));
    }
}
