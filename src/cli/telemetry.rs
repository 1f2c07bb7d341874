//! OpenTelemetry export of the runtime's spans ([`subagents::trace`]) and metrics
//! ([`subagents::metrics`]) over OTLP/HTTP, when `--otlp-endpoint` or the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or the per-signal `…_TRACES_ENDPOINT` / `…_METRICS_ENDPOINT`)
//! names a collector; and the metrics in Prometheus's text format, for `subagents node
//! --metrics-addr`. Protobuf by default; `OTEL_EXPORTER_OTLP_PROTOCOL=http/json` sends JSON.
//! Spans are exported in batches and metrics every `OTEL_METRIC_EXPORT_INTERVAL` ms (60 s by
//! default), from threads of the SDK's own, off the actors' threads. An `https://` collector
//! whose certificate a private authority signed is trusted through
//! `OTEL_EXPORTER_OTLP_CERTIFICATE` (or the per-signal variable), a PEM file, and one that asks
//! for a client certificate gets `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE` and `…_CLIENT_KEY`.
//! The rest of the standard `OTEL_*` variables (headers, timeout, service name) apply as the
//! OpenTelemetry SDK reads them. Both are exported a last time at exit.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use opentelemetry::metrics::{Meter, MeterProvider as _};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{MetricExporter, SpanExporter, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use tracing_subscriber::filter::FilterFn;
use tracing_subscriber::Layer;

use subagents::{ErrorCode, RuntimeBuilder, SubagentError};

use super::span_loss::{Exiting, LossReporting};

/// The exported signals, and the standard variables that configure each.
#[derive(Clone, Copy)]
enum Signal {
    Traces,
    Metrics,
}

