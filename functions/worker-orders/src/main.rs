//! Lambda entry point of the `worker:orders` consumer: SQS events, partial batch failures.
//! The loop is `airlock::doors::queue`'s, the same worker code `airlock serve` runs
//! in-process.

use airlock::core::domain::QueueTarget;

// One invocation at a time: one thread, no work stealing (docs/DECISIONS.md).
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_http::Error> {
    airlock::doors::queue::run_lambda(QueueTarget::Orders, env!("CARGO_BIN_NAME")).await
}
