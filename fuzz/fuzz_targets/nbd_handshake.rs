//! The whole NBD client against arbitrary server bytes; see `ferry_fuzz_drivers::nbd_handshake`.
#![no_main]

libfuzzer_sys::fuzz_target!(|d: &[u8]| ferry_fuzz_drivers::nbd_handshake(d));
