//! What the HTTP port's handlers share.

use std::sync::Arc;

use crate::config::Cidr;
use crate::server::auth::Authenticator;

/// What the handlers share.
pub struct Http {
    /// The public API, which the REST API calls as the gRPC port does.
    pub api: Arc<crate::server::Api>,
    pub authenticator: Arc<Authenticator>,
    pub metrics: super::metrics::Metrics,
    /// Scrapers that need no credential for `/metrics`.
    pub metrics_allow: Vec<Cidr>,
}
