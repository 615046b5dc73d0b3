//! Reading an object front to back from one GET, for servers without range requests:
//! the engine reads such a source in order (`Caps::sequential_read`); a read ahead of the
//! stream skips bytes, a read behind it (a retry) starts the stream over. For an object
//! of unknown size the body's end is the object's end: a read there comes back short, and
//! reads at or past it come back empty without asking again.

use bytes::{Buf, Bytes};
use ferry_core::http_headers::parse_content_length;
use ferry_core::{Error, ErrorKind};
use http::header::CONTENT_LENGTH;
use http::{Method, StatusCode};
use hyper::body::Incoming;

use super::body::next_chunk;
use super::client::Ask;
use super::error::{self, Attempt, Failure};
use super::probe::changed;
use super::source::Inner;

/// The one open response body and where it stands.
#[derive(Default)]
pub(super) struct Stream {
    body: Option<Incoming>,
    /// Offset of the next byte of `leftover` (or of the body when it is empty).
    pos: u64,
    /// The part of the last chunk not read yet (at most one chunk).
    leftover: Bytes,
    /// Where the body of an object of unknown size ended (its size).
    end: Option<u64>,
}

impl Stream {
    /// Reads up to `buf.len()` bytes at `offset` and says how many: all of them, except
    /// at the end of an object of unknown size. On failure the stream is dropped, so the
    /// next attempt starts over.
    pub async fn read(&mut self, src: &Inner, offset: u64, buf: &mut [u8]) -> Attempt<usize> {
        if self.end.is_some_and(|end| offset >= end) {
            return Ok(0);
        }
        let result = self.read_inner(src, offset, buf).await;
        if result.is_err() {
            *self = Self::default();
        }
        result
    }

    async fn read_inner(&mut self, src: &Inner, offset: u64, buf: &mut [u8]) -> Attempt<usize> {
        if self.body.is_none() || offset < self.pos {
            self.start(src).await?;
        }
        let idle = src.client.read_timeout();
        let len = buf.len();
        while self.pos < offset {
            if !self.refill(src, idle, 0, len).await? {
                return Ok(0);
            }
            let n = (self.leftover.len() as u64).min(offset - self.pos) as usize;
            self.leftover.advance(n);
            self.pos += n as u64;
        }
        let mut filled = 0;
        while filled < len {
            if !self.refill(src, idle, filled, len).await? {
                break;
            }
            let n = self.leftover.len().min(len - filled);
            self.leftover.copy_to_slice(&mut buf[filled..filled + n]);
            filled += n;
            self.pos += n as u64;
        }
        Ok(filled)
    }

    /// Makes `leftover` non-empty; false at the end of the body of an object of unknown
    /// size (the end of an object of known size comes only after its last byte was read,
    /// so an earlier end is a lost connection, tried again).
    async fn refill(
        &mut self,
        src: &Inner,
        idle: std::time::Duration,
        done: usize,
        len: usize,
    ) -> Attempt<bool> {
        if !self.leftover.is_empty() {
            return Ok(true);
        }
        let body = self
            .body
            .as_mut()
            .ok_or_else(|| Failure::fatal(Error::internal("stream read without a body")))?;
        match next_chunk(body, idle, done, len).await? {
            Some(chunk) => {
                self.leftover = chunk;
                Ok(true)
            }
            None if !src.size_known => {
                self.body = None;
                self.end = Some(self.pos);
                Ok(false)
            }
            None => Err(Failure::transient(Error::new(
                ErrorKind::Disconnected,
                format!("the response body ended at byte {}", self.pos),
            ))),
        }
    }

    async fn start(&mut self, src: &Inner) -> Attempt<()> {
        *self = Self::default();
        let ask = Ask {
            method: Method::GET,
            range: None,
            conditions: &src.conditions,
        };
        let response = src.location.send(&src.client, &ask, &src.shown).await?;
        let status = response.status();
        if let Some(old) = &src.validator {
            if status == StatusCode::PRECONDITION_FAILED {
                return Err(changed(&src.shown, old, None));
            }
            if let Some(new) = old.contradicted_by(response.headers()) {
                return Err(changed(&src.shown, old, Some(&new)));
            }
        }
        if status != StatusCode::OK {
            return Err(error::status(status, &src.shown));
        }
        if let Some(n) = response
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| parse_content_length(v.as_bytes()))
            .filter(|_| src.size_known)
        {
            if n != src.size {
                return Err(Failure::fatal(Error::protocol(format!(
                    "the object had {} bytes when opened, the server now sends {n}",
                    src.size
                ))));
            }
        }
        self.body = Some(response.into_body());
        Ok(())
    }
}
