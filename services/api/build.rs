//! Compiles proto/ferry/v1 into the gRPC service and client (tonic + prost), and writes the
//! file descriptor set that server reflection serves. protoc comes from protoc-bin-vendored,
//! so a fresh machine builds with no manual step. The client stubs are generated with the
//! `client` feature, the server traits with `server`: the operator links no server code.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let files = [
        proto_root.join("ferry/v1/jobs.proto"),
        proto_root.join("ferry/v1/schedules.proto"),
        proto_root.join("ferry/v1/backups.proto"),
    ];
    println!(
        "cargo:rerun-if-changed={}",
        proto_root.join("ferry/v1").display()
    );
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    // Maps as BTreeMap: a request encodes to the same bytes every time, which the
    // idempotency fingerprint relies on.
    config.btree_map(["."]);
    tonic_prost_build::configure()
        .build_client(std::env::var_os("CARGO_FEATURE_CLIENT").is_some())
        .build_server(std::env::var_os("CARGO_FEATURE_SERVER").is_some())
        .file_descriptor_set_path(out_dir.join("ferry_v1_descriptor.bin"))
        .compile_with_config(config, &files, &[proto_root])?;
    Ok(())
}
