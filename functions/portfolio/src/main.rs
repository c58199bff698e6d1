//! Lambda entry point of the portfolio endpoints (`GET /portfolio`, `/portfolio/allocation`,
//! `/portfolio/risk-flags`). State is built once per cold start; the handlers are
//! `airlock::doors::http::routes::portfolio`, the same code `airlock serve` mounts.

use airlock::doors::http::{self, routes};

// One invocation at a time: one thread, no work stealing (docs/DECISIONS.md).
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_http::Error> {
    http::run_lambda(env!("CARGO_BIN_NAME"), routes::portfolio::routes()).await
}
