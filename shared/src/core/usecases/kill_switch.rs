//! The kill switch as an operator's control action (`airlock kill-switch`). Engaging it
//! stops new orders at every gate (the control record, [`super::control`]) and, unless
//! asked to keep them, pulls the working orders: a cancel of every order at the broker
//! (`submitted`, `working`, `partially_filled`) of every account, or of the accounts named.
//!
//! Each cancel is a real `order.cancel` action, stored, audited and queued as an accepted
//! execute is (one atomic write of its idempotency record, the action and its audit record,
//! then the send; the sweeper sends one whose send was lost), and handled by the worker as
//! any cancel. No plan and no confirmation token: the operator's command is the decision.
//! Its ids are derived from the engagement and the order, so engaging again while the
//! switch is engaged, or a retry, queues nothing twice; a cancel that failed while its order
//! is still at the broker is queued again under the next attempt number.
//!
//! The order of the steps closes the race with a worker sending an order: the switch is
//! engaged first, then the orders are listed. A worker claims an order (`submitted`) before
//! it reads the switch, so an order that passed the worker's gate before the engage is
//! already `submitted` when the listing runs, and one claimed later meets the engaged switch
//! at the gate. The listing runs twice, [`KillSwitch::relist_after`] apart, for a listing
//! that lags behind the orders (a DynamoDB index).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use crate::core::clock::SharedClock;
use crate::core::digest::sha256_hex;
use crate::core::domain::payload::NormalizedCancel;
use crate::core::domain::{
    new_id, rfc3339, Account, ActionStatus, ActionType, Millis, NormalizedPayload, Order,
};
use crate::core::error::{ApiError, Code};
use crate::core::ports::{
    AccountStore, ActionStore, AuditLog, CommitOutcome, Conflict, ControlStore, ExecuteCommit,
    ExecuteLedger, KeyCondition, OrderStore,
};
use crate::core::records::{
    key_scope, ActionRecord, AuditRecord, Control, Decision, KeyRecord, KeyState, QueueMessage,
    ResourceRefs, Trace, QUEUE_MESSAGE_SCHEMA,
};
use crate::core::usecases::execute::{send_message, Dispatch, REPLAY_WINDOW_MS};

/// The service principal of the kill switch's actions; their `requested_by` is
/// `kill-switch:<who engaged>`.
pub const PRINCIPAL: &str = "kill-switch";

/// How many cancels of one order one engagement queues at most (each after the previous
/// one failed with the order still at the broker).
pub const MAX_ATTEMPTS: u32 = 5;

/// The kill switch use case, built by the command line from the backend's ports.
#[derive(Clone)]
pub struct KillSwitch {
    pub clock: SharedClock,
    pub control: Arc<dyn ControlStore>,
    pub accounts: Arc<dyn AccountStore>,
    pub orders: Arc<dyn OrderStore>,
    pub actions: Arc<dyn ActionStore>,
    pub ledger: Arc<dyn ExecuteLedger>,
    pub audit: Arc<dyn AuditLog>,
    pub dispatch: Dispatch,
    /// The pause before the second listing of working orders.
    pub relist_after: std::time::Duration,
}

/// What `engage` is asked to do besides engaging.
#[derive(Debug, Clone, Default)]
pub struct EngageOptions {
    pub reason: Option<String>,
    /// Pull only these accounts' orders (`None`: every account's).
    pub accounts: Option<Vec<String>>,
    /// Engage without pulling working orders.
    pub keep_working: bool,
}

/// What became of one working order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pull {
    /// A cancel was queued now.
    Queued,
    /// This engagement's cancel of it was queued before (an engage again, a retry).
    AlreadyQueued,
    /// No cancel could be queued (a store or queue fault, or every attempt failed).
    NotQueued(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pulled {
    pub order_id: String,
    pub account_id: String,
    pub action_id: Option<String>,
    pub outcome: Pull,
}

#[derive(Debug, Clone)]
pub struct Engaged {
    pub control: Control,
    pub pulled: Vec<Pulled>,
}

/// How the cancels of an engagement stand.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Queued or being handled.
    pub pending: usize,
    pub done: usize,
    pub failed: usize,
}

#[derive(Debug, Clone)]
pub struct Status {
    pub control: Control,
    pub cancels: Counts,
    /// The failed cancels: action id, order id and why.
    pub failures: Vec<(String, String, String)>,
}

