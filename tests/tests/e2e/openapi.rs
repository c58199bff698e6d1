//! The published contract: `docs/openapi.json` is the document the code generates and the
//! server serves; Schemathesis fuzzes `airlock serve` against it on both backends with
//! zero failures; the queue messages actually sent match `docs/queue-message.schema.json`.

use std::path::{Path, PathBuf};
use std::process::Command;

use airlock_tests::{both, column, contract, Backend, Server, Stack, MARKET_OPEN};
use serde_json::{json, Value};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repo root")
        .to_path_buf()
}

#[test]
fn the_committed_document_is_the_generated_one() {
    let committed =
        std::fs::read_to_string(repo().join("docs/openapi.json")).expect("docs/openapi.json");
    assert!(
        committed == airlock::doors::catalog::text().expect("the document builds"),
        "docs/openapi.json differs from the document the code generates; regenerate it with\n  \
         cargo run -p airlock-local -- openapi > docs/openapi.json\nand review the diff"
    );
}

#[test]
fn every_route_is_documented_with_its_errors() {
    let doc = contract::document();
    assert_eq!(doc["openapi"], "3.1.0");
    let ops: Vec<&str> = doc["paths"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|item| item.as_object().unwrap().values())
        .map(|op| op["operationId"].as_str().unwrap())
        .collect();
    for id in [
        "health",
        "getOpenApi",
        "listAccounts",
        "listPositions",
        "listOrders",
        "listJobs",
        "getAction",
        "planAction",
        "executePlan",
        "createEnrolment",
        "mcp",
    ] {
        assert!(ops.contains(&id), "{id} missing from {ops:?}");
    }
    // Every error code the contract has is answered by some operation or page, with the
    // status the one error-to-HTTP mapping gives it.
    let (_, _, execute) = contract::operation("executePlan");
    let r409 = &execute["responses"]["409"];
    let codes = &r409["content"]["application/json"]["schema"]["properties"]["error"]["properties"]
        ["code"]["enum"];
    assert_eq!(
        codes,
        &json!([
            "plan_already_executed",
            "idempotency_key_in_flight",
            "approval_required"
        ])
    );
    assert!(r409["headers"]["Retry-After"].is_object());
    assert!(execute["responses"]["429"]["headers"]["Retry-After"].is_object());
    assert_eq!(
        execute["security"],
        json!([{"serviceBearer": [], "operatorToken": []}])
    );
    let (_, _, health) = contract::operation("health");
    assert_eq!(health["security"], json!([]));
    // Pagination, the idempotency header, examples and the links Schemathesis follows.
    let (_, _, orders) = contract::operation("listOrders");
    let params = column(&orders["parameters"], "name");
    assert_eq!(params, ["account_id", "status", "limit", "cursor"]);
    let headers: Vec<&Value> = execute["parameters"].as_array().unwrap().iter().collect();
    assert_eq!(headers[0]["name"], "Idempotency-Key");
    assert_eq!(headers[0]["in"], "header");
    let (_, _, plan) = contract::operation("planAction");
    assert!(plan["requestBody"]["content"]["application/json"]["examples"]["order"].is_object());
    assert_eq!(
        plan["responses"]["200"]["links"]["ExecuteThePlan"]["operationId"],
        "executePlan"
    );
    assert_eq!(
        execute["responses"]["202"]["links"]["GetTheAction"]["operationId"],
        "getAction"
    );
}

both!(the_served_document_is_the_committed_one);
async fn the_served_document_is_the_committed_one(b: Backend) {
    let s = Server::start_on(b, &[]);
    let t = s.trader();
    let http = reqwest::Client::new();
    let r = http
        .get(s.url("/openapi.json"))
        .bearer_auth(&t.service)
        .header("x-operator-token", &t.operator)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["content-type"].to_str().unwrap(),
        "application/json"
    );
    let served = r.text().await.unwrap();
    let committed = std::fs::read_to_string(repo().join("docs/openapi.json")).unwrap();
    assert!(
        served == committed,
        "the served document is not docs/openapi.json"
    );
    // Same tokens as the reads.
    let r = t.with_tokens("", &t.operator).get("/openapi.json").await;
    assert_eq!((r.status, r.code()), (401, "unauthenticated"));
    contract::check("getOpenApi", r.status, &r.body);
}

