//! The loop core: the native base of `zuvrs.Loop`.
//!
//! `LoopCore` owns the libuv loop and everything that runs per callback:
//! the ready queue, the timer heap, the turn, wake-ups from other threads
//! and the fd watchers. Python code (python/zuvrs/_loop.py) adds what runs
//! once per loop or per run (argument checks, run_forever's set-up,
//! signals, executors).
//!
//! - turn.rs: one turn of the loop (poll, due timers, ready callbacks)
//! - timers.rs: the timer heap behind the single libuv timer
//! - fdwatch.rs: add_reader / add_writer, a selector inside the loop
//! - fastcall.rs: call_soon and friends as vectorcall methods (and the
//!   safe view of vectorcall arguments tasks.rs uses)
//! - tasks.rs: create_task / create_future without a Python frame
//! - gil.rs: handing the GIL to other threads around the poll
//! - clients.rs: the trait through which native objects living on the loop
//!   (transports, name lookups) are flushed before the poll and closed with it
//! - stats.rs: the loop's metrics (counters, lag, busy time, slowest
//!   callbacks) and the clock they are timed with
//!
//! The state other code reaches is `LoopShared`: boxed, so that libuv's
//! handles can point at it, and held by the `LoopCore` for the loop's life.

mod clients;
mod fastcall;
mod fdwatch;
mod gil;
pub(crate) mod stats;
mod tasks;
mod timers;
mod turn;

use std::cell::Cell;
use std::collections::VecDeque;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use pyo3::{PyTraverseError, PyVisit};

use crate::capi::eventloop::{callback_func, ready_object, repeating_state, traverse_ready};
use crate::cell::NativeCell;
use crate::errors::{closed_error, uv_error};
use crate::handles::context::ContextCache;
use crate::handles::{let_go, Callback, Handle, HasState, Ready};
use crate::python;
use crate::uv::eventloop::{client_before_poll, client_close_with_loop, client_housekeeping, LoopHandles};
use crate::uv::sys;
use clients::Clients;
pub(crate) use clients::{ClientPtr, LoopClient};
pub(crate) use fastcall::install_fast_methods;
use fdwatch::{FdWatchers, Side};
use gil::GilHandoff;
use stats::{LoopStats, TurnMarks};
use timers::TimerHeap;

