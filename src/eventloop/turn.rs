//! One turn of the loop, as asyncio's `_run_once`:
//!
//! 1. The work clients left for the end of the last turn (writes to flush,
//!    reads to re-arm), so the loop never sleeps with unsent data.
//! 2. `uv_run` once: without blocking when callbacks are ready or a stop is
//!    pending, else blocking until I/O, a wake-up or the earliest timer. The
//!    GIL is released just for the poll (see gil.rs). I/O callbacks queue
//!    their handles (fd watchers) or call protocols directly (transports).
//! 3. Due timers move to the ready queue, after the I/O callbacks.
//! 4. The callbacks queued when the turn began run; those they schedule wait
//!    for the next turn.
//!
//! While callbacks keep the queue busy a non-blocking poll rarely finds
//! anything, so it is skipped unless `BUSY_POLL_INTERVAL` has passed; while
//! I/O keeps flowing, a loop about to block first looks ahead with a
//! non-blocking poll (see `PollPacing`).
//!
//! Every turn counts its callbacks (stats.rs); with the loop's stats on, a
//! turn also reads the stats clock once per callback, for the lag, the
//! turn's length and the slowest callbacks (`run_ready::<true>`).

use pyo3::prelude::*;

use super::stats::{self, LoopStats, SlowCallback, TurnMarks, TurnRecord};
use super::{monotonic, report_callback_error, LoopCore, LoopShared};
use crate::capi::eventloop::{callback_func, ready_object, DueCall};
use crate::errors::{closed_error, is_fatal_base};
use crate::handles::{let_go, Callback, Ready};
use crate::python;
use crate::uv::eventloop::RunMode;

/// How often a loop whose ready queue never empties still polls for I/O.
const BUSY_POLL_INTERVAL: f64 = 50e-6;

/// After a look-ahead poll found nothing, how many chances to look ahead
/// are skipped before trying again.
const LOOK_AHEAD_BACKOFF: u32 = 7;

/// When the loop last polled, and whether that poll found I/O.
#[derive(Default)]
pub(super) struct PollPacing {
    last_poll: f64,
    last_had_io: bool,
    /// Look-ahead chances still to skip (0: look ahead).
    look_ahead_skip: u32,
}

