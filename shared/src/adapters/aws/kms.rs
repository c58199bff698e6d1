//! Confirmation-token signing with KMS: `Sign` with an `ECC_NIST_P256` key
//! (`ECDSA_SHA_256`), the DER signature converted to the JWS `r || s` form. The public key
//! is fetched once per cold start (`GetPublicKey`); verification never calls KMS.

use async_trait::async_trait;
use aws_sdk_kms::primitives::Blob;
use aws_sdk_kms::types::{MessageType, SigningAlgorithmSpec};
use p256::pkcs8::DecodePublicKey;

use super::unavailable;
use crate::error::{StoreError, StoreResult};
use crate::ports::Signer;

pub struct KmsSigner {
    client: aws_sdk_kms::Client,
    /// The key's ARN: the JWS `kid`.
    key_id: String,
    public: p256::PublicKey,
}

impl KmsSigner {
    /// Resolves the key (id, ARN or alias) and fetches its public key once.
    pub async fn connect(client: aws_sdk_kms::Client, key: &str) -> Result<KmsSigner, String> {
        let out = client
            .get_public_key()
            .key_id(key)
            .send()
            .await
            .map_err(|e| format!("KMS GetPublicKey {key}: {}", super::aws_error(&e)))?;
        let der = out
            .public_key()
            .ok_or_else(|| format!("KMS key {key} returned no public key"))?;
        let public = p256::PublicKey::from_public_key_der(der.as_ref())
            .map_err(|e| format!("KMS key {key} is not an ECC_NIST_P256 key: {e}"))?;
        let key_id = out.key_id().unwrap_or(key).to_string();
        Ok(KmsSigner {
            client,
            key_id,
            public,
        })
    }
}

#[async_trait]
impl Signer for KmsSigner {
    fn key_id(&self) -> &str {
        &self.key_id
    }

    fn public_key(&self) -> &p256::PublicKey {
        &self.public
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
