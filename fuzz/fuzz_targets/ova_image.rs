//! The input as a OVA image; see `ferry_fuzz_drivers::ova_image`.
#![no_main]

libfuzzer_sys::fuzz_target!(|d: &[u8]| ferry_fuzz_drivers::ova_image(d));
