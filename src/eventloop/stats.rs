//! Loop metrics, for `loop.stats()`: counters kept on every turn, and, while
//! the loop's stats are on, the time it spends busy and waiting in the poll,
//! how late callbacks run (lag), how long turns take, the longest turns and
//! the slowest callbacks.
//!
//! What is timed, and why this way (docs/metrics.md has the measurements):
//! - The clock is the CPU's time-stamp counter where the kernel keeps time
//!   with it (x86-64 with the `tsc` clocksource): a few nanoseconds a read,
//!   where `clock_gettime` costs 30-80 ns inside a turn (it waits for the
//!   pipeline to drain), which would be a fifth of a `call_soon`. Elsewhere
//!   it is CLOCK_MONOTONIC. Ticks become seconds through a calibration
//!   against CLOCK_MONOTONIC, refined whenever a snapshot is taken.
//! - Each callback's run is bracketed by the reads around it (one read per
//!   callback); a run over the admission threshold of the slowest list (at
//!   least `SLOW_FLOOR`) is described by Python code, after it returned.
//! - Lag, one sample per timer (its start against its deadline) and one per
//!   turn that ran other callbacks: the largest lag among them, each taken
//!   as due when the turn that scheduled it ended, or, if it was queued
//!   between turns (I/O, other threads), when this turn's callbacks began.
//!   Both are lower bounds of the true lag.
//! - Waiting in the poll is the time the GIL was handed away for it
//!   (gil.rs); busy is the rest of the time inside run_forever.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Once;

use crate::cell::NativeCell;

/// Callbacks shorter than this never enter the slowest list (describing
/// one runs Python code).
pub(crate) const SLOW_FLOOR_NS: u64 = 1_000_000;
/// How many slowest callbacks and longest turns are kept.
pub(crate) const TOP_N: usize = 10;
/// The slowest list covers between one and two windows of this length.
pub(crate) const WINDOW_NS: u64 = 60_000_000_000;

// ---------------------------------------------------------------------------
// The clock

static INIT: Once = Once::new();
static USE_TSC: AtomicBool = AtomicBool::new(false);
/// The calibration's origin: a counter reading and CLOCK_MONOTONIC (ns) then.
static ORIGIN_TICKS: AtomicU64 = AtomicU64::new(0);
static ORIGIN_NS: AtomicU64 = AtomicU64::new(0);
/// Nanoseconds per tick, as a 32.32 fixed-point number.
static NS_PER_TICK_Q32: AtomicU64 = AtomicU64::new(1 << 32);

fn monotonic_ns() -> u64 {
    let ts = crate::os::eventloop::monotonic_timespec();
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(target_arch = "x86_64")]
use crate::os::eventloop::read_tsc;

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn read_tsc() -> u64 {
    monotonic_ns()
}

/// Whether the kernel itself keeps time with the TSC (so it is invariant and
/// synchronised between CPUs): only then is it read directly.
fn tsc_is_trusted() -> bool {
    cfg!(target_arch = "x86_64")
        && std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
            .map(|s| s.trim() == "tsc")
            .unwrap_or(false)
}

/// Chooses the clock and calibrates it, once per process.
pub(crate) fn init() {
    INIT.call_once(|| {
        if !tsc_is_trusted() {
            return;
        }
        let (t0, n0) = (read_tsc(), monotonic_ns());
        ORIGIN_TICKS.store(t0, Ordering::Relaxed);
        ORIGIN_NS.store(n0, Ordering::Relaxed);
        USE_TSC.store(true, Ordering::Relaxed);
        // A first estimate over 20 us; later calibrations use all the time
        // since.
        while monotonic_ns() - n0 < 20_000 {
            std::hint::spin_loop();
        }
        calibrate();
    })
}

