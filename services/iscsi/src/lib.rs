//! ferry-iscsi: an async iSCSI initiator (RFC 7143) over tokio.
//!
//! Login with security negotiation (None, CHAP with MD5, mutual CHAP) and operational
//! negotiation (digests, segment and burst lengths, immediate and unsolicited data);
//! SendTargets discovery; a full-feature session with many commands in flight inside the
//! target's CmdSN window; R2T, NOP, ABORT TASK on timeout, logout; and the SBC commands
//! a disk copy needs ([`Device`]). It knows nothing of ferry.

#![forbid(unsafe_code)]

pub mod bhs;
mod config;
mod device;
mod error;
mod login;
pub mod pdu;
mod reader;
pub mod scsi;
mod session;
pub mod text;

pub use config::{Chap, Config, Params};
pub use device::Device;
pub use error::{Error, Result};
pub use login::{parse_send_targets, DiscoveredTarget};
pub use session::{discover, encode_lun, Completion, DataBuf, Session, Transfer};
