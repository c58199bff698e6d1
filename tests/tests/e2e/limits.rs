//! What bounds one operator's load, on both backends: a plan waiting for its approval,
//! asked about again and again, is audited once per idempotency key (the repeats are
//! counted); plans have a per-operator rate limit like executes (429 `rate_limited`,
//! `Retry-After`), on the REST API and the MCP plan tools alike; MCP's `execute_plan` is
//! paced firm-wide as API Gateway paces `POST /actions/execute`. The holds of MCP's
//! `execute_plan` are in `mcp.rs`.

use airlock_tests::{both, Api, Backend, Server, MARKET_OPEN};
use serde_json::{json, Value};

/// `name{labels}` -> value, from `GET /metrics`.
async fn counter(s: &Server, series: &str) -> f64 {
    let text = reqwest::get(format!("{}/metrics", s.base))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .filter_map(|l| l.rsplit_once(' '))
        .find(|(k, _)| *k == series)
        .map_or(0.0, |(_, v)| v.parse().expect("a number"))
}

fn approval_required_records(s: &Server, plan_id: &str, key: &str) -> usize {
    s.audit(plan_id)
        .iter()
        .filter(|r| {
            r["event"] == "execute"
                && r["reason_code"] == "approval_required"
                && r["idempotency_key"] == key
        })
        .count()
}

both!(a_plan_waiting_for_approval_is_audited_once_per_key);
async fn a_plan_waiting_for_approval_is_audited_once_per_key(b: Backend) {
    let s = Server::operator_mode_at_open(b);
    let t = s.trader();
    let p = t.plan_buy("CLF27", 1).await;
    assert_eq!(p["executable"], true, "{:?}", p.body);
    let pid = p["plan_id"].as_str().unwrap().to_string();
    let before = counter(
        &s,
        r#"airlock_audit_repeats_total{code="approval_required"}"#,
    )
    .await;
    const CALLS: usize = 30;
    for i in 0..CALLS {
        let r = t.execute_untokened(&pid, "k-waiting").await;
        assert_eq!(
            (r.status, r.code()),
            (409, "approval_required"),
            "call {i}: {:?}",
            r.body
        );
        assert!(r["approval"]["url"]
            .as_str()
            .is_some_and(|u| u.ends_with(&pid)));
    }
    assert_eq!(approval_required_records(&s, &pid, "k-waiting"), 1);
    // Another key is another request: audited once too.
    for _ in 0..3 {
        let r = t.execute_untokened(&pid, "k-other").await;
        assert_eq!(r.code(), "approval_required");
    }
    assert_eq!(approval_required_records(&s, &pid, "k-other"), 1);
    let after = counter(
        &s,
        r#"airlock_audit_repeats_total{code="approval_required"}"#,
    )
    .await;
    assert_eq!(
        after - before,
        (CALLS - 1 + 2) as f64,
        "the repeats are counted"
    );
    // The plan's trail: the plan and the two first refusals, nothing else.
    assert_eq!(s.audit(&pid).len(), 3, "{:?}", s.audit(&pid));
}

fn order(operator: &str, quantity: u32) -> Value {
    json!({
        "action_type": "order.submit.cl",
        "payload": { "account_id": "ACC-1", "symbol": "CLF27", "side": "buy", "quantity": quantity, "order_type": "market" },
        "requested_by": operator,
    })
}

both!(plans_are_rate_limited_per_operator);
async fn plans_are_rate_limited_per_operator(b: Backend) {
    let s = Server::start_on(
        b,
        &[
            ("AIRLOCK_NOW", MARKET_OPEN),
            ("AIRLOCK_PLAN_RATE_PER_MINUTE", "3"),
        ],
    );
    let t = s.trader();
    // A refused request is no plan and does not count.
    let bad = t.post("/actions/plan", &order("op-energy-trader", 0)).await;
    assert_eq!(bad.status, 400, "{:?}", bad.body);
    // A plan that cannot execute is stored, and counts.
    let big = t
        .post("/actions/plan", &order("op-energy-trader", 900_000))
        .await;
    assert_eq!(
        (big.status, &big["executable"]),
        (200, &json!(false)),
        "{:?}",
        big.body
    );
    for _ in 0..2 {
        let p = t.post("/actions/plan", &order("op-energy-trader", 1)).await;
        assert_eq!(p.status, 200, "{:?}", p.body);
    }
    let r = t.post("/actions/plan", &order("op-energy-trader", 1)).await;
    r.assert_error(429, "rate_limited");
    let wait: u64 = r
        .retry_after
        .as_deref()
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!((1..=60).contains(&wait), "Retry-After {wait}");
    assert_eq!(
        r.body.get("status"),
        None,
        "a plan refused is not an execute rejection"
    );
    assert!(r.message().contains("3 plans per minute"));
    // Over the limit, the window is read first: a bad body is refused the same way.
    let r = t.post("/actions/plan", &order("op-energy-trader", 0)).await;
    assert_eq!(r.code(), "rate_limited", "{:?}", r.body);
    // The MCP plan tools share the operator's window.
    let mcp = mcp_plan(&t).await;
    assert_eq!(mcp["isError"], true, "{mcp}");
    assert_eq!(
        mcp["structuredContent"]["error"]["code"], "rate_limited",
        "{mcp}"
    );
    // Another operator has a window of their own.
    let other = Api::new(
        &s,
        t.service.clone(),
        s.operator_token("op-energy-2", "trader", Some("energy")),
    );
    let p = other.post("/actions/plan", &order("op-energy-2", 1)).await;
    assert_eq!(p.status, 200, "{:?}", p.body);
}

