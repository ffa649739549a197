//! The crates' modules form a hierarchy: no two of them use each other, directly or through
//! others, so each can be read knowing only the ones below it. Checked at every level: the
//! top-level modules of `src/`, `kernels/src/` and `models/src/`, and the files inside each
//! module folder (`src/data/folder.rs` and `src/data/spec.rs` are siblings). A reference is any
//! path through `crate::` or `super::` in code outside `#[cfg(test)]`, brace groups included
//! (`use super::{cifar, folder}`); a child naming its parent (or the reverse) is not a cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type ModPath = Vec<String>;

/// Each `.rs` file under `src` by module path (`["data", "folder"]`; `mod.rs` is its folder's
/// module; `lib.rs`/`main.rs` the root, `[]`), with its code before `#[cfg(test)]`, line
/// comments removed.
fn modules(src: &Path) -> BTreeMap<ModPath, String> {
    let mut found = BTreeMap::new();
    let mut stack = vec![src.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path.strip_prefix(src).unwrap().with_extension("");
            let mut module: ModPath = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(module.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                module.pop();
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap();
            let code: String = code
                .lines()
                .map(|l| match l.find("//") {
                    Some(at) if !l[..at].ends_with(':') => &l[..at],
                    _ => l,
                })
                .collect::<Vec<_>>()
                .join("\n");
            found.entry(module).or_insert_with(String::new).push_str(&code);
        }
    }
    found
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The paths written at the start of `s` (`a::b::c`, or `a::{b, c::d}` expanded), as segments.
fn paths_at(s: &str) -> Vec<Vec<String>> {
    let mut segments = Vec::new();
    let mut rest = s;
    loop {
        rest = rest.trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            // The items up to the matching brace, split at top-level commas.
            let (mut depth, mut start, mut items) = (0usize, 0, Vec::new());
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        items.push(&group[start..i]);
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        items.push(&group[start..i]);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            return items
                .into_iter()
                .flat_map(paths_at)
                .map(|tail| segments.iter().cloned().chain(tail).collect())
                .collect();
        }
        let ident: String = rest.chars().take_while(|&c| is_ident(c)).collect();
        if ident.is_empty() {
            break;
        }
        rest = &rest[ident.len()..];
        if ident != "self" {
            segments.push(ident);
        }
        match rest.strip_prefix("::") {
            Some(more) => rest = more,
            None => break,
        }
    }
    vec![segments]
}

/// The modules `code` (in module `me`) refers to: the longest known prefix of each path it
/// writes through `crate::` or `super::`.
fn references(code: &str, me: &ModPath, known: &BTreeSet<ModPath>) -> BTreeSet<ModPath> {
    let mut out = BTreeSet::new();
    for (at, _) in code.match_indices("::") {
        let head_start = code[..at].rfind(|c: char| !is_ident(c)).map_or(0, |i| i + 1);
        let head = &code[head_start..at];
        if head != "crate" && head != "super" {
            continue;
        }
        // Only the first segment of a path: `super::super::x` is read from its first `super`.
        if code[..head_start].ends_with("::") {
            continue;
        }
        for path in paths_at(&code[head_start..]) {
            let mut segments = path.into_iter().peekable();
            let mut base: ModPath = Vec::new();
            match segments.next().as_deref() {
                Some("crate") => {}
                Some("super") => {
                    // The parent module, whether `me` is a file or a folder's mod.rs.
                    base = me.clone();
                    base.pop();
                    while segments.peek().map(String::as_str) == Some("super") {
                        segments.next();
                        base.pop();
                    }
                }
                _ => continue,
            }
            let full: ModPath = base.into_iter().chain(segments).collect();
            if let Some(target) = (0..=full.len())
                .rev()
                .map(|n| full[..n].to_vec())
                .find(|p| known.contains(p))
            {
                out.insert(target);
            }
        }
    }
    out
}

/// For each module folder (by path), its children and the siblings each refers to: a reference
/// from `a::x::..` to `a::y::..` is an edge `x -> y` among `a`'s children.
fn sibling_graphs(src: &Path) -> BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>> {
    let found = modules(src);
    let known: BTreeSet<ModPath> = found.keys().cloned().collect();
    let mut graphs: BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (me, code) in &found {
        for target in references(code, me, &known) {
            let common = me.iter().zip(&target).take_while(|(a, b)| a == b).count();
            if common == me.len() || common == target.len() {
                continue; // the same module, or an ancestor or descendant
            }
            graphs
                .entry(me[..common].to_vec())
                .or_default()
                .entry(me[common].clone())
                .or_default()
                .insert(target[common].clone());
        }
    }
    graphs
}

/// A cycle in `graph` as `a -> b -> a`, if there is one.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<String> {
    fn visit(graph: &BTreeMap<String, BTreeSet<String>>, path: &mut Vec<String>) -> Option<String> {
        let last = path.last().unwrap().clone();
        for next in graph.get(&last).into_iter().flatten() {
            if let Some(at) = path.iter().position(|m| m == next) {
                return Some(format!("{} -> {next}", path[at..].join(" -> ")));
            }
            path.push(next.clone());
            let found = visit(graph, path);
            path.pop();
            if found.is_some() {
                return found;
            }
        }
        None
    }
    graph.keys().find_map(|m| visit(graph, &mut vec![m.clone()]))
}

/// Every cycle found under `src`, as "crate::folder: a -> b -> a".
fn cycles(src: &Path) -> Vec<String> {
    sibling_graphs(src)
        .iter()
        .filter_map(|(parent, graph)| {
            let name = ["crate".to_string()]
                .iter()
                .chain(parent)
                .cloned()
                .collect::<Vec<_>>()
                .join("::");
            cycle(graph).map(|c| format!("{name}: {c}"))
        })
        .collect()
}

#[test]
fn modules_have_no_import_cycles() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let top: BTreeSet<String> = modules(&root.join("src"))
        .keys()
        .filter_map(|m| m.first().cloned())
        .collect();
    assert!(top.len() > 10, "found only {top:?}");
    for src in ["src", "kernels/src", "models/src"] {
        let found = cycles(&root.join(src));
        assert!(found.is_empty(), "import cycles in {src}: {found:#?}");
    }
}

/// The reader sees cycles through `crate::` and `super::` paths, brace groups and nested
/// folders (the old reader saw only top-level `crate::x` and missed two).
#[test]
fn a_planted_cycle_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    let write = |path: &str, text: &str| {
        let path = src.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write("lib.rs", "pub mod a;\npub mod data;\npub mod z;\n");
    write("a.rs", "pub fn f() { crate::z::g() }\n");
    write(
        "z.rs",
        "pub fn g() {}\n#[cfg(test)]\nmod tests { use crate::a; }\n",
    );
    write(
        "data/mod.rs",
        "pub mod folder;\npub mod spec;\npub use spec::Options;\n",
    );
    write("data/folder.rs", "use super::{spec::{Options, check}, Data};\n");
    write(
        "data/spec.rs",
        "pub struct Options;\n// crate::data::folder in a comment\n",
    );
    assert_eq!(cycles(src), Vec::<String>::new());
    write(
        "data/spec.rs",
        "pub struct Options;\nfn load() { super::folder::load() }\n",
    );
    assert_eq!(cycles(src), ["crate::data: folder -> spec -> folder"]);
    write("data/spec.rs", "pub struct Options;\n");
    write("z.rs", "pub fn g() { crate::a::f() }\n");
    assert_eq!(cycles(src), ["crate: a -> z -> a"]);
}
