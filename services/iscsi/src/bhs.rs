//! The layout of the 48-byte basic header segment (RFC 7143 section 11), in one place.
//!
//! Every PDU type the initiator sends or receives is a plain struct of its named fields
//! with `to_bhs` (encode) and `from_bhs` (decode). The tables below are the only place in
//! the crate where the offset or flag mask of a header field appears; both directions are
//! copies of at most 48 bytes, with no allocation, so the data path may decode every PDU.

/// Length of the basic header segment.
pub const BHS_LEN: usize = 48;

/// Opcodes (initiator to target).
pub mod op {
    pub const NOP_OUT: u8 = 0x00;
    pub const SCSI_CMD: u8 = 0x01;
    pub const TMF_REQ: u8 = 0x02;
    pub const LOGIN_REQ: u8 = 0x03;
    pub const TEXT_REQ: u8 = 0x04;
    pub const DATA_OUT: u8 = 0x05;
    pub const LOGOUT_REQ: u8 = 0x06;
    // Target to initiator.
    pub const NOP_IN: u8 = 0x20;
    pub const SCSI_RSP: u8 = 0x21;
    pub const TMF_RSP: u8 = 0x22;
    pub const LOGIN_RSP: u8 = 0x23;
    pub const TEXT_RSP: u8 = 0x24;
    pub const DATA_IN: u8 = 0x25;
    pub const LOGOUT_RSP: u8 = 0x26;
    pub const R2T: u8 = 0x31;
    pub const ASYNC: u8 = 0x32;
    pub const REJECT: u8 = 0x3f;
}

/// The immediate-delivery bit of byte 0 (requests).
pub const IMMEDIATE: u8 = 0x40;
/// The final (F) bit of byte 1.
pub const FINAL: u8 = 0x80;
/// The reserved tag value (an ITT or TTT that names no task).
pub const RESERVED_TAG: u32 = 0xffff_ffff;

/// Byte 0: bit 7 reserved, bit 6 immediate, bits 0-5 the opcode.
const OPCODE_BYTE: usize = 0;
const OPCODE_MASK: u8 = 0x3f;
const RESERVED_BIT: u8 = 0x80;
const FLAGS_BYTE: usize = 1;
const TOTAL_AHS_LENGTH: usize = 4;
/// DataSegmentLength: 24 bits at bytes 5..8.
const DATA_SEGMENT_LENGTH: usize = 5;
const LUN: usize = 8;
const ITT: usize = 16;

/// A basic header segment as it is on the wire.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Bhs(pub [u8; BHS_LEN]);

impl std::fmt::Debug for Bhs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Bhs(op=0x{:02x} flags=0x{:02x} itt=0x{:08x} dsl={})",
            self.opcode(),
            self.flags(),
            self.itt(),
            self.data_len()
        )
    }
}

impl Default for Bhs {
    fn default() -> Self {
        Self([0; BHS_LEN])
    }
}

impl Bhs {
    /// The first [`BHS_LEN`] bytes of `bytes` (a rejected header quoted in a Reject's data).
    pub fn from_prefix(bytes: &[u8]) -> Option<Self> {
        bytes.get(..BHS_LEN)?.try_into().ok().map(Self)
    }
    pub fn opcode(&self) -> u8 {
        self.0[OPCODE_BYTE] & OPCODE_MASK
    }
    /// Byte 1, whose bits each PDU type defines.
    pub fn flags(&self) -> u8 {
        self.0[FLAGS_BYTE]
    }
    /// Whether the reserved top bit of byte 0 is set (it must not be).
    pub fn reserved_bit(&self) -> bool {
        self.0[OPCODE_BYTE] & RESERVED_BIT != 0
    }
    /// TotalAHSLength in bytes.
    pub fn ahs_len(&self) -> usize {
        usize::from(self.0[TOTAL_AHS_LENGTH]) * 4
    }
    /// Declares no additional header segments (the initiator sends none).
    pub fn clear_ahs_len(&mut self) {
        self.0[TOTAL_AHS_LENGTH] = 0;
    }
    /// DataSegmentLength (without padding).
    pub fn data_len(&self) -> usize {
        let d = &self.0[DATA_SEGMENT_LENGTH..DATA_SEGMENT_LENGTH + 3];
        (usize::from(d[0]) << 16) | (usize::from(d[1]) << 8) | usize::from(d[2])
    }
    /// Sets DataSegmentLength; it is a 24-bit field, so only the low 24 bits of `len` count.
    pub fn set_data_len(&mut self, len: usize) {
        let len = (len as u32).to_be_bytes();
        self.0[DATA_SEGMENT_LENGTH..DATA_SEGMENT_LENGTH + 3].copy_from_slice(&len[1..]);
    }
    /// The Initiator Task Tag, at the same place in every PDU type.
    pub fn itt(&self) -> u32 {
        field::at::get(&self.0, ITT)
    }
    /// The LUN field (PDU types without one keep it reserved).
    pub fn lun(&self) -> [u8; 8] {
        field::at::get(&self.0, LUN)
    }
}

