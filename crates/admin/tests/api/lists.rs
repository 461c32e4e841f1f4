//! Spec §5.5: list order, filters and paging.

use ferrisix_config::store::Store;
use serde_json::json;

use crate::support::*;

async fn ids(a: &Admin, path: &str) -> Vec<String> {
    let v = a.call("GET", path, None).await.json();
    v["list"]
        .as_array()
        .map(|l| {
            l.iter()
                .map(|i| {
                    i["key"]
                        .as_str()
                        .unwrap()
                        .rsplit('/')
                        .next()
                        .unwrap()
                        .to_string()
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn key_order_without_paging_creation_order_with_it() {
    let a = Admin::new();
    for id in ["2", "10", "1"] {
        a.json(
            "PUT",
            &format!("/apisix/admin/routes/{id}"),
            route(&format!("/r{id}")),
        )
        .await;
    }
    assert_eq!(ids(&a, "/apisix/admin/routes").await, ["1", "10", "2"]);
    assert_eq!(
        ids(&a, "/apisix/admin/routes?page=1&page_size=10").await,
        ["2", "10", "1"]
    );
    // An update keeps the createdIndex.
    a.json("PUT", "/apisix/admin/routes/2", route("/again"))
        .await;
    assert_eq!(
        ids(&a, "/apisix/admin/routes?page=1&page_size=10").await,
        ["2", "10", "1"]
    );
}

#[tokio::test]
async fn empty_list_and_placeholders() {
    let a = Admin::new();
    let r = a.call("GET", "/apisix/admin/routes", None).await;
    assert_eq!(r.text(), "{\"list\":[],\"total\":0}\n");
    // `apisix init` writes `init_dir` placeholders; they are not items.
    a.store
        .put("/apisix/routes/", b"init_dir".to_vec(), None)
        .await
        .unwrap();
    a.call("GET", "/apisix/admin/routes", None)
        .await
        .expect(200, json!({"list": [], "total": 0}));
}

#[tokio::test]
async fn filters() {
    let a = Admin::new();
    let mut r1 = route("/api/one");
    r1["name"] = json!("1");
    let mut r2 = route("/x");
    r2["name"] = json!("10");
    r2["uri"] = serde_json::Value::Null;
    r2.as_object_mut().unwrap().remove("uri");
    r2["uris"] = json!(["/b", "/api/two"]);
    let mut r3 = route("/c");
    r3["labels"] = json!({"env": "prod"});
    a.json("PUT", "/apisix/admin/routes/1", r1)
        .await
        .expect(201, json!({}));
    a.json("PUT", "/apisix/admin/routes/2", r2)
        .await
        .expect(201, json!({}));
    a.json("PUT", "/apisix/admin/routes/3", r3)
        .await
        .expect(201, json!({}));
    assert_eq!(ids(&a, "/apisix/admin/routes?name=1").await, ["1", "2"]);
    assert_eq!(ids(&a, "/apisix/admin/routes?name=nil").await, ["3"]);
    assert_eq!(ids(&a, "/apisix/admin/routes?uri=api").await, ["1", "2"]);
    assert_eq!(ids(&a, "/apisix/admin/routes?label=env").await, ["3"]);
    assert_eq!(
        ids(&a, "/apisix/admin/routes?label=prod").await,
        Vec::<String>::new()
    );
    // Filter, then total, then paging.
    a.call(
        "GET",
        "/apisix/admin/routes?name=1&page=1&page_size=10",
        None,
    )
    .await
    .expect(200, json!({"total": 2}));
}

#[tokio::test]
async fn filter_argument_compares_without_conversion() {
    let a = Admin::new();
    a.json(
        "PUT",
        "/apisix/admin/upstreams/1",
        json!({"nodes": {"127.0.0.1:1": 1}}),
    )
    .await;
    a.json(
        "PUT",
        "/apisix/admin/routes/1",
        json!({"uri": "/a", "upstream_id": "1"}),
    )
    .await
    .expect(201, json!({}));
    a.json(
        "PUT",
        "/apisix/admin/routes/2",
        json!({"uri": "/b", "upstream_id": 1}),
    )
    .await
    .expect(201, json!({}));
    a.json("PUT", "/apisix/admin/routes/3", route("/c")).await;
    assert_eq!(
        ids(&a, "/apisix/admin/routes?filter=upstream_id%3D1").await,
        ["1"]
    );
    // Unsupported keys are ignored.
    assert_eq!(
        ids(&a, "/apisix/admin/routes?filter=desc%3Dx").await,
        ["1", "2", "3"]
    );
    // Only routes (and stream routes) know `filter`.
    a.json(
        "PUT",
        "/apisix/admin/services/1",
        json!({"upstream_id": "1"}),
    )
    .await;
    assert_eq!(
        ids(&a, "/apisix/admin/services?filter=upstream_id%3D9").await,
        ["1"]
    );
}

#[tokio::test]
async fn paging_bounds() {
    let a = Admin::new();
    for i in 1..=12 {
        a.json("PUT", &format!("/apisix/admin/routes/{i}"), route("/p"))
            .await;
    }
    let r = a
        .call("GET", "/apisix/admin/routes?page=2&page_size=10", None)
        .await;
    r.expect(200, json!({"total": 12}));
    assert_eq!(r.json()["list"].as_array().unwrap().len(), 2);
    let r = a
        .call("GET", "/apisix/admin/routes?page=3&page_size=10", None)
        .await;
    assert_eq!(r.json()["list"], json!({}));
    // page below 1 is page 1; one argument alone does not page.
    assert_eq!(
        ids(&a, "/apisix/admin/routes?page=-3&page_size=10")
            .await
            .len(),
        10
    );
    assert_eq!(ids(&a, "/apisix/admin/routes?page=1").await.len(), 12);
    assert_eq!(
        a.call("GET", "/apisix/admin/routes?page=1&page_size=x", None)
            .await
            .json()["total"],
        12
    );
    for size in ["9", "501"] {
        let r = a
            .call(
                "GET",
                &format!("/apisix/admin/routes?page=1&page_size={size}"),
                None,
            )
            .await;
        assert_eq!(
            (r.status, r.text().as_str()),
            (400, "page_size must be between 10 and 500")
        );
        assert_eq!(r.header("x-api-version"), Some("v3"));
    }
    // A huge page number is simply empty.
    let r = a
        .call("GET", "/apisix/admin/routes?page=1e300&page_size=10", None)
        .await;
    assert_eq!(r.json()["list"], json!({}));
}
