//! Workers on both backends: the order lifecycle through HTTP, exactly-once towards the
//! broker under redelivery and crashes, poison messages, cancels, syncs and price moves.

use std::time::Duration;

use airlock_tests::{both, Api, Backend, Resp, Server, Stack, MARKET_OPEN};
use serde_json::{json, Value};

fn broker_orders(s: &Server, account: &str) -> usize {
    let book = s.broker_book(account);
    book["orders"].as_object().map(|o| o.len()).unwrap_or(0)
}

async fn execute_order(t: &Api, payload: Value, key: &str, tool_call: &str) -> Resp {
    let p = t
        .post(
            "/actions/plan",
            &json!({"action_type": "order.submit.cl", "payload": payload, "requested_by": "op-energy-trader",
                    "chat_context": {"chat_session_id": "chat-w", "tool_call_id": tool_call}}),
        )
        .await;
    assert_eq!(p["executable"], true, "{:?}", p.body);
    let e = t.execute(&p, key).await;
    assert_eq!(e.status, 202, "{:?}", e.body);
    e
}

fn market(qty: u32) -> Value {
    json!({"account_id": "ACC-1", "symbol": "CLF27", "side": "buy", "quantity": qty, "order_type": "market"})
}

both!(a_market_order_fills_and_moves_the_position);
async fn a_market_order_fills_and_moves_the_position(b: Backend) {
    let s = Server::with_workers(b, &[]);
    let t = s.trader();
    assert_eq!(t.position("ACC-1", "CLF27").await, 3);
    let e = execute_order(&t, market(2), "w-1", "call-1").await;
    let a = t.settled(e["action_id"].as_str().unwrap()).await;
    assert_eq!(a["status"], "succeeded", "{:?}", a.body);
    assert_eq!(a["resource_refs"], e["resource_refs"]);
    let o = t
        .order(e["resource_refs"]["order_id"].as_str().unwrap())
        .await;
    assert_eq!(o["status"], "filled", "{o}");
    assert_eq!(o["filled_quantity"], 2);
    assert_eq!(o["avg_fill_price"], "68.40");
    assert_eq!(o["action_id"], e["action_id"]);
    assert_eq!(t.position("ACC-1", "CLF27").await, 5);
    let p = t.get("/positions?account_id=ACC-1").await;
    let clf = p.body["positions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["symbol"] == "CLF27")
        .unwrap()
        .clone();
    assert_eq!(clf["avg_price"], "68.40");
    assert_eq!(broker_orders(&s, "ACC-1"), 1);
}

both!(the_same_message_three_times_is_one_broker_order);
async fn the_same_message_three_times_is_one_broker_order(b: Backend) {
    // Queue first, with no worker running; then deliver it three times.
    let s = Server::start_on(b, &[("AIRLOCK_NOW", MARKET_OPEN)]);
    let t = s.trader();
    let e = execute_order(&t, market(1), "dup-1", "call-dup").await;
    let action_id = e["action_id"].as_str().unwrap().to_string();
    s.cli(&["redeliver", &action_id, "--times", "2"]);
    assert_eq!(s.queued_messages(), 3);
    let stack = s.crash();
    let s = stack.start(&[("AIRLOCK_NOW", MARKET_OPEN), ("AIRLOCK_WORKERS", "on")]);
    let t = s.trader();
    assert_eq!(t.settled(&action_id).await["status"], "succeeded");
    for _ in 0..100 {
        if s.queued_messages() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(s.queued_messages(), 0, "all three deliveries handled");
    assert_eq!(broker_orders(&s, "ACC-1"), 1, "one order at the broker");
    assert_eq!(t.position("ACC-1", "CLF27").await, 4, "filled once");
}

/// A market buy of 3 executed with the workers off (so its answer is never cut short),
/// then the workers started with `worker.after_broker` and `extra`: the broker has the
/// order when the process dies. The execute's answer and the stopped stack.
async fn executed_then_worker_died(
    b: Backend,
    key: &str,
    tool_call: &str,
    extra: &[(&str, &str)],
) -> (Resp, Stack) {
    let quiet = Server::with_workers(b, &[("AIRLOCK_WORKERS", "off")]);
    let e = execute_order(&quiet.trader(), market(3), key, tool_call).await;
    let mut env = vec![
        ("AIRLOCK_NOW", MARKET_OPEN),
        ("AIRLOCK_WORKERS", "on"),
        ("AIRLOCK_WORKER_RETRY_MS", "100"),
        ("AIRLOCK_WORKER_VISIBILITY_MS", "1000"),
        ("AIRLOCK_FAILPOINTS", "worker.after_broker"),
    ];
    env.extend_from_slice(extra);
    let stack = quiet.crash().start(&env).wait_exit(Duration::from_secs(20));
    (e, stack)
}

both!(a_worker_that_dies_after_the_broker_accepted_does_not_order_twice);
async fn a_worker_that_dies_after_the_broker_accepted_does_not_order_twice(b: Backend) {
    let (e, stack) = executed_then_worker_died(b, "die-1", "call-die", &[]).await;
    let action_id = e["action_id"].as_str().unwrap().to_string();
    // The broker has the order; Airlock never recorded the fill.
    let s = stack.start(&[
        ("AIRLOCK_NOW", MARKET_OPEN),
        ("AIRLOCK_WORKERS", "on"),
        ("AIRLOCK_WORKER_VISIBILITY_MS", "1000"),
    ]);
    let t = s.trader();
    let a = t.settled(&action_id).await;
    assert_eq!(a["status"], "succeeded", "{:?}", a.body);
    let o = t
        .order(e["resource_refs"]["order_id"].as_str().unwrap())
        .await;
    assert_eq!(o["status"], "filled");
    assert_eq!(
        broker_orders(&s, "ACC-1"),
        1,
        "the client order id stopped a second order"
    );
    assert_eq!(t.position("ACC-1", "CLF27").await, 6);
}

both!(a_worker_that_dies_after_the_record_has_settled_the_action);
/// The order's record of the broker's answer and its action's settle are one write: a
/// worker that dies right after it leaves the order filled and the action `succeeded`
/// before anything else runs (with two writes the action stayed `processing` until the
/// redelivery); the redelivery then only acknowledges the message.
async fn a_worker_that_dies_after_the_record_has_settled_the_action(b: Backend) {
    // On the emulator a message's handling can outlast a short visibility timeout (moto
    // serves one request at a time, behind the consumers' long polls): received again and
    // again, it would be dead-lettered before the check below. A longer one there.
    let visibility = if b == Backend::Aws { "10000" } else { "1000" };
    let quiet = Server::with_workers(b, &[("AIRLOCK_WORKERS", "off")]);
    let e = execute_order(&quiet.trader(), market(3), "rec-1", "call-rec").await;
    let action_id = e["action_id"].as_str().unwrap().to_string();
    let order_id = e["resource_refs"]["order_id"].as_str().unwrap().to_string();
    let stack = quiet
        .crash()
        .start(&[
            // Each start later than the last: the clock restarts at AIRLOCK_NOW.
            ("AIRLOCK_NOW", "2026-11-23T15:01:00Z"),
            ("AIRLOCK_WORKERS", "on"),
            ("AIRLOCK_WORKER_VISIBILITY_MS", visibility),
            ("AIRLOCK_FAILPOINTS", "worker.after_record"),
        ])
        .wait_exit(Duration::from_secs(20));
    // The state the crash left, read with the workers off.
    let s = stack.start(&[
        ("AIRLOCK_NOW", "2026-11-23T15:02:00Z"),
        ("AIRLOCK_WORKERS", "off"),
    ]);
    let t = s.trader();
    let a = t.get(&format!("/actions/{action_id}")).await;
    assert_eq!(a["status"], "succeeded", "{:?}", a.body);
    let order = t.order(&order_id).await;
    assert_eq!(order["status"], "filled");
    assert_eq!(a["updated_at"], order["updated_at"], "one write, one time");
    assert_eq!(t.position("ACC-1", "CLF27").await, 6);
    assert_eq!(
        s.queued_messages(),
        1,
        "the message was never deleted: {}",
        s.cli(&["queues"])
    );
    // The redelivery acknowledges it; nothing runs twice.
    let s = s.crash().start(&[
        ("AIRLOCK_NOW", "2026-11-23T15:03:00Z"),
        ("AIRLOCK_WORKERS", "on"),
        ("AIRLOCK_WORKER_VISIBILITY_MS", visibility),
    ]);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while s.queued_messages() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the redelivery was never acknowledged"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let t = s.trader();
    let after = t.get(&format!("/actions/{action_id}")).await;
    assert_eq!(
        (&after["status"], &after["updated_at"]),
        (&a["status"], &a["updated_at"]),
        "the redelivery moved nothing"
    );
    assert_eq!(broker_orders(&s, "ACC-1"), 1, "one order at the broker");
    assert_eq!(t.position("ACC-1", "CLF27").await, 6, "filled once");
}

both!(a_sync_between_a_broker_fill_and_its_record_does_not_count_the_fill_twice);
async fn a_sync_between_a_broker_fill_and_its_record_does_not_count_the_fill_twice(b: Backend) {
    // The order worker dies after the broker filled; the redelivery waits out its
    // visibility timeout, and a positions.sync of the same account runs before it. On the
    // emulator every call queues behind the consumers' one-second long polls (moto serves
    // one request at a time), so a sync there takes several seconds: a longer timeout.
    let visibility = if b == Backend::Aws { "25000" } else { "4000" };
    let slow = [("AIRLOCK_WORKER_VISIBILITY_MS", visibility)];
    let (e, stack) = executed_then_worker_died(b, "die-sync-1", "call-die-sync", &slow).await;
    let order_id = e["resource_refs"]["order_id"].as_str().unwrap().to_string();
    let s = stack.start(&[
        ("AIRLOCK_NOW", MARKET_OPEN),
        ("AIRLOCK_WORKERS", "on"),
        ("AIRLOCK_WORKER_RETRY_MS", "100"),
        ("AIRLOCK_WORKER_VISIBILITY_MS", visibility),
    ]);
    let t = s.trader();
    let p = t.plan_sync("ACC-1").await;
    let sync = t.execute(&p, "sync-after-crash").await;
    assert_eq!(sync.status, 202, "{:?}", sync.body);
    let done = t.settled(sync["action_id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "succeeded", "{:?}", done.body);
    assert_eq!(
        t.order(&order_id).await["status"],
        "filled",
        "the sync recorded the fill the dead worker left behind"
    );
    assert_eq!(t.position("ACC-1", "CLF27").await, 6);
    // The order's redelivery finds it filled: nothing more to add.
    let a = t.settled(e["action_id"].as_str().unwrap()).await;
    assert_eq!(a["status"], "succeeded", "{:?}", a.body);
    assert_eq!(t.position("ACC-1", "CLF27").await, 6, "counted once");
    assert_eq!(broker_orders(&s, "ACC-1"), 1);
}

both!(a_poison_message_is_dead_lettered_and_its_action_fails);
async fn a_poison_message_is_dead_lettered_and_its_action_fails(b: Backend) {
    let s = Server::with_workers(b, &[("AIRLOCK_FAILPOINTS", "worker.poison")]);
    let t = s.trader();
    let poison = execute_order(&t, market(1), "poison-1", "poison").await;
    let fine = execute_order(&t, json!({"account_id": "ACC-2", "symbol": "CLF27", "side": "sell", "quantity": 1, "order_type": "market"}), "fine-1", "call-fine").await;
    let a = t.settled(poison["action_id"].as_str().unwrap()).await;
    assert_eq!(a["status"], "failed");
    assert!(
        a["error"].as_str().unwrap().contains("cannot be handled"),
        "{:?}",
        a.body
    );
    assert_eq!(
        t.settled(fine["action_id"].as_str().unwrap()).await["status"],
        "succeeded"
    );
    let mut dead = 0;
    for _ in 0..100 {
        dead = s.queue_counts("dead_letters");
        if dead == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(dead, 1, "the poison message is in the dead-letter queue");
    assert_eq!(broker_orders(&s, "ACC-1"), 0);
}

both!(limits_rest_until_the_price_crosses_and_cancels_stop_them);
async fn limits_rest_until_the_price_crosses_and_cancels_stop_them(b: Backend) {
    let s = Server::with_workers(b, &[]);
    let t = s.trader();
    let limit = |px: &str| json!({"account_id": "ACC-1", "symbol": "CLF27", "side": "buy", "quantity": 1, "order_type": "limit", "limit_price": px, "time_in_force": "gtc"});
    let a = execute_order(&t, limit("66.00"), "lim-1", "call-lim-1").await;
    let b2 = execute_order(&t, limit("65.00"), "lim-2", "call-lim-2").await;
    for e in [&a, &b2] {
        assert_eq!(
            t.settled(e["action_id"].as_str().unwrap()).await["status"],
            "succeeded"
        );
        assert_eq!(
            t.order(e["resource_refs"]["order_id"].as_str().unwrap())
                .await["status"],
            "working"
        );
    }
    // The price falls to 65.80: the 66.00 bid fills, the 65.00 one keeps resting.
    s.cli(&["prices", "CLF27", "65.80"]);
    let oa = t
        .order(a["resource_refs"]["order_id"].as_str().unwrap())
        .await;
    assert_eq!(
        (oa["status"].as_str(), oa["avg_fill_price"].as_str()),
        (Some("filled"), Some("65.80"))
    );
    assert_eq!(t.position("ACC-1", "CLF27").await, 4);
    // Cancel the resting one.
    let ob = b2["resource_refs"]["order_id"].as_str().unwrap();
    let cp = t
        .post("/actions/plan", &json!({"action_type": "order.cancel", "payload": {"account_id": "ACC-1", "order_id": ob}, "requested_by": "op-energy-trader"}))
        .await;
    assert_eq!(cp["executable"], true, "{:?}", cp.body);
    let ce = t.execute(&cp, "cancel-lim-2").await;
    assert_eq!(
        t.settled(ce["action_id"].as_str().unwrap()).await["status"],
        "succeeded"
    );
    assert_eq!(t.order(ob).await["status"], "cancelled");
    // A limit far from the reference is rejected by the broker, with its reason: the
    // broker keeps its own band behind a policy band made wider than it.
    let wide = s.state_dir.join("wide-band.json");
    std::fs::write(&wide, r#"{"version": "wide", "price_band_pct": "60", "confirmation": {"order.submit.cl": "token"}}"#).unwrap();
    s.cli(&["policy", "set", wide.to_str().unwrap()]);
    let far = execute_order(&t, limit("40.00"), "lim-far", "call-far").await;
    let r = t.settled(far["action_id"].as_str().unwrap()).await;
    assert_eq!(r["status"], "failed");
    assert!(
        r["error"].as_str().unwrap().contains("band"),
        "{:?}",
        r.body
    );
    assert_eq!(
        t.order(far["resource_refs"]["order_id"].as_str().unwrap())
            .await["status"],
        "rejected"
    );
}

both!(positions_sync_rebuilds_from_the_broker_and_records_what_changed);
async fn positions_sync_rebuilds_from_the_broker_and_records_what_changed(b: Backend) {
    let s = Server::with_workers(b, &[]);
    let t = s.trader();
    assert_eq!(t.position("ACC-2", "CLF27").await, 10);
    let p = t.plan_sync("ACC-2").await;
    let e = t.execute(&p, "sync-2").await;
    assert_eq!(e.status, 202);
    assert_eq!(
        t.settled(e["action_id"].as_str().unwrap()).await["status"],
        "succeeded"
    );
    assert_eq!(t.position("ACC-2", "CLF27").await, 12);
    let jobs = t.get("/jobs?kind=positions.sync&status=succeeded").await;
    let job = jobs.body["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["job_id"] == e["resource_refs"]["job_id"])
        .cloned()
        .unwrap();
    assert_eq!(job["action_id"], e["action_id"]);
    assert_eq!(
        job["result"]["changed"],
        json!([{"symbol": "CLF27", "before": 10, "after": 12}])
    );
}

both!(action_status_waits_for_a_change_instead_of_polling);
async fn action_status_waits_for_a_change_instead_of_polling(b: Backend) {
    // Workers off: nothing changes, so the request is held for the whole wait.
    let s = Server::start_on(b, &[("AIRLOCK_NOW", MARKET_OPEN)]);
    let t = s.trader();
    let e = execute_order(&t, market(1), "w-wait-1", "call-wait-1").await;
    let id = e["action_id"].as_str().unwrap().to_string();
    let started = std::time::Instant::now();
    let a = t.get(&format!("/actions/{id}?wait=1")).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert_eq!(a["status"], "queued");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "held for the wait"
    );
    for bad in ["21", "-1", "1.5", "x", "+3"] {
        let r = t.get(&format!("/actions/{id}?wait={bad}")).await;
        assert_eq!(r.status, 400, "wait={bad}");
        assert_eq!(r.field(), "wait");
    }
    drop(s);

    // Workers on: the answer comes with the change, long before the wait ends.
    let s = Server::with_workers(b, &[]);
    let t = s.trader();
    let e = execute_order(&t, market(1), "w-wait-2", "call-wait-2").await;
    let id = e["action_id"].as_str().unwrap();
    let started = std::time::Instant::now();
    let mut seen = "queued".to_string();
    while seen != "succeeded" {
        let a = t.get(&format!("/actions/{id}?wait=20")).await;
        assert_ne!(a["status"], seen.as_str(), "answered only on a change");
        seen = a["status"].as_str().unwrap().to_string();
        assert!(started.elapsed() < Duration::from_secs(20), "{seen}");
    }
    // A finished action answers at once.
    let done = std::time::Instant::now();
    assert_eq!(
        t.get(&format!("/actions/{id}?wait=20")).await["status"],
        "succeeded"
    );
    assert!(done.elapsed() < Duration::from_secs(5));
}

/// `airlock broker fill` refused: its error message.
fn broker_fill_refused(s: &Server, args: &[&str]) -> String {
    let out = std::process::Command::new(airlock_tests::binary())
        .args([
            "--state-dir",
            s.state_dir.to_str().unwrap(),
            "broker",
            "fill",
        ])
        .args(args)
        .envs(s.cli_env())
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(!out.status.success(), "{args:?} was not refused");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// What the position limit counts for ACC-1 in CLF27 (its reason names the position and
/// the open orders).
async fn clf27_exposure(t: &Api) -> String {
    let p = t
        .post(
            "/actions/plan",
            &json!({"action_type": "order.submit.cl", "payload": market(1), "requested_by": "op-energy-trader"}),
        )
        .await;
    p.check("position_limit")["reason"]
        .as_str()
        .unwrap()
        .to_string()
}

both!(a_partial_fill_at_the_broker_is_recorded_by_reconciliation);
async fn a_partial_fill_at_the_broker_is_recorded_by_reconciliation(b: Backend) {
    let s = Server::with_workers(b, &[]);
    let t = s.trader();
    assert_eq!(t.position("ACC-1", "CLF27").await, 3);
    let limit = json!({"account_id": "ACC-1", "symbol": "CLF27", "side": "buy", "quantity": 5,
                       "order_type": "limit", "limit_price": "68.00", "time_in_force": "gtc"});
    let e = execute_order(&t, limit, "fill-1", "call-fill-1").await;
    let action_id = e["action_id"].as_str().unwrap();
    assert_eq!(t.settled(action_id).await["status"], "succeeded");
    let id = e["resource_refs"]["order_id"].as_str().unwrap();
    let o = t.order(id).await;
    assert_eq!(
        (o["status"].as_str(), o["version"].as_u64()),
        (Some("working"), Some(1))
    );
    assert_eq!(o["versions"], json!([]));
    // Open buys: this order's 5 and the demo's resting buy of 1.
    assert!(
        clf27_exposure(&t)
            .await
            .contains("holds +3 with open orders to buy 6 and sell 0"),
        "{}",
        clf27_exposure(&t).await
    );
    // Refused, nothing moved: more than is left, an unknown order, a price past the limit.
    let why = broker_fill_refused(
        &s,
        &["--account", "ACC-1", "--order", id, "--quantity", "6"],
    );
    assert!(why.contains("5 contract(s) left to fill, not 6"), "{why}");
    let why = broker_fill_refused(
        &s,
        &[
            "--account",
            "ACC-1",
            "--order",
            "ord-none",
            "--quantity",
            "1",
        ],
    );
    assert!(why.contains("no order ord-none"), "{why}");
    let why = broker_fill_refused(
        &s,
        &[
            "--account",
            "ACC-1",
            "--order",
            id,
            "--quantity",
            "1",
            "--price",
            "68.50",
        ],
    );
    assert!(why.contains("cannot fill at 68.50"), "{why}");
    assert_eq!(t.position("ACC-1", "CLF27").await, 3);

    // Two of five at the limit: the broker's order is partly filled, and reconciliation
    // records it in Airlock's order, position and exposure.
    let at_broker = s.broker_fill("ACC-1", id, 2, None);
    assert_eq!(at_broker["status"], "partially_filled", "{at_broker}");
    let o = t.order(id).await;
    assert_eq!(
        (
            o["status"].as_str(),
            o["filled_quantity"].as_u64(),
            o["avg_fill_price"].as_str()
        ),
        (Some("partially_filled"), Some(2), Some("68.00")),
        "{o}"
    );
    assert_eq!(t.position("ACC-1", "CLF27").await, 5);
    let seen = clf27_exposure(&t).await;
    assert!(
        seen.contains("holds +5 with open orders to buy 4 and sell 0"),
        "{seen}"
    );

    // The rest at another price: filled; the position moves by the new contracts at their
    // own price (the broker's average is over all fills).
    s.broker_fill("ACC-1", id, 3, Some("67.50"));
    let o = t.order(id).await;
    assert_eq!(
        (
            o["status"].as_str(),
            o["filled_quantity"].as_u64(),
            o["avg_fill_price"].as_str()
        ),
        (Some("filled"), Some(5), Some("67.70")),
        "{o}"
    );
    assert_eq!(t.position("ACC-1", "CLF27").await, 8);
    // 3 at 68.40, 2 at 68.00, 3 at 67.50.
    let p = t.get("/positions?account_id=ACC-1").await;
    let clf = p.body["positions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["symbol"] == "CLF27")
        .unwrap()
        .clone();
    assert_eq!(clf["avg_price"], "67.9625", "{clf}");
    let seen = clf27_exposure(&t).await;
    assert!(
        seen.contains("holds +8 with open orders to buy 1 and sell 0"),
        "{seen}"
    );
    let why = broker_fill_refused(
        &s,
        &["--account", "ACC-1", "--order", id, "--quantity", "1"],
    );
    assert!(why.contains("is filled"), "{why}");
}
