//! Read models, plans, control record and audit log on DynamoDB.
//!
//! Listings keep the embedded backend's order and keyset pages: accounts by id (a scan:
//! there are few accounts), positions by (account, symbol) one account at a time, orders
//! and jobs newest first through the `by_desk` / `by_account` indexes, merged across the
//! operator's desks. The desk filter is part of each query's key condition.

use std::collections::{BTreeSet, HashMap};

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{AttributeValue, Put, PutRequest, TransactWriteItem, WriteRequest};

use super::ddb::{self, from_body, get_s, n, opt_n, opt_s, s, time_key, Item};
use super::{unavailable, Aws};
use crate::auth::DeskScope;
use crate::domain::{Account, Exposure, Job, Millis, Order, Position};
use crate::error::{StoreError, StoreResult};
use crate::ports::{
    AccountStore, ActionStore, AuditLog, ControlStore, JobFilter, JobStore, OrderFilter,
    OrderStore, Page, PlanStore, PositionStore, ReadModelWriter, TimeKey,
};
use crate::records::{ActionRecord, AuditRecord, Control, PlanRecord, PlanStatus};

/// The `desk` of jobs tied to no account.
const NO_DESK: &str = "-";

impl Aws {
    pub(super) async fn get(
        &self,
        table: &str,
        key: &[(&str, AttributeValue)],
    ) -> StoreResult<Option<Item>> {
        let mut req = self.ddb.get_item().table_name(table).consistent_read(true);
        for (k, v) in key {
            req = req.key(*k, v.clone());
        }
        req.send()
            .await
            .map(|o| o.item)
            .map_err(|e| unavailable(&format!("GetItem {table}"), &e))
    }

