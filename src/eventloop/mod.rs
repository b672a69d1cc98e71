//! The loop core: the turn, the ready queue, timers, wake-ups and fd watchers.
//!
//! `LoopCore` is the native base of `zuvrs.Loop`. Python code (python/zuvrs)
//! adds what runs once per loop or per run (argument checks, run_forever's
//! set-up, signals, executors); everything per callback is here.
//!
//! One turn (`run_turn`):
//! 1. `uv_run` once: without blocking when callbacks are ready or a stop is
//!    pending, else blocking until I/O, a wake-up or the earliest timer. The
//!    GIL is released just for the poll (see `gil`).
//! 2. Due timers move to the ready queue (after the I/O callbacks, as in
//!    asyncio).
//! 3. The callbacks queued when the turn began run; those they schedule wait
//!    for the next turn.

mod fastcall;
mod gil;
mod poll;
mod tasks;
mod timers;

use std::cell::UnsafeCell;
use std::collections::{HashSet, VecDeque};

use pyo3::exceptions::{PyKeyboardInterrupt, PyRuntimeError, PySystemExit};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use pyo3::{PyTraverseError, PyVisit};

use crate::context::ContextCache;
use crate::errors::uv_error;
use crate::handles::{release_handle, run_in_context, Callback, Handle, HandleCore, HasCore, Ready};
use crate::transport::stream::StreamCore;
use crate::transport::udp::DatagramCore;
use crate::uv::{sys, UvHandle, UvLoop};
use gil::GilHandoff;
use poll::{FdWatchers, Side};
use timers::TimerHeap;

pub(crate) use fastcall::install_fast_methods;

/// Debug mode's slow-callback warning for protocol callbacks that libuv's
/// I/O callbacks run directly (they have no Handle to time): when the
/// callback that began at `started` took at least slow_callback_duration,
/// `loop._warn_slow_io(transport, seconds)` logs it as asyncio logs a slow
/// `_read_ready`.
pub(crate) fn warn_if_slow_io(py: Python<'_>, loop_obj: &Py<PyAny>, transport: &Py<PyAny>, started: f64) {
    let seconds = monotonic() - started;
    let warned = (|| -> PyResult<()> {
        let lp = loop_obj.bind(py);
        let limit: f64 = lp.getattr(pyo3::intern!(py, "slow_callback_duration"))?.extract()?;
        if seconds >= limit && !transport.is_none(py) {
            lp.call_method1(pyo3::intern!(py, "_warn_slow_io"), (transport, seconds))?;
        }
        Ok(())
    })();
    if let Err(err) = warned {
        err.write_unraisable(py, None);
    }
}

/// Seconds on the monotonic clock, the clock of `time.monotonic()` and of
/// libuv's `uv_now`.
#[inline]
pub(crate) fn monotonic() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// How often a loop whose ready queue never empties still polls for I/O.
const BUSY_POLL_INTERVAL: f64 = 50e-6;

/// After a look-ahead poll found nothing, how many chances to look ahead
/// are skipped before trying again.
const LOOK_AHEAD_BACKOFF: u32 = 7;

/// When the loop last polled, and whether that poll found I/O.
#[derive(Default)]
struct PollPacing {
    last_poll: f64,
    last_had_io: bool,
    /// Look-ahead chances still to skip (0: look ahead).
    look_ahead_skip: u32,
}

impl PollPacing {
    /// Whether a loop about to block should first poll without blocking.
    /// Worth it while I/O keeps flowing (the look-ahead finds the next event
    /// at once and the blocking poll's GIL hand-off and timeout set-up are
    /// saved); after a look-ahead that found nothing it is tried only every
    /// LOOK_AHEAD_BACKOFF + 1 chances, so a loop that really waits (request
    /// and response across processes) seldom pays the extra poll.
    fn look_ahead(&mut self) -> bool {
        if !self.last_had_io {
            return false;
        }
        if self.look_ahead_skip == 0 {
            return true;
        }
        self.look_ahead_skip -= 1;
        false
    }

    fn looked_ahead(&mut self, found: bool) {
        self.look_ahead_skip = if found { 0 } else { LOOK_AHEAD_BACKOFF };
    }
}

