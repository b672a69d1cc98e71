//! The unsafe edge to CPython's C API: the calls pyo3's safe API does not
//! offer, or offers only at a cost the hot paths cannot pay (borrowed
//! references, buffers, bytes filled in place, the GIL's save and restore).
//!
//! Everything here is a safe function or a safe owner type; the rest of the
//! crate uses `pyo3::ffi` only through this module, `handles::context`,
//! `handles::pool` and `eventloop::fastcall`. Each section belongs to the
//! layer that uses it.

// ---- section: calls and objects (python, handles) ----

// ---- end of section: handles ----

// ---- section: the loop (eventloop) ----

// ---- end of section: eventloop ----

// ---- section: transports (transport) ----

/// The transports' CPython calls: buffers borrowed from bytes-like objects
/// (`Py_buffer`), `bytes` filled in place (the thread's read buffer), the
/// bytes of a `bytes` without a call, the context a transport's callbacks
/// run in, and the cyclic GC's view of a core's state.
pub(crate) mod transport {
    use std::cell::RefCell;
    use std::mem::MaybeUninit;

    use pyo3::ffi;
    use pyo3::prelude::*;
    use pyo3::types::PyBytes;
    use pyo3::{PyTraverseError, PyVisit};

    use crate::cell::NativeCell;

