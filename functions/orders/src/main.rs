//! Lambda entry point of the `orders` endpoint. State is built once per cold start; the
//! handler is `airlock::doors::http::routes::orders`, the same code `airlock serve` mounts.

use airlock::doors::http::{self, routes};

// One invocation at a time: one thread, no work stealing (docs/DECISIONS.md).
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_http::Error> {
    http::run_lambda(env!("CARGO_BIN_NAME"), routes::orders::routes()).await
}
