//! The NBD export server against arbitrary client bytes; see `ferry_fuzz_drivers::nbd_server`.
#![no_main]

libfuzzer_sys::fuzz_target!(|d: &[u8]| ferry_fuzz_drivers::nbd_server(d));
