//! The per-account message throttle, on both backends: orders, changes and cancels that
//! execute accepts are counted per account over a sliding window
//! (`max_messages_per_window` in `message_window_seconds`); an order over it is refused
//! (429 `message_throttled`, `Retry-After`) and locks the account out for
//! `message_lockout_seconds`, during which only cancels pass. A refusal changes nothing
//! (the same execute passes after the lockout); a sync is not counted, nor is the replay of
//! an accepted execute. The count is a condition of execute's atomic commit: executes
//! racing for the last places pass exactly as many as there are.

use airlock_tests::{both, Api, Backend, Resp, Server, Stack, MARKET_OPEN};
use futures_util::future::join_all;
use serde_json::{json, Value};

/// A server at the market's open with the workers off (every accepted action stays
/// queued), rate limits this suite never meets, and a policy with this throttle.
fn start(b: Backend, max: u32, window_s: u32, lockout_s: u32) -> Server {
    let stack = Stack::new(b);
    let policy = json!({
        "version": "throttle",
        "confirmation": { "order.submit.cl": "token", "order.replace.cl": "token" },
        "max_messages_per_window": max,
        "message_window_seconds": window_s,
        "message_lockout_seconds": lockout_s,
    });
    std::fs::write(stack.state_dir.join("policy.json"), policy.to_string()).expect("policy");
    stack.start(&[
        ("AIRLOCK_NOW", MARKET_OPEN),
        ("AIRLOCK_EXECUTE_RATE_PER_MINUTE", "10000"),
        ("AIRLOCK_PLAN_RATE_PER_MINUTE", "10000"),
        ("AIRLOCK_ORDERS_BACKLOG_LIMIT", "0"),
    ])
}

/// `n` executable plans of a 1-lot buy on ACC-1.
async fn plans(t: &Api, n: usize) -> Vec<Resp> {
    let mut out = Vec::new();
    for _ in 0..n {
        let p = t.plan_buy("CLH27", 1).await;
        assert_eq!(p["executable"], true, "{:?}", p.body);
        out.push(p);
    }
    out
}

async fn plan_of(t: &Api, action_type: &str, payload: Value) -> Resp {
    let p = t
        .post(
            "/actions/plan",
            &json!({ "action_type": action_type, "payload": payload, "requested_by": "op-energy-trader" }),
        )
        .await;
    assert_eq!(p["executable"], true, "{:?}", p.body);
    p
}

/// A cancel of the demo's working order ORD-1003 on ACC-1.
async fn cancel_plan(t: &Api) -> Resp {
    plan_of(
        t,
        "order.cancel",
        json!({ "account_id": "ACC-1", "order_id": "ORD-1003" }),
    )
    .await
}

fn retry_after(r: &Resp) -> u64 {
    r.retry_after
        .as_deref()
        .expect("Retry-After")
        .parse()
        .expect("whole seconds")
}

fn throttled(r: &Resp) -> u64 {
    r.assert_error(429, "message_throttled");
    assert_eq!(
        r["status"], "rejected",
        "an execute's rejection: {:?}",
        r.body
    );
    retry_after(r)
}

async fn mcp_execute(t: &Api, p: &Resp) -> Value {
    t.mcp_tool(
        "execute_plan",
        json!({ "plan_id": p["plan_id"], "confirmation_token": p["confirmation_token"] }),
    )
    .await
}

// The server's clock starts at the market's open, on the minute: a window of 60 s is one
// bucket for the first minute of the process, so what is counted in it is exact.

both!(a_burst_over_the_threshold_is_refused_and_locks_the_account_out);
async fn a_burst_over_the_threshold_is_refused_and_locks_the_account_out(b: Backend) {
    let s = start(b, 5, 60, 30);
    let t = s.trader();
    let ps = plans(&t, 8).await;
    let cancels = [cancel_plan(&t).await, cancel_plan(&t).await];
    for (i, p) in ps[..5].iter().enumerate() {
        let r = t.execute(p, &format!("burst-{i}")).await;
        assert_eq!(r.status, 202, "order {i}: {:?}", r.body);
    }
    // The sixth starts the lockout: Retry-After is its end, or the window's room if later.
    let r = t.execute(&ps[5], "burst-5").await;
    let wait = throttled(&r);
    assert!((28..=60).contains(&wait), "Retry-After {wait}");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("ACC-1")
            && message.contains("5 orders, changes and cancels within 60 s")
            && message.contains("locked out for 30 s"),
        "{message}"
    );
    assert_eq!(s.queued_messages(), 5, "exactly the threshold was queued");
    // During the lockout: orders are refused (also through MCP), cancels pass.
    let r = t.execute(&ps[6], "burst-6").await;
    let wait = throttled(&r);
    assert!((20..=60).contains(&wait), "Retry-After {wait}");
    assert!(r["error"]["message"]
        .as_str()
        .unwrap()
        .contains("locked out"));
    let mcp = mcp_execute(&t, &ps[7]).await;
    assert_eq!(mcp["isError"], true, "{mcp}");
    assert_eq!(
        mcp["structuredContent"]["error"]["code"], "message_throttled",
        "{mcp}"
    );
    assert!(
        mcp["content"][0]["text"]
            .as_str()
            .is_some_and(|m| m.contains("Retry in")),
        "{mcp}"
    );
    for (i, c) in cancels.iter().enumerate() {
        let r = t.execute(c, &format!("cancel-{i}")).await;
        assert_eq!(r.status, 202, "a cancel passes the lockout: {:?}", r.body);
    }
    assert_eq!(s.queued_messages(), 7, "five orders and two cancels");
    // Another account has a window of its own.
    let other = plan_of(
        &t,
        "order.submit.cl",
        json!({ "account_id": "ACC-2", "symbol": "CLH27", "side": "buy", "quantity": 1, "order_type": "market" }),
    )
    .await;
    assert_eq!(t.execute(&other, "acc-2").await.status, 202);
    // A refusal is audited (it changes nothing: `orders_pass_again_after_the_lockout`).
    let pid = ps[5]["plan_id"].as_str().unwrap();
    let trail = s.audit(pid);
    assert!(
        trail.iter().any(|a| a["event"] == "execute"
            && a["decision"] == "rejected"
            && a["reason_code"] == "message_throttled"),
        "{trail:?}"
    );
}