    async fn scan_all(&self, table: &str) -> StoreResult<Vec<Item>> {
        let mut out = Vec::new();
        let mut start = None;
        loop {
            let o = self
                .ddb
                .scan()
                .table_name(table)
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| unavailable(&format!("Scan {table}"), &e))?;
            out.extend(o.items.unwrap_or_default());
            match o.last_evaluated_key {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => return Ok(out),
            }
        }
    }

    async fn all_accounts(&self) -> StoreResult<Vec<Account>> {
        let mut v: Vec<Account> = self
            .scan_all(&self.names.accounts)
            .await?
            .iter()
            .map(from_body)
            .collect::<StoreResult<_>>()?;
        v.sort_by(|a, b| a.account_id.cmp(&b.account_id));
        Ok(v)
    }

    /// The desks a scope covers (all known desks for `All`).
    async fn desks(&self, scope: &DeskScope) -> StoreResult<Vec<String>> {
        Ok(match scope {
            DeskScope::All => self
                .all_accounts()
                .await?
                .into_iter()
                .map(|a| a.desk)
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect(),
            DeskScope::Only(d) => d.iter().cloned().collect(),
        })
    }

    /// Newest-first rows of one index partition, strictly before `before`, at most `want`
    /// after the optional `filter` (attribute name, value).
    async fn query_newest(
        &self,
        table: &str,
        index: &str,
        partition: (&str, &str),
        before: Option<&str>,
        filters: &[(&str, String)],
        want: usize,
    ) -> StoreResult<Vec<Item>> {
        let mut out = Vec::new();
        let mut start = None;
        loop {
            let mut q = self
                .ddb
                .query()
                .table_name(table)
                .index_name(index)
                .scan_index_forward(false)
                .limit(want.max(10) as i32)
                .expression_attribute_names("#p", partition.0)
                .expression_attribute_values(":p", s(partition.1))
                .set_exclusive_start_key(start);
            q = match before {
                Some(b) => q
                    .key_condition_expression("#p = :p AND created_key < :before")
                    .expression_attribute_values(":before", s(b)),
                None => q.key_condition_expression("#p = :p"),
            };
            if !filters.is_empty() {
                let mut expr = Vec::new();
                for (i, (name, value)) in filters.iter().enumerate() {
                    q = q
                        .expression_attribute_names(format!("#f{i}"), *name)
                        .expression_attribute_values(format!(":f{i}"), s(value.clone()));
                    expr.push(format!("#f{i} = :f{i}"));
                }
                q = q.filter_expression(expr.join(" AND "));
            }
            let o = q
                .send()
                .await
                .map_err(|e| unavailable(&format!("Query {table}.{index}"), &e))?;
            out.extend(o.items.unwrap_or_default());
            match o.last_evaluated_key {
                Some(k) if !k.is_empty() && out.len() < want => start = Some(k),
                _ => break,
            }
        }
        out.truncate(want);
        Ok(out)
    }

    /// Merges per-partition newest-first lists into one page.
    /// The newest `want` rows over several desks: one `by_desk` query per desk, merged.
    async fn newest_by_desk(
        &self,
        table: &str,
        desk_list: Vec<String>,
        before: Option<&str>,
        filters: &[(&str, String)],
        want: usize,
    ) -> StoreResult<Vec<Item>> {
        let mut all = Vec::new();
        for d in desk_list {
            all.extend(
                self.query_newest(table, "by_desk", ("desk", &d), before, filters, want)
                    .await?,
            );
        }
        Ok(Self::merge_newest(all, want))
    }

    fn merge_newest(mut rows: Vec<Item>, limit: usize) -> Vec<Item> {
        rows.sort_by(|a, b| {
            let ka = opt_s(a, "created_key").unwrap_or_default();
            let kb = opt_s(b, "created_key").unwrap_or_default();
            kb.cmp(&ka)
        });
        rows.truncate(limit);
        rows
    }

    async fn batch_put(&self, table: &str, items: Vec<Item>) -> StoreResult<()> {
        for chunk in items.chunks(25) {
            let mut pending: Vec<WriteRequest> = chunk
                .iter()
                .map(|i| {
                    PutRequest::builder()
                        .set_item(Some(i.clone()))
                        .build()
                        .map(|p| WriteRequest::builder().put_request(p).build())
                        .map_err(|e| StoreError::Corrupt(e.to_string()))
                })
                .collect::<StoreResult<_>>()?;
            for _ in 0..8 {
                if pending.is_empty() {
                    break;
                }
                let o = self
                    .ddb
                    .batch_write_item()
                    .request_items(table, pending.clone())
                    .send()
                    .await
                    .map_err(|e| unavailable(&format!("BatchWriteItem {table}"), &e))?;
                pending = o
                    .unprocessed_items
                    .and_then(|mut m| m.remove(table))
                    .unwrap_or_default();
            }
            if !pending.is_empty() {
                return Err(StoreError::Unavailable(format!(
                    "BatchWriteItem {table}: items left unprocessed"
                )));
            }
        }
        Ok(())
    }

    async fn desk_of(
        &self,
        account_id: &str,
        cache: &mut HashMap<String, String>,
    ) -> StoreResult<String> {
        if let Some(d) = cache.get(account_id) {
            return Ok(d.clone());
        }
        let d = match self
            .get(&self.names.accounts, &[("account_id", s(account_id))])
            .await?
        {
            Some(item) => from_body::<Account>(&item)?.desk,
            None => return Err(StoreError::Corrupt(format!("no account {account_id}"))),
        };
        cache.insert(account_id.to_string(), d.clone());
        Ok(d)
    }
}

fn before_key(after: &Option<TimeKey>) -> Option<String> {
    after.as_ref().map(|(ms, id)| time_key(*ms, id))
}

#[async_trait]
impl AccountStore for Aws {
    async fn list_accounts(
        &self,
        desks: &DeskScope,
        page: &Page<String>,
    ) -> StoreResult<Vec<Account>> {
        Ok(self
            .all_accounts()
            .await?
            .into_iter()
            .filter(|a| desks.allows(&a.desk))
            .filter(|a| {
                page.after
                    .as_ref()
                    .is_none_or(|after| &a.account_id > after)
            })
            .take(page.limit as usize)
            .collect())
    }

