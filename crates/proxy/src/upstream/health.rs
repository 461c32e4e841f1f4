//! Upstream health checks with APISIX 3.x's `checks` (lua-resty-healthcheck's semantics), one
//! state per node per process.
//!
//! APISIX keeps a checker per nginx worker, so one node can be down in one worker and up in
//! another (APISIX #13888). Here each health-checked upstream has one [`UpstreamChecker`] whose
//! [`Target`]s are atomics shared by every worker thread: a passive report from any worker and
//! each active probe move the same counters, and every worker sees the flip at once. Active
//! probes run once per process, as tasks on the executor handle given to [`HealthService`].
//!
//! [`attach`] is how a snapshot compile gets a checker: it reuses the previous snapshot's
//! checker for the same resource (targets of unchanged nodes keep their state), builds a new one
//! when `checks` changed (still carrying the targets' states, as APISIX's `add_target` does
//! after `delayed_clear`), and none when the upstream has no `checks`. A checker lives as long
//! as a snapshot (or a request in flight) uses it; its prober stops when it is gone.

mod config;
mod probe;
mod target;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use ferrisix_tls::UpstreamTls;
use serde_json::Value;

pub use config::{ChecksConfig, Limits, ProbeType, StatusSet};
pub use target::{Counter, Counters, DownTally, Health, Target, TargetKey};

use crate::error::ProxyError;

/// Starts the active probers. Without an executor (tests, tools) checkers still count passive
/// reports but nothing probes.
#[derive(Clone, Debug, Default)]
pub struct HealthService {
    executor: Option<tokio::runtime::Handle>,
    /// `apisix.disable_upstream_healthcheck`: no checker is made, `checks` are ignored.
    disabled: bool,
}

impl HealthService {
    pub fn new(executor: tokio::runtime::Handle) -> HealthService {
        HealthService {
            executor: Some(executor),
            disabled: false,
        }
    }

    /// APISIX's global switch: with it, upstreams with `checks` get no checker.
    pub fn disabled(mut self, disabled: bool) -> HealthService {
        self.disabled = disabled;
        self
    }
}

/// The health checker of one upstream (an upstream object, or a route's or service's inline
/// upstream).
pub struct UpstreamChecker {
    /// The etcd key of the resource (`/apisix/upstreams/1`, `/apisix/routes/1`).
    pub name: String,
    /// `checks` as written, to tell whether a new version changed it.
    raw: Value,
    pub config: ChecksConfig,
    /// In the upstream's node order.
    targets: ArcSwap<Vec<Arc<Target>>>,
    /// How many of the targets are down (shared with the checkers this one took targets from
    /// or hands them to).
    tally: Arc<DownTally>,
    /// The TLS client config of `type: https` probes.
    probe_tls: Option<UpstreamTls>,
    /// Set when a newer checker took over: the prober stops.
    retired: AtomicBool,
}

impl std::fmt::Debug for UpstreamChecker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamChecker")
            .field("name", &self.name)
            .finish()
    }
}

/// A node as the checker should know it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetSpec {
    pub ip: IpAddr,
    /// The node's own port (`checks.active.port` overrides it for the target).
    pub port: u16,
    /// The node's domain, when it was given by name.
    pub domain: Option<String>,
}

/// Creates or reuses the checker of the upstream `name` (the single place where checkers are
/// made: see the module docs). `probe_tls` makes the client config of `type: https` probes:
/// it is asked only when a checker is made, never when one is reused.
pub fn attach(
    service: &HealthService,
    name: &str,
    checks: Option<&Value>,
    previous: Option<&Arc<UpstreamChecker>>,
    probe_tls: impl FnOnce(&ChecksConfig) -> Result<Option<UpstreamTls>, String>,
) -> Result<Option<Arc<UpstreamChecker>>, String> {
    let Some(checks) = checks.filter(|_| !service.disabled) else {
        return Ok(None);
    };
    if let Some(prev) = previous {
        if prev.raw == *checks && !prev.retired.load(Ordering::Relaxed) {
            return Ok(Some(prev.clone()));
        }
    }
    let config = ChecksConfig::parse(checks);
    let probe_tls = probe_tls(&config)?;
    let checker = Arc::new(UpstreamChecker {
        name: name.to_string(),
        raw: checks.clone(),
        config,
        targets: ArcSwap::from_pointee(Vec::new()),
        tally: previous.map_or_else(Arc::default, |p| p.tally.clone()),
        probe_tls,
        retired: AtomicBool::new(false),
    });
    if let Some(prev) = previous {
        // The new checker starts from the old one's targets; `sync_targets` keeps those that
        // are still wanted. The old one probes on until its successor is in use
        // ([`UpstreamChecker::retire`]): a compile that fails after this leaves it working.
        checker.targets.store(prev.targets.load_full());
    }
    if let Some(executor) = &service.executor {
        executor.spawn(probe::run(Arc::downgrade(&checker)));
    } else {
        tracing::debug!(checker = %name, "no executor for active health checks; passive only");
    }
    Ok(Some(checker))
}