impl Signal {
    /// The collector's path for the signal, appended to `--otlp-endpoint`.
    fn path(self) -> &'static str {
        match self {
            Self::Traces => "/v1/traces",
            Self::Metrics => "/v1/metrics",
        }
    }

    /// The first of the standard variables for `setting` (`ENDPOINT`, `PROTOCOL`, …) that is
    /// set, with its value: the signal's own (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) before the
    /// shared one (`OTEL_EXPORTER_OTLP_ENDPOINT`), as the OpenTelemetry SDK reads them.
    fn setting(self, setting: &str) -> Option<(String, String)> {
        let signal = match self {
            Self::Traces => "TRACES",
            Self::Metrics => "METRICS",
        };
        [
            format!("OTEL_EXPORTER_OTLP_{signal}_{setting}"),
            format!("OTEL_EXPORTER_OTLP_{setting}"),
        ]
        .into_iter()
        .find_map(|name| {
            let value = std::env::var(&name)
                .ok()
                .filter(|value| !value.is_empty())?;
            Some((name, value))
        })
    }

    /// Whether the signal is exported: `--otlp-endpoint` or its variables name a collector.
    fn exported(self, endpoint: Option<&str>) -> bool {
        endpoint.is_some() || self.setting("ENDPOINT").is_some()
    }

    /// The exporter's endpoint when `--otlp-endpoint` names it (otherwise the variables do).
    fn endpoint(self, endpoint: Option<&str>) -> Option<String> {
        endpoint.map(|base| self.under(base))
    }

    /// The signal's URL under a collector's base URL.
    fn under(self, base: &str) -> String {
        format!("{}{}", base.trim_end_matches('/'), self.path())
    }

    /// Where the signal is sent, as a log line names it: `--otlp-endpoint` with the signal's
    /// path, else the signal's own variable, else the shared one with the path, else the
    /// SDK's default.
    fn collector(self, endpoint: Option<&str>) -> String {
        if let Some(url) = self.endpoint(endpoint) {
            return url;
        }
        match self.setting("ENDPOINT") {
            Some((name, url)) if name == "OTEL_EXPORTER_OTLP_ENDPOINT" => self.under(&url),
            Some((_, url)) => url,
            None => format!("http://localhost:4318{}", self.path()),
        }
    }

    /// Protobuf unless the standard variables ask for JSON (with both built in, the SDK's own
    /// default would be JSON, which not every collector takes).
    ///
    /// # Errors
    /// `INVALID_CONFIG` for any other protocol, `grpc` included: this build exports over HTTP
    /// only, and would otherwise send HTTP to whatever port the user chose for gRPC.
    fn protocol(self) -> Result<opentelemetry_otlp::Protocol, SubagentError> {
        use opentelemetry_otlp::Protocol;
        let asked = self.setting("PROTOCOL");
        match asked.as_ref().map(|(name, value)| (name, value.as_str())) {
            None | Some((_, "http/protobuf")) => Ok(Protocol::HttpBinary),
            Some((_, "http/json")) => Ok(Protocol::HttpJson),
            Some((name, value)) => Err(SubagentError::new(
                ErrorCode::InvalidConfig,
                format!(
                    "{name}={value}: this build exports OTLP over HTTP only, as `http/protobuf` \
                     (the default) or `http/json`, to a collector's HTTP port (4318 by \
                     convention)"
                ),
            )),
        }
    }

    /// An HTTP client for a collector the standard TLS variables configure: the authorities
    /// `…_CERTIFICATE` names trusted besides the system's roots, and the client certificate
    /// and key `…_CLIENT_CERTIFICATE` and `…_CLIENT_KEY` name presented (mutual TLS), each a
    /// PEM file; it waits as long as `…_TIMEOUT` says (10 s by default, the SDK's own). For a
    /// collector reached over plain HTTP (`endpoint`, else the variables, else the SDK's default
    /// `http://localhost:4318`) with no TLS variable set, the client trusts no authority at all:
    /// it never makes a TLS connection, and reading the system's roots cost each exporter
    /// about 19 M instructions at startup (what the spans of some 200 children cost).
    ///
    /// # Errors
    /// `INVALID_CONFIG` for a file that cannot be read or holds nothing of its kind, a client
    /// certificate without its key or the other way round, or a timeout that is not a number
    /// of milliseconds.
    fn http_client(
        self,
        endpoint: Option<&str>,
    ) -> Result<reqwest_otlp::blocking::Client, SubagentError> {
        let authorities = self.setting("CERTIFICATE");
        let identity = (
            self.setting("CLIENT_CERTIFICATE"),
            self.setting("CLIENT_KEY"),
        );
        let mut client = reqwest_otlp::blocking::Client::builder().timeout(self.timeout()?);
        let collector = endpoint
            .map(str::to_owned)
            .or_else(|| self.setting("ENDPOINT").map(|(_, value)| value));
        if authorities.is_none()
            && matches!(identity, (None, None))
            && !collector.as_deref().is_some_and(is_https)
        {
            client = client.tls_certs_only(std::iter::empty());
        }
        if let Some((name, path)) = &authorities {
            let certificates = reqwest_otlp::Certificate::from_pem_bundle(&read(name, path)?)
                .map_err(|error| unusable(name, path, error))?;
            if certificates.is_empty() {
                return Err(unusable(name, path, "the file holds no PEM certificate"));
            }
            for certificate in certificates {
                client = client.add_root_certificate(certificate);
            }
        }
        match &identity {
            (None, None) => {}
            (Some((certificate, certificate_path)), Some((key, key_path))) => {
                let mut pem = read(certificate, certificate_path)?;
                pem.push(b'\n');
                pem.extend(read(key, key_path)?);
                let identity = reqwest_otlp::Identity::from_pem(&pem).map_err(|error| {
                    unusable(
                        certificate,
                        certificate_path,
                        format!("with {key}: {error}"),
                    )
                })?;
                client = client.identity(identity);
            }
            (Some((name, _)), None) | (None, Some((name, _))) => {
                return Err(SubagentError::new(
                    ErrorCode::InvalidConfig,
                    format!(
                        "{name} is set alone: a client certificate needs its key, and a key \
                         its certificate"
                    ),
                ));
            }
        }
        client.build().map_err(|error| {
            SubagentError::new(
                ErrorCode::InvalidConfig,
                format!("the OTLP exporter's HTTP client cannot start: {error}"),
            )
        })
    }

    /// `builder`, the signal's HTTP exporter, with its protocol, its HTTP client and, when
    /// `--otlp-endpoint` names the collector, its endpoint (otherwise the SDK reads the
    /// variables).
    ///
    /// # Errors
    /// `INVALID_CONFIG` as [`Signal::protocol`] and [`Signal::http_client`] say.
    fn configure<B: WithExportConfig + WithHttpConfig>(
        self,
        builder: B,
        endpoint: Option<&str>,
    ) -> Result<B, SubagentError> {
        let builder = builder
            .with_protocol(self.protocol()?)
            .with_http_client(self.http_client(endpoint)?);
        Ok(match self.endpoint(endpoint) {
            Some(endpoint) => builder.with_endpoint(endpoint),
            None => builder,
        })
    }

    /// How long one export waits, as `…_TIMEOUT` says in milliseconds (10 s by default).
    fn timeout(self) -> Result<std::time::Duration, SubagentError> {
        let Some((name, value)) = self.setting("TIMEOUT") else {
            return Ok(std::time::Duration::from_secs(10));
        };
        value
            .parse()
            .map(std::time::Duration::from_millis)
            .map_err(|_| {
                SubagentError::new(
                    ErrorCode::InvalidConfig,
                    format!("{name}={value}: not a number of milliseconds"),
                )
            })
    }
}

