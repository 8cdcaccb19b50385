//! The house rules of the product crates, checked on their sources: each
//! crate's modules import only from modules below them in the layers the
//! README's layout table lists, no source file passes 700 lines, no
//! function 120 (but the few named below, which may only shrink), and the
//! client without its default features links no burn.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The product crates: folder, and the crate name in the README's table.
const CRATES: [&str; 6] = [
    "flight-schemas",
    "agent/ops",
    "agent/rendezvous",
    "agent",
    "client/spark",
    "client",
];
/// The most lines a source file of a product crate may have.
const MAX_LINES: usize = 700;
/// The most lines a function of a product crate may have.
const MAX_FN_LINES: usize = 120;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_owned()
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("read {}: {e}", d.display())) {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The layers of `folder`'s crate, lowest first, from the README's layout
/// table: the row's last cell, layers separated by `·`, each the backticked
/// names of its rooms (several joined by `/` form one layer).
fn readme_layers(readme: &str, folder: &str) -> Vec<Vec<String>> {
    let row = readme
        .lines()
        .find(|l| l.starts_with(&format!("| `{folder}/`")))
        .unwrap_or_else(|| panic!("the README's layout table has no row for `{folder}/`"));
    let last = row.trim_end_matches('|').rsplit('|').next().unwrap_or_default();
    last.split('·')
        .map(|layer| {
            layer
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter(|layer| !layer.is_empty())
        .collect()
}

/// The top-level module a source file belongs to (`None` for the crate root,
/// binaries and test modules, which may use anything).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).expect("file under src");
    let first = rel
        .components()
        .next()?
        .as_os_str()
        .to_string_lossy()
        .into_owned();
    match first.as_str() {
        // The crate root and the binaries (`src/bin/<name>/…`) may use anything.
        "lib.rs" | "main.rs" | "bin" => None,
        // A room's tests (`tests.rs`) may check it against the rooms above.
        _ if rel.file_name().is_some_and(|f| f == "tests.rs") => None,
        _ if rel.components().count() == 1 => Some(first.trim_end_matches(".rs").to_owned()),
        _ => Some(first),
    }
}

/// The top-level modules `text` refers to as `crate::<module>`, outside comments.
fn crate_refs(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or_default();
        for (i, _) in code.match_indices("crate::") {
            let before = code[..i].chars().last();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue; // `kindling_crate::` and the like
            }
            let name: String = code[i + 7..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() && name.chars().next().is_some_and(|c| c.is_ascii_lowercase()) {
                out.insert(name);
            }
        }
    }
    out
}

#[test]
fn modules_import_only_from_the_layers_below_them() {
    let root = repo_root();
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let mut wrong = Vec::new();
    for folder in CRATES {
        let layers = readme_layers(&readme, folder);
        assert!(!layers.is_empty(), "no layers listed for `{folder}/`");
        let rank = |m: &str| layers.iter().position(|l| l.iter().any(|r| r == m));
        let src = root.join(folder).join("src");
        for file in rust_files(&src) {
            let Some(module) = module_of(&src, &file) else {
                continue;
            };
            let Some(own) = rank(&module) else {
                wrong.push(format!(
                    "{folder}: module `{module}` is not in the README's layers {layers:?}"
                ));
                continue;
            };
            let text = std::fs::read_to_string(&file).expect("source");
            for used in crate_refs(&text) {
                match rank(&used) {
                    Some(r) if r <= own => {}
                    Some(_) => wrong.push(format!(
                        "{}: `{module}` uses `crate::{used}`, a layer above it",
                        file.strip_prefix(&root).unwrap_or(&file).display()
                    )),
                    None => {} // an item of the crate root (a re-export), not a module
                }
            }
        }
    }
    assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
}

#[test]
fn no_product_source_file_passes_700_lines() {
    let root = repo_root();
    let long: Vec<String> = CRATES
        .iter()
        .flat_map(|folder| rust_files(&root.join(folder).join("src")))
        .filter_map(|f| {
            let lines = std::fs::read_to_string(&f).expect("source").lines().count();
            (lines > MAX_LINES).then(|| format!("{} ({lines} lines)", f.display()))
        })
        .collect();
    assert!(long.is_empty(), "files over {MAX_LINES} lines: {long:?}");
}

/// Each function of `text` with a body: its name and lines, from its `fn`
/// line to the closing brace at the `fn`'s indentation (the house's
/// rustfmt layout).
fn function_lengths(text: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let code = line.trim_start();
        let indent = line.len() - code.len();
        let after = [
            "pub ",
            "pub(crate) ",
            "pub(super) ",
            "async ",
            "const ",
            "unsafe ",
        ]
        .iter()
        .fold(code, |c, p| c.strip_prefix(p).unwrap_or(c));
        let Some(rest) = after.strip_prefix("fn ") else {
            continue;
        };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        // The signature ends at a line ending in `{` (a body) or `;` (none).
        let Some(open) = (i..lines.len()).find(|&j| {
            let l = lines[j].trim_end();
            l.ends_with('{') || l.ends_with(';')
        }) else {
            continue;
        };
        if lines[open].trim_end().ends_with(';') {
            continue;
        }
        let close = (open + 1..lines.len()).find(|&j| {
            let l = lines[j];
            l.len() > indent && l[..indent].trim().is_empty() && l[indent..].starts_with('}')
        });
        if let Some(close) = close {
            out.push((name, close - i + 1));
        }
    }
    out
}