/// The id of an engagement's `attempt`-th cancel of an order: the same for every engage of
/// the engagement, so a second engage finds it instead of queuing another.
pub fn cancel_action_id(engagement: &str, order_id: &str, attempt: u32) -> String {
    let digest =
        sha256_hex(format!("{PRINCIPAL}\u{0}{engagement}\u{0}{order_id}\u{0}{attempt}").as_bytes());
    format!("act_{}", &digest[..26])
}

/// The idempotency key of that cancel (scoped to [`PRINCIPAL`] and the engagement's
/// requester, as an execute's key is to its service and operator).
pub fn cancel_key(engagement: &str, order_id: &str, attempt: u32) -> String {
    format!("{PRINCIPAL}:{engagement}:{order_id}:{attempt}")
}

/// Who the kill switch's actions of an engagement are requested by.
pub fn requested_by(by: &str) -> String {
    format!("{PRINCIPAL}:{by}")
}

/// Whether an order is one to pull: at the broker, or possibly (claimed for it).
pub fn to_pull(order: &Order) -> bool {
    order.status.is_at_the_broker()
}

/// The counts of a set of actions by status.
pub fn count(actions: &[ActionRecord]) -> Counts {
    let mut c = Counts::default();
    for a in actions {
        match a.status {
            ActionStatus::Queued | ActionStatus::Processing => c.pending += 1,
            ActionStatus::Succeeded => c.done += 1,
            ActionStatus::Failed | ActionStatus::Rejected => c.failed += 1,
        }
    }
    c
}

fn audit_record(now: Millis, engagement: &str, operator: &str, decision: &str) -> AuditRecord {
    AuditRecord {
        audit_id: new_id("aud", now),
        at: now,
        event: "kill_switch".into(),
        decision: decision.into(),
        reason_code: None,
        reason: None,
        action_type: None,
        plan_id: Some(engagement.to_string()),
        action_id: None,
        idempotency_key: None,
        operator_id: operator.to_string(),
        service_principal: PRINCIPAL.into(),
        payload_hash: None,
        risk_checks: Vec::new(),
        order_id: None,
        job_id: None,
        chat_session_id: None,
        tool_call_id: None,
        request_id: engagement.to_string(),
        policy_version: None,
        approver: None,
        credential_id: None,
        user_verified: None,
        apigw_request_id: None,
        lambda_request_id: None,
    }
}

/// The engagement of a control record that has one.
fn engagement_of(c: &Control) -> Result<(String, String), ApiError> {
    c.engagement
        .as_ref()
        .map(|e| (e.id.clone(), e.by.clone()))
        .ok_or_else(|| ApiError::internal("the engaged control record names no engagement"))
}

impl KillSwitch {
    /// Engages the switch, then (unless `keep_working`) queues a cancel of every order at
    /// the broker of the accounts asked. Unknown accounts are refused before anything is
    /// changed.
    pub async fn engage(&self, who: &str, opts: &EngageOptions) -> Result<Engaged, ApiError> {
        let accounts = match &opts.accounts {
            Some(ids) => {
                let mut found = Vec::new();
                for id in ids {
                    match self.accounts.get_account(id).await? {
                        Some(a) => found.push(a),
                        None => {
                            return Err(ApiError::new(
                                Code::AccountNotFound,
                                format!("no account {id}; the kill switch was not engaged"),
                            ))
                        }
                    }
                }
                Some(found)
            }
            None => None,
        };
        let now = self.clock.now_ms();
        let control =
            super::control::engage(self.control.as_ref(), who, opts.reason.clone(), now).await?;
        let (engagement, by) = engagement_of(&control)?;
        let mut record = audit_record(now, &engagement, who, "engaged");
        record.reason = Some(match (&opts.reason, opts.keep_working) {
            (Some(r), true) => format!("{r} (working orders kept)"),
            (Some(r), false) => r.clone(),
            (None, true) => "working orders kept".into(),
            (None, false) => "no reason given".into(),
        });
        self.audit.append(&record).await?;
        let mut pulled = Vec::new();
        if !opts.keep_working {
            let mut desks: BTreeMap<String, Account> = accounts
                .iter()
                .flatten()
                .map(|a| (a.account_id.clone(), a.clone()))
                .collect();
            let ids: Option<Vec<String>> = accounts
                .as_ref()
                .map(|a| a.iter().map(|a| a.account_id.clone()).collect());
            let mut seen = HashSet::new();
            self.pull_pass(
                &engagement,
                &by,
                ids.as_deref(),
                &mut desks,
                &mut seen,
                &mut pulled,
            )
            .await?;
            tokio::time::sleep(self.relist_after).await;
            self.pull_pass(
                &engagement,
                &by,
                ids.as_deref(),
                &mut desks,
                &mut seen,
                &mut pulled,
            )
            .await?;
        }
        Ok(Engaged { control, pulled })
    }

