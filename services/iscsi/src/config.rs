//! What a session is configured with, and what login negotiated.

use std::fmt;
use std::time::Duration;

/// CHAP credentials. Debug never shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Chap {
    pub user: String,
    pub secret: String,
}

impl fmt::Debug for Chap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chap")
            .field("user", &self.user)
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// Session settings (what the initiator offers at login).
#[derive(Debug, Clone)]
pub struct Config {
    pub initiator_name: String,
    /// CHAP credentials the target checks; None offers no authentication.
    pub chap: Option<Chap>,
    /// Credentials the target must prove (mutual CHAP); requires `chap`.
    pub mutual_chap: Option<Chap>,
    pub header_digest: bool,
    pub data_digest: bool,
    /// MaxRecvDataSegmentLength we declare (and bound every received segment by).
    pub max_recv_data_segment_length: u32,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub immediate_data: bool,
    pub initial_r2t: bool,
    pub max_outstanding_r2t: u32,
    pub connect_timeout: Duration,
    /// None: wait for commands forever; else abort a command through task management.
    pub request_timeout: Option<Duration>,
    /// Commands in flight on the session (the target's CmdSN window bounds it too).
    pub max_in_flight: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            initiator_name: "iqn.2024-01.io.ferry:initiator".into(),
            chap: None,
            mutual_chap: None,
            header_digest: false,
            data_digest: false,
            max_recv_data_segment_length: 256 * 1024,
            max_burst_length: 16 * 1024 * 1024 - 512,
            first_burst_length: 256 * 1024,
            immediate_data: true,
            initial_r2t: false,
            max_outstanding_r2t: 1,
            connect_timeout: Duration::from_secs(30),
            request_timeout: Some(Duration::from_secs(60)),
            max_in_flight: 64,
        }
    }
}

/// Operational parameters in force after login.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    pub header_digest: bool,
    pub data_digest: bool,
    /// What we may send in one PDU (the target's MaxRecvDataSegmentLength).
    pub max_xmit_data_segment_length: u32,
    /// What the target may send us.
    pub max_recv_data_segment_length: u32,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub immediate_data: bool,
    pub initial_r2t: bool,
    pub max_outstanding_r2t: u32,
}

impl Default for Params {
    /// RFC 7143 defaults.
    fn default() -> Self {
        Self {
            header_digest: false,
            data_digest: false,
            max_xmit_data_segment_length: 8192,
            max_recv_data_segment_length: 8192,
            max_burst_length: 262_144,
            first_burst_length: 65_536,
            immediate_data: true,
            initial_r2t: true,
            max_outstanding_r2t: 1,
        }
    }
}
