//! The layers of `docs/ARCHITECTURE.md`, checked, and the rule that no two files need each other.
//!
//! Every crate of the workspace (the library in `src/`, and each front end under `crates/`) is
//! read as a tree of modules, from its root file and its `mod` declarations, and as a graph of
//! files: a file *uses* another when its code (comments, string literals and `#[cfg(test)]`
//! items left out) names a path that resolves to an item or module of the other — `crate::…`,
//! `super::…`, `self::…`, a child module's name, or a `use` of one of them, followed through
//! `use` imports and re-exports to the file that defines the item. A module declaration or a
//! re-export (`pub use child::Item`) is structure, not a use: a facade that only re-exports its
//! children does not use them (it does once its own code names what it re-exports).
//!
//! The checks: every module has a layer (and inside the algorithms layer a sub-layer; inside a
//! front end a layer of that crate) and uses only its own or lower layers, the algorithms only
//! strictly lower sub-layers; no front end names another; and the file graph has no cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The library's layers, lowest first, as ARCHITECTURE.md draws them: each is a list of
/// sub-layers (lowest first), each a list of top-level modules. A module may use modules of a
/// lower layer and of its own layer; inside a layer of several sub-layers (the algorithms),
/// only modules of a strictly lower sub-layer.
const LAYERS: &[(&str, &[&[&str]])] = &[
    (
        "data",
        &[&[
            "host_data",
            "recycle",
            "dtype",
            "rng",
            "error",
            "pyfmt",
            "warnings",
            "budget",
            "blocking",
        ]],
    ),
    ("compute", &[&["backend"]]),
    ("tensors", &[&["tensor", "transfer", "json"]]),
    ("communication", &[&["comm"]]),
    ("model state", &[&["replicas"]]),
    (
        "algorithms",
        &[
            // Written against the layers below only.
            &["step", "optim", "averaging", "join", "bench"],
            // Built on an optimizer, an averager or the join context.
            &["post_local_sgd", "diloco", "ddp", "zero", "rpc"],
            // Runs the algorithms above.
            &["train"],
        ],
    ),
];

/// Each front end's own modules in layers, lowest first (its root file, `lib.rs` or `main.rs`,
/// is above them all). A front end's files may use the library (any layer) and their own
/// modules of a lower layer or of their own; no other front end.
const FRONT_ENDS: &[(&str, &[&[&str]])] = &[
    (
        "distopt-js",
        &[
            // The module's memory budget, then argument conversion (which checks copies
            // against it).
            &["budget"],
            &["convert"],
            // Settings and options objects read as serde types.
            &["settings"],
            // What every binding shares: thrown errors and promises; the registries that find
            // the Rust object behind a JS argument; the slot of an object a wrapper can take.
            &["boundary", "handles"],
            &["slot"],
            &["typings"],
            // A networked rank's link: the npm package's NATS port; a server's configuration.
            &["nats", "nats_config"],
            // The current backend, the worlds, the CPU pool's workers.
            &["session", "world", "threads"],
            // A Trainer's settings (its world among them).
            &["trainer_settings"],
            // The replicas every algorithm takes, and what a wrapper of them holds.
            &["replicas"],
            &["wrapper"],
            // The objects a wrapper takes (optimizers, averagers), and bindings that take only
            // replicas and worlds.
            &["optim", "averaging", "train", "bench"],
            // The wrappers, and the bindings that take an optimizer class.
            &["post_local_sgd", "diloco", "zero", "rpc"],
            // Join takes ZeRO and DDP joinables.
            &["join"],
        ],
    ),
    (
        "distopt-cli",
        &[
            // The command line, its output, progress lines and the step told on stdin.
            &["args", "output", "progress", "finish"],
            // The run a process joins (`--world`).
            &["world"],
            // The workloads.
            &[
                "bench_algorithms",
                "bench_all",
                "bench_comm",
                "bench_overlap",
                "bench_recovery",
                "train",
            ],
            // `bench`, which runs the algorithm and all-in-one workloads.
            &["bench"],
        ],
    ),
];

