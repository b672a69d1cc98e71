//! Networking values and set-up, below the transports: socket addresses
//! (addr.rs), name resolution (dns.rs) and TCP connect / accept without
//! socket objects (tcp.rs).

pub(crate) mod addr;
pub(crate) mod dns;
pub(crate) mod tcp;
