//! YAML that kubectl reads back as it was meant. kubectl (sigs.k8s.io/yaml) parses YAML
//! 1.1, where a plain `off`, `no`, `y` or `1_000` is a boolean or a number; serde_yaml
//! writes YAML 1.2 and leaves such strings plain, so a mover's `--metrics-listen off`
//! would come back as `false`. This writer quotes every string that is not plainly a
//! string in both versions (as a JSON string, which is valid YAML), in block style
//! otherwise, as `kubectl get -o yaml` lays objects out.

use std::fmt::Write as _;

use serde_json::Value;

/// `value` as one YAML document (no `---`), ending with a newline.
pub fn to_string(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Object(map) if !map.is_empty() => object(&mut out, map, 0),
        Value::Array(items) if !items.is_empty() => array(&mut out, items, 0),
        other => {
            out.push_str(&scalar(other));
            out.push('\n');
        }
    }
    out
}

fn object(out: &mut String, map: &serde_json::Map<String, Value>, indent: usize) {
    for (i, (key, value)) in map.iter().enumerate() {
        // The first key of an object in a list goes on the item's `- ` line.
        if i > 0 || !out.ends_with("- ") {
            pad(out, indent);
        }
        out.push_str(&string(key));
        out.push(':');
        nested(out, value, indent, indent + 2);
    }
}

fn array(out: &mut String, items: &[Value], indent: usize) {
    for item in items {
        pad(out, indent);
        out.push_str("- ");
        match item {
            Value::Object(map) if !map.is_empty() => object(out, map, indent + 2),
            Value::Array(inner) if !inner.is_empty() => {
                out.push('\n');
                array(out, inner, indent + 2);
            }
            other => {
                out.push_str(&scalar(other));
                out.push('\n');
            }
        }
    }
}

/// What follows `key:`: a scalar on the same line, or a block below (a list at the key's
/// own indentation, as kubectl writes it).
fn nested(out: &mut String, value: &Value, key_indent: usize, map_indent: usize) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            out.push('\n');
            object(out, map, map_indent);
        }
        Value::Array(items) if !items.is_empty() => {
            out.push('\n');
            array(out, items, key_indent);
        }
        other => {
            out.push(' ');
            out.push_str(&scalar(other));
            out.push('\n');
        }
    }
}

fn pad(out: &mut String, indent: usize) {
    let _ = write!(out, "{:indent$}", "");
}

fn scalar(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => string(s),
        Value::Object(_) => "{}".into(),
        Value::Array(_) => "[]".into(),
    }
}

/// Words YAML 1.1 or 1.2 read as a boolean or null.
const RESERVED: [&str; 22] = [
    "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "true", "True", "TRUE", "false",
    "False", "FALSE", "on", "On", "ON", "off", "Off", "OFF",
];

/// A string plain when it cannot be anything else in YAML 1.1 or 1.2 (it starts with a
/// letter, `/` or `_`, holds only name-like characters, and is no reserved word), else
/// quoted.
fn string(s: &str) -> String {
    let plain = s
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '/' || c == '_')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_./:@=+-".contains(c))
        && !s.ends_with(':')
        && !s.contains("://")
        && !RESERVED.contains(&s)
        && !matches!(s, "null" | "Null" | "NULL");
    if plain {
        s.to_string()
    } else {
        Value::String(s.to_string()).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Whatever the strings, the YAML reads back as the same value (serde_yaml, YAML 1.2)
    /// and strings YAML 1.1 would read as something else are quoted.
    #[test]
    fn every_value_reads_back_and_ambiguous_strings_are_quoted() {
        let value = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "a", "labels": {"app.kubernetes.io/component": "mover"},
                          "annotations": {}},
            "spec": {
                "containers": [{"name": "c", "args": ["serve", "--metrics-listen", "off",
                    "0.0.0.0:50051", "y", "1_000", "12:30", "10Gi", "", "a: b", "#x",
                    "line\none", "https://x/y", "-dash", "null", "~", "3", "1e3", ".inf",
                    "ghcr.io/ferry-project/ferry:0.1.0"]}],
                "nested": [[1, 2], [], {}],
                "empty": [],
                "number": 5,
                "flag": false,
                "nothing": null,
                "list": [{"a": 1, "b": {"c": [true]}}, "s"]
            }
        });
        let text = to_string(&value);
        let back: Value = serde_yaml::from_str(&text).unwrap();
        assert_eq!(back, value, "{text}");
        for quoted in [
            "\"off\"",
            "\"y\"",
            "\"1_000\"",
            "\"12:30\"",
            "\"null\"",
            "\"3\"",
        ] {
            assert!(text.contains(quoted), "{quoted} not quoted:\n{text}");
        }
        assert!(
            text.contains("- ghcr.io/ferry-project/ferry:0.1.0\n"),
            "{text}"
        );
        assert!(
            text.contains("app.kubernetes.io/component: mover\n"),
            "{text}"
        );
    }
}
