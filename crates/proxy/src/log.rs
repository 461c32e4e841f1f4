//! The log phase: one per request, run once however the request ends (the response completed,
//! the client went away mid-body, or the request was abandoned before any response), with its
//! three consumers: the plugins' `log`, the connection statistics and the access log.
//!
//! The phase starts with the request (counting it in the statistics), travels in the request
//! context, and is handed to the response body with the answer; its `Drop` is the phase, so
//! it runs exactly once. A request abandoned before its answer is logged with nginx's 499.
//!
//! Beside it: the access log ([`access`]), the record of the upstream tries both consumers
//! read ([`record`]), and the sizes they report ([`lengths`]).

pub mod access;
pub(crate) mod lengths;
pub mod record;

use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use ferrisix_plugin_api::{ConnStats, LogCtx, RequestGuards};
use ferrisix_plugins::{PluginChain, Verdicts};

use crate::log::access::{AccessLog, LogRecord};
use crate::log::record::{tries, UpstreamRecord};

/// nginx's status for a request whose client closed the connection before the answer.
const CLIENT_CLOSED: u16 = 499;

/// Where the log phases of one connection's requests go, shared per connection so a request
/// clones no gateway-wide reference count.
#[derive(Debug)]
pub struct LogSinks {
    pub stats: Arc<ConnStats>,
    pub access_log: Arc<AccessLog>,
}

/// The plugins' side of the log phase, waiting for the response to end.
pub struct PendingLog {
    pub global: Arc<PluginChain>,
    pub route: Option<Arc<PluginChain>>,
    pub verdicts: (Verdicts, Verdicts),
    /// Dropped right after the plugins' log ran: limit-conn decrements here.
    pub guards: RequestGuards,
    pub ctx: LogCtx,
    pub start: Instant,
    /// The response body is captured up to this many bytes when a plugin asked for it.
    pub body_limit: Option<usize>,
    pub body: BytesMut,
    /// Made by the request phases: the client went away before the response phases.
    pub abandoned: bool,
}

impl PendingLog {
    fn run(&mut self, bytes_sent: u64, upstream: &UpstreamRecord, now: Instant) {
        if self.abandoned {
            self.ctx
                .vars
                .set("upstream_addr", || tries(&upstream.addrs));
            self.ctx
                .vars
                .set("upstream_status", || tries(&upstream.statuses));
            self.ctx.node = upstream.last_addr().map(|a| a.ip());
        }
        self.ctx.bytes_sent += bytes_sent;
        self.ctx.request_time = now.saturating_duration_since(self.start);
        if self.ctx.node.is_some() {
            self.ctx.upstream_time = upstream.start.map(|s| now.saturating_duration_since(s));
        }
        if self.body_limit.is_some() {
            self.ctx.response_body = Some(std::mem::take(&mut self.body).freeze());
        }
        // Masks (data-mask) before any plugin logs, then global rules first, then the
        // route's plugins.
        self.global.mask_log(&mut self.ctx, self.verdicts.0);
        if let Some(r) = &self.route {
            r.mask_log(&mut self.ctx, self.verdicts.1);
        }
        self.global.log(&self.ctx, self.verdicts.0);
        if let Some(r) = &self.route {
            r.log(&self.ctx, self.verdicts.1);
        }
    }
}

/// One request's log phase.
pub struct LogPhase {
    sinks: Arc<LogSinks>,
    /// The access log's record, when the access log is on.
    pub record: Option<Box<LogRecord>>,
    /// The plugins' log phase, when a chain has one or holds request guards.
    pub plugins: Option<Box<PendingLog>>,
    /// What happened upstream, for both.
    pub upstream: UpstreamRecord,
    /// `$status`: the answer's, once there is one.
    pub status: u16,
    /// `$body_bytes_sent`.
    bytes: u64,
}

impl std::fmt::Debug for LogPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogPhase")
            .field("status", &self.status)
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

impl LogPhase {
    /// A request arrived: counted in `requests` and `writing` until the phase runs.
    pub fn start(sinks: Arc<LogSinks>, record: Option<Box<LogRecord>>) -> LogPhase {
        sinks.stats.request_started();
        LogPhase {
            sinks,
            record,
            plugins: None,
            upstream: UpstreamRecord::default(),
            status: CLIENT_CLOSED,
            bytes: 0,
        }
    }

    /// A chunk of the response body went out.
    pub fn sent(&mut self, chunk: &Bytes) {
        self.bytes += chunk.len() as u64;
        if let Some(p) = &mut self.plugins {
            if let Some(limit) = p.body_limit {
                let room = limit.saturating_sub(p.body.len());
                p.body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
        }
    }
}

impl Drop for LogPhase {
    fn drop(&mut self) {
        if self.plugins.is_none() && self.record.is_none() {
            self.sinks.stats.request_finished();
            return;
        }
        // The phase's one clock read: every duration it logs ends here.
        let now = Instant::now();
        if let Some(mut plugins) = self.plugins.take() {
            plugins.run(self.bytes, &self.upstream, now);
            if let Some(record) = &mut self.record {
                // The access log's `$llm_*` come from the plugins' values.
                record.values = plugins.ctx.values.take();
            }
        }
        self.sinks.stats.request_finished();
        if let Some(mut record) = self.record.take() {
            record.status = self.status;
            record.body_bytes_sent = self.bytes;
            record.finish(&self.sinks.access_log, &self.upstream, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::log::access::LogSink;

    use super::*;

    #[test]
    fn runs_once_and_counts_the_request_either_way() {
        let sinks = Arc::new(LogSinks {
            stats: Arc::new(ConnStats::new()),
            access_log: Arc::new(AccessLog::new(LogSink::Off, "$status")),
        });
        sinks.stats.connection_opened();
        let mut phase = LogPhase::start(sinks.clone(), None);
        assert_eq!(sinks.stats.read().writing, 1);
        phase.sent(&Bytes::from_static(b"abc"));
        assert_eq!(phase.bytes, 3);
        drop(phase);
        let t = sinks.stats.read();
        assert_eq!((t.requests, t.writing), (1, 0));
        // Abandoned before any answer: still counted as finished, as nginx's 499.
        let phase = LogPhase::start(sinks.clone(), None);
        assert_eq!(phase.status, 499);
        drop(phase);
        assert_eq!(sinks.stats.read().writing, 0);
    }
}
