//! Lambda entry point of the sweeper, run on a schedule (EventBridge): sends actions that
//! were accepted but never queued. The same `airlock::core::usecases::worker::sweeper::Sweeper::sweep_once` runs on
//! a timer in `airlock serve`.

use airlock::{app, telemetry};
use lambda_runtime::{run, service_fn, LambdaEvent};

// One invocation at a time: one thread, no work stealing (docs/DECISIONS.md).
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_runtime::Error> {
    telemetry::init();
    airlock::metrics::init_lambda(env!("CARGO_BIN_NAME"));
    let sweeper = app::from_env().await?.sweeper.clone();
    let sweeper = sweeper.as_ref();
    run(service_fn(
        move |_: LambdaEvent<serde_json::Value>| async move {
            let sent = sweeper.sweep_once().await;
            airlock::metrics::flush_emf();
            let sent = sent.map_err(|e| e.to_string())?;
            Ok::<_, lambda_runtime::Error>(serde_json::json!({ "sent": sent }))
        },
    ))
    .await
}