/// Refines ticks-to-nanoseconds over the time since the origin.
pub(crate) fn calibrate() {
    if !USE_TSC.load(Ordering::Relaxed) {
        return;
    }
    let (t, n) = (read_tsc(), monotonic_ns());
    let dt = t.wrapping_sub(ORIGIN_TICKS.load(Ordering::Relaxed));
    let dn = n.saturating_sub(ORIGIN_NS.load(Ordering::Relaxed));
    if dt > 0 && dn > 0 {
        let q = ((dn as u128) << 32) / dt as u128;
        NS_PER_TICK_Q32.store(q.min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }
}

/// Now, in ticks of the stats clock.
#[inline(always)]
pub(crate) fn now() -> u64 {
    if USE_TSC.load(Ordering::Relaxed) {
        read_tsc()
    } else {
        monotonic_ns()
    }
}

#[inline]
pub(crate) fn ticks_to_ns(ticks: u64) -> u64 {
    ((ticks as u128 * NS_PER_TICK_Q32.load(Ordering::Relaxed) as u128) >> 32).min(u64::MAX as u128) as u64
}

pub(crate) fn ns_to_ticks(ns: u64) -> u64 {
    let q = NS_PER_TICK_Q32.load(Ordering::Relaxed).max(1);
    (((ns as u128) << 32) / q as u128).min(u64::MAX as u128) as u64
}

pub(crate) fn ticks_to_seconds(ticks: u64) -> f64 {
    ticks_to_ns(ticks) as f64 * 1e-9
}

/// A reading of the stats clock as seconds of `time.monotonic()` (the
/// loop's clock).
pub(crate) fn ticks_to_monotonic(t: u64) -> f64 {
    let (now_t, now_ns) = (now(), monotonic_ns());
    let ns = if t <= now_t { now_ns.saturating_sub(ticks_to_ns(now_t - t)) } else { now_ns + ticks_to_ns(t - now_t) };
    ns as f64 * 1e-9
}

/// The name of the clock in use, for `loop.stats()`.
pub(crate) fn clock_name() -> &'static str {
    if USE_TSC.load(Ordering::Relaxed) {
        "tsc"
    } else {
        "monotonic"
    }
}

// ---------------------------------------------------------------------------
// Histograms and top lists

/// Buckets: (0, 1 us], (1, 2 us], (2, 4 us], ... (2^25, 2^26 us] (67 s), and
/// everything above (python/zuvrs/stats.py has the same bounds).
pub(crate) const BUCKETS: usize = 28;

/// A histogram with power-of-two buckets, its sum and its maximum.
#[derive(Clone)]
pub(crate) struct LogHistogram {
    pub(crate) counts: [u64; BUCKETS],
    pub(crate) sum_ns: u64,
    pub(crate) max_ns: u64,
}

impl Default for LogHistogram {
    fn default() -> Self {
        LogHistogram { counts: [0; BUCKETS], sum_ns: 0, max_ns: 0 }
    }
}

impl LogHistogram {
    #[inline]
    fn bucket(ns: u64) -> usize {
        let us = ns.div_ceil(1000);
        if us <= 1 {
            0
        } else {
            ((64 - (us - 1).leading_zeros()) as usize).min(BUCKETS - 1)
        }
    }

    #[inline]
    pub(crate) fn record(&mut self, ns: u64) {
        self.counts[Self::bucket(ns)] += 1;
        self.sum_ns = self.sum_ns.saturating_add(ns);
        self.max_ns = self.max_ns.max(ns);
    }
}

/// The `TOP_N` largest entries by duration (ticks), largest first.
pub(crate) struct Top<T> {
    entries: Vec<(u64, T)>,
}

impl<T> Default for Top<T> {
    fn default() -> Self {
        Top { entries: Vec::new() }
    }
}

impl<T> Top<T> {
    /// Below this nothing gets in.
    fn bar(&self) -> u64 {
        if self.entries.len() < TOP_N {
            0
        } else {
            self.entries.last().map_or(0, |e| e.0)
        }
    }

    fn insert(&mut self, duration: u64, value: T) {
        if self.entries.len() >= TOP_N && duration <= self.bar() {
            return;
        }
        let at = self.entries.partition_point(|e| e.0 >= duration);
        self.entries.insert(at, (duration, value));
        self.entries.truncate(TOP_N);
    }
}

/// A top list over a sliding window: the entries of the current window and
/// of the one before, so a snapshot covers between one and two windows.
pub(crate) struct WindowedTop<T> {
    current: Top<T>,
    previous: Top<T>,
    /// When the current window began, and its length (ticks).
    started: u64,
    window: u64,
}

impl<T: Clone> WindowedTop<T> {
    fn new(now: u64, window: u64) -> Self {
        WindowedTop { current: Top::default(), previous: Top::default(), started: now, window }
    }

    #[inline]
    fn rotate(&mut self, now: u64) {
        let window = self.window;
        let age = now.saturating_sub(self.started);
        if age < window {
            return;
        }
        self.previous = if age < 2 * window { std::mem::take(&mut self.current) } else { Top::default() };
        self.current = Top::default();
        self.started = now;
    }

