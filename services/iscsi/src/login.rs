//! The login phase (RFC 7143 sections 6 and 12): security negotiation (None, CHAP with MD5,
//! mutual CHAP) and operational negotiation, on a connection not yet shared by tasks.
//! Also SendTargets discovery, which runs on such a connection too.

use md5::{Digest, Md5};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::bhs::{
    login_status, stage, LoginRequest, LoginResponse, LogoutRequest, TextRequest, TextResponse,
};
use crate::config::{Chap, Config, Params};
use crate::error::{Error, Result};
use crate::pdu::{self, op, Bhs, Digests, Pdu, BHS_LEN, RESERVED_TAG};
use crate::text;

/// The ITT of every login request (one task at a time on a login connection).
const LOGIN_ITT: u32 = 0;
/// The CmdSN a new session starts with.
const FIRST_CMD_SN: u32 = 1;
/// ISID type 10b (random, RFC 7143 section 11.12.5) in the top bits of its first byte.
const ISID_TYPE_RANDOM: u8 = 0x80;
/// ISID bytes 4 and 5 (the qualifier) are zero.
const ISID_QUALIFIER: std::ops::Range<usize> = 4..6;
/// CHAP_A value of CHAP with MD5 (RFC 1994).
const CHAP_MD5: &str = "5";
/// Length of a CHAP challenge we send to the target (mutual CHAP).
const CHAP_CHALLENGE_LEN: usize = 16;
/// Operational negotiation rounds allowed before giving up on a target that keeps asking.
const MAX_OPERATIONAL_ROUNDS: usize = 8;
/// The range RFC 7143 (section 13.12) allows for MaxRecvDataSegmentLength.
const MIN_SEGMENT_LENGTH: u32 = 512;
const MAX_SEGMENT_LENGTH: u32 = (1 << 24) - 1;
/// The ITTs of the SendTargets text request and the logout after it.
const SEND_TARGETS_ITT: u32 = 1;
const DISCOVERY_LOGOUT_ITT: u32 = 2;

/// Reads one PDU in the login phase: no digests, segments bounded by [`text::MAX_TEXT`].
pub(crate) async fn read_pdu(stream: &mut TcpStream, digests: Digests) -> Result<Pdu> {
    let mut bhs = Bhs::default();
    stream
        .read_exact(&mut bhs.0)
        .await
        .map_err(|e| Error::io("reading a PDU header", e))?;
    pdu::check_header(&bhs, text::MAX_TEXT)?;
    let dl = bhs.data_len();
    let rest = bhs.ahs_len() + digests.header_len() + dl + pdu::pad(dl) + digests.data_len(dl);
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

type Keys = Vec<(String, String)>;

fn kv(k: &str, v: &str) -> (String, String) {
    (k.to_string(), v.to_string())
}

/// The target's answer to one login request: its keys and where it moves next.
struct Reply {
    keys: Keys,
    transit: bool,
    next_stage: u8,
}

impl Reply {
    fn transits_to(&self, stage: u8) -> bool {
        self.transit && self.next_stage == stage
    }
}

struct Login<'a> {
    stream: &'a mut TcpStream,
    isid: [u8; 6],
    tsih: u16,
    cmd_sn: u32,
    exp_stat_sn: u32,
    max_cmd_sn: u32,
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
            *x = h[i % h.len()];
        }
    }
    b
}

