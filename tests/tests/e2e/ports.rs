//! Port conformance: each property is written once against the port traits and run on
//! both backends (`both!` defines `name::embedded` on SQLite and `name::aws` on DynamoDB
//! and SQS through the moto emulator), so the two adapters are proven to agree below HTTP.
//! Every test gets fresh state: a new SQLite state dir, or a new moto server bootstrapped
//! with `airlock bootstrap` (no demo data).

use std::path::PathBuf;
use std::sync::Arc;

use airlock::adapters::aws::{clients, shapes, Aws, KmsSigner, Names};
use airlock::adapters::keys;
use airlock::adapters::local_signer::LocalSigner;
use airlock::adapters::sqlite::Sqlite;
use airlock::app::Ports;
use airlock::config::AwsConfig;
use airlock::core::auth::DeskScope;
use airlock::core::domain::payload::{NormalizedOrder, NormalizedPayload, NormalizedSync};
use airlock::core::domain::{
    Account, AccountStatus, ActionStatus, ActionType, Exposure, ExposureDelta, Job, JobKind,
    JobStatus, Millis, Order, OrderStatus, OrderTerms, OrderType, Position, QueueTarget, Side,
    TimeInForce,
};
use airlock::core::ports::{
    ActionMove, CommitOutcome, Conflict, ExecuteCommit, KeyCondition, Page, PaperBookStore,
    PlanChange, PositionChange, PositionsReplacement, Reservation, Signer, Stored,
};
use airlock::core::records::{
    ActionRecord, Approval, ApprovalChange, ApprovalDecision, AuditRecord, Control, Decision,
    KeyRecord, KeyState, PlanRecord, PlanStatus, QueueMessage, RateState, ResourceRefs, Trace,
    QUEUE_MESSAGE_SCHEMA, RATE_WINDOW_MS,
};
use airlock_tests::moto::Moto;
use airlock_tests::{both, temp_state_dir, Backend};

/// 10 s into a minute bucket (2026-11-18), so rate updates of one test share a bucket.
const NOW: Millis = 1_795_000_000_000 - 1_795_000_000_000 % RATE_WINDOW_MS + 10_000;
const PRINCIPAL: &str = "4:svc1/op-1";
const SYMBOL: &str = "CLF27";

/// The ports of one backend, with what keeps that backend alive.
struct Env {
    p: Ports,
    /// The paper broker's document store under `p.paper`.
    book: Arc<dyn PaperBookStore>,
    /// The AWS backend's clients, for what no port says (the items as DynamoDB stores them).
    aws: Option<Aws>,
    _moto: Option<Moto>,
    dir: PathBuf,
}

