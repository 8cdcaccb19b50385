//! The agent's modules form layers: each `crate::` path in a module names a
//! module listed before it in the "Layers, lowest first" paragraph of lib.rs.

use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The modules in the order lib.rs lists them.
fn layers(lib: &str) -> Vec<String> {
    let mut paragraph = String::new();
    let mut inside = false;
    for line in lib.lines() {
        let Some(text) = line.strip_prefix("//!") else {
            break;
        };
        if text.contains("Layers, lowest first:") {
            inside = true;
        } else if inside && text.trim().is_empty() {
            break;
        }
        if inside {
            paragraph.push_str(text);
        }
    }
    // The list ends at the sentence's full stop.
    let list = paragraph.split("lowest first:").nth(1).unwrap_or_default();
    let list = list.split('.').next().unwrap_or_default();
    list.split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

/// The module's source files: `name.rs` and everything under `name/`.
fn files(name: &str) -> Vec<PathBuf> {
    let mut out = vec![src().join(format!("{name}.rs"))];
    let mut dirs = vec![src().join(name)];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.retain(|p| p.exists());
    out
}

/// The top-level modules that `crate::` paths in `code` name (comments skipped).
fn crate_paths(code: &str) -> Vec<String> {
    let code: String = code
        .lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n");
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut used = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level items of the group, each up to its first `::`, `,` or `}`.
            let mut depth = 0usize;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => used.push(ident(&std::mem::take(&mut item))),
                    c if depth == 0 => item.push(c),
                    _ => {}
                }
            }
            used.push(ident(&item));
        } else {
            used.push(ident(rest));
        }
    }
    used.retain(|m| !m.is_empty());
    used
}

#[test]
fn no_module_uses_one_above_it() {
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("lib.rs");
    let order = layers(&lib);
    let mut declared: Vec<String> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod "))
        .map(|l| l.trim_end_matches(';').to_owned())
        .collect();
    let mut listed = order.clone();
    declared.sort();
    listed.sort();
    assert_eq!(listed, declared, "lib.rs lists every module once in its layers");
    let mut backward = Vec::new();
    for (level, module) in order.iter().enumerate() {
        for file in files(module) {
            let code = std::fs::read_to_string(&file).expect("source");
            for used in crate_paths(&code) {
                match order.iter().position(|m| *m == used) {
                    Some(l) if l > level => backward.push(format!("{} uses {used}", file.display())),
                    _ => {}
                }
            }
        }
    }
    assert!(backward.is_empty(), "backward arrows:\n{}", backward.join("\n"));
}
