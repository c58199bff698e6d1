//! Plans on SQLite: the `plans` table; a plan is stored with its audit record.

use super::audit::append_audit;
use super::rows::one_body;
use super::{db_err, json_err, Sqlite};
use crate::error::StoreResult;
use crate::ports::PlanStore;
use crate::records::{AuditRecord, PlanRecord};
use async_trait::async_trait;
use rusqlite::{params, Connection};

#[async_trait]
impl PlanStore for Sqlite {
    async fn put_plan(&self, plan: &PlanRecord, audit: &AuditRecord) -> StoreResult<()> {
        let plan_body = serde_json::to_string(plan).map_err(json_err)?;
        let (id, status, exp) = (plan.plan_id.clone(), "planned".to_string(), plan.expires_at);
        let audit = audit.clone();
        self.write(move |tx| {
            tx.execute(
                "INSERT INTO plans (plan_id, status, expires_at, body) VALUES (?, ?, ?, ?)",
                params![id, status, exp, plan_body],
            )
            .map_err(db_err)?;
            append_audit(tx, &audit)
        })
        .await
    }

    async fn get_plan(&self, plan_id: &str) -> StoreResult<Option<PlanRecord>> {
        let id = plan_id.to_string();
        self.read(move |c| load_plan(c, &id)).await
    }
}

pub(super) fn load_plan(c: &Connection, plan_id: &str) -> StoreResult<Option<PlanRecord>> {
    one_body(c, "SELECT body FROM plans WHERE plan_id = ?", &[&plan_id])?
        .map(|t| serde_json::from_str(&t).map_err(json_err))
        .transpose()
}
