//! A request's REST path as the API server's request-info resolver reads it: `/api/v1/...`
//! is the core group, `/apis/GROUP/VERSION/...` a named one; then an optional
//! `namespaces/NS/`, the resource, its name, and a subresource. The RBAC check and the
//! stand-in's router read paths through this one function, so they cannot disagree.

/// The parts of a resource path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourcePath {
    /// The API group ("" for the core group).
    pub group: String,
    /// The version (`v1`, `v1alpha1`).
    pub version: String,
    /// The namespace of the request (None: cluster-scoped, or across all namespaces).
    pub namespace: Option<String>,
    /// The resource (plural), e.g. `pods`.
    pub resource: String,
    /// The object's name (None: the collection).
    pub name: Option<String>,
    /// The subresource (`status`), when the path names one.
    pub subresource: Option<String>,
}

/// Subresources of a namespace object itself (`/api/v1/namespaces/NAME/status`), which
/// the resolver must not read as a resource in that namespace.
const NAMESPACE_SUBRESOURCES: [&str; 2] = ["status", "finalize"];

impl ResourcePath {
    /// Parses a path; an error names what is not a resource path.
    pub fn parse(path: &str) -> Result<Self, String> {
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (group, version, rest) = match segments.as_slice() {
            ["api", version, rest @ ..] => ("", *version, rest),
            ["apis", group, version, rest @ ..] => (*group, *version, rest),
            _ => return Err(format!("not a resource path: {path}")),
        };
        let (namespace, rest) = match rest {
            ["namespaces", ns, next, rest @ ..] if !NAMESPACE_SUBRESOURCES.contains(next) => {
                let mut tail = vec![*next];
                tail.extend_from_slice(rest);
                (Some(ns.to_string()), tail)
            }
            _ => (None, rest.to_vec()),
        };
        let (resource, name, subresource) = match rest.as_slice() {
            [resource] => (*resource, None, None),
            [resource, name] => (*resource, Some(*name), None),
            [resource, name, sub] => (*resource, Some(*name), Some(*sub)),
            _ => return Err(format!("not a resource path: {path}")),
        };
        if resource.is_empty() || name.is_some_and(str::is_empty) {
            return Err(format!("not a resource path: {path}"));
        }
        Ok(Self {
            group: group.to_string(),
            version: version.to_string(),
            namespace,
            resource: resource.to_string(),
            name: name.map(str::to_string),
            subresource: subresource.map(str::to_string),
        })
    }

    /// `resource` or `resource/subresource`, as a Role names it.
    pub fn rbac_resource(&self) -> String {
        match &self.subresource {
            Some(sub) => format!("{}/{sub}", self.resource),
            None => self.resource.clone(),
        }
    }
}

/// Whether a query asks for a watch (`watch=true` or `watch=1`).
pub fn is_watch(query: &str) -> bool {
    query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_like_the_request_info_resolver() {
        let p = ResourcePath::parse("/apis/ferry.dev/v1alpha1/namespaces/vms/transfers/t/status")
            .unwrap();
        assert_eq!(
            (
                p.group.as_str(),
                p.namespace.as_deref(),
                p.rbac_resource().as_str(),
                p.name.as_deref()
            ),
            ("ferry.dev", Some("vms"), "transfers/status", Some("t"))
        );
        let ns = ResourcePath::parse("/api/v1/namespaces/vms").unwrap();
        assert_eq!(
            (ns.resource.as_str(), ns.name.as_deref()),
            ("namespaces", Some("vms"))
        );
        assert_eq!(ns.namespace, None);
        let status = ResourcePath::parse("/api/v1/namespaces/vms/status").unwrap();
        assert_eq!(status.rbac_resource(), "namespaces/status");
        let all = ResourcePath::parse("/api/v1/pods").unwrap();
        assert_eq!((all.namespace, all.name), (None, None));
        assert!(ResourcePath::parse("/healthz").is_err());
        assert!(ResourcePath::parse("/api/v1/namespaces/a/pods/b/c/d").is_err());
        assert!(is_watch("labelSelector=a&watch=true"));
        assert!(!is_watch("watchy=true"));
    }
}
