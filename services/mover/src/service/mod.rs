//! The ferry job service: the gRPC API (proto/ferry/v1), the job manager with its
//! scheduler and persistent store, cron schedules that start jobs ([`schedules`]),
//! backup repositories ([`backups`]), metrics, tracing and security around them.
//!
//! [`server::start`] runs a whole service in-process (the tests use it on 127.0.0.1:0);
//! `ferry serve` ([`serve`]) parses flags, environment and a config file into a
//! [`config::ServiceConfig`] and runs it until SIGTERM; `ferry job` ([`client`]) and
//! `ferry schedule` ([`schedule_client`]) talk to it.

pub mod api;
pub mod backup_client;
pub mod backups;
pub mod client;
pub mod config;
pub mod convert;
pub mod jobs;
pub mod metrics;
pub mod proto;
pub mod schedule_client;
pub mod scheduler;
pub mod schedules;
pub mod secrets;
pub mod security;
pub mod serve;
pub mod server;
pub mod status;
pub mod store;
pub mod telemetry;