/// libuv resources of an open loop.
struct UvParts {
    uv: UvLoop,
    /// Wakes the poll for `call_soon_threadsafe`; also keeps the loop alive so
    /// an idle `run_forever` blocks instead of spinning.
    wake: UvHandle<sys::uv_async_t>,
    /// Releases the GIL right before the poll.
    prepare: UvHandle<sys::uv_prepare_t>,
    /// Bounds the poll at the earliest timer deadline; its callback is empty,
    /// the heap is processed after `uv_run` returns.
    timer: UvHandle<sys::uv_timer_t>,
    /// Deadline the uv timer is armed for (NaN when not armed).
    armed_for: f64,
    fds: Option<FdWatchers>,
}

pub(crate) struct LoopState {
    uv: Option<UvParts>,
    pub(crate) ready: VecDeque<Ready>,
    pub(crate) timers: TimerHeap,
    pub(crate) gil: GilHandoff,
    pub(crate) ctx_cache: ContextCache,
    closed: bool,
    stopping: bool,
    debug: bool,
    thread_id: Option<Py<PyAny>>,
    /// A KeyboardInterrupt or SystemExit raised by Python code that ran
    /// inside a libuv callback: re-raised once `uv_run` returns.
    pending_error: Option<PyErr>,
    /// The `bytes` stream reads land in (see transport::stream::ReadBuffer).
    pub(crate) read_buf: crate::transport::stream::ReadBuffer,
    /// Open stream transports, closed with the loop (their fds included).
    pub(crate) streams: HashSet<*const StreamCore>,
    /// Open UDP transports, whose fd watches close with the loop.
    pub(crate) datagrams: HashSet<*const DatagramCore>,
    /// Transports written to during this turn, flushed before the next poll.
    pub(crate) flush_list: Vec<Py<StreamCore>>,
    /// Streams whose reading paused after a full read, resumed before the
    /// next poll (see StreamCore::on_read).
    pub(crate) rearm_list: Vec<Py<StreamCore>>,
    /// Set by libuv callbacks that saw I/O during the current poll.
    pub(crate) io_seen: bool,
}

impl LoopState {
    /// Stops the current `uv_run` and keeps `err` to raise from run_forever.
    pub(crate) fn raise_later(&mut self, err: PyErr) {
        if self.pending_error.is_none() {
            self.pending_error = Some(err);
        }
        if let Some(parts) = &self.uv {
            unsafe { sys::uv_stop(parts.uv.raw()) };
        }
    }

    /// The time an I/O callback begins, in debug mode only (for
    /// `warn_if_slow_io`).
    #[inline]
    pub(crate) fn debug_clock(&self) -> Option<f64> {
        if self.debug {
            Some(monotonic())
        } else {
            None
        }
    }

    /// True while run_forever runs this loop.
    pub(crate) fn is_running(&self) -> bool {
        self.thread_id.is_some()
    }

    /// The fd watchers, while the loop is open.
    pub(crate) fn fd_watchers_mut(&mut self) -> Option<&mut FdWatchers> {
        self.uv.as_mut().and_then(|p| p.fds.as_mut())
    }

    /// The libuv loop, while open.
    pub(crate) fn uv_loop(&self) -> Option<*mut sys::uv_loop_t> {
        self.uv.as_ref().map(|p| p.uv.raw())
    }
}

#[pyclass(module = "zuvrs._zuvrs", name = "LoopCore", subclass, frozen)]
pub struct LoopCore {
    // Boxed so libuv's back-pointers stay valid wherever the object is.
    state: Box<UnsafeCell<LoopState>>,
}

// SAFETY: the state is only touched by the thread holding the GIL (and, for
// `gil`, by the loop thread inside uv_run).
unsafe impl Sync for LoopCore {}
unsafe impl Send for LoopCore {}

unsafe extern "C" fn on_prepare(handle: *mut sys::uv_prepare_t) {
    // SAFETY: data is the loop state, alive while its handles are.
    unsafe {
        let st = &*((*handle).data as *const LoopState);
        st.gil.before_poll();
    }
}

unsafe extern "C" fn on_wake(_handle: *mut sys::uv_async_t) {}

unsafe extern "C" fn on_timer(_handle: *mut sys::uv_timer_t) {}

fn closed_error() -> PyErr {
    PyRuntimeError::new_err("Event loop is closed")
}

