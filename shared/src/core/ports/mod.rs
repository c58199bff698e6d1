//! Small async capability traits, one per capability. Handlers and the protocol hold
//! them as `Arc<dyn Port>`; `adapters::sqlite` implements them on SQLite, the AWS
//! adapters on DynamoDB, SQS and KMS. Adapters stay dumb: they store, load and check the
//! conditions they are given; every decision lives in `protocol`.

pub mod broker;
pub mod limits;

use async_trait::async_trait;

use crate::core::auth::DeskScope;
use crate::core::domain::{
    Account, Exposure, ExposureDelta, Job, JobKind, JobStatus, Millis, Order, OrderStatus,
    Position, Side,
};
use crate::core::error::StoreResult;
use crate::core::records::{
    ActionRecord, ApprovalChange, AuditRecord, Control, KeyRecord, PlanPosition, PlanRecord,
    QueueMessage, RateState,
};

/// Keyset pagination: rows strictly after `after` in the listing's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<K> {
    pub after: Option<K>,
    pub limit: u32,
}

/// Orders and jobs list newest first by `(created_at, id)`.
pub type TimeKey = (Millis, String);

#[derive(Debug, Clone, Default)]
pub struct OrderFilter {
    pub account_id: Option<String>,
    pub status: Option<OrderStatus>,
}

#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    pub kind: Option<JobKind>,
    pub status: Option<JobStatus>,
}

#[async_trait]
pub trait AccountStore: Send + Sync {
    /// Accounts on the given desks, by `account_id`.
    async fn list_accounts(
        &self,
        desks: &DeskScope,
        page: &Page<String>,
    ) -> StoreResult<Vec<Account>>;
    async fn get_account(&self, account_id: &str) -> StoreResult<Option<Account>>;
}

#[async_trait]
pub trait PositionStore: Send + Sync {
    /// Positions on the given desks, by `(account_id, symbol)`.
    async fn list_positions(
        &self,
        desks: &DeskScope,
        account_id: Option<&str>,
        page: &Page<(String, String)>,
    ) -> StoreResult<Vec<Position>>;
    async fn get_position(&self, account_id: &str, symbol: &str) -> StoreResult<Option<Position>>;
    /// The account's filled position and open orders in one contract (zero when none).
    async fn get_exposure(&self, account_id: &str, symbol: &str) -> StoreResult<Exposure>;
}

#[async_trait]
pub trait OrderStore: Send + Sync {
    async fn list_orders(
        &self,
        desks: &DeskScope,
        filter: &OrderFilter,
        page: &Page<TimeKey>,
    ) -> StoreResult<Vec<Order>>;
    async fn get_order(&self, order_id: &str) -> StoreResult<Option<Order>>;
    /// Every order at the broker ([`crate::core::domain::OrderStatus::is_at_the_broker`]) of one
    /// account, or of all, oldest first: a listing that reads only such orders, never an
    /// account's history. On DynamoDB it comes from an index, which can lag: re-read each
    /// order ([`OrderStore::get_order`], consistent) before acting on it.
    async fn list_at_the_broker(&self, account_id: Option<&str>) -> StoreResult<Vec<Order>>;
}

#[async_trait]
pub trait JobStore: Send + Sync {
    /// Jobs of accounts on the given desks, plus jobs tied to no account.
    async fn list_jobs(
        &self,
        desks: &DeskScope,
        filter: &JobFilter,
        page: &Page<TimeKey>,
    ) -> StoreResult<Vec<Job>>;
}

#[async_trait]
pub trait ActionStore: Send + Sync {
    async fn get_action(&self, action_id: &str) -> StoreResult<Option<ActionRecord>>;
    /// Actions accepted before `claimed_before` and not known to be sent: the sweeper's
    /// work. An action leaves this listing when a worker first moves its status (it was
    /// delivered), or by [`ActionStore::clear_unsent`]; execute itself writes nothing after
    /// its send.
    async fn list_unsent(
        &self,
        claimed_before: Millis,
        limit: u32,
    ) -> StoreResult<Vec<ActionRecord>>;
    /// Takes an action out of the unsent listing, only if it is still there: the sweeper,
    /// once it sent it, or once it will never be sent (its idempotency record expired).
    /// `false`: it was taken out meanwhile; nothing was written.
    async fn clear_unsent(&self, action_id: &str, now: Millis) -> StoreResult<bool>;
}

