//! ferry-iscsi's pure parsers on arbitrary bytes: PDU framing (with and without digests,
//! bounded segment length), text keys, CHAP binary values, sense data, VPD pages,
//! READ CAPACITY(16) and GET LBA STATUS data. The first byte picks one.
#![no_main]

use ferry_iscsi::pdu::{Digests, Pdu};
use ferry_iscsi::{scsi, text};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % 8 {
        0 | 1 => {
            let digests = Digests {
                header: which & 0x10 != 0,
                data: which & 0x20 != 0,
            };
            let mut buf = rest;
            while let Ok(Some((pdu, used))) = Pdu::parse(buf, digests, 8192) {
                assert!(pdu.data.len() <= 8192);
                assert!(used > 0 && used <= buf.len());
                buf = &buf[used..];
            }
        }
        2 => {
            if let Ok(pairs) = text::decode(rest) {
                let _ = ferry_iscsi::parse_send_targets(&pairs);
                assert_eq!(text::decode(&text::encode(&pairs)).ok(), Some(pairs));
            }
        }
        3 => {
            if let Ok(s) = std::str::from_utf8(rest) {
                let _ = text::decode_binary(s);
            }
        }
        4 => {
            if let Some(s) = scsi::Sense::parse(rest) {
                let _ = s.to_string();
            }
        }
        5 => {
            let _ = scsi::BlockLimits::parse(rest);
            let _ = scsi::Provisioning::parse(rest);
            let _ = scsi::Inquiry::parse(rest);
        }
        6 => {
            let _ = scsi::Capacity::parse(rest).map(|c| c.bytes());
        }
        _ => {
            let _ = scsi::parse_lba_status(rest);
        }
    }
});
