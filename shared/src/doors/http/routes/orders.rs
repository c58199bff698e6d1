//! `GET /orders?account_id=&status=`: orders on the operator's desks, newest first.

use axum::extract::State;
use axum::response::Response;
use axum::Router;

use crate::app::AppState;
use crate::core::domain::{Ident, OrderStatus};
use crate::core::error::ApiError;
use crate::core::error::Code;
use crate::doors::http::api;
use crate::doors::http::extract::{Authed, Query};
use crate::doors::http::openapi::{schema, Api, Op};
use crate::core::ports::OrderFilter;
use crate::core::usecases::views::OrderView;

pub fn api_doc() -> Api {
    Api::new().route(
        Op::get(api("/orders"), "listOrders")
            .tag("reads")
            .summary(
                "Orders on the operator's desks",
                "Orders newest first, optionally by account and status.",
            )
            .query("account_id", schema::<Ident>, "Only this account's orders. An account the operator may not see is 404 `account_not_found`.")
            .query("status", schema::<OrderStatus>, "Only orders in this status.")
            .paged()
            .errors(&[Code::AccountNotFound])
            .answers(200, "One page of orders, newest first.", schema::<OrderPage>),
        handler,
    )
}

pub fn routes() -> Router<AppState> {
    api_doc().into_router()
}

#[allow(dead_code)]
#[derive(schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
struct OrderPage {
    orders: Vec<OrderView<'static>>,
    /// The cursor of the next page; `null` on the last page.
    next_cursor: Option<String>,
}

async fn handler(
    State(st): State<AppState>,
    Authed(caller): Authed,
    Query(mut q): Query,
) -> Result<Response, ApiError> {
    let filter = OrderFilter {
        account_id: q.ident("account_id")?,
        status: q.parsed("status")?,
    };
    let page = q.page()?;
    q.finish()?;
    let l = st.reads.orders(&caller, filter, &page).await?;
    Ok(super::listing("orders", &l))
}
