//! Authentication of the two bearer tokens on every call under the base path:
//! the calling service's token (`Authorization: Bearer`) and the operator's token
//! (`X-Operator-Token`). See the contract, Identity.
//!
//! Algorithms are an allowlist (ES256 and RS256; never `none`, never HMAC), `exp` is
//! required and checked against Airlock's clock with at most 60 s of skew, and service
//! tokens may live at most 15 minutes (`exp - iat`).

pub mod dev_issuer;
pub mod roles;

use std::collections::{BTreeSet, HashMap};

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

pub use roles::{DeskScope, Permission, RoleTable};

use crate::error::{ApiError, Code};

/// The calling service (Mastra): `sub` is its client id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePrincipal {
    pub sub: String,
    pub scopes: BTreeSet<Permission>,
}

/// The human operator the chat acts for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator {
    pub sub: String,
    pub roles: Vec<String>,
    pub desks: DeskScope,
}

/// Who is calling, after both tokens were verified.
#[derive(Debug, Clone)]
pub struct Caller {
    pub service: ServicePrincipal,
    pub operator: Operator,
    /// Service scopes intersected with the operator's role permissions.
    pub permissions: BTreeSet<Permission>,
}

impl Caller {
    pub fn require(&self, p: Permission) -> Result<(), ApiError> {
        if self.permissions.contains(&p) {
            return Ok(());
        }
        let why = if !self.service.scopes.contains(&p) {
            format!("the service token lacks the {} scope", p.scope())
        } else {
            format!(
                "operator {} has no role that grants {}",
                self.operator.sub,
                p.scope()
            )
        };
        Err(ApiError::new(
            Code::InsufficientScope,
            format!("This call needs {}, but {why}.", p.scope()),
        ))
    }

    pub fn can_see_desk(&self, desk: &str) -> bool {
        self.operator.desks.allows(desk)
    }

    /// The body's `requested_by` must name the operator of the token (403 `operator_mismatch`).
    pub fn check_requested_by(&self, requested_by: &str) -> Result<(), ApiError> {
        if requested_by == self.operator.sub {
            Ok(())
        } else {
            Err(ApiError::new(
                Code::OperatorMismatch,
                "requested_by must be the operator of the X-Operator-Token; the body never widens identity.",
            )
            .with_field("/requested_by", "does not match the operator token's sub"))
        }
    }
}

/// Verification keys of one issuer, by `kid`.
#[derive(Clone)]
pub struct IssuerKeys {
    pub issuer: String,
    pub audience: String,
    keys: HashMap<String, (Algorithm, DecodingKey)>,
}

impl IssuerKeys {
    pub fn new(issuer: impl Into<String>, audience: impl Into<String>) -> Self {
        IssuerKeys {
            issuer: issuer.into(),
            audience: audience.into(),
            keys: HashMap::new(),
        }
    }

    /// Adds a P-256 public key (ES256) under `kid`.
    pub fn with_es256(mut self, kid: &str, key: &p256::PublicKey) -> Self {
        self.keys
            .insert(kid.to_string(), (Algorithm::ES256, es256_decoding_key(key)));
        self
    }
}

/// A jsonwebtoken decoding key for a P-256 public key.
pub fn es256_decoding_key(key: &p256::PublicKey) -> DecodingKey {
    use base64::Engine;
    use p256::elliptic_curve::sec1::ToEncodedPoint;
    let point = key.to_encoded_point(false);
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let x = b64.encode(point.x().map(|x| &x[..]).unwrap_or_default());
    let y = b64.encode(point.y().map(|y| &y[..]).unwrap_or_default());
    DecodingKey::from_ec_components(&x, &y).expect("a P-256 point has valid components")
}

/// Algorithms accepted on any token. Nothing else, ever: no `none`, no HMAC.
pub const ALLOWED_ALGORITHMS: &[Algorithm] = &[Algorithm::ES256, Algorithm::RS256];

/// Why a token was refused; the caller picks the error code for the token kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenFault {
    Expired(i64),
    Invalid(String),
}