impl Drop for Env {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

async fn env(backend: Backend) -> Env {
    let dir = temp_state_dir();
    match backend {
        Backend::Embedded => {
            let db = Sqlite::open(&dir).expect("open sqlite");
            let key = keys::load_or_create_p256(&dir.join("confirm.pem")).expect("key");
            let signer: Arc<dyn Signer> =
                Arc::new(LocalSigner::new("ports-test", &key).expect("signer"));
            Env {
                p: Ports::sqlite(&db, signer),
                book: Arc::new(db.clone()),
                aws: None,
                _moto: None,
                dir,
            }
        }
        Backend::Aws => {
            let moto = Moto::start();
            let mut e = vec![("AIRLOCK_BACKEND".to_string(), "aws".to_string())];
            e.extend(moto.env());
            airlock_tests::cli(&dir, &e, &["bootstrap"]);
            // Explicit configuration (not the process environment): tests run in parallel,
            // each on its own emulator.
            let conf = airlock_tests::emulator_config(&moto.endpoint).await;
            let (ddb, sqs, kms) = clients(&conf);
            let given = AwsConfig::default();
            let mut urls = Vec::new();
            for q in shapes::QUEUES {
                let u = sqs
                    .get_queue_url()
                    .queue_name(q.name(&given))
                    .send()
                    .await
                    .expect("queue url")
                    .queue_url
                    .expect("queue url");
                urls.push(u);
            }
            assert_eq!(shapes::QUEUES[0], shapes::ORDERS_QUEUE);
            let names = Names::resolve(&given, urls[0].clone(), urls[1].clone());
            let aws = Aws {
                ddb,
                sqs,
                kms: kms.clone(),
                names: Arc::new(names),
            };
            let signer: Arc<dyn Signer> =
                Arc::new(KmsSigner::new(kms, &shapes::signing_key(&given)));
            Env {
                p: Ports::aws(&aws, signer),
                book: Arc::new(aws.clone()),
                aws: Some(aws),
                _moto: Some(moto),
                dir,
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Records

fn account(id: &str, status: AccountStatus) -> Account {
    Account {
        account_id: id.into(),
        name: format!("Account {id}"),
        desk: "energy".into(),
        currency: "USD".into(),
        status,
    }
}

fn plan(plan_id: &str, account_id: &str, status: PlanStatus) -> PlanRecord {
    PlanRecord {
        plan_id: plan_id.into(),
        action_type: ActionType::OrderSubmitCl,
        account_id: account_id.into(),
        desk: "energy".into(),
        requested_by: "op-1".into(),
        service_principal: "svc1".into(),
        normalized_payload: NormalizedPayload::OrderSubmitCl(NormalizedOrder {
            terms: market_buy(account_id, SYMBOL, 1),
            contract_month: None,
            last_trade_date: None,
            market_protection: None,
        }),
        payload_hash: "hash".into(),
        risk_checks: vec![],
        executable: true,
        preview: "buy".into(),
        queue_target: QueueTarget::Orders,
        policy_version: "p1".into(),
        status,
        closed_reason: None,
        action_id: None,
        created_at: NOW - 1_000,
        expires_at: NOW + 600_000,
        chat_context: serde_json::json!({}),
        request_id: "req".into(),
        reference_price: None,
        reference_observed_at: None,
        confirmation: airlock::core::policy::ConfirmationMode::Token,
        four_eyes: false,
        notional: None,
        approval: None,
        approvals: Vec::new(),
    }
}

/// An execute's audit record (`queued`) with the key `id`, of `plan_id`.
pub(crate) fn audit(id: &str, plan_id: Option<&str>) -> AuditRecord {
    AuditRecord {
        audit_id: format!("aud-{id}"),
        at: NOW,
        event: "execute".into(),
        decision: "queued".into(),
        reason_code: None,
        reason: None,
        action_type: Some(ActionType::OrderSubmitCl),
        plan_id: plan_id.map(String::from),
        action_id: None,
        idempotency_key: Some(id.into()),
        operator_id: "op-1".into(),
        service_principal: "svc1".into(),
        payload_hash: None,
        risk_checks: vec![],
        order_id: None,
        job_id: None,
        chat_session_id: None,
        tool_call_id: None,
        request_id: "req".into(),
        policy_version: None,
        approver: None,
        credential_id: None,
        user_verified: None,
        apigw_request_id: None,
        lambda_request_id: None,
    }
}

fn claimed(
    key: &str,
    plan_id: &str,
    owner: &str,
    action_id: &str,
    expires_at: Millis,
) -> KeyRecord {
    KeyRecord {
        principal: PRINCIPAL.into(),
        key: key.into(),
        fingerprint: format!("fp-{key}-{plan_id}"),
        plan_id: plan_id.into(),
        requested_by: "op-1".into(),
        state: KeyState::Claimed {
            lease_owner: owner.into(),
            lease_until: NOW + 30_000,
            action_id: action_id.into(),
        },
        created_at: NOW,
        expires_at,
    }
}

fn message(action_id: &str, plan_id: &str, action_type: ActionType) -> QueueMessage {
    QueueMessage {
        schema: QUEUE_MESSAGE_SCHEMA.into(),
        action_id: action_id.into(),
        plan_id: plan_id.into(),
        action_type,
        normalized_payload: NormalizedPayload::PositionsSync(NormalizedSync {
            account_id: "ACC-Q".into(),
        }),
        resource_refs: ResourceRefs::default(),
        requested_by: "op-1".into(),
        service_principal: "svc1".into(),
        enqueued_at: "2026-11-18T00:00:00.000Z".into(),
        trace: Trace::default(),
    }
}

fn action(action_id: &str, plan_id: &str, account_id: &str, key: &str) -> ActionRecord {
    ActionRecord {
        action_id: action_id.into(),
        plan_id: plan_id.into(),
        action_type: ActionType::OrderSubmitCl,
        status: ActionStatus::Queued,
        queue_target: QueueTarget::Orders,
        resource_refs: ResourceRefs {
            order_id: Some(format!("ord-{action_id}")),
            job_id: None,
        },
        account_id: account_id.into(),
        desk: "energy".into(),
        requested_by: "op-1".into(),
        service_principal: "svc1".into(),
        idempotency_key: key.into(),
        message: message(action_id, plan_id, ActionType::OrderSubmitCl),
        enqueued_at: None,
        created_at: NOW,
        updated_at: NOW,
        error: None,
    }
}

/// A commit of a fresh claim on `key` with no other condition.
fn bare(key: &str) -> ExecuteCommit {
    ExecuteCommit {
        key: claimed(
            key,
            "pln-none",
            "owner-1",
            &format!("act-{key}"),
            NOW + 86_400_000,
        ),
        key_condition: KeyCondition::Absent,
        plan_change: None,
        control_version: None,
        account_active: None,
        rate: None,
        reserve: None,
        messages: None,
        action: None,
        enqueue_group: None,
        audit: audit(key, None),
    }
}

fn buy(account_id: &str, bound: i64, qty: i64) -> Reservation {
    Reservation {
        side: Side::Buy,
        bound,
        delta: ExposureDelta::reserve(account_id, SYMBOL, Side::Buy, qty),
    }
}

fn exposure(position: i64, open_buy: i64, open_sell: i64) -> Exposure {
    Exposure {
        position,
        open_buy,
        open_sell,
    }
}

async fn commit(e: &Env, c: &ExecuteCommit) -> CommitOutcome {
    e.p.ledger.commit(c, NOW).await.expect("commit")
}

async fn key_of(e: &Env, key: &str, now: Millis) -> Option<KeyRecord> {
    e.p.ledger
        .get_key(PRINCIPAL, key, now)
        .await
        .expect("get_key")
}

/// A conflicting commit wrote nothing: its key is still absent, its plan untouched.
async fn assert_conflict(e: &Env, c: &ExecuteCommit, want: Conflict) {
    assert_eq!(
        commit(e, c).await,
        CommitOutcome::Conflict(want),
        "commit of {}",
        c.key.key
    );
    assert_eq!(
        key_of(e, &c.key.key, NOW).await,
        None,
        "a {want:?} conflict wrote the key {}",
        c.key.key
    );
    if let Some(a) = &c.action {
        assert_eq!(
            e.p.actions
                .get_action(&a.action_id)
                .await
                .expect("get_action"),
            None,
            "a {want:?} conflict wrote the action"
        );
    }
}

// ---------------------------------------------------------------------------------------
// 1. ExecuteLedger::commit: each condition, and its conflict name

async fn commit_claims_a_key_once(b: Backend) {
    let e = env(b).await;
    let c = bare("k-once");
    assert_eq!(commit(&e, &c).await, CommitOutcome::Committed);
    assert_eq!(key_of(&e, "k-once", NOW).await, Some(c.key.clone()));
    // The same (principal, key) again: the key is taken.
    let mut again = bare("k-once");
    again.key.fingerprint = "another".into();
    again.audit.audit_id = "aud-k-once-2".into();
    assert_eq!(
        commit(&e, &again).await,
        CommitOutcome::Conflict(Conflict::Key)
    );
    assert_eq!(
        key_of(&e, "k-once", NOW).await,
        Some(c.key.clone()),
        "the losing commit overwrote the key"
    );
    // Same key text under another principal is another key.
    let mut other = bare("k-once");
    other.key.principal = "4:svc1/op-2".into();
    other.audit.audit_id = "aud-k-once-3".into();
    assert_eq!(commit(&e, &other).await, CommitOutcome::Committed);
    // A finishing write must name the current owner.
    let mut finish = bare("k-once");
    finish.key_condition = KeyCondition::ClaimedBy("someone-else".into());
    finish.audit.audit_id = "aud-k-once-4".into();
    assert_eq!(
        commit(&e, &finish).await,
        CommitOutcome::Conflict(Conflict::Key)
    );
    finish.key_condition = KeyCondition::ClaimedBy("owner-1".into());
    finish.key.state = KeyState::Decided {
        decision: Decision::Rejected {
            code: "x".into(),
            message: "y".into(),
            details: vec![],
        },
        owner: None,
    };
    assert_eq!(commit(&e, &finish).await, CommitOutcome::Committed);
    assert_eq!(
        key_of(&e, "k-once", NOW).await.map(|k| k.state),
        Some(finish.key.state.clone())
    );
    // ClaimedBy on a key nobody holds.
    let mut ghost = bare("k-ghost");
    ghost.key_condition = KeyCondition::ClaimedBy("owner-1".into());
    assert_conflict(&e, &ghost, Conflict::Key).await;
}
both!(commit_claims_a_key_once);

/// The embedded ledger queues an accepted action's message in the commit itself (the
/// outbox); DynamoDB cannot (execute sends to SQS after it). Where it can: the message is
/// delivered once, the action is stored sent (the sweeper has nothing to look at), and a
/// conflicting commit queues nothing.
async fn commit_queues_its_message_where_the_ledger_can(b: Backend) {
    let e = env(b).await;
    let can = e.p.ledger.queues_in_commit();
    assert_eq!(can, b == Backend::Embedded, "which ledger has an outbox");
    if !can {
        return;
    }
    let mut c = bare("k-outbox");
    let mut a = action("act-outbox", "pln-none", "ACC-O", "k-outbox");
    a.enqueued_at = Some(NOW);
    c.action = Some(a.clone());
    c.enqueue_group = Some("ACC-O".into());
    assert_eq!(commit(&e, &c).await, CommitOutcome::Committed);
    // The same key again: a conflict, so its (other) message is not queued.
    let mut again = c.clone();
    let mut other = action("act-outbox-2", "pln-none", "ACC-O", "k-outbox");
    other.enqueued_at = Some(NOW);
    again.action = Some(other);
    assert_eq!(
        commit(&e, &again).await,
        CommitOutcome::Conflict(Conflict::Key)
    );
    let got =
        e.p.queue
            .receive(QueueTarget::Orders, 10, 30_000)
            .await
            .unwrap();
    let ids: Vec<String> = got
        .iter()
        .map(|d| {
            serde_json::from_str::<QueueMessage>(&d.body)
                .unwrap()
                .action_id
        })
        .collect();
    assert_eq!(ids, ["act-outbox"], "queued once, by the commit that won");
    assert_eq!(got[0].group.as_deref(), Some("ACC-O"));
    let unsent = e.p.actions.list_unsent(NOW + 3_600_000, 10).await.unwrap();
    assert!(unsent.is_empty(), "stored as sent: {unsent:?}");
}
both!(commit_queues_its_message_where_the_ledger_can);

async fn commit_moves_only_a_planned_plan(b: Backend) {
    let e = env(b).await;
    for (n, id) in ["pln-ok", "pln-close"].iter().enumerate() {
        e.p.plans
            .put_plan(
                &plan(id, "ACC-1", PlanStatus::Planned),
                &audit(&format!("p{n}"), Some(id)),
            )
            .await
            .unwrap();
    }
    let get = |id: &'static str| {
        let p = e.p.plans.clone();
        async move { p.get_plan(id).await.unwrap() }
    };
    assert_eq!(
        get("pln-ok").await.map(|p| p.status),
        Some(PlanStatus::Planned)
    );

    let mut c = bare("k-plan-ok");
    c.plan_change = Some((
        "pln-ok".into(),
        PlanChange::Execute {
            action_id: "act-plan-ok".into(),
        },
    ));
    c.action = Some(action("act-plan-ok", "pln-ok", "ACC-1", "k-plan-ok"));
    assert_eq!(commit(&e, &c).await, CommitOutcome::Committed);
    let p = get("pln-ok").await.unwrap();
    assert_eq!(p.status, PlanStatus::Executed);
    assert_eq!(p.action_id.as_deref(), Some("act-plan-ok"));
    let a = e.p.actions.get_action("act-plan-ok").await.unwrap();
    assert_eq!(a, c.action.clone(), "the action reads back as written");

    // Close moves planned -> closed with the reason.
    let mut close = bare("k-plan-close");
    close.plan_change = Some((
        "pln-close".into(),
        PlanChange::Close {
            reason_code: "kill_switch".into(),
        },
    ));
    assert_eq!(commit(&e, &close).await, CommitOutcome::Committed);
    let p = get("pln-close").await.unwrap();
    assert_eq!(p.status, PlanStatus::Closed);
    assert_eq!(p.closed_reason.as_deref(), Some("kill_switch"));
    assert_eq!(p.action_id, None);

    // Executed, closed or missing: not planned.
    for (i, plan_id) in ["pln-ok", "pln-close", "pln-missing"].iter().enumerate() {
        let mut c = bare(&format!("k-plan-{i}"));
        c.plan_change = Some((
            plan_id.to_string(),
            PlanChange::Execute {
                action_id: format!("act-plan-{i}"),
            },
        ));
        c.action = Some(action(
            &format!("act-plan-{i}"),
            plan_id,
            "ACC-1",
            &c.key.key,
        ));
        assert_conflict(&e, &c, Conflict::Plan).await;
        let mut closing = bare(&format!("k-plan-close-{i}"));
        closing.plan_change = Some((
            plan_id.to_string(),
            PlanChange::Close {
                reason_code: "other".into(),
            },
        ));
        assert_conflict(&e, &closing, Conflict::Plan).await;
    }
    let p = get("pln-ok").await.unwrap();
    assert_eq!(
        (p.status, p.action_id.as_deref(), p.closed_reason.as_deref()),
        (PlanStatus::Executed, Some("act-plan-ok"), None),
        "a conflict changed the executed plan"
    );
    let p = get("pln-close").await.unwrap();
    assert_eq!(
        (p.status, p.action_id.as_deref(), p.closed_reason.as_deref()),
        (PlanStatus::Closed, None, Some("kill_switch")),
        "a conflict changed the closed plan"
    );
    assert_eq!(get("pln-missing").await, None, "a conflict created a plan");
}
both!(commit_moves_only_a_planned_plan);

async fn commit_checks_the_control_version(b: Backend) {
    let e = env(b).await;
    // Nothing stored yet: version 0.
    let mut stale = bare("k-ctl-1");
    stale.control_version = Some(3);
    assert_conflict(&e, &stale, Conflict::Control).await;
    let mut at0 = bare("k-ctl-2");
    at0.control_version = Some(0);
    assert_eq!(commit(&e, &at0).await, CommitOutcome::Committed);

    let c1 = Control {
        trade_execute_enabled: false,
        version: 1,
        updated_at: NOW,
        updated_by: "op-admin".into(),
        reason: Some("halt".into()),
        ..Control::default()
    };
    assert!(e.p.control.put_control(&c1, 0).await.unwrap());
    let mut old = bare("k-ctl-3");
    old.control_version = Some(0);
    assert_conflict(&e, &old, Conflict::Control).await;
    let mut cur = bare("k-ctl-4");
    cur.control_version = Some(1);
    assert_eq!(commit(&e, &cur).await, CommitOutcome::Committed);
    // Every operator's executes see the change (on DynamoDB each checks its operator's
    // copy of the record, and every write of the record writes every copy).
    for i in 0..24 {
        let mut old = bare(&format!("k-ctl-op-old-{i}"));
        old.audit.operator_id = format!("op-{i}");
        old.control_version = Some(0);
        assert_conflict(&e, &old, Conflict::Control).await;
        let mut cur = bare(&format!("k-ctl-op-cur-{i}"));
        cur.audit.operator_id = format!("op-{i}");
        cur.control_version = Some(1);
        assert_eq!(commit(&e, &cur).await, CommitOutcome::Committed, "op-{i}");
    }
}
both!(commit_checks_the_control_version);

async fn commit_checks_the_account_is_active(b: Backend) {
    let e = env(b).await;
    e.p.read_models
        .put_accounts(&[
            account("ACC-ON", AccountStatus::Active),
            account("ACC-SUS", AccountStatus::Suspended),
            account("ACC-CLO", AccountStatus::Closed),
        ])
        .await
        .unwrap();
    for (i, acc) in ["ACC-SUS", "ACC-CLO", "ACC-NONE"].iter().enumerate() {
        let mut c = bare(&format!("k-acc-{i}"));
        c.account_active = Some(acc.to_string());
        assert_conflict(&e, &c, Conflict::Account).await;
    }
    let mut ok = bare("k-acc-ok");
    ok.account_active = Some("ACC-ON".into());
    assert_eq!(commit(&e, &ok).await, CommitOutcome::Committed);
}
both!(commit_checks_the_account_is_active);

async fn commit_reserves_only_what_fits(b: Backend) {
    let e = env(b).await;
    let ex = |acc: &'static str| {
        let p = e.p.positions.clone();
        async move { p.get_exposure(acc, SYMBOL).await.unwrap() }
    };
    // The embedded store's positions need their account (a foreign key).
    e.p.read_models
        .put_accounts(&[
            account("ACC-A", AccountStatus::Active),
            account("ACC-NEW", AccountStatus::Active),
        ])
        .await
        .unwrap();
    // ACC-A: position 2 (positions and exposures, as the seed writes them), 3 open buys.
    e.p.read_models
        .put_positions(&[Position {
            account_id: "ACC-A".into(),
            symbol: SYMBOL.into(),
            quantity: 2,
            avg_price: None,
            updated_at: NOW,
            day_realized: None,
        }])
        .await
        .unwrap();
    e.p.read_models
        .put_exposures(&[("ACC-A".into(), SYMBOL.into(), exposure(2, 3, 0))])
        .await
        .unwrap();
    assert_eq!(ex("ACC-A").await, exposure(2, 3, 0));

    // Worst long 5 > bound 4: refused, nothing written.
    let mut over = bare("k-pos-over");
    over.reserve = Some(buy("ACC-A", 4, 1));
    over.action = Some(action("act-pos-over", "pln-none", "ACC-A", "k-pos-over"));
    assert_conflict(&e, &over, Conflict::Position).await;
    assert_eq!(
        ex("ACC-A").await,
        exposure(2, 3, 0),
        "a refused reserve moved the exposure"
    );

    // Worst long 5 <= bound 5: reserved.
    let mut fits = bare("k-pos-fits");
    fits.reserve = Some(buy("ACC-A", 5, 4));
    assert_eq!(commit(&e, &fits).await, CommitOutcome::Committed);
    assert_eq!(ex("ACC-A").await, exposure(2, 7, 0));

    // Sells: worst short 2 - 0 >= bound.
    let sell = |bound: i64, qty: i64| Reservation {
        side: Side::Sell,
        bound,
        delta: ExposureDelta::reserve("ACC-A", SYMBOL, Side::Sell, qty),
    };
    let mut s_over = bare("k-pos-sell-over");
    s_over.reserve = Some(sell(3, 1));
    assert_conflict(&e, &s_over, Conflict::Position).await;
    let mut s_ok = bare("k-pos-sell-ok");
    s_ok.reserve = Some(sell(2, 6));
    assert_eq!(commit(&e, &s_ok).await, CommitOutcome::Committed);
    assert_eq!(ex("ACC-A").await, exposure(2, 7, 6));

    // No exposure row at all counts as zero on both sides.
    let mut fresh_neg = bare("k-pos-fresh-neg");
    fresh_neg.reserve = Some(buy("ACC-NEW", -1, 1));
    assert_conflict(&e, &fresh_neg, Conflict::Position).await;
    let mut fresh_sell = bare("k-pos-fresh-sell");
    fresh_sell.reserve = Some(Reservation {
        side: Side::Sell,
        bound: 1,
        delta: ExposureDelta::reserve("ACC-NEW", SYMBOL, Side::Sell, 1),
    });
    assert_conflict(&e, &fresh_sell, Conflict::Position).await;
    assert_eq!(ex("ACC-NEW").await, Exposure::default());
    let mut fresh = bare("k-pos-fresh");
    fresh.reserve = Some(buy("ACC-NEW", 0, 3));
    assert_eq!(commit(&e, &fresh).await, CommitOutcome::Committed);
    assert_eq!(ex("ACC-NEW").await, exposure(0, 3, 0));
}
both!(commit_reserves_only_what_fits);

async fn commit_enforces_the_rate_cap(b: Backend) {
    let e = env(b).await;
    let limit = 2;
    let snap = |k: &'static str| {
        let l = e.p.ledger.clone();
        async move {
            l.snapshot(PRINCIPAL, k, "pln-none", "op-rate", NOW)
                .await
                .unwrap()
                .rate
        }
    };
    let s0 = snap("k-r").await;
    assert_eq!((s0.bucket, s0.count), (0, 0));
    assert_eq!(s0.operator_id, "op-rate");
    let first = s0.next(NOW, limit);
    assert!(!first.is_increment(), "the first execute rolls over");
    let mut c1 = bare("k-rate-1");
    c1.rate = Some(first.clone());
    assert_eq!(commit(&e, &c1).await, CommitOutcome::Committed);
    // The same roll-over again: the bucket is no longer the one read.
    let mut replay = bare("k-rate-replay");
    replay.rate = Some(first);
    assert_conflict(&e, &replay, Conflict::Rate).await;

    let s1 = snap("k-r").await;
    assert_eq!(
        (s1.bucket, s1.count),
        (RateState::bucket_of(NOW), 1),
        "rate state after one execute"
    );
    let second = s1.next(NOW, limit);
    assert!(second.is_increment());
    let mut c2 = bare("k-rate-2");
    c2.rate = Some(second.clone());
    assert_eq!(commit(&e, &c2).await, CommitOutcome::Committed);
    let s2 = snap("k-r").await;
    assert_eq!(s2.count, 2);
    // Cap reached: count 2 is not below cap 2.
    let third = s2.next(NOW, limit);
    assert_eq!(third.cap, 2);
    let mut c3 = bare("k-rate-3");
    c3.rate = Some(third);
    assert_conflict(&e, &c3, Conflict::Rate).await;
    assert_eq!(snap("k-r").await.count, 2, "a refused execute counted");
    // An increment computed for another bucket conflicts too.
    let mut wrong = bare("k-rate-4");
    wrong.rate = Some(airlock::core::records::RateUpdate {
        bucket: RateState::bucket_of(NOW) - RATE_WINDOW_MS,
        expected_bucket: RateState::bucket_of(NOW) - RATE_WINDOW_MS,
        ..second
    });
    assert_conflict(&e, &wrong, Conflict::Rate).await;
}
both!(commit_enforces_the_rate_cap);

// ---------------------------------------------------------------------------------------
// 2. Expired key records count as absent

async fn expired_keys_count_as_absent(b: Backend) {
    let e = env(b).await;
    let mut c = bare("k-exp");
    c.key.expires_at = NOW + 1_000;
    assert_eq!(commit(&e, &c).await, CommitOutcome::Committed);
    assert_eq!(key_of(&e, "k-exp", NOW + 999).await, Some(c.key.clone()));
    assert_eq!(
        key_of(&e, "k-exp", NOW + 1_000).await,
        None,
        "expired at expires_at"
    );
    assert_eq!(key_of(&e, "k-exp", NOW + 5_000).await, None);
    let later = NOW + 5_000;
    let snap =
        e.p.ledger
            .snapshot(PRINCIPAL, "k-exp", "pln-none", "op-1", later)
            .await
            .unwrap();
    assert_eq!(snap.key, None, "snapshot returned an expired key");
    // The lease owner of an expired record cannot finish on it.
    let mut finish = bare("k-exp");
    finish.key_condition = KeyCondition::ClaimedBy("owner-1".into());
    finish.audit.audit_id = "aud-k-exp-finish".into();
    assert_eq!(
        e.p.ledger.commit(&finish, later).await.unwrap(),
        CommitOutcome::Conflict(Conflict::Key)
    );
    // A new claim commits over the expired record.
    let mut fresh = bare("k-exp");
    fresh.key.fingerprint = "fp-new".into();
    fresh.key.created_at = later;
    fresh.key.expires_at = later + 86_400_000;
    fresh.audit.audit_id = "aud-k-exp-2".into();
    assert_eq!(
        e.p.ledger.commit(&fresh, later).await.unwrap(),
        CommitOutcome::Committed
    );
    assert_eq!(
        key_of(&e, "k-exp", later).await.map(|k| k.fingerprint),
        Some("fp-new".into())
    );
}
both!(expired_keys_count_as_absent);

// ---------------------------------------------------------------------------------------
// 3. take_over and mark_sent: only the lease owner

fn with_owner(k: &KeyRecord, owner: &str, until: Millis) -> KeyRecord {
    let mut k = k.clone();
    if let KeyState::Claimed {
        lease_owner,
        lease_until,
        ..
    } = &mut k.state
    {
        *lease_owner = owner.into();
        *lease_until = until;
    }
    k
}

async fn lease_takeover_and_mark_sent(b: Backend) {
    let e = env(b).await;
    let l = &e.p.ledger;
    let mut c = bare("k-lease");
    c.action = Some(action("act-lease", "pln-none", "ACC-1", "k-lease"));
    assert_eq!(commit(&e, &c).await, CommitOutcome::Committed);
    let unsent = e.p.actions.list_unsent(NOW + 1, 100).await.unwrap();
    assert_eq!(
        unsent
            .iter()
            .map(|a| a.action_id.as_str())
            .collect::<Vec<_>>(),
        vec!["act-lease"],
        "a committed, unsent action is the sweeper's"
    );
    assert!(
        e.p.actions.list_unsent(NOW, 100).await.unwrap().is_empty(),
        "list_unsent is strictly before claimed_before"
    );

    let to2 = with_owner(&c.key, "owner-2", NOW + 90_000);
    assert!(!l.take_over(&to2, "not-owner").await.unwrap());
    assert_eq!(
        key_of(&e, "k-lease", NOW).await,
        Some(c.key.clone()),
        "a refused takeover wrote"
    );
    let ghost = with_owner(&bare("k-none").key, "owner-2", NOW + 90_000);
    assert!(!l.take_over(&ghost, "owner-1").await.unwrap());
    assert_eq!(
        key_of(&e, "k-none", NOW).await,
        None,
        "a takeover created a key"
    );
    assert!(l.take_over(&to2, "owner-1").await.unwrap());
    // The old owner has lost it.
    let to3 = with_owner(&c.key, "owner-3", NOW + 95_000);
    assert!(!l.take_over(&to3, "owner-1").await.unwrap());
    let k = key_of(&e, "k-lease", NOW).await.expect("key");
    assert_eq!(k, to2);
    // Nor can the old owner finish with a commit.
    let mut late = bare("k-lease");
    late.key_condition = KeyCondition::ClaimedBy("owner-1".into());
    late.audit.audit_id = "aud-k-lease-late".into();
    assert_eq!(
        commit(&e, &late).await,
        CommitOutcome::Conflict(Conflict::Key)
    );
    assert_eq!(key_of(&e, "k-lease", NOW).await, Some(to2.clone()));

    let a = c.action.clone().unwrap();
    let sent_at = NOW + 2_000;
    let decided = KeyRecord {
        state: KeyState::Decided {
            decision: Decision::Queued {
                action_id: "act-lease".into(),
                plan_id: "pln-none".into(),
                queue_target: QueueTarget::Orders,
                resource_refs: a.resource_refs.clone(),
            },
            owner: None,
        },
        ..c.key.clone()
    };
    assert!(
        !l.mark_sent(&decided, "owner-1", "act-lease", sent_at)
            .await
            .unwrap(),
        "a stale owner marked the key sent"
    );
    assert_eq!(key_of(&e, "k-lease", NOW).await, Some(to2.clone()));
    assert_eq!(
        e.p.actions
            .get_action("act-lease")
            .await
            .unwrap()
            .unwrap()
            .enqueued_at,
        None,
        "a refused mark_sent marked the action sent"
    );
    // An action that does not exist: refused.
    assert!(!l
        .mark_sent(&decided, "owner-2", "act-missing", sent_at)
        .await
        .unwrap());
    assert_eq!(key_of(&e, "k-lease", NOW).await, Some(to2.clone()));

    assert!(l
        .mark_sent(&decided, "owner-2", "act-lease", sent_at)
        .await
        .unwrap());
    assert_eq!(key_of(&e, "k-lease", sent_at).await, Some(decided.clone()));
    let stored = e.p.actions.get_action("act-lease").await.unwrap().unwrap();
    assert_eq!(stored.enqueued_at, Some(sent_at));
    assert!(
        e.p.actions
            .list_unsent(NOW + 100_000, 100)
            .await
            .unwrap()
            .is_empty(),
        "a sent action is still listed as unsent"
    );
    // Decided: nobody holds a lease any more.
    assert!(!l
        .mark_sent(&decided, "owner-2", "act-lease", sent_at + 1)
        .await
        .unwrap());
    let to4 = with_owner(&c.key, "owner-4", NOW + 99_000);
    assert!(!l.take_over(&to4, "owner-2").await.unwrap());
    assert_eq!(key_of(&e, "k-lease", sent_at).await, Some(decided));
    assert_eq!(
        e.p.actions
            .get_action("act-lease")
            .await
            .unwrap()
            .unwrap()
            .enqueued_at,
        Some(sent_at),
        "enqueued_at moved"
    );
}
both!(lease_takeover_and_mark_sent);

// ---------------------------------------------------------------------------------------
// 4. ControlStore: versioned writes

async fn control_writes_are_versioned(b: Backend) {
    let e = env(b).await;
    let c0 = e.p.control.get_control().await.unwrap();
    assert_eq!(c0, Control::default());
    let c1 = Control {
        trade_execute_enabled: false,
        version: 1,
        updated_at: NOW,
        updated_by: "op-admin".into(),
        reason: Some("halt".into()),
        ..Control::default()
    };
    assert!(
        !e.p.control.put_control(&c1, 7).await.unwrap(),
        "stale version accepted"
    );
    assert_eq!(e.p.control.get_control().await.unwrap(), Control::default());
    assert!(e.p.control.put_control(&c1, 0).await.unwrap());
    assert_eq!(e.p.control.get_control().await.unwrap(), c1);
    let mut c2 = c1.clone();
    c2.version = 2;
    c2.trade_execute_enabled = true;
    c2.rollout.insert(
        "order.cancel".into(),
        airlock::core::records::RolloutMode::PlanOnly,
    );
    c2.reason = None;
    assert!(
        !e.p.control.put_control(&c2, 0).await.unwrap(),
        "version 0 overwrote"
    );
    assert_eq!(e.p.control.get_control().await.unwrap(), c1);
    assert!(e.p.control.put_control(&c2, 1).await.unwrap());
    let got = e.p.control.get_control().await.unwrap();
    assert_eq!(got, c2);
    assert_eq!(got.version, 2);
}
both!(control_writes_are_versioned);

// ---------------------------------------------------------------------------------------
// 5. WorkerStore::advance_order

/// A market buy's terms, good for the day.
fn market_buy(account_id: &str, symbol: &str, quantity: u32) -> OrderTerms {
    OrderTerms {
        account_id: account_id.into(),
        symbol: symbol.into(),
        side: Side::Buy,
        quantity,
        order_type: OrderType::Market,
        limit_price: None,
        stop_price: None,
        time_in_force: TimeInForce::Day,
    }
}

fn order(status: OrderStatus, filled: u32) -> Order {
    Order {
        order_id: "ord-w".into(),
        terms: market_buy("ACC-W", SYMBOL, 5),
        status,
        filled_quantity: filled,
        avg_fill_price: None,
        action_id: Some("act-w".into()),
        created_at: NOW,
        updated_at: NOW + filled as i64,
        version: 1,
        versions: Vec::new(),
    }
}

fn pos(qty: i64, expected: Option<i64>) -> PositionChange {
    PositionChange {
        expected,
        new: Position {
            account_id: "ACC-W".into(),
            symbol: SYMBOL.into(),
            quantity: qty,
            avg_price: None,
            updated_at: NOW + qty,
            day_realized: None,
        },
    }
}

/// ACC-W active, and an execute under `key` that reserved 5 contracts to buy.
async fn five_reserved(e: &Env, key: &str) {
    e.p.read_models
        .put_accounts(&[account("ACC-W", AccountStatus::Active)])
        .await
        .unwrap();
    let mut c = bare(key);
    c.reserve = Some(buy("ACC-W", 10, 5));
    assert_eq!(commit(e, &c).await, CommitOutcome::Committed);
}

async fn advance_order_is_conditional(b: Backend) {
    let e = env(b).await;
    let w = &e.p.workers;
    let ex = || async { e.p.positions.get_exposure("ACC-W", SYMBOL).await.unwrap() };
    five_reserved(&e, "k-w").await;
    assert_eq!(ex().await, exposure(0, 5, 0));

    let queued = order(OrderStatus::Queued, 0);
    assert_eq!(
        w.create_order(&queued).await.unwrap(),
        Stored::Created(queued.clone())
    );
    // Created once: a second create returns the stored order and writes nothing.
    let mut other = queued.clone();
    other.terms.quantity = 9;
    assert_eq!(
        w.create_order(&other).await.unwrap(),
        Stored::Found(queued.clone())
    );
    let claimed = order(OrderStatus::Submitted, 0);
    assert_eq!(
        w.create_order(&claimed).await.unwrap(),
        Stored::Found(queued.clone()),
        "a create claimed for the broker over a stored order"
    );
    assert_eq!(ex().await, exposure(0, 5, 0));

    let submitted = order(OrderStatus::Submitted, 0);
    assert!(w
        .advance_order(&queued, &submitted, None, None)
        .await
        .unwrap());
    // From a status it no longer has.
    assert!(!w
        .advance_order(&queued, &order(OrderStatus::Working, 0), None, None)
        .await
        .unwrap());
    assert_eq!(ex().await, exposure(0, 5, 0));

    let part2 = order(OrderStatus::PartiallyFilled, 2);
    assert!(w
        .advance_order(&submitted, &part2, Some(&pos(2, None)), None)
        .await
        .unwrap());
    assert_eq!(ex().await, exposure(2, 3, 0));
    let part4 = order(OrderStatus::PartiallyFilled, 4);
    assert!(w
        .advance_order(&part2, &part4, Some(&pos(4, Some(2))), None)
        .await
        .unwrap());
    assert_eq!(ex().await, exposure(4, 1, 0));
    // A second step from the same partially filled state: same status, other fills.
    let part3 = order(OrderStatus::PartiallyFilled, 3);
    assert!(
        !w.advance_order(&part2, &part3, None, None).await.unwrap(),
        "a step from filled_quantity 2 applied over filled_quantity 4"
    );
    assert_eq!(
        ex().await,
        exposure(4, 1, 0),
        "a refused step moved the exposure"
    );
    let filled = order(OrderStatus::Filled, 5);
    // The position changed since it was read: nothing written.
    assert!(!w
        .advance_order(&part4, &filled, Some(&pos(5, Some(3))), None)
        .await
        .unwrap());
    assert_eq!(
        e.p.orders.get_order("ord-w").await.unwrap(),
        Some(part4.clone())
    );
    assert_eq!(ex().await, exposure(4, 1, 0));
    assert_eq!(
        e.p.positions
            .get_position("ACC-W", SYMBOL)
            .await
            .unwrap()
            .map(|p| p.quantity),
        Some(4)
    );

    assert!(w
        .advance_order(&part4, &filled, Some(&pos(5, Some(4))), None)
        .await
        .unwrap());
    assert_eq!(ex().await, exposure(5, 0, 0));
    assert_eq!(
        e.p.orders.get_order("ord-w").await.unwrap(),
        Some(filled.clone())
    );
    assert_eq!(
        e.p.positions
            .get_position("ACC-W", SYMBOL)
            .await
            .unwrap()
            .map(|p| p.quantity),
        Some(5)
    );
    // Replayed: the order is no longer partially filled.
    assert!(!w
        .advance_order(&part4, &filled, Some(&pos(5, Some(4))), None)
        .await
        .unwrap());
    assert_eq!(ex().await, exposure(5, 0, 0));
}
both!(advance_order_is_conditional);

/// An order's step may settle the action it answers in the same write: all of it or
/// nothing, whichever of the order's and the action's conditions fails.
async fn an_order_step_settles_its_action_in_the_same_write(b: Backend) {
    let e = &env(b).await;
    let w = &e.p.workers;
    let ex = || async { e.p.positions.get_exposure("ACC-W", SYMBOL).await.unwrap() };
    let act = |id: &'static str| async move {
        e.p.actions
            .get_action(id)
            .await
            .unwrap()
            .expect("the action")
    };
    e.p.read_models
        .put_accounts(&[account("ACC-W", AccountStatus::Active)])
        .await
        .unwrap();
    let reserve = |key: &str, action_id: &str| {
        let mut c = bare(key);
        c.reserve = Some(buy("ACC-W", 10, 5));
        c.action = Some(action(action_id, "pln-none", "ACC-W", key));
        c
    };
    assert_eq!(
        commit(e, &reserve("k-s1", "act-s1")).await,
        CommitOutcome::Committed
    );
    let submitted = Order {
        action_id: Some("act-s1".into()),
        ..order(OrderStatus::Submitted, 0)
    };
    assert!(matches!(
        w.create_order(&submitted).await.unwrap(),
        Stored::Created(_)
    ));
    let filled = Order {
        action_id: Some("act-s1".into()),
        ..order(OrderStatus::Filled, 5)
    };
    let unsettled = [ActionStatus::Queued, ActionStatus::Processing];
    let succeeded = ActionMove {
        action_id: "act-s1",
        from: &unsettled[1..],
        to: ActionStatus::Succeeded,
        error: None,
        at: NOW + 10,
    };
    let unchanged = |why: &'static str| async move {
        assert_eq!(
            e.p.orders
                .get_order("ord-w")
                .await
                .unwrap()
                .map(|o| o.status),
            Some(OrderStatus::Submitted),
            "{why}"
        );
        assert_eq!(
            e.p.positions.get_position("ACC-W", SYMBOL).await.unwrap(),
            None,
            "{why}"
        );
        assert_eq!(ex().await, exposure(0, 5, 0), "{why}");
    };
    // The action is not in a status the move starts from (queued, not processing).
    assert!(!w
        .advance_order(&submitted, &filled, Some(&pos(5, None)), Some(&succeeded))
        .await
        .unwrap());
    unchanged("the action's condition failed").await;
    assert_eq!(act("act-s1").await.status, ActionStatus::Queued);
    let succeeded = ActionMove {
        from: &unsettled,
        ..succeeded
    };
    // No such action.
    let nobody = ActionMove {
        action_id: "act-none",
        ..succeeded
    };
    assert!(!w
        .advance_order(&submitted, &filled, Some(&pos(5, None)), Some(&nobody))
        .await
        .unwrap());
    unchanged("the action does not exist").await;
    // The order is not in the status the step starts from.
    assert!(!w
        .advance_order(
            &order(OrderStatus::Working, 0),
            &filled,
            Some(&pos(5, None)),
            Some(&succeeded)
        )
        .await
        .unwrap());
    unchanged("the order's condition failed").await;
    assert_eq!(act("act-s1").await.status, ActionStatus::Queued);
    // The position moved since it was read.
    assert!(!w
        .advance_order(
            &submitted,
            &filled,
            Some(&pos(5, Some(1))),
            Some(&succeeded)
        )
        .await
        .unwrap());
    unchanged("the position's condition failed").await;
    assert_eq!(act("act-s1").await.status, ActionStatus::Queued);

