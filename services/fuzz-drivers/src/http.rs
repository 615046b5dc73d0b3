//! The HTTP fuzz target: `http_headers` drives the parsers of the response header values
//! an HTTP source trusts for sizes and ranges (`ferry_core::http_headers`), and checks
//! what they accept is consistent (a range inside its total, a length that fits).

use ferry_core::http_headers::{
    parse_content_length, parse_content_range, parse_unsatisfied_range, strong_etag,
};

/// Every header parser on arbitrary bytes; the first byte picks one.
pub fn http_headers(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % 4 {
        0 => {
            if let Some(r) = parse_content_range(rest) {
                assert!(r.start <= r.end, "{r:?}");
                assert!(r.total.is_none_or(|t| r.end < t), "{r:?}");
            }
        }
        1 => {
            let _ = parse_unsatisfied_range(rest);
        }
        2 => {
            let _ = parse_content_length(rest);
        }
        _ => {
            if let Some(tag) = strong_etag(rest) {
                assert!(tag.starts_with('"') && tag.ends_with('"') && tag.len() >= 2);
            }
        }
    }
}
