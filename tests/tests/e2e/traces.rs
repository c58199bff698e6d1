//! Joined traces: on Lambda, every log line and audit record of a request
//! carries Airlock's request id, API Gateway's request id and the Lambda request id, and
//! the queue message carries them to the worker's log lines. The real plan and execute
//! binaries under the Lambda runtime emulator, on an embedded state dir the test reads.

use std::time::Duration;

use airlock_tests::lambda::{
    apigw_post_event, embedded_function_env, response_parts, FunctionProcess, LambdaEmulator,
    IGNORE_STAGE_ENV,
};
use airlock_tests::{cli, Server, MARKET_OPEN};
use serde_json::{json, Value};

/// The JSON log lines of `log` whose spans name `apigw_request_id`.
fn lines_of(log: &str, apigw: &str) -> Vec<Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| {
            v["spans"]
                .as_array()
                .is_some_and(|s| s.iter().any(|s| s["apigw_request_id"] == apigw))
        })
        .collect()
}

/// A JSON `POST` through a function, answered `status`: the API Gateway request id it
/// carried, the answer's `x-request-id`, and the answer.
fn post(
    f: &mut FunctionProcess,
    path: &str,
    headers: &[(&str, String)],
    body: &Value,
    status: u16,
) -> (String, String, Value) {
    let ev = apigw_post_event(path, headers, body);
    let apigw = ev["requestContext"]["requestId"]
        .as_str()
        .unwrap()
        .to_string();
    let resp = f.invoke(ev, Duration::from_secs(30)).unwrap();
    let (got, answer) = response_parts(&resp);
    assert_eq!(got, status, "{answer}");
    let request_id = airlock_tests::lambda::response_header(&resp, "x-request-id").unwrap();
    (apigw, request_id, answer)
}

#[test]
fn a_request_is_joined_across_logs_audit_and_the_worker() {
    let state = airlock_tests::lambda::TradingState::new();
    let (dir, env) = (&state.dir, &state.env);
    let fenv = embedded_function_env(dir, &[("RUST_LOG", "info"), IGNORE_STAGE_ENV]);
    let (emu_plan, emu_exec) = (LambdaEmulator::start(), LambdaEmulator::start());
    let mut plan = emu_plan.spawn_ready("plan", &fenv);
    let mut execute = emu_exec.spawn_ready("execute", &fenv);
    let h = state.json_headers();

    // The plan: its log lines and its audit record carry the three ids.
    let body = json!({
        "action_type": "order.submit.cl", "requested_by": "op-energy-trader",
        "payload": {"account_id": "ACC-1", "symbol": "CLF27", "side": "buy", "quantity": 1,
                    "order_type": "market"}
    });
    let (plan_gw, request_id, p) = post(&mut plan, "/actions/plan", &h, &body, 200);
    let lines = lines_of(&plan.log(), &plan_gw);
    assert!(
        !lines.is_empty(),
        "no log line names {plan_gw}:\n{}",
        plan.log()
    );
    let request_line = lines
        .iter()
        .find(|l| l["fields"]["message"] == "request")
        .expect("the request line");
    let span = request_line["spans"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "request")
        .expect("the request span");
    assert_eq!(span["request_id"], request_id.as_str(), "{request_line}");
    let lambda_id = span["lambda_request_id"].as_str().unwrap().to_string();
    assert!(!lambda_id.is_empty(), "{request_line}");
    let audit: Vec<Value> = cli(dir, env, &["audit", p["plan_id"].as_str().unwrap()])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(audit[0]["request_id"], request_id.as_str(), "{audit:?}");
    assert_eq!(audit[0]["apigw_request_id"], plan_gw.as_str());
    assert_eq!(audit[0]["lambda_request_id"], lambda_id.as_str());

    // The execute: its ids ride the queue message to the worker.
    let exec = json!({"plan_id": p["plan_id"], "confirmation_token": p["confirmation_token"],
                      "idempotency_key": "trace-1", "requested_by": "op-energy-trader"});
    let (exec_gw, exec_request_id, e) = post(&mut execute, "/actions/execute", &h, &exec, 202);
    assert!(!lines_of(&execute.log(), &exec_gw).is_empty());
    let body: String = rusqlite::Connection::open(dir.join("airlock.db"))
        .unwrap()
        .query_row("SELECT body FROM queue", [], |r| {
            airlock_tests::stored_body(r, 0)
        })
        .unwrap();
    let m: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(m["trace"]["request_id"], exec_request_id.as_str());
    assert_eq!(m["trace"]["apigw_request_id"], exec_gw.as_str());
    assert!(m["trace"]["lambda_request_id"]
        .as_str()
        .is_some_and(|s| !s.is_empty()));
    drop(plan);
    drop(execute);

    // A worker (here the in-process one of `airlock serve` on the same state) logs the
    // message's handling under the execute's ids.
    let s = Server::start_in(
        dir.clone(),
        &[("AIRLOCK_NOW", MARKET_OPEN), ("AIRLOCK_WORKERS", "on")],
    );
    let t = s.trader();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(t.settled(e["action_id"].as_str().unwrap()));
    let log = std::fs::read_to_string(dir.join("serve.log")).unwrap();
    let worker_lines = lines_of(&log, &exec_gw);
    assert!(
        worker_lines
            .iter()
            .any(|l| l["fields"]["message"] == "message handled"
                && l["spans"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|s| s["name"] == "record" && s["request_id"] == exec_request_id.as_str())),
        "the worker's lines do not carry the execute's ids:\n{log}"
    );
}
