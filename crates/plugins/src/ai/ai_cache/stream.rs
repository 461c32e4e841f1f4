//! Which answers ai-cache stores, and how (`ai-cache/stream.lua`): a complete JSON answer as
//! `json`, a server-sent event stream as `sse` only when it ended with its protocol's
//! terminal event (so a cut stream is never replayed); other framings are not stored.

use crate::support::ai::protocol::{Protocol, SseParser};

pub const FORMAT_JSON: &str = "json";
pub const FORMAT_SSE: &str = "sse";

/// How the answer is framed, from its content type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// One body (no stream).
    None,
    Sse,
    /// A binary stream (Bedrock's `application/vnd.amazon.eventstream`).
    Other,
}

impl Framing {
    pub fn of(content_type: Option<&str>, stream: bool) -> Framing {
        match content_type {
            Some(ct) if ct.contains("text/event-stream") => Framing::Sse,
            Some(ct) if ct.contains("application/vnd.amazon.eventstream") => Framing::Other,
            _ if stream => Framing::Other,
            _ => Framing::None,
        }
    }
}

/// Whether `data` is the terminal event of `protocol`'s stream.
fn is_done(protocol: Protocol, kind: &str, data: &str) -> bool {
    match protocol {
        Protocol::OpenAiChat => data == "[DONE]",
        Protocol::AnthropicMessages => kind == "message_stop",
        Protocol::OpenAiResponses => kind == "response.completed",
        _ => false,
    }
}

/// Whether a stream's body ends with a complete terminal event.
pub fn stream_completed(protocol: Protocol, body: &[u8]) -> bool {
    let trimmed = {
        let mut end = body.len();
        while end > 0 && body[end - 1].is_ascii_whitespace() && body[end - 1] != b'\n' {
            end -= 1;
        }
        &body[..end]
    };
    if !(trimmed.ends_with(b"\n\n") || trimmed.ends_with(b"\r\n\r\n")) {
        return false;
    }
    let events = SseParser::default().feed(body);
    events
        .last()
        .is_some_and(|e| is_done(protocol, &e.kind, &e.data))
}

fn looks_like_sse(body: &[u8]) -> bool {
    let start = body
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(body.len());
    let rest = &body[start..];
    [&b"data:"[..], b"event:", b":", b"id:", b"retry:"]
        .iter()
        .any(|p| rest.starts_with(p))
}

/// The format `body` is stored as, or `None` when it is not stored.
pub fn capture_format(framing: Framing, protocol: Protocol, body: &[u8]) -> Option<&'static str> {
    match framing {
        Framing::None if looks_like_sse(body) => None,
        Framing::None => Some(FORMAT_JSON),
        Framing::Sse if stream_completed(protocol, body) => Some(FORMAT_SSE),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        let chat = Protocol::OpenAiChat;
        assert_eq!(
            capture_format(Framing::None, chat, b"{\"a\":1}"),
            Some(FORMAT_JSON)
        );
        assert_eq!(capture_format(Framing::None, chat, b" data: {}\n\n"), None);
        let done = b"data: {\"x\":1}\n\ndata: [DONE]\n\n";
        assert_eq!(capture_format(Framing::Sse, chat, done), Some(FORMAT_SSE));
        // Cut before the terminal event, or mid-event.
        assert_eq!(
            capture_format(Framing::Sse, chat, b"data: {\"x\":1}\n\n"),
            None
        );
        assert_eq!(capture_format(Framing::Sse, chat, b"data: [DONE]"), None);
        assert_eq!(capture_format(Framing::Other, chat, done), None);
        let anthropic = b"event: message_start\ndata: {}\n\nevent: message_stop\ndata: {}\n\n";
        assert_eq!(
            capture_format(Framing::Sse, Protocol::AnthropicMessages, anthropic),
            Some(FORMAT_SSE)
        );
        assert_eq!(
            Framing::of(Some("text/event-stream; charset=utf-8"), true),
            Framing::Sse
        );
        assert_eq!(Framing::of(Some("application/json"), false), Framing::None);
    }
}
