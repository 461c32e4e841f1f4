//! `ferrisix-echo`: the upstream of the quick start (`127.0.0.1:1980`, where APISIX's
//! walkthrough and test suite expect one). It answers every HTTP/1.1 request with `200 OK` and
//! a text body naming the method, the path and the headers it received, so a request through
//! the gateway shows what the gateway forwarded. Keep-alive, `Content-Length` and chunked
//! request bodies are handled; one thread per connection. It is a demo and test aid, not a
//! server to put in production.
//!
//! Usage: `ferrisix-echo [ADDR]` (default `127.0.0.1:1980`).
#![forbid(unsafe_code)]

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::Duration;

/// The largest request head read (nginx's default `large_client_header_buffers`, 4 x 8k).
const MAX_HEAD: usize = 32 * 1024;
/// A connection with no next request for this long is closed.
const IDLE: Duration = Duration::from_secs(60);

fn main() -> ExitCode {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:1980".to_owned());
    if addr == "-h" || addr == "--help" {
        println!("usage: ferrisix-echo [ADDR]   (default 127.0.0.1:1980)");
        return ExitCode::SUCCESS;
    }
    let listener = match TcpListener::bind(&addr) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("ferrisix-echo: cannot listen on {addr}: {e}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!("ferrisix-echo: answering 200 on http://{addr}/");
    for stream in listener.incoming() {
        match stream {
            Ok(stream) => {
                std::thread::spawn(move || {
                    let _ = serve(stream);
                });
            }
            // Out of file descriptors or similar: wait a moment rather than spin.
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    ExitCode::SUCCESS
}

/// One request as read from the wire.
#[derive(Debug, PartialEq)]
struct Request {
    method: String,
    target: String,
    version: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// HTTP/1.1 keeps the connection unless told otherwise; HTTP/1.0 closes unless asked.
    fn keep_alive(&self) -> bool {
        let connection = self.header("connection").map(str::to_ascii_lowercase);
        match connection.as_deref() {
            Some(c) if c.contains("close") => false,
            Some(c) if c.contains("keep-alive") => true,
            _ => self.version == "HTTP/1.1",
        }
    }
}

fn serve(stream: TcpStream) -> io::Result<()> {
    stream.set_read_timeout(Some(IDLE))?;
    let _ = stream.set_nodelay(true);
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    loop {
        let req = match read_request(&mut reader) {
            Ok(Some(req)) => req,
            Ok(None) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                writer.write_all(
                    b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                )?;
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let keep = req.keep_alive();
        writer.write_all(&answer(&req, keep))?;
        if !keep {
            return Ok(());
        }
    }
}

/// The response: `200 OK`, `text/plain`, the request echoed.
fn answer(req: &Request, keep_alive: bool) -> Vec<u8> {
    let mut body = format!("{} {} {}\n", req.method, req.target, req.version);
    for (name, value) in &req.headers {
        body.push_str(&format!("{name}: {value}\n"));
    }
    if !req.body.is_empty() {
        body.push('\n');
        body.push_str(&String::from_utf8_lossy(&req.body));
        if !body.ends_with('\n') {
            body.push('\n');
        }
    }
    let body = if req.method == "HEAD" { "" } else { &body };
    let mut out = format!(
        "HTTP/1.1 200 OK\r\nServer: ferrisix-echo\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n",
        if req.method == "HEAD" { 0 } else { body.len() }
    );
    if !keep_alive {
        out.push_str("Connection: close\r\n");
    }
    out.push_str("\r\n");
    out.push_str(body);
    out.into_bytes()
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_owned())
}

/// Reads one line of the head, without its CRLF. `None` at a clean end of the stream.
fn read_line(reader: &mut impl BufRead, budget: &mut usize) -> io::Result<Option<String>> {
    let mut line = Vec::new();
    let n = reader
        .by_ref()
        .take(*budget as u64 + 1)
        .read_until(b'\n', &mut line)?;
    if n == 0 {
        return Ok(None);
    }
    if n > *budget || !line.ends_with(b"\n") {
        return Err(bad("request head too large or cut short"));
    }
    *budget -= n;
    line.pop();
    if line.ends_with(b"\r") {
        line.pop();
    }
    String::from_utf8(line)
        .map(Some)
        .map_err(|_| bad("request head is not UTF-8"))
}

/// The next request on the connection, `None` when the client closed it between requests.
fn read_request(reader: &mut impl BufRead) -> io::Result<Option<Request>> {
    let mut budget = MAX_HEAD;
    // Clients may send empty lines between requests (RFC 9112, 2.2).
    let line = loop {
        match read_line(reader, &mut budget)? {
            None => return Ok(None),
            Some(l) if l.is_empty() => continue,
            Some(l) => break l,
        }
    };
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad("bad request line"));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(bad("not HTTP/1.x"));
    }
    let mut headers = Vec::new();
    loop {
        let line = read_line(reader, &mut budget)?.ok_or_else(|| bad("head cut short"))?;
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':').ok_or_else(|| bad("bad header line"))?;
        headers.push((name.trim().to_owned(), value.trim().to_owned()));
    }
    let mut req = Request {
        method: method.to_owned(),
        target: target.to_owned(),
        version: version.to_owned(),
        headers,
        body: Vec::new(),
    };
    let chunked = req
        .header("transfer-encoding")
        .is_some_and(|te| te.to_ascii_lowercase().contains("chunked"));
    if chunked {
        req.body = read_chunked(reader)?;
    } else if let Some(len) = req.header("content-length") {
        let len: u64 = len.parse().map_err(|_| bad("bad Content-Length"))?;
        reader.by_ref().take(len).read_to_end(&mut req.body)?;
        if req.body.len() as u64 != len {
            return Err(bad("body cut short"));
        }
    }
    Ok(Some(req))
}

