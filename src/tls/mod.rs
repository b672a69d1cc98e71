//! Native TLS: the engine a TLS stream transport drives, on the user's own
//! `ssl.SSLContext`.
//!
//! The stdlib makes each connection's objects (`context.wrap_bio(incoming,
//! outgoing, server_side=..., server_hostname=...)` with two
//! `ssl.MemoryBIO`s), so SNI callbacks, verification, check_hostname, ALPN,
//! sessions, `getpeercert()` and `get_extra_info('ssl_object')` are the
//! stdlib's own. zuvrs then drives the connection's `SSL *` itself: no
//! Python call per record. Where that cannot be proven safe (another
//! OpenSSL than `_ssl`'s, an object layout not verified for this
//! interpreter, an SSLObject subclass overriding what is driven here), the
//! caller falls back to asyncio's sslproto.
//!
//! - `ossl`: the OpenSSL functions, resolved through `_ssl` itself, and
//!   every unsafe step: OpenSSL calls, reads of `_ssl`'s objects, the
//!   memory TLS reads decrypt into.
//! - `layout`: CPython's `_ssl` structs, and the checks on an SSLObject.
//! - `verdict`: the once-per-process proof that the functions are `_ssl`'s
//!   and the layouts hold.
//! - `errors`: the stdlib's exceptions, built natively the way `_ssl` does.
//! - `session`: `TlsSession`, one connection.
//! - `engine`: `_zuvrs._TlsEngine`, the session's face for tests.

mod engine;
mod errors;
mod layout;
mod ossl;
mod session;
mod verdict;

pub(crate) use engine::TlsEngine;
#[allow(unused_imports)]
pub(crate) use errors::is_again;
pub(crate) use ossl::{UniqueBytes, WritableBuffer};
#[allow(unused_imports)]
pub(crate) use session::{Decrypted, Handshake, Opened, Shutdown, TlsSession, Write, MAX_RECORD};