// ---------------------------------------------------------------------------------------------
// Reading Rust: tokens without comments, strings and `#[cfg(test)]` items.

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    /// An identifier, keyword or number.
    Word(String),
    /// `::`.
    Path,
    /// Any other punctuation character.
    Punct(char),
}

/// The tokens of `text` with their line numbers (1-based); comments and literals are dropped.
fn lex(text: &str) -> Vec<(Tok, usize)> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    let count_lines = |from: usize, to: usize, line: &mut usize| {
        *line += chars[from..to].iter().filter(|&&c| c == '\n').count();
    };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let start = i;
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            count_lines(start, i, &mut line);
        } else if c == '"' || (c == 'b' && next == Some('"')) {
            let start = i;
            i += if c == 'b' { 2 } else { 1 };
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            count_lines(start, i.min(chars.len()), &mut line);
        } else if (c == 'r' || (c == 'b' && next == Some('r'))) && {
            let j = if c == 'b' { i + 2 } else { i + 1 };
            let mut k = j;
            while chars.get(k) == Some(&'#') {
                k += 1;
            }
            chars.get(k) == Some(&'"') && (k > j || chars.get(j) == Some(&'"'))
        } {
            // A raw string: r"…", r#"…"#, br"…".
            let start = i;
            i += if c == 'b' { 2 } else { 1 };
            let mut hashes = 0;
            while chars[i] == '#' {
                hashes += 1;
                i += 1;
            }
            i += 1;
            loop {
                if i >= chars.len() {
                    break;
                }
                if chars[i] == '"' && (0..hashes).all(|h| chars.get(i + 1 + h) == Some(&'#')) {
                    i += 1 + hashes;
                    break;
                }
                i += 1;
            }
            count_lines(start, i.min(chars.len()), &mut line);
        } else if c == '\'' {
            // A char literal ('a', '\n', '\u{1F600}') or a lifetime ('a).
            if next == Some('\\') {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
            }
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push((Tok::Word(chars[start..i].iter().collect()), line));
        } else if c == ':' && next == Some(':') {
            out.push((Tok::Path, line));
            i += 2;
        } else {
            out.push((Tok::Punct(c), line));
            i += 1;
        }
    }
    out
}

fn word(t: &Tok) -> Option<&str> {
    match t {
        Tok::Word(w) => Some(w),
        _ => None,
    }
}

fn is_punct(t: Option<&(Tok, usize)>, c: char) -> bool {
    matches!(t, Some((Tok::Punct(p), _)) if *p == c)
}

