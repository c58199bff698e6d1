//! Confirmation tokens: compact JWS, ES256, bound to a plan, its payload hash, the
//! requester, the service principal and the execute audience. Signed through the
//! [`Signer`] port (a local key or KMS); verified locally with the cached public key, so
//! the execute path never calls the signer.

use base64::Engine;
use serde::{Deserialize, Serialize};

use crate::auth::{es256_decoding_key, verify_jwt, Issuer, KeySet, KeySource, TokenFault};
use std::sync::Arc;

use crate::error::StoreResult;
use crate::ports::Signer;

pub const CONFIRMATION_ISSUER: &str = "airlock";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfirmationClaims {
    pub iss: String,
    pub aud: String,
    /// The service principal the plan was made for.
    pub sub: String,
    pub plan_id: String,
    pub payload_hash: String,
    pub requested_by: String,
    pub iat: i64,
    pub exp: i64,
    pub jti: String,
}

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// Signs `claims` as a compact JWS with the signer's key.
pub async fn sign(signer: &dyn Signer, claims: &ConfirmationClaims) -> StoreResult<String> {
    let header = serde_json::json!({ "alg": "ES256", "typ": "JWT", "kid": signer.key_id() });
    let input = format!(
        "{}.{}",
        B64.encode(header.to_string()),
        B64.encode(serde_json::to_vec(claims).expect("claims serialize"))
    );
    let sig = signer.sign(input.as_bytes()).await?;
    Ok(format!("{input}.{}", B64.encode(sig)))
}

/// Verifies confirmation tokens with the signer's public key, fetched once (on first use).
pub struct ConfirmationVerifier {
    audience: String,
    signer: Arc<dyn Signer>,
    keys: tokio::sync::OnceCell<Issuer>,
}

impl ConfirmationVerifier {
    pub fn new(audience: &str, signer: Arc<dyn Signer>) -> Self {
        ConfirmationVerifier {
            audience: audience.to_string(),
            signer,
            keys: tokio::sync::OnceCell::new(),
        }
    }

    pub fn audience(&self) -> &str {
        &self.audience
    }

    /// Fetches the public key now, so the first execute makes no signer call. The execute
    /// function and `airlock serve` call it at start; nothing else needs the key.
    pub async fn preload(&self) -> Result<(), String> {
        self.issuer()
            .await
            .map(|_| ())
            .map_err(|_| "could not load the confirmation-token public key".to_string())
    }

    async fn issuer(&self) -> Result<&Issuer, TokenFault> {
        self.keys
            .get_or_try_init(|| async {
                let public = self.signer.public_key().await?;
                let mut set = KeySet::default();
                set.insert(
                    self.signer.key_id(),
                    jsonwebtoken::Algorithm::ES256,
                    es256_decoding_key(&public),
                );
                Ok::<_, crate::error::StoreError>(Issuer::new(
                    CONFIRMATION_ISSUER,
                    &self.audience,
                    KeySource::Static(set),
                ))
            })
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "could not load the confirmation public key");
                TokenFault::Unavailable
            })
    }

    /// Signature, algorithm (ES256 only), key id, issuer, audience and expiry (no skew:
    /// Airlock issued it on its own clock).
    pub async fn verify(&self, token: &str, now_s: i64) -> Result<ConfirmationClaims, TokenFault> {
        let claims = verify_jwt(token, self.issuer().await?, now_s, 0).await?;
        serde_json::from_value(claims)
            .map_err(|_| TokenFault::Invalid("the token's claims have the wrong shape".into()))
    }
}