#[async_trait]
pub trait PlanStore: Send + Sync {
    /// Stores a new plan and its audit record in one atomic write.
    async fn put_plan(&self, plan: &PlanRecord, audit: &AuditRecord) -> StoreResult<()>;
    async fn get_plan(&self, plan_id: &str) -> StoreResult<Option<PlanRecord>>;
    /// Records an operator's approval or decline on a plan with its audit record,
    /// atomically, only if the plan is still `planned`, has no decision yet, has not
    /// expired at `now` and still holds `change.seen` approvals. With a decision the plan
    /// leaves the pending-approvals listings. `false`: a condition failed; nothing was
    /// written.
    async fn record_approval(
        &self,
        plan_id: &str,
        change: &ApprovalChange,
        audit: &AuditRecord,
        now: Millis,
    ) -> StoreResult<bool>;
    /// Plans of this requester waiting for an approval ([`PlanRecord::awaiting_requester`]),
    /// unexpired at `now`, newest (latest expiry) first, after `before`, at most `limit`.
    /// On DynamoDB it comes from a sparse index, which can lag: callers re-check each plan.
    async fn list_awaiting_by_requester(
        &self,
        requester: &str,
        now: Millis,
        before: Option<&PlanPosition>,
        limit: u32,
    ) -> StoreResult<Vec<PlanRecord>>;
    /// Four-eyes plans of these desks waiting for an approval
    /// ([`PlanRecord::awaiting_desk`]), in the same order and with the same caveat.
    async fn list_awaiting_four_eyes(
        &self,
        desks: &DeskScope,
        now: Millis,
        before: Option<&PlanPosition>,
        limit: u32,
    ) -> StoreResult<Vec<PlanRecord>>;
}

/// The kinds of documents of the approval channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DocKind {
    /// An operator who approves with passkeys: roles, desks, credentials (id = `sub`).
    Operator,
    /// A one-time enrolment link (id = SHA-256 of its secret).
    Enrolment,
    /// A WebAuthn ceremony in progress (id = random), bound to what it is for.
    Challenge,
    /// A passkey sign-in on the approval page (id = SHA-256 of the cookie's secret).
    Session,
}

impl DocKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DocKind::Operator => "operator",
            DocKind::Enrolment => "enrolment",
            DocKind::Challenge => "challenge",
            DocKind::Session => "session",
        }
    }
}

/// A stored document: its JSON, its version (bumped by each write), and when it expires
/// (after which it counts as absent everywhere).
#[derive(Debug, Clone, PartialEq)]
pub struct Doc {
    pub body: serde_json::Value,
    pub version: u64,
    pub expires_at: Option<Millis>,
}

/// The approval channel's documents (operators, enrolments, challenges, sessions). The
/// store only keeps them and checks versions and expiry; what they mean lives in
/// `protocol::approvals`.
#[async_trait]
pub trait ApprovalStore: Send + Sync {
    /// A live document (an expired one counts as absent).
    async fn get_doc(&self, kind: DocKind, id: &str, now: Millis) -> StoreResult<Option<Doc>>;
    /// Writes `doc` (whose `version` is the new version) only if the stored version is
    /// `expected` (0: absent or expired). `false`: another write came first; nothing was
    /// written.
    async fn put_doc(
        &self,
        kind: DocKind,
        id: &str,
        doc: &Doc,
        expected: u64,
        now: Millis,
    ) -> StoreResult<bool>;
    /// Deletes a live document and returns it: of concurrent takers exactly one gets it
    /// (single-use challenges and enrolment links).
    async fn take_doc(&self, kind: DocKind, id: &str, now: Millis) -> StoreResult<Option<Doc>>;
    /// Every live document of a kind (the operators, for `airlock operators list`).
    async fn list_docs(&self, kind: DocKind, now: Millis) -> StoreResult<Vec<Doc>>;
}

/// The conditions an execute commit is checked against, atomically with its writes.
#[derive(Debug, Clone, PartialEq)]
pub enum KeyCondition {
    /// No live record for this key (an expired one counts as absent).
    Absent,
    /// The record is claimed by this lease owner (a takeover or the finishing write).
    ClaimedBy(String),
}

