//! Airlock: the trade-safety backend a Mastra agent uses as its only tool backend.
//!
//! One module per concern (see the README, `docs/CONTRACT.md` and `docs/DECISIONS.md`):
//! `domain` (types, CL contracts, calendar), `policy` (risk checks), `protocol` (plan,
//! execute, replay rules), `token` (confirmation JWS), `auth` (service and operator JWTs,
//! roles, desks), `ports` (small async traits per capability), `adapters` (SQLite, local
//! signer), `http` (request parsing and the one place errors become HTTP), `app` (wiring).

pub mod adapters;
pub mod app;
pub mod auth;
pub mod clock;
pub mod config;
pub mod domain;
pub mod error;
pub mod failpoint;
pub mod handlers;
pub mod http;
pub mod metrics;
pub mod pagination;
pub mod parse;
pub mod policy;
pub mod ports;
pub mod protocol;
pub mod records;
pub mod seed;
pub mod telemetry;
pub mod token;
pub mod worker;
