//! One handler per endpoint, each in its own module with a `routes()` that a Lambda's
//! `main` mounts alone and `airlock serve` merges with the others
//! (`doors::catalog::all`). A handler parses HTTP, calls a use case, and shapes the JSON
//! answer. The four listings are each a description given to [`listing_route!`], which
//! makes both the REST route and the MCP tool of the listing.

use axum::response::{IntoResponse, Response};

use crate::core::error::ApiError;

/// A listing from its description, as a REST route and as an MCP tool. The route: the
/// OpenAPI operation (path, id, summary, the filter's query parameters, errors, answer),
/// the page's schema, and the handler, which reads the filter and the page from the query,
/// refuses any other parameter, calls the read and answers
/// `{ "<name>": [...], "next_cursor": ... }`. The tool: `Tool`, a [`ListingTool`] with the
/// tool's name and texts, its arguments (a JSON object: the filter, `limit`, `cursor`) and
/// the same read.
macro_rules! listing_route {
    (
        name: $name:literal,
        operation: $op:literal,
        summary: ($title:literal, $desc:literal),
        queries: [$(($q:literal, $qs:ty, $qd:literal)),* $(,)?],
        errors: [$($err:expr),* $(,)?],
        answer: $answer:literal,
        $(#[$meta:meta])*
        page: $page:ident { $field:ident: $row:ty },
        filter: |$q_in:ident| $filter:expr,
        tool: ($tool:literal, $tool_title:literal, $tool_desc:literal),
        args: $args:ty => |$a:ident| $args_filter:expr,
        read: |$reads:ident, $caller:ident, $f:ident, $pg:ident| $read:expr $(,)?
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
            $field: Vec<<$row as crate::core::usecases::views::Viewed<'static>>::View>,
            /// The cursor of the next page; `null` on the last page.
            next_cursor: Option<String>,
        }

        async fn handler(
            State(st): State<AppState>,
            Authed(caller): Authed,
            Query(mut $q_in): Query,
        ) -> Result<Response, ApiError> {
            #[allow(clippy::let_unit_value)]
            let $f = $filter;
            let $pg = &$q_in.page()?;
            $q_in.finish()?;
            let ($reads, $caller) = (&*st.reads, &caller);
            let l = $read;
            Ok(super::listing($name, &l))
        }

        /// This listing as an MCP tool.
        pub struct Tool;

        impl super::ListingTool for Tool {
            const NAME: &'static str = $name;
            const TOOL: (&'static str, &'static str, &'static str) =
                ($tool, $tool_title, $tool_desc);
            type Args = $args;
            type Row = $row;

            fn page(a: &$args) -> (Option<u32>, Option<String>) {
                (a.limit, a.cursor.clone())
            }

            async fn read(
                $reads: &crate::core::usecases::reads::Reads,
                $caller: &crate::core::auth::Caller,
                $a: $args,
                $pg: &crate::core::usecases::reads::PageRequest,
            ) -> Result<crate::core::usecases::reads::Listing<$row>, ApiError> {
                #[allow(clippy::let_unit_value)]
                let $f = $args_filter;
                Ok($read)
            }
        }
    };
}

/// A listing as an MCP tool, made by [`listing_route!`] from the description its REST
/// route is made from: the same read, the same rows, the same answer.
pub trait ListingTool {
    /// The listing: its path and the answer's field, `{ "<NAME>": [...], "next_cursor": ... }`.
    const NAME: &'static str;
    /// The tool's name, title and description.
    const TOOL: (&'static str, &'static str, &'static str);
    /// The tool's arguments: the filter, `limit` and `cursor` (unknown fields refused).
    type Args: serde::de::DeserializeOwned + schemars::JsonSchema + Send;
    /// A row (its view is what the answer shows).
    type Row: for<'a> crate::core::usecases::views::Viewed<'a> + Send + 'static;
    /// The page the arguments ask for (`limit`, `cursor`), to be checked.
    fn page(args: &Self::Args) -> (Option<u32>, Option<String>);
    /// The route's read, with the filter the arguments name.
    fn read(
        reads: &crate::core::usecases::reads::Reads,
        caller: &crate::core::auth::Caller,
        args: Self::Args,
        page: &crate::core::usecases::reads::PageRequest,
    ) -> impl std::future::Future<
        Output = Result<crate::core::usecases::reads::Listing<Self::Row>, ApiError>,
    > + Send;
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
