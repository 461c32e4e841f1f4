//! The embedded dashboard (`deployment.admin.enable_admin_ui`): a directory of static files
//! served at `/ui/` on the Admin port, as APISIX's nginx template serves `<apisix home>/ui`:
//!
//! * `location = /ui` answers `301` to the relative `/ui/` (`absolute_redirect off`);
//! * `location ^~ /ui/` strips `/ui`, then `try_files $uri /index.html =404`: a file of the
//!   directory, else its `index.html` (the single-page application's fallback), else 404;
//! * `expires 7200s` plus `add_header Cache-Control "private,max-age=7200"`, `gzip on` for
//!   HTML, CSS, JavaScript and JSON.
//!
//! Beyond nginx (which follows symlinks wherever they point): nothing outside the directory
//! is served. Every candidate is resolved (`..`, symlinks) and must stay under the resolved
//! directory, otherwise it counts as missing.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{
    ACCEPT_ENCODING, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, ETAG, EXPIRES,
    IF_MODIFIED_SINCE, IF_NONE_MATCH, LAST_MODIFIED, LOCATION, SERVER,
};
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode};
use http_body_util::Full;

use crate::response::nginx_page;

/// `expires 7200s`.
const MAX_AGE: Duration = Duration::from_secs(7200);

/// Files larger than this are not read into memory (a dashboard build's largest bundle is a
/// few MiB); they answer 404 as an unreadable file would.
const MAX_FILE: u64 = 64 * 1024 * 1024;

/// Whether `uri` (normalised) is the dashboard's: `/ui` or under `/ui/`.
pub fn is_ui_path(uri: &str) -> bool {
    uri == "/ui" || uri.starts_with("/ui/")
}

/// Answers a request for `/ui` or `/ui/...` from `root`.
pub async fn serve(
    root: &Path,
    parts: &Parts,
    uri: &str,
    server: &HeaderValue,
) -> Response<Full<Bytes>> {
    let server_name = server.to_str().unwrap_or("ferrisix");
    if uri == "/ui" {
        let mut resp = page(StatusCode::MOVED_PERMANENTLY, server_name, server);
        resp.headers_mut()
            .insert(LOCATION, HeaderValue::from_static("/ui/"));
        return resp;
    }
    let rel = &uri["/ui".len()..];
    let found = match resolve(root, rel).await {
        Some(f) => Some(f),
        None => resolve(root, "/index.html").await,
    };
    let Some(file) = found else {
        return page(StatusCode::NOT_FOUND, server_name, server);
    };
    // nginx's static module serves only GET and HEAD.
    if parts.method != Method::GET && parts.method != Method::HEAD {
        return page(StatusCode::METHOD_NOT_ALLOWED, server_name, server);
    }
    let Ok(meta) = tokio::fs::metadata(&file).await else {
        return page(StatusCode::NOT_FOUND, server_name, server);
    };
    if meta.len() > MAX_FILE {
        return page(StatusCode::NOT_FOUND, server_name, server);
    }
    let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
    let mtime = modified
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let last_modified =
        httpdate::fmt_http_date(SystemTime::UNIX_EPOCH + Duration::from_secs(mtime));
    let etag = format!("\"{mtime:x}-{:x}\"", meta.len());
    let content_type = mime_type(&file);

    let mut headers = HeaderMap::new();
    headers.insert(SERVER, server.clone());
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    if let Ok(v) = HeaderValue::from_str(&last_modified) {
        headers.insert(LAST_MODIFIED, v);
    }
    if let Ok(v) = HeaderValue::from_str(&httpdate::fmt_http_date(SystemTime::now() + MAX_AGE)) {
        headers.insert(EXPIRES, v);
    }
    // `expires` sets one Cache-Control, `add_header` appends the other.
    headers.append(CACHE_CONTROL, HeaderValue::from_static("max-age=7200"));
    headers.append(
        CACHE_CONTROL,
        HeaderValue::from_static("private,max-age=7200"),
    );

    let not_modified = match parts.headers.get(IF_NONE_MATCH) {
        Some(v) => v
            .to_str()
            .is_ok_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*")),
        None => parts
            .headers
            .get(IF_MODIFIED_SINCE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v == last_modified),
    };
    if not_modified {
        if let Ok(v) = HeaderValue::from_str(&etag) {
            headers.insert(ETAG, v);
        }
        let mut resp = Response::new(Full::new(Bytes::new()));
        *resp.status_mut() = StatusCode::NOT_MODIFIED;
        *resp.headers_mut() = headers;
        return resp;
    }

    let Ok(content) = tokio::fs::read(&file).await else {
        return page(StatusCode::NOT_FOUND, server_name, server);
    };
    let gzip = compressible(content_type) && accepts_gzip(&parts.headers);
    let body = if gzip {
        match gzip_bytes(&content) {
            Some(z) => {
                headers.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
                // nginx's gzip filter weakens the entity tag of what it compresses.
                if let Ok(v) = HeaderValue::from_str(&format!("W/{etag}")) {
                    headers.insert(ETAG, v);
                }
                z
            }
            None => content,
        }
    } else {
        if let Ok(v) = HeaderValue::from_str(&etag) {
            headers.insert(ETAG, v);
        }
        headers.insert(
            http::header::ACCEPT_RANGES,
            HeaderValue::from_static("bytes"),
        );
        content
    };
    headers.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    let body = if parts.method == Method::HEAD {
        Bytes::new()
    } else {
        Bytes::from(body)
    };
    let mut resp = Response::new(Full::new(body));
    *resp.headers_mut() = headers;
    resp
}

