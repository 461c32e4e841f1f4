//! The response phases: the head `header_filter` may change, and the streaming body filters it
//! may install (nginx's `body_filter_by_lua`: `ngx.arg[1]` is the chunk, `ngx.arg[2]` the end
//! of the stream).
//!
//! A filter sees every chunk of the body on its way to the client, in order, and the end of the
//! stream once (with an empty chunk when the last chunk had already gone through). It may
//! replace a chunk, keep it back (answer an empty one) and flush what it kept at the end, or
//! end the stream early; filters run in the order they were installed, each on the previous
//! one's output. A filter that changes the body's length removes `Content-Length` in
//! `header_filter` ([`ResponseHead::clear_headers_as_body_modified`]).

use bytes::{Bytes, BytesMut};
use http::{header, HeaderMap, StatusCode};

/// One chunk on its way to the client.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BodyChunk {
    pub data: Bytes,
    /// The last chunk: set by the proxy at the end of the body, or by a filter to end it now
    /// (what comes after is dropped).
    pub end: bool,
}

/// A streaming transformation of the response body, made per request in `header_filter`.
pub trait BodyFilter: Send + 'static {
    fn filter(&mut self, chunk: &mut BodyChunk);

    /// The upstream's trailers (gRPC's `grpc-status`), seen before the end of the stream
    /// reaches [`BodyFilter::filter`]; a filter may change them, or empty them to send none
    /// (grpc-web moves them into the body).
    fn trailers(&mut self, _trailers: &mut HeaderMap) {}
}

/// The filters of one response, run by the proxy on each chunk.
#[derive(Default)]
pub struct BodyFilters {
    filters: Vec<Box<dyn BodyFilter>>,
    /// Filters that run after all the others whatever their plugin's priority: the content
    /// codings (gzip, brotli), as nginx's C filters run after the Lua body filters.
    last: Vec<Box<dyn BodyFilter>>,
    ended: bool,
    /// The trailers as the filters left them, sent after the last chunk.
    trailers: Option<HeaderMap>,
}

impl std::fmt::Debug for BodyFilters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BodyFilters({})", self.filters.len())
    }
}

impl BodyFilters {
    pub fn push(&mut self, filter: Box<dyn BodyFilter>) {
        self.filters.push(filter);
    }

    /// Installs a filter that runs after every filter installed with [`BodyFilters::push`].
    pub fn push_last(&mut self, filter: Box<dyn BodyFilter>) {
        self.last.push(filter);
    }

    pub fn is_empty(&self) -> bool {
        self.filters.is_empty() && self.last.is_empty()
    }

    /// Whether a filter ended the stream (nothing more is read or sent).
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Runs every filter on one chunk; `end`: the body has no more data after `data`. After
    /// the stream ended, further input is dropped and an empty last chunk answered.
    pub fn run(&mut self, data: Bytes, end: bool) -> BodyChunk {
        if self.ended {
            return BodyChunk {
                data: Bytes::new(),
                end: true,
            };
        }
        let mut chunk = BodyChunk { data, end };
        for f in self.filters.iter_mut().chain(self.last.iter_mut()) {
            f.filter(&mut chunk);
        }
        self.ended = chunk.end;
        chunk
    }

    /// Runs every filter on the upstream's trailers and keeps what is left of them to send
    /// after the last chunk ([`BodyFilters::take_trailers`]).
    pub fn trailers(&mut self, mut trailers: HeaderMap) {
        for f in self.filters.iter_mut().chain(self.last.iter_mut()) {
            f.trailers(&mut trailers);
        }
        self.trailers = (!trailers.is_empty()).then_some(trailers);
    }

    /// The trailers to send once the body is over.
    pub fn take_trailers(&mut self) -> Option<HeaderMap> {
        self.trailers.take()
    }

    /// Runs a whole body through the filters at once.
    pub fn run_all(&mut self, body: Bytes) -> Bytes {
        let chunk = self.run(body, true);
        chunk.data
    }
}

/// What `header_filter` decided about the body.
#[derive(Debug, Default)]
pub struct BodyEdits {
    pub filters: BodyFilters,
    /// A body replacing the response's own (which is then not read).
    pub replacement: Option<Bytes>,
}

impl BodyEdits {
    pub fn is_empty(&self) -> bool {
        self.filters.is_empty() && self.replacement.is_none()
    }
}

/// The response head as `header_filter` sees it.
pub struct ResponseHead<'a> {
    status: &'a mut StatusCode,
    headers: &'a mut HeaderMap,
    from_upstream: bool,
    edits: &'a mut BodyEdits,
}