    assert!(w
        .advance_order(&submitted, &filled, Some(&pos(5, None)), Some(&succeeded))
        .await
        .unwrap());
    assert_eq!(
        e.p.orders.get_order("ord-w").await.unwrap(),
        Some(filled.clone())
    );
    assert_eq!(ex().await, exposure(5, 0, 0));
    let a = act("act-s1").await;
    assert_eq!(
        (a.status, a.error, a.updated_at, a.enqueued_at),
        (ActionStatus::Succeeded, None, NOW + 10, Some(NOW + 10))
    );
    // Replayed later: the order moved on; the settled action stays as it is.
    let again = ActionMove {
        at: NOW + 15,
        ..succeeded
    };
    assert!(!w
        .advance_order(&submitted, &filled, Some(&pos(5, None)), Some(&again))
        .await
        .unwrap());
    assert_eq!(ex().await, exposure(5, 0, 0));
    assert_eq!(act("act-s1").await.updated_at, NOW + 10);

    // A rejection settles its action failed, with the reason, and releases the reservation.
    assert_eq!(
        commit(e, &reserve("k-s2", "act-s2")).await,
        CommitOutcome::Committed
    );
    assert_eq!(ex().await, exposure(5, 5, 0));
    let two = |status| Order {
        order_id: "ord-w2".into(),
        action_id: Some("act-s2".into()),
        ..order(status, 0)
    };
    assert!(matches!(
        w.create_order(&two(OrderStatus::Submitted)).await.unwrap(),
        Stored::Created(_)
    ));
    let failed = ActionMove {
        action_id: "act-s2",
        from: &unsettled,
        to: ActionStatus::Failed,
        error: Some("the broker rejected order ord-w2: over the limit"),
        at: NOW + 20,
    };
    assert!(w
        .advance_order(
            &two(OrderStatus::Submitted),
            &two(OrderStatus::Rejected),
            None,
            Some(&failed)
        )
        .await
        .unwrap());
    assert_eq!(ex().await, exposure(5, 0, 0));
    let a = act("act-s2").await;
    assert_eq!(
        (a.status, a.error.as_deref()),
        (ActionStatus::Failed, failed.error)
    );
    assert!(
        e.p.actions
            .list_unsent(NOW + 100_000, 100)
            .await
            .unwrap()
            .is_empty(),
        "a settled action is out of the sweeper's listing"
    );
}
both!(an_order_step_settles_its_action_in_the_same_write);

