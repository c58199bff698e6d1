//! Authentication of the two bearer tokens on every call under the base path:
//! the calling service's token (`Authorization: Bearer`) and the operator's token
//! (`X-Operator-Token`). See the contract, Identity.
//!
//! Algorithms are an allowlist (ES256 and RS256; never `none`, never HMAC), `exp` is
//! required and checked against Airlock's clock with at most 60 s of skew, and service
//! tokens may live at most 15 minutes (`exp - iat`).

pub mod jwks;
pub mod roles;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use jsonwebtoken::{Algorithm, DecodingKey, Validation};

pub use jwks::{JwksCache, KeyLookup, KeySet, VerifyKey};
pub use roles::{DeskScope, Permission, RoleTable};

use crate::core::error::{ApiError, Code};

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
            // Both ids in the message, so an audit record of the refusal says who claimed
            // to act for whom.
            Err(ApiError::new(
                Code::OperatorMismatch,
                format!(
                    "requested_by ({requested_by:?}) must be the operator of the X-Operator-Token ({:?}); the body never widens identity.",
                    self.operator.sub
                ),
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
    /// What only a client-credentials (service) token carries: required on service tokens,
    /// refused on operator tokens. `None` turns the check off (`none`).
    pub service_marker: Option<ServiceMarker>,
}

impl Default for ClaimNames {
    fn default() -> Self {
        ClaimNames {
            scope_prefix: String::new(),
            roles: "roles".into(),
            desks: "desks".into(),
            service_marker: Some(ServiceMarker::default()),
        }
    }
}

/// The default marker, Auth0's grant-type claim, which the local dev issuer also sets.
pub const DEFAULT_SERVICE_MARKER: &str = "gty=client-credentials";

/// What tells a provider's client-credentials token from a token the same provider issues
/// to a user: audience and scopes alone may not (an Auth0 user's access token for the API
/// has the API's audience, and users may be granted its scopes). Set with
/// `AIRLOCK_SERVICE_TOKEN_MARKER`:
///
/// - `CLAIM=VALUE`: the claim (a name or dotted path) is the string VALUE, or an array
///   holding it. Auth0 `gty=client-credentials`, Entra ID `idtyp=app` (with the optional
///   claim `idtyp` enabled on the API's app registration).
/// - `CLAIM=@OTHER`: the claim is a non-empty string equal to the claim OTHER. Cognito
///   `sub=@client_id` (a client-credentials token's subject is the app client; a user's is
///   the user), Okta `sub=@cid`.
/// - `none`: no check (only for a service issuer that issues nothing but client
///   credentials).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceMarker {
    Equals { claim: String, value: String },
    SameAs { claim: String, other: String },
}

impl Default for ServiceMarker {
    fn default() -> Self {
        ServiceMarker::Equals {
            claim: "gty".into(),
            value: "client-credentials".into(),
        }
    }
}

fn is_claim_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ':' | '-' | '.'))
}

impl ServiceMarker {
    /// Parses the setting; `Ok(None)` for `none`.
    pub fn parse(s: &str) -> Result<Option<ServiceMarker>, String> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("none") {
            return Ok(None);
        }
        let bad = || {
            format!(
                "must be CLAIM=VALUE, CLAIM=@OTHER_CLAIM or none (e.g. {DEFAULT_SERVICE_MARKER}, \
                 sub=@client_id), got {s:?}"
            )
        };
        let (claim, value) = s.split_once('=').ok_or_else(bad)?;
        let (claim, value) = (claim.trim(), value.trim());
        if !is_claim_name(claim) || value.is_empty() || value.chars().any(char::is_control) {
            return Err(bad());
        }
        Ok(Some(match value.strip_prefix('@') {
            Some(other) if is_claim_name(other) && other != claim => ServiceMarker::SameAs {
                claim: claim.into(),
                other: other.into(),
            },
            Some(_) => return Err(bad()),
            None => ServiceMarker::Equals {
                claim: claim.into(),
                value: value.into(),
            },
        }))
    }

    /// Whether a token's claims carry the marker.
    pub fn carried_by(&self, claims: &serde_json::Value) -> bool {
        match self {
            ServiceMarker::Equals { claim: c, value } => match claim(claims, c) {
                Some(serde_json::Value::String(s)) => s == value,
                Some(serde_json::Value::Array(a)) => a.iter().any(|x| x.as_str() == Some(value)),
                _ => false,
            },
            ServiceMarker::SameAs { claim: c, other } => {
                match (claim(claims, c), claim(claims, other)) {
                    (Some(serde_json::Value::String(a)), Some(serde_json::Value::String(b))) => {
                        !a.is_empty() && a == b
                    }
                    _ => false,
                }
            }
        }
    }

    /// For messages: `claim gty = "client-credentials"`, `claim sub equal to claim client_id`.
    pub fn describe(&self) -> String {
        match self {
            ServiceMarker::Equals { claim, value } => format!("claim {claim} = {value:?}"),
            ServiceMarker::SameAs { claim, other } => {
                format!("claim {claim} equal to claim {other}")
            }
        }
    }
}

