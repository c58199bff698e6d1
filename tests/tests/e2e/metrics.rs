//! The metrics: a scripted scenario (plans, a queued execute, a duplicate, one
//! execute per rejection code it can cheaply provoke, a worker run) and the exact counter
//! values it must leave on `GET /metrics`, on both backends; the same values in the EMF
//! lines the real Lambda binaries print under the Lambda runtime emulator; `airlock stats`.

use std::collections::BTreeMap;
use std::time::Duration;

use airlock_tests::lambda::{
    apigw_post_event, embedded_function_env, response_parts, LambdaEmulator, IGNORE_STAGE_ENV,
};
use airlock_tests::{both, temp_state_dir, Api, Backend, Resp, Server, BASE, MARKET_OPEN};
use serde_json::{json, Value};

fn order(qty: u32) -> Value {
    json!({
        "action_type": "order.submit.cl",
        "payload": {"account_id": "ACC-1", "symbol": "CLF27", "side": "buy", "quantity": qty,
                    "order_type": "market"},
        "requested_by": "op-energy-trader"
    })
}

/// The counters of a Prometheus page, by `name{labels}` as printed (histograms' `_count`).
fn counters(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty() && !l.contains("_bucket"))
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(k, v)| (k.to_string(), v.parse::<f64>().expect("a number")))
        .collect()
}

async fn scrape(s: &Server) -> (String, BTreeMap<String, f64>) {
    let r = reqwest::get(format!("{}/metrics", s.base)).await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    let text = r.text().await.unwrap();
    let c = counters(&text);
    (text, c)
}

/// The scenario, the same on every backend and front door: returns the action to follow.
async fn scenario(s: &Server, t: &Api) -> String {
    // Plans: two executable orders, one too large (not executable), one cancel.
    let a = t.post("/actions/plan", &order(1)).await;
    let b = t.post("/actions/plan", &order(1)).await;
    let big = t.post("/actions/plan", &order(900_000)).await;
    assert_eq!(
        (a["executable"].clone(), big["executable"].clone()),
        (json!(true), json!(false))
    );
    let cancel = t
        .post(
            "/actions/plan",
            &json!({"action_type": "order.cancel", "requested_by": "op-energy-trader",
                    "payload": {"account_id": "ACC-1", "order_id": "ORD-1003"}}),
        )
        .await;
    assert_eq!(cancel["executable"], true, "{:?}", cancel.body);
    // Queued, then the same request again: a duplicate.
    let q = t.execute(&a, "m-1").await;
    assert_eq!(q.status, 202, "{:?}", q.body);
    assert_eq!(t.execute(&a, "m-1").await.status, 200);
    // Rejections, one per code.
    let codes = |r: &Resp| r.code().to_string();
    assert_eq!(codes(&t.execute(&a, "m-2").await), "plan_already_executed");
    assert_eq!(codes(&t.execute(&b, "m-1").await), "idempotency_key_reused");
    assert_eq!(
        codes(
            &t.execute_with(b["plan_id"].as_str().unwrap(), "x.y.z", "m-3")
                .await
        ),
        "token_invalid"
    );
    // (A token is verified before the plan is looked up: none is sent here.)
    let unknown = json!({"plan_id": "pln_nope", "idempotency_key": "m-5",
                         "requested_by": "op-energy-trader"});
    assert_eq!(
        codes(&t.post("/actions/execute", &unknown).await),
        "plan_not_found"
    );
    s.cli(&["rollout", "order.cancel", "plan_only"]);
    assert_eq!(codes(&t.execute(&cancel, "m-6").await), "action_disabled");
    s.cli(&[
        "kill-switch",
        "engage",
        "--reason",
        "metrics drill",
        "--keep-working",
    ]);
    assert_eq!(codes(&t.execute(&b, "m-7").await), "kill_switch_engaged");
    // That rejection closed plan b: it cannot be executed any more.
    assert_eq!(codes(&t.execute(&b, "m-4").await), "plan_not_executable");
    // A request that is not an execute decision: the HTTP metrics only.
    assert_eq!(t.post("/actions/execute", &json!({})).await.status, 400);
    q["action_id"].as_str().unwrap().to_string()
}

