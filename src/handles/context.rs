//! Contexts for callbacks scheduled without `context=`.
//!
//! asyncio copies the current context for every such callback. A million
//! pending `call_soon(cb)` from the same code would then hold a million
//! identical copies (64 bytes each, all tracked by the cyclic GC). zuvrs keeps
//! one snapshot per loop instead and hands it to every handle scheduled while
//! the current context has not changed; whether it has is read off the
//! context's variable mapping (an immutable HAMT, replaced on every change).
//!
//! A callback must still run in a context of its own, so that what it sets is
//! seen by nobody else. A handle whose snapshot is shared runs in the snapshot
//! and, if the callback changed a variable (the mapping pointer moved), the
//! snapshot's mapping is put back afterwards: the change lived exactly as long
//! as the callback, as in a private copy, without allocating one per run.
//!
//! This relies on the layout of CPython's context object
//! (`PyObject_HEAD; ctx_prev; ctx_vars; ...`, unchanged since 3.7). It is
//! checked once at import; if the check fails every callback gets its own
//! copy, as in asyncio. Putting the old mapping back is invisible to
//! ContextVar's lookup cache, which is keyed on the thread's context version,
//! bumped by every enter and exit.
//!
//! To compare the current context with the snapshot, the thread's current
//! context is read where the thread state keeps it (its offset found at
//! import by entering a fresh context and looking for it, then checked with
//! a second one); copying it each time (`PyContext_CopyCurrent`, a GC object
//! made and freed per call) is the fallback when the offset is not found or
//! the thread has no context yet.

use std::cell::Cell;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use pyo3::ffi;
use pyo3::prelude::*;

use super::{Callback, HandleState};
use crate::capi::handles::ObjRef;

static SHARING_SAFE: AtomicBool = AtomicBool::new(false);

/// Offset of the current context in CPython's thread state, or 0 when
/// unknown (the copy is used then).
static TSTATE_CONTEXT_OFFSET: AtomicUsize = AtomicUsize::new(0);

/// How far into the thread state to look for the context field.
const TSTATE_SCAN_BYTES: usize = 1024;

/// Offset of `ctx_vars` in CPython's context object.
const VARS_OFFSET: usize = std::mem::size_of::<ffi::PyObject>() + std::mem::size_of::<*mut ffi::PyObject>();

#[inline]
unsafe fn vars_of(ctx: *mut ffi::PyObject) -> *mut ffi::PyObject {
    // SAFETY: `ctx` is a context object, whose layout check_layout verified.
    unsafe { *((ctx as *const u8).add(VARS_OFFSET) as *const *mut ffi::PyObject) }
}

/// Verifies the context layout on this interpreter (GIL held).
pub(crate) fn check_layout() {
    // SAFETY: plain C-API calls; the field read is validated by its type.
    let ok = unsafe {
        let a = ffi::PyContext_New();
        if a.is_null() {
            ffi::PyErr_Clear();
            return;
        }
        let b = ffi::PyContext_Copy(a);
        let ok = if b.is_null() {
            ffi::PyErr_Clear();
            false
        } else {
            let va = vars_of(a);
            let same = !va.is_null() && va == vars_of(b);
            let is_hamt = same && {
                let name = std::ffi::CStr::from_ptr((*ffi::Py_TYPE(va)).tp_name);
                name.to_bytes() == b"hamt"
            };
            ffi::Py_DECREF(b);
            is_hamt
        };
        ffi::Py_DECREF(a);
        ok
    };
    SHARING_SAFE.store(ok, Ordering::Relaxed);
    TSTATE_CONTEXT_OFFSET.store(if ok { find_tstate_context_offset() } else { 0 }, Ordering::Relaxed);
}

