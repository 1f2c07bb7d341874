//! OpenTelemetry export of the runtime's spans ([`subagents::trace`]) over OTLP/HTTP, when
//! `--otlp-endpoint` or the standard `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) names a collector. Protobuf by default;
//! `OTEL_EXPORTER_OTLP_PROTOCOL=http/json` sends JSON. Spans are exported in batches from a
//! thread of the SDK's own, off the actors' threads; the rest of the standard `OTEL_*`
//! variables (headers, timeout, service name) apply as the OpenTelemetry SDK reads them.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{SpanExporter, WithExportConfig as _};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_subscriber::Layer;

use subagents::{ErrorCode, SubagentError};

/// The variables that name a collector, as the OpenTelemetry SDK reads them.
const ENDPOINT_VARIABLES: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// The variables that choose the protocol, as the OpenTelemetry SDK reads them.
const PROTOCOL_VARIABLES: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
];

/// The span exporter while it runs: dropping it exports what is still batched.
pub(crate) struct Telemetry {
    provider: SdkTracerProvider,
}

impl Telemetry {
    /// Starts exporting when `endpoint` (a collector's base URL, `/v1/traces` appended) or the
    /// standard variables name a collector; `None` when nothing does.
    ///
    /// # Errors
    /// `INVALID_CONFIG` for an endpoint or protocol the exporter cannot use.
    pub(crate) fn start(endpoint: Option<&str>) -> Result<Option<Self>, SubagentError> {
        let named_by_environment = ENDPOINT_VARIABLES
            .iter()
            .any(|name| std::env::var_os(name).is_some_and(|value| !value.is_empty()));
        if endpoint.is_none() && !named_by_environment {
            return Ok(None);
        }
        let mut builder = SpanExporter::builder().with_http();
        // Protobuf unless the standard variables ask for JSON (with both built in, the SDK's
        // own default would be JSON, which not every collector takes).
        let protocol_named = PROTOCOL_VARIABLES
            .iter()
            .any(|name| std::env::var_os(name).is_some_and(|value| !value.is_empty()));
        if !protocol_named {
            builder = builder.with_protocol(opentelemetry_otlp::Protocol::HttpBinary);
        }
        if let Some(endpoint) = endpoint {
            builder =
                builder.with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')));
        }
        let exporter = builder.build().map_err(|error| {
            SubagentError::new(
                ErrorCode::InvalidConfig,
                format!("the OTLP exporter cannot start: {error}"),
            )
        })?;
        let service = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "subagents".to_owned());
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(Resource::builder().with_service_name(service).build())
            .build();
        Ok(Some(Self { provider }))
    }

    /// The layer that hands the runtime's spans to the exporter (only those: a command's own
    /// log lines are not spans).
    pub(crate) fn layer<S>(&self) -> impl Layer<S>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        // Only the conventions' attributes: the source location, thread, target and
        // busy/idle times the layer adds by default cost a tenth of a load run's throughput.
        tracing_opentelemetry::layer()
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_tracked_inactivity(false)
            .with_tracer(self.provider.tracer("subagents"))
            .with_filter(tracing_subscriber::filter::filter_fn(|metadata| {
                metadata.is_span() && metadata.target() == "subagents::trace"
            }))
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        // Exports what is still batched; a collector that is gone loses it, and says so.
        if let Err(error) = self.provider.shutdown() {
            tracing::warn!(%error, "the last spans were not exported");
        }
    }
}
