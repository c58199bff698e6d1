//! The paper broker's documents on DynamoDB: versioned JSON, saved at the version read.

use super::ddb::{self, n, s};
use super::tables::built;
use super::{is_condition_failure, unavailable, Aws};
use crate::core::error::{StoreError, StoreResult};
use crate::core::ports::{PaperBookStore, PaperDoc};
use async_trait::async_trait;
use aws_sdk_dynamodb::types::{Put, TransactWriteItem};

#[async_trait]
impl PaperBookStore for Aws {
    async fn load(&self, key: &str) -> StoreResult<(Option<serde_json::Value>, u64)> {
        match self
            .get(&self.names.paper_broker, &[("key", s(key))])
            .await?
        {
            None => Ok((None, 0)),
            Some(item) => {
                let doc = serde_json::from_str(ddb::get_s(&item, "doc")?)
                    .map_err(|e| StoreError::Corrupt(format!("paper book: {e}")))?;
                Ok((Some(doc), ddb::opt_n(&item, "version").unwrap_or(0) as u64))
            }
        }
    }

    async fn save(
        &self,
        key: &str,
        doc: &serde_json::Value,
        expected_version: u64,
    ) -> StoreResult<bool> {
        let put = self
            .ddb
            .put_item()
            .table_name(&self.names.paper_broker)
            .item("key", s(key))
            .item("version", n(expected_version as i64 + 1))
            .item("doc", s(doc.to_string()));
        let put = if expected_version == 0 {
            put.condition_expression("attribute_not_exists(#k)")
                .expression_attribute_names("#k", "key")
        } else {
            put.condition_expression("version = :v")
                .expression_attribute_values(":v", n(expected_version as i64))
        };
        match put.send().await {
            Ok(_) => Ok(true),
            Err(e) if is_condition_failure(&e) => Ok(false),
            Err(e) => Err(unavailable("PutItem paper book", &e)),
        }
    }

    async fn save_all(&self, docs: &[PaperDoc]) -> StoreResult<bool> {
        if let [d] = docs {
            return self.save(&d.key, &d.doc, d.expected_version).await;
        }
        let mut items = Vec::with_capacity(docs.len());
        for d in docs {
            let put = Put::builder()
                .table_name(&self.names.paper_broker)
                .item("key", s(d.key.clone()))
                .item("version", n(d.expected_version as i64 + 1))
                .item("doc", s(d.doc.to_string()));
            let put = if d.expected_version == 0 {
                put.condition_expression("attribute_not_exists(#k)")
                    .expression_attribute_names("#k", "key")
            } else {
                put.condition_expression("version = :v")
                    .expression_attribute_values(":v", n(d.expected_version as i64))
            };
            items.push(
                TransactWriteItem::builder()
                    .put(built(put.build())?)
                    .build(),
            );
        }
        self.transact_if(&items, "paper book").await
    }

    async fn list(&self, prefix: &str) -> StoreResult<Vec<serde_json::Value>> {
        self.scan_where(&self.names.paper_broker, Some(("key", prefix)))
            .await?
            .iter()
            .map(|item| {
                serde_json::from_str(ddb::get_s(item, "doc")?)
                    .map_err(|e| StoreError::Corrupt(format!("paper book: {e}")))
            })
            .collect()
    }
}
