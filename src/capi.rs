//! The unsafe edge to CPython's C API: the calls pyo3's safe API does not
//! offer, or offers only at a cost the hot paths cannot pay (borrowed
//! references, buffers, bytes filled in place, the GIL's save and restore).
//!
//! Everything here is a safe function or a safe owner type; the rest of the
//! crate uses `pyo3::ffi` only through this module, `handles::context`,
//! `handles::pool` and `eventloop::fastcall`. Each section belongs to the
//! layer that uses it.

// ---- section: releasing Python objects from drops (every layer) ----

/// Attaching to Python from a `Drop`, which may run while the interpreter
/// finalizes.
pub(crate) mod attach {
    use pyo3::ffi;
    use pyo3::prelude::*;

    /// Runs `f` attached to Python, for a drop that must release a Python
    /// object or buffer: on this thread's hold of the GIL when it has one,
    /// else attached by pyo3. None, and `f` not run, when this thread does
    /// not hold the GIL and the interpreter is past `Py_IsInitialized()`:
    /// what the drop holds then stays (the process is exiting).
    ///
    /// `Python::attach` alone will not do: CPython clears `Py_IsInitialized()`
    /// at the start of `Py_FinalizeEx` and still deallocates objects after it
    /// (module teardown, the last collections), with the GIL held by the
    /// finalizing thread, and pyo3 panics on attaching then unless it already
    /// counts the thread as attached, which a drop reached from a raw
    /// `tp_dealloc` or a C method entry does not.
    pub(crate) fn with_held<R>(f: impl for<'py> FnOnce(Python<'py>) -> R) -> Option<R> {
        // SAFETY: PyGILState_Check and Py_IsInitialized may be called from
        // any thread, with or without the GIL; the token is assumed only
        // when this thread holds the GIL.
        unsafe {
            if ffi::PyGILState_Check() == 1 {
                Some(f(Python::assume_attached()))
            } else if ffi::Py_IsInitialized() != 0 {
                Some(Python::attach(f))
            } else {
                None
            }
        }
    }
}

// ---- end of section: attach ----

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

        /// Hands the object out as its first `n` bytes (0 < `n` <= its
        /// length) without copying them: its length is cut to `n` in place,
        /// with the NUL every `bytes` ends with after them. The memory past
        /// them stays the object's (CPython frees an object's memory whole,
        /// whatever its length says), and `CutBytes::reclaim` restores it.
        pub(crate) fn cut(self, py: Python<'_>, n: usize) -> CutBytes<'_> {
            let full = self.as_slice().len();
            assert!(n > 0 && n <= full, "a cut within the buffer");
            let p = self.0.as_ptr();
            // SAFETY: nobody else references the object (the type's
            // invariant), so nobody sees its length change; `n` is within
            // its memory, which holds `full` bytes and their NUL.
            unsafe {
                let data = std::ptr::addr_of_mut!((*(p as *mut ffi::PyBytesObject)).ob_sval) as *mut u8;
                *data.add(n) = 0;
                (*(p as *mut ffi::PyVarObject)).ob_size = n as ffi::Py_ssize_t;
            }
            CutBytes { bytes: self.0.into_bound(py), full }
        }

        /// Takes a `bytes` back for filling, if nobody else references it
        /// and it is an exact `bytes` of `len` bytes (Err gives it back).
        pub(crate) fn reclaim(bytes: Bound<'_, PyBytes>, len: usize) -> Result<FillBytes, Bound<'_, PyBytes>> {
            let p = bytes.as_ptr();
            // SAFETY: reading the refcount of a live object.
            if unsafe { ffi::Py_REFCNT(p) } != 1 || bytes_data(bytes.as_unbound()).len() != len {
                return Err(bytes);
            }
            // SAFETY: reading the type of a live object.
            if unsafe { ffi::PyBytes_CheckExact(p) } == 0 {
                return Err(bytes);
            }
            // SAFETY: the only reference is ours, so the object can be
            // rewritten; its cached hash (if anyone hashed it) must go with
            // the contents.
            #[allow(deprecated)]
            unsafe {
                (*(p as *mut ffi::PyBytesObject)).ob_shash = -1;
            }
            Ok(FillBytes(bytes.unbind()))
        }
    }

    /// A `FillBytes` handed out with its length cut (`FillBytes::cut`).
    pub(crate) struct CutBytes<'py> {
        bytes: Bound<'py, PyBytes>,
        /// Its length before the cut (what its memory holds).
        full: usize,
    }

    impl<'py> CutBytes<'py> {
        #[inline]
        pub(crate) fn bytes(&self) -> &Bound<'py, PyBytes> {
            &self.bytes
        }

        /// Whether the cut left bytes out (the read did not fill it).
        #[inline]
        pub(crate) fn is_short(&self) -> bool {
            bytes_data(self.bytes.as_unbound()).len() < self.full
        }

        /// Back for filling at its full length, if nobody else references
        /// it. Otherwise whoever kept it keeps all its memory, and it stays
        /// a valid `bytes` of the cut length: Err gives it back.
        pub(crate) fn reclaim(self) -> Result<FillBytes, Bound<'py, PyBytes>> {
            let p = self.bytes.as_ptr();
            // SAFETY: reading the refcount of a live object.
            if unsafe { ffi::Py_REFCNT(p) } != 1 {
                return Err(self.bytes);
            }
            // SAFETY: ours is the only reference, so the object can be
            // rewritten: back to the length its memory holds (the byte after
            // it is still the NUL `bytes(full)` wrote, which reads never
            // reach), and without the hash of the cut contents, if anyone
            // hashed them.
            #[allow(deprecated)]
            unsafe {
                (*(p as *mut ffi::PyVarObject)).ob_size = self.full as ffi::Py_ssize_t;
                (*(p as *mut ffi::PyBytesObject)).ob_shash = -1;
            }
            Ok(FillBytes(self.bytes.unbind()))
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
            // the GIL (taken if this thread does not hold it). Left
            // unreleased only by a process that is exiting.
            crate::capi::attach::with_held(|_py| unsafe { ffi::PyBuffer_Release(&mut *self.0) });
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
/// an awaited object) and `am_send` (3.10, 3.11), and `am_await` /
/// `tp_iter` giving the object itself, without pyo3's trampolines.
pub(crate) fn install_resume_slots<T: Resumable>(py: pyo3::Python<'_>) {
    use pyo3::types::PyTypeMethods;
    let tp = py.get_type::<T>();
    // SAFETY: GIL held; a heap type made by pyo3, whose tp_as_async points
    // at its own (writable) slots; no instance is being resumed meanwhile.
    unsafe {
        let raw = tp.as_type_ptr();
        (*raw).tp_iternext = Some(resume_next::<T>);
        (*raw).tp_iter = Some(return_self);
        if let Some(async_slots) = (*raw).tp_as_async.as_mut() {
            async_slots.am_send = Some(resume_send::<T>);
            async_slots.am_await = Some(return_self);
        }
        pyo3::ffi::PyType_Modified(raw);
    }
}