#[derive(Debug, Clone, PartialEq)]
pub enum PlanChange {
    /// planned -> executed with this action id.
    Execute { action_id: String },
    /// planned -> closed for this reason code.
    Close { reason_code: String },
}

/// One atomic step of execute (DESIGN, the execute path, step 4): put the key record,
/// move the plan, check the control record and the rate state, store the action and
/// append the audit record, all or nothing.
#[derive(Debug, Clone)]
pub struct ExecuteCommit {
    pub key: KeyRecord,
    pub key_condition: KeyCondition,
    /// The plan must still be `planned`; `None` leaves the plan alone.
    pub plan_change: Option<(String, PlanChange)>,
    /// The control record (kill switch, rollout modes, policy) must still be at the
    /// version the decision was made on.
    pub control_version: Option<u64>,
    /// The account must still be active.
    pub account_active: Option<String>,
    /// One more execute on the operator's rate record (conditional, see [`RateUpdate`]).
    pub rate: Option<crate::core::records::RateUpdate>,
    /// The order's contracts, reserved against the position limit.
    pub reserve: Option<Reservation>,
    /// One more message on the account's message window (conditional, see
    /// [`crate::core::throttle::MessageUpdate`]).
    pub messages: Option<crate::core::throttle::MessageUpdate>,
    pub action: Option<ActionRecord>,
    /// Queue the action's message in this same atomic write, in this message group,
    /// deduplicated on the action id: a transactional outbox. Only set for a ledger that
    /// [`ExecuteLedger::queues_in_commit`], and then the action is stored as sent.
    pub enqueue_group: Option<String>,
    pub audit: AuditRecord,
}

/// An order's contracts added to its side's open quantity, only if the worst case on that
/// side still leaves room: for a buy, `position + open_buy <= bound` before the
/// reservation; for a sell, `position - open_sell >= bound`. Absent counts as zero.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub side: Side,
    pub bound: i64,
    pub delta: ExposureDelta,
}

