//! The patch types of the API server's PATCH verb, by content type:
//!
//! - `application/merge-patch+json`: RFC 7386 (maps merge, `null` removes a key, every
//!   other value replaces, lists whole).
//! - `application/json-patch+json`: RFC 6902 (add, remove, replace, move, copy, test).
//! - `application/strategic-merge-patch+json`: treated as a merge patch. Real strategic
//!   merge merges some lists by key (containers by name, conditions by type) and knows
//!   `$patch` directives; here lists are replaced whole and directives are not understood.
//! - `application/apply-patch+yaml` (server-side apply): the applied object is merged into
//!   the live one like a merge patch, after removing the fields the same field manager
//!   applied last time and leaves out now (as real apply does when that manager alone
//!   owned them). Real apply also tracks every manager's fields (managedFields), merges
//!   lists by their keys (here a list is one field, replaced whole) and answers a conflict
//!   between managers with 409 unless `force`; none of that is simulated. An apply that
//!   creates the object is supported.

use serde_json::Value;

/// The patch types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// RFC 7386.
    Merge,
    /// RFC 6902.
    Json,
    /// Strategic merge (as [`PatchType::Merge`]).
    Strategic,
    /// Server-side apply (as [`PatchType::Merge`], creating a missing object).
    Apply,
}

impl PatchType {
    /// The type of a request's `Content-Type` (parameters ignored).
    pub fn of(content_type: &str) -> Option<Self> {
        match content_type.split(';').next().unwrap_or_default().trim() {
            "application/merge-patch+json" => Some(Self::Merge),
            "application/json-patch+json" => Some(Self::Json),
            "application/strategic-merge-patch+json" => Some(Self::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Some(Self::Apply),
            _ => None,
        }
    }
}

/// RFC 7386 merge of `patch` into `target`.
pub fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    let Value::Object(t) = target else {
        return;
    };
    for (k, v) in patch {
        if v.is_null() {
            t.remove(k);
        } else {
            merge(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// Applies a patch of `kind` (the request body, parsed) to `live`; an error is the
/// message of the API server's 422 (a failed JSON patch `test`, a missing path).
pub fn apply(kind: PatchType, live: &Value, body: &Value) -> Result<Value, String> {
    let mut out = live.clone();
    match kind {
        PatchType::Merge | PatchType::Strategic | PatchType::Apply => merge(&mut out, body),
        PatchType::Json => {
            let ops: json_patch::Patch = serde_json::from_value(body.clone())
                .map_err(|e| format!("invalid JSON patch: {e}"))?;
            json_patch::patch(&mut out, &ops).map_err(|e| e.to_string())?;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn merge_patches_follow_rfc_7386() {
        let live = json!({"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]});
        let out = apply(
            PatchType::Merge,
            &live,
            &json!({"a": "z", "c": {"f": null}, "l": [3]}),
        )
        .unwrap();
        assert_eq!(out, json!({"a": "z", "c": {"d": "e"}, "l": [3]}));
    }

    #[test]
    fn json_patches_follow_rfc_6902() {
        let live = json!({"metadata": {"finalizers": ["a", "b"]}});
        let out = apply(
            PatchType::Json,
            &live,
            &json!([{"op": "test", "path": "/metadata/finalizers/0", "value": "a"},
                    {"op": "remove", "path": "/metadata/finalizers/0"},
                    {"op": "add", "path": "/metadata/labels", "value": {"x": "y"}}]),
        )
        .unwrap();
        assert_eq!(
            out,
            json!({"metadata": {"finalizers": ["b"], "labels": {"x": "y"}}})
        );
        let failed = apply(
            PatchType::Json,
            &live,
            &json!([{"op": "test", "path": "/metadata/finalizers/0", "value": "x"}]),
        );
        assert!(failed.is_err());
    }

    #[test]
    fn content_types_name_the_patch() {
        assert_eq!(
            PatchType::of("application/apply-patch+yaml"),
            Some(PatchType::Apply)
        );
        assert_eq!(
            PatchType::of("application/merge-patch+json; charset=utf-8"),
            Some(PatchType::Merge)
        );
        assert_eq!(PatchType::of("application/json"), None);
    }
}