/// What the scenario leaves, with `function` the label set's prefix (none locally).
fn expected() -> Vec<(&'static str, f64)> {
    vec![
        (
            r#"airlock_plan_requests_total{action_type="order.submit.cl",executable="true"}"#,
            2.0,
        ),
        (
            r#"airlock_plan_requests_total{action_type="order.submit.cl",executable="false"}"#,
            1.0,
        ),
        (
            r#"airlock_plan_requests_total{action_type="order.cancel",executable="true"}"#,
            1.0,
        ),
        (
            r#"airlock_execute_requests_total{action_type="order.submit.cl",outcome="queued"}"#,
            1.0,
        ),
        (
            r#"airlock_execute_requests_total{action_type="order.submit.cl",outcome="duplicate"}"#,
            1.0,
        ),
        (
            r#"airlock_execute_requests_total{action_type="order.submit.cl",outcome="rejected"}"#,
            5.0,
        ),
        (
            r#"airlock_execute_requests_total{action_type="order.cancel",outcome="rejected"}"#,
            1.0,
        ),
        (
            r#"airlock_execute_requests_total{action_type="unknown",outcome="rejected"}"#,
            1.0,
        ),
        (
            r#"airlock_execute_rejections_total{action_type="order.submit.cl",code="plan_already_executed"}"#,
            1.0,
        ),
        (
            r#"airlock_execute_rejections_total{action_type="order.submit.cl",code="idempotency_key_reused"}"#,
            1.0,
        ),
        (
            r#"airlock_execute_rejections_total{action_type="order.submit.cl",code="token_invalid"}"#,
            1.0,
        ),
        (
            r#"airlock_execute_rejections_total{action_type="order.submit.cl",code="plan_not_executable"}"#,
            1.0,
        ),
        (
            r#"airlock_execute_rejections_total{action_type="order.submit.cl",code="kill_switch_engaged"}"#,
            1.0,
        ),
        (
            r#"airlock_execute_rejections_total{action_type="order.cancel",code="action_disabled"}"#,
            1.0,
        ),
        (
            r#"airlock_execute_rejections_total{action_type="unknown",code="plan_not_found"}"#,
            1.0,
        ),
    ]
}

