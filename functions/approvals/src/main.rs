//! Lambda entry point of the approval page (`/approvals/...`, on its own public API) and the
//! admin-only `POST /operators/enrolments` (on the private API). State is built once per cold
//! start; the handler is `airlock::doors::approval_page`, the same code `airlock serve` mounts.

use airlock::doors::http;

// One invocation at a time: one thread, no work stealing (docs/DECISIONS.md).
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_http::Error> {
    let state = http::lambda_state(env!("CARGO_BIN_NAME")).await?;
    if let Err(why) = &state.approvals.webauthn {
        return Err(format!("AIRLOCK_APPROVAL_ORIGIN: {why}").into());
    }
    lambda_http::run(http::app(airlock::doors::approval_page::routes(), state)).await
}
