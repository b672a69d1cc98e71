//! `NativeCell`: the one way to the mutable native state of a Python-visible
//! object (the loop, a transport core, a handle).
//!
//! Those objects are `frozen` pyclasses shared between Python and libuv's
//! callbacks; their state is only ever touched by the thread holding the
//! GIL. The rule that makes a `&mut` to it sound is that it is never held
//! across a call into Python: Python code may call back into the same object
//! (a protocol's `data_received` writing to its transport), which would make
//! a second `&mut`. `NativeCell::with` scopes the borrow to a closure, so it
//! cannot outlive the statement that needs it, and debug builds check the
//! rule: a second borrow of the same cell while one is live panics, and so
//! does a call into Python (through `python::call` / `call_method`) while
//! any cell is borrowed on this thread. The debug test run (tools/test.sh)
//! therefore catches the bug class; release builds pay nothing.
//!
//! Values taken out of the state whose drop may run Python code (a protocol,
//! a callback's references) are returned from the closure and dropped after
//! it.

use std::cell::UnsafeCell;

use pyo3::Python;

#[cfg(debug_assertions)]
thread_local! {
    /// Cells borrowed on this thread right now.
    static BORROWED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

pub(crate) struct NativeCell<T> {
    value: UnsafeCell<T>,
    #[cfg(debug_assertions)]
    borrowed: std::cell::Cell<bool>,
}

// SAFETY: the value is only reached through `with`, which takes the GIL token,
// and through `peek` / `get_mut`, whose callers hold the GIL or own the cell;
// the module declares that it needs the GIL (src/lib.rs).
unsafe impl<T> Sync for NativeCell<T> {}
// SAFETY: as for Sync.
unsafe impl<T> Send for NativeCell<T> {}

impl<T> NativeCell<T> {
    pub(crate) const fn new(value: T) -> Self {
        NativeCell {
            value: UnsafeCell::new(value),
            #[cfg(debug_assertions)]
            borrowed: std::cell::Cell::new(false),
        }
    }

    /// Runs `f` on the state. `f` must not call into Python (see the module
    /// docs); debug builds check it.
    #[inline(always)]
    pub(crate) fn with<R>(&self, _py: Python<'_>, f: impl FnOnce(&mut T) -> R) -> R {
        #[cfg(debug_assertions)]
        {
            assert!(!self.borrowed.replace(true), "native state borrowed twice (re-entered from Python code?)");
            BORROWED.with(|n| n.set(n.get() + 1));
        }
        // SAFETY: the GIL is held (the token), so no other thread is here, and
        // on this thread no other borrow of this cell is live: borrows do not
        // escape their closure, and closures do not call into Python, which is
        // the only way back into this cell while one runs (checked in debug
        // builds).
        let result = f(unsafe { &mut *self.value.get() });
        #[cfg(debug_assertions)]
        {
            self.borrowed.set(false);
            BORROWED.with(|n| n.set(n.get() - 1));
        }
        result
    }

    /// A shared view for the cyclic GC's `tp_traverse`, which runs with the
    /// GIL held but gets no token (and may run while a closure allocates).
    ///
    /// # Safety
    /// GIL held; `f` only reads.
    #[inline]
    pub(crate) unsafe fn peek<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        // SAFETY: per the contract; a closure that allocated and so set off
        // the collection is suspended inside CPython and touches nothing
        // meanwhile.
        f(unsafe { &*self.value.get() })
    }

    /// `peek` for `__traverse__`: the `PyVisit` a traversal is given proves
    /// that the cyclic GC runs it, with the GIL held; `f` gets a shared view
    /// it can only read through.
    #[inline]
    pub(crate) fn traverse<R>(&self, _visit: &pyo3::PyVisit<'_>, f: impl FnOnce(&T) -> R) -> R {
        // SAFETY: as for `peek`: the GIL is held, and a closure of `with`
        // that allocated and so set off the collection is suspended inside
        // CPython and touches nothing meanwhile.
        unsafe { self.peek(f) }
    }

    /// The state of a cell its owner holds exclusively (Drop).
    pub(crate) fn get_mut(&mut self) -> &mut T {
        self.value.get_mut()
    }
}

/// Called at every call from Rust into Python code: in debug builds, checks
/// that no native state is borrowed on this thread.
#[inline(always)]
pub(crate) fn check_crossing() {
    #[cfg(debug_assertions)]
    BORROWED.with(|n| assert_eq!(n.get(), 0, "call into Python while native state is borrowed"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_borrow_ends_with_its_closure() {
        Python::initialize();
        Python::attach(|py| {
            let cell = NativeCell::new(1);
            cell.with(py, |v| *v += 1);
            assert_eq!(cell.with(py, |v| *v), 2);
            check_crossing();
        });
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "borrowed twice")]
    fn a_second_borrow_of_the_same_cell_panics() {
        Python::initialize();
        Python::attach(|py| {
            let cell = NativeCell::new(1);
            cell.with(py, |_| cell.with(py, |_| ()));
        });
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "call into Python")]
    fn crossing_into_python_while_borrowed_panics() {
        Python::initialize();
        Python::attach(|py| {
            let cell = NativeCell::new(1);
            cell.with(py, |_| check_crossing());
        });
    }
}
