//! ferry-iscsi's pure parsers; see `ferry_fuzz_drivers::iscsi_pdu`.
#![no_main]

libfuzzer_sys::fuzz_target!(|d: &[u8]| ferry_fuzz_drivers::iscsi_pdu(d));
