//! Authentication of the two bearer tokens on every call under the base path:
//! the calling service's token (`Authorization: Bearer`) and the operator's token
//! (`X-Operator-Token`). See the contract, Identity.
//!
//! Algorithms are an allowlist (ES256 and RS256; never `none`, never HMAC), `exp` is
//! required and checked against Airlock's clock with at most 60 s of skew, and service
//! tokens may live at most 15 minutes (`exp - iat`).

pub mod dev_issuer;
pub mod jwks;
pub mod roles;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use jsonwebtoken::{Algorithm, DecodingKey, Validation};

pub use jwks::{JwksCache, KeyLookup, KeySet, VerifyKey};
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

/// Where an issuer's verification keys come from.
#[derive(Clone)]
pub enum KeySource {
    /// Keys known at start (the local dev issuer).
    Static(KeySet),
    /// A production identity provider's JWKS URL, cached (see [`jwks`]).
    Jwks(Arc<JwksCache>),
    /// No identity provider configured: every token is refused, naming the variable to set.
    Unconfigured(&'static str),
}

/// One token issuer: who must have signed, for whom, and with which keys.
#[derive(Clone)]
pub struct Issuer {
    pub issuer: String,
    pub audience: String,
    /// The claim that carries the audience: `aud` (OIDC), or `client_id` for Amazon
    /// Cognito access tokens, which have no `aud`.
    pub audience_claim: String,
    pub keys: KeySource,
}

impl Issuer {
    pub fn new(issuer: impl Into<String>, audience: impl Into<String>, keys: KeySource) -> Self {
        Issuer {
            issuer: issuer.into(),
            audience: audience.into(),
            audience_claim: "aud".into(),
            keys,
        }
    }

    async fn key(&self, kid: Option<&str>) -> Result<VerifyKey, TokenFault> {
        let unknown = || TokenFault::Invalid("the token's signing key (kid) is unknown".into());
        match &self.keys {
            KeySource::Static(set) => set.get(kid).cloned().ok_or_else(unknown),
            KeySource::Jwks(cache) => cache.key(kid).await.map_err(|e| match e {
                KeyLookup::Unknown => unknown(),
                KeyLookup::Unavailable(_) => TokenFault::Unavailable,
            }),
            KeySource::Unconfigured(var) => Err(TokenFault::Invalid(format!(
                "no identity provider is configured for it ({var} is not set)"
            ))),
        }
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
    /// The identity provider's keys could not be fetched: not the caller's fault (503).
    Unavailable,
}

/// Verifies a compact JWS against one issuer and returns its claims.
/// `now_s` is Airlock's clock; `exp` must be in the future (with `skew_s`), `iat` and `nbf`
/// not in the future.
pub async fn verify_jwt(
    token: &str,
    issuer: &Issuer,
    now_s: i64,
    skew_s: i64,
) -> Result<serde_json::Value, TokenFault> {
    let header = jsonwebtoken::decode_header(token)
        .map_err(|_| TokenFault::Invalid("the token is not a well-formed JWT".into()))?;
    if !ALLOWED_ALGORITHMS.contains(&header.alg) {
        return Err(TokenFault::Invalid(format!(
            "algorithm {:?} is not allowed",
            header.alg
        )));
    }
    let VerifyKey { alg, key } = issuer.key(header.kid.as_deref()).await?;
    if alg != header.alg {
        return Err(TokenFault::Invalid(
            "the token's algorithm does not match its key".into(),
        ));
    }
    let mut v = Validation::new(alg);
    v.algorithms = vec![alg];
    // Time is checked below against Airlock's clock, not the system clock.
    v.validate_exp = false;
    v.validate_nbf = false;
    v.leeway = 0;
    v.set_issuer(&[&issuer.issuer]);
    if issuer.audience_claim == "aud" {
        v.set_audience(&[&issuer.audience]);
        v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
    } else {
        v.validate_aud = false;
        v.set_required_spec_claims(&["exp", "iss", "sub"]);
    }
    let data = jsonwebtoken::decode::<serde_json::Value>(token, &key, &v).map_err(|e| {
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
    if issuer.audience_claim != "aud"
        && !strings(claims.get(&issuer.audience_claim)).contains(&issuer.audience)
    {
        return Err(TokenFault::Invalid(format!(
            "the token is for another audience ({})",
            issuer.audience_claim
        )));
    }
    // Times are whole seconds within ±2^40 (about 35,000 years), so no sum below can
    // overflow; a time claim that is present but not such a number refuses the token.
    let time = |k: &str| -> Result<Option<i64>, TokenFault> {
        match claims.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .filter(|t| t.abs() < 1 << 40)
                .map(Some)
                .ok_or_else(|| {
                    TokenFault::Invalid(format!("{k} must be a whole number of seconds"))
                }),
        }
    };
    let exp = time("exp")?.ok_or_else(|| TokenFault::Invalid("exp is missing".into()))?;
    let nbf = time("nbf")?;
    let iat = time("iat")?;
    if now_s > exp + skew_s {
        return Err(TokenFault::Expired(exp));
    }
    if nbf.is_some_and(|nbf| nbf > now_s + skew_s) {
        return Err(TokenFault::Invalid("the token is not valid yet".into()));
    }
    if let Some(iat) = iat {
        if iat > now_s + skew_s {
            return Err(TokenFault::Invalid(
                "the token was issued in the future".into(),
            ));
        }
        if iat > exp {
            return Err(TokenFault::Invalid(
                "the token expires before it was issued".into(),
            ));
        }
    }
    Ok(claims)
}

/// A claim as a list of strings: a JSON array of strings, or one string of values
/// separated by spaces or commas (Cognito custom attributes are strings).
fn strings(v: Option<&serde_json::Value>) -> Vec<String> {
    match v {
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect(),
        Some(serde_json::Value::String(s)) => s
            .split([' ', ','])
            .filter(|x| !x.is_empty())
            .map(str::to_string)
            .collect(),
        _ => Vec::new(),
    }
}

/// A claim by dotted path (`realm_access.roles`); a key containing `:` (`cognito:groups`)
/// is one segment.
fn claim<'a>(claims: &'a serde_json::Value, path: &str) -> Option<&'a serde_json::Value> {
    if let Some(v) = claims.get(path) {
        return Some(v);
    }
    path.split('.').try_fold(claims, |v, seg| v.get(seg))
}

/// Where the claims Airlock reads live in each provider's tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimNames {
    /// Prefix stripped from service scopes (`airlock/` for a Cognito resource server).
    pub scope_prefix: String,
    /// The operator's roles (`roles`; `cognito:groups` on Cognito).
    pub roles: String,
    /// The operator's desks (`desks`; a custom attribute such as `custom:desks` on Cognito).
    pub desks: String,
}

