//! The approval page: where an operator, signed in with a passkey, approves or declines
//! the plans the agent made (server-rendered HTML and a small script, no build step), and
//! the admin-only API that creates enrolment links. The decisions are
//! `protocol::approvals`'; this module speaks HTTP: pages, cookies, the anti-forgery
//! checks, JSON ceremonies.
//!
//! Paths live under `/approvals` (not the Mastra base path): on AWS they are the
//! `approvals` function behind its own public API, locally the same listener as the API.

pub mod pages;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;

use crate::app::AppState;
use crate::core::auth::Permission;
use crate::core::error::{ApiError, Code};
use crate::core::records::ApprovalDecision;
use crate::core::usecases::approvals::summary;
use crate::core::usecases::approvals::EnrolmentLink;
use crate::core::usecases::approvals::{SignedIn, DEFAULT_ENROLMENT_TTL_S, SESSION_COOKIE};
use crate::doors::http::api;
use crate::doors::http::extract::{Authed, JsonBody, PathId, Query};
use crate::doors::http::observe::current_request_id;
use crate::doors::http::openapi::{schema, Api, Op};

/// The admin API (in the document) and the approval pages (for browsers, not in it).
pub fn api_doc() -> Api {
    Api::new()
        .route(
            Op::post(api("/operators/enrolments"), "createEnrolment")
                .tag("operators")
                .summary(
                    "Create an operator's enrolment link",
                    "Admins only: `trade.admin` on the service token and an admin role on the operator token (Mastra is never given it). Creates or updates the operator and returns a one-time link that registers one passkey.",
                )
                .body(
                    schema::<EnrolmentRequest>,
                    vec![("trader", serde_json::json!({"sub": "op-new-trader", "roles": ["trader"], "desks": ["energy"], "ttl_seconds": 86400}))],
                )
                .answers(201, "The one-time enrolment link.", schema::<EnrolmentLink>),
            create_enrolment,
        )
        .pages(pages_router())
}

pub fn routes() -> Router<AppState> {
    api_doc().into_router()
}

fn pages_router() -> Router<AppState> {
    Router::new()
        .route("/approvals", get(pending_page))
        .route("/approvals/", get(pending_page))
        .route("/approvals/pending.json", get(pending_json))
        .route("/approvals/assets/approvals.js", get(script))
        .route("/approvals/login", get(login_page))
        .route("/approvals/login/start", post(login_start))
        .route("/approvals/login/finish", post(login_finish))
        .route("/approvals/logout", post(logout))
        .route("/approvals/enroll/{secret}", get(enrol_page))
        .route("/approvals/enroll/{secret}/start", post(enrol_start))
        .route("/approvals/enroll/{secret}/finish", post(enrol_finish))
        .route("/approvals/plans/{plan_id}", get(plan_page))
        .route(
            "/approvals/plans/{plan_id}/state.json",
            get(plan_state_json),
        )
        .route("/approvals/plans/{plan_id}/start", post(decision_start))
        .route("/approvals/plans/{plan_id}/finish", post(decision_finish))
}

// ---- Sessions and forgery checks ---------------------------------------------------------

fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

async fn signed_in(st: &AppState, headers: &HeaderMap) -> Result<Option<SignedIn>, ApiError> {
    match cookie(headers, SESSION_COOKIE) {
        Some(secret) => st.approvals.session(&secret).await,
        None => Ok(None),
    }
}

/// A state-changing request must come from the approval page itself: its `Origin` is the
/// configured origin (browsers always send it on `fetch` POSTs; a cross-site form cannot
/// send JSON without it). Session requests also carry the session's anti-forgery token.
fn same_origin(st: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
    if origin == Some(st.approvals.origin.trim_end_matches('/')) {
        Ok(())
    } else {
        Err(ApiError::new(
            Code::CsrfRejected,
            "This request did not come from the approval page (Origin); reload the page and try again.",
        ))
    }
}

async fn session_post(st: &AppState, headers: &HeaderMap) -> Result<SignedIn, ApiError> {
    same_origin(st, headers)?;
    let who = signed_in(st, headers).await?.ok_or_else(|| {
        ApiError::new(
            Code::SignInRequired,
            "Sign in with your passkey first (your session may have expired); reload the page.",
        )
    })?;
    let token = headers
        .get("x-csrf-token")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !crate::core::usecases::approvals::same_secret(token, &who.csrf) {
        return Err(ApiError::new(
            Code::CsrfRejected,
            "This request lacks the page's anti-forgery token; reload the page and try again.",
        ));
    }
    Ok(who)
}

fn session_cookie(st: &AppState, secret: &str, max_age_s: u32) -> HeaderValue {
    let secure = if st.approvals.origin.starts_with("https://") {
        "; Secure"
    } else {
        ""
    };
    HeaderValue::from_str(&format!(
        "{SESSION_COOKIE}={secret}; Path=/approvals; HttpOnly; SameSite=Strict; Max-Age={max_age_s}{secure}"
    ))
    .unwrap_or_else(|_| HeaderValue::from_static(""))
}

