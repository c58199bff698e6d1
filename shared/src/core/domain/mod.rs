//! Domain types: accounts, orders, jobs, actions, CL contracts and the exchange calendar.
//!
//! Types here parse, they do not validate: a `Quantity` is always >= 1, a `Price` is
//! always a finite decimal, an `IdempotencyKey` is always 1..255 printable ASCII.
//!
//! One file a kind of value: `time` (milliseconds and their RFC 3339 text), `enums`
//! (the closed sets), `action_type` (the action types with their payloads and queues),
//! `quantity`, `price`, `ids` (identifiers), `account`, `order`, `exposure`, `job`,
//! `requests` (payloads as sent) and `schemas` (their JSON Schemas); all of them are
//! used through this module (`crate::core::domain::Price`).

pub mod calendar;
pub mod cl;
pub mod fills;
pub mod payload;
pub mod pnl;
pub mod portfolio;

/// A closed set of values spelled as text in the API: the enum, its `ALL`, `as_str`,
/// `Display` and `FromStr` (which names every allowed value when it refuses one).
macro_rules! string_enum {
    ($(#[$m:meta])* $name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
        pub enum $name { $(#[serde(rename = $text)] $variant),+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(self.as_str()) }
        }

        impl FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err(format!(
                        "expected one of {}",
                        [$($text),+].join(", ")
                    )),
                }
            }
        }
    };
}

mod account;
mod action_type;
mod enums;
mod exposure;
mod ids;
mod job;
mod order;
mod price;
mod quantity;
mod requests;
mod schemas;
mod time;

pub use account::{Account, Position};
pub use action_type::{ActionStatus, ActionType, NormalizedPayload, QueueTarget};
pub use enums::{AccountStatus, JobKind, JobStatus, OrderStatus, OrderType, Side, TimeInForce};
pub use exposure::{Exposure, ExposureDelta};
pub use ids::{new_id, IdempotencyKey, Ident};
pub use job::Job;
pub use order::{first_version, Order, OrderTerms, OrderVersion};
pub use price::{
    optional_input_price, Price, Quote, MAX_PRICE_NUMBER, MIN_PRICE_NUMBER, PRICE_TEXT_PATTERN,
};
pub use quantity::{optional_whole_u32, whole_number, Quantity};
pub use requests::{OrderCancel, OrderSubmitCl, PositionsSync};
pub use time::{human_time, rfc3339, Millis, Rfc3339};

/// Text a person or a log will read: no control characters (as JSON Schema, Unicode Cc).
pub const PRINTABLE_PATTERN: &str = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$";
