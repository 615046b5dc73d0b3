//! XDR primitives and every NFSv3, MOUNT and portmapper reply decoder; see `ferry_fuzz_drivers::nfs_xdr`.
#![no_main]

libfuzzer_sys::fuzz_target!(|d: &[u8]| ferry_fuzz_drivers::nfs_xdr(d));
