//! A crash (process abort) at every step boundary of execute and of the order worker, on
//! both backends, followed by the caller's retry, the restarted workers and the sweeper:
//! the key answers one action, the order reaches the broker once, the fill is recorded
//! once, and nothing is left queued or processing.
//!
//! The boundaries (failpoints of the `airlock-failpoints` build):
//! - `execute.after_commit`: decided and stored; on the embedded store also queued (the
//!   commit is its outbox), on AWS never sent (the sweeper sends it). On the embedded
//!   store the AWS shape runs too, with `execute.send_after_commit` (send after the commit);
//! - `execute.after_send`: sent, the caller never heard the answer;
//! - `worker.before_broker`: the order claimed for the broker, never submitted;
//! - `worker.after_broker`: the broker has the order, our record does not;
//! - `worker.before_ack`: handled, the message not deleted (redelivered).

use std::time::Duration;

use airlock_tests::{both, Api, Backend, Stack, MARKET_OPEN};

const POINTS: &[&str] = &[
    "execute.after_commit",
    "execute.after_send",
    "worker.before_broker",
    "worker.after_broker",
    "worker.before_ack",
];

/// One crash at `point` on `stack`, at `at` (each point later than the one before, so the
/// restart's clock never goes back), then the recovery; `done`: points before this one
/// (each left one order at the broker). Returns the stopped stack.
async fn crash_at(stack: Stack, point: &str, at: &str, later: &str, done: usize) -> Stack {
    let in_worker = point.starts_with("worker.");
    let key = format!("crash-{point}");
    let s = stack.start(&[
        ("AIRLOCK_NOW", at),
        ("AIRLOCK_FAILPOINTS", point),
        ("AIRLOCK_WORKERS", if in_worker { "on" } else { "off" }),
        ("AIRLOCK_WORKER_VISIBILITY_MS", "1000"),
        ("AIRLOCK_SWEEP_AFTER_MS", "3600000"),
    ]);
    let t = s.trader();
    let before = t.position("ACC-1", "CLF27").await;
    let p = t.plan_buy("CLF27", 1).await;
    assert_eq!(p["executable"], true, "{point}: {:?}", p.body);
    let first = t
        .try_post("/actions/execute", &Api::execute_body(&p, &key))
        .await;
    let first_id = match (&first, in_worker) {
        // The worker dies after execute answered.
        (Ok(r), true) => {
            assert_eq!(r.status, 202, "{point}: {:?}", r.body);
            Some(r["action_id"].as_str().unwrap_or_default().to_string())
        }
        // The process died before the answer reached the caller: at an execute point,
        // or at a worker point when the worker, woken by the commit that queued the
        // message (the embedded outbox), got there before the answer was written.
        (Err(_), _) => None,
        (other, _) => panic!("{point}: the crash did not happen where expected: {other:?}"),
    };
    let stack = s.wait_exit(Duration::from_secs(30));

    // Two minutes later: no failpoints, the workers on, the sweeper looking every 100 ms.
    let s = stack.start(&[
        ("AIRLOCK_NOW", later),
        ("AIRLOCK_WORKERS", "on"),
        ("AIRLOCK_WORKER_RETRY_MS", "100"),
        ("AIRLOCK_WORKER_VISIBILITY_MS", "1000"),
        ("AIRLOCK_SWEEP_INTERVAL_MS", "100"),
    ]);
    let t = s.trader();
    // The caller retries with the same key: the key was decided at the atomic step.
    let r = t.execute(&p, &key).await;
    assert_eq!(
        (r.status, r["status"].as_str()),
        (200, Some("duplicate")),
        "{point}: {:?}",
        r.body
    );
    let action_id = r["action_id"].as_str().unwrap_or_default().to_string();
    if let Some(id) = first_id {
        assert_eq!(action_id, id, "{point}: one action for the key");
    }
    let a = t.settled(&action_id).await;
    assert_eq!(a["status"], "succeeded", "{point}: {:?}", a.body);
    let order_id = a["resource_refs"]["order_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(t.order(&order_id).await["status"], "filled", "{point}");
    assert_eq!(
        t.position("ACC-1", "CLF27").await,
        before + 1,
        "{point}: the fill recorded exactly once"
    );
    let book = s.broker_book("ACC-1");
    let at_broker = book["orders"].as_object().cloned().unwrap_or_default();
    assert!(at_broker.contains_key(&order_id), "{point}: at the broker");
    assert_eq!(
        at_broker.len(),
        done + 1,
        "{point}: one more order at the broker: {at_broker:?}"
    );
    // A redelivered copy (the message not deleted before the crash) is acknowledged as
    // soon as it is seen again.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut left = s.queued_messages();
    while left > 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        left = s.queued_messages();
    }
    assert_eq!(
        left,
        0,
        "{point}: nothing left queued: {}",
        s.cli(&["queues"])
    );
    s.crash()
}

both!(a_crash_at_every_step_boundary_loses_nothing_and_doubles_nothing);
async fn a_crash_at_every_step_boundary_loses_nothing_and_doubles_nothing(b: Backend) {
    // One stack for every point: each crash and recovery three minutes after the last.
    let mut stack = Stack::new(b);
    let mut points = POINTS.to_vec();
    if b == Backend::Embedded {
        // The commit-then-send window of the AWS shape, which the outbox closes here.
        points.push("execute.send_after_commit,execute.after_commit");
    }
    for (i, point) in points.iter().enumerate() {
        let at = format!("2026-11-23T15:{:02}:00Z", i * 3);
        let later = format!("2026-11-23T15:{:02}:00Z", i * 3 + 2);
        stack = crash_at(stack, point, &at, &later, i).await;
    }
    assert_eq!(
        MARKET_OPEN, "2026-11-23T15:00:00Z",
        "the schedule starts at the open"
    );
}