impl LoopCore {
    /// The loop state.
    ///
    /// # Safety
    /// GIL held; the reference must not be kept across a call into Python or
    /// into `uv_run` (re-derive it afterwards).
    #[allow(clippy::mut_from_ref)]
    #[inline]
    pub(crate) unsafe fn st(&self) -> &mut LoopState {
        unsafe { &mut *self.state.get() }
    }

    /// The loop state, for transports (see `st` for the rules).
    pub(crate) fn state_ptr(&self) -> *mut LoopState {
        self.state.get()
    }

    #[inline]
    pub(crate) fn check_open(&self) -> PyResult<()> {
        if unsafe { self.st().closed } {
            Err(closed_error())
        } else {
            Ok(())
        }
    }

    #[inline]
    pub(crate) fn debug(&self) -> bool {
        unsafe { self.st().debug }
    }

    /// Cancels every queued callback and timer and drops the context
    /// snapshot (loop close or GC clear). Python code may run from here
    /// (__del__ of released objects), so the state is updated first.
    fn release_callbacks(&self) {
        let st = unsafe { self.st() };
        let ready: Vec<Ready> = st.ready.drain(..).collect();
        let timers = st.timers.drain();
        let snapshot = st.ctx_cache.take();
        for r in ready {
            r.cancel();
            r.release();
        }
        for t in timers {
            t.get().cancel_now();
            release_handle(t);
        }
        if !snapshot.is_null() {
            unsafe { pyo3::ffi::Py_DECREF(snapshot) };
        }
    }

    /// Queues a one-shot handle.
    #[inline]
    pub(crate) fn push_ready(&self, handle: Ready) {
        unsafe { self.st().ready.push_back(handle) }
    }

    /// Wakes the loop from another thread.
    pub(crate) fn wake(&self) {
        if let Some(parts) = unsafe { &self.st().uv } {
            // SAFETY: uv_async_send is the one libuv call safe from any thread.
            unsafe { sys::uv_async_send(parts.wake.raw()) };
        }
    }

    /// Arms the uv timer for the earliest live deadline before a blocking poll.
    fn arm_timer(&self) {
        let st = unsafe { self.st() };
        st.timers.prune();
        let next = st.timers.next_deadline();
        let Some(parts) = st.uv.as_mut() else { return };
        match next {
            None => {
                if !parts.armed_for.is_nan() {
                    unsafe { sys::uv_timer_stop(parts.timer.raw()) };
                    parts.armed_for = f64::NAN;
                }
            }
            Some(when) => {
                let active = unsafe { sys::uv_is_active(parts.timer.as_handle()) } != 0;
                if active && parts.armed_for == when {
                    return;
                }
                // libuv counts whole milliseconds on the same clock; rounding
                // the deadline up means the timer never fires early.
                let now_ms = parts.uv.now_ms();
                let due_ms = (when * 1000.0).ceil();
                let delay = if due_ms.is_nan() || due_ms <= now_ms as f64 {
                    0
                } else if due_ms >= u64::MAX as f64 {
                    u64::MAX / 2
                } else {
                    due_ms as u64 - now_ms
                };
                unsafe { sys::uv_timer_start(parts.timer.raw(), Some(on_timer), delay, 0) };
                parts.armed_for = when;
            }
        }
    }

    /// Moves due timers to the ready queue; `now` is the time just read,
    /// if any.
    fn collect_due_timers(&self, now: Option<f64>) {
        let st = unsafe { self.st() };
        if st.timers.len() == 0 {
            return;
        }
        st.timers.prune();
        let now = now.unwrap_or_else(monotonic);
        while let Some(h) = st.timers.pop_due(now) {
            if h.get().is_cancelled() {
                release_handle(h);
            } else {
                st.ready.push_back(Ready::Timer(h));
            }
        }
    }

