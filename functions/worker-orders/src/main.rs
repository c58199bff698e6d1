//! Lambda entry point of the `worker:orders` consumer (SQS FIFO events, partial batch
//! failures). The handler is `airlock::worker::lambda::handle_batch`, the same worker code
//! `airlock serve` runs in-process.

use airlock::domain::QueueTarget;
use airlock::{app, telemetry, worker};
use aws_lambda_events::event::sqs::SqsEvent;
use lambda_runtime::{run, service_fn, LambdaEvent};

// One invocation at a time: one thread, no work stealing (docs/DECISIONS.md).
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_runtime::Error> {
    telemetry::init();
    airlock::metrics::init_lambda(env!("CARGO_BIN_NAME"));
    let app = app::from_env().await?;
    let (consumer, retry_ms) = (app.consumer(), app.config.worker_retry_ms);
    let operation_timeout_ms = app.config.aws.operation_timeout_ms;
    let consumer = &consumer;
    run(service_fn(move |e: LambdaEvent<SqsEvent>| async move {
        let queue = QueueTarget::Orders;
        Ok::<_, lambda_runtime::Error>(
            worker::lambda::handle_batch(
                consumer,
                queue,
                retry_ms,
                e.payload,
                worker::lambda::Deadline::of_invocation(e.context.deadline, operation_timeout_ms),
            )
            .await,
        )
    }))
    .await
}