/// The bytes of the file variable `name` names.
fn read(name: &str, path: &str) -> Result<Vec<u8>, SubagentError> {
    std::fs::read(path).map_err(|error| unusable(name, path, error))
}

/// The file `path` that variable `name` names cannot be used, for `why`.
fn unusable(name: &str, path: &str, why: impl std::fmt::Display) -> SubagentError {
    SubagentError::new(ErrorCode::InvalidConfig, format!("{name}={path}: {why}"))
}

/// How many finished spans of a [`SpanVolume::Heavy`] command wait for export before more are
/// dropped (unless `OTEL_BSP_MAX_QUEUE_SIZE` says): two seconds of a load run's spans. The
/// SDK allocates and touches the whole queue at start, about 26 MiB.
const SPAN_QUEUE: usize = 65_536;

/// How many spans a command makes, which sizes its export queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SpanVolume {
    /// A load run or a cluster node: tens of thousands of spans a second, in bursts the
    /// export thread can fall behind on.
    Heavy,
    /// One agent or one delegation at a time (`acp-agent`, `demo`, `delegate`, …): the SDK's
    /// default queue (2,048 spans) holds seconds of them, and an `acp-agent` process per
    /// out-of-process child does not each hold [`SPAN_QUEUE`]'s 26 MiB.
    Light,
}

impl SpanVolume {
    /// The export queue's size; `None` leaves it to the SDK (its default, or
    /// `OTEL_BSP_MAX_QUEUE_SIZE` when `configured`).
    fn queue(self, configured: bool) -> Option<usize> {
        match self {
            Self::Heavy if !configured => Some(SPAN_QUEUE),
            Self::Heavy | Self::Light => None,
        }
    }
}

/// What a command records its runtime's metrics with, once [`Telemetry::start`] set it up.
static METRICS: OnceLock<Metrics> = OnceLock::new();

/// The process's meter, and the registry a Prometheus endpoint reads.
struct Metrics {
    meter: Meter,
    prometheus: Option<prometheus::Registry>,
}

/// The exporters while they run: dropping them exports what is still batched.
pub(crate) struct Telemetry {
    traces: Option<SdkTracerProvider>,
    metrics: Option<SdkMeterProvider>,
    /// Begun when this is dropped, before the providers shut down.
    exiting: Exiting,
}

impl Telemetry {
    /// Starts exporting spans and metrics when `endpoint` (a collector's base URL, the
    /// signal's path appended) or the standard variables name a collector, and records
    /// metrics for a Prometheus endpoint when `prometheus` is set; `None` when nothing is
    /// exported. `volume` sizes the queue spans wait in for export.
    ///
    /// # Errors
    /// `INVALID_CONFIG` for an endpoint or protocol an exporter cannot use.
    pub(crate) fn start(
        endpoint: Option<&str>,
        prometheus: bool,
        volume: SpanVolume,
    ) -> Result<Option<Self>, SubagentError> {
        let traces = Signal::Traces.exported(endpoint);
        let metrics = Signal::Metrics.exported(endpoint);
        if !traces && !metrics && !prometheus {
            return Ok(None);
        }
        // The exporters' HTTP client speaks TLS through rustls, which needs its cryptography
        // chosen for the process; one chosen already (by a host) stays.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let resource = Resource::builder()
            .with_service_name(service_name())
            .build();
        let exiting = Exiting::default();
        let traces = traces
            .then(|| span_provider(endpoint, resource.clone(), volume, exiting.clone()))
            .transpose()?;
        let metrics = (metrics || prometheus)
            .then(|| meter_provider(endpoint.filter(|_| metrics), metrics, prometheus, resource))
            .transpose()?;
        Ok(Some(Self {
            traces,
            metrics,
            exiting,
        }))
    }

    /// The layer that hands the runtime's spans and their events (follow-ups, interrupts,
    /// reports) to the exporter (only those: a command's own log lines are not exported); none
    /// when spans are not exported.
    pub(crate) fn layer<S>(&self) -> Option<impl Layer<S>>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        let provider = self.traces.as_ref()?;
        // Only the conventions' attributes: the source location, thread, target and
        // busy/idle times the layer adds by default cost a tenth of a load run's throughput.
        // Nothing in this process reads OpenTelemetry's current context (the runtime reads a
        // span's own), so entering a span need not make its context current.
        Some(
            tracing_opentelemetry::layer()
                .with_location(false)
                .with_threads(false)
                .with_target(false)
                .with_tracked_inactivity(false)
                .with_context_activation(false)
                .with_tracer(provider.tracer("subagents"))
                .with_filter(exported_spans()),
        )
    }
}

