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

use airlock_tests::moto::Moto;
use airlock_tests::passkey::{enroll, ApprovalClient, Passkey};
use airlock_tests::{both, Backend, Server, Stack, BASE, MARKET_OPEN};
use serde_json::{json, Value};

const TOOLS: [&str; 12] = [
    "list_accounts",
    "list_positions",
    "list_orders",
    "list_jobs",
    "get_action",
    "portfolio_analysis",
    "allocation_breakdown",
    "risk_flags",
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
    let plan_sync = |id: &'static str| json!({ "action_type": "positions.sync", "payload": { "account_id": id }, "requested_by": "op-energy-trader" });
    let done = t.post("/actions/plan", &plan_sync("ACC-2")).await;
    let action = t.execute(&done, "rest-1").await;
    assert_eq!(action.status, 202);
    let p = t.post("/actions/plan", &plan_sync("ACC-1")).await;
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
    let order_schema = &r["tools"][8]["inputSchema"];
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
        "Buy 1 CLF27 at market on ACC-1, day order."
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
    let p = t
        .post(
            "/actions/plan",
            &json!({ "action_type": "positions.sync", "payload": { "account_id": "ACC-1" }, "requested_by": "op-energy-trader" }),
        )
        .await;
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
        &[
            "token",
            "operator",
            "--sub",
            "op-energy-trader",
            "--desks",
            "energy",
        ],
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
    let s = Stack::new(b)
        .operator_mode()
        .start(&[("AIRLOCK_NOW", MARKET_OPEN)]);
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