/// The offset of the current context pointer in the thread state: the one
/// pointer-aligned slot that holds a freshly entered context, holds a
/// second one once that is entered instead, and is back to its old value
/// after both exits. 0 if there is no such single slot.
fn find_tstate_context_offset() -> usize {
    // SAFETY: the thread state is a live struct larger than the scanned
    // range on every supported version (several KiB of fields and frames);
    // only reads are made, between our own enter/exit calls.
    unsafe {
        let tstate = ffi::PyThreadState_Get() as *const u8;
        let slot = |off: usize| *(tstate.add(off) as *const *mut ffi::PyObject);
        let a = ffi::PyContext_New();
        let b = ffi::PyContext_New();
        let mut found = 0;
        if !a.is_null() && !b.is_null() && ffi::PyContext_Enter(a) == 0 {
            let step = std::mem::size_of::<*mut ffi::PyObject>();
            let candidates: Vec<usize> =
                (step..TSTATE_SCAN_BYTES).step_by(step).filter(|&off| slot(off) == a).collect();
            let mut confirmed = Vec::new();
            if ffi::PyContext_Exit(a) == 0 && ffi::PyContext_Enter(b) == 0 {
                confirmed = candidates.into_iter().filter(|&off| slot(off) == b).collect();
                if ffi::PyContext_Exit(b) != 0 {
                    confirmed.clear();
                }
            }
            if confirmed.len() == 1 && slot(confirmed[0]) != b {
                found = confirmed[0];
            }
        }
        ffi::PyErr_Clear();
        ffi::Py_XDECREF(a);
        ffi::Py_XDECREF(b);
        found
    }
}

/// "read" (the current context is read in place), "copy" (copied to compare
/// it with the snapshot) or "off" (every callback gets its own copy).
pub(crate) fn sharing_mode() -> &'static str {
    if !SHARING_SAFE.load(Ordering::Relaxed) {
        "off"
    } else if TSTATE_CONTEXT_OFFSET.load(Ordering::Relaxed) != 0 {
        "read"
    } else {
        "copy"
    }
}

/// The thread's current context (borrowed), or null when unknown or none.
///
/// # Safety
/// GIL held.
#[inline]
unsafe fn current_context() -> *mut ffi::PyObject {
    let off = TSTATE_CONTEXT_OFFSET.load(Ordering::Relaxed);
    if off == 0 {
        return ptr::null_mut();
    }
    // SAFETY: GIL held; the offset was found and verified by find_tstate_context_offset.
    unsafe { *((ffi::PyThreadState_Get() as *const u8).add(off) as *const *mut ffi::PyObject) }
}

/// One loop's current snapshot.
pub(crate) struct ContextCache {
    snapshot: *mut ffi::PyObject,
    /// The shared snapshot a callback is running in right now. Its variables
    /// may change during the run and are put back after it, so it must not
    /// be handed to handles scheduled meanwhile.
    running: *mut ffi::PyObject,
}

/// A context for a new handle: a new reference, and whether other handles
/// may share it.
pub(crate) struct Snapshot {
    pub(crate) context: *mut ffi::PyObject,
    pub(crate) shared: bool,
    /// The previous snapshot, to release once the loop state is not borrowed.
    pub(crate) replaced: *mut ffi::PyObject,
}

impl ContextCache {
    pub(crate) fn new() -> Self {
        ContextCache { snapshot: ptr::null_mut(), running: ptr::null_mut() }
    }

    /// The context a callback scheduled now should run in. Null (with a
    /// Python error set) on failure.
    ///
    /// # Safety
    /// GIL held.
    #[inline]
    pub(crate) unsafe fn capture(&mut self) -> Snapshot {
        // SAFETY: GIL held (this function's contract); the snapshot and the current context are live contexts.
        unsafe {
            let snap = self.snapshot;
            if !snap.is_null() && snap != self.running {
                let current = current_context();
                if !current.is_null() && vars_of(current) == vars_of(snap) {
                    // The current context has the snapshot's variables:
                    // share the snapshot without copying the context.
                    ffi::Py_INCREF(snap);
                    return Snapshot { context: snap, shared: true, replaced: ptr::null_mut() };
                }
            }
            let copy = ffi::PyContext_CopyCurrent();
            if copy.is_null() || !SHARING_SAFE.load(Ordering::Relaxed) {
                return Snapshot { context: copy, shared: false, replaced: ptr::null_mut() };
            }
            let snap = self.snapshot;
            if !snap.is_null() && snap != self.running && vars_of(snap) == vars_of(copy) {
                // Same variables as the snapshot: share it. (The copy came from
                // CPython's context free list and goes straight back.)
                ffi::Py_DECREF(copy);
                ffi::Py_INCREF(snap);
                return Snapshot { context: snap, shared: true, replaced: ptr::null_mut() };
            }
            ffi::Py_INCREF(copy);
            self.snapshot = copy;
            Snapshot { context: copy, shared: true, replaced: snap }
        }
    }

