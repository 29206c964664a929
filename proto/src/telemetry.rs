//! What every Quorum process logs and traces: `tracing`'s events as text or JSON lines, and,
//! when an OTLP endpoint is configured, its spans exported with OpenTelemetry (OTLP over gRPC).
//! A trace crosses processes as a W3C `traceparent` value: in gRPC metadata (a client's submit,
//! a follower forwarding it) and in the leader's launch messages to agents, so that one submit is
//! one trace from the client to the job's start on its nodes.

pub mod gauges;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// The metadata key (and HTTP header) of the W3C trace context.
pub const TRACEPARENT: &str = "traceparent";

/// The variable that names the OTLP endpoint (OpenTelemetry's own name for it).
pub const OTLP_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

/// The spans exported: Quorum's own, at `info` (a submit's, a launch's, a job's).
const TRACED: &str = "warn,quorum_control=info,quorum_agent=info,quorum_client=info,quorum_dev=info";

static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Whether this process exports spans: without an exporter, no trace context is made or kept.
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// How a process logs and traces.
pub struct Logging<'a> {
    /// The process's name in traces (`quorum-controller`, `quorum-agent`).
    pub service: &'a str,
    /// `text` or `json`.
    pub format: &'a str,
    /// The filter when `RUST_LOG` is not set.
    pub default_filter: &'a str,
    /// Log to stderr rather than stdout.
    pub stderr: bool,
    /// Where to export spans (`http://collector:4317`); none: spans are not exported.
    pub otlp_endpoint: Option<&'a str>,
}

/// Exports what is left when dropped (at the end of `main`).
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            if let Err(e) = provider.shutdown() {
                eprintln!("exporting the last spans: {e}");
            }
        }
    }
}

/// Installs this process's logging (and tracing when `otlp_endpoint` is set). Call it once, in
/// a Tokio runtime (the exporter's gRPC client needs one).
pub fn init(logging: Logging) -> Result<Telemetry, String> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(logging.default_filter));
    let fmt = tracing_subscriber::fmt::layer();
    let fmt = match (logging.format, logging.stderr) {
        ("json", false) => fmt.json().boxed(),
        ("json", true) => fmt.json().with_writer(std::io::stderr).boxed(),
        (_, false) => fmt.boxed(),
        (_, true) => fmt.with_writer(std::io::stderr).boxed(),
    };
    // The log's filter is the log's alone: spans are exported whatever it lets through.
    let logs = tracing_subscriber::registry().with(fmt.with_filter(filter));
    let (otel, provider) = match logging.otlp_endpoint.filter(|e| !e.is_empty()) {
        Some(endpoint) => {
            let (layer, provider) = otlp_layer(logging.service, endpoint)?;
            (Some(layer.with_filter(tracing_subscriber::EnvFilter::new(TRACED))), Some(provider))
        }
        None => (None, None),
    };
    logs.with(otel).try_init().map_err(|e| format!("installing the logger: {e}"))?;
    Ok(Telemetry { provider })
}

/// The layer that exports spans to `endpoint` as `service`, and the provider that flushes them:
/// for [`init`], and for a test that installs a subscriber of its own.
pub fn otlp_layer<S>(service: &str, endpoint: &str) -> Result<(impl Layer<S>, SdkTracerProvider), String>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    use opentelemetry_otlp::WithExportConfig;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| format!("the OTLP exporter for {endpoint}: {e}"))?;
    let resource = opentelemetry_sdk::Resource::builder().with_service_name(service.to_string()).build();
    let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
    let tracer = provider.tracer("quorum");
    EXPORTING.store(true, Ordering::Relaxed);
    Ok((tracing_opentelemetry::layer().with_tracer(tracer), provider))
}

/// Makes `span` a child of the span `traceparent` names (a W3C `traceparent` value); nothing
/// when it is empty or malformed, or when nothing is exported.
pub fn continue_trace(span: &tracing::Span, traceparent: &str) {
    if traceparent.is_empty() || !exporting() {
        return;
    }
    let carrier = HashMap::from([(TRACEPARENT.to_string(), traceparent.to_string())]);
    let parent = TraceContextPropagator::new().extract(&carrier);
    // A span that is not recorded (filtered out) has no context to set: nothing to do.
    let _ = span.set_parent(parent);
}

/// The W3C `traceparent` of `span`, for the next process to continue its trace; empty when
/// nothing is exported.
pub fn traceparent(span: &tracing::Span) -> String {
    if !exporting() {
        return String::new();
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&span.context(), &mut carrier);
    carrier.remove(TRACEPARENT).unwrap_or_default()
}

/// The `traceparent` a gRPC request carries (empty when none).
pub fn traceparent_of(metadata: &tonic::metadata::MetadataMap) -> &str {
    metadata.get(TRACEPARENT).and_then(|v| v.to_str().ok()).unwrap_or("")
}

/// Carries `span`'s trace on in a request's metadata (nothing when nothing is exported).
pub fn carry(span: &tracing::Span, metadata: &mut tonic::metadata::MetadataMap) {
    if let Ok(value) = tonic::metadata::MetadataValue::try_from(traceparent(span)) {
        if !value.is_empty() {
            metadata.insert(TRACEPARENT, value);
        }
    }
}
