//! [`HttpSource`]: ranged GETs into the engine's buffers by as many workers as the engine
//! runs, or one streaming GET read in order when the server does not serve ranges. A
//! server that neither serves ranges nor tells the size (a chunked answer without
//! Content-Length) gives a stream of unknown size: [`Source::size_known`] is false and the
//! body's end is the object's end ([`Source::read_some`] comes back short there).

use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::http_headers::{parse_content_length, parse_content_range};
use ferry_core::spec::HttpSpec;
use ferry_core::{
    backoff, BlockSizes, Caps, Error, ErrorKind, IoBuf, Result, Source, UNKNOWN_SIZE,
};
use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, CONTENT_RANGE};
use http::{Method, StatusCode};

use super::body::read_exact;
use super::client::{Ask, Client};
use super::error::{self, Attempt, Failure};
use super::location::Location;
use super::options::MAX_RETRY_DELAY;
use super::probe::{changed, probe, Probe};
use super::stream::Stream;
use super::validator::{change, unpinned_warning, Validator};
use super::HttpOptions;

/// Ranged GET size when the caller chose none (see docs/BENCHMARKS.md: against nginx on
/// loopback larger requests cost fewer round trips; 8 MiB as for S3).
const REQUEST_SIZE: u32 = 8 * 1024 * 1024;

/// Opens an `http://` or `https://` URL for reading.
pub async fn open_source(spec: &HttpSpec, options: &HttpOptions) -> Result<Arc<dyn Source>> {
    Ok(Arc::new(HttpSource::open(spec, options).await?))
}

/// An object read over HTTP(S). Every handle shares one client and its connection pool,
/// so [`Source::connect`] is free.
#[derive(Clone)]
pub struct HttpSource {
    inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub client: Client,
    /// Where requests go: the URL, or where its redirects lead (resolved again when a
    /// redirect target expires).
    pub location: Location,
    /// The URL as errors and logs show it (no query).
    pub shown: String,
    /// The object's size; [`UNKNOWN_SIZE`] when the server does not tell it.
    pub size: u64,
    /// The server told the size (Content-Length or Content-Range).
    pub size_known: bool,
    ranges: bool,
    pub validator: Option<Validator>,
    /// The server sent only a weak ETag (no validator then: see [`unpinned_warning`]).
    weak_etag: bool,
    /// The precondition that pins `validator`.
    pub conditions: Vec<(HeaderName, HeaderValue)>,
    attempts: u32,
    retry_base: std::time::Duration,
    stream: tokio::sync::Mutex<Stream>,
}

impl std::fmt::Debug for HttpSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpSource")
            .field("url", &self.inner.shown)
            .field("size", &self.inner.size)
            .field("size_known", &self.inner.size_known)
            .field("ranges", &self.inner.ranges)
            .field("validator", &self.inner.validator)
            .finish_non_exhaustive()
    }
}

impl Inner {
    /// Waits before attempt `attempt + 1`, or gives up with the last failure.
    async fn next_attempt(&self, attempt: &mut u32, failure: Failure, what: &str) -> Result<()> {
        *attempt += 1;
        if !failure.transient || *attempt >= self.attempts {
            let error = failure.error;
            if failure.transient && self.attempts > 1 {
                let message = format!(
                    "{} (gave up after {} attempts)",
                    error.message(),
                    self.attempts
                );
                return Err(Error::new(error.kind(), message));
            }
            return Err(error);
        }
        let delay = backoff::backoff_jittered(*attempt, self.retry_base, MAX_RETRY_DELAY);
        tracing::debug!(endpoint = %self.shown, attempt = *attempt, ?delay, error = %failure.error, "retrying HTTP {what}");
        tokio::time::sleep(delay).await;
        Ok(())
    }

