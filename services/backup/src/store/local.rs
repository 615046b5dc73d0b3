//! [`LocalStore`]: a repository in a directory, on a local file system or an NFS mount.
//!
//! Every write goes to a temporary file in the object's directory, is flushed to disk,
//! and is then renamed (or hard-linked, for create-only writes) to its final name, and
//! the directory is flushed too: after a crash an object is either whole or absent.
//! Temporary files start with `.tmp-` and are never listed.
//!
//! A backup's chunks are written with [`ObjectStore::put_batched`]: each file is flushed
//! before it is renamed into place, but its directory is not: [`ObjectStore::persist`]
//! flushes the whole file system (`syncfs`, as Proxmox Backup Server does by default)
//! before the index that names the chunks is written. A chunk is never visible with
//! partial content; a crash before `persist` may lose a chunk's name, which nothing
//! refers to yet. `syncfs` rather than the directories this process wrote: a backup
//! also relies on chunks that another backup running beside it renamed into place.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind as IoKind, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;
use ferry_core::{Error, ErrorKind, Result};
use sha2::{Digest as _, Sha256};

use super::{check_name, too_large, whole_seconds, ObjectMeta, ObjectStore, Put, PutMode, Version};

const TEMP_PREFIX: &str = ".tmp-";

/// A repository directory.
#[derive(Debug, Clone)]
pub struct LocalStore {
    root: Arc<PathBuf>,
}

impl LocalStore {
    /// A store rooted at `root`. Nothing is touched until the first operation; missing
    /// directories are created by writes.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: Arc::new(root.into()),
        }
    }

    /// The directory holding the repository.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The file that holds object `name`.
    pub fn path_of(&self, name: &str) -> Result<PathBuf> {
        check_name(name)?;
        Ok(self.root.join(name))
    }

    async fn blocking<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Path) -> Result<T> + Send + 'static,
    {
        let root = Arc::clone(&self.root);
        tokio::task::spawn_blocking(move || f(&root))
            .await
            .map_err(|e| Error::internal(format!("a file system task failed: {e}")))?
    }
}

fn io_err(what: String, err: std::io::Error) -> Error {
    Error::io(what, err)
}

fn content_version(data: &[u8]) -> Version {
    Version(hex::encode(Sha256::digest(data)))
}

fn random_suffix() -> String {
    let mut b = [0u8; 8];
    // A failed random source still gives a unique enough name with the pid and time.
    let _ = getrandom::fill(&mut b);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{}-{}-{nanos}", std::process::id(), hex::encode(b))
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err(format!("cannot flush directory {}", dir.display()), e))
}

/// Flushes the whole file system that holds `root`.
fn sync_file_system(root: &Path) -> Result<()> {
    let dir = File::open(root)
        .map_err(|e| io_err(format!("cannot open directory {}", root.display()), e))?;
    // SAFETY: syncfs only reads the descriptor, which `dir` keeps open for the call.
    if unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&dir)) } != 0 {
        return Err(io_err(
            format!("cannot flush the file system of {}", root.display()),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Creates `dir` and its missing parents, flushing each parent that got a new entry, so
/// that an object's directory survives a crash as surely as the object.
fn make_dir(dir: &Path) -> Result<()> {
    // A relative path's last parent is the empty path: the current directory.
    if dir.as_os_str().is_empty() || dir.is_dir() {
        return Ok(());
    }
    let parent = dir.parent().map(|p| {
        if p.as_os_str().is_empty() {
            Path::new(".")
        } else {
            p
        }
    });
    if let Some(parent) = parent {
        make_dir(parent)?;
    }
    match fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == IoKind::AlreadyExists => return Ok(()),
        Err(e) => {
            return Err(io_err(
                format!("cannot create directory {}", dir.display()),
                e,
            ))
        }
    }
    match parent {
        Some(parent) => sync_dir(parent),
        None => Ok(()),
    }
}

/// Writes `data` to a new temporary file beside `path` and flushes it.
fn write_temp(path: &Path, data: &[u8]) -> Result<PathBuf> {
    let dir = path
        .parent()
        .ok_or_else(|| Error::internal("an object path has no directory"))?;
    make_dir(dir)?;
    let temp = dir.join(format!("{TEMP_PREFIX}{}", random_suffix()));
    let result = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&temp)
        .and_then(|mut f| {
            f.write_all(data)?;
            f.sync_all()
        });
    match result {
        Ok(()) => Ok(temp),
        Err(e) => {
            let _ = fs::remove_file(&temp);
            Err(io_err(format!("cannot write {}", temp.display()), e))
        }
    }
}

fn read_bounded(
    path: &Path,
    name: &str,
    location: &str,
    max_len: u64,
    mut data: Vec<u8>,
) -> Result<Option<Vec<u8>>> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == IoKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(format!("cannot open {}", path.display()), e)),
    };
    let size = file
        .metadata()
        .map_err(|e| io_err(format!("cannot stat {}", path.display()), e))?
        .len();
    if size > max_len {
        return Err(too_large(location, name, size, max_len));
    }
    data.clear();
    data.reserve(size as usize);
    file.take(max_len.saturating_add(1))
        .read_to_end(&mut data)
        .map_err(|e| io_err(format!("cannot read {}", path.display()), e))?;
    if data.len() as u64 > max_len {
        return Err(too_large(location, name, data.len() as u64, max_len));
    }
    Ok(Some(data))
}

