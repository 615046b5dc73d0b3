//! The version of a registry image (`docker://HOST/REPO:TAG`), asked of the registry
//! without pulling it: the digest of the manifest the tag names (`HEAD
//! /v2/REPO/manifests/TAG`, its `Docker-Content-Digest`), as CDI's DataImportCron polls a
//! tag. A URL that pins a digest is its own version.
//!
//! Only anonymous pulls are asked (the operator reads no Secret values): a registry that
//! answers 401 with a `Bearer` challenge gets an anonymous token from its realm (as
//! Docker Hub and quay.io hand out for public images), one that wants basic credentials is
//! an error saying so. The token is never shown.

use http::{header, Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty, Limited};
use sha2::{Digest, Sha256};

use ferry_core::spec::RegistrySpec;

use super::probe::{client, send, shown, ProbeError};

/// The manifest kinds asked for: an image index or list first (its digest is what a
/// multi-platform tag names), then single manifests.
const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
     application/vnd.docker.distribution.manifest.list.v2+json, \
     application/vnd.oci.image.manifest.v1+json, \
     application/vnd.docker.distribution.manifest.v2+json";
/// Largest manifest read to hash it, where a registry gives no digest header.
const MAX_MANIFEST: usize = 4 << 20;
/// Largest token answer read.
const MAX_TOKEN_ANSWER: usize = 64 << 10;
/// The header naming a manifest's digest.
const DIGEST_HEADER: &str = "docker-content-digest";

