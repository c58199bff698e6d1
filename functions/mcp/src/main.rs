//! Lambda entry point of the MCP endpoint (`POST /mcp`). State is built once per cold
//! start; the handler is `airlock::handlers::mcp`, the same code `airlock serve` mounts,
//! without the `Host` allow-list (behind API Gateway the API's host names reach it). The
//! confirmation-token key is read on first use, not at init: most calls are reads.

use airlock::{app, handlers, http, telemetry};

// One invocation at a time: one thread, no work stealing (docs/DECISIONS.md).
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_http::Error> {
    telemetry::init();
    airlock::metrics::init_lambda(env!("CARGO_BIN_NAME"));
    let state = app::from_env().await?;
    lambda_http::run(http::app(handlers::mcp::routes(false), state)).await
}
