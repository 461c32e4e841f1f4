//! config.yaml parsing and checks.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let _ = ferrisix_config::settings::Settings::from_yaml_str_with_env(text, &|_| None);
});
