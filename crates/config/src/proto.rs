//! The `protos` resource compiled: the `content` of a proto is `.proto` source text or, as
//! APISIX accepts too, a base64 `FileDescriptorSet` (`protoc --include_imports
//! --descriptor_set_out`). Text is compiled at runtime in pure Rust (protox) into a
//! [`DescriptorPool`] that grpc-transcode builds and reads messages with.
//!
//! Imports: APISIX compiles a proto's text alone, so an `import` only works there for files
//! lua-protobuf finds on disk. ferrisix goes further: `import "pkg/user.proto"` is resolved
//! against the other proto resources, the one whose id is the import's path, or its path
//! without `.proto`, or its last segment with or without `.proto` (ids cannot hold `/`); and
//! `google/protobuf/*.proto` are built in. A proto whose import is missing is refused by the
//! data plane alone (quarantined) until the import is there; a syntax error is refused when the
//! proto is written.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use base64::Engine;
use miette::Diagnostic;
use prost_reflect::DescriptorPool;
use protox::file::{File, FileResolver, GoogleFileResolver};

/// The file name a proto's text is compiled under: its id, with `.proto` added.
pub fn file_name(id: &str) -> String {
    if id.ends_with(".proto") {
        id.to_owned()
    } else {
        format!("{id}.proto")
    }
}

/// The ids an import path may name, in the order they are tried.
fn import_candidates(path: &str) -> Vec<String> {
    let mut out = vec![path.to_owned()];
    let bare = path.strip_suffix(".proto").unwrap_or(path);
    out.push(bare.to_owned());
    if let Some((_, last)) = path.rsplit_once('/') {
        out.push(last.to_owned());
        out.push(last.strip_suffix(".proto").unwrap_or(last).to_owned());
    }
    out.dedup();
    out
}

/// Imports resolved against the other protos' texts (by id), then Google's well-known files.
struct ProtoFiles {
    main: (String, String),
    others: Arc<HashMap<String, String>>,
    google: GoogleFileResolver,
}

impl FileResolver for ProtoFiles {
    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        if name == self.main.0 {
            return File::from_source(name, &self.main.1);
        }
        if name.starts_with("google/protobuf/") {
            if let Ok(f) = self.google.open_file(name) {
                return Ok(f);
            }
        }
        for id in import_candidates(name) {
            if let Some(text) = self.others.get(&id) {
                return File::from_source(name, text);
            }
        }
        Err(protox::Error::file_not_found(name))
    }
}

/// Why a proto did not compile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProtoError {
    pub message: String,
    /// An import names no proto: the proto is held back until it exists.
    pub missing_import: bool,
}

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// `line:column` of a byte offset in `text`, 1-based.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

/// The compiler's message, with the file and, when it is the proto's own text, the place.
fn describe(err: &protox::Error, main: &str, text: &str) -> String {
    let place = err.labels().and_then(|mut l| l.next()).map(|l| l.offset());
    match (err.file(), place) {
        (Some(file), Some(offset)) if file == main => {
            let (line, col) = line_col(text, offset);
            format!("{file}:{line}:{col}: {err}")
        }
        (Some(file), _) => format!("{file}: {err}"),
        (None, _) => err.to_string(),
    }
}

/// Whether `content` looks like base64 (a descriptor set) rather than `.proto` text.
fn descriptor_set(content: &str) -> Option<DescriptorPool> {
    let compact: String = content.split_whitespace().collect();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(compact.as_bytes())
        .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(compact.as_bytes()))
        .ok()?;
    DescriptorPool::decode(bytes.as_slice()).ok()
}

/// Compiles the proto `id` whose content is `content`; imports are looked up in `others`
/// (every proto's content by id). As APISIX, text is tried first, then a base64 descriptor
/// set; when neither works, the text compiler's error is the answer.
pub fn compile(
    id: &str,
    content: &str,
    others: &Arc<HashMap<String, String>>,
) -> Result<DescriptorPool, ProtoError> {
    let name = file_name(id);
    let resolver = ProtoFiles {
        main: (name.clone(), content.to_owned()),
        others: others.clone(),
        google: GoogleFileResolver::new(),
    };
    let mut compiler = protox::Compiler::with_file_resolver(resolver);
    compiler.include_imports(true);
    match compiler.open_file(&name) {
        Ok(_) => Ok(compiler.descriptor_pool()),
        Err(err) => {
            if err.is_parse() {
                if let Some(pool) = descriptor_set(content) {
                    return Ok(pool);
                }
            }
            Err(ProtoError {
                message: describe(&err, &name, content),
                missing_import: err.is_file_not_found(),
            })
        }
    }
}

