//! Logs and traces of `ferry serve`: text or JSON logs through tracing-subscriber, and
//! spans exported over OTLP/gRPC when the standard OTEL_EXPORTER_OTLP_ENDPOINT (or
//! OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) environment variable is set.

use std::io::IsTerminal;

use ferry_core::{Error, Result};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per event.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = Error;

    /// `text` or `json`, as `--log-format` and the config file's `log_format` take them.
    fn from_str(text: &str) -> Result<Self> {
        match text {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(Error::invalid_input(format!(
                "log format '{other}': use text or json"
            ))),
        }
    }
}

/// Flushes and stops the trace exporter when dropped (or on [`TelemetryGuard::shutdown`]).
#[derive(Debug, Default)]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl TelemetryGuard {
    /// Whether spans are exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Exports what is buffered and stops the exporter.
    pub fn shutdown(&mut self) {
        if let Some(p) = self.provider.take() {
            if let Err(e) = p.force_flush() {
                eprintln!("ferry: flushing traces failed: {e}");
            }
            if let Err(e) = p.shutdown() {
                eprintln!("ferry: stopping the trace exporter failed: {e}");
            }
        }
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn otlp_requested() -> bool {
    [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]
    .iter()
    .any(|v| std::env::var(v).is_ok_and(|s| !s.is_empty()))
        && std::env::var("OTEL_SDK_DISABLED").map_or(true, |v| v != "true")
}

/// Installs the global subscriber. `filter` is an EnvFilter directive ("info",
/// "ferry_server=debug,info"). Must run inside the tokio runtime (the OTLP exporter uses it).
pub fn init(format: LogFormat, filter: &str) -> Result<TelemetryGuard> {
    let filter = EnvFilter::try_new(filter)
        .map_err(|e| Error::invalid_input(format!("log filter '{filter}': {e}")))?;
    let fmt = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .boxed(),
    };
    let mut guard = TelemetryGuard::default();
    let otel = if otlp_requested() {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .build()
            .map_err(|e| Error::invalid_input(format!("OTLP exporter: {e}")))?;
        let service_name =
            std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "ferry".to_string());
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name(service_name)
                    .build(),
            )
            .build();
        let tracer = provider.tracer("ferry");
        guard.provider = Some(provider);
        Some(tracing_opentelemetry::layer().with_tracer(tracer))
    } else {
        None
    };
    // A second init (tests, or the CLI having set one up) keeps the first subscriber.
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(otel)
        .try_init();
    Ok(guard)
}
