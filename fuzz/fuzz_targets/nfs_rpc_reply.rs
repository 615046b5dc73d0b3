//! ONC RPC replies as a connection's reader takes them; see `ferry_fuzz_drivers::nfs_rpc_reply`.
#![no_main]

libfuzzer_sys::fuzz_target!(|d: &[u8]| ferry_fuzz_drivers::nfs_rpc_reply(d));
