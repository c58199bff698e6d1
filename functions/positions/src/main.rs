//! Lambda entry point of the `positions` endpoint. State is built once per cold start; the
//! handler is `airlock::handlers::positions`, the same code `airlock serve` mounts.

use airlock::{app, handlers, http, telemetry};

// One invocation at a time: one thread, no work stealing (docs/DECISIONS.md).
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_http::Error> {
    telemetry::init();
    airlock::metrics::init_lambda(env!("CARGO_BIN_NAME"));
    let state = app::from_env().await?;
    lambda_http::run(http::app(handlers::positions::routes(), state)).await
}