    async fn get_account(&self, account_id: &str) -> StoreResult<Option<Account>> {
        self.get(&self.names.accounts, &[("account_id", s(account_id))])
            .await?
            .map(|i| from_body(&i))
            .transpose()
    }
}

#[async_trait]
impl PositionStore for Aws {
    async fn list_positions(
        &self,
        desks: &DeskScope,
        account_id: Option<&str>,
        page: &Page<(String, String)>,
    ) -> StoreResult<Vec<Position>> {
        let accounts: Vec<String> = self
            .all_accounts()
            .await?
            .into_iter()
            .filter(|a| desks.allows(&a.desk))
            .filter(|a| account_id.is_none_or(|id| id == a.account_id))
            .filter(|a| {
                page.after
                    .as_ref()
                    .is_none_or(|(acc, _)| &a.account_id >= acc)
            })
            .map(|a| a.account_id)
            .collect();
        let mut out = Vec::new();
        for acc in accounts {
            let mut start: Option<Item> = match &page.after {
                Some((a, sym)) if *a == acc => Some(HashMap::from([
                    ("account_id".to_string(), s(a.clone())),
                    ("symbol".to_string(), s(sym.clone())),
                ])),
                _ => None,
            };
            loop {
                let o = self
                    .ddb
                    .query()
                    .table_name(&self.names.positions)
                    .key_condition_expression("account_id = :a")
                    .expression_attribute_values(":a", s(acc.clone()))
                    .consistent_read(true)
                    .set_exclusive_start_key(start)
                    .send()
                    .await
                    .map_err(|e| unavailable("Query positions", &e))?;
                for item in o.items.unwrap_or_default() {
                    out.push(from_body::<Position>(&item)?);
                }
                match o.last_evaluated_key {
                    Some(k) if !k.is_empty() && out.len() < page.limit as usize => start = Some(k),
                    _ => break,
                }
            }
            if out.len() >= page.limit as usize {
                break;
            }
        }
        out.truncate(page.limit as usize);
        Ok(out)
    }

    async fn get_exposure(&self, account_id: &str, symbol: &str) -> StoreResult<Exposure> {
        let item = self
            .get(
                &self.names.exposures,
                &[("account_id", s(account_id)), ("symbol", s(symbol))],
            )
            .await?;
        Ok(ddb::exposure_from_item(item.as_ref()))
    }

    async fn get_position(&self, account_id: &str, symbol: &str) -> StoreResult<Option<Position>> {
        self.get(
            &self.names.positions,
            &[("account_id", s(account_id)), ("symbol", s(symbol))],
        )
        .await?
        .map(|i| from_body(&i))
        .transpose()
    }
}

#[async_trait]
impl OrderStore for Aws {
    async fn list_orders(
        &self,
        desks: &DeskScope,
        filter: &OrderFilter,
        page: &Page<TimeKey>,
    ) -> StoreResult<Vec<Order>> {
        let before = before_key(&page.after);
        let want = page.limit as usize;
        let mut filters = Vec::new();
        if let Some(st) = filter.status {
            filters.push(("status", st.as_str().to_string()));
        }
        let rows = match &filter.account_id {
            // The caller checked the account is visible.
            Some(acc) => {
                self.query_newest(
                    &self.names.orders,
                    "by_account",
                    ("account_id", acc),
                    before.as_deref(),
                    &filters,
                    want,
                )
                .await?
            }
            None => {
                let desk_list = self.desks(desks).await?;
                self.newest_by_desk(
                    &self.names.orders,
                    desk_list,
                    before.as_deref(),
                    &filters,
                    want,
                )
                .await?
            }
        };
        rows.iter().map(from_body).collect()
    }

    async fn get_order(&self, order_id: &str) -> StoreResult<Option<Order>> {
        self.get(&self.names.orders, &[("order_id", s(order_id))])
            .await?
            .map(|i| from_body(&i))
            .transpose()
    }
}

