//! The request path as nginx's `$uri` presents it to APISIX, and its segments.

/// nginx's normalised `$uri`: `%XX` decoded, runs of `/` merged (`merge_slashes on`), `.` and
/// `..` segments resolved. `None` when `..` climbs above the root (nginx answers 400).
pub fn normalize(raw: &str) -> Option<String> {
    let decoded = percent_encoding::percent_decode_str(raw).decode_utf8_lossy();
    let trailing = decoded.ends_with('/') || decoded.ends_with("/.") || decoded.ends_with("/..");
    let mut out: Vec<&str> = Vec::new();
    for seg in decoded.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                out.pop()?;
            }
            s => out.push(s),
        }
    }
    let mut uri = String::with_capacity(decoded.len() + 1);
    for seg in &out {
        uri.push('/');
        uri.push_str(seg);
    }
    if trailing || out.is_empty() {
        uri.push('/');
    }
    Some(uri)
}

/// The segments of a normalised uri, without empty ones: `ngx.re.split(uri, "/")` drops the
/// trailing empty fields, so `/routes/1/` and `/routes/1` read the same.
pub fn segments(uri: &str) -> Vec<String> {
    uri.split('/')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nginx_normalisation() {
        assert_eq!(
            normalize("/apisix/admin/routes/1").as_deref(),
            Some("/apisix/admin/routes/1")
        );
        assert_eq!(
            normalize("/apisix//admin/routes/").as_deref(),
            Some("/apisix/admin/routes/")
        );
        assert_eq!(
            normalize("/apisix/admin/./routes/%31").as_deref(),
            Some("/apisix/admin/routes/1")
        );
        assert_eq!(
            normalize("/apisix/x/../admin").as_deref(),
            Some("/apisix/admin")
        );
        assert_eq!(normalize("/../x"), None);
        assert_eq!(normalize("/").as_deref(), Some("/"));
    }

    #[test]
    fn segments_drop_empty_fields() {
        assert_eq!(
            segments("/apisix/admin/routes/"),
            ["apisix", "admin", "routes"]
        );
        assert_eq!(
            segments("/apisix/admin/routes/1/upstream/nodes"),
            ["apisix", "admin", "routes", "1", "upstream", "nodes"]
        );
    }
}
