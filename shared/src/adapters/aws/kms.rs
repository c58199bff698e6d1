//! Confirmation-token signing with KMS: `Sign` with an `ECC_NIST_P256` key
//! (`ECDSA_SHA_256`), the DER signature converted to the JWS `r || s` form. The public key
//! is fetched on first use (`GetPublicKey`, once per instance, only by functions that
//! verify: execute, unless `AIRLOCK_CONFIRMATION_PUBLIC_KEY` gives it, and mcp); verification
//! never calls KMS again.

use async_trait::async_trait;
use aws_sdk_kms::primitives::Blob;
use aws_sdk_kms::types::{MessageType, SigningAlgorithmSpec};
use p256::pkcs8::DecodePublicKey;

use super::unavailable;
use crate::core::error::{StoreError, StoreResult};
use crate::core::ports::Signer;

pub struct KmsSigner {
    client: aws_sdk_kms::Client,
    /// The key as configured (the template passes its ARN): the JWS `kid`.
    key_id: String,
    public: tokio::sync::OnceCell<p256::PublicKey>,
}

impl KmsSigner {
    /// A signer for `key` (id, ARN or alias). Makes no call: nothing is fetched until a
    /// token is signed or verified.
    pub fn new(client: aws_sdk_kms::Client, key: &str) -> KmsSigner {
        KmsSigner {
            client,
            key_id: key.to_string(),
            public: tokio::sync::OnceCell::new(),
        }
    }

    async fn fetch_public_key(&self) -> StoreResult<p256::PublicKey> {
        let out = self
            .client
            .get_public_key()
            .key_id(&self.key_id)
            .send()
            .await
            .map_err(|e| unavailable("KMS GetPublicKey", &e))?;
        let der = out.public_key().ok_or_else(|| {
            StoreError::Unavailable("KMS GetPublicKey returned no public key".into())
        })?;
        p256::PublicKey::from_public_key_der(der.as_ref()).map_err(|e| {
            StoreError::Corrupt(format!("the KMS key is not an ECC_NIST_P256 key: {e}"))
        })
    }
}

#[async_trait]
impl Signer for KmsSigner {
    fn key_id(&self) -> &str {
        &self.key_id
    }

    async fn public_key(&self) -> StoreResult<p256::PublicKey> {
        self.public
            .get_or_try_init(|| self.fetch_public_key())
            .await
            .copied()
    }

    async fn sign(&self, message: &[u8]) -> StoreResult<[u8; 64]> {
        let out = self
            .client
            .sign()
            .key_id(&self.key_id)
            .message(Blob::new(message))
            .message_type(MessageType::Raw)
            .signing_algorithm(SigningAlgorithmSpec::EcdsaSha256)
            .send()
            .await
            .map_err(|e| unavailable("KMS Sign", &e))?;
        let der = out
            .signature()
            .ok_or_else(|| StoreError::Unavailable("KMS Sign returned no signature".into()))?;
        let sig = p256::ecdsa::Signature::from_der(der.as_ref())
            .map_err(|e| StoreError::Unavailable(format!("KMS signature is not DER ECDSA: {e}")))?;
        let mut out = [0u8; 64];
        out.copy_from_slice(&sig.to_bytes());
        Ok(out)
    }
}