fn with_cookie(body: serde_json::Value, cookie: HeaderValue) -> Response {
    let mut resp = Json(body).into_response();
    resp.headers_mut().insert(header::SET_COOKIE, cookie);
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// Where to go after signing in: a path of the approval page, nothing else.
fn safe_next(next: Option<String>) -> String {
    match next {
        Some(n)
            if n.starts_with("/approvals")
                && !n.contains("//")
                && !n.contains('\\')
                && n.bytes().all(|b| b.is_ascii_graphic()) =>
        {
            n
        }
        _ => "/approvals".into(),
    }
}

fn to_login(path: &str) -> Response {
    Redirect::to(&format!("/approvals/login?next={path}")).into_response()
}

// ---- Pages ---------------------------------------------------------------------------------

async fn script() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        pages::SCRIPT,
    )
        .into_response()
}

async fn login_page(State(st): State<AppState>, Query(mut q): Query) -> Response {
    let next = match q.text("next") {
        Ok(n) => safe_next(n),
        Err(_) => "/approvals".into(),
    };
    let _ = st;
    pages::login(&next)
}

/// Plans on one page of the pending list.
const PENDING_PAGE: u32 = 50;

async fn pending_page(
    State(st): State<AppState>,
    headers: HeaderMap,
    Query(mut q): Query,
) -> Response {
    let who = match signed_in(&st, &headers).await {
        Ok(Some(w)) => w,
        Ok(None) => return to_login("/approvals"),
        Err(e) => return pages::error_page(&e),
    };
    // A position this page did not write starts the list from the top.
    let before = q
        .text("before")
        .ok()
        .flatten()
        .and_then(|b| pages::parse_pending_position(&b));
    match st
        .approvals
        .pending(&who, before.as_ref(), PENDING_PAGE)
        .await
    {
        Ok(page) => pages::pending(&who, &page, st.clock.now_ms(), before.is_none()),
        Err(e) => pages::error_page(&e),
    }
}

/// A JSON read of the page's own, for its script: signed in, or 401 `sign_in_required`.
async fn session_read(st: &AppState, headers: &HeaderMap) -> Result<SignedIn, ApiError> {
    signed_in(st, headers).await?.ok_or_else(|| {
        ApiError::new(
            Code::SignInRequired,
            "Sign in with your passkey first (your session may have expired); reload the page.",
        )
    })
}

