//! Every pure parser of server messages on arbitrary bytes; the first byte picks one.
#![no_main]

use ferry_nbd::{proto::*, wire};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % 10 {
        0 => {
            if let Ok(b) = <&[u8; 18]>::try_from(rest) {
                let _ = wire::parse_greeting(b);
            }
        }
        1 => {
            if let Ok(b) = <&[u8; 20]>::try_from(rest) {
                let _ = wire::parse_option_reply_header(b);
            }
        }
        2 => {
            let _ = wire::parse_info(rest);
        }
        3 => {
            let _ = wire::parse_server(rest);
        }
        4 => {
            let _ = wire::parse_meta_context(rest);
        }
        5 => {
            if rest.len() >= 4 {
                let magic = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]);
                let _ = wire::parse_reply_header(magic, &rest[4..]);
                for mode in [
                    wire::ReplyMode::Simple,
                    wire::ReplyMode::Structured,
                    wire::ReplyMode::Extended,
                ] {
                    let _ = wire::reply_header_rest(magic, mode);
                }
            }
        }
        6 => {
            if rest.len() >= 2 {
                let kind = u16::from_be_bytes([rest[0], rest[1]]) | REPLY_TYPE_FLAG_ERROR;
                let _ = wire::parse_error_chunk(kind, &rest[2..]);
                let _ = wire::parse_error_chunk(REPLY_TYPE_ERROR, &rest[2..]);
                let _ = wire::parse_error_chunk(REPLY_TYPE_ERROR_OFFSET, &rest[2..]);
            }
        }
        7 => {
            let _ = wire::parse_hole(rest);
        }
        8 => {
            let _ = wire::parse_block_status(REPLY_TYPE_BLOCK_STATUS, rest);
        }
        _ => {
            let _ = wire::parse_block_status(REPLY_TYPE_BLOCK_STATUS_EXT, rest);
        }
    }
});
