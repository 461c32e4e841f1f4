//! One definition per plugin: the static descriptor the registry, the factory, the Admin API's
//! plugin listing and schemas, and the plugin's shared state all derive from.

use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;

use crate::compile::{CompileCtx, PluginApi};
use crate::consumers::{AuthDef, PrepareFn};
use crate::plugin::Plugin;
use crate::services::PluginServices;

/// APISIX's `type` of a plugin module: consumer credentials accept only `auth` plugins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PluginKind {
    Auth,
    Other,
}

/// APISIX's `scope`: `global` plugins run only from global rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Any,
    Global,
}

/// APISIX's `run_policy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunPolicy {
    Always,
    /// `prefer_route`: a global rule's instance is skipped when the route has its own.
    PreferRoute,
}

/// What a plugin's own check (beyond its schema) sees. It does not carry the schema's
/// verdict: [`PluginDef::verdict`] applies that, so no check can drop it.
pub struct CheckCtx<'a> {
    pub conf: &'a Value,
    /// The schema (with `_meta` injected) the conf is checked against.
    pub schema: &'a Value,
    /// Shared state the check may keep (limit-count's first conf per group).
    pub services: &'a PluginServices,
    pub now: Instant,
    /// The conf is a consumer's (or a credential's), checked against the consumer schema.
    pub consumer: bool,
}

impl CheckCtx<'_> {
    /// The conf with the schema's defaults filled in (as APISIX's `check_schema` sees it).
    pub fn filled(&self) -> Result<Value, String> {
        let mut filled = self.conf.clone();
        ferrisix_config::schema::validate_and_fill(self.schema, &mut filled)?;
        Ok(filled)
    }
}

/// How a plugin compiles one configuration.
pub type CompileFn = fn(&CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String>;

/// A plugin's own check, run once its schema passed.
pub type CheckFn = fn(&CheckCtx<'_>) -> Result<(), String>;

/// How a plugin words its schema's failure: it gets the schema's error and returns the error
/// to report (its own words, or a check APISIX runs first that failed too). It cannot turn
/// the failure into a success.
pub type SchemaErrorFn = fn(&CheckCtx<'_>, String) -> String;

/// A plugin, defined once. Built in a `static` with [`PluginDef::new`] and struct update.
pub struct PluginDef {
    pub name: &'static str,
    /// Run order within a phase: higher runs first.
    pub priority: i64,
    pub version: f64,
    pub kind: PluginKind,
    pub scope: Scope,
    pub run_policy: RunPolicy,
    /// The compiled form depends on the route (prometheus' labels): global rules compile it
    /// once per route instead of once for all.
    pub per_route: bool,
    /// The configuration schema (without `_meta`, which the registry injects).
    pub schema: fn() -> Value,
    pub consumer_schema: Option<fn() -> Value>,
    pub metadata_schema: Option<fn() -> Value>,
    /// A check run only when the schema passed (the registry prefixes its error, as the
    /// schema's, with APISIX's `failed to check the configuration of plugin <name> err: `).
    pub check: Option<CheckFn>,
    /// Where the plugin words a schema failure itself (see [`SchemaErrorFn`]); `None` reports
    /// the schema's error as it is.
    pub schema_error: Option<SchemaErrorFn>,
    /// Fields of the conf stored encrypted (`apisix.data_encryption`), as dotted paths.
    pub encrypt_fields: &'static [&'static str],
    /// The APIs the plugin answers itself (`public-api` serves them).
    pub apis: Option<fn(&PluginServices) -> Vec<PluginApi>>,
    /// How an auth plugin's consumer credentials are indexed (`kind` is then
    /// [`PluginKind::Auth`]); `None` for plugins that find no consumers themselves.
    pub auth: Option<AuthDef>,
    pub compile: CompileFn,
}

impl std::fmt::Debug for PluginDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginDef")
            .field("name", &self.name)
            .field("priority", &self.priority)
            .finish_non_exhaustive()
    }
}

