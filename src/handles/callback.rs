//! A pending call: the function and its positional arguments, as owned
//! references. The references themselves, how they are held in one word and
//! how the call is made are `capi::handles::Callback`; how it is called
//! inside a context is `context::run_in_context`. This adds what Python code
//! sees of a callback.

use pyo3::prelude::*;
use pyo3::types::PyTuple;
use pyo3::{PyTraverseError, PyVisit};

pub(crate) use crate::capi::handles::Callback;

impl Callback {
    /// The positional arguments as a new tuple (for repr and error reports).
    pub(crate) fn args_tuple<'py>(&self, py: Python<'py>) -> Bound<'py, PyTuple> {
        PyTuple::new(py, self.args().iter().map(|a| a.bind(py))).expect("tuple of borrowed objects")
    }

    /// Reports the references to the cyclic GC.
    pub(crate) fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(self.function())?;
        for a in self.args() {
            visit.call(a)?;
        }
        Ok(())
    }
}
