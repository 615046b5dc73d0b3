//! The input as a VMDK image; see `ferry_fuzz_drivers::vmdk_image`.
#![no_main]

libfuzzer_sys::fuzz_target!(|d: &[u8]| ferry_fuzz_drivers::vmdk_image(d));