/// The longest token accepted, in bytes; anything longer is refused before parsing.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;
/// The longest `sub` accepted, in bytes (it becomes part of store keys and audit records).
pub const MAX_SUB_BYTES: usize = 256;
/// The most roles or desks an operator token may name, and the longest name, in bytes.
pub const MAX_CLAIM_LIST: usize = 64;
pub const MAX_CLAIM_NAME_BYTES: usize = 128;

/// A token's `sub`: 1..=256 bytes without control characters.
fn subject(c: &serde_json::Value) -> Result<&str, String> {
    let sub = c.get("sub").and_then(|v| v.as_str()).unwrap_or_default();
    if sub.is_empty() {
        Err("its sub is empty".into())
    } else if sub.len() > MAX_SUB_BYTES || sub.chars().any(char::is_control) {
        Err(format!(
            "its sub must be 1 to {MAX_SUB_BYTES} bytes without control characters"
        ))
    } else {
        Ok(sub)
    }
}

/// A list claim (roles, desks) within bounds: each name is used as a key or a query.
fn bounded_list(name: &str, list: Vec<String>) -> Result<Vec<String>, String> {
    if list.len() > MAX_CLAIM_LIST
        || list
            .iter()
            .any(|x| x.len() > MAX_CLAIM_NAME_BYTES || x.chars().any(char::is_control))
    {
        Err(format!(
            "its {name} claim must hold at most {MAX_CLAIM_LIST} names of at most \
             {MAX_CLAIM_NAME_BYTES} bytes without control characters"
        ))
    } else {
        Ok(list)
    }
}

