//! The host's layers, checked: a module may use only modules on lower layers.
//!
//! docs/architecture.md ("Repository layout") shows the same table. A new top-level
//! module must be placed in it, and an import that points up a layer (the
//! start of a cycle) fails `cargo test` with the file that has it.

/// Bottom first. Modules on one layer do not use each other.
const LAYERS: &[&[&str]] = &[
    // What everything shares: settings, a record, one JSON field, the WIT bindings, counters.
    &[
        "config",
        "record",
        "json_field",
        "bindings",
        "metrics",
        "telemetry",
        "failpoints",
        "shutdown",
    ],
    &["event_id", "business_key", "sandbox"],
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

/// `source` without comments, string literals and `#[cfg(test)]` modules:
/// only the code that ships.
fn shipped_code(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut chars = source.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let mut last = ' ';
                for c in chars.by_ref() {
                    if last == '*' && c == '/' {
                        break;
                    }
                    last = c;
                }
            }
            '"' => {
                let mut escaped = false;
                for c in chars.by_ref() {
                    if !escaped && c == '"' {
                        break;
                    }
                    escaped = !escaped && c == '\\';
                }
                out.push_str("\"\"");
            }
            // A raw string: r"..", r#".."#, with as many '#' to close it.
            'r' if !out.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
                && matches!(chars.peek(), Some('#' | '"')) =>
            {
                let mut hashes = 0;
                while chars.next_if_eq(&'#').is_some() {
                    hashes += 1;
                }
                if chars.next_if_eq(&'"').is_none() {
                    // `r#ident`: a raw identifier, not a string.
                    out.push('r');
                    out.push_str(&"#".repeat(hashes));
                    continue;
                }
                let close = format!("\"{}", "#".repeat(hashes));
                let mut text = String::new();
                for c in chars.by_ref() {
                    text.push(c);
                    if text.ends_with(&close) {
                        break;
                    }
                }
                out.push_str("\"\"");
            }
            // A char literal ('"', '\\''); a lifetime ('a) stays.
            '\'' => {
                let mut ahead = chars.clone();
                match (ahead.next(), ahead.next()) {
                    (Some('\\'), _) => {
                        chars.next();
                        chars.next();
                        for c in chars.by_ref() {
                            if c == '\'' {
                                break;
                            }
                        }
                    }
                    (Some(_), Some('\'')) => {
                        chars.next();
                        chars.next();
                    }
                    _ => out.push(c),
                }
            }
            _ => out.push(c),
        }
    }
    // Drop each `#[cfg(test)] mod name { ... }` by matching its braces.
    while let Some(at) = out.find("#[cfg(test)]") {
        let rest = &out[at..];
        let end = match (rest.find('{'), rest.find(';')) {
            (Some(open), semi) if semi.is_none_or(|semi| open < semi) => {
                let mut depth = 0;
                let mut end = rest.len();
                for (i, c) in rest[open..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = open + i + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            (_, Some(semi)) => semi + 1,
            _ => rest.len(),
        };
        out.replace_range(at..at + end, "");
    }
    out
}

/// The first segment of each path in a `{...}` group, at its top level.
fn group_heads(group: &str) -> Vec<&str> {
    let mut heads = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                heads.push(&group[start..i]);
                return heads.into_iter().map(first_segment).collect();
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                heads.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    heads.into_iter().map(first_segment).collect()
}

fn first_segment(path: &str) -> &str {
    let path = path.trim_start();
    let end = path
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(path.len());
    &path[..end]
}

/// The top-level modules the shipped code of file `rel` (e.g. `db/tx.rs`)
/// names through `crate::` or a `super::` chain that reaches the crate root.
fn uses(rel: &str, source: &str) -> Vec<String> {
    let code = shipped_code(source);
    let own = rel.split('/').next().unwrap_or_default().trim_end_matches(".rs");
    // How many `super::` lead from this file's module to the crate root.
    let depth = rel.trim_end_matches("/mod.rs").split('/').count();
    let mut roots = vec!["crate::".to_owned()];
    roots.push("super::".repeat(depth));
    let mut found = Vec::new();
    for root in &roots {
        for (at, _) in code.match_indices(root.as_str()) {
            // `super::super::x` seen from a deeper file is not a path from the root.
            if root.starts_with("super") && code[..at].ends_with("super::") {
                continue;
            }
            let rest = &code[at + root.len()..];
            let names = match rest.strip_prefix('{') {
                Some(group) => group_heads(group),
                None => vec![first_segment(rest)],
            };
            for name in names {
                if !name.is_empty() && name != own && name != "self" {
                    found.push(name.to_owned());
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
        let test_file = rel.ends_with("/tests.rs") || rel.contains("/tests/");
        if !rel.ends_with(".rs") || test_file || ["lib.rs", "main.rs", "layers.rs"].contains(&rel.as_str()) {
            continue;
        }
        let own = rel.split('/').next().unwrap().trim_end_matches(".rs");
        let Some(own_layer) = layer_of(own) else {
            wrong.push(format!(
                "{rel}: module {own} is on no layer: add it to LAYERS (and docs/architecture.md)"
            ));
            continue;
        };
        let source = std::fs::read_to_string(&path).unwrap();
        for used in uses(&rel, &source) {
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
    let code = "use crate::{\n    config::Backend,\n    sandbox::{a, b},\n    handler,\n};\nlet url = \"postgres://x\"; crate::stats::X;";
    assert_eq!(uses("db/mod.rs", code), ["config", "sandbox", "handler", "stats"]);
    assert!(
        uses(
            "db/tx.rs",
            "// crate::cli\n/* crate::admin */ let x = \"crate::host\";"
        )
        .is_empty()
    );
    assert_eq!(uses("host.rs", "use super::admin::Listener;"), ["admin"]);
    assert_eq!(uses("db/mod.rs", "use super::cli;"), ["cli"]);
    assert_eq!(
        uses(
            "db/walls/state.rs",
            "use super::super::Tx; use super::super::super::cli;"
        ),
        ["cli"]
    );
    assert!(uses("db/tx.rs", "use super::walls;").is_empty());
    assert!(uses("db/mod.rs", "#[cfg(test)]\nmod tests {\n    use crate::cli;\n}\n").is_empty());
    assert_eq!(
        uses(
            "db/mod.rs",
            "let j = r#\"{\"a\": \"crate::admin\"}\"#; let q = '\"'; let e = '\\''; fn f<'a>() { crate::cli::x() }"
        ),
        ["cli"]
    );
}
