//! `discovery.eureka`: the whole registry (`GET <host><prefix>apps`) every `fetch_interval`
//! seconds, from the first of the `host` list (tried from a random one) that answers.
//!
//! As APISIX's module: an instance serves when its status (or its overridden status, unless
//! `UNKNOWN`) is `UP`; its port is `port.$` when enabled, `securePort.$` when that is enabled;
//! its weight is `metadata.weight`, else `weight` (default 100). `service_name` is the
//! application's name as Eureka lists it. A host written `http://user:password@host:port`
//! is called with basic auth; certificates are not verified (as APISIX).

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use ferrisix_config::settings::discovery::EurekaSettings;
use ferrisix_plugin_api::{Executor, HttpClient, TlsClient};
use http::Method;
use serde_json::Value;

use super::consul::nodes_json;
use super::fetch::{self, call};
use super::{DiscoveredNode, DiscoveryEnv, Lookup, Part, Publisher, ServiceMap};

pub struct Eureka {
    part: Arc<Part>,
    settings: EurekaSettings,
}

/// One list or a single object (Eureka's JSON writes a one-item list as the item).
fn items(v: Option<&Value>) -> Vec<&Value> {
    match v {
        Some(Value::Array(a)) => a.iter().collect(),
        Some(o @ Value::Object(_)) => vec![o],
        _ => Vec::new(),
    }
}

fn enabled(v: &Value) -> bool {
    match v.get("@enabled") {
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => s == "true",
        _ => false,
    }
}

fn instance(i: &Value, default_weight: u32) -> Option<DiscoveredNode> {
    let mut status = i.get("status").and_then(Value::as_str).unwrap_or("");
    if let Some(o) = i
        .get("overriddenstatus")
        .or_else(|| i.get("overriddenStatus"))
        .and_then(Value::as_str)
    {
        if o != "UNKNOWN" {
            status = o;
        }
    }
    if status != "UP" {
        return None;
    }
    let num = |p: &Value| {
        p.get("$")
            .and_then(|v| {
                v.as_u64()
                    .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            })
            .and_then(|v| u16::try_from(v).ok())
    };
    let mut port = None;
    if let Some(p) = i.get("port").filter(|p| enabled(p)) {
        port = num(p);
    }
    if let Some(p) = i.get("securePort").filter(|p| enabled(p)) {
        port = num(p).or(port);
    }
    let port = port?;
    let ip = i.get("ipAddr").and_then(Value::as_str)?;
    let mut metadata = i.get("metadata").and_then(Value::as_object).cloned();
    let weight = metadata
        .as_mut()
        .and_then(|m| m.remove("weight"))
        .and_then(|w| {
            w.as_u64()
                .or_else(|| w.as_str().and_then(|s| s.parse().ok()))
        })
        .and_then(|w| u32::try_from(w).ok())
        .unwrap_or(default_weight);
    Some(DiscoveredNode {
        host: ip.to_string(),
        port,
        weight,
        metadata,
    })
}

/// `GET apps` as services by application name.
pub(super) fn parse_apps(body: &Value, default_weight: u32) -> Result<ServiceMap, String> {
    let apps = body
        .pointer("/applications")
        .filter(|a| a.is_object())
        .ok_or("no applications in the answer")?;
    let mut out = ServiceMap::new();
    for app in items(apps.get("application")) {
        let Some(name) = app.get("name").and_then(Value::as_str) else {
            continue;
        };
        let nodes: Vec<_> = items(app.get("instance"))
            .into_iter()
            .filter_map(|i| instance(i, default_weight))
            .collect();
        if !nodes.is_empty() {
            out.insert(name.to_string(), Arc::new(nodes));
        }
    }
    Ok(out)
}

struct Endpoint {
    url: String,
    auth: Option<String>,
}

