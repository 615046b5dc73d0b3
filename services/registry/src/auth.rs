//! Authentication: credentials from a docker `config.json` (as podman, skopeo and
//! kubelet's image pull secrets keep them), the registry's `WWW-Authenticate` challenge,
//! and the bearer token a token service gives for it.
//!
//! Nothing here prints a secret: [`Credentials`] and tokens show as `***` in `Debug`, and
//! parse errors name the field, never its value.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine as _;
use serde::Deserialize;

use crate::{Error, ErrorKind, Result};

/// Largest config.json read.
pub const MAX_CONFIG: usize = 1 << 20;
/// Largest token service reply read.
pub const MAX_TOKEN_REPLY: usize = 64 << 10;
/// Longest `WWW-Authenticate` header parsed.
pub const MAX_CHALLENGE: usize = 4096;

/// A user and password for one registry.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub user: String,
    password: String,
}

impl Credentials {
    pub fn new(user: impl Into<String>, password: impl Into<String>) -> Self {
        Self {
            user: user.into(),
            password: password.into(),
        }
    }

    /// The `Authorization: Basic ...` value.
    pub(crate) fn basic(&self) -> String {
        let pair = format!("{}:{}", self.user, self.password);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"***")
            .finish()
    }
}

/// The `auths` of a docker config.json.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct DockerConfig {
    auths: BTreeMap<String, Credentials>,
}

impl fmt::Debug for DockerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DockerConfig")
            .field("registries", &self.auths.keys().collect::<Vec<_>>())
            .finish()
    }
}

#[derive(Deserialize)]
struct RawConfig {
    #[serde(default)]
    auths: BTreeMap<String, RawAuth>,
}

#[derive(Deserialize)]
struct RawAuth {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

/// `https://host/v1/` and `host` name the same registry.
fn registry_key(key: &str) -> String {
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let host = key.split('/').next().unwrap_or(key).to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | "docker.io" => "registry-1.docker.io".to_string(),
        _ => host,
    }
}

impl DockerConfig {
    /// Parses a config.json (`{"auths": {"host": {"auth": base64(user:password)}}}`, or
    /// `username` and `password` fields).
    pub fn parse(text: &[u8]) -> Result<Self> {
        if text.len() > MAX_CONFIG {
            return Err(Error::invalid(format!(
                "the registry auth file is larger than {MAX_CONFIG} bytes"
            )));
        }
        let raw: RawConfig = serde_json::from_slice(text).map_err(|e| {
            Error::invalid(format!(
                "the registry auth file is not a docker config.json (line {}, column {})",
                e.line(),
                e.column()
            ))
        })?;
        let mut auths = BTreeMap::new();
        for (key, entry) in raw.auths {
            let creds = match (entry.auth, entry.username, entry.password) {
                (Some(auth), _, _) if !auth.is_empty() => {
                    let decoded = base64::engine::general_purpose::STANDARD
                        .decode(auth.trim())
                        .ok()
                        .and_then(|b| String::from_utf8(b).ok())
                        .ok_or_else(|| {
                            Error::invalid(format!(
                                "the registry auth file's entry for {key:?}: auth is not base64 of user:password"
                            ))
                        })?;
                    let (user, password) = decoded.split_once(':').ok_or_else(|| {
                        Error::invalid(format!(
                            "the registry auth file's entry for {key:?}: auth is not base64 of user:password"
                        ))
                    })?;
                    Credentials::new(user, password)
                }
                (_, Some(user), Some(password)) => Credentials::new(user, password),
                _ => continue,
            };
            auths.insert(registry_key(&key), creds);
        }
        Ok(Self { auths })
    }

    /// The credentials for `host` (`host` or `host:port`).
    pub fn credentials(&self, host: &str) -> Option<&Credentials> {
        self.auths.get(&registry_key(host))
    }
}

/// What a registry's 401 asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    Basic,
    /// The token service's URL and its parameters.
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
}

/// Parses a `WWW-Authenticate` value: `Basic realm="..."` or `Bearer realm="...",
/// service="...",scope="..."` (quoted values with `\` escapes).
pub fn parse_challenge(value: &str) -> Result<Challenge> {
    if value.len() > MAX_CHALLENGE {
        return Err(Error::protocol(
            "the registry's WWW-Authenticate is too long",
        ));
    }
    let value = value.trim();
    let (scheme, rest) = value.split_once(' ').unwrap_or((value, ""));
    if scheme.eq_ignore_ascii_case("basic") {
        return Ok(Challenge::Basic);
    }
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!(
                "the registry asks for {:?} authentication; ferry speaks Basic and Bearer",
                crate::digest::clip(scheme)
            ),
        ));
    }
    let params = parse_params(rest)?;
    let get = |k: &str| params.get(k).cloned();
    let realm = get("realm")
        .ok_or_else(|| Error::protocol("the registry's Bearer challenge has no realm"))?;
    Ok(Challenge::Bearer {
        realm,
        service: get("service"),
        scope: get("scope"),
    })
}

