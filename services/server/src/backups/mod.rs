//! Backups in the job service: the repositories requests name ([`repository`]), the
//! wire form of what the backup library reports ([`results`]), the pages of
//! ListSnapshots ([`pages`]) and the BackupService calls that read repositories
//! ([`api`]). Backup, restore, verify, prune and GC run as jobs (`jobs::backup`),
//! validated in `convert::backup`.

pub mod api;
pub mod pages;
pub mod repository;
pub mod results;
