//! The audit trail as evidence: chain heads, every stored record with its link, and the
//! signed checkpoints. Appending stays with the writes that audit ([`super::AuditLog`],
//! [`super::PlanStore::put_plan`], execute's commit, ...): each adapter links the record to
//! its chain's head inside the same atomic write ([`crate::core::audit_chain`]).

use async_trait::async_trait;

use crate::core::audit_chain::{ChainHead, ChainLink, Checkpoint};
use crate::core::error::StoreResult;

/// A record as stored: its body (the record's JSON, the content its hash covers), its link
/// (`None`: a record stored without one) and where it is (a row or item key, for reports).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredAudit {
    pub location: String,
    pub body: serde_json::Value,
    pub link: Option<ChainLink>,
}

/// One page of the stored records and where the next begins (`None`: the last page).
pub type AuditPage = (Vec<StoredAudit>, Option<String>);

#[async_trait]
pub trait AuditChains: Send + Sync {
    /// Every chain's head, by chain.
    async fn heads(&self) -> StoreResult<Vec<ChainHead>>;
    /// A page of every stored audit record, in storage order (not chain order), after
    /// `after` (a position an earlier page returned).
    async fn records(&self, after: Option<String>, limit: u32) -> StoreResult<AuditPage>;
    /// Stores a signed checkpoint.
    async fn put_checkpoint(&self, cp: &Checkpoint) -> StoreResult<()>;
    /// Every stored checkpoint, oldest first. One that does not parse is an error naming it.
    async fn checkpoints(&self) -> StoreResult<Vec<Checkpoint>>;
}
