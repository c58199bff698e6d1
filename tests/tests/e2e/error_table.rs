//! The contract's error table, end to end: every code of `airlock::core::error::Code::ALL` is
//! provoked over HTTP, on both backends, and each answer is checked against the committed
//! OpenAPI document (`airlock_tests::contract`): a status the operation documents, a body
//! of its schema with a code it lists for that status, the headers it declares (the
//! request id, `Retry-After`), and the HTTP status the one error-to-HTTP mapping gives the
//! code. Routes outside the document (an unknown path, a method a path does not take, the
//! approval pages) are checked against the contract's error body. The test ends by
//! requiring that the codes it saw are exactly `Code::ALL`: a new code without a way to
//! provoke it here fails it.
//!
//! One stack per backend, three processes on it: at the market's open (most codes, the
//! approval page), ten minutes later (expired tokens and plans; a send that fails, so an
//! accepted execute answers 503 and gives its key back), and at the open again, where the
//! key given back ten minutes "later" is still leased (409 in flight), and where a corrupt
//! stored action is read (500) and, on AWS, the emulator is stopped (503).

use std::collections::{BTreeMap, BTreeSet};

use airlock::core::error::Code;
use airlock::doors::http::error::status_of;
use airlock_tests::passkey::{enroll, ApprovalClient, Passkey};
use airlock_tests::{both, contract, Api, Backend, Resp, Server, Stack, MARKET_OPEN};
use reqwest::header::HeaderMap;
use serde_json::{json, Value};

/// Ten minutes after [`MARKET_OPEN`]: plans and their tokens (five minutes) have expired.
const LATER: &str = "2026-11-23T15:10:00Z";

/// A well-formed action id that does not exist.
const NO_ACTION: &str = "act_01kaq8m4x1a7c2e9f0g3h5";

