//! The metric names a Grafana dashboard's PromQL queries use, so tests can check that
//! each is one ferry exports (a renamed metric would otherwise leave an empty panel).
//! Used by services/operator/tests/manifests.rs (the operator's names) and
//! tests/tests/service_deploy.rs (the service's, scraped from a running `ferry serve`).

use std::collections::BTreeSet;
use std::path::Path;

/// Words that are PromQL syntax, not metric names, when not followed by `(`.
const KEYWORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "and",
    "or",
    "unless",
];

/// Skips from `open` at `chars[i]` to after its matching `close`.
fn skip_group(chars: &[char], mut i: usize, open: char, close: char) -> usize {
    let mut depth = 0;
    while i < chars.len() {
        match chars[i] {
            '"' => i = skip_string(chars, i),
            c if c == open => depth += 1,
            c if c == close => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    i
}

/// Returns the index of the closing quote of the string starting at `i`.
fn skip_string(chars: &[char], mut i: usize) -> usize {
    i += 1;
    while i < chars.len() && chars[i] != '"' {
        if chars[i] == '\\' {
            i += 1;
        }
        i += 1;
    }
    i
}

/// The metric names in one PromQL expression: identifiers that are not functions or
/// aggregations (followed by `(`), keywords, label lists (`by (...)`, `{...}`), ranges
/// (`[5m]`) or string literals.
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' {
            i = skip_string(&chars, i) + 1;
        } else if c == '{' {
            i = skip_group(&chars, i, '{', '}');
        } else if c == '[' {
            i = skip_group(&chars, i, '[', ']');
        } else if c.is_ascii_digit() || c == '.' {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' || c == '$' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || matches!(chars[i], '_' | ':' | '$'))
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut j = i;
            while j < chars.len() && chars[j].is_whitespace() {
                j += 1;
            }
            // `sum by (x) (...)`: an aggregation with its grouping first is no metric either.
            let rest: String = chars[j..].iter().take(8).collect();
            let grouped = ["by", "without"].iter().any(|g| {
                rest.strip_prefix(g)
                    .is_some_and(|r| r.starts_with(|c: char| c == '(' || c.is_whitespace()))
            });
            let called = chars.get(j) == Some(&'(') || grouped;
            if KEYWORDS.contains(&word.as_str()) {
                if called {
                    i = skip_group(&chars, j, '(', ')');
                }
            } else if !called && !word.starts_with('$') {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

/// The `expr` of every target of every panel (rows' nested panels too), with the panel's
/// title.
pub fn dashboard_exprs(dashboard: &serde_json::Value) -> Vec<(String, String)> {
    fn walk(panels: &serde_json::Value, out: &mut Vec<(String, String)>) {
        for p in panels.as_array().into_iter().flatten() {
            let title = p["title"].as_str().unwrap_or("").to_string();
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(e) = t["expr"].as_str() {
                    out.push((title.clone(), e.to_string()));
                }
            }
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// The repository's dashboard, parsed.
pub fn ferry_dashboard(repo: &Path) -> serde_json::Value {
    let path = repo.join("deploy/dashboards/ferry.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A histogram's series name without its `_bucket`, `_sum` or `_count` suffix.
pub fn family(name: &str) -> &str {
    ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .unwrap_or(name)
}
