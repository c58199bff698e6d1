//! The approval channel's documents on DynamoDB: the approvals table, keyed by `kind` and
//! `id`, each item with `version`, `expires_at` (millis, compared by every read and
//! condition) and `ttl` (seconds, DynamoDB's lazy deletion).

use super::ddb::{self, from_body, n, opt_n, s, Item};
use super::{unavailable, Aws};
use crate::core::domain::Millis;
use crate::core::error::StoreResult;
use crate::core::ports::{ApprovalStore, Doc, DocKind};
use async_trait::async_trait;
use aws_sdk_dynamodb::types::ReturnValue;

/// Live: no expiry, or an expiry after now.
const LIVE: &str = "(attribute_not_exists(expires_at) OR expires_at > :now)";

fn doc(item: &Item, now: Millis) -> StoreResult<Option<Doc>> {
    let expires_at = opt_n(item, "expires_at");
    if expires_at.is_some_and(|e| e <= now) {
        return Ok(None);
    }
    Ok(Some(Doc {
        body: from_body(item)?,
        version: opt_n(item, "version").unwrap_or(0) as u64,
        expires_at,
    }))
}

#[async_trait]
impl ApprovalStore for Aws {
    async fn get_doc(&self, kind: DocKind, id: &str, now: Millis) -> StoreResult<Option<Doc>> {
        match self
            .get(
                &self.names.approvals,
                &[("kind", s(kind.as_str())), ("id", s(id))],
            )
            .await?
        {
            Some(item) => doc(&item, now),
            None => Ok(None),
        }
    }

    async fn put_doc(
        &self,
        kind: DocKind,
        id: &str,
        d: &Doc,
        expected: u64,
        now: Millis,
    ) -> StoreResult<bool> {
        let mut put = self
            .ddb
            .put_item()
            .table_name(&self.names.approvals)
            .item("kind", s(kind.as_str()))
            .item("id", s(id))
            .item("version", n(d.version as i64))
            .item("body", ddb::body(&d.body)?)
            .expression_attribute_values(":now", n(now));
        if let Some(e) = d.expires_at {
            put = put
                .item("expires_at", n(e))
                .item("ttl", ddb::ttl_seconds(e));
        }
        // Version 0: absent, or expired (an expired item is overwritten as if absent).
        put = if expected == 0 {
            put.condition_expression(format!("attribute_not_exists(id) OR NOT {LIVE}"))
        } else {
            put.condition_expression(format!("version = :v AND {LIVE}"))
                .expression_attribute_values(":v", n(expected as i64))
        };
        match put.send().await {
            Ok(_) => Ok(true),
            Err(e) if super::is_condition_failure(&e) => Ok(false),
            Err(e) => Err(unavailable("PutItem approvals", &e)),
        }
    }

    async fn take_doc(&self, kind: DocKind, id: &str, now: Millis) -> StoreResult<Option<Doc>> {
        let out = self
            .ddb
            .delete_item()
            .table_name(&self.names.approvals)
            .key("kind", s(kind.as_str()))
            .key("id", s(id))
            .condition_expression(format!("attribute_exists(id) AND {LIVE}"))
            .expression_attribute_values(":now", n(now))
            .return_values(ReturnValue::AllOld)
            .send()
            .await;
        match out {
            Ok(o) => match o.attributes {
                Some(item) => doc(&item, now),
                None => Ok(None),
            },
            Err(e) if super::is_condition_failure(&e) => Ok(None),
            Err(e) => Err(unavailable("DeleteItem approvals", &e)),
        }
    }

    async fn list_docs(&self, kind: DocKind, now: Millis) -> StoreResult<Vec<Doc>> {
        let mut out = Vec::new();
        for item in self
            .query_partition(&self.names.approvals, "kind", kind.as_str())
            .await?
        {
            out.extend(doc(&item, now)?);
        }
        Ok(out)
    }
}
