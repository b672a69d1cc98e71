//! Networking values and set-up, below the transports: socket addresses
//! (addr.rs), name resolution (dns.rs), TCP connect / accept without
//! socket objects (tcp.rs) and Unix servers' socket files (unix_path.rs).

pub(crate) mod addr;
pub(crate) mod dns;
pub(crate) mod tcp;
pub(crate) mod unix_path;
