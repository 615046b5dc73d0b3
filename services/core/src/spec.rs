//! Endpoint specs: the URL forms users already know, parsed once into typed values.
//!
//! `/path` or `file:///path`; `nbd://host[:port]/export`, `nbd+unix:///export?socket=PATH`
//! (the NBD URI specification, with `nbds` for TLS); `nfs://host[:port]/path?version=3`
//! (libnfs); `iscsi://[user[%password]@]host[:port]/IQN/LUN` (libiscsi); `s3://bucket/key`;
//! `http://host[:port]/path[?query]` and `https://...` (read-only sources).
//! `Display` prints the spec back as a URL with every secret redacted (for HTTP the query,
//! which often carries a presigned signature, is printed as `?***`).

use std::fmt;
use std::path::PathBuf;

use percent_encoding::percent_decode_str;
use url::Url;

use crate::{Error, Result, Secret};

pub const NBD_DEFAULT_PORT: u16 = 10809;
pub const ISCSI_DEFAULT_PORT: u16 = 3260;

/// Where an NBD server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NbdAddress {
    Tcp { host: String, port: u16 },
    Unix { socket: PathBuf },
}

/// An NBD export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdSpec {
    pub address: NbdAddress,
    pub export: String,
    /// `nbds`: TLS is required.
    pub tls: bool,
    /// `tls-certificates=DIR`: a directory with ca-cert.pem (and client-cert.pem,
    /// client-key.pem for client authentication), as libnbd and qemu use.
    pub tls_certificates: Option<PathBuf>,
    /// `tls-verify-peer=false` skips server certificate verification (testing only).
    pub tls_verify_peer: bool,
    /// `tls-hostname=NAME`: the name to verify the server certificate against.
    pub tls_hostname: Option<String>,
}

/// A file on an NFS server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NfsSpec {
    pub host: String,
    pub port: Option<u16>,
    /// The absolute path on the server: export and file (NFSv3 uses the real path,
    /// NFSv4 the pseudo path).
    pub path: String,
    pub version: Option<u8>,
    pub nfsport: Option<u16>,
    pub mountport: Option<u16>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

/// A LUN on an iSCSI target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IscsiSpec {
    pub host: String,
    pub port: u16,
    pub iqn: String,
    pub lun: u64,
    pub user: Option<String>,
    pub password: Option<Secret>,
}

/// An object in S3-compatible storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Spec {
    pub bucket: String,
    pub key: String,
}

/// An object served over HTTP or HTTPS (read-only). Credentials never sit in the URL:
/// a URL with `user:password@` is refused, they come from options.
#[derive(Clone, PartialEq, Eq)]
pub struct HttpSpec {
    /// The whole URL, as given (normalized by the URL parser), query included: use it only
    /// to send requests, never to print; print the spec itself.
    pub url: Url,
}

impl HttpSpec {
    /// `https`.
    pub fn tls(&self) -> bool {
        self.url.scheme() == "https"
    }

    /// The URL with its query (a presigned signature, a token) replaced by `***`.
    pub fn redacted(&self) -> String {
        redact_http_url(&self.url)
    }
}

impl fmt::Debug for HttpSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpSpec")
            .field("url", &self.redacted())
            .finish()
    }
}

/// An HTTP(S) URL for logs and errors: no userinfo, the query and fragment as `?***`.
pub fn redact_http_url(url: &Url) -> String {
    let mut shown = url.clone();
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.set_fragment(None);
    let had_query = shown.query().is_some_and(|q| !q.is_empty());
    shown.set_query(None);
    let mut text = shown.to_string();
    if had_query {
        text.push_str("?***");
    }
    text
}

/// An image in an OCI (docker) registry: `docker://HOST[:PORT]/REPO[:TAG][@sha256:HEX]`
/// (also `oci://`), CDI's registry URL form. Credentials never sit in the URL: they come
/// from a docker config.json named by the options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistrySpec {
    /// `host` or `host:port`, as the registry's credentials are keyed.
    pub host: String,
    /// The repository path (`containerdisks/fedora`).
    pub repository: String,
    /// The tag, when the URL names one (`latest` when it names neither tag nor digest).
    pub tag: Option<String>,
    /// `sha256:HEX` when the URL pins the manifest digest.
    pub digest: Option<String>,
}

