//! `airlock check --base-url URL`: the golden scenarios pass against `airlock serve`, run
//! an order to a terminal state with `--execute`, and name what failed (an engaged kill
//! switch, a broken read path); `--execute` is refused on a stage that is not a sandbox.

use std::io::{Read, Write};
use std::process::Command;
use std::sync::{Arc, Mutex};

use airlock_tests::faults::{Fault, FaultProxy};
use airlock_tests::{both, column, Backend, Server, Stack, MARKET_OPEN};
use serde_json::Value;

/// One run of `airlock check`: exit code, table (stdout), stderr, JSON report.
struct Run {
    code: i32,
    table: String,
    stderr: String,
    report: Value,
}

impl Run {
    /// The detail of the scenario whose name starts so.
    fn detail(&self, name_starts: &str) -> &str {
        self.scenario(name_starts)["detail"]
            .as_str()
            .expect("a scenario's detail")
    }

    fn scenario(&self, name_starts: &str) -> &Value {
        self.report["scenarios"]
            .as_array()
            .expect("scenarios")
            .iter()
            .find(|s| s["name"].as_str().unwrap_or("").starts_with(name_starts))
            .unwrap_or_else(|| panic!("no scenario {name_starts:?} in {}", self.table))
    }

    fn failed(&self) -> Vec<String> {
        self.report["scenarios"]
            .as_array()
            .expect("scenarios")
            .iter()
            .filter(|s| s["ok"] != true)
            .map(|s| format!("{}: {}", s["name"], s["detail"]))
            .collect()
    }
}