    /// What a new entry must exceed (ticks) to get in, at `now`.
    pub(crate) fn bar(&mut self, now: u64) -> u64 {
        self.rotate(now);
        self.current.bar()
    }

    pub(crate) fn insert(&mut self, now: u64, duration: u64, value: T) {
        self.rotate(now);
        self.current.insert(duration, value);
    }

    /// Both windows' entries, largest first, at most TOP_N.
    pub(crate) fn snapshot(&mut self, now: u64) -> Vec<(u64, T)> {
        self.rotate(now);
        let mut all: Vec<(u64, T)> = self.current.entries.iter().chain(&self.previous.entries).cloned().collect();
        all.sort_by_key(|e| std::cmp::Reverse(e.0));
        all.truncate(TOP_N);
        all
    }
}

/// A turn in the longest-turns list.
#[derive(Clone)]
pub(crate) struct TurnRecord {
    /// When it ended (ticks).
    pub(crate) ended: u64,
    pub(crate) callbacks: u64,
}

/// A callback in the slowest list: what asyncio's debug mode would name it
/// by, and for a task step the coroutine and where it is suspended.
#[derive(Clone)]
pub(crate) struct SlowCallback {
    /// When it began (ticks).
    pub(crate) started: u64,
    pub(crate) name: String,
    pub(crate) coroutine: Option<String>,
    pub(crate) location: Option<String>,
    pub(crate) protocol: Option<String>,
}

// ---------------------------------------------------------------------------
// The loop's figures

/// Bytes and calls of the loop's transports, for the loop's totals.
#[derive(Default)]
pub(crate) struct IoTotals {
    pub(crate) bytes_read: Cell<u64>,
    pub(crate) bytes_written: Cell<u64>,
    pub(crate) reads: Cell<u64>,
    pub(crate) writes: Cell<u64>,
    /// Pauses that ended, in ticks.
    pub(crate) read_paused: Cell<u64>,
    pub(crate) write_paused: Cell<u64>,
}

impl IoTotals {
    fn reset(&self) {
        for c in
            [&self.bytes_read, &self.bytes_written, &self.reads, &self.writes, &self.read_paused, &self.write_paused]
        {
            c.set(0);
        }
    }
}

/// Where the last turn's callbacks ended, which the next turn measures from.
#[derive(Default, Clone, Copy)]
pub(crate) struct TurnMarks {
    /// The end of the last turn's callbacks (or the start of the run).
    pub(crate) end: u64,
    /// The ready queue's length then: those callbacks were due by `end`.
    pub(crate) queued: usize,
    /// The poll's total wait then (ticks).
    pub(crate) waited: u64,
}

/// The timed figures.
pub(crate) struct Book {
    pub(crate) lag: LogHistogram,
    pub(crate) turn_time: LogHistogram,
    pub(crate) longest_turns: WindowedTop<TurnRecord>,
    pub(crate) slowest: WindowedTop<SlowCallback>,
    /// Time spent inside run_forever / _run_once (ticks), and since when
    /// the current run has been going.
    pub(crate) run_ticks: u64,
    pub(crate) running_since: Option<u64>,
    pub(crate) marks: TurnMarks,
    /// SLOW_FLOOR_NS in ticks (kept: converting costs a 128-bit division).
    floor: u64,
}

impl Book {
    fn new(now: u64) -> Self {
        let window = ns_to_ticks(WINDOW_NS);
        Book {
            lag: LogHistogram::default(),
            turn_time: LogHistogram::default(),
            longest_turns: WindowedTop::new(now, window),
            slowest: WindowedTop::new(now, window),
            run_ticks: 0,
            running_since: None,
            marks: TurnMarks::default(),
            floor: ns_to_ticks(SLOW_FLOOR_NS),
        }
    }

    /// What a callback's run must exceed (ticks) to enter the slowest list.
    #[inline]
    pub(crate) fn slow_bar(&mut self, now: u64) -> u64 {
        self.slowest.bar(now).max(self.floor)
    }

    /// The conversions kept in ticks follow a new calibration.
    pub(crate) fn recalibrated(&mut self) {
        let window = ns_to_ticks(WINDOW_NS);
        self.longest_turns.window = window;
        self.slowest.window = window;
        self.floor = ns_to_ticks(SLOW_FLOOR_NS);
    }
}