impl PluginDef {
    /// A plugin of version 0.1, not `auth`, any scope, always run, route-independent, with no
    /// extra schemas, checks, encrypted fields or APIs.
    pub const fn new(
        name: &'static str,
        priority: i64,
        schema: fn() -> Value,
        compile: CompileFn,
    ) -> PluginDef {
        PluginDef {
            name,
            priority,
            version: 0.1,
            kind: PluginKind::Other,
            scope: Scope::Any,
            run_policy: RunPolicy::Always,
            per_route: false,
            schema,
            consumer_schema: None,
            metadata_schema: None,
            check: None,
            schema_error: None,
            encrypt_fields: &[],
            apis: None,
            auth: None,
            compile,
        }
    }

    /// The plugin's verdict on `cx.conf`: the schema's (`cx.schema`) first, then, only if it
    /// passed, the plugin's own [`PluginDef::check`]. A failed schema is always an error,
    /// worded by [`PluginDef::schema_error`] where the plugin has one.
    pub fn verdict(&self, cx: &CheckCtx<'_>) -> Result<(), String> {
        match ferrisix_config::schema::validate(cx.schema, cx.conf) {
            Ok(()) => self.check.map_or(Ok(()), |check| check(cx)),
            Err(e) => Err(match self.schema_error {
                Some(word) => word(cx, e),
                None => e,
            }),
        }
    }

    /// This plugin as an auth plugin over consumer credentials: `consumer_schema` is a
    /// credential's, `encrypt_fields` its secrets; the credentials are indexed by their
    /// `key_field`, each compiled by `prepare` where given (see [`AuthDef`]).
    pub const fn with_credentials(
        self,
        consumer_schema: fn() -> Value,
        encrypt_fields: &'static [&'static str],
        key_field: &'static str,
        prepare: Option<PrepareFn>,
    ) -> PluginDef {
        PluginDef {
            kind: PluginKind::Auth,
            auth: Some(AuthDef { key_field, prepare }),
            consumer_schema: Some(consumer_schema),
            encrypt_fields,
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::plugin::Phases;

    struct Nothing;

    impl Plugin for Nothing {
        fn phases(&self) -> Phases {
            Phases::NONE
        }
    }

    fn compile(_: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
        Ok(Arc::new(Nothing))
    }

    fn schema() -> Value {
        json!({"type": "object", "properties": {"n": {"type": "integer"}}})
    }

    fn accept(_: &CheckCtx<'_>) -> Result<(), String> {
        Ok(())
    }

    fn refuse(_: &CheckCtx<'_>) -> Result<(), String> {
        Err("own check".into())
    }

    fn reword(_: &CheckCtx<'_>, e: String) -> String {
        format!("reworded: {e}")
    }

    fn verdict(def: &PluginDef, conf: Value) -> Result<(), String> {
        let schema = (def.schema)();
        def.verdict(&CheckCtx {
            conf: &conf,
            schema: &schema,
            services: &PluginServices::default(),
            now: Instant::now(),
            consumer: false,
        })
    }

    #[test]
    fn a_check_that_accepts_does_not_drop_the_schema_error() {
        let def = PluginDef {
            check: Some(accept),
            ..PluginDef::new("t", 0, schema, compile)
        };
        let e = verdict(&def, json!({"n": "x"})).unwrap_err();
        assert!(e.starts_with("property \"n\" validation failed"), "{e}");
        assert_eq!(verdict(&def, json!({"n": 1})), Ok(()));
    }

    #[test]
    fn the_own_check_runs_once_the_schema_passed() {
        let def = PluginDef {
            check: Some(refuse),
            ..PluginDef::new("t", 0, schema, compile)
        };
        assert_eq!(verdict(&def, json!({"n": 1})), Err("own check".into()));
        // Both fail: the schema's error wins.
        let e = verdict(&def, json!({"n": "x"})).unwrap_err();
        assert!(e.starts_with("property \"n\""), "{e}");
    }

    #[test]
    fn a_plugin_may_only_reword_a_schema_failure() {
        let def = PluginDef {
            check: Some(accept),
            schema_error: Some(reword),
            ..PluginDef::new("t", 0, schema, compile)
        };
        let e = verdict(&def, json!({"n": "x"})).unwrap_err();
        assert!(e.starts_with("reworded: property \"n\""), "{e}");
        assert_eq!(verdict(&def, json!({"n": 1})), Ok(()));
    }
}
