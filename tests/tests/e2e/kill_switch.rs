//! The kill switch pulls working orders, on both backends: engaging it queues a cancel of
//! every order at the broker (of every account, or of `--accounts`), each a real
//! `order.cancel` action audited as the kill switch's; `--keep-working` pulls nothing;
//! engaging twice queues nothing twice; orders still in the queue never reach the broker;
//! an order claimed for the broker, or at the broker but not yet recorded, when the switch
//! engages is stopped or pulled; `status` counts the cancels.

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
