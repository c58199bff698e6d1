//! Lambda entry point of the approval page (`/approvals/...`, on its own public API) and the
//! admin-only `POST /operators/enrolments` (on the private API). State is built once per cold
//! start; the handler is `airlock::handlers::approvals`, the same code `airlock serve` mounts.

use airlock::{app, handlers, http, telemetry};

// One invocation at a time: one thread, no work stealing (docs/DECISIONS.md).
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_http::Error> {
    telemetry::init();
    airlock::metrics::init_lambda(env!("CARGO_BIN_NAME"));
    let state = app::from_env().await?;
    if let Err(why) = &state.approvals.webauthn {
        return Err(format!("AIRLOCK_APPROVAL_ORIGIN: {why}").into());
    }
    lambda_http::run(http::app(handlers::approvals::routes(), state)).await
}
