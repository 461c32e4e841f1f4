//! Reading a request body with APISIX's Admin limit (1.5 MiB), without ever holding more than
//! the limit in memory.

use bytes::{Buf, Bytes, BytesMut};
use http_body::Body;
use http_body_util::BodyExt;

#[derive(Debug, PartialEq, Eq)]
pub enum BodyError {
    /// `request size <n> is greater than the maximum size <limit> allowed`. For a body without
    /// `Content-Length`, `n` is what had arrived when reading stopped.
    TooLarge(u64),
    /// The client connection failed mid-body.
    Read(String),
}

impl BodyError {
    pub fn message(&self, limit: usize) -> String {
        match self {
            BodyError::TooLarge(n) => {
                format!("request size {n} is greater than the maximum size {limit} allowed")
            }
            BodyError::Read(e) => e.clone(),
        }
    }
}

/// Reads the whole body. A declared `Content-Length` over `limit` is refused before reading
/// anything; otherwise reading stops as soon as more than `limit` bytes have arrived.
pub async fn read_limited<B>(
    body: B,
    content_length: Option<u64>,
    limit: usize,
) -> Result<Bytes, BodyError>
where
    B: Body,
    B::Error: std::fmt::Display,
{
    if let Some(declared) = content_length {
        if declared > limit as u64 {
            return Err(BodyError::TooLarge(declared));
        }
    }
    let capacity = content_length.map_or(0, |n| n as usize);
    let mut buf = BytesMut::with_capacity(capacity);
    let mut body = std::pin::pin!(body);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| BodyError::Read(e.to_string()))?;
        let Ok(mut data) = frame.into_data() else {
            continue;
        };
        let len = data.remaining();
        if buf.len() + len > limit {
            return Err(BodyError::TooLarge((buf.len() + len) as u64));
        }
        while data.has_remaining() {
            let chunk = data.chunk();
            buf.extend_from_slice(chunk);
            let n = chunk.len();
            data.advance(n);
        }
    }
    Ok(buf.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Full;

    #[tokio::test]
    async fn limits() {
        let ok = read_limited(Full::new(Bytes::from_static(b"abc")), Some(3), 3).await;
        assert_eq!(ok.unwrap(), Bytes::from_static(b"abc"));
        let declared = read_limited(Full::new(Bytes::new()), Some(10), 3).await;
        assert_eq!(declared.unwrap_err(), BodyError::TooLarge(10));
        let streamed = read_limited(Full::new(Bytes::from_static(b"abcd")), None, 3).await;
        assert_eq!(streamed.unwrap_err(), BodyError::TooLarge(4));
        assert_eq!(
            BodyError::TooLarge(1572865).message(1572864),
            "request size 1572865 is greater than the maximum size 1572864 allowed"
        );
    }
}
