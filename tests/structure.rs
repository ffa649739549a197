//! The library's modules form a hierarchy: no two of them use each other, directly or through
//! others, so each can be read knowing only the ones below it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level module name → the top-level modules its non-test code names as `crate::x`.
fn uses() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let relative = path.strip_prefix(&src).unwrap();
            let top = relative
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy();
            let module = top.trim_end_matches(".rs").to_string();
            if module == "main" || module == "lib" {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap();
            let used = graph.entry(module.clone()).or_default();
            for (i, _) in code.match_indices("crate::") {
                let name: String = code[i + 7..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if name != module && !name.is_empty() {
                    used.insert(name);
                }
            }
        }
    }
    graph
}

#[test]
fn modules_have_no_import_cycles() {
    let graph = uses();
    assert!(graph.len() > 10, "found only {:?}", graph.keys());
    // Depth-first search from every module; a path that returns to a module on it is a cycle.
    fn visit(graph: &BTreeMap<String, BTreeSet<String>>, path: &mut Vec<String>) {
        let last = path.last().unwrap().clone();
        for next in graph.get(&last).into_iter().flatten() {
            if let Some(at) = path.iter().position(|m| m == next) {
                panic!("import cycle: {} -> {next}", path[at..].join(" -> "));
            }
            path.push(next.clone());
            visit(graph, path);
            path.pop();
        }
    }
    for module in graph.keys() {
        visit(&graph, &mut vec![module.clone()]);
    }
}
