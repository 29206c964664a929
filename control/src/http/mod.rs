//! The replica's HTTP port (`[http] listen`): `/metrics`, the replica's metrics in the
//! OpenMetrics text format for Prometheus ([`metrics`]), the REST API under `/api/v1`
//! ([`rest`]), and the dashboard at `/` ([`dashboard`]).
//!
//! HTTPS with the replica's certificate (HTTP/2 and HTTP/1.1) unless the cluster runs insecure.
//! A caller proves who it is as on the gRPC port, with `Authorization: Bearer <token>` (from
//! `quorum token`) or `Authorization: MUNGE <credential>`; nothing is taken on trust from the
//! connection, not even over plaintext. `/metrics` is for operators and administrators, and for
//! scrapers from the address ranges `[http] metrics_allow` names.

pub mod dashboard;
pub mod metrics;
pub mod rest;
mod shared;

pub use shared::Http;

use std::sync::Arc;

use axum::extract::{Extension, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use quorum_auth::listener::{Conn, Peer};
use quorum_auth::Role;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::StreamExt;
use tonic::transport::server::Connected;

use crate::security::Security;

/// Serves `listener` until `stop` turns true.
pub async fn serve(http: Arc<Http>, security: Arc<Security>, listener: TcpListener, mut stop: watch::Receiver<bool>) {
    let router =
        Router::new().route("/metrics", get(scrape)).merge(rest::routes()).merge(dashboard::routes()).with_state(http);
    let mut incoming = quorum_auth::listener::incoming(listener, security.mode, security.http_tls.clone());
    loop {
        let conn: Conn = tokio::select! {
            next = incoming.next() => match next {
                Some(Ok(conn)) => conn,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "HTTP port: accepting a connection");
                    continue;
                }
                None => return,
            },
            _ = stop.wait_for(|s| *s) => return,
        };
        let service = TowerToHyperService::new(router.clone().layer(Extension(conn.connect_info())));
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let serving = builder.serve_connection_with_upgrades(TokioIo::new(conn), service);
            tokio::pin!(serving);
            tokio::select! {
                served = serving.as_mut() => {
                    if let Err(e) = served {
                        tracing::debug!(error = %e, "HTTP connection");
                    }
                }
                _ = stop.wait_for(|s| *s) => {}
            }
        });
    }
}

/// An answer in plain text, as Prometheus and `curl` show it.
fn plain(status: StatusCode, text: impl Into<String>) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], format!("{}\n", text.into())).into_response()
}

/// The caller may read `/metrics`: an allowed scraper's address, or an operator's credential.
fn may_scrape(http: &Http, headers: &HeaderMap, peer: &Peer) -> Result<(), Response> {
    if peer.addr.is_some_and(|a| http.metrics_allow.iter().any(|c| c.contains(a.ip()))) {
        return Ok(());
    }
    let caller =
        http.authenticator.http_caller(headers, peer).map_err(|e| plain(StatusCode::UNAUTHORIZED, e.message()))?;
    if !caller.at_least(Role::Operator) {
        let who = &caller.user;
        return Err(plain(
            StatusCode::FORBIDDEN,
            format!("/metrics is for operators and administrators ({who} is neither), or for the scrapers [http] metrics_allow names"),
        ));
    }
    Ok(())
}

async fn scrape(State(http): State<Arc<Http>>, Extension(peer): Extension<Peer>, headers: HeaderMap) -> Response {
    if let Err(refused) = may_scrape(&http, &headers, &peer) {
        return refused;
    }
    match http.metrics.encode() {
        Ok(text) => ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text)
            .into_response(),
        Err(e) => plain(StatusCode::INTERNAL_SERVER_ERROR, format!("encoding the metrics: {e}")),
    }
}
