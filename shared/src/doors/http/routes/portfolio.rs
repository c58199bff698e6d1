//! `GET /portfolio?account_id=`, `GET /portfolio/allocation[?account_id=]` and
//! `GET /portfolio/risk-flags?account_id=`: what an account's positions are worth and
//! risk, where the book sits on the curve, and which positions are about to become a
//! delivery problem (`protocol::portfolio`). Desk-filtered like every read: an account the
//! operator may not see is 404.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};

use crate::app::AppState;
use crate::core::domain::Ident;
use crate::core::error::{ApiError, Code};
use crate::core::usecases::portfolio::{AllocationView, PortfolioView, RiskFlagsView};
use crate::doors::http::api;
use crate::doors::http::extract::{Authed, Query};
use crate::doors::http::openapi::{schema, Api, Op};

const ACCOUNT: &str = "The account. One the operator may not see is 404 `account_not_found`.";

pub fn api_doc() -> Api {
    Api::new()
        .route(
            Op::get(api("/portfolio"), "getPortfolio")
                .tag("portfolio")
                .summary(
                    "An account's positions, valued",
                    "Per position the contract, quantity, average and reference price, notional (contracts x 1,000 barrels x reference price, USD) and unrealized P&L; the totals: gross and net notional, net contracts. Decimal strings, never binary floating point.",
                )
                .required_query("account_id", schema::<Ident>, ACCOUNT)
                .errors(&[Code::AccountNotFound])
                .answers(200, "The valued positions.", schema::<PortfolioView>),
            portfolio,
        )
        .route(
            Op::get(api("/portfolio/allocation"), "getAllocation")
                .tag("portfolio")
                .summary(
                    "Where the gross notional sits",
                    "Gross notional by contract month, by side and by desk, as percentages with two decimals that sum to exactly 100. Without `account_id`: every account the operator may see.",
                )
                .query("account_id", schema::<Ident>, ACCOUNT)
                .errors(&[Code::AccountNotFound])
                .answers(200, "The allocation.", schema::<AllocationView>),
            allocation,
        )
        .route(
            Op::get(api("/portfolio/risk-flags"), "getRiskFlags")
                .tag("portfolio")
                .summary(
                    "An account's risk flags",
                    "Deterministic flags with the figures behind them: `concentration` (a contract month above the policy's share of gross notional: warn; not for a book in one month only), `near_limit` (above the policy's share of `max_position`: warn), `close_only` and `delivery` (inside the close-only window, or within the policy's business days of the last trading day: fail). And the long/short calendar exposure.",
                )
                .required_query("account_id", schema::<Ident>, ACCOUNT)
                .errors(&[Code::AccountNotFound])
                .answers(200, "The flags.", schema::<RiskFlagsView>),
            risk_flags,
        )
}

pub fn routes() -> Router<AppState> {
    api_doc().into_router()
}

fn account(q: &mut crate::doors::http::extract::QueryParams) -> Result<String, ApiError> {
    q.ident("account_id")?
        .ok_or_else(|| ApiError::invalid("account_id", "is required"))
}

async fn portfolio(
    State(st): State<AppState>,
    Authed(caller): Authed,
    Query(mut q): Query,
) -> Result<Response, ApiError> {
    let id = account(&mut q)?;
    q.finish()?;
    Ok(Json(st.portfolio.portfolio(&caller, &id).await?).into_response())
}

async fn allocation(
    State(st): State<AppState>,
    Authed(caller): Authed,
    Query(mut q): Query,
) -> Result<Response, ApiError> {
    let id = q.ident("account_id")?;
    q.finish()?;
    Ok(Json(st.portfolio.allocation(&caller, id.as_deref()).await?).into_response())
}

async fn risk_flags(
    State(st): State<AppState>,
    Authed(caller): Authed,
    Query(mut q): Query,
) -> Result<Response, ApiError> {
    let id = account(&mut q)?;
    q.finish()?;
    Ok(Json(st.portfolio.risk_flags(&caller, &id).await?).into_response())
}