impl Default for ClaimNames {
    fn default() -> Self {
        ClaimNames {
            scope_prefix: String::new(),
            roles: "roles".into(),
            desks: "desks".into(),
        }
    }
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
    pub service: Issuer,
    pub operator: Issuer,
    pub claims: ClaimNames,
    pub roles: RoleTable,
    pub max_service_lifetime_s: i64,
    pub skew_s: i64,
    pub verified_services: Arc<VerifiedTokens<ServicePrincipal>>,
    pub verified_operators: Arc<VerifiedTokens<Operator>>,
}

fn unavailable() -> ApiError {
    ApiError::new(
        Code::UpstreamUnavailable,
        "The identity provider's signing keys could not be fetched; retry shortly.",
    )
}

impl Authenticator {
    pub async fn authenticate(
        &self,
        bearer: Option<&str>,
        operator_token: Option<&str>,
        now_s: i64,
    ) -> Result<Caller, ApiError> {
        let service = self.service_principal(bearer, now_s).await?;
        let operator = self.operator(operator_token, now_s).await?;
        let role_perms = self.roles.permissions(&operator.roles);
        let permissions = service.scopes.intersection(&role_perms).copied().collect();
        Ok(Caller {
            service,
            operator,
            permissions,
        })
    }

    async fn service_principal(
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
        let c = verify_jwt(token, &self.service, now_s, self.skew_s)
            .await
            .map_err(|f| match f {
                TokenFault::Expired(_) => fail("it has expired".into()),
                TokenFault::Invalid(w) => fail(w),
                TokenFault::Unavailable => unavailable(),
            })?;
        let (Some(exp), Some(iat)) = (
            c.get("exp").and_then(|v| v.as_i64()),
            c.get("iat").and_then(|v| v.as_i64()),
        ) else {
            return Err(fail("it needs numeric exp and iat claims".into()));
        };
        if exp - iat > self.max_service_lifetime_s {
            return Err(fail(format!(
                "its lifetime exceeds {} seconds",
                self.max_service_lifetime_s
            )));
        }
        let sub = c.get("sub").and_then(|v| v.as_str()).unwrap_or_default();
        if sub.is_empty() {
            return Err(fail("its sub is empty".into()));
        }
        // `scope` (space-separated, RFC 8693) or `scp` (an array, Okta and Entra ID).
        let granted = match c.get("scope") {
            Some(v) => strings(Some(v)),
            None => strings(c.get("scp")),
        };
        let prefix = &self.claims.scope_prefix;
        let principal = ServicePrincipal {
            sub: sub.to_string(),
            scopes: granted
                .iter()
                .filter_map(|s| s.strip_prefix(prefix.as_str()))
                .filter_map(Permission::from_scope)
                .collect(),
        };
        self.verified_services.put(token, &principal, exp);
        Ok(principal)
    }