    /// One turn: flush writes, poll (or skip an idle poll), move due timers
    /// to the ready queue, run the callbacks queued when the turn began.
    fn run_turn(&self, py: Python<'_>, any: &Bound<'_, PyAny>, pacing: &mut PollPacing) -> PyResult<()> {
        crate::transport::stream::flush_all(py, self.state_ptr())?;
        let st = unsafe { self.st() };
        let Some(parts) = st.uv.as_ref() else { return Err(closed_error()) };
        let raw = parts.uv.raw();
        let busy = !st.ready.is_empty() || st.stopping;
        // While callbacks keep the queue busy and the last poll found no
        // I/O, a non-blocking poll finds nothing most of the time: polling
        // every BUSY_POLL_INTERVAL then keeps I/O latency negligible at a
        // fraction of the cost. A loop that is moving I/O polls every turn.
        let now = if busy { monotonic() } else { 0.0 };
        // The time after a poll that may have waited, for the timers too.
        let mut polled_at = None;
        if !busy || st.stopping || pacing.last_had_io || now - pacing.last_poll >= BUSY_POLL_INTERVAL {
            st.io_seen = false;
            let mut found = false;
            if !busy && pacing.look_ahead() {
                st.gil.set_release_before_poll(false);
                // SAFETY: as for the poll below.
                unsafe { sys::uv_run(raw, sys::uv_run_mode_UV_RUN_NOWAIT) };
                let st = unsafe { self.st() };
                found = st.io_seen || !st.ready.is_empty() || st.stopping || st.pending_error.is_some();
                pacing.looked_ahead(found);
            }
            if !found {
                let mode = if busy {
                    sys::uv_run_mode_UV_RUN_NOWAIT
                } else {
                    self.arm_timer();
                    sys::uv_run_mode_UV_RUN_ONCE
                };
                // Only a poll that may block hands the GIL to other threads; a
                // busy loop yields it through the interpreter's switch interval
                // like any Python code.
                unsafe { self.st().gil.set_release_before_poll(!busy) };
                // SAFETY: no state borrow is held across uv_run; callbacks
                // re-derive it from the handles' data pointers.
                unsafe {
                    sys::uv_run(raw, mode);
                    self.st().gil.reacquire();
                }
            }
            if !busy {
                let t = monotonic();
                polled_at = Some(t);
                pacing.last_poll = t;
            } else {
                pacing.last_poll = now;
            }
            pacing.last_had_io = unsafe { self.st().io_seen };
            if let Some(err) = unsafe { self.st().pending_error.take() } {
                return Err(err);
            }
        }
        self.collect_due_timers(polled_at);
        self.run_ready(any)
    }

    /// Runs the callbacks queued when the turn began.
    fn run_ready(&self, slf: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = slf.py();
        let n = unsafe { self.st().ready.len() };
        for _ in 0..n {
            // close() from a callback empties the queue; stop there.
            let Some(item) = (unsafe { self.st().ready.pop_front() }) else { break };
            let debug = self.debug();
            let (cb, ctx, shared) = unsafe {
                let core = item.core();
                let (ctx, shared) = core.run_context();
                match core.take_for_run(debug) {
                    Some(cb) => (cb, ctx, shared),
                    None => {
                        item.release();
                        continue;
                    }
                }
            };
            let started = if debug { Some(monotonic()) } else { None };
            // SAFETY: GIL held; no borrow of the state is live here; `item`
            // keeps the context alive.
            if shared {
                unsafe { self.st().ctx_cache.set_running(ctx) };
            }
            let ok = unsafe { run_in_context(&cb, ctx, shared) };
            if shared {
                unsafe { self.st().ctx_cache.set_running(std::ptr::null_mut()) };
            }
            if !ok {
                let err = PyErr::fetch(py);
                if err.is_instance_of::<PyKeyboardInterrupt>(py) || err.is_instance_of::<PySystemExit>(py) {
                    return Err(err);
                }
                report_callback_error(slf, &item, &cb, err)?;
            }
            if let Some(t0) = started {
                let dt = monotonic() - t0;
                let limit: f64 = slf.getattr("slow_callback_duration")?.extract()?;
                if dt >= limit {
                    let h = unsafe { Bound::from_borrowed_ptr(py, item.as_ptr()) };
                    let func = unsafe { Bound::from_borrowed_ptr(py, cb.func()) };
                    slf.call_method1("_warn_slow_callback", (h, func, dt))?;
                }
                drop(unsafe { item.core().finish_run() });
            }
            drop(cb);
            item.release();
        }
        Ok(())
    }

    /// The open loop's libuv parts (same borrowing rules as `st`).
    #[allow(clippy::mut_from_ref)]
    fn parts(&self) -> PyResult<&mut UvParts> {
        unsafe { self.st().uv.as_mut() }.ok_or_else(closed_error)
    }
}