/// What the Admin API checks when a proto is written: it compiles, or its only fault is an
/// import naming a proto that is not there (yet), which the data plane holds back.
pub fn check(id: &str, content: &str) -> Result<(), String> {
    match compile(id, content, &Arc::new(HashMap::new())) {
        Ok(_) => Ok(()),
        Err(e) if e.missing_import => Ok(()),
        Err(e) => Err(e.message),
    }
}

/// The compiled protos of one configuration, by id: what grpc-transcode compiles against.
/// `None` for none at all (a constant, for contexts without protos).
#[derive(Clone, Default)]
pub struct Protos(Option<Arc<ProtoMap>>);

type ProtoMap = HashMap<String, Result<DescriptorPool, ProtoError>>;

impl fmt::Debug for Protos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.0.iter().flat_map(|m| m.keys()))
            .finish()
    }
}

impl Protos {
    /// No protos.
    pub const EMPTY: Protos = Protos(None);

    /// Every proto of `contents` (content by id) compiled.
    pub fn compile_all(contents: HashMap<String, String>) -> Protos {
        let others = Arc::new(contents);
        let compiled = others
            .iter()
            .map(|(id, text)| (id.clone(), compile(id, text, &others)))
            .collect();
        Protos(Some(Arc::new(compiled)))
    }

    /// The proto `id`: `None` when there is none, its error when it did not compile.
    pub fn get(&self, id: &str) -> Option<&Result<DescriptorPool, ProtoError>> {
        self.0.as_ref()?.get(id)
    }

    /// The protos that did not compile.
    pub fn errors(&self) -> impl Iterator<Item = (&String, &ProtoError)> {
        self.0
            .iter()
            .flat_map(|m| m.iter())
            .filter_map(|(id, r)| r.as_ref().err().map(|e| (id, e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ECHO: &str = r#"syntax = "proto3";
package echo;
service EchoService { rpc Echo (EchoMsg) returns (EchoMsg); }
message EchoMsg { string msg = 1; }"#;

    #[test]
    fn text_compiles_into_a_pool() {
        let pool = compile("1", ECHO, &Arc::new(HashMap::new())).unwrap();
        let svc = pool.get_service_by_name("echo.EchoService").unwrap();
        let m = svc.methods().find(|m| m.name() == "Echo").unwrap();
        assert_eq!(m.input().full_name(), "echo.EchoMsg");
    }

    #[test]
    fn syntax_errors_name_the_place() {
        let bad = "syntax = \"proto3\";\nmessage A {\n  string x = ;\n}";
        let err = check("p", bad).unwrap_err();
        assert!(err.starts_with("p.proto:3:"), "{err}");
        let err = compile(
            "p",
            "syntax = \"proto3\"; message A { B b = 1; }",
            &Arc::new(HashMap::new()),
        )
        .unwrap_err();
        assert!(!err.missing_import, "{err}");
        assert!(err.message.contains("B"), "{err}");
    }

    #[test]
    fn imports_resolve_to_other_protos_by_id() {
        let user = "syntax = \"proto3\";\npackage pkg;\nmessage User { string name = 1; }";
        let src = "syntax = \"proto3\";\npackage hello;\nimport \"proto/user.proto\";\n\
                   import \"google/protobuf/empty.proto\";\n\
                   service S { rpc Run (pkg.User) returns (google.protobuf.Empty); }";
        // Missing import: accepted when written, held back by the data plane.
        assert_eq!(check("src", src), Ok(()));
        let alone = Protos::compile_all(HashMap::from([("src".into(), src.into())]));
        let err = alone.get("src").unwrap().as_ref().unwrap_err();
        assert!(
            err.missing_import && err.message.contains("proto/user.proto"),
            "{err}"
        );
        let both = Protos::compile_all(HashMap::from([
            ("src".into(), src.into()),
            ("user".into(), user.into()),
        ]));
        let pool = both.get("src").unwrap().as_ref().unwrap();
        assert!(pool.get_message_by_name("pkg.User").is_some());
        assert_eq!(both.errors().count(), 0);
    }

    #[test]
    fn descriptor_sets_in_base64() {
        let pool = compile("1", ECHO, &Arc::new(HashMap::new())).unwrap();
        let set = base64::engine::general_purpose::STANDARD.encode(pool.encode_to_vec());
        let back = compile("2", &set, &Arc::new(HashMap::new())).unwrap();
        assert!(back.get_service_by_name("echo.EchoService").is_some());
        assert!(check("3", "bm90IGEgZGVzY3JpcHRvcg==").is_err());
    }
}
