//! The layers of `docs/ARCHITECTURE.md`, checked: every top-level module of the library has a
//! layer, and no file of the library names (`crate::…`, outside comments) a module of a higher
//! layer, directly or through a re-export at the crate root. Data flows down; `use` points
//! down only.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The layers, lowest first, as ARCHITECTURE.md draws them.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "data",
        &[
            "host_data",
            "recycle",
            "dtype",
            "rng",
            "error",
            "pyfmt",
            "warnings",
            "budget",
        ],
    ),
    ("compute", &["backend"]),
    ("tensors", &["tensor", "transfer", "json"]),
    ("communication", &["comm"]),
    ("model state", &["replicas"]),
    (
        "algorithms",
        &[
            "step",
            "optim",
            "averaging",
            "post_local_sgd",
            "diloco",
            "ddp",
            "join",
            "zero",
            "rpc",
            "train",
            "bench",
        ],
    ),
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS
        .iter()
        .position(|(_, modules)| modules.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The first path segment of every `crate::` path in `code`, `crate::{a, b::c}` included.
fn crate_paths(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().last();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `distopt_crate::…` and the like
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    found.push(name);
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            found.push(name);
        }
    }
    found
}

/// Names re-exported at the crate root (`pub use module::{A, B}` in lib.rs) → their module.
fn root_exports(lib: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    let mut text = lib;
    while let Some(at) = text.find("pub use ") {
        text = &text[at + "pub use ".len()..];
        let end = text.find(';').unwrap();
        let item = &text[..end];
        let (module, rest) = item.split_once("::").unwrap();
        let rest = rest.trim_start_matches('{').trim_end_matches('}');
        for name in rest.split(',') {
            let name = name.trim().rsplit("::").next().unwrap().to_string();
            if !name.is_empty() {
                names.insert(name, module.trim().to_string());
            }
        }
    }
    names
}

#[test]
fn imports_point_down_the_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let exports = root_exports(&lib);
    let modules: Vec<&str> = lib
        .lines()
        .filter_map(|l| {
            l.trim()
                .strip_prefix("pub mod ")
                .or(l.trim().strip_prefix("pub(crate) mod "))
        })
        .map(|l| l.trim_end_matches(';'))
        .collect();
    assert!(modules.len() > 10, "lib.rs lists its modules: {modules:?}");
    for m in &modules {
        assert!(
            layer_of(m).is_some(),
            "module `{m}` has no layer: add it to LAYERS and to ARCHITECTURE.md"
        );
    }
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut upward = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        let top = rel
            .iter()
            .next()
            .unwrap()
            .to_str()
            .unwrap()
            .trim_end_matches(".rs");
        if top == "lib" {
            continue;
        }
        let mine = layer_of(top).unwrap();
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for name in crate_paths(line) {
                let module = exports.get(&name).map_or(name.as_str(), String::as_str);
                if let Some(theirs) = layer_of(module) {
                    if theirs > mine {
                        upward.push(format!(
                            "src/{}:{}: {} ({}) names crate::{} ({})",
                            rel.display(),
                            n + 1,
                            top,
                            LAYERS[mine].0,
                            name,
                            LAYERS[theirs].0
                        ));
                    }
                }
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports that point up:\n{}",
        upward.join("\n")
    );
}

#[test]
fn the_path_reader_finds_grouped_and_plain_paths() {
    assert_eq!(
        crate_paths("use crate::{tensor::Tensor, Error}; let x = crate::rng::mix(1, 2);"),
        vec!["tensor", "Error", "rng"]
    );
    assert!(crate_paths("other_crate::x").is_empty());
}
