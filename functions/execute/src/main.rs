//! Lambda entry point of the `execute` endpoint. State is built once per cold start; the
//! handler is `airlock::doors::http::routes::execute`, the same code `airlock serve` mounts.

use airlock::doors::http;

// One invocation at a time: one thread, no work stealing (docs/DECISIONS.md).
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_http::Error> {
    let state = http::lambda_state(env!("CARGO_BIN_NAME")).await?;
    // The only function that verifies confirmation tokens: load their key at init. With
    // AIRLOCK_CONFIRMATION_PUBLIC_KEY set it is there already (no call at all); else one
    // KMS GetPublicKey.
    state.execute.confirmations.preload().await?;
    lambda_http::run(http::app(
        airlock::doors::http::routes::execute::routes(),
        state,
    ))
    .await
}
