//! Spec §1: the stages every request goes through, in order.

use std::net::IpAddr;

use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn allow_list() {
    let outside = IpAddr::from([10, 0, 0, 1]);
    // The default list is 127.0.0.0/24.
    let a = Admin::with(|o| o.allow_admin = Some(vec!["127.0.0.0/24".parse().unwrap()]));
    let r = a.call_from("GET", "/apisix/admin/routes", outside).await;
    assert_eq!(r.status, 403);
    assert!(r.text().contains("<h1>403 Forbidden</h1>"));
    assert_eq!(r.header("content-type"), Some("text/html"));
    assert_eq!(
        r.header("access-control-allow-origin"),
        None,
        "refused before APISIX runs"
    );
    let r = a.call("GET", "/apisix/admin/routes", None).await;
    assert_eq!(r.status, 200);
    // An IPv4-mapped IPv6 peer is the IPv4 address.
    let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
    let r = a.call_from("GET", "/apisix/admin/routes", mapped).await;
    assert_eq!(r.status, 200);

    let nobody = Admin::with(|o| o.allow_admin = Some(vec![]));
    let r = nobody.unkeyed("HEAD", "/apisix/admin", local()).await;
    assert_eq!(r.status, 403);

    let everyone = Admin::with(|o| o.allow_admin = None);
    let r = everyone.unkeyed("HEAD", "/apisix/admin", outside).await;
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn common_headers_and_content_type() {
    let a = Admin::new();
    let r = a.call("GET", "/apisix/admin/routes", None).await;
    assert_eq!(
        r.header("server"),
        Some(concat!("ferrisix/", env!("CARGO_PKG_VERSION")))
    );
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    assert_eq!(r.header("access-control-allow-credentials"), Some("true"));
    assert_eq!(r.header("access-control-expose-headers"), Some("*"));
    assert_eq!(r.header("access-control-max-age"), Some("3600"));
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("x-api-version"), Some("v3"));
    // Even a 401 is labelled JSON.
    let r = a.unkeyed("GET", "/apisix/admin/routes", local()).await;
    assert_eq!(r.header("content-type"), Some("application/json"));

    let no_cors = Admin::with(|o| o.cors = false);
    let r = no_cors.call("GET", "/apisix/admin/routes", None).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("access-control-allow-origin"), None);
}

#[tokio::test]
async fn preflight_needs_no_key() {
    let a = Admin::new();
    let r = a
        .unkeyed("OPTIONS", "/apisix/admin/routes/1", local())
        .await;
    assert_eq!(r.status, 200);
    assert!(r.body.is_empty());
    assert_eq!(r.header("content-type"), Some("text/plain"));
    assert_eq!(r.header("content-length"), Some("0"));
    assert_eq!(
        r.header("access-control-allow-methods"),
        Some("POST, GET, PUT, OPTIONS, DELETE, PATCH")
    );
    assert_eq!(r.header("access-control-allow-headers"), Some("*"));
    assert_eq!(r.header("access-control-allow-credentials"), Some("true"));
    assert_eq!(r.header("access-control-max-age"), Some("3600"));
    assert_eq!(r.header("access-control-expose-headers"), None);

    let no_cors = Admin::with(|o| o.cors = false);
    let r = no_cors
        .unkeyed("OPTIONS", "/apisix/admin/routes/1", local())
        .await;
    assert_eq!(r.status, 404);
    assert!(r.text().contains("404 Not Found"));
}

#[tokio::test]
async fn head_needs_no_key() {
    let a = Admin::new();
    let r = a.unkeyed("HEAD", "/apisix/admin", local()).await;
    assert_eq!(r.status, 200);
    assert!(r.body.is_empty());
    assert_eq!(r.header("x-api-version"), None);
    // HEAD elsewhere has no route.
    let r = a.call("HEAD", "/apisix/admin/routes", None).await;
    assert_eq!(r.status, 404);
}

