//! Plain SHA-256 of the image stream, for users who must match `sha256sum`.
//!
//! SHA-256 is sequential, so the only parallelism left is reading ahead: chunks arrive
//! here in order while later reads are still running, and each is hashed on a blocking
//! thread so the async workers stay free to drive those reads.

use ferry_blkhash::{Hash, ZERO_PAGE};
use ferry_core::{Error, IoBuf, Result};
use sha2::{Digest as _, Sha256};
use tokio::sync::mpsc;

use crate::pool::BufPool;

/// Hashes chunks in the order received: `(len, Some(buf))` holds the chunk's bytes,
/// `(len, None)` stands for `len` zero bytes. Buffers go back to `pool`.
pub(crate) async fn hash_in_order(
    mut chunks: mpsc::Receiver<(usize, Option<IoBuf>)>,
    pool: &BufPool,
) -> Result<Hash> {
    let mut hasher = Sha256::new();
    while let Some((len, buf)) = chunks.recv().await {
        let (h, buf) = tokio::task::spawn_blocking(move || {
            let mut hasher = hasher;
            match &buf {
                Some(buf) => hasher.update(&buf[..]),
                None => {
                    let mut left = len;
                    while left > 0 {
                        let n = left.min(ZERO_PAGE.len());
                        hasher.update(&ZERO_PAGE[..n]);
                        left -= n;
                    }
                }
            }
            (hasher, buf)
        })
        .await
        .map_err(|_| Error::internal("a hashing thread panicked"))?;
        hasher = h;
        if let Some(buf) = buf {
            pool.put(buf);
        }
    }
    Ok(hasher.finalize().into())
}
