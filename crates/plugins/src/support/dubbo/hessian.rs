//! The subset of Hessian 2.0 serialization (<http://hessian.caucho.com/doc/hessian-serialization.html>)
//! that Dubbo 2 calls carry: null, booleans, ints, longs, doubles, dates, strings (chunked,
//! lengths in UTF-16 units as Java counts them), binary, lists, maps (untyped and typed),
//! objects from class definitions, and back references. Writing produces the compact forms
//! Java's Hessian2Output writes; reading accepts every form of these types.

use std::fmt;

/// A Hessian value as read or to be written.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i32),
    Long(i64),
    Double(f64),
    /// Milliseconds since the epoch.
    Date(i64),
    String(String),
    Binary(Vec<u8>),
    /// A list, with its type when it had one.
    List(Option<String>, Vec<Value>),
    /// A map, with its type when it had one (`M`).
    Map(Option<String>, Vec<(Value, Value)>),
    /// An object: its class name and its fields in order.
    Object(String, Vec<(String, Value)>),
}

impl Value {
    /// The text of a string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The entry of a map (or the field of an object) whose key is the string `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Map(_, entries) => entries
                .iter()
                .find(|(k, _)| k.as_str() == Some(key))
                .map(|(_, v)| v),
            Value::Object(_, fields) => fields.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

/// Writes values into a buffer (no back references: every value is written out in full).
#[derive(Debug, Default)]
pub struct Writer {
    buf: Vec<u8>,
    /// Class definitions written so far (each object writes its own).
    classes: i32,
}

/// Java's Hessian2Output splits strings and binaries into chunks of this many units.
const CHUNK: usize = 0x8000;

impl Writer {
    pub fn new() -> Writer {
        Writer::default()
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }

    pub fn null(&mut self) {
        self.buf.push(b'N');
    }

    pub fn bool(&mut self, v: bool) {
        self.buf.push(if v { b'T' } else { b'F' });
    }

    pub fn int(&mut self, v: i32) {
        let b = &mut self.buf;
        if (-0x10..=0x2f).contains(&v) {
            b.push((v + 0x90) as u8);
        } else if (-0x800..=0x7ff).contains(&v) {
            b.push((0xc8 + (v >> 8)) as u8);
            b.push(v as u8);
        } else if (-0x40000..=0x3ffff).contains(&v) {
            b.push((0xd4 + (v >> 16)) as u8);
            b.extend_from_slice(&(v as u16).to_be_bytes());
        } else {
            b.push(b'I');
            b.extend_from_slice(&v.to_be_bytes());
        }
    }

    pub fn long(&mut self, v: i64) {
        let b = &mut self.buf;
        if (-0x08..=0x0f).contains(&v) {
            b.push((v + 0xe0) as u8);
        } else if (-0x800..=0x7ff).contains(&v) {
            b.push((0xf8 + (v >> 8)) as u8);
            b.push(v as u8);
        } else if (-0x40000..=0x3ffff).contains(&v) {
            b.push((0x3c + (v >> 16)) as u8);
            b.extend_from_slice(&(v as u16).to_be_bytes());
        } else if let Ok(i) = i32::try_from(v) {
            b.push(0x59);
            b.extend_from_slice(&i.to_be_bytes());
        } else {
            b.push(b'L');
            b.extend_from_slice(&v.to_be_bytes());
        }
    }

    pub fn double(&mut self, v: f64) {
        let b = &mut self.buf;
        let int = v as i64;
        if int as f64 == v && !(v == 0.0 && v.is_sign_negative()) {
            match int {
                0 => return b.push(0x5b),
                1 => return b.push(0x5c),
                -0x80..=0x7f => {
                    b.push(0x5d);
                    return b.push(int as u8);
                }
                -0x8000..=0x7fff => {
                    b.push(0x5e);
                    return b.extend_from_slice(&(int as i16).to_be_bytes());
                }
                _ => {}
            }
        }
        // Java's compact form: the value in thousandths when that is exact.
        let mills = (v * 1000.0) as i32;
        if 0.001 * f64::from(mills) == v {
            b.push(0x5f);
            return b.extend_from_slice(&mills.to_be_bytes());
        }
        b.push(b'D');
        b.extend_from_slice(&v.to_bits().to_be_bytes());
    }

