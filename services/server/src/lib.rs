//! ferry-server: the ferry job service. The gRPC API of ferry-api ([`api`], [`schedules`],
//! [`backups`]) over the job manager ([`jobs`]) with its admission queue ([`admission`]) and
//! crash-safe store ([`store`]), cron schedules that start jobs, backup repositories, and
//! the metrics, tracing and security around them.
//!
//! [`server::start`] runs a whole service in-process from a [`config::ServiceConfig`] (the
//! tests use it on 127.0.0.1:0); the `ferry` binary's `serve` command builds that config
//! from flags, environment and a config file, and its `job`, `schedule` and `backup
//! --server` commands are the clients. This crate links no command-line parser.
//!
//! Module map: the records the store keeps are [`jobs::model`] and [`schedules::model`];
//! [`convert`] turns requests into those records and records into replies; [`status`] is
//! the one mapping from errors to gRPC codes.

#![forbid(unsafe_code)]

pub mod admission;
pub mod api;
pub mod backups;
pub mod config;
pub mod convert;
pub mod jobs;
pub mod metrics;
pub mod model;
pub mod schedules;
pub mod secrets;
pub mod security;
pub mod server;
pub mod status;
pub mod store;
pub mod telemetry;