    /// Marks the shared snapshot a callback is about to run in (null after).
    #[inline]
    pub(crate) fn set_running(&mut self, ctx: *mut ffi::PyObject) {
        self.running = ctx;
    }

    /// Forgets the snapshot; returns the reference the cache owned.
    pub(crate) fn take(&mut self, py: pyo3::Python<'_>) -> Option<pyo3::Py<pyo3::PyAny>> {
        let snapshot = std::mem::replace(&mut self.snapshot, ptr::null_mut());
        // SAFETY: the cache owned this reference (or holds NULL); GIL held.
        unsafe { pyo3::Bound::from_owned_ptr_or_opt(py, snapshot) }.map(pyo3::Bound::unbind)
    }
}

/// A callback's run in a shared snapshot, as the thread's record of it.
#[derive(Clone, Copy)]
struct SharedRun {
    /// The snapshot entered for the run.
    ctx: *mut ffi::PyObject,
    /// Its variables from before the run, to put back after it (a reference
    /// the run holds; null when nothing else shares the snapshot, or once
    /// put back early).
    before: *mut ffi::PyObject,
    /// The running handle's private copy the run moved into when the
    /// handle was asked for its context (a reference the run holds; null
    /// until then).
    moved_to: *mut ffi::PyObject,
}

const NO_RUN: SharedRun = SharedRun { ctx: ptr::null_mut(), before: ptr::null_mut(), moved_to: ptr::null_mut() };

thread_local! {
    /// The run in a shared snapshot going on on this thread (`NO_RUN` when
    /// none): what `copy_if_shared` needs to give a handle asked for its
    /// context meanwhile what asyncio's handle would have.
    static RUNNING_SHARED: Cell<SharedRun> = const { Cell::new(NO_RUN) };
    /// The address of the last handle state run in a shared snapshot on this
    /// thread (only compared, never followed).
    static RUNNING_HANDLE: Cell<usize> = const { Cell::new(0) };
}

/// Notes that the handle state at `addr` is about to run in a shared snapshot.
#[inline(always)]
pub(crate) fn mark_running(addr: usize) {
    RUNNING_HANDLE.set(addr);
}

/// Whether the handle state at `addr` is the one running (see `mark_running`).
fn is_running(addr: usize) -> bool {
    RUNNING_HANDLE.get() == addr
}

/// Runs `cb` inside `ctx`; when other handles share the snapshot, any
/// variable the call sets is undone afterwards (see the module docs).
/// Returns false if the call raised or the context could not be entered or
/// left (the exception is left set).
///
/// The run holds a reference to `ctx` of its own from before the enter to
/// after the exit. The callback may drop every other one (its handle's
/// `get_context()` gives the handle a private copy, and a `call_soon` from
/// it replaces the loop's snapshot), and CPython's `PyContext_Exit` must
/// not drop the last one: it clears the context's `ctx_prev` (the context
/// to go back to) while it still means to make it the current one, so the
/// thread was left in a freed context. If the callback asked its own handle
/// for its context, the run went on in that copy (`copy_if_shared`), which
/// is the one left here.
///
/// # Safety
/// GIL held; `ctx` is a live context not currently entered.
#[inline(always)]
pub(crate) unsafe fn run_in_context(cb: &Callback, ctx: *mut ffi::PyObject, shared: bool) -> bool {
    // SAFETY: the caller's contract: GIL held, `ctx` live and not entered;
    // `shared` is only set when the layout was verified (SHARING_SAFE held
    // at capture time). Our reference keeps `ctx` alive (see above).
    unsafe {
        let py = Python::assume_attached();
        let undo = shared && ffi::Py_REFCNT(ctx) > 1;
        ffi::Py_INCREF(ctx);
        if ffi::PyContext_Enter(ctx) < 0 {
            ffi::Py_DECREF(ctx);
            return false;
        }
        let slot = (ctx as *mut u8).add(VARS_OFFSET) as *mut *mut ffi::PyObject;
        let outer = if shared {
            let before = if undo { *slot } else { ptr::null_mut() };
            ffi::Py_XINCREF(before);
            RUNNING_SHARED.replace(SharedRun { ctx, before, moved_to: ptr::null_mut() })
        } else {
            NO_RUN
        };
        let ok = cb.call(py);
        if !shared {
            let exited = ffi::PyContext_Exit(ctx) == 0;
            ffi::Py_DECREF(ctx);
            return ok && exited;
        }
        let run = RUNNING_SHARED.replace(outer);
        if !run.moved_to.is_null() {
            // The snapshot was left (and its variables put back) when the
            // run moved into the handle's copy; that copy is the one to leave.
            let exited = ffi::PyContext_Exit(run.moved_to) == 0;
            ffi::Py_DECREF(run.moved_to);
            ffi::Py_DECREF(ctx);
            return ok && exited;
        }
        // The reference to drop once the context is left: ours to the
        // mapping from before, or, if the callback set a variable, the
        // changed mapping, whose place ours takes (no Python code runs
        // between this and the exit, which moves the thread's context version
        // on, so ContextVar's lookup cache never sees the swap).
        let before = run.before;
        let mut release = before;
        if !before.is_null() {
            let after = *slot;
            if after != before {
                *slot = before;
                release = after;
            }
        }
        let exited = ffi::PyContext_Exit(ctx) == 0;
        ffi::Py_XDECREF(release);
        ffi::Py_DECREF(ctx);
        ok && exited
    }
}