both!(the_scenario_leaves_exact_counters);
async fn the_scenario_leaves_exact_counters(b: Backend) {
    let s = Server::with_workers(b, &[]);
    let t = s.trader();
    let action = scenario(&s, &t).await;
    // The worker ran the queued order (the kill switch came after it was accepted, so the
    // worker's last check may refuse it: either way it is one message, handled once).
    let settled = t.settled(&action).await;
    let (text, c) = scrape(&s).await;
    for (k, v) in expected() {
        assert_eq!(c.get(k), Some(&v), "{k}\n{text}");
    }
    // Nothing else was counted as a plan or an execute decision.
    let plans: f64 = c
        .iter()
        .filter(|(k, _)| k.starts_with("airlock_plan_requests_total"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(plans, 4.0, "{text}");
    let executes: f64 = c
        .iter()
        .filter(|(k, _)| k.starts_with("airlock_execute_requests_total"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(executes, 9.0, "{text}");
    let outcome = if settled["status"] == "succeeded" {
        "succeeded"
    } else {
        "failed"
    };
    assert_eq!(
        c.get(&format!(
            r#"airlock_worker_messages_total{{queue="orders",outcome="{outcome}"}}"#
        )),
        Some(&1.0),
        "{text}"
    );
    assert_eq!(
        c.get("airlock_order_latency_seconds_count"),
        Some(&1.0),
        "{text}"
    );
    assert_eq!(c.get("airlock_kill_switch_engaged"), Some(&1.0), "{text}");
    s.cli(&["kill-switch", "release"]);
    let (text, c) = scrape(&s).await;
    assert_eq!(c.get("airlock_kill_switch_engaged"), Some(&0.0), "{text}");
    assert_eq!(
        c.get(r#"airlock_queue_depth{queue="orders"}"#),
        Some(&0.0),
        "{text}"
    );
    assert_eq!(
        c.get(r#"airlock_dead_letters{queue="orders"}"#),
        Some(&0.0),
        "{text}"
    );
    // Per endpoint latency, by route template and status, never a raw id.
    let execute_202 = format!(
        r#"airlock_http_request_duration_seconds_count{{route="{BASE}/actions/execute",method="POST",status="202"}}"#
    );
    assert_eq!(c.get(&execute_202), Some(&1.0), "{text}");
    assert!(
        text.contains(&format!(r#"route="{BASE}/actions/{{action_id}}""#)),
        "{text}"
    );
    assert!(!text.contains("act_"), "an id in a label: {text}");
    assert!(!text.contains("pln_"), "an id in a label: {text}");

    // `airlock stats` reads the same page.
    let out = s.cli(&[
        "stats",
        "--url",
        &format!("{}/metrics", s.base),
        "--window",
        "0",
    ]);
    assert!(
        out.contains(&format!("POST {BASE}/actions/execute")),
        "{out}"
    );
    assert!(
        out.contains("executes: 9 (1 queued, 1 duplicate, 7 rejected); acceptance rate 11.1%"),
        "{out}"
    );
    assert!(out.contains("plan_not_found 1"), "{out}");
    assert!(out.contains("kill switch: released"), "{out}");
}

/// MCP tool calls are counted by tool and outcome.
#[tokio::test]
async fn mcp_tool_calls_are_counted() {
    let s = Server::start_on(Backend::Embedded, &[("AIRLOCK_NOW", MARKET_OPEN)]);
    let t = s.trader();
    let call = |id: u32, name: &str, args: Value| json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": args}});
    let http = reqwest::Client::new();
    for body in [
        call(1, "list_accounts", json!({})),
        call(2, "list_accounts", json!({"limit": 0})),
        call(3, "get_action", json!({"action_id": "act_nope"})),
    ] {
        let r = http
            .post(format!("{}/mcp", t.base))
            .bearer_auth(&t.service)
            .header("x-operator-token", &t.operator)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-06-18")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let (text, c) = scrape(&s).await;
    assert_eq!(
        c.get(r#"airlock_mcp_tool_calls_total{tool="list_accounts",outcome="ok"}"#),
        Some(&1.0),
        "{text}"
    );
    assert_eq!(
        c.get(r#"airlock_mcp_tool_calls_total{tool="list_accounts",outcome="error"}"#),
        Some(&1.0),
        "{text}"
    );
    assert_eq!(
        c.get(r#"airlock_mcp_tool_calls_total{tool="get_action",outcome="error"}"#),
        Some(&1.0),
        "{text}"
    );
}

/// `/metrics` carries no tokens: never on a listener that is not loopback.
#[test]
fn metrics_refuse_a_public_listener() {
    let dir = temp_state_dir();
    let out = std::process::Command::new(airlock_tests::binary())
        .arg("--state-dir")
        .arg(&dir)
        .args([
            "serve",
            "--addr",
            "127.0.0.1:0",
            "--metrics-addr",
            "0.0.0.0:0",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("loopback"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// One EMF document, checked against the format's rules: `_aws.Timestamp` a number,
/// `CloudWatchMetrics` directives with a namespace, dimension sets naming top-level text
/// members, and metrics naming top-level numbers or `Values`/`Counts` arrays.
fn check_emf(doc: &Value) {
    let aws = &doc["_aws"];
    assert!(
        aws["Timestamp"]
            .as_i64()
            .is_some_and(|t| t > 1_600_000_000_000),
        "{doc}"
    );
    let directives = aws["CloudWatchMetrics"]
        .as_array()
        .expect("CloudWatchMetrics");
    assert!(!directives.is_empty());
    for d in directives {
        assert!(
            d["Namespace"].as_str().is_some_and(|n| !n.is_empty()),
            "{doc}"
        );
        for set in d["Dimensions"].as_array().expect("Dimensions") {
            let set = set.as_array().expect("a dimension set");
            assert!(set.len() <= 30, "{doc}");
            for k in set {
                let k = k.as_str().expect("a dimension name");
                assert!(
                    doc[k].is_string(),
                    "dimension {k} is not a text member: {doc}"
                );
            }
        }
        for m in d["Metrics"].as_array().expect("Metrics") {
            let name = m["Name"].as_str().expect("a metric name");
            let unit = m["Unit"].as_str().unwrap_or("None");
            assert!(["Count", "Seconds", "None"].contains(&unit), "{doc}");
            let v = &doc[name];
            let ok = v.is_number()
                || (v["Values"]
                    .as_array()
                    .is_some_and(|a| a.iter().all(Value::is_number))
                    && v["Counts"].as_array().map(Vec::len)
                        == v["Values"].as_array().map(Vec::len));
            assert!(ok, "metric {name} has no value: {doc}");
        }
    }
}

/// Sums the EMF counters of `log` by `name{labels}` (labels sorted as the Prometheus page
/// prints them: in the order recorded, which the test's keys follow).
fn emf_counters(log: &str) -> (Vec<Value>, BTreeMap<String, f64>) {
    let docs: Vec<Value> = log
        .lines()
        .filter(|l| l.starts_with("{\"_aws\""))
        .map(|l| serde_json::from_str(l).expect("EMF is JSON"))
        .collect();
    let mut sums = BTreeMap::new();
    for d in &docs {
        check_emf(d);
        let m = &d["_aws"]["CloudWatchMetrics"][0];
        let name = m["Metrics"][0]["Name"].as_str().unwrap();
        let full: Vec<&str> = m["Dimensions"][0]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_str().unwrap())
            .filter(|k| *k != "function")
            .collect();
        let labels: Vec<String> = full
            .iter()
            .map(|k| format!("{k}=\"{}\"", d[*k].as_str().unwrap()))
            .collect();
        let key = if labels.is_empty() {
            name.to_string()
        } else {
            format!("{name}{{{}}}", labels.join(","))
        };
        let v = match &d[name] {
            Value::Number(n) => n.as_f64().unwrap(),
            h => h["Counts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c.as_f64().unwrap())
                .sum(),
        };
        *sums.entry(key).or_insert(0.0) += v;
    }
    (docs, sums)
}

/// The plan and execute Lambdas (real binaries, runtime emulator, embedded state) print
/// EMF after each invocation with the same values the scenario leaves on `/metrics`.
#[test]
fn lambdas_print_the_same_values_as_emf() {
    let state = airlock_tests::lambda::TradingState::new();
    let dir = &state.dir;
    let emu = LambdaEmulator::start();
    // The functions read the system clock: at a trading hour through libfaketime.
    let fenv = embedded_function_env(
        dir,
        &[
            ("AIRLOCK_METRICS", "emf"),
            ("AIRLOCK_METRICS_NAMESPACE", "AirlockTest"),
            IGNORE_STAGE_ENV,
        ],
    );
    let mut plan = emu.spawn_ready("plan", &fenv);
    // One runtime API per function: both would otherwise take each other's invocations.
    let emu2 = LambdaEmulator::start();
    let mut execute = emu2.spawn_ready("execute", &fenv);
    let h = state.json_headers();
    let post = |f: &mut airlock_tests::lambda::FunctionProcess, path: &str, body: Value| {
        let ev = apigw_post_event(path, &h, &body);
        let resp = f.invoke(ev, Duration::from_secs(30)).unwrap();
        response_parts(&resp)
    };
    let (_, a) = post(&mut plan, "/actions/plan", order(1));
    let (status, big) = post(&mut plan, "/actions/plan", order(900_000));
    assert_eq!(status, 200, "{big}");
    assert_eq!(a["executable"], true, "{a}");
    let exec = |p: &Value, key: &str| {
        json!({"plan_id": p["plan_id"], "confirmation_token": p["confirmation_token"],
               "idempotency_key": key, "requested_by": "op-energy-trader"})
    };
    assert_eq!(big["executable"], false, "{big}");
    let r = post(&mut execute, "/actions/execute", exec(&a, "e-1"));
    assert_eq!(r.0, 202, "{}", r.1);
    assert_eq!(
        post(&mut execute, "/actions/execute", exec(&a, "e-1")).0,
        200
    );
    let r = post(&mut execute, "/actions/execute", exec(&a, "e-2"));
    assert_eq!(r.1["error"]["code"], "plan_already_executed", "{}", r.1);
    let (plan_docs, plans) = emf_counters(&plan.log());
    let (exec_docs, execs) = emf_counters(&execute.log());
    assert_eq!(
        plans
            .get(r#"airlock_plan_requests_total{action_type="order.submit.cl",executable="true"}"#),
        Some(&1.0),
        "{plans:?}"
    );
    assert_eq!(
        plans.get(
            r#"airlock_plan_requests_total{action_type="order.submit.cl",executable="false"}"#
        ),
        Some(&1.0),
        "{plans:?}"
    );
    assert_eq!(
        execs.get(
            r#"airlock_execute_requests_total{action_type="order.submit.cl",outcome="queued"}"#
        ),
        Some(&1.0),
        "{execs:?}"
    );
    assert_eq!(
        execs.get(
            r#"airlock_execute_requests_total{action_type="order.submit.cl",outcome="duplicate"}"#
        ),
        Some(&1.0),
        "{execs:?}"
    );
    assert_eq!(execs.get(r#"airlock_execute_rejections_total{action_type="order.submit.cl",code="plan_already_executed"}"#), Some(&1.0), "{execs:?}");
    let route = format!(
        r#"airlock_http_request_duration_seconds{{route="{BASE}/actions/execute",method="POST",status="202"}}"#
    );
    assert_eq!(execs.get(&route), Some(&1.0), "{execs:?}");
    // One cold start per function, in the first invocation's flush.
    assert_eq!(
        plans.get("airlock_lambda_cold_starts_total"),
        Some(&1.0),
        "{plans:?}"
    );
    assert_eq!(
        execs.get("airlock_lambda_cold_starts_total"),
        Some(&1.0),
        "{execs:?}"
    );
    for d in plan_docs.iter().chain(&exec_docs) {
        assert_eq!(
            d["_aws"]["CloudWatchMetrics"][0]["Namespace"],
            "AirlockTest"
        );
        assert!(d["function"] == "plan" || d["function"] == "execute", "{d}");
    }
    drop(plan);
    drop(execute);
}
