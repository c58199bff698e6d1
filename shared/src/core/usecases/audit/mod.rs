//! The audit trail as evidence: signed checkpoints of the chains' heads, and the
//! verification of every chain, checkpoint and record ([`verify`]).

pub mod verify;

use crate::core::audit_chain::Checkpoint;
use crate::core::domain::{new_id, Millis};
use crate::core::error::StoreResult;
use crate::core::ports::audit::AuditChains;
use crate::core::ports::Signer;

/// Signs and stores a checkpoint of every chain's head as it is now.
pub async fn checkpoint(
    chains: &dyn AuditChains,
    signer: &dyn Signer,
    now: Millis,
) -> StoreResult<Checkpoint> {
    use base64::Engine;
    let heads = chains.heads().await?;
    let mut cp = Checkpoint::new(new_id("ckp", now), now, signer.key_id(), heads);
    let sig = signer.sign(&cp.signed_bytes()?).await?;
    cp.signature = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sig);
    chains.put_checkpoint(&cp).await?;
    Ok(cp)
}