/// Replaces `ctx` by a private copy if anything else holds it (a shared
/// snapshot); true if it did. An object that is not a context stays (its
/// copy fails, and the error is cleared). `owner` is the address of the
/// handle state asking.
///
/// While a callback runs in the snapshot, asyncio's answers are these: the
/// running handle's context is the one the callback runs in, so the run
/// moves into the copy (the snapshot left, its variables put back, the copy
/// entered in its place) and what the callback sets from then on is the
/// copy's; a sibling's copy gets the snapshot's variables from before the
/// run, not what the running callback has set.
pub(crate) fn copy_if_shared(py: Python<'_>, ctx: &mut ObjRef, owner: usize) -> bool {
    if crate::capi::refcount(ctx) <= 1 {
        return false;
    }
    // SAFETY: GIL held (the token); a new reference or NULL with an error set.
    let copy = match unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyContext_Copy(ctx.as_ptr())) } {
        Ok(copy) => copy,
        Err(_) => return false,
    };
    let run = RUNNING_SHARED.get();
    if run.ctx == ctx.as_ptr() && run.moved_to.is_null() {
        // SAFETY: GIL held; `copy` is a new context of the verified layout
        // (sharing happens only then) that nothing else has seen; the run's
        // references keep `run.ctx` and `run.before` alive.
        unsafe {
            if is_running(owner) {
                // SAFETY: as above; the snapshot is the thread's current
                // context (checked), so leaving it and entering the copy is
                // what Context.run would have done with the copy from the start.
                if current_context() == run.ctx && move_run_into(run, copy.as_ptr()) {
                    *ctx = ObjRef::new(copy.unbind());
                    return true;
                }
            } else if !run.before.is_null() {
                set_vars(copy.as_ptr(), run.before);
            }
        }
    }
    *ctx = ObjRef::new(copy.unbind());
    true
}

/// Gives `ctx` (a context nothing else has seen yet) the mapping `vars`.
///
/// # Safety
/// GIL held; `ctx` of the verified layout, `vars` a live mapping.
unsafe fn set_vars(ctx: *mut ffi::PyObject, vars: *mut ffi::PyObject) {
    // SAFETY: per the contract; the new reference replaces the copy's.
    unsafe {
        let slot = (ctx as *mut u8).add(VARS_OFFSET) as *mut *mut ffi::PyObject;
        ffi::Py_INCREF(vars);
        let theirs = std::mem::replace(&mut *slot, vars);
        ffi::Py_DECREF(theirs);
    }
}

