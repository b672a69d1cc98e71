//! What every native transport core shares: the asyncio bookkeeping of a
//! transport (`TransportBase`), the first and last steps of its libuv
//! callbacks, and the calls it makes into its Python transport and protocol
//! (`Transport`). Its libuv handle is an owner of uv.rs (`UvStream`,
//! `UvPoll`), whose trampolines call the core.
//!
//! A core is the native half of a Python transport (python/zuvrs/transports):
//! the Python object is an `asyncio.Transport` whose hot methods are the
//! core's, and which does what happens once per connection
//! (`connection_made`, `connection_lost`, error reports). The core calls
//! back into it by the names in `python::transport`.

use pyo3::prelude::*;
use pyo3::PyClass;

use crate::capi::transport::copy_context;
use crate::cell::NativeCell;
use crate::errors::is_fatal_base;
use crate::eventloop::stats::{self, IoTotals, LoopStats, SlowCallback};
use crate::eventloop::{warn_if_slow_io, LoopShared};
use crate::handles::context::ContextScope;
use crate::python;

/// asyncio's default write buffer high-water mark (the low one is a quarter).
pub(crate) const DEFAULT_HIGH_WATER: usize = 64 * 1024;
/// After this many writes to a lost connection asyncio starts warning.
pub(crate) const LOG_THRESHOLD_FOR_CONNLOST_WRITES: u32 = 5;

/// asyncio's per-transport state, the same for streams and datagrams.
pub(crate) struct TransportBase {
    /// The zuvrs.Loop.
    pub(crate) loop_obj: Py<PyAny>,
    /// The Python transport (an asyncio.Transport) this core belongs to;
    /// None once connection_lost has run (nothing calls back any more).
    pub(crate) wrapper: Py<PyAny>,
    pub(crate) protocol: Option<Py<PyAny>>,
    /// start_reading() was called (connection_made has run).
    pub(crate) started: bool,
    /// pause_reading() is in force.
    pub(crate) paused: bool,
    pub(crate) closing: bool,
    /// asyncio's `_conn_lost`: non-zero once connection_lost is scheduled,
    /// then counting the writes dropped since.
    pub(crate) conn_lost: u32,
    pub(crate) high_water: usize,
    pub(crate) low_water: usize,
    /// The protocol was told to pause writing.
    pub(crate) protocol_paused: bool,
    /// Pause once the buffer reaches the high-water mark (asyncio's TLS
    /// transport), not once it exceeds it (its socket transports).
    pub(crate) pause_on_reaching_high: bool,
    /// The context the protocol's callbacks run in: a copy of the one the
    /// transport was made in (see `ContextScope`).
    pub(crate) context: Py<PyAny>,
    /// The turn in which reading last started or resumed
    /// (`Transport::note_read_start`).
    pub(crate) read_started_turn: Option<u64>,
    /// `get_extra_info('zuvrs_stats')`.
    pub(crate) stats: TransportStats,
}

/// A pause's time: since when (ticks of the stats clock), and the total of
/// those that ended.
#[derive(Default)]
struct PauseTime {
    since: Option<u64>,
    total: u64,
}

impl PauseTime {
    /// A pause begins (timed only while the loop's stats are on) or ends
    /// (its time also goes to the loop's total). Out of line: called on
    /// flow control's changes only, from code that runs on every write.
    #[cold]
    #[inline(never)]
    fn set(&mut self, paused: bool, timing: bool, loop_total: &std::cell::Cell<u64>) {
        match (paused, self.since) {
            (true, None) if timing => self.since = Some(stats::now()),
            (false, Some(since)) => {
                let took = stats::now().saturating_sub(since);
                self.total += took;
                LoopStats::add(loop_total, took);
                self.since = None;
            }
            _ => {}
        }
    }

    fn seconds(&self) -> f64 {
        let live = self.since.map_or(0, |since| stats::now().saturating_sub(since));
        stats::ticks_to_seconds(self.total + live)
    }
}

/// A transport's figures, each also added to its loop's totals. Reads and
/// writes count system calls (a write request handed to libuv counts one).
#[derive(Default)]
pub(crate) struct TransportStats {
    bytes_read: u64,
    reads: u64,
    bytes_written: u64,
    writes: u64,
    write_buffer_high: usize,
    reading_paused: PauseTime,
    writing_paused: PauseTime,
}

impl TransportStats {
    /// One read call that brought `n` bytes.
    #[inline]
    pub(crate) fn read(&mut self, io: &IoTotals, n: usize) {
        self.reads += 1;
        self.bytes_read += n as u64;
        LoopStats::add(&io.reads, 1);
        LoopStats::add(&io.bytes_read, n as u64);
    }

