//! From a URL to a file handle: the server's address, its MOUNT and NFS ports (from the
//! URL or the portmapper), the export that holds the path (from the server's export list
//! when it gives one), and LOOKUPs down to the file.

use std::net::SocketAddr;

use super::client::NfsConn;
use super::proto::{self, Attr, FileHandle, NfsStat};
use crate::error::{Error, Result};
use crate::rpc::{RpcConn, Sink};
use crate::xdr::Decoder;
use crate::ClientConfig;

/// Where a file is: the server, the path on it, and the ports when they are known
/// (otherwise the server's portmapper is asked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub host: String,
    pub path: String,
    pub nfs_port: Option<u16>,
    pub mount_port: Option<u16>,
}

/// A path resolved on the server: the directory holding the image, its name there, and
/// the image's handle and attributes when it exists.
#[derive(Debug)]
pub struct Resolved<B = Vec<u8>> {
    pub nfs: NfsConn<B>,
    pub export: String,
    pub dir: FileHandle,
    pub name: String,
    pub file: Option<(FileHandle, Attr)>,
}

/// Resolves `spec` over NFSv3: ports, export, then LOOKUPs down to the file.
pub async fn resolve<B: Sink>(spec: &Location, config: &ClientConfig) -> Result<Resolved<B>> {
    let ip = lookup_host(&spec.host, config).await?;
    let nfs_port = match spec.nfs_port {
        Some(p) => p,
        None => getport(ip, proto::NFS_PROGRAM, "NFS", config).await?,
    };
    let mount_port = match spec.mount_port {
        Some(p) => p,
        None => getport(ip, proto::MOUNT_PROGRAM, "MOUNT", config).await?,
    };
    let mount_addr = SocketAddr::new(ip, mount_port);
    let mount: RpcConn = RpcConn::connect(
        mount_addr,
        proto::MOUNT_PROGRAM,
        proto::MOUNT_VERSION,
        &config.rpc,
    )
    .await
    .map_err(|e| rpc_error(e, "connect to the MOUNT service"))?;
    let (export, root) = mount_export(&mount, &spec.host, &spec.path, config).await?;
    // The handle stays valid without the mount; tell the server we are done with it.
    let _ = mount
        .call(
            proto::MOUNTPROC_UMNT,
            proto::mount_args(&export).as_slice(),
            None,
            None,
        )
        .await;
    drop(mount);

    let nfs = NfsConn::connect(SocketAddr::new(ip, nfs_port), config).await?;
    let (dir, name, walked) = walk(&nfs, &spec.host, &export, root, &spec.path).await?;
    let file = match nfs.lookup(&dir, &name).await {
        Ok(Some((fh, attr))) => {
            let attr = match attr {
                Some(a) => a,
                None => nfs
                    .getattr(&fh)
                    .await
                    .map_err(|e| nfs_error(e, "get the image's attributes"))?,
            };
            Some((fh, attr))
        }
        Ok(None) => None,
        Err(e) => return Err(nfs_error(e, &format!("look up {walked}/{name}"))),
    };
    Ok(Resolved {
        nfs,
        export,
        dir,
        name,
        file,
    })
}

/// LOOKUPs from the export's `root` down to the directory holding `path`'s last
/// component: that directory, the component, and the directory's path.
async fn walk<B: Sink>(
    nfs: &NfsConn<B>,
    host: &str,
    export: &str,
    root: FileHandle,
    path: &str,
) -> Result<(FileHandle, String, String)> {
    let rest = path
        .get(export.len()..)
        .unwrap_or_default()
        .trim_start_matches('/');
    let mut parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
    let Some(name) = parts.pop() else {
        return Err(Error::InvalidInput(format!(
            "the path names the export {export} itself: add the image's path, for example nfs://{host}{export}/disk.img"
        )));
    };
    let mut dir = root;
    let mut walked = export.to_string();
    for part in parts {
        let next = match nfs.lookup(&dir, part).await {
            Ok(Some((fh, attr))) => {
                if attr.is_some_and(|a| a.ftype != proto::NF3DIR) {
                    return Err(Error::InvalidInput(format!(
                        "{walked}/{part} is not a directory"
                    )));
                }
                fh
            }
            Ok(None) => {
                return Err(Error::NotFound(format!(
                    "directory {walked}/{part} does not exist in export {export}"
                )))
            }
            Err(e) => return Err(nfs_error(e, &format!("look up {walked}/{part}"))),
        };
        walked = format!("{walked}/{part}");
        dir = next;
    }
    Ok((dir, name.to_string(), walked))
}

/// The address of `host` (a name or an IP address).
pub async fn lookup_host(host: &str, config: &ClientConfig) -> Result<std::net::IpAddr> {
    if let Ok(ip) = host.parse() {
        return Ok(ip);
    }
    let found = tokio::time::timeout(
        config.rpc.connect_timeout,
        tokio::net::lookup_host((host, 0)),
    )
    .await
    .map_err(|_| Error::Timeout(format!("resolving {host} timed out")))?
    .map_err(|source| Error::Resolve {
        message: format!("cannot resolve host {host}"),
        source,
    })?
    .next();
    found
        .map(|a| a.ip())
        .ok_or_else(|| Error::NotFound(format!("host {host} has no address")))
}

