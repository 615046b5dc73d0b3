//! Turning AWS SDK errors into ferry errors: a kind that decides retries and a message that
//! names the bucket or key and says what to do. No SDK error is attached as a source and no
//! request is printed, so credentials can never reach a log through an error.

use std::error::Error as StdError;

use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use ferry_core::{Error, ErrorKind};

/// What a failed request was about, for the message.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Subject<'a> {
    pub bucket: &'a str,
    /// Empty for bucket-level requests.
    pub key: &'a str,
}

impl Subject<'_> {
    fn object(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.key)
    }
}

const CREDENTIAL_CODES: &[&str] = &[
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "InvalidClientTokenId",
];

const BUSY_CODES: &[&str] = &[
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottled",
    "RequestThrottledException",
    "TooManyRequests",
    "TooManyRequestsException",
    "RequestLimitExceeded",
    "ProvisionedThroughputExceededException",
    "BandwidthLimitExceeded",
    "ServiceUnavailable",
    "InternalError",
    "RequestTimeout",
    "RequestTimeoutException",
];

/// Classifies a failed SDK call.
pub(crate) fn from_sdk<E>(err: SdkError<E, HttpResponse>, subject: Subject<'_>) -> Error
where
    E: ProvideErrorMetadata + StdError + Send + Sync + 'static,
{
    match &err {
        SdkError::ConstructionFailure(_) => {
            let detail = DisplayErrorContext(&err).to_string();
            if mentions_credentials(&detail) {
                no_credentials(subject)
            } else {
                Error::invalid_input(format!(
                    "cannot build the S3 request for bucket '{}': {}",
                    subject.bucket,
                    trim(&detail)
                ))
            }
        }
        SdkError::TimeoutError(_) => Error::new(
            ErrorKind::Timeout,
            format!("the S3 request for {} timed out", subject.object()),
        ),
        SdkError::DispatchFailure(failure) => {
            let detail = DisplayErrorContext(&err).to_string();
            let kind = if failure.is_timeout() {
                ErrorKind::Timeout
            } else if failure.is_io() {
                ErrorKind::Disconnected
            } else if mentions_credentials(&detail) {
                return no_credentials(subject);
            } else if failure.is_user() {
                ErrorKind::InvalidInput
            } else {
                ErrorKind::Disconnected
            };
            Error::new(
                kind,
                format!(
                    "cannot reach the S3 endpoint for bucket '{}': {}",
                    subject.bucket,
                    trim(&detail)
                ),
            )
        }
        SdkError::ResponseError(_) => Error::new(
            ErrorKind::Disconnected,
            format!(
                "the S3 response for {} was cut off or malformed: {}",
                subject.object(),
                trim(&DisplayErrorContext(&err).to_string())
            ),
        ),
        SdkError::ServiceError(service) => {
            let status = service.raw().status().as_u16();
            from_service(status, err.code(), err.message(), subject)
        }
        _ => Error::new(
            ErrorKind::Io,
            format!(
                "S3 request for {} failed: {}",
                subject.object(),
                trim(&DisplayErrorContext(&err).to_string())
            ),
        ),
    }
}

/// Classifies an error response from the store by HTTP status and S3 error code.
///
/// The rules apply in order of precedence (a specific S3 code before the bare HTTP status
/// it comes with), each rule one error a user can act on: first what does not exist, then
/// what the store refused for who or where the request came from, then the rest.
pub(crate) fn from_service(
    status: u16,
    code: Option<&str>,
    message: Option<&str>,
    subject: Subject<'_>,
) -> Error {
    let said = said(status, code, message);
    not_found(status, code, subject, &said)
        .or_else(|| refused(status, code, subject, &said))
        .unwrap_or_else(|| failed(status, code, subject, &said))
}

/// What the store said, for the end of a message: ` (code: message)`, or the HTTP status
/// when it said nothing.
fn said(status: u16, code: Option<&str>, message: Option<&str>) -> String {
    match (code, message) {
        (Some(c), Some(m)) if !m.is_empty() => format!(" ({c}: {})", trim(m)),
        (Some(c), _) => format!(" ({c})"),
        (None, Some(m)) if !m.is_empty() => format!(" ({})", trim(m)),
        _ => format!(" (HTTP {status})"),
    }
}

/// A missing bucket, object or multipart upload.
fn not_found(status: u16, code: Option<&str>, subject: Subject<'_>, said: &str) -> Option<Error> {
    let code_str = code.unwrap_or("");
    let bucket = subject.bucket;
    if code_str == "NoSuchBucket" || (status == 404 && subject.key.is_empty()) {
        return Some(Error::new(
            ErrorKind::NotFound,
            format!("bucket '{bucket}' does not exist{said}"),
        ));
    }
    // HEAD answers have no body: the SDK reports a bare 404 as code "NotFound".
    if code_str == "NoSuchKey" || (status == 404 && matches!(code, None | Some("NotFound"))) {
        return Some(Error::new(
            ErrorKind::NotFound,
            format!(
                "object '{}' not found in bucket '{bucket}'{said}",
                subject.key
            ),
        ));
    }
    if code_str == "NoSuchUpload" {
        return Some(Error::new(
            ErrorKind::NotFound,
            format!(
                "the multipart upload of {} no longer exists: it was aborted or expired{said}",
                subject.object()
            ),
        ));
    }
    None
}

/// A request the store refused for its credentials, region, clock or permissions.
fn refused(status: u16, code: Option<&str>, subject: Subject<'_>, said: &str) -> Option<Error> {
    let code_str = code.unwrap_or("");
    let bucket = subject.bucket;
    if CREDENTIAL_CODES.contains(&code_str) || status == 401 {
        return Some(Error::new(
            ErrorKind::PermissionDenied,
            format!(
                "the S3 store rejected the credentials for bucket '{bucket}'{said}: check the access key id, \
                 secret key and session token (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE, \
                 or the job's S3 credentials)"
            ),
        ));
    }
    if code_str == "AuthorizationHeaderMalformed"
        || code_str == "PermanentRedirect"
        || status == 301
    {
        return Some(Error::invalid_input(format!(
            "bucket '{bucket}' is in another region or behind another endpoint{said}: \
             set AWS_REGION or the job's S3 region (and endpoint URL)"
        )));
    }
    if code_str == "RequestTimeTooSkewed" {
        return Some(Error::new(
            ErrorKind::PermissionDenied,
            format!("the S3 store rejected the request for bucket '{bucket}'{said}: this machine's clock is wrong"),
        ));
    }
    if status == 403 {
        return Some(Error::new(
            ErrorKind::PermissionDenied,
            format!(
                "access to {} was denied{said}: check the credentials (AWS_ACCESS_KEY_ID, \
                 AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or the job's S3 credentials) and the bucket policy",
                if subject.key.is_empty() {
                    format!("bucket '{bucket}'")
                } else {
                    format!("{} in bucket '{bucket}'", subject.key)
                }
            ),
        ));
    }
    None
}

/// Any other failure: a changed object, a busy store, a refused size or range, or
/// whatever else the status says.
fn failed(status: u16, code: Option<&str>, subject: Subject<'_>, said: &str) -> Error {
    let code_str = code.unwrap_or("");
    if status == 412 || code_str == "PreconditionFailed" {
        return Error::new(
            ErrorKind::Corrupt,
            format!(
                "{} changed while it was being read{said}: start the copy again",
                subject.object()
            ),
        );
    }
    if BUSY_CODES.contains(&code_str) || status == 429 || status >= 500 {
        return Error::new(
            ErrorKind::Disconnected,
            format!(
                "the S3 store is busy or failing for {}{said}; retrying later may succeed",
                subject.object()
            ),
        );
    }
    if code_str == "EntityTooLarge" || code_str == "EntityTooSmall" || code_str == "InvalidRange" {
        return Error::invalid_input(format!("the S3 store refused {}{said}", subject.object()));
    }
    Error::new(
        if (400..500).contains(&status) {
            ErrorKind::InvalidInput
        } else {
            ErrorKind::Io
        },
        format!("S3 request for {} failed{said}", subject.object()),
    )
}

fn no_credentials(subject: Subject<'_>) -> Error {
    Error::new(
        ErrorKind::PermissionDenied,
        format!(
            "no usable S3 credentials for bucket '{}': set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, \
             AWS_PROFILE, a web identity token, or the job's S3 credentials",
            subject.bucket
        ),
    )
}

fn mentions_credentials(detail: &str) -> bool {
    let lower = detail.to_ascii_lowercase();
    lower.contains("credential") || lower.contains("identity")
}

/// Server and SDK messages are shown to users: keep them to one reasonable line.
fn trim(text: &str) -> String {
    const MAX: usize = 300;
    let line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.len() <= MAX {
        return line;
    }
    let mut end = MAX;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &line[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    const OBJ: Subject<'static> = Subject {
        bucket: "b",
        key: "k.img",
    };

    #[test]
    fn kinds_by_code_and_status() {
        let e = from_service(404, Some("NoSuchBucket"), None, OBJ);
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert!(e.to_string().contains("bucket 'b' does not exist"), "{e}");
        let e = from_service(404, Some("NotFound"), None, OBJ);
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert!(
            e.to_string().contains("'k.img' not found in bucket 'b'"),
            "{e}"
        );
        let e = from_service(
            404,
            None,
            None,
            Subject {
                bucket: "b",
                key: "",
            },
        );
        assert!(e.to_string().contains("bucket 'b' does not exist"), "{e}");
        let e = from_service(403, Some("SignatureDoesNotMatch"), Some("sig"), OBJ);
        assert_eq!(e.kind(), ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("check the access key id"), "{e}");
        assert_eq!(
            from_service(403, None, None, OBJ).kind(),
            ErrorKind::PermissionDenied
        );
        for (status, code) in [
            (503, Some("SlowDown")),
            (500, None),
            (429, None),
            (400, Some("RequestTimeout")),
        ] {
            let e = from_service(status, code, None, OBJ);
            assert!(e.kind().is_transient(), "{status} {code:?}: {e}");
        }
        assert_eq!(
            from_service(412, None, None, OBJ).kind(),
            ErrorKind::Corrupt
        );
        assert_eq!(
            from_service(400, Some("AuthorizationHeaderMalformed"), None, OBJ).kind(),
            ErrorKind::InvalidInput
        );
    }

    #[test]
    fn long_messages_are_cut() {
        let long = "x ".repeat(1000);
        let e = from_service(400, Some("Weird"), Some(&long), OBJ);
        assert!(e.to_string().len() < 500, "{}", e.to_string().len());
    }
}
