//! `POST /mcp`: every Airlock tool through one MCP endpoint (Streamable HTTP, stateless,
//! JSON responses) with the official Rust SDK (`rmcp`). It speaks the 2026-07-28 revision
//! (no sessions, `server/discover`) and keeps the `initialize` handshake for 2025-11-25 and
//! 2025-06-18 clients; no session is ever minted, so any process or Lambda instance answers
//! any request.
//!
//! Both tokens are checked here on every request, before rmcp sees it; the caller rides in
//! the request's extensions to the tool calls. The tools are `protocol::tools`: the same use
//! cases as the REST handlers, the same desk filter, rate limits and audit. A tool the
//! caller's permissions do not allow is neither listed nor callable.

use std::borrow::Cow;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ErrorCode, ErrorData,
    InputRequiredResult, ListToolsResult, PaginatedRequestParams, ProtocolVersion,
    ServerCapabilities, ServerConfig,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::app::AppState;
use crate::auth::Caller;
use crate::error::{ApiError, Code};
use crate::http::api;
use crate::http::extract::Authed;
use crate::http::observe::current_request_id;
use crate::http::openapi::{Api, Op};
use crate::protocol::tools::{self, ToolFacts, ToolOutcome};

/// The path, under the base path.
pub const PATH: &str = "/mcp";

/// The revisions served, newest first.
pub const VERSIONS: &[ProtocolVersion] = &[
    ProtocolVersion::V_2026_07_28,
    ProtocolVersion::V_2025_11_25,
    ProtocolVersion::V_2025_06_18,
];

/// How long a retried `execute_plan` whose user agreed to open the approval page waits for
/// the approval before asking again (inside the function's timeout and the clients' 60 s).
pub const APPROVAL_HOLD: std::time::Duration = std::time::Duration::from_secs(20);

/// The MCP server: the tools of one process's use cases.
#[derive(Clone)]
pub struct McpServer {
    pub state: AppState,
}

/// The routes: `POST /mcp` (and `GET`/`DELETE`, which MCP answers 405 on a stateless
/// server). `local`: `airlock serve` on loopback checks the `Host` header against DNS
/// rebinding; a Lambda behind API Gateway is reached by its API's host names.
pub fn api_doc(local: bool) -> Api {
    Api::new().route_with(
        Op::post(api(PATH), "mcp")
            .tag("mcp")
            .summary(
                "The MCP endpoint (Streamable HTTP)",
                "Every Airlock tool through one Model Context Protocol endpoint: JSON-RPC 2.0 messages, stateless, JSON responses (send `Accept: application/json, text/event-stream`). Its messages are MCP's (https://modelcontextprotocol.io); the tools and their schemas are listed by `tools/list`. JSON-RPC errors and tool errors answer 200.",
            )
            .body(
                |_| schemars::json_schema!({
                    "type": "object",
                    "description": "A JSON-RPC 2.0 request or notification of MCP.",
                    "properties": {"jsonrpc": {"const": "2.0"}, "id": {"type": ["string", "integer"]},
                                   "method": {"type": "string"}, "params": {"type": "object"}},
                    "required": ["jsonrpc", "method"]
                }),
                vec![("tools/list", json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}))],
            )
            .answers(200, "A JSON-RPC 2.0 response.", |_| schemars::json_schema!({
                "type": "object",
                "properties": {"jsonrpc": {"const": "2.0"}, "id": {"type": ["string", "integer", "null"]},
                               "result": {"type": "object"}, "error": {"type": "object"}},
                "required": ["jsonrpc"]
            }))
            .answers(202, "A notification, accepted.", |_| schemars::json_schema!({}))
            // A tool the caller may not use is left out of `tools/list` and refused as a
            // JSON-RPC error; the endpoint itself answers everyone with both tokens.
            .never(&[Code::InsufficientScope]),
        any(move |st, authed, req| handle(st, authed, req, local)),
    )
}

