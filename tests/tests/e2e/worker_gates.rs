//! Risk controls that hold at the workers, on both backends: a message whose
//! handling overflows or panics fails alone and the workers go on; the kill switch stops
//! orders already queued, at the worker and at the sweeper; a forged queue message is
//! refused; an order the broker accepted is not reported failed; a cancel does not wait
//! behind a failing submission of its account.

use std::time::{Duration, Instant};

use airlock_tests::{both, Api, Backend, Resp, Server, Stack, MARKET_OPEN};
use serde_json::{json, Value};

/// Two minutes after [`MARKET_OPEN`]: a first attempt's lease has run out.
const LATER: &str = "2026-11-23T15:02:00Z";

fn restart_with_workers(stack: Stack, now: &str, extra: &[(&str, &str)]) -> Server {
    let mut env = vec![
        ("AIRLOCK_NOW", now),
        ("AIRLOCK_WORKERS", "on"),
        ("AIRLOCK_WORKER_RETRY_MS", "100"),
        ("AIRLOCK_WORKER_VISIBILITY_MS", "1000"),
    ];
    env.extend_from_slice(extra);
    stack.start(&env)
}

/// The broker's own orders of an account, by client order id.
fn broker_orders(s: &Server, account: &str) -> serde_json::Map<String, Value> {
    let book = s.broker_book(account);
    book["orders"].as_object().cloned().unwrap_or_default()
}

async fn plan(t: &Api, action_type: &str, payload: Value, tool_call: &str) -> Resp {
    let p = t
        .post(
            "/actions/plan",
            &json!({"action_type": action_type, "payload": payload, "requested_by": "op-energy-trader",
                    "chat_context": {"chat_session_id": "chat-gates", "tool_call_id": tool_call}}),
        )
        .await;
    assert_eq!(p["executable"], true, "{:?}", p.body);
    p
}

async fn execute(t: &Api, action_type: &str, payload: Value, key: &str, tool_call: &str) -> Resp {
    let p = plan(t, action_type, payload, tool_call).await;
    let e = t.execute(&p, key).await;
    assert_eq!(e.status, 202, "{:?}", e.body);
    e
}

async fn submit(t: &Api, payload: Value, key: &str, tool_call: &str) -> Resp {
    execute(t, "order.submit.cl", payload, key, tool_call).await
}

/// A buy of 1 CLF27 on ACC-1 accepted at the atomic step, then the process died before the
/// enqueue (failpoint `execute.after_commit`): the stopped stack and the plan. The embedded
/// store queues in the commit itself; `execute.send_after_commit` makes it send after the
/// commit as on AWS, so the window this leaves (the sweeper's work) exists on both.
async fn accepted_then_crashed(b: Backend, tool_call: &str, key: &str) -> (Stack, Resp) {
    let s = Server::start_on(
        b,
        &[
            ("AIRLOCK_NOW", MARKET_OPEN),
            (
                "AIRLOCK_FAILPOINTS",
                "execute.send_after_commit,execute.after_commit",
            ),
        ],
    );
    let t = s.trader();
    let p = plan(
        &t,
        "order.submit.cl",
        market("ACC-1", "CLF27", "buy", 1),
        tool_call,
    )
    .await;
    let died = t
        .try_post("/actions/execute", &Api::execute_body(&p, key))
        .await;
    assert!(died.is_err(), "the server died mid-request: {died:?}");
    (s.wait_exit(Duration::from_secs(10)), p)
}

fn market(account: &str, symbol: &str, side: &str, qty: u32) -> Value {
    json!({"account_id": account, "symbol": symbol, "side": side, "quantity": qty, "order_type": "market"})
}

fn resting_limit() -> Value {
    json!({"account_id": "ACC-1", "symbol": "CLF27", "side": "buy", "quantity": 1,
           "order_type": "limit", "limit_price": "66.00", "time_in_force": "gtc"})
}

