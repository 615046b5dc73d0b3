//! A resource's endpoint as the mover sees it, as a ferry-api `Endpoint`: a claim becomes
//! its path inside the pod (see [`super::layout`]), Secret keys the files they are
//! projected to, NFS options the URL's query options as ferry parses them, and the typed
//! options of the URL's scheme their `Endpoint.options` (mapped by [`super::wire`]).

use ferry_api::proto;

use super::{find_pvc, layout, wire, MoverError, ResolvedPvc};
use crate::crd::{Endpoint, HttpOptions, NfsOptions, PvcRef};

/// An endpoint as the mover sees it: a claim becomes its path, Secret keys their files.
pub fn endpoint(e: &Endpoint, pvcs: &[ResolvedPvc]) -> Result<proto::Endpoint, MoverError> {
    let (url, options) = match &e.pvc {
        Some(r) => (layout::pvc_image(r, find_pvc(pvcs, &r.name)?.mode), None),
        None => {
            let mut url = e.url.clone().unwrap_or_default();
            if let Some(nfs) = &e.nfs {
                url.push_str(&nfs_query(nfs));
            }
            (url, options(e))
        }
    };
    Ok(proto::Endpoint {
        url,
        options,
        format: wire::image_format(e.format.unwrap_or_default()) as i32,
        allow_backing: e.allow_backing.unwrap_or(false),
        ..proto::Endpoint::default()
    })
}

/// The image of a whole claim (its device when Block, `disk.img` when Filesystem): the
/// target of a claim created from a template, or of a restore.
pub fn claim_image(pvc: &ResolvedPvc) -> proto::Endpoint {
    let r = PvcRef {
        name: pvc.name.clone(),
        path: None,
        namespace: None,
    };
    proto::Endpoint {
        url: layout::pvc_image(&r, pvc.mode),
        ..proto::Endpoint::default()
    }
}

/// The typed options of the URL's scheme (at most one is set: the spec's validation).
fn options(e: &Endpoint) -> Option<proto::endpoint::Options> {
    if let Some(s3) = &e.s3 {
        return Some(proto::endpoint::Options::S3(wire::s3_options(s3)));
    }
    if let Some(http) = &e.http {
        return Some(proto::endpoint::Options::Http(http_options(http)));
    }
    if let Some(iscsi) = &e.iscsi {
        return Some(proto::endpoint::Options::Iscsi(proto::IscsiOptions {
            user: iscsi.user.clone().unwrap_or_default(),
            password: iscsi.password.as_ref().map(wire::secret_ref),
        }));
    }
    if let Some(r) = &e.registry {
        let file = |name: &str| format!("{}/{name}", layout::REGISTRY_DIR);
        return Some(proto::endpoint::Options::Registry(proto::RegistryOptions {
            auth_file: r
                .secret_ref
                .as_ref()
                .map_or_else(String::new, |_| file(layout::REGISTRY_AUTH_FILE)),
            ca_file: r
                .cert_config_map
                .as_ref()
                .map_or_else(String::new, |_| file(layout::REGISTRY_CA_FILE)),
            insecure: r.insecure.unwrap_or(false),
            platform: r.platform.clone().unwrap_or_default(),
        }));
    }
    let nbd = e.nbd.as_ref()?;
    let dir = match (&nbd.tls_secret_name, nbd.mover_certificate) {
        (Some(secret), _) => layout::nbd_tls_dir(secret),
        (None, Some(true)) => layout::RELAY_TLS_DIR.to_string(),
        _ => return None,
    };
    Some(proto::endpoint::Options::Nbd(proto::NbdOptions {
        tls_certificates_dir: dir,
    }))
}

fn http_options(http: &HttpOptions) -> proto::HttpOptions {
    proto::HttpOptions {
        user: http.user.clone().unwrap_or_default(),
        password: http.password.as_ref().map(wire::secret_ref),
        bearer_token: http.bearer_token.as_ref().map(wire::secret_ref),
        headers: http
            .headers
            .iter()
            .map(|h| proto::HttpHeader {
                name: h.name.clone(),
                value: Some(wire::secret_ref(&h.value_from)),
            })
            .collect(),
        ca_certificates: http.ca_certificates.as_ref().map(wire::secret_ref),
        client_certificate: http.client_certificate.as_ref().map(wire::secret_ref),
        client_key: http.client_key.as_ref().map(wire::secret_ref),
        ..proto::HttpOptions::default()
    }
}

