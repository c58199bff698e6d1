//! `GET /health`: no auth; says the process is up.

use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::app::AppState;

pub fn routes() -> Router<AppState> {
    Router::new().route("/health", get(health))
}

async fn health() -> Json<Value> {
    Json(json!({ "status": "ok", "service": "airlock", "version": env!("CARGO_PKG_VERSION") }))
}