/// Hands a callback's exception to the loop's exception handler. The handle
/// shows its callback again while the handler looks at it (as asyncio's
/// handle does), then lets go of it.
fn report_callback_error(slf: &Bound<'_, PyAny>, item: &Ready, cb: &Callback, err: PyErr) -> PyResult<()> {
    let py = slf.py();
    let handle = unsafe { Bound::from_borrowed_ptr(py, item.as_ptr()) };
    let func = unsafe { Bound::from_borrowed_ptr(py, cb.func()) };
    let shown = unsafe { item.core().show_callback(cb) };
    let res = slf.call_method1("_report_callback_error", (handle, err.into_value(py), func, cb.args_tuple(py)));
    if shown {
        drop(unsafe { item.core().finish_run() });
    }
    res.map(drop)
}

#[pymethods]
impl LoopCore {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let uv = UvLoop::new().map_err(uv_error)?;
        let timers = TimerHeap::new();
        let state = Box::new(UnsafeCell::new(LoopState {
            uv: None,
            ready: VecDeque::with_capacity(1024),
            timers,
            gil: GilHandoff::new(),
            ctx_cache: ContextCache::new(),
            closed: false,
            stopping: false,
            debug: false,
            thread_id: None,
            pending_error: None,
            read_buf: Default::default(),
            streams: HashSet::new(),
            datagrams: HashSet::new(),
            flush_list: Vec::new(),
            rearm_list: Vec::new(),
            io_seen: false,
        }));
        let sp = state.get();
        // SAFETY: each handle is initialised on the fresh loop; their data
        // points at the boxed state, which outlives them (see free_core).
        unsafe {
            let wake = UvHandle::<sys::uv_async_t>::zeroed();
            let rc = sys::uv_async_init(uv.raw(), wake.raw(), Some(on_wake));
            if rc < 0 {
                wake.free_uninit();
                uv.close();
                return Err(uv_error(rc));
            }
            let prepare = UvHandle::<sys::uv_prepare_t>::zeroed();
            sys::uv_prepare_init(uv.raw(), prepare.raw());
            sys::uv_unref(prepare.as_handle());
            prepare.set_data(sp);
            let timer = UvHandle::<sys::uv_timer_t>::zeroed();
            sys::uv_timer_init(uv.raw(), timer.raw());
            sys::uv_unref(timer.as_handle());
            (*sp).uv = Some(UvParts { uv, wake, prepare, timer, armed_for: f64::NAN, fds: None });
        }
        Ok(LoopCore { state })
    }

    /// The loop's clock: `time.monotonic()`.
    fn time(&self) -> f64 {
        monotonic()
    }

    /// Stops the loop after the current turn.
    fn stop(&self) {
        unsafe { self.st().stopping = true }
    }

    #[getter(_stopping)]
    fn get_stopping(&self) -> bool {
        unsafe { self.st().stopping }
    }

    #[setter(_stopping)]
    fn set_stopping(&self, value: bool) {
        unsafe { self.st().stopping = value }
    }

    #[getter(_closed)]
    fn get_closed(&self) -> bool {
        unsafe { self.st().closed }
    }

    #[setter(_closed)]
    fn set_closed(&self, value: bool) {
        unsafe { self.st().closed = value }
    }

    /// Whether debug mode is on (asyncio's Task asks on every creation).
    fn get_debug(&self) -> bool {
        self.debug()
    }

    #[getter(_debug)]
    fn get_debug_flag(&self) -> bool {
        self.debug()
    }

    #[setter(_debug)]
    fn set_debug_flag(&self, value: bool) {
        unsafe { self.st().debug = value }
    }

    #[getter(_thread_id)]
    fn get_thread_id(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        unsafe { self.st().thread_id.as_ref().map(|t| t.clone_ref(py)) }
    }

    #[setter(_thread_id)]
    fn set_thread_id(&self, value: Option<Py<PyAny>>) {
        let old = unsafe { std::mem::replace(&mut self.st().thread_id, value) };
        drop(old);
    }

    /// Runs turns until `stop()`. Python's `run_forever` does the set-up
    /// around it (running-loop registration, async generator hooks).
    fn _run_loop(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let any = slf.as_any();
        {
            let parts = this.parts()?;
            unsafe { sys::uv_prepare_start(parts.prepare.raw(), Some(on_prepare)) };
        }
        let mut pacing = PollPacing::default();
        let result = loop {
            if let Err(e) = this.run_turn(py, any, &mut pacing) {
                break Err(e);
            }
            if unsafe { this.st().stopping } {
                break Ok(());
            }
        };
        if let Some(parts) = unsafe { this.st().uv.as_ref() } {
            unsafe { sys::uv_prepare_stop(parts.prepare.raw()) };
        }
        // What the last turn wrote goes out before run_forever returns.
        let flushed = crate::transport::stream::flush_all(py, this.state_ptr());
        result.and(flushed)
    }

    /// One turn of the loop, as asyncio's `_run_once` (for code that drives
    /// the loop by hand): poll, due timers, the callbacks queued so far.
    fn _run_once(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        this.run_turn(py, slf.as_any(), &mut PollPacing::default())?;
        crate::transport::stream::flush_all(py, this.state_ptr())
    }

    /// A snapshot of the callbacks waiting to run (asyncio keeps them in
    /// `_ready`; code that peeks at it sees the same handles). Assigning is
    /// ignored: asyncio's constructor and close() reset their own copy.
    #[getter(_ready)]
    fn get_ready(&self, py: Python<'_>) -> Vec<Py<PyAny>> {
        unsafe { self.st().ready.iter().map(|r| Bound::from_borrowed_ptr(py, r.as_ptr()).unbind()).collect() }
    }

    #[setter(_ready)]
    fn set_ready(&self, _value: Py<PyAny>) {}

    /// A snapshot of the scheduled timers (asyncio's `_scheduled`).
    #[getter(_scheduled)]
    fn get_scheduled(&self, py: Python<'_>) -> Vec<Py<PyAny>> {
        unsafe { self.st().timers.iter().map(|t| t.clone_ref(py).into_any()).collect() }
    }

    #[setter(_scheduled)]
    fn set_scheduled(&self, _value: Py<PyAny>) {}

    /// Frees the libuv loop and drops every queued callback. Python's
    /// `close()` calls this after its own checks.
    fn _free_core(&self) {
        let st = unsafe { self.st() };
        st.closed = true;
        let mut handlers = Vec::new();
        // Streams close their libuv handles (and fds) with the loop.
        let streams: Vec<*const StreamCore> = st.streams.drain().collect();
        let unflushed = std::mem::take(&mut st.flush_list);
        let unarmed = std::mem::take(&mut st.rearm_list);
        for s in streams {
            unsafe { (*s).close_handle() };
        }
        let st = unsafe { self.st() };
        let datagrams: Vec<*const DatagramCore> = st.datagrams.drain().collect();
        for d in datagrams {
            // SAFETY: a registered core is alive (its handle box holds it).
            unsafe { (*d).close_handle() };
        }
        let st = unsafe { self.st() };
        if let Some(mut parts) = st.uv.take() {
            if let Some(mut fds) = parts.fds.take() {
                handlers.extend(fds.take_all());
                fds.close();
            }
            parts.wake.close();
            parts.prepare.close();
            parts.timer.close();
            // SAFETY: every handle of this loop was closed above.
            unsafe { parts.uv.close() };
        }
        for h in handlers {
            h.get().cancel_now();
            release_handle(h);
        }
        drop(unflushed);
        drop(unarmed);
        self.release_callbacks();
    }

    /// The loop holds its queued handles' callbacks on their behalf (the
    /// handles are not tracked by the GC, see handles.rs), so it reports them.
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let st = unsafe { &*self.state.get() };
        for item in &st.ready {
            let core = unsafe { item.core() };
            // Repeating handles are reported once, through their watcher.
            if !core.is_repeating() {
                core.visit(&visit)?;
            }
        }
        for t in st.timers.iter() {
            unsafe { t.get().core() }.visit(&visit)?;
        }
        if let Some(fds) = st.uv.as_ref().and_then(|p| p.fds.as_ref()) {
            for h in fds.handlers() {
                unsafe { h.get().core() }.visit(&visit)?;
            }
        }
        visit.call(&st.thread_id)?;
        Ok(())
    }

    fn __clear__(&self) {
        let handlers = match unsafe { self.st().fd_watchers_mut() } {
            Some(fds) => fds.take_all(),
            None => Vec::new(),
        };
        for h in handlers {
            h.get().cancel_now();
            release_handle(h);
        }
        self.release_callbacks();
    }

    /// Sets (or replaces) the reader or writer of `fd`, returning its
    /// handle. The handle runs each time the descriptor is ready, until
    /// removed (replacing it cancels the old one).
    fn _set_fd_handler(
        &self,
        py: Python<'_>,
        fd: i32,
        write: bool,
        callback: &Bound<'_, PyAny>,
        args: &Bound<'_, PyTuple>,
    ) -> PyResult<Py<Handle>> {
        let side = if write { Side::Write } else { Side::Read };
        let sp = self.state.get();
        let handle = unsafe {
            // Runs many times in one context of its own, as in asyncio.
            let ctx = pyo3::ffi::PyContext_CopyCurrent();
            if ctx.is_null() {
                return Err(PyErr::fetch(py));
            }
            let items = (*(args.as_ptr() as *mut pyo3::ffi::PyTupleObject)).ob_item.as_ptr();
            let cb = Callback::new(callback.as_ptr(), items, args.len());
            Handle::create(py, HandleCore::new(cb, ctx, false, true))?.unbind()
        };
        let parts = self.parts()?;
        if parts.fds.is_none() {
            parts.fds = Some(FdWatchers::new(parts.uv.raw(), sp).map_err(|e| uv_error(-e))?);
        }
        let fds = parts.fds.as_mut().expect("created");
        let old = fds.set(fd, side, handle.clone_ref(py)).map_err(|e| uv_error(-e))?;
        if let Some(old) = old {
            old.get().cancel_now();
            release_handle(old);
        }
        Ok(handle)
    }

    /// Removes the reader or writer of `fd`; True if there was one.
    fn _clear_fd_handler(&self, fd: i32, write: bool) -> bool {
        let side = if write { Side::Write } else { Side::Read };
        let Some(fds) = (unsafe { self.st().fd_watchers_mut() }) else { return false };
        match fds.clear(fd, side) {
            Some(h) => {
                h.get().cancel_now();
                release_handle(h);
                true
            }
            None => false,
        }
    }

    /// The handles registered for `fd` as (reader, writer), for debugging
    /// and tests.
    fn _fd_handlers(&self, py: Python<'_>, fd: i32) -> (Option<Py<Handle>>, Option<Py<Handle>>) {
        let Some(fds) = (unsafe { self.st().fd_watchers_mut() }) else { return (None, None) };
        let (r, w) = fds.get(fd);
        (r.map(|h| h.clone_ref(py)), w.map(|h| h.clone_ref(py)))
    }

    /// Resolves a host name on libuv's thread pool into `future` (see dns.rs).
    #[pyo3(signature = (future, host, port, family, r#type, proto, flags))]
    #[allow(clippy::too_many_arguments)]
    fn _resolve(
        &self,
        future: Py<PyAny>,
        host: Option<&[u8]>,
        port: Option<&[u8]>,
        family: i32,
        r#type: i32,
        proto: i32,
        flags: i32,
    ) -> PyResult<()> {
        crate::dns::resolve(self, future, host, port, (family, r#type, proto, flags))
    }

    /// Looks up the name of a numeric address on libuv's thread pool into
    /// `future` (see dns.rs).
    #[pyo3(signature = (future, host, port, flowinfo, scope_id, flags))]
    #[allow(clippy::too_many_arguments)]
    fn _name_info(
        &self,
        future: Py<PyAny>,
        host: &str,
        port: u16,
        flowinfo: u32,
        scope_id: u32,
        flags: i32,
    ) -> PyResult<()> {
        crate::dns::name_info(self, future, host, port, flowinfo, scope_id, flags)
    }

    /// Counts of (ready callbacks, scheduled timers), for tests.
    fn _queue_sizes(&self) -> (usize, usize) {
        let st = unsafe { self.st() };
        (st.ready.len(), st.timers.len())
    }
}

impl Drop for LoopCore {
    fn drop(&mut self) {
        // A loop dropped without close(): free libuv and the queues anyway.
        let st = self.state.get_mut();
        if st.uv.is_some() || !st.ready.is_empty() || st.timers.len() > 0 {
            Python::attach(|_py| self._free_core());
        }
    }
}
