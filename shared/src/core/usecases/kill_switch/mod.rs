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
//!
//! With `flatten` (off by default) it then closes the open positions: [`flatten`].

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use crate::core::auth::DeskScope;
use crate::core::clock::SharedClock;
use crate::core::digest::sha256_hex;
use crate::core::domain::calendar::ExchangeCalendar;
use crate::core::domain::cl::ClContract;
use crate::core::domain::payload::{NormalizedCancel, NormalizedOrder};
use crate::core::domain::{
    new_id, rfc3339, Account, AccountStatus, ActionStatus, ActionType, ExposureDelta, Ident,
    Millis, NormalizedPayload, Order, OrderSubmitCl, OrderTerms, OrderType, Position, Price,
    Quantity, Side, TimeInForce,
};
use crate::core::error::{ApiError, Code};
use crate::core::policy::{self, OrderInputs, Policy};
use crate::core::ports::{
    AccountStore, ActionStore, AuditLog, CommitOutcome, Conflict, ControlStore, ExecuteCommit,
    ExecuteLedger, KeyCondition, OrderStore, Page, PositionStore, Prices, Reservation,
};
use crate::core::records::{
    key_scope, ActionRecord, AuditRecord, Control, Decision, KeyRecord, KeyState, QueueMessage,
    ResourceRefs, Trace, QUEUE_MESSAGE_SCHEMA,
};
use crate::core::usecases::execute::{send_message, Dispatch, REPLAY_WINDOW_MS};

mod flatten;

use flatten::is_flatten_id;
pub use flatten::{
    flatten_action_id, flatten_key, is_closing_order, is_flattening, keeps_closing_order,
    reduces_only,
};

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
    /// The process's policy; a policy in the control record takes precedence.
    pub policy: Arc<Policy>,
    /// The positions to flatten, and the day's P&L they make.
    pub positions: Arc<dyn PositionStore>,
    /// The reference prices closing orders are protected from.
    pub prices: Arc<dyn Prices>,
}

/// What `engage` is asked to do besides engaging.
#[derive(Debug, Clone, Default)]
pub struct EngageOptions {
    pub reason: Option<String>,
    /// Pull only these accounts' orders (`None`: every account's).
    pub accounts: Option<Vec<String>>,
    /// Engage without pulling working orders.
    pub keep_working: bool,
    /// Also queue a closing order for every open position of the accounts.
    pub flatten: bool,
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

/// What became of one open position (`flatten`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flattened {
    pub account_id: String,
    pub symbol: String,
    /// The net quantity read (positive long, negative short).
    pub position: i64,
    /// The closing order's side and its protected limit, when one was queued or found.
    pub side: Side,
    pub limit_price: Option<Price>,
    pub action_id: Option<String>,
    pub outcome: Pull,
}