// ---------------------------------------------------------------------------------------
// 5b. WorkerStore::replace_order

fn px(s: &str) -> airlock::core::domain::Price {
    airlock::core::domain::Price::parse(s).expect("price")
}

/// `ord-w` as a working limit buy of 5 at 68.00, version 1.
fn working_limit() -> Order {
    let mut o = order(OrderStatus::Working, 0);
    o.terms.order_type = OrderType::Limit;
    o.terms.limit_price = Some(px("68.00"));
    o
}

/// `o`'s terms with a new quantity and limit price.
fn terms_of(o: &Order, quantity: u32, limit: &str) -> OrderTerms {
    OrderTerms {
        quantity,
        limit_price: Some(px(limit)),
        ..o.terms.clone()
    }
}

/// A replace writes the next version only from the state it was computed from (status,
/// fills, version), with its exposure change and the action it settles, all or nothing;
/// every earlier version is kept; a step read before the replace cannot undo it.
async fn replace_order_is_conditional_and_keeps_every_version(b: Backend) {
    let e = &env(b).await;
    let w = &e.p.workers;
    let ex = || async { e.p.positions.get_exposure("ACC-W", SYMBOL).await.unwrap() };
    let stored = || async { e.p.orders.get_order("ord-w").await.unwrap().expect("ord-w") };
    five_reserved(e, "k-r").await;
    let v1 = working_limit();
    assert!(matches!(
        w.create_order(&v1).await.unwrap(),
        Stored::Created(_)
    ));
    assert_eq!(stored().await.version, 1);
    let v2 = v1.replaced(terms_of(&v1, 3, "67.95"), "act-r2", NOW + 100);
    assert_eq!((v2.version, v2.versions.len()), (2, 1));
    let down = ExposureDelta::reserve("ACC-W", SYMBOL, Side::Buy, -2);

    // Not a replace of the stored order: refused before anything is written.
    let mut flipped = v2.clone();
    flipped.terms.side = Side::Sell;
    assert!(w.replace_order(&v1, &flipped, &down, None).await.is_err());
    let skipped = Order {
        version: 3,
        ..v2.clone()
    };
    assert!(w.replace_order(&v1, &skipped, &down, None).await.is_err());
    // A step may not change the version either.
    assert!(w.advance_order(&v1, &v2, None, None).await.is_err());
    // From a status the order does not have.
    let claimed = Order {
        status: OrderStatus::Submitted,
        ..v1.clone()
    };
    let from_claimed = claimed.replaced(terms_of(&v1, 3, "67.95"), "act-r2", NOW + 100);
    assert!(!w
        .replace_order(&claimed, &from_claimed, &down, None)
        .await
        .unwrap());
    assert_eq!(stored().await, v1, "a refused replace wrote the order");
    assert_eq!(
        ex().await,
        exposure(0, 5, 0),
        "a refused replace moved the exposure"
    );

    assert!(w.replace_order(&v1, &v2, &down, None).await.unwrap());
    assert_eq!(stored().await, v2);
    assert_eq!(ex().await, exposure(0, 3, 0));
    // The same replace again (a redelivery): the order is no longer at version 1.
    assert!(!w.replace_order(&v1, &v2, &down, None).await.unwrap());
    assert_eq!(ex().await, exposure(0, 3, 0), "applied twice");
    // A fill read before the replace (from version 1) does not undo it.
    let stale_fill = Order {
        status: OrderStatus::PartiallyFilled,
        filled_quantity: 1,
        ..v1.clone()
    };
    assert!(!w
        .advance_order(&v1, &stale_fill, Some(&pos(1, None)), None)
        .await
        .unwrap());
    assert_eq!(stored().await, v2);
    // A fill on version 2 applies and keeps the versions.
    let part = Order {
        status: OrderStatus::PartiallyFilled,
        filled_quantity: 1,
        avg_fill_price: Some(px("67.95")),
        ..v2.clone()
    };
    assert!(w
        .advance_order(&v2, &part, Some(&pos(1, None)), None)
        .await
        .unwrap());
    assert_eq!(stored().await, part);
    assert_eq!(ex().await, exposure(1, 2, 0));
    // A replace computed before that fill: refused.
    let up = ExposureDelta::reserve("ACC-W", SYMBOL, Side::Buy, 1);
    let v3_early = v2.replaced(terms_of(&v2, 4, "67.95"), "act-r3", NOW + 200);
    assert!(!w.replace_order(&v2, &v3_early, &up, None).await.unwrap());

    // On the partly filled order: the replace applies to the rest and settles its action
    // in the same write (not at all while the action's condition fails).
    let mut c = bare("k-r3");
    c.action = Some(action("act-r3", "pln-none", "ACC-W", "k-r3"));
    assert_eq!(commit(e, &c).await, CommitOutcome::Committed);
    let unsettled = [ActionStatus::Queued, ActionStatus::Processing];
    let settles = ActionMove {
        action_id: "act-r3",
        from: &unsettled,
        to: ActionStatus::Succeeded,
        error: None,
        at: NOW + 300,
    };
    let nobody = ActionMove {
        action_id: "act-none",
        ..settles
    };
    let v3 = part.replaced(terms_of(&part, 4, "67.95"), "act-r3", NOW + 300);
    assert!(!w
        .replace_order(&part, &v3, &up, Some(&nobody))
        .await
        .unwrap());
    assert_eq!(stored().await, part);
    assert_eq!(ex().await, exposure(1, 2, 0));
    assert!(w
        .replace_order(&part, &v3, &up, Some(&settles))
        .await
        .unwrap());
    let got = stored().await;
    assert_eq!(got, v3);
    assert_eq!(ex().await, exposure(1, 3, 0));
    let a =
        e.p.actions
            .get_action("act-r3")
            .await
            .unwrap()
            .expect("act-r3");
    assert_eq!(
        (a.status, a.updated_at),
        (ActionStatus::Succeeded, NOW + 300)
    );
    // Every version, oldest first, as the listings show them too.
    let history: Vec<(u32, u32, Option<airlock::core::domain::Price>, &str)> = got
        .versions
        .iter()
        .map(|v| (v.version, v.quantity, v.limit_price, v.replaced_by.as_str()))
        .collect();
    assert_eq!(
        history,
        [
            (1, 5, Some(px("68.00")), "act-r2"),
            (2, 3, Some(px("67.95")), "act-r3")
        ]
    );
    assert_eq!(got.version, 3);
    let listed = e.p.orders.list_at_the_broker(Some("ACC-W")).await.unwrap();
    assert_eq!(listed, vec![v3.clone()]);
    let page =
        e.p.orders
            .list_orders(
                &DeskScope::All,
                &airlock::core::ports::OrderFilter::default(),
                &Page {
                    after: None,
                    limit: 10,
                },
            )
            .await
            .unwrap();
    assert_eq!(page, vec![v3]);
}
both!(replace_order_is_conditional_and_keeps_every_version);

/// An order stored before orders had versions (no version in its record) reads as
/// version 1 and can be replaced.
async fn an_order_stored_before_versions_is_version_1(b: Backend) {
    let e = &env(b).await;
    e.p.read_models
        .put_accounts(&[account("ACC-W", AccountStatus::Active)])
        .await
        .unwrap();
    let v1 = working_limit();
    let mut old = serde_json::to_value(&v1).unwrap();
    let fields = old.as_object_mut().unwrap();
    fields.remove("version");
    fields.remove("versions");
    match &e.aws {
        // The item as an earlier release wrote it: no `version` attribute, a body without it.
        Some(aws) => {
            use aws_sdk_dynamodb::types::AttributeValue::{N, S};
            aws.ddb
                .put_item()
                .table_name(&aws.names.orders)
                .item("order_id", S("ord-w".into()))
                .item("account_id", S("ACC-W".into()))
                .item("desk", S("energy".into()))
                .item("status", S("working".into()))
                .item("filled_quantity", N("0".into()))
                .item("created_key", S(format!("{:015}#ord-w", NOW)))
                .item("open_account", S("ACC-W".into()))
                .item("body", S(old.to_string()))
                .send()
                .await
                .expect("put the old item");
        }
        // SQLite: the migration gave every row version 1 and no versions.
        None => {
            e.p.read_models
                .put_orders(std::slice::from_ref(&v1))
                .await
                .unwrap()
        }
    }
    assert_eq!(
        e.p.orders.get_order("ord-w").await.unwrap(),
        Some(v1.clone())
    );
    let v2 = v1.replaced(terms_of(&v1, 4, "68.00"), "act-old", NOW + 50);
    let down = ExposureDelta::reserve("ACC-W", SYMBOL, Side::Buy, -1);
    assert!(e
        .p
        .workers
        .replace_order(&v1, &v2, &down, None)
        .await
        .unwrap());
    assert_eq!(
        e.p.orders.get_order("ord-w").await.unwrap(),
        Some(v2.clone())
    );
    // And a step from version 1 can no longer apply.
    assert!(!e
        .p
        .workers
        .replace_order(&v1, &v2, &down, None)
        .await
        .unwrap());
}
both!(an_order_stored_before_versions_is_version_1);

