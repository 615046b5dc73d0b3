//! Failures as the API server reports them: a `Status` object with the HTTP code, the
//! reason kube's `ErrorResponse` carries, the message a real server writes, and the
//! details (name, group, kind) it fills in.

use serde_json::{json, Value};

/// A failed request.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// `NotFound`, `AlreadyExists`, `Conflict`, `Forbidden`, `Invalid`, `BadRequest`, ...
    pub reason: &'static str,
    /// The message.
    pub message: String,
    /// `details`: name, group, kind (the resource).
    pub details: Option<(String, String, String)>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: String) -> Self {
        Self {
            code,
            reason,
            message,
            details: None,
        }
    }

    fn with(mut self, name: &str, group: &str, resource: &str) -> Self {
        self.details = Some((name.into(), group.into(), resource.into()));
        self
    }

    /// 404 for an object: `pods "x" not found`.
    pub fn not_found(qualified: &str, group: &str, resource: &str, name: &str) -> Self {
        Self::new(404, "NotFound", format!("{qualified} \"{name}\" not found"))
            .with(name, group, resource)
    }

    /// 404 for a path naming no served resource.
    pub fn no_resource() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource".into(),
        )
    }

    /// 409 for a create of an existing name.
    pub fn already_exists(qualified: &str, group: &str, resource: &str, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{qualified} \"{name}\" already exists"),
        )
        .with(name, group, resource)
    }

    /// 409 for a write based on a stale resourceVersion (or a failed precondition).
    pub fn conflict(qualified: &str, group: &str, resource: &str, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {qualified} \"{name}\": {why}"),
        )
        .with(name, group, resource)
    }

    /// The message of a stale resourceVersion.
    pub const MODIFIED: &'static str =
        "the object has been modified; please apply your changes to the latest version and try again";

    /// 422 for an invalid object.
    pub fn invalid(kind: &str, name: &str, why: &str) -> Self {
        Self::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {why}"),
        )
    }

    /// 400.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message.into())
    }

    /// 403 with the authorizer's message.
    pub fn forbidden(message: String, name: Option<&str>, group: &str, resource: &str) -> Self {
        Self::new(403, "Forbidden", message).with(name.unwrap_or_default(), group, resource)
    }

    /// 405.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message.into())
    }

    /// 410 for a watch from a compacted resourceVersion.
    pub fn gone(asked: u64, oldest: u64) -> Self {
        Self::new(
            410,
            "Expired",
            format!("too old resource version: {asked} ({oldest})"),
        )
    }

    /// 415 for a patch of an unknown content type.
    pub fn unsupported_media(content_type: &str) -> Self {
        Self::new(415, "UnsupportedMediaType", format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml; got {content_type}"))
    }

    /// The `Status` object.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": self.message, "reason": self.reason, "code": self.code,
        });
        if let Some((name, group, kind)) = &self.details {
            let mut details = json!({"kind": kind});
            if !name.is_empty() {
                details["name"] = json!(name);
            }
            if !group.is_empty() {
                details["group"] = json!(group);
            }
            status["details"] = details;
        }
        status
    }
}
