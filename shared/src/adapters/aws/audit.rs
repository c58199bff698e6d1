//! The audit log on DynamoDB: append-only records, read back as an id's trail. Each record
//! is linked to its chain's head ([`crate::core::audit_chain`]) in the same transaction as
//! the write it audits: the record's put, and the head's put on the audit-chains table
//! under the condition that the head is still the one read. A transaction cancelled only
//! by that condition, or only by transaction conflicts, is linked again to the new head and
//! sent again; so concurrent writers of one chain never fork it nor lose a record.

use super::ddb::{self, from_body, get_s, n, opt_n, opt_s, s, time_key, Item};
use super::tables::{conflict_backoff_ceiling_ms, NO_DESK};
use super::{unavailable, Aws};
use crate::core::audit_chain::{self, ChainHead, ChainLink, Checkpoint};
use crate::core::error::{StoreError, StoreResult};
use crate::core::ports::audit::{AuditChains, AuditPage, StoredAudit};
use crate::core::ports::{ActionStore, AuditLog};
use crate::core::records::AuditRecord;
use async_trait::async_trait;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{Put, TransactWriteItem};
use std::collections::HashMap;

/// The audit table's partition of the signed checkpoints (no plan id starts with `#`).
pub(super) const CHECKPOINTS_PARTITION: &str = "#checkpoint";

/// How long a chained write keeps linking again after losing its chain's head to another
/// writer (each loss is another writer's commit: the chain progresses), before it fails as
/// unavailable (retryable); and the resends it gets however slow the store is.
const CHAIN_BUDGET_MS: u64 = 8_000;
const CHAIN_MIN_RESENDS: u32 = 8;

/// Chain heads known to this process, by chain.
#[derive(Clone, Default)]
pub(crate) struct Heads(std::sync::Arc<std::sync::Mutex<HashMap<String, ChainHead>>>);

impl Heads {
    fn get(&self, chain: &str) -> Option<ChainHead> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(chain)
            .cloned()
    }

    /// Keeps `h` unless a later head of its chain is known.
    pub(super) fn keep(&self, h: ChainHead) {
        let mut m = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if m.get(&h.chain).is_none_or(|k| k.seq <= h.seq) {
            m.insert(h.chain.clone(), h);
        }
    }
}

/// The audit-chains item of a head, as read with other items (execute's snapshot).
pub(super) fn head_of_item(item: &Item) -> StoreResult<ChainHead> {
    head_from_item(item)
}

type TransactError = SdkError<TransactWriteItemsError, aws_smithy_runtime_api::http::Response>;

fn audit_item(a: &AuditRecord, link: &ChainLink) -> StoreResult<Item> {
    Ok(HashMap::from([
        (
            "plan_id".to_string(),
            s(a.plan_id.clone().unwrap_or_else(|| NO_DESK.into())),
        ),
        ("seq".to_string(), s(time_key(a.at, &a.audit_id))),
        ("at".to_string(), n(a.at)),
        ("body".to_string(), ddb::body(a)?),
        ("chain".to_string(), s(link.chain.clone())),
        ("chain_seq".to_string(), n(link.seq as i64)),
        ("prev_hash".to_string(), s(link.prev_hash.clone())),
        ("hash".to_string(), s(link.hash.clone())),
    ]))
}

/// Appends never overwrite: a record's sort key is its time and unique id.
const APPEND_ONLY: &str = "attribute_not_exists(seq)";

fn put(p: aws_sdk_dynamodb::types::builders::PutBuilder) -> StoreResult<TransactWriteItem> {
    let p = p.build().map_err(|e| StoreError::Corrupt(e.to_string()))?;
    Ok(TransactWriteItem::builder().put(p).build())
}

/// The client request token of resend `attempt`: the caller's for the first send; another
/// one, derived from it, for a send whose items changed (DynamoDB refuses a token reused
/// with other items).
fn attempt_token(token: Option<&str>, attempt: u32) -> Option<String> {
    let t = token?;
    if attempt == 0 {
        return Some(t.to_string());
    }
    Some(crate::core::digest::sha256_hex(format!("{t}#{attempt}").as_bytes())[..32].to_string())
}

