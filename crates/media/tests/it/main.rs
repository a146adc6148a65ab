//! The crate's integration tests, one binary: a module per topic, the
//! helpers they share declared once (see tests/README.md at the
//! workspace root for what each topic proves).

mod support;

mod av;
mod heif;
mod hostile_images;
mod images;
mod settle;
mod shared_decode;
mod tasks;