/// `__await__` / `__iter__` of an object that is its own iterator: `await`
/// asks for it once per wait.
unsafe extern "C" fn return_self(slf: *mut pyo3::ffi::PyObject) -> *mut pyo3::ffi::PyObject {
    // SAFETY: CPython calls the slot with the GIL held on a live object;
    // the new reference is the caller's.
    unsafe { pyo3::ffi::Py_INCREF(slf) };
    slf
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

/// C entries of their own for the native streams' per-read and per-write
/// methods (`read`, `readexactly`, `write`, `drain`, ...), in place of
/// pyo3's: a call with the method's argument given by position or by its
/// name goes straight to its Rust body; any other call (a wrong count, an
/// unknown keyword) goes to the method pyo3 made, kept aside, so its
/// errors are unchanged.
pub(crate) mod methods {
    use std::ffi::{CStr, CString};
    use std::sync::OnceLock;

    use pyo3::ffi;
    use pyo3::prelude::*;
    use pyo3::Borrowed;
    use smallvec::SmallVec;

    /// A method with a C entry: `call` is its body for `MIN..=MAX`
    /// arguments (at most one), given by position or, if the method takes
    /// one, by the name `PARAMETER`. The argument is as given: a None is
    /// None, which pyo3's handling of an optional parameter would take for
    /// the parameter's default (asyncio's `read(None)` is a TypeError).
    pub(crate) trait CMethod: 'static {
        type Class: pyo3::PyClass;
        const NAME: &'static CStr;
        const MIN: usize;
        const MAX: usize;
        const PARAMETER: &'static CStr;
        fn call<'py>(slf: &Bound<'py, Self::Class>, arg: Option<Borrowed<'_, 'py, PyAny>>) -> PyResult<Py<PyAny>>;
        /// Where install() keeps the method pyo3 made (a static of the
        /// implementation's own).
        fn original() -> &'static OnceLock<Py<PyAny>>;
    }

    /// `c_method!(Marker: Class, c"name"(c"parameter") MIN..=MAX, |slf, arg| body)`:
    /// a `CMethod` named `Marker` whose call is `body` (`c""`: no parameter).
    macro_rules! c_method {
        ($marker:ident: $class:ty, $name:literal($parameter:literal) $min:literal..=$max:literal, |$slf:ident, $arg:ident| $body:expr) => {
            pub(super) struct $marker;
            impl $crate::capi::methods::CMethod for $marker {
                type Class = $class;
                const NAME: &'static ::std::ffi::CStr = $name;
                const MIN: usize = $min;
                const MAX: usize = $max;
                const PARAMETER: &'static ::std::ffi::CStr = $parameter;
                fn call<'py>(
                    $slf: &::pyo3::Bound<'py, $class>,
                    $arg: Option<::pyo3::Borrowed<'_, 'py, ::pyo3::PyAny>>,
                ) -> ::pyo3::PyResult<::pyo3::Py<::pyo3::PyAny>> {
                    $body
                }
                fn original() -> &'static ::std::sync::OnceLock<::pyo3::Py<::pyo3::PyAny>> {
                    static ORIGINAL: ::std::sync::OnceLock<::pyo3::Py<::pyo3::PyAny>> = ::std::sync::OnceLock::new();
                    &ORIGINAL
                }
            }
        };
    }
    pub(crate) use c_method;

    /// Puts `M`'s C entry on its class in place of pyo3's method, with
    /// that method's signature and doc.
    pub(crate) fn install<M: CMethod>(py: Python<'_>) -> PyResult<()> {
        const { assert!(M::MIN <= M::MAX && M::MAX <= 1) };
        let ty = py.get_type::<M::Class>();
        let name = M::NAME.to_str().expect("ascii");
        let original = ty.getattr(name)?;
        let signature: Option<String> = original.getattr("__text_signature__")?.extract()?;
        let doc: Option<String> = original.getattr("__doc__")?.extract()?;
        let text = format!(
            "{name}{}\n--\n\n{}",
            signature.unwrap_or_else(|| "($self, /, *args, **kwargs)".into()),
            doc.unwrap_or_default()
        );
        // The type keeps pointers to the def and its doc for its life:
        // leaked on purpose (a few small structs per process).
        let doc: &'static CStr = Box::leak(CString::new(text).expect("no NUL").into_boxed_c_str());
        let descr = method_descriptor(
            &ty,
            ffi::PyMethodDef {
                ml_name: M::NAME.as_ptr(),
                ml_meth: ffi::PyMethodDefPointer { PyCFunctionFastWithKeywords: entry::<M> },
                ml_flags: ffi::METH_FASTCALL | ffi::METH_KEYWORDS,
                ml_doc: doc.as_ptr(),
            },
        )?;
        // First install only (a second module init finds its own entry).
        if M::original().set(original.unbind()).is_ok() {
            ty.setattr(name, descr)?;
        }
        Ok(())
    }

    /// A method descriptor of `ty` for `def` (its name and doc must be
    /// 'static). The def itself is leaked: the descriptor points at it for
    /// the life of the type (a few small structs per process).
    pub(crate) fn method_descriptor<'py>(
        ty: &Bound<'py, pyo3::types::PyType>,
        def: ffi::PyMethodDef,
    ) -> PyResult<Bound<'py, PyAny>> {
        let def: &'static mut ffi::PyMethodDef = Box::leak(Box::new(def));
        // SAFETY: the type object is a live heap type; the def is 'static.
        let descr = unsafe { ffi::PyDescr_NewMethod(ty.as_ptr() as *mut ffi::PyTypeObject, def) };
        // SAFETY: a new reference, or NULL with an exception set.
        unsafe { Bound::from_owned_ptr_or_err(ty.py(), descr) }
    }

    /// The C entry: the fast call shape to `M::call`, anything else to the
    /// method pyo3 made.
    unsafe extern "C" fn entry<M: CMethod>(
        slf: *mut ffi::PyObject,
        args: *const *mut ffi::PyObject,
        nargsf: ffi::Py_ssize_t,
        kwnames: *mut ffi::PyObject,
    ) -> *mut ffi::PyObject {
        // SAFETY: CPython calls a method descriptor's entry with the GIL
        // held, `slf` an instance of the descriptor's class (it checks),
        // and vectorcall's arguments: `nargs` positional ones, then one
        // per name in `kwnames` (NULL or a tuple), alive for the call.
        unsafe {
            let py = Python::assume_attached();
            let nargs = ffi::PyVectorcall_NARGS(nargsf as usize) as usize;
            let by_name = !kwnames.is_null()
                && nargs == 0
                && M::MAX == 1
                && ffi::PyTuple_GET_SIZE(kwnames) == 1
                && ffi::PyUnicode_CompareWithASCIIString(ffi::PyTuple_GET_ITEM(kwnames, 0), M::PARAMETER.as_ptr()) == 0;
            let result = if by_name || (kwnames.is_null() && (M::MIN..=M::MAX).contains(&nargs)) {
                let obj = Borrowed::from_ptr(py, slf).cast_unchecked::<M::Class>();
                let arg = (nargs == 1 || by_name).then(|| Borrowed::from_ptr(py, *args));
                M::call(&obj, arg)
            } else {
                let nkw = if kwnames.is_null() { 0 } else { ffi::PyTuple_GET_SIZE(kwnames) as usize };
                let mut stack: SmallVec<[*mut ffi::PyObject; 6]> = SmallVec::with_capacity(1 + nargs + nkw);
                stack.push(slf);
                stack.extend_from_slice(std::slice::from_raw_parts(args, nargs + nkw));
                let original = M::original().get().expect("installed before its entry is reachable");
                let out = ffi::PyObject_Vectorcall(original.as_ptr(), stack.as_ptr(), 1 + nargs, kwnames);
                Bound::from_owned_ptr_or_err(py, out).map(Bound::unbind)
            };
            match result {
                Ok(obj) => obj.into_ptr(),
                Err(err) => {
                    err.restore(py);
                    std::ptr::null_mut()
                }
            }
        }
    }
}