fn parse_params(mut rest: &str) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let bad = || Error::protocol("the registry's WWW-Authenticate parameters do not parse");
    loop {
        rest = rest.trim_start_matches([' ', ',']);
        if rest.is_empty() {
            return Ok(out);
        }
        let (key, after) = rest.split_once('=').ok_or_else(bad)?;
        let key = key.trim().to_ascii_lowercase();
        let mut value = String::new();
        if let Some(quoted) = after.strip_prefix('"') {
            let mut chars = quoted.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next().map(|(_, c)| c)),
                    '"' => {
                        end = Some(i + 1);
                        break;
                    }
                    c => value.push(c),
                }
            }
            rest = &quoted[end.ok_or_else(bad)?..];
        } else {
            let end = after.find(',').unwrap_or(after.len());
            value = after[..end].trim().to_string();
            rest = &after[end..];
        }
        out.insert(key, value);
    }
}

/// A bearer token (shows as `***`).
#[derive(Clone, PartialEq, Eq)]
pub struct Token(pub(crate) String);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(***)")
    }
}

#[derive(Deserialize)]
struct TokenReply {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    access_token: Option<String>,
}

/// The token in a token service's JSON reply (`token` or `access_token`).
pub fn parse_token_reply(body: &[u8]) -> Result<Token> {
    if body.len() > MAX_TOKEN_REPLY {
        return Err(Error::protocol(format!(
            "the token service's reply is larger than {MAX_TOKEN_REPLY} bytes"
        )));
    }
    let reply: TokenReply = serde_json::from_slice(body)
        .map_err(|_| Error::protocol("the token service's reply is not the JSON of a token"))?;
    let token = reply
        .token
        .filter(|t| !t.is_empty())
        .or(reply.access_token)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| Error::protocol("the token service's reply holds no token"))?;
    if token.bytes().any(|b| !(0x21..0x7f).contains(&b)) {
        return Err(Error::protocol(
            "the token service's token holds characters a header cannot carry",
        ));
    }
    Ok(Token(token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_json_entries() {
        let text = br#"{"auths":{"127.0.0.1:5000":{"auth":"YWxpY2U6czNjcmV0"},
            "https://index.docker.io/v1/":{"username":"bob","password":"pw"},
            "other.io":{}}}"#;
        let c = DockerConfig::parse(text).unwrap();
        let a = c.credentials("127.0.0.1:5000").unwrap();
        assert_eq!((a.user.as_str(), a.password.as_str()), ("alice", "s3cret"));
        assert_eq!(c.credentials("registry-1.docker.io").unwrap().user, "bob");
        assert!(c.credentials("other.io").is_none());
        let shown = format!("{c:?} {a:?}");
        assert!(
            !shown.contains("s3cret") && !shown.contains("YWxp"),
            "{shown}"
        );
        let err = DockerConfig::parse(br#"{"auths":{"h":{"auth":"bm9jb2xvbg=="}}}"#).unwrap_err();
        assert!(!err.message().contains("bm9j"), "{err}");
    }

    #[test]
    fn challenges() {
        assert_eq!(
            parse_challenge("Basic realm=\"r\"").unwrap(),
            Challenge::Basic
        );
        let c = parse_challenge(
            r#"Bearer realm="https://auth.io/token",service="registry.io",scope="repository:a/b:pull""#,
        )
        .unwrap();
        assert_eq!(
            c,
            Challenge::Bearer {
                realm: "https://auth.io/token".into(),
                service: Some("registry.io".into()),
                scope: Some("repository:a/b:pull".into())
            }
        );
        assert!(parse_challenge("Bearer service=\"x\"").is_err());
        assert!(parse_challenge("Bearer realm=\"unterminated").is_err());
        assert!(parse_challenge("Negotiate abc").is_err());
    }

    #[test]
    fn token_replies() {
        let t = parse_token_reply(br#"{"token":"abc.def"}"#).unwrap();
        assert_eq!(format!("{t:?}"), "Token(***)");
        assert_eq!(
            parse_token_reply(br#"{"access_token":"x"}"#).unwrap().0,
            "x"
        );
        assert!(parse_token_reply(br#"{"token":""}"#).is_err());
        assert!(parse_token_reply(br#"{"token":"a\nb"}"#).is_err());
        assert!(parse_token_reply(&vec![b' '; MAX_TOKEN_REPLY + 1]).is_err());
    }
}
