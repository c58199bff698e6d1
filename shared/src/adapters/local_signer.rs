//! Confirmation-token signer for the embedded stack: a P-256 key file in the state dir.

use async_trait::async_trait;
use p256::ecdsa::{signature::Signer as _, Signature, SigningKey};

use crate::error::StoreResult;
use crate::ports::Signer;

pub struct LocalSigner {
    kid: String,
    key: SigningKey,
    public: p256::PublicKey,
}

impl LocalSigner {
    pub fn new(kid: impl Into<String>, secret: &p256::SecretKey) -> Self {
        LocalSigner {
            kid: kid.into(),
            key: SigningKey::from(secret),
            public: secret.public_key(),
        }
    }
}

#[async_trait]
impl Signer for LocalSigner {
    fn key_id(&self) -> &str {
        &self.kid
    }

    fn public_key(&self) -> &p256::PublicKey {
        &self.public
    }

    async fn sign(&self, message: &[u8]) -> StoreResult<[u8; 64]> {
        let sig: Signature = self.key.sign(message);
        let mut out = [0u8; 64];
        out.copy_from_slice(&sig.to_bytes());
        Ok(out)
    }
}
