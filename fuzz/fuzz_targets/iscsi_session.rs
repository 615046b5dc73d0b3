//! The whole iSCSI initiator against a scripted target; see `ferry_fuzz_drivers::iscsi_session`.
#![no_main]

libfuzzer_sys::fuzz_target!(|d: &[u8]| ferry_fuzz_drivers::iscsi_session(d));