/// Whether a cancellation is only the chain head's (its condition failed: another writer
/// moved it) or only transaction conflicts: linking again and resending can succeed.
fn lost_the_head(e: &TransactError, head_index: usize, conflicts: bool) -> bool {
    let SdkError::ServiceError(se) = e else {
        return false;
    };
    let TransactWriteItemsError::TransactionCanceledException(tc) = se.err() else {
        return false;
    };
    let reasons = tc.cancellation_reasons();
    let failed: Vec<(usize, &str)> = reasons
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.code().map(|c| (i, c)))
        .filter(|(_, c)| *c != "None")
        .collect();
    let head_lost = failed
        .iter()
        .any(|(i, c)| *i == head_index && *c == "ConditionalCheckFailed");
    !failed.is_empty()
        && (head_lost || conflicts)
        && failed.iter().all(|(i, c)| {
            *c == "TransactionConflict" || (*i == head_index && *c == "ConditionalCheckFailed")
        })
}

impl Aws {
    async fn chain_head(&self, chain: &str) -> StoreResult<Option<ChainHead>> {
        let Some(item) = self
            .get(&self.names.audit_chains, &[("chain", s(chain))])
            .await?
        else {
            return Ok(None);
        };
        Ok(Some(head_from_item(&item)?))
    }

    /// The record's put and its chain head's conditional put, linked after `head`; and the
    /// head once they are written.
    fn linked(
        &self,
        a: &AuditRecord,
        chain: &str,
        content: &str,
        head: Option<&ChainHead>,
    ) -> StoreResult<([TransactWriteItem; 2], ChainHead)> {
        let link = ChainLink::next(chain, head, content);
        let record = put(Put::builder()
            .table_name(&self.names.audit)
            .set_item(Some(audit_item(a, &link)?))
            .condition_expression(APPEND_ONLY))?;
        let mut head_put = Put::builder()
            .table_name(&self.names.audit_chains)
            .item("chain", s(chain))
            .item("seq", n(link.seq as i64))
            .item("hash", s(link.hash.clone()))
            .item("at", n(a.at));
        head_put = match head {
            None => head_put.condition_expression("attribute_not_exists(chain)"),
            Some(h) => head_put
                .condition_expression("seq = :prev")
                .expression_attribute_values(":prev", n(h.seq as i64)),
        };
        Ok(([record, put(head_put)?], link.head()))
    }

    /// Sends `base` with the audit record linked to its chain (its two items last), from
    /// the head this process knows (else read), reading the head again and resending while
    /// the only failure is the head's condition, or (`retry_conflicts`) a transaction
    /// conflict. `Ok(Err(e))`: the last send failed otherwise (a condition of `base`, whose
    /// item indexes are as given); the caller classifies `e`.
    pub(super) async fn transact_audited(
        &self,
        base: &[TransactWriteItem],
        a: &AuditRecord,
        token: Option<&str>,
        retry_conflicts: bool,
        what: &str,
    ) -> StoreResult<Result<(), TransactError>> {
        let chain = audit_chain::chain_of(a);
        let content = audit_chain::content_hash(a)?;
        let mut attempt = 0u32;
        let started = tokio::time::Instant::now();
        let mut head = match self.heads.get(&chain) {
            Some(h) => Some(h),
            None => self.chain_head(&chain).await?,
        };
        loop {
            let mut items = base.to_vec();
            let (audit_items, next) = self.linked(a, &chain, &content, head.as_ref())?;
            items.extend(audit_items);
            let head_index = items.len() - 1;
            let sent = self
                .ddb
                .transact_write_items()
                .set_transact_items(Some(items))
                .set_client_request_token(attempt_token(token, attempt))
                .send()
                .await;
            let e = match sent {
                Ok(_) => {
                    self.heads.keep(next);
                    return Ok(Ok(()));
                }
                Err(e) if lost_the_head(&e, head_index, retry_conflicts) => e,
                Err(e) => return Ok(Err(e)),
            };
            attempt += 1;
            if attempt > CHAIN_MIN_RESENDS
                && started.elapsed() > std::time::Duration::from_millis(CHAIN_BUDGET_MS)
            {
                tracing::warn!(what, attempts = attempt, chain, "audit chain kept moving");
                return Err(unavailable(
                    &format!("TransactWriteItems {what}: the audit chain {chain} kept moving"),
                    &e,
                ));
            }
            let pause = {
                use rand::Rng;
                rand::thread_rng().gen_range(0..=conflict_backoff_ceiling_ms(attempt))
            };
            tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
            head = self.chain_head(&chain).await?;
        }
    }
}

fn head_from_item(item: &Item) -> StoreResult<ChainHead> {
    Ok(ChainHead {
        chain: get_s(item, "chain")?.to_string(),
        seq: opt_n(item, "seq")
            .ok_or_else(|| StoreError::Corrupt("an audit chain head without seq".into()))?
            .max(0) as u64,
        hash: get_s(item, "hash")?.to_string(),
    })
}