    /// `calls` write calls (or requests) that sent `n` bytes.
    #[inline]
    pub(crate) fn wrote(&mut self, io: &IoTotals, calls: u64, n: usize) {
        self.writes += calls;
        self.bytes_written += n as u64;
        LoopStats::add(&io.writes, calls);
        LoopStats::add(&io.bytes_written, n as u64);
    }

    /// The write buffer holds `size` bytes.
    #[inline]
    pub(crate) fn buffered(&mut self, size: usize) {
        self.write_buffer_high = self.write_buffer_high.max(size);
    }

    /// The figures, copied out (to make Python objects of outside a borrow).
    fn figures(&self) -> [(&'static str, f64); 7] {
        [
            ("bytes_read", self.bytes_read as f64),
            ("bytes_written", self.bytes_written as f64),
            ("reads", self.reads as f64),
            ("writes", self.writes as f64),
            ("write_buffer_high", self.write_buffer_high as f64),
            ("reading_paused_seconds", self.reading_paused.seconds()),
            ("writing_paused_seconds", self.writing_paused.seconds()),
        ]
    }
}

impl TransportBase {
    pub(crate) fn new(py: Python<'_>, loop_obj: Py<PyAny>, wrapper: Py<PyAny>) -> PyResult<Self> {
        let context = copy_context(py)?;
        Ok(TransportBase {
            loop_obj,
            wrapper,
            protocol: None,
            started: false,
            paused: false,
            closing: false,
            conn_lost: 0,
            high_water: DEFAULT_HIGH_WATER,
            low_water: DEFAULT_HIGH_WATER / 4,
            protocol_paused: false,
            pause_on_reaching_high: false,
            context,
            read_started_turn: None,
            stats: TransportStats::default(),
        })
    }

    /// Reading is wanted: started, not paused, not closing.
    pub(crate) fn wants_reading(&self) -> bool {
        self.started && !self.paused && !self.closing
    }

    /// Reports its references to the cyclic GC.
    pub(crate) fn visit(&self, visit: &pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        visit.call(&self.loop_obj)?;
        visit.call(&self.wrapper)?;
        visit.call(&self.protocol)?;
        visit.call(&self.context)
    }
}

/// The state of a core, which holds a `TransportBase`.
pub(crate) trait HasBase {
    fn base(&mut self) -> &mut TransportBase;
}

/// A native transport core: the Python-visible object that owns a libuv
/// handle and a `TransportBase`. The provided methods are the calls every
/// core makes into Python, each reading what it needs from the state first
/// and calling with no state borrowed.
pub(crate) trait Transport: PyClass + Sync + Sized + 'static {
    type State: HasBase;

    fn cell(&self) -> &NativeCell<Self::State>;

    /// The loop the core lives on (set at creation, never changed).
    fn shared(&self) -> &LoopShared;

    #[inline]
    fn with_base<R>(&self, py: Python<'_>, f: impl FnOnce(&mut TransportBase) -> R) -> R {
        self.cell().with(py, |st| f(st.base()))
    }

    fn wrapper(&self, py: Python<'_>) -> Py<PyAny> {
        self.with_base(py, |b| b.wrapper.clone_ref(py))
    }

    fn protocol(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.with_base(py, |b| b.protocol.as_ref().map(|p| p.clone_ref(py)))
    }

    /// The protocol's context made current until the scope is dropped.
    #[inline]
    fn protocol_context(&self, py: Python<'_>) -> ContextScope {
        ContextScope::enter(py, self.with_base(py, |b| b.context.clone_ref(py)))
    }