impl RegistrySpec {
    /// The tag or digest to ask the registry for (the digest when both are given).
    pub fn reference(&self) -> &str {
        self.digest
            .as_deref()
            .or(self.tag.as_deref())
            .unwrap_or("latest")
    }
}

/// Where an image lives.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndpointSpec {
    File(PathBuf),
    Nbd(NbdSpec),
    Nfs(NfsSpec),
    Iscsi(IscsiSpec),
    S3(S3Spec),
    /// `http://` or `https://` (a source only).
    Http(HttpSpec),
    /// `docker://` or `oci://`: a containerDisk in an OCI registry (a source only).
    Registry(RegistrySpec),
}

const SCHEMES: &str =
    "file, nbd, nbds, nbd+unix, nbds+unix, nfs, iscsi, s3, http, https, docker, oci";

impl EndpointSpec {
    /// Parses a path or URL.
    pub fn parse(text: &str) -> Result<Self> {
        if text.is_empty() {
            return Err(Error::invalid_input("empty endpoint: give a path or a URL"));
        }
        let Some((scheme, _)) = text.split_once("://") else {
            return Ok(Self::File(PathBuf::from(text)));
        };
        match scheme.to_ascii_lowercase().as_str() {
            "file" => parse_file(text),
            "nbd" | "nbds" | "nbd+unix" | "nbds+unix" => parse_nbd(text).map(Self::Nbd),
            "nfs" => parse_nfs(text).map(Self::Nfs),
            "iscsi" => parse_iscsi(text).map(Self::Iscsi),
            "s3" => parse_s3(text).map(Self::S3),
            "http" | "https" => parse_http(text).map(Self::Http),
            "docker" | "oci" => parse_registry(text).map(Self::Registry),
            other => Err(Error::invalid_input(format!(
                "unknown scheme '{other}' in '{}': expected a path or one of {SCHEMES}",
                redact_userinfo(text)
            ))),
        }
    }

    /// The scheme family, as a bounded metric label.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::File(_) => "file",
            Self::Nbd(_) => "nbd",
            Self::Nfs(_) => "nfs",
            Self::Iscsi(_) => "iscsi",
            Self::S3(_) => "s3",
            Self::Http(s) if s.tls() => "https",
            Self::Http(_) => "http",
            Self::Registry(_) => "registry",
        }
    }

    /// The host this endpoint talks to, for per-host limits (None for local files).
    pub fn host(&self) -> Option<String> {
        match self {
            Self::File(_) => None,
            Self::Nbd(s) => Some(match &s.address {
                NbdAddress::Tcp { host, port } => format!("{host}:{port}"),
                NbdAddress::Unix { socket } => socket.display().to_string(),
            }),
            Self::Nfs(s) => Some(s.host.clone()),
            Self::Iscsi(s) => Some(format!("{}:{}", s.host, s.port)),
            Self::S3(s) => Some(format!("s3:{}", s.bucket)),
            Self::Http(s) => Some(format!(
                "{}:{}",
                s.url.host_str().unwrap_or_default(),
                s.url.port_or_known_default().unwrap_or_default()
            )),
            Self::Registry(s) => Some(s.host.clone()),
        }
    }
}

fn parse_url(text: &str) -> Result<Url> {
    Url::parse(text)
        .map_err(|e| Error::invalid_input(format!("invalid URL '{}': {e}", redact_userinfo(text))))
}

fn decode(text: &str) -> Result<String> {
    percent_decode_str(text)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| {
            Error::invalid_input(format!(
                "'{text}' is not valid UTF-8 after percent-decoding"
            ))
        })
}

fn parse_file(text: &str) -> Result<EndpointSpec> {
    let url = parse_url(text)?;
    if url
        .host_str()
        .is_some_and(|h| !h.is_empty() && h != "localhost")
    {
        return Err(Error::invalid_input(format!(
            "file URL '{text}' names a remote host: use file:///absolute/path"
        )));
    }
    let path = decode(url.path())?;
    if path.is_empty() || path == "/" {
        return Err(Error::invalid_input(format!(
            "file URL '{text}' has no path"
        )));
    }
    Ok(EndpointSpec::File(PathBuf::from(path)))
}

fn host_of(url: &Url, text: &str) -> Result<String> {
    match url.host() {
        Some(url::Host::Ipv6(addr)) => Ok(addr.to_string()),
        Some(h) => Ok(h.to_string()),
        None => Err(Error::invalid_input(format!(
            "URL '{}' has no host",
            redact_userinfo(text)
        ))),
    }
}