    /// A copy of the current context (`contextvars.copy_context()`).
    pub(crate) fn copy_context(py: Python<'_>) -> PyResult<Py<PyAny>> {
        // SAFETY: GIL held (the token); a new reference, or NULL with the
        // error set.
        Ok(unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyContext_CopyCurrent())? }.unbind())
    }

    /// The bytes of a `bytes` object, read in place (no call, no GIL
    /// needed: the reference keeps the object alive, and its bytes never
    /// change).
    #[inline]
    pub(crate) fn bytes_data(b: &Py<PyBytes>) -> &[u8] {
        let p = b.as_ptr();
        // SAFETY: p is a live bytes object (or subclass instance: the same
        // layout), whose `ob_size` bytes at `ob_sval` are immutable for as
        // long as the reference is borrowed.
        unsafe {
            let len = (*(p as *mut ffi::PyVarObject)).ob_size as usize;
            let data = std::ptr::addr_of!((*(p as *mut ffi::PyBytesObject)).ob_sval) as *const u8;
            std::slice::from_raw_parts(data, len)
        }
    }

    /// `bytes(obj)`: a new `bytes` of a bytes-like object's contents (or
    /// whatever `__bytes__` returns).
    pub(crate) fn bytes_of<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        // SAFETY: GIL held; a new reference, or NULL with the error set.
        unsafe { Bound::from_owned_ptr_or_err(obj.py(), ffi::PyObject_Bytes(obj.as_ptr())) }
    }

    /// A `bytes` object that only its owner references, so its bytes can
    /// be written in place until it is handed out (`into_bytes`).
    pub(crate) struct FillBytes(Py<PyBytes>);

    impl FillBytes {
        /// A new `bytes` of `len` zero bytes: `bytes(len)`, whose memory
        /// comes from calloc (fresh pages cost no clearing), so no byte of it
        /// is ever uninitialised.
        pub(crate) fn new(py: Python<'_>, len: usize) -> PyResult<FillBytes> {
            let obj = py.get_type::<PyBytes>().call1((len,))?.cast_into_exact::<PyBytes>()?;
            // SAFETY: reading the refcount of a live object.
            if len > 0 && unsafe { ffi::Py_REFCNT(obj.as_ptr()) } != 1 {
                // (Never so for a new object. Empty bytes are shared, but
                // nothing can be written to them.)
                return Err(pyo3::exceptions::PyMemoryError::new_err(()));
            }
            Ok(FillBytes(obj.unbind()))
        }

        #[inline]
        pub(crate) fn as_slice(&self) -> &[u8] {
            bytes_data(&self.0)
        }

        #[inline]
        pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
            let s = bytes_data(&self.0);
            // SAFETY: nobody else references the object (the type's
            // invariant), so nobody sees the bytes change; `&mut self` makes
            // the borrow exclusive.
            unsafe { std::slice::from_raw_parts_mut(s.as_ptr() as *mut u8, s.len()) }
        }

        /// The object, from now on shared and immutable.
        #[inline]
        pub(crate) fn into_bytes(self, py: Python<'_>) -> Bound<'_, PyBytes> {
            self.0.into_bound(py)
        }

        /// Takes a `bytes` back for filling, if nobody else references it
        /// and it is an exact `bytes` of `len` bytes (None drops it).
        pub(crate) fn reclaim(bytes: Bound<'_, PyBytes>, len: usize) -> Option<FillBytes> {
            let p = bytes.as_ptr();
            // SAFETY: reading the refcount of a live object.
            if unsafe { ffi::Py_REFCNT(p) } != 1 || bytes_data(bytes.as_unbound()).len() != len {
                return None;
            }
            // SAFETY: reading the type of a live object.
            if unsafe { ffi::PyBytes_CheckExact(p) } == 0 {
                return None;
            }
            // SAFETY: the only reference is ours, so the object can be
            // rewritten; its cached hash (if anyone hashed it) must go with
            // the contents.
            #[allow(deprecated)]
            unsafe {
                (*(p as *mut ffi::PyBytesObject)).ob_shash = -1;
            }
            Some(FillBytes(bytes.unbind()))
        }
    }

    thread_local! {
        /// The thread's read buffer (see transport/readbuf.rs).
        static READ_BUFFER: RefCell<Option<FillBytes>> = const { RefCell::new(None) };
    }

    /// `f` on the thread's read buffer (None when there is none). `f` must
    /// not call back here (the buffer is borrowed meanwhile).
    #[inline]
    pub(crate) fn with_read_buffer<R>(f: impl FnOnce(&mut Option<FillBytes>) -> R) -> R {
        READ_BUFFER.with(|cell| f(&mut cell.borrow_mut()))
    }

    /// The memory of the thread's read buffer (made with `len` bytes if
    /// there is none), for a read into it that libuv makes right away
    /// (uv.rs); None when out of memory. The memory stays valid until the
    /// buffer leaves `with_read_buffer`'s slot, which takes code to run.
    #[inline]
    pub(crate) fn read_buffer_memory(py: Python<'_>, len: usize) -> Option<(*mut u8, usize)> {
        with_read_buffer(|slot| {
            if slot.is_none() {
                *slot = Some(FillBytes::new(py, len).ok()?);
            }
            let m = slot.as_mut()?.as_mut_slice();
            Some((m.as_mut_ptr(), m.len()))
        })
    }

    /// A buffer exported by a Python object (`Py_buffer`), released on drop.
    pub(crate) struct BufferView(Box<ffi::Py_buffer>);

    impl BufferView {
        /// A contiguous buffer of `obj`, writable when asked, whatever its
        /// item format (the bytes are what count, as for socket.recv_into).
        pub(crate) fn get(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<BufferView> {
            // SAFETY: a zeroed Py_buffer is a valid target for PyObject_GetBuffer.
            let mut view: Box<ffi::Py_buffer> = Box::new(unsafe { MaybeUninit::zeroed().assume_init() });
            let flags = if writable { ffi::PyBUF_WRITABLE } else { ffi::PyBUF_SIMPLE };
            // SAFETY: GIL held; the view is ours to fill and released in Drop.
            if unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) } < 0 {
                return Err(PyErr::fetch(obj.py()));
            }
            Ok(BufferView(view))
        }

        #[inline]
        pub(crate) fn len(&self) -> usize {
            self.0.len as usize
        }

        /// The bytes. Their memory stays valid until the view is released
        /// (the exporter cannot resize or free it meanwhile); a mutable
        /// exporter's values change only if Python code runs.
        #[inline]
        pub(crate) fn as_slice(&self) -> &[u8] {
            if self.0.buf.is_null() {
                return &[];
            }
            // SAFETY: the exported buffer is valid for its length until
            // released.
            unsafe { std::slice::from_raw_parts(self.0.buf as *const u8, self.len()) }
        }

        /// The bytes to write to, for a writable export (None otherwise).
        #[inline]
        pub(crate) fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
            if self.0.readonly != 0 || self.0.buf.is_null() {
                return None;
            }
            // SAFETY: a writable export, valid for its length until
            // released; `&mut self` makes the borrow exclusive.
            Some(unsafe { std::slice::from_raw_parts_mut(self.0.buf as *mut u8, self.len()) })
        }
    }

    impl Drop for BufferView {
        fn drop(&mut self) {
            // SAFETY: acquired by PyObject_GetBuffer and released once, with
            // the GIL (taken if this thread does not hold it).
            Python::attach(|_py| unsafe { ffi::PyBuffer_Release(&mut *self.0) })
        }
    }

    /// `f` on the state of a core's cell, in its `__traverse__` (the GC's
    /// visitor exists only there, with the GIL held; `f` gets the state
    /// shared, so it only reads).
    #[inline]
    pub(crate) fn traverse_state<T>(
        cell: &NativeCell<T>,
        _visit: &PyVisit<'_>,
        f: impl FnOnce(&T) -> Result<(), PyTraverseError>,
    ) -> Result<(), PyTraverseError> {
        // SAFETY: GIL held (the visitor); f only reads (a shared borrow).
        unsafe { cell.peek(f) }
    }
}

