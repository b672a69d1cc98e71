//! The timer heap: every `call_later` / `call_at` of a loop shares one libuv
//! timer, armed for the earliest live deadline.
//!
//! The heap is asyncio's: `heapq`'s algorithms step by step, with its
//! comparison of `TimerHandle`s (`when < other.when`), so a NaN deadline,
//! which compares false both ways, sits and moves in the heap where
//! asyncio's would, and fires when it reaches the top (a NaN is never
//! "later" than now). Equal deadlines fire in the order they were scheduled
//! (heapq's order for them depends on the heap's shape): successive
//! `call_later(d)` calls read the clock at different times in asyncio, and
//! zuvrs's calls, faster, can read the same nanosecond. Cancelling is O(1): the handle is marked and
//! counted in the shared [`TimerBook`]; dead entries are dropped when they reach
//! the top, and the heap is rebuilt when they are more than half of it. A heap
//! that has shrunk to a small part of its capacity gives the memory back.

use std::rc::Rc;

use pyo3::prelude::*;

use crate::handles::{let_go, TimerBook, TimerHandle};

/// Below this many entries a heap full of cancelled timers is not worth a
/// rebuild (the same threshold asyncio uses).
const MIN_ENTRIES_TO_COMPACT: usize = 100;

/// What the heap holds: a timer handle, or a stand-in in unit tests.
pub(crate) trait Timer {
    fn is_cancelled(&self, py: Python<'_>) -> bool;
    /// The handle leaves the heap.
    fn unschedule(&self);
    /// The heap's reference goes (see `let_go`).
    fn let_go(self);
}

impl Timer for Py<TimerHandle> {
    #[inline]
    fn is_cancelled(&self, py: Python<'_>) -> bool {
        self.get().is_cancelled(py)
    }

    #[inline]
    fn unschedule(&self) {
        self.get().unschedule()
    }

    #[inline]
    fn let_go(self) {
        let_go(self)
    }
}

struct Entry<T> {
    when: f64,
    seq: u64,
    timer: T,
}

impl<T> Entry<T> {
    /// heapq's `<` for asyncio's timers (`TimerHandle.__lt__`: the earlier
    /// deadline, false both ways when either is NaN), equal deadlines in
    /// scheduling order.
    #[inline]
    fn before(&self, other: &Self) -> bool {
        self.when < other.when || (self.when == other.when && self.seq < other.seq)
    }
}

/// A binary min-heap run exactly as Python's `heapq` runs asyncio's
/// `_scheduled` list (`heappush`, `heappop`, `heapify`), with `before` as
/// its `<`: the same moves for the same comparisons.
struct Heap<T>(Vec<Entry<T>>);

impl<T> Heap<T> {
    /// heapq's `_siftdown`: the entry at `pos` moves up while it is before
    /// its parent (no further up than `start`).
    #[inline]
    fn sift_up(&mut self, start: usize, mut pos: usize) {
        let h = &mut self.0;
        while pos > start {
            let parent = (pos - 1) >> 1;
            if !h[pos].before(&h[parent]) {
                break;
            }
            h.swap(pos, parent);
            pos = parent;
        }
    }

    /// heapq's `_siftup`: the smaller child moves up until `pos` reaches a
    /// leaf (the right one unless the left is before it), then the entry
    /// that was at `pos` moves up from there.
    #[inline]
    fn sift_down_to_leaf(&mut self, pos: usize) {
        let end = self.0.len();
        let mut hole = pos;
        let mut child = 2 * hole + 1;
        while child < end {
            let right = child + 1;
            if right < end && !self.0[child].before(&self.0[right]) {
                child = right;
            }
            self.0.swap(hole, child);
            hole = child;
            child = 2 * hole + 1;
        }
        self.sift_up(pos, hole);
    }

    fn push(&mut self, e: Entry<T>) {
        self.0.push(e);
        let last = self.0.len() - 1;
        self.sift_up(0, last);
    }

    fn pop(&mut self) -> Option<Entry<T>> {
        let last = self.0.pop()?;
        if self.0.is_empty() {
            return Some(last);
        }
        let top = std::mem::replace(&mut self.0[0], last);
        self.sift_down_to_leaf(0);
        Some(top)
    }

