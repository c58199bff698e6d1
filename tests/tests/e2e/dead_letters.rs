//! Dead letters whose last receive never finished, on both backends: an order worker that
//! dies on every receive of a message (failpoint `worker.before_broker`) until the queue
//! dead-letters it. The dead-letter sweep (part of the sweeper) fails its action, saying
//! so, and rejects the order the broker never saw; `airlock queues redrive` moves the
//! dead letter back without reviving the failed trade. A dead letter redriven before any
//! sweep runs once.

use std::time::{Duration, Instant};

use airlock_tests::{both, Api, Backend, Resp, Server, Stack, MARKET_OPEN};

/// An accepted buy of 1 CLF27 on ACC-1 whose worker died on each of its five receives:
/// the stopped stack, the execute's answer and ACC-1's position before.
async fn died_on_every_receive(b: Backend) -> (Stack, Resp, i64) {
    let env = [
        ("AIRLOCK_NOW", MARKET_OPEN),
        ("AIRLOCK_WORKERS", "on"),
        ("AIRLOCK_WORKER_VISIBILITY_MS", "1000"),
        ("AIRLOCK_SWEEP_INTERVAL_MS", "600000"),
        ("AIRLOCK_FAILPOINTS", "worker.before_broker"),
    ];
    // Executed with the workers off, so the worker's crash cannot cut the answer short.
    let s = Server::start_on(
        b,
        &[("AIRLOCK_NOW", MARKET_OPEN), ("AIRLOCK_WORKERS", "off")],
    );
    let t = s.trader();
    let before = t.position("ACC-1", "CLF27").await;
    let p = t.plan_buy("CLF27", 1).await;
    let r = t.execute(&p, "dead-1").await;
    assert_eq!(r.status, 202, "{:?}", r.body);
    let mut stack = s.crash();
    // Every receive dies the same way.
    for _ in 0..airlock::core::records::MAX_RECEIVES {
        stack = stack.start(&env).wait_exit(Duration::from_secs(30));
    }
    (stack, r, before)
}

fn restart(stack: Stack, sweep_ms: &str) -> Server {
    stack.start(&[
        ("AIRLOCK_NOW", "2026-11-23T15:02:00Z"),
        ("AIRLOCK_WORKERS", "on"),
        ("AIRLOCK_WORKER_VISIBILITY_MS", "1000"),
        ("AIRLOCK_WORKER_RETRY_MS", "100"),
        ("AIRLOCK_SWEEP_INTERVAL_MS", sweep_ms),
    ])
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn action_status(t: &Api, id: &str) -> Resp {
    t.get(&format!("/actions/{id}")).await
}

both!(a_dead_lettered_order_is_failed_by_the_sweep_and_not_revived_by_a_redrive);
async fn a_dead_lettered_order_is_failed_by_the_sweep_and_not_revived_by_a_redrive(b: Backend) {
    let (stack, executed, before) = died_on_every_receive(b).await;
    let action_id = executed["action_id"].as_str().expect("an action id");
    let s = restart(stack, "100");
    let t = s.trader();
    // The sixth receive dead-letters it; the sweep settles its action.
    let deadline = Instant::now() + Duration::from_secs(30);
    let a = loop {
        let a = action_status(&t, action_id).await;
        if a["status"] == "failed" {
            break a;
        }
        assert!(Instant::now() < deadline, "never settled: {:?}", a.body);
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let error = a["error"].as_str().unwrap_or_default();
    assert!(error.contains("dead-lettered after 5 receives"), "{error}");
    let order_id = executed["resource_refs"]["order_id"]
        .as_str()
        .unwrap_or_default();
    assert_eq!(
        t.order(order_id).await["status"],
        "rejected",
        "never reached the broker"
    );
    assert_eq!(
        s.queue_counts("dead_letters"),
        1,
        "the dead letter stays for operators"
    );

    // After a fix, the operator moves it back: the failed trade is not resurrected. (On
    // SQS a dead letter the sweep is reading is hidden for a few seconds: the restart
    // below sweeps rarely, as a deployment does, and the redrive is run again until the
    // dead letter is visible.)
    let s = restart(s.crash(), "600000");
    let t = s.trader();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = s.cli(&["queues", "redrive"]);
        if out.contains("worker:orders redriven=1") {
            break;
        }
        assert!(Instant::now() < deadline, "never redriven: {out}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    until("the redriven message acknowledged", || {
        s.queued_messages() == 0
    })
    .await;
    assert_eq!(s.queue_counts("dead_letters"), 0);
    assert_eq!(action_status(&t, action_id).await["status"], "failed");
    assert_eq!(t.order(order_id).await["status"], "rejected");
    assert_eq!(t.position("ACC-1", "CLF27").await, before, "no fill");
    let book = s.broker_book("ACC-1");
    assert!(
        book["orders"].as_object().is_none_or(|o| o.is_empty()),
        "the broker never saw it: {book}"
    );
}

both!(a_dead_letter_redriven_before_any_sweep_runs_once);
async fn a_dead_letter_redriven_before_any_sweep_runs_once(b: Backend) {
    let (stack, executed, before) = died_on_every_receive(b).await;
    let action_id = executed["action_id"].as_str().expect("an action id");
    // No sweep in this process: the dead letter waits with its action unsettled.
    let s = restart(stack, "600000");
    until("dead-lettered", || s.queue_counts("dead_letters") == 1).await;
    let t = s.trader();
    assert_eq!(action_status(&t, action_id).await["status"], "processing");
    let out = s.cli(&["queues", "redrive"]);
    assert!(out.contains("worker:orders redriven=1"), "{out}");
    t.settled(action_id).await.assert_status(200, "succeeded");
    assert_eq!(
        t.position("ACC-1", "CLF27").await,
        before + 1,
        "filled once"
    );
    let book = s.broker_book("ACC-1");
    assert_eq!(
        book["orders"].as_object().map(|o| o.len()),
        Some(1),
        "{book}"
    );
}
