//! What Airlock decides, with no knowledge of where requests come from or where anything is
//! stored: the domain types, the risk policy, the records, the ports the adapters implement
//! and the use cases the doors call.

pub mod auth;
pub mod clock;
pub mod digest;
pub mod domain;
pub mod error;
pub mod pagination;
pub mod parse;
pub mod policy;
pub mod ports;
pub mod records;
pub mod throttle;
pub mod token;
pub mod usecases;