/// Runs `airlock check` against `base` with the energy trader's tokens of `s`.
fn check_at(s: &Server, base: &str, extra: &[&str]) -> Run {
    let service = s.service_token();
    let operator = s.operator_token("op-energy-trader", "trader", Some("energy"));
    let json = s.state_dir.join(format!(
        "check-{}.json",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    let out = Command::new(airlock_tests::binary())
        .args(["check", "--base-url", base, "--json"])
        .arg(&json)
        .args(extra)
        .env("AIRLOCK_SERVICE_TOKEN", service)
        .env("AIRLOCK_OPERATOR_TOKEN", operator)
        .env_remove("AIRLOCK_NOW")
        .env("RUST_LOG", "warn")
        .output()
        .expect("run airlock check");
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let report = std::fs::read_to_string(&json)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    Run {
        code: out.status.code().unwrap_or(-1),
        table,
        stderr,
        report,
    }
}

fn check(s: &Server, extra: &[&str]) -> Run {
    check_at(s, &s.base, extra)
}

/// Every scenario the check runs without `--execute`.
const GOLDEN: [&str; 23] = [
    "health",
    "read accounts",
    "read positions",
    "read orders",
    "read jobs",
    "read portfolio",
    "read portfolio/allocation",
    "read portfolio/risk-flags",
    "read an unknown action",
    "daily loss budget",
    "paginate accounts",
    "paginate orders",
    "plan order.submit.cl",
    "market protection and the price's age",
    "plan order.cancel",
    "plan positions.sync",
    "execute with a tampered token",
    "replay a rejected execute",
    "bad input: malformed JSON",
    "bad input: an unknown field",
    "bad input: a missing required field",
    "bad input: a bad enum value",
    "bad input: a forged cursor",
];

both!(passes_against_serve_and_queues_nothing);
async fn passes_against_serve_and_queues_nothing(b: Backend) {
    // The shipped policy: new orders wait for an operator's approval.
    let s = Server::operator_mode_at_open(b);
    let r = check(&s, &[]);
    assert_eq!(r.code, 0, "{}\n{}", r.table, r.stderr);
    assert_eq!(r.report["failed"], 0, "{:?}", r.failed());
    let names = column(&r.report["scenarios"], "name");
    assert_eq!(names.len(), GOLDEN.len(), "{names:?}");
    for (name, want) in names.iter().zip(GOLDEN) {
        assert!(name.starts_with(want), "{name} where {want} was expected");
    }
    for s in r.report["scenarios"].as_array().unwrap() {
        assert_eq!(s["ok"], true, "{s}");
        assert!(s["ms"].is_u64() && s["detail"].is_string(), "{s}");
    }
    assert_eq!(r.report["passed"], GOLDEN.len());
    assert!(r.report["base_url"]
        .as_str()
        .unwrap()
        .ends_with("/api/internal/v1/mastra"));
    assert!(r.report["started_at"].is_string() && r.report["duration_ms"].is_u64());
    // The table: one line per scenario and the summary.
    assert_eq!(
        r.table.lines().filter(|l| l.starts_with("PASS  ")).count(),
        GOLDEN.len(),
        "{}",
        r.table
    );
    let ok = format!("OK {} passed, 0 failed", GOLDEN.len());
    assert!(r.table.contains(&ok), "{}", r.table);
    // The replay is the recorded rejection of a plan that cannot execute.
    assert!(
        r.detail("replay a rejected execute")
            .contains("plan_not_executable"),
        "{}",
        r.table
    );
    // Without --execute nothing is queued.
    assert_eq!(s.queued_messages(), 0);
    // The base URL may name the base path itself.
    let r = check_at(&s, &s.url(""), &[]);
    assert_eq!(r.code, 0, "{}\n{}", r.table, r.stderr);
}

both!(execute_follows_an_order_to_a_terminal_state);
async fn execute_follows_an_order_to_a_terminal_state(b: Backend) {
    // Orders confirmed with the plan's token (a sandbox set up for drills).
    let s = Server::with_workers(b, &[]);
    let r = check(&s, &["--execute"]);
    assert_eq!(r.code, 0, "{}\n{}", r.table, r.stderr);
    assert_eq!(r.report["execute"], true);
    for name in [
        "execute order.submit.cl",
        "execute positions.sync",
        "replay an accepted execute",
        "the order reaches a terminal state",
        "cancel the check's order",
        "the sync reaches a terminal state",
    ] {
        assert_eq!(r.scenario(name)["ok"], true, "{name}: {}", r.table);
    }
    let queued = r.detail("execute order.submit.cl").to_string();
    assert!(queued.contains("limit"), "{queued}");
    let order_id = queued
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .find(|w| w.starts_with("ord_"))
        .expect("the order id in the detail")
        .to_string();
    // The order rested at the broker, then was cancelled: nothing filled.
    let t = s.trader();
    let o = t.order(&order_id).await;
    assert_eq!(o["status"], "cancelled", "{o}");
    assert_eq!(o["filled_quantity"], 0, "{o}");
    assert!(
        r.detail("replay an accepted execute").contains("duplicate"),
        "{}",
        r.table
    );
}

both!(an_engaged_kill_switch_fails_the_order_plan);
async fn an_engaged_kill_switch_fails_the_order_plan(b: Backend) {
    let s = Server::start_on(b, &[("AIRLOCK_NOW", MARKET_OPEN)]);
    s.cli(&["kill-switch", "engage", "--reason", "check drill"]);
    let r = check(&s, &[]);
    assert_eq!(r.code, 1, "{}\n{}", r.table, r.stderr);
    let plan = r.scenario("plan order.submit.cl");
    assert_eq!(plan["ok"], false, "{}", r.table);
    assert!(
        plan["detail"].as_str().unwrap().contains("kill_switch"),
        "{plan}"
    );
    assert_eq!(
        r.failed().len(),
        1,
        "only the order plan fails: {:?}",
        r.failed()
    );
    assert!(
        r.table.contains("FAIL  plan order.submit.cl"),
        "{}",
        r.table
    );
    assert!(r.table.contains("1 failed"), "{}", r.table);
}

both!(a_broken_read_path_is_named);
async fn a_broken_read_path_is_named(b: Backend) {
    // Listing jobs fails: a corrupt row on the embedded backend, DynamoDB answering 500
    // for the jobs table on AWS.
    let stack = Stack::new(b);
    let proxy = stack.emulator_endpoint().map(|e| FaultProxy::start(&e));
    let mut env = vec![("AIRLOCK_NOW", MARKET_OPEN)];
    if let Some(p) = &proxy {
        env.push(("AWS_ENDPOINT_URL", p.endpoint.as_str()));
    }
    let s = stack.start(&env);
    match &proxy {
        Some(p) => {
            for op in ["Query", "Scan"] {
                p.on_matching(op, Some("airlock-jobs"), Fault::Status500, None);
            }
        }
        None => {
            s.db()
                .execute("UPDATE jobs SET kind = 'no.such.kind'", [])
                .unwrap();
        }
    }
    let r = check(&s, &[]);
    assert_eq!(r.code, 1, "{}\n{}", r.table, r.stderr);
    let jobs = r.scenario("read jobs");
    assert_eq!(jobs["ok"], false, "{}", r.table);
    let detail = jobs["detail"].as_str().unwrap();
    assert!(
        detail.contains("internal") || detail.contains("upstream_unavailable"),
        "{detail}"
    );
    assert_eq!(
        r.failed().len(),
        1,
        "only the jobs read fails: {:?}",
        r.failed()
    );
    assert_eq!(r.scenario("read orders")["ok"], true);
    assert!(r.table.contains("FAIL  read jobs"), "{}", r.table);
}

/// A stage whose `/health` names no paper broker: `--execute` stops after reading it.
#[tokio::test]
async fn execute_is_refused_where_the_stage_is_not_a_sandbox() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut c) = conn else { return };
            let mut buf = [0u8; 8192];
            let n = c.read(&mut buf).unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]).into_owned();
            log.lock()
                .unwrap()
                .push(head.lines().next().unwrap_or("").to_string());
            let body = r#"{"status":"ok","service":"airlock","version":"9.9.9","broker":"live"}"#;
            let _ = write!(
                c,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    // Tokens of any server: the fake stage never reads them.
    let s = Server::start(&[]);
    let r = check_at(&s, &base, &["--execute"]);
    assert_eq!(r.code, 2, "{}\n{}", r.table, r.stderr);
    assert!(r.stderr.contains("--execute refused"), "{}", r.stderr);
    assert!(r.stderr.contains("`live`"), "{}", r.stderr);
    assert_eq!(
        *seen.lock().unwrap(),
        vec!["GET /health HTTP/1.1".to_string()]
    );
}
