//! Faults on the AWS path, on the wire: `airlock serve` on the AWS backend with a fault
//! proxy (`airlock_tests::faults`) between its SDK and the emulator, answering some calls
//! the way real AWS sometimes does and the emulator never does: a lost reply after the
//! write, throttling, 500s, transaction conflicts, unprocessed keys, a stalled call.
//!
//! What must hold: an upstream failure answers 503 `upstream_unavailable` with
//! `Retry-After`, never a 500, and leaves nothing half-written; a retry with the same
//! idempotency key gets one answer naming one action; an accepted action is queued exactly
//! once. Each test fails loudly without the emulator.

use std::time::{Duration, Instant};

use airlock_tests::faults::{Fault, FaultProxy};
use airlock_tests::{Api, Backend, Resp, Server, Stack, MARKET_OPEN};

/// `airlock serve` on the AWS backend, its AWS calls through a new proxy.
fn start(extra: &[(&str, &str)]) -> (Server, FaultProxy) {
    let stack = Stack::new(Backend::Aws);
    let upstream = stack
        .emulator_endpoint()
        .expect("the AWS stack has an emulator");
    let proxy = FaultProxy::start(&upstream);
    let mut env = vec![
        ("AIRLOCK_NOW", MARKET_OPEN),
        ("AWS_ENDPOINT_URL", proxy.endpoint.as_str()),
    ];
    env.extend_from_slice(extra);
    (stack.start(&env), proxy)
}

async fn executable_plan(t: &Api) -> Resp {
    let p = t.plan_buy("CLF27", 1).await;
    assert_eq!(p.status, 200, "{:?}", p.body);
    assert_eq!(p["executable"], true, "{:?}", p.body);
    p
}

fn assert_unavailable(r: &Resp, what: &str) {
    assert_eq!(
        (r.status, r.code()),
        (503, "upstream_unavailable"),
        "{what}: {:?}",
        r.body
    );
    assert!(
        r.retry_after
            .as_deref()
            .is_some_and(|v| v.parse::<u64>().is_ok()),
        "{what}: 503 carries Retry-After"
    );
}

#[tokio::test]
async fn a_lost_reply_of_the_execute_commit_still_answers_202_once() {
    let (s, proxy) = start(&[]);
    let t = s.trader();
    let p = executable_plan(&t).await;
    // The commit is applied, its reply never arrives; the SDK sends it again.
    proxy.on("TransactWriteItems", Fault::DropReply, Some(1));
    let r = t.execute(&p, "lost-1").await;
    assert_eq!(
        (r.status, r["status"].as_str()),
        (202, Some("queued")),
        "not 409 about itself: {:?}",
        r.body
    );
    assert_eq!(
        proxy.faulted("TransactWriteItems"),
        1,
        "the reply was dropped"
    );
    let action_id = r["action_id"].as_str().expect("action id").to_string();
    let dup = t.execute(&p, "lost-1").await;
    assert_eq!(
        (dup.status, dup["action_id"].as_str()),
        (200, Some(action_id.as_str()))
    );
    assert_eq!(s.queued_messages(), 1, "queued once");
}

/// The proxy keeps the SDK's connections alive, as AWS does (moto closes each one): what
/// `lambda-bench --execute-aws` relies on to measure the function as it runs on AWS. moto
/// answers `HTTP/1.0`; passed on as is, the SDK closed every connection after one call.
#[tokio::test]
async fn the_proxy_keeps_the_sdk_connections_alive() {
    let (s, proxy) = start(&[("AIRLOCK_WORKERS", "off")]);
    let t = s.trader();
    let (calls, connections) = (proxy.total(), proxy.connections());
    for i in 0..5 {
        let p = executable_plan(&t).await;
        let r = t.execute(&p, &format!("alive-{i}")).await;
        assert_eq!(r.status, 202, "{:?}", r.body);
    }
    let (calls, connections) = (proxy.total() - calls, proxy.connections() - connections);
    assert!(
        calls >= 40,
        "five plans and executes made {calls} AWS calls"
    );
    // One connection, or a few where a background call overlaps a request's; a proxy that
    // does not keep them alive makes one per call.
    assert!(
        connections <= 4,
        "{connections} new connections for {calls} calls: not kept alive"
    );
}