/// Seconds on the monotonic clock, the clock of `time.monotonic()` and of
/// libuv's `uv_now`.
#[inline]
pub(crate) fn monotonic() -> f64 {
    let ts = crate::os::eventloop::monotonic_timespec();
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// The loop's time as its timers see it: `loop.time()` when that is Python
/// code (asyncio's loop reads its own `time()`, so tests and libraries that
/// patch it steer the timers), else the monotonic clock.
#[inline]
pub(crate) fn loop_time(py: Python<'_>, slf: &Bound<'_, PyAny>, shared: &LoopShared) -> PyResult<f64> {
    Ok(python_clock_now(py, slf, shared)?.unwrap_or_else(monotonic))
}

/// `loop.time()` when the loop's clock is Python code, else None (the
/// native clock is read where it is needed).
#[inline]
fn python_clock_now(py: Python<'_>, slf: &Bound<'_, PyAny>, shared: &LoopShared) -> PyResult<Option<f64>> {
    if shared.state.with(py, |st| st.python_clock) {
        return python::call_method0(slf, pyo3::intern!(py, "time"))?.extract().map(Some);
    }
    Ok(None)
}

/// Makes `fut`, a finished C future of a reader's that nothing else sees
/// (`capi::futures::reusable`), what `loop_obj.create_future()` would
/// return, as if new: Ok(false), with `fut` untouched, unless `loop_obj`
/// is a zuvrs loop whose `create_future` is its own and makes C futures.
pub(crate) fn renew_future(loop_obj: &Bound<'_, PyAny>, fut: &Bound<'_, PyAny>) -> PyResult<bool> {
    let py = loop_obj.py();
    match loop_obj.cast::<LoopCore>() {
        Ok(core) if core.get().shared().own_create_future(py) => {
            tasks::renew_future(py, loop_obj, core.get().shared(), fut)
        }
        _ => Ok(false),
    }
}

/// Whether `loop_obj` is a zuvrs loop whose `create_future` is its own.
pub(crate) fn own_create_future(loop_obj: &Bound<'_, PyAny>) -> bool {
    loop_obj.cast::<LoopCore>().is_ok_and(|l| l.get().shared().own_create_future(loop_obj.py()))
}

/// Debug mode's slow-callback warning for protocol callbacks that libuv's
/// I/O callbacks run directly (they have no Handle to time): when the
/// callback that began at `started` took at least slow_callback_duration,
/// `loop._warn_slow_io(transport, seconds)` logs it as asyncio logs a slow
/// `_read_ready`.
pub(crate) fn warn_if_slow_io(py: Python<'_>, loop_obj: &Bound<'_, PyAny>, transport: &Bound<'_, PyAny>, started: f64) {
    let seconds = monotonic() - started;
    let warned = (|| -> PyResult<()> {
        let limit: f64 = loop_obj.getattr(python::event_loop::slow_callback_duration(py))?.extract()?;
        if seconds >= limit && !transport.is_none() {
            python::call_method(loop_obj, python::event_loop::_warn_slow_io(py), (transport, seconds))?;
        }
        Ok(())
    })();
    if let Err(err) = warned {
        err.write_unraisable(py, None);
    }
}

/// What an open loop keeps besides its libuv handles (`LoopShared::uv`).
struct UvParts {
    /// Deadline the uv timer is armed for (NaN when not armed).
    armed_for: f64,
    fds: Option<FdWatchers>,
}

/// How often the loop runs its clients' housekeeping (while any wants it):
/// e.g. a TLS connection idle for a whole period gives back its record
/// buffers.
const HOUSEKEEPING_PERIOD_MS: u64 = 1000;

pub(crate) struct LoopState {
    uv: Option<UvParts>,
    ready: VecDeque<Ready>,
    timers: TimerHeap,
    ctx_cache: ContextCache,
    closed: bool,
    stopping: bool,
    debug: bool,
    /// The loop's `time` is Python code (patched on the instance, or a
    /// subclass's): timers are due by it rather than by the native clock.
    python_clock: bool,
    /// The loop's `create_future` is another than LoopCore's (set on the
    /// instance, or a subclass's): native streams then call it for every
    /// waiter, rather than renew one (`renew_future`).
    python_futures: bool,
    thread_id: Option<Py<PyAny>>,
    /// The thread run_forever runs the loop in (its native id; 0 while it
    /// does not run): while it is the caller's, this loop is the thread's
    /// running loop.
    running_thread: u64,
    /// A KeyboardInterrupt or SystemExit raised by Python code that ran
    /// inside a libuv callback: re-raised once `uv_run` returns.
    pending_error: Option<PyErr>,
    clients: Clients,
    /// `{"loop": <this loop>}`, the keywords `create_future` makes its
    /// futures with (tasks.rs); dropped when the loop closes.
    future_kwargs: Option<Py<pyo3::types::PyDict>>,
}

/// What libuv's callbacks and the native objects living on the loop reach.
pub(crate) struct LoopShared {
    /// Outside the cell: taken back by libuv callbacks before anything else.
    gil: GilHandoff,
    /// Set by libuv callbacks that saw I/O during the current poll.
    io_seen: Cell<bool>,
    /// The turns run so far: the current turn's number (see
    /// `Transport::first_read_waits`).
    turns: Cell<u64>,
    /// The next turn polls even if it would skip an idle poll.
    poll_wanted: Cell<bool>,
    /// The housekeeping timer fired during the current poll.
    housekeeping_fired: Cell<bool>,
    state: NativeCell<LoopState>,
    /// The loop's metrics (`loop.stats()`).
    pub(crate) stats: LoopStats,
    /// The libuv loop and its own handles (outside the state's cell: its
    /// `uv_run` runs callbacks that borrow the state).
    uv: LoopHandles,
}

// (LoopShared is Sync and Send by the argument next to LoopHandles, in uv.rs.)

impl LoopShared {
    /// The GIL's hand-off around the poll (for uv.rs).
    #[inline(always)]
    pub(crate) fn gil(&self) -> &GilHandoff {
        &self.gil
    }

    /// The libuv loop and its handles.
    #[inline(always)]
    pub(crate) fn uv(&self) -> &LoopHandles {
        &self.uv
    }

    /// A libuv callback saw I/O during this poll.
    #[inline(always)]
    pub(crate) fn io_happened(&self) {
        self.io_seen.set(true);
        LoopStats::add(&self.stats.io_events, 1);
    }

    /// The wake-up handle fired (maybe without the GIL: an atomic).
    #[inline]
    pub(crate) fn woken(&self) {
        self.stats.wakeups.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The housekeeping timer fired (in the poll, maybe without the GIL).
    #[inline]
    pub(crate) fn housekeeping_due(&self) {
        self.housekeeping_fired.set(true);
    }

    /// The number of the current turn.
    #[inline]
    pub(crate) fn turn_number(&self) -> u64 {
        self.turns.get()
    }

    /// Makes the next turn poll (a busy turn may otherwise skip it).
    #[inline]
    pub(crate) fn want_poll(&self) {
        self.poll_wanted.set(true);
    }

    /// Whether callbacks are queued to run (in an I/O callback: queued
    /// before this poll, or by an earlier callback of it).
    pub(crate) fn has_ready(&self, py: Python<'_>) -> bool {
        self.state.with(py, |st| !st.ready.is_empty())
    }

    /// The libuv loop, while open.
    pub(crate) fn uv_loop(&self, py: Python<'_>) -> PyResult<*mut sys::uv_loop_t> {
        self.uv.raw_loop(py).ok_or_else(closed_error)
    }

    /// Stops the current `uv_run` and keeps `err` to raise from run_forever.
    pub(crate) fn raise_later(&self, py: Python<'_>, err: PyErr) {
        self.state.with(py, |st| {
            if st.pending_error.is_none() {
                st.pending_error = Some(err);
            }
        });
        self.uv.stop(py);
    }

    /// True while run_forever runs this loop.
    pub(crate) fn is_running(&self, py: Python<'_>) -> bool {
        self.state.with(py, |st| st.thread_id.is_some())
    }

    /// True while run_forever runs this loop in the calling thread.
    #[inline]
    pub(crate) fn runs_here(&self, py: Python<'_>) -> bool {
        let thread = self.state.with(py, |st| st.running_thread);
        thread != 0 && thread == crate::os::eventloop::current_thread()
    }

    /// The time an I/O callback begins, in debug mode only (for
    /// `warn_if_slow_io`).
    #[inline]
    pub(crate) fn debug_clock(&self, py: Python<'_>) -> Option<f64> {
        self.state.with(py, |st| st.debug).then(monotonic)
    }

    /// Registers a client, closed with the loop unless it unregisters first.
    pub(crate) fn register(&self, py: Python<'_>, client: ClientPtr) {
        self.state.with(py, |st| st.clients.register(client))
    }

    pub(crate) fn unregister(&self, py: Python<'_>, client: ClientPtr) {
        self.state.with(py, |st| st.clients.unregister(client))
    }

    /// Runs `client.before_poll` before the loop next polls; `keep_alive`
    /// keeps it alive until then.
    pub(crate) fn before_poll(&self, py: Python<'_>, keep_alive: Py<PyAny>, client: ClientPtr) {
        self.state.with(py, |st| st.clients.add_due(keep_alive, client))
    }

    /// Has the loop call `client.housekeeping` every HOUSEKEEPING_PERIOD_MS
    /// (after the poll of a turn) until it answers false or unregisters.
    pub(crate) fn want_housekeeping(&self, py: Python<'_>, client: ClientPtr) {
        if self.state.with(py, |st| st.clients.want_housekeeping(client)) {
            self.uv.housekeeping_start(py, HOUSEKEEPING_PERIOD_MS);
        }
    }

    /// The housekeeping due after this turn's poll, if its timer fired.
    #[inline(always)]
    fn run_housekeeping_if_due(&self, py: Python<'_>) {
        if self.housekeeping_fired.replace(false) {
            self.run_housekeeping(py);
        }
    }

    #[cold]
    fn run_housekeeping(&self, py: Python<'_>) {
        let list = self.state.with(py, |st| st.clients.housekeeping_list());
        for client in list {
            // A client unregistered by an earlier one's housekeeping is gone.
            if !self.state.with(py, |st| st.clients.is_housekeeping(client)) {
                continue;
            }
            if !client_housekeeping(py, client) {
                self.state.with(py, |st| st.clients.housekeeping_done(client));
            }
        }
        if self.state.with(py, |st| st.clients.housekeeping_is_empty()) {
            self.uv.housekeeping_stop(py);
        }
    }

    /// The end of the turn: every client's `before_poll` work, until none
    /// is due (flushing may make more, e.g. resume_writing writes). An
    /// error is reported as unraisable, except KeyboardInterrupt and
    /// SystemExit, which propagate.
    fn run_before_poll(&self, py: Python<'_>) -> PyResult<()> {
        loop {
            let Some(mut due) = self.state.with(py, |st| st.clients.take_due()) else {
                return Ok(());
            };
            let mut fatal = None;
            for (keep_alive, client) in due.drain(..) {
                let result = client_before_poll(py, client, &keep_alive);
                drop(keep_alive);
                if let Err(err) = result {
                    if crate::errors::is_fatal_base(py, &err) {
                        // (The clients left are dropped with the drain.)
                        fatal = Some(err);
                        break;
                    }
                    err.write_unraisable(py, None);
                }
            }
            self.state.with(py, |st| st.clients.give_back(due));
            if let Some(err) = fatal {
                return Err(err);
            }
        }
    }

    /// Queues a one-shot handle.
    #[inline]
    fn push_ready(&self, py: Python<'_>, handle: Ready) {
        self.state.with(py, |st| st.ready.push_back(handle))
    }

    /// Wakes the loop from another thread.
    fn wake(&self, py: Python<'_>) {
        self.uv.wake(py)
    }

    fn check_open(&self, py: Python<'_>) -> PyResult<()> {
        if self.state.with(py, |st| st.closed) {
            Err(closed_error())
        } else {
            Ok(())
        }
    }

    /// Whether the loop's `create_future` is LoopCore's.
    pub(crate) fn own_create_future(&self, py: Python<'_>) -> bool {
        self.state.with(py, |st| !st.python_futures)
    }

    /// Whether the loop is in debug mode.
    pub(crate) fn debug(&self, py: Python<'_>) -> bool {
        self.state.with(py, |st| st.debug)
    }

    /// Sets (or replaces) the reader or writer of `fd`, returning its
    /// handle. The handle runs each time the descriptor is ready, until
    /// removed (replacing it cancels the old one).
    pub(crate) fn set_fd_handler(
        &self,
        py: Python<'_>,
        fd: i32,
        write: bool,
        callback: &Bound<'_, PyAny>,
        args: &Bound<'_, PyTuple>,
    ) -> PyResult<Py<Handle>> {
        let side = if write { Side::Write } else { Side::Read };
        // Runs many times in one context of its own, as in asyncio.
        let handle = Handle::create(py, repeating_state(py, callback, args)?)?.unbind();
        let uv = &self.uv;
        let result = self.state.with(py, |st| {
            let parts = st.uv.as_mut().ok_or(None)?;
            uv.fds_open(py).map_err(Some)?;
            let fds = parts.fds.get_or_insert_with(FdWatchers::new);
            fds.set(py, uv, fd, side, handle.clone_ref(py)).map_err(Some)
        });
        match result {
            Ok(old) => {
                if let Some(old) = old {
                    old.get().cancel_now(py);
                    let_go(old);
                }
                Ok(handle)
            }
            Err(None) => Err(closed_error()),
            Err(Some(errno)) => Err(crate::errors::os_error(errno)),
        }
    }

    /// A run (run_forever, or one `_run_once`) begins: with timing on, the
    /// clock is calibrated again and the turn marks start from now.
    pub(crate) fn stats_run_began(&self, py: Python<'_>) {
        if !self.stats.timing() {
            return;
        }
        stats::calibrate();
        let now = stats::now();
        let queued = self.state.with(py, |st| st.ready.len());
        let waited = self.gil.waited();
        self.stats.book.with(py, |b| {
            b.recalibrated();
            b.running_since = Some(now);
            b.marks = TurnMarks { end: now, queued, waited };
        })
    }

    /// A run ends (or timing is switched off during one).
    pub(crate) fn stats_run_ended(&self, py: Python<'_>) {
        let now = stats::now();
        self.stats.book.with(py, |b| {
            if let Some(since) = b.running_since.take() {
                b.run_ticks += now.saturating_sub(since);
            }
        })
    }

    /// Switches timing on or off (a running loop's figures go on from now).
    fn set_stats(&self, py: Python<'_>, on: bool) {
        if self.stats.timing() == on {
            return;
        }
        self.stats.set_timing(on);
        self.gil.set_timing(on);
        if !on {
            self.stats_run_ended(py);
        } else if self.is_running(py) {
            self.stats_run_began(py);
        }
    }

    /// `loop.stats()`'s figures as a dict of plain values (stats.py makes
    /// the dataclasses); `reset` zeroes them afterwards.
    fn stats_snapshot<'py>(&self, py: Python<'py>, reset: bool) -> PyResult<Bound<'py, PyDict>> {
        stats::calibrate();
        let now = stats::now();
        let (ready, timers, cancelled) = self.state.with(py, |st| {
            let book = st.timers.book();
            let cancelled = book.cancelled_total.get();
            if reset {
                book.cancelled_total.set(0);
            }
            // (Cancelled timers wait in the heap until dropped: not counted.)
            (st.ready.len(), st.timers.len().saturating_sub(book.cancelled_in_heap.get()), cancelled)
        });
        let waited = self.gil.waited_until(now);
        let (lag, turn_time, longest, slowest, ran) = self.stats.book.with(py, |b| {
            b.recalibrated();
            let ran = b.run_ticks + b.running_since.map_or(0, |since| now.saturating_sub(since));
            let taken =
                (b.lag.clone(), b.turn_time.clone(), b.longest_turns.snapshot(now), b.slowest.snapshot(now), ran);
            if reset {
                LoopStats::reset_book(b, now);
                b.marks.waited = 0;
            }
            taken
        });
        let s = &self.stats;
        let d = PyDict::new(py);
        d.set_item("enabled", s.timing())?;
        d.set_item("clock", stats::clock_name())?;
        d.set_item("turns", s.turns.get())?;
        d.set_item("callbacks", s.callbacks.get())?;
        d.set_item("timers_fired", s.timers_fired.get())?;
        d.set_item("timers_cancelled", cancelled)?;
        d.set_item("io_events", s.io_events.get())?;
        d.set_item("threadsafe_calls", s.threadsafe_calls.get())?;
        d.set_item("wakeups", s.wakeups.load(std::sync::atomic::Ordering::Relaxed))?;
        d.set_item("run_seconds", stats::ticks_to_seconds(ran))?;
        d.set_item("poll_seconds", stats::ticks_to_seconds(waited.min(ran)))?;
        d.set_item("ready", ready)?;
        d.set_item("timers", timers)?;
        for (key, h) in [("lag", &lag), ("turn_time", &turn_time)] {
            d.set_item(key, (h.counts.to_vec(), h.sum_ns as f64 * 1e-9, h.max_ns as f64 * 1e-9))?;
        }
        let longest: Vec<(f64, f64, u64)> = longest
            .into_iter()
            .map(|(took, t)| (stats::ticks_to_seconds(took), stats::ticks_to_monotonic(t.ended), t.callbacks))
            .collect();
        d.set_item("longest_turns", longest)?;
        type Slow = (f64, f64, String, Option<String>, Option<String>, Option<String>);
        let slowest: Vec<Slow> = slowest
            .into_iter()
            .map(|(took, c)| {
                let at = stats::ticks_to_monotonic(c.started);
                (stats::ticks_to_seconds(took), at, c.name, c.coroutine, c.location, c.protocol)
            })
            .collect();
        d.set_item("slowest", slowest)?;
        let io = &s.io;
        let t = PyDict::new(py);
        t.set_item("bytes_read", io.bytes_read.get())?;
        t.set_item("bytes_written", io.bytes_written.get())?;
        t.set_item("reads", io.reads.get())?;
        t.set_item("writes", io.writes.get())?;
        t.set_item("reading_paused_seconds", stats::ticks_to_seconds(io.read_paused.get()))?;
        t.set_item("writing_paused_seconds", stats::ticks_to_seconds(io.write_paused.get()))?;
        d.set_item("transports", t)?;
        if reset {
            s.reset_counters();
            self.gil.reset_waited();
        }
        Ok(d)
    }

    /// Removes the reader or writer of `fd`; True if there was one.
    pub(crate) fn clear_fd_handler(&self, py: Python<'_>, fd: i32, write: bool) -> bool {
        let side = if write { Side::Write } else { Side::Read };
        let uv = &self.uv;
        let old = self.state.with(py, |st| st.uv.as_mut()?.fds.as_mut()?.clear(py, uv, fd, side));
        match old {
            Some(h) => {
                h.get().cancel_now(py);
                let_go(h);
                true
            }
            None => false,
        }
    }
}

