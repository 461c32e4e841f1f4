//! error-page end to end: a global rule with the plugin and `plugin_metadata/error-page`
//! replace the gateway's own 404 (no route) and 502 (upstream down) answers, and leave the
//! upstream's own 404 alone; disabling the metadata brings the plain answers back.

use std::time::Duration;

use serde_json::json;

use crate::support::{self, Behaviour, StoreGatewayBuilder, Upstream};

#[test]
fn gateway_errors_get_the_metadata_pages() {
    let gw = StoreGatewayBuilder::embedded().start();
    let up = Upstream::start("nf", Behaviour::Status(404));
    let meta = json!({"enable": true,
        "error_404": {"body": "custom 404", "content_type": "text/plain"},
        "error_502": {}});
    let r = gw.admin(
        "PUT",
        "/apisix/admin/plugin_metadata/error-page",
        &meta.to_string(),
    );
    assert!(matches!(r.status, 200 | 201), "{}", r.text());
    let r = gw.admin(
        "PUT",
        "/apisix/admin/global_rules/ep",
        &json!({"plugins": {"error-page": {}}}).to_string(),
    );
    assert!(matches!(r.status, 200 | 201), "{}", r.text());
    gw.put_route(
        "dead",
        &json!({"uri": "/dead", "upstream": {"type": "roundrobin",
            "nodes": {support::dead_node(): 1}}}),
    );
    gw.put_route(
        "nf",
        &json!({"uri": "/nf", "upstream": {"type": "roundrobin",
            "nodes": {up.node(): 1}}}),
    );

    // /nf's route is served once its 404 is the upstream's (empty); before, no route matches
    // and the gateway's own 404 is the custom page.
    let served = support::poll_until(Duration::from_secs(10), || {
        let nf = support::get(gw.data_addr(), "/nf");
        nf.status == 404
            && nf.text().is_empty()
            && support::get(gw.data_addr(), "/dead").status == 502
            && support::get(gw.data_addr(), "/nowhere").text() == "custom 404"
    });
    assert!(served.is_some(), "the configuration is served");
    let r = support::get(gw.data_addr(), "/nowhere");
    assert_eq!(r.status, 404);
    assert_eq!(r.header("content-type"), Some("text/plain"));
    assert_eq!(r.header("content-length"), Some("10"));
    let r = support::get(gw.data_addr(), "/dead");
    assert_eq!(r.status, 502);
    assert_eq!(r.header("content-type"), Some("text/html"));
    assert!(
        r.text()
            .contains("<center><h1>502 Bad Gateway</h1></center>"),
        "{}",
        r.text()
    );
    // The upstream's own 404 is its answer.
    let r = support::get(gw.data_addr(), "/nf");
    assert_eq!(r.status, 404);
    assert_eq!(r.text(), "");

    // Off again: the gateway's plain answers.
    let r = gw.admin(
        "PUT",
        "/apisix/admin/plugin_metadata/error-page",
        &json!({"enable": false}).to_string(),
    );
    assert!(matches!(r.status, 200 | 201), "{}", r.text());
    let plain = support::poll_until(Duration::from_secs(10), || {
        support::get(gw.data_addr(), "/nowhere").text() != "custom 404"
    });
    assert!(plain.is_some());
    assert!(support::get(gw.data_addr(), "/dead")
        .text()
        .contains("502 Bad Gateway"));
}
