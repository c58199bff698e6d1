//! `GET /health`: no auth; says the process is up.

use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

use crate::app::AppState;

pub fn routes() -> Router<AppState> {
    Router::new().route("/health", get(health))
}

#[derive(Serialize)]
struct Health {
    status: &'static str,
    service: &'static str,
    version: &'static str,
}

async fn health() -> Json<Health> {
    Json(Health {
        status: "ok",
        service: "airlock",
        version: env!("CARGO_PKG_VERSION"),
    })
}
