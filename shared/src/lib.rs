//! Airlock: the trade-safety backend a Mastra agent uses as its only tool backend.
//!
//! The tree is the architecture (README, "Layout"):
//!
//! - [`core`]: what Airlock decides. The domain (CL contracts, the calendar, payloads), the
//!   risk policy, the records it keeps, the ports (small async traits per capability) and the
//!   use cases (plan, execute, approvals, reads, the workers and the sweeper). It imports
//!   nothing from `adapters`, `doors` or `app`.
//! - [`adapters`]: where it is stored and sent. The embedded backend (SQLite, the in-process
//!   queue, a local signing key), the AWS backend (DynamoDB, SQS, KMS), the paper broker, the
//!   outbound HTTP client. Each implements ports; none decides anything.
//! - [`doors`]: where a request enters. HTTP (the REST routes, parsing, the one place errors
//!   become HTTP, the OpenAPI document), MCP, the approval page, and the queue and sweeper
//!   Lambda entry points. Each turns its input into a use case call and its answer back.
//! - [`app`]: the wiring. Builds the ports for a backend from the typed config and hands the
//!   use cases to the doors; the demo seed.
//! - Cross-cutting, importing only `core`: [`config`] (typed settings from the
//!   environment), [`telemetry`] (one span per request or record), [`metrics`], [`failpoint`]
//!   (fault injection for the crash tests, off unless built with the feature).
//!
//! `layering::the_module_graph_has_no_cycle_and_keeps_its_layers` checks these rules on
//! every test run.

pub mod adapters;
pub mod app;
pub mod config;
pub mod core;
pub mod doors;
pub mod failpoint;
pub mod metrics;
pub mod telemetry;

#[cfg(test)]
mod layering;
