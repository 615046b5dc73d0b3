//! The crate table of docs/ARCHITECTURE.md is the law of dependencies: this test reads it
//! and `cargo metadata`, and fails when a workspace crate depends on a workspace crate the
//! table does not allow, when a crate is missing from the table (or the table names one
//! that is not in the workspace), or when a row's path is wrong.
//!
//! Normal and build dependencies must be listed in the crate's row. Dev-dependencies may
//! also name the dev-only crates (rows marked `(dev-only)`): test support never ships.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

/// One row of the table: the crate's path and the ferry crates it may depend on
/// (`None`: any workspace crate, as `every ferry crate` says).
#[derive(Debug)]
struct Row {
    path: String,
    allowed: Option<BTreeSet<String>>,
    dev_only: bool,
}

fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
}

/// The rows of the table under "## What each crate may depend on".
fn table(doc: &str) -> BTreeMap<String, Row> {
    let section = doc
        .split("\n## ")
        .find(|s| s.starts_with("What each crate may depend on"))
        .expect("docs/ARCHITECTURE.md has a section 'What each crate may depend on'");
    let mut rows = BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        if cells.len() < 3 || !cells[0].starts_with("ferry") {
            continue; // the header and its rule
        }
        let (name, dev_only) = match cells[0].split_once(' ') {
            Some((name, note)) => (name, note.contains("dev-only")),
            None => (cells[0], false),
        };
        let allowed = match cells[2] {
            "none" => Some(BTreeSet::new()),
            "every ferry crate" => None,
            list => Some(list.split(',').map(|c| c.trim().to_string()).collect()),
        };
        let row = Row {
            path: cells[1].to_string(),
            allowed,
            dev_only,
        };
        assert!(
            rows.insert(name.to_string(), row).is_none(),
            "{name} has two rows in the table"
        );
    }
    rows
}

/// Each workspace package: its manifest directory (relative to the root) and its
/// workspace dependencies with their kind (`normal`, `build`, `dev`).
fn workspace() -> BTreeMap<String, (String, Vec<(String, String)>)> {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(workspace_root())
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata is JSON");
    let root = workspace_root().canonicalize().expect("the root resolves");
    let members: BTreeSet<&str> = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    let mut packages = BTreeMap::new();
    for p in meta["packages"].as_array().expect("packages") {
        let name = p["name"].as_str().expect("a name").to_string();
        let manifest = Path::new(p["manifest_path"].as_str().expect("a manifest path"));
        let dir = manifest
            .parent()
            .and_then(|d| d.strip_prefix(&root).ok())
            .map(|d| d.display().to_string())
            .unwrap_or_default();
        let deps = p["dependencies"]
            .as_array()
            .expect("dependencies")
            .iter()
            .filter_map(|d| {
                let dep = d["name"].as_str()?;
                members.contains(dep).then(|| {
                    let kind = d["kind"].as_str().unwrap_or("normal").to_string();
                    (dep.to_string(), kind)
                })
            })
            .collect();
        packages.insert(name, (dir, deps));
    }
    packages
}

#[test]
fn every_dependency_is_allowed_by_the_architecture_table() {
    let doc = std::fs::read_to_string(workspace_root().join("docs/ARCHITECTURE.md"))
        .expect("docs/ARCHITECTURE.md is readable");
    let rows = table(&doc);
    let packages = workspace();
    let dev_only: BTreeSet<&str> = rows
        .iter()
        .filter(|(_, r)| r.dev_only)
        .map(|(n, _)| n.as_str())
        .collect();
    let mut wrong = Vec::new();
    for (name, (dir, deps)) in &packages {
        let Some(row) = rows.get(name) else {
            wrong.push(format!("{name} ({dir}) has no row in the table"));
            continue;
        };
        if &row.path != dir {
            wrong.push(format!(
                "{name}: the table says {}, it is at {dir}",
                row.path
            ));
        }
        let Some(allowed) = &row.allowed else {
            continue;
        };
        for (dep, kind) in deps {
            let ok = allowed.contains(dep) || (kind == "dev" && dev_only.contains(dep.as_str()));
            if !ok {
                wrong.push(format!(
                    "{name} depends on {dep} ({kind}), which its row does not allow"
                ));
            }
        }
    }
    for name in rows.keys() {
        if !packages.contains_key(name) {
            wrong.push(format!(
                "the table names {name}, which is not a workspace crate"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/ARCHITECTURE.md's table and the workspace disagree:\n{}",
        wrong.join("\n")
    );
}

/// The table parser itself: a row it cannot read would let any edge through.
#[test]
fn the_table_parser_reads_rows_and_dev_only_marks() {
    let doc = "# A\n\n## What each crate may depend on\n\n| crate | path | ferry crates | other |\n|---|---|---|---|\n| ferry-a | services/a | none | x |\n| ferry-b | services/b | ferry-a, ferry-c | |\n| ferry-t (dev-only) | services/t | every ferry crate | |\n\n## Next\n| ferry-z | z | none | |\n";
    let rows = table(doc);
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert_eq!(rows["ferry-a"].allowed.as_ref().unwrap().len(), 0);
    assert_eq!(
        rows["ferry-b"]
            .allowed
            .as_ref()
            .unwrap()
            .iter()
            .collect::<Vec<_>>(),
        ["ferry-a", "ferry-c"]
    );
    assert!(rows["ferry-t"].dev_only && rows["ferry-t"].allowed.is_none());
    assert!(!rows.contains_key("ferry-z"));
}