    /// One ranged GET into `buf`.
    async fn fetch(&self, offset: u64, buf: &mut [u8]) -> Attempt<()> {
        let len = buf.len() as u64;
        let last = offset + len - 1;
        let ask = Ask {
            method: Method::GET,
            range: Some((offset, last)),
            conditions: &self.conditions,
        };
        let response = self.location.send(&self.client, &ask, &self.shown).await?;
        let status = response.status();
        if let Some(old) = &self.validator {
            if status == StatusCode::PRECONDITION_FAILED {
                return Err(changed(&self.shown, old, None));
            }
            if let Some(new) = old.contradicted_by(response.headers()) {
                return Err(changed(&self.shown, old, Some(&new)));
            }
        }
        match status {
            StatusCode::PARTIAL_CONTENT => {}
            StatusCode::OK => {
                return Err(Failure::fatal(Error::protocol(format!(
                    "asked for bytes {offset}-{last}, the server sent the whole object (it stopped serving ranges)"
                ))))
            }
            other => return Err(error::status(other, &self.shown)),
        }
        let headers = response.headers();
        let range = headers
            .get(CONTENT_RANGE)
            .and_then(|v| parse_content_range(v.as_bytes()));
        match range {
            Some(r)
                if r.start == offset && r.end == last && r.total.is_none_or(|t| t == self.size) => {
            }
            Some(r) => {
                return Err(Failure::fatal(Error::protocol(format!(
                    "asked for bytes {offset}-{last} of {}, the server answered bytes {}-{}/{}",
                    self.size,
                    r.start,
                    r.end,
                    r.total.map_or("*".to_string(), |t| t.to_string())
                ))))
            }
            None => {
                return Err(Failure::fatal(Error::protocol(format!(
                    "asked for bytes {offset}-{last}, the answer has no valid Content-Range"
                ))))
            }
        }
        if let Some(n) = headers
            .get(CONTENT_LENGTH)
            .map(|v| parse_content_length(v.as_bytes()))
        {
            if n != Some(len) {
                return Err(Failure::fatal(Error::protocol(format!(
                    "asked for {len} bytes, the server announced {}",
                    n.map_or("an invalid length".to_string(), |n| n.to_string())
                ))));
            }
        }
        let mut body = response.into_body();
        read_exact(&mut body, buf, self.client.read_timeout()).await
    }
}

impl HttpSource {
    /// Asks the server for the object's size and version; fails with NotFound,
    /// PermissionDenied, or a TLS error naming the host.
    pub async fn open(spec: &HttpSpec, options: &HttpOptions) -> Result<Self> {
        let shown = spec.redacted();
        let client = Client::new(&spec.url, options)
            .map_err(|e| e.with_operation("open").with_endpoint(shown.clone()))?;
        let mut inner = Inner {
            client,
            location: Location::new(spec.url.clone(), spec.url.clone()),
            shown: shown.clone(),
            size: 0,
            size_known: true,
            ranges: false,
            validator: None,
            weak_etag: false,
            conditions: Vec::new(),
            attempts: options.attempts(),
            retry_base: options.retry_base(),
            stream: tokio::sync::Mutex::new(Stream::default()),
        };
        let mut attempt = 0;
        let found: Probe = loop {
            match probe(&inner.client, &spec.url, &shown).await {
                Ok(p) => break p,
                Err(f) => inner
                    .next_attempt(&mut attempt, f, "open")
                    .await
                    .map_err(|e| e.with_operation("open").with_endpoint(shown.clone()))?,
            }
        };
        if let Some(expected) = &options.expect_version {
            let old = Validator::from_token(expected);
            if old.is_some() && old != found.validator {
                let old = old.unwrap_or(Validator::ETag(String::new()));
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!(
                        "the object at {shown} changed since the job started {}: start a new job to copy the new version",
                        change(&old, found.validator.as_ref())
                    ),
                )
                .with_operation("open")
                .with_endpoint(shown));
            }
        }
        inner.conditions = found
            .validator
            .iter()
            .filter_map(Validator::condition)
            .collect();
        inner.size = found.size.unwrap_or(UNKNOWN_SIZE);
        inner.size_known = found.size.is_some();
        inner.ranges = found.ranges;
        inner.validator = found.validator;
        inner.location = Location::new(spec.url.clone(), found.url);
        if inner.validator.is_none() {
            tracing::warn!("{}", unpinned_warning(&shown, found.weak_etag));
        }
        inner.weak_etag = found.weak_etag;
        tracing::debug!(endpoint = %shown, size = ?found.size, ranges = inner.ranges, validator = ?inner.validator, "opened HTTP source");
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// Whether the server serves ranges (parallel reads) or only whole-object streams.
    pub fn serves_ranges(&self) -> bool {
        self.inner.ranges
    }

    /// The version the source reads (see [`Validator`]).
    pub fn validator(&self) -> Option<&Validator> {
        self.inner.validator.as_ref()
    }

    /// Why a change of the object during the copy would go unnoticed, when the server
    /// gives nothing to pin its version with (logged as a warning when opening).
    pub fn version_warning(&self) -> Option<String> {
        self.inner
            .validator
            .is_none()
            .then(|| unpinned_warning(&self.inner.shown, self.inner.weak_etag))
    }
}

