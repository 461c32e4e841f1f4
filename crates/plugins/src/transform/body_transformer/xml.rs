//! XML bodies decoded as APISIX's body-transformer decodes them (xml2lua's tree handler, then
//! namespace prefixes removed): the document is a table holding its root element by name; an
//! element holding only text is that text, one without text or children `""`, others a table
//! of their children by name (a repeated name as the list of its elements), their attributes
//! under `_attr` and their text at index 1 (key `"1"` here, an integer key once in Lua). Entities and CDATA are decoded; the declaration,
//! comments, processing instructions and a DOCTYPE are skipped.

use serde_json::{Map, Value};

/// Nesting limit, so a hostile document cannot overflow the stack.
const MAX_DEPTH: usize = 256;

const FAIL: &str = "Error Parsing XML";

struct Parser<'a> {
    s: &'a str,
    pos: usize,
}

/// Drops a `prefix:` from a name.
fn local(name: &str) -> &str {
    name.rsplit_once(':').map_or(name, |(_, l)| l)
}

fn unescape(text: &str) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        let end = rest[i..].find(';').ok_or(FAIL)?;
        let ent = &rest[i + 1..i + end];
        match ent {
            "lt" => out.push('<'),
            "gt" => out.push('>'),
            "amp" => out.push('&'),
            "quot" => out.push('"'),
            "apos" => out.push('\''),
            _ => {
                let code =
                    if let Some(h) = ent.strip_prefix("#x").or_else(|| ent.strip_prefix("#X")) {
                        u32::from_str_radix(h, 16).ok()
                    } else if let Some(d) = ent.strip_prefix('#') {
                        d.parse().ok()
                    } else {
                        None
                    };
                out.push(code.and_then(char::from_u32).ok_or(FAIL)?);
            }
        }
        rest = &rest[i + end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

impl Parser<'_> {
    fn rest(&self) -> &str {
        &self.s[self.pos..]
    }

    fn skip_ws(&mut self) {
        let t = self.rest().trim_start();
        self.pos = self.s.len() - t.len();
    }

    fn skip_until(&mut self, end: &str) -> Result<(), String> {
        let i = self.rest().find(end).ok_or(FAIL)?;
        self.pos += i + end.len();
        Ok(())
    }

    /// Skips declarations, comments, processing instructions and DOCTYPE.
    fn misc(&mut self) -> Result<(), String> {
        loop {
            self.skip_ws();
            let r = self.rest();
            if r.starts_with("<?") {
                self.skip_until("?>")?;
            } else if r.starts_with("<!--") {
                self.skip_until("-->")?;
            } else if r.starts_with("<!DOCTYPE") || r.starts_with("<!doctype") {
                self.skip_until(">")?;
            } else {
                return Ok(());
            }
        }
    }

    fn name(&mut self) -> Result<String, String> {
        let r = self.rest();
        let n = r
            .find(|c: char| c.is_whitespace() || matches!(c, '>' | '/' | '='))
            .unwrap_or(r.len());
        if n == 0 {
            return Err(FAIL.into());
        }
        let name = r[..n].to_owned();
        self.pos += n;
        Ok(name)
    }

    /// One element; `self.pos` at its `<`.
    fn element(&mut self, depth: usize) -> Result<(String, Value), String> {
        if depth > MAX_DEPTH {
            return Err(FAIL.into());
        }
        self.pos += 1;
        let name = self.name()?;
        let mut attrs = Map::new();
        loop {
            self.skip_ws();
            if self.rest().starts_with("/>") {
                self.pos += 2;
                let node = if attrs.is_empty() {
                    Value::String(String::new())
                } else {
                    let mut m = Map::new();
                    m.insert("_attr".into(), Value::Object(attrs));
                    Value::Object(m)
                };
                return Ok((local(&name).to_owned(), node));
            }
            if self.rest().starts_with('>') {
                self.pos += 1;
                break;
            }
            let a = self.name()?;
            self.skip_ws();
            if !self.rest().starts_with('=') {
                return Err(FAIL.into());
            }
            self.pos += 1;
            self.skip_ws();
            let q = self.rest().chars().next().ok_or(FAIL)?;
            if q != '"' && q != '\'' {
                return Err(FAIL.into());
            }
            self.pos += 1;
            let end = self.rest().find(q).ok_or(FAIL)?;
            let v = unescape(&self.rest()[..end])?;
            self.pos += end + 1;
            attrs.insert(local(&a).to_owned(), Value::String(v));
        }
        let mut children: Map<String, Value> = Map::new();
        let mut text = String::new();
        loop {
            let r = self.rest();
            if r.is_empty() {
                return Err(FAIL.into());
            }
            if r.starts_with("</") {
                self.pos += 2;
                let close = self.name()?;
                self.skip_ws();
                if close != name || !self.rest().starts_with('>') {
                    return Err(FAIL.into());
                }
                self.pos += 1;
                break;
            }
            if r.starts_with("<![CDATA[") {
                let end = r.find("]]>").ok_or(FAIL)?;
                text.push_str(&r[9..end]);
                self.pos += end + 3;
            } else if r.starts_with("<!--") {
                self.skip_until("-->")?;
            } else if r.starts_with("<?") {
                self.skip_until("?>")?;
            } else if r.starts_with('<') {
                let (k, v) = self.element(depth + 1)?;
                match children.get_mut(&k) {
                    // A child is text or an object: an array is a repetition already.
                    Some(Value::Array(list)) => list.push(v),
                    Some(prev) => {
                        let first = prev.take();
                        *prev = Value::Array(vec![first, v]);
                    }
                    None => {
                        children.insert(k, v);
                    }
                }
            } else {
                let end = r.find('<').unwrap_or(r.len());
                text.push_str(&unescape(&r[..end])?);
                self.pos += end;
            }
        }
        let text = text.trim();
        let node = if children.is_empty() && attrs.is_empty() {
            Value::String(text.to_owned())
        } else {
            if !attrs.is_empty() {
                children.insert("_attr".into(), Value::Object(attrs));
            }
            if !text.is_empty() {
                children.insert("1".into(), Value::String(text.to_owned()));
            }
            Value::Object(children)
        };
        Ok((local(&name).to_owned(), node))
    }
}

/// Decodes `text`; the error is xml2lua's message.
pub fn decode(text: &str) -> Result<Value, String> {
    let mut p = Parser { s: text, pos: 0 };
    p.misc()?;
    if !p.rest().starts_with('<') {
        return Err(FAIL.into());
    }
    let (name, node) = p.element(0)?;
    p.misc()?;
    if !p.rest().is_empty() {
        return Err(FAIL.into());
    }
    let mut root = Map::new();
    root.insert(name, node);
    Ok(Value::Object(root))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn soap_envelope() {
        let doc = decode(
            "<?xml version=\"1.0\"?><soap-env:Envelope xmlns:soap-env=\"u\"><soap-env:Body>\
             <ns0:r><ns0:name>Spain &amp; co</ns0:name><ns0:x/><ns0:i>1</ns0:i><ns0:i>2</ns0:i>\
             <f xml:lang=\"en\">oops</f></ns0:r></soap-env:Body></soap-env:Envelope>",
        )
        .unwrap();
        assert_eq!(
            doc["Envelope"]["Body"]["r"],
            json!({"name": "Spain & co", "x": "", "i": ["1", "2"],
                   "f": {"_attr": {"lang": "en"}, "1": "oops"}})
        );
        assert_eq!(decode("{\"a\": 1}").unwrap_err(), "Error Parsing XML");
        assert!(decode("<a><b></a>").is_err());
        assert!(decode(&"<a>".repeat(1000)).is_err());
    }
}
