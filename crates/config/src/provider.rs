//! The standalone `yaml`/`json` config provider (APISIX `role: data_plane` with
//! `config_provider: yaml|json`): resources come from one file, `apisix.yaml` or `apisix.json`,
//! that is re-read whenever it changes.
//!
//! [`parse_standalone`] turns the file's text into a [`ConfigState`] the way APISIX's
//! `core/config_yaml.lua` reads it: each resource kind is a list, an item's id is its `id`, else
//! (consumers) its `username`, else `arr_<position>`; YAML must end with `#END` so a half-written
//! file is never applied. Items are stored as written — validating them is the compile stage's
//! job, which quarantines bad ones individually — but a file that is not YAML/JSON at all, or
//! whose shape is wrong, is refused as a whole. [`FileProvider`] watches the file and publishes
//! each good version.

mod file;
mod standalone;

pub use file::FileProvider;
pub use standalone::{parse_standalone, parse_standalone_with, Format, Standalone};

#[cfg(test)]
mod tests;