// ---------------------------------------------------------------------------------------
// 5c. WorkerStore::settle_with_exposure

/// An action settled together with an exposure change (a replace's reserved increase
/// released as it fails): both or nothing, once, whichever delivery comes first.
async fn settling_an_action_releases_its_exposure_once(b: Backend) {
    let e = &env(b).await;
    let w = &e.p.workers;
    let ex = || async { e.p.positions.get_exposure("ACC-W", SYMBOL).await.unwrap() };
    let act = |id: &'static str| async move {
        e.p.actions
            .get_action(id)
            .await
            .unwrap()
            .expect("the action")
    };
    e.p.read_models
        .put_accounts(&[account("ACC-W", AccountStatus::Active)])
        .await
        .unwrap();
    // Three actions; the first two each reserved 5 contracts to buy.
    for (key, id, reserve) in [
        ("k-x1", "act-x1", true),
        ("k-x2", "act-x2", true),
        ("k-x3", "act-x3", false),
    ] {
        let mut c = bare(key);
        c.reserve = reserve.then(|| buy("ACC-W", 20, 5));
        c.action = Some(action(id, "pln-none", "ACC-W", key));
        assert_eq!(commit(e, &c).await, CommitOutcome::Committed);
    }
    assert_eq!(ex().await, exposure(0, 10, 0));
    let unsettled = [ActionStatus::Queued, ActionStatus::Processing];
    let release = ExposureDelta::reserve("ACC-W", SYMBOL, Side::Buy, -3);
    let failed = ActionMove {
        action_id: "act-x1",
        from: &unsettled,
        to: ActionStatus::Failed,
        error: Some("the broker rejected the replace of ord-x1: stale version"),
        at: NOW + 10,
    };

    // A change that moves the position (or the orders claimed for the broker) is not a
    // reservation's: refused, nothing written.
    for moves in [
        ExposureDelta {
            position: 3,
            ..release.clone()
        },
        ExposureDelta {
            submitting: -1,
            ..release.clone()
        },
    ] {
        let got = w.settle_with_exposure(&moves, &failed).await;
        assert!(
            matches!(got, Err(airlock::core::error::StoreError::Corrupt(_))),
            "{moves:?}: {got:?}"
        );
    }
    assert_eq!(ex().await, exposure(0, 10, 0));
    assert_eq!(act("act-x1").await.status, ActionStatus::Queued);
    // No such action: nothing written.
    let nobody = ActionMove {
        action_id: "act-none",
        ..failed
    };
    assert!(!w.settle_with_exposure(&release, &nobody).await.unwrap());
    assert_eq!(ex().await, exposure(0, 10, 0));

    // Both applied together.
    assert!(w.settle_with_exposure(&release, &failed).await.unwrap());
    assert_eq!(ex().await, exposure(0, 7, 0));
    let a = act("act-x1").await;
    assert_eq!(
        (a.status, a.error.as_deref(), a.updated_at, a.enqueued_at),
        (ActionStatus::Failed, failed.error, NOW + 10, Some(NOW + 10))
    );
    // Redelivered: the action is settled; the exposure stays as the first call left it.
    let again = ActionMove {
        at: NOW + 15,
        ..failed
    };
    assert!(!w.settle_with_exposure(&release, &again).await.unwrap());
    assert_eq!(ex().await, exposure(0, 7, 0));
    assert_eq!(act("act-x1").await.updated_at, NOW + 10);

    // An action already final (succeeded) is not failed, and nothing is released.
    assert!(w
        .set_action_status(
            "act-x2",
            &unsettled,
            ActionStatus::Succeeded,
            None,
            NOW + 20
        )
        .await
        .unwrap());
    let late = ActionMove {
        action_id: "act-x2",
        at: NOW + 25,
        ..failed
    };
    assert!(!w
        .settle_with_exposure(
            &ExposureDelta::reserve("ACC-W", SYMBOL, Side::Buy, -5),
            &late
        )
        .await
        .unwrap());
    assert_eq!(ex().await, exposure(0, 7, 0));
    let a = act("act-x2").await;
    assert_eq!(
        (a.status, a.error, a.updated_at),
        (ActionStatus::Succeeded, None, NOW + 20)
    );

    // A zero change moves only the action: no exposure is written, not even a zero one.
    let other = "CLG27";
    let zero = ExposureDelta::reserve("ACC-W", other, Side::Buy, 0);
    let three = ActionMove {
        action_id: "act-x3",
        at: NOW + 30,
        ..failed
    };
    assert!(w.settle_with_exposure(&zero, &three).await.unwrap());
    assert_eq!(act("act-x3").await.status, ActionStatus::Failed);
    assert_eq!(ex().await, exposure(0, 7, 0));
    assert_eq!(
        e.p.positions.get_exposure("ACC-W", other).await.unwrap(),
        Exposure::default()
    );
    if let Some(aws) = &e.aws {
        use aws_sdk_dynamodb::types::AttributeValue::S;
        let item = aws
            .ddb
            .get_item()
            .table_name(&aws.names.exposures)
            .key("account_id", S("ACC-W".into()))
            .key("symbol", S(other.into()))
            .consistent_read(true)
            .send()
            .await
            .expect("get the exposure item")
            .item;
        assert_eq!(item, None, "a zero change wrote an exposure item");
    }
    assert!(!w.settle_with_exposure(&zero, &three).await.unwrap());
    assert!(
        e.p.actions
            .list_unsent(NOW + 100_000, 100)
            .await
            .unwrap()
            .is_empty(),
        "settled actions are out of the sweeper's listing"
    );
}
both!(settling_an_action_releases_its_exposure_once);

/// Concurrent settles of one action (two workers, or a worker and the dead-letter sweep):
/// exactly one applies, so the reservation is released once.
async fn concurrent_settles_release_the_exposure_once(b: Backend) {
    let e = &env(b).await;
    let w = &e.p.workers;
    e.p.read_models
        .put_accounts(&[account("ACC-W", AccountStatus::Active)])
        .await
        .unwrap();
    let mut c = bare("k-y");
    c.reserve = Some(buy("ACC-W", 20, 8));
    c.action = Some(action("act-y", "pln-none", "ACC-W", "k-y"));
    assert_eq!(commit(e, &c).await, CommitOutcome::Committed);
    let unsettled = [ActionStatus::Queued, ActionStatus::Processing];
    let release = ExposureDelta::reserve("ACC-W", SYMBOL, Side::Buy, -2);
    let mv = |at: Millis| ActionMove {
        action_id: "act-y",
        from: &unsettled,
        to: ActionStatus::Failed,
        error: Some("refused by the kill switch"),
        at,
    };
    let (m1, m2, m3, m4) = (mv(NOW + 1), mv(NOW + 2), mv(NOW + 3), mv(NOW + 4));
    let got = futures_util::future::join_all([
        w.settle_with_exposure(&release, &m1),
        w.settle_with_exposure(&release, &m2),
        w.settle_with_exposure(&release, &m3),
        w.settle_with_exposure(&release, &m4),
    ])
    .await;
    let applied = got
        .into_iter()
        .map(|r| r.expect("settle"))
        .filter(|ok| *ok)
        .count();
    assert_eq!(applied, 1, "exactly one settle applies");
    assert_eq!(
        e.p.positions.get_exposure("ACC-W", SYMBOL).await.unwrap(),
        exposure(0, 6, 0)
    );
}
both!(concurrent_settles_release_the_exposure_once);

// ---------------------------------------------------------------------------------------
// 5d. Broker::replace and the paper broker's fills (over each backend's document store)

/// Exchange semantics of a replace at the paper broker: applied with its version (a
/// resend is not applied twice, an older version is stale), priority kept by a pure
/// reduction and lost by a new price or more contracts, applied to the rest of a partly
/// filled order, refused for a filled order, below the filled quantity or outside the band.
async fn the_paper_broker_replaces_with_exchange_semantics(b: Backend) {
    use airlock::core::ports::broker::{
        Broker, BrokerOrder, BrokerStatus, ReplaceOutcome, Replacement,
    };
    let e = &env(b).await;
    let broker = &e.p.paper;
    broker
        .set_prices(&std::collections::BTreeMap::from([(
            SYMBOL.to_string(),
            px("68.40"),
        )]))
        .await
        .unwrap();
    let mut terms = market_buy("ACC-B", SYMBOL, 5);
    terms.order_type = OrderType::Limit;
    terms.limit_price = Some(px("68.00"));
    let first = broker
        .submit(&BrokerOrder::new("ord-b", &terms, 1))
        .await
        .unwrap();
    assert_eq!((first.status, first.version), (BrokerStatus::Working, 1));
    let change = |version: u32, quantity: u32, limit: &str| Replacement {
        version,
        quantity,
        limit_price: Some(px(limit)),
        stop_price: None,
        time_in_force: TimeInForce::Day,
    };
    let replaced = |o: ReplaceOutcome| match o {
        ReplaceOutcome::Replaced(o) => o,
        other => panic!("not replaced: {other:?}"),
    };
    let refused = |o: ReplaceOutcome| match o {
        ReplaceOutcome::Rejected { order, reason } => (order, reason),
        other => panic!("not rejected: {other:?}"),
    };
    let pause = || tokio::time::sleep(std::time::Duration::from_millis(5));
    pause().await;
    // Fewer contracts, same price: the same place in the queue.
    let v2 = replaced(
        broker
            .replace("ACC-B", "ord-b", &change(2, 3, "68.00"))
            .await
            .unwrap(),
    );
    assert_eq!((v2.version, v2.terms.quantity), (2, 3));
    assert_eq!(
        v2.priority_at, first.priority_at,
        "a reduction keeps priority"
    );
    pause().await;
    // A new price: the back of the queue.
    let v3 = replaced(
        broker
            .replace("ACC-B", "ord-b", &change(3, 3, "67.95"))
            .await
            .unwrap(),
    );
    assert!(
        v3.priority_at > v2.priority_at,
        "a price change loses priority"
    );
    pause().await;
    // More contracts: the back of the queue too.
    let v4 = replaced(
        broker
            .replace("ACC-B", "ord-b", &change(4, 6, "67.95"))
            .await
            .unwrap(),
    );
    assert!(
        v4.priority_at > v3.priority_at,
        "an increase loses priority"
    );
    // A resend of version 4 with other terms: the order as it is; an older version: stale.
    assert_eq!(
        replaced(
            broker
                .replace("ACC-B", "ord-b", &change(4, 1, "60.00"))
                .await
                .unwrap()
        ),
        v4
    );
    let (order, why) = refused(
        broker
            .replace("ACC-B", "ord-b", &change(3, 2, "67.95"))
            .await
            .unwrap(),
    );
    assert_eq!(order, v4);
    assert!(why.contains("stale"), "{why}");
    // Outside the band: refused, nothing changed.
    let (_, why) = refused(
        broker
            .replace("ACC-B", "ord-b", &change(5, 6, "40.00"))
            .await
            .unwrap(),
    );
    assert!(why.contains("band"), "{why}");
    // The broker's document keeps every version.
    let book = broker.book("ACC-B").await.unwrap();
    let doc = &book.orders["ord-b"];
    assert_eq!(doc, &v4);
    let kept: Vec<(u32, u32)> = doc
        .versions
        .iter()
        .map(|v| (v.version, v.quantity))
        .collect();
    assert_eq!(kept, [(1, 5), (2, 3), (3, 3)]);

    // A partial fill (the operator's fill at its limit), then a replace of the rest.
    let part = broker
        .fill("ACC-B", "ord-b", 2, None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (part.status, part.filled_quantity, part.avg_fill_price),
        (BrokerStatus::PartiallyFilled, 2, Some(px("67.95")))
    );
    let (_, why) = refused(
        broker
            .replace("ACC-B", "ord-b", &change(5, 1, "67.95"))
            .await
            .unwrap(),
    );
    assert!(why.contains("below the 2 already filled"), "{why}");
    let rest = replaced(
        broker
            .replace("ACC-B", "ord-b", &change(5, 3, "67.95"))
            .await
            .unwrap(),
    );
    assert_eq!(
        (rest.status, rest.terms.quantity, rest.filled_quantity),
        (BrokerStatus::PartiallyFilled, 3, 2)
    );
    // Moved through the market: the rest fills at the reference, the average is over both.
    let done = replaced(
        broker
            .replace("ACC-B", "ord-b", &change(6, 3, "68.50"))
            .await
            .unwrap(),
    );
    assert_eq!(
        (done.status, done.filled_quantity, done.avg_fill_price),
        (BrokerStatus::Filled, 3, Some(px("68.1")))
    );
    let held = broker.positions("ACC-B").await.unwrap();
    assert_eq!((held[0].quantity, held[0].avg_price), (3, Some(px("68.1"))));
    // Filled: nothing left to replace.
    let (_, why) = refused(
        broker
            .replace("ACC-B", "ord-b", &change(7, 9, "68.00"))
            .await
            .unwrap(),
    );
    assert!(why.contains("is filled"), "{why}");
    assert_eq!(
        broker
            .replace("ACC-B", "ord-none", &change(2, 1, "68.00"))
            .await
            .unwrap(),
        ReplaceOutcome::Unknown
    );
}
both!(the_paper_broker_replaces_with_exchange_semantics);