/// How one field is read from and written to the header bytes.
mod field {
    use super::BHS_LEN;

    type Bytes = [u8; BHS_LEN];

    /// A multi-byte big-endian field or a byte string at an offset.
    pub(super) trait Value: Sized {
        fn read(b: &Bytes, at: usize) -> Self;
        fn write(self, b: &mut Bytes, at: usize);
    }

    impl Value for u8 {
        fn read(b: &Bytes, at: usize) -> Self {
            b[at]
        }
        fn write(self, b: &mut Bytes, at: usize) {
            b[at] = self;
        }
    }

    impl Value for u16 {
        fn read(b: &Bytes, at: usize) -> Self {
            u16::from_be_bytes([b[at], b[at + 1]])
        }
        fn write(self, b: &mut Bytes, at: usize) {
            b[at..at + 2].copy_from_slice(&self.to_be_bytes());
        }
    }

    impl Value for u32 {
        fn read(b: &Bytes, at: usize) -> Self {
            u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
        }
        fn write(self, b: &mut Bytes, at: usize) {
            b[at..at + 4].copy_from_slice(&self.to_be_bytes());
        }
    }

    impl<const N: usize> Value for [u8; N] {
        fn read(b: &Bytes, at: usize) -> Self {
            let mut v = [0u8; N];
            v.copy_from_slice(&b[at..at + N]);
            v
        }
        fn write(self, b: &mut Bytes, at: usize) {
            b[at..at + N].copy_from_slice(&self);
        }
    }

    /// A field of its own bytes at an offset.
    pub(super) mod at {
        use super::{Bytes, Value};
        pub(in super::super) fn get<T: Value>(b: &Bytes, at: usize) -> T {
            T::read(b, at)
        }
        pub(in super::super) fn put<T: Value>(b: &mut Bytes, v: T, at: usize) {
            v.write(b, at)
        }
    }

    /// A one-bit flag: `mask` in byte `byte`.
    pub(super) mod flag {
        use super::Bytes;
        pub(in super::super) fn get(b: &Bytes, byte: usize, mask: u8) -> bool {
            b[byte] & mask != 0
        }
        pub(in super::super) fn put(b: &mut Bytes, v: bool, byte: usize, mask: u8) {
            if v {
                b[byte] |= mask;
            } else {
                b[byte] &= !mask;
            }
        }
    }

    /// A value of several bits: the bits of `mask` in byte `byte`, shifted down.
    pub(super) mod bits {
        use super::Bytes;
        pub(in super::super) fn get(b: &Bytes, byte: usize, mask: u8) -> u8 {
            (b[byte] & mask) >> mask.trailing_zeros()
        }
        pub(in super::super) fn put(b: &mut Bytes, v: u8, byte: usize, mask: u8) {
            b[byte] = (b[byte] & !mask) | ((v << mask.trailing_zeros()) & mask);
        }
    }
}