impl Login<'_> {
    /// Sends one login request and returns the target's answer, following continuation
    /// (C bit) of the target's text.
    async fn exchange(
        &mut self,
        current_stage: u8,
        next_stage: u8,
        transit: bool,
        keys: &[(String, String)],
    ) -> Result<Reply> {
        let mut data = text::encode(keys);
        let mut collected = Vec::new();
        loop {
            let bhs = LoginRequest {
                immediate: true,
                transit,
                current_stage,
                next_stage: if transit { next_stage } else { 0 },
                isid: self.isid,
                tsih: self.tsih,
                itt: LOGIN_ITT,
                cmd_sn: self.cmd_sn,
                exp_stat_sn: self.exp_stat_sn,
                ..LoginRequest::default()
            }
            .to_bhs();
            let request = Pdu::new(bhs, std::mem::take(&mut data));
            write_pdu(self.stream, &request, Digests::default()).await?;
            let rsp = read_pdu(self.stream, Digests::default()).await?;
            if rsp.bhs.opcode() != op::LOGIN_RSP {
                return Err(Error::Protocol(format!(
                    "expected a login response, got opcode 0x{:02x}",
                    rsp.bhs.opcode()
                )));
            }
            let b = LoginResponse::from_bhs(&rsp.bhs);
            self.check_status(&b)?;
            self.tsih = b.tsih;
            self.exp_stat_sn = b.stat_sn.wrapping_add(1);
            self.max_cmd_sn = b.max_cmd_sn;
            if collected.len() + rsp.data.len() > text::MAX_TEXT {
                return Err(Error::Protocol("login text too long".into()));
            }
            collected.extend_from_slice(&rsp.data);
            if !b.continue_ {
                return Ok(Reply {
                    keys: text::decode(&collected)?,
                    transit: b.transit,
                    next_stage: b.next_stage,
                });
            }
        }
    }

    /// The error a login response's Status-Class and Status-Detail stand for, if any.
    fn check_status(&self, b: &LoginResponse) -> Result<()> {
        let (class, detail) = (b.status_class, b.status_detail);
        let peer = self.peer;
        match class {
            login_status::SUCCESS => Ok(()),
            login_status::REDIRECTION => Err(Error::Login(format!(
                "the target redirects (status 0x{class:02x}{detail:02x}); redirection is not supported"
            ))),
            login_status::INITIATOR_ERROR => Err(match (detail, self.chap_user) {
                (login_status::AUTHENTICATION_FAILURE, None) => Error::AuthFailed(format!(
                    "{peer} requires CHAP authentication and no credentials were given (status 0x0201)"
                )),
                (login_status::AUTHENTICATION_FAILURE, Some(user)) => Error::AuthFailed(format!(
                    "{peer} refused the CHAP credentials of user '{user}' (status 0x0201)"
                )),
                (login_status::AUTHORIZATION_FAILURE, _) => Error::AuthFailed(format!(
                    "this initiator is not authorized for {peer} (status 0x0202)"
                )),
                (login_status::NOT_FOUND | login_status::TARGET_REMOVED, _) => {
                    Error::TargetNotFound(format!(
                        "the target does not exist (status 0x02{detail:02x})"
                    ))
                }
                _ => Error::Login(format!("initiator error (status 0x02{detail:02x})")),
            }),
            _ => Err(Error::Login(format!(
                "target error (status 0x{class:02x}{detail:02x})"
            ))),
        }
    }

    /// One request of security negotiation, asking to move on to operational negotiation.
    async fn security_exchange(
        &mut self,
        transit: bool,
        keys: &[(String, String)],
    ) -> Result<Reply> {
        self.exchange(stage::SECURITY, stage::OPERATIONAL, transit, keys)
            .await
    }
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
    isid[0] = ISID_TYPE_RANDOM;
    isid[ISID_QUALIFIER].fill(0);
    let mut l = Login {
        stream,
        isid,
        tsih: 0,
        cmd_sn: FIRST_CMD_SN,
        exp_stat_sn: 0,
        max_cmd_sn: FIRST_CMD_SN,
        peer: if target.is_some() {
            "the target"
        } else {
            "the discovery portal"
        },
        chap_user: config.chap.as_ref().map(|c| c.user.as_str()),
    };
    let last = negotiate_security(&mut l, config, target).await?;
    leave_security(&mut l, &last).await?;
    let params = negotiate_operational(&mut l, config, target.is_some()).await?;
    Ok(Established {
        params,
        cmd_sn: l.cmd_sn,
        exp_stat_sn: l.exp_stat_sn,
        max_cmd_sn: l.max_cmd_sn,
    })
}

/// The keys of the first login request: who we are, where we log in, how we authenticate.
fn security_keys(config: &Config, target: Option<&str>) -> Result<Keys> {
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
    Ok(keys)
}

