//! ferry-image-backup: backups of disk images into a deduplicating repository
//! ([`ferry_backup`]), and restores out of it.
//!
//! [`backup`] reads any [`Source`](ferry_core::Source) (file, block device, NBD, NFS,
//! iSCSI, S3, HTTP, qcow2, compressed) chunk by chunk with parallel workers, asks the
//! source for extents lazily so that all-zero chunks are never read, stores the chunks
//! the repository does not have yet, and computes the image's blksum-compatible block
//! hash from what it read. With a parent backup and a dirty bitmap
//! ([`ChangedRanges`]), only the chunks the bitmap marks dirty are read at all; clean
//! chunks take the parent's chunk and block digests. [`restore`] copies a backup, read as
//! a [`Source`](ferry_core::Source) of its image, into any [`Target`](ferry_core::Target)
//! with the engine's copy, and checks the block hash of what it read against the
//! manifest's before the target is finished. [`BackupImage`] is a backup's image for any
//! other reader (the NBD export of `ferry backup serve`): chunks fetched on demand into a
//! bounded [`ChunkCache`], read-ahead for sequential readers, zero chunks as zero extents.
//!
//! Each backup stores, besides the repository's index and manifest, the 64 KiB block
//! digests of its data chunks ([`blocks`]): they are what lets an incremental backup
//! produce the whole image's block hash without reading unchanged chunks; and their
//! change digests ([`change`]), which let it tell an unchanged chunk it reads without
//! hashing it with SHA-256.
//!
//! Memory: a backup holds one chunk buffer per worker (workers x chunk size; 8 x 4 MiB
//! by default), plus while a chunk is stored one encoded copy of it, plus the index and
//! the block digests (32 bytes per chunk, and 32 bytes per 64 KiB of data: 0.05 % of the
//! image's data). A restore holds per worker two blobs fetched ahead, the blob it opens
//! and its plaintext (about 4 x chunk size), plus the index. A served backup holds its
//! cache's bound of decoded chunks (128 MiB by default), plus the chunks being fetched
//! (the read-ahead window, 8 chunks by default, and the clients' requests in flight).

#![forbid(unsafe_code)]

mod backup;
pub mod blocks;
pub mod change;
mod changed;
mod chunk_cache;
mod hash;
mod known;
mod maintenance;
mod parent;
mod replicate;
mod restore;
mod served;
mod snapshot;
mod snapshot_metadata;

pub use backup::{backup, BackupOptions, BackupReport, DEFAULT_WORKERS};
pub use changed::{ChangedRanges, NbdDirtyBitmap};
pub use chunk_cache::{CacheStats, CachedChunk, ChunkCache, DEFAULT_CACHE_BYTES};
pub use ferry_snapshot_metadata::SecurityToken;
pub use known::{AllocatedOnly, KnownChanges};
pub use maintenance::{gc, prune, prune_source};
pub use parent::{latest_backup, parent_manifest, ParentChoice};
pub use replicate::sync;
pub use restore::{restore, RestoreOptions, RestoreOrder, RestoreReport};
pub use served::{BackupImage, DEFAULT_READ_AHEAD};
pub use snapshot_metadata::{
    changed_block_tracking, plan_with_snapshot_metadata, with_reason, MetadataPlan, MetadataRequest,
};
