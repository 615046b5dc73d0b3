//! Opening an HTTP object: its size, its version and whether ranges work, from a HEAD
//! and a `Range: bytes=0-0` GET (or only the GET when HEAD is not allowed).

use ferry_core::http_headers::{
    parse_content_length, parse_content_range, parse_unsatisfied_range,
};
use ferry_core::{Error, ErrorKind};
use http::header::{ACCEPT_RANGES, CONTENT_LENGTH, CONTENT_RANGE, TRANSFER_ENCODING};
use http::{HeaderMap, Method, StatusCode};
use url::Url;

use super::client::{Ask, Client};
use super::error::{self, Attempt, Failure};
use super::validator::{change, is_weak_etag, Validator};

/// What opening learned.
#[derive(Debug, Clone)]
pub(super) struct Probe {
    /// None: the server does not tell it (a chunked answer without ranges); the object
    /// is then read as a stream whose size shows at its end.
    pub size: Option<u64>,
    /// Range requests work.
    pub ranges: bool,
    pub validator: Option<Validator>,
    /// The server sent an ETag, but only a weak one.
    pub weak_etag: bool,
    /// Where the object is after redirects: later requests go there directly.
    pub url: Url,
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(CONTENT_LENGTH)
        .and_then(|v| parse_content_length(v.as_bytes()))
}

/// What the HEAD request told.
struct Head {
    size: Option<u64>,
    validator: Option<Validator>,
    weak_etag: bool,
    /// The server said `Accept-Ranges: none`.
    no_ranges: bool,
    /// Where the object is after redirects.
    url: Url,
}

/// One probe attempt.
pub(super) async fn probe(client: &Client, url: &Url, shown: &str) -> Attempt<Probe> {
    let Head {
        size: head_size,
        mut validator,
        mut weak_etag,
        no_ranges,
        url,
    } = head(client, url, shown).await?;
    let conditions: Vec<_> = validator.iter().filter_map(Validator::condition).collect();
    let (response, url) = client
        .send(
            &url,
            &Ask {
                method: Method::GET,
                range: (!no_ranges).then_some((0, 0)),
                conditions: &conditions,
            },
        )
        .await?;
    let status = response.status();
    let headers = response.headers();
    if let Some(old) = &validator {
        check_unchanged(old, status, headers, shown)?;
    } else {
        validator = Validator::from_headers(headers);
        weak_etag |= is_weak_etag(headers);
    }
    let (size, ranges) = size_and_ranges(status, headers, head_size, shown)?;
    if size.is_none() && !framed(response.version(), headers) {
        return Err(Failure::fatal(Error::unsupported(
            "the server tells neither the object's size (no Content-Length) nor where its body \
             ends (not chunked): a cut connection could not be told from the end",
        )));
    }
    // The body (one byte, or the whole object without ranges) is dropped unread.
    drop(response);
    if let (Some(h), Some(size)) = (head_size, size) {
        if h != size {
            return Err(Failure::fatal(Error::protocol(format!(
                "HEAD says the object has {h} bytes, a GET says {size}"
            ))));
        }
    }
    Ok(Probe {
        size,
        ranges,
        validator,
        weak_etag,
        url,
    })
}

/// The HEAD request. A server that does not allow HEAD tells nothing here: the GET
/// tells everything.
async fn head(client: &Client, url: &Url, shown: &str) -> Attempt<Head> {
    let (response, url) = client
        .send(
            url,
            &Ask {
                method: Method::HEAD,
                range: None,
                conditions: &[],
            },
        )
        .await?;
    let status = response.status();
    if status.is_success() {
        let h = response.headers();
        Ok(Head {
            size: content_length(h),
            validator: Validator::from_headers(h),
            weak_etag: is_weak_etag(h),
            no_ranges: h
                .get(ACCEPT_RANGES)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"none")),
            url,
        })
    } else if matches!(status.as_u16(), 404 | 410 | 401 | 403 | 407)
        || status.is_server_error()
        || status == StatusCode::TOO_MANY_REQUESTS
    {
        Err(error::status(status, shown))
    } else {
        // HEAD not allowed (405, 501, ...).
        Ok(Head {
            size: None,
            validator: None,
            weak_etag: false,
            no_ranges: false,
            url,
        })
    }
}

/// Whether the body's end is marked (chunked HTTP/1.1, or HTTP/2 frames), so a body
/// whose length is not announced cannot end early unnoticed.
fn framed(version: http::Version, headers: &HeaderMap) -> bool {
    version >= http::Version::HTTP_2
        || headers.get_all(TRANSFER_ENCODING).iter().any(|v| {
            v.to_str().is_ok_and(|v| {
                v.split(',')
                    .any(|coding| coding.trim().eq_ignore_ascii_case("chunked"))
            })
        })
}

/// Fails if the GET's answer shows that the object changed since the HEAD.
fn check_unchanged(
    old: &Validator,
    status: StatusCode,
    headers: &HeaderMap,
    shown: &str,
) -> Attempt<()> {
    if status == StatusCode::PRECONDITION_FAILED {
        return Err(changed(shown, old, None));
    }
    if let Some(new) = old.contradicted_by(headers) {
        return Err(changed(shown, old, Some(&new)));
    }
    Ok(())
}

/// The object's size and whether ranges work, from the answer to the `bytes=0-0` GET
/// (`head_size`: what the HEAD said).
fn size_and_ranges(
    status: StatusCode,
    headers: &HeaderMap,
    head_size: Option<u64>,
    shown: &str,
) -> Attempt<(Option<u64>, bool)> {
    match status {
        StatusCode::PARTIAL_CONTENT => {
            let range = headers
                .get(CONTENT_RANGE)
                .and_then(|v| parse_content_range(v.as_bytes()))
                .filter(|r| r.start == 0 && r.end == 0);
            let Some(total) = range.and_then(|r| r.total) else {
                return Err(Failure::fatal(Error::protocol(
                    "the answer to a range request has no valid Content-Range for bytes 0-0 with the object's size",
                )));
            };
            Ok((Some(total), true))
        }
        StatusCode::RANGE_NOT_SATISFIABLE => {
            // An empty object: no byte 0 to send.
            let total = headers
                .get(CONTENT_RANGE)
                .and_then(|v| parse_unsatisfied_range(v.as_bytes()))
                .or(head_size);
            match total {
                Some(0) => Ok((Some(0), true)),
                _ => Err(Failure::fatal(Error::protocol(
                    "the server refused the range bytes=0-0 of a non-empty object",
                ))),
            }
        }
        // Without a Content-Length (a chunked answer) the size shows at the body's end.
        StatusCode::OK => Ok((content_length(headers).or(head_size), false)),
        other => Err(error::status(other, shown)),
    }
}

/// The object changed: always final.
pub(super) fn changed(shown: &str, old: &Validator, new: Option<&Validator>) -> Failure {
    Failure::fatal(Error::new(
        ErrorKind::Corrupt,
        format!(
            "the object at {shown} changed during the copy {}",
            change(old, new)
        ),
    ))
}
