//! AWS-backend specifics on the moto emulator: AWS calls per operation (counted by an SDK
//! interceptor and logged per request), and outages that become a retryable 503 with
//! nothing half-written and no SDK text in the answer.

use airlock_tests::{Backend, Server, MARKET_OPEN};

/// `calls` with the run between the first call and the first write sorted.
fn reads_sorted(mut calls: Vec<String>) -> Vec<String> {
    let end = calls
        .iter()
        .position(|c| c.ends_with("TransactWriteItems") || c.starts_with("SQS."))
        .unwrap_or(calls.len());
    if end > 1 {
        calls[1..end].sort();
    }
    calls
}

fn calls_of(s: &Server, method: &str, path_end: &str, status: u64) -> Vec<Vec<String>> {
    s.request_log()
        .into_iter()
        .filter(|l| {
            l["method"] == method
                && l["path"].as_str().unwrap_or("").ends_with(path_end)
                && l["status"].as_u64() == Some(status)
        })
        .map(|l| {
            l["backend_calls"]
                .as_str()
                .unwrap_or("")
                .split(',')
                .filter(|c| !c.is_empty())
                .map(String::from)
                .collect()
        })
        .collect()
}

#[tokio::test]
async fn aws_calls_per_operation() {
    let s = Server::start_on(
        Backend::Aws,
        &[
            ("AIRLOCK_NOW", MARKET_OPEN),
            // Like the template's cache for the Lambda functions (1 s), longer: the orders
            // queue's count (execute's admission check) is read at most once a minute here.
            ("AIRLOCK_ORDERS_BACKLOG_CACHE_MS", "60000"),
        ],
    );
    let t = s.trader();
    let p = t.plan_buy("CLF27", 1).await;
    assert_eq!(p["executable"], true, "{:?}", p.body);
    assert_eq!(t.execute(&p, "calls-1").await.status, 202);
    assert_eq!(t.execute(&p, "calls-1").await.status, 200);
    let p2 = t.plan_buy("CLF27", 1).await;
    assert_eq!(t.execute(&p2, "calls-2").await.status, 202);
    assert_eq!(t.get("/orders?limit=10").await.status, 200);

    let plan = calls_of(&s, "POST", "/actions/plan", 200);
    assert_eq!(plan.len(), 2);
    let signs = plan[0]
        .iter()
        .filter(|c| c.starts_with("KMS."))
        .collect::<Vec<_>>();
    assert_eq!(
        signs,
        ["KMS.Sign"],
        "plan signs exactly once: {:?}",
        plan[0]
    );

    // An order's execute reads its account's positions, then the reference prices of the
    // order's contract and the open positions' (ACC-1 holds two contracts) in one call, and
    // the account's message window; the calls between the first read and the commit are
    // compared sorted.
    let queued: Vec<Vec<String>> = calls_of(&s, "POST", "/actions/execute", 202)
        .into_iter()
        .map(reads_sorted)
        .collect();
    assert_eq!(
        queued[0],
        [
            "DynamoDB.BatchGetItem",
            "DynamoDB.GetItem",
            "DynamoDB.GetItem",
            "DynamoDB.Query",
            "SQS.GetQueueAttributes",
            "DynamoDB.TransactWriteItems",
            "SQS.SendMessage"
        ],
        "the first order execute also counts the orders queue"
    );
    assert_eq!(
        queued[1],
        [
            "DynamoDB.BatchGetItem",
            "DynamoDB.GetItem",
            "DynamoDB.GetItem",
            "DynamoDB.Query",
            "DynamoDB.TransactWriteItems",
            "SQS.SendMessage"
        ],
        "an order's execute at its floor: one read, the account's positions, then every reference \
         price it needs in one call (the daily loss, the price band), the account's message \
         window, one atomic commit, one \
         send; no KMS"
    );
    let replay = calls_of(&s, "POST", "/actions/execute", 200);
    assert_eq!(
        replay[0],
        ["DynamoDB.BatchGetItem", "DynamoDB.PutItem"],
        "a replay: one read and its audit record, neither signs nor sends"
    );
}

#[tokio::test]
async fn an_aws_outage_is_a_clean_503() {
    let mut s = Server::start_on(Backend::Aws, &[("AIRLOCK_NOW", MARKET_OPEN)]);
    let t = s.trader();
    let p = t.plan_buy("CLF27", 1).await;
    assert_eq!(p["executable"], true);
    s.stop_emulator();
    for r in [
        t.get("/accounts").await,
        t.plan_buy("CLF27", 1).await,
        t.execute(&p, "outage-1").await,
    ] {
        r.assert_error(503, "upstream_unavailable");
        let text = r.body.to_string();
        for leak in ["dispatch", "Dynamo", "hyper", "127.0.0.1", "connection"] {
            assert!(
                !text.contains(leak),
                "no SDK detail reaches the client: {text}"
            );
        }
    }
}
