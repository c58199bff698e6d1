//! Risk controls that hold at every gate, on both backends: open orders count
//! against the position limit (at plan, and atomically at execute under concurrency), the
//! close-only window counts open orders too, execute re-runs every check that can change
//! since the plan (allow lists, account status, price band), control writes never undo
//! each other, the rate limit holds its sliding window under bursts, idempotency keys are
//! scoped to the operator, and `operator_mismatch` is audited.

use std::time::Duration;

use airlock_tests::{both, Api, Backend, Resp, Server, Stack, MARKET_OPEN};
use futures_util::future::join_all;
use serde_json::{json, Value};

fn start(b: Backend, extra: &[(&str, &str)]) -> Server {
    let mut env = vec![("AIRLOCK_NOW", MARKET_OPEN)];
    env.extend_from_slice(extra);
    Server::start_on(b, &env)
}

async fn plan_order(t: &Api, operator: &str, order: Value) -> Resp {
    t.post(
        "/actions/plan",
        &json!({
            "action_type": "order.submit.cl",
            "payload": order,
            "requested_by": operator,
        }),
    )
    .await
}

fn order(side: &str, symbol: &str, qty: u32) -> Value {
    json!({ "account_id": "ACC-1", "symbol": symbol, "side": side, "quantity": qty, "order_type": "market" })
}

fn names_check(r: &Resp, name: &str) -> bool {
    r.body["error"]["details"]
        .as_array()
        .map(|d| {
            d.iter()
                .any(|x| x["field"] == format!("risk_checks/{name}"))
        })
        .unwrap_or(false)
}

fn write_policy(s: &Server, policy: Value) -> String {
    write_policy_in(&s.state_dir, policy)
}

fn write_policy_in(state_dir: &std::path::Path, mut policy: Value) -> String {
    // These suites confirm orders with the plan's token (the approval suites cover the
    // operator's page).
    policy["confirmation"] =
        serde_json::json!({ "order.submit.cl": "token", "order.replace.cl": "token" });
    let file = state_dir.join(format!(
        "policy-{}.json",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::write(&file, policy.to_string()).unwrap();
    file.to_str().unwrap().to_string()
}

both!(open_orders_count_against_the_position_limit);
async fn open_orders_count_against_the_position_limit(b: Backend) {
    // Workers off: every accepted order stays open.
    let s = start(b, &[]);
    let t = s.trader();
    // Six plans of 10 against a limit of 50, all made before any executes: each passes.
    let mut plans = Vec::new();
    for _ in 0..6 {
        let p = plan_order(&t, "op-energy-trader", order("buy", "CLH27", 10)).await;
        assert_eq!(p["executable"], true, "{:?}", p.body);
        plans.push(p);
    }
    // Executed together: the limit holds atomically against the open ones.
    let keys: Vec<String> = (0..plans.len()).map(|i| format!("open-{i}")).collect();
    let results = join_all(plans.iter().zip(&keys).map(|(p, k)| t.execute(p, k))).await;
    let accepted = results.iter().filter(|r| r.status == 202).count();
    let refused: Vec<&Resp> = results.iter().filter(|r| r.status != 202).collect();
    assert_eq!(
        accepted,
        5,
        "{:?}",
        results.iter().map(|r| &r.body).collect::<Vec<_>>()
    );
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].status, 422, "{:?}", refused[0].body);
    assert_eq!(refused[0].code(), "policy_violation");
    assert!(
        names_check(refused[0], "position_limit"),
        "{:?}",
        refused[0].body
    );
    // A new plan sees the open orders.
    let p = plan_order(&t, "op-energy-trader", order("buy", "CLH27", 1)).await;
    assert_eq!(p["executable"], false);
    let c = p.check("position_limit");
    assert_eq!(c["status"], "fail", "{c}");
    assert!(
        c["reason"]
            .as_str()
            .unwrap()
            .contains("open orders to buy 50"),
        "{c}"
    );
    // The other side has its own room.
    let p = plan_order(&t, "op-energy-trader", order("sell", "CLH27", 10)).await;
    assert_eq!(p["executable"], true, "{:?}", p.body["risk_checks"]);
}

