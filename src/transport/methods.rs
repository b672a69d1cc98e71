//! `CoreMethod`: a transport method that is its native core's.
//!
//! A Python transport forwards its hot methods (write, close, ...) to its
//! native core. Forwarding through a Python method would cost a frame per
//! call, and binding every core method on every new transport costs a
//! method object each (most never called on a short connection, and each
//! one a GC-tracked allocation). A `CoreMethod` class attribute does it on
//! first use instead: it looks the method up on `instance._core` and stores
//! the bound method in the instance's `__dict__`, where every later lookup
//! finds it (a descriptor without `__set__` yields to the instance dict).

use pyo3::prelude::*;
use pyo3::types::{PyString, PyType};

#[pyclass(module = "zuvrs._zuvrs", frozen)]
pub(crate) struct CoreMethod {
    name: Py<PyString>,
}

#[pymethods]
impl CoreMethod {
    #[new]
    fn new(name: Py<PyString>) -> Self {
        CoreMethod { name }
    }

    fn __get__(
        slf: &Bound<'_, Self>,
        instance: &Bound<'_, PyAny>,
        _owner: Option<&Bound<'_, PyType>>,
    ) -> PyResult<Py<PyAny>> {
        if instance.is_none() {
            return Ok(slf.clone().into_any().unbind());
        }
        let py = slf.py();
        let name = slf.get().name.bind(py);
        let method = instance.getattr(crate::python::transport::_core(py))?.getattr(name)?;
        instance.setattr(name, &method)?;
        Ok(method.unbind())
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!("<core method {}>", self.name.bind(py))
    }
}