#[tokio::test]
async fn throttled_dynamodb_answers_503_and_the_same_key_succeeds_after() {
    let (s, proxy) = start(&[]);
    let t = s.trader();
    let p = executable_plan(&t).await;
    proxy.on("BatchGetItem", Fault::Throttle, None);
    proxy.on("Scan", Fault::Throttle, None);
    proxy.on("GetItem", Fault::Throttle, None);
    assert_unavailable(&t.execute(&p, "thr-1").await, "execute");
    assert_unavailable(&t.get("/accounts").await, "GET /accounts");
    assert_unavailable(&t.plan_buy("CLF27", 1).await, "plan");
    assert!(proxy.faulted("BatchGetItem") >= 1);
    proxy.heal();
    let r = t.execute(&p, "thr-1").await;
    assert_eq!(r.status, 202, "{:?}", r.body);
    assert_eq!(s.queued_messages(), 1);
}

#[tokio::test]
async fn a_failing_signer_at_plan_answers_503() {
    let (_s, proxy) = start(&[]);
    let t = _s.trader();
    proxy.on("Sign", Fault::Status500, None);
    assert_unavailable(&t.plan_buy("CLF27", 1).await, "plan");
    assert!(proxy.faulted("Sign") >= 1);
    proxy.heal();
    executable_plan(&t).await;
}

/// KMS `Sign`'s quota is per second (ECC: 300 a second per account and Region): a throttled
/// `Sign` is tried again at once and the plan succeeds; one throttled on every attempt
/// gives up after three, within about half a second, and the plan answers 503 with
/// nothing stored.
#[tokio::test]
async fn a_throttled_sign_is_retried_briefly_then_answers_503() {
    let (s, proxy) = start(&[("AIRLOCK_WORKERS", "off")]);
    let t = s.trader();
    proxy.on("Sign", Fault::Throttle, Some(1));
    executable_plan(&t).await;
    assert_eq!((proxy.faulted("Sign"), proxy.count("Sign")), (1, 2));

    proxy.on("Sign", Fault::Throttle, None);
    let writes = || {
        [
            "TransactWriteItems",
            "PutItem",
            "UpdateItem",
            "BatchWriteItem",
        ]
        .iter()
        .map(|op| proxy.count(op))
        .sum::<usize>()
    };
    let (signs, before) = (proxy.count("Sign"), writes());
    let started = Instant::now();
    let r = t.plan_buy("CLF27", 1).await;
    let took = started.elapsed();
    assert_unavailable(&r, "plan");
    assert_eq!(proxy.count("Sign") - signs, 3, "three attempts");
    assert!(
        took < Duration::from_millis(1_500),
        "gave up after {took:?}"
    );
    assert_eq!(
        writes(),
        before,
        "a plan that could not sign stores nothing"
    );
    proxy.heal();
    executable_plan(&t).await;
}

#[tokio::test]
async fn a_failing_send_answers_503_with_the_action_and_the_retry_queues_it_once() {
    let (s, proxy) = start(&[]);
    let t = s.trader();
    let p = executable_plan(&t).await;
    proxy.on("SendMessage", Fault::Status500, None);
    let r = t.execute(&p, "send-1").await;
    assert_unavailable(&r, "execute with SQS failing");
    let action_id = r.body["action_id"]
        .as_str()
        .expect("the accepted action")
        .to_string();
    assert_eq!(s.queued_messages(), 0);
    proxy.heal();
    let again = t.execute(&p, "send-1").await;
    assert_eq!(
        (again.status, again["action_id"].as_str()),
        (202, Some(action_id.as_str())),
        "{:?}",
        again.body
    );
    assert_eq!(s.queued_messages(), 1, "queued once");
}

#[tokio::test]
async fn a_transaction_conflict_on_the_commit_is_decided_again() {
    let (s, proxy) = start(&[]);
    let t = s.trader();
    let p = executable_plan(&t).await;
    proxy.on("TransactWriteItems", Fault::TransactionConflict, Some(1));
    let r = t.execute(&p, "conflict-1").await;
    assert_eq!(r.status, 202, "{:?}", r.body);
    assert_eq!(proxy.faulted("TransactWriteItems"), 1);
    assert_eq!(s.queued_messages(), 1);
}