// ---- end of section: streams ----

// ---- section: dict versions (dicts) ----

pub(crate) mod dicts {
    use pyo3::prelude::*;
    use pyo3::types::PyDict;

    /// The version tag of `dict` (PEP 509): a value no other state of any
    /// dict has had, new whenever the dict changes. CPython keeps it in
    /// the dict object up to 3.13 (deprecated from 3.12; from 3.14 the
    /// field is something else); None where it cannot be read.
    #[inline]
    pub(crate) fn version(dict: &Bound<'_, PyDict>) -> Option<u64> {
        #[cfg(not(any(Py_3_14, PyPy, GraalPy, Py_GIL_DISABLED)))]
        {
            // SAFETY: `dict` is a live dict object (or a subclass's, which
            // starts with the same struct); one field of it is read.
            #[allow(deprecated)]
            let tag = unsafe { (*(dict.as_ptr() as *mut pyo3::ffi::PyDictObject)).ma_version_tag };
            return (tag != 0).then_some(tag);
        }
        #[allow(unreachable_code)]
        {
            let _ = dict;
            None
        }
    }
}

// ---- end of section: dicts ----

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

// ---- section: handles and the calls of python.rs (handles, python) ----

/// The Python calls of python.rs that pyo3 makes only at a cost: a method
/// called without a bound method object, and one called with a keyword
/// argument without a keyword dict.
pub(crate) mod calls {
    use pyo3::ffi;
    use pyo3::prelude::*;
    use pyo3::types::{PyString, PyTuple};
    use smallvec::SmallVec;

    /// `obj.name()`, looked up as a method (`PyObject_CallMethodNoArgs`).
    #[inline]
    pub(crate) fn call_method0<'py>(
        obj: &Bound<'py, PyAny>,
        name: &Bound<'py, PyString>,
    ) -> PyResult<Bound<'py, PyAny>> {
        // SAFETY: GIL held (the tokens); both are live objects; the result is
        // a new reference or NULL with an exception set.
        unsafe { Bound::from_owned_ptr_or_err(obj.py(), ffi::PyObject_CallMethodNoArgs(obj.as_ptr(), name.as_ptr())) }
    }

    /// `obj.name(*args, **dict(zip(kwnames, kwvalues)))` as one vectorcall.
    /// A TypeError if there are not as many keyword values as names.
    pub(crate) fn call_method_kw<'py>(
        obj: &Bound<'py, PyAny>,
        name: &Bound<'py, PyString>,
        args: &[&Bound<'py, PyAny>],
        kwnames: &Bound<'py, PyTuple>,
        kwvalues: &[&Bound<'py, PyAny>],
    ) -> PyResult<Bound<'py, PyAny>> {
        if kwnames.len() != kwvalues.len() {
            return Err(pyo3::exceptions::PyTypeError::new_err("keyword names and values differ in number"));
        }
        let mut argv: SmallVec<[*mut ffi::PyObject; 6]> = SmallVec::with_capacity(1 + args.len() + kwvalues.len());
        argv.push(obj.as_ptr());
        argv.extend(args.iter().map(|a| a.as_ptr()));
        argv.extend(kwvalues.iter().map(|a| a.as_ptr()));
        // SAFETY: GIL held; every pointer is a live object borrowed for the
        // call; the positional count (self and args) leaves exactly
        // `kwnames.len()` values at the end, checked above.
        unsafe {
            Bound::from_owned_ptr_or_err(
                obj.py(),
                ffi::PyObject_VectorcallMethod(name.as_ptr(), argv.as_ptr(), args.len() + 1, kwnames.as_ptr()),
            )
        }
    }
}

