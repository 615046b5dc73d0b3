//! Compiles the upstream SnapshotMetadata API (proto/snapshotmetadata/schema.proto) into
//! a tonic client and, with the `server` feature, the server trait. protoc comes from
//! protoc-bin-vendored, so a fresh machine builds with no manual step.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_root =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto/snapshotmetadata");
    let schema = proto_root.join("schema.proto");
    println!("cargo:rerun-if-changed={}", schema.display());
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(std::env::var_os("CARGO_FEATURE_SERVER").is_some())
        .compile_with_config(config, &[schema], &[proto_root])?;
    Ok(())
}
