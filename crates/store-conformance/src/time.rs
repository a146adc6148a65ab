//! Time in the log: `recorded_at` never goes backwards along seq, whoever
//! appends and whatever their clock says, and a command's time is read in
//! its transaction — by the clock every client shares where the backend
//! has one (PostgreSQL's server), never before the last event's.

use crate::fixtures::{append, at, media, one, registered, updated};
use crate::Harness;
use futures::TryStreamExt;
use opledger_domain::chain::{self, ChainPoint};
use opledger_domain::envelope::StreamId;
use opledger_domain::time::Timestamp;
use opledger_store::{ExpectedVersion, Store, StoreError, TimeSource, WriteTx};

const HOUR_MICROS: i64 = 3_600_000_000;

/// The command time a write transaction gives for `caller` from `source`.
async fn command_time<S: Store>(store: &S, caller: Timestamp, source: TimeSource) -> Timestamp {
    store
        .write::<_, StoreError, _>(move |tx: &mut S::Tx| Box::pin(async move { tx.command_time(caller, source).await }))
        .await
        .unwrap()
}

pub async fn recorded_at_never_goes_backwards_along_seq<H: Harness>(harness: &H) {
    let ahead = harness.open().await;
    let behind = harness.open().await;
    let stream = StreamId::media(media(1));
    // A host an hour ahead appends; then a host an hour behind it, one
    // event in order and one earlier still, in one call.
    let mut first = registered(media(1), 1);
    first.recorded_at = at(HOUR_MICROS);
    append(&ahead, one(&stream, ExpectedVersion::NoStream, vec![first]))
        .await
        .unwrap();
    let mut second = updated(media(1), 2);
    second.recorded_at = at(0);
    let mut third = updated(media(1), 3);
    third.recorded_at = at(-HOUR_MICROS);
    append(&behind, one(&stream, ExpectedVersion::Exactly(1), vec![second, third]))
        .await
        .unwrap();
    // Later again: recorded as given.
    let mut fourth = updated(media(1), 4);
    fourth.recorded_at = at(2 * HOUR_MICROS);
    append(&behind, one(&stream, ExpectedVersion::Exactly(3), vec![fourth]))
        .await
        .unwrap();

    let events: Vec<_> = ahead.read_all(0, 10).try_collect().await.unwrap();
    let times: Vec<Timestamp> = events.iter().map(|event| event.recorded_at).collect();
    assert_eq!(
        times,
        vec![at(HOUR_MICROS), at(HOUR_MICROS), at(HOUR_MICROS), at(2 * HOUR_MICROS)],
        "each event no earlier than the one before it"
    );
    // The chain digests the time as stored.
    let entries = ahead.read_chain(0, 10).await.unwrap();
    assert_eq!(chain::check(ChainPoint::START, entries).unwrap().seq, 4);

    // A command's time: the caller's, but never before the last event's.
    let head_time = at(2 * HOUR_MICROS);
    assert_eq!(
        command_time(&behind, at(0), TimeSource::Caller).await,
        head_time,
        "an earlier clock is lifted to the log's present"
    );
    let later = at(3 * HOUR_MICROS);
    assert_eq!(command_time(&behind, later, TimeSource::Caller).await, later);
}

pub async fn a_command_takes_the_shared_clock_where_the_backend_has_one<H: Harness>(harness: &H) {
    let store = harness.open().await;
    let shared = store.shared_time().await.unwrap();
    // A caller whose clock is a year ahead of the shared clock (of the
    // test's fixed times, without one), and one a year behind it.
    let year = 365 * 24 * HOUR_MICROS;
    let now = shared.unwrap_or_else(|| at(0));
    let caller = Timestamp::from_micros(now.as_micros() + year);
    let behind = Timestamp::from_micros(now.as_micros() - year);
    let decided = command_time(&store, caller, TimeSource::Shared).await;
    match shared {
        // PostgreSQL: the server's clock, read in the transaction, whatever
        // the caller's says.
        Some(server) => {
            assert!(
                decided >= server && decided.as_micros() - server.as_micros() < 60_000_000,
                "the server's time {server}, not the caller's {caller}: {decided}"
            );
        }
        // SQLite: embedded in the caller's process, whose clock it is.
        None => assert_eq!(decided, caller),
    }
    // A caller behind by a year still decides at the shared clock's time
    // (or, without one, at its own).
    let decided = command_time(&store, behind, TimeSource::Shared).await;
    match shared {
        Some(server) => assert!(decided >= server, "{decided} before the server's {server}"),
        None => assert_eq!(decided, behind),
    }
    // Asked for the caller's clock, every backend gives it.
    assert_eq!(command_time(&store, caller, TimeSource::Caller).await, caller);
}