/// Declares one PDU type: a struct of its named fields, each placed by `at(offset)`,
/// `flag(byte, mask)` or `bits(byte, mask)`, with its encoding and decoding.
macro_rules! pdu_type {
    (
        $(#[$meta:meta])*
        $name:ident = $opcode:expr;
        $( $(#[$fmeta:meta])* $field:ident : $ty:ty = $kind:ident ( $($arg:expr),+ ) ),+ $(,)?
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct $name {
            $( $(#[$fmeta])* pub $field: $ty, )+
        }

        impl $name {
            pub const OPCODE: u8 = $opcode;

            /// The header with these fields (DataSegmentLength and TotalAHSLength zero).
            pub fn to_bhs(&self) -> Bhs {
                let mut b = Bhs::default();
                b.0[OPCODE_BYTE] = Self::OPCODE;
                $( field::$kind::put(&mut b.0, self.$field, $($arg),+); )+
                b
            }

            /// Reads the fields of this PDU type from `bhs` (whose opcode the caller checked).
            pub fn from_bhs(bhs: &Bhs) -> Self {
                Self {
                    $( $field: field::$kind::get(&bhs.0, $($arg),+), )+
                }
            }
        }
    };
}

// Bits of byte 1 shared by several types.
const CONTINUE: u8 = 0x40;
const READ: u8 = 0x40;
const WRITE: u8 = 0x20;
const TASK_ATTRIBUTES: u8 = 0x07;
const ACKNOWLEDGE: u8 = 0x40;
const BIDI_OVERFLOW: u8 = 0x10;
const BIDI_UNDERFLOW: u8 = 0x08;
const RESIDUAL_OVERFLOW: u8 = 0x04;
const RESIDUAL_UNDERFLOW: u8 = 0x02;
const STATUS_PRESENT: u8 = 0x01;
/// Login: T (transit), C, CSG (bits 2-3), NSG (bits 0-1).
const TRANSIT: u8 = 0x80;
const CURRENT_STAGE: u8 = 0x0c;
const NEXT_STAGE: u8 = 0x03;
/// Task management function / logout reason: the 7 bits under F.
const FUNCTION: u8 = 0x7f;

pdu_type! {
    /// SCSI Command (11.3).
    ScsiCommand = op::SCSI_CMD;
    immediate: bool = flag(OPCODE_BYTE, IMMEDIATE),
    final_: bool = flag(FLAGS_BYTE, FINAL),
    read: bool = flag(FLAGS_BYTE, READ),
    write: bool = flag(FLAGS_BYTE, WRITE),
    /// ATTR: see [`task_attr`].
    task_attr: u8 = bits(FLAGS_BYTE, TASK_ATTRIBUTES),
    lun: [u8; 8] = at(LUN),
    itt: u32 = at(ITT),
    expected_data_transfer_length: u32 = at(20),
    cmd_sn: u32 = at(24),
    exp_stat_sn: u32 = at(28),
    cdb: [u8; 16] = at(32),
}

pdu_type! {
    /// SCSI Response (11.4).
    ScsiResponse = op::SCSI_RSP;
    bidi_overflow: bool = flag(FLAGS_BYTE, BIDI_OVERFLOW),
    bidi_underflow: bool = flag(FLAGS_BYTE, BIDI_UNDERFLOW),
    residual_overflow: bool = flag(FLAGS_BYTE, RESIDUAL_OVERFLOW),
    residual_underflow: bool = flag(FLAGS_BYTE, RESIDUAL_UNDERFLOW),
    /// 0 is "command completed at target".
    response: u8 = at(2),
    status: u8 = at(3),
    itt: u32 = at(ITT),
    snack_tag: u32 = at(20),
    stat_sn: u32 = at(24),
    exp_cmd_sn: u32 = at(28),
    max_cmd_sn: u32 = at(32),
    exp_data_sn: u32 = at(36),
    bidi_read_residual_count: u32 = at(40),
    residual_count: u32 = at(44),
}

pdu_type! {
    /// Task Management Function Request (11.5).
    TaskManagementRequest = op::TMF_REQ;
    immediate: bool = flag(OPCODE_BYTE, IMMEDIATE),
    final_: bool = flag(FLAGS_BYTE, FINAL),
    /// See [`tmf`].
    function: u8 = bits(FLAGS_BYTE, FUNCTION),
    lun: [u8; 8] = at(LUN),
    itt: u32 = at(ITT),
    referenced_task_tag: u32 = at(20),
    cmd_sn: u32 = at(24),
    exp_stat_sn: u32 = at(28),
    ref_cmd_sn: u32 = at(32),
    exp_data_sn: u32 = at(36),
}

pdu_type! {
    /// Task Management Function Response (11.6).
    TaskManagementResponse = op::TMF_RSP;
    final_: bool = flag(FLAGS_BYTE, FINAL),
    response: u8 = at(2),
    itt: u32 = at(ITT),
    stat_sn: u32 = at(24),
    exp_cmd_sn: u32 = at(28),
    max_cmd_sn: u32 = at(32),
}

pdu_type! {
    /// SCSI Data-Out (11.7).
    DataOut = op::DATA_OUT;
    final_: bool = flag(FLAGS_BYTE, FINAL),
    lun: [u8; 8] = at(LUN),
    itt: u32 = at(ITT),
    ttt: u32 = at(20),
    exp_stat_sn: u32 = at(28),
    data_sn: u32 = at(36),
    buffer_offset: u32 = at(40),
}

pdu_type! {
    /// SCSI Data-In (11.7).
    DataIn = op::DATA_IN;
    final_: bool = flag(FLAGS_BYTE, FINAL),
    acknowledge: bool = flag(FLAGS_BYTE, ACKNOWLEDGE),
    residual_overflow: bool = flag(FLAGS_BYTE, RESIDUAL_OVERFLOW),
    residual_underflow: bool = flag(FLAGS_BYTE, RESIDUAL_UNDERFLOW),
    /// S: this PDU carries the command's status (and StatSN).
    status_present: bool = flag(FLAGS_BYTE, STATUS_PRESENT),
    status: u8 = at(3),
    lun: [u8; 8] = at(LUN),
    itt: u32 = at(ITT),
    ttt: u32 = at(20),
    stat_sn: u32 = at(24),
    exp_cmd_sn: u32 = at(28),
    max_cmd_sn: u32 = at(32),
    data_sn: u32 = at(36),
    buffer_offset: u32 = at(40),
    residual_count: u32 = at(44),
}

pdu_type! {
    /// Ready To Transfer (11.8).
    R2t = op::R2T;
    final_: bool = flag(FLAGS_BYTE, FINAL),
    lun: [u8; 8] = at(LUN),
    itt: u32 = at(ITT),
    ttt: u32 = at(20),
    stat_sn: u32 = at(24),
    exp_cmd_sn: u32 = at(28),
    max_cmd_sn: u32 = at(32),
    r2t_sn: u32 = at(36),
    buffer_offset: u32 = at(40),
    desired_data_transfer_length: u32 = at(44),
}

pdu_type! {
    /// Asynchronous Message (11.9).
    AsyncMessage = op::ASYNC;
    final_: bool = flag(FLAGS_BYTE, FINAL),
    lun: [u8; 8] = at(LUN),
    itt: u32 = at(ITT),
    stat_sn: u32 = at(24),
    exp_cmd_sn: u32 = at(28),
    max_cmd_sn: u32 = at(32),
    /// See [`async_event`].
    async_event: u8 = at(36),
    async_vcode: u8 = at(37),
    parameter1: u16 = at(38),
    parameter2: u16 = at(40),
    parameter3: u16 = at(42),
}

pdu_type! {
    /// Text Request (11.10).
    TextRequest = op::TEXT_REQ;
    immediate: bool = flag(OPCODE_BYTE, IMMEDIATE),
    final_: bool = flag(FLAGS_BYTE, FINAL),
    continue_: bool = flag(FLAGS_BYTE, CONTINUE),
    lun: [u8; 8] = at(LUN),
    itt: u32 = at(ITT),
    ttt: u32 = at(20),
    cmd_sn: u32 = at(24),
    exp_stat_sn: u32 = at(28),
}

pdu_type! {
    /// Text Response (11.11).
    TextResponse = op::TEXT_RSP;
    final_: bool = flag(FLAGS_BYTE, FINAL),
    /// C: the text continues in the next response.
    continue_: bool = flag(FLAGS_BYTE, CONTINUE),
    lun: [u8; 8] = at(LUN),
    itt: u32 = at(ITT),
    ttt: u32 = at(20),
    stat_sn: u32 = at(24),
    exp_cmd_sn: u32 = at(28),
    max_cmd_sn: u32 = at(32),
}

pdu_type! {
    /// Login Request (11.12).
    LoginRequest = op::LOGIN_REQ;
    immediate: bool = flag(OPCODE_BYTE, IMMEDIATE),
    transit: bool = flag(FLAGS_BYTE, TRANSIT),
    continue_: bool = flag(FLAGS_BYTE, CONTINUE),
    /// CSG: see [`stage`].
    current_stage: u8 = bits(FLAGS_BYTE, CURRENT_STAGE),
    /// NSG: meaningful only with `transit`.
    next_stage: u8 = bits(FLAGS_BYTE, NEXT_STAGE),
    version_max: u8 = at(2),
    version_min: u8 = at(3),
    isid: [u8; 6] = at(8),
    tsih: u16 = at(14),
    itt: u32 = at(ITT),
    cid: u16 = at(20),
    cmd_sn: u32 = at(24),
    exp_stat_sn: u32 = at(28),
}

pdu_type! {
    /// Login Response (11.13).
    LoginResponse = op::LOGIN_RSP;
    transit: bool = flag(FLAGS_BYTE, TRANSIT),
    continue_: bool = flag(FLAGS_BYTE, CONTINUE),
    current_stage: u8 = bits(FLAGS_BYTE, CURRENT_STAGE),
    next_stage: u8 = bits(FLAGS_BYTE, NEXT_STAGE),
    version_max: u8 = at(2),
    version_active: u8 = at(3),
    isid: [u8; 6] = at(8),
    tsih: u16 = at(14),
    itt: u32 = at(ITT),
    stat_sn: u32 = at(24),
    exp_cmd_sn: u32 = at(28),
    max_cmd_sn: u32 = at(32),
    /// See [`login_status`].
    status_class: u8 = at(36),
    status_detail: u8 = at(37),
}

pdu_type! {
    /// Logout Request (11.14).
    LogoutRequest = op::LOGOUT_REQ;
    immediate: bool = flag(OPCODE_BYTE, IMMEDIATE),
    final_: bool = flag(FLAGS_BYTE, FINAL),
    /// 0 closes the session.
    reason_code: u8 = bits(FLAGS_BYTE, FUNCTION),
    itt: u32 = at(ITT),
    cid: u16 = at(20),
    cmd_sn: u32 = at(24),
    exp_stat_sn: u32 = at(28),
}

pdu_type! {
    /// Logout Response (11.15).
    LogoutResponse = op::LOGOUT_RSP;
    final_: bool = flag(FLAGS_BYTE, FINAL),
    response: u8 = at(2),
    itt: u32 = at(ITT),
    stat_sn: u32 = at(24),
    exp_cmd_sn: u32 = at(28),
    max_cmd_sn: u32 = at(32),
    time2wait: u16 = at(40),
    time2retain: u16 = at(42),
}

pdu_type! {
    /// Reject (11.17); its data segment quotes the rejected header.
    Reject = op::REJECT;
    final_: bool = flag(FLAGS_BYTE, FINAL),
    reason: u8 = at(2),
    itt: u32 = at(ITT),
    stat_sn: u32 = at(24),
    exp_cmd_sn: u32 = at(28),
    max_cmd_sn: u32 = at(32),
    /// DataSN or R2TSN of a rejected SNACK.
    data_sn: u32 = at(36),
}

pdu_type! {
    /// NOP-Out (11.18).
    NopOut = op::NOP_OUT;
    immediate: bool = flag(OPCODE_BYTE, IMMEDIATE),
    final_: bool = flag(FLAGS_BYTE, FINAL),
    lun: [u8; 8] = at(LUN),
    itt: u32 = at(ITT),
    ttt: u32 = at(20),
    cmd_sn: u32 = at(24),
    exp_stat_sn: u32 = at(28),
}

pdu_type! {
    /// NOP-In (11.19).
    NopIn = op::NOP_IN;
    final_: bool = flag(FLAGS_BYTE, FINAL),
    lun: [u8; 8] = at(LUN),
    itt: u32 = at(ITT),
    ttt: u32 = at(20),
    stat_sn: u32 = at(24),
    exp_cmd_sn: u32 = at(28),
    max_cmd_sn: u32 = at(32),
}

/// SCSI Command task attributes (ATTR).
pub mod task_attr {
    pub const UNTAGGED: u8 = 0;
    pub const SIMPLE: u8 = 1;
}

/// Task management functions.
pub mod tmf {
    pub const ABORT_TASK: u8 = 1;
}

/// Login stages (CSG and NSG).
pub mod stage {
    pub const SECURITY: u8 = 0;
    pub const OPERATIONAL: u8 = 1;
    pub const FULL_FEATURE: u8 = 3;
}

/// Login response Status-Class values and the Status-Detail values of class 2.
pub mod login_status {
    pub const SUCCESS: u8 = 0;
    pub const REDIRECTION: u8 = 1;
    pub const INITIATOR_ERROR: u8 = 2;
    pub const AUTHENTICATION_FAILURE: u8 = 0x01;
    pub const AUTHORIZATION_FAILURE: u8 = 0x02;
    pub const NOT_FOUND: u8 = 0x03;
    pub const TARGET_REMOVED: u8 = 0x04;
}

/// Asynchronous Message events (AsyncEvent).
pub mod async_event {
    /// The target asks the initiator to log out.
    pub const LOGOUT_REQUESTED: u8 = 1;
    /// The target will drop the connection.
    pub const CONNECTION_DROPPED: u8 = 2;
    /// The target will drop every connection of the session.
    pub const SESSION_DROPPED: u8 = 3;
}

/// The logout reason code that closes the whole session.
pub const LOGOUT_CLOSE_SESSION: u8 = 0;
/// The Response of a SCSI Response: the command completed at the target.
pub const COMMAND_COMPLETED: u8 = 0;
/// The Response of a Logout Response: the session or connection closed successfully.
pub const LOGOUT_SUCCESSFUL: u8 = 0;

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Bhs {
        let bytes: Vec<u8> = s
            .split_whitespace()
            .map(|b| u8::from_str_radix(b, 16).unwrap())
            .collect();
        Bhs::from_prefix(&bytes).unwrap()
    }

    // Headers captured from tgtd 1.0.85 answering a READ(16) of 24 blocks with an
    // Expected Data Transfer Length of 12800 (a Python initiator on loopback).

    #[test]
    fn data_in_decodes_a_captured_header() {
        // The last Data-In: F, U and S set, 4096 bytes at 8192, 512 bytes short.
        let bhs = hex("25 83 00 00 00 00 10 00 00 00 00 00 00 00 00 00 \
                       00 00 01 08 ff ff ff ff 00 00 00 03 00 00 00 03 \
                       00 00 00 83 00 00 00 01 00 00 20 00 00 00 02 00");
        assert_eq!(bhs.opcode(), op::DATA_IN);
        assert_eq!(bhs.data_len(), 4096);
        assert_eq!(bhs.itt(), 0x108);
        let d = DataIn::from_bhs(&bhs);
        assert!(d.final_ && d.status_present && d.residual_underflow);
        assert!(!d.residual_overflow && !d.acknowledge);
        assert_eq!(d.status, 0);
        assert_eq!(d.lun, [0; 8]);
        assert_eq!(d.ttt, RESERVED_TAG);
        assert_eq!((d.stat_sn, d.exp_cmd_sn, d.max_cmd_sn), (3, 3, 0x83));
        assert_eq!(d.data_sn, 1);
        assert_eq!(d.buffer_offset, 8192);
        assert_eq!(d.residual_count, 512);
        let mut back = d.to_bhs();
        back.set_data_len(4096);
        assert_eq!(back, bhs);
    }

    #[test]
    fn scsi_response_decodes_a_captured_header() {
        // CHECK CONDITION (the unit attention after login) with 20 bytes of sense.
        let bhs = hex("21 80 00 02 00 00 00 14 00 00 00 00 00 00 00 00 \
                       00 00 01 07 00 00 00 00 00 00 00 02 00 00 00 02 \
                       00 00 00 82 00 00 00 00 00 00 00 00 00 00 00 00");
        assert_eq!(bhs.data_len(), 20);
        let r = ScsiResponse::from_bhs(&bhs);
        assert_eq!((r.response, r.status), (COMMAND_COMPLETED, 2));
        assert_eq!(r.itt, 0x107);
        assert_eq!((r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn), (2, 2, 0x82));
        assert!(!r.residual_underflow && !r.residual_overflow);
        assert_eq!(r.residual_count, 0);
    }

    #[test]
    fn login_response_decodes_a_captured_header() {
        // The answer to operational negotiation: transit from stage 1 to 3, TSIH 0x100.
        let bhs = hex("23 87 00 00 00 00 00 84 80 01 02 03 00 00 01 00 \
                       00 00 00 00 00 00 00 00 00 00 00 01 00 00 00 01 \
                       00 00 00 02 00 00 00 00 00 00 00 00 00 00 00 00");
        let r = LoginResponse::from_bhs(&bhs);
        assert!(r.transit && !r.continue_);
        assert_eq!(
            (r.current_stage, r.next_stage),
            (stage::OPERATIONAL, stage::FULL_FEATURE)
        );
        assert_eq!(r.isid, [0x80, 1, 2, 3, 0, 0]);
        assert_eq!(r.tsih, 0x100);
        assert_eq!((r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn), (1, 1, 2));
        assert_eq!(
            (r.status_class, r.status_detail),
            (login_status::SUCCESS, 0)
        );
    }

    #[test]
    fn scsi_command_encodes_the_rfc_layout() {
        let cdb = [0x88, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 8, 0, 0];
        let cmd = ScsiCommand {
            final_: true,
            read: true,
            task_attr: task_attr::SIMPLE,
            lun: [0, 1, 0, 0, 0, 0, 0, 0],
            itt: 0x100,
            expected_data_transfer_length: 4096,
            cmd_sn: 7,
            exp_stat_sn: 9,
            cdb,
            ..ScsiCommand::default()
        };
        let bhs = cmd.to_bhs();
        let mut want = [0u8; BHS_LEN];
        want[..2].copy_from_slice(&[0x01, 0xc1]);
        want[9] = 1;
        want[16..20].copy_from_slice(&0x100u32.to_be_bytes());
        want[20..24].copy_from_slice(&4096u32.to_be_bytes());
        want[24..28].copy_from_slice(&7u32.to_be_bytes());
        want[28..32].copy_from_slice(&9u32.to_be_bytes());
        want[32..48].copy_from_slice(&cdb);
        assert_eq!(bhs.0, want);
        assert_eq!(ScsiCommand::from_bhs(&bhs), cmd);
    }

    #[test]
    fn login_flags_and_stages() {
        let req = LoginRequest {
            immediate: true,
            transit: true,
            current_stage: stage::OPERATIONAL,
            next_stage: stage::FULL_FEATURE,
            isid: [0x80, 1, 2, 3, 0, 0],
            tsih: 0x1234,
            itt: 5,
            cmd_sn: 1,
            exp_stat_sn: 2,
            ..LoginRequest::default()
        };
        let bhs = req.to_bhs();
        assert_eq!(&bhs.0[..2], &[0x43, 0x87]);
        assert_eq!(&bhs.0[8..16], &[0x80, 1, 2, 3, 0, 0, 0x12, 0x34]);
        assert_eq!(LoginRequest::from_bhs(&bhs), req);
        let mut rsp = [0u8; BHS_LEN];
        rsp[..2].copy_from_slice(&[0x23, 0x41]);
        rsp[36..38].copy_from_slice(&[2, 1]);
        let rsp = LoginResponse::from_bhs(&Bhs(rsp));
        assert!(rsp.continue_ && !rsp.transit);
        assert_eq!((rsp.current_stage, rsp.next_stage), (0, 1));
        assert_eq!(
            (rsp.status_class, rsp.status_detail),
            (
                login_status::INITIATOR_ERROR,
                login_status::AUTHENTICATION_FAILURE
            )
        );
    }

    #[test]
    fn every_type_round_trips() {
        fn check<T: PartialEq + std::fmt::Debug>(v: T, enc: fn(&T) -> Bhs, dec: fn(&Bhs) -> T) {
            let b = enc(&v);
            assert_eq!(dec(&b), v);
        }
        let r2t = R2t {
            final_: true,
            itt: 1,
            ttt: 2,
            stat_sn: 3,
            exp_cmd_sn: 4,
            max_cmd_sn: 5,
            r2t_sn: 6,
            buffer_offset: 7,
            desired_data_transfer_length: 8,
            ..R2t::default()
        };
        check(r2t, R2t::to_bhs, R2t::from_bhs);
        assert_eq!(r2t.to_bhs().0[44..48], 8u32.to_be_bytes());
        let rsp = ScsiResponse {
            residual_underflow: true,
            bidi_overflow: true,
            response: 1,
            status: 2,
            itt: 3,
            stat_sn: 4,
            exp_cmd_sn: 5,
            max_cmd_sn: 6,
            residual_count: 7,
            ..ScsiResponse::default()
        };
        check(rsp, ScsiResponse::to_bhs, ScsiResponse::from_bhs);
        assert_eq!(rsp.to_bhs().0[1], 0x12);
        let tmf = TaskManagementRequest {
            immediate: true,
            final_: true,
            function: tmf::ABORT_TASK,
            referenced_task_tag: 9,
            ref_cmd_sn: 10,
            ..TaskManagementRequest::default()
        };
        check(
            tmf,
            TaskManagementRequest::to_bhs,
            TaskManagementRequest::from_bhs,
        );
        assert_eq!(&tmf.to_bhs().0[..2], &[0x42, 0x81]);
        let out = DataOut {
            final_: true,
            itt: 1,
            ttt: 2,
            exp_stat_sn: 3,
            data_sn: 4,
            buffer_offset: 5,
            ..DataOut::default()
        };
        check(out, DataOut::to_bhs, DataOut::from_bhs);
        let am = AsyncMessage {
            async_event: async_event::SESSION_DROPPED,
            parameter3: 4,
            ..AsyncMessage::default()
        };
        check(am, AsyncMessage::to_bhs, AsyncMessage::from_bhs);
        assert_eq!(am.to_bhs().0[36], 3);
        check(
            TextRequest {
                final_: true,
                ttt: RESERVED_TAG,
                ..TextRequest::default()
            },
            TextRequest::to_bhs,
            TextRequest::from_bhs,
        );
        check(
            TextResponse {
                continue_: true,
                ttt: 3,
                ..TextResponse::default()
            },
            TextResponse::to_bhs,
            TextResponse::from_bhs,
        );
        check(
            LogoutRequest {
                immediate: true,
                final_: true,
                reason_code: 2,
                cid: 1,
                ..LogoutRequest::default()
            },
            LogoutRequest::to_bhs,
            LogoutRequest::from_bhs,
        );
        check(
            LogoutResponse {
                response: 1,
                time2wait: 2,
                time2retain: 3,
                ..LogoutResponse::default()
            },
            LogoutResponse::to_bhs,
            LogoutResponse::from_bhs,
        );
        check(
            Reject {
                reason: 9,
                data_sn: 2,
                ..Reject::default()
            },
            Reject::to_bhs,
            Reject::from_bhs,
        );
        check(
            NopOut {
                ttt: 5,
                lun: [1; 8],
                ..NopOut::default()
            },
            NopOut::to_bhs,
            NopOut::from_bhs,
        );
        check(
            NopIn {
                ttt: 6,
                max_cmd_sn: 7,
                ..NopIn::default()
            },
            NopIn::to_bhs,
            NopIn::from_bhs,
        );
        check(
            TaskManagementResponse {
                response: 5,
                ..TaskManagementResponse::default()
            },
            TaskManagementResponse::to_bhs,
            TaskManagementResponse::from_bhs,
        );
    }

    #[test]
    fn framing_fields() {
        let mut b = NopIn::default().to_bhs();
        assert_eq!(b.opcode(), op::NOP_IN);
        b.set_data_len(0x12_3456);
        assert_eq!(&b.0[4..8], &[0, 0x12, 0x34, 0x56]);
        assert_eq!(b.data_len(), 0x12_3456);
        b.0[4] = 2;
        assert_eq!(b.ahs_len(), 8);
        b.clear_ahs_len();
        assert_eq!(b.ahs_len(), 0);
        assert!(!b.reserved_bit());
        b.0[0] |= 0x80;
        assert!(b.reserved_bit());
        assert_eq!(b.opcode(), op::NOP_IN);
        assert!(Bhs::from_prefix(&[0u8; 47]).is_none());
    }
}