// ---------------------------------------------------------------------------------------
// 6. Queue

fn action_of(body: &str) -> String {
    serde_json::from_str::<QueueMessage>(body)
        .expect("queue body is a QueueMessage")
        .action_id
}

async fn queue_sends_receives_and_deduplicates(b: Backend) {
    let e = env(b).await;
    let q = &e.p.queue;
    let m = message("act-q1", "pln-q1", ActionType::OrderSubmitCl);
    assert_eq!(q.backlog(QueueTarget::Orders).await.unwrap(), 0);
    q.send(&m, "ACC-Q", "act-q1").await.unwrap();
    q.send(&m, "ACC-Q", "act-q1").await.unwrap();
    // Execute's admission count: the message, once.
    assert_eq!(q.backlog(QueueTarget::Orders).await.unwrap(), 1);
    assert_eq!(q.backlog(QueueTarget::Jobs).await.unwrap(), 0);
    let got = q.receive(QueueTarget::Orders, 10, 30_000).await.unwrap();
    assert_eq!(
        q.backlog(QueueTarget::Orders).await.unwrap(),
        1,
        "a message being handled still counts"
    );
    assert_eq!(
        got.len(),
        1,
        "a resend with the same dedup id was delivered: {got:?}"
    );
    assert_eq!(
        serde_json::from_str::<QueueMessage>(&got[0].body).unwrap(),
        m
    );
    assert_eq!(got[0].group.as_deref(), Some("ACC-Q"));
    assert_eq!(got[0].receive_count, 1);
    // Hidden while in flight; a resend while in flight is not delivered either.
    q.send(&m, "ACC-Q", "act-q1").await.unwrap();
    assert!(q
        .receive(QueueTarget::Orders, 10, 30_000)
        .await
        .unwrap()
        .is_empty());
    q.ack(QueueTarget::Orders, &got[0].receipt).await.unwrap();
    assert_eq!(q.backlog(QueueTarget::Orders).await.unwrap(), 0, "handled");
    assert!(q
        .receive(QueueTarget::Orders, 10, 30_000)
        .await
        .unwrap()
        .is_empty());

    // The jobs queue: send, receive, release, receive again, ack.
    let j = message("act-j1", "pln-j1", ActionType::PositionsSync);
    q.send(&j, "ACC-Q", "act-j1").await.unwrap();
    let got = q.receive(QueueTarget::Jobs, 10, 30_000).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(action_of(&got[0].body), "act-j1");
    assert!(
        q.receive(QueueTarget::Orders, 10, 30_000)
            .await
            .unwrap()
            .is_empty(),
        "a job went to the orders queue"
    );
    q.release(QueueTarget::Jobs, &got[0].receipt, 0)
        .await
        .unwrap();
    let again = q.receive(QueueTarget::Jobs, 10, 30_000).await.unwrap();
    assert_eq!(again.len(), 1, "a released message did not come back");
    assert_eq!(action_of(&again[0].body), "act-j1");
    assert_eq!(again[0].receive_count, 2);
    q.ack(QueueTarget::Jobs, &again[0].receipt).await.unwrap();
    assert!(q
        .receive(QueueTarget::Jobs, 10, 30_000)
        .await
        .unwrap()
        .is_empty());
}
both!(queue_sends_receives_and_deduplicates);

/// SQS FIFO keeps a deduplication id for 5 minutes from the send, deleted or not; the
/// embedded queue keeps acked rows for the same window.
async fn queue_dedup_outlives_the_ack(b: Backend) {
    let e = env(b).await;
    let q = &e.p.queue;
    let m = message("act-d1", "pln-d1", ActionType::OrderSubmitCl);
    q.send(&m, "ACC-Q", "act-d1").await.unwrap();
    let got = q.receive(QueueTarget::Orders, 10, 30_000).await.unwrap();
    assert_eq!(got.len(), 1);
    q.ack(QueueTarget::Orders, &got[0].receipt).await.unwrap();
    q.send(&m, "ACC-Q", "act-d1").await.unwrap();
    let again = q.receive(QueueTarget::Orders, 10, 30_000).await.unwrap();
    assert!(
        again.is_empty(),
        "a resend within the deduplication window, after the ack, was delivered again: {again:?}"
    );
}

// The embedded queue only: moto compares a FIFO deduplication id only with messages still
// in the queue (sqs/models.py add_message), so after the delete it delivers a resend again,
// where real SQS keeps the id for 5 minutes from the send. A test of the emulator's gap
// would prove nothing about SQS.
#[tokio::test]
async fn queue_dedup_outlives_the_ack_embedded() {
    queue_dedup_outlives_the_ack(airlock_tests::Backend::Embedded).await
}

/// What both backends guarantee on the FIFO orders queue: each group's messages come in
/// send order, a batch holds a prefix of each group's waiting messages, and while a
/// message of a group is in flight nothing later of that group is delivered.
async fn queue_keeps_group_order(b: Backend) {
    let e = env(b).await;
    let q = &e.p.queue;
    let sent = [("a1", "G-A"), ("a2", "G-A"), ("b1", "G-B"), ("a3", "G-A")];
    for (id, group) in sent {
        q.send(&message(id, "pln", ActionType::OrderSubmitCl), group, id)
            .await
            .unwrap();
    }
    let order = |g: &str| -> Vec<String> {
        sent.iter()
            .filter(|(_, gg)| *gg == g)
            .map(|(id, _)| id.to_string())
            .collect()
    };
    let mut seen: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let mut rounds = 0;
    while seen.values().map(Vec::len).sum::<usize>() < sent.len() {
        rounds += 1;
        assert!(rounds <= sent.len(), "messages lost: seen {seen:?}");
        let batch = q.receive(QueueTarget::Orders, 10, 30_000).await.unwrap();
        assert!(!batch.is_empty(), "nothing delivered; seen {seen:?}");
        let mut in_batch: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for d in &batch {
            let g = d.group.clone().expect("a FIFO delivery names its group");
            in_batch.entry(g).or_default().push(action_of(&d.body));
        }
        if rounds == 1 {
            assert_eq!(
                in_batch.keys().collect::<Vec<_>>(),
                vec!["G-A", "G-B"],
                "the first receive serves every group"
            );
        }
        for (g, ids) in &in_batch {
            let done = seen.get(g).map(Vec::len).unwrap_or(0);
            assert_eq!(
                ids[..],
                order(g)[done..done + ids.len()],
                "group {g} out of order (seen {seen:?})"
            );
        }
        // Everything delivered is in flight: its groups deliver nothing more meanwhile.
        let blocked = q.receive(QueueTarget::Orders, 10, 30_000).await.unwrap();
        for d in &blocked {
            assert!(
                !in_batch.contains_key(d.group.as_deref().unwrap_or("")),
                "{} delivered while its group had a message in flight",
                action_of(&d.body)
            );
        }
        for d in batch.iter().chain(&blocked) {
            seen.entry(d.group.clone().unwrap())
                .or_default()
                .push(action_of(&d.body));
            q.ack(QueueTarget::Orders, &d.receipt).await.unwrap();
        }
    }
    assert_eq!(seen.get("G-A"), Some(&order("G-A")));
    assert_eq!(seen.get("G-B"), Some(&order("G-B")));
    assert!(q
        .receive(QueueTarget::Orders, 10, 30_000)
        .await
        .unwrap()
        .is_empty());
}
both!(queue_keeps_group_order);

/// An expired record counts as absent, so its former lease owner no longer holds it:
/// `mark_sent` after `expires_at` must not write the key or mark the action sent.
async fn mark_sent_on_an_expired_key_is_refused(b: Backend) {
    let e = env(b).await;
    let mut c = bare("k-mexp");
    c.key.expires_at = NOW + 1_000;
    c.action = Some(action("act-mexp", "pln-none", "ACC-1", "k-mexp"));
    assert_eq!(commit(&e, &c).await, CommitOutcome::Committed);
    let decided = KeyRecord {
        state: KeyState::Decided {
            decision: Decision::Queued {
                action_id: "act-mexp".into(),
                plan_id: "pln-none".into(),
                queue_target: QueueTarget::Orders,
                resource_refs: ResourceRefs::default(),
            },
            owner: None,
        },
        ..c.key.clone()
    };
    let later = NOW + 5_000;
    let wrote =
        e.p.ledger
            .mark_sent(&decided, "owner-1", "act-mexp", later)
            .await
            .unwrap();
    let enqueued =
        e.p.actions
            .get_action("act-mexp")
            .await
            .unwrap()
            .unwrap()
            .enqueued_at;
    assert_eq!(
        (wrote, enqueued),
        (false, None),
        "mark_sent succeeded on a key that expired before it"
    );
}
both!(mark_sent_on_an_expired_key_is_refused);

/// The sweeper retires an action it will never send (its key expired): once, only while
/// it is unsent, and it leaves the unsent listing.
async fn clear_unsent_takes_an_action_out_once(b: Backend) {
    let e = env(b).await;
    let mut c = bare("k-retire");
    c.action = Some(action("act-retire", "pln-none", "ACC-1", "k-retire"));
    assert_eq!(commit(&e, &c).await, CommitOutcome::Committed);
    assert!(!e.p.actions.clear_unsent("act-none", NOW + 5).await.unwrap());
    assert!(e
        .p
        .actions
        .clear_unsent("act-retire", NOW + 5)
        .await
        .unwrap());
    assert!(
        e.p.actions
            .list_unsent(NOW + 100_000, 100)
            .await
            .unwrap()
            .is_empty(),
        "a retired action is no longer the sweeper's"
    );
    assert_eq!(
        e.p.actions
            .get_action("act-retire")
            .await
            .unwrap()
            .unwrap()
            .enqueued_at,
        Some(NOW + 5)
    );
    assert!(
        !e.p.actions
            .clear_unsent("act-retire", NOW + 9)
            .await
            .unwrap(),
        "retired twice"
    );
}
both!(clear_unsent_takes_an_action_out_once);

/// Commits an unsent action `id` accepted at `created_at`, under its own key.
async fn unsent_action(e: &Env, id: &str, created_at: Millis, error: Option<&str>) {
    let key = format!("k-{id}");
    let mut c = bare(&key);
    let mut a = action(id, "pln-none", "ACC-1", &key);
    a.created_at = created_at;
    a.updated_at = created_at;
    a.error = error.map(String::from);
    c.action = Some(a);
    assert_eq!(commit(e, &c).await, CommitOutcome::Committed, "{id}");
}

async fn unsent_ids(e: &Env, claimed_before: Millis, limit: u32) -> Vec<String> {
    e.p.actions
        .list_unsent(claimed_before, limit)
        .await
        .expect("list_unsent")
        .into_iter()
        .map(|a| a.action_id)
        .collect()
}

/// The sweeper's listing reads past one page of its index: 40 unsent actions of about
/// 60 KB each (2.4 MB; DynamoDB answers a query with at most 1 MB), 24 of them on one shard
/// of the AWS index (more than a page of it), all come back, oldest first; fewer asked
/// for, the oldest ones; and only those accepted before `claimed_before`.
async fn the_unsent_listing_reads_past_one_page(b: Backend) {
    let e = env(b).await;
    let (mut crowded, mut others) = (Vec::new(), Vec::new());
    for i in 0.. {
        let id = format!("act-page-{i}");
        match shapes::unsent_shard(&id).as_str() {
            "u#3" if crowded.len() < 24 => crowded.push(id),
            "u#3" => {}
            _ if others.len() < 16 => others.push(id),
            _ => {}
        }
        if crowded.len() == 24 && others.len() == 16 {
            break;
        }
    }
    // Accepted in this order, three of the crowded shard's for every two others.
    let (mut crowded, mut others) = (crowded.into_iter(), others.into_iter());
    let order: Vec<String> = (0..40)
        .filter_map(|j| match j % 5 {
            0..=2 => crowded.next(),
            _ => others.next(),
        })
        .collect();
    assert_eq!(order.len(), 40);
    let bulk = "x".repeat(60_000);
    for (i, id) in order.iter().enumerate() {
        unsent_action(&e, id, NOW + i as Millis, Some(&bulk)).await;
    }
    if let Some(aws) = &e.aws {
        // One query of the crowded shard does not answer all of it.
        let first = aws
            .ddb
            .query()
            .table_name(&aws.names.actions)
            .index_name(shapes::UNSENT_INDEX)
            .key_condition_expression("unsent_shard = :s")
            .expression_attribute_values(
                ":s",
                aws_sdk_dynamodb::types::AttributeValue::S("u#3".into()),
            )
            .send()
            .await
            .expect("query a shard");
        assert!(first.count < 24, "one page: {}", first.count);
        assert!(first.last_evaluated_key.is_some());
    }
    assert_eq!(
        unsent_ids(&e, NOW + 1_000, 100).await,
        order,
        "every one, oldest first"
    );
    assert_eq!(
        unsent_ids(&e, NOW + 1_000, 30).await,
        order[..30],
        "the oldest 30"
    );
    assert_eq!(unsent_ids(&e, NOW + 1_000, 1).await, order[..1]);
    assert_eq!(
        unsent_ids(&e, NOW + 35, 100).await,
        order[..35],
        "accepted before"
    );
}
both!(the_unsent_listing_reads_past_one_page);