    fn peek(&self) -> Option<&Entry<T>> {
        self.0.first()
    }

    /// heapq's `heapify`.
    fn from_vec(v: Vec<Entry<T>>) -> Self {
        let mut h = Heap(v);
        for i in (0..h.0.len() / 2).rev() {
            h.sift_down_to_leaf(i);
        }
        h
    }
}

pub(crate) struct TimerHeap<T: Timer = Py<TimerHandle>> {
    heap: Heap<T>,
    next_seq: u64,
    book: Rc<TimerBook>,
}

impl<T: Timer> TimerHeap<T> {
    pub(crate) fn new() -> Self {
        TimerHeap {
            heap: Heap(Vec::new()),
            next_seq: 0,
            book: Rc::new(TimerBook {
                cancelled_in_heap: std::cell::Cell::new(0),
                cancelled_total: std::cell::Cell::new(0),
            }),
        }
    }

    pub(crate) fn book(&self) -> &Rc<TimerBook> {
        &self.book
    }

    pub(crate) fn push(&mut self, timer: T, when: f64) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.heap.push(Entry { when, seq, timer });
    }

    pub(crate) fn len(&self) -> usize {
        self.heap.0.len()
    }

    fn count_uncancelled(&self) {
        let c = &self.book.cancelled_in_heap;
        c.set(c.get().saturating_sub(1));
    }

    /// Drops cancelled entries: all of them when they are the majority,
    /// otherwise those at the top. (A cancelled handle holds no Python
    /// references, so releasing it here runs no Python code.)
    pub(crate) fn prune(&mut self, py: Python<'_>) {
        let cancelled = self.book.cancelled_in_heap.get();
        if cancelled == 0 {
            return;
        }
        if self.len() > MIN_ENTRIES_TO_COMPACT && cancelled * 2 > self.len() {
            let old = std::mem::take(&mut self.heap.0);
            let mut live = Vec::with_capacity(old.len() - cancelled);
            for e in old {
                if e.timer.is_cancelled(py) {
                    e.timer.unschedule();
                    e.timer.let_go();
                } else {
                    live.push(e);
                }
            }
            self.heap = Heap::from_vec(live);
            self.book.cancelled_in_heap.set(0);
            return;
        }
        while let Some(top) = self.heap.peek() {
            if !top.timer.is_cancelled(py) {
                break;
            }
            let e = self.heap.pop().expect("peeked");
            e.timer.unschedule();
            e.timer.let_go();
            self.count_uncancelled();
        }
        self.shrink();
    }

    /// Gives memory back once the heap uses a small part of what it holds
    /// (after a burst of a million timers, say).
    fn shrink(&mut self) {
        let v = &mut self.heap.0;
        let cap = v.capacity();
        if cap > 4096 && v.len() < cap / 8 {
            v.shrink_to(v.len() * 2);
        }
    }

    /// The earliest deadline (call `prune` first to skip cancelled entries).
    pub(crate) fn next_deadline(&self) -> Option<f64> {
        self.heap.peek().map(|e| e.when)
    }

    /// Pops the earliest entry if it is due at `now` (cancelled entries at the
    /// top are returned too; the caller skips them when running).
    #[inline]
    pub(crate) fn pop_due(&mut self, py: Python<'_>, now: f64) -> Option<T> {
        // (A NaN deadline is due: asyncio's `when >= end_time` is false.)
        if self.heap.peek()?.when > now {
            return None;
        }
        let e = self.heap.pop().expect("peeked");
        e.timer.unschedule();
        if e.timer.is_cancelled(py) {
            self.count_uncancelled();
        }
        if self.heap.0.is_empty() {
            self.shrink();
        }
        Some(e.timer)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.heap.0.iter().map(|e| &e.timer)
    }