fn id(r: &Resp, field: &str) -> String {
    match field {
        "action_id" => r["action_id"].as_str().unwrap().to_string(),
        f => r["resource_refs"][f].as_str().unwrap().to_string(),
    }
}

/// Server log lines (JSON) whose message is `message`.
fn log_lines(s: &Server, message: &str) -> Vec<Value> {
    std::fs::read_to_string(s.state_dir.join("serve.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["fields"]["message"] == message)
        .collect()
}

// ---------------------------------------------------------------------------------------
// A: nothing a message does stops the workers.

both!(an_order_whose_fill_overflows_does_not_stop_the_workers);
async fn an_order_whose_fill_overflows_does_not_stop_the_workers(b: Backend) {
    // ACC-1 holds 3 CLF27 at 68.40; at the largest decimal price, the weighted average of a
    // buy overflows a naive computation (a panic would kill the order consumer for every
    // account).
    let s = Server::with_workers(b, &[]);
    let t = s.trader();
    s.cli(&["prices", "CLF27", "79228162514264337593543950335"]);
    let extreme = submit(
        &t,
        market("ACC-1", "CLF27", "buy", 2),
        "ovf-1",
        "call-ovf-1",
    )
    .await;
    let later = submit(
        &t,
        market("ACC-2", "CLG27", "buy", 1),
        "ovf-2",
        "call-ovf-2",
    )
    .await;
    let a = t.settled(&id(&later, "action_id")).await;
    assert_eq!(a["status"], "succeeded", "{:?}", a.body);
    assert_eq!(t.order(&id(&later, "order_id")).await["status"], "filled");
    // The extreme one settled too (it filled: the average is representable), no panic.
    let a = t.settled(&id(&extreme, "action_id")).await;
    assert_eq!(a["status"], "succeeded", "{:?}", a.body);
    assert_eq!(t.position("ACC-1", "CLF27").await, 5);
    assert!(
        log_lines(&s, "the worker panicked handling a message").is_empty(),
        "no panic on the way"
    );
}

both!(a_panicking_message_fails_alone_and_the_workers_go_on);
async fn a_panicking_message_fails_alone_and_the_workers_go_on(b: Backend) {
    let s = Server::with_workers(b, &[("AIRLOCK_FAILPOINTS", "worker.panic")]);
    let t = s.trader();
    let panics = submit(&t, market("ACC-1", "CLF27", "buy", 1), "panic-1", "panic").await;
    let a = t.settled(&id(&panics, "action_id")).await;
    assert_eq!(a["status"], "failed", "{:?}", a.body);
    let error = a["error"].as_str().unwrap();
    assert!(error.contains("panicked"), "{error}");
    assert!(!error.contains("resubmit"), "{error}");
    // Its order never reached the broker: rejected, nothing left open.
    assert_eq!(
        t.order(&id(&panics, "order_id")).await["status"],
        "rejected"
    );
    assert!(broker_orders(&s, "ACC-1").is_empty());
    // Every later order, on any account, still fills.
    for (acc, key) in [("ACC-2", "after-panic-2"), ("ACC-1", "after-panic-1")] {
        let e = submit(&t, market(acc, "CLF27", "buy", 1), key, key).await;
        let a = t.settled(&id(&e, "action_id")).await;
        assert_eq!(a["status"], "succeeded", "{:?}", a.body);
    }
    assert!(
        !log_lines(&s, "the worker panicked handling a message").is_empty(),
        "the panic was caught and logged"
    );
}

// ---------------------------------------------------------------------------------------
// B: the kill switch reaches orders already queued.

both!(queued_orders_meet_the_kill_switch_at_the_worker);
async fn queued_orders_meet_the_kill_switch_at_the_worker(b: Backend) {
    // A resting limit order, at the broker.
    let s = Server::with_workers(b, &[]);
    let t = s.trader();
    let rest = submit(&t, resting_limit(), "ks-rest", "call-ks-rest").await;
    assert_eq!(
        t.settled(&id(&rest, "action_id")).await["status"],
        "succeeded"
    );
    // Workers off: an order, a cancel of the resting one and a sync are queued, then the
    // switch is engaged.
    let s = s.crash().start(&[("AIRLOCK_NOW", MARKET_OPEN)]);
    let t = s.trader();
    let queued = submit(&t, market("ACC-1", "CLF27", "buy", 1), "ks-1", "call-ks-1").await;
    let rest_order = id(&rest, "order_id");
    let cancel = execute(
        &t,
        "order.cancel",
        json!({"account_id": "ACC-1", "order_id": rest_order}),
        "ks-cancel",
        "call-ks-cancel",
    )
    .await;
    let sync = execute(
        &t,
        "positions.sync",
        json!({"account_id": "ACC-2"}),
        "ks-sync",
        "call-ks-sync",
    )
    .await;
    s.cli(&["kill-switch", "engage", "--reason", "desk drill"]);
    // Workers on: the order is refused before the broker; the cancel and the sync run.
    let s = restart_with_workers(s.crash(), MARKET_OPEN, &[]);
    let t = s.trader();
    let a = t.settled(&id(&queued, "action_id")).await;
    assert_eq!(a["status"], "failed", "{:?}", a.body);
    let error = a["error"].as_str().unwrap();
    assert!(error.starts_with("kill_switch_engaged: "), "{error}");
    assert!(error.contains("desk drill"), "{error}");
    assert_eq!(
        t.order(&id(&queued, "order_id")).await["status"],
        "rejected"
    );
    let c = t.settled(&id(&cancel, "action_id")).await;
    assert_eq!(c["status"], "succeeded", "{:?}", c.body);
    assert_eq!(t.order(&rest_order).await["status"], "cancelled");
    let y = t.settled(&id(&sync, "action_id")).await;
    assert_eq!(y["status"], "succeeded", "{:?}", y.body);
    let at_broker = broker_orders(&s, "ACC-1");
    assert_eq!(
        at_broker.keys().collect::<Vec<_>>(),
        [&rest_order],
        "only the resting order ever reached the broker"
    );
    assert_eq!(t.position("ACC-1", "CLF27").await, 3);
}

both!(the_sweeper_does_not_send_an_order_while_the_kill_switch_is_engaged);
async fn the_sweeper_does_not_send_an_order_while_the_kill_switch_is_engaged(b: Backend) {
    // Accepted at the atomic step, then the process died before the enqueue.
    let (stack, p) = accepted_then_crashed(b, "call-ks-sweep", "ks-sweep").await;
    let plan_id = p["plan_id"].as_str().unwrap().to_string();
    stack.cli(
        &[("AIRLOCK_NOW", MARKET_OPEN)],
        &[
            "kill-switch",
            "engage",
            "--reason",
            "incident 12",
            "--keep-working",
        ],
    );
    // Two minutes later the sweeper finds it unsent, with the switch engaged.
    let later = stack.start(&[("AIRLOCK_NOW", LATER), ("AIRLOCK_SWEEP_INTERVAL_MS", "100")]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let refused = loop {
        let trail = later.audit(&plan_id);
        if let Some(r) = trail.iter().find(|r| r["decision"] == "rejected") {
            break r.clone();
        }
        assert!(
            Instant::now() < deadline,
            "the sweeper never refused it: {trail:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(refused["reason_code"], "kill_switch_engaged", "{refused}");
    assert_eq!(later.queued_messages(), 0, "nothing was sent");
    // The key replays the decision the atomic step made; the action says how it ended.
    let t = later.trader();
    let r = t.execute(&p, "ks-sweep").await;
    r.assert_status(200, "duplicate");
    let a = t.get(&format!("/actions/{}", id(&r, "action_id"))).await;
    assert_eq!(a["status"], "failed", "{:?}", a.body);
    assert!(
        a["error"]
            .as_str()
            .unwrap()
            .starts_with("kill_switch_engaged: "),
        "{:?}",
        a.body
    );
    assert_eq!(t.order(&id(&r, "order_id")).await["status"], "rejected");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        later.queued_messages(),
        0,
        "not sent by a later pass either"
    );
    assert!(broker_orders(&later, "ACC-1").is_empty());
}

// ---------------------------------------------------------------------------------------
// C: workers act on the stored action, never on the message.

/// A signed-looking request to the emulator (moto routes by the credential scope and does
/// not check signatures).
async fn aws_call(endpoint: &str, target: &str, body: Value) -> Value {
    let service = if target.starts_with("DynamoDB") {
        "dynamodb"
    } else {
        "sqs"
    };
    let r = reqwest::Client::new()
        .post(format!("{endpoint}/"))
        .header("content-type", "application/x-amz-json-1.0")
        .header("x-amz-target", target)
        .header("x-amz-date", "20260101T000000Z")
        .header(
            "authorization",
            format!(
                "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/{service}/aws4_request, \
                 SignedHeaders=host;x-amz-date, Signature=0000"
            ),
        )
        .body(body.to_string())
        .send()
        .await
        .expect("emulator call");
    let status = r.status().as_u16();
    let v: Value = r.json().await.unwrap_or(Value::Null);
    assert_eq!(status, 200, "{target}: {v}");
    v
}

fn emulator(stack: &Stack) -> Option<String> {
    stack
        .env()
        .into_iter()
        .find(|(k, _)| k == "AWS_ENDPOINT_URL")
        .map(|(_, v)| v)
}

/// The stored queued order submissions, as their action records.
async fn stored_submissions(stack: &Stack) -> Vec<Value> {
    let bodies: Vec<String> = match emulator(stack) {
        None => {
            let db = rusqlite::Connection::open(stack.state_dir.join("airlock.db")).unwrap();
            let mut st = db.prepare("SELECT body FROM actions").unwrap();
            let rows = st
                .query_map([], |r| airlock_tests::stored_body(r, 0))
                .unwrap();
            rows.map(Result::unwrap).collect()
        }
        Some(endpoint) => {
            let scan = aws_call(
                &endpoint,
                "DynamoDB_20120810.Scan",
                json!({"TableName": "airlock-actions"}),
            )
            .await;
            scan["Items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["body"]["S"].as_str().unwrap().to_string())
                .collect()
        }
    };
    bodies
        .iter()
        .map(|b| serde_json::from_str::<Value>(b).unwrap())
        .filter(|a| a["action_type"] == "order.submit.cl" && a["status"] == "queued")
        .collect()
}

/// Puts `body` on the orders queue in `group`, as anyone with write access to it could.
async fn enqueue_raw(stack: &Stack, body: &Value, group: &str) {
    match emulator(stack) {
        None => {
            let db = rusqlite::Connection::open(stack.state_dir.join("airlock.db")).unwrap();
            db.execute(
                "INSERT INTO queue (queue, group_key, dedup_id, body, visible_at, created_at) \
                 VALUES ('worker:orders', ?, 'forged-1', ?, 0, 0)",
                [group, &body.to_string()],
            )
            .unwrap();
        }
        Some(endpoint) => {
            let url = aws_call(
                &endpoint,
                "AmazonSQS.GetQueueUrl",
                json!({"QueueName": "airlock-orders.fifo"}),
            )
            .await;
            aws_call(
                &endpoint,
                "AmazonSQS.SendMessage",
                json!({"QueueUrl": url["QueueUrl"], "MessageBody": body.to_string(),
                       "MessageGroupId": group, "MessageDeduplicationId": "forged-1"}),
            )
            .await;
        }
    }
}

both!(an_action_left_unsent_past_its_keys_replay_window_is_failed_never_sent);
async fn an_action_left_unsent_past_its_keys_replay_window_is_failed_never_sent(b: Backend) {
    // Accepted at the atomic step, then the process died before the enqueue, and no
    // sweeper ran for a day: the idempotency record (24 h) has expired. A real table
    // deletes it within about a day; here it is past its `expires_at`, which every read
    // treats as absent. Sending a day-old order now would act on a stale intent.
    let (stack, p) = accepted_then_crashed(b, "call-expired-unsent", "expired-1").await;
    let plan_id = p["plan_id"].as_str().unwrap().to_string();
    let next_day = "2026-11-24T16:00:00Z";
    let later = stack.start(&[
        ("AIRLOCK_NOW", next_day),
        ("AIRLOCK_SWEEP_INTERVAL_MS", "100"),
    ]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let retired = loop {
        let trail = later.audit(&plan_id);
        if let Some(r) = trail.iter().find(|r| r["decision"] == "rejected") {
            break r.clone();
        }
        assert!(
            Instant::now() < deadline,
            "the sweeper never settled it: {trail:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(retired["reason_code"], "expired_unsent", "{retired}");
    let action_id = retired["action_id"].as_str().unwrap().to_string();
    let order_id = retired["order_id"].as_str().unwrap().to_string();
    let t = later.trader();
    let a = t.get(&format!("/actions/{action_id}")).await;
    assert_eq!(a["status"], "failed", "{:?}", a.body);
    assert!(
        a["error"].as_str().unwrap().starts_with("expired_unsent: "),
        "{:?}",
        a.body
    );
    assert_eq!(t.order(&order_id).await["status"], "rejected");
    // Later passes leave it alone: retired once, never sent, never audited again.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(later.queued_messages(), 0, "nothing was sent");
    assert!(broker_orders(&later, "ACC-1").is_empty());
    let rejected = later
        .audit(&plan_id)
        .iter()
        .filter(|r| r["decision"] == "rejected")
        .count();
    assert_eq!(rejected, 1, "audited once");
}

both!(a_forged_queue_message_is_refused_and_the_stored_order_runs);
async fn a_forged_queue_message_is_refused_and_the_stored_order_runs(b: Backend) {
    // An accepted order that was never sent (the process died before the enqueue).
    let (stack, p) = accepted_then_crashed(b, "call-forge", "forge-1").await;
    // Someone who can write to the queue attaches another order to the live action id.
    let stored = stored_submissions(&stack).await;
    assert_eq!(stored.len(), 1, "{stored:?}");
    let action_id = stored[0]["action_id"].as_str().unwrap().to_string();
    let order_id = stored[0]["resource_refs"]["order_id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut forged = stored[0]["message"].clone();
    forged["normalized_payload"]["account_id"] = json!("ACC-2");
    forged["normalized_payload"]["quantity"] = json!(7);
    enqueue_raw(&stack, &forged, "ACC-2").await;
    // Workers on; the sweeper waits an hour, so only the forged message is on the queue.
    let s = restart_with_workers(stack, LATER, &[("AIRLOCK_SWEEP_AFTER_MS", "3600000")]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while s.queued_messages() > 0 {
        assert!(
            Instant::now() < deadline,
            "the forged message was never consumed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let t = s.trader();
    let a = t.get(&format!("/actions/{action_id}")).await;
    assert_eq!(
        a["status"], "queued",
        "the action is untouched: {:?}",
        a.body
    );
    assert_eq!(
        t.order(&order_id).await,
        Value::Null,
        "no order was recorded"
    );
    assert!(
        broker_orders(&s, "ACC-2").is_empty(),
        "the broker never saw it"
    );
    assert_eq!(
        s.queue_counts("dead_letters"),
        0,
        "deleted, not dead-lettered"
    );
    let refused = log_lines(
        &s,
        "refused a queue message that is not the stored action's; deleted unhandled",
    );
    assert_eq!(refused.len(), 1, "logged once");
    assert!(
        refused[0].to_string().contains(&action_id)
            && refused[0].to_string().contains("normalized_payload"),
        "{}",
        refused[0]
    );
    // A retry of the key answers from the commit; the stored message, sent by the
    // sweeper, is what runs.
    let r = t.execute(&p, "forge-1").await;
    assert_eq!(
        (r.status, r["action_id"].as_str()),
        (200, Some(action_id.as_str())),
        "{:?}",
        r.body
    );
    let s = restart_with_workers(s.crash(), LATER, &[("AIRLOCK_SWEEP_INTERVAL_MS", "100")]);
    let t = s.trader();
    let a = t.settled(&action_id).await;
    assert_eq!(a["status"], "succeeded", "{:?}", a.body);
    let o = t.order(&order_id).await;
    assert_eq!(
        (o["account_id"].as_str(), o["quantity"].as_u64()),
        (Some("ACC-1"), Some(1))
    );
    assert_eq!(broker_orders(&s, "ACC-1").len(), 1);
    assert!(broker_orders(&s, "ACC-2").is_empty());
    assert_eq!(t.position("ACC-2", "CLF27").await, 10);
}

// ---------------------------------------------------------------------------------------
// D: the last attempt, cancels behind a failing submission.

both!(an_order_the_broker_accepted_is_not_failed_when_only_its_record_failed);
async fn an_order_the_broker_accepted_is_not_failed_when_only_its_record_failed(b: Backend) {
    let s = Server::with_workers(b, &[("AIRLOCK_FAILPOINTS", "worker.record_fails")]);
    let t = s.trader();
    let e = submit(
        &t,
        market("ACC-1", "CLF27", "buy", 1),
        "rec-1",
        "record-fails",
    )
    .await;
    // Every attempt's record fails; the last one asks the broker, which has the order.
    let a = t.settled(&id(&e, "action_id")).await;
    assert_eq!(a["status"], "succeeded", "{:?}", a.body);
    assert_eq!(t.order(&id(&e, "order_id")).await["status"], "filled");
    assert_eq!(t.position("ACC-1", "CLF27").await, 4);
    assert_eq!(broker_orders(&s, "ACC-1").len(), 1);
}

both!(a_cancel_does_not_wait_behind_a_failing_submission_of_its_account);
async fn a_cancel_does_not_wait_behind_a_failing_submission_of_its_account(b: Backend) {
    // A failing submission holds its account's group for 3 + 6 + 9 + 12 s of retries.
    let s = Server::with_workers(
        b,
        &[
            ("AIRLOCK_FAILPOINTS", "worker.poison"),
            ("AIRLOCK_WORKER_RETRY_MS", "3000"),
        ],
    );
    let t = s.trader();
    let rest = submit(&t, resting_limit(), "cw-rest", "call-cw-rest").await;
    assert_eq!(
        t.settled(&id(&rest, "action_id")).await["status"],
        "succeeded"
    );
    let poison = submit(
        &t,
        market("ACC-1", "CLF27", "buy", 1),
        "cw-poison",
        "poison",
    )
    .await;
    let rest_order = id(&rest, "order_id");
    let cancel = execute(
        &t,
        "order.cancel",
        json!({"account_id": "ACC-1", "order_id": rest_order}),
        "cw-cancel",
        "call-cw-cancel",
    )
    .await;
    let c = t.settled(&id(&cancel, "action_id")).await;
    let p = t
        .get(&format!("/actions/{}", id(&poison, "action_id")))
        .await;
    assert_eq!(c["status"], "succeeded", "{:?}", c.body);
    assert_eq!(t.order(&rest_order).await["status"], "cancelled");
    assert!(
        p["status"] == "queued" || p["status"] == "processing",
        "the cancel ran while the submission was still failing: {:?}",
        p.body
    );
    // The submission fails in the end, its order rejected, as before.
    let p = t.settled(&id(&poison, "action_id")).await;
    assert_eq!(p["status"], "failed", "{:?}", p.body);
}

both!(a_slow_message_group_does_not_hold_the_others);
async fn a_slow_message_group_does_not_hold_the_others(b: Backend) {
    // The first order's handling takes 6 s (failpoint `worker.slow`). Orders of another
    // account and contract, executed after it, are received and settled meanwhile: the
    // consumer does not wait for a batch's slowest group before receiving again.
    let s = Server::with_workers(b, &[("AIRLOCK_FAILPOINTS", "worker.slow")]);
    let t = s.trader();
    let slow = submit(&t, market("ACC-1", "CLF27", "buy", 1), "sl-slow", "slow").await;
    let slow_action = id(&slow, "action_id");
    for i in 0..3 {
        let side = if i % 2 == 0 { "buy" } else { "sell" };
        let e = submit(
            &t,
            market("ACC-2", "CLG27", side, 1),
            &format!("sl-{i}"),
            &format!("call-sl-{i}"),
        )
        .await;
        let a = t.settled(&id(&e, "action_id")).await;
        assert_eq!(a["status"], "succeeded", "{:?}", a.body);
        let held = t.get(&format!("/actions/{slow_action}")).await;
        assert_eq!(
            held["status"], "processing",
            "order {i} of the other group settled only after the slow one: {:?}",
            held.body
        );
    }
    let a = t.settled(&slow_action).await;
    assert_eq!(a["status"], "succeeded", "{:?}", a.body);
}

both!(an_order_held_for_room_in_the_backlog_is_accepted_once_the_workers_make_it);
async fn an_order_held_for_room_in_the_backlog_is_accepted_once_the_workers_make_it(b: Backend) {
    held_then_accepted(b, 0).await;
}

both!(a_held_order_is_accepted_with_a_cached_backlog_count);
/// As above with the count cached for a second (`AIRLOCK_ORDERS_BACKLOG_CACHE_MS`): the
/// execute let go from its hold takes a place in the cached count, and must not then be
/// held again by that same count (until its wait ended, and then refused).
async fn a_held_order_is_accepted_with_a_cached_backlog_count(b: Backend) {
    held_then_accepted(b, 1000).await;
}

async fn held_then_accepted(b: Backend, cache_ms: u64) {
    // Backlog limit 1: the first order, 6 s at the worker (failpoint `worker.slow`), fills
    // it. The next execute is held, not refused, and is accepted once the workers have made
    // room: one request, no retry by the caller, and no rejection in its plan's trail.
    let cache = cache_ms.to_string();
    let s = Server::with_workers(
        b,
        &[
            ("AIRLOCK_FAILPOINTS", "worker.slow"),
            ("AIRLOCK_ORDERS_BACKLOG_LIMIT", "1"),
            ("AIRLOCK_ORDERS_BACKLOG_WAIT_MS", "10000"),
            ("AIRLOCK_ORDERS_BACKLOG_CACHE_MS", &cache),
            // Longer than the slow handling: no redelivery while it runs.
            ("AIRLOCK_WORKER_VISIBILITY_MS", "30000"),
        ],
    );
    let t = s.trader();
    let slow = submit(&t, market("ACC-1", "CLF27", "buy", 1), "hold-slow", "slow").await;
    let slow_action = id(&slow, "action_id");
    // The count read before the slow order was queued (0) is stale once the cache ends.
    tokio::time::sleep(Duration::from_millis(cache_ms + 100)).await;
    let p = plan(
        &t,
        "order.submit.cl",
        market("ACC-2", "CLG27", "buy", 1),
        "call-held",
    )
    .await;
    let started = Instant::now();
    let held = t.execute(&p, "hold-next").await;
    let waited = started.elapsed();
    assert_eq!(held.status, 202, "{:?}", held.body);
    assert!(
        waited >= Duration::from_secs(2),
        "accepted after {waited:?}, while the slow order still filled the backlog"
    );
    // It was admitted only once the slow order had left the queue.
    let first = t.get(&format!("/actions/{slow_action}")).await;
    assert_eq!(first["status"], "succeeded", "{:?}", first.body);
    let a = t.settled(&id(&held, "action_id")).await;
    assert_eq!(a["status"], "succeeded", "{:?}", a.body);
    let trail = s.audit(p["plan_id"].as_str().unwrap());
    assert!(
        trail.iter().all(|e| e["decision"] != "rejected"),
        "held, never refused: {trail:?}"
    );
}
