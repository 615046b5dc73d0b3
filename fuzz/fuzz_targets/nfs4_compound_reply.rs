//! NFSv4 COMPOUND replies, result by result; see `ferry_fuzz_drivers::nfs4_compound_reply`.
#![no_main]

libfuzzer_sys::fuzz_target!(|d: &[u8]| ferry_fuzz_drivers::nfs4_compound_reply(d));
