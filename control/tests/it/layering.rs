//! The layering of the workspace, checked rather than hoped for (DESIGN.md, "Layout"):
//!
//! - no import circle between the files of any crate: every `crate::`, `super::`, `self::` and
//!   child-module path in a file is resolved to the file that defines the module it names, and
//!   the resulting graph must have no cycle;
//! - the two pure cores (`quorum-state`, `quorum-sched`) have no tokio, tonic, openraft or
//!   RocksDB anywhere in their dependency trees, and the `quorum` command-line client does not
//!   link the controller or the agent (`cargo tree`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The source roots of the workspace's library and binary crates.
const CRATE_ROOTS: &[&str] = &[
    "model/src",
    "proto/src",
    "auth/src",
    "raft/src",
    "control/state/src",
    "control/sched/src",
    "control/src",
    "agent/src",
    "client/src",
    "cli/src",
    "dev/src",
    "dbd/src",
    "jepsen/src",
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("control sits in the workspace").to_path_buf()
}

/// Every `.rs` file under `dir`, but not under `bin/` (each binary is a crate root of its own
/// that reaches the library by its crate name).
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() && p.file_name().is_some_and(|n| n != "bin") {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module path of a file relative to its crate's source root: `lib.rs` and `main.rs` are
/// the root, `a/mod.rs` and `a.rs` are `a`, `a/b.rs` is `a::b`.
fn module_of(root: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root).expect("the file is under its root");
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    if !(parts.is_empty() && (stem == "lib" || stem == "main")) && stem != "mod" {
        parts.push(stem.to_string());
    }
    parts
}