// ---- end of section: transport ----

// ---- section: native streams (streams) ----

/// The reference count of a live object (asked to tell whether anything
/// but its holder has it; pyo3 deprecates its own accessor).
#[inline]
pub(crate) fn refcount<T>(obj: &pyo3::Py<T>) -> isize {
    // SAFETY: `obj` is a live reference, so its header can be read.
    unsafe { pyo3::ffi::Py_REFCNT(obj.as_ptr()) }
}

/// What resuming a native awaitable gives.
pub(crate) enum Resumed {
    /// The value to hand to the task (a future it is to wait for).
    Yield(pyo3::Py<pyo3::PyAny>),
    /// The awaitable is done, with this result.
    Return(pyo3::Py<pyo3::PyAny>),
}

/// A pyclass the interpreter resumes through C slots of its own rather than
/// through pyo3's `__next__` trampoline, which would make a StopIteration
/// through a boxed error for every result.
pub(crate) trait Resumable: pyo3::PyClass {
    /// One step; `value` is what was sent in (None for `next()`).
    fn resume(slf: &pyo3::Bound<'_, Self>, value: &pyo3::Bound<'_, pyo3::PyAny>) -> pyo3::PyResult<Resumed>;
}

/// Puts `T`'s resumption slots in place: `tp_iternext` (how 3.12+ resume
/// an awaited object) and `am_send` (3.10, 3.11).
pub(crate) fn install_resume_slots<T: Resumable>(py: pyo3::Python<'_>) {
    use pyo3::types::PyTypeMethods;
    let tp = py.get_type::<T>();
    // SAFETY: GIL held; a heap type made by pyo3, whose tp_as_async points
    // at its own (writable) slots; no instance is being resumed meanwhile.
    unsafe {
        let raw = tp.as_type_ptr();
        (*raw).tp_iternext = Some(resume_next::<T>);
        if let Some(async_slots) = (*raw).tp_as_async.as_mut() {
            async_slots.am_send = Some(resume_send::<T>);
        }
        pyo3::ffi::PyType_Modified(raw);
    }
}