/// Runs Schemathesis (installed by scripts/schemathesis.sh into .venv/st) against a
/// server on `b`, with the trader's and an admin's real tokens. Every default check, the
/// checks of tests/schemathesis/airlock_checks.py, the four phases, a fixed seed.
async fn fuzz(b: Backend, max_examples: u32) {
    let st = repo().join(".venv/st/bin/st");
    assert!(
        st.exists(),
        "{} is missing: run scripts/schemathesis.sh (the test command does)",
        st.display()
    );
    // Token confirmation (the fuzzer plays the agent and the confirming caller), the
    // market open, and rate limits and a message throttle the fuzzer's plans and executes
    // do not reach.
    let stack = Stack::new(b);
    std::fs::write(
        stack.state_dir.join("policy.json"),
        r#"{"confirmation": {"order.submit.cl": "token", "order.replace.cl": "token"}, "max_messages_per_window": 1000000000}"#,
    )
    .expect("policy.json");
    let s = stack.start(&[
        ("AIRLOCK_NOW", MARKET_OPEN),
        ("AIRLOCK_EXECUTE_RATE_PER_MINUTE", "1000000"),
        ("AIRLOCK_PLAN_RATE_PER_MINUTE", "1000000"),
        // The workers are off: the fuzzer's orders would fill the backlog.
        ("AIRLOCK_ORDERS_BACKLOG_LIMIT", "0"),
    ]);
    let admin_service = s.cli(&[
        "token",
        "service",
        "--scopes",
        "trade.read trade.plan trade.execute trade.admin",
    ]);
    let admin = s.operator_token("op-admin", "admin", None);
    let t = s.trader();
    let out = Command::new(&st)
        .current_dir(repo())
        .args([
            "--config-file",
            "tests/schemathesis/schemathesis.toml",
            "run",
            &s.url("/openapi.json"),
            "--max-examples",
            &max_examples.to_string(),
            "--request-timeout",
            "30",
        ])
        .env(
            "AIRLOCK_ST_HOOKS",
            repo().join("tests/schemathesis/airlock_checks.py"),
        )
        .env("AIRLOCK_ST_SERVICE_TOKEN", &t.service)
        .env("AIRLOCK_ST_OPERATOR_TOKEN", &t.operator)
        .env("AIRLOCK_ST_ADMIN_SERVICE_TOKEN", &admin_service)
        .env("AIRLOCK_ST_ADMIN_OPERATOR_TOKEN", &admin)
        .env("NO_COLOR", "1")
        .env("SCHEMATHESIS_TELEMETRY", "false")
        .output()
        .expect("run schemathesis");
    let text = String::from_utf8_lossy(&out.stdout);
    // The summary goes to the test's output (`--nocapture`), for the record.
    let summary: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.contains("SUMMARY"))
        .collect();
    println!("{}", summary.join("\n"));
    assert!(
        out.status.success(),
        "Schemathesis found failures against the {b:?} backend:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("passed") && !text.contains("failed"),
        "unexpected Schemathesis output:\n{text}"
    );
}

#[tokio::test]
async fn schemathesis_finds_nothing_embedded() {
    fuzz(Backend::Embedded, 150).await;
}

/// Shorter on the emulator: both backends honour one document.
#[tokio::test]
async fn schemathesis_finds_nothing_aws() {
    fuzz(Backend::Aws, 40).await;
}

/// Validates `instance` against the queue message schema.
fn queue_schema_violations(instance: &Value) -> Vec<String> {
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("docs/queue-message.schema.json")).unwrap(),
    )
    .unwrap();
    let v = jsonschema::draft202012::new(&schema).expect("a valid schema");
    v.iter_errors(instance)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect()
}

/// Every field of `instance` is a property the schema names (recursively for objects),
/// so a field added to the message without its documentation fails.
fn undocumented(schema: &Value, instance: &Value, at: &str, out: &mut Vec<String>) {
    let Some(obj) = instance.as_object() else {
        return;
    };
    let mut props = serde_json::Map::new();
    if let Some(p) = schema["properties"].as_object() {
        props.extend(p.clone());
    }
    for (k, v) in obj {
        match props.get(k) {
            None => out.push(format!("{at}/{k}")),
            Some(s) => undocumented(s, v, &format!("{at}/{k}"), out),
        }
    }
}

/// The messages waiting in the queues (workers are off): SQLite's queue table, or SQS.
async fn sent_messages(s: &Server) -> Vec<Value> {
    match s.backend {
        Backend::Embedded => {
            let db = s.db();
            let mut st = db.prepare("SELECT body FROM queue").unwrap();
            st.query_map([], |r| airlock_tests::stored_body(r, 0))
                .unwrap()
                .map(|b| serde_json::from_str(&b.unwrap()).unwrap())
                .collect()
        }
        Backend::Aws => {
            let env: std::collections::HashMap<String, String> = s.cli_env().into_iter().collect();
            let conf = airlock_tests::emulator_config(&env["AWS_ENDPOINT_URL"]).await;
            let sqs = aws_sdk_sqs::Client::new(&conf);
            let urls = sqs
                .list_queues()
                .send()
                .await
                .unwrap()
                .queue_urls
                .unwrap_or_default();
            let mut out = Vec::new();
            for url in urls.iter().filter(|u| !u.contains("-dlq")) {
                let got = sqs
                    .receive_message()
                    .queue_url(url)
                    .max_number_of_messages(10)
                    .visibility_timeout(0)
                    .send()
                    .await
                    .unwrap();
                for m in got.messages.unwrap_or_default() {
                    out.push(serde_json::from_str(m.body().unwrap()).unwrap());
                }
            }
            out
        }
    }
}