both!(orders_pass_again_after_the_lockout);
async fn orders_pass_again_after_the_lockout(b: Backend) {
    // A short window: orders sent slower than the server answers slide out of it (the
    // emulator under a loaded machine answers in hundreds of milliseconds, hence its longer
    // window), so this sends orders until one is refused, the threshold passing first.
    let window = match b {
        Backend::Embedded => 2,
        Backend::Aws => 6,
    };
    let s = start(b, 3, window, 3);
    let t = s.trader();
    let ps = plans(&t, 16).await;
    let mut passed = 0;
    let (refused, wait) = loop {
        assert!(passed < 15, "never refused");
        let p = &ps[passed];
        let r = t.execute(p, &format!("k-{passed}")).await;
        if r.status == 202 {
            passed += 1;
            continue;
        }
        break (p, throttled(&r));
    };
    assert!(passed >= 3, "{passed} passed");
    assert!(
        (3..=2 * window as u64 + 1).contains(&wait),
        "Retry-After {wait}: the lockout, or the window"
    );
    let key = format!("k-{passed}");
    // Asked again during the lockout: refused, and the lockout is not extended.
    let r = t.execute(refused, &key).await;
    assert!(throttled(&r) <= wait);
    tokio::time::sleep(std::time::Duration::from_millis(wait * 1000 + 300)).await;
    // The same execute (same plan, same key) passes: the refusal decided nothing.
    let r = t.execute(refused, &key).await;
    assert_eq!(r.status, 202, "{:?}", r.body);
    // Once the window has moved past the burst, a new order passes too.
    tokio::time::sleep(std::time::Duration::from_secs(window as u64 + 1)).await;
    assert_eq!(t.execute(&ps[passed + 1], "next").await.status, 202);
    assert_eq!(s.queued_messages(), passed as i64 + 2);
}

both!(racing_executes_pass_exactly_the_threshold);
async fn racing_executes_pass_exactly_the_threshold(b: Backend) {
    let s = start(b, 5, 60, 30);
    let t = s.trader();
    let ps = plans(&t, 8).await;
    let keys: Vec<String> = (0..8).map(|i| format!("race-{i}")).collect();
    let results = join_all(ps.iter().zip(&keys).map(|(p, k)| t.execute(p, k))).await;
    let queued = results.iter().filter(|r| r.status == 202).count();
    let refused: Vec<&Resp> = results.iter().filter(|r| r.status != 202).collect();
    for r in &refused {
        throttled(r);
    }
    assert_eq!(
        (queued, refused.len()),
        (5, 3),
        "{:?}",
        results.iter().map(|r| &r.body).collect::<Vec<_>>()
    );
    assert_eq!(s.queued_messages(), 5);
}

both!(syncs_and_replays_are_not_counted);
async fn syncs_and_replays_are_not_counted(b: Backend) {
    let s = start(b, 3, 60, 30);
    let t = s.trader();
    let ps = plans(&t, 4).await;
    assert_eq!(t.execute(&ps[0], "once").await.status, 202);
    for _ in 0..4 {
        let r = t.execute(&ps[0], "once").await;
        assert_eq!((r.status, &r["status"]), (200, &json!("duplicate")));
    }
    for i in 0..4 {
        let sync = plan_of(&t, "positions.sync", json!({ "account_id": "ACC-1" })).await;
        let r = t.execute(&sync, &format!("sync-{i}")).await;
        assert_eq!(r.status, 202, "a sync is no message: {:?}", r.body);
    }
    assert_eq!(t.execute(&ps[1], "two").await.status, 202);
    assert_eq!(t.execute(&ps[2], "three").await.status, 202);
    throttled(&t.execute(&ps[3], "four").await);
}