pub fn routes(local: bool) -> Router<AppState> {
    api_doc(local).into_router()
}

async fn handle(
    State(st): State<AppState>,
    Authed(caller): Authed,
    mut req: Request,
    local: bool,
) -> Response {
    req.extensions_mut().insert(caller);
    let sent_json = req
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"));
    let mut config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None)
        .with_max_request_body_bytes(crate::http::extract::MAX_BODY_BYTES);
    if !local {
        config = config.disable_allowed_hosts();
    }
    let server = McpServer { state: st };
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(NeverSessionManager::default()),
        config,
    );
    let resp = match service.oneshot(req).await {
        Ok(resp) => resp.map(axum::body::Body::new).into_response(),
        Err(never) => match never {},
    };
    // rmcp answers 415 to a JSON body it cannot read as a JSON-RPC message; the contract
    // keeps 415 for another content type and calls a bad body 400.
    if sent_json && resp.status() == axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE {
        return ApiError::invalid_at("/".into(), "not a JSON-RPC 2.0 message of MCP")
            .into_response();
    }
    resp
}

fn caller(ctx: &RequestContext<RoleServer>) -> Result<Caller, ErrorData> {
    ctx.extensions
        .get::<axum::http::request::Parts>()
        .and_then(|p| p.extensions.get::<Caller>())
        .cloned()
        .ok_or_else(|| {
            ErrorData::internal_error("the request carries no authenticated caller", None)
        })
}

fn header(ctx: &RequestContext<RoleServer>, name: &str) -> Option<String> {
    ctx.extensions
        .get::<axum::http::request::Parts>()
        .and_then(|p| p.headers.get(name))
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 256 && !v.chars().any(char::is_control))
        .map(String::from)
}

fn decode<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, ErrorData> {
    serde_json::from_value(v)
        .map_err(|e| ErrorData::internal_error(format!("building a result: {e}"), None))
}

/// A tool result: structured content (an object) and one short line of text.
fn result(structured: Value, text: String, is_error: bool) -> Result<CallToolResult, ErrorData> {
    decode(json!({
        "resultType": "complete",
        "content": [{ "type": "text", "text": text }],
        "structuredContent": structured,
        "isError": is_error,
    }))
}

/// Whether the client said it can open URLs for the user (URL-mode elicitation).
fn url_elicitation(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.client_capabilities()
        .and_then(|c| serde_json::to_value(c).ok())
        .is_some_and(|c| c.pointer("/elicitation/url").is_some())
}

