//! Background tasks that end with their owner: the lease keep-alive, each
//! watch stream and the endpoint sync are stopped by dropping a guard, not
//! by a message, so an owner that goes away by any path stops its task.

use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::Instrument;

/// Spawns the task `start` builds around a cancellation token, and returns
/// the guard whose drop cancels it. The task logs under the caller's span
/// (the engine's per-peer span, for a peer's client).
pub(crate) fn spawn_until_dropped<F>(start: impl FnOnce(CancellationToken) -> F) -> DropGuard
where
    F: Future<Output = ()> + Send + 'static,
{
    let cancel = CancellationToken::new();
    tokio::spawn(start(cancel.clone()).instrument(tracing::Span::current()));
    cancel.drop_guard()
}