    async fn operator(&self, token: Option<&str>, now_s: i64) -> Result<Operator, ApiError> {
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
        let c = verify_jwt(token, &self.operator, now_s, self.skew_s)
            .await
            .map_err(|f| match f {
                TokenFault::Expired(_) => fail("it has expired".into()),
                TokenFault::Invalid(w) => fail(w),
                TokenFault::Unavailable => unavailable(),
            })?;
        let sub = c.get("sub").and_then(|v| v.as_str()).unwrap_or_default();
        if sub.is_empty() {
            return Err(fail("its sub is empty".into()));
        }
        let exp = c.get("exp").and_then(|v| v.as_i64()).unwrap_or(now_s);
        let roles = strings(claim(&c, &self.claims.roles));
        let desks = claim(&c, &self.claims.desks).map(|d| strings(Some(d)));
        let desks = match desks {
            _ if self.roles.all_desks(&roles) => DeskScope::All,
            Some(d) if d.iter().any(|x| x == "*") => DeskScope::All,
            Some(d) => DeskScope::Only(d.into_iter().collect()),
            None => DeskScope::Only(BTreeSet::new()),
        };
        let operator = Operator {
            sub: sub.to_string(),
            roles,
            desks,
        };
        self.verified_operators.put(token, &operator, exp);
        Ok(operator)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header};
    use p256::pkcs8::EncodePrivateKey;

    const NOW: i64 = 1_800_000_000;

    fn signer() -> (EncodingKey, KeySource) {
        let sk = p256::SecretKey::random(&mut rand::rngs::OsRng);
        let pem = sk.to_pkcs8_pem(p256::pkcs8::LineEnding::LF).unwrap();
        let mut set = KeySet::default();
        set.insert("k", Algorithm::ES256, es256_decoding_key(&sk.public_key()));
        (
            EncodingKey::from_ec_pem(pem.as_bytes()).unwrap(),
            KeySource::Static(set),
        )
    }

    fn sign(key: &EncodingKey, claims: serde_json::Value) -> String {
        let mut h = Header::new(Algorithm::ES256);
        h.kid = Some("k".into());
        jsonwebtoken::encode(&h, &claims, key).unwrap()
    }

    fn auth(keys: KeySource, claims: ClaimNames) -> Authenticator {
        Authenticator {
            service: Issuer::new("iss", "aud", keys.clone()),
            operator: Issuer::new("iss", "ops", keys),
            claims,
            roles: RoleTable::default(),
            max_service_lifetime_s: 900,
            skew_s: 60,
            verified_services: Default::default(),
            verified_operators: Default::default(),
        }
    }

    #[tokio::test]
    async fn reads_scp_arrays_and_nested_role_claims() {
        let (key, keys) = signer();
        let a = auth(
            keys,
            ClaimNames {
                scope_prefix: "api://airlock/".into(),
                roles: "realm_access.roles".into(),
                desks: "desks".into(),
            },
        );
        let svc = sign(
            &key,
            serde_json::json!({"iss": "iss", "aud": "aud", "sub": "m", "iat": NOW, "exp": NOW + 60,
                "scp": ["api://airlock/trade.read", "trade.plan", "api://airlock/bogus"]}),
        );
        let op = sign(
            &key,
            serde_json::json!({"iss": "iss", "aud": "ops", "sub": "o", "exp": NOW + 60,
                "realm_access": {"roles": ["trader"]}, "desks": "energy, metals"}),
        );
        let c = a.authenticate(Some(&svc), Some(&op), NOW).await.unwrap();
        assert_eq!(
            c.service.scopes,
            [Permission::Read].into_iter().collect(),
            "only prefixed, known scopes"
        );
        assert_eq!(c.operator.roles, ["trader"]);
        assert!(c.can_see_desk("metals") && c.can_see_desk("energy") && !c.can_see_desk("x"));
    }

    #[tokio::test]
    async fn an_unconfigured_provider_refuses_every_token_and_says_why() {
        let (key, _) = signer();
        let a = auth(
            KeySource::Unconfigured("AIRLOCK_SERVICE_JWKS_URL"),
            ClaimNames::default(),
        );
        let svc = sign(
            &key,
            serde_json::json!({"iss": "iss", "aud": "aud", "sub": "m", "iat": NOW, "exp": NOW + 60, "scope": "trade.read"}),
        );
        let e = a
            .authenticate(Some(&svc), Some(&svc), NOW)
            .await
            .unwrap_err();
        assert_eq!(e.code, Code::Unauthenticated);
        assert!(
            e.message.contains("AIRLOCK_SERVICE_JWKS_URL"),
            "{}",
            e.message
        );
    }
}
