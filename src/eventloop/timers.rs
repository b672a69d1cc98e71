//! The timer heap: every `call_later` / `call_at` of a loop shares one libuv
//! timer, armed for the earliest live deadline.
//!
//! Entries are ordered by (deadline, sequence), so equal deadlines fire in the
//! order they were scheduled. Cancelling is O(1): the handle is marked and
//! counted in the shared [`TimerBook`]; dead entries are dropped when they reach
//! the top, and the heap is rebuilt when they are more than half of it.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::rc::Rc;

use pyo3::prelude::*;

use crate::handles::{release_handle, TimerBook, TimerHandle};

/// Below this many entries a heap full of cancelled timers is not worth a
/// rebuild (the same threshold asyncio uses).
const MIN_ENTRIES_TO_COMPACT: usize = 100;

struct Entry {
    when: f64,
    seq: u64,
    handle: Py<TimerHandle>,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.seq == other.seq
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    // Reversed, so std's max-heap pops the earliest (deadline, sequence).
    fn cmp(&self, other: &Self) -> Ordering {
        other.when.total_cmp(&self.when).then_with(|| other.seq.cmp(&self.seq))
    }
}

pub(crate) struct TimerHeap {
    heap: BinaryHeap<Entry>,
    next_seq: u64,
    book: Rc<TimerBook>,
}

impl TimerHeap {
    pub(crate) fn new() -> Self {
        TimerHeap {
            heap: BinaryHeap::new(),
            next_seq: 0,
            book: Rc::new(TimerBook { cancelled_in_heap: std::cell::Cell::new(0) }),
        }
    }

    pub(crate) fn book(&self) -> &Rc<TimerBook> {
        &self.book
    }

    pub(crate) fn push(&mut self, handle: Py<TimerHandle>, when: f64) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.heap.push(Entry { when, seq, handle });
    }

    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }

    /// Drops cancelled entries: all of them when they are the majority,
    /// otherwise those at the top. (A cancelled handle holds no Python
    /// references, so releasing it here runs no Python code.)
    pub(crate) fn prune(&mut self) {
        let cancelled = self.book.cancelled_in_heap.get();
        if cancelled == 0 {
            return;
        }
        if self.heap.len() > MIN_ENTRIES_TO_COMPACT && cancelled * 2 > self.heap.len() {
            let old = std::mem::take(&mut self.heap).into_vec();
            let mut live = Vec::with_capacity(old.len() - cancelled);
            for e in old {
                let h = e.handle.get();
                if h.is_cancelled() {
                    h.unschedule();
                    release_handle(e.handle);
                } else {
                    live.push(e);
                }
            }
            self.heap = BinaryHeap::from(live);
            self.book.cancelled_in_heap.set(0);
            return;
        }
        while let Some(top) = self.heap.peek() {
            let h = top.handle.get();
            if !h.is_cancelled() {
                break;
            }
            h.unschedule();
            release_handle(self.heap.pop().expect("peeked").handle);
            let c = &self.book.cancelled_in_heap;
            c.set(c.get().saturating_sub(1));
        }
    }

    /// The earliest deadline (call `prune` first to skip cancelled entries).
    pub(crate) fn next_deadline(&self) -> Option<f64> {
        self.heap.peek().map(|e| e.when)
    }

    /// Pops the earliest entry if it is due at `now` (cancelled entries at the
    /// top are returned too; the caller skips them when running).
    #[inline]
    pub(crate) fn pop_due(&mut self, now: f64) -> Option<Py<TimerHandle>> {
        if self.heap.peek()?.when > now {
            return None;
        }
        let e = self.heap.pop().expect("peeked");
        let h = e.handle.get();
        h.unschedule();
        if h.is_cancelled() {
            let c = &self.book.cancelled_in_heap;
            c.set(c.get().saturating_sub(1));
        }
        Some(e.handle)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Py<TimerHandle>> {
        self.heap.iter().map(|e| &e.handle)
    }

    /// Empties the heap, handing every handle to the caller (loop close).
    pub(crate) fn drain(&mut self) -> Vec<Py<TimerHandle>> {
        self.book.cancelled_in_heap.set(0);
        std::mem::take(&mut self.heap)
            .into_vec()
            .into_iter()
            .map(|e| {
                e.handle.get().unschedule();
                e.handle
            })
            .collect()
    }
}
