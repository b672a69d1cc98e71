//! Methods patched on asyncio's own stream classes while the program runs
//! (`mock.patch.object(asyncio.StreamWriter, "writelines")`, as test
//! suites do). asyncio's streams then call the patched method. zuvrs's
//! stream classes put their native methods ahead of asyncio's in the MRO,
//! so they would not: each native method first asks its class's
//! `PatchWatch` whether asyncio's class still holds its own version of
//! that method, or of one the method is built on (`readline` on
//! `readuntil`). If not, the method is asyncio's for this call, found after
//! the native class in the instance's MRO as `super()` finds it: the patch
//! itself, or asyncio's own method, which calls the patched one.
//!
//! A transport that feeds a native reader (the sink, transport/stream/
//! sink.rs) stands in for the protocol's `data_received` and the reader's
//! `feed_data`: it asks too, before each read, and steps aside while
//! either is patched.
//!
//! The question comes with every call, so the answer is kept with the
//! version tag asyncio's class had when it was found. CPython marks a
//! type's tag invalid whenever the type changes (a setattr on it, a patch
//! or its undoing) and gives it a new one at the next attribute lookup
//! through it or a subclass: the same valid tag means asyncio's class is
//! as it was. While its tag is not valid, the class is looked at anew.

use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString, PySuper, PyTuple, PyType};

use crate::cell::NativeCell;

/// The methods of one native class that asyncio's class may have patched.
pub(super) struct PatchWatch {
    config: PyOnceLock<Config>,
    seen: NativeCell<Seen>,
}

struct Config {
    /// The native class (the lookup of a patched method starts after it)
    /// and asyncio's class.
    core: Py<PyType>,
    asyncio_class: Py<PyType>,
    /// Each watched name: asyncio's own attribute by that name when the
    /// watch began (None: it had none), and the bits of the names the
    /// method is built on.
    names: Vec<(Py<PyString>, Option<Py<PyAny>>, u64)>,
}

/// The last answer: asyncio's class (null until the watch starts), its
/// version tag then (0: no answer yet) and the bits of the names patched.
#[derive(Clone, Copy)]
struct Seen {
    class: *mut ffi::PyTypeObject,
    tag: u32,
    patched: u64,
    /// How many times asyncio's class was looked at (the tests' evidence
    /// that an answer is kept while the class is unchanged).
    looks: u64,
}

/// The type's version tag, if it is valid. Up to 3.12 a change of the
/// type clears Py_TPFLAGS_VALID_VERSION_TAG (3.10 leaves the old tag in
/// place); from 3.13 that flag is no longer set, and a change makes the
/// tag 0.
#[inline(always)]
fn valid_tag(tp: *mut ffi::PyTypeObject) -> Option<u32> {
    // SAFETY: `tp` is a live type object (asyncio's class, held by the
    // watch); both fields are plain data, written only with the GIL held.
    let tag = unsafe { (*tp).tp_version_tag };
    #[cfg(not(Py_3_13))]
    // SAFETY: as above.
    let valid = unsafe { (*tp).tp_flags } & ffi::Py_TPFLAGS_VALID_VERSION_TAG != 0;
    #[cfg(Py_3_13)]
    let valid = true;
    (valid && tag != 0).then_some(tag)
}

impl PatchWatch {
    pub(super) const fn new() -> Self {
        PatchWatch {
            config: PyOnceLock::new(),
            seen: NativeCell::new(Seen { class: std::ptr::null_mut(), tag: 0, patched: 0, looks: 0 }),
        }
    }

    /// Starts watching `names` of `asyncio_class` for the native class
    /// `core`; `built_on` maps a name to the names its method is built on.
    fn start(
        &self,
        py: Python<'_>,
        core: Py<PyType>,
        asyncio_class: Py<PyType>,
        names: &Bound<'_, PyTuple>,
        built_on: &Bound<'_, PyDict>,
    ) -> PyResult<()> {
        if names.len() > 64 {
            return Err(pyo3::exceptions::PyValueError::new_err("at most 64 names are watched"));
        }
        let own = asyncio_class.bind(py).getattr(intern!(py, "__dict__"))?;
        let names: Vec<Bound<'_, PyString>> =
            names.iter().map(|n| n.cast_into::<PyString>()).collect::<Result<_, _>>()?;
        let bit_of = |name: &Bound<'_, PyAny>| names.iter().position(|n| n.as_any().eq(name).unwrap_or(false));
        let mut watched = Vec::with_capacity(names.len());
        for name in &names {
            let original = own.call_method1(intern!(py, "get"), (name,))?;
            let mut deps = 0u64;
            if let Some(on) = built_on.get_item(name)? {
                for dep in on.try_iter()? {
                    let dep = dep?;
                    let Some(i) = bit_of(&dep) else {
                        return Err(pyo3::exceptions::PyValueError::new_err(format!("{dep} is not watched")));
                    };
                    deps |= 1 << i;
                }
            }
            watched.push((name.clone().unbind(), (!original.is_none()).then(|| original.unbind()), deps));
        }
        let class = asyncio_class.as_ptr().cast();
        if self.config.set(py, Config { core, asyncio_class, names: watched }).is_ok() {
            self.seen.with(py, |seen| seen.class = class);
        }
        Ok(())
    }

