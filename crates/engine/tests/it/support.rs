//! What the engine's test topics share: an engine on a fresh database of a
//! backend with a fixed clock and sequential ids, started, and a command
//! context.

use opledger_engine::{parse_kinds, CommandContext, Engine, FixedClock, SequentialIds};
use opledger_store::Store;
use opledger_testkit::Backend;
use std::sync::Arc;

/// The time every test engine's clock starts at.
pub const START_MICROS: i64 = 1_700_000_000_000_000;

/// The context of a test's commands (actor `test`).
pub fn context() -> CommandContext {
    CommandContext::actor("test")
}

/// A started engine on `backend`'s fresh database, its clock fixed at
/// [`START_MICROS`] (the clock is returned for tests that move it).
pub async fn engine_with_clock<B: Backend>(backend: &B) -> (Engine<B::Store>, Arc<FixedClock>) {
    let clock = Arc::new(FixedClock::at(opledger_domain::Timestamp::from_micros(START_MICROS)));
    let engine = Engine::with_clock(backend.open().await, clock.clone(), Arc::new(SequentialIds::default()));
    engine.startup().await.unwrap();
    (engine, clock)
}

/// [`engine_with_clock`] without the clock.
pub async fn engine<B: Backend>(backend: &B) -> Engine<B::Store> {
    engine_with_clock(backend).await.0
}

/// Declares the kinds of `document` (a declaration file's text); none may
/// be refused.
pub async fn declare<S: Store>(engine: &Engine<S>, document: &str) {
    let report = engine
        .apply_kinds(&context(), &parse_kinds(document).unwrap(), false)
        .await
        .unwrap();
    assert!(report.refused().next().is_none(), "{report:?}");
}