fn read_chunked(reader: &mut impl BufRead) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let mut budget = MAX_HEAD;
        let size_line = read_line(reader, &mut budget)?.ok_or_else(|| bad("chunk cut short"))?;
        let size = size_line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size, 16).map_err(|_| bad("bad chunk size"))?;
        if size == 0 {
            // Trailers, up to the empty line.
            while !read_line(reader, &mut budget)?
                .ok_or_else(|| bad("trailers cut short"))?
                .is_empty()
            {}
            return Ok(body);
        }
        let start = body.len();
        reader.by_ref().take(size as u64).read_to_end(&mut body)?;
        if body.len() - start != size {
            return Err(bad("chunk cut short"));
        }
        let mut crlf = [0u8; 2];
        reader.read_exact(&mut crlf)?;
        if &crlf != b"\r\n" {
            return Err(bad("chunk not followed by CRLF"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &str) -> io::Result<Option<Request>> {
        read_request(&mut BufReader::new(raw.as_bytes()))
    }

    #[test]
    fn a_request_with_a_body_is_echoed() {
        let req = parse("POST /hello?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nworld")
            .unwrap()
            .unwrap();
        assert_eq!(req.target, "/hello?x=1");
        assert_eq!(req.body, b"world");
        let text = String::from_utf8(answer(&req, true)).unwrap();
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(text.ends_with("POST /hello?x=1 HTTP/1.1\nHost: a\nContent-Length: 5\n\nworld\n"));
        assert!(!text.contains("Connection: close"));
    }

    #[test]
    fn chunked_bodies_and_keep_alive_rules() {
        let raw = "PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\nGET /next HTTP/1.0\r\n\r\n";
        let mut reader = BufReader::new(raw.as_bytes());
        let first = read_request(&mut reader).unwrap().unwrap();
        assert_eq!(first.body, b"abcde");
        assert!(first.keep_alive());
        let second = read_request(&mut reader).unwrap().unwrap();
        assert_eq!(second.target, "/next");
        assert!(!second.keep_alive(), "HTTP/1.0 closes by default");
        assert!(read_request(&mut reader).unwrap().is_none());
    }

    #[test]
    fn malformed_heads_are_refused() {
        for raw in [
            "GET /\r\n\r\n",
            "GET / SPDY/3\r\n\r\n",
            "GET / HTTP/1.1\r\nno colon\r\n\r\n",
            "GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\n",
        ] {
            let e = parse(raw).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{raw:?}");
        }
        let huge = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(MAX_HEAD));
        assert!(parse(&huge).is_err());
    }

    #[test]
    fn serves_over_a_socket() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || serve(listener.accept().unwrap().0));
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut got = String::new();
        c.read_to_string(&mut got).unwrap();
        assert!(got.starts_with("HTTP/1.1 200 OK\r\n"), "{got}");
        assert!(got.contains("Connection: close\r\n"));
        assert!(got.ends_with("GET /a HTTP/1.1\nHost: x\nConnection: close\n"));
    }
}