/// `plan_cl_order` through MCP (2026-07-28): the JSON-RPC result.
async fn mcp_plan(t: &Api) -> Value {
    let args = json!({ "account_id": "ACC-1", "symbol": "CLF27", "side": "buy", "quantity": 1, "order_type": "market" });
    t.mcp_tool("plan_cl_order", args).await
}

// The firm-wide pace of MCP's `execute_plan` (`AIRLOCK_MCP_EXECUTE_RATE_PER_SECOND`,
// `AIRLOCK_MCP_EXECUTE_BURST`: the template sets API Gateway's execute throttle). Calls
// over it are refused before anything is read or written for them, whoever the operator;
// the REST route is not counted (API Gateway paces it).
both!(mcp_execute_plan_is_paced_firm_wide);
async fn mcp_execute_plan_is_paced_firm_wide(b: Backend) {
    // A burst of 2, then one call every 20 s: every call below comes inside the 20 s.
    let s = Server::start_on(
        b,
        &[
            ("AIRLOCK_NOW", MARKET_OPEN),
            ("AIRLOCK_MCP_EXECUTE_RATE_PER_SECOND", "0.05"),
            ("AIRLOCK_MCP_EXECUTE_BURST", "2"),
        ],
    );
    let t = s.trader();
    let other = Api::new(
        &s,
        t.service.clone(),
        s.operator_token("op-energy-2", "trader", Some("energy")),
    );
    let mut calls = Vec::new();
    for _ in 0..3 {
        calls.push((&t, t.plan_buy("CLF27", 1).await));
    }
    let theirs = other.post("/actions/plan", &order("op-energy-2", 1)).await;
    calls.push((&other, theirs));
    for (_, p) in &calls {
        assert_eq!(
            (p.status, &p["executable"]),
            (200, &json!(true)),
            "{:?}",
            p.body
        );
    }
    // Four calls at once, by two operators: the burst's two pass, whoever sends them (a
    // pace per operator would pass three).
    let results = futures_util::future::join_all(calls.iter().map(|(api, p)| {
        let args =
            json!({ "plan_id": p["plan_id"], "confirmation_token": p["confirmation_token"] });
        api.mcp_tool("execute_plan", args)
    }))
    .await;
    let mut refused = Vec::new();
    for ((_, p), r) in calls.iter().zip(&results) {
        if r["isError"] == true {
            let e = &r["structuredContent"]["error"];
            assert_eq!(e["code"], "rate_limited", "{r}");
            let message = e["message"].as_str().unwrap();
            assert!(
                message.contains("firm-wide 0.05 a second (burst 2)"),
                "{message}"
            );
            let wait: u64 = message
                .split("retry in ")
                .nth(1)
                .and_then(|m| m.split(' ').next())
                .and_then(|n| n.parse().ok())
                .expect("retry in N s");
            assert!((1..=20).contains(&wait), "{message}");
            refused.push(p);
        } else {
            assert_eq!(r["structuredContent"]["status"], "queued", "{r}");
        }
    }
    assert_eq!(refused.len(), 2, "{results:?}");
    // Nothing was read or written for a refused call: its plan has only its plan record,
    // and only the two admitted actions were queued.
    for p in &refused {
        let trail = s.audit(p["plan_id"].as_str().unwrap());
        assert_eq!(trail.len(), 1, "{trail:?}");
    }
    assert_eq!(s.queued_messages(), 2);
    // Still over the pace: refused again.
    let again = t
        .mcp_tool(
        "execute_plan",
        json!({ "plan_id": refused[0]["plan_id"], "confirmation_token": refused[0]["confirmation_token"] }),
    )
    .await;
    assert_eq!(again["structuredContent"]["error"]["code"], "rate_limited");
    // The REST route is another door, paced by API Gateway: not counted here.
    let mine = refused[0];
    let rest = if mine["plan_id"] == calls[3].1["plan_id"] {
        other
            .post(
                "/actions/execute",
                &json!({ "plan_id": mine["plan_id"], "confirmation_token": mine["confirmation_token"], "idempotency_key": "rest-1", "requested_by": "op-energy-2" }),
            )
            .await
    } else {
        t.execute(mine, "rest-1").await
    };
    assert_eq!(rest.status, 202, "{:?}", rest.body);
    assert_eq!(s.queued_messages(), 3);
}
