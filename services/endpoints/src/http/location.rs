//! [`Location`]: where an object's requests go, and resolving it again when a cached
//! redirect target stops answering.
//!
//! Template servers often redirect to a presigned object-store URL that is valid for a few
//! minutes. Opening follows the redirects once and later requests go straight to the
//! target; when that target answers 401, 403, 404 or 410 (an expired signature), the
//! request is sent once more from the origin URL, following its redirects anew (same rules:
//! at most [`super::MAX_REDIRECTS`], no https to http, credentials only to the origin), and
//! the new target is kept for the requests that follow. The version conditions ride along
//! unchanged, so a new target that serves another version still fails the copy. A refusal
//! after resolving again is final.

use ferry_core::spec::redact_http_url;
use ferry_core::{Error, ErrorKind};
use http::{Response, StatusCode};
use hyper::body::Incoming;
use parking_lot::Mutex;
use url::Url;

use super::client::{Ask, Client};
use super::error::{self, Attempt, Failure};

/// The origin URL and the target its redirects led to.
pub(super) struct Location {
    /// The URL the job names: redirects are resolved from here.
    origin: Url,
    /// Where requests go now (the origin when it did not redirect).
    target: Mutex<Url>,
}

/// Answers that a stale redirect target gives (an expired or revoked presigned URL).
fn refused(status: StatusCode) -> bool {
    matches!(status.as_u16(), 401 | 403 | 404 | 410)
}

impl Location {
    /// `origin`, whose redirects led to `target` when the object was opened.
    pub fn new(origin: Url, target: Url) -> Self {
        Self {
            origin,
            target: Mutex::new(target),
        }
    }

    /// Sends `ask` to the current target; when a redirect target refuses it, resolves the
    /// origin's redirects again and sends it there. `shown` names the object in errors.
    pub async fn send(
        &self,
        client: &Client,
        ask: &Ask<'_>,
        shown: &str,
    ) -> Attempt<Response<Incoming>> {
        let target = self.target.lock().clone();
        let (response, _) = client.send(&target, ask).await?;
        let status = response.status();
        if !refused(status) || target == self.origin {
            return Ok(response);
        }
        drop(response);
        tracing::info!(
            endpoint = %shown,
            target = %redact_http_url(&target),
            status = status.as_u16(),
            "the redirect target refused a request (expired?); resolving the URL's redirects again"
        );
        let (response, now) = client.send(&self.origin, ask).await?;
        let again = response.status();
        if refused(again) {
            if now == self.origin {
                // The origin itself refuses: its own answer says why (credentials, gone).
                return Err(error::status(again, shown));
            }
            return Err(refused_again(again, shown, &now));
        }
        if again.is_success() {
            tracing::debug!(endpoint = %shown, target = %redact_http_url(&now), "new redirect target");
            *self.target.lock() = now;
        }
        Ok(response)
    }
}

/// The target found by resolving again refused the request too: final.
fn refused_again(status: StatusCode, shown: &str, target: &Url) -> Failure {
    let n = status.as_u16();
    let reason = status.canonical_reason().unwrap_or("");
    let kind = if matches!(n, 404 | 410) {
        ErrorKind::NotFound
    } else {
        ErrorKind::PermissionDenied
    };
    Failure::fatal(Error::new(
        kind,
        format!(
            "{shown} redirects to {} which refused the request (HTTP {n} {reason}), as did the target before it: the server's redirect target (a presigned URL?) is expired or not valid",
            redact_http_url(target)
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_answers_of_a_stale_target_resolve_again() {
        for code in [401, 403, 404, 410] {
            assert!(refused(StatusCode::from_u16(code).unwrap()), "{code}");
        }
        for code in [200, 206, 302, 407, 412, 416, 429, 500, 503] {
            assert!(!refused(StatusCode::from_u16(code).unwrap()), "{code}");
        }
    }

    #[test]
    fn the_final_refusal_names_the_status_but_no_query() {
        let target = Url::parse("https://store.example/obj?X-Amz-Signature=s3cr3t").unwrap();
        let f = refused_again(StatusCode::FORBIDDEN, "https://t.example/disk.img", &target);
        let text = f.error.to_string();
        assert!(!f.transient);
        assert_eq!(f.error.kind(), ErrorKind::PermissionDenied);
        assert!(text.contains("HTTP 403 Forbidden"), "{text}");
        assert!(text.contains("https://store.example/obj?***"), "{text}");
        assert!(!text.contains("s3cr3t"), "{text}");
        let gone = refused_again(StatusCode::GONE, "x", &target);
        assert_eq!(gone.error.kind(), ErrorKind::NotFound);
    }
}