fn parse_bool(key: &str, value: &str) -> Result<bool> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(Error::invalid_input(format!(
            "option {key}={value}: expected true or false"
        ))),
    }
}

fn parse_number<T: std::str::FromStr>(key: &str, value: &str) -> Result<T> {
    value
        .parse()
        .map_err(|_| Error::invalid_input(format!("option {key}={value}: expected a number")))
}

fn parse_nbd(text: &str) -> Result<NbdSpec> {
    let url = parse_url(text)?;
    let scheme = url.scheme().to_ascii_lowercase();
    let tls = scheme.starts_with("nbds");
    let unix = scheme.ends_with("+unix");
    if !url.username().is_empty() || url.password().is_some() {
        return Err(Error::invalid_input(format!(
            "NBD URL '{}' carries user information, which NBD does not use",
            redact_userinfo(text)
        )));
    }
    let export = decode(url.path().strip_prefix('/').unwrap_or(url.path()))?;
    let mut socket = None;
    let mut spec = NbdSpec {
        address: NbdAddress::Unix {
            socket: PathBuf::new(),
        },
        export,
        tls,
        tls_certificates: None,
        tls_verify_peer: true,
        tls_hostname: None,
    };
    for (key, value) in url.query_pairs() {
        match key.as_ref() {
            "socket" => socket = Some(PathBuf::from(value.as_ref())),
            "tls-certificates" => spec.tls_certificates = Some(PathBuf::from(value.as_ref())),
            "tls-verify-peer" => spec.tls_verify_peer = parse_bool(&key, &value)?,
            "tls-hostname" => spec.tls_hostname = Some(value.into_owned()),
            other => {
                return Err(Error::invalid_input(format!(
                    "unknown NBD URL option '{other}': expected socket, tls-certificates, tls-verify-peer or tls-hostname"
                )))
            }
        }
    }
    spec.address = if unix {
        if url.host_str().is_some_and(|h| !h.is_empty()) {
            return Err(Error::invalid_input(format!(
                "NBD unix URL '{text}' must not name a host: use nbd+unix:///export?socket=PATH"
            )));
        }
        let socket = socket.ok_or_else(|| {
            Error::invalid_input(format!("NBD unix URL '{text}' needs ?socket=PATH"))
        })?;
        NbdAddress::Unix { socket }
    } else {
        if socket.is_some() {
            return Err(Error::invalid_input(format!(
                "NBD URL '{text}': socket= needs the nbd+unix scheme"
            )));
        }
        NbdAddress::Tcp {
            host: host_of(&url, text)?,
            port: url.port().unwrap_or(NBD_DEFAULT_PORT),
        }
    };
    Ok(spec)
}

fn parse_nfs(text: &str) -> Result<NfsSpec> {
    let url = parse_url(text)?;
    let path = decode(url.path())?;
    if path.len() <= 1 {
        return Err(Error::invalid_input(format!(
            "NFS URL '{text}' has no path: use nfs://host/export/path/to/image"
        )));
    }
    let mut spec = NfsSpec {
        host: host_of(&url, text)?,
        port: url.port(),
        path,
        version: None,
        nfsport: None,
        mountport: None,
        uid: None,
        gid: None,
    };
    for (key, value) in url.query_pairs() {
        match key.as_ref() {
            "version" => {
                let v: u8 = parse_number(&key, &value)?;
                if v != 3 && v != 4 {
                    return Err(Error::invalid_input(format!(
                        "option version={value}: NFS version must be 3 or 4"
                    )));
                }
                spec.version = Some(v);
            }
            "nfsport" => spec.nfsport = Some(parse_number(&key, &value)?),
            "mountport" => spec.mountport = Some(parse_number(&key, &value)?),
            "uid" => spec.uid = Some(parse_number(&key, &value)?),
            "gid" => spec.gid = Some(parse_number(&key, &value)?),
            other => {
                return Err(Error::invalid_input(format!(
                    "unknown NFS URL option '{other}': expected version, nfsport, mountport, uid or gid"
                )))
            }
        }
    }
    Ok(spec)
}