#[pyclass(module = "zuvrs._zuvrs", name = "LoopCore", subclass, frozen)]
pub struct LoopCore {
    // Boxed so libuv's back-pointers stay valid wherever the object is.
    shared: Box<LoopShared>,
}

impl LoopCore {
    /// What transports and lookups reach of the loop.
    #[inline]
    pub(crate) fn shared(&self) -> &LoopShared {
        &self.shared
    }

    /// Cancels every queued callback and timer and drops the context
    /// snapshot (loop close or GC clear). Python code may run from here
    /// (__del__ of released objects), so the state is updated first.
    fn release_callbacks(&self, py: Python<'_>) {
        // Timers dropped with the loop were not cancelled by anybody.
        let (ready, timers, snapshot, cancelled, kwargs) = self.shared.state.with(py, |st| {
            let ready: Vec<Ready> = st.ready.drain(..).collect();
            st.ready.shrink_to_fit();
            let cancelled = st.timers.book().cancelled_total.get();
            (ready, st.timers.drain(), st.ctx_cache.take(py), cancelled, st.future_kwargs.take())
        });
        drop(kwargs);
        for r in ready {
            r.cancel(py);
            r.let_go();
        }
        for t in timers {
            t.get().cancel_now(py);
            let_go(t);
        }
        self.shared.state.with(py, |st| st.timers.book().cancelled_total.set(cancelled));
        drop(snapshot);
    }