async fn run(
    endpoints: Vec<Endpoint>,
    client: HttpClient,
    settings: EurekaSettings,
    publisher: Publisher,
) {
    let weight = settings.weight.unwrap_or(100);
    let t = settings.timeout;
    let timeout = Duration::from_millis(t.connect + t.send + t.read);
    loop {
        let start = rand::random::<usize>() % endpoints.len().max(1);
        let mut last_err = String::from("no eureka host");
        let mut done = false;
        for k in 0..endpoints.len() {
            let e = &endpoints[(start + k) % endpoints.len()];
            let mut headers = vec![("Accept", "application/json".to_string())];
            if let Some(a) = &e.auth {
                headers.push(("Authorization", a.clone()));
            }
            let url = format!("{}apps", e.url);
            let r = call(&client, Method::GET, &url, &headers, timeout, false)
                .await
                .and_then(|a| a.json())
                .and_then(|v| parse_apps(&v, weight));
            match r {
                Ok(map) => {
                    publisher.publish(map);
                    done = true;
                    break;
                }
                Err(err) => {
                    tracing::error!(url = %e.url, error = %err, "failed to fetch registry");
                    last_err = format!("{}: {err}", e.url);
                }
            }
        }
        if !done {
            publisher.failed(&format!(
                "failed to fetch registry from all eureka hosts: {last_err}"
            ));
        }
        tokio::time::sleep(Duration::from_secs(settings.fetch_interval)).await;
    }
}

impl Eureka {
    pub(super) fn start(
        settings: &EurekaSettings,
        env: &DiscoveryEnv,
        publisher: &dyn Fn(&'static str, &Arc<Part>) -> Publisher,
    ) -> Eureka {
        let part = Part::new("");
        let endpoints = settings
            .host
            .iter()
            .map(|h| {
                let (url, user) = fetch::split_userinfo(h);
                let mut url = url;
                if let Some(p) = &settings.prefix {
                    url.push_str(p);
                }
                if !url.ends_with('/') {
                    url.push('/');
                }
                Endpoint {
                    url,
                    auth: user.map(|(u, p)| {
                        format!(
                            "Basic {}",
                            base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
                        )
                    }),
                }
            })
            .collect();
        let client = HttpClient::with_tls(
            Executor::new(env.executor.clone()),
            &TlsClient::new(env.trusted.clone()),
        );
        env.executor.spawn(run(
            endpoints,
            client,
            settings.clone(),
            publisher("eureka", &part),
        ));
        Eureka {
            part,
            settings: settings.clone(),
        }
    }

    pub(super) fn lookup(&self, service_name: &str) -> Lookup {
        match self.part.get(service_name) {
            Some(n) => Lookup::Nodes(n),
            None if self.part.is_ready() => Lookup::Missing,
            None => Lookup::Pending,
        }
    }

    pub(super) fn config(&self) -> Option<Value> {
        super::config_json(&self.settings)
    }

    pub(super) fn services(&self) -> Value {
        nodes_json(&self.part.map())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn instances_up_with_enabled_ports() {
        let body = json!({"applications": {"application": [
            {"name": "USER-SERVICE", "instance": [
                {"ipAddr": "10.0.0.1", "status": "UP", "overriddenStatus": "UNKNOWN",
                 "port": {"$": 8761, "@enabled": "true"}, "securePort": {"$": 443, "@enabled": "false"},
                 "metadata": {"weight": "5", "zone": "a"}},
                {"ipAddr": "10.0.0.2", "status": "UP", "overriddenstatus": "OUT_OF_SERVICE",
                 "port": {"$": 8761, "@enabled": "true"}, "securePort": {"$": 443, "@enabled": "false"}},
                {"ipAddr": "10.0.0.3", "status": "DOWN",
                 "port": {"$": 8761, "@enabled": "true"}, "securePort": {"$": 443, "@enabled": "false"}},
                {"ipAddr": "10.0.0.4", "status": "UP",
                 "port": {"$": 8761, "@enabled": "true"}, "securePort": {"$": 8443, "@enabled": true}}
            ]},
            {"name": "SINGLE", "instance":
                {"ipAddr": "10.0.0.5", "status": "UP", "port": {"$": 80, "@enabled": "true"}, "securePort": {"$": 443, "@enabled": "false"}}}
        ]}});
        let map = parse_apps(&body, 100).unwrap();
        let got: Vec<_> = map["USER-SERVICE"]
            .iter()
            .map(|n| (n.host.as_str(), n.port, n.weight))
            .collect();
        assert_eq!(got, [("10.0.0.1", 8761, 5), ("10.0.0.4", 8443, 100)]);
        assert_eq!(
            map["USER-SERVICE"][0]
                .metadata
                .as_ref()
                .unwrap()
                .get("zone"),
            Some(&json!("a"))
        );
        assert_eq!(map["SINGLE"][0].port, 80);
        assert!(parse_apps(&json!({"x": 1}), 1).is_err());
    }
}
