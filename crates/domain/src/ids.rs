//! Typed identifiers. Each wraps a UUID; which kind of UUID (v7 in practice)
//! is the caller's business, because generating one needs a clock and
//! randomness that the domain does not have. An id knows nothing of the
//! projections; its row key is made beside `projections::Key`.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use uuid::Uuid;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub Uuid);

        impl $name {
            pub fn as_uuid(&self) -> Uuid {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.hyphenated().fmt(f)
            }
        }

        impl FromStr for $name {
            type Err = String;
            fn from_str(text: &str) -> Result<Self, String> {
                Uuid::parse_str(text)
                    .map($name)
                    .map_err(|error| format!("{text:?} is not a valid {}: {error}", stringify!($name)))
            }
        }
    };
}

id_type!(
    /// A media item in the registry.
    MediaId
);
id_type!(
    /// A region (crop, face, bounding box) of a media item.
    RegionId
);
id_type!(
    /// One unit of work in the ledger; also names the operation's event stream.
    OperationId
);
id_type!(
    /// A batch: a named run over a fixed set of items; also names its stream.
    BatchId
);
