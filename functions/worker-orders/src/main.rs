//! Lambda entry point of the `worker:orders` consumer (SQS FIFO events, partial batch
//! failures). The handler is `airlock::worker::lambda::handle_batch`, the same worker code
//! `airlock serve` runs in-process.

use airlock::{app, telemetry, worker};
use aws_lambda_events::event::sqs::SqsEvent;
use lambda_runtime::{run, service_fn, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    telemetry::init();
    let worker = app::from_env().await?.worker;
    let worker = worker.as_ref();
    run(service_fn(move |e: LambdaEvent<SqsEvent>| async move {
        Ok::<_, lambda_runtime::Error>(worker::lambda::handle_batch(worker, e.payload).await)
    }))
    .await
}