/// Asks the portmapper (rpcbind) for a program's TCP port.
async fn getport(
    ip: std::net::IpAddr,
    program: u32,
    name: &str,
    config: &ClientConfig,
) -> Result<u16> {
    let addr = SocketAddr::new(ip, proto::PMAP_PORT);
    let hint = "or give nfsport= and mountport= in the URL";
    let pmap: RpcConn =
        RpcConn::connect(addr, proto::PMAP_PROGRAM, proto::PMAP_VERSION, &config.rpc)
            .await
            .map_err(|source| Error::Transport {
                doing: format!("reach the portmapper (rpcbind) to find the {name} port ({hint})"),
                source,
            })?;
    let version = if program == proto::NFS_PROGRAM {
        proto::NFS_VERSION
    } else {
        proto::MOUNT_VERSION
    };
    let out = pmap
        .call(
            proto::PMAPPROC_GETPORT,
            proto::pmap_getport_args(program, version).as_slice(),
            None,
            None,
        )
        .await;
    let body = out
        .result
        .map_err(|e| rpc_error(e, "ask the portmapper for a port"))?;
    let port = Decoder::new(&body)
        .u32()
        .map_err(|e| Error::Protocol(format!("malformed portmapper reply: {e}")))?;
    match u16::try_from(port) {
        Ok(0) => Err(Error::Unsupported(format!(
            "the server has no {name} version {version} over TCP registered with its portmapper ({hint})"
        ))),
        Ok(p) => Ok(p),
        Err(_) => Err(Error::Protocol(format!(
            "the portmapper gave port {port} for {name}"
        ))),
    }
}

/// Mounts the export holding `path`: the exports the server lists that contain it,
/// longest first, or else each ancestor directory of the path.
async fn mount_export(
    mount: &RpcConn,
    host: &str,
    path: &str,
    config: &ClientConfig,
) -> Result<(String, FileHandle)> {
    let exports = list_exports(mount).await;
    let candidates: Vec<String> = match &exports {
        Some(list) => {
            let mut c: Vec<String> = list
                .iter()
                .map(|e| normalize(e))
                .filter(|e| contains(e, path))
                .collect();
            c.sort_by_key(|e| std::cmp::Reverse(e.len()));
            c.dedup();
            c
        }
        None => ancestors(path),
    };
    let listed = match &exports {
        Some(list) if list.is_empty() => "the server lists no exports".to_string(),
        Some(list) => format!("the server exports {}", list.join(", ")),
        None => "the server does not list its exports".to_string(),
    };
    let path_trimmed = normalize(path);
    if exports
        .iter()
        .flatten()
        .any(|e| normalize(e) == path_trimmed)
    {
        return Err(Error::InvalidInput(format!(
            "the path names the export {path_trimmed} itself: add the image's path, for example nfs://{host}{path_trimmed}/disk.img"
        )));
    }
    if candidates.is_empty() {
        return Err(Error::NotFound(format!(
            "export not found: no export of {host} contains {path}; {listed}"
        )));
    }
    let mut refused = None;
    for export in &candidates {
        let out = mount
            .call(
                proto::MOUNTPROC_MNT,
                proto::mount_args(export).as_slice(),
                None,
                None,
            )
            .await;
        let body = out
            .result
            .map_err(|e| rpc_error(e, &format!("mount {export}")))?;
        let mut d = Decoder::new(&body);
        let status = d
            .u32()
            .map_err(|e| Error::Protocol(format!("malformed MOUNT reply: {e}")))?;
        match NfsStat(status) {
            NfsStat::OK => {
                let fh = proto::mount_ok(&mut d)
                    .map_err(|e| Error::Protocol(format!("malformed MOUNT reply: {e}")))?;
                return Ok((export.clone(), fh));
            }
            NfsStat::PERM | NfsStat::ACCES => refused = Some((export.clone(), NfsStat(status))),
            _ => {}
        }
    }
    match refused {
        Some((export, status)) => Err(Error::PermissionDenied(format!(
            "the server refused to mount {export} for this client (uid {}, gid {}): {status}",
            config.rpc.uid, config.rpc.gid
        ))),
        None => Err(Error::NotFound(format!(
            "export not found: {host} would not mount any directory containing {path}; {listed}"
        ))),
    }
}

async fn list_exports(mount: &RpcConn) -> Option<Vec<String>> {
    let out = mount.call(proto::MOUNTPROC_EXPORT, &[], None, None).await;
    let body = out.result.ok()?;
    proto::exports(&mut Decoder::new(&body)).ok()
}

fn normalize(export: &str) -> String {
    let trimmed = export.trim_end_matches('/');
    if trimmed.is_empty() {
        "/".to_string()
    } else {
        trimmed.to_string()
    }
}

/// Whether `export` is a proper ancestor of `path`.
fn contains(export: &str, path: &str) -> bool {
    if export == "/" {
        return path.len() > 1;
    }
    path.strip_prefix(export)
        .is_some_and(|rest| rest.starts_with('/') && rest.len() > 1)
}

/// `/a/b/c` -> `/a/b`, `/a`, `/`.
fn ancestors(path: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut p = path.trim_end_matches('/');
    while let Some((parent, _)) = p.rsplit_once('/') {
        out.push(if parent.is_empty() {
            "/".into()
        } else {
            parent.into()
        });
        p = parent;
    }
    out
}

/// An RPC failure while opening, with what was being done.
fn rpc_error(source: crate::rpc::RpcError, doing: &str) -> Error {
    Error::Transport {
        doing: doing.to_string(),
        source,
    }
}

/// An NFS failure while opening, with what was being done.
fn nfs_error(e: Error, doing: &str) -> Error {
    Error::Open {
        doing: doing.to_string(),
        source: Box::new(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_matching() {
        assert!(contains("/srv/nfs", "/srv/nfs/a.img"));
        assert!(!contains("/srv/nfs", "/srv/nfs"));
        assert!(!contains("/srv/nf", "/srv/nfs/a.img"));
        assert!(contains("/", "/a.img"));
        assert_eq!(ancestors("/a/b/c.img"), ["/a/b", "/a", "/"]);
        assert_eq!(normalize("/x/"), "/x");
    }
}
