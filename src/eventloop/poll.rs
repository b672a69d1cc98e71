//! `add_reader` / `add_writer`: one `uv_poll_t` per watched file descriptor.
//!
//! A watcher keeps the reader and writer handles of its descriptor. When the
//! descriptor is ready the poll callback queues the matching handle on the
//! ready queue, like asyncio's selector loop does, so the callbacks run in
//! the loop's turn in order with everything else.

use std::mem::MaybeUninit;

use pyo3::prelude::*;

use super::LoopState;
use crate::handles::{Handle, Ready};
use crate::uv::{sys, HandleBox, UvHandle};

#[repr(C)]
pub(crate) struct FdWatcher {
    /// Must stay the first field (see `HandleBox`).
    poll: sys::uv_poll_t,
    state: *mut LoopState,
    reader: Option<Py<Handle>>,
    writer: Option<Py<Handle>>,
}

// SAFETY: repr(C) with the uv_poll_t first.
unsafe impl HandleBox for FdWatcher {}

pub(crate) type Watcher = UvHandle<FdWatcher>;

/// Which side of a descriptor a handler watches.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Read,
    Write,
}

/// Creates the watcher for `fd`, leaving the descriptor's blocking mode as it
/// was (libuv makes it non-blocking; asyncio does not touch it).
pub(crate) fn new_watcher(state: *mut LoopState, uv_loop: *mut sys::uv_loop_t, fd: i32) -> Result<Watcher, i32> {
    let w = UvHandle::new(FdWatcher {
        // SAFETY: initialised by uv_poll_init below.
        poll: unsafe { MaybeUninit::zeroed().assume_init() },
        state,
        reader: None,
        writer: None,
    });
    // SAFETY: fcntl on a caller-supplied descriptor only reads/sets flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        w.free_uninit();
        return Err(-std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EBADF));
    }
    // SAFETY: the watcher allocation is valid; on error libuv did not keep it.
    let rc = unsafe { sys::uv_poll_init(uv_loop, &mut (*w.raw()).poll, fd) };
    if rc < 0 {
        w.free_uninit();
        return Err(rc);
    }
    if flags & libc::O_NONBLOCK == 0 {
        unsafe { libc::fcntl(fd, libc::F_SETFL, flags) };
    }
    w.set_data(w.raw());
    Ok(w)
}

impl FdWatcher {
    /// Replaces the handler of one side; returns the old one.
    pub(crate) fn set(&mut self, side: Side, handle: Option<Py<Handle>>) -> Option<Py<Handle>> {
        match side {
            Side::Read => std::mem::replace(&mut self.reader, handle),
            Side::Write => std::mem::replace(&mut self.writer, handle),
        }
    }

    pub(crate) fn reader_ref(&self, py: Python<'_>) -> Option<Py<Handle>> {
        self.reader.as_ref().map(|h| h.clone_ref(py))
    }

    pub(crate) fn writer_ref(&self, py: Python<'_>) -> Option<Py<Handle>> {
        self.writer.as_ref().map(|h| h.clone_ref(py))
    }

    pub(crate) fn handlers(&self) -> impl Iterator<Item = &Py<Handle>> {
        self.reader.iter().chain(self.writer.iter())
    }

    pub(crate) fn is_idle(&self) -> bool {
        self.reader.is_none() && self.writer.is_none()
    }

    /// Takes both handlers (loop close).
    pub(crate) fn take_all(&mut self) -> [Option<Py<Handle>>; 2] {
        [self.reader.take(), self.writer.take()]
    }

    /// Starts polling for the sides that have handlers (or stops if none).
    pub(crate) fn update(&mut self) -> Result<(), i32> {
        let mut events = 0;
        if self.reader.is_some() {
            events |= sys::uv_poll_event_UV_READABLE as i32;
        }
        if self.writer.is_some() {
            events |= sys::uv_poll_event_UV_WRITABLE as i32;
        }
        // SAFETY: the poll handle is initialised and owned by this watcher.
        let rc = unsafe {
            if events == 0 {
                sys::uv_poll_stop(&mut self.poll)
            } else {
                sys::uv_poll_start(&mut self.poll, events, Some(on_poll))
            }
        };
        if rc < 0 {
            Err(rc)
        } else {
            Ok(())
        }
    }
}

unsafe extern "C" fn on_poll(handle: *mut sys::uv_poll_t, status: i32, events: i32) {
    // SAFETY: data points at the FdWatcher that owns this handle, and its
    // state pointer at the live loop state (watchers close before the loop).
    unsafe {
        let w = &mut *((*handle).data as *mut FdWatcher);
        let st = &mut *w.state;
        st.gil.reacquire();
        st.io_seen = true;
        let py = Python::assume_attached();
        // An error (e.g. the descriptor was closed under us) wakes both sides
        // so their callbacks see it, as a selector reports it.
        let events = if status < 0 {
            (sys::uv_poll_event_UV_READABLE | sys::uv_poll_event_UV_WRITABLE) as i32
        } else {
            events
        };
        if events & sys::uv_poll_event_UV_READABLE as i32 != 0 {
            if let Some(h) = &w.reader {
                st.ready.push_back(Ready::Soon(h.clone_ref(py)));
            }
        }
        if events & sys::uv_poll_event_UV_WRITABLE as i32 != 0 {
            if let Some(h) = &w.writer {
                st.ready.push_back(Ready::Soon(h.clone_ref(py)));
            }
        }
    }
}
