//! Lambda entry point of the `execute` endpoint. State is built once per cold start; the
//! handler is `airlock::handlers::execute`, the same code `airlock serve` mounts.

use airlock::{app, handlers, http, telemetry};

// One invocation at a time: one thread, no work stealing (docs/DECISIONS.md).
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_http::Error> {
    telemetry::init();
    airlock::metrics::init_lambda(env!("CARGO_BIN_NAME"));
    let state = app::from_env().await?;
    // The only function that verifies confirmation tokens: load their key at init. With
    // AIRLOCK_CONFIRMATION_PUBLIC_KEY set it is there already (no call at all); else one
    // KMS GetPublicKey.
    state.execute.confirmations.preload().await?;
    lambda_http::run(http::app(handlers::execute::routes(), state)).await
}
