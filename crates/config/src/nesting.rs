//! A bound on YAML nesting, checked before the document is parsed.
//!
//! serde_yaml (libyaml) takes time quadratic in the nesting depth before its own recursion
//! limit (128) refuses a document: 100k nested `[` in 200 KB took 30 s. This scan is linear
//! and errs on the side of counting too deep, never too shallow: flow collections (`[`, `{`),
//! block indentation levels, and compact block entries (`- - - x`) all count; quoted scalars,
//! comments and block scalars (`|`, `>`) do not.

/// Deeper than this is refused. Above serde_yaml's own limit (128), so nothing it would accept
/// is refused here: the scan only saves the time a hostile document would cost.
pub const MAX_YAML_DEPTH: usize = 256;

/// `Err` with a message naming the line when `text` nests deeper than [`MAX_YAML_DEPTH`].
pub fn check_yaml_depth(text: &str) -> Result<(), String> {
    let mut scan = Scan::default();
    for (n, line) in text.lines().enumerate() {
        if let Some(depth) = scan.line(line) {
            if depth > MAX_YAML_DEPTH {
                return Err(format!(
                    "line {}: YAML nested deeper than {MAX_YAML_DEPTH} levels; refused before parsing",
                    n + 1
                ));
            }
        }
    }
    Ok(())
}

#[derive(Default)]
struct Scan {
    /// Indentation of the open block collections.
    indents: Vec<usize>,
    flow: usize,
    /// Inside a quoted scalar that continues on the next line.
    quote: Option<u8>,
    /// Lines indented deeper than this belong to a block scalar.
    block_scalar: Option<usize>,
}

impl Scan {
    /// Scans one line; returns the deepest nesting seen on it.
    fn line(&mut self, line: &str) -> Option<usize> {
        let bytes = line.as_bytes();
        let indent = bytes.iter().take_while(|b| **b == b' ').count();
        let content = &bytes[indent..];
        if let Some(parent) = self.block_scalar {
            if content.is_empty() || indent > parent {
                return None;
            }
            self.block_scalar = None;
        }
        let mut depth = 0;
        let mut i = 0;
        if self.quote.is_none() && self.flow == 0 {
            if content.is_empty() || content[0] == b'#' {
                return None;
            }
            while self.indents.last().is_some_and(|top| *top >= indent) {
                self.indents.pop();
            }
            self.indents.push(indent);
            // Compact entries: `- - x` and `? x` open one collection each.
            while i < content.len()
                && matches!(content[i], b'-' | b'?')
                && content.get(i + 1).is_none_or(|b| *b == b' ')
            {
                depth += 1;
                i += 2;
                while content.get(i) == Some(&b' ') {
                    i += 1;
                }
            }
            depth += self.indents.len();
        }
        let mut deepest = depth + self.flow;
        let mut last_token_start = i;
        let mut prev_space = true;
        while i < content.len() {
            let b = content[i];
            if let Some(q) = self.quote {
                if q == b'"' && b == b'\\' {
                    i += 2;
                    continue;
                }
                if b == q {
                    if q == b'\'' && content.get(i + 1) == Some(&b'\'') {
                        i += 2;
                        continue;
                    }
                    self.quote = None;
                }
                i += 1;
                prev_space = false;
                continue;
            }
            match b {
                b'#' if prev_space => break,
                b'"' | b'\'' if prev_space || self.flow > 0 => self.quote = Some(b),
                b'[' | b'{' => {
                    self.flow += 1;
                    deepest = deepest.max(depth + self.flow);
                }
                b']' | b'}' => self.flow = self.flow.saturating_sub(1),
                _ => {}
            }
            if b == b' ' || b == b'\t' {
                last_token_start = i + 1;
            }
            prev_space = matches!(b, b' ' | b'\t' | b'[' | b'{' | b',');
            i += 1;
        }
        // `key: |`, `- >-`: the more indented lines that follow are text.
        if self.quote.is_none() && self.flow == 0 {
            let last = &content[last_token_start.min(content.len())..i.min(content.len())];
            let last = trim_end(last);
            if matches!(last.first(), Some(b'|' | b'>'))
                && last[1..]
                    .iter()
                    .all(|c| c.is_ascii_digit() || matches!(c, b'+' | b'-'))
            {
                self.block_scalar = Some(indent);
            }
        }
        Some(deepest)
    }
}

fn trim_end(b: &[u8]) -> &[u8] {
    let end = b
        .iter()
        .rposition(|c| !matches!(c, b' ' | b'\t'))
        .map_or(0, |p| p + 1);
    &b[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 8, finding 9: 100k nested `[` is refused at once (serde_yaml took 30 s).
    #[test]
    fn hostile_nesting_is_refused_before_parsing() {
        let started = std::time::Instant::now();
        let flow = "[".repeat(100_000);
        assert!(check_yaml_depth(&flow)
            .unwrap_err()
            .contains("deeper than 256"));
        let compact = format!("{}x\n", "- ".repeat(100_000));
        assert!(check_yaml_depth(&compact).is_err());
        let maps = "{a: ".repeat(100_000);
        assert!(check_yaml_depth(&maps).is_err());
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }

    #[test]
    fn ordinary_documents_pass() {
        let doc = r#"
routes:
  - uri: /a   # [[[[ a comment
    vars: [["arg_x", "==", "[[[["], ["http_y", "~~", '{{{{']]
    plugins:
      limit-count: {count: 1, time_window: 60}
    desc: |
      [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[
    name: "a [ { b"
#END
"#;
        assert_eq!(check_yaml_depth(doc), Ok(()));
        let deep_but_fine = format!("{}{}", "[".repeat(100), "]".repeat(100));
        assert_eq!(check_yaml_depth(&deep_but_fine), Ok(()));
        let json = serde_json::json!({"a": [[{"b": "]]]]{{{{\"\\"}]]}).to_string();
        assert_eq!(check_yaml_depth(&json), Ok(()));
    }
}