/// Tokens that verified, by SHA-256 of the token, until their `exp`: each request carries
/// two tokens, and an ES256 check costs more than the rest of a read. A cached token is
/// still refused once expired. Bounded: cleared when full. The confirmation verifier keeps
/// the tokens its process signed in one too (`token::ConfirmationVerifier::issued`).
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

    pub(crate) fn get(&self, token: &str, now_s: i64, skew_s: i64) -> Option<T> {
        let map = self.map.lock().ok()?;
        match map.get(&Self::key(token)) {
            Some((v, exp)) if now_s <= exp + skew_s => Some(v.clone()),
            _ => None,
        }
    }

    pub(crate) fn put(&self, token: &str, value: &T, exp: i64) {
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
        let accept = |c: &serde_json::Value| {
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
            if let Some(m) = &self.claims.service_marker {
                if !m.carried_by(c) {
                    return Err(fail(format!(
                        "it is not a client-credentials token (a user's token cannot act as the \
                         calling service; it needs {}, see AIRLOCK_SERVICE_TOKEN_MARKER)",
                        m.describe()
                    )));
                }
            }
            let sub = subject(c).map_err(fail)?;
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
            Ok((principal, exp))
        };
        self.verified(
            token,
            &self.service,
            &self.verified_services,
            now_s,
            &fail,
            accept,
        )
        .await
    }

    async fn operator(&self, token: Option<&str>, now_s: i64) -> Result<Operator, ApiError> {
        let fail = |why: String| {
            ApiError::new(
                Code::OperatorUnauthenticated,
                format!("The operator token was refused: {why}. The operator must sign in again."),
            )
        };
        let token = token.ok_or_else(|| fail("the X-Operator-Token header is missing".into()))?;
        let accept = |c: &serde_json::Value| {
            if let Some(m) = &self.claims.service_marker {
                if m.carried_by(c) {
                    return Err(fail(format!(
                        "it is a client-credentials (service) token, not an operator's ({})",
                        m.describe()
                    )));
                }
            }
            let sub = subject(c).map_err(fail)?;
            let exp = c.get("exp").and_then(|v| v.as_i64()).unwrap_or(now_s);
            let roles =
                bounded_list("roles", strings(claim(c, &self.claims.roles))).map_err(fail)?;
            let desks = match claim(c, &self.claims.desks) {
                None => None,
                Some(d) => Some(bounded_list("desks", strings(Some(d))).map_err(fail)?),
            };
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
            Ok((operator, exp))
        };
        self.verified(
            token,
            &self.operator,
            &self.verified_operators,
            now_s,
            &fail,
            accept,
        )
        .await
    }

    /// One path for both kinds of token: bounded in size, answered from the cache of
    /// tokens already verified, else verified against `issuer` and read by `accept` (which
    /// gives the principal and when it expires), then cached.
    async fn verified<T: Clone>(
        &self,
        token: &str,
        issuer: &Issuer,
        cache: &VerifiedTokens<T>,
        now_s: i64,
        fail: &impl Fn(String) -> ApiError,
        accept: impl FnOnce(&serde_json::Value) -> Result<(T, i64), ApiError>,
    ) -> Result<T, ApiError> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(fail(format!("it is longer than {MAX_TOKEN_BYTES} bytes")));
        }
        if let Some(p) = cache.get(token, now_s, self.skew_s) {
            return Ok(p);
        }
        let c = verify_jwt(token, issuer, now_s, self.skew_s)
            .await
            .map_err(|f| match f {
                TokenFault::Expired(_) => fail("it has expired".into()),
                TokenFault::Invalid(w) => fail(w),
                TokenFault::Unavailable => unavailable(),
            })?;
        let (principal, exp) = accept(&c)?;
        cache.put(token, &principal, exp);
        Ok(principal)
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
                service_marker: Some(ServiceMarker::SameAs {
                    claim: "sub".into(),
                    other: "azp".into(),
                }),
            },
        );
        let svc = sign(
            &key,
            serde_json::json!({"iss": "iss", "aud": "aud", "sub": "m", "azp": "m", "iat": NOW, "exp": NOW + 60,
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

    #[test]
    fn service_markers_parse_and_match() {
        use serde_json::json;
        assert_eq!(
            ServiceMarker::parse(DEFAULT_SERVICE_MARKER).unwrap(),
            Some(ServiceMarker::default())
        );
        assert_eq!(ServiceMarker::parse("none").unwrap(), None);
        let cognito = ServiceMarker::parse(" sub=@client_id ").unwrap().unwrap();
        assert!(cognito.carried_by(&json!({"sub": "abc", "client_id": "abc"})));
        assert!(!cognito.carried_by(&json!({"sub": "user-uuid", "client_id": "abc"})));
        assert!(!cognito.carried_by(&json!({"sub": "abc"})));
        assert!(!cognito.carried_by(&json!({"sub": "", "client_id": ""})));
        let entra = ServiceMarker::parse("idtyp=app").unwrap().unwrap();
        assert!(entra.carried_by(&json!({"idtyp": "app"})));
        assert!(entra.carried_by(&json!({"idtyp": ["app"]})));
        assert!(!entra.carried_by(&json!({"idtyp": "user"})));
        let nested = ServiceMarker::parse("ext.kind=machine").unwrap().unwrap();
        assert!(nested.carried_by(&json!({"ext": {"kind": "machine"}})));
        for bad in [
            "", "gty", "=x", "gty=", "g ty=x", "sub=@", "sub=@sub", "sub=@a b", "a=\u{1}",
        ] {
            assert!(ServiceMarker::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn a_user_token_is_neither_a_service_token_nor_the_reverse() {
        let (key, keys) = signer();
        // One issuer and audience for both kinds: only the marker tells them apart.
        let mut a = auth(keys, ClaimNames::default());
        a.operator.audience = "aud".into();
        let user = sign(
            &key,
            serde_json::json!({"iss": "iss", "aud": "aud", "sub": "alice", "iat": NOW, "exp": NOW + 60,
                "scope": "trade.read trade.plan trade.execute", "roles": ["trader"]}),
        );
        let machine = sign(
            &key,
            serde_json::json!({"iss": "iss", "aud": "aud", "sub": "m", "iat": NOW, "exp": NOW + 60,
                "gty": "client-credentials", "scope": "trade.read", "roles": ["admin"]}),
        );
        assert!(a
            .authenticate(Some(&machine), Some(&user), NOW)
            .await
            .is_ok());
        let e = a
            .authenticate(Some(&user), Some(&user), NOW)
            .await
            .unwrap_err();
        assert_eq!(e.code, Code::Unauthenticated);
        assert!(
            e.message.contains("not a client-credentials token"),
            "{}",
            e.message
        );
        assert!(
            e.message.contains("AIRLOCK_SERVICE_TOKEN_MARKER"),
            "{}",
            e.message
        );
        let e = a
            .authenticate(Some(&machine), Some(&machine), NOW)
            .await
            .unwrap_err();
        assert_eq!(e.code, Code::OperatorUnauthenticated);
        assert!(
            e.message.contains("client-credentials (service) token"),
            "{}",
            e.message
        );
        // Off: the user's token passes as the service (what `none` means).
        a.claims.service_marker = None;
        a.verified_services = Default::default();
        assert!(a.authenticate(Some(&user), Some(&user), NOW).await.is_ok());
    }

    #[tokio::test]
    async fn subjects_roles_and_desks_are_bounded() {
        let (key, keys) = signer();
        let a = auth(keys, ClaimNames::default());
        let svc = |sub: &str| {
            sign(
                &key,
                serde_json::json!({"iss": "iss", "aud": "aud", "sub": sub, "iat": NOW, "exp": NOW + 60,
                    "gty": "client-credentials", "scope": "trade.read"}),
            )
        };
        let op = |sub: &str, desks: serde_json::Value| {
            sign(
                &key,
                serde_json::json!({"iss": "iss", "aud": "ops", "sub": sub, "exp": NOW + 60,
                    "roles": ["trader"], "desks": desks}),
            )
        };
        let ok_op = op("o", serde_json::json!(["energy"]));
        assert!(a
            .authenticate(Some(&svc("m")), Some(&ok_op), NOW)
            .await
            .is_ok());
        let e = a
            .authenticate(Some(&svc(&"m".repeat(257))), Some(&ok_op), NOW)
            .await
            .unwrap_err();
        assert_eq!(e.code, Code::Unauthenticated);
        let e = a
            .authenticate(Some(&svc("m\n")), Some(&ok_op), NOW)
            .await
            .unwrap_err();
        assert_eq!(e.code, Code::Unauthenticated);
        for bad in [
            op(&"o".repeat(257), serde_json::json!(["energy"])),
            op("o", serde_json::json!(["x".repeat(129)])),
            op(
                "o",
                serde_json::json!((0..65).map(|i| format!("d{i}")).collect::<Vec<_>>()),
            ),
        ] {
            let e = a
                .authenticate(Some(&svc("m")), Some(&bad), NOW)
                .await
                .unwrap_err();
            assert_eq!(e.code, Code::OperatorUnauthenticated, "{}", e.message);
        }
        let huge = "a".repeat(MAX_TOKEN_BYTES + 1);
        let e = a
            .authenticate(Some(&huge), Some(&ok_op), NOW)
            .await
            .unwrap_err();
        assert!(e.message.contains("longer than"), "{}", e.message);
    }
}