/// Verifies a compact JWS against one issuer's keys and returns its claims.
/// `now_s` is Airlock's clock; `exp` must be in the future (with `skew_s`), `iat` and `nbf`
/// not in the future.
pub fn verify_jwt<T: serde::de::DeserializeOwned>(
    token: &str,
    keys: &IssuerKeys,
    now_s: i64,
    skew_s: i64,
) -> Result<T, TokenFault> {
    let header = jsonwebtoken::decode_header(token)
        .map_err(|_| TokenFault::Invalid("the token is not a well-formed JWT".into()))?;
    if !ALLOWED_ALGORITHMS.contains(&header.alg) {
        return Err(TokenFault::Invalid(format!(
            "algorithm {:?} is not allowed",
            header.alg
        )));
    }
    let (alg, key) = match &header.kid {
        Some(kid) => keys.keys.get(kid),
        None if keys.keys.len() == 1 => keys.keys.values().next(),
        None => None,
    }
    .ok_or_else(|| TokenFault::Invalid("the token's signing key (kid) is unknown".into()))?;
    if *alg != header.alg {
        return Err(TokenFault::Invalid(
            "the token's algorithm does not match its key".into(),
        ));
    }
    let mut v = Validation::new(*alg);
    v.algorithms = vec![*alg];
    // Time is checked below against Airlock's clock, not the system clock.
    v.validate_exp = false;
    v.validate_nbf = false;
    v.leeway = 0;
    v.set_audience(&[&keys.audience]);
    v.set_issuer(&[&keys.issuer]);
    v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
    let data = jsonwebtoken::decode::<serde_json::Value>(token, key, &v).map_err(|e| {
        use jsonwebtoken::errors::ErrorKind::*;
        TokenFault::Invalid(
            match e.kind() {
                InvalidAudience => "the token is for another audience",
                InvalidIssuer => "the token is from another issuer",
                InvalidSignature => "the token's signature does not verify",
                MissingRequiredClaim(_) => "the token lacks a required claim",
                _ => "the token does not verify",
            }
            .into(),
        )
    })?;
    let claims = data.claims;
    let num = |k: &str| claims.get(k).and_then(|v| v.as_i64());
    let exp = num("exp").ok_or_else(|| TokenFault::Invalid("exp must be a number".into()))?;
    if now_s > exp + skew_s {
        return Err(TokenFault::Expired(exp));
    }
    if let Some(nbf) = num("nbf") {
        if nbf > now_s + skew_s {
            return Err(TokenFault::Invalid("the token is not valid yet".into()));
        }
    }
    if let Some(iat) = num("iat") {
        if iat > now_s + skew_s {
            return Err(TokenFault::Invalid(
                "the token was issued in the future".into(),
            ));
        }
    }
    serde_json::from_value(claims)
        .map_err(|_| TokenFault::Invalid("the token's claims have the wrong shape".into()))
}

#[derive(Debug, Deserialize)]
struct ServiceClaims {
    sub: String,
    scope: String,
    exp: i64,
    iat: i64,
}

#[derive(Debug, Deserialize)]
struct OperatorClaims {
    sub: String,
    exp: i64,
    #[serde(default)]
    roles: Vec<String>,
    desks: Option<Vec<String>>,
}

/// Tokens that verified, by SHA-256 of the token, until their `exp`: each request carries
/// two tokens, and an ES256 check costs more than the rest of a read. A cached token is
/// still refused once expired. Bounded: cleared when full.
pub struct VerifiedTokens<T> {
    map: std::sync::Mutex<HashMap<[u8; 32], (T, i64)>>,
}

impl<T> Default for VerifiedTokens<T> {
    fn default() -> Self {
        VerifiedTokens {
            map: std::sync::Mutex::new(HashMap::new()),
        }
    }
}

const TOKEN_CACHE_MAX: usize = 10_000;

impl<T: Clone> VerifiedTokens<T> {
    fn key(token: &str) -> [u8; 32] {
        use sha2::Digest;
        sha2::Sha256::digest(token.as_bytes()).into()
    }

    fn get(&self, token: &str, now_s: i64, skew_s: i64) -> Option<T> {
        let map = self.map.lock().ok()?;
        match map.get(&Self::key(token)) {
            Some((v, exp)) if now_s <= exp + skew_s => Some(v.clone()),
            _ => None,
        }
    }