/// What handles (src/handles) hold and call: owned references released
/// with a plain decref (a handle's value is dropped by its pool's
/// `tp_dealloc`, outside pyo3's trampolines, where dropping a `Py<T>` would
/// ask pyo3 whether the thread is attached, and could only queue the
/// decref), a callback's function and arguments in one word, and the
/// handle's release by the loop.
///
/// These types are only made with the GIL held and are not `Send`, so they
/// are dropped on the thread that holds them: in a handle's `tp_dealloc`,
/// or under the GIL that a `NativeCell::with` closure they were taken out of
/// proves.
pub(crate) mod handles {
    use std::marker::PhantomData;
    use std::mem::ManuallyDrop;
    use std::ptr;

    use pyo3::ffi;
    use pyo3::prelude::*;
    use smallvec::SmallVec;

    use crate::handles::{HandleState, Ready};

    /// A strong reference released with a plain `Py_DECREF` (see the module
    /// docs); otherwise a `Py<PyAny>` (deref).
    #[repr(transparent)]
    pub(crate) struct ObjRef(ManuallyDrop<Py<PyAny>>, PhantomData<*mut ()>);

    impl ObjRef {
        /// Takes over a reference.
        #[inline(always)]
        pub(crate) fn new(obj: Py<PyAny>) -> ObjRef {
            ObjRef(ManuallyDrop::new(obj), PhantomData)
        }

        /// Takes over the reference `ptr` owns.
        ///
        /// # Safety
        /// GIL held; `ptr` is a live object whose reference is the caller's to give.
        #[inline(always)]
        pub(crate) unsafe fn from_owned_ptr(ptr: *mut ffi::PyObject) -> ObjRef {
            // SAFETY: per the contract: a live object, so not null; Py<PyAny>
            // is a transparent non-null pointer (no check, as on the hot path).
            ObjRef::new(unsafe {
                std::mem::transmute::<ptr::NonNull<ffi::PyObject>, Py<PyAny>>(ptr::NonNull::new_unchecked(ptr))
            })
        }

        /// A new reference to the object, for Python code.
        #[inline]
        pub(crate) fn to_object(&self, py: Python<'_>) -> Py<PyAny> {
            self.0.clone_ref(py)
        }
    }

    impl std::ops::Deref for ObjRef {
        type Target = Py<PyAny>;

        #[inline(always)]
        fn deref(&self) -> &Py<PyAny> {
            &self.0
        }
    }

    impl Drop for ObjRef {
        #[inline(always)]
        fn drop(&mut self) {
            // SAFETY: the reference is ours; GIL held (see the module docs).
            unsafe { ffi::Py_DECREF(self.0.as_ptr()) }
        }
    }

    /// Two or more arguments.
    type ArgList = SmallVec<[*mut ffi::PyObject; 4]>;

    /// Set on `Args` words that point at an `ArgList` (object and box
    /// pointers are at least 8-byte aligned, so bit 0 is free).
    const HEAP_ARGS: usize = 1;

    /// Owned positional arguments of a callback in one word, so that a
    /// handle fits CPython's 64-byte allocation class (one cache line,
    /// which matters when a handle made by one thread is run by another):
    /// no argument, the single argument inline (the common cases: task
    /// steps and future callbacks), or a tagged pointer to a heap list for
    /// two or more.
    struct Args(usize, PhantomData<*mut ()>);

    impl Args {
        /// Takes new references to the `nargs` objects at `args`.
        ///
        /// # Safety
        /// GIL held; `args` points at `nargs` live object pointers.
        #[inline(always)]
        unsafe fn new(args: *const *mut ffi::PyObject, nargs: usize) -> Args {
            // SAFETY: the caller's contract.
            unsafe {
                for i in 0..nargs {
                    ffi::Py_INCREF(*args.add(i));
                }
                let word = match nargs {
                    0 => 0,
                    1 => *args as usize,
                    _ => {
                        let list: Box<ArgList> =
                            Box::new(std::slice::from_raw_parts(args, nargs).iter().copied().collect());
                        Box::into_raw(list) as usize | HEAP_ARGS
                    }
                };
                Args(word, PhantomData)
            }
        }

        /// The arguments (`Py<PyAny>` has the layout of an object pointer).
        #[inline(always)]
        fn as_slice(&self) -> &[Py<PyAny>] {
            let raw: &[*mut ffi::PyObject] = if self.0 == 0 {
                &[]
            } else if self.0 & HEAP_ARGS == 0 {
                // SAFETY: the word is the one argument's pointer.
                std::slice::from_ref(unsafe { &*(&self.0 as *const usize as *const *mut ffi::PyObject) })
            } else {
                // SAFETY: a tagged pointer from Box::into_raw, owned by self.
                unsafe { (*((self.0 & !HEAP_ARGS) as *const ArgList)).as_slice() }
            };
            // SAFETY: Py<PyAny> is a transparent non-null object pointer, and
            // every pointer here is a live reference owned by self.
            unsafe { std::slice::from_raw_parts(raw.as_ptr() as *const Py<PyAny>, raw.len()) }
        }
    }

    impl Drop for Args {
        #[inline(always)]
        fn drop(&mut self) {
            for a in self.as_slice() {
                // SAFETY: our references; GIL held (see the module docs).
                unsafe { ffi::Py_DECREF(a.as_ptr()) }
            }
            if self.0 & HEAP_ARGS != 0 {
                // SAFETY: made by Box::into_raw in `new`; dropped once.
                drop(unsafe { Box::from_raw((self.0 & !HEAP_ARGS) as *mut ArgList) });
            }
        }
    }

    /// The owned references of a pending call: the function and its
    /// positional arguments (see handles/callback.rs for the rest).
    pub(crate) struct Callback {
        func: ObjRef,
        args: Args,
    }

