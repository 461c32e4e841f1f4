//! `ferrisix -t`: like `nginx -t`, every problem of the configuration at once. config.yaml
//! itself is checked by loading it ([`crate::settings::Settings::load`] collects every bad
//! key); this checks what the settings point at: the standalone file, each of its resources
//! validated on its own as the data plane would (so one bad route is named, not the first
//! error alone).

use crate::model::ResourceKind;
use crate::provider::parse_standalone;
use crate::settings::Settings;
use crate::validate::{self, PluginCheck};

/// The problems of the standalone file the settings name (none for store providers), one
/// line each: `<file>: <error>` when the file cannot be used at all, else
/// `<file>: <resource> <id>: <error>` per refused resource.
pub fn standalone_problems(settings: &Settings, plugins: &dyn PluginCheck) -> Vec<String> {
    let Some(format) = settings.provider().file_format() else {
        return Vec::new();
    };
    let path = settings.standalone_file();
    let state = match std::fs::read_to_string(&path)
        .map_err(|e| e.to_string())
        .and_then(|text| parse_standalone(&text, format, 1))
    {
        Ok(state) => state,
        Err(e) => return vec![format!("{}: {e}", path.display())],
    };
    let mut problems = Vec::new();
    for kind in ResourceKind::ALL {
        for item in state.items(kind) {
            if let Err(e) = validate::check_resource(kind, &item.value.parse(), plugins) {
                problems.push(format!(
                    "{}: {} {}: {e}",
                    path.display(),
                    kind.noun(),
                    item.id
                ));
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::AcceptAnyPlugin;

    fn standalone(dir: &std::path::Path, apisix_yaml: Option<&str>) -> Settings {
        let path = dir.join("config.yaml");
        std::fs::write(
            &path,
            "deployment:\n  role: data_plane\n  role_data_plane:\n    config_provider: yaml\n",
        )
        .unwrap();
        if let Some(text) = apisix_yaml {
            std::fs::write(dir.join("apisix.yaml"), text).unwrap();
        }
        Settings::load(&path).unwrap().0
    }

    #[test]
    fn names_every_bad_resource_of_the_standalone_file() {
        let dir = tempfile::tempdir().unwrap();
        let settings = standalone(
            dir.path(),
            Some("routes:\n  - id: ok\n    uri: /a\n    upstream:\n      nodes:\n        \"127.0.0.1:1\": 1\n  - id: bad\n    uri: /b\n    methods: [FETCH]\n    upstream:\n      nodes:\n        \"127.0.0.1:1\": 1\nupstreams:\n  - id: u\n    nodes: 7\n#END\n"),
        );
        let problems = standalone_problems(&settings, &AcceptAnyPlugin);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("upstream u: "), "{problems:?}");
        assert!(
            problems[1].contains("route bad: ") && problems[1].contains("\"methods\""),
            "{problems:?}"
        );
        assert!(problems[1].starts_with(&settings.standalone_file().display().to_string()));
    }

    #[test]
    fn an_unusable_file_is_one_problem() {
        let dir = tempfile::tempdir().unwrap();
        let missing = standalone(dir.path(), None);
        let problems = standalone_problems(&missing, &AcceptAnyPlugin);
        assert_eq!(problems.len(), 1, "{problems:?}");
        let no_end = standalone(dir.path(), Some("routes: []\n"));
        let problems = standalone_problems(&no_end, &AcceptAnyPlugin);
        assert_eq!(problems.len(), 1);
        assert!(problems[0].contains("#END"), "{problems:?}");
        let good = standalone(dir.path(), Some("routes: []\n#END\n"));
        assert!(standalone_problems(&good, &AcceptAnyPlugin).is_empty());
    }

    #[test]
    fn store_providers_have_no_file_to_check() {
        let settings = Settings::default();
        assert!(standalone_problems(&settings, &AcceptAnyPlugin).is_empty());
    }
}