#[derive(Debug, Clone)]
pub struct Engaged {
    pub control: Control,
    pub pulled: Vec<Pulled>,
    pub flattened: Vec<Flattened>,
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
    /// The closing orders of `flatten`.
    pub flattening: Counts,
    /// The failed cancels and closing orders: action id, order id and why.
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
    /// the broker of the accounts asked, then (with `flatten`) a closing order of every
    /// open position of those accounts. Unknown accounts are refused before anything is
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
        let mut notes = Vec::new();
        if let Some(r) = &opts.reason {
            notes.push(r.clone());
        }
        if opts.keep_working {
            notes.push("working orders kept".into());
        }
        if opts.flatten {
            notes.push("open positions flattened".into());
        }
        record.reason = Some(match notes.len() {
            0 => "no reason given".into(),
            1 if opts.reason.is_some() => notes.remove(0),
            _ if opts.reason.is_some() => {
                let r = notes.remove(0);
                format!("{r} ({})", notes.join(", "))
            }
            _ => notes.join(", "),
        });
        self.audit.append(&record).await?;
        let mut desks: BTreeMap<String, Account> = accounts
            .iter()
            .flatten()
            .map(|a| (a.account_id.clone(), a.clone()))
            .collect();
        let ids: Option<Vec<String>> = accounts
            .as_ref()
            .map(|a| a.iter().map(|a| a.account_id.clone()).collect());
        let mut pulled = Vec::new();
        if !opts.keep_working {
            let mut seen = HashSet::new();
            for pass in 0..2 {
                if pass > 0 {
                    tokio::time::sleep(self.relist_after).await;
                }
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
        }
        let flattened = if opts.flatten {
            self.flatten(&control, &engagement, &by, accounts.as_deref())
                .await?
        } else {
            Vec::new()
        };
        Ok(Engaged {
            control,
            pulled,
            flattened,
        })
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

    /// The switch and how the cancels and closing orders of its last engagement stand.
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
        let (closing, cancels): (Vec<ActionRecord>, Vec<ActionRecord>) = actions
            .into_iter()
            .partition(|a| a.action_type == ActionType::OrderSubmitCl);
        Ok(Status {
            cancels: count(&cancels),
            flattening: count(&closing),
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
    /// the broker, or it is one of this engagement's own closing orders.
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
        if order
            .action_id
            .as_deref()
            .is_some_and(|a| is_flatten_id(engagement, &account_id, &order.terms.symbol, a))
        {
            return Ok(None);
        }
        let desk = self.account(&account_id, desks).await?.desk;
        for attempt in 0..MAX_ATTEMPTS {
            let action_id = cancel_action_id(engagement, order_id, attempt);
            match self.actions.get_action(&action_id).await? {
                // Failed while the order is still at the broker: the next attempt.
                Some(a) if a.status == ActionStatus::Failed => continue,
                Some(a) => {
                    self.resend_if_unsent(&a).await;
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

    /// An account, read once per engage.
    async fn account(
        &self,
        account_id: &str,
        desks: &mut BTreeMap<String, Account>,
    ) -> Result<Account, ApiError> {
        if let Some(a) = desks.get(account_id) {
            return Ok(a.clone());
        }
        let account = self
            .accounts
            .get_account(account_id)
            .await?
            .ok_or_else(|| ApiError::internal(format!("no account {account_id}")))?;
        desks.insert(account_id.to_string(), account.clone());
        Ok(account)
    }

    /// An action queued by an earlier engage, maybe never sent (a lost send): sent again;
    /// the queue deduplicates on the action id and the worker is idempotent.
    async fn resend_if_unsent(&self, a: &ActionRecord) {
        if a.enqueued_at.is_none() {
            if let Err(e) = send_message(&self.dispatch, a).await {
                tracing::warn!(action_id = %a.action_id, error = %e.message, "resending a kill switch action failed; the sweeper sends it");
            }
        }
    }

    /// Stores and queues one cancel.
    async fn queue_cancel(
        &self,
        engagement: &str,
        by: &str,
        order: &Order,
        desk: &str,
        attempt: u32,
        action_id: &str,
    ) -> Result<Pull, ApiError> {
        let queued = Queued {
            engagement,
            by,
            action_id,
            key: cancel_key(engagement, &order.order_id, attempt),
            account_id: &order.terms.account_id,
            desk,
            order_id: order.order_id.clone(),
            payload: NormalizedPayload::OrderCancel(NormalizedCancel {
                account_id: order.terms.account_id.clone(),
                order_id: order.order_id.clone(),
            }),
            reason: format!(
                "the kill switch pulls order {} ({} {} {} {}, {})",
                order.order_id,
                order.terms.side,
                order.terms.quantity,
                order.terms.symbol,
                order.terms.order_type,
                order.status
            ),
            reserve: None,
        };
        match self.queue(queued).await? {
            CommitOutcome::Committed => Ok(Pull::Queued),
            // Another engage queued it first.
            CommitOutcome::Conflict(Conflict::Key) => Ok(Pull::AlreadyQueued),
            CommitOutcome::Conflict(c) => Err(ApiError::internal(format!(
                "a kill switch cancel met a condition it does not set: {c:?}"
            ))),
        }
    }

    /// Stores and queues one action of the kill switch: its key, the action, its audit
    /// record and (a closing order) its contracts' reservation in one atomic write, as an
    /// accepted execute's (the embedded store queues it in that write), then the send. A
    /// conflict is returned as is: nothing was written.
    async fn queue(&self, q: Queued<'_>) -> Result<CommitOutcome, ApiError> {
        let now = self.clock.now_ms();
        let requester = requested_by(q.by);
        let action_type = q.payload.action_type();
        let refs = ResourceRefs {
            order_id: Some(q.order_id.clone()),
            job_id: None,
        };
        let message = QueueMessage {
            schema: QUEUE_MESSAGE_SCHEMA.into(),
            action_id: q.action_id.to_string(),
            plan_id: q.engagement.to_string(),
            action_type,
            normalized_payload: q.payload,
            resource_refs: refs.clone(),
            requested_by: requester.clone(),
            service_principal: PRINCIPAL.into(),
            enqueued_at: rfc3339(now),
            trace: Trace {
                request_id: q.engagement.to_string(),
                ..Trace::default()
            },
        };
        let in_commit = self.ledger.queues_in_commit();
        let group = message.normalized_payload.message_group();
        let action = ActionRecord {
            action_id: q.action_id.to_string(),
            plan_id: q.engagement.to_string(),
            action_type,
            status: ActionStatus::Queued,
            queue_target: action_type.queue_target(),
            resource_refs: refs.clone(),
            account_id: q.account_id.to_string(),
            desk: q.desk.to_string(),
            requested_by: requester.clone(),
            service_principal: PRINCIPAL.into(),
            idempotency_key: q.key.clone(),
            message,
            enqueued_at: in_commit.then_some(now),
            created_at: now,
            updated_at: now,
            error: None,
        };
        let owner = new_id("own", now);
        let key_record = KeyRecord {
            principal: key_scope(PRINCIPAL, &requester),
            key: q.key.clone(),
            fingerprint: sha256_hex(
                format!("{}\u{0}{requester}\u{0}{PRINCIPAL}", q.engagement).as_bytes(),
            ),
            plan_id: q.engagement.to_string(),
            requested_by: requester.clone(),
            state: KeyState::Decided {
                decision: Decision::Queued {
                    action_id: q.action_id.to_string(),
                    plan_id: q.engagement.to_string(),
                    queue_target: action.queue_target,
                    resource_refs: refs.clone(),
                },
                owner: Some(owner),
            },
            created_at: now,
            expires_at: now + REPLAY_WINDOW_MS,
        };
        let mut audit = audit_record(now, q.engagement, &requester, "queued");
        audit.reason_code = Some("kill_switch".into());
        audit.reason = Some(q.reason);
        audit.action_type = Some(action_type);
        audit.action_id = Some(q.action_id.to_string());
        audit.idempotency_key = Some(q.key);
        audit.order_id = Some(q.order_id);
        let commit = ExecuteCommit {
            key: key_record,
            key_condition: KeyCondition::Absent,
            plan_change: None,
            control_version: None,
            account_active: None,
            rate: None,
            reserve: q.reserve,
            // The operator's control action: not counted on the account's message window,
            // so the message throttle never refuses it.
            messages: None,
            action: Some(action.clone()),
            enqueue_group: in_commit.then_some(group),
            audit,
        };
        let outcome = self.ledger.commit(&commit, now).await?;
        if outcome == CommitOutcome::Committed && !in_commit {
            if let Err(e) = send_message(&self.dispatch, &action).await {
                // Stored: the sweeper sends it.
                tracing::warn!(action_id = %action.action_id, error = %e.message, "sending a kill switch action failed; the sweeper sends it");
            }
        }
        Ok(outcome)
    }
}

/// One action of the kill switch to store and queue ([`KillSwitch::queue`]).
struct Queued<'a> {
    engagement: &'a str,
    by: &'a str,
    action_id: &'a str,
    key: String,
    account_id: &'a str,
    desk: &'a str,
    order_id: String,
    payload: NormalizedPayload,
    /// The audit record's reason.
    reason: String,
    reserve: Option<Reservation>,
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
    fn a_closing_order_only_reduces_the_position_it_finds() {
        use Side::*;
        for (position, side, q, ok, word) in [
            (3, Sell, 3, true, ""),
            (3, Sell, 1, true, ""),
            (-2, Buy, 2, true, ""),
            (1, Sell, 3, false, "reverse it (-2)"),
            (-1, Buy, 2, false, "reverse it (+1)"),
            (2, Buy, 2, false, "increase it (+4)"),
            (-2, Sell, 1, false, "increase it (-3)"),
            (0, Sell, 3, false, "would open one (-3)"),
            (0, Buy, 1, false, "would open one (+1)"),
        ] {
            let r = reduces_only(position, side, q);
            assert_eq!(r.is_ok(), ok, "{position} {side:?} {q}: {r:?}");
            if let Err(why) = r {
                assert!(why.starts_with("kill_switch_flatten: "), "{why}");
                assert!(why.contains(word), "{why}");
            }
        }
    }

    fn closing_message(engagement: &str, action_id: &str, principal: &str) -> QueueMessage {
        serde_json::from_value(serde_json::json!({
            "schema": QUEUE_MESSAGE_SCHEMA, "action_id": action_id, "plan_id": engagement,
            "action_type": "order.submit.cl",
            "normalized_payload": {"account_id": "ACC-1", "symbol": "CLF27", "side": "sell",
                "quantity": 3, "order_type": "limit", "limit_price": "67.90",
                "time_in_force": "day", "contract_month": null, "last_trade_date": null},
            "resource_refs": {"order_id": "ord_1"}, "requested_by": "kill-switch:cli:ann",
            "service_principal": principal, "enqueued_at": "2026-11-23T15:00:00Z",
            "trace": {"request_id": engagement}
        }))
        .unwrap()
    }

    #[test]
    fn only_the_current_engagements_own_closing_orders_pass_the_engaged_switch() {
        let mut control = Control::default();
        control.engage("ks_1", 0, "cli:ann", None);
        let id = flatten_action_id("ks_1", "ACC-1", "CLF27", 2);
        assert!(crate::core::parse::check_ident("/action_id", &id).is_ok());
        assert!(crate::core::domain::IdempotencyKey::parse(&flatten_key(
            "ks_1", "ACC-1", "CLF27", 2
        ))
        .is_ok());
        let own = closing_message("ks_1", &id, PRINCIPAL);
        assert!(is_closing_order(&own));
        assert!(is_flattening(&own, &control));
        // A principal that calls itself the kill switch, with any plan or action id an
        // execute makes: not one.
        for forged in [
            closing_message("pln_1", "act_1", PRINCIPAL),
            closing_message("ks_1", "act_1", PRINCIPAL),
            closing_message("pln_1", &id, PRINCIPAL),
            closing_message("ks_1", &id, "mastra-dev"),
            // Another contract's or account's id, another engagement's.
            closing_message(
                "ks_1",
                &flatten_action_id("ks_1", "ACC-2", "CLF27", 0),
                PRINCIPAL,
            ),
            closing_message(
                "ks_1",
                &flatten_action_id("ks_1", "ACC-1", "CLG27", 0),
                PRINCIPAL,
            ),
            closing_message(
                "ks_2",
                &flatten_action_id("ks_2", "ACC-1", "CLF27", 0),
                PRINCIPAL,
            ),
            // Past the attempts an engagement makes.
            closing_message(
                "ks_1",
                &flatten_action_id("ks_1", "ACC-1", "CLF27", MAX_ATTEMPTS),
                PRINCIPAL,
            ),
        ] {
            assert!(!is_flattening(&forged, &control), "{forged:?}");
        }
        // Released: no exception is needed, none is made.
        let mut released = control.clone();
        released.trade_execute_enabled = true;
        assert!(!is_flattening(&own, &released));
        // A cancel of the kill switch is not a closing order.
        let mut cancel = own.clone();
        cancel.action_type = ActionType::OrderCancel;
        assert!(!is_closing_order(&cancel));
        assert_ne!(id, cancel_action_id("ks_1", "ACC-1", 2));
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
