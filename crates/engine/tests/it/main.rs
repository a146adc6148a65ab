//! The crate's integration tests, one binary: a module per topic, the
//! helpers they share declared once (see tests/README.md at the
//! workspace root for what each topic proves).

mod support;

mod batches_review;
mod blocked_batches;
mod clock_skew;
mod commands;
mod declared_kinds;
mod describe;
mod fault_loop;
mod fixtures;
mod golden_logs;
mod idempotency;
mod ingestion_lookups;
mod integrity;
mod kind_change;
mod needs;
mod paging_properties;
mod properties;
mod queries;
mod release;
mod release_held;
mod repair;
mod replay;
mod review_bulk;
mod slow_commit;
mod startup;
mod upgrade;
mod versions;
mod work_properties;
mod work_protocol;
mod work_smoke;
