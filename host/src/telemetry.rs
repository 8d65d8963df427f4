//! Logging on stderr, filtered by `INBOXD_LOG` (or `RUST_LOG`): readable
//! lines by default, one JSON object per line with `--log-format json` (or
//! `INBOXD_LOG_FORMAT=json`) for log shippers. stdout is left to command
//! output (the demo's summary, `--json` documents).
//!
//! Traces: with `[telemetry] otlp_endpoint`, `inboxd run` exports spans over
//! OTLP/HTTP (JSON) — one per batch transaction and one per event (see
//! [`event_span`]), parented to the event's W3C `traceparent` — and the
//! outbox messages an event publishes carry its span as their parent, so a
//! chain of handlers is one trace. Without it no span is even made: the hot
//! path pays nothing. Log lines never carry these spans.
//!
//! Also where the process decides about library backtraces, see
//! [`library_backtraces_off_unless_asked`].

mod one_line;

use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider as _,
};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use std::sync::atomic::{AtomicBool, Ordering};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::{Targets, filter_fn};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// The target of the spans exported over OTLP; log output never shows it.
pub const TRACE_TARGET: &str = "inboxd::trace";

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Whether spans are exported: the pipeline makes none otherwise.
static TRACING: AtomicBool = AtomicBool::new(false);

/// Where spans go: an OTLP/HTTP collector's traces URL (JSON encoding, e.g.
/// `http://127.0.0.1:4318/v1/traces`) and the `service.name` they carry.
pub struct OtlpTarget<'a> {
    pub endpoint: &'a str,
    pub service: &'a str,
}

/// Sets up logging, and span export to `otlp` if given; the returned
/// [`Traces`] sends the last spans when shut down.
pub fn init(
    default_filter: &str,
    format: LogFormat,
    otlp: Option<OtlpTarget>,
) -> Result<Option<Traces>, TracesError> {
    let filter = EnvFilter::try_from_env("INBOXD_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new(default_filter));
    // No colours: the writer escapes every control character an event holds
    // (a guest's text may hold escape sequences), the formatter's own too.
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_writer(one_line::OneLine(std::io::stderr));
    let Some(target) = otlp else {
        // No span is made for the trace then (see `tracing_on`).
        let logs = match format {
            LogFormat::Text => fmt.boxed(),
            LogFormat::Json => fmt.json().boxed(),
        };
        let _ = tracing_subscriber::registry().with(filter).with(logs).try_init();
        return Ok(None);
    };
    let provider = provider(&target)?;
    // The spans made for the trace pass whatever the log level, go to the
    // exporter alone (with no log lines in them), and never to the log.
    let filter = filter.add_directive(
        format!("{TRACE_TARGET}=trace")
            .parse()
            .expect("a valid directive"),
    );
    let not_traced = filter_fn(|meta| meta.target() != TRACE_TARGET);
    let logs = match format {
        LogFormat::Text => fmt.with_filter(not_traced).boxed(),
        LogFormat::Json => fmt.json().with_filter(not_traced).boxed(),
    };
    let spans = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("inboxd"))
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_level(false)
        .with_tracked_inactivity(false)
        .with_filter(Targets::new().with_target(TRACE_TARGET, tracing::Level::TRACE));
    let installed = tracing_subscriber::registry()
        .with(filter)
        .with(logs)
        .with(spans)
        .try_init()
        .is_ok();
    TRACING.store(installed, Ordering::Relaxed);
    Ok(Some(Traces { provider }))
}

/// Why spans cannot be exported.
#[derive(Debug, thiserror::Error)]
#[error("telemetry.otlp_endpoint: cannot export to {endpoint}: {reason}")]
pub struct TracesError {
    endpoint: String,
    reason: String,
}

/// The span exporter while it runs; [`Traces::shutdown`] sends the last spans.
pub struct Traces {
    provider: SdkTracerProvider,
}

impl Traces {
    /// Sends the spans still buffered, then stops exporting. It blocks
    /// until the exporter's thread has sent them.
    pub fn shutdown(self) {
        TRACING.store(false, Ordering::Relaxed);
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!("the last spans could not be exported: {e}");
        }
    }
}

