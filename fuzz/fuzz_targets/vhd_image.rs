//! The input as a VHD image; see `ferry_fuzz_drivers::vhd_image`.
#![no_main]

libfuzzer_sys::fuzz_target!(|d: &[u8]| ferry_fuzz_drivers::vhd_image(d));
