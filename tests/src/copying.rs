//! The steps every endpoint copy test shares: open a source and a target by URL with the
//! default options, run the engine between them, and hash what a URL serves through
//! ferry's own source (compared by the tests with an independent hash of the backing file).

use std::sync::Arc;

use ferry_core::{EndpointSpec, Result, Source, Target};
use ferry_endpoints::{open_source, open_target, SourceOptions, TargetOptions};
use ferry_engine::{
    checksum, copy, CancellationToken, ChecksumOptions, CopyOptions, CopyReport, Progress,
};

/// Opens `url` as a source with the default options.
pub async fn source(url: &str) -> Result<Arc<dyn Source>> {
    open_source(&EndpointSpec::parse(url)?, &SourceOptions::default()).await
}

/// Opens `url` as a target for `size` bytes with the default options.
pub async fn target(url: &str, size: u64) -> Result<Arc<dyn Target>> {
    open_target(&EndpointSpec::parse(url)?, size, &TargetOptions::default()).await
}

/// Copies between endpoints already open.
pub async fn run(
    source: Arc<dyn Source>,
    target: Arc<dyn Target>,
    options: &CopyOptions,
) -> Result<CopyReport> {
    copy(
        source,
        target,
        options,
        &Progress::new(),
        &CancellationToken::new(),
    )
    .await
}

/// Opens `src` and `dst` (sized to the source) and copies with `options`.
pub async fn copy_urls(src: &str, dst: &str, options: &CopyOptions) -> Result<CopyReport> {
    let s = source(src).await?;
    let t = target(dst, s.size()).await?;
    run(s, t, options).await
}

/// The block hash of what `url` serves, computed by ferry through its source.
pub async fn blkhash_of(url: &str) -> String {
    let s = source(url).await.expect("open the source to hash");
    checksum(
        s,
        &ChecksumOptions::default(),
        &Progress::new(),
        &CancellationToken::new(),
    )
    .await
    .expect("hash the source")
    .hex()
}