/// `digest:sha256:<hex>` of the manifest `spec` names; plain HTTP when `insecure`.
pub async fn version(spec: &RegistrySpec, insecure: bool) -> Result<String, ProbeError> {
    if let Some(digest) = &spec.digest {
        return Ok(format!("digest:{digest}"));
    }
    let scheme = if insecure { "http" } else { "https" };
    let url = format!(
        "{scheme}://{}/v2/{}/manifests/{}",
        spec.host,
        spec.repository,
        spec.reference()
    );
    let client = client()?;
    let mut token: Option<String> = None;
    for method in [Method::HEAD, Method::HEAD, Method::GET] {
        let mut request = Request::builder()
            .method(method.clone())
            .uri(url.as_str())
            .header(header::ACCEPT, ACCEPT);
        if let Some(t) = &token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let request = request
            .body(Empty::new())
            .map_err(|e| ProbeError::Invalid(format!("{url}: {e}")))?;
        let response = send(&client, request, &url).await?;
        let status = response.status();
        if status == StatusCode::UNAUTHORIZED && token.is_none() {
            let challenge = response
                .headers()
                .get(header::WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            token = Some(anonymous_token(&client, &challenge, spec, &url).await?);
            continue;
        }
        if !status.is_success() {
            let hint = match status {
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                    ": the image is not public: give registry.secretRef (then every fire imports)"
                }
                StatusCode::NOT_FOUND => ": check the repository and the tag",
                _ => "",
            };
            return Err(ProbeError::Status { url, status, hint });
        }
        let named = response
            .headers()
            .get(DIGEST_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        if let Some(digest) = named {
            return checked(&digest, &url).map(|d| format!("digest:{d}"));
        }
        if method == Method::GET {
            let body = Limited::new(response.into_body(), MAX_MANIFEST)
                .collect()
                .await
                .map_err(|e| ProbeError::Unreachable {
                    url: url.clone(),
                    why: format!("reading the manifest (at most {MAX_MANIFEST} bytes): {e}"),
                })?
                .to_bytes();
            return Ok(format!("digest:sha256:{}", hex(&Sha256::digest(&body))));
        }
        // No digest header on HEAD: the manifest itself is hashed (GET, next turn).
    }
    Err(ProbeError::Unreachable {
        url,
        why: "the registry asked for a token again after giving one".into(),
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A digest header's value when it is `sha256:` and 64 lower-case hex digits.
fn checked(digest: &str, url: &str) -> Result<String, ProbeError> {
    let ok = digest.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    });
    if ok {
        Ok(digest.to_string())
    } else {
        Err(ProbeError::Unreachable {
            url: url.to_string(),
            why: "the registry named a manifest digest that is not sha256:HEX".into(),
        })
    }
}

/// The parameters of a `Bearer` challenge (`realm`, `service`, `scope`); None for any
/// other scheme.
pub fn bearer_challenge(header: &str) -> Option<Vec<(String, String)>> {
    let (scheme, rest) = header.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let mut params = Vec::new();
    let mut rest = rest.trim();
    while !rest.is_empty() {
        let (key, after) = rest.split_once('=')?;
        let after = after.trim_start();
        let (value, tail) = match after.strip_prefix('"') {
            Some(quoted) => {
                let end = quoted.find('"')?;
                (&quoted[..end], &quoted[end + 1..])
            }
            None => match after.find(',') {
                Some(i) => (&after[..i], &after[i..]),
                None => (after, ""),
            },
        };
        params.push((key.trim().to_ascii_lowercase(), value.to_string()));
        rest = tail.trim_start().trim_start_matches(',').trim_start();
    }
    Some(params)
}

/// An anonymous pull token from the realm of `challenge`.
async fn anonymous_token(
    client: &super::probe::HttpClient,
    challenge: &str,
    spec: &RegistrySpec,
    url: &str,
) -> Result<String, ProbeError> {
    let Some(params) = bearer_challenge(challenge) else {
        return Err(ProbeError::Status {
            url: url.to_string(),
            status: StatusCode::UNAUTHORIZED,
            hint: ": the registry wants credentials: give registry.secretRef (then every fire imports)",
        });
    };
    let get = |k: &str| {
        params
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    };
    let realm = get("realm").ok_or_else(|| ProbeError::Unreachable {
        url: url.to_string(),
        why: "a Bearer challenge without a realm".into(),
    })?;
    let scope = get("scope").unwrap_or_else(|| format!("repository:{}:pull", spec.repository));
    let mut token_url = url::Url::parse(&realm)
        .map_err(|e| ProbeError::Invalid(format!("the token realm {}: {e}", shown(&realm))))?;
    {
        let mut query = token_url.query_pairs_mut();
        if let Some(service) = get("service") {
            query.append_pair("service", &service);
        }
        query.append_pair("scope", &scope);
    }
    let request = Request::builder()
        .method(Method::GET)
        .uri(token_url.as_str())
        .body(Empty::new())
        .map_err(|e| ProbeError::Invalid(format!("{}: {e}", shown(&realm))))?;
    let response = send(client, request, &shown(&realm)).await?;
    let status = response.status();
    if !status.is_success() {
        return Err(ProbeError::Status {
            url: shown(&realm),
            status,
            hint: ": no anonymous token for this image: give registry.secretRef (then every fire imports)",
        });
    }
    let body = Limited::new(response.into_body(), MAX_TOKEN_ANSWER)
        .collect()
        .await
        .map_err(|e| ProbeError::Unreachable {
            url: shown(&realm),
            why: format!("reading the token: {e}"),
        })?
        .to_bytes();
    let answer: serde_json::Value =
        serde_json::from_slice(&body).map_err(|_| ProbeError::Unreachable {
            url: shown(&realm),
            why: "the token service's answer is not JSON".into(),
        })?;
    answer
        .get("token")
        .or_else(|| answer.get("access_token"))
        .and_then(|t| t.as_str())
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .ok_or_else(|| ProbeError::Unreachable {
            url: shown(&realm),
            why: "the token service's answer holds no token".into(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bearer_challenge_is_read_and_others_are_not() {
        let params = bearer_challenge(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/alpine:pull""#,
        )
        .unwrap();
        assert_eq!(
            params,
            [
                (
                    "realm".to_string(),
                    "https://auth.docker.io/token".to_string()
                ),
                ("service".to_string(), "registry.docker.io".to_string()),
                (
                    "scope".to_string(),
                    "repository:library/alpine:pull".to_string()
                ),
            ]
        );
        let unquoted = bearer_challenge("bearer realm=https://r/t, service=s").unwrap();
        assert_eq!(unquoted[1], ("service".to_string(), "s".to_string()));
        assert!(bearer_challenge(r#"Basic realm="registry""#).is_none());
        assert!(bearer_challenge(r#"Bearer realm="unterminated"#).is_none());
        assert!(bearer_challenge("").is_none());
    }

    #[test]
    fn a_pinned_digest_is_its_own_version_and_bad_digests_are_refused() {
        let spec = RegistrySpec {
            host: "registry.example.com".into(),
            repository: "vms/fedora".into(),
            tag: None,
            digest: Some(format!("sha256:{}", "ab".repeat(32))),
        };
        let version = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(super::version(&spec, false))
            .unwrap();
        assert_eq!(version, format!("digest:sha256:{}", "ab".repeat(32)));
        assert!(checked("sha256:XYZ", "u").is_err());
        assert!(checked("md5:00", "u").is_err());
    }
}