/// libiscsi's form puts `user%password` in the userinfo, which is not valid URL syntax, so
/// the authority is split by hand.
fn parse_iscsi(text: &str) -> Result<IscsiSpec> {
    let rest = &text["iscsi://".len()..];
    let (authority, path) = rest.split_once('/').ok_or_else(|| {
        Error::invalid_input(format!(
            "iSCSI URL '{}' has no target: use iscsi://[user[%password]@]host[:port]/IQN/LUN",
            redact_userinfo(text)
        ))
    })?;
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let (user, password) = match userinfo {
        None => (None, None),
        Some(u) => match u.split_once('%') {
            Some((user, pass)) => (Some(decode(user)?), Some(Secret::new(decode(pass)?))),
            None => (Some(decode(u)?), None),
        },
    };
    let parsed = parse_url(&format!("iscsi://{hostport}/"))?;
    let host = host_of(&parsed, text)?;
    let port = parsed.port().unwrap_or(ISCSI_DEFAULT_PORT);
    let path = path.split('?').next().unwrap_or_default();
    let (iqn, lun) = path.rsplit_once('/').ok_or_else(|| {
        Error::invalid_input(format!(
            "iSCSI URL '{}' needs /IQN/LUN after the host",
            redact_userinfo(text)
        ))
    })?;
    let iqn = decode(iqn)?;
    if iqn.is_empty() {
        return Err(Error::invalid_input(format!(
            "iSCSI URL '{}' has an empty target name",
            redact_userinfo(text)
        )));
    }
    let lun = lun.parse().map_err(|_| {
        Error::invalid_input(format!(
            "iSCSI URL '{}': LUN '{lun}' is not a number",
            redact_userinfo(text)
        ))
    })?;
    Ok(IscsiSpec {
        host,
        port,
        iqn,
        lun,
        user,
        password,
    })
}

fn parse_s3(text: &str) -> Result<S3Spec> {
    let rest = &text["s3://".len()..];
    let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() || key.is_empty() {
        return Err(Error::invalid_input(format!(
            "S3 URL '{text}' needs a bucket and a key: use s3://bucket/key"
        )));
    }
    if key.contains('?') {
        return Err(Error::invalid_input(format!(
            "S3 URL '{text}' has options; give endpoint, region and credentials through the environment or job options"
        )));
    }
    Ok(S3Spec {
        bucket: bucket.to_string(),
        key: decode(key)?,
    })
}

fn parse_http(text: &str) -> Result<HttpSpec> {
    let url = Url::parse(text).map_err(|e| {
        let shown = match text.split_once(['?', '#']) {
            Some((base, _)) => format!("{base}?***"),
            None => text.to_string(),
        };
        Error::invalid_input(format!("invalid URL '{}': {e}", redact_userinfo(&shown)))
    })?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(Error::invalid_input(format!(
            "HTTP URL '{}' carries user information: give the user and password through the \
             environment (FERRY_HTTP_USER, FERRY_HTTP_PASSWORD_FILE) or the job's HTTP options",
            redact_http_url(&url)
        )));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(Error::invalid_input(format!(
            "HTTP URL '{}' has no host",
            redact_http_url(&url)
        )));
    }
    Ok(HttpSpec { url })
}

/// The registry Docker Hub's short names mean (`docker://library/alpine`).
pub const DOCKER_HUB: &str = "registry-1.docker.io";
/// Longest repository path accepted (the distribution spec's limit is 255 per name).
const MAX_REPOSITORY: usize = 255;