/// `try_files`' file test, confined: `rel` (normalised, starting with `/`) under `root` names
/// a regular file whose resolved path stays inside the resolved `root`.
async fn resolve(root: &Path, rel: &str) -> Option<PathBuf> {
    let root = tokio::fs::canonicalize(root).await.ok()?;
    let mut candidate = root.clone();
    for seg in rel.split('/').filter(|s| !s.is_empty()) {
        // The path was normalised already; a `..` or NUL left here is refused, not resolved.
        if seg == "." || seg == ".." || seg.contains('\0') {
            return None;
        }
        candidate.push(seg);
    }
    if candidate == root {
        return None;
    }
    let real = tokio::fs::canonicalize(&candidate).await.ok()?;
    if !real.starts_with(&root) {
        tracing::warn!(path = %candidate.display(), "admin ui: refused a file outside the ui directory");
        return None;
    }
    let meta = tokio::fs::metadata(&real).await.ok()?;
    meta.is_file().then_some(real)
}

fn page(status: StatusCode, server_name: &str, server: &HeaderValue) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(nginx_page(status, server_name)));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(SERVER, server.clone());
    h.insert(CONTENT_TYPE, HeaderValue::from_static("text/html"));
    resp
}

/// nginx's `mime.types` for what a dashboard build holds; anything else is
/// `default_type application/octet-stream`.
fn mime_type(path: &Path) -> &'static str {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    match ext.as_str() {
        "html" | "htm" | "shtml" => "text/html",
        "css" => "text/css",
        "js" => "application/javascript",
        "json" => "application/json",
        "map" => "application/octet-stream",
        "txt" => "text/plain",
        "xml" => "text/xml",
        "svg" | "svgz" => "image/svg+xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "ico" => "image/x-icon",
        "webp" => "image/webp",
        "woff" => "font/woff",
        "woff2" => "font/woff2",
        "ttf" => "application/octet-stream",
        "wasm" => "application/wasm",
        _ => "application/octet-stream",
    }
}

/// `gzip_types text/css application/javascript application/json`, plus `text/html`, which
/// nginx always compresses.
fn compressible(content_type: &str) -> bool {
    matches!(
        content_type,
        "text/html" | "text/css" | "application/javascript" | "application/json"
    )
}

fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|coding| {
            let mut parts = coding.split(';');
            let name = parts.next().unwrap_or("").trim();
            let refused = parts.any(|p| {
                p.trim()
                    .strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    .is_some_and(|q| q == 0.0)
            });
            name.eq_ignore_ascii_case("gzip") && !refused
        })
}

fn gzip_bytes(content: &[u8]) -> Option<Vec<u8>> {
    // nginx's `gzip_comp_level` default.
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(1));
    enc.write_all(content).ok()?;
    enc.finish().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ui_paths() {
        assert!(is_ui_path("/ui"));
        assert!(is_ui_path("/ui/"));
        assert!(is_ui_path("/ui/assets/a.js"));
        assert!(!is_ui_path("/uix"));
        assert!(!is_ui_path("/apisix/admin/ui"));
    }

    #[test]
    fn gzip_acceptance() {
        let mut h = HeaderMap::new();
        assert!(!accepts_gzip(&h));
        h.insert(ACCEPT_ENCODING, HeaderValue::from_static("br, gzip;q=0.5"));
        assert!(accepts_gzip(&h));
        h.insert(ACCEPT_ENCODING, HeaderValue::from_static("gzip;q=0"));
        assert!(!accepts_gzip(&h));
    }

    #[test]
    fn types() {
        assert_eq!(mime_type(Path::new("a/index.html")), "text/html");
        assert_eq!(mime_type(Path::new("a/x.JS")), "application/javascript");
        assert_eq!(mime_type(Path::new("a/x")), "application/octet-stream");
    }

    #[tokio::test]
    async fn nothing_outside_the_directory_resolves() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ui");
        std::fs::create_dir_all(root.join("assets")).unwrap();
        std::fs::write(root.join("index.html"), "<html>").unwrap();
        std::fs::write(root.join("assets/a.js"), "1").unwrap();
        std::fs::write(dir.path().join("secret"), "s").unwrap();
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(dir.path().join("secret"), root.join("out")).unwrap();
            std::os::unix::fs::symlink(root.join("assets/a.js"), root.join("in")).unwrap();
        }
        assert!(resolve(&root, "/assets/a.js").await.is_some());
        assert!(resolve(&root, "/").await.is_none());
        assert!(
            resolve(&root, "/assets").await.is_none(),
            "directories are not files"
        );
        assert!(resolve(&root, "/../secret").await.is_none());
        assert!(resolve(&root, "/assets/../../secret").await.is_none());
        #[cfg(unix)]
        {
            assert!(resolve(&root, "/out").await.is_none());
            assert!(resolve(&root, "/in").await.is_some());
        }
    }
}
