//! Transports: the native halves of asyncio transports.
//!
//! Each transport is a Python object deriving from `asyncio.Transport`
//! (python/zuvrs/_transports.py) that holds a native core from here and binds
//! the core's methods as its own, so `transport.write()` goes straight to
//! Rust. The core owns the libuv handle and calls the protocol directly from
//! libuv's callbacks (reads, write completions); what happens once per
//! connection (connection_made, connection_lost, error reports) is Python.

pub(crate) mod datagram;
pub(crate) mod methods;
pub(crate) mod stream;
pub(crate) mod tcp;
pub(crate) mod udp;