#[async_trait]
impl JobStore for Aws {
    async fn list_jobs(
        &self,
        desks: &DeskScope,
        filter: &JobFilter,
        page: &Page<TimeKey>,
    ) -> StoreResult<Vec<Job>> {
        let before = before_key(&page.after);
        let want = page.limit as usize;
        let mut filters = Vec::new();
        if let Some(k) = filter.kind {
            filters.push(("kind", k.as_str().to_string()));
        }
        if let Some(st) = filter.status {
            filters.push(("status", st.as_str().to_string()));
        }
        let mut desk_list = self.desks(desks).await?;
        desk_list.push(NO_DESK.to_string());
        self.newest_by_desk(
            &self.names.jobs,
            desk_list,
            before.as_deref(),
            &filters,
            want,
        )
        .await?
        .iter()
        .map(from_body)
        .collect()
    }
}

/// An action item's body overlaid with its mutable attributes.
pub(super) fn action_from_item(item: &Item) -> StoreResult<ActionRecord> {
    let mut a: ActionRecord = from_body(item)?;
    a.enqueued_at = opt_n(item, "enqueued_at");
    if let Some(st) = opt_s(item, "status") {
        a.status = st.parse().map_err(StoreError::Corrupt)?;
    }
    if let Some(u) = opt_n(item, "updated_at") {
        a.updated_at = u;
    }
    a.error = opt_s(item, "error").or(a.error);
    Ok(a)
}

#[async_trait]
impl ActionStore for Aws {
    async fn get_action(&self, action_id: &str) -> StoreResult<Option<ActionRecord>> {
        self.get(&self.names.actions, &[("action_id", s(action_id))])
            .await?
            .map(|i| action_from_item(&i))
            .transpose()
    }

    async fn list_unsent(
        &self,
        claimed_before: Millis,
        limit: u32,
    ) -> StoreResult<Vec<ActionRecord>> {
        let o = self
            .ddb
            .query()
            .table_name(&self.names.actions)
            .index_name("unsent")
            .key_condition_expression("unsent = :u AND created_at < :t")
            .expression_attribute_values(":u", s("1"))
            .expression_attribute_values(":t", n(claimed_before))
            .limit(limit as i32)
            .send()
            .await
            .map_err(|e| unavailable("Query actions.unsent", &e))?;
        // The index is eventually consistent: re-read each action before trusting it.
        let mut out = Vec::new();
        for item in o.items.unwrap_or_default() {
            let id = get_s(&item, "action_id")?.to_string();
            if let Some(a) = self.get_action(&id).await? {
                if a.enqueued_at.is_none() {
                    out.push(a);
                }
            }
        }
        Ok(out)
    }
}

/// A plan item's body overlaid with its mutable attributes.
pub(super) fn plan_from_item(item: &Item) -> StoreResult<PlanRecord> {
    let mut p: PlanRecord = from_body(item)?;
    p.status = match get_s(item, "status")? {
        "planned" => PlanStatus::Planned,
        "executed" => PlanStatus::Executed,
        "closed" => PlanStatus::Closed,
        other => return Err(StoreError::Corrupt(format!("plan status {other}"))),
    };
    p.action_id = opt_s(item, "action_id");
    p.closed_reason = opt_s(item, "closed_reason");
    Ok(p)
}

/// Plans stay readable for a week after they expire (for `plan_expired` answers and
/// audit), then DynamoDB may delete them.
const PLAN_RETENTION_MS: Millis = 7 * 24 * 3600 * 1000;

pub(super) fn audit_put(table: &str, a: &AuditRecord) -> StoreResult<TransactWriteItem> {
    let item: Item = HashMap::from([
        (
            "plan_id".to_string(),
            s(a.plan_id.clone().unwrap_or_else(|| NO_DESK.into())),
        ),
        ("seq".to_string(), s(time_key(a.at, &a.audit_id))),
        ("at".to_string(), n(a.at)),
        ("body".to_string(), ddb::body(a)?),
    ]);
    let put = Put::builder()
        .table_name(table)
        .set_item(Some(item))
        .condition_expression("attribute_not_exists(seq)")
        .build()
        .map_err(|e| StoreError::Corrupt(e.to_string()))?;
    Ok(TransactWriteItem::builder().put(put).build())
}