impl Reservation {
    /// Whether the exposure leaves room for this reservation.
    pub fn fits(&self, e: &Exposure) -> bool {
        e.leaves_room(self.side, self.bound)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conflict {
    Key,
    Plan,
    Control,
    Rate,
    Position,
    Account,
    Messages,
}

/// Everything execute reads before it decides, in one round trip.
#[derive(Debug, Clone)]
pub struct ExecuteSnapshot {
    /// The live idempotency record (expired ones count as absent).
    pub key: Option<KeyRecord>,
    pub plan: Option<PlanRecord>,
    pub control: Control,
    pub rate: RateState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitOutcome {
    Committed,
    /// A condition no longer held; nothing was written. Re-read and decide again.
    Conflict(Conflict),
}

#[async_trait]
pub trait ExecuteLedger: Send + Sync {
    /// Whether [`ExecuteLedger::commit`] can queue the action's message in its own atomic
    /// write ([`ExecuteCommit::enqueue_group`]): the embedded store, whose queue is a table
    /// of the same database. DynamoDB and SQS share no transaction: execute sends after the
    /// commit there (the default, `false`).
    fn queues_in_commit(&self) -> bool {
        false
    }
    /// A live key record (expired ones count as absent).
    async fn get_key(
        &self,
        principal: &str,
        key: &str,
        now: Millis,
    ) -> StoreResult<Option<KeyRecord>>;
    /// The key, the plan, the control record and the operator's rate state, read together
    /// (one consistent read in SQLite, one `BatchGetItem` in DynamoDB).
    async fn snapshot(
        &self,
        principal: &str,
        key: &str,
        plan_id: &str,
        operator_id: &str,
        now: Millis,
    ) -> StoreResult<ExecuteSnapshot>;
    async fn commit(&self, c: &ExecuteCommit, now: Millis) -> StoreResult<CommitOutcome>;
    /// After the enqueue: writes the `decided` key record (built by the protocol) and marks
    /// the action sent, only if `lease_owner` still holds the key (a late first attempt
    /// cannot overwrite a new owner's record). `false`: it does not; nothing was written.
    async fn mark_sent(
        &self,
        decided: &KeyRecord,
        lease_owner: &str,
        action_id: &str,
        now: Millis,
    ) -> StoreResult<bool>;
    /// Writes `claim` (the same key with a new lease, built by the protocol), only if
    /// `old_owner` still holds the key. `false`: it does not; nothing was written.
    async fn take_over(&self, claim: &KeyRecord, old_owner: &str) -> StoreResult<bool>;
}

#[async_trait]
pub trait ControlStore: Send + Sync {
    async fn get_control(&self) -> StoreResult<Control>;
    /// Writes `c` only if the stored record is still at `expected_version` (0: none yet).
    /// `false`: another write came first; nothing was written.
    async fn put_control(&self, c: &Control, expected_version: u64) -> StoreResult<bool>;
}

#[async_trait]
pub trait AuditLog: Send + Sync {
    async fn append(&self, rec: &AuditRecord) -> StoreResult<()>;
    /// Every record naming this plan or action id (and, for an action, its plan), by time.
    async fn trail(&self, id: &str) -> StoreResult<Vec<AuditRecord>>;
}

#[async_trait]
pub trait Queue: Send + Sync {
    /// Sends a message. `dedup_id` makes a resend of the same action a no-op (SQS FIFO
    /// deduplication; the embedded queue has a unique index).
    async fn send(&self, msg: &QueueMessage, group: &str, dedup_id: &str) -> StoreResult<()>;
    /// Messages per queue: waiting, and received but not yet deleted.
    async fn depth(&self) -> StoreResult<Vec<QueueDepth>>;
    /// The messages of one queue waiting or received but not yet deleted: execute's
    /// admission check. On SQS an approximate count (one `GetQueueAttributes`).
    async fn backlog(&self, queue: crate::core::domain::QueueTarget) -> StoreResult<u64>;
    /// How often an execute held for room in the backlog may count it again: a local
    /// count is a small read, an SQS count a call (and approximate anyway).
    fn backlog_poll(&self) -> std::time::Duration {
        std::time::Duration::from_millis(2)
    }
    /// Up to `max` messages, hidden from other consumers for `visibility_ms`. On the FIFO
    /// orders queue, a group's (account's) messages arrive in order, and none of a group
    /// arrives while an earlier one of it is in flight; one batch may hold several of one
    /// group (SQS does; the embedded queue gives one), which the consumer handles in order.
    async fn receive(
        &self,
        queue: crate::core::domain::QueueTarget,
        max: u32,
        visibility_ms: u64,
    ) -> StoreResult<Vec<Delivery>>;
    /// The message was handled: delete it.
    async fn ack(&self, queue: crate::core::domain::QueueTarget, receipt: &str) -> StoreResult<()>;
    /// Handling failed: make the message visible again after `delay_ms`. After the
    /// queue's maximum receives it moves to the dead-letter queue instead.
    async fn release(
        &self,
        queue: crate::core::domain::QueueTarget,
        receipt: &str,
        delay_ms: u64,
    ) -> StoreResult<()>;
    /// Dead letters of `queue` (received [`crate::core::records::MAX_RECEIVES`] times and never
    /// handled), up to `max`, not looked at in the last `hide_ms`; each is hidden again for
    /// `hide_ms` and stays a dead letter (for the dead-letter sweep, which settles its
    /// action, and for operators).
    async fn dead_letters(
        &self,
        queue: crate::core::domain::QueueTarget,
        max: u32,
        hide_ms: u64,
    ) -> StoreResult<Vec<Delivery>>;
    /// Moves up to `max` dead letters of `queue` back to it, received again as new (their
    /// receive count starts over). Returns how many moved.
    async fn redrive(
        &self,
        queue: crate::core::domain::QueueTarget,
        max: u32,
    ) -> StoreResult<usize>;
    /// A signal raised on every send to `queue` from this process, so an idle in-process
    /// consumer can wake at once instead of polling. `None` (the default): the queue cannot
    /// tell (SQS, whose `receive` long-polls instead).
    fn send_signal(
        &self,
        _queue: crate::core::domain::QueueTarget,
    ) -> Option<std::sync::Arc<tokio::sync::Notify>> {
        None
    }
}

/// A received message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub receipt: String,
    pub body: String,
    /// How many times it has been received, this time included.
    pub receive_count: u32,
    /// Its message group (FIFO queues: the account). Messages of one group are handled in
    /// order; different groups may be handled at the same time. `None`: no order to keep.
    pub group: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueDepth {
    pub queue: crate::core::domain::QueueTarget,
    pub waiting: i64,
    pub in_flight: i64,
    /// Messages in the queue's dead-letter queue.
    pub dead_letters: i64,
    /// When the oldest message still waiting was sent, if the queue can tell (SQLite;
    /// SQS publishes `ApproximateAgeOfOldestMessage` to CloudWatch itself).
    pub oldest_sent_at: Option<crate::core::domain::Millis>,
}

/// Signs confirmation tokens (ES256). The local signer holds a P-256 key file; the AWS
/// signer calls KMS `Sign`. Verification never calls the signer: it uses the public key.
#[async_trait]
pub trait Signer: Send + Sync {
    fn key_id(&self) -> &str;
    /// The verification key; a KMS signer fetches it on first use and keeps it, so only
    /// functions that verify confirmation tokens need `kms:GetPublicKey`.
    async fn public_key(&self) -> StoreResult<p256::PublicKey>;
    /// The ES256 signature of `message` in JWS form (`r || s`, 64 bytes).
    async fn sign(&self, message: &[u8]) -> StoreResult<[u8; 64]>;
}

/// Writes to the read models: the demo seed and the workers use it.
#[async_trait]
pub trait ReadModelWriter: Send + Sync {
    async fn put_accounts(&self, rows: &[Account]) -> StoreResult<()>;
    async fn put_positions(&self, rows: &[Position]) -> StoreResult<()>;
    async fn put_orders(&self, rows: &[Order]) -> StoreResult<()>;
    async fn put_jobs(&self, rows: &[Job]) -> StoreResult<()>;
    /// Sets exposures outright (the demo seed, from its positions and open orders).
    async fn put_exposures(&self, rows: &[(String, String, Exposure)]) -> StoreResult<()>;
}

/// A sync's replacement of an account's positions: written only if the stored positions
/// are still exactly `before` (a fill recorded in between makes the write fail).
#[derive(Debug, Clone, Copy)]
pub struct PositionsReplacement<'a> {
    pub account_id: &'a str,
    pub before: &'a [Position],
    pub after: &'a [Position],
}

/// A position's new state, written only if the stored quantity is still `expected`
/// (`None`: no row yet).
#[derive(Debug, Clone, PartialEq)]
pub struct PositionChange {
    pub expected: Option<i64>,
    pub new: Position,
}

/// An action's move from one of `from` to `to` (`error`: why it failed) at `at`, written
/// with the order step that settles it ([`WorkerStore::advance_order`]) or with the
/// exposure change it settles ([`WorkerStore::settle_with_exposure`]).
#[derive(Debug, Clone, Copy)]
pub struct ActionMove<'a> {
    pub action_id: &'a str,
    pub from: &'a [crate::core::domain::ActionStatus],
    pub to: crate::core::domain::ActionStatus,
    pub error: Option<&'a str>,
    pub at: Millis,
}

/// What a create-if-absent found: the record it wrote, or the one an earlier call stored.
#[derive(Debug, Clone, PartialEq)]
pub enum Stored<T> {
    Created(T),
    Found(T),
}

impl<T> Stored<T> {
    pub fn into_inner(self) -> T {
        match self {
            Stored::Created(t) | Stored::Found(t) => t,
        }
    }
}

/// The exposure step [`WorkerStore::create_order`] writes with a new order (see
/// [`ExposureDelta::of_order_created`]); an order with fills is refused (`Corrupt`): it is
/// created before any fill.
pub fn creation_step(order: &Order) -> StoreResult<ExposureDelta> {
    if order.filled_quantity != 0 {
        return Err(crate::core::error::StoreError::Corrupt(format!(
            "order {}: an order is created before any fill",
            order.order_id
        )));
    }
    Ok(ExposureDelta::of_order_created(order))
}

/// Refuses (`Corrupt`) a step ([`WorkerStore::advance_order`]) that moves what a step
/// never moves: the order's account, its creation time, its version and earlier versions.
pub fn step_check(prev: &Order, next: &Order) -> StoreResult<()> {
    if (
        &next.terms.account_id,
        next.created_at,
        next.version,
        &next.versions,
    ) != (
        &prev.terms.account_id,
        prev.created_at,
        prev.version,
        &prev.versions,
    ) {
        return Err(crate::core::error::StoreError::Corrupt(format!(
            "order {}: a step may not move its account, creation time or version",
            prev.order_id
        )));
    }
    Ok(())
}

/// Refuses (`Corrupt`) a `next` that is not a replace of `prev` ([`Order::replace_error`]).
pub fn replace_check(prev: &Order, next: &Order) -> StoreResult<()> {
    match prev.replace_error(next) {
        Some(why) => Err(crate::core::error::StoreError::Corrupt(why)),
        None => Ok(()),
    }
}

/// Refuses (`Corrupt`) an exposure change [`WorkerStore::settle_with_exposure`] cannot
/// write alone: one that moves the position or the count of orders claimed for the broker.
/// Only open quantities (reservations) move without an order's or a position's write.
pub fn open_change_check(exposure: &ExposureDelta) -> StoreResult<()> {
    if exposure.position != 0 || exposure.submitting != 0 {
        return Err(crate::core::error::StoreError::Corrupt(format!(
            "exposure of {} in {}: only open quantities move without an order's write",
            exposure.account_id, exposure.symbol
        )));
    }
    Ok(())
}

/// The workers' writes. Each call is atomic and conditional on the state the worker read,
/// so a redelivered or concurrent message can never apply the same step twice.
#[async_trait]
pub trait WorkerStore: Send + Sync {
    /// Creates the order if absent, together with the exposure change of the step from the
    /// order as execute reserved it (`queued`, nothing filled) to `order`
    /// ([`ExposureDelta::of_order_step`]): none for `queued`, a claim for the broker for
    /// `submitted`, the reservation released for `rejected`. `Found`: an earlier delivery
    /// created it; nothing was written. An order with fills is refused (`Corrupt`).
    async fn create_order(&self, order: &Order) -> StoreResult<Stored<Order>>;
    /// Replaces the order `prev` with `next` if its status, fills and version are still
    /// `prev`'s (a step keeps the version; a replace is [`WorkerStore::replace_order`]), together
    /// with the position change its fill causes, the exposure change of the step
    /// ([`ExposureDelta::of_order_step`]) and, when given, the move of the action the step
    /// settles ([`ActionMove`], as [`WorkerStore::set_action_status`] makes it). `false`:
    /// another delivery moved the order first, or the action is not in one of `from`;
    /// nothing was written.
    async fn advance_order(
        &self,
        prev: &Order,
        next: &Order,
        position: Option<&PositionChange>,
        settles: Option<&ActionMove<'_>>,
    ) -> StoreResult<bool>;
    /// Writes a replace of the order `prev`: `next` is `prev` at the next version with new
    /// terms ([`Order::replaced`]), written only if the stored order is still at
    /// `prev.version`, in `prev.status` and with `prev.filled_quantity` (a fill recorded in
    /// between makes it fail: read again), together with `exposure` (increments, as
    /// [`WorkerStore::advance_order`] applies its step's) and, when given, the move of the
    /// action it settles. `false`: a condition failed; nothing was written. A `next` that is
    /// not such a replace is refused (`Corrupt`).
    async fn replace_order(
        &self,
        prev: &Order,
        next: &Order,
        exposure: &ExposureDelta,
        settles: Option<&ActionMove<'_>>,
    ) -> StoreResult<bool>;
    /// Settles an action (`settles`, as [`WorkerStore::set_action_status`] makes the move)
    /// together with an exposure change (increments, as [`WorkerStore::advance_order`]
    /// applies them), all or nothing: a reservation released when what reserved it ends
    /// without changing an order. A zero `exposure` writes only the move. `false`: the
    /// action is not in one of `settles.from` (another delivery settled it first); nothing
    /// was written, so a redelivery can never apply the change twice. A change that moves
    /// the position or the count of orders claimed for the broker is refused (`Corrupt`,
    /// [`open_change_check`]): those move only with the order or position that causes them.
    async fn settle_with_exposure(
        &self,
        exposure: &ExposureDelta,
        settles: &ActionMove<'_>,
    ) -> StoreResult<bool>;
    /// Creates the job if absent; returns the stored job either way.
    async fn create_job(&self, job: &Job) -> StoreResult<Job>;
    /// Finishes a running job with its result, and replaces the account's positions when
    /// given (a sync), atomically; the exposures' positions follow. `false`: it was
    /// finished already, or a position changed since it was read, or an order of a
    /// contract it replaces is claimed for the broker and not yet recorded
    /// (`submitted`: the broker's position may hold its fill already): read again later.
    /// On DynamoDB a replacement larger than one transaction is written in chunks, each
    /// under these conditions, the job's own update last.
    async fn finish_job(
        &self,
        job: &Job,
        result: &serde_json::Value,
        positions: Option<&PositionsReplacement<'_>>,
    ) -> StoreResult<bool>;
    /// Moves an action's status if it is one of `from`. A moved action was delivered (or
    /// settled unsent): it also leaves the unsent listing ([`ActionStore::list_unsent`]).
    async fn set_action_status(
        &self,
        action_id: &str,
        from: &[crate::core::domain::ActionStatus],
        to: crate::core::domain::ActionStatus,
        error: Option<&str>,
        now: Millis,
    ) -> StoreResult<bool>;
}

/// Storage of the paper broker: versioned JSON documents (the price table, one book of
/// positions per account, one document per broker order), replaced only at the version
/// read. Version 0 means "does not exist yet".
#[async_trait]
pub trait PaperBookStore: Send + Sync {
    async fn load(&self, key: &str) -> StoreResult<(Option<serde_json::Value>, u64)>;
    /// The document if its version is not `known` (`None`: unchanged since that read), so a
    /// reader that keeps what it decoded skips decoding it again. An adapter that can ask
    /// the store for the version alone overrides this; the default loads and compares.
    async fn load_changed(
        &self,
        key: &str,
        known: u64,
    ) -> StoreResult<Option<(Option<serde_json::Value>, u64)>> {
        let (doc, version) = self.load(key).await?;
        Ok((version != known).then_some((doc, version)))
    }
    /// `false`: the document changed since `expected_version`; nothing was written.
    async fn save(
        &self,
        key: &str,
        doc: &serde_json::Value,
        expected_version: u64,
    ) -> StoreResult<bool>;
    /// Saves several documents (at most a handful), each at its expected version, all or
    /// nothing. `false`: one of them changed (or exists, for version 0); nothing was written.
    async fn save_all(&self, docs: &[PaperDoc]) -> StoreResult<bool>;
    /// Every document whose key starts with `prefix`, in no particular order. A scan, for
    /// the CLI and tests, not for a worker's path.
    async fn list(&self, prefix: &str) -> StoreResult<Vec<serde_json::Value>>;
}

/// A document to save with [`PaperBookStore::save_all`].
#[derive(Debug, Clone, PartialEq)]
pub struct PaperDoc {
    pub key: String,
    pub doc: serde_json::Value,
    pub expected_version: u64,
}

pub use crate::core::domain::Quote;

/// Reference prices (the paper broker's price table; a market data feed in production): the
/// price-band check compares a limit or stop price with them.
#[async_trait]
pub trait Prices: Send + Sync {
    /// The reference price of a contract (`CLZ26`) and its time, if one is known.
    async fn quote(&self, symbol: &str) -> StoreResult<Option<Quote>>;
    /// The reference price of a contract (`CLZ26`), if one is known.
    async fn reference_price(
        &self,
        symbol: &str,
    ) -> StoreResult<Option<crate::core::domain::Price>> {
        Ok(self.quote(symbol).await?.map(|q| q.price))
    }
    /// The quotes of several contracts, in the order asked; one round trip where the
    /// source allows it.
    async fn quotes(&self, symbols: &[&str]) -> StoreResult<Vec<Option<Quote>>> {
        let mut out = Vec::with_capacity(symbols.len());
        for s in symbols {
            out.push(self.quote(s).await?);
        }
        Ok(out)
    }
    /// The reference prices of several contracts, in the order asked; one round trip
    /// where the source allows it.
    async fn reference_prices(
        &self,
        symbols: &[&str],
    ) -> StoreResult<Vec<Option<crate::core::domain::Price>>> {
        let mut out = Vec::with_capacity(symbols.len());
        for s in symbols {
            out.push(self.reference_price(s).await?);
        }
        Ok(out)
    }
}