/// `docker://HOST[:PORT]/REPO[:TAG][@sha256:HEX]`. A first path part without a `.` or
/// `:` that is not `localhost` is a Docker Hub repository, as docker and CDI read it.
fn parse_registry(text: &str) -> Result<RegistrySpec> {
    let (_, rest) = text.split_once("://").unwrap_or(("", text));
    let bad = |why: &str| {
        Error::invalid_input(format!(
            "registry URL '{}' {why}: use docker://HOST[:PORT]/REPO:TAG or \
             docker://HOST[:PORT]/REPO@sha256:DIGEST",
            redact_userinfo(text)
        ))
    };
    if rest.contains(['?', '#']) {
        return Err(bad(
            "has options; registry settings come from the environment or the job",
        ));
    }
    let (first, path) = rest
        .split_once('/')
        .ok_or_else(|| bad("has no repository"))?;
    if first.contains('@') {
        return Err(bad(
            "carries user information; credentials come from a docker config.json \
             (FERRY_REGISTRY_AUTH_FILE)",
        ));
    }
    let (host, path) =
        if first.contains(['.', ':']) || first == "localhost" || first.starts_with('[') {
            (first.to_string(), path.to_string())
        } else {
            (DOCKER_HUB.to_string(), format!("{first}/{path}"))
        };
    let (path, digest) = match path.split_once('@') {
        Some((p, d)) => (p.to_string(), Some(d.to_string())),
        None => (path, None),
    };
    if let Some(d) = &digest {
        let hex = d
            .strip_prefix("sha256:")
            .ok_or_else(|| bad("pins a digest that is not sha256:HEX"))?;
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(bad(
                "pins a digest that is not sha256: and 64 lowercase hex digits",
            ));
        }
    }
    // A tag follows the last ':' after the last '/'.
    let slash = path.rfind('/').map_or(0, |i| i + 1);
    let (repository, tag) = match path[slash..].rfind(':') {
        Some(i) => (
            path[..slash + i].to_string(),
            Some(path[slash + i + 1..].to_string()),
        ),
        None => (path, None),
    };
    if let Some(t) = &tag {
        let ok = !t.is_empty()
            && t.len() <= 128
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !ok {
            return Err(bad("has an invalid tag"));
        }
    }
    let repo_ok = !repository.is_empty()
        && repository.len() <= MAX_REPOSITORY
        && repository.split('/').all(|part| {
            !part.is_empty()
                && part.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'-')
                })
        });
    if !repo_ok {
        return Err(bad(
            "has an invalid repository name (lowercase letters, digits, . _ - and /)",
        ));
    }
    let tag = match (&tag, &digest) {
        (None, None) => Some("latest".to_string()),
        _ => tag,
    };
    Ok(RegistrySpec {
        host,
        repository,
        tag,
        digest,
    })
}

/// Replaces `user[:%]password@` in a URL-ish string with `user:***@`, for error messages
/// about URLs that did not parse.
pub fn redact_userinfo(text: &str) -> String {
    let Some((scheme, rest)) = text.split_once("://") else {
        return text.to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split([':', '%']).next().unwrap_or_default();
            let redacted = if user.len() < userinfo.len() {
                format!("{user}%***")
            } else {
                user.to_string()
            };
            format!("{scheme}://{redacted}@{host}{}", &rest[authority_end..])
        }
        None => text.to_string(),
    }
}