both!(close_only_orders_cannot_flip_the_position_together);
async fn close_only_orders_cannot_flip_the_position_together(b: Backend) {
    // Seeded at MARKET_OPEN: ACC-1 holds +3 CLF27. Then 2026-12-17 is inside CLF27's
    // two-day close-only window (last trading day 2026-12-21).
    let s = start(b, &[]);
    let stack = s.crash();
    let s = stack.start(&[("AIRLOCK_NOW", "2026-12-17T15:00:00Z")]);
    let t = s.trader();
    let a = plan_order(&t, "op-energy-trader", order("sell", "CLF27", 2)).await;
    let b2 = plan_order(&t, "op-energy-trader", order("sell", "CLF27", 2)).await;
    assert_eq!(a["executable"], true, "{:?}", a.body["risk_checks"]);
    assert_eq!(b2["executable"], true, "{:?}", b2.body["risk_checks"]);
    let ea = t.execute(&a, "close-a").await;
    assert_eq!(ea.status, 202, "{:?}", ea.body);
    // +3 with 2 already being sold: another 2 could flip the position to -1.
    let eb = t.execute(&b2, "close-b").await;
    assert_eq!(eb.status, 422, "{:?}", eb.body);
    assert_eq!(eb.code(), "policy_violation");
    assert!(names_check(&eb, "expiry_window"), "{:?}", eb.body);
    let p = plan_order(&t, "op-energy-trader", order("sell", "CLF27", 1)).await;
    assert_eq!(p["executable"], true, "{:?}", p.body["risk_checks"]);
}

both!(execute_rechecks_what_changed_since_the_plan);
async fn execute_rechecks_what_changed_since_the_plan(b: Backend) {
    let s = start(b, &[]);
    let t = s.trader();
    // The account leaves the policy's allow list after the plan.
    let p = plan_order(&t, "op-energy-trader", order("buy", "CLH27", 1)).await;
    assert_eq!(p["executable"], true);
    let file = write_policy(
        &s,
        json!({ "version": "only-acc-2", "allowed_accounts": ["ACC-2"] }),
    );
    s.cli(&["policy", "set", &file]);
    let e = t.execute(&p, "recheck-allow").await;
    assert_eq!(e.status, 422, "{:?}", e.body);
    assert!(names_check(&e, "account_allowed"), "{:?}", e.body);
    s.cli(&["policy", "reset"]);

    // The account is suspended after the plan.
    let p = plan_order(&t, "op-energy-trader", order("buy", "CLH27", 1)).await;
    assert_eq!(p["executable"], true);
    s.cli(&["account-status", "ACC-1", "suspended"]);
    let e = t.execute(&p, "recheck-suspended").await;
    assert_eq!(e.status, 422, "{:?}", e.body);
    assert_eq!(e.code(), "policy_violation");
    assert!(names_check(&e, "account_allowed"), "{:?}", e.body);
    assert!(e.message().contains("suspended"));
    s.cli(&["account-status", "ACC-1", "active"]);

    // The price band narrows after a limit order was planned near its edge.
    s.cli(&["prices", "CLH27", "70.00"]);
    let limit = "80.00";
    let p = plan_order(
        &t,
        "op-energy-trader",
        json!({ "account_id": "ACC-1", "symbol": "CLH27", "side": "buy", "quantity": 1,
                "order_type": "limit", "limit_price": limit }),
    )
    .await;
    assert_eq!(p["executable"], true, "{:?}", p.body["risk_checks"]);
    let file = write_policy(&s, json!({ "version": "band-5", "price_band_pct": "5" }));
    s.cli(&["policy", "set", &file]);
    let e = t.execute(&p, "recheck-band").await;
    assert_eq!(e.status, 422, "{:?}", e.body);
    assert!(names_check(&e, "price_band"), "{:?}", e.body);
}

both!(a_price_far_from_the_reference_fails_at_plan);
async fn a_price_far_from_the_reference_fails_at_plan(b: Backend) {
    let s = start(b, &[]);
    let t = s.trader();
    for price in ["-999999999999.9999999999999999", "790000.00", "0.01"] {
        let p = plan_order(
            &t,
            "op-energy-trader",
            json!({ "account_id": "ACC-1", "symbol": "CLH27", "side": "buy", "quantity": 1,
                    "order_type": "limit", "limit_price": price }),
        )
        .await;
        assert_eq!(p.status, 200, "{price}: {:?}", p.body);
        assert_eq!(p["executable"], false, "{price}");
        assert_eq!(p.check("price_band")["status"], "fail", "{price}");
        assert!(p["confirmation_token"].is_null());
    }
}