/// Security negotiation: offers the methods we may use and runs the one the target picks.
/// Returns the target's last answer.
async fn negotiate_security(
    l: &mut Login<'_>,
    config: &Config,
    target: Option<&str>,
) -> Result<Reply> {
    let keys = security_keys(config, target)?;
    let no_auth = config.chap.is_none();
    let first = l.security_exchange(no_auth, &keys).await?;
    let method = text::get(&first.keys, "AuthMethod").unwrap_or("None");
    match method {
        "CHAP" => {
            let chap = config.chap.as_ref().ok_or_else(|| {
                Error::AuthFailed(format!(
                    "{} requires CHAP authentication and no credentials were given",
                    l.peer
                ))
            })?;
            authenticate_chap(l, chap, config.mutual_chap.as_ref()).await
        }
        "None" if config.mutual_chap.is_some() => Err(Error::AuthFailed(format!(
            "mutual CHAP was required but {} chose no authentication",
            l.peer
        ))),
        "None" => Ok(first),
        "Reject" if no_auth => Err(Error::AuthFailed(format!(
            "{} requires authentication and no CHAP credentials were given",
            l.peer
        ))),
        _ => Err(Error::AuthFailed(format!(
            "{} wants authentication method {method:?}; supported: CHAP, None",
            l.peer
        ))),
    }
}

