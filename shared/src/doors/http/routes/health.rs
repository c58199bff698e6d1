//! `GET /health`: no auth; says the process is up.

use axum::{Json, Router};
use serde::Serialize;

use crate::app::AppState;
use crate::doors::http::openapi::{schema, Api, Op};

pub fn api_doc() -> Api {
    Api::new().route(
        Op::get("/health".into(), "health")
            .tag("service")
            .summary(
                "Is the process up",
                "No tokens needed. Says nothing about the stores. `broker` names the broker \
                 adapter orders go to: `paper` (the simulated broker, the only one today) \
                 marks a sandbox, where `airlock check --execute` may place an order.",
            )
            .public()
            .answers(200, "Up.", schema::<Health>),
        health,
    )
}

/// The broker adapter of every deployment: the paper broker is the only one
/// (`app::Ports::broker`). A real broker adapter changes this to its own name.
pub const BROKER: &str = "paper";

pub fn routes() -> Router<AppState> {
    api_doc().into_router()
}

#[derive(Serialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
struct Health {
    #[schemars(extend("const" = "ok"))]
    status: &'static str,
    #[schemars(extend("const" = "airlock"))]
    service: &'static str,
    version: &'static str,
    /// The broker adapter orders go to: `paper` is the simulated broker (a sandbox).
    broker: &'static str,
}

async fn health() -> Json<Health> {
    Json(Health {
        status: "ok",
        service: "airlock",
        version: env!("CARGO_PKG_VERSION"),
        broker: BROKER,
    })
}