impl UpstreamChecker {
    /// Aligns the targets with `nodes` (in node order) and returns each node's target.
    /// Targets of nodes that stay keep their state and counters; new ones start healthy.
    /// `pass_host_rewrite`: the upstream's `upstream_host` when `pass_host` is `rewrite`
    /// (probes then send it as Host).
    pub fn sync_targets(
        &self,
        nodes: &[TargetSpec],
        pass_host_rewrite: Option<&str>,
    ) -> Vec<Arc<Target>> {
        let current = self.targets.load();
        let by_key: HashMap<TargetKey, &Arc<Target>> =
            current.iter().map(|t| (t.key(), t)).collect();
        let active = &self.config.active;
        let mut seen = std::collections::HashSet::new();
        let mut list = Vec::with_capacity(nodes.len());
        let mut per_node = Vec::with_capacity(nodes.len());
        for n in nodes {
            let port = active.port.unwrap_or(n.port);
            let hostname = active.host.clone().unwrap_or_else(|| n.ip.to_string());
            let host_header = pass_host_rewrite
                .map(str::to_string)
                .or_else(|| n.domain.clone());
            let key = (n.ip, port, hostname.clone(), host_header.clone());
            let target = match by_key.get(&key) {
                Some(t) => (*t).clone(),
                None => Arc::new(Target::new(
                    n.ip,
                    port,
                    hostname,
                    host_header,
                    self.tally.clone(),
                )),
            };
            // Nodes sharing one identity (same ip with `checks.active.port`) share a target,
            // as resty.healthcheck's target list holds it once.
            if seen.insert(key) {
                list.push(target.clone());
            }
            per_node.push(target);
        }
        let changed = list.len() != current.len()
            || list
                .iter()
                .zip(current.iter())
                .any(|(a, b)| !Arc::ptr_eq(a, b));
        if changed {
            self.targets.store(Arc::new(list));
        }
        per_node
    }

    /// A newer checker took over this one's targets: its prober stops, and it is never reused.
    pub fn retire(&self) {
        self.retired.store(true, Ordering::Relaxed);
    }

    /// The targets in node order.
    pub fn targets(&self) -> Arc<Vec<Arc<Target>>> {
        self.targets.load_full()
    }

    /// Whether any target is down; one atomic load, what a pick reads first.
    pub fn any_down(&self) -> bool {
        self.tally.any()
    }

    /// A try failed and another try follows (APISIX's balancer reports `get_last_failure`
    /// before the retry): a timeout or a TCP-level failure on the passive counters.
    pub fn report_retried_failure(&self, target: &Target, failure: ProxyError) {
        let limits = &self.config.passive;
        let flipped = if failure.is_timeout() {
            target.report(false, Counter::Timeout, limits.timeouts)
        } else {
            target.report(false, Counter::Tcp, limits.tcp_failures)
        };
        self.log_flip(target, flipped, "passive");
    }

    /// The status the last try ended with (the log phase's `healthcheck_passive`), counted
    /// only when `checks.passive` is configured.
    pub fn report_final_status(&self, target: &Target, status: u16) {
        if !self.config.passive_enabled {
            return;
        }
        let flipped = report_status(target, &self.config.passive, status);
        self.log_flip(target, flipped, "passive");
    }