#[tokio::test]
async fn a_single_write_refused_by_a_transaction_conflict_is_retried() {
    let (_s, proxy) = start(&[]);
    let t = _s.trader();
    let p = executable_plan(&t).await;
    assert_eq!(t.execute(&p, "wc-1").await.status, 202);
    // A replay's only write is its audit record: one PutItem, refused once.
    proxy.on("PutItem", Fault::WriteConflict, Some(1));
    let r = t.execute(&p, "wc-1").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(proxy.faulted("PutItem"), 1, "the conflict was answered");
}

#[tokio::test]
async fn unprocessed_keys_are_read_again() {
    let (s, proxy) = start(&[]);
    let t = s.trader();
    let p = executable_plan(&t).await;
    proxy.on("BatchGetItem", Fault::UnprocessedKeys, Some(2));
    let r = t.execute(&p, "unproc-1").await;
    assert_eq!(r.status, 202, "{:?}", r.body);
    assert_eq!(
        proxy.count("BatchGetItem"),
        3,
        "two answered unprocessed, then read"
    );
    assert_eq!(s.queued_messages(), 1);
}

#[tokio::test]
async fn a_stalled_call_answers_503_within_its_limits() {
    let (_s, proxy) = start(&[
        ("AIRLOCK_AWS_ATTEMPT_TIMEOUT_MS", "500"),
        ("AIRLOCK_AWS_OPERATION_TIMEOUT_MS", "1500"),
    ]);
    let t = _s.trader();
    let p = executable_plan(&t).await;
    proxy.on("BatchGetItem", Fault::Delay(Duration::from_secs(10)), None);
    let started = Instant::now();
    let r = t.execute(&p, "stall-1").await;
    let took = started.elapsed();
    assert_unavailable(&r, "execute with a stalled read");
    assert!(
        took < Duration::from_secs(5),
        "answered after {took:?}, not bounded by the call limits"
    );
}

/// A small deterministic generator (xorshift64*), so a failing schedule can be replayed
/// from its printed seed (`AIRLOCK_FAULT_SEED`).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Faults a schedule draws from: (operation, fault, most applications).
fn menu() -> Vec<(&'static str, Fault, u64)> {
    vec![
        ("TransactWriteItems", Fault::DropReply, 1),
        ("TransactWriteItems", Fault::TransactionConflict, 2),
        ("TransactWriteItems", Fault::Status500, 4),
        ("SendMessage", Fault::Status500, 4),
        ("SendMessage", Fault::DropReply, 1),
        ("BatchGetItem", Fault::Throttle, 4),
        ("BatchGetItem", Fault::UnprocessedKeys, 3),
        ("PutItem", Fault::WriteConflict, 2),
        ("PutItem", Fault::Status500, 4),
    ]
}