/// A loop's metrics. The counters sit in `Cell`s (the loop's thread, or
/// another one holding the GIL, updates them); `wakeups` is counted by
/// libuv's async callback, which may run without the GIL.
pub(crate) struct LoopStats {
    /// Timing is on (the loop's `stats` switch).
    enabled: Cell<bool>,
    pub(crate) turns: Cell<u64>,
    pub(crate) callbacks: Cell<u64>,
    pub(crate) timers_fired: Cell<u64>,
    pub(crate) io_events: Cell<u64>,
    pub(crate) threadsafe_calls: Cell<u64>,
    pub(crate) wakeups: AtomicU64,
    pub(crate) io: IoTotals,
    pub(crate) book: NativeCell<Book>,
}

impl LoopStats {
    pub(crate) fn new() -> Self {
        init();
        LoopStats {
            enabled: Cell::new(false),
            turns: Cell::new(0),
            callbacks: Cell::new(0),
            timers_fired: Cell::new(0),
            io_events: Cell::new(0),
            threadsafe_calls: Cell::new(0),
            wakeups: AtomicU64::new(0),
            io: IoTotals::default(),
            book: NativeCell::new(Book::new(now())),
        }
    }

    /// Whether timing is on.
    #[inline(always)]
    pub(crate) fn timing(&self) -> bool {
        self.enabled.get()
    }

    pub(crate) fn set_timing(&self, on: bool) {
        self.enabled.set(on);
    }

    #[inline(always)]
    pub(crate) fn add(counter: &Cell<u64>, n: u64) {
        counter.set(counter.get().wrapping_add(n));
    }

    /// Zeroes every figure (`loop.stats(reset=True)`).
    pub(crate) fn reset_counters(&self) {
        for c in [&self.turns, &self.callbacks, &self.timers_fired, &self.io_events, &self.threadsafe_calls] {
            c.set(0);
        }
        self.wakeups.store(0, Ordering::Relaxed);
        self.io.reset();
    }

    /// A fresh book (keeping a run's start and the turn marks, restarted now).
    pub(crate) fn reset_book(book: &mut Book, now: u64) {
        let running = book.running_since.map(|_| now);
        let marks = book.marks;
        *book = Book::new(now);
        book.running_since = running;
        book.marks = marks;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two_microseconds() {
        assert_eq!(LogHistogram::bucket(0), 0);
        assert_eq!(LogHistogram::bucket(1000), 0);
        assert_eq!(LogHistogram::bucket(1001), 1);
        assert_eq!(LogHistogram::bucket(2000), 1);
        assert_eq!(LogHistogram::bucket(2001), 2);
        assert_eq!(LogHistogram::bucket(4000), 2);
        assert_eq!(LogHistogram::bucket(50_000_000), 16, "50 ms is in (32.768, 65.536] ms");
        assert_eq!(LogHistogram::bucket(67_108_864_000), BUCKETS - 2, "2^26 us, the last bound (stats.py)");
        assert_eq!(LogHistogram::bucket(67_108_864_001), BUCKETS - 1);
        assert_eq!(LogHistogram::bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn top_keeps_the_largest_first() {
        let mut top = Top::default();
        for d in [5u64, 1, 9, 3, 7, 2, 8, 6, 4, 10, 0, 11] {
            top.insert(d, d);
        }
        let kept: Vec<u64> = top.entries.iter().map(|e| e.0).collect();
        assert_eq!(kept, [11, 10, 9, 8, 7, 6, 5, 4, 3, 2]);
        assert_eq!(top.bar(), 2);
    }

    #[test]
    fn windows_age_out() {
        init();
        let w = ns_to_ticks(WINDOW_NS);
        let mut top = WindowedTop::new(0, w);
        top.insert(1, 5, 'a');
        top.insert(w + 1, 3, 'b');
        let seen: Vec<char> = top.snapshot(w + 2).into_iter().map(|e| e.1).collect();
        assert_eq!(seen, ['a', 'b'], "the previous window is still reported");
        assert!(top.snapshot(3 * w + 3).is_empty(), "two windows later nothing is left");
    }

    #[test]
    fn ticks_convert_both_ways() {
        init();
        calibrate();
        let t = ns_to_ticks(1_000_000);
        let back = ticks_to_ns(t);
        assert!(back.abs_diff(1_000_000) < 10, "{back}");
    }
}
