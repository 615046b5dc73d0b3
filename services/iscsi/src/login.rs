//! The login phase (RFC 7143 sections 6 and 12): security negotiation (None, CHAP with MD5,
//! mutual CHAP) and operational negotiation, on a connection not yet shared by tasks.
//! Also SendTargets discovery, which runs on such a connection too.

use md5::{Digest, Md5};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::config::{Config, Params};
use crate::error::{Error, Result};
use crate::pdu::{self, op, Bhs, Digests, Pdu, BHS_LEN, FINAL, IMMEDIATE};
use crate::text;

const TRANSIT: u8 = 0x80;
const CONTINUE: u8 = 0x40;
const STAGE_SECURITY: u8 = 0;
const STAGE_OPERATIONAL: u8 = 1;
const STAGE_FULL: u8 = 3;

/// Reads one PDU in the login phase: no digests, segments bounded by [`text::MAX_TEXT`].
pub(crate) async fn read_pdu(stream: &mut TcpStream, digests: Digests) -> Result<Pdu> {
    let mut bhs = Bhs::default();
    stream
        .read_exact(&mut bhs.0)
        .await
        .map_err(|e| Error::io("reading a PDU header", e))?;
    pdu::check_header(&bhs, text::MAX_TEXT)?;
    let rest = bhs.ahs_len()
        + if digests.header { 4 } else { 0 }
        + bhs.data_len()
        + pdu::pad(bhs.data_len())
        + if digests.data && bhs.data_len() > 0 {
            4
        } else {
            0
        };
    let mut buf = vec![0u8; BHS_LEN + rest];
    buf[..BHS_LEN].copy_from_slice(&bhs.0);
    stream
        .read_exact(&mut buf[BHS_LEN..])
        .await
        .map_err(|e| Error::io("reading a PDU", e))?;
    match Pdu::parse(&buf, digests, text::MAX_TEXT)? {
        Some((p, _)) => Ok(p),
        None => Err(Error::Protocol("truncated PDU".into())),
    }
}

pub(crate) async fn write_pdu(stream: &mut TcpStream, p: &Pdu, digests: Digests) -> Result<()> {
    stream
        .write_all(&p.encode(digests))
        .await
        .map_err(|e| Error::io("sending a PDU", e))
}

/// The state login leaves for the full-feature phase.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Established {
    pub params: Params,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    pub max_cmd_sn: u32,
}

struct Login<'a> {
    stream: &'a mut TcpStream,
    isid: [u8; 6],
    tsih: u16,
    cmd_sn: u32,
    exp_stat_sn: u32,
    max_cmd_sn: u32,
    itt: u32,
    /// "the target" or "the discovery portal", for errors.
    peer: &'static str,
    /// The CHAP user we authenticate as, if any (never the secret).
    chap_user: Option<&'a str>,
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    if getrandom::fill(&mut b).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let h = Md5::digest(t.to_le_bytes());
        for (i, x) in b.iter_mut().enumerate() {
            *x = h[i % 16];
        }
    }
    b
}

impl Login<'_> {
    /// Sends one login request and returns the response's keys and flags, following
    /// continuation (C bit) of the target's text.
    async fn exchange(
        &mut self,
        csg: u8,
        nsg: u8,
        transit: bool,
        keys: &[(String, String)],
    ) -> Result<(Vec<(String, String)>, u8)> {
        let mut data = text::encode(keys);
        let mut collected = Vec::new();
        loop {
            let mut flags = (csg << 2) | if transit { TRANSIT | nsg } else { 0 };
            if !transit {
                flags &= !3;
            }
            let mut bhs = Bhs::new(op::LOGIN_REQ | IMMEDIATE, flags);
            bhs.0[8..14].copy_from_slice(&self.isid);
            bhs.set_u16(14, self.tsih);
            bhs.set_itt(self.itt);
            bhs.set_u32(24, self.cmd_sn);
            bhs.set_u32(28, self.exp_stat_sn);
            write_pdu(
                self.stream,
                &Pdu::new(bhs, std::mem::take(&mut data)),
                Digests::default(),
            )
            .await?;
            let rsp = read_pdu(self.stream, Digests::default()).await?;
            let b = &rsp.bhs;
            if b.opcode() != op::LOGIN_RSP {
                return Err(Error::Protocol(format!(
                    "expected a login response, got opcode 0x{:02x}",
                    b.opcode()
                )));
            }
            let (class, detail) = (b.u8_at(36), b.u8_at(37));
            match class {
                0 => {}
                1 => {
                    return Err(Error::Login(format!(
                        "the target redirects (status 0x{class:02x}{detail:02x}); redirection is not supported"
                    )))
                }
                2 => {
                    let peer = self.peer;
                    return Err(match (detail, self.chap_user) {
                        (0x01, None) => Error::AuthFailed(format!(
                            "{peer} requires CHAP authentication and no credentials were given (status 0x0201)"
                        )),
                        (0x01, Some(user)) => Error::AuthFailed(format!(
                            "{peer} refused the CHAP credentials of user '{user}' (status 0x0201)"
                        )),
                        (0x02, _) => Error::AuthFailed(format!(
                            "this initiator is not authorized for {peer} (status 0x0202)"
                        )),
                        (0x03 | 0x04, _) => Error::TargetNotFound(format!(
                            "the target does not exist (status 0x02{detail:02x})"
                        )),
                        _ => Error::Login(format!("initiator error (status 0x02{detail:02x})")),
                    })
                }
                _ => {
                    return Err(Error::Login(format!(
                        "target error (status 0x{class:02x}{detail:02x})"
                    )))
                }
            }
            self.tsih = b.u16_at(14);
            self.exp_stat_sn = b.u32_at(24).wrapping_add(1);
            self.max_cmd_sn = b.u32_at(32);
            if collected.len() + rsp.data.len() > text::MAX_TEXT {
                return Err(Error::Protocol("login text too long".into()));
            }
            collected.extend_from_slice(&rsp.data);
            if b.flags() & CONTINUE == 0 {
                return Ok((text::decode(&collected)?, b.flags()));
            }
        }
    }
}

