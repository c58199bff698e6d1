//! The kill switch pulls working orders, on both backends: engaging it queues a cancel of
//! every order at the broker (of every account, or of `--accounts`), each a real
//! `order.cancel` action audited as the kill switch's; `--keep-working` pulls nothing;
//! engaging twice queues nothing twice; orders still in the queue never reach the broker;
//! an order claimed for the broker, or at the broker but not yet recorded, when the switch
//! engages is stopped or pulled; `status` counts the cancels. `--flatten` closes open
//! positions with protected limits, once per engagement, reports a position without a
//! fresh price, cannot be imitated through plan and execute, and never reverses a position
//! that moved after its closing order was queued.

use std::time::{Duration, Instant};

use airlock_tests::{both, Api, Backend, Resp, Server, MARKET_OPEN};
use serde_json::{json, Value};

/// One line of `kill-switch engage`'s output: `pull ACC-1 ord_x: cancel queued (act_y)`.
#[derive(Debug, Clone)]
struct Pulled {
    account: String,
    order: String,
    outcome: String,
    action: String,
}

fn pulled(out: &str) -> Vec<Pulled> {
    out.lines()
        .filter_map(|l| l.strip_prefix("pull "))
        .map(|l| {
            let (account, rest) = l.split_once(' ').expect("account");
            let (order, rest) = rest.split_once(": ").expect("order");
            let (outcome, action) = rest.rsplit_once(" (").expect("action");
            Pulled {
                account: account.into(),
                order: order.into(),
                outcome: outcome.into(),
                action: action.trim_end_matches(')').into(),
            }
        })
        .collect()
}

fn engage(s: &Server, extra: &[&str]) -> (String, Vec<Pulled>) {
    let mut args = vec!["kill-switch", "engage", "--reason", "desk drill"];
    args.extend_from_slice(extra);
    let out = s.cli(&args);
    assert!(out.contains("ENGAGED"), "{out}");
    let p = pulled(&out);
    (out, p)
}

/// `kill-switch status`'s counts line: (pending, done, failed).
fn counts(s: &Server) -> (u32, u32, u32) {
    let out = s.cli(&["kill-switch", "status"]);
    let line = out
        .lines()
        .find(|l| l.starts_with("cancels: "))
        .unwrap_or_else(|| panic!("no counts in {out}"));
    let n = |k: &str| -> u32 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("{k} in {line}"))
            .parse()
            .unwrap()
    };
    (n("pending"), n("done"), n("failed"))
}

