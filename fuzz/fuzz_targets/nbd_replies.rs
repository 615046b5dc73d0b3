//! Transmission-phase replies: a valid handshake (extended headers or structured replies,
//! chosen by the first byte), then arbitrary reply bytes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut bytes = ferry_fuzz::handshake(mode & 1 == 1);
    bytes.extend_from_slice(rest);
    ferry_fuzz::session(bytes);
});
