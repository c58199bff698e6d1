//! The local development issuer: one P-256 key in the state dir signs the service and
//! operator tokens that `airlock token` prints and `airlock serve` accepts. Production
//! deployments verify tokens of their own identity providers instead.

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::Serialize;

use crate::config::Config;
use crate::core::auth::ServiceMarker;

pub const DEV_ISSUER_KID: &str = "airlock-dev-issuer-1";

pub struct DevIssuer {
    key: EncodingKey,
    pub public: p256::PublicKey,
}

#[derive(Serialize)]
struct OperatorClaims<'a> {
    iss: &'a str,
    aud: &'a str,
    sub: &'a str,
    roles: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    desks: Option<&'a [String]>,
    iat: i64,
    exp: i64,
}

impl DevIssuer {
    pub fn new(secret: &p256::SecretKey) -> Result<Self, String> {
        use p256::pkcs8::EncodePrivateKey;
        let pem = secret
            .to_pkcs8_pem(p256::pkcs8::LineEnding::LF)
            .map_err(|e| format!("encoding the dev issuer key: {e}"))?;
        let key = EncodingKey::from_ec_pem(pem.as_bytes())
            .map_err(|e| format!("loading the dev issuer key: {e}"))?;
        Ok(DevIssuer {
            key,
            public: secret.public_key(),
        })
    }

    fn sign<T: Serialize>(&self, claims: &T) -> String {
        let mut h = Header::new(Algorithm::ES256);
        h.kid = Some(DEV_ISSUER_KID.into());
        jsonwebtoken::encode(&h, claims, &self.key).expect("ES256 signing with a valid key")
    }

    pub fn service_token(
        &self,
        cfg: &Config,
        sub: &str,
        scopes: &str,
        now_s: i64,
        ttl_s: i64,
    ) -> String {
        let mut claims = serde_json::json!({
            "iss": cfg.service_issuer,
            "sub": sub,
            "scope": scopes,
            "iat": now_s,
            "exp": now_s + ttl_s,
        });
        claims[cfg.service_audience_claim.as_str()] = serde_json::json!(cfg.service_audience);
        // The client-credentials marker of the configuration (`gty` by default), so the
        // dev issuer's service tokens pass the check that a user's token fails.
        if let Some(m) = &cfg.claims.service_marker {
            add_marker(&mut claims, m);
        }
        self.sign(&claims)
    }

    pub fn operator_token(
        &self,
        cfg: &Config,
        sub: &str,
        roles: &[String],
        desks: Option<&[String]>,
        now_s: i64,
        ttl_s: i64,
    ) -> String {
        self.sign(&OperatorClaims {
            iss: &cfg.operator_issuer,
            aud: &cfg.operator_audience,
            sub,
            roles,
            desks,
            iat: now_s,
            exp: now_s + ttl_s,
        })
    }
}

/// Adds what `m` requires to a service token's claims, without overwriting a claim the
/// token already has (a marker on `sub=@client_id` copies `sub` into `client_id`).
fn add_marker(claims: &mut serde_json::Value, m: &ServiceMarker) {
    let Some(map) = claims.as_object_mut() else {
        return;
    };
    match m {
        ServiceMarker::Equals { claim, value } => {
            if !claim.contains('.') {
                map.entry(claim.clone())
                    .or_insert_with(|| serde_json::json!(value));
            }
        }
        ServiceMarker::SameAs { claim, other } => {
            if let Some(v) = map.get(claim).cloned() {
                if !other.contains('.') {
                    map.entry(other.clone()).or_insert(v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_service_tokens_carry_the_configured_marker() {
        let mut claims = serde_json::json!({"sub": "mastra", "aud": "a"});
        add_marker(&mut claims, &ServiceMarker::default());
        assert!(ServiceMarker::default().carried_by(&claims));
        let cognito = ServiceMarker::parse("sub=@client_id").unwrap().unwrap();
        add_marker(&mut claims, &cognito);
        assert_eq!(claims["client_id"], "mastra");
        assert!(cognito.carried_by(&claims));
        let aud = ServiceMarker::parse("aud=other").unwrap().unwrap();
        add_marker(&mut claims, &aud);
        assert_eq!(claims["aud"], "a", "never overwrites");
    }
}
