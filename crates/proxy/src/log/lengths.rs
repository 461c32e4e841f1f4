//! The sizes the log phase reports: nginx's `$request_length`, and the response head's size
//! on the wire (part of `$bytes_sent`).

use http::{HeaderMap, Response};

use crate::ctx::ClientHead;

/// nginx's `$request_length`: request line, headers and body.
pub fn request_length(head: &ClientHead, headers: &HeaderMap) -> u64 {
    request_length_of(&head.method, &head.uri, headers)
}

/// [`request_length`] from the request's own parts (the access log's record takes it before
/// the head is checked).
pub fn request_length_of(method: &http::Method, uri: &http::Uri, headers: &HeaderMap) -> u64 {
    let line = method.as_str().len()
        + uri.path_and_query().map_or(1, |p| p.as_str().len())
        + " HTTP/1.1\r\n".len()
        + 1;
    // One pass: the body's length is the first Content-Length value met (`get`'s answer),
    // without a second, hashed lookup.
    let mut body: Option<&http::HeaderValue> = None;
    let header_bytes: usize = headers
        .iter()
        .map(|(k, v)| {
            if body.is_none() && k == http::header::CONTENT_LENGTH {
                body = Some(v);
            }
            k.as_str().len() + v.len() + 4
        })
        .sum();
    let body: u64 = body
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0);
    (line + header_bytes + 2) as u64 + body
}

/// The response head's size on the wire, as well as it can be known before hyper writes it
/// (it adds `date`, and `content-length` when the body's size is known).
pub fn head_length<B: http_body::Body>(resp: &Response<B>) -> u64 {
    let mut n = "HTTP/1.1 200 OK\r\n".len() + "date: Mon, 01 Jan 2024 00:00:00 GMT\r\n".len() + 2;
    let mut has_length = false;
    n += resp
        .headers()
        .iter()
        .map(|(k, v)| {
            has_length |= k == http::header::CONTENT_LENGTH;
            k.as_str().len() + v.len() + 4
        })
        .sum::<usize>();
    if !has_length {
        if let Some(len) = resp.body().size_hint().exact() {
            n += "content-length: \r\n".len() + len.to_string().len();
        }
    }
    n as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctx::HostName;
    use crate::response::body::ResponseBody;
    use http::HeaderValue;

    #[test]
    fn request_length_counts_line_headers_and_body() {
        let req = http::Request::builder()
            .method("POST")
            .uri("/a?b=1")
            .header("host", "x")
            .header("content-length", "5")
            .body(())
            .unwrap();
        let (parts, _) = req.into_parts();
        let head = ClientHead {
            method: parts.method,
            uri: parts.uri,
            version: parts.version,
            path: None,
            host: HostName::Absent,
            host_value: None,
        };
        // "POST /a?b=1 HTTP/1.1\r\n" + "host: x\r\n" + "content-length: 5\r\n" + "\r\n" + 5
        assert_eq!(request_length(&head, &parts.headers), 22 + 9 + 19 + 2 + 5);
        // The body is the first Content-Length value, as `get` reads it; no valid one is 0.
        let mut headers = parts.headers.clone();
        headers.append("content-length", HeaderValue::from_static("7"));
        headers.append("x-a", HeaderValue::from_static("1"));
        let n = request_length_of(&head.method, &head.uri, &headers);
        assert_eq!(n, 22 + 9 + 19 + 19 + 8 + 2 + 5);
        headers.insert("content-length", HeaderValue::from_static("x"));
        let n = request_length_of(&head.method, &head.uri, &headers);
        assert_eq!(n, 22 + 9 + 19 + 8 + 2);
    }

    #[test]
    fn head_length_counts_a_content_length_once() {
        let sized = Response::builder()
            .header("content-length", "3")
            .body(ResponseBody::empty())
            .unwrap();
        let base =
            "HTTP/1.1 200 OK\r\n".len() + "date: Mon, 01 Jan 2024 00:00:00 GMT\r\n".len() + 2;
        assert_eq!(
            head_length(&sized),
            (base + "content-length: 3\r\n".len()) as u64
        );
    }
}