    impl Callback {
        /// Takes new references to `func` and the `nargs` objects at `args`.
        ///
        /// # Safety
        /// GIL held; `func` is a live object and `args` points at `nargs` live objects.
        #[inline(always)]
        pub(crate) unsafe fn new(func: *mut ffi::PyObject, args: *const *mut ffi::PyObject, nargs: usize) -> Callback {
            // SAFETY: the caller's contract.
            unsafe {
                let args = Args::new(args, nargs);
                ffi::Py_INCREF(func);
                Callback { func: ObjRef::from_owned_ptr(func), args }
            }
        }

        /// A second owner of the same references (for handles that run many times).
        #[inline]
        pub(crate) fn clone_refs(&self) -> Callback {
            let args = self.args.as_slice();
            // SAFETY: GIL held (callbacks live under it, see the module
            // docs); the references are live ones of this callback.
            unsafe {
                ffi::Py_INCREF(self.func.as_ptr());
                Callback {
                    func: ObjRef::from_owned_ptr(self.func.as_ptr()),
                    args: Args::new(args.as_ptr() as *const *mut ffi::PyObject, args.len()),
                }
            }
        }

        /// The function (borrowed).
        #[inline]
        pub(crate) fn func(&self) -> *mut ffi::PyObject {
            self.func.as_ptr()
        }

        /// The function.
        #[inline]
        pub(crate) fn function(&self) -> &Py<PyAny> {
            &self.func
        }

        /// The positional arguments.
        #[inline]
        pub(crate) fn args(&self) -> &[Py<PyAny>] {
            self.args.as_slice()
        }

        /// Calls the function in the current context. Returns false if it
        /// raised (the exception is left set).
        #[inline(always)]
        pub(crate) fn call(&self, _py: Python<'_>) -> bool {
            crate::cell::check_crossing();
            let args = self.args.as_slice();
            // SAFETY: GIL held (the token); the function and the arguments
            // are live references of this callback, `args.len()` of them.
            unsafe {
                let res = ffi::PyObject_Vectorcall(
                    self.func.as_ptr(),
                    args.as_ptr() as *const *mut ffi::PyObject,
                    args.len(),
                    ptr::null_mut(),
                );
                if res.is_null() {
                    return false;
                }
                ffi::Py_DECREF(res);
                true
            }
        }

        /// Calls `context.run(function, *args)`, asyncio's way with a
        /// context that is not a `contextvars.Context`. Returns false if it
        /// raised (the exception is left set).
        ///
        /// # Safety
        /// GIL held; `context` is a live object.
        pub(crate) unsafe fn call_through(&self, context: *mut ffi::PyObject) -> bool {
            // SAFETY: the caller's contract.
            let (py, context) = unsafe {
                let py = Python::assume_attached();
                (py, pyo3::Borrowed::from_ptr(py, context))
            };
            crate::cell::check_crossing();
            let run = match context.getattr(pyo3::intern!(py, "run")) {
                Ok(run) => run,
                Err(err) => {
                    err.restore(py);
                    return false;
                }
            };
            let args = self.args.as_slice();
            let mut all: SmallVec<[*mut ffi::PyObject; 5]> = SmallVec::with_capacity(args.len() + 1);
            all.push(self.func.as_ptr());
            all.extend(args.iter().map(|a| a.as_ptr()));
            // SAFETY: GIL held; `run` and every pointer in `all` are live for the call.
            let res = unsafe { ffi::PyObject_Vectorcall(run.as_ptr(), all.as_ptr(), all.len(), ptr::null_mut()) };
            if res.is_null() {
                return false;
            }
            // SAFETY: a new reference, ours.
            unsafe { ffi::Py_DECREF(res) };
            true
        }
    }

    /// `int(x)` of a float, as CPython converts it (an error for nan and
    /// infinities).
    pub(crate) fn int_of_float(py: Python<'_>, x: f64) -> PyResult<Py<PyAny>> {
        // SAFETY: GIL held (the token); a new reference or NULL with the error set.
        unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyLong_FromDouble(x)) }.map(Bound::unbind)
    }

    /// Lets go of a handle the loop no longer queues. Queued handles are
    /// not tracked by the GC (the loop reports their references); one that
    /// somebody else still holds is tracked from now on, so a cycle through
    /// its context can still be collected.
    ///
    /// Every caller holds the GIL (the loop's own code; debug builds check
    /// it); it takes no token because the loop's timer heap releases its
    /// handles through a trait that has none (a plain decref: Py's drop
    /// would first ask pyo3 whether the thread is attached, on every
    /// callback).
    #[inline]
    pub(crate) fn let_go<T>(handle: Py<T>) {
        let p = handle.into_ptr();
        // SAFETY: GIL held (see above); the object is a live pyo3 instance
        // of a GC class and this was our reference.
        unsafe {
            debug_assert!(ffi::PyGILState_Check() == 1, "let_go without the GIL");
            if ffi::Py_REFCNT(p) > 1 && ffi::PyObject_GC_IsTracked(p) == 0 {
                ffi::PyObject_GC_Track(p as *mut _);
            }
            ffi::Py_DECREF(p);
        }
    }

    impl Ready {
        /// The handle's state for the cyclic GC (see `NativeCell::peek`).
        ///
        /// # Safety
        /// GIL held; `f` only reads.
        #[inline]
        pub(crate) unsafe fn peek_state<R>(&self, f: impl FnOnce(&HandleState) -> R) -> R {
            use crate::handles::HasState;
            // SAFETY: per the contract.
            unsafe {
                match self {
                    Ready::Soon(h) => h.get().state_cell().peek(f),
                    Ready::Timer(h) => h.get().state_cell().peek(f),
                }
            }
        }
    }

    /// Source tracebacks of debug-mode handles, by the address of their
    /// state: kept out of the handle so that a handle stays within 64 bytes.
    /// Debug mode only, so the GIL is asked for rather than assumed.
    pub(crate) mod tracebacks {
        use std::collections::HashMap;
        use std::sync::{Mutex, MutexGuard, OnceLock};

        use pyo3::prelude::*;

        fn table() -> MutexGuard<'static, HashMap<usize, Py<PyAny>>> {
            static TABLE: OnceLock<Mutex<HashMap<usize, Py<PyAny>>>> = OnceLock::new();
            TABLE.get_or_init(|| Mutex::new(HashMap::new())).lock().unwrap_or_else(|poisoned| poisoned.into_inner())
        }

        /// Records `tb` for `key`; the one it replaces is dropped after the
        /// table is unlocked.
        pub(crate) fn record(_py: Python<'_>, key: usize, tb: Py<PyAny>) {
            let old = table().insert(key, tb);
            drop(old);
        }

        /// The traceback recorded for `key`.
        pub(crate) fn get(py: Python<'_>, key: usize) -> Option<Py<PyAny>> {
            table().get(&key).map(|tb| tb.clone_ref(py))
        }

        /// Forgets the traceback of `key` (a handle's state being dropped).
        pub(crate) fn forget(key: usize) {
            let tb = table().remove(&key);
            if let Some(tb) = tb {
                // Attached already (a handle dies under the GIL, during
                // finalization too): the decref is made at once, not queued
                // by pyo3 for its next attach.
                crate::capi::attach::with_held(|py| tb.drop_ref(py));
            }
        }
    }
}