/// `?version=..&uid=..` in the order ferry documents them; empty when nothing is set.
fn nfs_query(nfs: &NfsOptions) -> String {
    let pairs: Vec<String> = [
        ("version", nfs.version.map(u64::from)),
        ("nfsport", nfs.nfs_port.map(u64::from)),
        ("mountport", nfs.mount_port.map(u64::from)),
        ("uid", nfs.uid.map(u64::from)),
        ("gid", nfs.gid.map(u64::from)),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.map(|v| format!("{k}={v}")))
    .collect();
    if pairs.is_empty() {
        String::new()
    } else {
        format!("?{}", pairs.join("&"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{HttpHeader, ImageFormat, SecretKeyRef, VolumeMode};

    fn secret(name: &str, key: &str) -> SecretKeyRef {
        SecretKeyRef {
            name: name.into(),
            key: key.into(),
        }
    }

    fn file(name: &str) -> Option<proto::SecretRef> {
        Some(proto::SecretRef {
            source: Some(proto::secret_ref::Source::File(name.into())),
        })
    }

    #[test]
    fn s3_credentials_become_secret_files_and_nfs_options_the_query() {
        let mut s3 = Endpoint::url("s3://bucket/key");
        s3.s3 = Some(crate::crd::S3Options {
            region: Some("eu-west-1".into()),
            access_key_id: Some(secret("s3", "id")),
            secret_access_key: Some(secret("s3", "key")),
            force_path_style: Some(true),
            ..crate::crd::S3Options::default()
        });
        assert_eq!(
            endpoint(&s3, &[]).unwrap(),
            proto::Endpoint {
                url: "s3://bucket/key".into(),
                options: Some(proto::endpoint::Options::S3(proto::S3Options {
                    endpoint_url: String::new(),
                    region: "eu-west-1".into(),
                    access_key_id: file("s3/id"),
                    secret_access_key: file("s3/key"),
                    session_token: None,
                    force_path_style: true,
                })),
                ..proto::Endpoint::default()
            }
        );
        let mut nfs = Endpoint::url("nfs://server/export/disk.img");
        nfs.nfs = Some(NfsOptions {
            version: Some(4),
            uid: Some(107),
            gid: Some(107),
            ..NfsOptions::default()
        });
        assert_eq!(
            endpoint(&nfs, &[]).unwrap().url,
            "nfs://server/export/disk.img?version=4&uid=107&gid=107"
        );
        let mut nbd = Endpoint::url("nbds://h/e");
        nbd.nbd = Some(crate::crd::NbdOptions {
            tls_secret_name: Some("certs".into()),
            ..Default::default()
        });
        assert_eq!(
            endpoint(&nbd, &[]).unwrap().options,
            Some(proto::endpoint::Options::Nbd(proto::NbdOptions {
                tls_certificates_dir: "/var/run/ferry/nbd-tls/certs".into()
            }))
        );
        let mut docker = Endpoint::url("docker://registry.example.com/vms/fedora:41");
        docker.registry = Some(crate::crd::RegistryOptions {
            secret_ref: Some("pull-secret".into()),
            cert_config_map: Some("registry-ca".into()),
            platform: Some("linux/arm64".into()),
            insecure: Some(true),
        });
        assert_eq!(
            endpoint(&docker, &[]).unwrap().options,
            Some(proto::endpoint::Options::Registry(proto::RegistryOptions {
                auth_file: "/var/run/ferry/registry/auth.json".into(),
                ca_file: "/var/run/ferry/registry/ca.crt".into(),
                insecure: true,
                platform: "linux/arm64".into(),
            }))
        );
        docker.registry = Some(crate::crd::RegistryOptions::default());
        assert_eq!(
            endpoint(&docker, &[]).unwrap().options,
            Some(proto::endpoint::Options::Registry(
                proto::RegistryOptions::default()
            ))
        );
        let mut relay = Endpoint::url("nbds://10.0.0.7:10810/?tls-hostname=g0.vms.mover.ferry.dev");
        relay.nbd = Some(crate::crd::NbdOptions {
            mover_certificate: Some(true),
            ..Default::default()
        });
        assert_eq!(
            endpoint(&relay, &[]).unwrap().options,
            Some(proto::endpoint::Options::Nbd(proto::NbdOptions {
                tls_certificates_dir: "/var/run/ferry/relay-tls".into()
            }))
        );
        assert_eq!(
            endpoint(&Endpoint::pvc("gone"), &[]).unwrap_err(),
            MoverError::UnresolvedPvc("gone".into())
        );
        let mut zst = Endpoint::url("s3://bucket/disk.raw.zst");
        zst.format = Some(ImageFormat::Zst);
        zst.allow_backing = Some(true);
        let wire = endpoint(&zst, &[]).unwrap();
        assert_eq!(
            (wire.format, wire.allow_backing),
            (proto::ImageFormat::Zst as i32, true)
        );
        assert_eq!(
            endpoint(&s3, &[]).unwrap().format,
            proto::ImageFormat::Auto as i32
        );
    }

    #[test]
    fn http_credentials_and_headers_become_secret_files() {
        let mut http = Endpoint::url("https://images.example/disk.qcow2");
        http.http = Some(HttpOptions {
            user: Some("me".into()),
            password: Some(secret("web", "password")),
            headers: vec![HttpHeader {
                name: "X-Api-Key".into(),
                value_from: secret("web", "api-key"),
            }],
            ..HttpOptions::default()
        });
        let Some(proto::endpoint::Options::Http(o)) = endpoint(&http, &[]).unwrap().options else {
            panic!("no HTTP options")
        };
        assert_eq!(
            o,
            proto::HttpOptions {
                user: "me".into(),
                password: file("web/password"),
                headers: vec![proto::HttpHeader {
                    name: "X-Api-Key".into(),
                    value: file("web/api-key"),
                }],
                ..proto::HttpOptions::default()
            }
        );
    }

    #[test]
    fn a_claim_is_its_image_inside_the_mover() {
        let pvcs = [
            ResolvedPvc::new("fs", VolumeMode::Filesystem),
            ResolvedPvc::new("blk", VolumeMode::Block),
        ];
        let mut fs = Endpoint::pvc("fs");
        fs.format = Some(ImageFormat::Qcow2);
        let wire = endpoint(&fs, &pvcs).unwrap();
        assert_eq!(wire.url, "/var/run/ferry/volumes/fs/disk.img");
        assert_eq!(wire.options, None);
        assert_eq!(wire.format, proto::ImageFormat::Qcow2 as i32);
        assert_eq!(claim_image(&pvcs[1]).url, "/dev/ferry/blk");
        assert_eq!(
            claim_image(&pvcs[0]).url,
            "/var/run/ferry/volumes/fs/disk.img"
        );
    }
}