fn meta_of(name: String, meta: &fs::Metadata) -> ObjectMeta {
    ObjectMeta {
        name,
        size: meta.len(),
        modified: whole_seconds(meta.modified().unwrap_or(SystemTime::UNIX_EPOCH)),
        retain_until: None,
    }
}

fn put_blocking(path: &Path, data: &[u8], mode: PutMode) -> Result<Put> {
    let dir = path
        .parent()
        .ok_or_else(|| Error::internal("an object path has no directory"))?
        .to_path_buf();
    let temp = write_temp(path, data)?;
    let outcome = match mode {
        PutMode::Overwrite => fs::rename(&temp, path)
            .map(|()| Put::Written)
            .map_err(|e| io_err(format!("cannot rename into {}", path.display()), e)),
        PutMode::CreateOnly => match fs::hard_link(&temp, path) {
            Ok(()) => Ok(Put::Written),
            Err(e) if e.kind() == IoKind::AlreadyExists => Ok(Put::Conflict),
            Err(e) => Err(io_err(format!("cannot create {}", path.display()), e)),
        },
        PutMode::ReplaceIf(expected) => replace_if(path, &dir, &temp, &expected),
    };
    let _ = fs::remove_file(&temp);
    let outcome = outcome?;
    if outcome == Put::Written {
        sync_dir(&dir)?;
    }
    Ok(outcome)
}

/// Compare-and-swap with renames: move the current object aside (only one contender can
/// move a given file), check it is the expected one, then link the new one in place
/// (create-only, so an object created meanwhile by someone else wins).
fn replace_if(path: &Path, dir: &Path, temp: &Path, expected: &Version) -> Result<Put> {
    let aside = dir.join(format!("{TEMP_PREFIX}{}-old", random_suffix()));
    match fs::rename(path, &aside) {
        Ok(()) => {}
        Err(e) if e.kind() == IoKind::NotFound => return Ok(Put::Conflict),
        Err(e) => return Err(io_err(format!("cannot replace {}", path.display()), e)),
    }
    let current =
        fs::read(&aside).map_err(|e| io_err(format!("cannot read {}", aside.display()), e));
    let matches = matches!(&current, Ok(data) if content_version(data) == *expected);
    let target = if matches { temp } else { aside.as_path() };
    let linked = match fs::hard_link(target, path) {
        Ok(()) => Ok(matches),
        Err(e) if e.kind() == IoKind::AlreadyExists => Ok(false),
        Err(e) => Err(io_err(format!("cannot link {}", path.display()), e)),
    };
    let _ = fs::remove_file(&aside);
    current?;
    Ok(if linked? { Put::Written } else { Put::Conflict })
}

fn list_blocking(root: &Path, prefix: &str) -> Result<Vec<ObjectMeta>> {
    let dir_part = match prefix.rfind('/') {
        Some(i) => &prefix[..i],
        None => "",
    };
    let start = if dir_part.is_empty() {
        root.to_path_buf()
    } else {
        root.join(dir_part)
    };
    let mut out = Vec::new();
    let mut pending = vec![(start, dir_part.to_string())];
    while let Some((dir, rel)) = pending.pop() {
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == IoKind::NotFound => continue,
            Err(e) => return Err(io_err(format!("cannot list {}", dir.display()), e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| io_err(format!("cannot list {}", dir.display()), e))?;
            let file_name = entry.file_name();
            let Some(file_name) = file_name.to_str() else {
                continue;
            };
            if file_name.starts_with(TEMP_PREFIX) {
                continue;
            }
            let name = if rel.is_empty() {
                file_name.to_string()
            } else {
                format!("{rel}/{file_name}")
            };
            // Directories are walked when they can hold names with the prefix.
            let file_type = entry
                .file_type()
                .map_err(|e| io_err(format!("cannot stat {}", entry.path().display()), e))?;
            if file_type.is_dir() {
                let as_dir = format!("{name}/");
                if as_dir.starts_with(prefix) || prefix.starts_with(&as_dir) {
                    pending.push((entry.path(), name));
                }
            } else if file_type.is_file() && name.starts_with(prefix) {
                match entry.metadata() {
                    Ok(meta) => out.push(meta_of(name, &meta)),
                    Err(e) if e.kind() == IoKind::NotFound => {}
                    Err(e) => {
                        return Err(io_err(format!("cannot stat {}", entry.path().display()), e))
                    }
                }
            }
        }
    }
    Ok(out)
}

