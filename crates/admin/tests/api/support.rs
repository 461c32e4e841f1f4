//! A test Admin API on a fresh in-memory store, and helpers to call it and check answers.

use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use ferrisix_admin::{AdminApi, AdminOptions};
use ferrisix_config::settings::{AdminKey, AdminRole};
use ferrisix_config::store::memory::MemoryStore;
use ferrisix_config::store::Store;
use ferrisix_plugins::PluginRegistry;
use http::{HeaderMap, Method, Request};
use http_body_util::{BodyExt, Full};
use serde_json::Value;

pub const KEY: &str = "edd1c9f034335f136f87ad84b625c8f1";
pub const VIEWER_KEY: &str = "4054f7cf07e344346cd3f287985e76a2";

pub fn local() -> IpAddr {
    IpAddr::from([127, 0, 0, 1])
}

pub struct Admin {
    pub api: Arc<AdminApi>,
    pub store: Arc<MemoryStore>,
}

pub fn options() -> AdminOptions {
    AdminOptions {
        keys: vec![
            AdminKey {
                name: "admin".into(),
                key: KEY.into(),
                role: AdminRole::Admin,
            },
            AdminKey {
                name: "viewer".into(),
                key: VIEWER_KEY.into(),
                role: AdminRole::Viewer,
            },
        ],
        ..AdminOptions::default()
    }
}

impl Admin {
    pub fn new() -> Admin {
        Admin::with(|_| {})
    }

    pub fn with(change: impl FnOnce(&mut AdminOptions)) -> Admin {
        let mut opts = options();
        change(&mut opts);
        let store = Arc::new(MemoryStore::new("/apisix"));
        let api = AdminApi::new(
            opts,
            store.clone() as Arc<dyn Store>,
            PluginRegistry::builtin(),
        );
        Admin {
            api: Arc::new(api),
            store,
        }
    }

    /// A request with the admin key.
    pub async fn call(&self, method: &str, path: &str, body: Option<&str>) -> Resp {
        let mut b = Request::builder()
            .method(method)
            .uri(path)
            .header("X-API-KEY", KEY);
        if body.is_some() {
            b = b.header("Content-Type", "application/json");
        }
        self.send(
            b.body(Full::new(Bytes::from(body.unwrap_or_default().to_string())))
                .unwrap(),
            local(),
        )
        .await
    }

    /// A request with the admin key and no body, from `peer`.
    pub async fn call_from(&self, method: &str, path: &str, peer: IpAddr) -> Resp {
        self.send(
            req(method, path)
                .header("X-API-KEY", KEY)
                .body(body(""))
                .unwrap(),
            peer,
        )
        .await
    }

    /// A request without the admin key (and no body), from `peer`.
    pub async fn unkeyed(&self, method: &str, path: &str, peer: IpAddr) -> Resp {
        self.send(req(method, path).body(body("")).unwrap(), peer)
            .await
    }

    /// A request with a JSON value as body.
    pub async fn json(&self, method: &str, path: &str, body: Value) -> Resp {
        self.call(method, path, Some(&body.to_string())).await
    }

    pub async fn send(&self, req: Request<Full<Bytes>>, peer: IpAddr) -> Resp {
        let resp = self.api.handle(req, peer).await;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        Resp {
            status,
            headers,
            body,
        }
    }

    /// The raw stored value of `key`.
    pub async fn stored(&self, key: &str) -> Option<Value> {
        self.store
            .get(key)
            .await
            .unwrap()
            .map(|kv| serde_json::from_slice(&kv.value).unwrap())
    }
}

pub fn req(method: &str, path: &str) -> http::request::Builder {
    Request::builder()
        .method(Method::from_bytes(method.as_bytes()).unwrap())
        .uri(path)
}

pub fn body(s: &str) -> Full<Bytes> {
    Full::new(Bytes::from(s.to_string()))
}

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    pub fn error_msg(&self) -> String {
        self.json()["error_msg"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Status and a JSON subset, as the conformance runner checks them.
    #[track_caller]
    pub fn expect(&self, status: u16, subset: Value) -> &Resp {
        assert_eq!(self.status, status, "status; body: {}", self.text());
        let actual = self.json();
        if let Err(path) = contains(&actual, &subset, "") {
            panic!("at {path}: expected {subset} within {actual}");
        }
        self
    }

    /// `path` (dotted) does not exist in the JSON body.
    #[track_caller]
    pub fn absent(&self, path: &str) -> &Resp {
        let json = self.json();
        let mut cur = Some(&json);
        for part in path.split('.') {
            cur = cur.and_then(|c| c.get(part));
        }
        assert!(cur.is_none(), "{path} present in {}", self.text());
        self
    }
}

/// `expected` is contained in `actual`: objects by listed keys, arrays element-wise with equal
/// lengths, scalars equal.
pub fn contains(actual: &Value, expected: &Value, at: &str) -> Result<(), String> {
    match (actual, expected) {
        (Value::Object(a), Value::Object(e)) => {
            for (k, ev) in e {
                let av = a.get(k).ok_or_else(|| format!("{at}.{k} (missing)"))?;
                contains(av, ev, &format!("{at}.{k}"))?;
            }
            Ok(())
        }
        (Value::Array(a), Value::Array(e)) => {
            if a.len() != e.len() {
                return Err(format!("{at} (length {} != {})", a.len(), e.len()));
            }
            for (i, (av, ev)) in a.iter().zip(e).enumerate() {
                contains(av, ev, &format!("{at}[{i}]"))?;
            }
            Ok(())
        }
        (a, e) if a == e => Ok(()),
        _ => Err(at.to_string()),
    }
}

/// A minimal route body with an inline upstream.
pub fn route(uri: &str) -> Value {
    serde_json::json!({"uri": uri, "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:8080": 1}}})
}
