//! [`Validator`]: which version of an object a copy reads, and the request headers that
//! make the server refuse to answer for any other version.

use std::fmt;

use http::header::{HeaderName, HeaderValue, IF_MATCH, IF_UNMODIFIED_SINCE};
use http::HeaderMap;

use ferry_core::http_headers::{strong_etag, MAX_HEADER_VALUE};

/// The version of an object, from the first answer: a strong ETag when the server gives
/// one, its Last-Modified date otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Validator {
    /// A strong entity tag, quotes included, sent back in `If-Match`.
    ETag(String),
    /// An HTTP date, sent back in `If-Unmodified-Since`.
    LastModified(String),
}

impl Validator {
    /// The validator of a response's headers.
    pub fn from_headers(headers: &HeaderMap) -> Option<Self> {
        if let Some(tag) = headers
            .get(http::header::ETAG)
            .and_then(|v| strong_etag(v.as_bytes()))
        {
            return Some(Self::ETag(tag.to_string()));
        }
        headers
            .get(http::header::LAST_MODIFIED)
            .filter(|v| v.len() <= MAX_HEADER_VALUE)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .map(|v| Self::LastModified(v.to_string()))
    }

    /// Whether a response's own headers name another version than this one (a server
    /// that ignored the precondition). Headers that say nothing are no evidence.
    pub fn contradicted_by(&self, headers: &HeaderMap) -> Option<Self> {
        let theirs = Self::from_headers(headers)?;
        match (self, &theirs) {
            (Self::ETag(a), Self::ETag(b)) if a != b => Some(theirs),
            (Self::LastModified(a), Self::LastModified(b)) if a != b => Some(theirs),
            _ => None,
        }
    }

    /// The precondition header that pins this version.
    pub fn condition(&self) -> Option<(HeaderName, HeaderValue)> {
        match self {
            Self::ETag(tag) => HeaderValue::from_str(tag).ok().map(|v| (IF_MATCH, v)),
            Self::LastModified(date) => HeaderValue::from_str(date)
                .ok()
                .map(|v| (IF_UNMODIFIED_SINCE, v)),
        }
    }

    /// A string that stores this validator in a job (see [`Validator::from_token`]).
    pub fn token(&self) -> String {
        match self {
            Self::ETag(tag) => format!("etag:{tag}"),
            Self::LastModified(date) => format!("last-modified:{date}"),
        }
    }

    /// Reads back a [`Validator::token`].
    pub fn from_token(token: &str) -> Option<Self> {
        if let Some(tag) = token.strip_prefix("etag:") {
            return Some(Self::ETag(tag.to_string()));
        }
        token
            .strip_prefix("last-modified:")
            .map(|d| Self::LastModified(d.to_string()))
    }

    fn value(&self) -> &str {
        match self {
            Self::ETag(v) | Self::LastModified(v) => v,
        }
    }
}

impl fmt::Display for Validator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ETag(tag) => write!(f, "ETag {tag}"),
            Self::LastModified(date) => write!(f, "Last-Modified {date}"),
        }
    }
}

/// Whether the response's ETag is a weak one (`W/"..."`): If-Match compares strongly, so
/// a weak tag never matches and cannot pin a version (RFC 9110, 13.1.1).
pub(super) fn is_weak_etag(headers: &HeaderMap) -> bool {
    headers.get(http::header::ETAG).is_some_and(|v| {
        let v = v.as_bytes();
        v.len() <= MAX_HEADER_VALUE && v.trim_ascii_start().starts_with(b"W/")
    })
}

/// The warning for an object whose server gives no validator: nothing in the requests
/// can make the server refuse another version. `shown` is the redacted URL.
pub(super) fn unpinned_warning(shown: &str, weak_etag: bool) -> String {
    let what = if weak_etag {
        "only a weak ETag (which If-Match cannot use) and no Last-Modified"
    } else {
        "no ETag or Last-Modified"
    };
    format!("{shown} sends {what}: a change during the copy would go unnoticed")
}

/// "(ETag a -> b)", for the message of a changed object.
pub(super) fn change(old: &Validator, new: Option<&Validator>) -> String {
    match new {
        Some(new) if std::mem::discriminant(old) == std::mem::discriminant(new) => {
            let name = match old {
                Validator::ETag(_) => "ETag",
                Validator::LastModified(_) => "Last-Modified",
            };
            format!("({name} {} -> {})", old.value(), new.value())
        }
        Some(new) => format!("({old} -> {new})"),
        None => format!("({old} -> another version)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strong_etag_wins_and_round_trips() {
        let mut h = HeaderMap::new();
        h.insert("etag", HeaderValue::from_static("W/\"weak\""));
        h.insert(
            "last-modified",
            HeaderValue::from_static("Wed, 02 Dec 2026 10:00:00 GMT"),
        );
        let v = Validator::from_headers(&h).unwrap();
        assert!(matches!(v, Validator::LastModified(_)));
        assert_eq!(v.condition().unwrap().0, IF_UNMODIFIED_SINCE);
        h.insert("etag", HeaderValue::from_static("\"abc\""));
        let v = Validator::from_headers(&h).unwrap();
        assert_eq!(v, Validator::ETag("\"abc\"".into()));
        assert_eq!(Validator::from_token(&v.token()), Some(v.clone()));
        let mut other = HeaderMap::new();
        other.insert("etag", HeaderValue::from_static("\"def\""));
        let new = v.contradicted_by(&other).unwrap();
        assert_eq!(change(&v, Some(&new)), "(ETag \"abc\" -> \"def\")");
        assert_eq!(v.contradicted_by(&HeaderMap::new()), None);
    }

    #[test]
    fn a_weak_etag_alone_pins_nothing() {
        let mut h = HeaderMap::new();
        h.insert("etag", HeaderValue::from_static("W/\"weak\""));
        assert_eq!(Validator::from_headers(&h), None);
        assert!(is_weak_etag(&h));
        h.insert("etag", HeaderValue::from_static("\"strong\""));
        assert!(!is_weak_etag(&h));
        assert!(!is_weak_etag(&HeaderMap::new()));
        let w = unpinned_warning("http://h/disk.img?***", true);
        assert!(w.contains("weak ETag"), "{w}");
        let n = unpinned_warning("http://h/disk.img?***", false);
        assert_eq!(
            n,
            "http://h/disk.img?*** sends no ETag or Last-Modified: a change during the copy would go unnoticed"
        );
    }
}
