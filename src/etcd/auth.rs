//! The auth service. Today it only fetches a token: the transport owns the
//! token (every call needs it, and an expired one is renewed in the middle
//! of a call), so fetching one is the transport's job and this service
//! hands it on. User and role management would live here.

use super::error::Result;
use super::transport::Transport;

/// The auth service on a transport.
#[derive(Clone)]
pub(crate) struct AuthClient {
    transport: Transport,
}

impl AuthClient {
    pub(crate) fn new(transport: Transport) -> AuthClient {
        AuthClient { transport }
    }

    pub(crate) async fn authenticate(&self) -> Result<()> {
        self.transport.authenticate().await
    }
}