fn no_store(body: serde_json::Value) -> Response {
    let mut resp = Json(body).into_response();
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// `GET /approvals/pending.json`: the first page of the pending list, which the list's
/// script polls to update itself: each plan's summary and the list's items as HTML.
async fn pending_json(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let who = session_read(&st, &headers).await?;
    let page = st.approvals.pending(&who, None, PENDING_PAGE).await?;
    let now = st.clock.now_ms();
    let items: Vec<summary::PendingItem> = page
        .plans
        .iter()
        .map(|p| summary::pending_item(p, now))
        .collect();
    Ok(no_store(serde_json::json!({
        "count": items.len(),
        "key": pages::pending_key(&items),
        "text": pages::pending_count(items.len(), true),
        "html": pages::pending_items(&who, &items),
        "more": page.next.is_some(),
        "plans": items,
    })))
}

/// `GET /approvals/plans/{plan_id}/state.json`: where a plan stands and whether this
/// operator may still decide it, which the plan page's script polls so that its buttons
/// are disabled, with the reason, once the plan is decided elsewhere.
async fn plan_state_json(
    State(st): State<AppState>,
    headers: HeaderMap,
    PathId(id): PathId,
) -> Result<Response, ApiError> {
    let who = session_read(&st, &headers).await?;
    let p = st.approvals.plan_page(&who, &id).await?;
    let now = st.clock.now_ms();
    let state = pages::state(&p.plan, now);
    Ok(no_store(serde_json::json!({
        "plan_id": p.plan.plan_id,
        "state": state,
        "approve": p.approve.is_ok(),
        "decline": p.decline.is_ok(),
        "why_not": p.approve.as_ref().err().or(p.decline.as_ref().err()),
        "left_ms": (p.plan.expires_at - now).max(0),
        "four_eyes": summary::four_eyes(&p.plan),
    })))
}

async fn plan_page(State(st): State<AppState>, headers: HeaderMap, PathId(id): PathId) -> Response {
    let who = match signed_in(&st, &headers).await {
        Ok(Some(w)) => w,
        Ok(None) => return to_login(&format!("/approvals/plans/{id}")),
        Err(e) => return pages::error_page(&e),
    };
    match st.approvals.plan_page(&who, &id).await {
        Ok(p) => pages::plan(&who, &p, st.clock.now_ms()),
        Err(e) => pages::error_page(&e),
    }
}

async fn enrol_page(State(st): State<AppState>, PathId(secret): PathId) -> Response {
    match st.approvals.enrolment(&secret).await {
        Ok((sub, expires_at)) => pages::enrol(&sub, expires_at),
        Err(e) => pages::error_page(&e),
    }
}

// ---- Ceremonies (JSON) -------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LoginStart {
    operator_id: String,
    #[serde(default)]
    next: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Finish {
    challenge_id: String,
    credential: serde_json::Value,
    #[serde(default)]
    next: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DecisionStart {
    decision: ApprovalDecision,
}

async fn login_start(
    State(st): State<AppState>,
    headers: HeaderMap,
    JsonBody(req): JsonBody<LoginStart>,
) -> Result<Response, ApiError> {
    same_origin(&st, &headers)?;
    let _ = req.next;
    let c = st.approvals.start_sign_in(&req.operator_id).await?;
    Ok(Json(c).into_response())
}

async fn login_finish(
    State(st): State<AppState>,
    headers: HeaderMap,
    JsonBody(req): JsonBody<Finish>,
) -> Result<Response, ApiError> {
    same_origin(&st, &headers)?;
    let (sub, session) = st
        .approvals
        .finish_sign_in(&req.challenge_id, req.credential)
        .await?;
    Ok(with_cookie(
        serde_json::json!({ "operator_id": sub, "next": safe_next(req.next) }),
        session_cookie(&st, &session.secret, session.max_age_s),
    ))
}

async fn logout(State(st): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    let who = session_post(&st, &headers).await?;
    st.approvals.sign_out(&who).await?;
    Ok(with_cookie(
        serde_json::json!({ "signed_out": true }),
        session_cookie(&st, "", 0),
    ))
}

async fn enrol_start(
    State(st): State<AppState>,
    headers: HeaderMap,
    PathId(secret): PathId,
) -> Result<Response, ApiError> {
    same_origin(&st, &headers)?;
    Ok(Json(st.approvals.start_registration(&secret).await?).into_response())
}

async fn enrol_finish(
    State(st): State<AppState>,
    headers: HeaderMap,
    PathId(secret): PathId,
    JsonBody(req): JsonBody<Finish>,
) -> Result<Response, ApiError> {
    same_origin(&st, &headers)?;
    let (sub, session) = st
        .approvals
        .finish_registration(&secret, &req.challenge_id, req.credential)
        .await?;
    Ok(with_cookie(
        serde_json::json!({ "operator_id": sub, "next": "/approvals" }),
        session_cookie(&st, &session.secret, session.max_age_s),
    ))
}

async fn decision_start(
    State(st): State<AppState>,
    headers: HeaderMap,
    PathId(plan_id): PathId,
    JsonBody(req): JsonBody<DecisionStart>,
) -> Result<Response, ApiError> {
    let who = session_post(&st, &headers).await?;
    let c = st
        .approvals
        .start_decision(&who, &plan_id, req.decision, &current_request_id())
        .await?;
    Ok(Json(c).into_response())
}

async fn decision_finish(
    State(st): State<AppState>,
    headers: HeaderMap,
    PathId(plan_id): PathId,
    JsonBody(req): JsonBody<Finish>,
) -> Result<Response, ApiError> {
    let who = session_post(&st, &headers).await?;
    let a = st
        .approvals
        .finish_decision(
            &who,
            &plan_id,
            &req.challenge_id,
            req.credential,
            &current_request_id(),
        )
        .await?;
    Ok(Json(serde_json::json!({
        "plan_id": plan_id,
        "decision": a.decision,
        "approver": a.approver,
        "at": crate::core::domain::rfc3339(a.at),
    }))
    .into_response())
}

// ---- Admin API ---------------------------------------------------------------------------

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct EnrolmentRequest {
    /// The operator id (their tokens' `sub`).
    #[schemars(length(min = 1, max = 256), regex(pattern = crate::core::domain::PRINTABLE_PATTERN))]
    sub: String,
    /// Role names (default `["trader"]`).
    #[serde(default)]
    #[schemars(length(max = 64), inner(length(min = 1, max = 128)))]
    roles: Option<Vec<String>>,
    /// Desks the operator works on (default none; `*` for all).
    #[serde(default)]
    #[schemars(length(max = 64), inner(length(min = 1, max = 128)))]
    desks: Option<Vec<String>>,
    /// How long the link works, 60 s to 7 days (default 1 day).
    #[serde(default, deserialize_with = "crate::core::domain::optional_whole_u32")]
    #[schemars(range(min = 60, max = crate::core::usecases::approvals::MAX_ENROLMENT_TTL_S))]
    ttl_seconds: Option<u32>,
}

/// `POST /operators/enrolments`: an enrolment link, for admins only (`trade.admin` on both
/// the service token and the operator's roles; Mastra's client is never given it).
async fn create_enrolment(
    State(st): State<AppState>,
    Authed(caller): Authed,
    Query(q): Query,
    JsonBody(req): JsonBody<EnrolmentRequest>,
) -> Result<Response, ApiError> {
    q.finish()?;
    caller.require(Permission::Admin)?;
    let link = st
        .approvals
        .enroll(
            &req.sub,
            &req.roles.unwrap_or_else(|| vec!["trader".into()]),
            &req.desks.unwrap_or_default(),
            req.ttl_seconds.unwrap_or(DEFAULT_ENROLMENT_TTL_S),
            &caller.operator.sub,
        )
        .await?;
    tracing::info!(operator = %link.sub, by = %caller.operator.sub, "enrolment link created");
    Ok((StatusCode::CREATED, Json(link)).into_response())
}