fn provider(target: &OtlpTarget) -> Result<SdkTracerProvider, TracesError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpJson)
        .with_endpoint(target.endpoint)
        .build()
        .map_err(|e| TracesError {
            endpoint: target.endpoint.to_owned(),
            reason: e.to_string(),
        })?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(target.service.to_owned())
        .build();
    // Batched on the SDK's own thread: an export never waits on the pipeline.
    // Every span is kept, whatever an incoming `traceparent`'s sampled flag
    // says: those headers are producers' and handlers', not the operator's.
    Ok(SdkTracerProvider::builder()
        .with_sampler(opentelemetry_sdk::trace::Sampler::AlwaysOn)
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

/// Whether spans are exported (see the module).
pub fn tracing_on() -> bool {
    TRACING.load(Ordering::Relaxed)
}

/// A span of the trace an incoming event belongs to: a child of its W3C
/// `traceparent` header when it has a valid one, else of the current span.
/// `span` is made only while spans are exported; it is `Span::none()` otherwise.
pub fn with_parent_of(span: tracing::Span, headers: &[(String, Vec<u8>)]) -> tracing::Span {
    if let Some(parent) = traceparent_header(headers).and_then(parse_traceparent) {
        let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(parent));
    }
    span
}

/// Links `span` to the span a message's `traceparent` names (the relay's
/// send of an outbox message, to the event that published it).
pub fn link_to(span: &tracing::Span, headers: &[(String, Vec<u8>)]) {
    if let Some(linked) = traceparent_header(headers).and_then(parse_traceparent) {
        span.add_link(linked);
    }
}

/// The current span as a W3C `traceparent`, while spans are exported: what
/// an outbox message carries, so its consumer's span is this one's child.
pub fn current_traceparent() -> Option<String> {
    if !tracing_on() {
        return None;
    }
    let context = tracing::Span::current().context();
    let span = context.span();
    let current = span.span_context();
    current.is_valid().then(|| {
        format!(
            "00-{}-{}-{:02x}",
            current.trace_id(),
            current.span_id(),
            current.trace_flags().to_u8()
        )
    })
}

/// The last `traceparent` header, if it is text.
pub(crate) fn traceparent_header(headers: &[(String, Vec<u8>)]) -> Option<&str> {
    headers
        .iter()
        .rev()
        .find(|(name, _)| name.eq_ignore_ascii_case("traceparent"))
        .and_then(|(_, value)| std::str::from_utf8(value).ok())
}

/// `00-<trace id>-<parent id>-<flags>`, as W3C Trace Context writes it.
pub(crate) fn parse_traceparent(value: &str) -> Option<SpanContext> {
    // Version 00 is 55 characters; a later version may add a little. The
    // header is a producer's (or a handler's): nothing longer is split.
    if value.len() > 256 {
        return None;
    }
    let parts: Vec<&str> = value.trim().split('-').collect();
    let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    // Version 00 has exactly these four fields; a later one ("ff" is never
    // valid) may add fields after them.
    let [version, trace, span, flags, rest @ ..] = parts.as_slice() else {
        return None;
    };
    if !(hex(version, 2) && hex(trace, 32) && hex(span, 16) && hex(flags, 2))
        || *version == "ff"
        || (*version == "00" && !rest.is_empty())
    {
        return None;
    }
    let context = SpanContext::new(
        TraceId::from_hex(trace).ok()?,
        SpanId::from_hex(span).ok()?,
        TraceFlags::new(u8::from_str_radix(flags, 16).ok()?),
        true,
        TraceState::default(),
    );
    context.is_valid().then_some(context)
}

/// Sets `RUST_LIB_BACKTRACE=0` unless it is set already, so `RUST_BACKTRACE=1`
/// (common in containers) keeps backtraces for panics but not for every error
/// value a library creates. wasmtime creates one each time a `Store` is
/// dropped (it disposes the store's idle fiber with a "future dropped"
/// error), and with backtraces on, capturing it was 10% of the host's CPU on
/// a backlog (measured with `perf`). Set `RUST_LIB_BACKTRACE=1` to get them.
///
/// # Safety
/// Call it first thing in `main`, before any other thread exists (it sets an
/// environment variable; see [`std::env::set_var`]).
pub unsafe fn library_backtraces_off_unless_asked() {
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        // SAFETY: the caller guarantees no other thread is running.
        unsafe { std::env::set_var("RUST_LIB_BACKTRACE", "0") };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparents_are_read_as_w3c_writes_them() {
        let read = parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(read.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(read.span_id().to_string(), "00f067aa0ba902b7");
        assert!(read.is_sampled());
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473x-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-+1",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad:?}");
        }
        assert!(
            current_traceparent().is_none(),
            "nothing is exported in unit tests"
        );
    }
}
