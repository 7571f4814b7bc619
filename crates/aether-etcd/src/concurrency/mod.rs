//! Sessions, leader election and distributed locks on KV, Lease and Watch.
//!
//! The semantics are those of etcd's Go `concurrency` package, so a Rust
//! process and a Go process can campaign in the same election or queue on
//! the same lock:
//!
//! - A [`Session`] is a lease kept alive in the background. Everything a
//!   session writes is attached to its lease, so it disappears when the
//!   session closes or its holder dies and the lease runs out.
//! - An [`Election`] or a [`Mutex`] on prefix `p` writes one key per session,
//!   `p/<lease id in hex>`. The keys queue by create revision: the oldest one
//!   leads (or holds the lock). A waiter watches only the key created just
//!   before its own, so a release wakes one waiter, not the whole queue.
//! - The same session campaigning (or locking) twice on one prefix finds its
//!   own key and carries on from it: that is Go's re-entrancy, and what lets a
//!   process resume a candidacy with [`Election::resume`].
//!
//! Dropping a `campaign()` or `lock()` future while it waits withdraws its
//! key, as Go's package does when the context is cancelled: the drop
//! starts a task that deletes the key if it still has the create revision
//! this wait made (a `Drop` cannot await the request itself). The write
//! that queues the key runs in a task of its own for the same reason: a
//! future dropped while that write is on its way never learns the key's
//! revision, so the task withdraws the key it created. Without a
//! runtime, or if that request fails, the key goes with the session's
//! lease. A lock already held or a campaign already won stays so:
//! [`Mutex::unlock`] and [`Election::resign`] release them.
//!
//! etcd's v3election and v3lock gRPC services (the same package run inside
//! the server) are not used: a campaign there is one long unary call, which
//! a per-request timeout cuts short and a reconnect loses, while here each
//! step is an ordinary request and the wait is a watch that resumes.

mod election;
mod mutex;
mod session;
mod wait;

pub use election::{Election, Observe};
pub use mutex::Mutex;
pub use session::{DEFAULT_SESSION_TTL, Session, SessionOptions};
