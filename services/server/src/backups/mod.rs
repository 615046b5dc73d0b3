//! Backups in the job service: the repositories requests name ([`repository`]), the
//! wire form of what the backup library reports ([`results`]), the pages of
//! ListSnapshots ([`pages`]), the BackupService calls that read repositories
//! ([`api`]) and those that manage their keys ([`keys`]). Backup, restore, verify, prune and GC run as jobs (`jobs::backup`),
//! validated in `convert::backup`.

pub mod api;
mod keys;
pub mod pages;
pub mod repository;
pub mod results;
