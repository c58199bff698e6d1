//! Confirmation-token signer for the embedded stack: a P-256 key file in the state dir,
//! signing through aws-lc-rs (a fixed-width `r || s` signature, as JWS wants).

use async_trait::async_trait;
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use p256::pkcs8::EncodePrivateKey;

use crate::core::error::{StoreError, StoreResult};
use crate::core::ports::Signer;

pub struct LocalSigner {
    kid: String,
    key: EcdsaKeyPair,
    rng: SystemRandom,
    public: p256::PublicKey,
}

impl LocalSigner {
    pub fn new(kid: impl Into<String>, secret: &p256::SecretKey) -> Result<Self, String> {
        let der = secret
            .to_pkcs8_der()
            .map_err(|e| format!("encoding the signing key: {e}"))?;
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, der.as_bytes())
            .map_err(|e| format!("loading the signing key: {e}"))?;
        Ok(LocalSigner {
            kid: kid.into(),
            key,
            rng: SystemRandom::new(),
            public: secret.public_key(),
        })
    }
}

#[async_trait]
impl Signer for LocalSigner {
    fn key_id(&self) -> &str {
        &self.kid
    }

    async fn public_key(&self) -> StoreResult<p256::PublicKey> {
        Ok(self.public)
    }

    async fn sign(&self, message: &[u8]) -> StoreResult<[u8; 64]> {
        let sig = self
            .key
            .sign(&self.rng, message)
            .map_err(|_| StoreError::Unavailable("local signing failed".into()))?;
        let mut out = [0u8; 64];
        out.copy_from_slice(sig.as_ref());
        Ok(out)
    }
}
