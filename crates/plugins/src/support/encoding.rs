//! Content codings on streamed bodies: gzip (`flate2` on its pure-Rust miniz_oxide backend) and
//! brotli (the `brotli` crate), both ways. Each coder keeps only its own window and the output
//! not yet taken, so a body of any size goes through in bounded memory.

use std::io::Write;

use flate2::write::{GzDecoder, GzEncoder};
use flate2::Compression;

/// Whether `accept` (an `Accept-Encoding` value) accepts `coding` (or `*` when `star`): one of
/// its comma-separated entries names it without `q=0`.
pub fn accepts(accept: &str, coding: &str, star: bool) -> bool {
    accept.split(',').any(|entry| {
        let mut parts = entry.split(';');
        let name = parts.next().unwrap_or("").trim();
        if !(name.eq_ignore_ascii_case(coding) || (star && name == "*")) {
            return false;
        }
        let q = parts
            .filter_map(|p| p.trim().strip_prefix("q="))
            .next()
            .map(|q| q.trim().parse::<f32>().unwrap_or(0.0));
        q.is_none_or(|q| q > 0.0)
    })
}

/// A streaming compressor.
pub enum Encoder {
    Gzip(GzEncoder<Vec<u8>>),
    Brotli(Box<brotli::CompressorWriter<Vec<u8>>>),
}

/// brotli's settings (ngx_brotli's `brotli_comp_level`, `brotli_window`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BrotliParams {
    /// 0..=11.
    pub quality: u32,
    /// The window's log2 (10..=24; 0 lets the encoder choose).
    pub lgwin: u32,
    /// The input block's log2 (16..=24; 0 lets the encoder choose).
    pub lgblock: u32,
    /// 0 generic, 1 UTF-8 text, 2 WOFF 2.0 fonts.
    pub mode: u32,
}

impl Encoder {
    pub fn gzip(level: u32) -> Encoder {
        Encoder::Gzip(GzEncoder::new(Vec::new(), Compression::new(level.min(9))))
    }

    pub fn brotli(p: BrotliParams) -> Encoder {
        let mut params = brotli::enc::BrotliEncoderParams {
            quality: p.quality.min(11) as i32,
            ..Default::default()
        };
        if p.lgwin != 0 {
            params.lgwin = p.lgwin as i32;
        }
        if p.lgblock != 0 {
            params.lgblock = p.lgblock as i32;
        }
        params.mode = match p.mode {
            1 => brotli::enc::backward_references::BrotliEncoderMode::BROTLI_MODE_TEXT,
            2 => brotli::enc::backward_references::BrotliEncoderMode::BROTLI_MODE_FONT,
            _ => brotli::enc::backward_references::BrotliEncoderMode::BROTLI_MODE_GENERIC,
        };
        Encoder::Brotli(Box::new(brotli::CompressorWriter::with_params(
            Vec::new(),
            4096,
            &params,
        )))
    }

    /// Compresses `data`; answers the output ready so far. `flush`: emit everything compressed
    /// up to here (a sync flush).
    pub fn push(&mut self, data: &[u8], flush: bool) -> Vec<u8> {
        // Writing into a Vec cannot fail.
        match self {
            Encoder::Gzip(e) => {
                let _ = e.write_all(data);
                if flush {
                    let _ = e.flush();
                }
                std::mem::take(e.get_mut())
            }
            Encoder::Brotli(e) => {
                let _ = e.write_all(data);
                if flush {
                    let _ = e.flush();
                }
                std::mem::take(e.get_mut())
            }
        }
    }

    /// Ends the stream: the rest of the output and the trailer.
    pub fn finish(self) -> Vec<u8> {
        match self {
            Encoder::Gzip(e) => e.finish().unwrap_or_default(),
            Encoder::Brotli(e) => e.into_inner(),
        }
    }
}