    /// asyncio's `name` for `slf`, if asyncio's class has it (or one it is
    /// built on) patched: then the native method calls this instead.
    #[inline(always)]
    pub(super) fn asyncio_method<'py>(
        &self,
        slf: &Bound<'py, PyAny>,
        name: &str,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        if self.known(slf.py()) == Some(0) {
            return Ok(None);
        }
        self.method_if_patched(slf, name)
    }

    /// Whether asyncio's class has its own `name` (neither it nor what it
    /// is built on patched). A failure to tell counts as patched.
    #[inline(always)]
    pub(super) fn is_own(&self, py: Python<'_>, name: &str) -> bool {
        self.known(py) == Some(0) || self.is_own_after_look(py, name)
    }

    /// The bits of the names patched, if the last answer still holds (no
    /// watch: none patched).
    #[inline(always)]
    fn known(&self, py: Python<'_>) -> Option<u64> {
        let seen = self.seen.with(py, |seen| *seen);
        if seen.class.is_null() {
            return Some(0);
        }
        (valid_tag(seen.class) == Some(seen.tag)).then_some(seen.patched)
    }

    /// The bits of the names patched on asyncio's class.
    fn patched(&self, py: Python<'_>) -> PyResult<u64> {
        match self.known(py) {
            Some(patched) => Ok(patched),
            None => self.look(py),
        }
    }

    #[cold]
    #[inline(never)]
    fn is_own_after_look(&self, py: Python<'_>, name: &str) -> bool {
        match self.patched(py) {
            Ok(patched) => self.bit(py, name).is_none_or(|bit| patched & bit == 0),
            Err(_) => false,
        }
    }

    /// Compares asyncio's class with what it held when the watch began.
    #[cold]
    #[inline(never)]
    fn look(&self, py: Python<'_>) -> PyResult<u64> {
        let Some(c) = self.config.get(py) else { return Ok(0) };
        self.seen.with(py, |seen| seen.looks += 1);
        let class = c.asyncio_class.bind(py);
        let own = class.getattr(intern!(py, "__dict__"))?;
        let mut patched = 0u64;
        for (i, (name, original, _)) in c.names.iter().enumerate() {
            let now = own.call_method1(intern!(py, "get"), (name,))?;
            let same = match original {
                Some(original) => now.is(original),
                None => now.is_none(),
            };
            if !same {
                patched |= 1 << i;
            }
        }
        // What is built on something patched is asyncio's too.
        loop {
            let before = patched;
            for (i, (_, _, deps)) in c.names.iter().enumerate() {
                if deps & patched != 0 {
                    patched |= 1 << i;
                }
            }
            if patched == before {
                break;
            }
        }
        // (A lookup through the class gives it a valid tag again, if it
        // can have one.)
        if let Some((name, _, _)) = c.names.first() {
            let _ = class.getattr(name.bind(py));
        }
        if let Some(tag) = valid_tag(c.asyncio_class.as_ptr().cast()) {
            self.seen.with(py, |seen| {
                seen.tag = tag;
                seen.patched = patched;
            });
        }
        Ok(patched)
    }

    fn bit(&self, py: Python<'_>, name: &str) -> Option<u64> {
        let c = self.config.get(py)?;
        let i = c.names.iter().position(|(n, _, _)| n.bind(py).to_str().is_ok_and(|n| n == name))?;
        Some(1 << i)
    }

    /// asyncio's `name` for `slf` if it is patched (after a look, if the
    /// last answer no longer holds), else None.
    #[cold]
    #[inline(never)]
    fn method_if_patched<'py>(&self, slf: &Bound<'py, PyAny>, name: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
        let py = slf.py();
        let patched = self.patched(py)?;
        let (Some(c), Some(bit)) = (self.config.get(py), self.bit(py, name)) else { return Ok(None) };
        if patched & bit == 0 {
            return Ok(None);
        }
        Ok(Some(PySuper::new(c.core.bind(py), slf)?.getattr(name)?))
    }
}

/// The watches of the three native stream classes.
pub(super) static READER: PatchWatch = PatchWatch::new();
pub(super) static WRITER: PatchWatch = PatchWatch::new();
pub(super) static PROTOCOL: PatchWatch = PatchWatch::new();

/// Starts the watch of a native stream class (`core`, one of the three
/// cores) over `names` of asyncio's class (python/zuvrs/streams.py, once).
#[pyfunction]
pub(super) fn watch_asyncio_patches(
    py: Python<'_>,
    core: Bound<'_, PyType>,
    asyncio_class: Py<PyType>,
    names: &Bound<'_, PyTuple>,
    built_on: &Bound<'_, PyDict>,
) -> PyResult<()> {
    let watch = if core.is(py.get_type::<super::ReaderCore>()) {
        &READER
    } else if core.is(py.get_type::<super::WriterCore>()) {
        &WRITER
    } else if core.is(py.get_type::<super::protocol::ProtocolCore>()) {
        &PROTOCOL
    } else {
        return Err(pyo3::exceptions::PyTypeError::new_err("not a native stream class"));
    };
    watch.start(py, core.unbind(), asyncio_class, names, built_on)
}

/// How many times the watches have looked at asyncio's classes (each
/// look follows a change of one of them, or a class that has no valid
/// version tag).
#[pyfunction]
pub(super) fn asyncio_patch_looks(py: Python<'_>) -> u64 {
    [&READER, &WRITER, &PROTOCOL].iter().map(|w| w.seen.with(py, |seen| seen.looks)).sum()
}

/// In a native method: returns what asyncio's method `$name` returns for
/// `$slf` when asyncio's class has it patched (see the module docs).
macro_rules! asyncio_if_patched {
    ($watch:expr, $slf:expr, $name:literal, $args:expr) => {
        if let Some(method) = $watch.asyncio_method($slf.as_any(), $name)? {
            return Ok(method.call1($args)?.unbind());
        }
    };
}
pub(super) use asyncio_if_patched;
