//! The request body made ready to go upstream: the client's own, or what the plugins left of
//! it; buffered when small enough to be replayed on another node, streamed otherwise; held
//! to the route's (or the gateway's) body size limit.

use std::time::Duration;

use ferrisix_plugin_api::{BodyError, RequestBody};
use http::header;
use http_body::Body as _;
use http_body_util::BodyExt;

use super::client::{StreamSource, UpstreamBody};
use crate::ctx::RequestCtx;
use crate::error::{ErrorKind, ProxyError};

/// Bodies up to this size (with a known length) are read before proxying so that a failed
/// try can be replayed; larger ones stream.
const BUFFERED_BODY_LIMIT: u64 = 64 * 1024;

fn body_error(e: &BodyError) -> ProxyError {
    match e {
        BodyError::Broken(_) => ErrorKind::BodyBroken.into(),
        BodyError::Timeout => ErrorKind::BodyTimeout.into(),
        BodyError::TooLarge(_) => ErrorKind::BodyTooLarge.into(),
    }
}

/// Reads a body of unknown length until it ends (a complete, replayable body) or passes
/// `limit` bytes (a stream that first sends what was read).
async fn read_up_to(
    mut body: StreamSource,
    limit: usize,
    between_reads: Duration,
) -> Result<UpstreamBody, ProxyError> {
    let mut buf = bytes::BytesMut::new();
    loop {
        match tokio::time::timeout(between_reads, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    buf.extend_from_slice(&data);
                    if buf.len() > limit {
                        return Ok(UpstreamBody::stream_after(Some(buf.freeze()), body));
                    }
                }
            }
            Ok(None) => return Ok(UpstreamBody::full(buf.freeze())),
            // The client went away mid-body (nginx: 400) or stalled (408).
            Ok(Some(Err(_))) => return Err(ErrorKind::BodyBroken.into()),
            Err(_) => return Err(ErrorKind::BodyTimeout.into()),
        }
    }
}

/// Buffers small known-length bodies (replayable) and streams the rest; `timeout`: nginx's
/// `client_body_timeout`; `limit`: the body size limit, past which a chunked body is not read
/// on (the caller refuses it).
async fn unread_body(
    body: StreamSource,
    timeout: Duration,
    limit: Option<u64>,
) -> Result<UpstreamBody, ProxyError> {
    if body.is_end_stream() {
        return Ok(UpstreamBody::Empty);
    }
    match body.size_hint().exact() {
        Some(n) if n <= BUFFERED_BODY_LIMIT => {
            match tokio::time::timeout(timeout, body.collect()).await {
                Ok(Ok(collected)) => Ok(UpstreamBody::full(collected.to_bytes())),
                // The client went away or stalled (nginx logs 400/408).
                Ok(Err(_)) => Err(ErrorKind::BodyBroken.into()),
                Err(_) => Err(ErrorKind::BodyTimeout.into()),
            }
        }
        Some(_) => Ok(UpstreamBody::stream_after(None, body)),
        // Unknown length (chunked): nginx reads the whole body and sends it with
        // Content-Length. Do the same up to the buffering limit; past it, stream what was
        // read followed by the rest, so a huge upload never sits in memory.
        // With a smaller size limit, reading stops once the body passes it (nginx: 413 then).
        None => {
            let up_to = limit.map_or(BUFFERED_BODY_LIMIT, |l| l.min(BUFFERED_BODY_LIMIT));
            read_up_to(body, up_to as usize, timeout).await
        }
    }
}

/// The request body as it goes upstream: the client's own, or what the plugins left of it;
/// a route's body size limit refuses a larger one (413) or cuts a stream off at it.
pub async fn prepare_body(ctx: &mut RequestCtx<'_>) -> Result<UpstreamBody, ProxyError> {
    let (body, limit, buffering) = match ctx.plugins.as_mut() {
        Some(run) => {
            let limit = run.state.max_body_size();
            let buffering = run.state.request_buffering();
            let body = match run.state.take_body() {
                RequestBody::Empty => match ctx.body.take() {
                    Some(b) => StreamBody::Unread(StreamSource::Client(b)),
                    None => StreamBody::Ready(UpstreamBody::Empty),
                },
                RequestBody::Unread(b) => StreamBody::Unread(StreamSource::Pending(b)),
                RequestBody::Buffered(b) => {
                    // Still the plugins' after the answer (ext-plugin-post-resp's runner may
                    // ask for it), as nginx keeps a read body for the later phases.
                    run.state.set_body(RequestBody::Buffered(b.clone()));
                    StreamBody::Ready(UpstreamBody::full(b))
                }
                RequestBody::Partial { read, rest } => StreamBody::Ready(
                    UpstreamBody::stream_after(Some(read), StreamSource::Pending(rest)),
                ),
                RequestBody::Failed(e) => return Err(body_error(&e)),
            };
            (body, limit, buffering)
        }
        None => match ctx.body.take() {
            Some(b) => (StreamBody::Unread(StreamSource::Client(b)), None, None),
            None => (StreamBody::Ready(UpstreamBody::Empty), None, None),
        },
    };
    // The route's client-control limit, else the gateway's `client_max_body_size`.
    let global = ctx.conn.gateway.client_max_body_size;
    let limit = limit.or((global != 0).then_some(global));
    if let Some(max) = limit {
        let declared = ctx
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|n| n > max) {
            return Err(ErrorKind::BodyTooLarge.into());
        }
    }
    let body = match body {
        StreamBody::Ready(b) => b,
        // proxy-control's `request_buffering: false`: the body goes up as it arrives.
        StreamBody::Unread(b) if buffering == Some(false) && !b.is_end_stream() => {
            UpstreamBody::stream_after(None, b)
        }
        StreamBody::Unread(b) => {
            unread_body(b, ctx.conn.gateway.client_body_timeout, limit).await?
        }
    };
    let body = body.client_timeout(ctx.conn.gateway.client_body_timeout);
    match limit {
        Some(max) => body.limit(max),
        None => Ok(body),
    }
}

enum StreamBody {
    Unread(StreamSource),
    Ready(UpstreamBody),
}