#[test]
fn no_product_function_passes_120_lines() {
    let root = repo_root();
    let mut wrong = Vec::new();
    for file in CRATES
        .iter()
        .flat_map(|folder| rust_files(&root.join(folder).join("src")))
    {
        let rel = file
            .strip_prefix(&root)
            .expect("under the root")
            .to_string_lossy()
            .into_owned();
        // Unit tests beside the code are not product code.
        if rel.ends_with("/tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("source");
        for (name, n) in function_lengths(&text) {
            if n > MAX_FN_LINES {
                wrong.push(format!("{rel}: fn {name} has {n} lines (at most {MAX_FN_LINES})"));
            }
        }
    }
    assert!(wrong.is_empty(), "functions too long:\n{}", wrong.join("\n"));
    // The scanner sees functions at their length, nested ones too, and
    // skips declarations without a body.
    let body = "        let x = 1;\n".repeat(MAX_FN_LINES);
    let sample = format!(
        "impl A {{\n    pub(crate) async fn long(\n        a: u8,\n    ) -> u8 {{\n{body}    }}\n\n    fn decl();\n}}\nfn short() {{}}\n"
    );
    assert_eq!(
        function_lengths(&sample),
        [("long".to_owned(), MAX_FN_LINES + 4)],
        "the function scanner"
    );
}

/// `cargo tree` of `package`'s normal dependencies, one crate per line.
fn dependency_tree(package: &str, features: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO"))
        .current_dir(repo_root())
        .args([
            "tree",
            "--offline",
            "-e",
            "normal",
            "-p",
            package,
            "--prefix",
            "none",
        ])
        .args(features)
        .output()
        .expect("cargo tree");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn links_burn(tree: &str) -> bool {
    tree.lines().any(|l| l.starts_with("burn"))
}

#[test]
fn the_rendezvous_the_spark_client_and_the_client_without_default_features_link_no_burn() {
    for (package, features) in [
        ("kindling-ops", &[][..]),
        ("kindling-rendezvous", &[][..]),
        ("kindling-spark", &[][..]),
        ("kindling", &["--no-default-features"][..]),
    ] {
        assert!(
            !links_burn(&dependency_tree(package, features)),
            "{package} {features:?} links burn"
        );
    }
    // The check itself sees burn where it is: with the client's default `local` feature.
    assert!(
        links_burn(&dependency_tree("kindling", &[])),
        "kindling with `local` should link burn"
    );
}