/// The AWS items of the actions table: `(action_id, unsent_shard, unsent)`.
async fn action_index_attributes(e: &Env) -> Vec<(String, Option<String>, Option<String>)> {
    use aws_sdk_dynamodb::types::AttributeValue;
    let aws = e.aws.as_ref().expect("the AWS backend");
    let text = |item: &std::collections::HashMap<String, AttributeValue>, name: &str| {
        item.get(name).and_then(|v| v.as_s().ok()).cloned()
    };
    let mut out = Vec::new();
    let mut start = None;
    loop {
        let o = aws
            .ddb
            .scan()
            .table_name(&aws.names.actions)
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .expect("scan actions");
        for item in o.items.unwrap_or_default() {
            out.push((
                text(&item, "action_id").expect("action_id"),
                text(&item, shapes::UNSENT_SHARD_ATTRIBUTE),
                text(&item, shapes::LEGACY_UNSENT_ATTRIBUTE),
            ));
        }
        match o.last_evaluated_key {
            Some(k) if !k.is_empty() => start = Some(k),
            _ => break,
        }
    }
    out.sort();
    out
}

/// 64 unsent actions with ids as execute makes them are written to many shards of the
/// unsent index, none holding a quarter of them, and never to the legacy single partition.
#[tokio::test]
async fn unsent_actions_spread_over_the_index_shards() {
    let e = env(Backend::Aws).await;
    for i in 0..64 {
        let id = airlock::core::domain::new_id("act", NOW);
        unsent_action(&e, &id, NOW + i, None).await;
    }
    let items = action_index_attributes(&e).await;
    assert_eq!(items.len(), 64);
    let mut per_shard = std::collections::BTreeMap::<String, usize>::new();
    for (id, shard, legacy) in &items {
        assert_eq!(legacy, &None, "{id}: written to the legacy index");
        let shard = shard.clone().unwrap_or_else(|| panic!("{id}: no shard"));
        assert_eq!(shard, shapes::unsent_shard(id));
        *per_shard.entry(shard).or_default() += 1;
    }
    assert!(per_shard.len() >= 8, "{per_shard:?}");
    assert!(per_shard.values().all(|&n| n < 16), "{per_shard:?}");
    assert_eq!(unsent_ids(&e, NOW + 1_000, 100).await.len(), 64);
}

/// Actions accepted before the sharded index existed carry only `unsent = "1"` (the
/// legacy index's key): they are still listed, in time order with the others, and every
/// way out of the listing (retired, moved by a worker, marked sent) removes that attribute
/// too. Once the legacy index is dropped, the listing carries on without it.
#[tokio::test]
async fn actions_from_before_the_sharded_index_are_still_listed() {
    use aws_sdk_dynamodb::types::DeleteGlobalSecondaryIndexAction;
    use aws_sdk_dynamodb::types::GlobalSecondaryIndexUpdate;
    let e = env(Backend::Aws).await;
    let aws = e.aws.clone().expect("the AWS backend");
    let ids = [
        "act-old-1",
        "act-new-1",
        "act-old-2",
        "act-old-3",
        "act-new-2",
    ];
    for (i, id) in ids.iter().enumerate() {
        unsent_action(&e, id, NOW + i as Millis, None).await;
    }
    // As the release before wrote them.
    for id in ["act-old-1", "act-old-2", "act-old-3"] {
        airlock_tests::unsent_the_old_way(&aws.ddb, &aws.names.actions, id).await;
    }
    assert_eq!(
        unsent_ids(&e, NOW + 1_000, 100).await,
        ids,
        "old and new, oldest first"
    );
    assert_eq!(unsent_ids(&e, NOW + 1_000, 2).await, ids[..2]);

    // Out of the listing: retired by the sweeper, moved by a worker, marked sent.
    assert!(e
        .p
        .actions
        .clear_unsent("act-old-1", NOW + 10)
        .await
        .unwrap());
    assert!(!e
        .p
        .actions
        .clear_unsent("act-old-1", NOW + 11)
        .await
        .unwrap());
    assert!(e
        .p
        .workers
        .set_action_status(
            "act-old-2",
            &[ActionStatus::Queued],
            ActionStatus::Processing,
            None,
            NOW + 10,
        )
        .await
        .unwrap());
    let mut c = bare("k-act-old-3");
    c.key.state = KeyState::Decided {
        decision: Decision::Queued {
            action_id: "act-old-3".into(),
            plan_id: "pln-none".into(),
            queue_target: QueueTarget::Orders,
            resource_refs: ResourceRefs::default(),
        },
        owner: None,
    };
    assert!(e
        .p
        .ledger
        .mark_sent(&c.key, "owner-1", "act-old-3", NOW + 10)
        .await
        .unwrap());
    assert_eq!(
        unsent_ids(&e, NOW + 1_000, 100).await,
        ["act-new-1", "act-new-2"]
    );
    for (id, shard, legacy) in action_index_attributes(&e).await {
        if id.starts_with("act-old-") {
            assert_eq!(
                (shard, legacy),
                (None, None),
                "{id} left an index attribute"
            );
        }
    }

    // The release after drops the legacy index: nothing to read there, no error.
    aws.ddb
        .update_table()
        .table_name(&aws.names.actions)
        .global_secondary_index_updates(
            GlobalSecondaryIndexUpdate::builder()
                .delete(
                    DeleteGlobalSecondaryIndexAction::builder()
                        .index_name(shapes::LEGACY_UNSENT_INDEX)
                        .build()
                        .expect("delete action"),
                )
                .build(),
        )
        .send()
        .await
        .expect("drop the legacy index");
    assert_eq!(
        unsent_ids(&e, NOW + 1_000, 100).await,
        ["act-new-1", "act-new-2"]
    );
}

/// A sync replacing more positions than one DynamoDB transaction can hold (100 items; each
/// position is a write and an exposure move) writes them all, and the job once.
async fn a_sync_replaces_more_positions_than_one_transaction_holds(b: Backend) {
    let e = env(b).await;
    let w = &e.p.workers;
    e.p.read_models
        .put_accounts(&[account("ACC-B", AccountStatus::Active)])
        .await
        .unwrap();
    let running = Job {
        job_id: "job-big".into(),
        kind: JobKind::PositionsSync,
        status: JobStatus::Running,
        account_id: Some("ACC-B".into()),
        action_id: Some("act-big".into()),
        created_at: NOW,
        updated_at: NOW,
        error: None,
        result: None,
    };
    w.create_job(&running).await.unwrap();
    let rows = |n: usize, qty: i64| -> Vec<Position> {
        (0..n)
            .map(|i| Position {
                account_id: "ACC-B".into(),
                symbol: format!("SYM{i:03}"),
                quantity: qty,
                avg_price: None,
                updated_at: NOW,
                day_realized: None,
            })
            .collect()
    };
    let after = rows(150, 2);
    let done = Job {
        status: JobStatus::Succeeded,
        ..running.clone()
    };
    let result = serde_json::json!({"positions": 150});
    let replaced = w
        .finish_job(
            &done,
            &result,
            Some(&PositionsReplacement {
                account_id: "ACC-B",
                before: &[],
                after: &after,
            }),
        )
        .await
        .unwrap();
    assert!(replaced);
    let page = Page {
        after: None,
        limit: 10_000,
    };
    let held =
        e.p.positions
            .list_positions(&DeskScope::All, Some("ACC-B"), &page)
            .await
            .unwrap();
    assert_eq!(held.len(), 150, "every position written");
    assert!(held.iter().all(|p| p.quantity == 2));
    assert_eq!(
        e.p.positions
            .get_exposure("ACC-B", "SYM149")
            .await
            .unwrap()
            .position,
        2,
        "the exposure moved with the position"
    );
    assert_eq!(
        w.create_job(&running).await.unwrap().status,
        JobStatus::Succeeded,
        "the job finished (a create returns the stored job)"
    );
    // Finished: the same write again changes nothing.
    assert!(!w
        .finish_job(
            &done,
            &result,
            Some(&PositionsReplacement {
                account_id: "ACC-B",
                before: &[],
                after: &after,
            }),
        )
        .await
        .unwrap());
}
both!(a_sync_replaces_more_positions_than_one_transaction_holds);

/// The narrow sync race (an order claimed for the broker, whose fill the broker's
/// positions may hold before the order records it): a sync does not replace the position
/// of a contract while one of its orders is `submitted`, and does once it is recorded.
async fn a_sync_waits_for_orders_claimed_for_the_broker(b: Backend) {
    a_sync_waits_for_a_claimed_order(b, false).await
}
both!(a_sync_waits_for_orders_claimed_for_the_broker);

/// The same, for an order created already claimed (the order worker's first delivery).
async fn a_sync_waits_for_orders_created_claimed(b: Backend) {
    a_sync_waits_for_a_claimed_order(b, true).await
}
both!(a_sync_waits_for_orders_created_claimed);

async fn a_sync_waits_for_a_claimed_order(b: Backend, created_claimed: bool) {
    let e = env(b).await;
    let w = &e.p.workers;
    e.p.read_models
        .put_accounts(&[account("ACC-W", AccountStatus::Active)])
        .await
        .unwrap();
    let queued = order(OrderStatus::Queued, 0);
    let submitted = order(OrderStatus::Submitted, 0);
    if created_claimed {
        assert_eq!(
            w.create_order(&submitted).await.unwrap(),
            Stored::Created(submitted.clone())
        );
    } else {
        w.create_order(&queued).await.unwrap();
        assert!(w
            .advance_order(&queued, &submitted, None, None)
            .await
            .unwrap());
    }
    let running = Job {
        job_id: "job-race".into(),
        kind: JobKind::PositionsSync,
        status: JobStatus::Running,
        account_id: Some("ACC-W".into()),
        action_id: Some("act-race".into()),
        created_at: NOW,
        updated_at: NOW,
        error: None,
        result: None,
    };
    w.create_job(&running).await.unwrap();
    let done = Job {
        status: JobStatus::Succeeded,
        ..running.clone()
    };
    let result = serde_json::json!({});
    // The broker already filled the order (5): the sync must not write that position.
    let broker = vec![Position {
        account_id: "ACC-W".into(),
        symbol: SYMBOL.into(),
        quantity: 5,
        avg_price: None,
        updated_at: NOW,
        day_realized: None,
    }];
    let replace = |before: &'static [Position]| PositionsReplacement {
        account_id: "ACC-W",
        before,
        after: &broker,
    };
    assert!(
        !w.finish_job(&done, &result, Some(&replace(&[])))
            .await
            .unwrap(),
        "replaced a position while an order of the contract was at the broker unrecorded"
    );
    assert_eq!(
        e.p.positions.get_position("ACC-W", SYMBOL).await.unwrap(),
        None
    );
    // Another contract's positions are not held up by it.
    let other = Position {
        symbol: "CLG27".into(),
        ..broker[0].clone()
    };
    let other_job = Job {
        job_id: "job-other".into(),
        ..running.clone()
    };
    w.create_job(&other_job).await.unwrap();
    assert!(w
        .finish_job(
            &Job {
                status: JobStatus::Succeeded,
                ..other_job
            },
            &result,
            Some(&PositionsReplacement {
                account_id: "ACC-W",
                before: &[],
                after: std::slice::from_ref(&other),
            }),
        )
        .await
        .unwrap());
    // The order records its fill; the sync, reading again, replaces.
    let filled = order(OrderStatus::Filled, 5);
    assert!(w
        .advance_order(&submitted, &filled, Some(&pos(5, None)), None)
        .await
        .unwrap());
    let now_held = vec![
        other.clone(),
        Position {
            updated_at: NOW + 5,
            ..broker[0].clone()
        },
    ];
    let mut after = broker.clone();
    after.push(other);
    assert!(w
        .finish_job(
            &done,
            &result,
            Some(&PositionsReplacement {
                account_id: "ACC-W",
                before: &now_held,
                after: &after,
            }),
        )
        .await
        .unwrap());
    assert_eq!(
        e.p.positions
            .get_position("ACC-W", SYMBOL)
            .await
            .unwrap()
            .map(|p| p.quantity),
        Some(5),
        "counted once"
    );
}

/// An order created in a later state than `queued` moves the exposure as the step from
/// what execute reserved would: created `rejected` (never sent), its reservation is
/// released at once; created with fills, it is refused; a second create moves nothing.
async fn create_order_applies_its_step_from_the_reservation(b: Backend) {
    let e = env(b).await;
    let w = &e.p.workers;
    let ex = || async { e.p.positions.get_exposure("ACC-W", SYMBOL).await.unwrap() };
    five_reserved(&e, "k-created").await;
    assert_eq!(ex().await, exposure(0, 5, 0));

    let filled = order(OrderStatus::Filled, 5);
    assert!(
        w.create_order(&filled).await.is_err(),
        "an order created with fills"
    );
    assert_eq!(e.p.orders.get_order("ord-w").await.unwrap(), None);

    let rejected = order(OrderStatus::Rejected, 0);
    assert_eq!(
        w.create_order(&rejected).await.unwrap(),
        Stored::Created(rejected.clone())
    );
    assert_eq!(ex().await, exposure(0, 0, 0), "the reservation stays held");
    // A redelivery's claim finds it rejected: nothing moves.
    assert_eq!(
        w.create_order(&order(OrderStatus::Submitted, 0))
            .await
            .unwrap(),
        Stored::Found(rejected.clone())
    );
    assert_eq!(
        w.create_order(&rejected).await.unwrap(),
        Stored::Found(rejected.clone())
    );
    assert_eq!(ex().await, exposure(0, 0, 0), "released twice");
    assert_eq!(e.p.orders.get_order("ord-w").await.unwrap(), Some(rejected));
}
both!(create_order_applies_its_step_from_the_reservation);