impl PollPacing {
    /// Whether this turn polls at all: always when the loop may block (no
    /// callback ready), is stopping, or just saw I/O; otherwise once every
    /// BUSY_POLL_INTERVAL, which keeps I/O latency negligible at a fraction
    /// of the cost of a poll per turn.
    fn should_poll(&self, busy: bool, stopping: bool, now: f64) -> bool {
        !busy || stopping || self.last_had_io || now - self.last_poll >= BUSY_POLL_INTERVAL
    }

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

/// `_run_loop`: turns until `stop()`.
pub(super) fn run_forever(slf: &Bound<'_, LoopCore>) -> PyResult<()> {
    let py = slf.py();
    let shared = slf.get().shared();
    if !shared.uv().prepare_start(py) {
        return Err(closed_error());
    }
    shared.stats_run_began(py);
    let mut pacing = PollPacing::default();
    let result = loop {
        if let Err(e) = run_turn(py, slf.as_any(), shared, &mut pacing) {
            break Err(e);
        }
        if shared.state.with(py, |st| st.stopping) {
            break Ok(());
        }
    };
    shared.uv().prepare_stop(py);
    // What the last turn wrote goes out before run_forever returns.
    let flushed = shared.run_before_poll(py);
    shared.stats_run_ended(py);
    result.and(flushed)
}

/// `_run_once`: one turn, for code that drives the loop by hand.
pub(super) fn run_once(slf: &Bound<'_, LoopCore>) -> PyResult<()> {
    let py = slf.py();
    let shared = slf.get().shared();
    shared.stats_run_began(py);
    let result =
        run_turn(py, slf.as_any(), shared, &mut PollPacing::default()).and_then(|()| shared.run_before_poll(py));
    shared.stats_run_ended(py);
    result
}

/// Arms the uv timer for the earliest live deadline before a blocking poll.
/// `python_now` is the loop's Python clock's time, when it has one: the
/// delay is then measured on that clock.
fn arm_timer(py: Python<'_>, shared: &LoopShared, python_now: Option<f64>) {
    let uv = shared.uv();
    shared.state.with(py, |st| {
        st.timers.prune(py);
        let next = st.timers.next_deadline();
        let Some(parts) = st.uv.as_mut() else { return };
        match next {
            None => {
                if !parts.armed_for.is_nan() {
                    uv.timer_stop(py);
                    parts.armed_for = f64::NAN;
                }
            }
            Some(when) => {
                let delay = match python_now {
                    // A Python clock: the delay is measured on it, and the
                    // next arming starts afresh.
                    Some(now) => {
                        parts.armed_for = f64::NAN;
                        timer_delay_ms(((when - now) * 1000.0).ceil(), 0)
                    }
                    None => {
                        if parts.armed_for == when && uv.timer_active(py) {
                            return;
                        }
                        parts.armed_for = when;
                        // libuv counts whole milliseconds on the same clock;
                        // rounding the deadline up means the timer never
                        // fires early.
                        let Some(now_ms) = uv.now_ms(py) else { return };
                        timer_delay_ms((when * 1000.0).ceil(), now_ms)
                    }
                };
                uv.timer_start(py, delay);
            }
        }
    })
}

/// The uv timer's delay for a deadline of `due_ms` on a clock now at
/// `now_ms`: 0 when due (or NaN), at most `u64::MAX / 2` (libuv adds it to
/// its clock).
fn timer_delay_ms(due_ms: f64, now_ms: u64) -> u64 {
    if due_ms.is_nan() || due_ms <= now_ms as f64 {
        0
    } else if due_ms >= u64::MAX as f64 {
        u64::MAX / 2
    } else {
        (due_ms as u64 - now_ms).min(u64::MAX / 2)
    }
}

/// Moves due timers to the ready queue; `now` is the time just read, if any.
#[inline(always)]
fn collect_due_timers(py: Python<'_>, shared: &LoopShared, now: f64) {
    let released = shared.state.with(py, |st| queue_due_timers(py, st, now));
    for h in released {
        let_go(h);
    }
}

/// collect_due_timers's work on the state: the cancelled timers it popped
/// are returned, to let go of outside the borrow. (A function of its own,
/// always inlined: as a closure the turn's code outgrew inlining it.)
#[inline(always)]
fn queue_due_timers(py: Python<'_>, st: &mut super::LoopState, now: f64) -> Vec<Py<crate::handles::TimerHandle>> {
    let mut released = Vec::new();
    if st.timers.len() == 0 {
        return released;
    }
    st.timers.prune(py);
    while let Some(h) = st.timers.pop_due(py, now) {
        if h.get().is_cancelled(py) {
            released.push(h);
        } else {
            st.ready.push_back(Ready::Timer(h));
        }
    }
    released
}

/// One `uv_run`. No state borrow is held across it: callbacks borrow the
/// state themselves. Only a poll that may block hands the GIL to other
/// threads; a busy loop yields it through the interpreter's switch interval
/// like any Python code. A loop whose poll is already running (a protocol
/// callback driving the loop by hand) refuses.
fn uv_run(py: Python<'_>, shared: &LoopShared, mode: RunMode, may_block: bool) -> PyResult<()> {
    if !shared.run_uv(py, mode, may_block) {
        if shared.uv().raw_loop(py).is_none() {
            return Err(closed_error());
        }
        return Err(pyo3::exceptions::PyRuntimeError::new_err("the event loop is already polling"));
    }
    if let Some(err) = shared.gil.take_signal_error() {
        // Raised by the turn (the poll has returned: no uv_stop needed).
        shared.state.with(py, |st| {
            if st.pending_error.is_none() {
                st.pending_error = Some(err);
            }
        });
    }
    Ok(())
}

/// One turn: flush writes, poll (or skip an idle poll), move due timers
/// to the ready queue, run the callbacks queued when the turn began.
fn run_turn(py: Python<'_>, slf: &Bound<'_, PyAny>, shared: &LoopShared, pacing: &mut PollPacing) -> PyResult<()> {
    shared.turns.set(shared.turns.get() + 1);
    LoopStats::add(&shared.stats.turns, 1);
    shared.run_before_poll(py)?;
    let (open, busy, stopping) =
        shared.state.with(py, |st| (st.uv.is_some(), !st.ready.is_empty() || st.stopping, st.stopping));
    if !open {
        return Err(closed_error());
    }
    let now = if busy { monotonic() } else { 0.0 };
    // The time after a poll that may have waited, for the timers too.
    let mut polled_at = None;
    // (A transport that started reading last turn wants this turn's poll:
    // asyncio would see its data now. See Transport::first_read_waits.)
    let wanted = shared.poll_wanted.replace(false);
    if wanted || pacing.should_poll(busy, stopping, now) {
        shared.io_seen.set(false);
        let mut found = false;
        if !busy && pacing.look_ahead() {
            uv_run(py, shared, RunMode::NoWait, false)?;
            found = shared.io_seen.get()
                || shared.state.with(py, |st| !st.ready.is_empty() || st.stopping || st.pending_error.is_some());
            pacing.looked_ahead(found);
        }
        if !found {
            let mode = if busy {
                RunMode::NoWait
            } else {
                arm_timer(py, shared, super::python_clock_now(py, slf, shared)?);
                RunMode::Once
            };
            uv_run(py, shared, mode, !busy)?;
        }
        if !busy {
            let t = monotonic();
            polled_at = Some(t);
            pacing.last_poll = t;
        } else {
            pacing.last_poll = now;
        }
        pacing.last_had_io = shared.io_seen.get();
        if let Some(err) = shared.state.with(py, |st| st.pending_error.take()) {
            return Err(err);
        }
        shared.run_housekeeping_if_due(py);
    }
    let python_now = super::python_clock_now(py, slf, shared)?;
    let now = match python_now {
        Some(now) => now,
        None if shared.state.with(py, |st| st.timers.len() == 0) => 0.0,
        None => polled_at.unwrap_or_else(monotonic),
    };
    collect_due_timers(py, shared, now);
    if shared.stats.timing() {
        // The loop time the due timers were collected at (with a Python
        // clock, timer lag would mix two clocks: not measured).
        run_ready::<true>(slf, shared, python_now.is_none().then_some(now))
    } else {
        run_ready::<false>(slf, shared, None)
    }
}

/// Runs the callbacks queued when the turn began. `TIMED`: the loop's stats
/// are on (one read of the stats clock per callback, see stats.rs);
/// `timers_at` is the loop time due timers were collected at.
fn run_ready<const TIMED: bool>(slf: &Bound<'_, PyAny>, shared: &LoopShared, timers_at: Option<f64>) -> PyResult<()> {
    let py = slf.py();
    let n = shared.state.with(py, |st| st.ready.len());
    // When the callbacks began, what the last turn left, and what a callback
    // must take to enter the slowest list.
    let (began, marks, mut bar) = if TIMED {
        let began = stats::now();
        shared.stats.book.with(py, |b| (began, b.marks, b.slow_bar(began)))
    } else {
        (0, TurnMarks::default(), u64::MAX)
    };
    // When the next callback begins; the largest lag of a ready callback
    // (None: no ready callback ran).
    let mut last = began;
    let mut worst_lag: Option<u64> = None;
    let mut ran = 0u64;
    for i in 0..n {
        // close() from a callback empties the queue; stop there.
        let Some((item, debug)) = shared.state.with(py, |st| st.ready.pop_front().map(|i| (i, st.debug))) else {
            break;
        };
        let Some(due) = DueCall::take(py, &item, debug) else {
            item.let_go();
            continue;
        };
        let cb = due.callback();
        let started = debug.then(monotonic);
        let shared_ctx = due.shared_context();
        if let Some(ctx) = shared_ctx {
            shared.state.with(py, |st| st.ctx_cache.set_running(ctx));
        }
        // No borrow of native state is live here.
        let ok = due.run(py);
        if shared_ctx.is_some() {
            shared.state.with(py, |st| st.ctx_cache.set_running(std::ptr::null_mut()));
        }
        ran += 1;
        LoopStats::add(&shared.stats.callbacks, 1);
        if !ok {
            let err = PyErr::fetch(py);
            if is_fatal_base(py, &err) {
                return Err(err);
            }
            report_callback_error(slf, &item, cb, err)?;
        }
        if let Ready::Timer(h) = &item {
            LoopStats::add(&shared.stats.timers_fired, 1);
            if TIMED {
                if let Some(at) = timers_at {
                    // A deadline of -inf or NaN (asyncio accepts both) is
                    // late by nothing measurable: it counts from the turn.
                    let late = at - h.get().deadline();
                    let late_ns = if late.is_finite() { (late.max(0.0) * 1e9) as u64 } else { 0 };
                    let lag = late_ns.saturating_add(stats::ticks_to_ns(last.saturating_sub(began)));
                    shared.stats.book.with(py, |b| b.lag.record(lag));
                }
            }
        } else if TIMED {
            // Scheduled by the last turn's callbacks: due when they ended;
            // queued since (I/O, other threads): due when this turn began.
            let due = if i < marks.queued { marks.end } else { began };
            let lag = last.saturating_sub(due);
            worst_lag = Some(worst_lag.map_or(lag, |w| w.max(lag)));
        }
        if TIMED {
            let end = stats::now();
            let took = end.saturating_sub(last);
            last = end;
            if took > bar {
                note_slow_callback(slf, shared, &item, cb, end - took, took)?;
                bar = shared.stats.book.with(py, |b| b.slow_bar(end));
                // (Describing it is not the next callback's time.)
                last = stats::now();
            }
        }
        if let Some(t0) = started {
            let dt = monotonic() - t0;
            let limit: f64 = slf.getattr(python::event_loop::slow_callback_duration(py))?.extract()?;
            if dt >= limit {
                let (h, func) = (ready_object(py, &item), callback_func(py, cb));
                python::call_method(slf, python::event_loop::_warn_slow_callback(py), (h, func, dt))?;
            }
            let dropped = item.with_state(py, |c| c.finish_run());
            drop(dropped);
        }
        drop(due);
        item.let_go();
    }
    // After a burst, the queue's memory goes back once it is mostly empty.
    let queued = shared.state.with(py, |st| {
        let cap = st.ready.capacity();
        if cap > READY_KEEP && st.ready.len() < cap / 8 {
            st.ready.shrink_to(READY_KEEP.max(st.ready.len() * 2));
        }
        st.ready.len()
    });
    if TIMED {
        end_timed_turn(py, shared, last, worst_lag, ran, queued);
    }
    Ok(())
}

/// The figures of a timed turn that ended at `end`: its lag sample, its
/// length (poll waits left out), and the marks the next turn measures from.
fn end_timed_turn(py: Python<'_>, shared: &LoopShared, end: u64, worst_lag: Option<u64>, ran: u64, queued: usize) {
    let waited = shared.gil.waited();
    shared.stats.book.with(py, |b| {
        if let Some(lag) = worst_lag {
            b.lag.record(stats::ticks_to_ns(lag));
        }
        let took = end.saturating_sub(b.marks.end).saturating_sub(waited.saturating_sub(b.marks.waited));
        b.turn_time.record(stats::ticks_to_ns(took));
        if took > b.longest_turns.bar(end) {
            b.longest_turns.insert(end, took, TurnRecord { ended: end, callbacks: ran });
        }
        b.marks = TurnMarks { end, queued, waited };
    });
}

/// A callback that ran for `took` ticks from `started` enters the slowest
/// list, named as asyncio's debug mode names it (`loop._describe_callback`),
/// asked for after it returned. Only KeyboardInterrupt and SystemExit
/// escape (they stop the loop, as from the callback itself).
#[cold]
#[inline(never)]
fn note_slow_callback(
    slf: &Bound<'_, PyAny>,
    shared: &LoopShared,
    item: &Ready,
    cb: &Callback,
    started: u64,
    took: u64,
) -> PyResult<()> {
    let py = slf.py();
    let (handle, func) = (ready_object(py, item), callback_func(py, cb));
    // The handle shows its callback again while it is described (as in an
    // error report).
    let shown = item.with_state(py, |c| c.show_callback(cb));
    let described = python::call_method(slf, python::event_loop::_describe_callback(py), (handle, func))
        .and_then(|d| d.extract::<(String, Option<String>, Option<String>)>());
    if shown {
        let dropped = item.with_state(py, |c| c.finish_run());
        drop(dropped);
    }
    let (name, coroutine, location) = match described {
        Ok(d) => d,
        Err(err) if is_fatal_base(py, &err) => return Err(err),
        Err(err) => {
            err.write_unraisable(py, Some(slf));
            return Ok(());
        }
    };
    let entry = SlowCallback { started, name, coroutine, location, protocol: None };
    shared.stats.book.with(py, |b| b.slowest.insert(started + took, took, entry));
    Ok(())
}

/// Capacity the ready queue keeps however empty it gets (16 KiB).
const READY_KEEP: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timer_delays_round_up_and_clamp() {
        assert_eq!(timer_delay_ms(1500.0, 1000), 500);
        assert_eq!(timer_delay_ms(999.0, 1000), 0, "already due");
        assert_eq!(timer_delay_ms(f64::NAN, 0), 0);
        assert_eq!(timer_delay_ms(f64::INFINITY, 0), u64::MAX / 2);
        assert_eq!(timer_delay_ms(1e300, 5), u64::MAX / 2);
    }

