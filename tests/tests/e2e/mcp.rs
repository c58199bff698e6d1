//! The MCP endpoint driven by real clients, on both backends: Mastra's `MCPClient`
//! (`@mastra/mcp`), the official TypeScript SDK 1.x (2025-11-25 handshake) and 2.x (the
//! stateless 2026-07-28 revision, and a 2025-06-18 client) under the machine's Node.js
//! (`tests/mcp/clients.mjs`, dependencies installed by `scripts/node-deps.sh`, which the
//! test command runs). Tools with their annotations and schemas, every tool called, plan and
//! execute, retried `execute_plan` as `duplicate`, unknown tools, bad arguments, missing
//! and foreign tokens, a viewer's narrower list, and an order approved on the approval page
//! while the client waits (URL elicitation).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use airlock::core::domain::ActionType;
use airlock::core::usecases::actions;
use airlock_tests::moto::Moto;
use airlock_tests::passkey::{enroll, ApprovalClient, Passkey};
use airlock_tests::{both, Backend, Server, Stack, BASE, MARKET_OPEN};
use serde_json::{json, Value};

const TOOLS: [&str; 13] = [
    "list_accounts",
    "list_positions",
    "list_orders",
    "list_jobs",
    "get_action",
    "portfolio_analysis",
    "allocation_breakdown",
    "risk_flags",
    "plan_replace_order",
    "plan_cl_order",
    "plan_cancel_order",
    "plan_positions_sync",
    "execute_plan",
];

fn script() -> PathBuf {
    let root = Moto::repo_root();
    assert!(
        root.join("tests/mcp/node_modules/@mastra/mcp").exists(),
        "the Node MCP clients are not installed: run scripts/node-deps.sh (the test command does)"
    );
    root.join("tests/mcp/clients.mjs")
}

fn url(s: &Server) -> String {
    format!("{}{BASE}/mcp", s.base)
}

/// Runs one client scenario to the end; its JSON report.
fn run(
    scenario: &str,
    s: &Server,
    tokens: (&str, &str),
    calls: Value,
    env: &[(&str, &str)],
) -> Value {
    let out = spawn(scenario, s, tokens, calls, env)
        .wait_with_output()
        .expect("node");
    report(scenario, out)
}

