//! `GET /accounts`: the accounts on the operator's desks.

use axum::extract::State;
use axum::response::Response;
use axum::Router;

use crate::app::AppState;
use crate::core::error::ApiError;
use crate::doors::http::api;
use crate::doors::http::extract::{Authed, Query};
use crate::doors::http::openapi::{schema, Api, Op};
use crate::core::usecases::views::AccountView;

pub fn api_doc() -> Api {
    Api::new().route(
        Op::get(api("/accounts"), "listAccounts")
            .tag("reads")
            .summary(
                "Accounts on the operator's desks",
                "Accounts the operator may see (desk-filtered), by account id. Page with `next_cursor`.",
            )
            .paged()
            .answers(200, "One page of accounts.", schema::<AccountPage>),
        handler,
    )
}

pub fn routes() -> Router<AppState> {
    api_doc().into_router()
}

/// One page of `GET /accounts` (the document's schema of the answer).
#[allow(dead_code)]
#[derive(schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
struct AccountPage {
    accounts: Vec<AccountView<'static>>,
    /// The cursor of the next page; `null` on the last page.
    next_cursor: Option<String>,
}

async fn handler(
    State(st): State<AppState>,
    Authed(caller): Authed,
    Query(mut q): Query,
) -> Result<Response, ApiError> {
    let page = q.page()?;
    q.finish()?;
    let l = st.reads.accounts(&caller, &page).await?;
    Ok(super::listing("accounts", &l))
}