#[async_trait]
impl PlanStore for Aws {
    async fn put_plan(&self, plan: &PlanRecord, audit: &AuditRecord) -> StoreResult<()> {
        let item: Item = HashMap::from([
            ("plan_id".to_string(), s(plan.plan_id.clone())),
            ("status".to_string(), s("planned")),
            ("expires_at".to_string(), n(plan.expires_at)),
            (
                "ttl".to_string(),
                ddb::ttl_seconds(plan.expires_at + PLAN_RETENTION_MS),
            ),
            ("body".to_string(), ddb::body(plan)?),
        ]);
        let put = Put::builder()
            .table_name(&self.names.plans)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(plan_id)")
            .build()
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        self.ddb
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().put(put).build())
            .transact_items(audit_put(&self.names.audit, audit)?)
            .send()
            .await
            .map_err(|e| unavailable("TransactWriteItems plan", &e))?;
        Ok(())
    }

    async fn get_plan(&self, plan_id: &str) -> StoreResult<Option<PlanRecord>> {
        self.get(&self.names.plans, &[("plan_id", s(plan_id))])
            .await?
            .map(|i| plan_from_item(&i))
            .transpose()
    }
}

pub(super) const CONTROL_ID: &str = "global";

pub(super) fn control_from_item(item: Option<Item>) -> StoreResult<Control> {
    match item {
        Some(i) => from_body(&i),
        None => Ok(Control::default()),
    }
}

#[async_trait]
impl ControlStore for Aws {
    async fn get_control(&self) -> StoreResult<Control> {
        control_from_item(
            self.get(&self.names.control, &[("id", s(CONTROL_ID))])
                .await?,
        )
    }

    async fn put_control(&self, c: &Control, expected_version: u64) -> StoreResult<bool> {
        // `trade_execute_enabled` and `rollout` are attributes too: execute's commit checks
        // them in a ConditionCheck.
        let rollout: HashMap<String, AttributeValue> = c
            .rollout
            .iter()
            .map(|(k, v)| {
                let mode = serde_json::to_value(v)
                    .ok()
                    .and_then(|x| x.as_str().map(String::from))
                    .unwrap_or_default();
                (k.clone(), s(mode))
            })
            .collect();
        let put = self
            .ddb
            .put_item()
            .table_name(&self.names.control)
            .item("id", s(CONTROL_ID))
            .item(
                "trade_execute_enabled",
                AttributeValue::Bool(c.trade_execute_enabled),
            )
            .item("rollout", AttributeValue::M(rollout))
            .item("version", n(c.version as i64))
            .item("body", ddb::body(c)?);
        // Version 0 is "never written" (or written before versions existed).
        let put = if expected_version == 0 {
            put.condition_expression(
                "attribute_not_exists(id) OR attribute_not_exists(version) OR version = :v",
            )
        } else {
            put.condition_expression("version = :v")
        }
        .expression_attribute_values(":v", n(expected_version as i64));
        match put.send().await {
            Ok(_) => Ok(true),
            Err(e) if super::is_condition_failure(&e) => Ok(false),
            Err(e) => Err(unavailable("PutItem control", &e)),
        }
    }
}

#[async_trait]
impl AuditLog for Aws {
    async fn append(&self, rec: &AuditRecord) -> StoreResult<()> {
        self.ddb
            .transact_write_items()
            .transact_items(audit_put(&self.names.audit, rec)?)
            .send()
            .await
            .map_err(|e| unavailable("append audit", &e))?;
        Ok(())
    }

    async fn trail(&self, id: &str) -> StoreResult<Vec<AuditRecord>> {
        let plan_id = match self.get_action(id).await? {
            Some(a) => a.plan_id,
            None => id.to_string(),
        };
        let mut out = Vec::new();
        let mut start = None;
        loop {
            let o = self
                .ddb
                .query()
                .table_name(&self.names.audit)
                .key_condition_expression("plan_id = :p")
                .expression_attribute_values(":p", s(plan_id.clone()))
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| unavailable("Query audit", &e))?;
            for item in o.items.unwrap_or_default() {
                out.push(from_body::<AuditRecord>(&item)?);
            }
            match o.last_evaluated_key {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => return Ok(out),
            }
        }
    }
}

