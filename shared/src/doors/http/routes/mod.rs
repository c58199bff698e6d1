//! One handler per endpoint, each in its own module with a `routes()` that a Lambda's
//! `main` mounts alone and `airlock serve` merges with the others
//! (`doors::catalog::all`). A handler parses HTTP, calls a use case, and shapes the JSON
//! answer. The four listings are each a description given to [`listing_route!`].

use axum::response::{IntoResponse, Response};

use crate::core::error::ApiError;

/// A listing endpoint from its description: the OpenAPI operation (path, id, summary, the
/// filter's query parameters, errors, answer), the page's schema, and the handler, which
/// reads the filter and the page from the query, refuses any other parameter, calls the
/// read and answers `{ "<name>": [...], "next_cursor": ... }`.
macro_rules! listing_route {
    (
        name: $name:literal,
        operation: $op:literal,
        summary: ($title:literal, $desc:literal),
        queries: [$(($q:literal, $qs:ty, $qd:literal)),* $(,)?],
        errors: [$($err:expr),* $(,)?],
        answer: $answer:literal,
        $(#[$meta:meta])*
        page: $page:ident { $field:ident: $view:ty },
        filter: |$q_in:ident| $filter:expr,
        read: |$st:ident, $caller:ident, $f:ident, $pg:ident| $read:expr $(,)?
    ) => {
        use axum::extract::State;
        use axum::response::Response;
        use axum::Router;

        use crate::app::AppState;
        use crate::core::error::ApiError;
        use crate::doors::http::api;
        use crate::doors::http::extract::{Authed, Query};
        use crate::doors::http::openapi::{schema, Api, Op};

        pub fn api_doc() -> Api {
            Api::new().route(
                Op::get(api(concat!("/", $name)), $op)
                    .tag("reads")
                    .summary($title, $desc)
                    $(.query($q, schema::<$qs>, $qd))*
                    .paged()
                    .errors(&[$($err),*])
                    .answers(200, $answer, schema::<$page>),
                handler,
            )
        }

        pub fn routes() -> Router<AppState> {
            api_doc().into_router()
        }

        $(#[$meta])*
        #[allow(dead_code)]
        #[derive(schemars::JsonSchema)]
        #[schemars(deny_unknown_fields)]
        struct $page {
            $field: Vec<$view>,
            /// The cursor of the next page; `null` on the last page.
            next_cursor: Option<String>,
        }

        async fn handler(
            State($st): State<AppState>,
            Authed($caller): Authed,
            Query(mut $q_in): Query,
        ) -> Result<Response, ApiError> {
            #[allow(clippy::let_unit_value)]
            let $f = $filter;
            let $pg = $q_in.page()?;
            $q_in.finish()?;
            let l = $read;
            Ok(super::listing($name, &l))
        }
    };
}

// After the macro: the listings use it.
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