    pub fn date(&mut self, ms: i64) {
        if ms % 60_000 == 0 {
            if let Ok(minutes) = i32::try_from(ms / 60_000) {
                self.buf.push(0x4b);
                return self.buf.extend_from_slice(&minutes.to_be_bytes());
            }
        }
        self.buf.push(0x4a);
        self.buf.extend_from_slice(&ms.to_be_bytes());
    }

    pub fn string(&mut self, s: &str) {
        // Lengths count UTF-16 units; a character outside the BMP is written as its two
        // surrogates, each in UTF-8's three-byte form, as Java writes them.
        let units: Vec<u16> = s.encode_utf16().collect();
        let mut rest = &units[..];
        while rest.len() > CHUNK {
            let mut n = CHUNK;
            // A chunk does not end between the two halves of a pair.
            if (0xd800..0xdc00).contains(&rest[n - 1]) {
                n -= 1;
            }
            self.buf.push(b'R');
            self.buf.extend_from_slice(&(n as u16).to_be_bytes());
            put_units(&mut self.buf, &rest[..n]);
            rest = &rest[n..];
        }
        let n = rest.len();
        if n <= 0x1f {
            self.buf.push(n as u8);
        } else if n <= 0x3ff {
            self.buf.push(0x30 + (n >> 8) as u8);
            self.buf.push(n as u8);
        } else {
            self.buf.push(b'S');
            self.buf.extend_from_slice(&(n as u16).to_be_bytes());
        }
        put_units(&mut self.buf, rest);
    }

    pub fn binary(&mut self, bytes: &[u8]) {
        let mut rest = bytes;
        while rest.len() > CHUNK {
            self.buf.push(b'A');
            self.buf.extend_from_slice(&(CHUNK as u16).to_be_bytes());
            self.buf.extend_from_slice(&rest[..CHUNK]);
            rest = &rest[CHUNK..];
        }
        let n = rest.len();
        if n <= 0x0f {
            self.buf.push(0x20 + n as u8);
        } else if n <= 0x3ff {
            self.buf.push(0x34 + (n >> 8) as u8);
            self.buf.push(n as u8);
        } else {
            self.buf.push(b'B');
            self.buf.extend_from_slice(&(n as u16).to_be_bytes());
        }
        self.buf.extend_from_slice(rest);
    }