    /// Releases the switch (the engagement stays, as the last one, for `status`).
    pub async fn release(&self, who: &str) -> Result<Control, ApiError> {
        let now = self.clock.now_ms();
        let control = super::control::release(self.control.as_ref(), who, now).await?;
        if let Some(e) = &control.engagement {
            self.audit
                .append(&audit_record(now, &e.id, who, "released"))
                .await?;
        }
        Ok(control)
    }

    /// The switch and how the cancels of its last engagement stand.
    pub async fn status(&self) -> Result<Status, ApiError> {
        let control = self.control.get_control().await?;
        let mut actions = Vec::new();
        if let Some(e) = &control.engagement {
            let mut ids = HashSet::new();
            for r in self.audit.trail(&e.id).await? {
                let Some(id) = r.action_id.filter(|_| r.decision == "queued") else {
                    continue;
                };
                if ids.insert(id.clone()) {
                    if let Some(a) = self.actions.get_action(&id).await? {
                        actions.push(a);
                    }
                }
            }
        }
        let failures = actions
            .iter()
            .filter(|a| matches!(a.status, ActionStatus::Failed | ActionStatus::Rejected))
            .map(|a| {
                (
                    a.action_id.clone(),
                    a.resource_refs.order_id.clone().unwrap_or_default(),
                    a.error.clone().unwrap_or_default(),
                )
            })
            .collect();
        Ok(Status {
            cancels: count(&actions),
            control,
            failures,
        })
    }

    /// One listing of the orders at the broker and a cancel of each not seen yet.
    async fn pull_pass(
        &self,
        engagement: &str,
        by: &str,
        accounts: Option<&[String]>,
        desks: &mut BTreeMap<String, Account>,
        seen: &mut HashSet<String>,
        pulled: &mut Vec<Pulled>,
    ) -> Result<(), ApiError> {
        let mut listed = Vec::new();
        match accounts {
            None => listed = self.orders.list_at_the_broker(None).await?,
            Some(ids) => {
                for id in ids {
                    listed.extend(self.orders.list_at_the_broker(Some(id)).await?);
                }
            }
        }
        for o in listed {
            if !seen.insert(o.order_id.clone()) {
                continue;
            }
            let outcome = self.pull(engagement, by, &o.order_id, desks).await;
            let (action_id, outcome) = match outcome {
                Ok(Some(done)) => done,
                Ok(None) => continue,
                Err(e) => (None, Pull::NotQueued(e.cause.unwrap_or(e.message))),
            };
            pulled.push(Pulled {
                order_id: o.order_id.clone(),
                account_id: o.terms.account_id.clone(),
                action_id,
                outcome,
            });
        }
        Ok(())
    }

    /// Queues this engagement's cancel of an order still at the broker (re-read: the
    /// listing may lag), unless one is queued already. `None`: the order is no longer at
    /// the broker.
    async fn pull(
        &self,
        engagement: &str,
        by: &str,
        order_id: &str,
        desks: &mut BTreeMap<String, Account>,
    ) -> Result<Option<(Option<String>, Pull)>, ApiError> {
        let Some(order) = self.orders.get_order(order_id).await? else {
            return Ok(None);
        };
        if !to_pull(&order) {
            return Ok(None);
        }
        let account_id = order.terms.account_id.clone();
        if !desks.contains_key(&account_id) {
            let account = self
                .accounts
                .get_account(&account_id)
                .await?
                .ok_or_else(|| {
                    ApiError::internal(format!("order {order_id}: no account {account_id}"))
                })?;
            desks.insert(account_id.clone(), account);
        }
        let desk = desks
            .get(&account_id)
            .map(|a| a.desk.clone())
            .unwrap_or_default();
        for attempt in 0..MAX_ATTEMPTS {
            let action_id = cancel_action_id(engagement, order_id, attempt);
            match self.actions.get_action(&action_id).await? {
                // Failed while the order is still at the broker: the next attempt.
                Some(a) if a.status == ActionStatus::Failed => continue,
                Some(a) => {
                    if a.enqueued_at.is_none() {
                        // Queued, maybe never sent (a lost send): send again; the queue
                        // deduplicates on the action id and the worker is idempotent.
                        if let Err(e) = send_message(&self.dispatch, &a).await {
                            tracing::warn!(action_id = %a.action_id, error = %e.message, "resending a kill switch cancel failed; the sweeper sends it");
                        }
                    }
                    return Ok(Some((Some(action_id), Pull::AlreadyQueued)));
                }
                None => {
                    let outcome = self
                        .queue_cancel(engagement, by, &order, &desk, attempt, &action_id)
                        .await?;
                    return Ok(Some((Some(action_id), outcome)));
                }
            }
        }
        Ok(Some((
            None,
            Pull::NotQueued(format!(
                "{MAX_ATTEMPTS} cancels of order {order_id} failed in this engagement"
            )),
        )))
    }