#[async_trait]
impl Source for HttpSource {
    fn describe(&self) -> String {
        self.inner.shown.clone()
    }

    fn size(&self) -> u64 {
        self.inner.size
    }

    fn size_known(&self) -> bool {
        self.inner.size_known
    }

    fn caps(&self) -> Caps {
        let ranges = self.inner.ranges;
        Caps {
            extents: false,
            efficient_zero: false,
            trim: false,
            random_write: false,
            rewrite: true,
            read_while_writing: true,
            multi_conn: ranges,
            sequential_read: !ranges,
            block: BlockSizes {
                minimum: 1,
                preferred: REQUEST_SIZE,
                maximum: 1024 * 1024 * 1024,
            },
            request_size: Some(REQUEST_SIZE),
            work_unit: None,
        }
    }

    async fn read_at(&self, offset: u64, mut buf: IoBuf) -> Result<IoBuf> {
        let inner = &*self.inner;
        let len = buf.len() as u64;
        if offset.checked_add(len).is_none_or(|end| end > inner.size) {
            return Err(Error::invalid_input(format!(
                "read of {len} bytes at {offset} is beyond the object's {} bytes",
                inner.size
            ))
            .at("read", offset)
            .with_endpoint(self.describe()));
        }
        if len == 0 {
            return Ok(buf);
        }
        let mut attempt = 0;
        loop {
            let result = if inner.ranges {
                inner.fetch(offset, &mut buf).await
            } else {
                let read = inner
                    .stream
                    .lock()
                    .await
                    .read(inner, offset, &mut buf)
                    .await;
                match read {
                    Ok(n) if n == buf.len() => Ok(()),
                    Ok(n) => Err(Failure::fatal(Error::invalid_input(format!(
                        "read of {len} bytes at {offset}: the object ends at byte {}",
                        offset + n as u64
                    )))),
                    Err(f) => Err(f),
                }
            };
            match result {
                Ok(()) => return Ok(buf),
                Err(f) => inner
                    .next_attempt(&mut attempt, f, "read")
                    .await
                    .map_err(|e| e.at("read", offset).with_endpoint(self.describe()))?,
            }
        }
    }

    async fn read_some(&self, offset: u64, mut buf: IoBuf) -> Result<IoBuf> {
        let inner = &*self.inner;
        let start = buf.view().start;
        if inner.size_known {
            let n = inner.size.saturating_sub(offset).min(buf.len() as u64) as usize;
            buf.set_view(start, n);
            if n == 0 {
                return Ok(buf);
            }
            return self.read_at(offset, buf).await;
        }
        let mut attempt = 0;
        loop {
            let read = inner
                .stream
                .lock()
                .await
                .read(inner, offset, &mut buf)
                .await;
            match read {
                Ok(n) => {
                    buf.set_view(start, n);
                    return Ok(buf);
                }
                Err(f) => inner
                    .next_attempt(&mut attempt, f, "read")
                    .await
                    .map_err(|e| e.at("read", offset).with_endpoint(self.describe()))?,
            }
        }
    }

    async fn connect(&self) -> Result<Arc<dyn Source>> {
        Ok(Arc::new(self.clone()))
    }

    fn version(&self) -> Option<String> {
        self.inner.validator.as_ref().map(Validator::token)
    }
}
