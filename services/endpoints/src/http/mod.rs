//! HTTP(S) endpoint: disk images served by a web server or object store, read (never
//! written) with parallel ranged GETs, or with one streaming GET when the server does not
//! serve ranges.
//!
//! `http://host[:port]/path[?query]` and `https://...` name the object; credentials never
//! sit in the URL (a URL with `user:password@` is refused) and come from [`HttpOptions`]:
//! basic or bearer authentication, extra request headers, extra trusted CA certificates and
//! a client certificate. The query (often a presigned signature) is never printed.
//!
//! Opening asks HEAD for the size and the validators (ETag, Last-Modified), then a
//! `Range: bytes=0-0` GET decides whether ranges work. Every later request carries
//! `If-Match` (a strong ETag) or `If-Unmodified-Since`, so an object replaced during a copy
//! fails it with [`ErrorKind::Corrupt`](ferry_core::ErrorKind::Corrupt) instead of mixing
//! two versions. Transient failures (5xx, 429, 408, broken connections, timeouts) are
//! retried per request with capped exponential backoff and jitter; redirects are followed
//! (at most [`MAX_REDIRECTS`], never from https to http, credentials only to the original
//! origin), and followed again from the URL when the target they led to stops answering (an
//! expired presigned URL). A server that sends no validator (no ETag, or only a weak one,
//! and no Last-Modified) cannot be pinned: opening warns that a change would go unnoticed.

mod body;
mod client;
mod env;
mod error;
mod location;
mod options;
mod probe;
mod source;
mod stream;
mod tls;
mod validator;

pub use client::MAX_REDIRECTS;
pub use env::parse_headers;
pub use options::HttpOptions;
pub use source::{open_source, HttpSource};
pub use validator::Validator;