/// The runtime's spans and their events, all at `INFO` (`subagents::trace`).
///
/// The level hint matters beyond this layer: the subscriber's hint is the level the `log`
/// facade is bridged at. Without one it is `TRACE`, and every `log::trace!` of a dependency
/// (sled's write and flush paths have many) is dispatched to the layers only to be refused: a
/// third of what exporting cost the main job.
fn exported_spans() -> FilterFn<impl Fn(&tracing::Metadata<'_>) -> bool> {
    tracing_subscriber::filter::filter_fn(|metadata| metadata.target() == "subagents::trace")
        .with_max_level_hint(tracing::Level::INFO)
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        // Exports what is still batched; a collector that is gone loses it, and says so.
        self.exiting.begin();
        if let Some(traces) = &self.traces {
            if let Err(error) = traces.shutdown() {
                tracing::warn!(%error, "the last spans were not exported");
            }
        }
        if let Some(metrics) = &self.metrics {
            if let Err(error) = metrics.shutdown() {
                tracing::warn!(%error, "the last metrics were not exported");
            }
        }
    }
}

/// Whether the runtimes this process builds record content on their spans
/// (`--trace-content`).
static TRACE_CONTENT: AtomicBool = AtomicBool::new(false);

/// Makes the runtimes this process builds record content on their spans.
pub(crate) fn trace_content(record: bool) {
    TRACE_CONTENT.store(record, Ordering::Relaxed);
}

/// `builder`, recording its runtime's metrics when this process exports them, and content on
/// its spans with `--trace-content`.
pub(crate) fn instrumented(builder: RuntimeBuilder) -> RuntimeBuilder {
    let builder = builder.trace_content(TRACE_CONTENT.load(Ordering::Relaxed));
    match METRICS.get() {
        Some(metrics) => builder.meter(metrics.meter.clone()),
        None => builder,
    }
}

/// The metrics in Prometheus's text exposition format, when [`Telemetry::start`] was asked for
/// them.
pub(crate) fn prometheus_text() -> Option<Result<String, SubagentError>> {
    use prometheus::Encoder as _;
    let registry = METRICS.get()?.prometheus.as_ref()?;
    let mut text = Vec::new();
    let bug = |error: &dyn std::fmt::Display| {
        SubagentError::new(
            ErrorCode::ReportableBug,
            format!("the metrics did not encode: {error}"),
        )
    };
    let encoded = prometheus::TextEncoder::new()
        .encode(&registry.gather(), &mut text)
        .map_err(|error| bug(&error))
        .and_then(|()| String::from_utf8(text).map_err(|error| bug(&error)));
    Some(encoded)
}

fn service_name() -> String {
    std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "subagents".to_owned())
}

/// Whether a collector's URL is reached over TLS (its scheme is `https`, in any case).
fn is_https(url: &str) -> bool {
    url.trim_start()
        .get(..8)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://"))
}

fn invalid(what: &str, error: impl std::fmt::Display) -> SubagentError {
    SubagentError::new(
        ErrorCode::InvalidConfig,
        format!("the OTLP {what} exporter cannot start: {error}"),
    )
}

fn span_provider(
    endpoint: Option<&str>,
    resource: Resource,
    volume: SpanVolume,
    exiting: Exiting,
) -> Result<SdkTracerProvider, SubagentError> {
    let exporter = Signal::Traces
        .configure(SpanExporter::builder().with_http(), endpoint)?
        .build()
        .map_err(|error| invalid("span", error))?;
    // The SDK's default queue (2,048 spans) is under a tenth of a second of a load run's
    // spans (about 30,000/s): a burst the exporter's thread falls behind on would overflow
    // it, and what overflows is dropped, a trace with holes. The standard variable decides.
    let mut batching = BatchConfigBuilder::default();
    let configured = std::env::var_os("OTEL_BSP_MAX_QUEUE_SIZE").is_some();
    if let Some(queue) = volume.queue(configured) {
        batching = batching.with_max_queue_size(queue);
    }
    let exporter = LossReporting::new(exporter, Signal::Traces.collector(endpoint), exiting);
    let processor = BatchSpanProcessor::builder(exporter)
        .with_batch_config(batching.build())
        .build();
    Ok(SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(resource)
        .build())
}

