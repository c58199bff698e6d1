//! The action protocol over real HTTP against `airlock serve` (embedded backend): plan,
//! execute, replay rules, concurrency storms, token attacks, the kill switch, rollout
//! modes, rate limits, crash recovery by retry and by the sweeper, and the audit trail.

use std::collections::HashSet;
use std::time::Duration;

use airlock_tests::{both, column, forge, Api, Backend, Resp, Server, Stack, MARKET_OPEN};
use serde_json::json;

fn start(b: Backend, extra: &[(&str, &str)]) -> Server {
    let mut env = vec![("AIRLOCK_NOW", MARKET_OPEN)];
    env.extend_from_slice(extra);
    Server::start_on(b, &env)
}

async fn executable_plan(t: &Api) -> Resp {
    let p = t.plan_buy("CLF27", 1).await;
    assert_eq!(p.status, 200, "{:?}", p.body);
    assert_eq!(p["executable"], true, "{:?}", p.body["risk_checks"]);
    p
}

fn queue_count(s: &Server) -> i64 {
    s.queued_messages()
}

both!(plan_then_execute_queues_once_and_replays);
async fn plan_then_execute_queues_once_and_replays(b: Backend) {
    let s = start(b, &[]);
    let t = s.trader();
    let p = executable_plan(&t).await;
    assert_eq!(
        p["preview"],
        "Buy 1 CLF27 at market, protected: limit 68.90 (68.40 + 0.50) on ACC-1, day order."
    );
    assert_eq!(p["normalized_payload"]["contract_month"], "2027-01");
    assert_eq!(p["normalized_payload"]["last_trade_date"], "2026-12-21");
    assert_eq!(p["queue_target"], "worker:orders");
    assert_eq!(p["requires_confirmation"], true);
    assert!(p["policy_version"].as_str().unwrap().contains("cme-"));
    let names = column(&p.body["risk_checks"], "name");
    for n in [
        "action_enabled",
        "kill_switch",
        "account_allowed",
        "symbol_valid",
        "symbol_allowed",
        "contract_not_expired",
        "expiry_window",
        "market_open",
        "max_order_size",
        "position_limit",
        "price_on_tick",
        "order_type_valid",
        "concentration",
    ] {
        assert!(names.contains(&n), "check {n} in {names:?}");
    }
    let token = p["confirmation_token"].as_str().unwrap();
    assert_eq!(forge::header(token)["alg"], "ES256");
    let claims = forge::claims(token);
    assert_eq!(claims["plan_id"], p["plan_id"]);
    assert_eq!(claims["requested_by"], "op-energy-trader");
    assert_eq!(claims["sub"], "mastra-dev");
    assert_eq!(
        claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(),
        300
    );

    let e = t.execute(&p, "key-1").await;
    assert_eq!(e.status, 202, "{:?}", e.body);
    assert_eq!(e["status"], "queued");
    let action_id = e["action_id"].as_str().unwrap().to_string();
    assert!(e["resource_refs"]["order_id"]
        .as_str()
        .unwrap()
        .starts_with("ord_"));
    assert_eq!(e["plan_id"], p["plan_id"]);

    let d = t.execute(&p, "key-1").await;
    assert_eq!((d.status, d["status"].as_str()), (200, Some("duplicate")));
    assert_eq!(d["action_id"], json!(action_id));
    assert_eq!(d["resource_refs"], e["resource_refs"]);
    assert_eq!(queue_count(&s), 1);

    let st = t.get(&format!("/actions/{action_id}")).await;
    assert_eq!(st.status, 200);
    assert_eq!(st["status"], "queued");
    assert_eq!(st["plan_id"], p["plan_id"]);

    // The queue message is the public v1 contract (read straight from the embedded queue).
    if b == Backend::Embedded {
        let body: String = s
            .db()
            .query_row("SELECT body FROM queue", [], |r| {
                airlock_tests::stored_body(r, 0)
            })
            .unwrap();
        let m: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(m["schema"], "airlock.action.v1");
        assert_eq!(m["action_id"], json!(action_id));
        assert_eq!(m["normalized_payload"]["symbol"], "CLF27");
        assert_eq!(m["trace"]["chat_session_id"], "chat-1");
        for f in [
            "plan_id",
            "action_type",
            "resource_refs",
            "requested_by",
            "service_principal",
            "enqueued_at",
        ] {
            assert!(!m[f].is_null(), "message field {f}");
        }
    }

    // The same key with another plan: 422.
    let p2 = executable_plan(&t).await;
    let r = t.execute(&p2, "key-1").await;
    assert_eq!((r.status, r.code()), (422, "idempotency_key_reused"));
    // A header that disagrees with the body: 400.
    let r = t.send_with_header(&p2, "key-9", "key-10").await;
    assert_eq!((r.status, r.code()), (400, "invalid_request"));
    assert_eq!(queue_count(&s), 1);

    // The audit trail, in time order, through the CLI.
    let trail = s.cli(&["audit", p["plan_id"].as_str().unwrap()]);
    let decisions: Vec<String> = trail
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .map(|v| v["decision"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(decisions, ["planned", "queued", "duplicate"]);
    let first: serde_json::Value = serde_json::from_str(trail.lines().nth(1).unwrap()).unwrap();
    for f in [
        "action_id",
        "plan_id",
        "idempotency_key",
        "operator_id",
        "service_principal",
        "payload_hash",
        "risk_checks",
        "order_id",
        "chat_session_id",
        "tool_call_id",
        "request_id",
        "policy_version",
    ] {
        assert!(!first[f].is_null(), "audit field {f} in {first}");
    }
    let by_action = s.cli(&["audit", &action_id]);
    assert_eq!(by_action.lines().count(), 3);
}

both!(sixty_four_concurrent_executes_with_one_key_queue_exactly_once);
async fn sixty_four_concurrent_executes_with_one_key_queue_exactly_once(b: Backend) {
    let s = start(b, &[]);
    let t = s.trader();
    let p = executable_plan(&t).await;
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (t, p) = (t.clone(), p.clone());
        tasks.push(tokio::spawn(
            async move { t.execute(&p, "storm-key").await },
        ));
    }
    let mut action_ids = HashSet::new();
    let (mut queued, mut dup, mut busy) = (0, 0, 0);
    for task in tasks {
        let r = task.await.unwrap();
        match (r.status, r.code()) {
            (202, _) => queued += 1,
            (200, _) => dup += 1,
            (409, "idempotency_key_in_flight") => {
                busy += 1;
                assert!(r.retry_after.is_some(), "409 carries Retry-After");
            }
            other => panic!("unexpected {other:?}: {:?}", r.body),
        }
        action_ids.insert(
            r["action_id"]
                .as_str()
                .expect("every response names the action")
                .to_string(),
        );
    }
    assert_eq!(queued, 1, "exactly one 202");
    assert_eq!(queued + dup + busy, 64);
    assert_eq!(action_ids.len(), 1, "one action id: {action_ids:?}");
    assert_eq!(queue_count(&s), 1);
}

both!(sixty_four_keys_on_one_plan_queue_exactly_once);
async fn sixty_four_keys_on_one_plan_queue_exactly_once(b: Backend) {
    let s = start(b, &[]);
    let t = s.trader();
    let p = executable_plan(&t).await;
    let mut tasks = Vec::new();
    for i in 0..64 {
        let (t, p) = (t.clone(), p.clone());
        tasks.push(tokio::spawn(async move {
            t.execute(&p, &format!("k-{i}")).await
        }));
    }
    let mut codes = Vec::new();
    for task in tasks {
        let r = task.await.unwrap();
        codes.push((r.status, r.code().to_string()));
    }
    let queued = codes.iter().filter(|(s, _)| *s == 202).count();
    let taken = codes
        .iter()
        .filter(|(s, c)| *s == 409 && c == "plan_already_executed")
        .count();
    assert_eq!((queued, taken), (1, 63), "{codes:?}");
    assert_eq!(queue_count(&s), 1);
}

both!(forged_expired_and_foreign_tokens_are_rejected_and_audited);
async fn forged_expired_and_foreign_tokens_are_rejected_and_audited(b: Backend) {
    let s = start(b, &[]);
    let t = s.trader();
    let p = executable_plan(&t).await;
    let other = executable_plan(&t).await;
    let token = p["confirmation_token"].as_str().unwrap().to_string();
    let plan_id = p["plan_id"].as_str().unwrap().to_string();
    let claims = forge::claims(&token);

    let pem = format!("{}\n", s.cli(&["confirmation-key"]));
    let kid = forge::header(&token)["kid"].as_str().unwrap().to_string();
    let mut wider = claims.clone();
    wider["exp"] = json!(claims["exp"].as_i64().unwrap() + 86_400);
    let cases: Vec<(&str, String)> = vec![
        ("forged signature", forge::es256_foreign(&token, &claims)),
        ("edited claims", {
            let parts: Vec<&str> = token.split('.').collect();
            format!(
                "{}.{}.{}",
                parts[0],
                forge::b64(wider.to_string().as_bytes()),
                parts[2]
            )
        }),
        (
            "another plan's token",
            other["confirmation_token"].as_str().unwrap().to_string(),
        ),
        ("alg none", forge::alg_none(&claims)),
        (
            "HS256 with the public key",
            forge::hs256(&claims, Some(&kid), pem.as_bytes()),
        ),
        ("not a token", "abc".into()),
    ];
    for (i, (what, bad)) in cases.iter().enumerate() {
        let r = t.execute_with(&plan_id, bad, &format!("attack-{i}")).await;
        assert_eq!(
            (r.status, r.code()),
            (422, "token_invalid"),
            "{what}: {:?}",
            r.body
        );
        assert_eq!(r["status"], "rejected");
    }
    // Another requester's token: the head trader's plan, executed by the energy trader.
    let head = t.with_tokens(
        &t.service,
        &s.operator_token("op-head-trader", "head_trader", None),
    );
    let hp = head
        .post(
            "/actions/plan",
            &json!({"action_type": "order.submit.cl", "payload": {"account_id": "ACC-1", "symbol": "CLF27", "side": "buy", "quantity": 1, "order_type": "market"}, "requested_by": "op-head-trader"}),
        )
        .await;
    assert_eq!(hp["executable"], true);
    let r = t.execute(&hp, "attack-requester").await;
    r.assert_error(422, "token_invalid");
    // Claiming to be the head trader in the body is a 403.
    let r = t
        .post(
            "/actions/execute",
            &json!({"plan_id": hp["plan_id"], "confirmation_token": hp["confirmation_token"], "idempotency_key": "attack-body", "requested_by": "op-head-trader"}),
        )
        .await;
    assert_eq!((r.status, r.code()), (403, "operator_mismatch"));

    assert_eq!(queue_count(&s), 0, "nothing queued");
    let invalid = |trail: Vec<serde_json::Value>| {
        trail
            .iter()
            .filter(|a| a["reason_code"] == "token_invalid")
            .count()
    };
    let audited = invalid(s.audit(&plan_id)) + invalid(s.audit(hp["plan_id"].as_str().unwrap()));
    assert_eq!(audited, 7, "each attack audited");

    // Expired: restart the server ten minutes later on the same state dir.
    let dir = s.crash();
    let later = dir.start(&[("AIRLOCK_NOW", "2026-11-23T15:10:00Z")]);
    let t2 = later.trader();
    let r = t2.execute_with(&plan_id, &token, "late").await;
    r.assert_error(422, "token_expired");
    assert!(r.message().contains("expired at 2026-11-23 15:05:"));
    assert_eq!(later.queued_messages(), 0);
    let expired = later.audit(&plan_id);
    assert_eq!(
        expired
            .iter()
            .filter(|a| a["reason_code"] == "token_expired")
            .count(),
        1
    );
}

both!(kill_switch_closes_plans_and_takes_effect_on_a_running_server);
async fn kill_switch_closes_plans_and_takes_effect_on_a_running_server(b: Backend) {
    let s = start(b, &[]);
    let t = s.trader();
    let p = executable_plan(&t).await;
    let out = s.cli(&[
        "kill-switch",
        "engage",
        "--reason",
        "test drill",
        "--keep-working",
    ]);
    assert!(out.contains("ENGAGED"), "{out}");
    let r = t.execute(&p, "ks-1").await;
    r.assert_error(403, "kill_switch_engaged");
    // Decided: the key replays the rejection.
    let r = t.execute(&p, "ks-1").await;
    assert_eq!(r.code(), "kill_switch_engaged");
    // Plans made now fail the kill_switch check, but cancels stay available.
    let blocked = t.plan_buy("CLF27", 1).await;
    assert_eq!(blocked["executable"], false);
    let ks = blocked.check("kill_switch").clone();
    assert_eq!(ks["status"], "fail");
    let cancel = t
        .post(
            "/actions/plan",
            &json!({"action_type": "order.cancel", "payload": {"account_id": "ACC-1", "order_id": "ORD-1003"}, "requested_by": "op-energy-trader"}),
        )
        .await;
    assert_eq!(cancel["executable"], true, "{:?}", cancel.body);
    let r = t.execute(&cancel, "cancel-1").await;
    assert_eq!(r.status, 202, "{:?}", r.body);
    assert_eq!(r["resource_refs"]["order_id"], "ORD-1003");

    let out = s.cli(&["kill-switch", "release"]);
    assert!(out.contains("released"), "{out}");
    // The closed plan stays closed, under any key.
    let r = t.execute(&p, "ks-2").await;
    r.assert_error(422, "plan_not_executable");
    let r = t.execute(&p, "ks-1").await;
    assert_eq!(
        r.code(),
        "kill_switch_engaged",
        "the first key still replays its decision"
    );
    // A new plan goes through.
    let fresh = executable_plan(&t).await;
    assert_eq!(t.execute(&fresh, "ks-3").await.status, 202);
    assert_eq!(queue_count(&s), 2);
    let status = s.cli(&["kill-switch", "status"]);
    assert!(status.contains("released"));
}

both!(rollout_modes_and_rate_limits);
async fn rollout_modes_and_rate_limits(b: Backend) {
    let s = start(b, &[("AIRLOCK_EXECUTE_RATE_PER_MINUTE", "2")]);
    let t = s.trader();
    s.cli(&["rollout", "order.submit.cl", "plan_only"]);
    let p = t.plan_buy("CLF27", 1).await;
    assert_eq!(p["executable"], false);
    let c = p.check("action_enabled").clone();
    assert_eq!(c["status"], "fail");
    assert!(c["reason"].as_str().unwrap().contains("plan_only"));
    // No token was issued: there is none to send.
    let r = t.execute(&p, "ro-0").await;
    r.assert_error(400, "invalid_request");
    assert_eq!(r.field(), "/confirmation_token");

    s.cli(&["rollout", "order.submit.cl", "execute"]);
    let p = executable_plan(&t).await;
    s.cli(&["rollout", "order.submit.cl", "disabled"]);
    let r = t.execute(&p, "ro-1").await;
    r.assert_error(403, "action_disabled");
    s.cli(&["rollout", "order.submit.cl", "execute"]);

    // Two decided executes per minute; the third is 429 and can be retried later.
    for i in 0..2 {
        let p = executable_plan(&t).await;
        assert_eq!(t.execute(&p, &format!("rl-{i}")).await.status, 202);
    }
    let p = executable_plan(&t).await;
    let r = t.execute(&p, "rl-2").await;
    r.assert_error(429, "rate_limited");
    let wait: u64 = r.retry_after.as_deref().unwrap().parse().unwrap();
    assert!((1..=60).contains(&wait));
    // Not a decision: the key is free and the plan still open.
    let again = t.execute(&p, "rl-2").await;
    assert_eq!(again.code(), "rate_limited");
    assert_eq!(queue_count(&s), 2);
}

/// A crash between the execute commit and the send. The embedded store queues the message
/// in the commit itself (its outbox); `execute.send_after_commit` makes it send after the
/// commit as on AWS, so the window the sweeper closes is tested on both backends.
const SEND_AFTER_COMMIT_THEN_CRASH: &str = "execute.send_after_commit,execute.after_commit";

/// An executable plan on a server armed with `failpoints`, whose execute with `key` kills
/// the server mid-request: the stopped state and the plan.
async fn execute_then_crash(b: Backend, failpoints: &str, key: &str) -> (Stack, Resp) {
    let s = start(b, &[("AIRLOCK_FAILPOINTS", failpoints)]);
    let t = s.trader();
    let p = executable_plan(&t).await;
    let died = t
        .try_post("/actions/execute", &Api::execute_body(&p, key))
        .await;
    assert!(died.is_err(), "the server died mid-request: {died:?}");
    (s.wait_exit(Duration::from_secs(10)), p)
}

/// The messages queued once the sweeper (every 100 ms) has queued any, within 10 s.
async fn swept(s: &Server) -> i64 {
    let mut n = 0;
    for _ in 0..100 {
        n = s.queued_messages();
        if n > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    n
}

/// A `duplicate` answer (200) to a retry; the action's id.
fn duplicate_of(r: &Resp) -> String {
    r.assert_status(200, "duplicate");
    r["action_id"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn the_embedded_commit_queues_the_message_so_a_crash_after_it_loses_nothing() {
    let (dir, p) = execute_then_crash(Backend::Embedded, "execute.after_commit", "outbox-1").await;
    // No sweeper for an hour, and a queue that refuses every send: the message is there
    // already, committed with the decision.
    let again = dir.start(&[
        ("AIRLOCK_NOW", MARKET_OPEN),
        ("AIRLOCK_SWEEP_AFTER_MS", "3600000"),
        ("AIRLOCK_FAILPOINTS", "dispatch.send_fails"),
    ]);
    assert_eq!(again.queued_messages(), 1, "queued by the commit itself");
    let t = again.trader();
    let action_id = duplicate_of(&t.execute(&p, "outbox-1").await);
    // A new execute answers 202 though the send would fail: there is no send after the
    // commit to fail.
    let q = executable_plan(&t).await;
    let second = t.execute(&q, "outbox-2").await;
    assert_eq!(second.status, 202, "{:?}", second.body);
    assert_eq!(again.queued_messages(), 2);
    // The workers handle the one the crash left, once; nothing was resent.
    let dir = again.crash();
    let s = dir.start(&[("AIRLOCK_NOW", MARKET_OPEN), ("AIRLOCK_WORKERS", "on")]);
    let a = s.trader().settled(&action_id).await;
    assert_eq!(a["status"], "succeeded", "{:?}", a.body);
    let trail = s.audit(&action_id);
    assert!(trail.iter().all(|a| a["decision"] != "resent"), "{trail:?}");
}

/// The embedded store keeps the growing tables' bodies packed (LZ4 against a fixed
/// dictionary). Every body is a BLOB less than half its JSON, each reads back whole through
/// the API and `airlock audit`, and a database written before the format (bodies as TEXT)
/// keeps working: its plan, action, key and audit trail read, and a retry finds the key.
#[tokio::test]
async fn embedded_bodies_are_stored_packed_and_text_bodies_from_before_still_read() {
    let s = Server::start_on(Backend::Embedded, &[("AIRLOCK_NOW", MARKET_OPEN)]);
    let t = s.trader();
    let p = executable_plan(&t).await;
    let e = t.execute(&p, "packed-1").await;
    assert_eq!(e.status, 202, "{:?}", e.body);
    let action_id = e["action_id"].as_str().unwrap().to_string();
    let action_before = t.get(&format!("/actions/{action_id}")).await.body;
    let trail_before = s.audit(&action_id);
    assert!(trail_before.len() >= 2, "{trail_before:?}");
    assert!(
        trail_before
            .iter()
            .any(|a| a["risk_checks"].as_array().is_some_and(|c| c.len() > 5)),
        "the plan's audit record has its risk checks back: {trail_before:?}"
    );

    const TABLES: [&str; 6] = [
        "plans",
        "actions",
        "audit",
        "idempotency_keys",
        "check_sets",
        "queue",
    ];
    let db = s.db();
    for table in TABLES {
        let rows: Vec<(String, usize, String)> = db
            .prepare(&format!(
                "SELECT typeof(body), length(body), body FROM {table}"
            ))
            .unwrap()
            .query_map([], |r| {
                Ok((r.get(0)?, r.get(1)?, airlock_tests::stored_body(r, 2)?))
            })
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert!(!rows.is_empty(), "{table} has rows");
        let (mut stored_total, mut json_total) = (0, 0);
        for (kind, stored, json) in rows {
            assert_eq!(kind, "blob", "{table}: {json}");
            serde_json::from_str::<serde_json::Value>(&json).expect("a JSON body");
            (stored_total, json_total) = (stored_total + stored, json_total + json.len());
        }
        assert!(
            stored_total * 2 < json_total,
            "{table}: {stored_total} bytes stored for {json_total} of JSON"
        );
    }

    // The same database as an older version wrote it: every body as its JSON text.
    let stack = s.crash();
    let db = rusqlite::Connection::open(stack.state_dir.join("airlock.db")).unwrap();
    // The audit table refuses updates; lifted for this rewrite and put back after.
    let guard: String = db
        .query_row(
            "SELECT sql FROM sqlite_master WHERE name = 'audit_append_only_update'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    db.execute_batch("DROP TRIGGER audit_append_only_update")
        .unwrap();
    for table in TABLES {
        // check_sets has no rowid (keyed by its hash).
        let key = if table == "check_sets" {
            "hash"
        } else {
            "rowid"
        };
        let rows: Vec<(rusqlite::types::Value, String)> = db
            .prepare(&format!("SELECT {key}, body FROM {table}"))
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, airlock_tests::stored_body(r, 1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        for (k, json) in rows {
            db.execute(
                &format!("UPDATE {table} SET body = ? WHERE {key} = ?"),
                rusqlite::params![json, k],
            )
            .unwrap();
        }
        let blobs: i64 = db
            .query_row(
                &format!("SELECT COUNT(*) FROM {table} WHERE typeof(body) != 'text'"),
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(blobs, 0, "{table}");
    }
    db.execute_batch(&guard).unwrap();
    drop(db);
    let again = stack.start(&[("AIRLOCK_NOW", MARKET_OPEN)]);
    let t = again.trader();
    assert_eq!(
        t.get(&format!("/actions/{action_id}")).await.body,
        action_before
    );
    assert_eq!(again.audit(&action_id), trail_before);
    assert_eq!(duplicate_of(&t.execute(&p, "packed-1").await), action_id);
    // New writes beside the old rows are packed again.
    let q = executable_plan(&t).await;
    assert_eq!(t.execute(&q, "packed-2").await.status, 202);
    let packed: i64 = again
        .db()
        .query_row(
            "SELECT COUNT(*) FROM plans WHERE typeof(body) = 'blob'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(packed, 1, "the new plan");
}

both!(a_backlogged_orders_queue_refuses_new_orders_and_decides_nothing);
/// Execute's admission check: while the orders queue holds the limit, a new order is held
/// for `AIRLOCK_ORDERS_BACKLOG_WAIT_MS`, then refused with 503 `orders_backlogged` and
/// `Retry-After`, and nothing is written (the plan stays open, the key undecided). A replay
/// of an accepted execute and a sync still go through at once. Once the workers have
/// drained the queue, the same key queues the order.
async fn a_backlogged_orders_queue_refuses_new_orders_and_decides_nothing(b: Backend) {
    let s = start(
        b,
        &[
            ("AIRLOCK_ORDERS_BACKLOG_LIMIT", "2"),
            ("AIRLOCK_ORDERS_BACKLOG_WAIT_MS", "300"),
        ],
    );
    let t = s.trader();
    let mut accepted = Vec::new();
    for key in ["backlog-1", "backlog-2"] {
        let p = executable_plan(&t).await;
        let r = t.execute(&p, key).await;
        assert_eq!(r.status, 202, "{:?}", r.body);
        accepted.push((p, r["action_id"].as_str().unwrap().to_string()));
    }
    let p = executable_plan(&t).await;
    let started = std::time::Instant::now();
    let refused = t.execute(&p, "backlog-3").await;
    refused.assert_error(503, "orders_backlogged");
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(300),
        "refused after {:?}, before its hold for room ended",
        started.elapsed()
    );
    assert_eq!(refused.retry_after.as_deref(), Some("1"));
    assert_eq!(refused["status"], "rejected");
    assert_eq!(s.queued_messages(), 2, "nothing queued");
    // Load shed on purpose: logged as a warning, never as an error that pages someone.
    let logged: Vec<_> = s
        .log_lines()
        .into_iter()
        .filter(|l| l["fields"]["code"] == "orders_backlogged")
        .collect();
    assert!(
        !logged.is_empty() && logged.iter().all(|l| l["level"] == "WARN"),
        "{logged:?}"
    );
    let plan_id = p["plan_id"].as_str().unwrap();
    let trail = s.audit(plan_id);
    assert!(trail.iter().all(|a| a["decision"] != "queued"), "{trail:?}");
    // Refused again while the queue stays full: the key was not decided.
    let again = t.execute(&p, "backlog-3").await;
    assert_eq!(again.code(), "orders_backlogged", "{:?}", again.body);
    // An accepted execute still replays, and a sync is never refused.
    let (p1, a1) = &accepted[0];
    assert_eq!(duplicate_of(&t.execute(p1, "backlog-1").await), *a1);
    let sync = t.plan_sync("ACC-1").await;
    assert_eq!(t.execute(&sync, "backlog-sync").await.status, 202);

    // The workers drain the queue; the same key now queues the order.
    let stack = s.crash();
    let s = stack.start(&[
        ("AIRLOCK_NOW", MARKET_OPEN),
        ("AIRLOCK_WORKERS", "on"),
        ("AIRLOCK_ORDERS_BACKLOG_LIMIT", "2"),
    ]);
    let t = s.trader();
    for (_, a) in &accepted {
        assert_eq!(t.settled(a).await["status"], "succeeded");
    }
    let r = t.execute(&p, "backlog-3").await;
    assert_eq!(r.status, 202, "{:?}", r.body);
    assert_eq!(
        t.settled(r["action_id"].as_str().unwrap()).await["status"],
        "succeeded"
    );
}

both!(a_retry_after_a_crash_after_the_commit_answers_from_the_commit);
async fn a_retry_after_a_crash_after_the_commit_answers_from_the_commit(b: Backend) {
    let (dir, p) = execute_then_crash(b, SEND_AFTER_COMMIT_THEN_CRASH, "crash-1").await;

    // Same instant: the key was decided at the atomic step; the retry answers from it
    // (no "still running" about a request that is dead), though nothing was sent yet.
    let again = dir.start(&[
        ("AIRLOCK_NOW", MARKET_OPEN),
        ("AIRLOCK_SWEEP_AFTER_MS", "3600000"),
    ]);
    assert_eq!(again.queued_messages(), 0, "committed but never sent");
    let t = again.trader();
    let action_id = duplicate_of(&t.execute(&p, "crash-1").await);
    assert_eq!(
        t.get(&format!("/actions/{action_id}")).await["status"],
        "queued"
    );
    assert_eq!(
        again.queued_messages(),
        0,
        "a replay writes nothing but its audit"
    );

    // The sweeper sends what the crash left unsent, once.
    let dir = again.crash();
    let later = dir.start(&[
        ("AIRLOCK_NOW", "2026-11-23T15:02:00Z"),
        ("AIRLOCK_SWEEP_INTERVAL_MS", "100"),
    ]);
    assert_eq!(swept(&later).await, 1, "the sweeper queued the action");
    let r = later.trader().execute(&p, "crash-1").await;
    assert_eq!(
        (r.status, r["action_id"].as_str()),
        (200, Some(action_id.as_str()))
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(later.queued_messages(), 1, "never twice");
    let trail = later.audit(&action_id);
    assert_eq!(
        trail.iter().filter(|a| a["decision"] == "resent").count(),
        1,
        "{trail:?}"
    );
}

both!(a_commit_whose_reply_was_lost_carries_on_from_its_own_decision);
async fn a_commit_whose_reply_was_lost_carries_on_from_its_own_decision(b: Backend) {
    // Every execute commit "loses its reply": the write happened, the request cannot tell.
    let s = start(b, &[("AIRLOCK_FAILPOINTS", "execute.commit_reply_lost")]);
    let t = s.trader();
    let p = executable_plan(&t).await;
    let r = t.execute(&p, "lost-reply-1").await;
    // It reads again, finds its own decision, sends and answers: not 409 about itself.
    r.assert_status(202, "queued");
    let action_id = r["action_id"].as_str().unwrap().to_string();
    assert_eq!(queue_count(&s), 1, "sent at once, once");
    let dup = t.execute(&p, "lost-reply-1").await;
    assert_eq!(
        (dup.status, dup["action_id"].as_str()),
        (200, Some(action_id.as_str()))
    );
    assert_eq!(queue_count(&s), 1, "never twice");
    let trail = s.audit(&action_id);
    assert_eq!(
        trail.iter().filter(|a| a["decision"] == "queued").count(),
        1,
        "one decision: {trail:?}"
    );
}

both!(a_crash_after_the_commit_is_finished_by_the_sweeper);
async fn a_crash_after_the_commit_is_finished_by_the_sweeper(b: Backend) {
    let (dir, p) = execute_then_crash(b, SEND_AFTER_COMMIT_THEN_CRASH, "crash-2").await;
    // Two minutes later nobody has retried; the sweeper sends it.
    let later = dir.start(&[
        ("AIRLOCK_NOW", "2026-11-23T15:02:00Z"),
        ("AIRLOCK_SWEEP_INTERVAL_MS", "100"),
    ]);
    assert_eq!(swept(&later).await, 1, "the sweeper queued the action");
    let t = later.trader();
    duplicate_of(&t.execute(&p, "crash-2").await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(later.queued_messages(), 1, "never twice");
}

/// An action accepted by the release before the sharded unsent index (its item carries
/// only `unsent = "1"`, the legacy index's key) and left unsent by a crash: after the
/// upgrade the sweeper still finds it, sends it once, and takes it out of both indexes.
#[tokio::test]
async fn the_sweeper_sends_an_action_accepted_before_the_sharded_index() {
    let (dir, p) = execute_then_crash(Backend::Aws, SEND_AFTER_COMMIT_THEN_CRASH, "legacy-1").await;
    let env: std::collections::BTreeMap<String, String> = dir.env().into_iter().collect();
    let conf = airlock_tests::emulator_config(&env["AWS_ENDPOINT_URL"]).await;
    let ddb = aws_sdk_dynamodb::Client::new(&conf);
    let table = "airlock-actions";
    let unsent = || async {
        ddb.scan()
            .table_name(table)
            .consistent_read(true)
            .send()
            .await
            .expect("scan actions")
            .items
            .unwrap_or_default()
            .into_iter()
            .filter(|i| i.contains_key("unsent_shard") || i.contains_key("unsent"))
            .collect::<Vec<_>>()
    };
    let left = unsent().await;
    assert_eq!(left.len(), 1, "the crash left one action unsent: {left:?}");
    let action_id = left[0]["action_id"].as_s().expect("action_id").clone();
    airlock_tests::unsent_the_old_way(&ddb, table, &action_id).await;

    let later = dir.start(&[
        ("AIRLOCK_NOW", "2026-11-23T15:02:00Z"),
        ("AIRLOCK_SWEEP_INTERVAL_MS", "100"),
    ]);
    assert_eq!(swept(&later).await, 1, "the sweeper queued the action");
    let t = later.trader();
    assert_eq!(duplicate_of(&t.execute(&p, "legacy-1").await), action_id);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(later.queued_messages(), 1, "never twice");
    assert!(unsent().await.is_empty(), "still in an unsent index");
    let trail = later.audit(&action_id);
    assert_eq!(
        trail.iter().filter(|a| a["decision"] == "resent").count(),
        1,
        "{trail:?}"
    );
}

both!(a_decided_key_replays_after_the_token_expired);
async fn a_decided_key_replays_after_the_token_expired(b: Backend) {
    let s = start(b, &[]);
    let t = s.trader();
    let p = executable_plan(&t).await;
    let first = t.execute(&p, "replay-1").await;
    assert_eq!(first.status, 202);
    let dir = s.crash();
    let later = dir.start(&[("AIRLOCK_NOW", "2026-11-23T20:00:00Z")]);
    let t = later.trader();
    let r = t.execute(&p, "replay-1").await;
    r.assert_status(200, "duplicate");
    assert_eq!(r["action_id"], first["action_id"]);
    assert_eq!(later.queued_messages(), 1);
    // Past the 24-hour window the key is forgotten; the token has long expired.
    let dir = later.crash();
    let next_day = dir.start(&[("AIRLOCK_NOW", "2026-11-24T16:00:00Z")]);
    let r = next_day.trader().execute(&p, "replay-1").await;
    assert_eq!(r.code(), "token_expired");
}

both!(a_send_that_fails_after_the_commit_gives_up_its_lease);
async fn a_send_that_fails_after_the_commit_gives_up_its_lease(b: Backend) {
    // Leases long enough that waiting one out could not explain the retry's success.
    let lease = ("AIRLOCK_EXECUTE_LEASE_MS", "120000");
    let s = start(
        b,
        &[
            (
                "AIRLOCK_FAILPOINTS",
                "execute.send_after_commit,dispatch.send_fails",
            ),
            lease,
        ],
    );
    let t = s.trader();
    let p = executable_plan(&t).await;
    let r = t.execute(&p, "send-fails-1").await;
    r.assert_error(503, "upstream_unavailable");
    assert_eq!(
        r.retry_after.as_deref(),
        Some("1"),
        "503 carries Retry-After"
    );
    let action_id = r.body["action_id"]
        .as_str()
        .expect("the accepted action")
        .to_string();
    assert_eq!(queue_count(&s), 0, "nothing was queued");
    // The caller retries with the same key a minute later, well inside the 120 s lease it
    // would have had to wait out: the retry resumes the claim and queues the action.
    let stack = s.crash();
    let s = stack.start(&[("AIRLOCK_NOW", "2026-11-23T15:01:00Z"), lease]);
    let t = s.trader();
    let again = t.execute(&p, "send-fails-1").await;
    assert_eq!(again.status, 202, "{:?}", again.body);
    assert_eq!(again["action_id"], action_id.as_str(), "the same action");
    assert_eq!(queue_count(&s), 1, "queued once");
    let dup = t.execute(&p, "send-fails-1").await;
    assert_eq!(
        (dup.status, dup["action_id"].as_str()),
        (200, Some(action_id.as_str()))
    );
}
