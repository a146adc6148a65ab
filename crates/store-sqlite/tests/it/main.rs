//! The crate's integration tests, one binary: a module per topic, the
//! helpers they share declared once (see tests/README.md at the
//! workspace root for what each topic proves).

mod conformance;
mod memory_statistics;
mod schema;
mod table_layout;
mod writer;