    fn put(&self, token: &str, value: &T, exp: i64) {
        if let Ok(mut map) = self.map.lock() {
            if map.len() >= TOKEN_CACHE_MAX {
                map.clear();
            }
            map.insert(Self::key(token), (value.clone(), exp));
        }
    }
}

/// Verifies both tokens of a request.
#[derive(Clone)]
pub struct Authenticator {
    pub service: IssuerKeys,
    pub operator: IssuerKeys,
    pub roles: RoleTable,
    pub max_service_lifetime_s: i64,
    pub skew_s: i64,
    pub verified_services: std::sync::Arc<VerifiedTokens<ServicePrincipal>>,
    pub verified_operators: std::sync::Arc<VerifiedTokens<Operator>>,
}

impl Authenticator {
    pub fn authenticate(
        &self,
        bearer: Option<&str>,
        operator_token: Option<&str>,
        now_s: i64,
    ) -> Result<Caller, ApiError> {
        let service = self.service_principal(bearer, now_s)?;
        let operator = self.operator(operator_token, now_s)?;
        let role_perms = self.roles.permissions(&operator.roles);
        let permissions = service.scopes.intersection(&role_perms).copied().collect();
        Ok(Caller {
            service,
            operator,
            permissions,
        })
    }

    fn service_principal(
        &self,
        bearer: Option<&str>,
        now_s: i64,
    ) -> Result<ServicePrincipal, ApiError> {
        let fail = |why: String| {
            ApiError::new(
                Code::Unauthenticated,
                format!("The service token was refused: {why}. Send a valid `Authorization: Bearer <jwt>` for this API."),
            )
        };
        let token = bearer.ok_or_else(|| fail("it is missing".into()))?;
        if let Some(p) = self.verified_services.get(token, now_s, self.skew_s) {
            return Ok(p);
        }
        let c: ServiceClaims =
            verify_jwt(token, &self.service, now_s, self.skew_s).map_err(|f| match f {
                TokenFault::Expired(_) => fail("it has expired".into()),
                TokenFault::Invalid(w) => fail(w),
            })?;
        if c.exp - c.iat > self.max_service_lifetime_s {
            return Err(fail(format!(
                "its lifetime exceeds {} seconds",
                self.max_service_lifetime_s
            )));
        }
        if c.sub.is_empty() {
            return Err(fail("its sub is empty".into()));
        }
        let principal = ServicePrincipal {
            sub: c.sub,
            scopes: c
                .scope
                .split_whitespace()
                .filter_map(Permission::from_scope)
                .collect(),
        };
        self.verified_services.put(token, &principal, c.exp);
        Ok(principal)
    }

    fn operator(&self, token: Option<&str>, now_s: i64) -> Result<Operator, ApiError> {
        let fail = |why: String| {
            ApiError::new(
                Code::OperatorUnauthenticated,
                format!("The operator token was refused: {why}. The operator must sign in again."),
            )
        };
        let token = token.ok_or_else(|| fail("the X-Operator-Token header is missing".into()))?;
        if let Some(o) = self.verified_operators.get(token, now_s, self.skew_s) {
            return Ok(o);
        }
        let c: OperatorClaims =
            verify_jwt(token, &self.operator, now_s, self.skew_s).map_err(|f| match f {
                TokenFault::Expired(_) => fail("it has expired".into()),
                TokenFault::Invalid(w) => fail(w),
            })?;
        if c.sub.is_empty() {
            return Err(fail("its sub is empty".into()));
        }
        let desks = match c.desks {
            _ if self.roles.all_desks(&c.roles) => DeskScope::All,
            Some(d) if d.iter().any(|x| x == "*") => DeskScope::All,
            Some(d) => DeskScope::Only(d.into_iter().collect()),
            None => DeskScope::Only(BTreeSet::new()),
        };
        let operator = Operator {
            sub: c.sub,
            roles: c.roles,
            desks,
        };
        self.verified_operators.put(token, &operator, c.exp);
        Ok(operator)
    }
}
