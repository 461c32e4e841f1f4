//! The standalone file, as YAML and as JSON.
#![no_main]
use ferrisix_config::provider::{parse_standalone_with, Format};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let _ = parse_standalone_with(text, Format::Yaml, 1, &|_| None);
    let _ = parse_standalone_with(text, Format::Json, 1, &|_| None);
});
