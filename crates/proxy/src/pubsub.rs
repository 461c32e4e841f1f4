//! The `kafka` upstream scheme (`apisix/pubsub/kafka.lua`): after the route's plugins ran, a
//! request for a kafka upstream never reaches the balancer. The gateway completes the
//! WebSocket handshake itself (lua-resty-websocket's server checks), answers 101 and, once
//! hyper hands over the upgraded connection, runs APISIX's pub-sub loop on it
//! ([`ferrisix_plugins::pubsub`]) with a Kafka consumer of the upstream's brokers, with
//! kafka-proxy's SASL credentials when the route has them. The loop runs on its own task and
//! owns its consumer: nothing is shared with other requests.
//!
//! A request that is not a WebSocket handshake is answered 400 (nginx's page) and the reason
//! is logged as APISIX logs it: `failed to initialize pubsub module, err: bad "upgrade"
//! request header: nil`.

use std::sync::Arc;

use base64::Engine as _;
use ferrisix_plugins::pubsub::kafka::{KafkaConsumer, KafkaSasl, KafkaUpstream};
use http::header::{self, HeaderMap, HeaderValue};
use http::{Response, StatusCode, Version};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

use crate::ctx::RequestCtx;
use crate::response::body::ResponseBody;
use crate::response::canned;

/// RFC 6455's GUID, appended to the client's key for `Sec-WebSocket-Accept`.
const WS_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// Serves the request as a pub-sub connection to `kafka`'s brokers.
pub(crate) fn kafka(
    ctx: &mut RequestCtx<'_>,
    kafka: &Arc<KafkaUpstream>,
) -> Response<ResponseBody> {
    let server = &ctx.conn.gateway.server_header;
    let accepted = handshake(ctx.head.version, &ctx.headers).and_then(|accepted| {
        // hyper offers the connection only on HTTP/1.1 (checked above).
        let upgrade = ctx
            .extensions
            .remove::<OnUpgrade>()
            .ok_or_else(|| "bad http version".to_string())?;
        Ok((accepted, upgrade))
    });
    let ((accept, protocol), upgrade) = match accepted {
        Ok(a) => a,
        Err(reason) => {
            tracing::error!("failed to initialize pubsub module, err: {reason}");
            return canned::error_page(StatusCode::BAD_REQUEST, server);
        }
    };
    let sasl = ctx
        .plugins
        .as_ref()
        .and_then(|r| r.state.value::<KafkaSasl>())
        .cloned();
    let consumer = KafkaConsumer::new(kafka.clone(), sasl);
    tokio::spawn(async move {
        match upgrade.await {
            Ok(io) => ferrisix_plugins::pubsub::serve(TokioIo::new(io), consumer).await,
            Err(e) => tracing::debug!(error = %e, "pubsub websocket upgrade failed"),
        }
    });
    let mut resp = Response::new(ResponseBody::empty());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    h.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    if let Some(p) = protocol {
        h.insert(header::SEC_WEBSOCKET_PROTOCOL, p);
    }
    h.insert(header::SERVER, server.clone());
    resp
}

/// lua-resty-websocket's checks of the handshake, in its order; on success the
/// `Sec-WebSocket-Accept` value and the protocol to echo (the client's first).
fn handshake(
    version: Version,
    headers: &HeaderMap,
) -> Result<(HeaderValue, Option<HeaderValue>), String> {
    if version != Version::HTTP_11 {
        return Err("bad http version".into());
    }
    let upgrade = headers.get(header::UPGRADE);
    if !upgrade.is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket")) {
        let shown = upgrade.map_or("nil".into(), |v| String::from_utf8_lossy(v.as_bytes()));
        return Err(format!("bad \"upgrade\" request header: {shown}"));
    }
    let connection = headers
        .get_all(header::CONNECTION)
        .iter()
        .map(|v| v.as_bytes().to_ascii_lowercase())
        .collect::<Vec<_>>()
        .join(&b","[..]);
    if !connection.windows(7).any(|w| w == b"upgrade") {
        return Err("bad \"connection\" request header".into());
    }
    let Some(key) = headers.get(header::SEC_WEBSOCKET_KEY) else {
        return Err("bad \"sec-websocket-key\" request header".into());
    };
    if headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .is_none_or(|v| v.as_bytes() != b"13")
    {
        return Err("bad \"sec-websocket-version\" request header".into());
    }
    let mut hashed = ring::digest::Context::new(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY);
    hashed.update(key.as_bytes());
    hashed.update(WS_GUID.as_bytes());
    let accept = base64::engine::general_purpose::STANDARD.encode(hashed.finish());
    let accept = HeaderValue::from_str(&accept).expect("base64 is a valid header value");
    Ok((accept, headers.get(header::SEC_WEBSOCKET_PROTOCOL).cloned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    const GOOD: [(&str, &str); 4] = [
        ("upgrade", "WebSocket"),
        ("connection", "keep-alive, Upgrade"),
        ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ("sec-websocket-version", "13"),
    ];

    #[test]
    fn accepts_as_rfc_6455() {
        // RFC 6455 section 1.3's example.
        let (accept, protocol) = handshake(Version::HTTP_11, &headers(&GOOD)).unwrap();
        assert_eq!(accept, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        assert_eq!(protocol, None);
        let mut with = GOOD.to_vec();
        with.push(("sec-websocket-protocol", "pubsub"));
        let (_, protocol) = handshake(Version::HTTP_11, &headers(&with)).unwrap();
        assert_eq!(protocol.unwrap(), "pubsub");
    }

    #[test]
    fn refuses_as_lua_resty_websocket() {
        let without = |name: &str| {
            let h: Vec<_> = GOOD.iter().copied().filter(|(k, _)| *k != name).collect();
            handshake(Version::HTTP_11, &headers(&h)).unwrap_err()
        };
        assert_eq!(without("upgrade"), "bad \"upgrade\" request header: nil");
        assert_eq!(without("connection"), "bad \"connection\" request header");
        assert_eq!(
            without("sec-websocket-key"),
            "bad \"sec-websocket-key\" request header"
        );
        assert_eq!(
            without("sec-websocket-version"),
            "bad \"sec-websocket-version\" request header"
        );
        let mut h = GOOD.to_vec();
        h[0] = ("upgrade", "h2c");
        assert_eq!(
            handshake(Version::HTTP_11, &headers(&h)).unwrap_err(),
            "bad \"upgrade\" request header: h2c"
        );
        assert_eq!(
            handshake(Version::HTTP_2, &headers(&GOOD)).unwrap_err(),
            "bad http version"
        );
    }
}