    #[test]
    fn an_idle_loop_always_polls() {
        let p = PollPacing { last_poll: 100.0, last_had_io: false, look_ahead_skip: 0 };
        assert!(p.should_poll(false, false, 100.0));
    }

    #[test]
    fn a_busy_loop_polls_every_interval() {
        let p = PollPacing { last_poll: 1.0, last_had_io: false, look_ahead_skip: 0 };
        assert!(!p.should_poll(true, false, 1.0 + BUSY_POLL_INTERVAL / 2.0));
        assert!(p.should_poll(true, false, 1.0 + BUSY_POLL_INTERVAL));
        assert!(p.should_poll(true, true, 1.0), "a stopping loop polls once more");
        let flowing = PollPacing { last_had_io: true, ..p };
        assert!(flowing.should_poll(true, false, 1.0), "a loop moving I/O polls every turn");
    }

    #[test]
    fn look_ahead_backs_off_after_a_miss() {
        let mut p = PollPacing { last_poll: 0.0, last_had_io: true, look_ahead_skip: 0 };
        assert!(p.look_ahead());
        p.looked_ahead(false);
        let skipped = (0..LOOK_AHEAD_BACKOFF).filter(|_| !p.look_ahead()).count();
        assert_eq!(skipped as u32, LOOK_AHEAD_BACKOFF);
        assert!(p.look_ahead(), "tried again after the back-off");
        p.looked_ahead(true);
        assert!(p.look_ahead(), "a hit keeps looking ahead");
    }

    #[test]
    fn no_look_ahead_without_io() {
        let mut p = PollPacing::default();
        assert!(!p.look_ahead());
    }
}
