//! What a version probe pod (`ferry source version --termination-message-path`) says
//! through its container's termination message, as CDI's importer reports its result: one
//! small JSON object, `{"version": "..."}` (`null`: the source names no version) or
//! `{"error": "..."}`. The binary writes it ([`encode`]); the operator reads it back from
//! the terminated container's status ([`parse`]), which may hold anything (the end of a
//! crashed binary's log, a truncated message), so parsing is bounded and total.

use serde::{Deserialize, Serialize};

/// The most Kubernetes keeps of one container's termination message.
pub const MAX_MESSAGE: usize = 4096;
/// Longest version accepted (a registry digest is 71 bytes, an S3 ETag with a version id
/// about 120, an HTTP date 29).
pub const MAX_VERSION: usize = 512;
/// Longest error text written, and shown in a status.
pub const MAX_ERROR: usize = 1024;

/// What a probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probed {
    /// The source's version, or None when it names none (every fire imports then).
    Version(Option<String>),
    /// The source could not be asked (bad credentials, a 404, unreachable): the error.
    Failed(String),
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    /// Present (`Some`), with a version or `null` (`Some(None)`), or absent (`None`).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    version: Option<Option<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// A field that is there, `null` included.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

/// The termination message for `probed`: at most [`MAX_MESSAGE`] bytes (an error's text
/// cut at [`MAX_ERROR`] bytes, on a character boundary).
pub fn encode(probed: &Probed) -> String {
    let wire = match probed {
        Probed::Version(v) => Wire {
            version: Some(v.clone().filter(|v| usable_version(v))),
            error: None,
        },
        Probed::Failed(e) => Wire {
            version: None,
            error: Some(cut(&printable(e), MAX_ERROR)),
        },
    };
    serde_json::to_string(&wire).unwrap_or_else(|_| r#"{"error":"unencodable"}"#.into())
}

/// Reads a probe pod's termination message. Anything but one of [`encode`]'s messages is
/// a failure saying so, quoting at most 200 printable characters of what was there.
pub fn parse(message: &str) -> Probed {
    let text = message.trim();
    if text.is_empty() {
        return Probed::Failed("the version probe ended without a report".into());
    }
    let garbage = || {
        Probed::Failed(format!(
            "the version probe ended without a report it could read: {}",
            cut(&printable(text), 200)
        ))
    };
    // serde reads a struct from a JSON array too: only an object is a report.
    if text.len() > MAX_MESSAGE || !text.starts_with('{') {
        return garbage();
    }
    let Ok(wire) = serde_json::from_str::<Wire>(text) else {
        return garbage();
    };
    match (wire.version, wire.error) {
        (Some(version), None) => match version {
            None => Probed::Version(None),
            Some(v) if usable_version(&v) => Probed::Version(Some(v)),
            Some(_) => Probed::Failed(
                "the version probe reported a version that is empty, too long or not printable"
                    .into(),
            ),
        },
        (None, Some(e)) => Probed::Failed(cut(&printable(&e), MAX_ERROR)),
        _ => garbage(),
    }
}

/// A version is printable ASCII (spaces inside allowed), 1 to [`MAX_VERSION`] bytes.
fn usable_version(v: &str) -> bool {
    !v.trim().is_empty() && v.len() <= MAX_VERSION && v.bytes().all(|b| (0x20..0x7f).contains(&b))
}

/// `text` with control characters (newlines included) as spaces.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// At most `max` bytes of `text`, cut on a character boundary (`...` marks a cut).
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max.saturating_sub(3);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_errors_round_trip_exactly() {
        for probed in [
            Probed::Version(Some("etag:\"9a0364b9e99bb480dd25e1f0284c8555\"".into())),
            Probed::Version(Some(
                "etag:\"abc\" version-id:3HL4kqtJlcpXroDTDmJ+rmSpXd3dIbrHY".into(),
            )),
            Probed::Version(Some(format!("digest:sha256:{}", "ab".repeat(32)))),
            Probed::Version(None),
            Probed::Failed("s3://images/f.raw: access denied: check the credentials".into()),
        ] {
            let text = encode(&probed);
            assert!(text.len() <= MAX_MESSAGE);
            assert_eq!(parse(&text), probed, "{text}");
        }
        assert_eq!(
            encode(&Probed::Version(Some("etag:\"v1\"".into()))),
            r#"{"version":"etag:\"v1\""}"#
        );
        assert_eq!(encode(&Probed::Version(None)), r#"{"version":null}"#);
        assert_eq!(
            parse("  {\"version\":\"x\"}\n"),
            Probed::Version(Some("x".into()))
        );
    }

    #[test]
    fn long_errors_are_cut_to_fit_and_never_hold_control_characters() {
        let long = format!("é{}\n\u{1b}[31m", "x".repeat(10_000));
        let text = encode(&Probed::Failed(long));
        assert!(text.len() <= MAX_MESSAGE, "{}", text.len());
        let Probed::Failed(back) = parse(&text) else {
            panic!("{text}")
        };
        assert!(back.len() <= MAX_ERROR && back.starts_with('é') && back.ends_with("..."));
        assert!(!back.chars().any(char::is_control), "{back}");
        // An unusable version is written as none rather than as a lie.
        assert_eq!(
            encode(&Probed::Version(Some("a\nb".into()))),
            r#"{"version":null}"#
        );
    }

    #[test]
    fn garbage_is_a_failure_that_quotes_a_bounded_printable_prefix() {
        let failed = |text: &str| match parse(text) {
            Probed::Failed(why) => why,
            other => panic!("{text:?} parsed as {other:?}"),
        };
        assert_eq!(failed(""), "the version probe ended without a report");
        let log = "thread 'main' panicked at src/x.rs:1:1:\nboom";
        assert_eq!(
            failed(log),
            "the version probe ended without a report it could read: thread 'main' panicked at src/x.rs:1:1: boom"
        );
        assert!(failed(&"y".repeat(100_000)).len() < 300);
        for text in [
            "{\"version\":\"v\",\"error\":\"e\"}",
            "{}",
            "{\"version\":42}",
            "{\"other\":1}",
            "[\"version\"]",
            "{\"version\":\"v\"",
            "null",
            "{\"version\":\"\"}",
            "{\"version\":\"a\\u0000b\"}",
        ] {
            failed(text);
        }
        let huge = format!("{{\"version\":\"{}\"}}", "v".repeat(MAX_VERSION + 1));
        failed(&huge);
        let too_long = format!("{{\"error\":\"{}\"}}", "e".repeat(MAX_MESSAGE));
        failed(&too_long);
    }
}
