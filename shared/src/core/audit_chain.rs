//! The audit trail's proof: every audit record is a link of a hash chain, and signed
//! checkpoints pin the chains' heads. One place for the canonical form and every hash, so
//! both stores only keep the fields and check the head's sequence number.
//!
//! - A record's **content hash** is the SHA-256 of its canonical form ([`canonical`]: its
//!   JSON with object keys sorted by their UTF-8 bytes, no white space).
//! - Records are chained per **operator** (`operator:<operator_id>`, [`chain_of`]): every
//!   record names one, and execute's atomic write already holds the operator's rate
//!   record, so the chain head adds no new point where writes wait on each other.
//! - A record's **link** is its chain, its sequence number there (1, 2, ...), the previous
//!   record's hash ([`GENESIS`] for the first) and its own hash, [`link_hash`]: SHA-256 of
//!   `airlock.audit.v1`, chain, sequence, previous hash and content hash, one per line.
//! - A **checkpoint** ([`Checkpoint`]) lists every chain's head (sequence and hash) and the
//!   count of records, at a time, signed with ECDSA P-256 (SHA-256) by a key of its own.

use serde::{Deserialize, Serialize};

use crate::core::digest::sha256_hex;
use crate::core::domain::Millis;
use crate::core::error::{StoreError, StoreResult};
use crate::core::records::AuditRecord;

/// The previous hash of a chain's first record.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The first line of every link hash's input: the version of this format.
pub const LINK_DOMAIN: &str = "airlock.audit.v1";

/// The `format` of a checkpoint.
pub const CHECKPOINT_FORMAT: &str = "airlock.audit.checkpoint.v1";

/// The chain a record belongs to: its operator's.
pub fn chain_of(rec: &AuditRecord) -> String {
    operator_chain(&rec.operator_id)
}

/// The chain of an operator's records.
pub fn operator_chain(operator_id: &str) -> String {
    format!("operator:{operator_id}")
}

/// The canonical form of a JSON value: object keys sorted by their UTF-8 bytes, no white
/// space, strings and numbers as serde_json writes them.
pub fn canonical(v: &serde_json::Value) -> String {
    let mut out = String::new();
    write_canonical(v, &mut out);
    out
}

fn write_canonical(v: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                if let Some(x) = m.get(k) {
                    write_canonical(x, out);
                }
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(x, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// The content hash of a stored record's JSON.
pub fn content_hash_of(v: &serde_json::Value) -> String {
    sha256_hex(canonical(v).as_bytes())
}

/// The content hash of a record about to be stored.
pub fn content_hash(rec: &AuditRecord) -> StoreResult<String> {
    let v = serde_json::to_value(rec)
        .map_err(|e| StoreError::Corrupt(format!("encoding an audit record: {e}")))?;
    Ok(content_hash_of(&v))
}

/// The hash of the link at `seq` of `chain`.
pub fn link_hash(chain: &str, seq: u64, prev_hash: &str, content_hash: &str) -> String {
    sha256_hex(format!("{LINK_DOMAIN}\n{chain}\n{seq}\n{prev_hash}\n{content_hash}").as_bytes())
}

/// A chain's last record: its sequence number and hash (and when it was written).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainHead {
    pub chain: String,
    pub seq: u64,
    pub hash: String,
}

/// Where a record sits in its chain, stored with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainLink {
    pub chain: String,
    pub seq: u64,
    pub prev_hash: String,
    pub hash: String,
}

impl ChainLink {
    /// The link of a record of `content_hash` after `head` (`None`: the chain's first).
    pub fn next(chain: &str, head: Option<&ChainHead>, content_hash: &str) -> ChainLink {
        let (seq, prev) = match head {
            Some(h) => (h.seq + 1, h.hash.clone()),
            None => (1, GENESIS.to_string()),
        };
        ChainLink {
            chain: chain.to_string(),
            seq,
            hash: link_hash(chain, seq, &prev, content_hash),
            prev_hash: prev,
        }
    }

    /// The chain's head once this record is stored.
    pub fn head(&self) -> ChainHead {
        ChainHead {
            chain: self.chain.clone(),
            seq: self.seq,
            hash: self.hash.clone(),
        }
    }

    /// Whether this link holds for a record of `content_hash`.
    pub fn holds_for(&self, content_hash: &str) -> bool {
        link_hash(&self.chain, self.seq, &self.prev_hash, content_hash) == self.hash
    }
}

/// A signed statement of every chain's head at a time. The signature covers the canonical
/// form of every other field ([`Checkpoint::signed_bytes`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub format: String,
    pub checkpoint_id: String,
    /// When it was taken (milliseconds since the epoch).
    pub at: Millis,
    /// The signing key (a KMS key ARN, or `local-audit-1`).
    pub key_id: String,
    /// Records in all chains: the sum of the heads' sequence numbers.
    pub records: u64,
    /// Every chain's head, by chain name.
    pub chains: Vec<ChainHead>,
    /// ECDSA P-256 over SHA-256 of [`Checkpoint::signed_bytes`]: `r || s`, base64url
    /// without padding (as a JWS ES256 signature). Empty before signing.
    #[serde(default)]
    pub signature: String,
}

