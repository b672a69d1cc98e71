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

// ---- end of section: transport ----

// ---- section: native streams (streams) ----

// ---- end of section: streams ----
