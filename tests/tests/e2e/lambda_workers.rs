//! The worker and sweeper Lambda binaries under the Lambda Runtime API emulator, fed SQS
//! and scheduled events, on the embedded backend's state dir.

use std::time::Duration;

use airlock_tests::lambda::{embedded_function_env, LambdaEmulator};
use airlock_tests::{Backend, Server, MARKET_OPEN};
use serde_json::{json, Value};

const TIMEOUT: Duration = Duration::from_secs(30);

fn sqs_event(records: &[(&str, &str, &str)]) -> Value {
    json!({
        "Records": records.iter().map(|(id, body, group)| json!({
            "messageId": id,
            "receiptHandle": format!("receipt-{id}"),
            "body": body,
            "attributes": { "ApproximateReceiveCount": "1", "MessageGroupId": group },
            "messageAttributes": {},
            "eventSource": "aws:sqs",
            "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:airlock-orders.fifo",
            "awsRegion": "us-east-1"
        })).collect::<Vec<_>>()
    })
}

#[tokio::test]
async fn the_order_worker_lambda_fills_a_queued_order_and_reports_failed_records() {
    // Queue an order with `airlock serve` (workers off), then stop it.
    let s = Server::start_on(Backend::Embedded, &[("AIRLOCK_NOW", MARKET_OPEN)]);
    let t = s.trader();
    let p = t.plan_buy("CLF27", 2).await;
    let e = t.execute(&p, "lambda-w-1").await;
    assert_eq!(e.status, 202, "{:?}", e.body);
    let body: String = s
        .db()
        .query_row("SELECT body FROM queue", [], |r| {
            airlock_tests::stored_body(r, 0)
        })
        .unwrap();
    let order_id = e["resource_refs"]["order_id"].as_str().unwrap().to_string();
    let stack = s.crash();
    let emu = LambdaEmulator::start();
    let env = embedded_function_env(&stack.state_dir, &[]);
    let mut f = emu.spawn_ready("worker-orders", &env);
    let out = f
        .invoke(
            sqs_event(&[("m-1", &body, "ACC-1"), ("m-2", "{not json", "ACC-9")]),
            TIMEOUT,
        )
        .expect("invocation");
    assert_eq!(
        out,
        json!({ "batchItemFailures": [{ "itemIdentifier": "m-2" }] })
    );
    // Redelivered: already handled, nothing fails, nothing is ordered twice.
    let again = f
        .invoke(sqs_event(&[("m-1", &body, "ACC-1")]), TIMEOUT)
        .expect("invocation");
    assert_eq!(again, json!({ "batchItemFailures": [] }));
    f.stop();

    let s = stack.start(&[("AIRLOCK_NOW", MARKET_OPEN)]);
    let status: String = s
        .db()
        .query_row(
            "SELECT status FROM orders WHERE order_id = ?",
            [&order_id],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(status, "filled");
    let book = s.broker_book("ACC-1");
    assert_eq!(book["orders"].as_object().unwrap().len(), 1);
    let a = s
        .trader()
        .get(&format!("/actions/{}", e["action_id"].as_str().unwrap()))
        .await;
    assert_eq!(a["status"], "succeeded");

    // The sweeper, on a scheduled event.
    let mut sw = emu.spawn_ready("sweeper", &env);
    let out = sw
        .invoke(
            json!({"source": "aws.events", "detail-type": "Scheduled Event", "detail": {}}),
            TIMEOUT,
        )
        .expect("invocation");
    assert_eq!(out, json!({ "sent": 0 }));
}

/// An invocation whose deadline is nearer than one record's worst case (five operation
/// timeouts, 10 s by default): the first record is handled, the rest are handed back
/// untouched as batch item failures (no order made for them) instead of running into the
/// function's timeout; handed back again with time to spare, they are handled.
#[tokio::test]
async fn the_order_worker_lambda_hands_back_what_its_deadline_leaves_no_room_for() {
    let s = Server::start_on(Backend::Embedded, &[("AIRLOCK_NOW", MARKET_OPEN)]);
    let t = s.trader();
    let mut executed = Vec::new();
    for key in ["lambda-dl-1", "lambda-dl-2"] {
        let p = t.plan_buy("CLF27", 1).await;
        let e = t.execute(&p, key).await;
        assert_eq!(e.status, 202, "{:?}", e.body);
        executed.push(e);
    }
    let bodies: Vec<String> = {
        let db = s.db();
        let mut q = db.prepare("SELECT body FROM queue ORDER BY rowid").unwrap();
        let rows = q
            .query_map([], |r| airlock_tests::stored_body(r, 0))
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        rows
    };
    assert_eq!(bodies.len(), 2);
    let order_ids: Vec<String> = executed
        .iter()
        .map(|e| e["resource_refs"]["order_id"].as_str().unwrap().to_string())
        .collect();
    let stack = s.crash();
    let emu = LambdaEmulator::start();
    let mut f = emu.spawn_ready(
        "worker-orders",
        &embedded_function_env(&stack.state_dir, &[]),
    );
    let short = f
        .invoke(
            sqs_event(&[
                ("m-1", &bodies[0], "ACC-1#a"),
                ("m-2", &bodies[1], "ACC-1#b"),
            ]),
            Duration::from_secs(8),
        )
        .expect("invocation");
    assert_eq!(
        short,
        json!({ "batchItemFailures": [{ "itemIdentifier": "m-2" }] })
    );
    let again = f
        .invoke(sqs_event(&[("m-2", &bodies[1], "ACC-1#b")]), TIMEOUT)
        .expect("invocation");
    assert_eq!(again, json!({ "batchItemFailures": [] }));
    f.stop();

    let s = stack.start(&[("AIRLOCK_NOW", MARKET_OPEN)]);
    let status = |id: &str| -> Option<String> {
        s.db()
            .query_row("SELECT status FROM orders WHERE order_id = ?", [id], |r| {
                r.get(0)
            })
            .ok()
    };
    assert_eq!(status(&order_ids[0]).as_deref(), Some("filled"));
    assert_eq!(status(&order_ids[1]).as_deref(), Some("filled"));
}