/// The source without comments, string literals and char literals, so that a path named in
/// a comment or a message is no import.
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if b[i] == b'r' && (b[i + 1..].starts_with(b"\"") || b[i + 1..].starts_with(b"#")) {
            // a raw string r"..." or r#"..."#
            let mut j = i + 1;
            let mut hashes = 0;
            while j < b.len() && b[j] == b'#' {
                hashes += 1;
                j += 1;
            }
            if j < b.len() && b[j] == b'"' {
                let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
                j += 1;
                while j < b.len() && !b[j..].starts_with(&close) {
                    j += 1;
                }
                i = j + close.len();
                out.push_str("\"\"");
            } else {
                out.push('r');
                i += 1;
            }
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // a char literal ('x' or '\n'); a lifetime has no closing quote
            i += 1;
            while i < b.len() && b[i] != b'\'' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else {
            let c = src[i..].chars().next().expect("inside the string");
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Expands a path with brace groups (`a::{b, c::{d as e}}`) into its plain paths, each with the
/// name it is brought in as (`a::b` as `b`, `a::c::d` as `e`; `a::{self}` is `a`).
fn expand(path: &str) -> Vec<(Vec<String>, String)> {
    let Some(open) = path.find('{') else {
        let (path, alias) = match path.split_once(" as ") {
            Some((p, a)) => (p, Some(a.trim().to_string())),
            None => (path, None),
        };
        let mut segments: Vec<String> =
            path.split("::").map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
        if segments.len() > 1 && segments.last().is_some_and(|s| s == "self") {
            segments.pop();
        }
        let name = alias.unwrap_or_else(|| segments.last().cloned().unwrap_or_default());
        return vec![(segments, name)];
    };
    let prefix = &path[..open];
    let mut depth = 0;
    let mut items = Vec::new();
    let mut start = open + 1;
    for (i, c) in path.char_indices().skip(open) {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    items.push(&path[start..i]);
                    break;
                }
            }
            ',' if depth == 1 => {
                items.push(&path[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.into_iter().map(str::trim).filter(|s| !s.is_empty()).flat_map(|s| expand(&format!("{prefix}{s}"))).collect()
}

/// Every path in `code` that starts with one of `heads` (`crate`, `super`, `self`, or a child
/// module's name), brace groups expanded, each with the name it is brought in as.
fn paths(code: &str, heads: &BTreeSet<String>) -> Vec<(usize, Vec<String>, String)> {
    let chars: Vec<char> = code.chars().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let after_path = i > 1 && chars[i - 1] == ':' && chars[i - 2] == ':';
        if !is_ident(chars[i]) || (i > 0 && is_ident(chars[i - 1])) || after_path {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < chars.len() && is_ident(chars[j]) {
            j += 1;
        }
        let head: String = chars[i..j].iter().collect();
        let starts_path = j + 1 < chars.len() && chars[j] == ':' && chars[j + 1] == ':';
        if !(heads.contains(&head) && starts_path) {
            i = j;
            continue;
        }
        // The whole path: identifiers, `::`, and balanced brace groups (with `as` renames).
        let mut k = j;
        let mut depth = 0;
        while k < chars.len() {
            let c = chars[k];
            if is_ident(c) || c == ':' || (depth > 0 && (c == ',' || c.is_whitespace() || c == '*')) {
                k += 1;
            } else if c == '{' {
                depth += 1;
                k += 1;
            } else if c == '}' && depth > 0 {
                depth -= 1;
                k += 1;
            } else {
                break;
            }
        }
        let mut text: String = chars[i..k].iter().collect();
        // `crate::a::b as c;` outside braces.
        let rest: String = chars[k..chars.len().min(k + 80)].iter().collect();
        if let Some(alias) = rest.strip_prefix(" as ") {
            let alias: String = alias.chars().take_while(|c| is_ident(*c)).collect();
            text = format!("{text} as {alias}");
        }
        found.extend(expand(&text).into_iter().map(|(p, n)| (i, p, n)));
        i = k;
    }
    found
}

/// For each character of `code`, how many inline modules (`mod tests { ... }`) enclose it: a
/// `super` there first leaves those, within the same file.
fn inline_depths(code: &str) -> Vec<usize> {
    let chars: Vec<char> = code.chars().collect();
    let mut depths = Vec::with_capacity(chars.len());
    // The brace depths at which inline modules opened.
    let mut open: Vec<usize> = Vec::new();
    let mut braces = 0;
    for i in 0..chars.len() {
        match chars[i] {
            '{' => {
                braces += 1;
                let before: String = chars[i.saturating_sub(64)..i].iter().collect();
                let words: Vec<&str> = before.split_whitespace().collect();
                if words.len() >= 2 && words[words.len() - 2].ends_with("mod") && words[words.len() - 2].len() <= 3 {
                    open.push(braces);
                }
            }
            '}' => {
                if open.last() == Some(&braces) {
                    open.pop();
                }
                braces -= 1;
            }
            _ => {}
        }
        depths.push(open.len());
    }
    depths
}

/// The child modules a file declares (`mod x;`, `pub mod x;`, `pub(crate) mod x;`).
fn declared_children(code: &str) -> BTreeSet<String> {
    code.lines()
        .filter_map(|l| {
            let l = l.trim();
            let rest = l.strip_prefix("pub ").or_else(|| l.strip_prefix("pub(crate) ")).unwrap_or(l);
            let rest = rest.strip_prefix("pub(super) ").unwrap_or(rest);
            rest.strip_prefix("mod ").and_then(|m| m.strip_suffix(';')).map(str::to_string)
        })
        .collect()
}

/// What a module re-exports: the name it is seen by, and the path it stands for.
fn reexports(code: &str) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for statement in code.split(';') {
        let s = statement.trim();
        let Some(rest) = ["pub use ", "pub(crate) use ", "pub(super) use "].iter().find_map(|p| s.strip_prefix(p))
        else {
            continue;
        };
        for (path, name) in expand(rest.trim()) {
            if name != "*" && !path.is_empty() {
                out.insert(name, path);
            }
        }
    }
    out
}

/// A crate's modules: each one's file, child modules and re-exports.
struct Modules {
    files: BTreeMap<Vec<String>, PathBuf>,
    children: BTreeMap<Vec<String>, BTreeSet<String>>,
    exports: BTreeMap<Vec<String>, BTreeMap<String, Vec<String>>>,
}

impl Modules {
    /// The file that defines what `path` names, seen from module `here`; `None` for another
    /// crate's item.
    fn resolve(&self, here: &[String], path: &[String], depth: usize) -> Option<&PathBuf> {
        let mut module = here.to_vec();
        let mut rest = path;
        match rest.first().map(String::as_str) {
            Some("crate") => {
                module.clear();
                rest = &rest[1..];
            }
            Some("self") => rest = &rest[1..],
            Some("super") => {
                while rest.first().is_some_and(|s| s == "super") {
                    module.pop();
                    rest = &rest[1..];
                }
            }
            // Not a child module here, in a re-export: another crate's item.
            Some(head) if depth > 0 && !self.children.get(&module).is_some_and(|c| c.contains(head)) => return None,
            _ => {}
        }
        // The longest prefix of what follows that names a module with a file.
        while let Some(seg) = rest.first() {
            let mut next = module.clone();
            next.push(seg.clone());
            if !self.files.contains_key(&next) {
                break;
            }
            module = next;
            rest = &rest[1..];
        }
        // A name the module re-exports resolves to where it comes from.
        if let Some(target) = rest.first().and_then(|seg| self.exports.get(&module)?.get(seg)) {
            if depth > 8 {
                return self.files.get(&module);
            }
            let mut next = target.clone();
            next.extend(rest[1..].iter().cloned());
            return self.resolve(&module, &next, depth + 1);
        }
        self.files.get(&module)
    }
}

/// Each file's imports of other files of the same crate.
fn import_graph(root: &Path) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    let code: BTreeMap<PathBuf, String> = files
        .iter()
        .map(|f| (f.clone(), code_only(&std::fs::read_to_string(f).expect("a readable source file"))))
        .collect();
    let mut modules = Modules { files: BTreeMap::new(), children: BTreeMap::new(), exports: BTreeMap::new() };
    for f in &files {
        let m = module_of(root, f);
        modules.children.insert(m.clone(), declared_children(&code[f]));
        modules.exports.insert(m.clone(), reexports(&code[f]));
        modules.files.insert(m, f.clone());
    }
    let mut graph = BTreeMap::new();
    for file in &files {
        let here = module_of(root, file);
        let mut heads: BTreeSet<String> = ["crate", "super", "self"].iter().map(|s| s.to_string()).collect();
        heads.extend(modules.children[&here].iter().cloned());
        let depths = inline_depths(&code[file]);
        let mut edges = BTreeSet::new();
        for (at, mut path, _) in paths(&code[file], &heads) {
            // In an inline module, the first `super`s stay in this file.
            let inline = depths.get(at).copied().unwrap_or(0);
            let leading = path.iter().take_while(|s| *s == "super").count();
            if leading > 0 {
                let stay = leading.min(inline);
                path.drain(..stay);
                if path.is_empty() {
                    continue;
                }
                if stay == leading {
                    path.insert(0, "self".into());
                }
            }
            if let Some(f) = modules.resolve(&here, &path, 0).filter(|f| *f != file) {
                edges.insert(f.clone());
            }
        }
        graph.insert(file.clone(), edges);
    }
    graph
}

/// The files on some cycle of `graph`, as the cycles' members (Tarjan's strongly connected
/// components of more than one file).
fn cycles(graph: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    struct Tarjan<'a> {
        graph: &'a BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on_stack: BTreeSet<&'a PathBuf>,
        found: Vec<Vec<PathBuf>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a PathBuf) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    self.found.push(component);
                }
            }
        }
    }
    let mut t = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.found
}