impl<'a> ResponseHead<'a> {
    /// The proxy's constructor.
    pub fn new(
        status: &'a mut StatusCode,
        headers: &'a mut HeaderMap,
        from_upstream: bool,
        edits: &'a mut BodyEdits,
    ) -> ResponseHead<'a> {
        ResponseHead {
            status,
            headers,
            from_upstream,
            edits,
        }
    }

    pub fn status(&self) -> StatusCode {
        *self.status
    }

    pub fn set_status(&mut self, status: StatusCode) {
        *self.status = status;
    }

    pub fn headers(&self) -> &HeaderMap {
        self.headers
    }

    pub fn headers_mut(&mut self) -> &mut HeaderMap {
        self.headers
    }

    /// Whether the upstream sent this head (not an exit, an error page or a 404).
    pub fn from_upstream(&self) -> bool {
        self.from_upstream
    }

    /// Installs a filter on the body (after those installed before it).
    pub fn add_body_filter(&mut self, filter: Box<dyn BodyFilter>) {
        self.edits.filters.push(filter);
    }

    /// Installs a content coding (gzip, brotli): it runs after every other filter, on the body
    /// as the other plugins left it.
    pub fn add_encoding_filter(&mut self, filter: Box<dyn BodyFilter>) {
        self.edits.filters.push_last(filter);
    }

    /// Replaces the body with `body` (the filters installed still run on it).
    pub fn replace_body(&mut self, body: Bytes) {
        self.edits.replacement = Some(body);
    }

    /// APISIX's `core.response.clear_header_as_body_modified`: the headers that describe the
    /// body as the upstream sent it go (its length, encoding and cache validators).
    pub fn clear_headers_as_body_modified(&mut self) {
        for h in [
            header::CONTENT_LENGTH,
            header::CONTENT_ENCODING,
            header::LAST_MODIFIED,
            header::ETAG,
        ] {
            self.headers.remove(h);
        }
    }
}

/// A filter that keeps the whole body and hands it to `f` at the end (for plugins that
/// rewrite bodies as a whole, APISIX's `core.response.hold_body_chunk`).
pub struct WholeBody<F> {
    buf: BytesMut,
    f: Option<F>,
}

impl<F: FnOnce(Bytes) -> Bytes + Send + 'static> WholeBody<F> {
    pub fn new(f: F) -> WholeBody<F> {
        WholeBody {
            buf: BytesMut::new(),
            f: Some(f),
        }
    }
}

impl<F: FnOnce(Bytes) -> Bytes + Send + 'static> BodyFilter for WholeBody<F> {
    fn filter(&mut self, chunk: &mut BodyChunk) {
        self.buf.extend_from_slice(&chunk.data);
        if !chunk.end {
            chunk.data = Bytes::new();
            return;
        }
        let whole = std::mem::take(&mut self.buf).freeze();
        chunk.data = match self.f.take() {
            Some(f) => f(whole),
            None => whole,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Upper-cases and counts; ends the stream after `stop_after` chunks.
    struct Upper {
        seen: usize,
        stop_after: usize,
    }

    impl BodyFilter for Upper {
        fn filter(&mut self, chunk: &mut BodyChunk) {
            chunk.data = Bytes::from(chunk.data.to_ascii_uppercase());
            self.seen += 1;
            if self.seen == self.stop_after {
                chunk.end = true;
            }
        }
    }

    #[test]
    fn filters_chain_and_end_early() {
        let mut f = BodyFilters::default();
        f.push(Box::new(Upper {
            seen: 0,
            stop_after: 2,
        }));
        f.push(Box::new(WholeBody::new(|b: Bytes| {
            let mut v = b.to_vec();
            v.extend_from_slice(b"!");
            Bytes::from(v)
        })));
        assert_eq!(f.run(Bytes::from("ab"), false).data, "");
        // The first filter ends the stream: the second flushes what it kept.
        let last = f.run(Bytes::from("cd"), false);
        assert_eq!(
            last,
            BodyChunk {
                data: Bytes::from("ABCD!"),
                end: true
            }
        );
        assert!(f.ended());
        assert_eq!(f.run(Bytes::from("ef"), false).data, "");
    }

    #[test]
    fn last_filters_run_after_the_others() {
        let mut f = BodyFilters::default();
        f.push_last(Box::new(WholeBody::new(|b: Bytes| {
            let mut v = b.to_vec();
            v.extend_from_slice(b"!");
            Bytes::from(v)
        })));
        f.push(Box::new(Upper {
            seen: 0,
            stop_after: 9,
        }));
        assert!(!f.is_empty());
        assert_eq!(f.run_all(Bytes::from("ab")), "AB!");
    }

    #[test]
    fn head_edits() {
        let mut status = StatusCode::OK;
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_LENGTH, "10".parse().unwrap());
        headers.insert(header::ETAG, "\"x\"".parse().unwrap());
        headers.insert(header::CONTENT_TYPE, "text/plain".parse().unwrap());
        let mut edits = BodyEdits::default();
        let mut head = ResponseHead::new(&mut status, &mut headers, true, &mut edits);
        assert!(head.from_upstream());
        head.clear_headers_as_body_modified();
        head.set_status(StatusCode::CREATED);
        head.replace_body(Bytes::from("x"));
        assert_eq!(status, StatusCode::CREATED);
        assert_eq!(headers.len(), 1);
        assert_eq!(edits.replacement.as_deref(), Some(&b"x"[..]));
    }
}