    /// What ends the connection: `wrapper._call_connection_lost`, unless
    /// the core does it itself.
    fn connection_lost_callback<'py>(&self, wrapper: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        wrapper.getattr(python::transport::_call_connection_lost(wrapper.py()))
    }

    /// Schedules `wrapper._call_connection_lost(exc)` (or the core's own
    /// end) on the loop, in the protocol's context.
    fn schedule_connection_lost(&self, py: Python<'_>, exc: Option<Py<PyAny>>) -> PyResult<()> {
        let (loop_obj, wrapper, context) =
            self.with_base(py, |b| (b.loop_obj.clone_ref(py), b.wrapper.clone_ref(py), b.context.clone_ref(py)));
        let cb = self.connection_lost_callback(wrapper.bind(py))?;
        let exc = exc.unwrap_or_else(|| py.None()).into_bound(py);
        let call_soon = python::event_loop::call_soon(py);
        python::call_method_in_context(loop_obj.bind(py), call_soon, &[&cb, &exc], context.bind(py))?;
        Ok(())
    }

    /// `wrapper._fatal_error(exc, message)` (asyncio's transport contract);
    /// nothing once the transport has finished (a late error is dropped).
    fn fatal_error(&self, py: Python<'_>, exc: PyErr, message: &str) -> PyResult<()> {
        let wrapper = self.wrapper(py);
        if wrapper.is_none(py) {
            return Ok(());
        }
        python::call_method(wrapper.bind(py), python::transport::_fatal_error(py), (exc.into_value(py), message))?;
        Ok(())
    }

    /// `wrapper._report_error(message, exc)`: the loop's exception handler
    /// with the transport and protocol in the context.
    fn report(&self, py: Python<'_>, message: &str, err: PyErr) -> PyResult<()> {
        let wrapper = self.wrapper(py);
        python::call_method(wrapper.bind(py), python::transport::_report_error(py), (message, err.into_value(py)))?;
        Ok(())
    }

    /// An exception that escaped Python code run from a libuv callback:
    /// KeyboardInterrupt and SystemExit stop the loop and propagate out of
    /// run_forever; anything else (reporting itself failed: the exception
    /// handler raised) goes to the unraisable hook.
    fn fail_in_callback(&self, py: Python<'_>, err: PyErr) {
        if is_fatal_base(py, &err) {
            self.shared().raise_later(py, err);
        } else {
            err.write_unraisable(py, None);
        }
    }

    /// An exception raised by protocol code that asyncio calls straight from
    /// an fd callback (datagrams, read pipes): `wrapper._callback_failed`
    /// reports it as the loop reports a failing callback ("Exception in
    /// callback ..."); the transport carries on.
    fn callback_failed(&self, py: Python<'_>, err: PyErr, writing: bool) -> PyResult<()> {
        let wrapper = self.wrapper(py);
        python::call_method(wrapper.bind(py), python::transport::_callback_failed(py), (err.into_value(py), writing))?;
        Ok(())
    }

    /// Calls `protocol.pause_writing()` once `buffered` bytes are over the
    /// high-water mark (asyncio's `_maybe_pause_protocol`).
    #[inline]
    fn pause_protocol_if_needed(&self, py: Python<'_>, buffered: usize) -> PyResult<()> {
        let loop_stats = &self.shared().stats;
        let protocol = self.with_base(py, |b| {
            let below = if b.pause_on_reaching_high { buffered < b.high_water } else { buffered <= b.high_water };
            if b.protocol_paused || below {
                return None;
            }
            b.protocol_paused = true;
            b.stats.writing_paused.set(true, loop_stats.timing(), &loop_stats.io.write_paused);
            b.protocol.as_ref().map(|p| p.clone_ref(py))
        });
        self.tell_protocol(py, protocol, python::protocol::pause_writing(py), "protocol.pause_writing() failed")
    }

    /// Calls `protocol.resume_writing()` once `buffered` bytes are down to
    /// the low-water mark (asyncio's `_maybe_resume_protocol`).
    #[inline]
    fn resume_protocol_if_needed(&self, py: Python<'_>, buffered: usize) -> PyResult<()> {
        let loop_stats = &self.shared().stats;
        let protocol = self.with_base(py, |b| {
            if !b.protocol_paused || buffered > b.low_water {
                return None;
            }
            b.protocol_paused = false;
            b.stats.writing_paused.set(false, loop_stats.timing(), &loop_stats.io.write_paused);
            b.protocol.as_ref().map(|p| p.clone_ref(py))
        });
        self.tell_protocol(py, protocol, python::protocol::resume_writing(py), "protocol.resume_writing() failed")
    }

    #[doc(hidden)]
    fn tell_protocol(
        &self,
        py: Python<'_>,
        protocol: Option<Py<PyAny>>,
        method: &Bound<'_, pyo3::types::PyString>,
        failure: &str,
    ) -> PyResult<()> {
        let Some(protocol) = protocol else { return Ok(()) };
        let _context = self.protocol_context(py);
        if let Err(err) = python::call_method0(protocol.bind(py), method) {
            if is_fatal_base(py, &err) {
                return Err(err);
            }
            self.report(py, failure, err)?;
        }
        Ok(())
    }

    /// The first steps of a core's libuv callback once the trampoline (uv.rs)
    /// has the GIL back and told the turn that I/O happened: the debug
    /// clock, the stats clock, and the protocol's context made current
    /// (until the scope, which `leave_io` takes, is dropped).
    #[inline]
    fn begin_io(&self, py: Python<'_>) -> IoScope {
        let started = self.shared().debug_clock(py);
        let timed = self.shared().stats.timing().then(stats::now);
        let context = self.protocol_context(py);
        IoScope { started, timed, _context: context }
    }

    /// The last step of a libuv callback that ran protocol code: the
    /// slowest list (stats on) and debug mode's slow-callback warning, then
    /// the protocol's context left.
    fn leave_io(&self, py: Python<'_>, scope: IoScope) {
        if let Some(began) = scope.timed {
            let end = stats::now();
            let took = end.saturating_sub(began);
            let loop_stats = &self.shared().stats;
            if took > loop_stats.book.with(py, |b| b.slow_bar(end)) {
                self.note_slow_io(py, began, took);
            }
        }
        if let Some(started) = scope.started {
            let (loop_obj, wrapper) = self.with_base(py, |b| (b.loop_obj.clone_ref(py), b.wrapper.clone_ref(py)));
            warn_if_slow_io(py, loop_obj.bind(py), wrapper.bind(py), started);
        }
    }

    /// Reading starts or resumes now (start_reading, resume_reading):
    /// see `first_read_waits`.
    fn note_read_start(&self, py: Python<'_>) {
        let shared = self.shared();
        let turn = shared.turn_number();
        // The next turn polls: asyncio's would see data already waiting.
        shared.want_poll();
        self.with_base(py, |b| b.read_started_turn = Some(turn));
    }

    /// Whether what the socket has now must wait for the callbacks already
    /// queued. asyncio's selector loop runs an fd's read callback from the
    /// ready queue, behind everything queued before the poll that saw it:
    /// reading that starts in one turn (connection_made, reading and the
    /// connection's waiter are queued together) delivers nothing before the
    /// callbacks queued in that turn have run (the task awaiting the
    /// waiter, what connection_made queued), and nothing after those of the
    /// next. A core reads inside libuv's poll, ahead of the queue, so in the
    /// turn reading started and in the next one (which polls, even if busy:
    /// `note_read_start`), while callbacks are queued, it leaves the data in
    /// the kernel; the next turn's poll reads it (after they ran: a turn
    /// runs what was queued before its poll, and it polls, having seen I/O).
    /// Later reads are not held (the cost would be per read).
    fn first_read_waits(&self, py: Python<'_>) -> bool {
        let started = self.with_base(py, |b| b.read_started_turn);
        match started {
            Some(t) if self.shared().turn_number() <= t + 1 => self.shared().has_ready(py),
            _ => false,
        }
    }

    /// A protocol callback run from libuv's callback enters the slowest
    /// list under the name debug mode gives it (`loop._warn_slow_io`).
    #[cold]
    #[inline(never)]
    #[doc(hidden)]
    fn note_slow_io(&self, py: Python<'_>, began: u64, took: u64) {
        let (wrapper, protocol) =
            self.with_base(py, |b| (b.wrapper.clone_ref(py), b.protocol.as_ref().map(|p| p.clone_ref(py))));
        let type_name = |o: &Py<PyAny>| o.bind(py).get_type().qualname().map(|n| n.to_string()).unwrap_or_default();
        let entry = SlowCallback {
            started: began,
            name: format!("<Handle {}._read_ready()>", type_name(&wrapper)),
            coroutine: None,
            location: None,
            protocol: protocol.as_ref().map(type_name),
        };
        self.shared().stats.book.with(py, |b| b.slowest.insert(began + took, took, entry));
    }

    /// Reading was paused or resumed (pause_reading() / resume_reading()).
    fn reading_paused(&self, py: Python<'_>, paused: bool) {
        let loop_stats = &self.shared().stats;
        self.with_base(py, |b| {
            let paused = paused && !b.closing;
            b.stats.reading_paused.set(paused, loop_stats.timing(), &loop_stats.io.read_paused)
        })
    }

    /// The transport's figures (`get_extra_info('zuvrs_stats')`).
    fn stats_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let figures = self.cell().with(py, |st| st.base().stats.figures());
        let d = pyo3::types::PyDict::new(py);
        for (name, value) in figures {
            if name.ends_with("_seconds") {
                d.set_item(name, value)?;
            } else {
                d.set_item(name, value as u64)?;
            }
        }
        Ok(d)
    }

    /// Sets the water marks (the Python transport checks and keeps the
    /// limits as asyncio's `_set_write_buffer_limits` does), then pauses the
    /// protocol if `buffered` is now over the high one.
    fn set_water_marks(&self, py: Python<'_>, high: usize, low: usize, buffered: usize) -> PyResult<()> {
        self.with_base(py, |b| {
            b.high_water = high;
            b.low_water = low;
        });
        self.pause_protocol_if_needed(py, buffered)
    }
}

/// What a libuv callback entered (`Transport::begin_io`) and leaves
/// (`Transport::leave_io`).
pub(crate) struct IoScope {
    /// The debug clock at the start.
    started: Option<f64>,
    /// The stats clock at the start (the loop's stats are on).
    timed: Option<u64>,
    _context: ContextScope,
}
