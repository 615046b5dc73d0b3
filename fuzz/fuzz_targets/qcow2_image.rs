//! The input as a qcow2 image file; see `ferry_fuzz_drivers::qcow2_image`.
#![no_main]

libfuzzer_sys::fuzz_target!(|d: &[u8]| ferry_fuzz_drivers::qcow2_image(d));
