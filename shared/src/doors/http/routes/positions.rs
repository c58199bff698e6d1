//! `GET /positions?account_id=`: positions on the operator's desks.

use axum::extract::State;
use axum::response::Response;
use axum::Router;

use crate::app::AppState;
use crate::core::domain::Ident;
use crate::core::error::ApiError;
use crate::core::error::Code;
use crate::doors::http::api;
use crate::doors::http::extract::{Authed, Query};
use crate::doors::http::openapi::{schema, Api, Op};
use crate::core::usecases::views::PositionView;

pub fn api_doc() -> Api {
    Api::new().route(
        Op::get(api("/positions"), "listPositions")
            .tag("reads")
            .summary(
                "Positions on the operator's desks",
                "Signed positions in contracts (long > 0, short < 0) with average prices, optionally for one account.",
            )
            .query("account_id", schema::<Ident>, "Only this account's positions. An account the operator may not see is 404 `account_not_found`.")
            .paged()
            .errors(&[Code::AccountNotFound])
            .answers(200, "One page of positions.", schema::<PositionPage>),
        handler,
    )
}

pub fn routes() -> Router<AppState> {
    api_doc().into_router()
}

#[allow(dead_code)]
#[derive(schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
struct PositionPage {
    positions: Vec<PositionView<'static>>,
    /// The cursor of the next page; `null` on the last page.
    next_cursor: Option<String>,
}

async fn handler(
    State(st): State<AppState>,
    Authed(caller): Authed,
    Query(mut q): Query,
) -> Result<Response, ApiError> {
    let account_id = q.ident("account_id")?;
    let page = q.page()?;
    q.finish()?;
    let l = st
        .reads
        .positions(&caller, account_id.as_deref(), &page)
        .await?;
    Ok(super::listing("positions", &l))
}