/// Waits until `status` shows no pending cancel; the counts then.
async fn counts_settled(s: &Server) -> (u32, u32, u32) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let c = counts(s);
        if c.0 == 0 || Instant::now() > deadline {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The paper broker's own view of an order (Null if it never reached the broker).
fn at_broker(s: &Server, account: &str, order: &str) -> Value {
    let book: Value = serde_json::from_str(&s.cli(&["broker-book", account])).unwrap();
    book["orders"][order].clone()
}

fn resting(account: &str) -> Value {
    json!({"account_id": account, "symbol": "CLF27", "side": "buy", "quantity": 1,
           "order_type": "limit", "limit_price": "66.00", "time_in_force": "gtc"})
}

fn market(account: &str) -> Value {
    json!({"account_id": account, "symbol": "CLF27", "side": "buy", "quantity": 1, "order_type": "market"})
}

async fn submit(t: &Api, payload: Value, key: &str, tool_call: &str) -> Resp {
    let p = t
        .post(
            "/actions/plan",
            &json!({"action_type": "order.submit.cl", "payload": payload, "requested_by": "op-energy-trader",
                    "chat_context": {"chat_session_id": "chat-ks", "tool_call_id": tool_call}}),
        )
        .await;
    assert_eq!(p["executable"], true, "{:?}", p.body);
    let e = t.execute(&p, key).await;
    assert_eq!(e.status, 202, "{:?}", e.body);
    e
}

fn order_id(r: &Resp) -> String {
    r["resource_refs"]["order_id"].as_str().unwrap().to_string()
}

fn action_id(r: &Resp) -> String {
    r["action_id"].as_str().unwrap().to_string()
}

/// A resting buy on each of ACC-1 and ACC-2, working at the broker (workers on).
async fn two_working(s: &Server, t: &Api) -> [String; 2] {
    let mut out = Vec::new();
    for acc in ["ACC-1", "ACC-2"] {
        let e = submit(t, resting(acc), &format!("rest-{acc}"), "call-rest").await;
        let a = t.settled(&action_id(&e)).await;
        assert_eq!(a["status"], "succeeded", "{:?}", a.body);
        let o = order_id(&e);
        assert_eq!(t.order(&o).await["status"], "working");
        assert_eq!(at_broker(s, acc, &o)["status"], "working");
        out.push(o);
    }
    [out[0].clone(), out[1].clone()]
}

/// The CLI expected to fail: its stderr.
fn cli_fails(s: &Server, args: &[&str]) -> String {
    let mut cmd = std::process::Command::new(airlock_tests::binary());
    cmd.arg("--state-dir")
        .arg(&s.state_dir)
        .args(args)
        .env_remove("AIRLOCK_NOW")
        .env("RUST_LOG", "warn");
    for (k, v) in s.cli_env() {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run airlock");
    assert!(!out.status.success(), "airlock {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).to_string()
}

both!(engaging_cancels_every_working_order_audited_as_the_kill_switch);
async fn engaging_cancels_every_working_order_audited_as_the_kill_switch(b: Backend) {
    let s = Server::with_workers(b, &[]);
    let t = s.trader();
    let [o1, o2] = two_working(&s, &t).await;
    let (out, pulls) = engage(&s, &[]);
    // The two resting orders and the demo's working and partly filled ones (ORD-1003 on
    // ACC-1, ORD-1004 on ACC-2), nothing else.
    let mut orders: Vec<&str> = pulls.iter().map(|p| p.order.as_str()).collect();
    orders.sort();
    let mut expected = vec![o1.as_str(), o2.as_str(), "ORD-1003", "ORD-1004"];
    expected.sort();
    assert_eq!(orders, expected, "{out}");
    assert!(pulls.iter().all(|p| p.outcome == "cancel queued"), "{out}");
    for p in &pulls {
        let a = t.settled(&p.action).await;
        assert_eq!(a["status"], "succeeded", "{p:?}: {:?}", a.body);
        assert_eq!(a["action_type"], "order.cancel");
        assert_eq!(a["resource_refs"]["order_id"], p.order.as_str());
        assert_eq!(t.order(&p.order).await["status"], "cancelled", "{p:?}");
    }
    // Cancelled at the broker too.
    assert_eq!(at_broker(&s, "ACC-1", &o1)["status"], "cancelled");
    assert_eq!(at_broker(&s, "ACC-2", &o2)["status"], "cancelled");
    // Audited as the kill switch's, under its engagement.
    let status = s.cli(&["kill-switch", "status"]);
    let engagement = status
        .lines()
        .find_map(|l| l.strip_prefix("last engagement "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("{status}"))
        .to_string();
    assert!(status.contains("reason: desk drill"), "{status}");
    let trail = s.audit(&engagement);
    let engaged = trail
        .iter()
        .find(|r| r["event"] == "kill_switch" && r["decision"] == "engaged")
        .unwrap_or_else(|| panic!("{trail:?}"));
    assert!(
        engaged["operator_id"].as_str().unwrap().starts_with("cli:"),
        "{engaged}"
    );
    for p in &pulls {
        let queued = trail
            .iter()
            .find(|r| r["action_id"] == p.action.as_str() && r["decision"] == "queued")
            .unwrap_or_else(|| panic!("{p:?} in {trail:?}"));
        assert_eq!(queued["event"], "kill_switch");
        assert_eq!(queued["reason_code"], "kill_switch");
        assert_eq!(queued["service_principal"], "kill-switch");
        assert_eq!(queued["order_id"], p.order.as_str());
        assert!(
            queued["operator_id"]
                .as_str()
                .unwrap()
                .starts_with("kill-switch:cli:"),
            "{queued}"
        );
    }
    assert_eq!(counts_settled(&s).await, (0, 4, 0));
    // New orders are still stopped.
    let blocked = t.plan_buy("CLF27", 1).await;
    assert_eq!(blocked["executable"], false);
}

both!(accounts_pulls_only_those_accounts_and_an_unknown_one_changes_nothing);
async fn accounts_pulls_only_those_accounts_and_an_unknown_one_changes_nothing(b: Backend) {
    let s = Server::with_workers(b, &[]);
    let t = s.trader();
    let [o1, o2] = two_working(&s, &t).await;
    let err = cli_fails(&s, &["kill-switch", "engage", "--accounts", "ACC-2,ACC-9"]);
    assert!(err.contains("no account ACC-9"), "{err}");
    assert!(
        s.cli(&["kill-switch", "status"]).contains("released"),
        "an unknown account engages nothing"
    );
    let (out, pulls) = engage(&s, &["--accounts", "ACC-2"]);
    assert!(pulls.iter().all(|p| p.account == "ACC-2"), "{out}");
    let mut orders: Vec<&str> = pulls.iter().map(|p| p.order.as_str()).collect();
    orders.sort();
    let mut expected = vec![o2.as_str(), "ORD-1004"];
    expected.sort();
    assert_eq!(orders, expected, "{out}");
    for p in &pulls {
        assert_eq!(t.settled(&p.action).await["status"], "succeeded");
    }
    assert_eq!(t.order(&o2).await["status"], "cancelled");
    assert_eq!(at_broker(&s, "ACC-2", &o2)["status"], "cancelled");
    // ACC-1's orders keep working.
    assert_eq!(t.order(&o1).await["status"], "working");
    assert_eq!(at_broker(&s, "ACC-1", &o1)["status"], "working");
    assert_eq!(t.order("ORD-1003").await["status"], "working");
    assert_eq!(counts_settled(&s).await, (0, 2, 0));
}

both!(keep_working_engages_without_pulling);
async fn keep_working_engages_without_pulling(b: Backend) {
    let s = Server::with_workers(b, &[]);
    let t = s.trader();
    let [o1, o2] = two_working(&s, &t).await;
    let (out, pulls) = engage(&s, &["--keep-working"]);
    assert!(pulls.is_empty(), "{out}");
    assert!(out.contains("working orders kept"), "{out}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(s.queued_messages(), 0);
    for (acc, o) in [("ACC-1", &o1), ("ACC-2", &o2)] {
        assert_eq!(t.order(o).await["status"], "working");
        assert_eq!(at_broker(&s, acc, o)["status"], "working");
    }
    assert_eq!(counts(&s), (0, 0, 0));
    // Engaging again without the flag, in the same engagement, pulls them.
    let (out, pulls) = engage(&s, &[]);
    assert_eq!(pulls.len(), 4, "{out}");
    assert_eq!(counts_settled(&s).await, (0, 4, 0));
}

both!(engaging_twice_queues_no_duplicate_cancels);
async fn engaging_twice_queues_no_duplicate_cancels(b: Backend) {
    let s = Server::with_workers(b, &[]);
    let t = s.trader();
    let [o1, o2] = two_working(&s, &t).await;
    // Workers off: the cancels stay in the queue.
    let s = s.crash().start(&[("AIRLOCK_NOW", MARKET_OPEN)]);
    let (_, first) = engage(&s, &[]);
    assert_eq!(first.len(), 4);
    assert_eq!(s.queued_messages(), 4);
    assert_eq!(counts(&s), (4, 0, 0));
    let (out, again) = engage(&s, &[]);
    assert!(
        again.iter().all(|p| p.outcome == "cancel already queued"),
        "{out}"
    );
    let ids = |p: &[Pulled]| {
        let mut v: Vec<String> = p.iter().map(|p| p.action.clone()).collect();
        v.sort();
        v
    };
    assert_eq!(ids(&first), ids(&again), "the same actions");
    assert_eq!(s.queued_messages(), 4, "nothing queued twice");
    assert_eq!(counts(&s), (4, 0, 0));
    // Workers on: each order is cancelled once.
    let s = s.crash().start(&[
        ("AIRLOCK_NOW", MARKET_OPEN),
        ("AIRLOCK_WORKERS", "on"),
        ("AIRLOCK_WORKER_RETRY_MS", "100"),
    ]);
    assert_eq!(counts_settled(&s).await, (0, 4, 0));
    let t = s.trader();
    for (acc, o) in [("ACC-1", &o1), ("ACC-2", &o2)] {
        assert_eq!(t.order(o).await["status"], "cancelled");
        assert_eq!(at_broker(&s, acc, o)["status"], "cancelled");
    }
}

both!(orders_still_in_the_queue_never_reach_the_broker);
async fn orders_still_in_the_queue_never_reach_the_broker(b: Backend) {
    // Workers off: two orders accepted and queued, then the switch engaged.
    let s = Server::start_on(b, &[("AIRLOCK_NOW", MARKET_OPEN)]);
    let t = s.trader();
    let a1 = submit(&t, market("ACC-1"), "q-1", "call-q-1").await;
    let a2 = submit(&t, resting("ACC-2"), "q-2", "call-q-2").await;
    let (out, pulls) = engage(&s, &[]);
    // Only the demo's orders are at the broker; the queued ones are not listed.
    assert!(
        pulls
            .iter()
            .all(|p| p.order != order_id(&a1) && p.order != order_id(&a2)),
        "{out}"
    );
    let s = s.crash().start(&[
        ("AIRLOCK_NOW", MARKET_OPEN),
        ("AIRLOCK_WORKERS", "on"),
        ("AIRLOCK_WORKER_RETRY_MS", "100"),
    ]);
    let t = s.trader();
    for (acc, e) in [("ACC-1", &a1), ("ACC-2", &a2)] {
        let a = t.settled(&action_id(e)).await;
        assert_eq!(a["status"], "failed", "{:?}", a.body);
        let error = a["error"].as_str().unwrap();
        assert!(error.starts_with("kill_switch_engaged: "), "{error}");
        assert_eq!(t.order(&order_id(e)).await["status"], "rejected");
        assert_eq!(at_broker(&s, acc, &order_id(e)), Value::Null, "never sent");
    }
}

both!(an_order_claimed_for_the_broker_when_the_switch_engages_never_works);
async fn an_order_claimed_for_the_broker_when_the_switch_engages_never_works(b: Backend) {
    // `worker.slow`: the order is claimed (`submitted`), then its worker waits 6 s before
    // its gate and the broker. The switch engages in between.
    let s = Server::with_workers(
        b,
        &[
            ("AIRLOCK_FAILPOINTS", "worker.slow"),
            ("AIRLOCK_WORKER_RETRY_MS", "1000"),
        ],
    );
    let t = s.trader();
    let e = submit(&t, resting("ACC-1"), "slow-1", "slow").await;
    let o = order_id(&e);
    let deadline = Instant::now() + Duration::from_secs(20);
    // The claim came after the last look that did not see it: its gate comes 6 s later.
    let mut not_yet = Instant::now();
    loop {
        let looked = Instant::now();
        if t.order(&o).await["status"] == "submitted" {
            break;
        }
        not_yet = looked;
        assert!(Instant::now() < deadline, "the order was never claimed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (out, pulls) = engage(&s, &[]);
    let before_the_gate = Instant::now() < not_yet + Duration::from_secs(6);
    let pull = pulls.iter().find(|p| p.order == o).cloned();
    let a = t.settled(&action_id(&e)).await;
    if before_the_gate {
        // The switch was engaged and the orders listed before the worker's gate: the
        // claimed order was listed, and the gate refused it.
        let pull = pull.unwrap_or_else(|| panic!("the claimed order was listed: {out}"));
        assert_eq!(a["status"], "failed", "{:?}", a.body);
        assert!(
            a["error"]
                .as_str()
                .unwrap()
                .starts_with("kill_switch_engaged: "),
            "{:?}",
            a.body
        );
        assert_eq!(t.order(&o).await["status"], "rejected");
        assert_eq!(at_broker(&s, "ACC-1", &o), Value::Null, "never sent");
        // Its cancel found nothing left to cancel.
        let c = t.settled(&pull.action).await;
        assert_eq!(c["status"], "failed", "{:?}", c.body);
        assert!(
            c["error"].as_str().unwrap().contains("rejected"),
            "{:?}",
            c.body
        );
        let status = s.cli(&["kill-switch", "status"]);
        assert!(
            status.contains(&format!("failed {o} ({})", pull.action)),
            "{status}"
        );
        assert_eq!(counts_settled(&s).await, (0, 2, 1));
    } else {
        // A slow engage (a loaded machine): the gate ran while it was under way, and
        // either refused the order (engaged before it) or let it through (then it was
        // listed, and its cancel, retried until the submission settled, pulled it).
        eprintln!("the engage ended after the worker's gate: {out}");
        if let Some(p) = &pull {
            t.settled(&p.action).await;
        }
        let order = t.order(&o).await["status"].clone();
        assert!(order == "rejected" || order == "cancelled", "{order}");
        let broker = at_broker(&s, "ACC-1", &o);
        assert!(
            broker == Value::Null || broker["status"] == "cancelled",
            "{broker}"
        );
    }
}

both!(an_order_at_the_broker_but_not_yet_recorded_is_pulled);
async fn an_order_at_the_broker_but_not_yet_recorded_is_pulled(b: Backend) {
    // `worker.after_broker`: the broker accepted the order, and its worker died before
    // recording it; Airlock still shows it `submitted`. The switch engages meanwhile.
    let s = Server::with_workers(b, &[("AIRLOCK_FAILPOINTS", "worker.after_broker")]);
    let t = s.trader();
    let e = submit(&t, resting("ACC-1"), "late-1", "call-late-1").await;
    let o = order_id(&e);
    let stack = s.wait_exit(Duration::from_secs(20));
    let s = stack.start(&[("AIRLOCK_NOW", MARKET_OPEN)]);
    assert_eq!(at_broker(&s, "ACC-1", &o)["status"], "working");
    assert_eq!(s.trader().order(&o).await["status"], "submitted");
    let (out, pulls) = engage(&s, &[]);
    let pull = pulls
        .iter()
        .find(|p| p.order == o)
        .unwrap_or_else(|| panic!("the submitted order was listed: {out}"))
        .clone();
    // Workers on: the submission is recorded (the broker has it), the cancel pulls it.
    let s = s.crash().start(&[
        ("AIRLOCK_NOW", MARKET_OPEN),
        ("AIRLOCK_WORKERS", "on"),
        ("AIRLOCK_WORKER_RETRY_MS", "200"),
        ("AIRLOCK_WORKER_VISIBILITY_MS", "1000"),
    ]);
    let t = s.trader();
    let c = t.settled(&pull.action).await;
    assert_eq!(c["status"], "succeeded", "{:?}", c.body);
    assert_eq!(at_broker(&s, "ACC-1", &o)["status"], "cancelled");
    let deadline = Instant::now() + Duration::from_secs(30);
    while t.order(&o).await["status"] != "cancelled" {
        assert!(Instant::now() < deadline, "{:?}", t.order(&o).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// `--flatten`: a closing order of every open position, off by default.

/// One line of `kill-switch engage --flatten`'s output:
/// `flatten ACC-1 CLF27 +3: sell 3 limit 67.90 queued (act_y)`.
#[derive(Debug, Clone)]
struct Flat {
    account: String,
    symbol: String,
    position: i64,
    outcome: String,
    action: Option<String>,
}

fn flattened(out: &str) -> Vec<Flat> {
    out.lines()
        .filter_map(|l| l.strip_prefix("flatten "))
        .map(|l| {
            let (head, rest) = l.split_once(": ").expect("head");
            let mut h = head.split(' ');
            let (account, symbol, position) = (
                h.next().unwrap().to_string(),
                h.next().unwrap().to_string(),
                h.next().unwrap().parse().expect("position"),
            );
            let (outcome, action) = match rest.rsplit_once(" (act_") {
                Some((o, a)) if !rest.starts_with("NOT FLATTENED") => (
                    o.to_string(),
                    Some(format!("act_{}", a.trim_end_matches(')'))),
                ),
                _ => (rest.to_string(), None),
            };
            Flat {
                account,
                symbol,
                position,
                outcome,
                action,
            }
        })
        .collect()
}

/// `kill-switch engage` with `extra`, whether it failed or not: (success, stdout, stderr).
fn engage_any(s: &Server, extra: &[&str]) -> (bool, String, String) {
    let mut cmd = std::process::Command::new(airlock_tests::binary());
    cmd.arg("--state-dir")
        .arg(&s.state_dir)
        .args(["kill-switch", "engage", "--reason", "flatten drill"])
        .args(extra)
        .env_remove("AIRLOCK_NOW")
        .env("RUST_LOG", "warn");
    for (k, v) in s.cli_env() {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run airlock");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(stdout.contains("ENGAGED"), "{stdout}");
    (
        out.status.success(),
        stdout,
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// `kill-switch engage --flatten` expected to succeed: its closing orders.
fn flatten(s: &Server, extra: &[&str]) -> (String, Vec<Flat>) {
    let mut args = vec!["--flatten"];
    args.extend_from_slice(extra);
    let (ok, out, err) = engage_any(s, &args);
    assert!(ok, "{out}\n{err}");
    let f = flattened(&out);
    (out, f)
}

/// `kill-switch status`'s closing orders line: (pending, done, failed).
fn flattening(s: &Server) -> (u32, u32, u32) {
    let out = s.cli(&["kill-switch", "status"]);
    let line = out
        .lines()
        .find(|l| l.starts_with("flattening: "))
        .unwrap_or_else(|| panic!("no closing orders in {out}"));
    let n = |k: &str| -> u32 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("{k} in {line}"))
            .parse()
            .unwrap()
    };
    (n("pending"), n("done"), n("failed"))
}

async fn flattening_settled(s: &Server) -> (u32, u32, u32) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let c = flattening(s);
        if c.0 == 0 || Instant::now() > deadline {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn find<'a>(f: &'a [Flat], account: &str, symbol: &str) -> &'a Flat {
    f.iter()
        .find(|f| f.account == account && f.symbol == symbol)
        .unwrap_or_else(|| panic!("no {account} {symbol} in {f:?}"))
}

/// A closing order's action once settled, its order, and the broker's view of the order.
async fn closing_order(s: &Server, t: &Api, action: &str) -> (Resp, Value, Value) {
    let a = t.settled(action).await;
    let o = a["resource_refs"]["order_id"].as_str().unwrap().to_string();
    let order = t.order(&o).await;
    let account = order["account_id"].as_str().unwrap_or("ACC-1").to_string();
    (a, order.clone(), at_broker(s, &account, &o))
}

both!(flatten_closes_a_long_and_a_short_position_with_protected_limits);
async fn flatten_closes_a_long_and_a_short_position_with_protected_limits(b: Backend) {
    let s = Server::with_workers(b, &[]);
    let t = s.trader();
    // The demo: ACC-1 long 3 CLF27 (reference 68.40), short 2 CLG27 (68.28).
    assert_eq!(t.position("ACC-1", "CLF27").await, 3);
    assert_eq!(t.position("ACC-1", "CLG27").await, -2);
    // Without --flatten: no closing order, positions untouched.
    let (out, _) = engage(&s, &["--accounts", "ACC-1"]);
    assert!(flattened(&out).is_empty(), "{out}");
    assert!(!out.contains("open positions"), "{out}");
    assert_eq!(counts_settled(&s).await, (0, 1, 0), "ORD-1003 pulled");
    assert_eq!(flattening(&s), (0, 0, 0));
    assert_eq!(t.position("ACC-1", "CLF27").await, 3);
    assert_eq!(t.position("ACC-1", "CLG27").await, -2);
    // With it (the same engagement): one closing order per position, protected by the
    // policy's market_protection_points (0.50) from the reference price.
    let (out, f) = flatten(&s, &["--accounts", "ACC-1", "--keep-working"]);
    assert_eq!(f.len(), 2, "{out}");
    let long = find(&f, "ACC-1", "CLF27");
    assert_eq!(long.position, 3);
    assert_eq!(long.outcome, "sell 3 limit 67.90 queued", "{out}");
    let short = find(&f, "ACC-1", "CLG27");
    assert_eq!(short.position, -2);
    assert_eq!(short.outcome, "buy 2 limit 68.78 queued", "{out}");
    assert!(
        out.contains(
            "open positions: 2 (2 closing order(s) queued now, 0 queued before, 0 not flattened)"
        ),
        "{out}"
    );
    for (flat, side, qty, limit) in [(long, "sell", 3, "67.90"), (short, "buy", 2, "68.78")] {
        let action = flat.action.as_deref().unwrap();
        let (a, order, broker) = closing_order(&s, &t, action).await;
        assert_eq!(a["status"], "succeeded", "{:?}", a.body);
        assert_eq!(a["action_type"], "order.submit.cl");
        assert_eq!(order["side"], side, "{order}");
        assert_eq!(order["quantity"], qty, "{order}");
        assert_eq!(order["order_type"], "limit", "{order}");
        assert_eq!(order["limit_price"], limit, "{order}");
        assert_eq!(order["time_in_force"], "day", "{order}");
        assert_eq!(order["status"], "filled", "{order}");
        // The broker got the protected limit, and it filled.
        assert_eq!(broker["order_type"], "limit", "{broker}");
        assert_eq!(broker["limit_price"], limit, "{broker}");
        assert_eq!(broker["status"], "filled", "{broker}");
    }
    assert_eq!(t.position("ACC-1", "CLF27").await, 0);
    assert_eq!(t.position("ACC-1", "CLG27").await, 0);
    assert_eq!(flattening_settled(&s).await, (0, 2, 0));
    // Audited as the kill switch's, under its engagement.
    let status = s.cli(&["kill-switch", "status"]);
    let engagement = status
        .lines()
        .find_map(|l| l.strip_prefix("last engagement "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .to_string();
    let trail = s.audit(&engagement);
    let queued = trail
        .iter()
        .find(|r| r["action_id"] == long.action.as_deref().unwrap() && r["decision"] == "queued")
        .unwrap_or_else(|| panic!("{trail:?}"));
    assert_eq!(queued["service_principal"], "kill-switch");
    assert_eq!(queued["action_type"], "order.submit.cl");
    assert!(
        queued["operator_id"]
            .as_str()
            .unwrap()
            .starts_with("kill-switch:cli:"),
        "{queued}"
    );
    assert_eq!(
        queued["reason"],
        "the kill switch flattens ACC-1 CLF27 (position +3): sell 3 as a limit at 67.90 \
         (the reference price 68.40 less market_protection_points 0.50)",
        "{queued}"
    );
    // Flat now: engaging again queues nothing; other accounts were not touched.
    let (out, f) = flatten(&s, &["--accounts", "ACC-1"]);
    assert!(f.is_empty(), "{out}");
    assert_eq!(t.position("ACC-2", "CLF27").await, 10);
    // New orders are still stopped.
    assert_eq!(t.plan_buy("CLF27", 1).await["executable"], false);
}

both!(engaging_twice_with_flatten_queues_no_closing_order_twice);
async fn engaging_twice_with_flatten_queues_no_closing_order_twice(b: Backend) {
    // Workers off: the closing orders wait in the queue.
    let s = Server::start_on(b, &[("AIRLOCK_NOW", MARKET_OPEN)]);
    let (_, first) = flatten(&s, &["--accounts", "ACC-1", "--keep-working"]);
    assert_eq!(first.len(), 2, "{first:?}");
    assert!(first
        .iter()
        .all(|f| f.outcome.ends_with(" queued") && !f.outcome.contains("already")));
    assert_eq!(s.queued_messages(), 2);
    assert_eq!(flattening(&s), (2, 0, 0));
    let (out, again) = flatten(&s, &["--accounts", "ACC-1", "--keep-working"]);
    assert!(
        again.iter().all(|f| f.outcome.ends_with(" already queued")),
        "{out}"
    );
    let ids = |f: &[Flat]| {
        let mut v: Vec<String> = f.iter().filter_map(|f| f.action.clone()).collect();
        v.sort();
        v
    };
    assert_eq!(ids(&first), ids(&again), "the same actions");
    assert_eq!(s.queued_messages(), 2, "nothing queued twice");
    // Every account now (ACC-1's again, found; ACC-2's and ACC-3's new).
    let (out, all) = flatten(&s, &["--keep-working"]);
    assert_eq!(all.len(), 4, "{out}");
    assert_eq!(s.queued_messages(), 4);
    // Workers on: each position is closed once.
    let s = s.crash().start(&[
        ("AIRLOCK_NOW", MARKET_OPEN),
        ("AIRLOCK_WORKERS", "on"),
        ("AIRLOCK_WORKER_RETRY_MS", "100"),
    ]);
    assert_eq!(flattening_settled(&s).await, (0, 4, 0));
    let t = s.trader();
    assert_eq!(t.position("ACC-1", "CLF27").await, 0);
    assert_eq!(t.position("ACC-1", "CLG27").await, 0);
    assert_eq!(t.position("ACC-2", "CLF27").await, 0);
    let head = Api::new(
        &s,
        s.service_token(),
        s.operator_token("op-head-trader", "head_trader", None),
    );
    assert_eq!(head.position("ACC-3", "CLH27").await, 0);
}

both!(a_position_without_a_fresh_price_is_reported_not_flattened);
async fn a_position_without_a_fresh_price_is_reported_not_flattened(b: Backend) {
    let s = Server::with_workers(b, &[]);
    // The default age limit (300 s; the stack's own policy turns it off).
    let file = s.state_dir.join("policy-flatten.json");
    std::fs::write(
        &file,
        json!({"version": "defaults", "confirmation": {"order.submit.cl": "token"}}).to_string(),
    )
    .unwrap();
    s.cli(&["policy", "set", &file.to_string_lossy()]);
    // CLG27's price was observed ten minutes before the clock; CLF27's is fresh.
    let mut env = s.cli_env();
    env.retain(|(k, _)| k != "AIRLOCK_NOW");
    env.push(("AIRLOCK_NOW".into(), "2026-11-23T14:50:00Z".into()));
    airlock_tests::cli(&s.state_dir, &env, &["prices", "CLG27", "68.28"]);
    s.cli(&["prices", "CLF27", "68.40"]);
    let (ok, out, err) = engage_any(&s, &["--flatten", "--accounts", "ACC-1", "--keep-working"]);
    assert!(!ok, "a position left open fails the command: {out}");
    assert!(
        err.contains("1 open position(s) were not flattened"),
        "{err}"
    );
    let f = flattened(&out);
    let stale = find(&f, "ACC-1", "CLG27");
    assert!(stale.action.is_none(), "{stale:?}");
    assert!(
        stale
            .outcome
            .starts_with("NOT FLATTENED: price_band: the reference price of CLG27 (68.28) is "),
        "{stale:?}"
    );
    assert!(
        stale
            .outcome
            .contains("older than max_quote_age_seconds 300"),
        "{stale:?}"
    );
    assert!(out.contains("1 not flattened"), "{out}");
    // The other position is flattened; the stale one stays open.
    let fresh = find(&f, "ACC-1", "CLF27");
    let t = s.trader();
    let (a, _, _) = closing_order(&s, &t, fresh.action.as_deref().unwrap()).await;
    assert_eq!(a["status"], "succeeded", "{:?}", a.body);
    assert_eq!(t.position("ACC-1", "CLF27").await, 0);
    assert_eq!(t.position("ACC-1", "CLG27").await, -2);
    assert_eq!(flattening_settled(&s).await, (0, 1, 0));
    // Refreshed, an engage again closes it.
    s.cli(&["prices", "CLG27", "68.28"]);
    let (_, f) = flatten(&s, &["--accounts", "ACC-1", "--keep-working"]);
    let now = find(&f, "ACC-1", "CLG27");
    assert_eq!(now.outcome, "buy 2 limit 68.78 queued", "{f:?}");
    t.settled(now.action.as_deref().unwrap()).await;
    assert_eq!(t.position("ACC-1", "CLG27").await, 0);
}

both!(a_plan_and_execute_cannot_pass_the_switch_as_its_closing_order);
async fn a_plan_and_execute_cannot_pass_the_switch_as_its_closing_order(b: Backend) {
    // Workers off. A service principal that calls itself `kill-switch`, and a trader, each
    // execute a sell that would only reduce ACC-1's long 3, before the switch engages.
    let s = Server::start_on(b, &[("AIRLOCK_NOW", MARKET_OPEN)]);
    let forger = Api::new(
        &s,
        s.cli(&["token", "service", "--sub", "kill-switch"]),
        s.operator_token("op-energy-trader", "trader", Some("energy")),
    );
    let t = s.trader();
    let sell = |q: u32| json!({"account_id": "ACC-1", "symbol": "CLF27", "side": "sell", "quantity": q, "order_type": "market"});
    let forged = submit(&forger, sell(3), "forged-1", "call-forged").await;
    let plain = submit(&t, sell(1), "plain-1", "call-plain").await;
    let (_, f) = flatten(&s, &["--accounts", "ACC-1", "--keep-working"]);
    let own = find(&f, "ACC-1", "CLF27").action.clone().unwrap();
    // While it is engaged, a new plan by either is not executable.
    for api in [&forger, &t] {
        let p = api
            .post(
                "/actions/plan",
                &json!({"action_type": "order.submit.cl", "payload": sell(1), "requested_by": "op-energy-trader"}),
            )
            .await;
        assert_eq!(p["executable"], false, "{:?}", p.body);
        assert_eq!(p.check("kill_switch")["status"], "fail");
    }
    // Workers on: the two executes are refused at the worker (the switch is engaged, and
    // they are not its orders); its own closing order passes and closes the position.
    let s = s.crash().start(&[
        ("AIRLOCK_NOW", MARKET_OPEN),
        ("AIRLOCK_WORKERS", "on"),
        ("AIRLOCK_WORKER_RETRY_MS", "100"),
    ]);
    let t = s.trader();
    for e in [&forged, &plain] {
        let a = t.settled(&action_id(e)).await;
        assert_eq!(a["status"], "failed", "{:?}", a.body);
        assert!(
            a["error"]
                .as_str()
                .unwrap()
                .starts_with("kill_switch_engaged: "),
            "{:?}",
            a.body
        );
        assert_eq!(t.order(&order_id(e)).await["status"], "rejected");
        assert_eq!(
            at_broker(&s, "ACC-1", &order_id(e)),
            Value::Null,
            "never sent"
        );
    }
    let a = t.settled(&own).await;
    assert_eq!(a["status"], "succeeded", "{:?}", a.body);
    assert_eq!(t.position("ACC-1", "CLF27").await, 0);
}

both!(a_position_that_moved_after_its_closing_order_was_queued_is_not_reversed);
async fn a_position_that_moved_after_its_closing_order_was_queued_is_not_reversed(b: Backend) {
    // A resting sell of 2 on ACC-1's long 3 CLF27, working at the broker.
    let s = Server::with_workers(b, &[]);
    let t = s.trader();
    let rest = json!({"account_id": "ACC-1", "symbol": "CLF27", "side": "sell", "quantity": 2,
                      "order_type": "limit", "limit_price": "70.00", "time_in_force": "gtc"});
    let e = submit(&t, rest, "rest-sell", "call-rest-sell").await;
    assert_eq!(t.settled(&action_id(&e)).await["status"], "succeeded");
    let resting = order_id(&e);
    // Workers off: the switch engages keeping it, and queues a sell of 3 to close.
    let s = s.crash().start(&[("AIRLOCK_NOW", MARKET_OPEN)]);
    let (_, f) = flatten(&s, &["--accounts", "ACC-1", "--keep-working"]);
    let closing = find(&f, "ACC-1", "CLF27");
    assert_eq!(closing.outcome, "sell 3 limit 67.90 queued", "{f:?}");
    // The resting sell fills before the closing order is handled: long 1 now.
    s.cli(&[
        "broker",
        "fill",
        "--account",
        "ACC-1",
        "--order",
        &resting,
        "--quantity",
        "2",
    ]);
    let t = s.trader();
    assert_eq!(t.position("ACC-1", "CLF27").await, 1);
    // Workers on: the sell of 3 would reverse the position to short 2; it is refused.
    let s = s.crash().start(&[
        ("AIRLOCK_NOW", MARKET_OPEN),
        ("AIRLOCK_WORKERS", "on"),
        ("AIRLOCK_WORKER_RETRY_MS", "100"),
    ]);
    let t = s.trader();
    let (a, order, broker) = closing_order(&s, &t, closing.action.as_deref().unwrap()).await;
    assert_eq!(a["status"], "failed", "{:?}", a.body);
    let error = a["error"].as_str().unwrap();
    assert!(
        error.starts_with("kill_switch_flatten: the position is +1 now, and this closing sell of 3 would reverse it (-2)"),
        "{error}"
    );
    assert_eq!(order["status"], "rejected", "{order}");
    assert_eq!(broker, Value::Null, "never sent");
    assert_eq!(t.position("ACC-1", "CLF27").await, 1, "not reversed");
    // The other position closed; status shows the refusal.
    assert_eq!(t.position("ACC-1", "CLG27").await, 0);
    assert_eq!(flattening_settled(&s).await, (0, 1, 1));
    let status = s.cli(&["kill-switch", "status"]);
    assert!(status.contains("kill_switch_flatten: "), "{status}");
    // An engage again closes what is left: a sell of 1.
    let (out, f) = flatten(&s, &["--accounts", "ACC-1", "--keep-working"]);
    let again = find(&f, "ACC-1", "CLF27");
    assert_eq!(again.outcome, "sell 1 limit 67.90 queued", "{out}");
    assert_ne!(again.action, closing.action, "the next attempt");
    assert_eq!(
        t.settled(again.action.as_deref().unwrap()).await["status"],
        "succeeded"
    );
    assert_eq!(t.position("ACC-1", "CLF27").await, 0);
}

both!(the_agent_cannot_cancel_or_shrink_a_closing_order_while_the_switch_is_engaged);
async fn the_agent_cannot_cancel_or_shrink_a_closing_order_while_the_switch_is_engaged(b: Backend) {
    // Workers off: the switch engages and queues a sell of 3 at 67.90 to close ACC-1's long
    // 3 CLF27; the market then falls below it, so it rests at the broker once sent.
    let s = Server::start_on(b, &[("AIRLOCK_NOW", MARKET_OPEN)]);
    let (_, f) = flatten(&s, &["--accounts", "ACC-1", "--keep-working"]);
    let closing = find(&f, "ACC-1", "CLF27").action.clone().unwrap();
    s.cli(&["prices", "CLF27", "67.70"]);
    let s = s.crash().start(&[
        ("AIRLOCK_NOW", MARKET_OPEN),
        ("AIRLOCK_WORKERS", "on"),
        ("AIRLOCK_WORKER_RETRY_MS", "100"),
    ]);
    let t = s.trader();
    let (a, order, broker) = closing_order(&s, &t, &closing).await;
    assert_eq!(a["status"], "succeeded", "{:?}", a.body);
    assert_eq!(order["status"], "working", "{order}");
    assert_eq!(broker["status"], "working", "{broker}");
    let o = order["order_id"].as_str().unwrap().to_string();
    // The agent's token confirms a cancel, and a change that only lowers the quantity:
    // both are accepted, and refused at the worker while the switch is engaged.
    for (n, (action_type, payload)) in [
        (
            "order.cancel",
            json!({"account_id": "ACC-1", "order_id": o}),
        ),
        (
            "order.replace.cl",
            json!({"account_id": "ACC-1", "order_id": o, "quantity": 1}),
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let p = t
            .post(
                "/actions/plan",
                &json!({"action_type": action_type, "payload": payload, "requested_by": "op-energy-trader"}),
            )
            .await;
        let e = t.execute(&p, &format!("undo-flatten-{n}")).await;
        assert_eq!(e.status, 202, "{action_type}: {:?}", e.body);
        let a = t.settled(&action_id(&e)).await;
        assert_eq!(a["status"], "failed", "{action_type}: {:?}", a.body);
        let error = a["error"].as_str().unwrap();
        assert!(
            error.starts_with(&format!(
                "kill_switch_flatten: order {o} is the kill switch's closing order of engagement ks_"
            )),
            "{action_type}: {error}"
        );
    }
    let order = t.order(&o).await;
    assert_eq!(order["status"], "working", "{order}");
    assert_eq!(order["quantity"], 3, "{order}");
    let broker = at_broker(&s, "ACC-1", &o);
    assert_eq!(broker["status"], "working", "{broker}");
    assert_eq!(broker["quantity"], 3, "{broker}");
    // Released, the order is the desk's again: its cancel goes through.
    s.cli(&["kill-switch", "release"]);
    let p = t
        .post(
            "/actions/plan",
            &json!({"action_type": "order.cancel", "payload": {"account_id": "ACC-1", "order_id": o}, "requested_by": "op-energy-trader"}),
        )
        .await;
    let e = t.execute(&p, "cancel-after-release").await;
    assert_eq!(t.settled(&action_id(&e)).await["status"], "succeeded");
    assert_eq!(t.order(&o).await["status"], "cancelled");
    assert_eq!(t.position("ACC-1", "CLF27").await, 3);
}