fn transits_to(flags: u8, stage: u8) -> bool {
    flags & TRANSIT != 0 && flags & 3 == stage
}

fn chap_response(id: u8, secret: &str, challenge: &[u8]) -> [u8; 16] {
    let mut h = Md5::new();
    h.update([id]);
    h.update(secret.as_bytes());
    h.update(challenge);
    h.finalize().into()
}

/// Logs in: `target` None makes a discovery session.
pub(crate) async fn login(
    stream: &mut TcpStream,
    config: &Config,
    target: Option<&str>,
) -> Result<Established> {
    let mut isid: [u8; 6] = random_bytes();
    isid[0] = 0x80;
    isid[4] = 0;
    isid[5] = 0;
    let mut l = Login {
        stream,
        isid,
        tsih: 0,
        cmd_sn: 1,
        exp_stat_sn: 0,
        max_cmd_sn: 1,
        itt: 0,
        peer: if target.is_some() {
            "the target"
        } else {
            "the discovery portal"
        },
        chap_user: config.chap.as_ref().map(|c| c.user.as_str()),
    };
    let kv = |k: &str, v: &str| (k.to_string(), v.to_string());

    // Security negotiation.
    let mut keys = vec![kv("InitiatorName", &config.initiator_name)];
    match target {
        Some(t) => {
            keys.push(kv("SessionType", "Normal"));
            keys.push(kv("TargetName", t));
        }
        None => keys.push(kv("SessionType", "Discovery")),
    }
    if config.mutual_chap.is_some() && config.chap.is_none() {
        return Err(Error::InvalidRequest(
            "mutual CHAP needs initiator CHAP credentials too".into(),
        ));
    }
    let methods = match (&config.chap, &config.mutual_chap) {
        (None, _) => "None",
        (Some(_), Some(_)) => "CHAP",
        (Some(_), None) => "CHAP,None",
    };
    keys.push(kv("AuthMethod", methods));
    let no_auth = config.chap.is_none();
    let (got, mut flags) = l
        .exchange(STAGE_SECURITY, STAGE_OPERATIONAL, no_auth, &keys)
        .await?;
    let method = text::get(&got, "AuthMethod").unwrap_or("None").to_string();
    if method == "CHAP" {
        let chap = config.chap.as_ref().ok_or_else(|| {
            Error::AuthFailed(format!(
                "{} requires CHAP authentication and no credentials were given",
                l.peer
            ))
        })?;
        let (got, _) = l
            .exchange(
                STAGE_SECURITY,
                STAGE_OPERATIONAL,
                false,
                &[kv("CHAP_A", "5")],
            )
            .await?;
        if text::get(&got, "CHAP_A") != Some("5") {
            return Err(Error::AuthFailed(
                "the target does not offer CHAP with MD5".into(),
            ));
        }
        let id: u8 = text::get(&got, "CHAP_I")
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| Error::Protocol("missing or bad CHAP_I".into()))?;
        let challenge = text::decode_binary(
            text::get(&got, "CHAP_C").ok_or_else(|| Error::Protocol("missing CHAP_C".into()))?,
        )?;
        let mut keys = vec![
            kv("CHAP_N", &chap.user),
            kv(
                "CHAP_R",
                &text::encode_hex(&chap_response(id, &chap.secret, &challenge)),
            ),
        ];
        let mutual = config.mutual_chap.as_ref().map(|m| {
            let id = random_bytes::<1>()[0];
            let c: [u8; 16] = random_bytes();
            (m, id, c)
        });
        if let Some((_, id, c)) = &mutual {
            keys.push(kv("CHAP_I", &id.to_string()));
            keys.push(kv("CHAP_C", &text::encode_hex(c)));
        }
        let (got, f) = l
            .exchange(STAGE_SECURITY, STAGE_OPERATIONAL, true, &keys)
            .await?;
        flags = f;
        if let Some((m, id, c)) = mutual {
            let name = text::get(&got, "CHAP_N");
            let resp = text::get(&got, "CHAP_R")
                .map(text::decode_binary)
                .transpose()?;
            if name != Some(m.user.as_str())
                || resp.as_deref() != Some(&chap_response(id, &m.secret, &c)[..])
            {
                return Err(Error::AuthFailed(format!(
                    "{} failed mutual CHAP authentication (its CHAP_N or CHAP_R does not match the configured account)",
                    l.peer
                )));
            }
        }
    } else if method == "None" {
        if config.mutual_chap.is_some() {
            return Err(Error::AuthFailed(format!(
                "mutual CHAP was required but {} chose no authentication",
                l.peer
            )));
        }
    } else if method == "Reject" && no_auth {
        return Err(Error::AuthFailed(format!(
            "{} requires authentication and no CHAP credentials were given",
            l.peer
        )));
    } else {
        return Err(Error::AuthFailed(format!(
            "{} wants authentication method {method:?}; supported: CHAP, None",
            l.peer
        )));
    }
    if !transits_to(flags, STAGE_OPERATIONAL) && !transits_to(flags, STAGE_FULL) {
        let (_, f) = l
            .exchange(STAGE_SECURITY, STAGE_OPERATIONAL, true, &[])
            .await?;
        flags = f;
        if !transits_to(flags, STAGE_OPERATIONAL) {
            return Err(Error::Login(
                "the target did not leave security negotiation".into(),
            ));
        }
    }

    // Operational negotiation.
    let yn = |b: bool| if b { "Yes" } else { "No" };
    let dg = |b: bool| if b { "CRC32C" } else { "None" };
    let mut keys = vec![
        kv("HeaderDigest", dg(config.header_digest)),
        kv("DataDigest", dg(config.data_digest)),
        kv(
            "MaxRecvDataSegmentLength",
            &config.max_recv_data_segment_length.to_string(),
        ),
    ];
    if target.is_some() {
        keys.extend([
            kv("InitialR2T", yn(config.initial_r2t)),
            kv("ImmediateData", yn(config.immediate_data)),
            kv("MaxBurstLength", &config.max_burst_length.to_string()),
            kv("FirstBurstLength", &config.first_burst_length.to_string()),
            kv(
                "MaxOutstandingR2T",
                &config.max_outstanding_r2t.max(1).to_string(),
            ),
            kv("MaxConnections", "1"),
            kv("DataPDUInOrder", "Yes"),
            kv("DataSequenceInOrder", "Yes"),
            kv("ErrorRecoveryLevel", "0"),
            kv("DefaultTime2Wait", "0"),
            kv("DefaultTime2Retain", "0"),
        ]);
    }
    let mut params = Params {
        max_recv_data_segment_length: config.max_recv_data_segment_length,
        ..Params::default()
    };
    let mut offered = keys.clone();
    let mut pending = keys;
    for _ in 0..8 {
        let (got, f) = l
            .exchange(STAGE_OPERATIONAL, STAGE_FULL, true, &pending)
            .await?;
        pending = Vec::new();
        for (k, v) in &got {
            let num = || -> Result<u32> {
                v.parse()
                    .map_err(|_| Error::Protocol(format!("bad value {v:?} for {k}")))
            };
            let ours = text::get(&offered, k).map(str::to_string);
            match k.as_str() {
                "HeaderDigest" => params.header_digest = v == "CRC32C",
                "DataDigest" => params.data_digest = v == "CRC32C",
                "MaxRecvDataSegmentLength" => {
                    params.max_xmit_data_segment_length = num()?.clamp(512, (1 << 24) - 1)
                }
                "MaxBurstLength" => {
                    params.max_burst_length = num()?.clamp(512, config.max_burst_length.max(512))
                }
                "FirstBurstLength" => {
                    params.first_burst_length =
                        num()?.clamp(512, config.first_burst_length.max(512))
                }
                "MaxOutstandingR2T" => params.max_outstanding_r2t = num()?.max(1),
                "ImmediateData" => params.immediate_data = config.immediate_data && v == "Yes",
                "InitialR2T" => params.initial_r2t = config.initial_r2t || v == "Yes",
                _ => {}
            }
            if ours.is_none()
                && !matches!(
                    k.as_str(),
                    "MaxRecvDataSegmentLength"
                        | "TargetAlias"
                        | "TargetPortalGroupTag"
                        | "TargetAddress"
                )
                && v != "NotUnderstood"
                && v != "Irrelevant"
                && v != "Reject"
            {
                // The target proposes a key we did not offer: accept its value.
                pending.push((k.clone(), v.clone()));
                offered.push((k.clone(), v.clone()));
            }
        }
        if transits_to(f, STAGE_FULL) && pending.is_empty() {
            if (config.header_digest && !params.header_digest)
                || (config.data_digest && !params.data_digest)
            {
                return Err(Error::Login(
                    "CRC32C digests were asked for but the target declined them".into(),
                ));
            }
            if target.is_none() {
                params.immediate_data = false;
            }
            if params.first_burst_length > params.max_burst_length {
                params.first_burst_length = params.max_burst_length;
            }
            return Ok(Established {
                params,
                cmd_sn: l.cmd_sn,
                exp_stat_sn: l.exp_stat_sn,
                max_cmd_sn: l.max_cmd_sn,
            });
        }
    }
    Err(Error::Login(
        "operational negotiation did not finish".into(),
    ))
}

