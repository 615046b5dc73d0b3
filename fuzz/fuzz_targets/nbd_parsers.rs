//! Every pure parser of NBD server messages; see `ferry_fuzz_drivers::nbd_parsers`.
#![no_main]

libfuzzer_sys::fuzz_target!(|d: &[u8]| ferry_fuzz_drivers::nbd_parsers(d));