#[async_trait]
impl ObjectStore for LocalStore {
    fn location(&self) -> String {
        self.root.display().to_string()
    }

    async fn put(&self, name: &str, data: Bytes, mode: PutMode) -> Result<Put> {
        let path = self.path_of(name)?;
        self.blocking(move |_| put_blocking(&path, &data, mode))
            .await
    }

    async fn put_batched(&self, name: &str, data: Bytes) -> Result<()> {
        let path = self.path_of(name)?;
        self.blocking(move |_| {
            let temp = write_temp(&path, &data)?;
            fs::rename(&temp, &path).map_err(|e| {
                let _ = fs::remove_file(&temp);
                io_err(format!("cannot rename into {}", path.display()), e)
            })
        })
        .await
    }

    async fn persist(&self) -> Result<()> {
        self.blocking(sync_file_system).await
    }

    async fn get_into(&self, name: &str, max_len: u64, buf: Vec<u8>) -> Result<Option<Vec<u8>>> {
        let path = self.path_of(name)?;
        let (name, location) = (name.to_string(), self.location());
        self.blocking(move |_| read_bounded(&path, &name, &location, max_len, buf))
            .await
    }

    async fn get_versioned(&self, name: &str, max_len: u64) -> Result<Option<(Vec<u8>, Version)>> {
        Ok(self.get(name, max_len).await?.map(|data| {
            let version = content_version(&data);
            (data, version)
        }))
    }

    async fn head(&self, name: &str) -> Result<Option<ObjectMeta>> {
        let path = self.path_of(name)?;
        let name = name.to_string();
        self.blocking(move |_| match fs::metadata(&path) {
            Ok(meta) if meta.is_file() => Ok(Some(meta_of(name, &meta))),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == IoKind::NotFound => Ok(None),
            Err(e) => Err(io_err(format!("cannot stat {}", path.display()), e)),
        })
        .await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>> {
        let prefix = prefix.to_string();
        self.blocking(move |root| list_blocking(root, &prefix))
            .await
    }

    async fn delete(&self, name: &str) -> Result<()> {
        let path = self.path_of(name)?;
        self.blocking(move |_| match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == IoKind::NotFound => Ok(()),
            Err(e) => Err(io_err(format!("cannot delete {}", path.display()), e)),
        })
        .await
    }

    async fn touch(&self, name: &str) -> Result<()> {
        let path = self.path_of(name)?;
        let name = name.to_string();
        let location = self.location();
        self.blocking(move |_| {
            let file = OpenOptions::new().write(true).open(&path).map_err(|e| {
                if e.kind() == IoKind::NotFound {
                    Error::new(
                        ErrorKind::NotFound,
                        format!("{name} is missing from {location}"),
                    )
                } else {
                    io_err(format!("cannot open {}", path.display()), e)
                }
            })?;
            file.set_modified(SystemTime::now())
                .map_err(|e| io_err(format!("cannot touch {}", path.display()), e))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn temporary_files_are_never_listed_and_never_final() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::new(dir.path());
        store
            .put(
                "chunks/ab/abcd",
                Bytes::from_static(b"x"),
                PutMode::Overwrite,
            )
            .await
            .unwrap();
        std::fs::write(dir.path().join("chunks/ab/.tmp-left-over"), b"half").unwrap();
        let names: Vec<String> = store
            .list("chunks/")
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.name)
            .collect();
        assert_eq!(names, vec!["chunks/ab/abcd".to_string()]);
    }

    #[tokio::test]
    async fn batched_puts_are_whole_objects_in_new_directories() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::new(dir.path().join("repo/nested"));
        let data = Bytes::from(vec![7u8; 100_000]);
        store
            .put_batched("chunks/cd/cdef", data.clone())
            .await
            .unwrap();
        store.persist().await.unwrap();
        let got = store.get("chunks/cd/cdef", 1 << 20).await.unwrap().unwrap();
        assert_eq!(got, data.to_vec());
        let names: Vec<String> = store
            .list("")
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.name)
            .collect();
        assert_eq!(names, vec!["chunks/cd/cdef".to_string()]);
    }

    #[tokio::test]
    async fn prefixes_that_end_inside_a_name_match() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::new(dir.path());
        for name in ["locks/gc", "locks/gc-last", "locks/other", "config"] {
            store
                .put(name, Bytes::from_static(b"1"), PutMode::Overwrite)
                .await
                .unwrap();
        }
        let mut names: Vec<String> = store
            .list("locks/gc")
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.name)
            .collect();
        names.sort();
        assert_eq!(
            names,
            vec!["locks/gc".to_string(), "locks/gc-last".to_string()]
        );
        let all = store.list("").await.unwrap();
        assert_eq!(all.len(), 4);
    }
}