    /// Empties the heap, handing every handle to the caller (loop close).
    pub(crate) fn drain(&mut self) -> Vec<T> {
        self.book.cancelled_in_heap.set(0);
        std::mem::take(&mut self.heap.0)
            .into_iter()
            .map(|e| {
                e.timer.unschedule();
                e.timer
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use super::*;

    /// A timer that knows its name and whether it was cancelled.
    struct Fake {
        name: u32,
        cancelled: Rc<Cell<bool>>,
    }

    impl Timer for Fake {
        fn is_cancelled(&self, _py: Python<'_>) -> bool {
            self.cancelled.get()
        }
        fn unschedule(&self) {}
        fn let_go(self) {}
    }

    fn fake(name: u32) -> (Fake, Rc<Cell<bool>>) {
        let flag = Rc::new(Cell::new(false));
        (Fake { name, cancelled: flag.clone() }, flag)
    }

    fn with_py(f: impl FnOnce(Python<'_>)) {
        Python::initialize();
        Python::attach(f);
    }

    /// The order Python's heapq pops the same pushes in, with asyncio's
    /// comparison (checked with CPython: `heapq.heappush` of objects whose
    /// `__lt__` compares `when`, then `heappop` until empty).
    #[test]
    fn pops_in_heapqs_order() {
        with_py(|py| {
            let nan = f64::NAN;
            let mut heap = TimerHeap::<Fake>::new();
            for (name, when) in [(0, nan), (1, 1.0), (2, nan), (3, 0.5), (4, 2.0), (5, nan), (6, 0.1)] {
                heap.push(fake(name).0, when);
            }
            let order: Vec<u32> = std::iter::from_fn(|| heap.pop_due(py, 10.0)).map(|t| t.name).collect();
            assert_eq!(order, [0, 2, 5, 6, 3, 1, 4]);
        });
    }

    #[test]
    fn earliest_first_and_ties_in_scheduling_order() {
        with_py(|py| {
            let mut heap = TimerHeap::<Fake>::new();
            for (name, when) in [(0, 3.0), (1, 1.0), (2, 2.0), (3, 1.0), (4, 1.0)] {
                heap.push(fake(name).0, when);
            }
            let order: Vec<u32> = std::iter::from_fn(|| heap.pop_due(py, 10.0)).map(|t| t.name).collect();
            assert_eq!(order, [1, 3, 4, 2, 0]);
        });
    }

    #[test]
    fn nothing_before_its_deadline() {
        with_py(|py| {
            let mut heap = TimerHeap::<Fake>::new();
            heap.push(fake(0).0, 5.0);
            assert!(heap.pop_due(py, 4.999).is_none());
            assert_eq!(heap.pop_due(py, 5.0).map(|t| t.name), Some(0));
        });
    }

    #[test]
    fn cancelled_entries_at_the_top_are_pruned() {
        with_py(|py| {
            let mut heap = TimerHeap::<Fake>::new();
            let (a, a_flag) = fake(0);
            let (b, _) = fake(1);
            heap.push(a, 1.0);
            heap.push(b, 2.0);
            a_flag.set(true);
            heap.book().cancelled_in_heap.set(1);
            heap.prune(py);
            assert_eq!(heap.len(), 1);
            assert_eq!(heap.next_deadline(), Some(2.0));
            assert_eq!(heap.book().cancelled_in_heap.get(), 0);
        });
    }

    #[test]
    fn a_mostly_cancelled_heap_is_rebuilt() {
        with_py(|py| {
            let mut heap = TimerHeap::<Fake>::new();
            let mut flags = Vec::new();
            for i in 0..1000 {
                let (t, flag) = fake(i);
                heap.push(t, f64::from(i));
                flags.push(flag);
            }
            // Cancel all but every tenth, from the end (the top stays live).
            for (i, flag) in flags.iter().enumerate() {
                if i % 10 != 0 {
                    flag.set(true);
                }
            }
            heap.book().cancelled_in_heap.set(900);
            heap.prune(py);
            assert_eq!(heap.len(), 100);
            let names: Vec<u32> = std::iter::from_fn(|| heap.pop_due(py, 1e9)).map(|t| t.name).collect();
            assert_eq!(names, (0..1000).step_by(10).collect::<Vec<_>>());
        });
    }

    #[test]
    fn memory_goes_back_after_a_burst() {
        with_py(|py| {
            let mut heap = TimerHeap::<Fake>::new();
            for i in 0..100_000 {
                heap.push(fake(i).0, 1.0);
            }
            while heap.pop_due(py, 2.0).is_some() {}
            assert!(heap.heap.0.capacity() < 4096, "capacity {}", heap.heap.0.capacity());
        });
    }
}
