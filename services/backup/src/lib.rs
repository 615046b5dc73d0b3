//! ferry-backup: the deduplicating repository that ferry's backups of disk images are
//! stored in, on a directory (local or NFS) or in an S3 bucket. It knows nothing of
//! images or endpoints: the backup and restore code feeds it chunks and reads them back.
//!
//! # Using it
//! ```no_run
//! # async fn example(image: &[Vec<u8>], image_size: u64) -> ferry_core::Result<()> {
//! use ferry_backup::{FixedIndex, InitOptions, Repository, RepositoryUrl, SessionOptions, SnapshotInfo};
//! let url = RepositoryUrl::parse("s3://backups/vms")?;
//! let store = url.open(&Default::default()).await;
//! let repo = Repository::init(store, InitOptions::new()).await?; // or Repository::open
//! let session = repo.begin_session(SessionOptions::new()).await?;
//! let mut index = FixedIndex::new(image_size, repo.chunk_size())?;
//! for (i, chunk) in image.iter().enumerate() {
//!     // Chunk i covers index.chunk_range(i); several may be stored at once.
//!     let put = session.put_chunk(chunk).await?;
//!     index.set(i, put.digest)?;
//! }
//! let manifest = session.finish(&index, SnapshotInfo::new("nbd://host/vm1")).await?;
//! // Restore: load_manifest, load_index, then get_chunk for each non-zero digest.
//! let index = repo.load_index(&repo.load_manifest(&manifest.id).await?).await?;
//! # Ok(()) }
//! ```
//! An incremental backup passes the parent's digests of unchanged chunks to
//! [`Session::reuse_chunk`] instead of reading them.
//!
//! # Layout
//! ```text
//! config                      JSON: format version (3), repository id (random), chunk size,
//!                             zstd level (or null), encryption (null, or {"key_objects": "keys/"};
//!                             format 2: argon2id parameters, salt, wrapped master key, key check)
//! keys/<16 hex>               key objects: a passphrase's wrapping of the master keys (key_slot)
//! protected/<backup id>       the mark of a protected backup (protect)
//! pruned/<backup id>          an immutable repository's record of a pruned backup (immutable)
//! chunks/<2 hex>/<64 hex>     chunk blobs, named by digest
//! indexes/<backup id>         fixed index blob of one backup (header + N x 32-byte digests);
//!                             an all-zero digest marks a chunk of zeroes, never stored
//! snapshots/<backup id>.json  manifest, written LAST (chunks, then index, then manifest)
//! sessions/<backup id>.json   running backup sessions (start time, parent, heartbeat) for GC safety
//! locks/gc                    the GC lease (holder, start, expiry)
//! locks/gc-last               when the last GC ran, and its report
//! bad/<64 hex>                chunks verify found missing or damaged: stored again by the next backup
//! ```
//! - Chunks are fixed-size (a power of two from 64 KiB to 64 MiB, default 4 MiB, fixed per
//!   repository); the last chunk of an image may be short.
//! - A chunk's digest is SHA-256 of its plaintext, or HMAC-SHA256 under a key derived
//!   from the master key when the repository is encrypted, so names leak nothing. After
//!   a new master key (`key rotate --master`), new chunks are named and encrypted under
//!   it; older data is read with the older master keys (see [`Repository::rotate_key`]).
//! - Blobs (chunks and indexes, see below) carry a magic per kind (plain, zstd,
//!   encrypted, encrypted zstd), the plaintext length, then the payload; AES-256-GCM
//!   with a random 96-bit nonce per blob. Every chunk read is checked against its name.
//! - Manifests are JSON; in an encrypted repository the JSON is stored as an encrypted
//!   blob.
//! - Backup ids sort by time: `20261202T101500Z-0a1b2c3d`.
//!
//! # Blobs
//! `magic (8) | plaintext length (8, LE) | payload`; magics `FRYBLOBP`, `FRYBLOBZ`,
//! `FRYBLOBE`, `FRYBLOBX`; an encrypted payload is `nonce (12) | ciphertext | tag (16)`
//! with the header as associated data. Compression is kept only when it shrinks the data.
//!
//! # Operations
//! - [`Repository::prune`] with a [`KeepPolicy`] (restic's keep-last/hourly/daily/weekly/
//!   monthly/yearly/within semantics, per source; [`prune::plan`] is the pure part).
//! - [`Repository::gc`]: mark and sweep under a lease, with a grace period; [`gc`]
//!   explains why running backups are safe.
//! - [`Repository::verify`]: re-reads chunks and names the backups a bad chunk breaks.
//! - Keys: [`Repository::list_keys`], [`Repository::add_key`], [`Repository::remove_key`],
//!   [`Repository::rotate_key`]; protection: [`Repository::protect`] and
//!   [`Repository::unprotect`].
//! - Replication: [`sync`] copies the backups another repository lacks (only the chunks
//!   it lacks, each checked on the way, index and manifest last);
//!   [`Repository::init_from`] makes one that shares the keys, so chunks go as stored.
//! - Immutable repositories (S3 Object Lock, format 4): see [`Immutability`],
//!   [`undelete`] and [`hidden_backups`]; the reasoning is in `immutable.rs`.

mod blob;
mod config;
mod digest;
pub mod gc;
mod immutable;
mod index;
mod key_admin;
mod key_slot;
mod keys;
mod location;
mod manifest;
mod protect;
pub mod prune;
mod rate;
mod repository;
mod session;
pub mod store;
mod sync;
mod verify;

pub use config::{
    Config, DEFAULT_CHUNK_SIZE, DEFAULT_ZSTD_LEVEL, FORMAT_VERSION, IMMUTABLE_FORMAT_VERSION,
    MAX_CHUNK_SIZE, MIN_CHUNK_SIZE,
};
pub use digest::{block_digests, block_digests_known_zero, Digest};
pub use gc::{GcLease, GcOptions, GcReport, LeaseHeld};
pub use immutable::{hidden_backups, undelete, HiddenBackup, Immutability, UndeleteReport};
pub use index::{FixedIndex, MAX_INDEX_ENTRIES};
pub use key_admin::{KeyInfo, KeyRemoved, KeyRotated};
pub use keys::{EncryptionConfig, KdfParams, KeySlotsRef, SingleKey};
pub use location::RepositoryUrl;
pub use manifest::{BackupId, Manifest, SnapshotInfo};
pub use prune::{CalendarDuration, Keep, KeepPolicy, KeepReason, PrunePlan, PruneReport};
pub use rate::{FixedRate, RatePolicy};
pub use repository::{InitOptions, Repository};
pub use session::{ChunkOutcome, ChunkPut, Session, SessionOptions};
pub use store::{
    LocalStore, LockMode, ObjectMeta, ObjectStore, ObjectVersion, Put, PutMode, Retention, S3Store,
};
pub use sync::{sync, sync_with, CopyBeside, SyncObserver, SyncOptions, SyncReport};
pub use verify::{ChunkFault, ChunkProblem, VerifyOptions, VerifyReport};