both!(queue_messages_match_their_schema);
async fn queue_messages_match_their_schema(b: Backend) {
    let s = Server::start_on(b, &[("AIRLOCK_NOW", MARKET_OPEN)]);
    let t = s.trader();
    let plans = [
        json!({"action_type": "order.submit.cl", "requested_by": "op-energy-trader",
               "payload": {"account_id": "ACC-1", "symbol": "CLF27", "side": "buy", "quantity": 1,
                           "order_type": "limit", "limit_price": "68.50", "time_in_force": "gtc"},
               "chat_context": {"chat_session_id": "chat-q", "tool_call_id": "call-q", "turn": 3}}),
        json!({"action_type": "order.cancel", "requested_by": "op-energy-trader",
               "payload": {"account_id": "ACC-1", "order_id": "ORD-1003"}}),
        json!({"action_type": "positions.sync", "requested_by": "op-energy-trader",
               "payload": {"account_id": "ACC-2"}}),
    ];
    for (i, p) in plans.iter().enumerate() {
        let plan = t.post("/actions/plan", p).await;
        assert_eq!(plan.status, 200, "{:?}", plan.body);
        assert_eq!(plan["executable"], true, "{:?}", plan.body);
        let e = t.execute(&plan, &format!("q-{i}")).await;
        assert_eq!(e.status, 202, "{:?}", e.body);
        contract::check("executePlan", e.status, &e.body);
    }
    let messages = sent_messages(&s).await;
    assert_eq!(messages.len(), 3, "{messages:?}");
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("docs/queue-message.schema.json")).unwrap(),
    )
    .unwrap();
    let mut kinds: Vec<&str> = Vec::new();
    for m in &messages {
        let v = queue_schema_violations(m);
        assert!(
            v.is_empty(),
            "a sent message does not match its schema: {v:?}\n{m}"
        );
        // The payload's shape is the one of the message's action type (`allOf` / `if`).
        let mut resolved = schema.clone();
        let branch = schema["allOf"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["if"]["properties"]["action_type"]["const"] == m["action_type"])
            .expect("a payload shape for each action type");
        resolved["properties"]["normalized_payload"] =
            branch["then"]["properties"]["normalized_payload"].clone();
        let mut extra = Vec::new();
        undocumented(&resolved, m, "", &mut extra);
        assert!(
            extra.is_empty(),
            "fields the schema does not name: {extra:?}\n{m}"
        );
        kinds.push(m["action_type"].as_str().unwrap());
    }
    kinds.sort();
    assert_eq!(kinds, ["order.cancel", "order.submit.cl", "positions.sync"]);
    // The schema refuses what it should: the check above could fail.
    let mut bad = messages[0].clone();
    bad["schema"] = json!("airlock.action.v2");
    assert!(!queue_schema_violations(&bad).is_empty());
    let submit = messages
        .iter()
        .find(|m| m["action_type"] == "order.submit.cl")
        .unwrap();
    let mut bad = submit.clone();
    bad["normalized_payload"]["side"] = json!("short");
    assert!(!queue_schema_violations(&bad).is_empty());
    let mut bad = submit.clone();
    bad["action_type"] = json!("order.cancel");
    bad["normalized_payload"] = json!({"account_id": "ACC-1"});
    assert!(
        !queue_schema_violations(&bad).is_empty(),
        "a cancel needs its order_id"
    );
}

/// `airlock openapi | head -1`: the CLI's output goes to a reader that stops early. The
/// document is larger than a pipe's buffer, so the CLI writes into a closed pipe; it must end
/// quietly with success, not panic ("failed printing to stdout: Broken pipe").
#[test]
fn the_cli_ends_quietly_when_its_reader_stops_early() {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = Command::new(airlock_tests::binary())
        .arg("openapi")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("airlock openapi");
    let mut first = [0u8; 16];
    let mut stdout = child.stdout.take().expect("stdout");
    stdout
        .read_exact(&mut first)
        .expect("the document's first bytes");
    drop(stdout);
    let out = child.wait_with_output().expect("airlock exits");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !stderr.contains("panicked"),
        "status {}, stderr: {stderr}",
        out.status
    );
    assert!(
        first.starts_with(b"{"),
        "{:?}",
        String::from_utf8_lossy(&first)
    );
}
