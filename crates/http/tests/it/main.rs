//! The crate's integration tests, one binary: a module per topic, the
//! helpers they share declared once (see tests/README.md at the
//! workspace root for what each topic proves).

mod fixtures;
mod support;

mod admin;
mod api;
mod auth;
mod contract;
mod events;
mod exports;
mod metrics;
mod page;
mod read;
mod retries;
mod security;
mod work;
