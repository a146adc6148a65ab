//! The crate's integration tests, one binary: a module per topic, the
//! helpers they share declared once (see tests/README.md at the
//! workspace root for what each topic proves).

mod architecture;
mod common;
mod crash_support;
mod history_support;
mod ingest_support;
mod supervise_support;

mod batch_cli;
mod bench_http;
mod bench_scripts;
mod cli;
mod closed_output;
mod crash;
mod dashboard;
mod explain_cli;
mod export_cli;
mod export_http;
mod history_checker;
mod http_fuzz;
mod http_service;
mod ingest_cli;
mod ingest_faults;
mod ingest_files;
mod ingest_media;
mod ingest_signals;
mod input_hygiene;
mod kinds_cli;
mod postgres_cli;
mod postgres_processes;
mod postgres_restart;
mod power_loss;
mod query_cli;
mod read_only;
mod repair_cli;
mod retry_cli;
mod supervise_cli;
mod task_cli;