/// `am_send`: the result or yielded value in `*result`, as the interpreter
/// expects; an error is raised, not returned.
unsafe extern "C" fn resume_send<T: Resumable>(
    slf: *mut pyo3::ffi::PyObject,
    arg: *mut pyo3::ffi::PyObject,
    result: *mut *mut pyo3::ffi::PyObject,
) -> pyo3::ffi::PySendResult {
    use pyo3::prelude::*;
    // SAFETY: CPython calls the slot with the GIL held, on a live instance
    // of the type it was installed on (T), with a valid result pointer.
    unsafe {
        let py = Python::assume_attached();
        let obj = Bound::from_borrowed_ptr(py, slf).cast_into_unchecked::<T>();
        let arg = if arg.is_null() { py.None().into_bound(py) } else { Bound::from_borrowed_ptr(py, arg) };
        match T::resume(&obj, &arg) {
            Ok(Resumed::Return(value)) => {
                *result = value.into_ptr();
                pyo3::ffi::PySendResult::PYGEN_RETURN
            }
            Ok(Resumed::Yield(value)) => {
                *result = value.into_ptr();
                pyo3::ffi::PySendResult::PYGEN_NEXT
            }
            Err(err) => {
                err.restore(py);
                *result = std::ptr::null_mut();
                pyo3::ffi::PySendResult::PYGEN_ERROR
            }
        }
    }
}

/// `tp_iternext`: the value to yield, or NULL with StopIteration(result)
/// set (nothing set for a None result).
unsafe extern "C" fn resume_next<T: Resumable>(slf: *mut pyo3::ffi::PyObject) -> *mut pyo3::ffi::PyObject {
    use pyo3::prelude::*;
    // SAFETY: as for resume_send.
    unsafe {
        let py = Python::assume_attached();
        let obj = Bound::from_borrowed_ptr(py, slf).cast_into_unchecked::<T>();
        match T::resume(&obj, &py.None().into_bound(py)) {
            Ok(Resumed::Yield(value)) => value.into_ptr(),
            Ok(Resumed::Return(value)) => {
                let value = value.into_bound(py);
                if value.is_none() {
                    // No exception: a None result.
                } else if value.is_instance_of::<pyo3::types::PyTuple>()
                    || value.is_instance_of::<pyo3::exceptions::PyBaseException>()
                {
                    // StopIteration's constructor would take these apart:
                    // the exception made first, with the value as its one argument.
                    match py.get_type::<pyo3::exceptions::PyStopIteration>().call1((value,)) {
                        Ok(exc) => pyo3::ffi::PyErr_SetObject(pyo3::ffi::PyExc_StopIteration, exc.as_ptr()),
                        Err(err) => err.restore(py),
                    }
                } else {
                    pyo3::ffi::PyErr_SetObject(pyo3::ffi::PyExc_StopIteration, value.as_ptr());
                }
                std::ptr::null_mut()
            }
            Err(err) => {
                err.restore(py);
                std::ptr::null_mut()
            }
        }
    }
}

// ---- end of section: streams ----

// ---- section: Unix socket paths and accepted connections (net) ----

/// The net layer's CPython calls: the filesystem encoding of Unix socket
/// paths, `os.fspath`, and a context of its own per accepted connection.
pub(crate) mod net {
    use pyo3::prelude::*;
    use pyo3::types::{PyBytes, PyString};

