//! Lambda entry point of the `accounts` endpoint. State is built once per cold start; the
//! handler is `airlock::handlers::accounts`, the same code `airlock serve` mounts. This
//! function also answers the unauthenticated `GET /health`.

use airlock::{app, handlers, http, telemetry};

// One invocation at a time: one thread, no work stealing (docs/DECISIONS.md).
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_http::Error> {
    telemetry::init();
    airlock::metrics::init_lambda(env!("CARGO_BIN_NAME"));
    let state = app::from_env().await?;
    let routes = handlers::accounts::routes()
        .merge(handlers::health::routes())
        .merge(handlers::openapi::routes());
    lambda_http::run(http::app(routes, state)).await
}
