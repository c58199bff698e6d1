//! Plans on SQLite: the `plans` table; a plan is stored with its audit record.

use super::audit::{append_audit, AuditRow};
use super::packed::{packed_json, Body};
use super::rows::desk_clause;
use super::rows::one_body;
use super::rows::Cached;
use super::rows::{compact_body, fields, full_body, raw, Compact};
use super::{db_err, json_err, Sqlite};
use crate::core::auth::DeskScope;
use crate::core::domain::Millis;
use crate::core::error::StoreResult;
use crate::core::ports::PlanStore;
use crate::core::records::{ApprovalChange, AuditRecord, PlanPosition, PlanRecord, PlanStatus};
use async_trait::async_trait;
use rusqlite::types::Value;
use rusqlite::{params, Connection};

#[async_trait]
impl PlanStore for Sqlite {
    async fn put_plan(&self, plan: &PlanRecord, audit: &AuditRecord) -> StoreResult<()> {
        let (id, status, exp) = (plan.plan_id.clone(), "planned".to_string(), plan.expires_at);
        let awaiting = plan.awaiting_desk().map(String::from);
        let requester = plan.awaiting_requester().map(String::from);
        let (plan, audit) = (Compact::new(plan)?, AuditRow::new(audit)?);
        self.write(move |tx| {
            plan.store(tx)?;
            tx.run(
                "INSERT INTO plans (plan_id, status, expires_at, body, awaiting_desk, \
                 awaiting_requester) VALUES (?, ?, ?, ?, ?, ?)",
                params![id, status, exp, plan.body, awaiting, requester],
            )
            .map_err(db_err)?;
            audit.insert(tx)
        })
        .await
    }

    async fn get_plan(&self, plan_id: &str) -> StoreResult<Option<PlanRecord>> {
        let id = plan_id.to_string();
        self.read(move |c| load_plan(c, &id)).await
    }

    async fn record_approval(
        &self,
        plan_id: &str,
        change: &ApprovalChange,
        audit: &AuditRecord,
        now: Millis,
    ) -> StoreResult<bool> {
        let (id, change, audit) = (plan_id.to_string(), change.clone(), audit.clone());
        self.write(move |tx| {
            let Some(mut plan) = load_plan(tx, &id)? else {
                return Ok(false);
            };
            if plan.status != PlanStatus::Planned
                || plan.approval.is_some()
                || now >= plan.expires_at
                || plan.approvals.len() != change.seen
            {
                return Ok(false);
            }
            if let Some(reason) = change.close {
                plan.status = PlanStatus::Closed;
                plan.closed_reason = Some(reason);
            }
            plan.approvals = change.approvals;
            plan.approval = change.decision;
            let status = if plan.status == PlanStatus::Closed {
                "closed"
            } else {
                "planned"
            };
            let text = compact_body(tx, &plan)?;
            tx.run(
                "UPDATE plans SET status = ?, body = ?, awaiting_desk = ?, \
                 awaiting_requester = ? WHERE plan_id = ?",
                params![
                    status,
                    text,
                    plan.awaiting_desk(),
                    plan.awaiting_requester(),
                    id
                ],
            )
            .map_err(db_err)?;
            append_audit(tx, &audit)?;
            Ok(true)
        })
        .await
    }

    async fn list_awaiting_by_requester(
        &self,
        requester: &str,
        now: Millis,
        before: Option<&PlanPosition>,
        limit: u32,
    ) -> StoreResult<Vec<PlanRecord>> {
        let args = vec![Value::Text(requester.to_string())];
        self.awaiting("awaiting_requester = ?", args, now, before, limit)
            .await
    }

    async fn list_awaiting_four_eyes(
        &self,
        desks: &DeskScope,
        now: Millis,
        before: Option<&PlanPosition>,
        limit: u32,
    ) -> StoreResult<Vec<PlanRecord>> {
        let mut args = Vec::new();
        let clause = format!(
            "awaiting_desk IS NOT NULL AND {}",
            desk_clause(desks, "awaiting_desk", &mut args)
        );
        self.awaiting(&clause, args, now, before, limit).await
    }
}

impl Sqlite {
    /// Awaiting plans matching `clause`, unexpired, newest (latest expiry) first.
    async fn awaiting(
        &self,
        clause: &str,
        mut args: Vec<Value>,
        now: Millis,
        before: Option<&PlanPosition>,
        limit: u32,
    ) -> StoreResult<Vec<PlanRecord>> {
        args.push(Value::Integer(now));
        let mut sql = format!("SELECT body FROM plans WHERE {clause} AND expires_at > ?");
        if let Some((at, id)) = before {
            sql.push_str(" AND (expires_at < ? OR (expires_at = ? AND plan_id < ?))");
            args.extend([
                Value::Integer(*at),
                Value::Integer(*at),
                Value::Text(id.clone()),
            ]);
        }
        sql.push_str(" ORDER BY expires_at DESC, plan_id DESC");
        sql.push_str(&super::rows::limit(limit));
        self.read(move |c| {
            let mut st = c.prepare_cached(&sql).map_err(db_err)?;
            let rows = st
                .query_map(rusqlite::params_from_iter(args), |r| r.get::<_, Body>(0))
                .map_err(db_err)?;
            let mut out = Vec::new();
            for r in rows {
                out.push(full_body(c, &r.map_err(db_err)?.0)?);
            }
            Ok(out)
        })
        .await
    }
}

pub(super) fn load_plan(c: &Connection, plan_id: &str) -> StoreResult<Option<PlanRecord>> {
    one_body(c, "SELECT body FROM plans WHERE plan_id = ?", &[&plan_id])?
        .map(|t| full_body(c, &t))
        .transpose()
}

/// Sets a plan's status and one more top-level field of its stored body (the execute
/// commit's plan change), inside the caller's transaction. False when the plan is gone.
pub(super) fn set_plan_fields(
    tx: &Connection,
    plan_id: &str,
    status: &str,
    field: &str,
    value: &str,
) -> StoreResult<bool> {
    let Some(text) = one_body(tx, "SELECT body FROM plans WHERE plan_id = ?", &[&plan_id])? else {
        return Ok(false);
    };
    let mut top = fields(&text)?;
    let (status_text, value_text) = (
        raw(serde_json::to_string(status).map_err(json_err)?)?,
        raw(serde_json::to_string(value).map_err(json_err)?)?,
    );
    top.insert("status".into(), &status_text);
    top.insert(field.into(), &value_text);
    let body = packed_json(&top)?;
    let changed = tx
        .run(
            "UPDATE plans SET status = ?, body = ?, awaiting_desk = NULL, \
             awaiting_requester = NULL WHERE plan_id = ?",
            params![status, body, plan_id],
        )
        .map_err(db_err)?;
    Ok(changed == 1)
}
