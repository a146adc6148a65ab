//! Typed identifiers. Each wraps a UUID; which kind of UUID (v7 in practice)
//! is the caller's business, because generating one needs a clock and
//! randomness that the domain does not have.

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
            /// The id as a row key (rendered as `to_string` renders it).
            pub fn key(&self) -> crate::projections::Key {
                crate::projections::Key::Id(self.0)
            }

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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Row keys are the stored key text: `key` must be exactly what
        /// `to_string` (and therefore every stored key) gives.
        #[test]
        fn an_id_key_is_its_display_text(bits in any::<u128>()) {
            let uuid = Uuid::from_u128(bits);
            prop_assert_eq!(MediaId(uuid).key().to_string(), MediaId(uuid).to_string());
            prop_assert_eq!(RegionId(uuid).key().to_string(), RegionId(uuid).to_string());
            prop_assert_eq!(OperationId(uuid).key().to_string(), OperationId(uuid).to_string());
            prop_assert_eq!(BatchId(uuid).key().to_string(), BatchId(uuid).to_string());
            prop_assert_eq!(crate::projections::Key::from_text(&MediaId(uuid).to_string()), MediaId(uuid).key());
        }
    }
}