/// Reconciliation's listing: the orders at the broker (submitted, working, partially
/// filled) of an account or of all, and no other; an order leaves it when it ends.
async fn orders_at_the_broker_are_listed_and_leave_when_they_end(b: Backend) {
    let e = env(b).await;
    let w = &e.p.workers;
    e.p.read_models
        .put_accounts(&[
            account("ACC-W", AccountStatus::Active),
            account("ACC-V", AccountStatus::Active),
        ])
        .await
        .unwrap();
    let ids = |v: Vec<Order>| v.into_iter().map(|o| o.order_id).collect::<Vec<_>>();
    let mk = |id: &str, acc: &str, status: OrderStatus| {
        let mut o = order(status, 0);
        o.order_id = id.into();
        o.terms.account_id = acc.into();
        o
    };
    // Queued (not at the broker yet), then claimed and working; one of another account.
    let q = mk("ord-q", "ACC-W", OrderStatus::Queued);
    w.create_order(&q).await.unwrap();
    let a = mk("ord-a", "ACC-W", OrderStatus::Queued);
    w.create_order(&a).await.unwrap();
    let a_sub = mk("ord-a", "ACC-W", OrderStatus::Submitted);
    assert!(w.advance_order(&a, &a_sub, None, None).await.unwrap());
    let a_work = mk("ord-a", "ACC-W", OrderStatus::Working);
    assert!(w.advance_order(&a_sub, &a_work, None, None).await.unwrap());
    let v = mk("ord-v", "ACC-V", OrderStatus::Queued);
    w.create_order(&v).await.unwrap();
    let v_sub = mk("ord-v", "ACC-V", OrderStatus::Submitted);
    assert!(w.advance_order(&v, &v_sub, None, None).await.unwrap());

    let o = &e.p.orders;
    assert_eq!(
        ids(o.list_at_the_broker(Some("ACC-W")).await.unwrap()),
        ["ord-a"]
    );
    let mut all = ids(o.list_at_the_broker(None).await.unwrap());
    all.sort();
    assert_eq!(all, ["ord-a", "ord-v"]);
    // Cancelled: no longer at the broker.
    let a_done = mk("ord-a", "ACC-W", OrderStatus::Cancelled);
    assert!(w.advance_order(&a_work, &a_done, None, None).await.unwrap());
    assert!(o
        .list_at_the_broker(Some("ACC-W"))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(ids(o.list_at_the_broker(None).await.unwrap()), ["ord-v"]);
}
both!(orders_at_the_broker_are_listed_and_leave_when_they_end);

/// The paper book answers `load_changed` with nothing while the version it was given is
/// current, and with the document once it moved; so the broker decodes its price table
/// once per change, and a price set by another process (another broker on the same store)
/// is seen by the next read.
async fn the_price_table_is_decoded_once_per_change(b: Backend) {
    let e = env(b).await;
    let book = e.book.as_ref();
    assert_eq!(
        book.load_changed("prices", 0).await.unwrap(),
        None,
        "absent"
    );
    let doc = serde_json::json!({"CLF27": "68.40"});
    assert!(book.save("prices", &doc, 0).await.unwrap());
    let (got, v1) = book.load_changed("prices", 0).await.unwrap().expect("new");
    assert_eq!((got, v1), (Some(doc), 1));
    assert_eq!(book.load_changed("prices", v1).await.unwrap(), None);

    let mine = &e.p.paper;
    let other = airlock::adapters::paper_broker::PaperBroker::new(e.book.clone());
    let price = |s: &str| airlock::core::domain::Price::parse(s).unwrap();
    assert_eq!(mine.prices().await.unwrap()["CLF27"].price, price("68.40"));
    let set = std::collections::BTreeMap::from([("CLF27".to_string(), price("70.10"))]);
    other.set_prices(&set).await.unwrap();
    assert_eq!(mine.prices().await.unwrap()["CLF27"].price, price("70.10"));
    assert_eq!(
        book.load_changed("prices", v1 + 1).await.unwrap(),
        None,
        "one change, one version"
    );
}
both!(the_price_table_is_decoded_once_per_change);

/// Orders on one account's contracts, submitted to the paper broker at the same time (the
/// workers handle each account-and-contract group at once), all fill: the writers of the
/// account's book take turns in a process instead of losing optimistic rounds to each other
/// until one gives up. A second broker on the same store (another process) submitting at
/// the same time is held off by the versions, and its lost rounds pause before they read
/// again (should one still give up, it is retried, as its message would be); nothing is
/// lost or counted twice.
async fn the_paper_broker_fills_concurrent_orders_on_one_account(b: Backend) {
    use airlock::adapters::paper_broker::PaperBroker;
    use airlock::core::ports::broker::{Broker, BrokerOrder, BrokerStatus};
    let e = env(b).await;
    let months = ["CLF27", "CLG27", "CLH27", "CLJ27", "CLK27", "CLM27"];
    let price = airlock::core::domain::Price::parse("68.40").unwrap();
    let table = months.iter().map(|m| (m.to_string(), price)).collect();
    e.p.paper.set_prices(&table).await.unwrap();
    let other = Arc::new(PaperBroker::new(e.book.clone()));
    let order = |i: usize| {
        BrokerOrder::new(
            &format!("ord-{i}"),
            &market_buy("ACC-C", months[i % months.len()], 1),
            1,
        )
    };
    const MINE: usize = 36;
    const OTHERS: usize = 6;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..MINE + OTHERS {
        let broker = if i < MINE {
            e.p.paper.clone()
        } else {
            other.clone()
        };
        let o = order(i);
        tasks.spawn(async move { (i, broker.submit(&o).await) });
    }
    let mut filled = 0;
    let mut gave_up = Vec::new();
    while let Some(done) = tasks.join_next().await {
        match done.unwrap() {
            (_, Ok(ack)) => {
                assert_eq!(ack.status, BrokerStatus::Filled, "{ack:?}");
                filled += 1;
            }
            // The other process may lose every round while this one writes back to back
            // (a slow emulator stretches that): its message would be retried later.
            (i, Err(e)) if i >= MINE && e.to_string().contains("contention") => gave_up.push(i),
            (i, Err(e)) => panic!("order {i}: this process's orders never give up: {e}"),
        }
    }
    for i in gave_up {
        let ack = other.submit(&order(i)).await.expect("retried later");
        assert_eq!(ack.status, BrokerStatus::Filled, "{ack:?}");
        filled += 1;
    }
    assert_eq!(filled, MINE + OTHERS);
    let mut positions = e.p.paper.positions("ACC-C").await.unwrap();
    positions.sort_by(|a, b| a.symbol.cmp(&b.symbol));
    let held: Vec<(String, i64)> = positions
        .into_iter()
        .map(|p| (p.symbol, p.quantity))
        .collect();
    let mut want: Vec<(String, i64)> = months.iter().map(|m| (m.to_string(), 7)).collect();
    want.sort();
    assert_eq!(held, want, "every fill moved the book once");
    // A resend of a client order id is the same order, not a new fill.
    let again = e.p.paper.submit(&order(0)).await.unwrap();
    assert_eq!(again.status, BrokerStatus::Filled);
    let total: i64 =
        e.p.paper
            .positions("ACC-C")
            .await
            .unwrap()
            .iter()
            .map(|p| p.quantity)
            .sum();
    assert_eq!(total, (MINE + OTHERS) as i64);
}
both!(the_paper_broker_fills_concurrent_orders_on_one_account);

// ---------------------------------------------------------------------------------------
// The pending-approvals listings

/// An `operator`-mode plan awaiting approval, asked by `by`, expiring `exp_s` seconds after
/// `NOW` (the listings are newest, that is latest expiry, first).
fn awaiting(plan_id: &str, by: &str, four_eyes: bool, exp_s: i64) -> PlanRecord {
    let mut p = plan(plan_id, "ACC-1", PlanStatus::Planned);
    p.confirmation = airlock::core::policy::ConfirmationMode::Operator;
    p.requested_by = by.into();
    p.four_eyes = four_eyes;
    p.expires_at = NOW + exp_s * 1000;
    p
}

fn approval_by(who: &str, decision: ApprovalDecision) -> Approval {
    Approval {
        decision,
        approver: who.into(),
        credential_id: format!("cred-{who}"),
        user_verified: true,
        payload_hash: "hash".into(),
        at: NOW,
    }
}

fn ids(plans: &[PlanRecord]) -> Vec<&str> {
    plans.iter().map(|p| p.plan_id.as_str()).collect()
}

/// An operator's pending list is a query of their own plans (and of the four-eyes plans of
/// their desks), so a colleague's 205 plans on the same desk never push theirs off it.
async fn the_pending_listings_are_queries_not_filters(b: Backend) {
    let e = env(b).await;
    let put = |p: PlanRecord| {
        let plans = e.p.plans.clone();
        async move {
            let a = audit(&format!("a-{}", p.plan_id), Some(&p.plan_id));
            plans.put_plan(&p, &a).await.unwrap();
        }
    };
    // The colleague's plans expire first: a listing that reads the 200 soonest and
    // filters afterwards never reaches op-1's.
    for i in 0..205 {
        put(awaiting(
            &format!("pln-c{i:03}"),
            "op-colleague",
            false,
            100 + i,
        ))
        .await;
    }
    for (id, exp) in [
        ("pln-mine-1", 400),
        ("pln-mine-2", 401),
        ("pln-mine-3", 402),
    ] {
        put(awaiting(id, "op-1", false, exp)).await;
    }
    put(awaiting("pln-4e-a", "op-colleague", true, 500)).await;
    put(awaiting("pln-4e-b", "op-2", true, 501)).await;
    // Token plans never await an approval.
    put(plan("pln-token", "ACC-1", PlanStatus::Planned)).await;

    let plans = &e.p.plans;
    let mine = plans
        .list_awaiting_by_requester("op-1", NOW, None, 2)
        .await
        .unwrap();
    assert_eq!(ids(&mine), ["pln-mine-3", "pln-mine-2"], "newest first");
    let last = mine.last().unwrap();
    let before = (last.expires_at, last.plan_id.clone());
    let rest = plans
        .list_awaiting_by_requester("op-1", NOW, Some(&before), 2)
        .await
        .unwrap();
    assert_eq!(ids(&rest), ["pln-mine-1"]);
    // Expired ones are gone.
    let later = plans
        .list_awaiting_by_requester("op-1", NOW + 401_500, None, 10)
        .await
        .unwrap();
    assert_eq!(ids(&later), ["pln-mine-3"]);

    let energy = DeskScope::Only(["energy".to_string()].into_iter().collect());
    let four = plans
        .list_awaiting_four_eyes(&energy, NOW, None, 10)
        .await
        .unwrap();
    assert_eq!(ids(&four), ["pln-4e-b", "pln-4e-a"]);
    let metals = DeskScope::Only(["metals".to_string()].into_iter().collect());
    assert!(plans
        .list_awaiting_four_eyes(&metals, NOW, None, 10)
        .await
        .unwrap()
        .is_empty());

    // The maker's approval alone keeps a four-eyes plan in both listings; the checker's
    // completes it and takes it out. A write made on a stale count changes nothing.
    let maker = approval_by("op-colleague", ApprovalDecision::Approved);
    let first = ApprovalChange {
        seen: 0,
        approvals: vec![maker.clone()],
        decision: None,
        close: None,
    };
    let a = audit("a-4e-1", Some("pln-4e-a"));
    assert!(plans
        .record_approval("pln-4e-a", &first, &a, NOW)
        .await
        .unwrap());
    assert!(
        !plans
            .record_approval("pln-4e-a", &first, &audit("a-4e-x", Some("pln-4e-a")), NOW)
            .await
            .unwrap(),
        "a second write on the count read before the first is refused"
    );
    let p = plans.get_plan("pln-4e-a").await.unwrap().unwrap();
    assert_eq!(p.approvals, vec![maker.clone()]);
    assert_eq!(p.approval, None);
    assert_eq!(
        ids(&plans
            .list_awaiting_four_eyes(&energy, NOW, None, 10)
            .await
            .unwrap()),
        ["pln-4e-b", "pln-4e-a"]
    );
    let checker = approval_by("op-head", ApprovalDecision::Approved);
    let second = ApprovalChange {
        seen: 1,
        approvals: vec![maker.clone(), checker.clone()],
        decision: Some(checker.clone()),
        close: None,
    };
    assert!(plans
        .record_approval("pln-4e-a", &second, &audit("a-4e-2", Some("pln-4e-a")), NOW)
        .await
        .unwrap());
    let p = plans.get_plan("pln-4e-a").await.unwrap().unwrap();
    assert_eq!(p.approvals, vec![maker, checker.clone()]);
    assert_eq!(p.approval, Some(checker));
    assert_eq!(p.status, PlanStatus::Planned);
    assert_eq!(
        ids(&plans
            .list_awaiting_four_eyes(&energy, NOW, None, 10)
            .await
            .unwrap()),
        ["pln-4e-b"]
    );
    assert!(plans
        .list_awaiting_by_requester("op-colleague", NOW, None, 300)
        .await
        .unwrap()
        .iter()
        .all(|p| p.plan_id != "pln-4e-a"));

    // A decline closes the plan and takes it out.
    let decline = ApprovalChange {
        seen: 0,
        approvals: vec![],
        decision: Some(approval_by("op-1", ApprovalDecision::Declined)),
        close: Some("plan_declined".into()),
    };
    assert!(plans
        .record_approval(
            "pln-mine-3",
            &decline,
            &audit("a-d", Some("pln-mine-3")),
            NOW
        )
        .await
        .unwrap());
    let p = plans.get_plan("pln-mine-3").await.unwrap().unwrap();
    assert_eq!(p.status, PlanStatus::Closed);
    assert_eq!(p.closed_reason.as_deref(), Some("plan_declined"));
    assert_eq!(
        ids(&plans
            .list_awaiting_by_requester("op-1", NOW, None, 10)
            .await
            .unwrap()),
        ["pln-mine-2", "pln-mine-1"]
    );
}
both!(the_pending_listings_are_queries_not_filters);