/// The meter provider: an OTLP reader when `otlp`, a Prometheus registry when `prometheus`;
/// sets [`METRICS`].
fn meter_provider(
    endpoint: Option<&str>,
    otlp: bool,
    prometheus: bool,
    resource: Resource,
) -> Result<SdkMeterProvider, SubagentError> {
    let mut provider = SdkMeterProvider::builder().with_resource(resource);
    if otlp {
        // A failed metrics export is not retried: the next one carries the same cumulative
        // totals, and at exit a collector that is gone then costs no backoff.
        let exporter = Signal::Metrics
            .configure(MetricExporter::builder().with_http(), endpoint)?
            .with_retry_policy(opentelemetry_otlp::RetryPolicy::disabled())
            .build()
            .map_err(|error| invalid("metric", error))?;
        provider = provider.with_reader(PeriodicReader::builder(exporter).build());
    }
    let registry = prometheus.then(prometheus::Registry::new);
    if let Some(registry) = &registry {
        let exporter = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .build()
            .map_err(|error| invalid("Prometheus", error))?;
        provider = provider.with_reader(exporter);
    }
    let provider = provider.build();
    let _ = METRICS.set(Metrics {
        meter: provider.meter("subagents"),
        prometheus: registry,
    });
    Ok(provider)
}

/// How long the metrics endpoint waits for a request's head, on a fresh connection or one
/// kept alive: a client that connects and goes quiet holds no task or descriptor longer. A
/// scraper reconnects for its next scrape.
const METRICS_REQUEST_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

/// Serves the metrics in Prometheus's text format at `GET /metrics` on `listener`, one task
/// per connection, until the process ends; a connection that sends no request for
/// [`METRICS_REQUEST_WITHIN`] is closed.
pub(crate) async fn serve_prometheus(listener: tokio::net::TcpListener) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of descriptors, most likely: wait for some to close rather than spin.
                tracing::warn!(%error, "the metrics endpoint could not accept a connection");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        tokio::spawn(async move {
            let service = hyper::service::service_fn(|request| async move {
                Ok::<_, std::convert::Infallible>(scrape(&request))
            });
            let served = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(METRICS_REQUEST_WITHIN)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
            if let Err(error) = served {
                tracing::debug!(%error, "a metrics connection ended with an error");
            }
        });
    }
}

/// The answer to one request of the metrics endpoint.
fn scrape<B>(
    request: &hyper::Request<B>,
) -> hyper::Response<http_body_util::Full<hyper::body::Bytes>> {
    let (status, content_type, body) = match (request.method(), request.uri().path()) {
        (&hyper::Method::GET, "/metrics") => match prometheus_text() {
            Some(Ok(text)) => (
                hyper::StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                text,
            ),
            Some(Err(error)) => (
                hyper::StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain; charset=utf-8",
                error.to_string(),
            ),
            None => (
                hyper::StatusCode::NOT_FOUND,
                "text/plain; charset=utf-8",
                "this process records no metrics\n".to_owned(),
            ),
        },
        (_, "/metrics") => (
            hyper::StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "GET /metrics\n".to_owned(),
        ),
        _ => (
            hyper::StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "the metrics are at /metrics\n".to_owned(),
        ),
    };
    let mut response = hyper::Response::new(http_body_util::Full::new(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exporting_spans_bridges_the_log_facade_at_info_only() {
        use tracing_subscriber::layer::SubscriberExt;
        let telemetry = Telemetry {
            traces: Some(SdkTracerProvider::builder().build()),
            metrics: None,
            exiting: Exiting::default(),
        };
        let subscriber = tracing_subscriber::registry().with(telemetry.layer());
        // `init` bridges `log` at this level: `None` would be `TRACE`.
        assert_eq!(
            tracing::Subscriber::max_level_hint(&subscriber),
            Some(tracing::level_filters::LevelFilter::INFO)
        );
    }

    #[test]
    fn only_a_heavy_command_holds_the_large_span_queue_unless_the_variable_says() {
        assert_eq!(SpanVolume::Heavy.queue(false), Some(SPAN_QUEUE));
        assert_eq!(SpanVolume::Heavy.queue(true), None, "the variable decides");
        assert_eq!(SpanVolume::Light.queue(false), None, "the SDK's default");
        assert_eq!(SpanVolume::Light.queue(true), None);
    }

    #[test]
    fn only_an_https_collector_is_reached_over_tls() {
        assert!(is_https("https://collector.example:4318"));
        assert!(is_https(" HTTPS://collector.example"));
        assert!(!is_https("http://127.0.0.1:4318"));
        assert!(!is_https("https:/"));
        assert!(!is_https(""));
    }
}