/// A streaming decompressor (response-rewrite's `filters` on a compressed body).
pub enum Decoder {
    Gzip(Box<GzDecoder<Vec<u8>>>),
    Brotli(Box<brotli::DecompressorWriter<Vec<u8>>>),
}

impl Decoder {
    /// The decoder of a `Content-Encoding`, `None` for one it does not know.
    pub fn for_encoding(encoding: &str) -> Option<Decoder> {
        match encoding.trim().to_ascii_lowercase().as_str() {
            "gzip" => Some(Decoder::Gzip(Box::new(GzDecoder::new(Vec::new())))),
            "br" => Some(Decoder::Brotli(Box::new(brotli::DecompressorWriter::new(
                Vec::new(),
                4096,
            )))),
            _ => None,
        }
    }

    /// Decodes `data`; answers the output ready so far.
    pub fn push(&mut self, data: &[u8]) -> Result<Vec<u8>, String> {
        match self {
            Decoder::Gzip(d) => {
                d.write_all(data)
                    .and_then(|_| d.flush())
                    .map_err(|e| format!("inflate gzip err: {e}"))?;
                Ok(std::mem::take(d.get_mut()))
            }
            Decoder::Brotli(d) => {
                d.write_all(data)
                    .and_then(|_| d.flush())
                    .map_err(|e| format!("brotli decode err: {e}"))?;
                Ok(std::mem::take(d.get_mut()))
            }
        }
    }

    /// Ends the stream: the rest of the output.
    pub fn finish(self) -> Result<Vec<u8>, String> {
        match self {
            Decoder::Gzip(d) => d.finish().map_err(|e| format!("inflate gzip err: {e}")),
            Decoder::Brotli(d) => d
                .into_inner()
                .map_err(|_| "brotli decode err: truncated stream".to_owned()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(mut enc: Encoder, coding: &str) {
        let body: Vec<u8> = (0..20_000)
            .flat_map(|i| format!("{i} hello\n").into_bytes())
            .collect();
        let mut packed = Vec::new();
        for c in body.chunks(1000) {
            packed.extend(enc.push(c, false));
        }
        packed.extend(enc.finish());
        assert!(packed.len() < body.len() / 3, "{coding} compresses");
        let mut dec = Decoder::for_encoding(coding).unwrap();
        let mut out = Vec::new();
        for c in packed.chunks(333) {
            out.extend(dec.push(c).unwrap());
        }
        out.extend(dec.finish().unwrap());
        assert_eq!(out, body);
    }

    #[test]
    fn codings_round_trip_in_chunks() {
        round_trip(Encoder::gzip(1), "gzip");
        round_trip(Encoder::gzip(9), "gzip");
        round_trip(
            Encoder::brotli(BrotliParams {
                quality: 6,
                lgwin: 19,
                lgblock: 0,
                mode: 0,
            }),
            "br",
        );
        round_trip(
            Encoder::brotli(BrotliParams {
                quality: 0,
                lgwin: 10,
                lgblock: 16,
                mode: 1,
            }),
            "br",
        );
        assert!(Decoder::for_encoding("deflate").is_none());
        let mut bad = Decoder::for_encoding("gzip").unwrap();
        assert!(bad.push(b"not gzip at all").is_err());
    }

    #[test]
    fn sync_flush_emits_what_was_written() {
        let mut enc = Encoder::gzip(1);
        let first = enc.push(b"hello hello hello", true);
        let mut dec = Decoder::for_encoding("gzip").unwrap();
        assert_eq!(dec.push(&first).unwrap(), b"hello hello hello");
    }

    #[test]
    fn accept_encoding() {
        assert!(accepts("gzip, deflate, br", "gzip", false));
        assert!(accepts("br;q=0.5", "br", true));
        assert!(!accepts("gzip;q=0", "gzip", false));
        assert!(!accepts("deflate", "gzip", false));
        assert!(accepts("*", "br", true));
        assert!(!accepts("*", "gzip", false));
        assert!(!accepts("gzipx", "gzip", false));
    }
}