    /// `bytes` decoded with the filesystem encoding, as `os.fsdecode`.
    pub(crate) fn fs_decode<'py>(py: Python<'py>, bytes: &[u8]) -> PyResult<Bound<'py, PyString>> {
        // SAFETY: GIL held (the token); a valid buffer of its length; the
        // result is a new reference to a str or NULL with an exception set.
        unsafe {
            let obj = pyo3::ffi::PyUnicode_DecodeFSDefaultAndSize(
                bytes.as_ptr() as *const libc::c_char,
                bytes.len() as pyo3::ffi::Py_ssize_t,
            );
            Ok(Bound::from_owned_ptr_or_err(py, obj)?.cast_into_unchecked())
        }
    }

    /// A str encoded with the filesystem encoding, as `os.fsencode`.
    pub(crate) fn fs_encode<'py>(s: &Bound<'py, PyString>) -> PyResult<Bound<'py, PyBytes>> {
        // SAFETY: GIL held; the result is a new reference to a bytes object
        // or NULL with an exception set.
        unsafe {
            let obj = pyo3::ffi::PyUnicode_EncodeFSDefault(s.as_ptr());
            Ok(Bound::from_owned_ptr_or_err(s.py(), obj)?.cast_into_unchecked())
        }
    }

    /// `os.fspath(obj)`: a str or bytes, or the TypeError os.fspath raises.
    pub(crate) fn fspath<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        // SAFETY: GIL held; PyOS_FSPath returns a new reference or NULL with
        // the error set.
        unsafe { Bound::from_owned_ptr_or_err(obj.py(), pyo3::ffi::PyOS_FSPath(obj.as_ptr())) }
    }

    /// `f()` run inside a fresh copy of the current context (entered
    /// before, exited after; an exit that fails is the error).
    pub(crate) fn in_context_copy<R>(py: Python<'_>, f: impl FnOnce() -> PyResult<R>) -> PyResult<R> {
        // SAFETY: GIL held; a new reference to a context, or NULL with the
        // error set.
        let ctx = unsafe { Bound::from_owned_ptr_or_err(py, pyo3::ffi::PyContext_CopyCurrent())? };
        // SAFETY: a live context, new, so not entered anywhere.
        if unsafe { pyo3::ffi::PyContext_Enter(ctx.as_ptr()) } < 0 {
            return Err(PyErr::fetch(py));
        }
        let result = f();
        // SAFETY: the context entered above, on this thread; CPython checks
        // that it is the current one.
        if unsafe { pyo3::ffi::PyContext_Exit(ctx.as_ptr()) } < 0 {
            return Err(PyErr::fetch(py));
        }
        result
    }
}

// ---- end of section: net ----

// ---- section: the loop's GIL hand-off and queued callbacks (eventloop) ----

/// The loop's CPython calls: the thread state saved while the loop polls
/// without the GIL, a queued handle's callback run in its context, and the
/// state of an fd handler built from a callback and its argument tuple.
pub(crate) mod eventloop {
    use std::cell::Cell;
    use std::marker::PhantomData;
    use std::ptr;

    use pyo3::ffi;
    use pyo3::prelude::*;
    use pyo3::types::PyTuple;
    use pyo3::PyVisit;

    use crate::handles::{run_in_context, Callback, HandleState, Ready};

    /// The loop thread's Python thread state while the loop polls without
    /// the GIL (`PyEval_SaveThread`); null while it holds the GIL.
    pub(crate) struct SavedThread {
        saved: Cell<*mut ffi::PyThreadState>,
    }

    impl SavedThread {
        pub(crate) const fn new() -> Self {
            SavedThread { saved: Cell::new(ptr::null_mut()) }
        }

        /// Whether the GIL is given away.
        #[inline(always)]
        pub(crate) fn is_saved(&self) -> bool {
            !self.saved.get().is_null()
        }

        /// Releases the GIL, if not given away already.
        ///
        /// # Safety
        /// This thread holds the GIL, and touches no Python object until
        /// `restore` (the loop's prepare callback, inside uv_run).
        #[inline(always)]
        pub(crate) unsafe fn save(&self) {
            if self.saved.get().is_null() {
                // SAFETY: per the contract.
                self.saved.set(unsafe { ffi::PyEval_SaveThread() });
            }
        }

        /// Takes the GIL back if `save` gave it away; true if it did.
        ///
        /// # Safety
        /// On the thread that called `save`.
        #[inline(always)]
        pub(crate) unsafe fn restore(&self) -> bool {
            let saved = self.saved.replace(ptr::null_mut());
            if saved.is_null() {
                return false;
            }
            // SAFETY: `saved` is this thread's state, saved by `save`.
            unsafe { ffi::PyEval_RestoreThread(saved) };
            true
        }
    }

