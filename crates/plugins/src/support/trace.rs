//! What the tracing plugins (opentelemetry, zipkin) share: the wall clock spans are stamped
//! with, random trace and span ids (the SDK's generator), and the export of a batch of
//! encoded spans as one HTTP POST to a collector, through the gateway's HTTP client, so a
//! collector that is down or slow costs the request path nothing (the batch processor sends
//! off it).

use std::sync::Weak;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use ferrisix_plugin_api::PluginServices;
use http::{HeaderName, HeaderValue, Request};
use opentelemetry::trace::{SpanId, TraceId};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};

use crate::log::batch_processor::SendError;

/// Nanoseconds since the epoch.
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A random 128-bit trace id (never the invalid all-zero one).
pub fn new_trace_id() -> TraceId {
    RandomIdGenerator::default().new_trace_id()
}

/// A random 64-bit span id (never the invalid all-zero one).
pub fn new_span_id() -> SpanId {
    RandomIdGenerator::default().new_span_id()
}

/// Where a tracing plugin POSTs its batches.
pub struct Collector {
    pub url: String,
    pub content_type: HeaderValue,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub timeout: Duration,
    /// Weak: the services hold the processor that holds this.
    pub services: Weak<PluginServices>,
}

impl Collector {
    /// POSTs one encoded batch; an answer outside 2xx fails it. The error names the URL and
    /// the status or the failure, after `prefix`.
    pub async fn post(&self, body: Bytes, prefix: &str) -> Result<(), SendError> {
        let Some(services) = self.services.upgrade() else {
            return Err(SendError::new("the gateway is gone"));
        };
        let mut builder = Request::post(&self.url).header("content-type", &self.content_type);
        for (k, v) in &self.headers {
            builder = builder.header(k, v);
        }
        let request = builder
            .body(body)
            .map_err(|e| SendError::new(format!("invalid request to {}: {e}", self.url)))?;
        match services.http().send(request, self.timeout).await {
            Ok(r) if r.status().is_success() => Ok(()),
            Ok(r) => Err(SendError::new(format!(
                "{prefix}{} answered {}",
                self.url,
                r.status()
            ))),
            Err(e) => Err(SendError::new(format!("{prefix}{e}, url: {}", self.url))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_valid_and_differ() {
        let (a, b) = (new_trace_id(), new_trace_id());
        assert!(a != TraceId::INVALID && a != b);
        assert!(new_span_id() != SpanId::INVALID);
        assert!(now_ns() > 1_600_000_000_000_000_000);
    }
}