both!(control_writes_never_undo_each_other);
async fn control_writes_never_undo_each_other(b: Backend) {
    let s = start(b, &[]);
    for round in 0..3 {
        // An engage racing several rollout changes: every change lands, none is undone.
        let s = &s;
        std::thread::scope(|scope| {
            scope.spawn(move || s.cli(&["kill-switch", "engage", "--reason", "drill"]));
            for mode in ["plan_only", "execute", "plan_only"] {
                scope.spawn(move || s.cli(&["rollout", "positions.sync", mode]));
            }
        });
        let status = s.cli(&["kill-switch", "status"]);
        assert!(
            status.contains("ENGAGED"),
            "round {round}: a rollout write undid the engage: {status}"
        );
        s.cli(&["kill-switch", "release"]);
    }
}

both!(the_rate_limit_holds_its_sliding_window_under_a_burst);
async fn the_rate_limit_holds_its_sliding_window_under_a_burst(b: Backend) {
    // The server's clock starts half way through a minute: the limit fills in that minute
    // and the burst waits about 30 s for the next, not most of a minute.
    let s = start(
        b,
        &[
            ("AIRLOCK_EXECUTE_RATE_PER_MINUTE", "5"),
            ("AIRLOCK_NOW", "2026-11-23T15:00:30Z"),
        ],
    );
    let t = s.trader();
    let mut plans = Vec::new();
    for _ in 0..12 {
        let p = plan_order(&t, "op-energy-trader", order("buy", "CLH27", 1)).await;
        assert_eq!(p["executable"], true);
        plans.push(p);
    }
    // The server's clock, from a plan's expiry (5 minutes after it was made).
    let server_now = |p: &Resp| {
        chrono::DateTime::parse_from_rfc3339(p["expires_at"].as_str().unwrap())
            .unwrap()
            .timestamp_millis()
            - 300_000
    };
    // Fill the limit early enough in a minute that the burst lands early in the next.
    let mut now = server_now(&plans[0]);
    if now % 60_000 > 40_000 {
        tokio::time::sleep(Duration::from_millis((61_000 - now % 60_000) as u64)).await;
    }
    for (i, p) in plans.iter().take(5).enumerate() {
        let e = t.execute(p, &format!("rate-{i}")).await;
        assert_eq!(e.status, 202, "{:?}", e.body);
    }
    let probe = plan_order(&t, "op-energy-trader", order("buy", "CLH27", 1)).await;
    now = server_now(&probe);
    // Into the next minute by about a second: the last minute's 5 still count ~5 * 59/60.
    tokio::time::sleep(Duration::from_millis((61_000 - now % 60_000) as u64)).await;
    let keys: Vec<String> = (5..plans.len()).map(|i| format!("burst-{i}")).collect();
    let burst = join_all(plans[5..].iter().zip(&keys).map(|(p, k)| t.execute(p, k))).await;
    let accepted = burst.iter().filter(|r| r.status == 202).count();
    assert!(
        burst.iter().all(|r| r.status == 202 || r.status == 429),
        "{:?}",
        burst.iter().map(|r| &r.body).collect::<Vec<_>>()
    );
    // Within 1 to 13 s of the minute, the window leaves room for at most 2 more; a commit
    // checking only the current minute would have let 5 through.
    assert!(accepted <= 2, "{accepted} accepted in the burst");
}

both!(idempotency_keys_are_scoped_to_the_operator);
async fn idempotency_keys_are_scoped_to_the_operator(b: Backend) {
    let s = start(b, &[]);
    let alice = s.trader();
    let bob = alice.with_tokens(
        &s.service_token(),
        &s.operator_token("op-energy-trader-2", "trader", Some("energy")),
    );
    let pa = plan_order(&alice, "op-energy-trader", order("buy", "CLH27", 1)).await;
    let pb = plan_order(&bob, "op-energy-trader-2", order("buy", "CLH27", 1)).await;
    assert_eq!(pb.status, 200, "{:?}", pb.body);
    let ea = alice.execute(&pa, "predictable-key").await;
    assert_eq!(ea.status, 202, "{:?}", ea.body);
    let eb = bob
        .post(
            "/actions/execute",
            &json!({
                "plan_id": pb["plan_id"], "confirmation_token": pb["confirmation_token"],
                "idempotency_key": "predictable-key", "requested_by": "op-energy-trader-2"
            }),
        )
        .await;
    assert_eq!(
        eb.status, 202,
        "another operator's key is not shared: {:?}",
        eb.body
    );
    assert_ne!(ea["action_id"], eb["action_id"]);
    // Each replays its own.
    let again = alice.execute(&pa, "predictable-key").await;
    assert_eq!(again.status, 200);
    assert_eq!(again["action_id"], ea["action_id"]);
}

