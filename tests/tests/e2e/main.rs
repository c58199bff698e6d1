//! The end-to-end suite: one test binary, a module per area. Every test is named
//! `module::test` (`binary(e2e) & test(/^reads::/)` selects one area in nextest), runs in its
//! own process under nextest and starts its own servers, emulator and state directory.
//! Helpers shared between areas live in the `airlock_tests` library (`tests/src`).

mod access;
mod actions;
mod approvals;
mod aws;
mod browser_approvals;
mod browser_harness;
mod check;
mod crashes;
mod daily_loss;
mod dead_letters;
mod deploy_walk;
mod edge;
mod emulator;
mod error_table;
mod faults;
mod idp;
mod input_bounds;
mod kill_switch;
mod lambda;
mod lambda_workers;
mod limits;
mod market_rules;
mod mcp;
mod metrics;
mod openapi;
mod permissions;
mod portfolio;
mod ports;
mod prices;
mod reads;
mod replace;
mod risk_controls;
mod throttle;
mod traces;
mod worker_gates;
mod workers;