    fn log_flip(&self, target: &Target, flipped: Option<Health>, by: &str) {
        if let Some(h) = flipped {
            if h == Health::Healthy || h == Health::Unhealthy {
                tracing::warn!(
                    checker = %self.name,
                    target = %format!("{}:{}", target.ip, target.port),
                    hostname = %target.hostname,
                    check = by,
                    "upstream node is now {}",
                    h.name()
                );
            }
        }
    }
}

/// `report_http_status`: a healthy status counts as a success, an unhealthy one (or none: an
/// unparsable answer) as an HTTP failure, any other status is ignored.
fn report_status(target: &Target, limits: &Limits, status: u16) -> Option<Health> {
    if limits.healthy_statuses.contains(status) {
        target.report(true, Counter::Success, limits.successes)
    } else if status == 0 || limits.unhealthy_statuses.contains(status) {
        target.report(false, Counter::Http, limits.http_failures)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn no_tls(_: &ChecksConfig) -> Result<Option<UpstreamTls>, String> {
        Ok(None)
    }

    fn spec(port: u16) -> TargetSpec {
        TargetSpec {
            ip: "127.0.0.1".parse().unwrap(),
            port,
            domain: None,
        }
    }

    #[test]
    fn unchanged_nodes_keep_their_state_when_the_list_changes() {
        let svc = HealthService::default();
        let checks = json!({"active": {"unhealthy": {"tcp_failures": 1}}});
        let c = attach(&svc, "/apisix/upstreams/1", Some(&checks), None, no_tls)
            .unwrap()
            .unwrap();
        let t = c.sync_targets(&[spec(1), spec(2)], None);
        c.report_retried_failure(
            &t[1],
            ProxyError::new(crate::error::ErrorKind::ConnectRefused),
        );
        c.report_retried_failure(
            &t[1],
            ProxyError::new(crate::error::ErrorKind::ConnectRefused),
        );
        assert!(!t[1].is_up());
        // Same checks: the same checker; node 2 stays down, node 3 starts up.
        let again = attach(&svc, "/apisix/upstreams/1", Some(&checks), Some(&c), no_tls)
            .unwrap()
            .unwrap();
        assert!(Arc::ptr_eq(&again, &c));
        let t2 = again.sync_targets(&[spec(2), spec(3)], None);
        assert!(!t2[0].is_up());
        assert!(t2[1].is_up());
        assert_eq!(again.targets().len(), 2);
        // Changed checks: a new checker that still knows node 2 is down.
        let other = json!({"active": {"http_path": "/x"}});
        let fresh = attach(
            &svc,
            "/apisix/upstreams/1",
            Some(&other),
            Some(&again),
            no_tls,
        )
        .unwrap()
        .unwrap();
        assert!(!Arc::ptr_eq(&fresh, &again));
        let t3 = fresh.sync_targets(&[spec(2)], None);
        assert!(!t3[0].is_up());
        assert!(attach(&svc, "x", None, Some(&fresh), no_tls)
            .unwrap()
            .is_none());
    }

    #[test]
    fn the_global_switch_makes_no_checker() {
        let svc = HealthService::default().disabled(true);
        let checks = json!({"active": {}});
        assert!(attach(&svc, "a", Some(&checks), None, no_tls)
            .unwrap()
            .is_none());
    }

    #[test]
    fn final_statuses_count_only_with_passive() {
        let svc = HealthService::default();
        let active_only = json!({"active": {}});
        let c = attach(&svc, "a", Some(&active_only), None, no_tls)
            .unwrap()
            .unwrap();
        let t = c.sync_targets(&[spec(1)], None);
        for _ in 0..10 {
            c.report_final_status(&t[0], 500);
        }
        assert!(t[0].is_up());
        let passive = json!({"active": {}, "passive": {"unhealthy": {"http_statuses": [502], "http_failures": 1}}});
        let c = attach(&svc, "b", Some(&passive), None, no_tls)
            .unwrap()
            .unwrap();
        let t = c.sync_targets(&[spec(1)], None);
        c.report_final_status(&t[0], 500);
        assert!(t[0].is_up());
        c.report_final_status(&t[0], 502);
        assert!(!t[0].is_up());
    }
}