    /// In a forked child, gives the libuv loop kernel objects of its own
    /// (see `UvLoop::adopt_after_fork`); nothing in the parent's.
    fn adopt_after_fork(&self, py: Python<'_>) {
        self.shared.uv.adopt_after_fork(py)
    }

    /// Closes libuv and everything on it (close(), or a loop collected
    /// without close()). Every libuv handle is closed by its owner, then
    /// the loop; Python callbacks are released last, since their `__del__`
    /// may run arbitrary code.
    fn free_core(&self, py: Python<'_>) {
        self.adopt_after_fork(py);
        let (clients, due) = self.shared.state.with(py, |st| {
            st.closed = true;
            st.clients.take_all()
        });
        for client in clients {
            client_close_with_loop(py, client);
        }
        let (parts, more) = self.shared.state.with(py, |st| (st.uv.take(), st.clients.take_all()));
        debug_assert!(more.0.is_empty(), "a client registered while the loop closed");
        let mut handlers = Vec::new();
        if let Some(mut parts) = parts {
            if let Some(mut fds) = parts.fds.take() {
                handlers.extend(fds.take_all(py, &self.shared.uv));
            }
        }
        // Every handle of the loop's own, then the loop.
        self.shared.uv.close(py);
        for h in handlers {
            h.get().cancel_now(py);
            let_go(h);
        }
        drop(due);
        drop(more);
        self.release_callbacks(py);
    }
}