/// Moves the running callback from its snapshot into `copy`: the
/// snapshot's variables are put back and it is left, `copy` is entered and
/// the run holds it. False (nothing changed, or an error set) if either
/// step fails.
///
/// # Safety
/// GIL held; `run` is the thread's record of the run; the snapshot is the
/// thread's current context; `copy` a live context not entered.
unsafe fn move_run_into(run: SharedRun, copy: *mut ffi::PyObject) -> bool {
    // SAFETY: per the contract; the run's reference keeps the snapshot alive
    // across its exit, and ours keeps `copy` alive until the run leaves it.
    unsafe {
        let slot = (run.ctx as *mut u8).add(VARS_OFFSET) as *mut *mut ffi::PyObject;
        if ffi::PyContext_Exit(run.ctx) < 0 {
            return false;
        }
        if ffi::PyContext_Enter(copy) < 0 {
            // Back where it was, so the run ends as it would have.
            if ffi::PyContext_Enter(run.ctx) < 0 {
                ffi::PyErr_Clear();
            }
            return false;
        }
        if !run.before.is_null() {
            // The run's reference to the old mapping moves into the slot.
            let changed = std::mem::replace(&mut *slot, run.before);
            ffi::Py_DECREF(changed);
        }
        ffi::Py_INCREF(copy);
        RUNNING_SHARED.set(SharedRun { ctx: run.ctx, before: ptr::null_mut(), moved_to: copy });
        true
    }
}

impl HandleState {
    /// A state taking over the reference to `context`.
    ///
    /// # Safety
    /// GIL held; `context` is a live `contextvars.Context` whose reference
    /// is the caller's to give; `shared_context` only as `capture` says.
    #[inline(always)]
    pub(crate) unsafe fn new(cb: Callback, context: *mut ffi::PyObject, shared_context: bool, repeat: bool) -> Self {
        // SAFETY: per the contract.
        let context = unsafe { ObjRef::from_owned_ptr(context) };
        HandleState::from_parts(cb, context, shared_context, repeat, false)
    }

    /// A state whose `context` is any object: as asyncio, the handle keeps
    /// it and calls its `run()` when the callback is due.
    ///
    /// # Safety
    /// As for `new`, `context` being any live object.
    pub(crate) unsafe fn with_foreign_context(cb: Callback, context: *mut ffi::PyObject) -> Self {
        // SAFETY: per the contract.
        let context = unsafe { ObjRef::from_owned_ptr(context) };
        HandleState::from_parts(cb, context, false, false, true)
    }
}

/// The thread runs in a given context until this is dropped: what a
/// transport's protocol callbacks run in (the context the transport was
/// made in, one for its whole life, as uvloop keeps it).
///
/// Entering is skipped when that context is already the current one (a
/// protocol callback that writes and so pauses itself, or a callback the
/// loop runs in it), or is entered further up the stack (CPython refuses a
/// second entry; the code then runs in the current context).
pub(crate) struct ContextScope {
    /// The context entered, or None when nothing was entered.
    entered: Option<pyo3::Py<pyo3::PyAny>>,
}

impl ContextScope {
    /// Makes `ctx` (a `contextvars.Context`) the current context.
    #[inline]
    pub(crate) fn enter(_py: pyo3::Python<'_>, ctx: pyo3::Py<pyo3::PyAny>) -> ContextScope {
        let ptr = ctx.as_ptr();
        // SAFETY: GIL held (the token); `ptr` is a live context, kept alive by
        // the reference the scope holds; a failed entry leaves only its own
        // error set, which is cleared.
        unsafe {
            if current_context() == ptr {
                return ContextScope { entered: None };
            }
            if ffi::PyContext_Enter(ptr) < 0 {
                ffi::PyErr_Clear();
                return ContextScope { entered: None };
            }
        }
        ContextScope { entered: Some(ctx) }
    }
}

impl Drop for ContextScope {
    #[inline]
    fn drop(&mut self) {
        if let Some(ctx) = self.entered.take() {
            // SAFETY: the context was entered by `enter` on this thread, with
            // the GIL held since (a scope lives within one libuv callback or
            // one method call); exiting restores the previous context.
            unsafe {
                if ffi::PyContext_Exit(ctx.as_ptr()) < 0 {
                    ffi::PyErr_Clear();
                }
            }
            drop(ctx);
        }
    }
}
