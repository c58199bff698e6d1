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

pub mod tools;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

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
use crate::core::auth::Caller;
use crate::core::error::{ApiError, Code};
use crate::doors::http::api;
use crate::doors::http::deadline::{wall_ms, within_deadline};
use crate::doors::http::extract::{
    json_text_faults, too_large, Authed, MAX_BODY_BYTES, MAX_JSON_KEY_CHARS, MAX_JSON_STRING_CHARS,
};
use crate::doors::http::observe::current_request_id;
use crate::doors::http::openapi::{Api, Op};
use tools::{ToolFacts, ToolOutcome};

/// The path, under the base path.
pub const PATH: &str = "/mcp";

/// The revisions served, newest first.
pub const VERSIONS: &[ProtocolVersion] = &[
    ProtocolVersion::V_2026_07_28,
    ProtocolVersion::V_2025_11_25,
    ProtocolVersion::V_2025_06_18,
];

/// The longest a retried `execute_plan` whose user agreed to open the approval page waits
/// for the approval before asking again (`AIRLOCK_APPROVAL_HOLD_MS` may shorten it; inside
/// the clients' 60 s).
pub const APPROVAL_HOLD: Duration = Duration::from_millis(crate::config::DEFAULT_APPROVAL_HOLD_MS);

/// The MCP server: the tools of one process's use cases.
#[derive(Clone)]
pub struct McpServer {
    pub state: AppState,
    pub tools: tools::Tools,
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
            .required_header(
                "Accept",
                |_| schemars::json_schema!({"type": "string", "enum": ["application/json, text/event-stream"]}),
                "MCP's Streamable HTTP: the client takes JSON and event streams (this endpoint answers JSON). An `Accept` without both is 400 `invalid_request`.",
            )
            .body(
                |_| schemars::json_schema!({
                    "type": "object",
                    "description": "A JSON-RPC 2.0 request or notification of MCP. Keys longer than 128 characters and strings longer than 4,096, at any depth, are refused (400 `invalid_request`, the field's pointer).",
                    "properties": {"jsonrpc": {"const": "2.0"},
                                   "id": {"type": ["string", "integer"], "maxLength": MAX_JSON_STRING_CHARS},
                                   "method": {"type": "string", "maxLength": MAX_JSON_STRING_CHARS},
                                   "params": {"type": ["object", "null"], "propertyNames": {"maxLength": MAX_JSON_KEY_CHARS}}},
                    "propertyNames": {"maxLength": MAX_JSON_KEY_CHARS},
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
            .answers_empty(202, "A notification, accepted (no body).")
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
    req: Request,
    local: bool,
) -> Response {
    let (mut parts, body) = req.into_parts();
    parts.extensions.insert(caller);
    let sent_json = parts
        .headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"));
    // The message is read as a REST body is: at most 64 KiB, every key once, strings and
    // keys bounded. rmcp parses it again (keeping the last of two equal keys), so it only
    // ever sees text that passed.
    let declared = parts
        .headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES) {
        return too_large().into_response();
    }
    let Ok(bytes) = axum::body::to_bytes(body, MAX_BODY_BYTES).await else {
        return too_large().into_response();
    };
    if sent_json {
        match strict_message(&bytes) {
            Ok(None) => {}
            Ok(Some(fault)) => {
                parts.extensions.insert(ArgumentFault(fault));
            }
            Err(e) => return e.into_response(),
        }
    }
    let req = Request::from_parts(parts, axum::body::Body::from(bytes));
    let mut config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None)
        .with_max_request_body_bytes(MAX_BODY_BYTES);
    if !local {
        config = config.disable_allowed_hosts();
    }
    let server = McpServer {
        tools: tools::Tools::of(&st),
        state: st,
    };
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

/// A fault of a `tools/call`'s arguments found in the message's text (a key given twice,
/// an over-long string or key), its pointer into the arguments: the call answers it as a
/// tool error, as it does any bad argument.
#[derive(Debug, Clone)]
struct ArgumentFault(ApiError);

/// Where a `tools/call` message holds its tool's arguments.
const ARGUMENTS: &str = "/params/arguments";

/// The text checks of a JSON message ([`json_text_faults`]). `Err`: a fault of the message
/// itself (its envelope: method, id, params, `_meta`), answered 400 as a REST body's would
/// be, naming the pointer. `Ok(Some)`: the message is sound but for its tool arguments,
/// whose first fault the tool call answers. Text that is not JSON is left to rmcp.
fn strict_message(bytes: &[u8]) -> Result<Option<ApiError>, ApiError> {
    let faults = match json_text_faults(bytes) {
        Ok(f) if !f.is_empty() => f,
        _ => return Ok(None),
    };
    let tool_call = serde_json::from_slice::<Value>(bytes)
        .ok()
        .is_some_and(|m| m.get("method").and_then(Value::as_str) == Some("tools/call"));
    let mut first = None;
    for f in faults {
        let (field, message) = f
            .details
            .first()
            .map(|d| (d.field.clone(), d.message.clone()))
            .unwrap_or_default();
        match field.strip_prefix(ARGUMENTS) {
            Some(inner) if tool_call && inner.starts_with('/') => {
                first.get_or_insert_with(|| ApiError::invalid_at(inner.to_string(), &message));
            }
            _ => return Err(f),
        }
    }
    Ok(first)
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
        // A key given twice (or an over-long one) in the arguments: refused as any bad
        // argument is, never read as the last of its values.
        if let Some(ArgumentFault(e)) = ctx
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|p| p.extensions.get::<ArgumentFault>())
            .cloned()
        {
            tools::refused(tool);
            let text = format!("{}: {}", e.code, e.message);
            return Ok(result(tools::error_body(&e), text, true)?.into());
        }
        // `execute_plan` is paced firm-wide, once per call (a held call's last execute is
        // the same call), before anything is read or written for it: API Gateway's
        // execute throttle cannot single out one tool of this route.
        if tool.name == "execute_plan" {
            if let Err(e) = self.tools.pace_execute().await {
                tools::refused(tool);
                let text = format!("{}: {}", e.code, e.message);
                return Ok(result(tools::error_body(&e), text, true)?.into());
            }
        }
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
            deadline_ms: lambda_deadline_ms(&ctx),
            operation_timeout_ms: self.state.config.aws.operation_timeout_ms,
        };
        let args = request.arguments.map(Value::Object).unwrap_or(Value::Null);
        let mut outcome = self.tools.call(&caller, tool, args.clone(), &facts).await;
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
        // Set when this call asked to be held and was not: it answers at once, with the
        // approval page, never by asking again (which the client would retry at once).
        let mut not_held = None;
        if let Some(answer) = answer {
            if answer != "accept" {
                let e = crate::core::error::ApiError::new(
                    crate::core::error::Code::ApprovalRequired,
                    "The user did not open the approval page; the plan still waits for the operator's approval there.",
                );
                return Ok(result(
                    tools::error_body(&e),
                    format!("{}: {}", e.code, e.message),
                    true,
                )?
                .into());
            }
            if matches!(outcome, Ok(ToolOutcome::NeedsApproval { .. })) {
                let hold = hold_length(
                    self.tools.approval_hold,
                    lambda_deadline_ms(&ctx),
                    wall_ms(),
                    hold_reserve(self.state.config.aws.operation_timeout_ms),
                );
                let until = tokio::time::Instant::now() + hold;
                match self.tools.hold_for_approval(&caller, &args, until).await {
                    Ok(true) => {
                        outcome = self.tools.call(&caller, tool, args.clone(), &facts).await;
                    }
                    Ok(false) => not_held = Some(hold),
                    Err(e) => outcome = Err(e),
                }
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
                if not_held.is_none() {
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
                }
                // A client that cannot open URLs, or a call not held: tell the user where
                // to go.
                let message = match not_held {
                    Some(hold) if hold.is_zero() => format!(
                        "{message} This call was not held: no time was left to wait for the approval."
                    ),
                    Some(_) => format!(
                        "{message} This call was not held: another call already waits for this plan's approval, or for {} of this operator's plans.",
                        self.tools.holds.per_operator
                    ),
                    None => message,
                };
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

/// On Lambda, when the invocation must have answered (`lambda_http` leaves the runtime's
/// context in the request's extensions): milliseconds since the epoch.
fn lambda_deadline_ms(ctx: &RequestContext<RoleServer>) -> Option<u64> {
    ctx.extensions
        .get::<axum::http::request::Parts>()
        .and_then(|p| crate::doors::http::deadline::lambda_deadline_ms(&p.extensions))
}

/// What a held call keeps of its invocation for after the hold, on Lambda: the most
/// operation timeouts one request waits out (its last look at the plan, then the final
/// execute's calls, each bounded by `operation_timeout_ms`).
pub fn hold_reserve(operation_timeout_ms: u64) -> Duration {
    Duration::from_millis(crate::config::MAX_SEQUENTIAL_CALLS * operation_timeout_ms)
}

/// How long a call may be held for an approval: the configured hold, cut on Lambda so that
/// it ends `reserve` before the invocation's deadline (the hold's last look and the final
/// execute, each call within its operation timeout, then fit before the function times
/// out). Zero: no time for a hold.
fn hold_length(
    max: Duration,
    deadline_ms: Option<u64>,
    now_ms: u64,
    reserve: Duration,
) -> Duration {
    within_deadline(max, deadline_ms, now_ms, reserve)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(arguments: &str) -> String {
        format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"plan_cl_order","arguments":{arguments}}}}}"#
        )
    }

    fn field(e: &ApiError) -> &str {
        &e.details[0].field
    }

    #[test]
    fn a_hold_ends_in_time_for_the_lambda_to_answer() {
        let s = Duration::from_secs;
        let reserve = s(8);
        // Outside Lambda: the configured hold.
        assert_eq!(hold_length(s(20), None, 1_000, reserve), s(20));
        // 27 s left: the hold ends 8 s before the deadline.
        assert_eq!(hold_length(s(20), Some(28_000), 1_000, reserve), s(19));
        assert_eq!(hold_length(s(20), Some(60_000), 1_000, reserve), s(20));
        // Less left than the reserve, or a deadline already past: no hold.
        assert_eq!(hold_length(s(20), Some(8_000), 1_000, reserve), s(0));
        assert_eq!(hold_length(s(20), Some(500), 1_000, reserve), s(0));
    }

    #[test]
    fn a_fault_of_the_arguments_is_the_tools_and_of_the_envelope_the_messages() {
        let f = strict_message(call(r#"{"quantity":1,"quantity":7}"#).as_bytes())
            .unwrap()
            .expect("a fault of the arguments");
        assert_eq!((f.code, field(&f)), (Code::InvalidRequest, "/quantity"));
        let long = "x".repeat(crate::doors::http::extract::MAX_JSON_STRING_CHARS + 1);
        let f = strict_message(call(&format!(r#"{{"symbol":"{long}"}}"#)).as_bytes())
            .unwrap()
            .expect("an over-long argument");
        assert_eq!(field(&f), "/symbol");
        // The envelope's own keys: the message is refused, whatever its arguments hold.
        let e = strict_message(br#"{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/list"}"#)
            .unwrap_err();
        assert_eq!(field(&e), "/id");
        let both = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{"q":1,"q":2},"name":"b"}}"#;
        assert_eq!(
            field(&strict_message(both.as_bytes()).unwrap_err()),
            "/params/name"
        );
        let twice = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{},"arguments":{"q":1}}}"#;
        assert_eq!(
            field(&strict_message(twice.as_bytes()).unwrap_err()),
            "/params/arguments"
        );
        // Arguments of anything but a tool call are the message's.
        let other = r#"{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":"a","arguments":{"q":1,"q":2}}}"#;
        assert_eq!(
            field(&strict_message(other.as_bytes()).unwrap_err()),
            "/params/arguments/q"
        );
        assert!(strict_message(call(r#"{"quantity":1}"#).as_bytes())
            .unwrap()
            .is_none());
        // Text that is not JSON is rmcp's to answer.
        assert!(strict_message(b"{\"jsonrpc\":").unwrap().is_none());
    }
}
