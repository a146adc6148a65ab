//! Rebuilds this crate when a migration file is added or changed:
//! `sqlx::migrate!` embeds `migrations/sqlite` at compile time, and cargo
//! would otherwise not notice a new file there.

fn main() {
    println!("cargo:rerun-if-changed=../../migrations/sqlite");
}