    /// Any value (lists and maps with their type when they have one; objects as a class
    /// definition followed by the instance).
    pub fn value(&mut self, v: &Value) {
        match v {
            Value::Null => self.null(),
            Value::Bool(b) => self.bool(*b),
            Value::Int(i) => self.int(*i),
            Value::Long(l) => self.long(*l),
            Value::Double(d) => self.double(*d),
            Value::Date(ms) => self.date(*ms),
            Value::String(s) => self.string(s),
            Value::Binary(b) => self.binary(b),
            Value::List(ty, items) => {
                let n = items.len();
                match ty {
                    Some(t) if n <= 7 => {
                        self.buf.push(0x70 + n as u8);
                        self.string(t);
                    }
                    Some(t) => {
                        self.buf.push(b'V');
                        self.string(t);
                        self.int(i32::try_from(n).unwrap_or(i32::MAX));
                    }
                    None if n <= 7 => self.buf.push(0x78 + n as u8),
                    None => {
                        self.buf.push(b'X');
                        self.int(i32::try_from(n).unwrap_or(i32::MAX));
                    }
                }
                items.iter().for_each(|i| self.value(i));
            }
            Value::Map(ty, entries) => {
                match ty {
                    Some(t) => {
                        self.buf.push(b'M');
                        self.string(t);
                    }
                    None => self.buf.push(b'H'),
                }
                for (k, v) in entries {
                    self.value(k);
                    self.value(v);
                }
                self.buf.push(b'Z');
            }
            Value::Object(class, fields) => {
                // Each object gets its own definition: references to earlier definitions
                // would need the writer to remember them, which nothing here needs.
                self.buf.push(b'C');
                self.string(class);
                self.int(i32::try_from(fields.len()).unwrap_or(i32::MAX));
                fields.iter().for_each(|(name, _)| self.string(name));
                self.buf.push(b'O');
                self.int(self.classes);
                self.classes += 1;
                fields.iter().for_each(|(_, v)| self.value(v));
            }
        }
    }
}

/// UTF-16 units as Hessian's UTF-8: each unit on its own (a surrogate in three bytes).
fn put_units(buf: &mut Vec<u8>, units: &[u16]) {
    for &u in units {
        let c = u32::from(u);
        if c < 0x80 {
            buf.push(c as u8);
        } else if c < 0x800 {
            buf.push(0xc0 | (c >> 6) as u8);
            buf.push(0x80 | (c & 0x3f) as u8);
        } else {
            buf.push(0xe0 | (c >> 12) as u8);
            buf.push(0x80 | ((c >> 6) & 0x3f) as u8);
            buf.push(0x80 | (c & 0x3f) as u8);
        }
    }
}

/// Why a value could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError(pub String);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DecodeError {}

fn err<T>(msg: impl Into<String>) -> Result<T, DecodeError> {
    Err(DecodeError(msg.into()))
}

/// Nesting deeper than this is refused rather than followed (a hostile answer could
/// otherwise exhaust the stack).
const MAX_DEPTH: usize = 64;

/// A class definition read from `C`.
#[derive(Clone, Debug)]
struct ClassDef {
    name: String,
    fields: Vec<String>,
}

/// Reads values from a buffer, keeping the class definitions, types and references that
/// later values may point back to.
#[derive(Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    classes: Vec<ClassDef>,
    types: Vec<String>,
    refs: Vec<Value>,
    depth: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader {
            buf,
            pos: 0,
            classes: Vec::new(),
            types: Vec::new(),
            refs: Vec::new(),
            depth: 0,
        }
    }

    /// Whether every byte was read.
    pub fn at_end(&self) -> bool {
        self.pos >= self.buf.len()
    }

    fn byte(&mut self) -> Result<u8, DecodeError> {
        let b = *self
            .buf
            .get(self.pos)
            .ok_or_else(|| DecodeError("unexpected end of hessian data".into()))?;
        self.pos += 1;
        Ok(b)
    }

    fn peek(&self) -> Result<u8, DecodeError> {
        self.buf
            .get(self.pos)
            .copied()
            .ok_or_else(|| DecodeError("unexpected end of hessian data".into()))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| DecodeError("unexpected end of hessian data".into()))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u16(&mut self) -> Result<usize, DecodeError> {
        let b = self.take(2)?;
        Ok(usize::from(u16::from_be_bytes([b[0], b[1]])))
    }

    fn i32_be(&mut self) -> Result<i32, DecodeError> {
        let b = self.take(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn i64_be(&mut self) -> Result<i64, DecodeError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(i64::from_be_bytes(a))
    }

    /// An int value (lengths, references, class numbers).
    pub fn read_int(&mut self) -> Result<i32, DecodeError> {
        match self.read()? {
            Value::Int(i) => Ok(i),
            other => err(format!("expected an int, found {other:?}")),
        }
    }

    /// A string value.
    pub fn read_string(&mut self) -> Result<String, DecodeError> {
        match self.read()? {
            Value::String(s) => Ok(s),
            other => err(format!("expected a string, found {other:?}")),
        }
    }

    fn count(&mut self) -> Result<usize, DecodeError> {
        let n = self.read_int()?;
        usize::try_from(n).map_err(|_| DecodeError(format!("negative length {n}")))
    }

    /// A type: its name, or a reference to a type named before.
    fn read_type(&mut self) -> Result<String, DecodeError> {
        let b = self.peek()?;
        if b <= 0x1f || (0x30..=0x33).contains(&b) || b == b'S' || b == b'R' {
            let t = self.read_string()?;
            self.types.push(t.clone());
            return Ok(t);
        }
        let i = self.count()?;
        self.types
            .get(i)
            .cloned()
            .ok_or_else(|| DecodeError(format!("unknown type reference {i}")))
    }

    /// The next value.
    pub fn read(&mut self) -> Result<Value, DecodeError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return err("hessian data nested too deeply");
        }
        let v = self.read_inner();
        self.depth -= 1;
        v
    }

    fn read_inner(&mut self) -> Result<Value, DecodeError> {
        let code = self.byte()?;
        Ok(match code {
            b'N' => Value::Null,
            b'T' => Value::Bool(true),
            b'F' => Value::Bool(false),
            0x80..=0xbf => Value::Int(i32::from(code) - 0x90),
            0xc0..=0xcf => Value::Int(((i32::from(code) - 0xc8) << 8) | i32::from(self.byte()?)),
            0xd0..=0xd7 => {
                let hi = (i32::from(code) - 0xd4) << 16;
                Value::Int(hi | self.u16()? as i32)
            }
            b'I' => Value::Int(self.i32_be()?),
            0xd8..=0xef => Value::Long(i64::from(code) - 0xe0),
            0xf0..=0xff => Value::Long(((i64::from(code) - 0xf8) << 8) | i64::from(self.byte()?)),
            0x38..=0x3f => {
                let hi = (i64::from(code) - 0x3c) << 16;
                Value::Long(hi | self.u16()? as i64)
            }
            0x59 => Value::Long(i64::from(self.i32_be()?)),
            b'L' => Value::Long(self.i64_be()?),
            0x5b => Value::Double(0.0),
            0x5c => Value::Double(1.0),
            0x5d => Value::Double(f64::from(self.byte()? as i8)),
            0x5e => {
                let b = self.take(2)?;
                Value::Double(f64::from(i16::from_be_bytes([b[0], b[1]])))
            }
            0x5f => Value::Double(0.001 * f64::from(self.i32_be()?)),
            b'D' => Value::Double(f64::from_bits(self.i64_be()? as u64)),
            0x4a => Value::Date(self.i64_be()?),
            0x4b => Value::Date(i64::from(self.i32_be()?) * 60_000),
            0x00..=0x1f | 0x30..=0x33 | b'S' | b'R' => Value::String(self.string_from(code)?),
            0x20..=0x2f | 0x34..=0x37 | b'A' | b'B' => Value::Binary(self.binary_from(code)?),
            b'H' => self.map(None)?,
            b'M' => {
                let t = self.read_type()?;
                self.map(Some(t))?
            }
            b'U' => {
                let t = self.read_type()?;
                self.list(Some(t), None)?
            }
            b'V' => {
                let t = self.read_type()?;
                let n = self.count()?;
                self.list(Some(t), Some(n))?
            }
            b'W' => self.list(None, None)?,
            b'X' => {
                let n = self.count()?;
                self.list(None, Some(n))?
            }
            0x70..=0x77 => {
                let t = self.read_type()?;
                self.list(Some(t), Some(usize::from(code - 0x70)))?
            }
            0x78..=0x7f => self.list(None, Some(usize::from(code - 0x78)))?,
            b'C' => {
                let name = self.read_string()?;
                let n = self.count()?;
                let mut fields = Vec::with_capacity(n.min(64));
                for _ in 0..n {
                    fields.push(self.read_string()?);
                }
                self.classes.push(ClassDef { name, fields });
                return self.read_inner();
            }
            b'O' => {
                let i = self.count()?;
                self.object(i)?
            }
            0x60..=0x6f => self.object(usize::from(code - 0x60))?,
            b'Q' => {
                let i = self.count()?;
                self.refs
                    .get(i)
                    .cloned()
                    .ok_or_else(|| DecodeError(format!("unknown reference {i}")))?
            }
            other => return err(format!("unknown hessian code 0x{other:02x}")),
        })
    }

    /// A string whose first chunk starts with `code`.
    fn string_from(&mut self, mut code: u8) -> Result<String, DecodeError> {
        let mut units: Vec<u16> = Vec::new();
        loop {
            let (n, last) = match code {
                0x00..=0x1f => (usize::from(code), true),
                0x30..=0x33 => (
                    (usize::from(code - 0x30) << 8) | usize::from(self.byte()?),
                    true,
                ),
                b'S' => (self.u16()?, true),
                b'R' => (self.u16()?, false),
                other => return err(format!("unknown string chunk 0x{other:02x}")),
            };
            self.units(n, &mut units)?;
            if last {
                break;
            }
            code = self.byte()?;
        }
        // Unpaired surrogates (which Java strings may hold) become U+FFFD.
        Ok(String::from_utf16_lossy(&units))
    }

    /// `n` UTF-16 units of Hessian's UTF-8 (a four-byte sequence counts as its two units).
    fn units(&mut self, n: usize, out: &mut Vec<u16>) -> Result<(), DecodeError> {
        let mut got = 0;
        while got < n {
            let b0 = u32::from(self.byte()?);
            let c = if b0 < 0x80 {
                b0
            } else if b0 & 0xe0 == 0xc0 {
                ((b0 & 0x1f) << 6) | self.cont()?
            } else if b0 & 0xf0 == 0xe0 {
                ((b0 & 0x0f) << 12) | (self.cont()? << 6) | self.cont()?
            } else if b0 & 0xf8 == 0xf0 {
                let c = ((b0 & 0x07) << 18)
                    | (self.cont()? << 12)
                    | (self.cont()? << 6)
                    | self.cont()?;
                let mut pair = [0u16; 2];
                match char::from_u32(c) {
                    Some(ch) => {
                        let enc = ch.encode_utf16(&mut pair);
                        out.extend_from_slice(enc);
                        got += enc.len();
                    }
                    None => return err("invalid utf-8 in hessian string"),
                }
                continue;
            } else {
                return err("invalid utf-8 in hessian string");
            };
            out.push(c as u16);
            got += 1;
        }
        Ok(())
    }

    fn cont(&mut self) -> Result<u32, DecodeError> {
        let b = self.byte()?;
        if b & 0xc0 != 0x80 {
            return err("invalid utf-8 in hessian string");
        }
        Ok(u32::from(b & 0x3f))
    }

    fn binary_from(&mut self, mut code: u8) -> Result<Vec<u8>, DecodeError> {
        let mut out = Vec::new();
        loop {
            let (n, last) = match code {
                0x20..=0x2f => (usize::from(code - 0x20), true),
                0x34..=0x37 => (
                    (usize::from(code - 0x34) << 8) | usize::from(self.byte()?),
                    true,
                ),
                b'B' => (self.u16()?, true),
                b'A' => (self.u16()?, false),
                other => return err(format!("unknown binary chunk 0x{other:02x}")),
            };
            out.extend_from_slice(self.take(n)?);
            if last {
                return Ok(out);
            }
            code = self.byte()?;
        }
    }

    fn map(&mut self, ty: Option<String>) -> Result<Value, DecodeError> {
        let slot = self.refs.len();
        self.refs.push(Value::Null);
        let mut entries = Vec::new();
        while self.peek()? != b'Z' {
            let k = self.read()?;
            let v = self.read()?;
            entries.push((k, v));
        }
        self.pos += 1;
        let v = Value::Map(ty, entries);
        self.refs[slot] = v.clone();
        Ok(v)
    }

    fn list(&mut self, ty: Option<String>, len: Option<usize>) -> Result<Value, DecodeError> {
        let slot = self.refs.len();
        self.refs.push(Value::Null);
        let mut items = Vec::new();
        match len {
            Some(n) => {
                // Every item takes at least a byte: a length past the data is refused here
                // rather than reserved.
                if n > self.buf.len() - self.pos {
                    return err(format!("list length {n} past the end of the data"));
                }
                items.reserve(n);
                for _ in 0..n {
                    items.push(self.read()?);
                }
            }
            None => {
                while self.peek()? != b'Z' {
                    items.push(self.read()?);
                }
                self.pos += 1;
            }
        }
        let v = Value::List(ty, items);
        self.refs[slot] = v.clone();
        Ok(v)
    }

    fn object(&mut self, class: usize) -> Result<Value, DecodeError> {
        let def = self
            .classes
            .get(class)
            .cloned()
            .ok_or_else(|| DecodeError(format!("unknown class definition {class}")))?;
        let slot = self.refs.len();
        self.refs.push(Value::Null);
        let mut fields = Vec::with_capacity(def.fields.len());
        for name in def.fields {
            let v = self.read()?;
            fields.push((name, v));
        }
        let v = Value::Object(def.name, fields);
        self.refs[slot] = v.clone();
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(v: &Value) -> Vec<u8> {
        let mut w = Writer::new();
        w.value(v);
        w.into_bytes()
    }

    fn read(b: &[u8]) -> Value {
        let mut r = Reader::new(b);
        let v = r.read().unwrap();
        assert!(r.at_end(), "bytes left after {v:?}");
        v
    }

    /// The examples of the Hessian 2.0 serialization specification, both ways.
    #[test]
    fn spec_examples() {
        let cases: &[(Value, &[u8])] = &[
            (Value::Null, b"N"),
            (Value::Bool(true), b"T"),
            (Value::Bool(false), b"F"),
            (Value::Int(0), &[0x90]),
            (Value::Int(-16), &[0x80]),
            (Value::Int(47), &[0xbf]),
            (Value::Int(0), &[0x90]),
            (Value::Int(-2048), &[0xc0, 0x00]),
            (Value::Int(-256), &[0xc7, 0x00]),
            (Value::Int(2047), &[0xcf, 0xff]),
            (Value::Int(-262144), &[0xd0, 0x00, 0x00]),
            (Value::Int(262143), &[0xd7, 0xff, 0xff]),
            (Value::Int(300_000_000), &[b'I', 0x11, 0xe1, 0xa3, 0x00]),
            (Value::Long(0), &[0xe0]),
            (Value::Long(-8), &[0xd8]),
            (Value::Long(15), &[0xef]),
            (Value::Long(-2048), &[0xf0, 0x00]),
            (Value::Long(-256), &[0xf7, 0x00]),
            (Value::Long(2047), &[0xff, 0xff]),
            (Value::Long(-262144), &[0x38, 0x00, 0x00]),
            (Value::Long(262143), &[0x3f, 0xff, 0xff]),
            (Value::Long(300_000), &[0x59, 0x00, 0x04, 0x93, 0xe0]),
            (Value::Long(1 << 40), &[b'L', 0, 0, 1, 0, 0, 0, 0, 0]),
            (Value::Double(0.0), &[0x5b]),
            (Value::Double(1.0), &[0x5c]),
            (Value::Double(-128.0), &[0x5d, 0x80]),
            (Value::Double(127.0), &[0x5d, 0x7f]),
            (Value::Double(-32768.0), &[0x5e, 0x80, 0x00]),
            (Value::Double(32767.0), &[0x5e, 0x7f, 0xff]),
            (Value::Double(12.25), &[0x5f, 0x00, 0x00, 0x2f, 0xda]),
            (
                Value::Double(1e-20),
                &[b'D', 0x3b, 0xc7, 0x9c, 0xa1, 0x0c, 0x92, 0x42, 0x23],
            ),
            (Value::String(String::new()), &[0x00]),
            (Value::String("hello".into()), b"\x05hello"),
            (Value::String("\u{c3}".into()), &[0x01, 0xc3, 0x83]),
            (Value::Binary(vec![]), &[0x20]),
            (Value::Binary(vec![1, 2, 3]), &[0x23, 1, 2, 3]),
            (
                Value::Date(894_621_091_000),
                &[0x4a, 0, 0, 0, 0xd0, 0x4b, 0x92, 0x84, 0xb8],
            ),
            (
                Value::Date(894_621_060_000),
                &[0x4b, 0x00, 0xe3, 0x83, 0x8f],
            ),
            (
                Value::List(Some("[int".into()), vec![Value::Int(0), Value::Int(1)]),
                b"\x72\x04[int\x90\x91",
            ),
            (
                Value::List(None, vec![Value::Int(0), Value::Int(1)]),
                b"\x7a\x90\x91",
            ),
            (
                Value::Map(
                    None,
                    vec![
                        (Value::Int(1), Value::String("fee".into())),
                        (Value::Int(16), Value::String("fie".into())),
                        (Value::Int(256), Value::String("foe".into())),
                    ],
                ),
                b"H\x91\x03fee\xa0\x03fie\xc9\x00\x03foeZ",
            ),
            (
                Value::Map(
                    Some("com.caucho.test.Car".into()),
                    vec![(Value::String("color".into()), Value::String("red".into()))],
                ),
                b"M\x13com.caucho.test.Car\x05color\x03redZ",
            ),
            (
                Value::Object(
                    "example.Car".into(),
                    vec![
                        ("color".into(), Value::String("red".into())),
                        ("model".into(), Value::String("corvette".into())),
                    ],
                ),
                b"C\x0bexample.Car\x92\x05color\x05modelO\x90\x03red\x08corvette",
            ),
        ];
        for (v, bytes) in cases {
            assert_eq!(&written(v)[..], *bytes, "writing {v:?}");
            assert_eq!(&read(bytes), v, "reading {bytes:02x?}");
        }
    }

    #[test]
    fn other_forms_are_read() {
        // Compact objects by class number, typed references, variable lists, references.
        let b = b"C\x0bexample.Car\x91\x05color\x60\x03red\x60\x05green";
        let mut r = Reader::new(b);
        let car = |c: &str| Value::Object("example.Car".into(), vec![("color".into(), c.into())]);
        assert_eq!(r.read().unwrap(), car("red"));
        assert_eq!(r.read().unwrap(), car("green"));
        assert_eq!(
            read(b"W\x90\x91Z"),
            Value::List(None, vec![Value::Int(0), Value::Int(1)])
        );
        assert_eq!(
            read(b"U\x04[int\x90Z"),
            Value::List(Some("[int".into()), vec![Value::Int(0)])
        );
        assert_eq!(
            read(b"\x7a\x72\x04[int\x90\x91\x70\x90"),
            Value::List(
                None,
                vec![
                    Value::List(Some("[int".into()), vec![Value::Int(0), Value::Int(1)]),
                    Value::List(Some("[int".into()), vec![]),
                ]
            )
        );
        let m = read(b"\x7aH\x01aTZQ\x91");
        let inner = Value::Map(None, vec![(Value::String("a".into()), Value::Bool(true))]);
        assert_eq!(m, Value::List(None, vec![inner.clone(), inner]));
        // 'S' and medium strings, 'B' and medium binaries.
        assert_eq!(read(b"S\x00\x05hello"), Value::String("hello".into()));
        assert_eq!(read(b"\x30\x03abc"), Value::String("abc".into()));
        assert_eq!(read(b"B\x00\x02\x01\x02"), Value::Binary(vec![1, 2]));
        assert_eq!(read(b"A\x00\x01\x01\x21\x02"), Value::Binary(vec![1, 2]));
    }

    impl From<&str> for Value {
        fn from(s: &str) -> Value {
            Value::String(s.into())
        }
    }

    #[test]
    fn strings_count_utf16_units_and_chunk() {
        // Outside the BMP: two units, each surrogate in three bytes (as Java writes it).
        let bytes = written(&Value::String("\u{1f600}".into()));
        assert_eq!(bytes, [0x02, 0xed, 0xa0, 0xbd, 0xed, 0xb8, 0x80]);
        assert_eq!(read(&bytes), Value::String("\u{1f600}".into()));
        // Four-byte UTF-8 from other writers counts as two units too.
        assert_eq!(
            read(b"\x03\xf0\x9f\x98\x80a"),
            Value::String("\u{1f600}a".into())
        );
        // Past 0x8000 units: 'R' chunks, then the final one.
        let long = "é".repeat(0x8000 + 5);
        let bytes = written(&Value::String(long.clone()));
        assert_eq!(&bytes[..3], b"R\x80\x00");
        assert_eq!(bytes[3 + 2 * 0x8000], 0x05);
        assert_eq!(read(&bytes), Value::String(long));
        // A chunk does not split a surrogate pair.
        let pairs = format!("{}{}", "a".repeat(0x7fff), "\u{1f600}");
        let bytes = written(&Value::String(pairs.clone()));
        assert_eq!(&bytes[..3], b"R\x7f\xff");
        assert_eq!(read(&bytes), Value::String(pairs));
        let bin = vec![7u8; 0x8000 + 1];
        let bytes = written(&Value::Binary(bin.clone()));
        assert_eq!(&bytes[..3], b"A\x80\x00");
        assert_eq!(read(&bytes), Value::Binary(bin));
    }

    #[test]
    fn bad_input_is_an_error() {
        for b in [
            &b""[..],
            b"S\x00\x05hel",
            b"H\x90",
            b"O\x90",
            b"Q\x90",
            b"X\xd7\xff\xff",
            b"\x01\xff",
            b"\x41\x00\x01",
            b"\x7f",
        ] {
            assert!(Reader::new(b).read().is_err(), "{b:02x?}");
        }
        // Deep nesting is refused, not followed.
        let deep = vec![0x79u8; 10_000];
        assert!(Reader::new(&deep).read().is_err());
    }
}
