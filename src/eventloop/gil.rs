//! Handing the GIL to other threads while the loop waits in the kernel.
//!
//! The loop holds the GIL for its whole turn except the poll: a prepare
//! handle (run by libuv just before it polls) releases it, and the first
//! libuv callback after the poll, or the return from `uv_run`, takes it back.
//! So it is released and retaken once per turn, never per callback, and
//! libuv callbacks that touch Python objects call `LoopShared::enter_io`
//! first.
//!
//! While the loop's stats are on, the time between the release and the
//! taking back is the time the loop waited in the poll (stats.rs).
//!
//! A signal that ended the wait has its Python handler run right where the
//! GIL comes back, outside any callback: what the handler raises (Ctrl-C's
//! KeyboardInterrupt, or any exception) leaves `run_forever`, as it leaves
//! asyncio's when the handler runs between two callbacks.

use std::cell::Cell;

use pyo3::{PyErr, Python};

use super::stats;
use crate::capi::eventloop::SavedThread;

/// The hand-off's state. The GIL itself is given away and taken back in
/// uv.rs (`LoopShared::reacquire_gil` and the prepare callback), through
/// `SavedThread`; this keeps what goes with it.
pub(crate) struct GilHandoff {
    /// The loop thread's state while it does not hold the GIL.
    thread: SavedThread,
    /// Whether the coming poll may block (only then is the GIL released).
    release_before_poll: Cell<bool>,
    /// What a Python signal handler raised when the GIL came back.
    signal_error: Cell<Option<PyErr>>,
    /// Time the waits (the loop's stats are on); when the current one began
    /// and the total so far, in ticks of the stats clock.
    timing: Cell<bool>,
    wait_began: Cell<u64>,
    waited: Cell<u64>,
}

impl GilHandoff {
    pub(crate) fn new() -> Self {
        GilHandoff {
            thread: SavedThread::new(),
            release_before_poll: Cell::new(true),
            signal_error: Cell::new(None),
            timing: Cell::new(false),
            wait_began: Cell::new(0),
            waited: Cell::new(0),
        }
    }

    /// The saved thread state (uv.rs releases and restores it).
    #[inline(always)]
    pub(crate) fn thread(&self) -> &SavedThread {
        &self.thread
    }

    pub(crate) fn set_timing(&self, on: bool) {
        self.timing.set(on);
    }

    /// The time spent waiting in the poll so far (ticks), not counting a
    /// wait in progress.
    pub(crate) fn waited(&self) -> u64 {
        self.waited.get()
    }

    /// The same with a wait in progress (a snapshot taken by another thread
    /// while the loop polls) counted up to `now`.
    pub(crate) fn waited_until(&self, now: u64) -> u64 {
        let began = self.wait_began.get();
        self.waited.get() + if began != 0 { now.saturating_sub(began) } else { 0 }
    }

    pub(crate) fn reset_waited(&self) {
        self.waited.set(0);
    }

    pub(crate) fn set_release_before_poll(&self, release: bool) {
        self.release_before_poll.set(release);
    }

    /// Whether the poll about to begin may block, so the GIL goes.
    #[inline(always)]
    pub(crate) fn release_before_poll(&self) -> bool {
        self.release_before_poll.get()
    }

    /// The GIL is about to be given away for the poll.
    #[inline(always)]
    pub(crate) fn wait_begins(&self) {
        if self.timing.get() {
            self.wait_began.set(stats::now().max(1));
        }
    }

    /// The GIL is back after the poll: the wait's time, and the Python
    /// signal handlers of signals that came meanwhile.
    #[inline(always)]
    pub(crate) fn wait_over(&self, py: Python<'_>) {
        let began = self.wait_began.replace(0);
        if began != 0 {
            self.wait_ended(began);
        }
        if let Err(err) = py.check_signals() {
            let first = self.signal_error.take();
            self.signal_error.set(first.or(Some(err)));
        }
    }

    /// A timed wait that began at `began` is over (kept out of `wait_over`,
    /// which is inlined into every libuv callback).
    #[cold]
    #[inline(never)]
    fn wait_ended(&self, began: u64) {
        self.waited.set(self.waited.get() + stats::now().saturating_sub(began));
    }

    /// What a signal handler raised when the GIL was last taken back.
    pub(crate) fn take_signal_error(&self) -> Option<PyErr> {
        self.signal_error.take()
    }
}
