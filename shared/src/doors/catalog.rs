//! Every door's endpoints in one place: the router `airlock serve` mounts, and
//! `GET /openapi.json`, this API's OpenAPI 3.1 document made from the routes themselves
//! (`http::openapi`). The same text is committed as `docs/openapi.json`.

use std::sync::OnceLock;

use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::Router;

use crate::app::AppState;
use crate::core::auth::Permission;
use crate::core::error::ApiError;
use crate::doors::http::api;
use crate::doors::http::extract::{Authed, Query};
use crate::doors::http::openapi::{Api, Op};
use crate::doors::http::routes::{
    accounts, action_status, execute, health, jobs, orders, plan, portfolio, positions,
};

/// Every endpoint and its documentation: what `airlock serve` mounts, and the OpenAPI
/// document ([`text`]).
pub fn all_api() -> Api {
    Api::new()
        .merge(api_doc())
        .merge(health::api_doc())
        .merge(accounts::api_doc())
        .merge(positions::api_doc())
        .merge(portfolio::api_doc())
        .merge(orders::api_doc())
        .merge(jobs::api_doc())
        .merge(action_status::api_doc())
        .merge(plan::api_doc())
        .merge(execute::api_doc())
        .merge(crate::doors::approval_page::api_doc())
        .merge(crate::doors::mcp::api_doc(true))
}

/// Every endpoint on one router: what `airlock serve` mounts.
pub fn all() -> Router<AppState> {
    all_api().into_router()
}

pub fn api_doc() -> Api {
    Api::new().route(
        Op::get(api("/openapi.json"), "getOpenApi")
            .tag("service")
            .summary(
                "This API's OpenAPI document",
                "The OpenAPI 3.1 document of every operation, generated from the routes (docs/openapi.json in the repository is the same text). Same tokens as the reads.",
            )
            .answers(200, "The OpenAPI 3.1 document.", |_| {
                schemars::json_schema!({"type": "object", "required": ["openapi", "info", "paths"]})
            }),
        handler,
    )
}

pub fn routes() -> Router<AppState> {
    api_doc().into_router()
}

/// The document as served and committed: pretty JSON and a final newline. Built once;
/// `Err` only for a schema bug, which the committed-document test catches before a release.
pub fn text() -> Result<&'static str, String> {
    static TEXT: OnceLock<Result<String, String>> = OnceLock::new();
    TEXT.get_or_init(|| {
        let doc = all_api().document()?;
        let mut t = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
        t.push('\n');
        Ok(t)
    })
    .as_deref()
    .map_err(Clone::clone)
}

async fn handler(Authed(caller): Authed, Query(q): Query) -> Result<Response, ApiError> {
    q.finish()?;
    caller.require(Permission::Read)?;
    let text = text().map_err(ApiError::internal)?;
    Ok(([(CONTENT_TYPE, "application/json")], text).into_response())
}