#[test]
fn no_file_of_any_crate_imports_a_file_that_imports_it_back() {
    let ws = workspace();
    let mut report = Vec::new();
    let mut edges = 0;
    for root in CRATE_ROOTS {
        let graph = import_graph(&ws.join(root));
        edges += graph.values().map(BTreeSet::len).sum::<usize>();
        for cycle in cycles(&graph) {
            // The imports within the cycle, so that the message says which one closes it.
            let name = |f: &PathBuf| f.strip_prefix(&ws).unwrap_or(f).display().to_string();
            let members: BTreeSet<&PathBuf> = cycle.iter().collect();
            let imports: Vec<String> = cycle
                .iter()
                .flat_map(|f| graph[f].iter().filter(|t| members.contains(t)).map(move |t| (f, t)))
                .map(|(f, t)| format!("  {} imports {}", name(f), name(t)))
                .collect();
            report.push(format!("a circle of {} files:\n{}", cycle.len(), imports.join("\n")));
        }
    }
    assert!(
        edges > 100,
        "only {edges} imports found between files: the resolver is broken, so this check proves nothing"
    );
    assert!(report.is_empty(), "import circles between files:\n{}", report.join("\n"));
}

#[test]
fn the_resolver_finds_a_circle_where_there_is_one() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("a")).unwrap();
    let files = [
        ("lib.rs", "pub mod a;\npub mod b;\npub mod c;\npub use a::inner::Thing;\npub use std as ext;\n"),
        ("a/mod.rs", "pub mod inner;\nuse inner::Thing;\n// crate::c::Nothing in a comment\n"),
        ("a/inner.rs", "use super::super::b;\npub struct Thing;\n"),
        ("b.rs", "use crate::{a::{self, inner as _}};\nconst S: &str = \"crate::c\";\n"),
        ("c.rs", "use crate::Thing;\nuse crate::ext::fmt;\nmod tests {\n    use super::*;\n}\n"),
    ];
    for (name, text) in files {
        std::fs::write(src.join(name), text).unwrap();
    }
    let graph = import_graph(src);
    let rel = |f: &PathBuf| f.strip_prefix(src).unwrap().display().to_string();
    let edges: BTreeSet<(String, String)> =
        graph.iter().flat_map(|(f, to)| to.iter().map(move |t| (rel(f), rel(t)))).collect();
    let expected: BTreeSet<(String, String)> = [
        ("lib.rs", "a/inner.rs"),
        ("a/mod.rs", "a/inner.rs"),
        ("a/inner.rs", "b.rs"),
        ("b.rs", "a/mod.rs"),
        ("b.rs", "a/inner.rs"),
        // crate::Thing, re-exported by lib.rs, is a/inner.rs's; crate::ext is another crate.
        ("c.rs", "a/inner.rs"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(edges, expected);
    let found = cycles(&graph);
    assert_eq!(found.len(), 1, "{found:?}");
    let mut members: Vec<String> = found[0].iter().map(rel).collect();
    members.sort();
    assert_eq!(members, ["a/inner.rs", "a/mod.rs", "b.rs"]);
}

/// The names of every package in the dependency tree of `package` (normal dependencies, as
/// linked into its library and binaries).
fn dependency_tree(package: &str) -> BTreeSet<String> {
    let out = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "-p", package, "-e", "normal", "--prefix", "none", "--format", "{p}"])
        .current_dir(workspace())
        .output()
        .expect("cargo runs");
    assert!(out.status.success(), "cargo tree -p {package}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_pure_cores_and_the_cli_depend_on_nothing_above_them() {
    let forbidden_in_cores =
        ["tokio", "tonic", "openraft", "rocksdb", "librocksdb-sys", "quorum-raft", "quorum-control"];
    for core in ["quorum-state", "quorum-sched"] {
        let tree = dependency_tree(core);
        assert!(tree.contains("quorum-model"), "{core}'s tree was read: {tree:?}");
        let found: Vec<&&str> = forbidden_in_cores.iter().filter(|f| tree.contains(**f)).collect();
        assert!(found.is_empty(), "{core} depends on {found:?}");
    }
    let cli = dependency_tree("quorum-cli");
    assert!(cli.contains("quorum-client"), "the CLI's tree was read: {cli:?}");
    let above =
        ["quorum-control", "quorum-agent", "quorum-dev", "quorum-raft", "openraft", "rocksdb", "librocksdb-sys"];
    let found: Vec<&&str> = above.iter().filter(|f| cli.contains(**f)).collect();
    assert!(found.is_empty(), "the quorum CLI depends on {found:?}");
    // The exporter is a client of the cluster too: it reads the history over the API.
    let dbd = dependency_tree("quorum-dbd");
    assert!(dbd.contains("quorum-client") && dbd.contains("tokio-postgres"), "quorum-dbd's tree was read: {dbd:?}");
    let found: Vec<&&str> = above.iter().filter(|f| dbd.contains(**f)).collect();
    assert!(found.is_empty(), "quorum-dbd depends on {found:?}");
}