#[async_trait]
impl AuditLog for Aws {
    async fn append(&self, rec: &AuditRecord) -> StoreResult<()> {
        self.transact_audited(&[], rec, None, true, "audit")
            .await?
            .map_err(|e| unavailable("TransactWriteItems audit", &e))
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

/// A stored body as JSON; one that does not parse stays a string (its hash then fails).
fn stored_json(text: String) -> serde_json::Value {
    serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text))
}

/// A scan position as text: the last item's key (plan id and sort key), JSON.
fn position(key: &Item) -> StoreResult<String> {
    let p = get_s(key, "plan_id")?;
    let q = get_s(key, "seq")?;
    serde_json::to_string(&[p, q]).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn start_key(p: &str) -> StoreResult<Item> {
    let [plan_id, seq]: [String; 2] = serde_json::from_str(p)
        .map_err(|_| StoreError::Corrupt(format!("audit position {p:?}")))?;
    Ok(HashMap::from([
        ("plan_id".to_string(), s(plan_id)),
        ("seq".to_string(), s(seq)),
    ]))
}

#[async_trait]
impl AuditChains for Aws {
    async fn heads(&self) -> StoreResult<Vec<ChainHead>> {
        let mut v = self
            .scan_all(&self.names.audit_chains)
            .await?
            .iter()
            .map(head_from_item)
            .collect::<StoreResult<Vec<_>>>()?;
        v.sort_by(|a, b| a.chain.cmp(&b.chain));
        Ok(v)
    }

    async fn records(&self, after: Option<String>, limit: u32) -> StoreResult<AuditPage> {
        let start = after.as_deref().map(start_key).transpose()?;
        let o = self
            .ddb
            .scan()
            .table_name(&self.names.audit)
            .consistent_read(true)
            .limit(limit as i32)
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(|e| unavailable("Scan audit", &e))?;
        let mut out = Vec::new();
        for item in o.items.unwrap_or_default() {
            let plan_id = get_s(&item, "plan_id")?;
            if plan_id == CHECKPOINTS_PARTITION {
                continue;
            }
            let location = format!(
                "audit item ({plan_id}, {})",
                opt_s(&item, "seq").unwrap_or_default()
            );
            let body = stored_json(opt_s(&item, "body").unwrap_or_default());
            let link = match (
                opt_s(&item, "chain"),
                opt_n(&item, "chain_seq"),
                opt_s(&item, "prev_hash"),
                opt_s(&item, "hash"),
            ) {
                (Some(chain), Some(seq), Some(prev_hash), Some(hash)) => Some(ChainLink {
                    chain,
                    seq: seq.max(0) as u64,
                    prev_hash,
                    hash,
                }),
                _ => None,
            };
            out.push(StoredAudit {
                location,
                body,
                link,
            });
        }
        let next = match o.last_evaluated_key {
            Some(k) if !k.is_empty() => Some(position(&k)?),
            _ => None,
        };
        Ok((out, next))
    }

    async fn put_checkpoint(&self, cp: &Checkpoint) -> StoreResult<()> {
        self.ddb
            .put_item()
            .table_name(&self.names.audit)
            .item("plan_id", s(CHECKPOINTS_PARTITION))
            .item("seq", s(time_key(cp.at, &cp.checkpoint_id)))
            .item("at", n(cp.at))
            .item("body", ddb::body(cp)?)
            .condition_expression(APPEND_ONLY)
            .send()
            .await
            .map_err(|e| unavailable("PutItem checkpoint", &e))?;
        Ok(())
    }

    async fn checkpoints(&self) -> StoreResult<Vec<Checkpoint>> {
        let mut out = Vec::new();
        let mut start = None;
        loop {
            let o = self
                .ddb
                .query()
                .table_name(&self.names.audit)
                .key_condition_expression("plan_id = :p")
                .expression_attribute_values(":p", s(CHECKPOINTS_PARTITION))
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| unavailable("Query checkpoints", &e))?;
            for item in o.items.unwrap_or_default() {
                let cp = from_body::<Checkpoint>(&item).map_err(|e| {
                    StoreError::Corrupt(format!(
                        "checkpoint {} does not parse: {e}",
                        opt_s(&item, "seq").unwrap_or_default()
                    ))
                })?;
                out.push(cp);
            }
            match o.last_evaluated_key {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => return Ok(out),
            }
        }
    }
}
