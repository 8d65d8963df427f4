//! The host's layers, checked: a module may use only modules on lower layers.
//!
//! The README's "Repository layout" shows the same table. A new top-level
//! module must be placed in it, and an import that points up a layer (the
//! start of a cycle) fails `cargo test` with the file that has it.

/// Bottom first. Modules on one layer do not use each other.
const LAYERS: &[&[&str]] = &[
    // What everything shares: settings, a record, the WIT bindings, counters.
    &[
        "config",
        "record",
        "bindings",
        "metrics",
        "telemetry",
        "failpoints",
        "shutdown",
    ],
    &["event_id", "sandbox"],
    // Transactions and the host's tables; the walls go up here.
    &["db"],
    // The seam between the pipeline and what runs in it.
    &["handler", "stats", "retention"],
    &["capabilities", "pipeline"],
    &["wasm", "kafka", "replay"],
    // Assembly: the handlers a host runs, its API, the process.
    &["registry"],
    &["admin"],
    &["host"],
    &["cli"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// The top-level modules `source` (a file of module `own`) names, outside
/// comments and its test module.
fn uses(own: &str, source: &str, top_level_file: bool) -> Vec<String> {
    let code = source.split("#[cfg(test)]\nmod tests").next().unwrap_or_default();
    let mut found = Vec::new();
    for line in code.lines() {
        let line = line.split("//").next().unwrap_or_default();
        let mut prefixes = vec!["crate::"];
        if top_level_file {
            prefixes.push("super::");
        }
        for prefix in prefixes {
            for (at, _) in line.match_indices(prefix) {
                let rest = &line[at + prefix.len()..];
                let names: Vec<&str> = match rest.strip_prefix('{') {
                    // `use crate::{a, b::c}`: the first segment of each path.
                    Some(list) => list
                        .split('}')
                        .next()
                        .unwrap_or_default()
                        .split(',')
                        .map(|path| path.trim().split("::").next().unwrap_or_default())
                        .collect(),
                    None => vec![rest],
                };
                for name in names {
                    let name: String = name
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() && name != own {
                        found.push(name);
                    }
                }
            }
        }
    }
    found
}

#[test]
fn every_import_points_down_a_layer() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut wrong = Vec::new();
    let mut files = vec![src.clone()];
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            continue;
        }
        let rel = path.strip_prefix(&src).unwrap().to_string_lossy().into_owned();
        if !rel.ends_with(".rs") || ["lib.rs", "main.rs", "layers.rs"].contains(&rel.as_str()) {
            continue;
        }
        let own = rel.split('/').next().unwrap().trim_end_matches(".rs");
        let Some(own_layer) = layer_of(own) else {
            wrong.push(format!(
                "{rel}: module {own} is on no layer: add it to LAYERS (and the README)"
            ));
            continue;
        };
        let source = std::fs::read_to_string(&path).unwrap();
        for used in uses(own, &source, !rel.contains('/')) {
            match layer_of(&used) {
                Some(layer) if layer < own_layer => {}
                Some(_) => wrong.push(format!("{rel}: {own} uses {used}, which is not on a lower layer")),
                // Not a top-level module (a local item reached through `super::`).
                None => {}
            }
        }
    }
    wrong.sort();
    wrong.dedup();
    assert!(
        wrong.is_empty(),
        "imports against the layers:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_check_sees_imports() {
    assert_eq!(
        uses(
            "db",
            "use crate::{config::Backend, sandbox};\nuse crate::handler::X;",
            false
        ),
        ["config", "sandbox", "handler"]
    );
    assert!(uses("db", "// crate::cli\nlet x = 1;", false).is_empty());
    assert_eq!(uses("host", "use super::admin::Listener;", true), ["admin"]);
}