both!(operator_mismatch_at_execute_is_audited);
async fn operator_mismatch_at_execute_is_audited(b: Backend) {
    let s = start(b, &[]);
    let t = s.trader();
    let p = plan_order(&t, "op-energy-trader", order("buy", "CLH27", 1)).await;
    let e = t
        .post(
            "/actions/execute",
            &json!({
                "plan_id": p["plan_id"], "confirmation_token": p["confirmation_token"],
                "idempotency_key": "mismatch-1", "requested_by": "op-someone-else"
            }),
        )
        .await;
    assert_eq!(e.status, 403, "{:?}", e.body);
    assert_eq!(e.code(), "operator_mismatch");
    let trail = s.audit(p["plan_id"].as_str().unwrap());
    assert!(
        trail
            .iter()
            .any(|a| a["reason_code"] == "operator_mismatch" && a["decision"] == "rejected"),
        "{trail:?}"
    );
}

both!(the_worker_checks_the_position_limit_before_the_broker);
async fn the_worker_checks_the_position_limit_before_the_broker(b: Backend) {
    // Accepted while the limit was 50, then the limit drops to 5 before a worker runs.
    let s = start(b, &[]);
    let t = s.trader();
    let p = plan_order(&t, "op-energy-trader", order("buy", "CLH27", 10)).await;
    let e = t.execute(&p, "gate-1").await;
    assert_eq!(e.status, 202, "{:?}", e.body);
    let action_id = e["action_id"].as_str().unwrap().to_string();
    let order_id = e["resource_refs"]["order_id"].as_str().unwrap().to_string();
    let file = write_policy(&s, json!({ "version": "tight", "max_position": 5 }));
    s.cli(&["policy", "set", &file]);
    let s = s
        .crash()
        .start(&[("AIRLOCK_NOW", MARKET_OPEN), ("AIRLOCK_WORKERS", "on")]);
    refused_by_the_new_limit(&s, &action_id, &order_id).await;
}

/// The worker refused the order for the limit lowered to 5: the action failed with
/// `position_limit`, the order is rejected and never reached the broker, and its
/// contracts were released (5 fit under the new limit).
async fn refused_by_the_new_limit(s: &Server, action_id: &str, order_id: &str) {
    let t = s.trader();
    let r = t.settled(action_id).await;
    assert_eq!(r["status"], "failed", "{:?}", r.body);
    assert!(
        r.body.to_string().contains("position_limit"),
        "{:?}",
        r.body
    );
    assert_eq!(t.order(order_id).await["status"], "rejected");
    let book = s.broker_book("ACC-1");
    assert!(
        book["orders"].get(order_id).is_none(),
        "the broker saw the order: {book}"
    );
    let p = plan_order(&t, "op-energy-trader", order("buy", "CLH27", 5)).await;
    assert_eq!(p["executable"], true, "{:?}", p.body["risk_checks"]);
}

