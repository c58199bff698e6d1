//! Airlock: the trade-safety backend a Mastra agent uses as its only tool backend.
//!
//! One module per concern (see the README, `docs/CONTRACT.md` and `docs/DECISIONS.md`):
//! `domain` (types, CL contracts, calendar, fills, portfolio figures), `policy` (risk
//! checks, the control record), `records` (what the ports store), `protocol` (the use
//! cases: plan, execute, reads, approvals, portfolio, limits, control, the MCP tools),
//! `worker` (the order and job workers, the in-process consumer, the SQS Lambda loop, the
//! sweeper, the dead-letter sweep), `token` (confirmation JWS), `auth` (service and
//! operator JWTs, JWKS, roles, desks), `ports` (small async traits per capability),
//! `adapters` (SQLite; DynamoDB, SQS and KMS; the paper broker; the local signer and key
//! files), `http` (request parsing, the OpenAPI document, serving, and the one place errors
//! become HTTP), `handlers` (the REST routes, MCP, the approval page), `app` (wiring),
//! `config`, `clock`, `error`, `metrics`, `telemetry` (logs), `pagination` (cursors),
//! `parse`, `failpoint` (tests), `seed` (demo data).

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
