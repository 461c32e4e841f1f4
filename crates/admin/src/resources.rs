//! The resources of `/apisix/admin/<resource>`: path segment, etcd directory, the word APISIX
//! uses for it in messages, which methods it refuses, and how it is checked.

use ferrisix_config::model::ResourceKind;
use http::Method;

/// How a resource's body is checked on writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checker {
    /// A kind the config crate validates (schema, extra checks, plugins, references).
    Core(ResourceKind),
    Credential,
    ConsumerGroup,
    Proto,
    Secret,
    StreamRoute,
}

/// What must not be using a resource when it is deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteCheck {
    Upstream,
    Service,
    PluginConfig,
    ConsumerGroup,
    Proto,
    StreamRoute,
}

#[derive(Debug)]
pub struct Resource {
    /// The path segment, which is also the etcd directory.
    pub name: &'static str,
    /// The word in messages (`missing route id`, ``not supported `POST` method for route``).
    pub kind: &'static str,
    /// Methods answered with 405.
    pub unsupported: &'static [Method],
    pub checker: Checker,
    /// `false` for consumers (the id is the username) and plugin metadata (the plugin name).
    pub needs_id: bool,
    pub delete_check: Option<DeleteCheck>,
    /// `filter=` keys honoured on lists.
    pub filter_fields: &'static [&'static str],
}

const NONE: &[Method] = &[];
const POST: &[Method] = &[Method::POST];
const PATCH: &[Method] = &[Method::PATCH];
const POST_PATCH: &[Method] = &[Method::POST, Method::PATCH];

const fn res(
    name: &'static str,
    kind: &'static str,
    unsupported: &'static [Method],
    checker: Checker,
    delete_check: Option<DeleteCheck>,
) -> Resource {
    Resource {
        name,
        kind,
        unsupported,
        checker,
        needs_id: true,
        delete_check,
        filter_fields: &[],
    }
}

static RESOURCES: [Resource; 13] = [
    Resource {
        filter_fields: &["service_id", "upstream_id"],
        ..res(
            "routes",
            "route",
            NONE,
            Checker::Core(ResourceKind::Routes),
            None,
        )
    },
    res(
        "services",
        "service",
        NONE,
        Checker::Core(ResourceKind::Services),
        Some(DeleteCheck::Service),
    ),
    res(
        "upstreams",
        "upstream",
        NONE,
        Checker::Core(ResourceKind::Upstreams),
        Some(DeleteCheck::Upstream),
    ),
    Resource {
        needs_id: false,
        ..res(
            "consumers",
            "consumer",
            POST_PATCH,
            Checker::Core(ResourceKind::Consumers),
            None,
        )
    },
    res(
        "credentials",
        "credential",
        POST_PATCH,
        Checker::Credential,
        None,
    ),
    res("ssls", "ssl", NONE, Checker::Core(ResourceKind::Ssls), None),
    res(
        "protos",
        "proto",
        PATCH,
        Checker::Proto,
        Some(DeleteCheck::Proto),
    ),
    res(
        "global_rules",
        "global rule",
        POST,
        Checker::Core(ResourceKind::GlobalRules),
        None,
    ),
    Resource {
        filter_fields: &["service_id", "upstream_id"],
        ..res(
            "stream_routes",
            "stream route",
            PATCH,
            Checker::StreamRoute,
            Some(DeleteCheck::StreamRoute),
        )
    },
    Resource {
        needs_id: false,
        ..res(
            "plugin_metadata",
            "plugin_metadata",
            POST_PATCH,
            Checker::Core(ResourceKind::PluginMetadata),
            None,
        )
    },
    res(
        "plugin_configs",
        "plugin config",
        POST,
        Checker::Core(ResourceKind::PluginConfigs),
        Some(DeleteCheck::PluginConfig),
    ),
    res(
        "consumer_groups",
        "consumer group",
        POST,
        Checker::ConsumerGroup,
        Some(DeleteCheck::ConsumerGroup),
    ),
    res("secrets", "secret", POST, Checker::Secret, None),
];

pub fn lookup(name: &str) -> Option<&'static Resource> {
    RESOURCES.iter().find(|r| r.name == name)
}

impl Resource {
    pub fn refuses(&self, method: &Method) -> bool {
        self.unsupported.contains(method)
    }

    /// The core schema `POST /apisix/admin/schema/validate/<resource>` checks against.
    pub fn schema_name(&self) -> Option<&'static str> {
        Some(match self.name {
            "routes" => "route",
            "services" => "service",
            "upstreams" => "upstream",
            "consumers" => "consumer",
            "credentials" => "credential",
            "ssls" => "ssl",
            "protos" => "proto",
            "global_rules" => "global_rule",
            "stream_routes" => "stream_route",
            "plugin_configs" => "plugin_config",
            "consumer_groups" => "consumer_group",
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        assert_eq!(lookup("routes").unwrap().kind, "route");
        assert!(lookup("consumers").unwrap().refuses(&Method::POST));
        assert!(!lookup("consumers").unwrap().needs_id);
        assert!(lookup("routs").is_none());
        assert!(lookup("schema").is_none());
    }
}
