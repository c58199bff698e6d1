//! The local development issuer: one P-256 key in the state dir signs the service and
//! operator tokens that `airlock token` prints and `airlock serve` accepts. Production
//! deployments verify tokens of their own identity providers instead.

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::Serialize;

use crate::config::Config;

pub const DEV_ISSUER_KID: &str = "airlock-dev-issuer-1";

pub struct DevIssuer {
    key: EncodingKey,
    pub public: p256::PublicKey,
}

#[derive(Serialize)]
struct ServiceClaims<'a> {
    iss: &'a str,
    aud: &'a str,
    sub: &'a str,
    scope: &'a str,
    iat: i64,
    exp: i64,
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
        self.sign(&ServiceClaims {
            iss: &cfg.service_issuer,
            aud: &cfg.service_audience,
            sub,
            scope: scopes,
            iat: now_s,
            exp: now_s + ttl_s,
        })
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
