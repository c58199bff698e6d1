//! One handler per endpoint, each in its own module with a `routes()` that a Lambda's
//! `main` mounts alone and `airlock serve` merges with the others (see [`all`]).
//! A handler parses HTTP, calls the protocol, and shapes the JSON answer.

pub mod accounts;
pub mod action_status;
pub mod execute;
pub mod health;
pub mod jobs;
pub mod orders;
pub mod plan;
pub mod positions;
mod views;

use axum::Router;

use crate::app::AppState;

/// Every endpoint on one router: what `airlock serve` mounts.
pub fn all() -> Router<AppState> {
    Router::new()
        .merge(health::routes())
        .merge(accounts::routes())
        .merge(positions::routes())
        .merge(orders::routes())
        .merge(jobs::routes())
        .merge(action_status::routes())
        .merge(plan::routes())
        .merge(execute::routes())
}