    /// Stores and queues one cancel: its key, the action and its audit record in one
    /// atomic write (the embedded store queues it in that write), then the send.
    async fn queue_cancel(
        &self,
        engagement: &str,
        by: &str,
        order: &Order,
        desk: &str,
        attempt: u32,
        action_id: &str,
    ) -> Result<Pull, ApiError> {
        let now = self.clock.now_ms();
        let requester = requested_by(by);
        let key = cancel_key(engagement, &order.order_id, attempt);
        let refs = ResourceRefs {
            order_id: Some(order.order_id.clone()),
            job_id: None,
        };
        let payload = NormalizedPayload::OrderCancel(NormalizedCancel {
            account_id: order.terms.account_id.clone(),
            order_id: order.order_id.clone(),
        });
        let message = QueueMessage {
            schema: QUEUE_MESSAGE_SCHEMA.into(),
            action_id: action_id.to_string(),
            plan_id: engagement.to_string(),
            action_type: ActionType::OrderCancel,
            normalized_payload: payload,
            resource_refs: refs.clone(),
            requested_by: requester.clone(),
            service_principal: PRINCIPAL.into(),
            enqueued_at: rfc3339(now),
            trace: Trace {
                request_id: engagement.to_string(),
                ..Trace::default()
            },
        };
        let in_commit = self.ledger.queues_in_commit();
        let group = message.normalized_payload.message_group();
        let action = ActionRecord {
            action_id: action_id.to_string(),
            plan_id: engagement.to_string(),
            action_type: ActionType::OrderCancel,
            status: ActionStatus::Queued,
            queue_target: ActionType::OrderCancel.queue_target(),
            resource_refs: refs.clone(),
            account_id: order.terms.account_id.clone(),
            desk: desk.to_string(),
            requested_by: requester.clone(),
            service_principal: PRINCIPAL.into(),
            idempotency_key: key.clone(),
            message,
            enqueued_at: in_commit.then_some(now),
            created_at: now,
            updated_at: now,
            error: None,
        };
        let owner = new_id("own", now);
        let key_record = KeyRecord {
            principal: key_scope(PRINCIPAL, &requester),
            key: key.clone(),
            fingerprint: sha256_hex(
                format!("{engagement}\u{0}{requester}\u{0}{PRINCIPAL}").as_bytes(),
            ),
            plan_id: engagement.to_string(),
            requested_by: requester.clone(),
            state: KeyState::Decided {
                decision: Decision::Queued {
                    action_id: action_id.to_string(),
                    plan_id: engagement.to_string(),
                    queue_target: action.queue_target,
                    resource_refs: refs.clone(),
                },
                owner: Some(owner),
            },
            created_at: now,
            expires_at: now + REPLAY_WINDOW_MS,
        };
        let mut audit = audit_record(now, engagement, &requester, "queued");
        audit.reason_code = Some("kill_switch".into());
        audit.reason = Some(format!(
            "the kill switch pulls order {} ({} {} {} {}, {})",
            order.order_id,
            order.terms.side,
            order.terms.quantity,
            order.terms.symbol,
            order.terms.order_type,
            order.status
        ));
        audit.action_type = Some(ActionType::OrderCancel);
        audit.action_id = Some(action_id.to_string());
        audit.idempotency_key = Some(key);
        audit.order_id = Some(order.order_id.clone());
        let commit = ExecuteCommit {
            key: key_record,
            key_condition: KeyCondition::Absent,
            plan_change: None,
            control_version: None,
            account_active: None,
            rate: None,
            reserve: None,
            // The operator's control action: not counted on the account's message window,
            // so the message throttle never refuses it.
            messages: None,
            action: Some(action.clone()),
            enqueue_group: in_commit.then_some(group),
            audit,
        };
        match self.ledger.commit(&commit, now).await? {
            CommitOutcome::Committed => {}
            // Another engage queued it first.
            CommitOutcome::Conflict(Conflict::Key) => return Ok(Pull::AlreadyQueued),
            CommitOutcome::Conflict(c) => {
                return Err(ApiError::internal(format!(
                    "a kill switch cancel met a condition it does not set: {c:?}"
                )))
            }
        }
        if !in_commit {
            if let Err(e) = send_message(&self.dispatch, &action).await {
                // Stored: the sweeper sends it.
                tracing::warn!(action_id = %action.action_id, error = %e.message, "sending a kill switch cancel failed; the sweeper sends it");
            }
        }
        Ok(Pull::Queued)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::domain::OrderStatus;

    #[test]
    fn a_cancel_is_named_by_its_engagement_order_and_attempt_only() {
        let a = cancel_action_id("ks_1", "ORD-1", 0);
        assert_eq!(a, cancel_action_id("ks_1", "ORD-1", 0), "deterministic");
        assert!(a.starts_with("act_") && a.len() == 30, "{a}");
        assert!(
            crate::core::parse::check_ident("/action_id", &a).is_ok(),
            "{a}"
        );
        for other in [
            cancel_action_id("ks_2", "ORD-1", 0),
            cancel_action_id("ks_1", "ORD-2", 0),
            cancel_action_id("ks_1", "ORD-1", 1),
        ] {
            assert_ne!(a, other);
        }
        let key = cancel_key("ks_1", "ORD-1", 0);
        assert!(
            crate::core::domain::IdempotencyKey::parse(&key).is_ok(),
            "{key}"
        );
        assert_eq!(requested_by("cli:ann"), "kill-switch:cli:ann");
    }

    #[test]
    fn only_orders_at_the_broker_are_pulled() {
        use OrderStatus::*;
        for (status, pulled) in [
            (Queued, false),
            (Submitted, true),
            (Working, true),
            (PartiallyFilled, true),
            (Filled, false),
            (Cancelled, false),
            (Rejected, false),
        ] {
            let o = Order {
                order_id: "ORD-1".into(),
                terms: crate::core::domain::OrderTerms {
                    account_id: "ACC-1".into(),
                    symbol: "CLF27".into(),
                    side: crate::core::domain::Side::Buy,
                    quantity: 1,
                    order_type: crate::core::domain::OrderType::Market,
                    limit_price: None,
                    stop_price: None,
                    time_in_force: crate::core::domain::TimeInForce::Day,
                },
                status,
                filled_quantity: 0,
                avg_fill_price: None,
                action_id: None,
                created_at: 0,
                updated_at: 0,
                version: crate::core::domain::first_version(),
                versions: Vec::new(),
            };
            assert_eq!(to_pull(&o), pulled, "{status:?}");
        }
    }

    #[test]
    fn counts_by_status() {
        let action = |status| ActionRecord {
            status,
            ..serde_json::from_value::<ActionRecord>(serde_json::json!({
                "action_id": "act_1", "plan_id": "ks_1", "action_type": "order.cancel",
                "status": "queued", "queue_target": "worker:orders",
                "resource_refs": {"order_id": "ORD-1"}, "account_id": "ACC-1", "desk": "energy",
                "requested_by": "kill-switch:cli:ann", "service_principal": "kill-switch",
                "idempotency_key": "k",
                "message": {"schema": QUEUE_MESSAGE_SCHEMA, "action_id": "act_1", "plan_id": "ks_1",
                    "action_type": "order.cancel",
                    "normalized_payload": {"account_id": "ACC-1", "order_id": "ORD-1"},
                    "resource_refs": {"order_id": "ORD-1"}, "requested_by": "kill-switch:cli:ann",
                    "service_principal": "kill-switch", "enqueued_at": "2026-11-23T15:00:00Z",
                    "trace": {"request_id": "ks_1"}},
                "enqueued_at": null, "created_at": 0, "updated_at": 0, "error": null
            }))
            .unwrap()
        };
        use ActionStatus::*;
        let all = [Queued, Processing, Succeeded, Succeeded, Failed].map(action);
        assert_eq!(
            count(&all),
            Counts {
                pending: 2,
                done: 2,
                failed: 1
            }
        );
    }
}
