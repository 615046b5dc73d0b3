//! Parsers for the HTTP header values an HTTP source trusts for sizes and ranges
//! (`Content-Range`, `Content-Length`, entity tags).
//!
//! They live here, with no HTTP dependency, because they decide how many bytes are read
//! into which buffer: they are the part of the HTTP source a hostile server reaches first,
//! so they are small, total (never panic, every length bounded) and fuzzed on their own.

/// Longest header value looked at; anything longer is refused without scanning it.
pub const MAX_HEADER_VALUE: usize = 256;

/// A `Content-Range: bytes START-END/TOTAL` value (END inclusive, TOTAL `*` = unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContentRange {
    pub start: u64,
    /// The last byte, inclusive.
    pub end: u64,
    pub total: Option<u64>,
}

impl ContentRange {
    /// The number of bytes in the range.
    pub fn len(&self) -> u64 {
        self.end - self.start + 1
    }

    /// Never true: a range holds at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// Headers an HTTP source sets itself, or that would change what it reads: the range,
/// the version conditions that pin the object, the body's length and encoding, and the
/// connection's hop-by-hop headers. A user's extra headers may not name them.
pub const RESERVED_HEADERS: &[&str] = &[
    "host",
    "range",
    "accept-encoding",
    "if-match",
    "if-none-match",
    "if-range",
    "if-modified-since",
    "if-unmodified-since",
    "content-length",
    "transfer-encoding",
    "te",
    "trailer",
    "connection",
    "keep-alive",
    "proxy-connection",
    "upgrade",
];

/// Whether `name` is one of [`RESERVED_HEADERS`] (ASCII case-insensitive).
pub fn is_reserved_header(name: &str) -> bool {
    let name = name.trim();
    RESERVED_HEADERS
        .iter()
        .any(|r| r.eq_ignore_ascii_case(name))
}

/// Parses a decimal byte count: ASCII digits only (no sign, no spaces), fits u64.
pub fn parse_length(text: &str) -> Option<u64> {
    let text = text.trim_matches([' ', '\t']);
    if text.is_empty() || text.len() > 20 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// Parses a `Content-Range` value of a 206 answer. None when it is malformed, is not in
/// bytes, has START > END, or END is not below TOTAL.
pub fn parse_content_range(value: &[u8]) -> Option<ContentRange> {
    if value.len() > MAX_HEADER_VALUE {
        return None;
    }
    let text = std::str::from_utf8(value).ok()?.trim_matches([' ', '\t']);
    let (unit, rest) = text.split_once(' ')?;
    if !unit.eq_ignore_ascii_case("bytes") {
        return None;
    }
    let (range, total) = rest.trim_start().split_once('/')?;
    let (start, end) = range.split_once('-')?;
    let start = parse_length(start)?;
    let end = parse_length(end)?;
    let total = match total {
        "*" => None,
        t => Some(parse_length(t)?),
    };
    // END = u64::MAX would make the range's length overflow: no real object is that large.
    if start > end || end == u64::MAX || total.is_some_and(|t| end >= t) {
        return None;
    }
    Some(ContentRange { start, end, total })
}

/// The complete length of a `Content-Range: bytes */TOTAL` value (a 416 answer).
pub fn parse_unsatisfied_range(value: &[u8]) -> Option<u64> {
    if value.len() > MAX_HEADER_VALUE {
        return None;
    }
    let text = std::str::from_utf8(value).ok()?.trim_matches([' ', '\t']);
    let (unit, rest) = text.split_once(' ')?;
    if !unit.eq_ignore_ascii_case("bytes") {
        return None;
    }
    parse_length(rest.trim_start().strip_prefix("*/")?)
}

/// Parses a `Content-Length` value (a list of equal values counts as one, as RFC 9110 allows).
pub fn parse_content_length(value: &[u8]) -> Option<u64> {
    if value.len() > MAX_HEADER_VALUE {
        return None;
    }
    let text = std::str::from_utf8(value).ok()?;
    let mut values = text.split(',').map(parse_length);
    let first = values.next()??;
    values.all(|v| v == Some(first)).then_some(first)
}

/// An entity tag, as the server sent it (quotes included), when it is strong (no `W/`)
/// and well formed: only a strong tag can be sent back in `If-Match`.
pub fn strong_etag(value: &[u8]) -> Option<&str> {
    if value.len() > MAX_HEADER_VALUE {
        return None;
    }
    let text = std::str::from_utf8(value).ok()?.trim_matches([' ', '\t']);
    let inner = text.strip_prefix('"')?.strip_suffix('"')?;
    // etagc = %x21 / %x23-7E / obs-text; only ASCII is kept.
    inner
        .bytes()
        .all(|b| b == 0x21 || (0x23..=0x7e).contains(&b))
        .then_some(text)
}

/// The version of an S3 object as a job and a GoldenImage record it: `etag:<ETag>` (the
/// quotes kept), followed by ` version-id:<id>` on a versioned bucket. None without a
/// usable ETag (refused when malformed or longer than [`MAX_HEADER_VALUE`]); a version
/// id that is not printable ASCII of that length is left out.
pub fn s3_object_version(etag: Option<&str>, version_id: Option<&str>) -> Option<String> {
    let etag = etag.and_then(|e| strong_etag(e.as_bytes()))?;
    let id = version_id.map(|v| v.trim_matches([' ', '\t'])).filter(|v| {
        !v.is_empty()
            && v != &"null"
            && v.len() <= MAX_HEADER_VALUE
            && v.bytes().all(|b| (0x21..=0x7e).contains(&b))
    });
    Some(match id {
        Some(id) => format!("etag:{etag} version-id:{id}"),
        None => format!("etag:{etag}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_ranges() {
        assert_eq!(
            parse_content_range(b"bytes 0-0/1048576"),
            Some(ContentRange {
                start: 0,
                end: 0,
                total: Some(1048576)
            })
        );
        let r = parse_content_range(b"bytes 100-199/*").unwrap();
        assert_eq!((r.len(), r.total), (100, None));
        for bad in [
            &b"bytes 5-4/10"[..],
            b"bytes 0-10/10",
            b"items 0-1/10",
            b"bytes -1-2/10",
            b"bytes 0-99999999999999999999999/1",
            b"bytes +1-2/10",
            b"bytes 1-2",
            b"",
            b"bytes */10",
            b"\xff\xfe",
        ] {
            assert_eq!(parse_content_range(bad), None, "{bad:?}");
        }
        assert_eq!(parse_content_range(&[b'1'; 300]), None);
        assert_eq!(parse_unsatisfied_range(b"bytes */4096"), Some(4096));
        assert_eq!(parse_unsatisfied_range(b"bytes 0-1/4096"), None);
    }

    #[test]
    fn version_conditions_and_hop_by_hop_headers_are_reserved() {
        for name in [
            "If-Match",
            "if-none-match",
            " Range ",
            "Transfer-Encoding",
            "HOST",
        ] {
            assert!(is_reserved_header(name), "{name}");
        }
        for name in ["X-Api-Key", "Authorization", "Cookie"] {
            assert!(!is_reserved_header(name), "{name}");
        }
    }

    #[test]
    fn a_range_ending_at_the_largest_offset_is_refused() {
        assert_eq!(parse_content_range(b"bytes 0-18446744073709551615/*"), None);
        let last = parse_content_range(b"bytes 0-18446744073709551614/*").unwrap();
        assert_eq!(last.len(), u64::MAX);
    }

    #[test]
    fn lengths_and_tags() {
        assert_eq!(parse_content_length(b"42"), Some(42));
        assert_eq!(parse_content_length(b"42, 42"), Some(42));
        assert_eq!(parse_content_length(b"42, 43"), None);
        assert_eq!(parse_content_length(b"-1"), None);
        assert_eq!(parse_content_length(b"18446744073709551616"), None);
        assert_eq!(parse_content_length(b""), None);
        assert_eq!(strong_etag(b"\"abc-123\""), Some("\"abc-123\""));
        assert_eq!(strong_etag(b"W/\"abc\""), None);
        assert_eq!(strong_etag(b"abc"), None);
        assert_eq!(strong_etag(b"\"a\"b\""), None);
    }

    #[test]
    fn s3_versions_name_the_etag_and_a_real_version_id() {
        assert_eq!(
            s3_object_version(Some("\"abc\""), None).as_deref(),
            Some("etag:\"abc\"")
        );
        assert_eq!(
            s3_object_version(Some("\"abc-2\""), Some("3HL4kqtJlcpXroDTDmJ+rmSpXd3dIbrHY"))
                .as_deref(),
            Some("etag:\"abc-2\" version-id:3HL4kqtJlcpXroDTDmJ+rmSpXd3dIbrHY")
        );
        // An unversioned bucket answers the id `null`.
        assert_eq!(
            s3_object_version(Some("\"abc\""), Some("null")).as_deref(),
            Some("etag:\"abc\"")
        );
        assert_eq!(
            s3_object_version(Some("\"abc\""), Some("a b\n")).as_deref(),
            Some("etag:\"abc\"")
        );
        assert_eq!(s3_object_version(Some("abc"), Some("v1")), None);
        assert_eq!(s3_object_version(None, Some("v1")), None);
        let long = format!("\"{}\"", "a".repeat(MAX_HEADER_VALUE));
        assert_eq!(s3_object_version(Some(&long), None), None);
    }
}