fn fmt_host(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

impl fmt::Display for EndpointSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File(path) => write!(f, "{}", path.display()),
            Self::Nbd(s) => {
                let scheme = if s.tls { "nbds" } else { "nbd" };
                match &s.address {
                    NbdAddress::Tcp { host, port } => {
                        write!(f, "{scheme}://{}:{port}/{}", fmt_host(host), s.export)
                    }
                    NbdAddress::Unix { socket } => {
                        write!(
                            f,
                            "{scheme}+unix:///{}?socket={}",
                            s.export,
                            socket.display()
                        )
                    }
                }
            }
            Self::Nfs(s) => {
                write!(f, "nfs://{}", fmt_host(&s.host))?;
                if let Some(port) = s.port {
                    write!(f, ":{port}")?;
                }
                f.write_str(&s.path)?;
                if let Some(v) = s.version {
                    write!(f, "?version={v}")?;
                }
                Ok(())
            }
            Self::Iscsi(s) => {
                f.write_str("iscsi://")?;
                if let Some(user) = &s.user {
                    f.write_str(user)?;
                    if s.password.is_some() {
                        f.write_str("%***")?;
                    }
                    f.write_str("@")?;
                }
                write!(f, "{}:{}/{}/{}", fmt_host(&s.host), s.port, s.iqn, s.lun)
            }
            Self::S3(s) => write!(f, "s3://{}/{}", s.bucket, s.key),
            Self::Http(s) => f.write_str(&s.redacted()),
            Self::Registry(s) => {
                write!(f, "docker://{}/{}", s.host, s.repository)?;
                if let Some(tag) = &s.tag {
                    write!(f, ":{tag}")?;
                }
                if let Some(digest) = &s.digest {
                    write!(f, "@{digest}")?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn parse(text: &str) -> EndpointSpec {
        EndpointSpec::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn files() {
        assert_eq!(parse("/tmp/a.img"), EndpointSpec::File("/tmp/a.img".into()));
        assert_eq!(parse("rel/a.img"), EndpointSpec::File("rel/a.img".into()));
        assert_eq!(
            parse("file:///tmp/a%20b.img"),
            EndpointSpec::File("/tmp/a b.img".into())
        );
        assert_eq!(parse("file://localhost/x"), EndpointSpec::File("/x".into()));
        assert!(EndpointSpec::parse("file://remote/x").is_err());
        assert!(EndpointSpec::parse("").is_err());
    }

    #[test]
    fn nbd_tcp_and_unix() {
        let EndpointSpec::Nbd(s) = parse("nbd://127.0.0.1:10900/disk") else {
            panic!()
        };
        assert_eq!(
            s.address,
            NbdAddress::Tcp {
                host: "127.0.0.1".into(),
                port: 10900
            }
        );
        assert_eq!(s.export, "disk");
        assert!(!s.tls);

        let EndpointSpec::Nbd(s) = parse("nbd://example.com") else {
            panic!()
        };
        assert_eq!(
            s.address,
            NbdAddress::Tcp {
                host: "example.com".into(),
                port: NBD_DEFAULT_PORT
            }
        );
        assert_eq!(s.export, "");

        let EndpointSpec::Nbd(s) =
            parse("nbds+unix:///e?socket=/run/nbd.sock&tls-verify-peer=false")
        else {
            panic!()
        };
        assert_eq!(
            s.address,
            NbdAddress::Unix {
                socket: "/run/nbd.sock".into()
            }
        );
        assert!(s.tls && !s.tls_verify_peer);

        let EndpointSpec::Nbd(s) = parse("nbd://[::1]:5000/x") else {
            panic!()
        };
        assert_eq!(
            s.address,
            NbdAddress::Tcp {
                host: "::1".into(),
                port: 5000
            }
        );
        assert_eq!(
            parse("nbd://[::1]:5000/x").to_string(),
            "nbd://[::1]:5000/x"
        );

        for bad in [
            "nbd+unix:///e",
            "nbd://h/e?socket=/x",
            "nbd://h/e?bogus=1",
            "nbd:///e",
        ] {
            assert_eq!(
                EndpointSpec::parse(bad).unwrap_err().kind(),
                ErrorKind::InvalidInput,
                "{bad}"
            );
        }
    }

    #[test]
    fn nfs_options() {
        let EndpointSpec::Nfs(s) =
            parse("nfs://10.0.0.1:2049/srv/export/a.img?version=3&uid=0&gid=0")
        else {
            panic!()
        };
        assert_eq!(s.host, "10.0.0.1");
        assert_eq!(s.port, Some(2049));
        assert_eq!(s.path, "/srv/export/a.img");
        assert_eq!((s.version, s.uid, s.gid), (Some(3), Some(0), Some(0)));
        assert!(EndpointSpec::parse("nfs://h/x?version=2").is_err());
        assert!(EndpointSpec::parse("nfs://h/x?uid=abc").is_err());
        assert!(EndpointSpec::parse("nfs://h/").is_err());
    }

    #[test]
    fn iscsi_with_chap_is_redacted() {
        let text = "iscsi://alice%s3cr%21t@127.0.0.1:3261/iqn.2026-01.io.ferry:t1/1";
        let EndpointSpec::Iscsi(s) = parse(text) else {
            panic!()
        };
        assert_eq!(s.user.as_deref(), Some("alice"));
        assert_eq!(s.password.as_ref().map(Secret::expose), Some("s3cr!t"));
        assert_eq!(s.iqn, "iqn.2026-01.io.ferry:t1");
        assert_eq!((s.port, s.lun), (3261, 1));
        let shown = parse(text).to_string();
        assert!(!shown.contains("s3cr"), "{shown}");
        assert_eq!(
            shown,
            "iscsi://alice%***@127.0.0.1:3261/iqn.2026-01.io.ferry:t1/1"
        );
        assert!(!format!("{:?}", parse(text)).contains("s3cr"));

        let err = EndpointSpec::parse("iscsi://bob%hunter2@host/iqn.x/notalun").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
        assert!(EndpointSpec::parse("iscsi://host/iqn.x").is_err());
        assert!(EndpointSpec::parse("iscsi://host").is_err());
    }

    #[test]
    fn s3() {
        let EndpointSpec::S3(s) = parse("s3://bucket/dir/a.img") else {
            panic!()
        };
        assert_eq!((s.bucket.as_str(), s.key.as_str()), ("bucket", "dir/a.img"));
        assert!(EndpointSpec::parse("s3://bucket").is_err());
        assert!(EndpointSpec::parse("s3:///key").is_err());
    }

    #[test]
    fn http_urls() {
        let EndpointSpec::Http(s) = parse("https://example.com:8443/images/a.qcow2") else {
            panic!()
        };
        assert!(s.tls());
        assert_eq!(s.url.as_str(), "https://example.com:8443/images/a.qcow2");
        let spec = parse("http://Example.com/a.img");
        assert_eq!(spec.kind(), "http");
        assert_eq!(spec.host().as_deref(), Some("example.com:80"));
        assert_eq!(spec.to_string(), "http://example.com/a.img");

        let presigned = "https://h/b/k.img?X-Amz-Signature=deadbeef&X-Amz-Credential=AKID";
        let spec = parse(presigned);
        let EndpointSpec::Http(s) = &spec else {
            panic!()
        };
        assert_eq!(s.url.as_str(), presigned);
        for shown in [spec.to_string(), format!("{spec:?}"), s.redacted()] {
            assert!(!shown.contains("deadbeef"), "{shown}");
            assert!(!shown.contains("AKID"), "{shown}");
            assert!(shown.contains("https://h/b/k.img?***"), "{shown}");
        }
        assert_eq!(spec.host().as_deref(), Some("h:443"));

        let err = EndpointSpec::parse("https://alice:hunter2@h/x").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(!err.to_string().contains("hunter2"), "{err}");
        assert!(err.to_string().contains("user information"), "{err}");
        assert!(EndpointSpec::parse("http://bob@h/x").is_err());
        assert!(EndpointSpec::parse("http://").is_err());
    }

    #[test]
    fn unknown_scheme_is_named_and_redacted() {
        let err = EndpointSpec::parse("ftp://u:pw@host/x").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        let text = err.to_string();
        assert!(text.contains("unknown scheme 'ftp'"), "{text}");
        assert!(!text.contains("pw@"), "{text}");
    }

    #[test]
    fn hosts_for_limits() {
        assert_eq!(parse("/x").host(), None);
        assert_eq!(parse("nbd://h:1/e").host().as_deref(), Some("h:1"));
        assert_eq!(parse("s3://b/k").kind(), "s3");
    }

    #[test]
    fn registry_urls() {
        let d = "a".repeat(64);
        let spec = EndpointSpec::parse("docker://127.0.0.1:5000/disks/fedora:41").unwrap();
        let EndpointSpec::Registry(r) = &spec else {
            panic!("{spec:?}")
        };
        assert_eq!(
            (r.host.as_str(), r.repository.as_str()),
            ("127.0.0.1:5000", "disks/fedora")
        );
        assert_eq!((r.tag.as_deref(), r.reference()), (Some("41"), "41"));
        assert_eq!(spec.to_string(), "docker://127.0.0.1:5000/disks/fedora:41");
        assert_eq!(spec.kind(), "registry");
        assert_eq!(spec.host().as_deref(), Some("127.0.0.1:5000"));
        let pinned = format!("oci://quay.io/containerdisks/fedora@sha256:{d}");
        let EndpointSpec::Registry(r) = EndpointSpec::parse(&pinned).unwrap() else {
            panic!()
        };
        assert_eq!(r.tag, None);
        assert_eq!(r.reference(), format!("sha256:{d}"));
        let EndpointSpec::Registry(r) = EndpointSpec::parse("docker://kubevirt/cirros").unwrap()
        else {
            panic!()
        };
        assert_eq!(
            (r.host.as_str(), r.repository.as_str(), r.reference()),
            (DOCKER_HUB, "kubevirt/cirros", "latest")
        );
        for bad in [
            "docker://host.io/",
            "docker://user:pw@host.io/repo:tag",
            "docker://host.io/Repo:tag",
            "docker://host.io/repo:t@g",
            "docker://host.io/repo@sha256:abc",
            "docker://host.io/repo@md5:abc",
            "docker://host.io/repo:tag?insecure=1",
        ] {
            let err = EndpointSpec::parse(bad).unwrap_err();
            assert!(!err.to_string().contains("pw@"), "{err}");
        }
    }
}