#[tokio::test]
async fn unrouted_paths_get_nginx_pages() {
    let a = Admin::new();
    for (method, path) in [
        ("GET", "/apisix/admin"),
        ("GET", "/apisix/adminx"),
        ("GET", "/other"),
        ("TRACE", "/apisix/admin/routes"),
    ] {
        let r = a.call(method, path, None).await;
        assert_eq!(r.status, 404, "{method} {path}");
        assert!(
            r.text().contains("<h1>404 Not Found</h1>"),
            "{method} {path}"
        );
        assert_eq!(r.header("content-type"), Some("text/html"));
    }
    // Inside the admin location APISIX's headers are already set.
    let r = a.call("GET", "/apisix/adminx", None).await;
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    let r = a.call("GET", "/other", None).await;
    assert_eq!(r.header("access-control-allow-origin"), None);
}

#[tokio::test]
async fn resource_and_method_lookup() {
    let a = Admin::new();
    let r = a.json("PUT", "/apisix/admin/routs/111", route("/x")).await;
    r.expect(
        404,
        json!({"error_msg": "Unsupported resource type: routs"}),
    );
    assert_eq!(r.header("x-api-version"), None);
    // `schema` and `plugins` only answer GET.
    let r = a.json("PUT", "/apisix/admin/schema/route", json!({})).await;
    r.expect(404, json!({"error_msg": "not found"}));
    assert_eq!(r.header("x-api-version"), None);
    a.call("DELETE", "/apisix/admin/plugins/limit-count", None)
        .await
        .expect(404, json!({"error_msg": "not found"}));
    a.call("POST", "/apisix/admin/plugins/list", None)
        .await
        .expect(404, json!({"error_msg": "not found"}));
}

#[tokio::test]
async fn invalid_json_is_echoed() {
    let a = Admin::new();
    let r = a
        .call("PUT", "/apisix/admin/routes/122", Some("{abcd"))
        .await;
    r.expect(
        400,
        json!({
            "error_msg": "invalid request body: Expected object key string but found invalid token at character 2",
            "req_body": "{abcd"
        }),
    );
    assert_eq!(r.header("x-api-version"), None);
    a.call("PUT", "/apisix/admin/routes/122", Some("uri=/x")).await.expect(
        400,
        json!({"error_msg": "invalid request body: Expected value but found invalid token at character 1", "req_body": "uri=/x"}),
    );
    a.call("GET", "/apisix/admin/routes/122", None)
        .await
        .expect(404, json!({"message": "Key not found"}));
    // Even a GET's body must be JSON.
    let r = a
        .call(
            "GET",
            "/apisix/admin/routes?page=1&page_size=5",
            Some("page_size must be between 10 and 500"),
        )
        .await;
    assert_eq!(r.status, 400);
    assert!(r
        .error_msg()
        .starts_with("invalid request body: Expected value"));
}

#[tokio::test]
async fn deep_nesting_is_an_error_not_a_crash() {
    let a = Admin::new();
    let deep = format!("{{\"uri\":{}", "[".repeat(100_000));
    let r = a.call("PUT", "/apisix/admin/routes/1", Some(&deep)).await;
    assert_eq!(r.status, 400);
    assert!(r
        .error_msg()
        .starts_with("invalid request body: Found too many nested data structures (1001)"));
    // Nesting within the limit decodes and fails validation normally.
    let nested = format!(
        "{{\"uri\":\"/a\",\"desc\":{}1{}}}",
        "[".repeat(900),
        "]".repeat(900)
    );
    let r = a.call("PUT", "/apisix/admin/routes/1", Some(&nested)).await;
    assert_eq!(r.status, 400);
    assert!(
        r.error_msg()
            .starts_with("invalid configuration: property \"desc\""),
        "{}",
        r.text()
    );
}

