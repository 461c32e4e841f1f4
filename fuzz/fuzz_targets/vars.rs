//! lua-resty-expr `vars`: any JSON document, compiled and evaluated.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
        if let Ok(expr) = ferrisix_config::vars::compile_vars(&v) {
            let _ = expr.eval(&());
        }
    }
});