/// CHAP with MD5 (RFC 7143 section 12.1.3): answers the target's challenge and, for mutual
/// CHAP, challenges the target and checks its answer.
async fn authenticate_chap(l: &mut Login<'_>, chap: &Chap, mutual: Option<&Chap>) -> Result<Reply> {
    let got = l
        .security_exchange(false, &[kv("CHAP_A", CHAP_MD5)])
        .await?
        .keys;
    if text::get(&got, "CHAP_A") != Some(CHAP_MD5) {
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
    let mutual = mutual.map(|m| {
        let [id] = random_bytes::<1>();
        let c: [u8; CHAP_CHALLENGE_LEN] = random_bytes();
        (m, id, c)
    });
    if let Some((_, id, c)) = &mutual {
        keys.push(kv("CHAP_I", &id.to_string()));
        keys.push(kv("CHAP_C", &text::encode_hex(c)));
    }
    let reply = l.security_exchange(true, &keys).await?;
    if let Some((m, id, c)) = mutual {
        verify_mutual(l.peer, &reply.keys, m, id, &c)?;
    }
    Ok(reply)
}

/// Checks the target's answer to our mutual CHAP challenge `c` with identifier `id`.
fn verify_mutual(peer: &str, got: &[(String, String)], m: &Chap, id: u8, c: &[u8]) -> Result<()> {
    let name = text::get(got, "CHAP_N");
    let resp = text::get(got, "CHAP_R")
        .map(text::decode_binary)
        .transpose()?;
    if name != Some(m.user.as_str())
        || resp.as_deref() != Some(&chap_response(id, &m.secret, c)[..])
    {
        return Err(Error::AuthFailed(format!(
            "{peer} failed mutual CHAP authentication (its CHAP_N or CHAP_R does not match the configured account)"
        )));
    }
    Ok(())
}

/// Makes sure the target has left security negotiation, asking once more if it has not.
async fn leave_security(l: &mut Login<'_>, last: &Reply) -> Result<()> {
    if last.transits_to(stage::OPERATIONAL) || last.transits_to(stage::FULL_FEATURE) {
        return Ok(());
    }
    let again = l.security_exchange(true, &[]).await?;
    if !again.transits_to(stage::OPERATIONAL) {
        return Err(Error::Login(
            "the target did not leave security negotiation".into(),
        ));
    }
    Ok(())
}

/// The operational keys we offer; a discovery session offers only the connection's.
fn operational_keys(config: &Config, normal: bool) -> Keys {
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
    if normal {
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
    keys
}

/// Operational negotiation (RFC 7143 section 13): offers our keys, takes the target's
/// answers into the parameters, and accepts keys the target proposes that we did not offer,
/// until the target moves to the full-feature phase.
async fn negotiate_operational(l: &mut Login<'_>, config: &Config, normal: bool) -> Result<Params> {
    let keys = operational_keys(config, normal);
    let mut params = Params {
        max_recv_data_segment_length: config.max_recv_data_segment_length,
        ..Params::default()
    };
    let mut offered = keys.clone();
    let mut pending = keys;
    for _ in 0..MAX_OPERATIONAL_ROUNDS {
        let reply = l
            .exchange(stage::OPERATIONAL, stage::FULL_FEATURE, true, &pending)
            .await?;
        pending = Vec::new();
        for (k, v) in &reply.keys {
            apply_operational_key(&mut params, config, k, v)?;
            if text::get(&offered, k).is_none() && is_target_proposal(k, v) {
                // The target proposes a key we did not offer: accept its value.
                pending.push((k.clone(), v.clone()));
                offered.push((k.clone(), v.clone()));
            }
        }
        if reply.transits_to(stage::FULL_FEATURE) && pending.is_empty() {
            return finish_params(params, config, normal);
        }
    }
    Err(Error::Login(
        "operational negotiation did not finish".into(),
    ))
}

/// Takes one key of the target's answer into the negotiated parameters.
fn apply_operational_key(params: &mut Params, config: &Config, k: &str, v: &str) -> Result<()> {
    let num = || -> Result<u32> {
        v.parse()
            .map_err(|_| Error::Protocol(format!("bad value {v:?} for {k}")))
    };
    let burst = |ours: u32| ours.max(MIN_SEGMENT_LENGTH);
    match k {
        "HeaderDigest" => params.header_digest = v == "CRC32C",
        "DataDigest" => params.data_digest = v == "CRC32C",
        "MaxRecvDataSegmentLength" => {
            params.max_xmit_data_segment_length =
                num()?.clamp(MIN_SEGMENT_LENGTH, MAX_SEGMENT_LENGTH)
        }
        "MaxBurstLength" => {
            params.max_burst_length =
                num()?.clamp(MIN_SEGMENT_LENGTH, burst(config.max_burst_length))
        }
        "FirstBurstLength" => {
            params.first_burst_length =
                num()?.clamp(MIN_SEGMENT_LENGTH, burst(config.first_burst_length))
        }
        "MaxOutstandingR2T" => params.max_outstanding_r2t = num()?.max(1),
        "ImmediateData" => params.immediate_data = config.immediate_data && v == "Yes",
        "InitialR2T" => params.initial_r2t = config.initial_r2t || v == "Yes",
        _ => {}
    }
    Ok(())
}

/// Whether a key we did not offer is a proposal to answer (not a declaration or a refusal).
fn is_target_proposal(k: &str, v: &str) -> bool {
    !matches!(
        k,
        "MaxRecvDataSegmentLength" | "TargetAlias" | "TargetPortalGroupTag" | "TargetAddress"
    ) && !matches!(v, "NotUnderstood" | "Irrelevant" | "Reject")
}

/// The parameters once negotiation is over: digests we asked for must have been granted.
fn finish_params(mut params: Params, config: &Config, normal: bool) -> Result<Params> {
    if (config.header_digest && !params.header_digest)
        || (config.data_digest && !params.data_digest)
    {
        return Err(Error::Login(
            "CRC32C digests were asked for but the target declined them".into(),
        ));
    }
    if !normal {
        params.immediate_data = false;
    }
    if params.first_burst_length > params.max_burst_length {
        params.first_burst_length = params.max_burst_length;
    }
    Ok(params)
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
    let mut ttt = RESERVED_TAG;
    let mut exp_stat_sn = est.exp_stat_sn;
    let mut collected = Vec::new();
    loop {
        let bhs = TextRequest {
            immediate: true,
            final_: true,
            itt: SEND_TARGETS_ITT,
            ttt,
            cmd_sn: est.cmd_sn,
            exp_stat_sn,
            ..TextRequest::default()
        }
        .to_bhs();
        write_pdu(stream, &Pdu::new(bhs, std::mem::take(&mut data)), digests).await?;
        let rsp = read_pdu(stream, digests).await?;
        if rsp.bhs.opcode() != op::TEXT_RSP {
            return Err(Error::Protocol(format!(
                "expected a text response, got opcode 0x{:02x}",
                rsp.bhs.opcode()
            )));
        }
        let b = TextResponse::from_bhs(&rsp.bhs);
        exp_stat_sn = b.stat_sn.wrapping_add(1);
        if collected.len() + rsp.data.len() > text::MAX_TEXT {
            return Err(Error::Protocol("SendTargets answer too long".into()));
        }
        collected.extend_from_slice(&rsp.data);
        if !b.continue_ {
            break;
        }
        ttt = b.ttt;
    }
    let targets = parse_send_targets(&text::decode(&collected)?);
    let bhs = LogoutRequest {
        immediate: true,
        final_: true,
        reason_code: crate::bhs::LOGOUT_CLOSE_SESSION,
        itt: DISCOVERY_LOGOUT_ITT,
        cmd_sn: est.cmd_sn,
        exp_stat_sn,
        ..LogoutRequest::default()
    }
    .to_bhs();
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
