//! How jobs open endpoints: through ferry-endpoints in the service, through fakes in unit
//! tests of the runner (failures on demand, slow reads).

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::{EndpointSpec, Result, Source, Target};
use ferry_endpoints::{SourceOptions, TargetOptions};

/// Opens endpoints for jobs.
#[async_trait]
pub trait Opener: Send + Sync + Debug + 'static {
    async fn open_source(
        &self,
        spec: &EndpointSpec,
        options: &SourceOptions,
    ) -> Result<Arc<dyn Source>>;

    async fn open_target(
        &self,
        spec: &EndpointSpec,
        size: u64,
        options: &TargetOptions,
    ) -> Result<Arc<dyn Target>>;
}

/// The real endpoints.
#[derive(Debug, Clone, Copy, Default)]
pub struct Endpoints;

#[async_trait]
impl Opener for Endpoints {
    async fn open_source(
        &self,
        spec: &EndpointSpec,
        options: &SourceOptions,
    ) -> Result<Arc<dyn Source>> {
        ferry_endpoints::open_source(spec, options).await
    }

    async fn open_target(
        &self,
        spec: &EndpointSpec,
        size: u64,
        options: &TargetOptions,
    ) -> Result<Arc<dyn Target>> {
        ferry_endpoints::open_target(spec, size, options).await
    }
}