    /// A queued handle's callback taken out to run, and the context it runs
    /// in: the handle's own, which the queue item (borrowed for `'a`) keeps
    /// alive with the handle.
    pub(crate) struct DueCall<'a> {
        cb: Callback,
        ctx: *mut ffi::PyObject,
        shared: bool,
        foreign: bool,
        _item: PhantomData<&'a Ready>,
    }

    impl<'a> DueCall<'a> {
        /// The callback of `item` if it is to run (not cancelled); `keep`:
        /// the handle keeps its callback meanwhile (debug mode).
        #[inline(always)]
        pub(crate) fn take(py: Python<'_>, item: &'a Ready, keep: bool) -> Option<Self> {
            item.with_state(py, |c| {
                let cb = c.take_for_run(keep)?;
                let (ctx, shared) = c.run_context();
                Some(DueCall { cb, ctx, shared, foreign: c.has_foreign_context(), _item: PhantomData })
            })
        }

        #[inline(always)]
        pub(crate) fn callback(&self) -> &Callback {
            &self.cb
        }

        /// The context, when it is the loop's shared snapshot (see
        /// handles/context.rs): for `ContextCache::set_running`.
        #[inline(always)]
        pub(crate) fn shared_context(&self) -> Option<*mut ffi::PyObject> {
            self.shared.then_some(self.ctx)
        }

        /// Calls the callback in its context; false if it raised (the
        /// exception is left set). Native state must not be borrowed (the
        /// call runs Python code; debug builds check it).
        #[inline(always)]
        pub(crate) fn run(&self, _py: Python<'_>) -> bool {
            // SAFETY: GIL held (the token); the context is the handle
            // state's, which the borrowed item keeps alive; a foreign one is
            // any live object.
            unsafe {
                if self.foreign {
                    self.cb.call_through(self.ctx)
                } else {
                    run_in_context(&self.cb, self.ctx, self.shared)
                }
            }
        }
    }

    /// A queued handle, as an object.
    #[inline]
    pub(crate) fn ready_object<'py>(py: Python<'py>, item: &Ready) -> Bound<'py, PyAny> {
        // SAFETY: the item holds a reference to its handle.
        unsafe { Bound::from_borrowed_ptr(py, item.as_ptr()) }
    }

    /// `f` on a queued handle's state, for the cyclic GC's traversal (the
    /// `PyVisit` proves it: the GIL is held, and `f` only reads).
    #[inline]
    pub(crate) fn traverse_ready<R>(item: &Ready, _visit: &PyVisit<'_>, f: impl FnOnce(&HandleState) -> R) -> R {
        // SAFETY: as for `NativeCell::traverse`.
        unsafe { item.peek_state(f) }
    }

    /// A callback's function, as an object.
    #[inline]
    pub(crate) fn callback_func<'py>(py: Python<'py>, cb: &Callback) -> Bound<'py, PyAny> {
        // SAFETY: the callback holds a reference to its function.
        unsafe { Bound::from_borrowed_ptr(py, cb.func()) }
    }

    /// The state of an fd handler: `callback(*args)`, run each time the fd
    /// is ready, in a copy of the current context of its own (as asyncio).
    pub(crate) fn repeating_state(
        py: Python<'_>,
        callback: &Bound<'_, PyAny>,
        args: &Bound<'_, PyTuple>,
    ) -> PyResult<HandleState> {
        // SAFETY: GIL held; a new reference or NULL with the error set.
        let ctx = unsafe { ffi::PyContext_CopyCurrent() };
        if ctx.is_null() {
            return Err(PyErr::fetch(py));
        }
        // SAFETY: the callback and the tuple's items are live objects;
        // Callback::new takes references of its own, and the state takes
        // over the context's.
        unsafe {
            let items = (*(args.as_ptr() as *mut ffi::PyTupleObject)).ob_item.as_ptr();
            let cb = Callback::new(callback.as_ptr(), items, args.len());
            Ok(HandleState::new(cb, ctx, false, true))
        }
    }
}

// ---- end of section: eventloop ----