// ---- end of section: handles ----

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

/// The C `_asyncio.Future`'s loop, read where the object keeps it, so that
/// `create_future` can make a future without passing `loop=` (its keyword
/// costs the call more than the rest of the future's set-up) and still
/// check that the future took this loop.
pub(crate) mod futures {
    use std::sync::atomic::{AtomicU8, Ordering};

    use pyo3::ffi;
    use pyo3::prelude::*;
    use pyo3::sync::PyOnceLock;
    use pyo3::types::PyType;

    const UNKNOWN: u8 = 0;
    const VERIFIED: u8 = 1;
    const ELSEWHERE: u8 = 2;

    /// Whether a C future's loop is its first field after the object
    /// header (`FutureObj_HEAD` since 3.7): learnt from the first future
    /// made with `loop=` (`learn_layout`).
    static LOOP_FIELD: AtomicU8 = AtomicU8::new(UNKNOWN);

    /// `_asyncio.Future`, when the C accelerator is there.
    fn c_future_type(py: Python<'_>) -> Option<&Bound<'_, PyType>> {
        static TYPE: PyOnceLock<Option<Py<PyType>>> = PyOnceLock::new();
        TYPE.get_or_init(py, || {
            let ty = py.import("_asyncio").and_then(|m| m.getattr("Future")).ok()?;
            ty.cast_into::<PyType>().ok().map(Bound::unbind)
        })
        .as_ref()
        .map(|t| t.bind(py))
    }

    /// Whether `ty` is the C future type itself (not a subclass).
    pub(crate) fn is_c_future_type(ty: &Bound<'_, PyAny>) -> bool {
        c_future_type(ty.py()).is_some_and(|c| ty.is(c))
    }

    /// `fut._asyncio_future_blocking = True`, what `await fut` does before
    /// it yields. On an exact C future the type's own data descriptor is
    /// called directly (an instance's dict cannot shadow a data descriptor,
    /// and a subclass, which might define its own, takes the generic path),
    /// skipping the attribute lookup of a `setattr`.
    pub(crate) fn mark_blocking(fut: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = fut.py();
        let name = pyo3::intern!(py, "_asyncio_future_blocking");
        static SETTER: PyOnceLock<Option<Py<PyAny>>> = PyOnceLock::new();
        let descr = SETTER.get_or_init(py, || {
            let descr = c_future_type(py)?.getattr(name).ok()?;
            // SAFETY: reading a slot of a live type object.
            let has_set = unsafe { (*ffi::Py_TYPE(descr.as_ptr())).tp_descr_set.is_some() };
            has_set.then(|| descr.unbind())
        });
        match (descr, c_future_type(py)) {
            (Some(descr), Some(c)) if fut.get_type().is(c) => {
                // SAFETY: GIL held; `descr` is a live data descriptor of the
                // C future type (its tp_descr_set checked above), called on
                // an instance of exactly that type; 0 or -1 with the error set.
                let rc = unsafe {
                    let set = (*ffi::Py_TYPE(descr.as_ptr())).tp_descr_set.expect("checked at first use");
                    set(descr.as_ptr(), fut.as_ptr(), ffi::Py_True())
                };
                if rc < 0 {
                    return Err(PyErr::fetch(py));
                }
                Ok(())
            }
            _ => fut.setattr(name, true),
        }
    }

    /// Whether `fut`, an exact C future whose only references are the
    /// caller's two (where it keeps it, and `fut`), can be made new
    /// (`reinit`) without anybody seeing it: no weak reference to it and no
    /// instance dict (nothing set on it), and no exception of its still to
    /// be logged as never retrieved. False wherever this cannot tell where
    /// the type keeps its weak references or attributes.
    pub(crate) fn reusable(fut: &Bound<'_, PyAny>) -> bool {
        let py = fut.py();
        // (Without the GIL a reference count says nothing of other threads.)
        if cfg!(any(PyPy, GraalPy, Py_GIL_DISABLED)) {
            return false;
        }
        let Some(own) = own_methods(py) else { return false };
        // SAFETY: `fut` is live, so its header can be read; the attributes
        // are asked of it only when it is exactly of the type `own`
        // describes.
        let unseen = unsafe {
            ffi::Py_TYPE(fut.as_ptr()) == own.tp
                && ffi::Py_REFCNT(fut.as_ptr()) == 2
                && own.weak_refs.none_on(fut.as_ptr())
                && own.attributes.none_on(fut.as_ptr())
        };
        unseen && !log_traceback_pending(fut)
    }

    /// `fut._log_traceback`, read through the C future type's descriptor
    /// (true if it cannot be read).
    fn log_traceback_pending(fut: &Bound<'_, PyAny>) -> bool {
        let py = fut.py();
        static GETTER: PyOnceLock<Option<Py<PyAny>>> = PyOnceLock::new();
        let descr = GETTER.get_or_init(py, || {
            let descr = c_future_type(py)?.getattr("_log_traceback").ok()?;
            // SAFETY: reading a slot of a live type object.
            let has_get = unsafe { (*ffi::Py_TYPE(descr.as_ptr())).tp_descr_get.is_some() };
            has_get.then(|| descr.unbind())
        });
        let Some(descr) = descr else { return true };
        // SAFETY: GIL held; `descr` is a live descriptor of the C future
        // type with a tp_descr_get (checked at first use), called on an
        // exact instance; a new reference or NULL with the error set.
        let value = unsafe {
            let get = (*ffi::Py_TYPE(descr.as_ptr())).tp_descr_get.expect("checked at first use");
            Bound::from_owned_ptr_or_err(
                py,
                get(descr.as_ptr(), fut.as_ptr(), ffi::Py_TYPE(fut.as_ptr()) as *mut ffi::PyObject),
            )
        };
        // SAFETY: comparing with the False singleton's address.
        !value.is_ok_and(|v| v.as_ptr() == unsafe { ffi::Py_False() })
    }

    /// `fut.__init__(*args, **kwargs)`: a C future made pending again, as
    /// new (CPython's `Future.__init__` clears all it held first).
    pub(crate) fn reinit(
        fut: &Bound<'_, PyAny>,
        args: &Bound<'_, pyo3::types::PyTuple>,
        kwargs: Option<&Bound<'_, pyo3::types::PyDict>>,
    ) -> PyResult<()> {
        let py = fut.py();
        // SAFETY: GIL held; `fut` is a live instance of a type whose tp_init
        // is called with an args tuple and a dict or NULL; 0 or -1 with the
        // error set.
        let rc = unsafe {
            let init = (*ffi::Py_TYPE(fut.as_ptr())).tp_init.expect("the C future type has __init__");
            init(fut.as_ptr(), args.as_ptr(), kwargs.map_or(std::ptr::null_mut(), |k| k.as_ptr()))
        };
        if rc < 0 {
            return Err(PyErr::fetch(py));
        }
        Ok(())
    }

    /// The first field after the header of `fut`, an exact C future.
    fn first_field(fut: &Bound<'_, PyAny>) -> Option<*mut ffi::PyObject> {
        let c = c_future_type(fut.py())?;
        if !fut.get_type().is(c) {
            return None;
        }
        // SAFETY: `fut` is a live instance of exactly the C future type,
        // whose object holds its pointer fields after the header; the read
        // is of one pointer-sized field inside the object.
        Some(unsafe {
            *((fut.as_ptr() as *const u8).add(std::mem::size_of::<ffi::PyObject>()) as *const *mut ffi::PyObject)
        })
    }

    /// Learns where the loop of a C future sits from `fut`, made with
    /// `loop=loop_` (only the first such future is looked at).
    pub(crate) fn learn_layout(fut: &Bound<'_, PyAny>, loop_: &Bound<'_, PyAny>) {
        if LOOP_FIELD.load(Ordering::Relaxed) != UNKNOWN {
            return;
        }
        if let Some(field) = first_field(fut) {
            let found = if field == loop_.as_ptr() { VERIFIED } else { ELSEWHERE };
            LOOP_FIELD.store(found, Ordering::Relaxed);
        }
    }

    /// Whether the loop's field is known to be where `belongs_to` reads it.
    #[inline]
    pub(crate) fn layout_known() -> bool {
        LOOP_FIELD.load(Ordering::Relaxed) == VERIFIED
    }

    /// Whether the C future `fut` belongs to `loop_` (false when that
    /// cannot be told).
    #[inline]
    pub(crate) fn belongs_to(fut: &Bound<'_, PyAny>, loop_: &Bound<'_, PyAny>) -> bool {
        layout_known() && first_field(fut) == Some(loop_.as_ptr())
    }

    /// The future methods native code calls (python::future_call0 / 1).
    #[derive(Clone, Copy)]
    pub(crate) enum Method {
        Done,
        Cancelled,
        Result,
        SetResult,
        SetException,
    }

    const METHODS: [&str; 5] = ["done", "cancelled", "result", "set_result", "set_exception"];

    /// Where a C future keeps the attributes set on it, which would shadow
    /// the type's methods.
    #[derive(Clone, Copy)]
    enum Attributes {
        /// Nowhere: it takes none.
        None,
        /// In a dict whose pointer is at this offset (up to 3.12).
        DictAt(isize),
        /// In a dict or inline values the interpreter manages (3.13+).
        #[cfg(Py_3_13)]
        Managed,
    }

    impl Attributes {
        /// Whether `obj` has no attribute of its own.
        ///
        /// # Safety
        /// GIL held; `obj` is a live object of the type this describes.
        #[inline]
        unsafe fn none_on(self, obj: *mut ffi::PyObject) -> bool {
            // SAFETY: per the contract: the type's objects hold a dict pointer
            // at that offset, or a dict the interpreter manages.
            unsafe {
                match self {
                    Attributes::None => true,
                    Attributes::DictAt(offset) => {
                        (*((obj as *const u8).offset(offset) as *const *mut ffi::PyObject)).is_null()
                    }
                    #[cfg(Py_3_13)]
                    Attributes::Managed => {
                        let mut seen = false;
                        PyObject_VisitManagedDict(obj, note_seen, &mut seen as *mut bool as *mut std::ffi::c_void) == 0
                            && !seen
                    }
                }
            }
        }
    }

    /// Where a C future keeps the list of its weak references.
    #[derive(Clone, Copy)]
    enum WeakRefs {
        /// Nowhere: it takes none.
        None,
        /// At this offset from the object: a field of it, or (a negative
        /// offset, from 3.12) in the header CPython keeps before it, where
        /// CPython's own `_PyObject_GET_WEAKREFS_LISTPTR` reads it.
        At(isize),
        /// Somewhere this cannot tell.
        Unknown,
    }

    impl WeakRefs {
        fn of(offset: isize, flags: std::ffi::c_ulong) -> WeakRefs {
            match offset {
                0 => WeakRefs::None,
                off if off > 0 || has_flag(flags, MANAGED_WEAKREF) => WeakRefs::At(off),
                _ => WeakRefs::Unknown,
            }
        }

        /// Whether no weak reference to `obj` exists (false if unknown).
        ///
        /// # Safety
        /// GIL held; `obj` is a live object of the type this describes.
        #[inline]
        unsafe fn none_on(self, obj: *mut ffi::PyObject) -> bool {
            match self {
                WeakRefs::None => true,
                // SAFETY: per the contract, a pointer-sized field at that
                // offset inside the object or its managed header.
                WeakRefs::At(offset) => unsafe {
                    (*((obj as *const u8).offset(offset) as *const *mut ffi::PyObject)).is_null()
                },
                WeakRefs::Unknown => false,
            }
        }
    }

    /// Type flags of later Pythons (None before them).
    #[cfg(Py_3_11)]
    const MANAGED_DICT: Option<std::ffi::c_ulong> = Some(ffi::Py_TPFLAGS_MANAGED_DICT);
    #[cfg(not(Py_3_11))]
    const MANAGED_DICT: Option<std::ffi::c_ulong> = None;
    #[cfg(Py_3_12)]
    const MANAGED_WEAKREF: Option<std::ffi::c_ulong> = Some(ffi::Py_TPFLAGS_MANAGED_WEAKREF);
    #[cfg(not(Py_3_12))]
    const MANAGED_WEAKREF: Option<std::ffi::c_ulong> = None;

    /// Whether `flags` has `flag`, where this Python has such a flag.
    fn has_flag(flags: std::ffi::c_ulong, flag: Option<std::ffi::c_ulong>) -> bool {
        flag.is_some_and(|f| flags & f != 0)
    }

    #[cfg(Py_3_13)]
    extern "C" {
        /// Visits the object's managed dict, or its inline values (public
        /// since 3.13; pyo3's bindings leave it out).
        fn PyObject_VisitManagedDict(
            obj: *mut ffi::PyObject,
            visit: ffi::visitproc,
            arg: *mut std::ffi::c_void,
        ) -> std::ffi::c_int;
    }

    /// A visit callback noting that it was called.
    #[cfg(Py_3_13)]
    unsafe extern "C" fn note_seen(_: *mut ffi::PyObject, seen: *mut std::ffi::c_void) -> std::ffi::c_int {
        // SAFETY: `seen` is the `bool` that `none_on` passed.
        unsafe { *(seen as *mut bool) = true };
        0
    }

    /// What calling the C future type's own methods takes: the type, where
    /// its objects keep attributes, and its methods (method descriptors) in
    /// `Method` order.
    struct OwnMethods {
        tp: *mut ffi::PyTypeObject,
        attributes: Attributes,
        weak_refs: WeakRefs,
        methods: [Py<PyAny>; 5],
    }

    // SAFETY: only read with the GIL held (`own_methods` takes the token);
    // the type pointer is kept alive by `c_future_type`'s reference.
    unsafe impl Send for OwnMethods {}
    // SAFETY: as for Send.
    unsafe impl Sync for OwnMethods {}

    /// None without the C future type, or when this cannot tell where its
    /// objects keep their attributes.
    fn own_methods(py: Python<'_>) -> Option<&OwnMethods> {
        static OWN: PyOnceLock<Option<OwnMethods>> = PyOnceLock::new();
        OWN.get_or_init(py, || {
            let ty = c_future_type(py)?;
            let tp = ty.as_type_ptr();
            // SAFETY: a live type object; its fields are only read.
            let (flags, dict_offset, weak_offset) =
                unsafe { ((*tp).tp_flags, (*tp).tp_dictoffset, (*tp).tp_weaklistoffset) };
            // (Before 3.11 a dict is at tp_dictoffset.)
            let attributes = if has_flag(flags, MANAGED_DICT) {
                #[cfg(Py_3_13)]
                {
                    Attributes::Managed
                }
                #[cfg(not(Py_3_13))]
                return None;
            } else if dict_offset > 0 {
                Attributes::DictAt(dict_offset)
            } else if dict_offset == 0 {
                Attributes::None
            } else {
                return None;
            };
            let found: Vec<Py<PyAny>> = METHODS.iter().filter_map(|n| ty.getattr(*n).ok().map(Bound::unbind)).collect();
            let weak_refs = WeakRefs::of(weak_offset, flags);
            Some(OwnMethods { tp, attributes, weak_refs, methods: found.try_into().ok()? })
        })
        .as_ref()
    }

    /// `fut.method(*arg)` through the C future type's own method when that
    /// is what a lookup on `fut` would find: `fut` is exactly of that type
    /// and has no attribute of its own, as an assignment such as
    /// `fut.set_result = ...` makes. That skips the lookup (about
    /// 150 instructions a call). None when the method must be looked up on
    /// `fut`.
    #[inline]
    pub(crate) fn call_own<'py>(
        fut: &Bound<'py, PyAny>,
        method: Method,
        arg: Option<&Bound<'py, PyAny>>,
    ) -> Option<PyResult<Bound<'py, PyAny>>> {
        let own = own_methods(fut.py())?;
        // SAFETY: `fut` is a live object, asked for its attributes only
        // when it is exactly of the type `attributes` describes.
        let plain = unsafe { ffi::Py_TYPE(fut.as_ptr()) == own.tp && own.attributes.none_on(fut.as_ptr()) };
        if !plain {
            return None;
        }
        let func = &own.methods[method as usize];
        let argv = [fut.as_ptr(), arg.map_or(std::ptr::null_mut(), |a| a.as_ptr())];
        let nargs = if arg.is_some() { 2 } else { 1 };
        // SAFETY: GIL held; the descriptor and the arguments are live
        // objects borrowed for the call; the result is a new reference or
        // NULL with an exception set.
        Some(unsafe {
            Bound::from_owned_ptr_or_err(
                fut.py(),
                ffi::PyObject_Vectorcall(func.as_ptr(), argv.as_ptr(), nargs, std::ptr::null_mut()),
            )
        })
    }
}

// ---- end of section: futures ----
