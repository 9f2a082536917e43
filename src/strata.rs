//! The crate's strata, held against the code: no module imports one of a stratum above
//! its own or a module beside it, and no two files of a folder import each other in a
//! circle (a folder's `mod.rs` is its face: declaring and re-exporting its files is not
//! an import). The strata are the crate doc's map (`lib.rs`, "## Strata").

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module, by stratum, from the ground up.
const STRATA: [&[&str]; 12] = [
    &[
        "backoff",
        "headers",
        "parts",
        "readable",
        "listener",
        "when",
        "rate",
        "private_cluster",
    ],
    &["task", "pace"],
    &["config", "finals"],
    &["kafka", "resilience"],
    &["store"],
    &["telemetry"],
    &["handlers", "replay", "output"],
    &["ingest", "worker", "operations", "testing"],
    &["admin"],
    &["fleet"],
    &["demo", "bench"],
    &["cli"],
];

fn stratum(module: &str) -> Option<usize> {
    STRATA.iter().position(|s| s.contains(&module))
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src is readable") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// The code of `text` without its comments (line comments and doc lines).
fn code(text: &str) -> String {
    text.lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The names that follow `prefix` in `code`: `prefix::name` or each name of
/// `prefix::{a, b::c, ...}` (first segments only).
fn names_after(code: &str, prefix: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    for (at, _) in code.match_indices(prefix) {
        let before = code[..at].chars().last();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let rest = &code[at + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inner = &group[..group.find('}').unwrap_or(group.len())];
            names.extend(
                inner
                    .split(',')
                    .map(|item| ident(item.trim()))
                    .filter(|n| !n.is_empty()),
            );
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                names.insert(name);
            }
        }
    }
    names
}

/// The top-level module a file of `src/` belongs to (`None`: `lib.rs`, `main.rs`).
fn module_of(relative: &Path) -> Option<String> {
    let first = relative.components().next()?.as_os_str().to_str()?;
    match first {
        "lib.rs" | "main.rs" | "strata.rs" => None,
        name => Some(name.trim_end_matches(".rs").to_owned()),
    }
}

#[test]
fn no_module_imports_a_module_of_its_own_stratum_or_above() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut wrong = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&src).expect("under src");
        let Some(module) = module_of(relative) else {
            continue;
        };
        let own = stratum(&module)
            .unwrap_or_else(|| panic!("module {module} is on no stratum: add it to STRATA"));
        let text = code(&std::fs::read_to_string(file).expect("readable"));
        for used in names_after(&text, "crate::") {
            if used == module || used.chars().next().is_some_and(|c| c.is_uppercase()) {
                continue;
            }
            match stratum(&used) {
                Some(theirs) if theirs < own => {}
                Some(theirs) => wrong.push(format!(
                    "{} (stratum {}) imports {used} (stratum {})",
                    relative.display(),
                    own + 1,
                    theirs + 1
                )),
                None => {}
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports that run up or sideways:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_two_files_of_a_folder_import_each_other_in_a_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    // Each file (not a mod.rs) and the files of its own folder it imports, by `super::`
    // or by the folder's path from the crate.
    let mut edges: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for file in &files {
        if file.file_name().is_some_and(|n| n == "mod.rs") {
            continue;
        }
        let dir = file.parent().expect("a folder");
        if dir == src {
            continue;
        }
        let folder = dir.strip_prefix(&src).expect("under src");
        let path = folder
            .components()
            .map(|c| c.as_os_str().to_str().expect("utf-8"))
            .collect::<Vec<_>>()
            .join("::");
        let text = code(&std::fs::read_to_string(file).expect("readable"));
        let mut used = names_after(&text, "super::");
        used.extend(names_after(&text, &format!("crate::{path}::")));
        let sibling = |name: &String| {
            [
                dir.join(format!("{name}.rs")),
                dir.join(name).join("mod.rs"),
            ]
            .into_iter()
            .find(|p| p.exists() && p != file)
        };
        edges.insert(file.clone(), used.iter().filter_map(sibling).collect());
    }
    // A circle is a file that reaches itself.
    let mut circles = Vec::new();
    for start in edges.keys() {
        let mut seen = BTreeSet::new();
        let mut todo: Vec<&PathBuf> = edges[start].iter().collect();
        while let Some(next) = todo.pop() {
            if next == start {
                circles.push(
                    start
                        .strip_prefix(&src)
                        .expect("under src")
                        .display()
                        .to_string(),
                );
                break;
            }
            if seen.insert(next.clone()) {
                todo.extend(edges.get(next).into_iter().flatten());
            }
        }
    }
    assert!(
        circles.is_empty(),
        "files in a circle of imports:\n{}",
        circles.join("\n")
    );
}