impl Checkpoint {
    /// An unsigned checkpoint of these heads.
    pub fn new(id: String, at: Millis, key_id: &str, mut chains: Vec<ChainHead>) -> Checkpoint {
        chains.sort_by(|a, b| a.chain.cmp(&b.chain));
        Checkpoint {
            format: CHECKPOINT_FORMAT.into(),
            checkpoint_id: id,
            at,
            key_id: key_id.into(),
            records: chains.iter().map(|c| c.seq).sum(),
            chains,
            signature: String::new(),
        }
    }

    /// What the signature signs: the canonical form of the checkpoint without `signature`.
    pub fn signed_bytes(&self) -> StoreResult<Vec<u8>> {
        let mut v = serde_json::to_value(self)
            .map_err(|e| StoreError::Corrupt(format!("encoding a checkpoint: {e}")))?;
        if let Some(m) = v.as_object_mut() {
            m.remove("signature");
        }
        Ok(canonical(&v).into_bytes())
    }

    /// Checks the signature with the audit key's public key.
    pub fn verify(&self, key: &p256::PublicKey) -> Result<(), String> {
        use base64::Engine;
        use p256::ecdsa::signature::Verifier;
        if self.format != CHECKPOINT_FORMAT {
            return Err(format!("unknown format {:?}", self.format));
        }
        let sig = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(&self.signature)
            .map_err(|_| "the signature is not base64url".to_string())?;
        let sig = p256::ecdsa::Signature::from_slice(&sig)
            .map_err(|_| "the signature is not a P-256 r || s pair".to_string())?;
        let msg = self.signed_bytes().map_err(|e| e.to_string())?;
        if self.records != self.chains.iter().map(|c| c.seq).sum::<u64>() {
            return Err("its record count is not the sum of its heads".into());
        }
        p256::ecdsa::VerifyingKey::from(key)
            .verify(&msg, &sig)
            .map_err(|_| "the signature does not verify with the audit key".to_string())
    }

    /// The head it states for `chain`.
    pub fn head(&self, chain: &str) -> Option<&ChainHead> {
        self.chains.iter().find(|c| c.chain == chain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_canonical_form_sorts_keys_at_every_level_and_has_no_space() {
        let v = serde_json::json!({"b": 1, "a": {"z": [true, null, "x\"y"], "c": -2.5}});
        assert_eq!(
            canonical(&v),
            r#"{"a":{"c":-2.5,"z":[true,null,"x\"y"]},"b":1}"#
        );
        // The same content parsed from text in another order hashes the same.
        let w: serde_json::Value =
            serde_json::from_str(r#"{ "a": { "z": [true, null, "x\"y"], "c": -2.5 }, "b": 1 }"#)
                .unwrap();
        assert_eq!(content_hash_of(&v), content_hash_of(&w));
    }

    #[test]
    fn links_chain_and_any_change_breaks_them() {
        let first = ChainLink::next("operator:a", None, "c1");
        assert_eq!((first.seq, first.prev_hash.as_str()), (1, GENESIS));
        let second = ChainLink::next("operator:a", Some(&first.head()), "c2");
        assert_eq!(second.seq, 2);
        assert_eq!(second.prev_hash, first.hash);
        assert!(second.holds_for("c2"));
        assert!(!second.holds_for("c1"));
        // The chain and the position are part of the hash: a link moved breaks.
        let moved = ChainLink {
            seq: 3,
            ..second.clone()
        };
        assert!(!moved.holds_for("c2"));
        let other = ChainLink {
            chain: "operator:b".into(),
            ..second.clone()
        };
        assert!(!other.holds_for("c2"));
        // A fixed vector: the format is public (docs/CONTRACT.md, Audit trail).
        assert_eq!(
            link_hash("operator:a", 1, GENESIS, "c1"),
            sha256_hex(format!("airlock.audit.v1\noperator:a\n1\n{GENESIS}\nc1").as_bytes())
        );
    }

    #[test]
    fn a_checkpoint_verifies_only_as_signed() {
        use base64::Engine;
        use p256::ecdsa::signature::Signer;
        let sk = p256::ecdsa::SigningKey::random(&mut rand::rngs::OsRng);
        let heads = vec![
            ChainHead {
                chain: "operator:b".into(),
                seq: 2,
                hash: "h2".into(),
            },
            ChainHead {
                chain: "operator:a".into(),
                seq: 5,
                hash: "h5".into(),
            },
        ];
        let mut cp = Checkpoint::new("ckp_1".into(), 1_000, "local-audit-1", heads);
        assert_eq!(cp.records, 7);
        assert_eq!(cp.chains[0].chain, "operator:a");
        let sig: p256::ecdsa::Signature = sk.sign(&cp.signed_bytes().unwrap());
        cp.signature = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sig.to_bytes());
        let pk = p256::PublicKey::from(sk.verifying_key());
        assert_eq!(cp.verify(&pk), Ok(()));
        let mut forged = cp.clone();
        forged.chains[0].seq = 4;
        forged.records = 6;
        assert!(forged.verify(&pk).is_err());
        let other = p256::ecdsa::SigningKey::random(&mut rand::rngs::OsRng);
        assert!(cp
            .verify(&p256::PublicKey::from(other.verifying_key()))
            .is_err());
    }
}
