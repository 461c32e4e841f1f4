//! `checks` as the checker uses it, with APISIX's schema defaults (and resty.healthcheck's for
//! the passive side when `passive` is absent: retried failures still count then).

use std::time::Duration;

use serde_json::Value;

/// A set of HTTP statuses (100-599).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusSet([u64; 10]);

impl StatusSet {
    pub fn of(codes: &[u16]) -> StatusSet {
        let mut s = StatusSet([0; 10]);
        for c in codes {
            if *c < 640 {
                s.0[(*c / 64) as usize] |= 1 << (c % 64);
            }
        }
        s
    }

    pub fn contains(&self, code: u16) -> bool {
        code < 640 && self.0[(code / 64) as usize] & (1 << (code % 64)) != 0
    }
}

/// The thresholds of one side (active or passive).
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    pub healthy_statuses: StatusSet,
    pub successes: u8,
    pub unhealthy_statuses: StatusSet,
    pub http_failures: u8,
    pub tcp_failures: u8,
    pub timeouts: u8,
}

/// `checks.active.type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeType {
    Http,
    Https,
    Tcp,
}

impl ProbeType {
    pub fn name(self) -> &'static str {
        match self {
            ProbeType::Http => "http",
            ProbeType::Https => "https",
            ProbeType::Tcp => "tcp",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ActiveConfig {
    pub kind: ProbeType,
    pub timeout: Duration,
    pub concurrency: usize,
    pub http_method: String,
    pub http_path: String,
    pub http_req_body: String,
    pub host: Option<String>,
    pub port: Option<u16>,
    pub https_verify_certificate: bool,
    /// `"Name: value"` lines.
    pub req_headers: Vec<String>,
    pub healthy_interval: Duration,
    pub unhealthy_interval: Duration,
    pub limits: Limits,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ChecksConfig {
    pub active: ActiveConfig,
    /// resty.healthcheck's passive settings (its defaults when `passive` is absent).
    pub passive: Limits,
    /// `passive` was given: answers are then counted in the log phase too.
    pub passive_enabled: bool,
    /// What the control API's `type` says.
    pub type_name: &'static str,
}

fn num(v: Option<&Value>, default: f64) -> f64 {
    v.and_then(Value::as_f64).unwrap_or(default)
}

fn counter(v: Option<&Value>, default: u8) -> u8 {
    v.and_then(Value::as_u64)
        .map(|n| n.min(254) as u8)
        .unwrap_or(default)
}

fn statuses(v: Option<&Value>, default: &[u16]) -> StatusSet {
    match v.and_then(Value::as_array) {
        Some(list) => StatusSet::of(
            &list
                .iter()
                .filter_map(|c| c.as_u64().map(|c| c as u16))
                .collect::<Vec<_>>(),
        ),
        None => StatusSet::of(default),
    }
}

const ACTIVE_HEALTHY: &[u16] = &[200, 302];
const ACTIVE_UNHEALTHY: &[u16] = &[429, 404, 500, 501, 502, 503, 504, 505];
const PASSIVE_HEALTHY: &[u16] = &[
    200, 201, 202, 203, 204, 205, 206, 207, 208, 226, 300, 301, 302, 303, 304, 305, 306, 307, 308,
];
const PASSIVE_UNHEALTHY: &[u16] = &[429, 500, 503];

fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s.max(0.001)).unwrap_or(Duration::from_secs(1))
}

impl ChecksConfig {
    /// From a validated `checks` object.
    pub fn parse(checks: &Value) -> ChecksConfig {
        let empty = Value::Null;
        let active = checks.get("active").unwrap_or(&empty);
        let healthy = active.get("healthy").unwrap_or(&empty);
        let unhealthy = active.get("unhealthy").unwrap_or(&empty);
        let kind = match active.get("type").and_then(Value::as_str) {
            Some("https") => ProbeType::Https,
            Some("tcp") => ProbeType::Tcp,
            _ => ProbeType::Http,
        };
        let str_of =
            |v: Option<&Value>, d: &str| v.and_then(Value::as_str).unwrap_or(d).to_string();
        let active_cfg = ActiveConfig {
            kind,
            timeout: secs(num(active.get("timeout"), 1.0)),
            concurrency: (num(active.get("concurrency"), 10.0) as usize).max(1),
            http_method: str_of(active.get("http_method"), "GET"),
            http_path: str_of(active.get("http_path"), "/"),
            http_req_body: str_of(active.get("http_req_body"), ""),
            host: active
                .get("host")
                .and_then(Value::as_str)
                .map(str::to_string),
            port: active
                .get("port")
                .and_then(Value::as_u64)
                .and_then(|p| u16::try_from(p).ok()),
            https_verify_certificate: active
                .get("https_verify_certificate")
                .and_then(Value::as_bool)
                .unwrap_or(true),
            req_headers: active
                .get("req_headers")
                .and_then(Value::as_array)
                .map(|l| {
                    l.iter()
                        .filter_map(|h| h.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
            healthy_interval: secs(num(healthy.get("interval"), 1.0)),
            unhealthy_interval: secs(num(unhealthy.get("interval"), 1.0)),
            limits: Limits {
                healthy_statuses: statuses(healthy.get("http_statuses"), ACTIVE_HEALTHY),
                successes: counter(healthy.get("successes"), 2),
                unhealthy_statuses: statuses(unhealthy.get("http_statuses"), ACTIVE_UNHEALTHY),
                http_failures: counter(unhealthy.get("http_failures"), 5),
                tcp_failures: counter(unhealthy.get("tcp_failures"), 2),
                timeouts: counter(unhealthy.get("timeouts"), 3),
            },
        };
        let passive = checks.get("passive");
        let p = passive.unwrap_or(&empty);
        let ph = p.get("healthy").unwrap_or(&empty);
        let pu = p.get("unhealthy").unwrap_or(&empty);
        let passive_limits = Limits {
            healthy_statuses: statuses(ph.get("http_statuses"), PASSIVE_HEALTHY),
            successes: counter(ph.get("successes"), 5),
            unhealthy_statuses: statuses(pu.get("http_statuses"), PASSIVE_UNHEALTHY),
            http_failures: counter(pu.get("http_failures"), 5),
            tcp_failures: counter(pu.get("tcp_failures"), 2),
            timeouts: counter(pu.get("timeouts"), 7),
        };
        // `get_checker_type`: active's type when given, else passive's.
        let type_name = match (
            active.get("type").and_then(Value::as_str),
            p.get("type").and_then(Value::as_str),
        ) {
            (Some(_), _) => kind.name(),
            (None, Some("tcp")) => "tcp",
            (None, Some("https")) => "https",
            _ => "http",
        };
        ChecksConfig {
            active: active_cfg,
            passive: passive_limits,
            passive_enabled: passive.is_some(),
            type_name,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_are_apisix_schema_defaults() {
        let c = ChecksConfig::parse(&json!({"active": {}}));
        assert_eq!(c.active.kind, ProbeType::Http);
        assert_eq!(c.active.http_path, "/");
        assert_eq!(c.active.limits.successes, 2);
        assert_eq!(c.active.limits.tcp_failures, 2);
        assert!(c.active.limits.unhealthy_statuses.contains(404));
        assert!(!c.active.limits.unhealthy_statuses.contains(200));
        assert!(!c.passive_enabled);
        assert_eq!(c.passive.timeouts, 7);
        assert!(c.passive.healthy_statuses.contains(226));
    }

    #[test]
    fn explicit_values_win() {
        let c = ChecksConfig::parse(&json!({
            "active": {"type": "tcp", "port": 8080, "healthy": {"interval": 3, "successes": 1}},
            "passive": {"unhealthy": {"http_statuses": [502], "http_failures": 1}}
        }));
        assert_eq!(c.active.kind, ProbeType::Tcp);
        assert_eq!(c.active.port, Some(8080));
        assert_eq!(c.active.healthy_interval, Duration::from_secs(3));
        assert!(c.passive_enabled);
        assert!(c.passive.unhealthy_statuses.contains(502));
        assert!(!c.passive.unhealthy_statuses.contains(500));
        assert_eq!(c.type_name, "tcp");
    }
}