/// Hands a callback's exception to the loop's exception handler. The handle
/// shows its callback again while the handler looks at it (as asyncio's
/// handle does), then lets go of it.
fn report_callback_error(slf: &Bound<'_, PyAny>, item: &Ready, cb: &Callback, err: PyErr) -> PyResult<()> {
    let py = slf.py();
    let (handle, func) = (ready_object(py, item), callback_func(py, cb));
    let shown = item.with_state(py, |c| c.show_callback(cb));
    let res = python::call_method(
        slf,
        python::event_loop::_report_callback_error(py),
        (handle, err.into_value(py), func, cb.args_tuple(py)),
    );
    if shown {
        let dropped = item.with_state(py, |c| c.finish_run());
        drop(dropped);
    }
    res.map(drop)
}

#[pymethods]
impl LoopCore {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let uv = LoopHandles::new().map_err(uv_error)?;
        let shared = Box::new(LoopShared {
            gil: GilHandoff::new(),
            io_seen: Cell::new(false),
            turns: Cell::new(0),
            poll_wanted: Cell::new(false),
            housekeeping_fired: Cell::new(false),
            state: NativeCell::new(LoopState {
                uv: Some(UvParts { armed_for: f64::NAN, fds: None }),
                ready: VecDeque::with_capacity(1024),
                timers: TimerHeap::new(),
                ctx_cache: ContextCache::new(),
                closed: false,
                stopping: false,
                debug: false,
                python_clock: false,
                python_futures: false,
                thread_id: None,
                running_thread: 0,
                pending_error: None,
                clients: Clients::default(),
                future_kwargs: None,
            }),
            stats: LoopStats::new(),
            uv,
        });
        Ok(LoopCore { shared })
    }

    /// The loop's clock: `time.monotonic()`.
    fn time(&self) -> f64 {
        monotonic()
    }

    /// Whether the loop's `time` is Python code (set by Loop when `time` is
    /// patched or a subclass defines it; see `loop_time`).
    fn _set_python_clock(&self, py: Python<'_>, on: bool) {
        self.shared.state.with(py, |st| st.python_clock = on)
    }

    /// Whether the loop's `create_future` is Python code (set by Loop when
    /// it is patched or a subclass defines it; see `own_create_future`).
    fn _set_python_futures(&self, py: Python<'_>, on: bool) {
        self.shared.state.with(py, |st| st.python_futures = on)
    }

    /// Stops the loop after the current turn.
    fn stop(&self, py: Python<'_>) {
        self.shared.state.with(py, |st| st.stopping = true)
    }

    #[getter(_stopping)]
    fn get_stopping(&self, py: Python<'_>) -> bool {
        self.shared.state.with(py, |st| st.stopping)
    }

    #[setter(_stopping)]
    fn set_stopping(&self, py: Python<'_>, value: bool) {
        self.shared.state.with(py, |st| st.stopping = value)
    }

    #[getter(_closed)]
    fn get_closed(&self, py: Python<'_>) -> bool {
        self.shared.state.with(py, |st| st.closed)
    }

    #[setter(_closed)]
    fn set_closed(&self, py: Python<'_>, value: bool) {
        self.shared.state.with(py, |st| st.closed = value)
    }

    #[getter(_debug)]
    fn get_debug_flag(&self, py: Python<'_>) -> bool {
        self.shared.debug(py)
    }

    /// asyncio's `set_debug` takes any value (`set_debug(1)`): its truth.
    #[setter(_debug)]
    fn set_debug_flag(&self, py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let on = value.is_truthy()?;
        self.shared.state.with(py, |st| st.debug = on);
        Ok(())
    }

    #[getter(_thread_id)]
    fn get_thread_id(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.shared.state.with(py, |st| st.thread_id.as_ref().map(|t| t.clone_ref(py)))
    }

    #[setter(_thread_id)]
    fn set_thread_id(&self, py: Python<'_>, value: Option<Py<PyAny>>) {
        // run_forever sets it from the thread it runs in.
        let thread = if value.is_some() { crate::os::eventloop::current_thread() } else { 0 };
        let old = self.shared.state.with(py, |st| {
            st.running_thread = thread;
            std::mem::replace(&mut st.thread_id, value)
        });
        drop(old);
    }

    /// Runs turns until `stop()`. Python's `run_forever` does the set-up
    /// around it (running-loop registration, async generator hooks).
    fn _run_loop(slf: &Bound<'_, Self>) -> PyResult<()> {
        turn::run_forever(slf)
    }

    /// One turn of the loop, as asyncio's `_run_once` (for code that drives
    /// the loop by hand): poll, due timers, the callbacks queued so far.
    fn _run_once(slf: &Bound<'_, Self>) -> PyResult<()> {
        turn::run_once(slf)
    }

    /// A snapshot of the callbacks waiting to run (asyncio keeps them in
    /// `_ready`; code that peeks at it sees the same handles). Assigning is
    /// ignored: asyncio's constructor and close() reset their own copy.
    #[getter(_ready)]
    fn get_ready(&self, py: Python<'_>) -> Vec<Py<PyAny>> {
        self.shared.state.with(py, |st| st.ready.iter().map(|r| ready_object(py, r).unbind()).collect())
    }

    #[setter(_ready)]
    fn set_ready(&self, _value: Py<PyAny>) {}

    /// A snapshot of the scheduled timers (asyncio's `_scheduled`).
    #[getter(_scheduled)]
    fn get_scheduled(&self, py: Python<'_>) -> Vec<Py<PyAny>> {
        self.shared.state.with(py, |st| st.timers.iter().map(|t| t.clone_ref(py).into_any()).collect())
    }

    #[setter(_scheduled)]
    fn set_scheduled(&self, _value: Py<PyAny>) {}

    /// Frees the libuv loop and drops every queued callback. Python's
    /// `close()` calls this after its own checks.
    fn _free_core(&self, py: Python<'_>) {
        self.free_core(py)
    }

    /// Loop.close's first step: in a forked child, kernel objects of the
    /// loop's own before any handle is closed.
    fn _adopt_after_fork(&self, py: Python<'_>) {
        self.adopt_after_fork(py)
    }

    /// The loop holds its queued handles' callbacks on their behalf (the
    /// handles are not tracked by the GC, see handles/), so it reports them.
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.shared.state.traverse(&visit, |st| {
            for item in &st.ready {
                // Repeating handles are reported once, through their watcher.
                traverse_ready(item, &visit, |c| if c.is_repeating() { Ok(()) } else { c.visit(&visit) })?;
            }
            for t in st.timers.iter() {
                t.get().state_cell().traverse(&visit, |c| c.visit(&visit))?;
            }
            if let Some(fds) = st.uv.as_ref().and_then(|p| p.fds.as_ref()) {
                for h in fds.handlers() {
                    h.get().state_cell().traverse(&visit, |c| c.visit(&visit))?;
                }
            }
            visit.call(&st.thread_id)?;
            visit.call(&st.future_kwargs)
        })
    }

    fn __clear__(&self, py: Python<'_>) {
        let uv = &self.shared.uv;
        let handlers = self.shared.state.with(py, |st| match st.uv.as_mut().and_then(|p| p.fds.as_mut()) {
            Some(fds) => fds.take_all(py, uv),
            None => Vec::new(),
        });
        for h in handlers {
            h.get().cancel_now(py);
            let_go(h);
        }
        self.release_callbacks(py);
    }

    /// Sets (or replaces) the reader or writer of `fd`, returning its handle.
    fn _set_fd_handler(
        &self,
        py: Python<'_>,
        fd: i32,
        write: bool,
        callback: &Bound<'_, PyAny>,
        args: &Bound<'_, PyTuple>,
    ) -> PyResult<Py<Handle>> {
        self.shared.set_fd_handler(py, fd, write, callback, args)
    }

    /// Removes the reader or writer of `fd`; True if there was one.
    fn _clear_fd_handler(&self, py: Python<'_>, fd: i32, write: bool) -> bool {
        self.shared.clear_fd_handler(py, fd, write)
    }

    /// The handles registered for `fd` as (reader, writer), for debugging
    /// and tests.
    fn _fd_handlers(&self, py: Python<'_>, fd: i32) -> (Option<Py<Handle>>, Option<Py<Handle>>) {
        self.shared.state.with(py, |st| {
            let Some(fds) = st.uv.as_ref().and_then(|p| p.fds.as_ref()) else { return (None, None) };
            let (r, w) = fds.get(fd);
            (r.map(|h| h.clone_ref(py)), w.map(|h| h.clone_ref(py)))
        })
    }

    /// `loop.stats()`'s figures (python/zuvrs/stats.py makes its snapshot).
    #[pyo3(signature = (reset=false))]
    fn _stats<'py>(&self, py: Python<'py>, reset: bool) -> PyResult<Bound<'py, PyDict>> {
        self.shared.stats_snapshot(py, reset)
    }

    /// Whether the loop times its turns (`zuvrs.new_event_loop(stats=...)`).
    #[getter(_stats_on)]
    fn get_stats_on(&self) -> bool {
        self.shared.stats.timing()
    }

    #[setter(_stats_on)]
    fn set_stats_on(&self, py: Python<'_>, on: bool) {
        self.shared.set_stats(py, on)
    }

    /// Counts of (ready callbacks, scheduled timers), for tests.
    fn _queue_sizes(&self, py: Python<'_>) -> (usize, usize) {
        self.shared.state.with(py, |st| (st.ready.len(), st.timers.len()))
    }
}

impl Drop for LoopCore {
    fn drop(&mut self) {
        // A loop dropped without close(): free libuv and the queues anyway.
        let st = self.shared.state.get_mut();
        if st.uv.is_some() || !st.ready.is_empty() || st.timers.len() > 0 {
            crate::capi::attach::with_held(|py| self.free_core(py));
        }
    }
}
