//! What the loop knows of the native objects that live on it (transport
//! cores, name lookups in flight): the `LoopClient` trait, and nothing else.
//!
//! A client registers while it has a libuv handle or request on the loop,
//! so that a loop closing first closes it too; and it asks for
//! `before_poll` when it has work for the end of the turn (writes to flush,
//! reads to re-arm). The loop depends on no transport this way: transports
//! depend on the loop.

use std::collections::HashSet;
use std::hash::{Hash, Hasher};

use pyo3::prelude::*;

pub(crate) trait LoopClient {
    /// The work asked for with `LoopShared::before_poll`, run once just
    /// before the loop next polls (the end of the turn).
    fn before_poll(&self, py: Python<'_>) -> PyResult<()>;

    /// The loop is closing while the client is registered: close its libuv
    /// handle or cancel its request now, and let go of Python objects that
    /// the completion would have used.
    fn close_with_loop(&self, py: Python<'_>);

    /// The loop's periodic housekeeping, for a client that asked for it
    /// (`LoopShared::want_housekeeping`): true to be asked again next
    /// period, false to leave the housekeeping list.
    fn housekeeping(&self, _py: Python<'_>) -> bool {
        false
    }
}

/// A registered client. It stays valid while registered: a client
/// unregisters before it is freed.
#[derive(Clone, Copy)]
pub(crate) struct ClientPtr(pub(crate) *const dyn LoopClient);

impl ClientPtr {
    fn addr(&self) -> *const () {
        self.0 as *const ()
    }
}

impl PartialEq for ClientPtr {
    fn eq(&self, other: &Self) -> bool {
        self.addr() == other.addr()
    }
}

impl Eq for ClientPtr {}

impl Hash for ClientPtr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.addr().hash(state)
    }
}

/// The loop's clients: those open on it, and those due before the next poll.
#[derive(Default)]
pub(crate) struct Clients {
    open: HashSet<ClientPtr>,
    /// Open clients that want the periodic housekeeping.
    housekeeping: HashSet<ClientPtr>,
    /// Each with the Python object that keeps it alive until then.
    due: Vec<(Py<PyAny>, ClientPtr)>,
    /// The list the last due clients were run from, emptied and kept for
    /// the next ones: a loop whose transports write every turn would
    /// otherwise allocate and free a list per turn.
    spare: Vec<(Py<PyAny>, ClientPtr)>,
}

impl Clients {
    pub(crate) fn register(&mut self, client: ClientPtr) {
        self.open.insert(client);
    }

    pub(crate) fn unregister(&mut self, client: ClientPtr) {
        self.open.remove(&client);
        self.housekeeping.remove(&client);
    }

    /// Adds an open client to the housekeeping list; whether the list was
    /// empty before (the period's timer is to start).
    pub(crate) fn want_housekeeping(&mut self, client: ClientPtr) -> bool {
        if !self.open.contains(&client) {
            return false;
        }
        let was_empty = self.housekeeping.is_empty();
        self.housekeeping.insert(client);
        was_empty
    }

    /// The clients on the housekeeping list now.
    pub(crate) fn housekeeping_list(&self) -> Vec<ClientPtr> {
        self.housekeeping.iter().copied().collect()
    }

    pub(crate) fn is_housekeeping(&self, client: ClientPtr) -> bool {
        self.housekeeping.contains(&client)
    }

    /// Takes `client` off the housekeeping list.
    pub(crate) fn housekeeping_done(&mut self, client: ClientPtr) {
        self.housekeeping.remove(&client);
    }

    pub(crate) fn housekeeping_is_empty(&self) -> bool {
        self.housekeeping.is_empty()
    }

    pub(crate) fn add_due(&mut self, keep_alive: Py<PyAny>, client: ClientPtr) {
        self.due.push((keep_alive, client));
    }

    /// The clients due now, if any (those that ask while they run are due
    /// next). The list goes back with `give_back` once run.
    pub(crate) fn take_due(&mut self) -> Option<Vec<(Py<PyAny>, ClientPtr)>> {
        if self.due.is_empty() {
            return None;
        }
        let spare = std::mem::take(&mut self.spare);
        Some(std::mem::replace(&mut self.due, spare))
    }

    /// The list `take_due` gave, run and emptied (its capacity is reused).
    pub(crate) fn give_back(&mut self, list: Vec<(Py<PyAny>, ClientPtr)>) {
        debug_assert!(list.is_empty());
        if list.capacity() > self.spare.capacity() {
            self.spare = list;
        }
    }

    /// Everything, for the loop's close.
    pub(crate) fn take_all(&mut self) -> (Vec<ClientPtr>, Vec<(Py<PyAny>, ClientPtr)>) {
        self.housekeeping.clear();
        (self.open.drain().collect(), std::mem::take(&mut self.due))
    }
}
