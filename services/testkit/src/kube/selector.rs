//! Label selectors (`a=b`, `a!=b`, `a in (x,y)`, `a notin (x)`, `a`, `!a`) and field
//! selectors (`metadata.name=x`, `spec.nodeName!=y`) as the API server parses them. Field
//! selectors are limited to the fields the API server supports for each kind (the common
//! `metadata.name` and `metadata.namespace`, and the few each built-in kind adds): a
//! selector a real cluster refuses is refused here too, with its 400.

use serde_json::Value;

/// One label requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Label {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    Absent(String),
}

/// A parsed label selector (all requirements must hold).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<Label>);

/// Splits on commas outside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
        .into_iter()
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect()
}

fn set(values: &str) -> Result<Vec<String>, String> {
    let inner = values
        .trim()
        .strip_prefix('(')
        .and_then(|v| v.strip_suffix(')'))
        .ok_or_else(|| format!("a set needs parentheses: {values}"))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

impl LabelSelector {
    /// Parses a selector; an error is the 400 a real server answers.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let req = if let Some((k, v)) = part.split_once("!=") {
                Label::NotEquals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==") {
                Label::Equals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once('=') {
                Label::Equals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once(" notin ") {
                Label::NotIn(k.trim().into(), set(v)?)
            } else if let Some((k, v)) = part.split_once(" in ") {
                Label::In(k.trim().into(), set(v)?)
            } else if let Some(k) = part.strip_prefix('!') {
                Label::Absent(k.trim().into())
            } else if part.contains(' ') || part.contains('(') {
                return Err(format!("unable to parse requirement: {part}"));
            } else {
                Label::Exists(part.into())
            };
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    /// Whether an object's labels match.
    pub fn matches(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        let get = |k: &str| labels.get(k).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Label::Equals(k, v) => get(k) == Some(v.as_str()),
            Label::NotEquals(k, v) => get(k) != Some(v.as_str()),
            Label::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Label::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            Label::Exists(k) => get(k).is_some(),
            Label::Absent(k) => get(k).is_none(),
        })
    }
}

/// A parsed field selector (all terms must hold).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

/// The fields the API server supports in field selectors of a kind, beyond
/// `metadata.name` and `metadata.namespace`.
fn kind_fields(group: &str, plural: &str) -> &'static [&'static str] {
    match (group, plural) {
        ("", "pods") => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        ("", "events") => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        ("events.k8s.io", "events") => &[
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "regarding.uid",
            "reason",
            "reportingController",
            "type",
        ],
        ("", "secrets") => &["type"],
        ("", "nodes") => &["spec.unschedulable"],
        ("", "namespaces") => &["status.phase"],
        ("", "persistentvolumes") => &["spec.storageClassName"],
        _ => &[],
    }
}

fn field_value(object: &Value, path: &str) -> String {
    if path == "source" {
        // An event's `source` selects on its component.
        return object["source"]["component"]
            .as_str()
            .unwrap_or_default()
            .to_string();
    }
    let mut v = object;
    for part in path.split('.') {
        v = &v[part];
    }
    match v {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        _ => String::new(),
    }
}

impl FieldSelector {
    /// Parses a selector for resources of `group`/`plural`; an unsupported field is the
    /// API server's 400.
    pub fn parse(s: &str, group: &str, plural: &str) -> Result<Self, String> {
        let mut terms = Vec::new();
        for part in split_top(s) {
            let (field, equal, value) = if let Some((k, v)) = part.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, true, v)
            } else {
                return Err(format!(
                    "invalid selector: '{part}'; can't understand '{part}'"
                ));
            };
            let field = field.trim();
            let supported = field == "metadata.name"
                || field == "metadata.namespace"
                || kind_fields(group, plural).contains(&field);
            if !supported {
                return Err(format!("field label not supported: {field}"));
            }
            terms.push((field.to_string(), equal, value.trim().to_string()));
        }
        Ok(Self(terms))
    }

    /// Whether an object matches.
    pub fn matches(&self, object: &Value) -> bool {
        self.0
            .iter()
            .all(|(field, equal, value)| (field_value(object, field) == *value) == *equal)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn label_selectors_match_as_kubernetes_does() {
        let pod = json!({"metadata": {"labels": {"app": "mover", "tier": "a"}}});
        let yes = [
            "app=mover",
            "app==mover,tier",
            "app in (x, mover)",
            "tier notin (b)",
            "!absent",
            "app!=web",
        ];
        for s in yes {
            assert!(LabelSelector::parse(s).unwrap().matches(&pod), "{s}");
        }
        let no = [
            "app=web",
            "absent",
            "!tier",
            "app notin (mover)",
            "app in (a,b)",
            "app=mover,tier=b",
        ];
        for s in no {
            assert!(!LabelSelector::parse(s).unwrap().matches(&pod), "{s}");
        }
        assert!(LabelSelector::parse("").unwrap().matches(&json!({})));
        assert!(LabelSelector::parse("a b").is_err());
    }

    #[test]
    fn field_selectors_take_the_supported_fields_only() {
        let event = json!({"metadata": {"name": "e", "namespace": "vms"},
            "involvedObject": {"kind": "Pod", "name": "p"}, "type": "Warning"});
        let s = FieldSelector::parse(
            "involvedObject.kind=Pod,involvedObject.name=p",
            "",
            "events",
        )
        .unwrap();
        assert!(s.matches(&event));
        assert!(
            !FieldSelector::parse("involvedObject.name!=p", "", "events")
                .unwrap()
                .matches(&event)
        );
        assert!(FieldSelector::parse("metadata.namespace=vms", "", "events")
            .unwrap()
            .matches(&event));
        assert_eq!(
            FieldSelector::parse("spec.foo=1", "ferry.dev", "transfers").unwrap_err(),
            "field label not supported: spec.foo"
        );
        assert!(FieldSelector::parse("status.phase=Running", "", "pods").is_ok());
    }
}
