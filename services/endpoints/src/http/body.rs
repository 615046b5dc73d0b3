//! Reading response bodies into the engine's buffers: never more than asked is held, a
//! body that is longer or shorter than announced is an error, and a body that goes quiet
//! for longer than the read timeout is given up.

use std::time::Duration;

use bytes::{Buf, Bytes};
use ferry_core::{Error, ErrorKind};
use http_body_util::BodyExt;
use hyper::body::{Body, Incoming};

use super::error::{self, Attempt, Failure};

/// The next chunk of data, None at the end of the body.
pub(super) async fn next_chunk(
    body: &mut Incoming,
    idle: Duration,
    done: usize,
    len: usize,
) -> Attempt<Option<Bytes>> {
    loop {
        let frame = match tokio::time::timeout(idle, body.frame()).await {
            Err(_) => {
                return Err(Failure::transient(Error::new(
                    ErrorKind::Timeout,
                    format!("the response body stalled for {idle:?} after {done} of {len} bytes"),
                )))
            }
            Ok(None) => return Ok(None),
            Ok(Some(Err(e))) => return Err(error::body(e, done, len)),
            Ok(Some(Ok(frame))) => frame,
        };
        // Trailers carry no data: skip them.
        if let Ok(data) = frame.into_data() {
            if !data.is_empty() {
                return Ok(Some(data));
            }
        }
    }
}

/// Fills `buf` with the whole body, which must be exactly `buf.len()` bytes.
pub(super) async fn read_exact(body: &mut Incoming, buf: &mut [u8], idle: Duration) -> Attempt<()> {
    let len = buf.len();
    let mut filled = 0;
    while filled < len {
        let Some(mut chunk) = next_chunk(body, idle, filled, len).await? else {
            return Err(Failure::transient(Error::new(
                ErrorKind::Disconnected,
                format!("the response body ended after {filled} of {len} bytes"),
            )));
        };
        if chunk.len() > len - filled {
            return Err(Failure::fatal(Error::protocol(format!(
                "asked for {len} bytes, the server sent more"
            ))));
        }
        let n = chunk.len();
        chunk.copy_to_slice(&mut buf[filled..filled + n]);
        filled += n;
    }
    if !body.is_end_stream() && next_chunk(body, idle, filled, len).await?.is_some() {
        return Err(Failure::fatal(Error::protocol(format!(
            "asked for {len} bytes, the server sent more"
        ))));
    }
    Ok(())
}