/// The codes seen so far, each with where it was answered.
#[derive(Default)]
struct Seen(BTreeMap<&'static str, Vec<String>>);

impl Seen {
    /// An answer of the documented operation `op`, which must be `want`.
    fn api(&mut self, op: &str, what: &str, r: &Resp, want: Code) {
        let ctx = format!("{op} ({what}): {} {}", r.status, r.body);
        assert_eq!(
            r.status,
            status_of(want).as_u16(),
            "status of {want}: {ctx}"
        );
        let code = contract::check(op, r.status, &r.body);
        assert_eq!(code.as_deref(), Some(want.as_str()), "{ctx}");
        documented_headers(op, r, &ctx);
        common(
            want,
            op == "executePlan",
            &r.body,
            r.request_id.as_deref(),
            r.retry_after.as_deref(),
            &ctx,
        );
        self.0
            .entry(want.as_str())
            .or_default()
            .push(format!("{op}: {what}"));
    }

    /// An answer of a route the document does not describe (checked against the contract's
    /// error body only).
    fn outside(&mut self, what: &str, status: u16, body: &Value, headers: &HeaderMap, want: Code) {
        let ctx = format!("{what}: {status} {body}");
        assert_eq!(status, status_of(want).as_u16(), "status of {want}: {ctx}");
        let code = contract::check_error(status, body);
        assert_eq!(code, want.as_str(), "{ctx}");
        let h = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
        common(want, false, body, h("x-request-id"), h("retry-after"), &ctx);
        self.0
            .entry(want.as_str())
            .or_default()
            .push(what.to_string());
    }
}

/// What every error answer carries, whatever the route: the request id in the header and
/// the body, `Retry-After` where the contract promises it, and `status: "rejected"` exactly
/// on the rejections of `POST /actions/execute`.
fn common(
    want: Code,
    execute: bool,
    body: &Value,
    request_id: Option<&str>,
    retry_after: Option<&str>,
    ctx: &str,
) {
    let id = request_id.unwrap_or_else(|| panic!("no x-request-id header: {ctx}"));
    assert!(id.starts_with("req_"), "x-request-id {id:?}: {ctx}");
    assert_eq!(body["request_id"], id, "the body repeats the header: {ctx}");
    if matches!(
        want,
        Code::RateLimited
            | Code::MessageThrottled
            | Code::OrdersBacklogged
            | Code::UpstreamUnavailable
            | Code::IdempotencyKeyInFlight
    ) {
        let secs: u64 = retry_after
            .unwrap_or_else(|| panic!("no Retry-After: {ctx}"))
            .parse()
            .unwrap_or_else(|_| panic!("Retry-After is not whole seconds: {ctx}"));
        assert!(secs >= 1, "Retry-After {secs}: {ctx}");
    }
    let rejected = body.get("status") == Some(&json!("rejected"));
    assert_eq!(
        rejected,
        execute && want.is_execute_rejection(),
        "status \"rejected\" on execute rejections only: {ctx}"
    );
}

/// The response headers the document declares for this answer: required ones present, and
/// every one present matching its schema.
fn documented_headers(op: &str, r: &Resp, ctx: &str) {
    let (_, _, operation) = contract::operation(op);
    let doc = contract::document();
    let declared = operation["responses"][r.status.to_string()]["headers"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    assert!(
        declared.contains_key("x-request-id"),
        "the document declares no x-request-id header: {ctx}"
    );
    for (name, h) in declared {
        let h = match h["$ref"].as_str() {
            Some(p) => doc
                .pointer(p.trim_start_matches('#'))
                .unwrap_or_else(|| panic!("dangling {p}")),
            None => &h,
        };
        let value = match name.to_ascii_lowercase().as_str() {
            "x-request-id" => r.request_id.as_deref(),
            "retry-after" => r.retry_after.as_deref(),
            other => panic!("header {other} is declared but not read by the harness: {ctx}"),
        };
        match value {
            None => assert!(h["required"] != true, "header {name} is required: {ctx}"),
            Some(v) => {
                let schema = &h["schema"];
                let ok = jsonschema::draft202012::new(schema)
                    .expect("a header schema")
                    .is_valid(&json!(v));
                assert!(ok, "header {name}: {v:?} does not match {schema}: {ctx}");
            }
        }
    }
}

/// A request with the client's tokens, for what `Api` has no method for (other methods,
/// other headers, paths outside the base path), answered as a `Resp` with its headers.
async fn send(t: &Api, rb: reqwest::RequestBuilder) -> (Resp, HeaderMap) {
    let mut rb = rb;
    if !t.service.is_empty() {
        rb = rb.header("authorization", format!("Bearer {}", t.service));
    }
    if !t.operator.is_empty() {
        rb = rb.header("x-operator-token", &t.operator);
    }
    let r = rb.send().await.expect("HTTP request");
    let headers = r.headers().clone();
    let h = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(String::from)
    };
    let resp = Resp {
        status: r.status().as_u16(),
        request_id: h("x-request-id"),
        retry_after: h("retry-after"),
        body: Value::Null,
    };
    let text = r.text().await.expect("body");
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (Resp { body, ..resp }, headers)
}

/// A POST whose body stops after a few bytes, read off the wire (the server answers once
/// the body deadline passes).
fn stalled_body(s: &Server, t: &Api, path: &str) -> Resp {
    use airlock_tests::raw;
    let bearer = format!("Bearer {}", t.service);
    let mut c = raw::connect(&s.base);
    let head = raw::head(
        "POST",
        &format!("{}{path}", airlock_tests::BASE),
        &[
            ("Authorization", &bearer),
            ("X-Operator-Token", &t.operator),
            ("Content-Type", "application/json"),
            ("Content-Length", "100"),
        ],
    );
    raw::send(&mut c, &head);
    raw::send(&mut c, b"{\"action_type\": ");
    let (got, _) = raw::until_closed(&mut c, std::time::Duration::from_secs(20))
        .expect("the server answers a stalled body");
    let a = raw::parse(&got);
    Resp {
        status: a.status,
        request_id: a.header("x-request-id").map(String::from),
        retry_after: a.header("retry-after").map(String::from),
        body: a.body,
    }
}

/// A POST of raw bytes to the MCP endpoint, as an MCP client sends it.
async fn mcp(t: &Api, content_type: &str, body: Vec<u8>) -> Resp {
    let rb = t
        .http
        .post(format!("{}/mcp", t.base))
        .header("content-type", content_type)
        .header("accept", "application/json, text/event-stream")
        .body(body);
    send(t, rb).await.0
}

fn order(account: &str, qty: u32, requested_by: &str) -> Value {
    json!({
        "action_type": "order.submit.cl",
        "payload": { "account_id": account, "symbol": "CLF27", "side": "buy", "quantity": qty, "order_type": "market" },
        "requested_by": requested_by,
    })
}

async fn plan(t: &Api, body: &Value) -> Resp {
    let p = t.post("/actions/plan", body).await;
    assert_eq!(p.status, 200, "{:?}", p.body);
    contract::check("planAction", p.status, &p.body);
    assert_eq!(p["executable"], true, "{:?}", p.body["risk_checks"]);
    p
}

/// Writes a policy file in the state dir and sets it in the control record.
fn set_policy(s: &Server, name: &str, policy: &str) {
    let file = s.state_dir.join(name);
    std::fs::write(&file, policy).expect("policy file");
    s.cli(&["policy", "set", file.to_str().expect("utf-8 path")]);
}

/// Makes the stored action unreadable: a corrupt record, which only a bug or a damaged
/// store can leave.
async fn corrupt_action(s: &Server, action_id: &str) {
    match s.backend {
        Backend::Embedded => {
            let n = s
                .db()
                .execute(
                    "UPDATE actions SET body = '{not json' WHERE action_id = ?",
                    [action_id],
                )
                .expect("update");
            assert_eq!(n, 1, "the action row");
        }
        Backend::Aws => {
            use aws_sdk_dynamodb::types::AttributeValue;
            let env: BTreeMap<String, String> = s.cli_env().into_iter().collect();
            let conf = airlock_tests::emulator_config(&env["AWS_ENDPOINT_URL"]).await;
            let table = env
                .get("AIRLOCK_ACTIONS_TABLE")
                .cloned()
                .unwrap_or_else(|| {
                    let prefix = env
                        .get("AIRLOCK_RESOURCE_PREFIX")
                        .cloned()
                        .unwrap_or_default();
                    format!("{prefix}airlock-actions")
                });
            aws_sdk_dynamodb::Client::new(&conf)
                .update_item()
                .table_name(table)
                .key("action_id", AttributeValue::S(action_id.to_string()))
                .update_expression("SET body = :b")
                .condition_expression("attribute_exists(action_id)")
                .expression_attribute_values(":b", AttributeValue::S("{not json".into()))
                .send()
                .await
                .expect("corrupt the stored action");
        }
    }
}

both!(every_error_code_is_answered_as_the_document_says);
async fn every_error_code_is_answered_as_the_document_says(b: Backend) {
    let mut seen = Seen::default();
    let s = Stack::new(b).start(&[
        ("AIRLOCK_NOW", MARKET_OPEN),
        // One accepted execute per minute: the second is refused.
        ("AIRLOCK_EXECUTE_RATE_PER_MINUTE", "1"),
        // One order waiting (the workers are off) backlogs the orders queue.
        ("AIRLOCK_ORDERS_BACKLOG_LIMIT", "1"),
        ("AIRLOCK_ORDERS_BACKLOG_WAIT_MS", "0"),
        // A body that stops half-way is cut off after 2 s.
        ("AIRLOCK_BODY_READ_TIMEOUT_MS", "2000"),
    ]);
    let t = s.trader();
    let anon = t.with_tokens("", "");
    let bad_operator = t.with_tokens(&t.service, "not-a-token");
    let read_only = t.with_tokens(
        &s.cli(&["token", "service", "--scopes", "trade.read"]),
        &t.operator,
    );
    let plan_only = t.with_tokens(
        &s.cli(&["token", "service", "--scopes", "trade.plan"]),
        &t.operator,
    );

    // ---- Identity, query parameters and bodies, on every documented operation.
    let action_path = format!("/actions/{NO_ACTION}?");
    let reads = [
        ("listAccounts", "/accounts?"),
        ("listPositions", "/positions?account_id=ACC-1&"),
        ("listOrders", "/orders?"),
        ("listJobs", "/jobs?"),
        ("getAction", action_path.as_str()),
        ("getOpenApi", "/openapi.json?"),
    ];
    for (op, path) in reads {
        let r = anon.get(path).await;
        seen.api(op, "no tokens", &r, Code::Unauthenticated);
        let r = bad_operator.get(path).await;
        seen.api(
            op,
            "a malformed operator token",
            &r,
            Code::OperatorUnauthenticated,
        );
        let r = plan_only.get(path).await;
        seen.api(op, "no trade.read", &r, Code::InsufficientScope);
        let r = t.get(&format!("{path}acount_id=ACC-1")).await;
        seen.api(op, "an unknown query parameter", &r, Code::InvalidRequest);
    }
    for (op, path) in &reads[..4] {
        let r = t.get(&format!("{path}cursor=bm90LWEtY3Vyc29y")).await;
        seen.api(
            op,
            "a cursor Airlock did not issue",
            &r,
            Code::InvalidCursor,
        );
    }
    for (op, path) in [
        ("listPositions", "/positions?account_id=ACC-3"),
        ("listOrders", "/orders?account_id=ACC-3"),
    ] {
        let r = t.get(path).await;
        seen.api(op, "another desk's account", &r, Code::AccountNotFound);
    }
    let r = t.get(&format!("/actions/{NO_ACTION}")).await;
    seen.api("getAction", "an unknown action", &r, Code::ActionNotFound);

    let enrolment = json!({ "sub": "op-new", "roles": ["trader"], "desks": ["energy"] });
    let writes = [
        (
            "planAction",
            "/actions/plan",
            order("ACC-1", 1, "op-energy-trader"),
        ),
        (
            "executePlan",
            "/actions/execute",
            json!({ "plan_id": "pln_none", "idempotency_key": "k-auth", "requested_by": "op-energy-trader" }),
        ),
        (
            "createEnrolment",
            "/operators/enrolments",
            enrolment.clone(),
        ),
    ];
    let too_large = vec![b' '; 70 * 1024];
    for (op, path, body) in &writes {
        let r = anon.post(path, body).await;
        seen.api(op, "no tokens", &r, Code::Unauthenticated);
        let r = bad_operator.post(path, body).await;
        seen.api(
            op,
            "a malformed operator token",
            &r,
            Code::OperatorUnauthenticated,
        );
        let r = t
            .post_raw(path, "text/plain", body.to_string().into_bytes())
            .await;
        seen.api(op, "text/plain", &r, Code::UnsupportedMediaType);
        let r = t
            .post_raw(path, "application/json", too_large.clone())
            .await;
        seen.api(op, "70 KiB", &r, Code::PayloadTooLarge);
        let r = t.post_raw(path, "application/json", b"{".to_vec()).await;
        seen.api(op, "malformed JSON", &r, Code::InvalidRequest);
        // The body itself is `/` (the contract's pointer for the whole body).
        assert_eq!(r.field(), "/", "{op}: {}", r.body);
    }
    let r = read_only.post("/actions/plan", &writes[0].2).await;
    seen.api("planAction", "no trade.plan", &r, Code::InsufficientScope);
    let r = read_only.post("/actions/execute", &writes[1].2).await;
    seen.api(
        "executePlan",
        "no trade.execute",
        &r,
        Code::InsufficientScope,
    );
    let r = t.post("/operators/enrolments", &enrolment).await;
    seen.api(
        "createEnrolment",
        "Mastra's scopes",
        &r,
        Code::InsufficientScope,
    );

    let tools_list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}});
    let r = mcp(
        &anon,
        "application/json",
        tools_list.to_string().into_bytes(),
    )
    .await;
    seen.api("mcp", "no tokens", &r, Code::Unauthenticated);
    let r = mcp(
        &bad_operator,
        "application/json",
        tools_list.to_string().into_bytes(),
    )
    .await;
    seen.api(
        "mcp",
        "a malformed operator token",
        &r,
        Code::OperatorUnauthenticated,
    );
    let r = mcp(&t, "text/plain", tools_list.to_string().into_bytes()).await;
    seen.api("mcp", "text/plain", &r, Code::UnsupportedMediaType);
    let r = mcp(&t, "application/json", too_large.clone()).await;
    seen.api("mcp", "70 KiB", &r, Code::PayloadTooLarge);
    let r = stalled_body(&s, &t, "/actions/plan");
    seen.api("planAction", "a body that stops", &r, Code::RequestTimeout);
    for body in [&b"{"[..], b"{}", b"[1]"] {
        let r = mcp(&t, "application/json", body.to_vec()).await;
        seen.api("mcp", "not a JSON-RPC message", &r, Code::InvalidRequest);
    }
    let no_accept = t
        .http
        .post(format!("{}/mcp", t.base))
        .header("content-type", "application/json")
        .body(tools_list.to_string());
    let (r, _) = send(&t, no_accept).await;
    seen.api("mcp", "no Accept header", &r, Code::InvalidRequest);

    let r = t
        .post("/actions/plan", &order("ACC-1", 1, "op-head-trader"))
        .await;
    seen.api(
        "planAction",
        "another operator's name",
        &r,
        Code::OperatorMismatch,
    );
    let r = t
        .post("/actions/plan", &order("ACC-3", 1, "op-energy-trader"))
        .await;
    seen.api(
        "planAction",
        "another desk's account",
        &r,
        Code::AccountNotFound,
    );
    let change = serde_json::json!({"action_type": "order.replace.cl",
        "payload": {"account_id": "ACC-1", "order_id": "ord-none", "quantity": 2},
        "requested_by": "op-energy-trader"});
    let r = t.post("/actions/plan", &change).await;
    seen.api(
        "planAction",
        "a change of an unknown order",
        &r,
        Code::OrderNotFound,
    );

    // ---- Routes the document does not have.
    let (r, h) = send(&t, t.http.get(format!("{}/no-such-thing", t.base))).await;
    seen.outside("GET an unknown path", r.status, &r.body, &h, Code::NotFound);
    let (r, h) = send(&t, t.http.get(format!("{}/elsewhere", s.base))).await;
    seen.outside(
        "GET outside the base path",
        r.status,
        &r.body,
        &h,
        Code::NotFound,
    );
    let (r, h) = send(&t, t.http.delete(format!("{}/accounts", t.base))).await;
    seen.outside(
        "DELETE /accounts",
        r.status,
        &r.body,
        &h,
        Code::MethodNotAllowed,
    );

    // ---- Execute, token mode (the stack's policy).
    let r = t
        .execute_untokened("pln_01kaq8m4x1a7c2e9f0g3h5", "k-none")
        .await;
    seen.api("executePlan", "an unknown plan", &r, Code::PlanNotFound);
    let p1 = plan(&t, &order("ACC-1", 1, "op-energy-trader")).await;
    let r = t
        .execute_with(&p1.plan_id(), "not-a-token", "k-forged")
        .await;
    seen.api("executePlan", "a forged token", &r, Code::TokenInvalid);
    let r = t
        .post(
            "/actions/execute",
            &json!({ "plan_id": p1["plan_id"], "confirmation_token": p1["confirmation_token"],
                     "idempotency_key": "k-mismatch", "requested_by": "op-head-trader" }),
        )
        .await;
    seen.api(
        "executePlan",
        "another operator's name",
        &r,
        Code::OperatorMismatch,
    );
    let accepted = t.execute(&p1, "k-1").await;
    assert_eq!(accepted.status, 202, "{:?}", accepted.body);
    contract::check("executePlan", 202, &accepted.body);
    let action_id = accepted["action_id"]
        .as_str()
        .expect("action id")
        .to_string();
    let r = t.execute(&p1, "k-2").await;
    seen.api(
        "executePlan",
        "a consumed plan, another key",
        &r,
        Code::PlanAlreadyExecuted,
    );
    let p2 = plan(&t, &order("ACC-1", 1, "op-energy-trader")).await;
    let r = t.execute(&p2, "k-1").await;
    seen.api(
        "executePlan",
        "a key used for another plan",
        &r,
        Code::IdempotencyKeyReused,
    );
    // A sync is never refused for the orders backlog; it meets the rate limit.
    let sync = plan(
        &t,
        &json!({
            "action_type": "positions.sync",
            "payload": { "account_id": "ACC-1" },
            "requested_by": "op-energy-trader",
        }),
    )
    .await;
    let r = t.execute(&sync, "k-3").await;
    seen.api(
        "executePlan",
        "the second execute of the minute",
        &r,
        Code::RateLimited,
    );
    // The order accepted above is still waiting: a new order is refused before the
    // rate limit is even looked at, and nothing is decided.
    let r = t.execute(&p2, "k-3b").await;
    seen.api(
        "executePlan",
        "an order behind a backlogged orders queue",
        &r,
        Code::OrdersBacklogged,
    );

    s.cli(&["kill-switch", "engage", "--reason", "error table"]);
    let r = t.execute(&p2, "k-4").await;
    seen.api(
        "executePlan",
        "the kill switch engaged",
        &r,
        Code::KillSwitchEngaged,
    );
    s.cli(&["kill-switch", "release"]);
    let r = t.execute(&p2, "k-5").await;
    seen.api(
        "executePlan",
        "a plan the kill switch closed",
        &r,
        Code::PlanNotExecutable,
    );

    let p3 = plan(&t, &order("ACC-1", 1, "op-energy-trader")).await;
    s.cli(&["rollout", "order.submit.cl", "disabled"]);
    let r = t.execute(&p3, "k-6").await;
    seen.api("executePlan", "rollout disabled", &r, Code::ActionDisabled);
    s.cli(&["rollout", "order.submit.cl", "execute"]);

    let p4 = plan(&t, &order("ACC-1", 3, "op-energy-trader")).await;
    set_policy(
        &s,
        "tight.json",
        r#"{"version": "error-table-tight", "max_order_size": 2, "confirmation": {"order.submit.cl": "token"}}"#,
    );
    let r = t.execute(&p4, "k-7").await;
    seen.api(
        "executePlan",
        "a check that fails under the new policy",
        &r,
        Code::PolicyViolation,
    );

    // The message throttle: one message an hour on an account, no lockout. A cancel by
    // another operator (this one used its execute of the minute) fills ACC-1's window.
    set_policy(
        &s,
        "throttle.json",
        r#"{"version": "error-table-throttle", "max_messages_per_window": 1, "message_window_seconds": 3600, "message_lockout_seconds": 0, "confirmation": {"order.submit.cl": "token"}}"#,
    );
    let head_trader = t.with_tokens(
        &t.service,
        &s.operator_token("op-head-trader", "head_trader", None),
    );
    let cancel = plan(
        &head_trader,
        &json!({ "action_type": "order.cancel", "requested_by": "op-head-trader",
                 "payload": { "account_id": "ACC-1", "order_id": "ORD-1003" } }),
    )
    .await;
    let r = head_trader
        .post(
            "/actions/execute",
            &json!({ "plan_id": cancel["plan_id"], "confirmation_token": cancel["confirmation_token"],
                     "idempotency_key": "k-cancel", "requested_by": "op-head-trader" }),
        )
        .await;
    assert_eq!(r.status, 202, "{:?}", r.body);
    let p5 = plan(&t, &order("ACC-1", 1, "op-energy-trader")).await;
    let r = t.execute(&p5, "k-throttled").await;
    seen.api(
        "executePlan",
        "an account over its message throttle",
        &r,
        Code::MessageThrottled,
    );

    // A plan whose token expires before the next process starts.
    s.cli(&["policy", "reset"]);
    let expiring = plan(&t, &order("ACC-1", 1, "op-energy-trader")).await;

    // ---- Operator mode: the approval page.
    set_policy(
        &s,
        "operator.json",
        r#"{"version": "error-table-operator"}"#,
    );
    let approved = plan(&t, &order("ACC-1", 1, "op-energy-trader")).await;
    assert_eq!(
        approved["approval"]["required"], true,
        "{:?}",
        approved.body
    );
    let declined = plan(&t, &order("ACC-1", 1, "op-energy-trader")).await;
    let late = plan(&t, &order("ACC-1", 1, "op-energy-trader")).await;
    let head = t.with_tokens(
        &t.service,
        &s.operator_token("op-head-trader", "head_trader", None),
    );
    let theirs = plan(&head, &order("ACC-1", 1, "op-head-trader")).await;
    let r = t.execute_untokened(&approved.plan_id(), "k-wait").await;
    seen.api(
        "executePlan",
        "before the approval",
        &r,
        Code::ApprovalRequired,
    );
    assert_eq!(r["approval"], approved["approval"], "{:?}", r.body);

    let decide = |pid: &str| format!("/approvals/plans/{pid}/start");
    let mut c = ApprovalClient::new(&s.base);
    let a = c
        .post(
            &decide(&approved.plan_id()),
            json!({"decision": "approved"}),
        )
        .await;
    seen.outside(
        "approval without a session",
        a.status,
        &a.body,
        &a.headers,
        Code::SignInRequired,
    );
    let a = c.sign_in("op-viewer", &mut Passkey::new()).await;
    seen.outside(
        "sign-in of an operator never enrolled",
        a.status,
        &a.body,
        &a.headers,
        Code::PasskeyInvalid,
    );
    let link = enroll(&s, "op-energy-trader", "trader", "energy");
    let mut key = Passkey::new();
    let a = c.enroll(&link, &mut key).await;
    assert_eq!(a.status, 200, "enrol: {}", a.body);
    let path = link.split_once("/approvals/").expect("link").1;
    let a = ApprovalClient::new(&s.base)
        .post(&format!("/approvals/{path}/start"), json!({}))
        .await;
    seen.outside(
        "an enrolment link used twice",
        a.status,
        &a.body,
        &a.headers,
        Code::EnrolmentNotFound,
    );

    let origin = std::mem::replace(&mut c.origin, "https://approvals.evil.example".into());
    let a = c.start(&approved.plan_id(), "approved").await;
    seen.outside(
        "approval from another origin",
        a.status,
        &a.body,
        &a.headers,
        Code::CsrfRejected,
    );
    c.origin = origin;
    let a = c
        .decide(&approved.plan_id(), "approved", &mut Passkey::new())
        .await;
    seen.outside(
        "another passkey's assertion",
        a.status,
        &a.body,
        &a.headers,
        Code::PasskeyInvalid,
    );
    let a = c.start(&theirs.plan_id(), "approved").await;
    seen.outside(
        "approving another operator's plan",
        a.status,
        &a.body,
        &a.headers,
        Code::ApprovalRefused,
    );
    let a = c.decide(&approved.plan_id(), "approved", &mut key).await;
    assert_eq!(a.status, 200, "approve: {}", a.body);
    let a = c.start(&approved.plan_id(), "approved").await;
    seen.outside(
        "approving a decided plan",
        a.status,
        &a.body,
        &a.headers,
        Code::PlanNotPending,
    );
    let a = c.decide(&declined.plan_id(), "declined", &mut key).await;
    assert_eq!(a.status, 200, "decline: {}", a.body);
    let r = t.execute_untokened(&declined.plan_id(), "k-declined").await;
    seen.api("executePlan", "a declined plan", &r, Code::PlanDeclined);
    s.cli(&["policy", "reset"]);

    // ---- Ten minutes later; every send to the queue fails.
    let s = s.crash().start(&[
        ("AIRLOCK_NOW", LATER),
        // The embedded commit queues the message itself; this sends after it, as on AWS.
        (
            "AIRLOCK_FAILPOINTS",
            "execute.send_after_commit,dispatch.send_fails",
        ),
    ]);
    let t = s.trader();
    let r = t.execute(&expiring, "k-expired").await;
    seen.api(
        "executePlan",
        "a token past its exp",
        &r,
        Code::TokenExpired,
    );
    let r = t.execute_untokened(&late.plan_id(), "k-late").await;
    seen.api(
        "executePlan",
        "a plan past its expires_at",
        &r,
        Code::PlanExpired,
    );
    let unsent = plan(&t, &order("ACC-1", 1, "op-energy-trader")).await;
    let r = t.execute(&unsent, "k-unsent").await;
    seen.api(
        "executePlan",
        "the queue refusing the send",
        &r,
        Code::UpstreamUnavailable,
    );
    let unsent_action = r["action_id"].clone();
    assert!(
        unsent_action.is_string(),
        "the accepted action: {:?}",
        r.body
    );

    // ---- Back at the open. The failed send gave its key back with a lease that ends at
    // 15:10; to a clock that reads 15:00 that lease is live, as a retry sees a key whose
    // first request is still running.
    let mut s = s.crash().start(&[("AIRLOCK_NOW", MARKET_OPEN)]);
    let t = s.trader();
    let r = t.execute(&unsent, "k-unsent").await;
    seen.api(
        "executePlan",
        "a key another request holds",
        &r,
        Code::IdempotencyKeyInFlight,
    );
    assert_eq!(r["action_id"], unsent_action, "{:?}", r.body);

    corrupt_action(&s, &action_id).await;
    let r = t.get(&format!("/actions/{action_id}")).await;
    seen.api("getAction", "a corrupt stored action", &r, Code::Internal);

    if b == Backend::Aws {
        s.stop_emulator();
        let r = t.get("/accounts").await;
        seen.api(
            "listAccounts",
            "the emulator stopped",
            &r,
            Code::UpstreamUnavailable,
        );
        let r = t
            .post("/actions/plan", &order("ACC-1", 1, "op-energy-trader"))
            .await;
        seen.api(
            "planAction",
            "the emulator stopped",
            &r,
            Code::UpstreamUnavailable,
        );
    }

    let all: BTreeSet<&str> = Code::ALL.iter().map(|c| c.as_str()).collect();
    let got: BTreeSet<&str> = seen.0.keys().copied().collect();
    assert_eq!(
        got,
        all,
        "never provoked: {:?}; not in Code::ALL: {:?}",
        all.difference(&got).collect::<Vec<_>>(),
        got.difference(&all).collect::<Vec<_>>()
    );
}