impl rmcp::ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::new(ServerCapabilities::builder().enable_tools().build());
        info.server_info = rmcp::model::Implementation::new("airlock", env!("CARGO_PKG_VERSION"));
        info.instructions = Some(
            "Airlock: read CL futures accounts, positions, orders and jobs, and propose trades. \
             Plan first (plan_* tools), show the preview and risk checks to the operator; new \
             orders are approved by the operator on Airlock's approval page (execute_plan asks \
             the client to open it). Report progress with get_action."
                .into(),
        );
        info
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(VERSIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let caller = caller(&ctx)?;
        let tools: Vec<Value> = tools::visible(&caller)
            .map(|t| {
                json!({
                    "name": t.name,
                    "title": t.title,
                    "description": t.description,
                    "inputSchema": t.input_schema,
                    "outputSchema": t.output_schema,
                    "annotations": {
                        "title": t.title,
                        "readOnlyHint": t.read_only,
                        "destructiveHint": t.destructive,
                        "idempotentHint": t.idempotent,
                        "openWorldHint": false,
                    }
                })
            })
            .collect();
        // The list depends on the caller's permissions: private, and cached briefly.
        decode(json!({
            "resultType": "complete",
            "tools": tools,
            "ttlMs": 60_000,
            "cacheScope": "private",
        }))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let caller = caller(&ctx)?;
        let Some(tool) = tools::visible(&caller).find(|t| t.name == request.name) else {
            return Err(ErrorData::invalid_params(
                format!("Unknown tool: {}", request.name),
                None,
            ));
        };
        let facts = ToolFacts {
            request_id: current_request_id(),
            chat_session_id: header(&ctx, "x-chat-session-id"),
            tool_call_id: header(&ctx, "x-tool-call-id").or_else(|| {
                Some(format!(
                    "mcp:{}",
                    serde_json::to_value(&ctx.id)
                        .map(|v| v.to_string())
                        .unwrap_or_default()
                ))
            }),
        };
        let args = request.arguments.map(Value::Object).unwrap_or(Value::Null);
        let mut outcome = self
            .state
            .tools
            .call(&caller, tool, args.clone(), &facts)
            .await;
        let version = ctx.protocol_version();
        // The retry of an approval request: the user agreed to open the page. Real clients
        // retry at once, a few times, so hold the call while the person approves (polling
        // the same idempotent execute) instead of asking again straight away.
        let answer = request
            .input_responses
            .as_ref()
            .and_then(|r| r.get("approve"))
            .and_then(|a| a.get("action"))
            .and_then(Value::as_str)
            .map(String::from);
        if let Some(answer) = answer {
            if answer != "accept" {
                let e = crate::error::ApiError::new(
                    crate::error::Code::ApprovalRequired,
                    "The user did not open the approval page; the plan still waits for the operator's approval there.",
                );
                return Ok(result(
                    tools::error_body(&e),
                    format!("{}: {}", e.code, e.message),
                    true,
                )?
                .into());
            }
            let until = tokio::time::Instant::now() + APPROVAL_HOLD;
            if matches!(outcome, Ok(ToolOutcome::NeedsApproval { .. })) {
                // Look at the plan (a read, no audit record) until it is decided, then
                // execute once more.
                while tokio::time::Instant::now() < until
                    && self
                        .state
                        .tools
                        .awaiting_approval(&args)
                        .await
                        .unwrap_or(false)
                {
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                }
                outcome = self
                    .state
                    .tools
                    .call(&caller, tool, args.clone(), &facts)
                    .await;
            }
        }
        match outcome {
            Ok(ToolOutcome::Done { structured, text }) => {
                Ok(result(structured, text, false)?.into())
            }
            Err(e) => {
                let text = format!("{}: {}", e.code, e.message);
                Ok(result(tools::error_body(&e), text, true)?.into())
            }
            Ok(ToolOutcome::NeedsApproval {
                plan_id,
                url,
                expires_at,
                message,
            }) => {
                let ask = format!(
                    "Approve plan {plan_id} in Airlock with your passkey (before {expires_at}); the order is placed once you approve."
                );
                if version == Some(ProtocolVersion::V_2026_07_28) && url_elicitation(&ctx) {
                    // MRTR: the client opens the URL, then calls the tool again.
                    let r: InputRequiredResult = decode(json!({
                        "resultType": "input_required",
                        "inputRequests": { "approve": { "method": "elicitation/create", "params": {
                            "mode": "url", "message": ask, "url": url } } },
                    }))?;
                    return Ok(r.into());
                }
                if version == Some(ProtocolVersion::V_2025_11_25) && url_elicitation(&ctx) {
                    return Err(ErrorData::new(
                        ErrorCode(-32042),
                        format!("{ask} Open {url}"),
                        Some(json!({ "elicitations": [{
                            "mode": "url",
                            "elicitationId": plan_id,
                            "url": url,
                            "message": ask,
                        }] })),
                    ));
                }
                // A client that cannot open URLs: tell the user where to go.
                let body = json!({
                    "error": { "code": "approval_required", "message": message },
                    "approval": { "required": true, "url": url, "expires_at": expires_at },
                });
                Ok(result(
                    body,
                    format!("{ask} Open {url}, then call execute_plan again."),
                    true,
                )?
                .into())
            }
        }
    }
}