#[async_trait]
impl ReadModelWriter for Aws {
    async fn put_accounts(&self, rows: &[Account]) -> StoreResult<()> {
        let items = rows
            .iter()
            .map(|a| {
                Ok(HashMap::from([
                    ("account_id".to_string(), s(a.account_id.clone())),
                    ("desk".to_string(), s(a.desk.clone())),
                    // Execute's commit checks the account is still active.
                    ("status".to_string(), s(a.status.as_str())),
                    ("body".to_string(), ddb::body(a)?),
                ]))
            })
            .collect::<StoreResult<Vec<Item>>>()?;
        self.batch_put(&self.names.accounts, items).await
    }

    async fn put_positions(&self, rows: &[Position]) -> StoreResult<()> {
        let items = rows
            .iter()
            .map(|p| {
                Ok(HashMap::from([
                    ("account_id".to_string(), s(p.account_id.clone())),
                    ("symbol".to_string(), s(p.symbol.clone())),
                    ("quantity".to_string(), n(p.quantity)),
                    ("body".to_string(), ddb::body(p)?),
                ]))
            })
            .collect::<StoreResult<Vec<Item>>>()?;
        self.batch_put(&self.names.positions, items).await
    }

    async fn put_exposures(&self, rows: &[(String, String, Exposure)]) -> StoreResult<()> {
        let items = rows
            .iter()
            .map(|(account_id, symbol, e)| {
                HashMap::from([
                    ("account_id".to_string(), s(account_id.clone())),
                    ("symbol".to_string(), s(symbol.clone())),
                    ("position".to_string(), n(e.position)),
                    ("open_buy".to_string(), n(e.open_buy)),
                    ("open_sell".to_string(), n(e.open_sell)),
                    ("worst_long".to_string(), n(e.worst_long())),
                    ("worst_short".to_string(), n(e.worst_short())),
                ])
            })
            .collect();
        self.batch_put(&self.names.exposures, items).await
    }

    async fn put_orders(&self, rows: &[Order]) -> StoreResult<()> {
        let mut desks = HashMap::new();
        let mut items = Vec::with_capacity(rows.len());
        for o in rows {
            items.push(HashMap::from([
                ("order_id".to_string(), s(o.order_id.clone())),
                ("account_id".to_string(), s(o.terms.account_id.clone())),
                (
                    "desk".to_string(),
                    s(self.desk_of(&o.terms.account_id, &mut desks).await?),
                ),
                ("status".to_string(), s(o.status.as_str())),
                ("filled_quantity".to_string(), n(o.filled_quantity as i64)),
                (
                    "created_key".to_string(),
                    s(time_key(o.created_at, &o.order_id)),
                ),
                ("body".to_string(), ddb::body(o)?),
            ]));
        }
        self.batch_put(&self.names.orders, items).await
    }

    async fn put_jobs(&self, rows: &[Job]) -> StoreResult<()> {
        let mut desks = HashMap::new();
        let mut items = Vec::with_capacity(rows.len());
        for j in rows {
            let desk = match &j.account_id {
                Some(a) => self.desk_of(a, &mut desks).await?,
                None => NO_DESK.to_string(),
            };
            items.push(HashMap::from([
                ("job_id".to_string(), s(j.job_id.clone())),
                ("desk".to_string(), s(desk)),
                ("kind".to_string(), s(j.kind.as_str())),
                ("status".to_string(), s(j.status.as_str())),
                (
                    "created_key".to_string(),
                    s(time_key(j.created_at, &j.job_id)),
                ),
                ("body".to_string(), ddb::body(j)?),
            ]));
        }
        self.batch_put(&self.names.jobs, items).await
    }
}