/// Random fault schedules on execute, then the workers and the sweeper with the faults
/// healed: every key settles on one action, every accepted action reaches the broker
/// exactly once, and nothing is left queued or processing.
#[tokio::test]
async fn random_fault_schedules_never_lose_or_double_an_action() {
    let seed = std::env::var("AIRLOCK_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
                | 1
        });
    eprintln!("fault schedule seed: {seed} (replay with AIRLOCK_FAULT_SEED={seed})");
    let mut rng = Rng(seed);
    let (s, proxy) = start(&[("AIRLOCK_SWEEP_AFTER_MS", "3600000")]);
    let t = s.trader();
    let initial = t.position("ACC-1", "CLF27").await;
    let menu = menu();
    let (mut buys, mut sells) = (0, 0);
    // key -> every action id an accepting answer (200/202) named.
    let mut answers: Vec<(String, Vec<String>)> = Vec::new();
    for i in 0..8 {
        // Five buys and three sells: a doubled or lost fill shows in the net position.
        let side = if i % 3 == 2 { "sell" } else { "buy" };
        if side == "buy" {
            buys += 1;
        } else {
            sells += 1;
        }
        let p = t
            .post(
                "/actions/plan",
                &serde_json::json!({
                    "action_type": "order.submit.cl",
                    "payload": { "account_id": "ACC-1", "symbol": "CLF27", "side": side,
                                 "quantity": 1, "order_type": "market" },
                    "requested_by": "op-energy-trader"
                }),
            )
            .await;
        assert_eq!(p["executable"], true, "seed {seed}: {:?}", p.body);
        let (op, fault, most) = menu[rng.below(menu.len() as u64) as usize].clone();
        let times = 1 + rng.below(most) as usize;
        proxy.on(op, fault.clone(), Some(times));
        let key = format!("sched-{i}");
        let mut named = Vec::new();
        for attempt in 0..4 {
            let r = t.execute(&p, &key).await;
            match r.status {
                200 | 202 => {
                    named.push(r["action_id"].as_str().unwrap_or_default().to_string());
                    break;
                }
                503 | 409 => {
                    assert!(r.retry_after.is_some(), "seed {seed}: {:?}", r.body);
                    if attempt >= 1 {
                        proxy.heal();
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                other => panic!("seed {seed}: {op} {fault:?} x{times}: {other} {:?}", r.body),
            }
        }
        proxy.heal();
        // A last replay answers from the key's decision.
        let r = t.execute(&p, &key).await;
        assert_eq!(
            r.status, 200,
            "seed {seed}: {op} {fault:?} x{times}: {:?}",
            r.body
        );
        named.push(r["action_id"].as_str().unwrap_or_default().to_string());
        answers.push((key, named));
    }
    for (key, named) in &answers {
        assert!(
            named.windows(2).all(|w| w[0] == w[1]) && !named[0].is_empty(),
            "seed {seed}: key {key} answered with several actions: {named:?}"
        );
    }

    // The workers and the sweeper, faults healed, a while later.
    let s = s.crash().start(&[
        ("AIRLOCK_NOW", "2026-11-23T15:05:00Z"),
        ("AWS_ENDPOINT_URL", proxy.endpoint.as_str()),
        ("AIRLOCK_WORKERS", "on"),
        ("AIRLOCK_SWEEP_INTERVAL_MS", "200"),
        ("AIRLOCK_WORKER_RETRY_MS", "100"),
    ]);
    let t = s.trader();
    let mut orders = Vec::new();
    for (key, named) in &answers {
        let a = t.settled(&named[0]).await;
        assert_eq!(a["status"], "succeeded", "seed {seed}: {key}: {:?}", a.body);
        orders.push(
            a["resource_refs"]["order_id"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        );
    }
    let book = s.broker_book("ACC-1");
    let at_broker = book["orders"].as_object().cloned().unwrap_or_default();
    for o in &orders {
        assert!(
            at_broker.contains_key(o),
            "seed {seed}: order {o} never reached the broker"
        );
    }
    let mut unique = orders.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(
        unique.len(),
        orders.len(),
        "seed {seed}: two keys share an order"
    );
    assert_eq!(
        t.position("ACC-1", "CLF27").await,
        initial + buys - sells,
        "seed {seed}: each fill recorded exactly once"
    );
    assert_eq!(s.queued_messages(), 0, "seed {seed}: nothing left queued");
}

/// A market buy of 1 executed with the workers on, while the order worker's
/// transactions whose body contains `text` are applied and their replies lost `times`
/// times: every one was faulted, the action `succeeded`, the order filled once.
async fn worker_carries_on_after_lost_replies(text: &str, times: usize, key: &str) {
    let (s, proxy) = start(&[
        ("AIRLOCK_WORKERS", "on"),
        ("AIRLOCK_WORKER_RETRY_MS", "100"),
        ("AIRLOCK_WORKER_VISIBILITY_MS", "1000"),
    ]);
    let t = s.trader();
    let before = t.position("ACC-1", "CLF27").await;
    let p = executable_plan(&t).await;
    proxy.on_matching(
        "TransactWriteItems",
        Some(text),
        Fault::DropReply,
        Some(times),
    );
    let r = t.execute(&p, key).await;
    assert_eq!(r.status, 202, "{:?}", r.body);
    let a = t.settled(r["action_id"].as_str().unwrap_or_default()).await;
    assert_eq!(a["status"], "succeeded", "{:?}", a.body);
    assert_eq!(
        proxy.faulted("TransactWriteItems"),
        times,
        "every matching reply was dropped"
    );
    let order_id = a["resource_refs"]["order_id"].as_str().unwrap_or_default();
    assert_eq!(t.order(order_id).await["status"], "filled");
    assert_eq!(
        t.position("ACC-1", "CLF27").await,
        before + 1,
        "filled once"
    );
}

#[tokio::test]
async fn the_worker_carries_on_when_its_writes_lose_their_replies() {
    // The order worker's transactions (they write the orders table) are applied, and
    // their replies lost, twice (the claim's, and the SDK's retry of it).
    worker_carries_on_after_lost_replies("airlock-orders\"", 2, "wlost-1").await;
}

#[tokio::test]
async fn the_worker_carries_on_when_its_record_with_the_settle_loses_its_reply() {
    // The order's record with its action's settle (the one transaction that moves an
    // action's status) is applied and its reply lost; the SDK's retry fails its condition.
    worker_carries_on_after_lost_replies(
        "updated_at = :now, enqueued_at = if_not_exists(enqueued_at, :now)",
        1,
        "slost-1",
    )
    .await;
}

#[tokio::test]
async fn the_sweeper_sends_what_a_crash_left_when_sqs_comes_back() {
    let stack = Stack::new(Backend::Aws);
    let proxy = FaultProxy::start(&stack.emulator_endpoint().expect("emulator"));
    let s = stack.start(&[
        ("AIRLOCK_NOW", MARKET_OPEN),
        ("AWS_ENDPOINT_URL", proxy.endpoint.as_str()),
        ("AIRLOCK_FAILPOINTS", "execute.after_commit"),
    ]);
    let t = s.trader();
    let p = executable_plan(&t).await;
    let died = t
        .try_post("/actions/execute", &Api::execute_body(&p, "swept-1"))
        .await;
    assert!(died.is_err(), "the server died after the commit");
    let stack = s.wait_exit(Duration::from_secs(30));
    // SQS fails the sweeper's first sends (every attempt of them), then recovers.
    proxy.on("SendMessage", Fault::Status500, Some(6));
    let s = stack.start(&[
        ("AIRLOCK_NOW", "2026-11-23T15:02:00Z"),
        ("AWS_ENDPOINT_URL", proxy.endpoint.as_str()),
        ("AIRLOCK_SWEEP_INTERVAL_MS", "200"),
    ]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while s.queued_messages() == 0 {
        assert!(Instant::now() < deadline, "the sweeper never sent it");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(proxy.faulted("SendMessage") >= 3, "the first sends failed");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(s.queued_messages(), 1, "sent once");
    let r = s.trader().execute(&p, "swept-1").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
}

#[tokio::test]
async fn a_stale_unsent_index_does_not_make_the_sweeper_send_twice() {
    // No workers: the action stays undelivered, so the sweeper sends it (after 1 s).
    let (s, proxy) = start(&[
        ("AIRLOCK_SWEEP_AFTER_MS", "1000"),
        ("AIRLOCK_SWEEP_INTERVAL_MS", "200"),
    ]);
    let t = s.trader();
    let p = executable_plan(&t).await;
    let r = t.execute(&p, "stale-1").await;
    assert_eq!(r.status, 202, "{:?}", r.body);
    let action_id = r["action_id"].as_str().unwrap_or_default().to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    let resent = |s: &Server| {
        s.audit(&action_id)
            .iter()
            .filter(|a| a["decision"] == "resent")
            .count()
    };
    while resent(&s) == 0 {
        assert!(Instant::now() < deadline, "the sweeper never looked at it");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Sent and out of the index; from now on the index answers with its last listing,
    // which still holds the action.
    proxy.on("Query", Fault::Stale, None);
    let passes = proxy.faulted("Query");
    while proxy.faulted("Query") < passes + 5 {
        assert!(Instant::now() < deadline, "the sweeper stopped");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Each later pass saw the stale row, re-read the action and left it.
    assert_eq!(resent(&s), 1, "sent again from a stale index row");
    assert_eq!(s.queued_messages(), 1);
}

/// `airlock bootstrap` whose `CreateTable` reply is lost: the SDK sends it again, DynamoDB
/// answers that the table exists (it was created), and the bootstrap carries on from there
/// instead of failing.
#[tokio::test]
async fn a_bootstrap_whose_create_table_reply_was_lost_carries_on() {
    let stack = Stack::new(Backend::Aws);
    let proxy = FaultProxy::start(&stack.emulator_endpoint().expect("emulator"));
    proxy.on("CreateTable", Fault::DropReply, Some(1));
    let out = stack.cli(
        &[("AWS_ENDPOINT_URL", proxy.endpoint.as_str())],
        &["bootstrap"],
    );
    assert!(!out.is_empty(), "bootstrap reported nothing");
    // Every table is there, once: a second bootstrap has nothing to create.
    let again = stack.cli(&[], &["bootstrap"]);
    assert!(!again.contains("created"), "{again}");
}

/// The worker's creation of an order (one transaction: the order and its exposure step)
/// cancelled by `TransactionConflict` on every try, as DynamoDB does while another
/// transaction holds one of its items (a hot exposure item): each delivery sends it again
/// with jittered backoff for its budget (more than three tries), then fails retryable
/// ("transaction conflicts"), never as a vanished order; once the conflicts stop, the next
/// delivery fills it once. Then four conflicts in a row are absorbed inside one delivery.
#[tokio::test]
async fn an_order_creation_that_keeps_conflicting_backs_off_and_is_retried() {
    let (s, proxy) = start(&[
        ("AIRLOCK_WORKERS", "on"),
        ("AIRLOCK_WORKER_RETRY_MS", "100"),
        ("AIRLOCK_WORKER_VISIBILITY_MS", "1000"),
    ]);
    let t = s.trader();
    let before = t.position("ACC-1", "CLF27").await;
    let create = "attribute_not_exists(order_id)";
    let failed = |s: &Server| {
        s.log_lines()
            .into_iter()
            .filter(|l| l["fields"]["message"] == "message failed")
            .map(|l| {
                l["fields"]["cause"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect::<Vec<_>>()
    };
    proxy.on_matching(
        "TransactWriteItems",
        Some(create),
        Fault::TransactionConflict,
        None,
    );
    let p = executable_plan(&t).await;
    let r = t.execute(&p, "hot-1").await;
    assert_eq!(r.status, 202, "{:?}", r.body);
    let deadline = Instant::now() + Duration::from_secs(30);
    while failed(&s).is_empty() {
        assert!(Instant::now() < deadline, "no delivery failed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let causes = failed(&s);
    assert!(
        causes[0].contains("transaction conflicts"),
        "retryable, named as conflicts: {causes:?}"
    );
    assert!(
        proxy.faulted("TransactWriteItems") > 3,
        "more than three tries in the first delivery"
    );
    let lines = serde_json::to_string(&s.log_lines()).unwrap_or_default();
    assert!(
        !lines.contains("vanished"),
        "never reported as a vanished order"
    );
    proxy.heal();
    let action_id = r["action_id"].as_str().unwrap_or_default().to_string();
    t.settled(&action_id).await.assert_status(200, "succeeded");
    assert_eq!(
        t.position("ACC-1", "CLF27").await,
        before + 1,
        "filled once"
    );

    // Four conflicts, then none: one delivery absorbs them.
    let failures = failed(&s).len();
    proxy.on_matching(
        "TransactWriteItems",
        Some(create),
        Fault::TransactionConflict,
        Some(4),
    );
    let p = executable_plan(&t).await;
    let r = t.execute(&p, "hot-2").await;
    assert_eq!(r.status, 202, "{:?}", r.body);
    let a = t.settled(r["action_id"].as_str().unwrap_or_default()).await;
    assert_eq!(a["status"], "succeeded", "{:?}", a.body);
    assert_eq!(
        failed(&s).len(),
        failures,
        "no delivery failed: {:?}",
        failed(&s)
    );
    assert_eq!(t.position("ACC-1", "CLF27").await, before + 2);
}

/// No item shared by every execute: with executes spread over operators and accounts, no
/// single item is in more than 40 % of execute transactions (DynamoDB cancels transactions
/// that touch one item at the same time, which moto never does), and the firm-wide control
/// record (`global`) is in none. Read off the wire: every `TransactWriteItems` the server
/// sends is kept by the proxy and taken apart item by item.
#[tokio::test]
async fn no_item_is_shared_by_every_execute() {
    use airlock::adapters::aws::shapes;
    use std::collections::BTreeMap;

    // 18 orders at once: no backlog hold (the workers drain the emulator slowly).
    let (s, proxy) = start(&[("AIRLOCK_ORDERS_BACKLOG_LIMIT", "0")]);
    let service = s.service_token();
    let operators = ["op-ana", "op-ben", "op-cleo", "op-dev", "op-eli", "op-fay"];
    let accounts = ["ACC-1", "ACC-2", "ACC-3"];
    proxy.record("TransactWriteItems");
    let mut executes = 0;
    for op in operators {
        let t = s
            .trader()
            .with_tokens(&service, &s.operator_token(op, "head_trader", None));
        for acc in accounts {
            let p = t
                .post(
                    "/actions/plan",
                    &serde_json::json!({
                        "action_type": "order.submit.cl",
                        "payload": { "account_id": acc, "symbol": "CLF27", "side": "buy", "quantity": 1, "order_type": "market" },
                        "requested_by": op,
                        "chat_context": { "chat_session_id": "chat-spread", "tool_call_id": "call-1" }
                    }),
                )
                .await;
            assert_eq!(p["executable"], true, "{op} {acc}: {:?}", p.body);
            let r = t
                .post(
                    "/actions/execute",
                    &serde_json::json!({
                        "plan_id": p["plan_id"],
                        "confirmation_token": p["confirmation_token"],
                        "idempotency_key": format!("spread-{op}-{acc}"),
                        "requested_by": op
                    }),
                )
                .await;
            assert_eq!(r.status, 202, "{op} {acc}: {:?}", r.body);
            executes += 1;
        }
    }

    // Each item of a transaction, as table and key.
    let key_of = |table: &str, item: &serde_json::Value| -> String {
        let t = shapes::TABLES
            .iter()
            .find(|t| table.ends_with(t.default_name))
            .unwrap_or_else(|| panic!("a table of the template: {table}"));
        let mut k = format!("{}:{}", t.default_name, item[t.partition]);
        if let Some(sort) = t.sort {
            k.push_str(&format!("/{}", item[sort]));
        }
        k
    };
    let mut transactions = Vec::new();
    for body in proxy.recorded("TransactWriteItems") {
        let v: serde_json::Value = serde_json::from_slice(&body).expect("a JSON request");
        let mut keys = Vec::new();
        for it in v["TransactItems"].as_array().expect("TransactItems") {
            let (kind, op) = it
                .as_object()
                .and_then(|o| o.iter().next())
                .expect("one op");
            let table = op["TableName"].as_str().expect("TableName");
            let key = if kind == "Put" {
                &op["Item"]
            } else {
                &op["Key"]
            };
            keys.push(key_of(table, key));
        }
        // Execute's atomic step: the one that moves a plan (a plan's own write puts it).
        if keys.iter().any(|k| k.starts_with("airlock-idempotency:"))
            && keys.iter().any(|k| k.starts_with("airlock-plans:"))
        {
            transactions.push(keys);
        }
    }
    assert_eq!(transactions.len(), executes, "one commit per execute");
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for t in &transactions {
        for k in t {
            *seen.entry(k.as_str()).or_default() += 1;
        }
    }
    for (k, n) in &seen {
        assert!(
            !k.contains(r#""global""#),
            "the firm-wide control record is in {n} of {executes} executes"
        );
        assert!(
            *n * 10 <= executes * 4,
            "{k} is in {n} of {executes} execute transactions (more than 40 %): {seen:#?}"
        );
    }
    // The executes did check the control record: on their operators' copies.
    let copies: Vec<_> = seen
        .keys()
        .filter(|k| k.starts_with("airlock-control:"))
        .collect();
    assert!(copies.len() >= 3, "{copies:?}");
}
