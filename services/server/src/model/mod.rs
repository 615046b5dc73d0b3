//! The records the service keeps: jobs ([`job`]) and schedules ([`schedule`]), as the store
//! persists them and the API reports them. A leaf: plain data with serde, depending on no
//! other module of the service, so the store, the job manager and the schedules all build on
//! it without importing each other.

pub mod job;
pub mod schedule;
