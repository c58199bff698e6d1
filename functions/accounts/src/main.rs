//! Lambda entry point of the `accounts` endpoint. State is built once per cold start; the
//! handler is `airlock::doors::http::routes::accounts`, the same code `airlock serve` mounts. This
//! function also answers the unauthenticated `GET /health`.

use airlock::doors::http::{self, routes};

// One invocation at a time: one thread, no work stealing (docs/DECISIONS.md).
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_http::Error> {
    let routes = routes::accounts::routes()
        .merge(routes::health::routes())
        .merge(airlock::doors::catalog::routes());
    http::run_lambda(env!("CARGO_BIN_NAME"), routes).await
}
