//! NBD transmission-phase replies after a valid handshake; see `ferry_fuzz_drivers::nbd_replies`.
#![no_main]

libfuzzer_sys::fuzz_target!(|d: &[u8]| ferry_fuzz_drivers::nbd_replies(d));
