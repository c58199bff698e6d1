//! One handler per endpoint, each in its own module with a `routes()` that a Lambda's
//! `main` mounts alone and `airlock serve` merges with the others (see [`all`]).
//! A handler parses HTTP, calls the protocol, and shapes the JSON answer.

pub mod accounts;
pub mod action_status;
pub mod execute;
pub mod health;
pub mod jobs;
pub mod metrics;
pub mod orders;
pub mod plan;
pub mod portfolio;
pub mod positions;

use axum::response::{IntoResponse, Response};

use crate::core::error::ApiError;


/// One page of a listing as the answer: `{ "<name>": [...], "next_cursor": ... }`.
fn listing<T>(name: &'static str, listing: &crate::core::usecases::reads::Listing<T>) -> Response
where
    for<'a> T: crate::core::usecases::views::Viewed<'a>,
    for<'a> &'a T: Into<<T as crate::core::usecases::views::Viewed<'a>>::View>,
{
    // Sized for the page up front (an order's view is about 330 bytes): written into a
    // growing buffer, a 50-row page would be copied about eight times on its way to 16 KB.
    let mut body = Vec::with_capacity(64 + 384 * listing.rows.len());
    match serde_json::to_writer(
        &mut body,
        &crate::core::usecases::views::ListingView { name, listing },
    ) {
        Ok(()) => (
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Err(e) => ApiError::internal(format!("writing the page: {e}")).into_response(),
    }
}
