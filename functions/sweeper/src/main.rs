//! Lambda entry point of the sweeper, run on a schedule (EventBridge): sends actions that
//! were accepted but never queued. The same `airlock::protocol::sweeper::sweep_once` runs on
//! a timer in `airlock serve`.

use airlock::{app, protocol, telemetry};
use lambda_runtime::{run, service_fn, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    telemetry::init();
    let state = app::from_env().await?;
    let state = &state;
    run(service_fn(
        move |_: LambdaEvent<serde_json::Value>| async move {
            let sent = protocol::sweeper::sweep_once(state)
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, lambda_runtime::Error>(serde_json::json!({ "sent": sent }))
        },
    ))
    .await
}