/// Where the item starting at `i` ends (one past its last token): its first `;` or its first
/// `{…}` group (and a `;` right after it) outside parentheses and brackets.
fn item_end(toks: &[(Tok, usize)], mut i: usize) -> usize {
    let mut depth = 0i32;
    while i < toks.len() {
        match &toks[i].0 {
            Tok::Punct('(' | '[') => depth += 1,
            Tok::Punct(')' | ']') => depth -= 1,
            Tok::Punct(';') if depth == 0 => return i + 1,
            Tok::Punct('{') if depth == 0 => {
                let mut braces = 0;
                while i < toks.len() {
                    match toks[i].0 {
                        Tok::Punct('{') => braces += 1,
                        Tok::Punct('}') => {
                            braces -= 1;
                            if braces == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
                return if is_punct(toks.get(i + 1), ';') {
                    i + 2
                } else {
                    i + 1
                };
            }
            _ => {}
        }
        i += 1;
    }
    i
}

/// The tokens with every `#[cfg(test)]` item left out.
fn without_tests(toks: Vec<(Tok, usize)>) -> Vec<(Tok, usize)> {
    let test_attr = [
        Tok::Punct('#'),
        Tok::Punct('['),
        Tok::Word("cfg".into()),
        Tok::Punct('('),
        Tok::Word("test".into()),
        Tok::Punct(')'),
        Tok::Punct(']'),
    ];
    let mut out = Vec::with_capacity(toks.len());
    let mut i = 0;
    while i < toks.len() {
        if toks.len() - i >= test_attr.len()
            && toks[i..i + test_attr.len()]
                .iter()
                .map(|(t, _)| t)
                .eq(test_attr.iter())
        {
            i = item_end(&toks, i + test_attr.len());
        } else {
            out.push(toks[i].clone());
            i += 1;
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Use trees and paths.

/// One name a `use` brings in: the path it names and the name it binds (`None`: a glob).
#[derive(Debug, Clone, PartialEq)]
struct UseItem {
    path: Vec<String>,
    binds: Option<String>,
}

/// Parses the use tree at `toks[*i..]` (after `use`, up to `;`) under `prefix`.
fn use_tree(toks: &[(Tok, usize)], i: &mut usize, prefix: &[String], out: &mut Vec<UseItem>) {
    let mut path = prefix.to_vec();
    if matches!(toks.get(*i), Some((Tok::Path, _))) {
        *i += 1; // `use ::external::…`
        path.push("::".into());
    }
    loop {
        match toks.get(*i).map(|(t, _)| t) {
            Some(Tok::Punct('{')) => {
                *i += 1;
                loop {
                    if is_punct(toks.get(*i), '}') {
                        *i += 1;
                        return;
                    }
                    use_tree(toks, i, &path, out);
                    if is_punct(toks.get(*i), ',') {
                        *i += 1;
                    }
                }
            }
            Some(Tok::Punct('*')) => {
                *i += 1;
                out.push(UseItem { path, binds: None });
                return;
            }
            Some(Tok::Word(w)) => {
                let w = w.clone();
                *i += 1;
                if w == "self" && !path.is_empty() && !matches!(toks.get(*i), Some((Tok::Path, _)))
                {
                    // `use a::{self}`: binds `a`.
                    let binds = alias(toks, i).or_else(|| path.last().cloned());
                    out.push(UseItem { path, binds });
                    return;
                }
                path.push(w.clone());
                if matches!(toks.get(*i), Some((Tok::Path, _))) {
                    *i += 1;
                    continue;
                }
                let binds = alias(toks, i).unwrap_or(w);
                out.push(UseItem {
                    path,
                    binds: Some(binds),
                });
                return;
            }
            _ => return,
        }
    }
}

fn alias(toks: &[(Tok, usize)], i: &mut usize) -> Option<String> {
    if toks.get(*i).and_then(|(t, _)| word(t)) == Some("as") {
        let name = toks
            .get(*i + 1)
            .and_then(|(t, _)| word(t))
            .map(String::from);
        *i += 2;
        return name;
    }
    None
}

// ---------------------------------------------------------------------------------------------
// A crate as modules and files.

/// How a path found in a file is to be read.
#[derive(Debug, Clone)]
struct Mention {
    /// The module (an index into `Crate::modules`) the path is written in.
    scope: usize,
    path: Vec<String>,
    line: usize,
}

#[derive(Debug)]
struct Module {
    path: Vec<String>,
    parent: Option<usize>,
    /// The file, relative to the workspace root.
    file: String,
    children: BTreeMap<String, usize>,
    /// Names bound by `use` in this module → the path they name (as written).
    imports: BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Default)]
struct Crate {
    modules: Vec<Module>,
    /// Per file: the paths its code names (imports that are not re-exports included).
    mentions: BTreeMap<String, Vec<Mention>>,
    /// Files reached from the root.
    files: BTreeSet<String>,
}

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn relative(path: &Path) -> String {
    path.strip_prefix(workspace())
        .unwrap()
        .to_string_lossy()
        .replace('\\', "/")
}

impl Crate {
    /// Reads the crate whose root file is `root` (`src/lib.rs`, `…/src/main.rs`).
    fn read(root: &Path) -> Crate {
        let mut krate = Crate::default();
        krate.modules.push(Module {
            path: Vec::new(),
            parent: None,
            file: relative(root),
            children: BTreeMap::new(),
            imports: BTreeMap::new(),
        });
        krate.read_file(0, root, root.parent().unwrap().to_path_buf());
        krate
    }

    /// Reads `file`, the module `module`, whose child modules' files live in `dir`.
    fn read_file(&mut self, module: usize, file: &Path, dir: PathBuf) {
        let name = relative(file);
        self.files.insert(name.clone());
        let text = std::fs::read_to_string(file).unwrap();
        let toks = without_tests(lex(&text));
        let mut mentions = Vec::new();
        // (module, brace depth at which its inline block closes)
        let mut scopes: Vec<(usize, i32, PathBuf)> = vec![(module, -1, dir)];
        let mut depth = 0;
        let mut i = 0;
        while i < toks.len() {
            let (tok, line) = &toks[i];
            let scope = scopes.last().unwrap().0;
            let prev = i.checked_sub(1).map(|p| &toks[p].0);
            let starts_item = !matches!(prev, Some(Tok::Path));
            match tok {
                Tok::Punct('{') => depth += 1,
                Tok::Punct('}') => {
                    depth -= 1;
                    if scopes.last().unwrap().1 == depth {
                        scopes.pop();
                    }
                }
                Tok::Word(w) if w == "mod" && starts_item => {
                    let child = word(&toks[i + 1].0).unwrap().to_string();
                    let dir = scopes.last().unwrap().2.clone();
                    let index = self.add_module(scope, &child, String::new());
                    if is_punct(toks.get(i + 2), '{') {
                        // An inline module: the same file.
                        self.modules[index].file = name.clone();
                        scopes.push((index, depth, dir.join(&child)));
                        depth += 1;
                        i += 3;
                        continue;
                    }
                    let flat = dir.join(format!("{child}.rs"));
                    let nested = dir.join(&child).join("mod.rs");
                    let (child_file, child_dir) = if flat.exists() {
                        (flat, dir.join(&child))
                    } else {
                        assert!(nested.exists(), "{name}: no file for `mod {child}`");
                        (nested, dir.join(&child))
                    };
                    self.modules[index].file = relative(&child_file);
                    self.read_file(index, &child_file, child_dir);
                    i += 2;
                    continue;
                }
                Tok::Word(w) if w == "use" && starts_item => {
                    let reexport = is_reexport(&toks, i);
                    let mut items = Vec::new();
                    let mut j = i + 1;
                    use_tree(&toks, &mut j, &[], &mut items);
                    while j < toks.len() && !is_punct(toks.get(j), ';') {
                        j += 1;
                    }
                    let rest: BTreeSet<&str> = toks[..i]
                        .iter()
                        .chain(&toks[j..])
                        .filter_map(|(t, _)| word(t))
                        .collect();
                    for item in items {
                        if let Some(binds) = &item.binds {
                            self.modules[scope]
                                .imports
                                .insert(binds.clone(), item.path.clone());
                        }
                        // A re-export is structure unless this file's code names it too.
                        let used_here = item.binds.as_deref().is_some_and(|b| rest.contains(b));
                        if !reexport || used_here {
                            mentions.push(Mention {
                                scope,
                                path: item.path,
                                line: *line,
                            });
                        }
                    }
                    i = j + 1;
                    continue;
                }
                Tok::Word(w)
                    if starts_item
                        && matches!(toks.get(i + 1), Some((Tok::Path, _)))
                        && (matches!(w.as_str(), "crate" | "super" | "self")
                            || self.modules[scope].children.contains_key(w)) =>
                {
                    let mut path = vec![w.clone()];
                    let mut j = i + 1;
                    while matches!(toks.get(j), Some((Tok::Path, _))) {
                        match toks.get(j + 1).and_then(|(t, _)| word(t)) {
                            Some(next) => path.push(next.to_string()),
                            None => break,
                        }
                        j += 2;
                    }
                    mentions.push(Mention {
                        scope,
                        path,
                        line: *line,
                    });
                    i = j;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
        self.mentions.entry(name).or_default().extend(mentions);
    }

    fn add_module(&mut self, parent: usize, name: &str, file: String) -> usize {
        let mut path = self.modules[parent].path.clone();
        path.push(name.to_string());
        self.modules.push(Module {
            path,
            parent: Some(parent),
            file,
            children: BTreeMap::new(),
            imports: BTreeMap::new(),
        });
        let index = self.modules.len() - 1;
        self.modules[parent]
            .children
            .insert(name.to_string(), index);
        index
    }

    /// The file that defines what `path` (written in module `scope`) names, or `None` for
    /// another crate's.
    fn resolve(&self, scope: usize, path: &[String], hops: usize) -> Option<String> {
        if hops > 16 {
            return None;
        }
        let mut rest = path;
        let mut module = match rest.first().map(String::as_str) {
            Some("crate") => {
                rest = &rest[1..];
                0
            }
            Some("self") => {
                rest = &rest[1..];
                scope
            }
            Some("super") => {
                let mut m = scope;
                while rest.first().map(String::as_str) == Some("super") {
                    m = self.modules[m].parent?;
                    rest = &rest[1..];
                }
                m
            }
            Some(first) if self.modules[scope].children.contains_key(first) => scope,
            Some(first) if self.modules[scope].imports.contains_key(first) && rest.len() > 1 => {
                // `use super::convert;` … `convert::set`: through the import.
                let mut through = self.modules[scope].imports[first].clone();
                through.extend_from_slice(&rest[1..]);
                return self.resolve(scope, &through, hops + 1);
            }
            _ => return None, // another crate (or a name of the prelude)
        };
        while let Some(&child) = rest
            .first()
            .and_then(|n| self.modules[module].children.get(n))
        {
            module = child;
            rest = &rest[1..];
        }
        match rest.first() {
            Some(name) if self.modules[module].imports.contains_key(name) => {
                let mut through = self.modules[module].imports[name].clone();
                through.extend_from_slice(&rest[1..]);
                self.resolve(module, &through, hops + 1)
            }
            _ => Some(self.modules[module].file.clone()),
        }
    }

    /// File → (file it uses → the first line that does).
    fn graph(&self) -> BTreeMap<String, BTreeMap<String, usize>> {
        let mut graph: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
        for (file, mentions) in &self.mentions {
            let edges = graph.entry(file.clone()).or_default();
            for m in mentions {
                if let Some(target) = self.resolve(m.scope, &m.path, 0) {
                    if &target != file {
                        edges.entry(target).or_insert(m.line);
                    }
                }
            }
        }
        graph
    }
}

/// Whether the `use` at `toks[i]` is `pub use` / `pub(…) use`.
fn is_reexport(toks: &[(Tok, usize)], i: usize) -> bool {
    let before = |k: usize| i.checked_sub(k).map(|p| &toks[p].0);
    before(1) == Some(&Tok::Word("pub".into()))
        || (before(1) == Some(&Tok::Punct(')'))
            && (2..6).any(|k| before(k) == Some(&Tok::Word("pub".into()))))
}

// ---------------------------------------------------------------------------------------------
// The checks.

/// Every crate of the workspace: the library, then the front ends.
fn crates() -> Vec<(&'static str, Crate)> {
    let root = workspace();
    let mut all = vec![("distopt", Crate::read(&root.join("src/lib.rs")))];
    for (name, _) in FRONT_ENDS {
        let src = root.join("crates").join(name).join("src");
        let file = if src.join("lib.rs").exists() {
            "lib.rs"
        } else {
            "main.rs"
        };
        all.push((name, Crate::read(&src.join(file))));
    }
    all
}

/// The (layer, sub-layer) of top-level module `module` in `layers`.
fn place(layers: &[(&str, &[&[&str]])], module: &str) -> Option<(usize, usize)> {
    layers.iter().enumerate().find_map(|(l, (_, subs))| {
        subs.iter()
            .position(|s| s.contains(&module))
            .map(|s| (l, s))
    })
}

/// The top-level module a file of a crate whose root file is `root` belongs to (`None`: the
/// root file itself).
fn top_module(root: &str, file: &str) -> Option<String> {
    let dir = root.rsplit_once('/').unwrap().0;
    let rel = file.strip_prefix(dir).unwrap().trim_start_matches('/');
    if file == root {
        return None;
    }
    Some(
        rel.split('/')
            .next()
            .unwrap()
            .trim_end_matches(".rs")
            .to_string(),
    )
}

fn layer_name(layers: &[(&str, &[&[&str]])], (l, s): (usize, usize)) -> String {
    if layers[l].1.len() > 1 {
        format!("{} {}", layers[l].0, s)
    } else {
        layers[l].0.to_string()
    }
}

/// The uses that point up `layers` in `krate`.
fn upward_uses(krate: &Crate, layers: &[(&str, &[&[&str]])]) -> Vec<String> {
    let root = &krate.modules[0].file;
    let mut found = Vec::new();
    for (file, edges) in &krate.graph() {
        let Some(mine) = top_module(root, file) else {
            continue; // the root file sits above every module
        };
        let Some(me) = place(layers, &mine) else {
            found.push(format!(
                "{file}: module `{mine}` has no layer: add it to the table and to ARCHITECTURE.md"
            ));
            continue;
        };
        for (target, line) in edges {
            let Some(theirs) = top_module(root, target) else {
                found.push(format!(
                    "{file}:{line} ({mine}) uses the crate root {target}"
                ));
                continue;
            };
            if theirs == mine {
                continue;
            }
            let Some(them) = place(layers, &theirs) else {
                continue; // reported for its own files
            };
            let strict = layers[me.0].1.len() > 1;
            let up =
                them.0 > me.0 || (them.0 == me.0 && (them.1 > me.1 || (strict && them.1 == me.1)));
            if up {
                found.push(format!(
                    "{file}:{line}: {mine} ({}) uses {theirs} ({}) in {target}",
                    layer_name(layers, me),
                    layer_name(layers, them)
                ));
            }
        }
    }
    found
}

#[test]
fn imports_point_down_the_layers() {
    let all = crates();
    let (_, library) = &all[0];
    let top: Vec<&str> = library.modules[0]
        .children
        .keys()
        .map(String::as_str)
        .collect();
    assert!(top.len() > 10, "lib.rs lists its modules: {top:?}");
    let mut upward = upward_uses(library, LAYERS);
    for m in &top {
        if place(LAYERS, m).is_none() {
            upward.push(format!(
                "module `{m}` has no layer: add it to LAYERS and to ARCHITECTURE.md"
            ));
        }
    }
    assert!(
        upward.is_empty(),
        "imports that point up:\n{}",
        upward.join("\n")
    );
}

#[test]
fn front_ends_use_the_library_and_their_own_lower_modules() {
    let all = crates();
    let mut upward = Vec::new();
    for (name, krate) in &all[1..] {
        let layers = FRONT_ENDS.iter().find(|(n, _)| n == name).unwrap().1;
        let layers: &[(&str, &[&[&str]])] = &[(name, layers)];
        upward.extend(upward_uses(krate, layers));
        for m in krate.modules[0].children.keys() {
            if place(layers, m).is_none() {
                upward.push(format!("{name}: module `{m}` has no layer in FRONT_ENDS"));
            }
        }
        // No front end names another.
        for file in &krate.files {
            let text = std::fs::read_to_string(workspace().join(file)).unwrap();
            for (other, _) in FRONT_ENDS.iter().filter(|(o, _)| o != name) {
                let ident = other.replace('-', "_");
                if lex(&text)
                    .iter()
                    .any(|(t, _)| word(t) == Some(ident.as_str()))
                {
                    upward.push(format!("{file} names the front end {other}"));
                }
            }
        }
    }
    assert!(
        upward.is_empty(),
        "front-end imports that point up:\n{}",
        upward.join("\n")
    );
}

/// The strongly connected components of `graph` of more than one file (Tarjan's algorithm).
fn cycles(graph: &BTreeMap<String, BTreeMap<String, usize>>) -> Vec<Vec<String>> {
    struct State<'g> {
        graph: &'g BTreeMap<String, BTreeMap<String, usize>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flat_map(|e| e.keys()) {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on_stack.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.found
}

#[test]
fn no_file_needs_a_file_that_needs_it() {
    let mut failures = Vec::new();
    for (name, krate) in &crates() {
        let graph = krate.graph();
        for component in cycles(&graph) {
            let members: BTreeSet<&str> = component.iter().map(String::as_str).collect();
            let mut text = format!("{name}: a cycle of {} files:", component.len());
            for file in &component {
                for (target, line) in &graph[file] {
                    if members.contains(target.as_str()) {
                        text.push_str(&format!("\n  {file}:{line} uses {target}"));
                    }
                }
            }
            failures.push(text);
        }
    }
    assert!(
        failures.is_empty(),
        "import cycles:\n{}",
        failures.join("\n")
    );
}

#[test]
fn every_source_file_is_a_module() {
    for (name, krate) in &crates() {
        let dir = workspace().join(krate.modules[0].file.rsplit_once('/').unwrap().0);
        let mut files = Vec::new();
        rust_files(&dir, &mut files);
        for file in files {
            let file = relative(&file);
            assert!(
                krate.files.contains(&file) || is_test_only(&file),
                "{name}: {file} is not reached from the crate root by `mod` declarations"
            );
        }
    }
}

/// Files of a `#[cfg(test)] mod name;` (left out with the test code): `dir/name.rs` declared
/// so by `dir/mod.rs` or `dir.rs`.
fn is_test_only(file: &str) -> bool {
    let Some((dir, name)) = file.rsplit_once('/') else {
        return false;
    };
    let Some(stem) = name.strip_suffix(".rs") else {
        return false;
    };
    [format!("{dir}/mod.rs"), format!("{dir}.rs")]
        .iter()
        .filter_map(|parent| std::fs::read_to_string(workspace().join(parent)).ok())
        .any(|code| {
            let words: Vec<&str> = code.split_whitespace().collect();
            words
                .windows(3)
                .any(|w| w[0] == "#[cfg(test)]" && w[1] == "mod" && w[2] == format!("{stem};"))
        })
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

#[test]
fn the_reader_skips_comments_strings_and_tests() {
    let toks = without_tests(lex(
        "use crate::{tensor::Tensor, error::{self, Error as E}}; // crate::x\n\
         let s = \"crate::y\"; let r = r#\"super::z\"#; let c = '\\''; fn f<'a>() {}\n\
         #[cfg(test)]\nmod tests { use super::w; }\n/* crate::v */ self::u::g();",
    ));
    let words: Vec<&str> = toks.iter().filter_map(|(t, _)| word(t)).collect();
    for gone in ["x", "y", "z", "w", "v", "tests"] {
        assert!(!words.contains(&gone), "{gone} in {words:?}");
    }
    assert!(words.contains(&"u"));
    let mut items = Vec::new();
    let mut i = 1;
    use_tree(&toks, &mut i, &[], &mut items);
    let seen: Vec<(String, Option<String>)> = items
        .into_iter()
        .map(|u| (u.path.join("::"), u.binds))
        .collect();
    assert_eq!(
        seen,
        vec![
            ("crate::tensor::Tensor".into(), Some("Tensor".into())),
            ("crate::error".into(), Some("error".into())),
            ("crate::error::Error".into(), Some("E".into())),
        ]
    );
}