both!(a_claimed_order_redelivered_after_a_crash_is_checked_again);
/// The worker's last checks follow its claim: a worker that claimed an order and died
/// before the broker (failpoint `worker.before_broker`) leaves it `submitted`; the limit
/// drops to 5 while it is down; the redelivery, once the claim is abandoned, runs the
/// whole gate again (not only the kill switch) and does not send the order.
async fn a_claimed_order_redelivered_after_a_crash_is_checked_again(b: Backend) {
    let s = Stack::new(b).start(&[
        ("AIRLOCK_NOW", MARKET_OPEN),
        ("AIRLOCK_WORKERS", "on"),
        ("AIRLOCK_FAILPOINTS", "worker.before_broker"),
        ("AIRLOCK_WORKER_VISIBILITY_MS", "1000"),
    ]);
    let t = s.trader();
    let p = plan_order(&t, "op-energy-trader", order("buy", "CLH27", 10)).await;
    // On the embedded store the commit queues the message and wakes the worker, which may
    // claim the order and abort the process before the answer is written: the answer is
    // taken from the retry below either way.
    let first = t
        .try_post("/actions/execute", &Api::execute_body(&p, "gate-claimed"))
        .await;
    if let Ok(r) = &first {
        assert_eq!(r.status, 202, "{:?}", r.body);
    }
    let stack = s.wait_exit(Duration::from_secs(30));
    let file = write_policy_in(
        &stack.state_dir,
        json!({ "version": "tight", "max_position": 5 }),
    );
    stack.cli(&[("AIRLOCK_NOW", MARKET_OPEN)], &["policy", "set", &file]);
    // Two minutes later: the claim is older than the visibility timeout.
    let later = "2026-11-23T15:02:00Z";
    let s = stack.start(&[
        ("AIRLOCK_NOW", later),
        ("AIRLOCK_WORKERS", "on"),
        ("AIRLOCK_WORKER_RETRY_MS", "100"),
        ("AIRLOCK_WORKER_VISIBILITY_MS", "1000"),
    ]);
    let t = s.trader();
    let r = t.execute(&p, "gate-claimed").await;
    r.assert_status(200, "duplicate");
    let action_id = r["action_id"].as_str().unwrap_or_default().to_string();
    let order_id = r["resource_refs"]["order_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    refused_by_the_new_limit(&s, &action_id, &order_id).await;
    assert_eq!(broker_order_count(&s), 0, "the broker saw the order");
}

/// A small deterministic generator, so a failing interleaving can be replayed by its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

async fn positions_of(t: &Api) -> Vec<(String, i64)> {
    let r = t.get("/positions?account_id=ACC-1").await;
    r.body["positions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["symbol"].as_str().unwrap().to_string(),
                p["quantity"].as_i64().unwrap(),
            )
        })
        .collect()
}

fn broker_order_count(s: &Server) -> usize {
    let book = s.broker_book("ACC-1");
    book["orders"].as_object().map(|o| o.len()).unwrap_or(0)
}