/// A target named by SendTargets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveredTarget {
    pub name: String,
    /// `host:port,tag` strings, as the target sent them.
    pub addresses: Vec<String>,
}

/// Parses SendTargets response text.
pub fn parse_send_targets(pairs: &[(String, String)]) -> Vec<DiscoveredTarget> {
    let mut out: Vec<DiscoveredTarget> = Vec::new();
    for (k, v) in pairs {
        match k.as_str() {
            "TargetName" => out.push(DiscoveredTarget {
                name: v.clone(),
                addresses: Vec::new(),
            }),
            "TargetAddress" => {
                if let Some(t) = out.last_mut() {
                    t.addresses.push(v.clone());
                }
            }
            _ => {}
        }
    }
    out
}

/// SendTargets=All on a logged-in discovery connection, then logout.
pub(crate) async fn send_targets(
    stream: &mut TcpStream,
    est: Established,
) -> Result<Vec<DiscoveredTarget>> {
    let digests = Digests {
        header: est.params.header_digest,
        data: est.params.data_digest,
    };
    let mut data = text::encode(&[("SendTargets".into(), "All".into())]);
    let mut ttt = pdu::RESERVED_TAG;
    let mut exp_stat_sn = est.exp_stat_sn;
    let mut collected = Vec::new();
    loop {
        let mut bhs = Bhs::new(op::TEXT_REQ | IMMEDIATE, FINAL);
        bhs.set_itt(1);
        bhs.set_u32(20, ttt);
        bhs.set_u32(24, est.cmd_sn);
        bhs.set_u32(28, exp_stat_sn);
        write_pdu(stream, &Pdu::new(bhs, std::mem::take(&mut data)), digests).await?;
        let rsp = read_pdu(stream, digests).await?;
        if rsp.bhs.opcode() != op::TEXT_RSP {
            return Err(Error::Protocol(format!(
                "expected a text response, got opcode 0x{:02x}",
                rsp.bhs.opcode()
            )));
        }
        exp_stat_sn = rsp.bhs.u32_at(24).wrapping_add(1);
        if collected.len() + rsp.data.len() > text::MAX_TEXT {
            return Err(Error::Protocol("SendTargets answer too long".into()));
        }
        collected.extend_from_slice(&rsp.data);
        if rsp.bhs.flags() & CONTINUE == 0 {
            break;
        }
        ttt = rsp.bhs.u32_at(20);
    }
    let targets = parse_send_targets(&text::decode(&collected)?);
    let mut bhs = Bhs::new(op::LOGOUT_REQ | IMMEDIATE, FINAL);
    bhs.set_itt(2);
    bhs.set_u32(24, est.cmd_sn);
    bhs.set_u32(28, exp_stat_sn);
    write_pdu(stream, &Pdu::new(bhs, Vec::new()), digests).await?;
    let _ = read_pdu(stream, digests).await;
    Ok(targets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chap_md5_matches_rfc1994_construction() {
        // MD5(0x01 || "secret" || 0x00..0x0f), computed independently with Python hashlib.
        let c: Vec<u8> = (0..16).collect();
        let r = chap_response(1, "secret", &c);
        assert_eq!(text::encode_hex(&r), "0x740e86463bda3a4d7017d6e0fba0699d");
    }

    #[test]
    fn send_targets_parsing() {
        let pairs =
            text::decode(b"TargetName=iqn.a\0TargetAddress=1.2.3.4:3260,1\0TargetName=iqn.b\0")
                .unwrap();
        let t = parse_send_targets(&pairs);
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].addresses, vec!["1.2.3.4:3260,1".to_string()]);
    }
}
