//! The layering rule, checked: every module of the crate has a layer, and a file may name
//! (`crate::x`, `super::…::x` reaching the root, or inside `crate::{…}`) only modules of
//! layers below its own. `ARCHITECTURE.md` explains the layers; this is what keeps it true.

use std::{collections::BTreeSet, path::Path};

/// The crate's top-level modules, lowest layer first. Modules on one line share a layer and
/// may not name each other.
const LAYERS: &[&[&str]] = &[
    &["domain", "rng"],
    &["db"],
    &["telemetry", "scheduler", "metering"],
    &["simulate", "billing", "backends", "config", "idp"],
    &["control"],
    &["auth"],
    &["state"],
    &["ops", "demo"],
    &["http"],
    &["api", "web", "client"],
    &["serve"],
    // Benchmarks run the whole service.
    &["bench"],
];

/// Modules that name no other module of the crate at all, whatever their layer: the client
/// talks to the server only over HTTP, so that it could move to a binary of its own.
const STANDALONE: &[&str] = &["client"];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// The module path of a source file relative to `src/`: `api/jobs.rs` → `[api, jobs]`,
/// `api/mod.rs` → `[api]`.
fn module_path(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if let Some(last) = parts.pop() {
        let stem = last.trim_end_matches(".rs");
        if stem != "mod" {
            parts.push(stem.to_owned());
        }
    }
    parts
}

/// Removes `//` comments and the contents of string literals, so that neither is read as a
/// path.
fn code_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let mut in_string = false;
    while let Some(c) = chars.next() {
        if in_string {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    in_string = false;
                    out.push('"');
                }
                _ => {}
            }
        } else if c == '"' {
            in_string = true;
            out.push('"');
        } else if c == '\'' {
            // A character literal (`'"'`, `'\''`) is skipped whole; a lifetime is kept.
            let ahead: Vec<char> = chars.clone().take(3).collect();
            match ahead.as_slice() {
                ['\\', _, ..] => {
                    for c in chars.by_ref() {
                        if c == '\'' {
                            break;
                        }
                    }
                }
                [_, '\'', ..] => {
                    chars.next();
                    chars.next();
                }
                _ => out.push(c),
            }
        } else if c == '/' && chars.peek() == Some(&'/') {
            for c in chars.by_ref() {
                if c == '\n' {
                    out.push('\n');
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn identifier_at(text: &str) -> Option<&str> {
    let end = text.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(text.len());
    (end > 0).then(|| &text[..end])
}

/// The top-level modules a file at `path` (its module path) names.
fn named_modules(path: &[String], text: &str) -> BTreeSet<String> {
    let code = code_only(text);
    let mut named = BTreeSet::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < code.len() {
        let rest = &code[i..];
        let preceded_by_ident = i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
        // `crate::` or a chain of `super::` that climbs to the crate root.
        let root_rest = if preceded_by_ident {
            None
        } else if let Some(after) = rest.strip_prefix("crate::") {
            Some(after)
        } else if rest.starts_with("super::") {
            let mut after = rest;
            let mut depth = path.len();
            while let Some(next) = after.strip_prefix("super::") {
                after = next;
                depth = depth.saturating_sub(1);
            }
            (depth == 0).then_some(after)
        } else {
            None
        };
        if let Some(after) = root_rest {
            if let Some(group) = after.strip_prefix('{') {
                // `crate::{a, b::c, d::{e, f}}`: the first name of each top-level entry.
                let mut depth = 0usize;
                let mut entry_start = true;
                for (k, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => entry_start = true,
                        c if c.is_whitespace() => {}
                        _ if entry_start && depth == 0 => {
                            if let Some(name) = identifier_at(&group[k..]) {
                                named.insert(name.to_owned());
                            }
                            entry_start = false;
                        }
                        _ => {}
                    }
                }
            } else if let Some(name) = identifier_at(after) {
                named.insert(name.to_owned());
            }
        }
        i += rest.chars().next().map_or(1, char::len_utf8);
    }
    named.remove("self");
    named
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("reading the source tree") {
        let path = entry.expect("reading a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every upward or sideways import in the crate, as `file: names module (layer)`.
fn violations() -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut found = Vec::new();
    for file in files {
        let relative = file.strip_prefix(&src).expect("a file under src");
        let path = module_path(relative);
        let Some(top) = path.first() else { continue };
        // The binary and the crate root sit above every layer.
        if matches!(top.as_str(), "main" | "lib" | "layers") {
            continue;
        }
        let Some(own) = layer_of(top) else {
            found.push(format!("{}: module `{top}` has no layer in LAYERS", relative.display()));
            continue;
        };
        let text = std::fs::read_to_string(&file).expect("reading a source file");
        for named in named_modules(&path, &text) {
            if &named == top {
                continue;
            }
            match layer_of(&named) {
                Some(layer) if STANDALONE.contains(&top.as_str()) => found.push(format!(
                    "{}: `{top}` names `{named}` (layer {layer}), but it talks to the server only over HTTP",
                    relative.display()
                )),
                Some(layer) if layer < own => {}
                Some(layer) => found.push(format!(
                    "{}: `{top}` (layer {own}) names `{named}` (layer {layer}), which is not below it",
                    relative.display()
                )),
                // A name from the root that is not a module (a macro, a re-export) is no edge.
                None => {}
            }
        }
    }
    found
}

#[test]
fn no_module_names_a_module_of_its_own_layer_or_above() {
    let found = violations();
    assert!(found.is_empty(), "dependencies must point down (see ARCHITECTURE.md):\n{}", found.join("\n"));
}

#[test]
fn every_module_the_crate_declares_has_a_layer() {
    let lib = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).expect("lib.rs");
    for line in lib.lines() {
        if let Some(name) = line.strip_prefix("pub mod ").and_then(|l| l.strip_suffix(';')) {
            assert!(layer_of(name).is_some(), "module `{name}` is declared in lib.rs but has no layer in LAYERS");
        }
    }
}

#[test]
fn the_scanner_sees_every_way_a_file_can_name_a_module() {
    let file = |p: &[&str]| p.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let text = r#"
        use crate::{api::{self, error::ApiError}, db, state::AppState};
        use super::super::web::pages;
        fn f() { crate::serve::app(); let s = "crate::bench"; } // crate::demo
        use super::extract;
    "#;
    let named = named_modules(&file(&["auth", "policy"]), text);
    let expected: BTreeSet<String> = ["api", "db", "state", "serve", "web"].iter().map(|s| (*s).to_owned()).collect();
    assert_eq!(named, expected);
    // From `auth/mod.rs`, one `super::` already reaches the root.
    assert!(named_modules(&file(&["auth"]), "use super::api::ROUTES;").contains("api"));
}