fn spawn(
    scenario: &str,
    s: &Server,
    (service, operator): (&str, &str),
    calls: Value,
    env: &[(&str, &str)],
) -> std::process::Child {
    let mut cmd = Command::new("node");
    cmd.arg(script())
        .args([scenario, &url(s)])
        .env("AIRLOCK_MCP_CALLS", calls.to_string())
        .env("AIRLOCK_MCP_DEADLINE_MS", "80000")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in [
        ("AIRLOCK_SERVICE_TOKEN", service),
        ("AIRLOCK_OPERATOR_TOKEN", operator),
    ] {
        if v.is_empty() {
            cmd.env_remove(k);
        } else {
            cmd.env(k, v);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("node is on PATH (Node.js 20)")
}

fn report(scenario: &str, out: std::process::Output) -> Value {
    assert!(
        out.status.success(),
        "{scenario}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{scenario}: not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    assert_eq!(v["timedOut"], false, "{scenario} timed out");
    v
}

fn names(r: &Value) -> Vec<String> {
    r["tools"]
        .as_array()
        .map(|t| {
            t.iter()
                .map(|t| t["name"].as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// The structured content of call `i` (an SDK scenario's raw result).
fn structured(r: &Value, i: usize) -> &Value {
    assert_eq!(r["calls"][i]["ok"], true, "call {i}: {}", r["calls"][i]);
    &r["calls"][i]["result"]["structuredContent"]
}

fn tool_error(r: &Value, i: usize) -> (String, Value) {
    let res = &r["calls"][i]["result"];
    assert_eq!(
        res["isError"], true,
        "call {i} should be a tool error: {}",
        r["calls"][i]
    );
    (
        res["structuredContent"]["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        res.clone(),
    )
}

fn start(b: Backend) -> Server {
    Server::start_on(b, &[("AIRLOCK_NOW", MARKET_OPEN)])
}

both!(every_tool_through_the_2026_client);
async fn every_tool_through_the_2026_client(b: Backend) {
    let s = start(b);
    let t = s.trader();
    // An action to ask about, and a token-mode plan to execute through MCP.
    let done = t.plan_sync("ACC-2").await;
    let action = t.execute(&done, "rest-1").await;
    assert_eq!(action.status, 202);
    let p = t.plan_sync("ACC-1").await;
    let calls = json!([
        { "name": "list_accounts", "arguments": {} },
        { "name": "list_positions", "arguments": { "account_id": "ACC-1" } },
        { "name": "list_orders", "arguments": { "limit": 2 } },
        { "name": "list_jobs", "arguments": {} },
        { "name": "get_action", "arguments": { "action_id": action["action_id"] } },
        { "name": "plan_cl_order", "arguments": { "account_id": "ACC-1", "symbol": "CLF27", "side": "buy", "quantity": 1, "order_type": "market" } },
        { "name": "plan_cancel_order", "arguments": { "account_id": "ACC-1", "order_id": "ORD-1001" } },
        { "name": "plan_positions_sync", "arguments": { "account_id": "ACC-1" } },
        { "name": "execute_plan", "arguments": { "plan_id": p["plan_id"], "confirmation_token": p["confirmation_token"] } },
        { "name": "execute_plan", "arguments": { "plan_id": p["plan_id"], "confirmation_token": p["confirmation_token"] } },
        { "name": "plan_cl_order", "arguments": { "account_id": "ACC-1", "symbol": "CLF27", "side": "buy", "quantity": 0, "order_type": "market" } },
        { "name": "list_positions", "arguments": { "account_id": "ACC-3" } },
        { "name": "no_such_tool", "arguments": {} },
        { "name": "list_accounts", "arguments": { "limit": 1, "extra": true } },
    ]);
    let r = run("sdk-2026", &s, (&t.service, &t.operator), calls, &[]);
    assert_eq!(r["connect"]["ok"], true, "{}", r["connect"]);
    assert!(r["connect"]["discover"]["supportedVersions"]
        .as_array()
        .unwrap()
        .contains(&json!("2026-07-28")));
    assert_eq!(names(&r), TOOLS);
    for tool in r["tools"].as_array().unwrap() {
        let a = &tool["annotations"];
        assert_eq!(a["openWorldHint"], false, "{tool}");
        assert_eq!(tool["inputSchema"]["type"], "object");
        assert!(tool["outputSchema"].is_object());
        let execute = tool["name"] == "execute_plan";
        assert_eq!(a["readOnlyHint"], !execute, "{}", tool["name"]);
        if execute {
            assert_eq!(a["destructiveHint"], true);
            assert_eq!(a["idempotentHint"], true);
        }
    }
    let order_schema = &r["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "plan_cl_order")
        .unwrap()["inputSchema"];
    assert_eq!(order_schema["additionalProperties"], false);
    assert!(order_schema["required"]
        .as_array()
        .unwrap()
        .contains(&json!("quantity")));

    assert_eq!(structured(&r, 0)["accounts"].as_array().unwrap().len(), 3);
    assert!(structured(&r, 1)["positions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|p| p["account_id"] == "ACC-1"));
    assert_eq!(structured(&r, 2)["orders"].as_array().unwrap().len(), 2);
    assert!(structured(&r, 2)["next_cursor"].is_string());
    assert!(structured(&r, 3)["jobs"].is_array());
    assert_eq!(structured(&r, 4)["action_id"], action["action_id"]);
    assert_eq!(
        structured(&r, 5)["preview"],
        "Buy 1 CLF27 at market, protected: limit 68.90 (68.40 + 0.50) on ACC-1, day order."
    );
    assert!(structured(&r, 6)["plan_id"].is_string());
    assert!(structured(&r, 7)["confirmation_token"].is_string());
    let first = structured(&r, 8);
    assert_eq!(first["status"], "queued", "{first}");
    let again = structured(&r, 9);
    assert_eq!(again["status"], "duplicate");
    assert_eq!(again["action_id"], first["action_id"]);
    let text = r["calls"][8]["result"]["content"][0]["text"]
        .as_str()
        .unwrap();
    assert!(
        text.contains(first["action_id"].as_str().unwrap()),
        "{text}"
    );

    let (code, res) = tool_error(&r, 10);
    assert_eq!(code, "invalid_request");
    assert_eq!(
        res["structuredContent"]["error"]["details"][0]["field"],
        "/quantity"
    );
    assert_eq!(
        tool_error(&r, 11).0,
        "account_not_found",
        "the desk filter holds"
    );
    assert_eq!(r["calls"][12]["ok"], false);
    assert_eq!(
        r["calls"][12]["error"]["code"], -32602,
        "unknown tool: {}",
        r["calls"][12]
    );
    assert_eq!(tool_error(&r, 13).0, "invalid_request");
    // One action per plan, whatever the retries: the queue holds the two executes.
    assert_eq!(s.queued_messages(), 2);
}

both!(mastra_and_the_legacy_clients);
async fn mastra_and_the_legacy_clients(b: Backend) {
    let s = start(b);
    let t = s.trader();
    let p = t.plan_sync("ACC-1").await;
    // Mastra with its defaults (the 2025-11-25 handshake): every tool, typed, with its
    // hints; a plan and an execute retried without a key come back `duplicate`.
    let exec = json!({ "name": "execute_plan", "arguments": { "plan_id": p["plan_id"], "confirmation_token": p["confirmation_token"] } });
    let calls = json!([{ "name": "list_accounts", "arguments": { "limit": 1 } }, exec, exec]);
    let m = run("mastra", &s, (&t.service, &t.operator), calls.clone(), &[]);
    assert_eq!(m["connect"]["ok"], true, "{}", m["connect"]);
    assert_eq!(names(&m), TOOLS);
    let ex = m["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == "execute_plan")
        .unwrap();
    assert_eq!(ex["annotations"]["destructiveHint"], true, "{ex}");
    assert_eq!(
        m["calls"][0]["result"]["accounts"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        m["calls"][1]["result"]["status"], "queued",
        "{}",
        m["calls"][1]
    );
    assert_eq!(m["calls"][2]["result"]["status"], "duplicate");
    assert_eq!(
        m["calls"][2]["result"]["action_id"],
        m["calls"][1]["result"]["action_id"]
    );

    for scenario in ["sdk-legacy", "sdk-legacy-2025-06-18"] {
        let r = run(scenario, &s, (&t.service, &t.operator), calls.clone(), &[]);
        assert_eq!(r["connect"]["ok"], true, "{scenario}: {}", r["connect"]);
        assert_eq!(names(&r), TOOLS, "{scenario}");
        assert_eq!(structured(&r, 0)["accounts"].as_array().unwrap().len(), 1);
        // The same plan, retried by another client: still the one action.
        assert_eq!(structured(&r, 1)["status"], "duplicate", "{scenario}");
        assert_eq!(
            structured(&r, 1)["action_id"],
            m["calls"][1]["result"]["action_id"]
        );
    }
    assert_eq!(s.queued_messages(), 1);
}

both!(a_viewer_sees_the_reads_and_tokens_are_checked_on_every_request);
async fn a_viewer_sees_the_reads_and_tokens_are_checked_on_every_request(b: Backend) {
    let s = start(b);
    let t = s.trader();
    let viewer = s.operator_token("op-viewer", "viewer", Some("energy"));
    let calls = json!([{ "name": "execute_plan", "arguments": { "plan_id": "pln_x" } }]);
    let r = run("sdk-2026", &s, (&t.service, &viewer), calls, &[]);
    assert_eq!(names(&r), TOOLS[..8], "a viewer lists only the reads");
    assert_eq!(r["calls"][0]["error"]["code"], -32602, "{}", r["calls"][0]);

    for (service, operator) in [
        ("", t.operator.as_str()),
        (t.service.as_str(), ""),
        (t.service.as_str(), "e30.e30.e30"),
    ] {
        let r = run("sdk-2026", &s, (service, operator), json!([]), &[]);
        assert_eq!(r["connect"]["ok"], false, "{}", r["connect"]);
        assert!(
            r["http"]
                .as_array()
                .unwrap()
                .iter()
                .any(|h| h["status"] == 401),
            "{}",
            r["http"]
        );
    }
    // Another issuer's token (a second stack's dev issuer) is refused too.
    let other = Stack::new(Backend::Embedded);
    let foreign = airlock_tests::cli(
        &other.state_dir,
        &[],
        &airlock_tests::trader_args(&["token", "operator"]),
    );
    let r = run(
        "sdk-legacy",
        &s,
        (&t.service, foreign.trim()),
        json!([]),
        &[],
    );
    assert_eq!(r["connect"]["ok"], false);
}

both!(execute_plan_opens_the_approval_page_and_waits_for_it);
async fn execute_plan_opens_the_approval_page_and_waits_for_it(b: Backend) {
    let s = Server::operator_mode_at_open(b);
    let t = s.trader();
    let link = enroll(&s, "op-energy-trader", "trader", "energy");
    let mut page = ApprovalClient::new(&s.base);
    let mut key = Passkey::new();
    assert_eq!(page.enroll(&link, &mut key).await.status, 200);

    let plan = |t: &airlock_tests::Api| {
        let t = t.clone();
        async move {
            let p = t.plan_buy("CLF27", 1).await;
            assert_eq!(p["executable"], true, "{:?}", p.body);
            p
        }
    };
    let p = plan(&t).await;
    let pid = p["plan_id"].as_str().unwrap().to_string();
    let dir = s.state_dir.join("mcp-elicit");
    std::fs::create_dir_all(&dir).unwrap();
    // The client answers at once (the user agreed to open the page); its retry is held
    // by the server while the person approves.
    let notify = dir.join("notify.jsonl");
    let env = [("AIRLOCK_MCP_ELICIT_NOTIFY_FILE", notify.to_str().unwrap())];
    let calls = json!([{ "name": "execute_plan", "arguments": { "plan_id": pid } }]);
    let child = spawn("sdk-2026", &s, (&t.service, &t.operator), calls, &env);
    // The client is asked to open the plan's approval page.
    let deadline = Instant::now() + Duration::from_secs(30);
    let asked: Value = loop {
        if let Ok(text) = std::fs::read_to_string(&notify) {
            if let Some(line) = text.lines().next() {
                break serde_json::from_str(line).unwrap();
            }
        }
        assert!(
            Instant::now() < deadline,
            "no elicitation reached the client"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(asked["mode"], "url", "{asked}");
    assert_eq!(asked["url"], p["approval"]["url"]);
    // The person approves a moment later; the held retry completes.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(page.decide(&pid, "approved", &mut key).await.status, 200);
    let r = report("sdk-2026", child.wait_with_output().unwrap());
    let done = structured(&r, 0);
    assert_eq!(done["status"], "queued", "{}", r["calls"][0]);
    assert_eq!(s.queued_messages(), 1);
    // Holding the call read the plan, not execute: a couple of audited asks, not dozens.
    let asks = s
        .cli(&["audit", &pid])
        .lines()
        .filter(|l| l.contains("\"approval_required\""))
        .count();
    assert!((1..=3).contains(&asks), "{asks} approval_required records");

    // Clients that cannot open URLs are told where to go, and nothing is decided.
    let p2 = plan(&t).await;
    let calls = json!([{ "name": "execute_plan", "arguments": { "plan_id": p2["plan_id"] } }]);
    for scenario in ["sdk-legacy", "sdk-legacy-2025-06-18"] {
        let r = run(scenario, &s, (&t.service, &t.operator), calls.clone(), &[]);
        let (code, res) = tool_error(&r, 0);
        assert_eq!(code, "approval_required", "{scenario}");
        assert_eq!(
            res["structuredContent"]["approval"]["url"],
            p2["approval"]["url"]
        );
        assert!(res["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains(p2["approval"]["url"].as_str().unwrap()));
    }
    let r = run(
        "sdk-2026",
        &s,
        (&t.service, &t.operator),
        calls.clone(),
        &[("AIRLOCK_MCP_ELICITATION", "none")],
    );
    assert_eq!(tool_error(&r, 0).0, "approval_required");
    assert_eq!(s.queued_messages(), 1);
    // Mastra (legacy handshake by default) shows the URL in the error it throws.
    let m = run("mastra", &s, (&t.service, &t.operator), calls, &[]);
    let shown = m["calls"][0].to_string();
    assert!(
        shown.contains(p2["approval"]["url"].as_str().unwrap()),
        "{shown}"
    );
}

// ---------------------------------------------------------------------------------------
// Raw JSON-RPC, as a 2026-07-28 client sends it: what no client library can send (a key
// given twice) and many calls at once.

const MCP_VERSION: &str = "2026-07-28";

/// The `_meta` of a 2026-07-28 request from a client that can open URLs for the user.
fn meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": MCP_VERSION,
        "io.modelcontextprotocol/clientCapabilities": { "elicitation": { "form": {}, "url": {} } },
    })
}

/// POSTs one JSON-RPC message (its text as given) to the MCP endpoint: status and body.
async fn post_mcp(
    s: &Server,
    t: &airlock_tests::Api,
    method: &str,
    tool: Option<&str>,
    text: String,
) -> (u16, Value) {
    let mut rb = t
        .http
        .post(url(s))
        .header("authorization", format!("Bearer {}", t.service))
        .header("x-operator-token", &t.operator)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", MCP_VERSION)
        .header("mcp-method", method);
    if let Some(name) = tool {
        rb = rb.header("mcp-name", name);
    }
    let r = rb.body(text).send().await.expect("POST /mcp");
    let status = r.status().as_u16();
    let body = r.text().await.expect("body");
    (
        status,
        serde_json::from_str(&body).unwrap_or(Value::String(body)),
    )
}

/// A `tools/call` whose arguments are the given JSON text: the JSON-RPC `result`.
async fn call_raw(
    s: &Server,
    t: &airlock_tests::Api,
    tool: &str,
    arguments: &str,
    extra: &str,
) -> Value {
    let text = format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"{tool}","arguments":{arguments}{extra},"_meta":{}}}}}"#,
        meta()
    );
    let (status, body) = post_mcp(s, t, "tools/call", Some(tool), text).await;
    assert_eq!(status, 200, "{tool} {arguments}: {body}");
    body.get("result")
        .cloned()
        .unwrap_or_else(|| panic!("{tool} {arguments}: no result: {body}"))
}

both!(tool_arguments_are_read_as_strictly_as_rest_bodies);
async fn tool_arguments_are_read_as_strictly_as_rest_bodies(b: Backend) {
    let s = start(b);
    let t = s.trader();
    let order = |q: &str| {
        format!(
            r#"{{"account_id":"ACC-1","symbol":"CLF27","side":"buy",{q},"order_type":"market"}}"#
        )
    };
    // Two quantities: REST names the field, and so does the tool, planning nothing.
    let rest = t
        .post_raw(
            "/actions/plan",
            "application/json",
            format!(
                r#"{{"action_type":"order.submit.cl","requested_by":"op-energy-trader","payload":{}}}"#,
                order(r#""quantity":1,"quantity":7"#)
            )
            .into_bytes(),
        )
        .await;
    rest.assert_error(400, "invalid_request");
    assert_eq!(rest.field(), "/payload/quantity");
    let r = call_raw(
        &s,
        &t,
        "plan_cl_order",
        &order(r#""quantity":1,"quantity":7"#),
        "",
    )
    .await;
    assert_eq!(r["isError"], true, "the last quantity was planned: {r}");
    let err = &r["structuredContent"]["error"];
    assert_eq!(err["code"], "invalid_request", "{r}");
    assert_eq!(err["details"][0]["field"], "/quantity", "{r}");
    // The same key twice in a nested argument, and text over the bounds, the same way.
    let long = format!(
        r#"{{"account_id":"ACC-1","symbol":"{}","side":"buy","quantity":1,"order_type":"market"}}"#,
        "x".repeat(4097)
    );
    for (tool, args, field) in [
        ("plan_cl_order", long.as_str(), "/symbol"),
        ("list_accounts", r#"{"limit":1,"limit":2}"#, "/limit"),
    ] {
        let r = call_raw(&s, &t, tool, args, "").await;
        assert_eq!(r["isError"], true, "{tool}: {r}");
        assert_eq!(
            r["structuredContent"]["error"]["details"][0]["field"], field,
            "{r}"
        );
    }
    // One quantity plans as before.
    let r = call_raw(&s, &t, "plan_cl_order", &order(r#""quantity":2"#), "").await;
    assert_eq!(r["isError"], false, "{r}");
    assert_eq!(
        r["structuredContent"]["preview"],
        "Buy 2 CLF27 at market, protected: limit 68.90 (68.40 + 0.50) on ACC-1, day order.",
        "{r}"
    );
    // A key twice in the message itself (not its arguments): the message is refused, 400
    // naming it, as a REST body would be.
    let text = format!(
        r#"{{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/list","params":{{"_meta":{}}}}}"#,
        meta()
    );
    let (status, body) = post_mcp(&s, &t, "tools/list", None, text).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "invalid_request", "{body}");
    assert_eq!(body["error"]["details"][0]["field"], "/id", "{body}");
    // And a message over 64 KiB, as a body over 64 KiB.
    let big = format!(r#"{{"pad":"{}"}}"#, "y".repeat(70 * 1024));
    let (status, body) = post_mcp(&s, &t, "tools/call", Some("list_accounts"), big).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["error"]["code"], "payload_too_large", "{body}");
}

/// An `execute_plan` retried after the user agreed to open the approval page (2026-07-28,
/// URL elicitation): `(held, result)`, held when the call waited for the approval and
/// then asked again (`input_required`), not held when it answered `approval_required` at
/// once.
async fn retry_after_accept(
    s: &Server,
    t: &airlock_tests::Api,
    plan_id: &str,
) -> (bool, Value, Duration) {
    let started = Instant::now();
    let r = call_raw(
        s,
        t,
        "execute_plan",
        &json!({ "plan_id": plan_id }).to_string(),
        r#","inputResponses":{"approve":{"action":"accept"}}"#,
    )
    .await;
    let took = started.elapsed();
    match (r["resultType"].as_str(), r["isError"].as_bool()) {
        (Some("input_required"), _) => (true, r, took),
        (_, Some(true)) => {
            assert_eq!(
                r["structuredContent"]["error"]["code"], "approval_required",
                "{r}"
            );
            (false, r, took)
        }
        _ => panic!("neither held nor refused: {r}"),
    }
}

both!(held_execute_plan_calls_are_bounded_per_plan_and_per_operator);
async fn held_execute_plan_calls_are_bounded_per_plan_and_per_operator(b: Backend) {
    const HOLD_MS: u64 = 3_000;
    let s = Stack::new(b).operator_mode().start(&[
        ("AIRLOCK_NOW", MARKET_OPEN),
        ("AIRLOCK_APPROVAL_HOLD_MS", &HOLD_MS.to_string()),
    ]);
    let t = s.trader();
    let mut plans = Vec::new();
    for _ in 0..3 {
        let p = t.plan_buy("CLF27", 1).await;
        assert_eq!(p["executable"], true, "{:?}", p.body);
        plans.push(p["plan_id"].as_str().unwrap().to_string());
    }
    let hold = Duration::from_millis(HOLD_MS);

    // Four calls at once for one plan: one waits for the approval, the others are told at
    // once where to approve.
    let calls = (0..4).map(|_| retry_after_accept(&s, &t, &plans[0]));
    let answers = futures_util::future::join_all(calls).await;
    let held: Vec<_> = answers.iter().filter(|a| a.0).collect();
    assert_eq!(held.len(), 1, "one held call per plan: {answers:?}");
    assert!(
        held[0].2 >= hold - Duration::from_millis(500),
        "{answers:?}"
    );
    for (_, r, took) in answers.iter().filter(|a| !a.0) {
        assert!(
            *took < hold,
            "answered at once, not after a hold: {took:?} {r}"
        );
        assert!(
            r["structuredContent"]["approval"]["url"]
                .as_str()
                .is_some_and(|u| u.ends_with(&plans[0])),
            "{r}"
        );
    }

    // One call for each of three plans: two of the operator's calls wait, the third is
    // answered at once.
    let calls = plans.iter().map(|p| retry_after_accept(&s, &t, p));
    let answers = futures_util::future::join_all(calls).await;
    assert_eq!(
        answers.iter().filter(|a| a.0).count(),
        2,
        "two held calls per operator: {answers:?}"
    );
    // Once they ended, the plan is held again.
    let (held, r, _) = retry_after_accept(&s, &t, &plans[2]).await;
    assert!(held, "{r}");
    assert_eq!(s.queued_messages(), 0, "nothing was executed");
}

/// On Lambda the hold ends in time for the call to answer before the invocation's
/// deadline: the mcp function (real binary, runtime emulator, embedded state) given 12 s
/// holds for what the deadline leaves after its reserve (4 operation timeouts of 2 s),
/// and answers, instead of holding 20 s and timing out.
#[test]
fn a_held_call_answers_before_the_lambdas_deadline() {
    use airlock_tests::lambda::{
        apigw_rest_event, embedded_function_env, response_parts, LambdaEmulator, TradingState,
        IGNORE_STAGE_ENV,
    };
    let state = TradingState::new();
    // The shipped policy: orders are approved on the approval page.
    std::fs::remove_file(state.dir.join("policy.json")).expect("policy.json");
    let emu = LambdaEmulator::start();
    let mut f = emu.spawn_ready(
        "mcp",
        &embedded_function_env(&state.dir, &[IGNORE_STAGE_ENV]),
    );
    let bearer = format!("Bearer {}", state.service);
    let mut call = |arguments: Value, extra: Value, timeout: Duration| {
        let mut params =
            json!({ "name": arguments["tool"], "arguments": arguments["args"], "_meta": meta() });
        if let Some(m) = extra.as_object() {
            for (k, v) in m {
                params[k] = v.clone();
            }
        }
        let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params });
        let name = arguments["tool"].as_str().unwrap().to_string();
        let h = [
            ("Authorization", bearer.as_str()),
            ("X-Operator-Token", state.operator.as_str()),
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
            ("MCP-Protocol-Version", MCP_VERSION),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", name.as_str()),
        ];
        let ev = apigw_rest_event(
            "POST",
            &format!("{BASE}/mcp"),
            &[],
            &h,
            Some(&body.to_string()),
        );
        let started = Instant::now();
        f.invoke(ev, timeout).map(|resp| {
            let (status, body) = response_parts(&resp);
            assert_eq!(status, 200, "{body}");
            (body["result"].clone(), started.elapsed())
        })
    };
    let order = json!({ "account_id": "ACC-1", "symbol": "CLF27", "side": "buy", "quantity": 1, "order_type": "market" });
    let (plan, _) = call(
        json!({ "tool": "plan_cl_order", "args": order }),
        json!({}),
        Duration::from_secs(30),
    )
    .expect("plan");
    assert_eq!(plan["structuredContent"]["executable"], true, "{plan}");
    let plan_id = plan["structuredContent"]["plan_id"].clone();
    let (held, took) = call(
        json!({ "tool": "execute_plan", "args": { "plan_id": plan_id } }),
        json!({ "inputResponses": { "approve": { "action": "accept" } } }),
        Duration::from_secs(12),
    )
    .expect("the held call answers before the invocation's deadline");
    assert_eq!(
        held["resultType"], "input_required",
        "held, then asked again: {held}"
    );
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(10),
        "held for what the deadline leaves (about 4 s): {took:?}"
    );
}

/// A payload of each registered action type, as an agent would send it. A type added to
/// the registry without one here fails the test below.
fn example_payload(a: ActionType) -> Value {
    match a.as_str() {
        "order.submit.cl" => {
            json!({ "account_id": "ACC-1", "symbol": "CLF27", "side": "buy", "quantity": 1, "order_type": "limit", "limit_price": "68.00" })
        }
        "order.replace.cl" => {
            json!({ "account_id": "ACC-1", "order_id": "ORD-1001", "quantity": 2 })
        }
        "order.cancel" => json!({ "account_id": "ACC-1", "order_id": "ORD-1001" }),
        "positions.sync" => json!({ "account_id": "ACC-1" }),
        other => panic!("{other}: give the registered action type an example payload here"),
    }
}

both!(every_registered_action_type_is_reachable_from_every_door);
async fn every_registered_action_type_is_reachable_from_every_door(b: Backend) {
    let s = start(b);
    let t = s.trader();
    let doc = t.get("/openapi.json").await;
    let variants = doc.body["components"]["schemas"]["PlanRequest"]["oneOf"].clone();
    for a in ActionType::ALL {
        let payload = example_payload(*a);
        // REST.
        let r = t
            .post("/actions/plan", &json!({ "action_type": a.as_str(), "payload": payload, "requested_by": "op-energy-trader" }))
            .await;
        assert_eq!(r.status, 200, "{a} over REST: {:?}", r.body);
        assert_eq!(r["action_type"], a.as_str(), "{a}: {:?}", r.body);
        // MCP: the type's own plan tool, the payload as its arguments.
        let tool = actions::of(*a).plan_tool().name;
        let m = call_raw(&s, &t, tool, &payload.to_string(), "").await;
        assert_ne!(m["isError"], true, "{a} through {tool}: {m}");
        assert_eq!(
            m["structuredContent"]["action_type"],
            a.as_str(),
            "{a}: {m}"
        );
        // OpenAPI: the plan request names the type and describes its payload.
        let variant = variants
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| v["properties"]["action_type"]["const"] == a.as_str());
        let payload_ref = variant.map(|v| &v["properties"]["payload"]["$ref"]);
        assert!(
            payload_ref.is_some_and(Value::is_string),
            "{a}: no PlanRequest variant with its payload schema in {variants}"
        );
    }
}
