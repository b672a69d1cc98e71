//! The unsafe edge to the operating system (libc): sockets, socket
//! addresses, file descriptors, epoll, processes.
//!
//! Everything here is a safe function or a safe owner type over a libc call;
//! the rest of the crate calls libc only through this module. Each section
//! belongs to the layer that uses it.

// ---- section: name resolution and socket set-up (net) ----

// ---- end of section: net ----

// ---- section: fd watchers and process (eventloop) ----

// ---- end of section: eventloop ----

// ---- section: datagram and stream sockets (transport) ----

// ---- end of section: transport ----
