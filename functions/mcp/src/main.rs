//! Lambda entry point of the MCP endpoint (`POST /mcp`). State is built once per cold
//! start; the handler is `airlock::doors::mcp`, the same code `airlock serve` mounts,
//! without the `Host` allow-list (behind API Gateway the API's host names reach it). The
//! confirmation-token key is read on first use, not at init: most calls are reads.

use airlock::doors::http;

// One invocation at a time: one thread, no work stealing (docs/DECISIONS.md).
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_http::Error> {
    http::run_lambda(env!("CARGO_BIN_NAME"), airlock::doors::mcp::routes(false)).await
}
