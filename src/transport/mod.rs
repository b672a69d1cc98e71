//! Transports: the native halves of asyncio transports.
//!
//! Each transport is a Python object deriving from `asyncio.Transport`
//! (python/zuvrs/transports) that holds a native core from here and binds
//! the core's methods as its own, so `transport.write()` goes straight to
//! Rust. The core owns the libuv handle and calls the protocol directly from
//! libuv's callbacks (reads, write completions); what happens once per
//! connection (connection_made, connection_lost, error reports) is Python.
//!
//! - base.rs: what every core shares (asyncio's bookkeeping, the handle box,
//!   the calls into Python, the libuv callback prologue)
//! - stream/: TCP, Unix stream sockets and pipes
//! - datagram.rs: UDP and Unix datagram sockets
//! - readbuf.rs: the buffer reads land in
//! - buffer.rs: borrowing bytes-like objects
//! - methods.rs: a Python transport's method that is its core's

pub(crate) mod base;
pub(crate) mod buffer;
pub(crate) mod datagram;
pub(crate) mod methods;
pub(crate) mod readbuf;
pub(crate) mod stream;