async fn drained(s: &Server) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while s.queued_messages() > 0 {
        assert!(std::time::Instant::now() < deadline, "queues never drained");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

both!(random_interleavings_keep_the_limit_and_the_kill_switch);
/// Random interleavings of plans, executes (buys and sells, market and resting limits),
/// price moves that fill resting orders, cancels and kill-switch writes, with the workers
/// running: the position never passes the limit (checked after every step), and no order
/// reaches the broker while the switch is engaged (orders queued before the engage
/// included).
async fn random_interleavings_keep_the_limit_and_the_kill_switch(b: Backend) {
    let max = 12i64;
    let s = start(
        b,
        &[
            ("AIRLOCK_WORKERS", "on"),
            ("AIRLOCK_WORKER_RETRY_MS", "100"),
            // The rate limits are not what this test is about.
            ("AIRLOCK_EXECUTE_RATE_PER_MINUTE", "10000"),
            ("AIRLOCK_PLAN_RATE_PER_MINUTE", "10000"),
        ],
    );
    let file = write_policy(
        &s,
        // The message throttle is not what this test is about either.
        json!({ "version": "prop", "max_position": max, "max_order_size": 6,
                "max_messages_per_window": 1_000_000 }),
    );
    s.cli(&["policy", "set", &file]);
    s.cli(&["prices", "CLH27", "70.00"]);
    let t = s.trader();
    let seed = 0x5eed_0000_0000_0001u64 ^ (b as u64);
    let mut rng = Rng(seed);
    let mut engaged = false;
    let mut broker_at_engage = 0;
    let mut price = 7000i64;
    let mut open: Vec<String> = Vec::new();
    // The emulator serves one request at a time behind the workers' long polls, so the AWS
    // run takes fewer steps (the conditions it exercises are the same each step).
    let steps = match b {
        Backend::Embedded => 60,
        Backend::Aws => 8,
    };
    for step in 0..steps {
        match rng.below(10) {
            0..=5 => {
                let side = if rng.below(2) == 0 { "buy" } else { "sell" };
                let qty = 1 + rng.below(6) as u32;
                let mut o = json!({ "account_id": "ACC-1", "symbol": "CLH27", "side": side,
                                    "quantity": qty, "order_type": "market" });
                if rng.below(2) == 0 {
                    // A resting limit a little away from the price, filled by a later move.
                    let off = 1 + rng.below(200) as i64;
                    let px = if side == "buy" {
                        price - off
                    } else {
                        price + off
                    };
                    o["order_type"] = json!("limit");
                    o["limit_price"] = json!(format!("{}.{:02}", px / 100, px % 100));
                }
                let p = plan_order(&t, "op-energy-trader", o).await;
                if p["executable"] == true {
                    let e = t.execute(&p, &format!("prop-{seed}-{step}")).await;
                    assert!(
                        [202, 422].contains(&e.status),
                        "seed {seed} step {step}: {:?}",
                        e.body
                    );
                    if e.status == 202 {
                        open.push(e["resource_refs"]["order_id"].as_str().unwrap().into());
                    }
                }
            }
            6 => {
                price += rng.below(400) as i64 - 200;
                s.cli(&[
                    "prices",
                    "CLH27",
                    &format!("{}.{:02}", price / 100, price % 100),
                ]);
            }
            7 if !open.is_empty() => {
                let id = open.remove(rng.below(open.len() as u64) as usize);
                let p = t
                    .post(
                        "/actions/plan",
                        &json!({ "action_type": "order.cancel",
                                 "payload": { "account_id": "ACC-1", "order_id": id },
                                 "requested_by": "op-energy-trader" }),
                    )
                    .await;
                if p["executable"] == true {
                    t.execute(&p, &format!("prop-cancel-{seed}-{step}")).await;
                }
            }
            8 if !engaged => {
                s.cli(&["kill-switch", "engage", "--reason", "prop"]);
                engaged = true;
                broker_at_engage = broker_order_count(&s);
            }
            9 if engaged => {
                drained(&s).await;
                assert_eq!(
                    broker_order_count(&s),
                    broker_at_engage,
                    "seed {seed} step {step}: an order reached the broker while engaged"
                );
                s.cli(&["kill-switch", "release"]);
                engaged = false;
            }
            _ => {}
        }
        for (symbol, q) in positions_of(&t).await {
            if symbol == "CLH27" {
                assert!(q.abs() <= max, "seed {seed} step {step}: position {q}");
            }
        }
    }
    drained(&s).await;
    if engaged {
        assert_eq!(broker_order_count(&s), broker_at_engage, "seed {seed}");
    }
    // Whatever still rests, filling it all at once stays within the limit.
    s.cli(&["prices", "CLH27", "1.00"]);
    s.cli(&["prices", "CLH27", "500.00"]);
    drained(&s).await;
    for (symbol, q) in positions_of(&t).await {
        if symbol == "CLH27" {
            assert!(q.abs() <= max, "seed {seed}: final position {q}");
        }
    }
}

both!(reference_prices_carry_the_time_they_were_observed);
async fn reference_prices_carry_the_time_they_were_observed(b: Backend) {
    // `airlock prices`: "CLH27 70.00 observed <time>, <seconds> s ago".
    fn observed(out: &str) -> (String, u64) {
        let line = out.lines().find(|l| l.starts_with("CLH27 70.00 observed "));
        let rest = line.unwrap_or_else(|| panic!("no CLH27 line in {out}"))
            ["CLH27 70.00 observed ".len()..]
            .to_string();
        let (at, ago) = rest.split_once(", ").expect("time, age");
        let secs = ago.trim_end_matches(" s ago").parse().expect("seconds");
        (at.to_string(), secs)
    }
    let s = Server::start_on(b, &[("AIRLOCK_NOW", MARKET_OPEN)]);
    let (at, age) = observed(&s.cli(&["prices", "CLH27", "70.00"]));
    assert!(at.starts_with("2026-11-23T15:00:0"), "{at}");
    assert!(age <= 1, "{age}");
    // Ninety seconds later the same price is ninety seconds old.
    let mut env = s.cli_env();
    env.retain(|(k, _)| k != "AIRLOCK_NOW");
    env.push(("AIRLOCK_NOW".into(), "2026-11-23T15:01:30Z".into()));
    let (again, age) = observed(&airlock_tests::cli(
        &s.state_dir,
        &env,
        &["prices", "CLH27"],
    ));
    assert_eq!(again, at, "the time it was observed, not read");
    assert!((88..=90).contains(&age), "{age}");
}