#[tokio::test]
async fn body_limit() {
    let a = Admin::new();
    let big = format!("{{\"desc\":\"{}\"}}", "x".repeat(1_572_864));
    let r = a.call("PUT", "/apisix/admin/routes/1", Some(&big)).await;
    r.expect(
        400,
        json!({"error_msg": format!("invalid request body: request size {} is greater than the maximum size 1572864 allowed", big.len())}),
    );
    // A declared length is refused before anything is read.
    let r = a
        .send(
            req("PUT", "/apisix/admin/routes/1")
                .header("X-API-KEY", KEY)
                .header("Content-Length", "99999999")
                .body(body(""))
                .unwrap(),
            local(),
        )
        .await;
    r.expect(
        400,
        json!({"error_msg": "invalid request body: request size 99999999 is greater than the maximum size 1572864 allowed"}),
    );
    // Exactly at the limit is fine as far as the size goes.
    let edge = format!("\"{}\"", "x".repeat(1_572_862));
    let r = a
        .call("PATCH", "/apisix/admin/routes/1/desc", Some(&edge))
        .await;
    r.expect(404, json!({"message": "Key not found"}));
}

#[tokio::test]
async fn ttl_must_be_a_number() {
    let a = Admin::new();
    for q in ["ttl=xxx", "ttl", "ttl=", "ttl=1&ttl=2"] {
        let r = a
            .json("PUT", &format!("/apisix/admin/routes/1?{q}"), route("/a"))
            .await;
        r.expect(
            400,
            json!({"error_msg": "invalid argument ttl: should be a number"}),
        );
        assert_eq!(r.header("x-api-version"), None);
    }
    // Checked on every method.
    a.call("GET", "/apisix/admin/routes?ttl=x", None)
        .await
        .expect(
            400,
            json!({"error_msg": "invalid argument ttl: should be a number"}),
        );
}

#[tokio::test]
async fn request_content_type_is_ignored() {
    let a = Admin::new();
    let r = a
        .send(
            req("PUT", "/apisix/admin/routes/1")
                .header("X-API-KEY", KEY)
                .header("Content-Type", "application/x-www-form-urlencoded")
                .body(body(&route("/form").to_string()))
                .unwrap(),
            local(),
        )
        .await;
    r.expect(201, json!({"value": {"uri": "/form"}}));
}

#[tokio::test]
async fn trailing_slashes_and_encoded_paths() {
    let a = Admin::new();
    a.json("PUT", "/apisix/admin/routes/1/", route("/a"))
        .await
        .expect(201, json!({"key": "/apisix/routes/1"}));
    a.call("GET", "/apisix/admin/routes/", None)
        .await
        .expect(200, json!({"total": 1}));
    a.call("GET", "/apisix/admin//routes/%31", None)
        .await
        .expect(200, json!({"value": {"id": "1"}}));
}

#[tokio::test]
async fn store_failures_are_503_with_the_store_text() {
    let a = Admin::new();
    a.json("PUT", "/apisix/admin/routes/1", route("/a")).await;
    a.store.set_unavailable(Some("connection refused"));
    for (method, path, body) in [
        ("GET", "/apisix/admin/routes/1", None),
        ("GET", "/apisix/admin/routes", None),
        (
            "PUT",
            "/apisix/admin/routes/1",
            Some(route("/b").to_string()),
        ),
        (
            "POST",
            "/apisix/admin/routes",
            Some(route("/b").to_string()),
        ),
        (
            "PATCH",
            "/apisix/admin/routes/1",
            Some("{\"desc\":\"x\"}".to_string()),
        ),
        ("DELETE", "/apisix/admin/routes/1", None),
    ] {
        let r = a.call(method, path, body.as_deref()).await;
        r.expect(503, json!({"error_msg": "connection refused"}));
        assert_eq!(r.header("x-api-version"), Some("v3"));
    }
    a.store.set_unavailable(None);
    a.call("GET", "/apisix/admin/routes/1", None)
        .await
        .expect(200, json!({"value": {"uri": "/a"}}));
}
