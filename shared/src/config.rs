//! Typed configuration, read once at start. Environment names mirror the SAM template's
//! `Environment` keys; a bad value names the variable at fault.

use std::path::PathBuf;

#[derive(Debug, Clone)]
pub struct Config {
    /// Where the embedded backend keeps its SQLite file and local keys.
    pub state_dir: PathBuf,
    /// `AIRLOCK_BACKEND`: the backend a Lambda runs on (`aws` when unset). `airlock` takes
    /// its own `--backend` flag, which defaults to this variable too.
    pub backend: Backend,
    /// `AIRLOCK_NOW` (RFC 3339): the instant the local clock starts at, for demos and
    /// tests; Lambdas ignore it.
    pub now: Option<chrono::DateTime<chrono::Utc>>,
    /// The role table: `AIRLOCK_ROLES_FILE` (a file) or `AIRLOCK_ROLES` (the text itself);
    /// the contract's `viewer < trader < head_trader < admin` when neither is set.
    pub roles: crate::core::auth::RoleTable,
    /// `AIRLOCK_CURSOR_KEY` (base64, at least 32 bytes): the cursor MAC key every function
    /// of a deployment shares; unset, a key file in the state dir.
    pub cursor_key: Option<Secret>,
    /// The AWS backend's resource names (the SAM template's environment).
    pub aws: AwsConfig,
    pub service_issuer: String,
    pub service_audience: String,
    pub operator_issuer: String,
    pub operator_audience: String,
    /// JWKS URL of the service-token issuer; unset = the local dev issuer's key (embedded
    /// backend) or no identity provider at all (a Lambda on the AWS backend refuses tokens).
    pub service_jwks_url: Option<String>,
    /// JWKS URL of the operator-token issuer (as above).
    pub operator_jwks_url: Option<String>,
    /// The claim holding the audience: `aud`, or `client_id` for Cognito access tokens.
    pub service_audience_claim: String,
    pub operator_audience_claim: String,
    /// Where roles, desks and scopes live in the providers' tokens.
    pub claims: crate::core::auth::ClaimNames,
    /// How long a fetched JWKS is trusted before it is fetched again, seconds.
    pub jwks_cache_s: u32,
    /// The least time between two fetches triggered by an unknown `kid`, seconds.
    pub jwks_refetch_cooldown_s: u32,
    /// `aud` of confirmation tokens.
    pub confirmation_audience: String,
    /// Confirmation-token and plan lifetime, 30..=900 s (default 300).
    pub confirmation_ttl_s: u32,
    /// `AIRLOCK_CONFIRMATION_PUBLIC_KEY`: the confirmation-token public key (the PEM that
    /// `airlock confirmation-key` prints, or its base64 body on one line). Set, tokens are
    /// verified with it under the signer's key id, and the signer's public key is never
    /// fetched (no KMS `GetPublicKey` at cold start); unset, it is fetched once per process.
    /// A value that is not a P-256 public key is a configuration error (never ignored).
    pub confirmation_public_key: Option<p256::PublicKey>,
    /// Longest accepted service-token lifetime (`exp - iat`), seconds.
    pub max_service_token_lifetime_s: u32,
    /// Clock skew tolerated on `exp`, `nbf` and `iat`, seconds (at most 60).
    pub clock_skew_s: u32,
    /// How long an execute attempt holds its idempotency key before another may take over.
    pub execute_lease_ms: i64,
    /// Per-operator decided executes per rolling minute.
    pub execute_rate_per_minute: u32,
    /// Per-operator stored plans per rolling minute (`AIRLOCK_PLAN_RATE_PER_MINUTE`).
    pub plan_rate_per_minute: u32,
    /// `AIRLOCK_MCP_EXECUTE_RATE_PER_SECOND`: the firm-wide steady rate of MCP `execute_plan`
    /// calls (the template sets API Gateway's `ExecuteThrottleRate`, which only the REST
    /// route gets); unset, MCP executes are not paced.
    pub mcp_execute_rate_per_second: Option<f64>,
    /// `AIRLOCK_MCP_EXECUTE_BURST`: how many MCP `execute_plan` calls may come at once under
    /// that rate (the template: `ExecuteThrottleBurst`); unset, the rate rounded up.
    pub mcp_execute_burst: u32,
    /// The longest an MCP `execute_plan` is held while its plan waits for the operator's
    /// approval (`AIRLOCK_APPROVAL_HOLD_MS`, at most 20,000; 0: never held). On Lambda the
    /// hold also ends in time for the call to answer before the invocation's deadline.
    pub approval_hold_ms: u64,
    /// Held `execute_plan` calls per operator at a time (`AIRLOCK_APPROVAL_HOLDS_PER_OPERATOR`;
    /// one per plan whatever this says; 0: never held).
    pub approval_holds_per_operator: u32,
    /// Execute holds an order submission for room, then refuses it (503
    /// `orders_backlogged`), while the orders queue holds this many messages or more,
    /// waiting or being handled; 0 turns it off.
    pub orders_backlog_limit: u32,
    /// How long execute reuses the orders queue's count before asking again (0: every
    /// submission asks; the template sets 1,000 on AWS, where asking is an SQS call).
    pub orders_backlog_cache_ms: u64,
    /// How long execute holds an order submission that meets a full backlog, waiting for
    /// room, before it refuses it (0: refuse at once; the template sets 0 on AWS).
    pub orders_backlog_wait_ms: u64,
    /// An action claimed but not sent for this long is resent by the sweeper.
    pub sweep_after_ms: i64,
    /// How often `airlock serve` runs the sweeper.
    pub sweep_interval_ms: u64,
    /// A failed message is retried after this delay times its attempt number.
    pub worker_retry_ms: u64,
    /// How long a received message stays hidden while a worker handles it; a worker that
    /// dies leaves it to be redelivered after this.
    pub worker_visibility_ms: u64,
    /// `AIRLOCK_APPROVAL_ORIGIN`: the origin operators open approval pages at (scheme, host,
    /// port; `https` except on `localhost`). `airlock serve` defaults it to
    /// `http://localhost:<port>`.
    pub approval_origin: Option<String>,
    /// `AIRLOCK_APPROVAL_RP_ID`: the WebAuthn relying-party id (a domain, the origin's host
    /// or a parent of it); unset, the origin's host. Passkeys are bound to it.
    pub approval_rp_id: Option<String>,
    /// `AIRLOCK_APPROVAL_SESSION_SECONDS`: how long a passkey sign-in on the approval page
    /// lasts (60 to 3600, default 900).
    pub approval_session_s: u32,
    /// `AIRLOCK_HEADER_READ_TIMEOUT_MS`: how long `airlock serve` waits for a request's
    /// line and headers, from the first poll of an idle connection (default 10,000); a
    /// client that has not sent them by then is disconnected.
    pub header_read_timeout_ms: u64,
    /// `AIRLOCK_BODY_READ_TIMEOUT_MS`: how long `airlock serve` waits for a request's
    /// whole body once its headers are in (default 20,000); later, 408 `request_timeout`
    /// and the connection is closed.
    pub body_read_timeout_ms: u64,
}

pub const DEFAULT_SERVICE_ISSUER: &str = "airlock-local-dev";
pub const DEFAULT_SERVICE_AUDIENCE: &str = "airlock-api";
pub const DEFAULT_OPERATOR_ISSUER: &str = "airlock-local-dev-operators";
pub const DEFAULT_OPERATOR_AUDIENCE: &str = "airlock-operators";
pub const DEFAULT_CONFIRMATION_AUDIENCE: &str = "airlock-execute";
/// Stored plans per operator per rolling minute: three times the executes', for the plans
/// an agent makes and the operator does not take.
pub const DEFAULT_PLAN_RATE_PER_MINUTE: u32 = 60;
/// The longest hold of an `execute_plan` waiting for an approval (MCP clients time out at
/// 60 s; the MCP function's timeout is 27 s).
pub const DEFAULT_APPROVAL_HOLD_MS: u64 = 20_000;
/// Held `execute_plan` calls per operator at a time.
pub const DEFAULT_APPROVAL_HOLDS_PER_OPERATOR: u32 = 2;
/// Orders waiting or being handled beyond which execute holds new submissions (for
/// [`DEFAULT_ORDERS_BACKLOG_WAIT_MS`], then refuses them): about 10 ms of the embedded
/// workers' drain, so an accepted order is handled within tens of milliseconds even under
/// a closed loop of clients (BENCHMARKS.md). The template sets 500 for the Lambdas,
/// which refuse at once.
pub const DEFAULT_ORDERS_BACKLOG_LIMIT: u32 = 16;
/// How long execute holds an order submission for room in a full backlog before refusing
/// it: the workers pace a burst instead of the callers' retries, and only workers that
/// make no room for this long (stalled, or a broker outage) cause refusals.
pub const DEFAULT_ORDERS_BACKLOG_WAIT_MS: u64 = 2_000;
/// How long `airlock serve` waits for a request's line and headers.
pub const DEFAULT_HEADER_READ_TIMEOUT_MS: u64 = 10_000;
/// How long `airlock serve` waits for a request's body after its headers.
pub const DEFAULT_BODY_READ_TIMEOUT_MS: u64 = 20_000;

impl Config {
    /// The approval page's origin: configured, else `http://localhost:3000`.
    pub fn approval_origin(&self) -> String {
        self.approval_origin
            .clone()
            .unwrap_or_else(|| "http://localhost:3000".into())
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            state_dir: PathBuf::from(".airlock"),
            backend: Backend::Aws,
            now: None,
            roles: crate::core::auth::RoleTable::default(),
            cursor_key: None,
            aws: AwsConfig::default(),
            service_issuer: DEFAULT_SERVICE_ISSUER.into(),
            service_audience: DEFAULT_SERVICE_AUDIENCE.into(),
            operator_issuer: DEFAULT_OPERATOR_ISSUER.into(),
            operator_audience: DEFAULT_OPERATOR_AUDIENCE.into(),
            service_jwks_url: None,
            operator_jwks_url: None,
            service_audience_claim: "aud".into(),
            operator_audience_claim: "aud".into(),
            claims: crate::core::auth::ClaimNames::default(),
            jwks_cache_s: 600,
            jwks_refetch_cooldown_s: 30,
            confirmation_audience: DEFAULT_CONFIRMATION_AUDIENCE.into(),
            confirmation_ttl_s: 300,
            confirmation_public_key: None,
            max_service_token_lifetime_s: 900,
            clock_skew_s: 60,
            execute_lease_ms: 10_000,
            execute_rate_per_minute: 20,
            plan_rate_per_minute: DEFAULT_PLAN_RATE_PER_MINUTE,
            mcp_execute_rate_per_second: None,
            mcp_execute_burst: 1,
            approval_hold_ms: DEFAULT_APPROVAL_HOLD_MS,
            approval_holds_per_operator: DEFAULT_APPROVAL_HOLDS_PER_OPERATOR,
            orders_backlog_limit: DEFAULT_ORDERS_BACKLOG_LIMIT,
            orders_backlog_cache_ms: 0,
            orders_backlog_wait_ms: DEFAULT_ORDERS_BACKLOG_WAIT_MS,
            sweep_after_ms: 60_000,
            sweep_interval_ms: 5_000,
            worker_retry_ms: 2_000,
            worker_visibility_ms: 30_000,
            approval_origin: None,
            approval_rp_id: None,
            approval_session_s: 900,
            header_read_timeout_ms: DEFAULT_HEADER_READ_TIMEOUT_MS,
            body_read_timeout_ms: DEFAULT_BODY_READ_TIMEOUT_MS,
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("configuration: {var}: {message}")]
pub struct ConfigError {
    pub var: &'static str,
    pub message: String,
}

fn var(name: &'static str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn number<T: std::str::FromStr + PartialOrd + Copy + std::fmt::Display>(
    name: &'static str,
    default: T,
    min: T,
    max: T,
) -> Result<T, ConfigError> {
    match var(name) {
        None => Ok(default),
        Some(v) => match v.trim().parse::<T>() {
            Ok(n) if n >= min && n <= max => Ok(n),
            _ => Err(ConfigError {
                var: name,
                message: format!("must be a number from {min} to {max}, got {v:?}"),
            }),
        },
    }
}

/// `AIRLOCK_MCP_EXECUTE_RATE_PER_SECOND`, when set: more than 0 (a fraction spaces calls
/// more than a second apart), at most 100,000.
fn mcp_execute_rate() -> Result<Option<f64>, ConfigError> {
    const NAME: &str = "AIRLOCK_MCP_EXECUTE_RATE_PER_SECOND";
    var(NAME)
        .map(|_| number(NAME, 1.0, 0.001, 100_000.0))
        .transpose()
}

fn jwks_url(name: &'static str) -> Result<Option<String>, ConfigError> {
    match var(name) {
        None => Ok(None),
        Some(url) => crate::core::auth::jwks::check_url(url.trim())
            .map(|()| Some(url.trim().to_string()))
            .map_err(|message| ConfigError { var: name, message }),
    }
}

/// A claim name: letters, digits, `_ : - .` (a dotted path reads a nested claim).
fn claim_name(name: &'static str, default: &str) -> Result<String, ConfigError> {
    let v = var(name).unwrap_or_else(|| default.to_string());
    let ok = v
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ':' | '-' | '.'));
    if ok && !v.is_empty() {
        Ok(v)
    } else {
        Err(ConfigError {
            var: name,
            message: format!("must be a claim name, got {v:?}"),
        })
    }
}

/// `AIRLOCK_SERVICE_TOKEN_MARKER`: what only a client-credentials token carries
/// (`CLAIM=VALUE`, `CLAIM=@OTHER_CLAIM` or `none`; default `gty=client-credentials`).
/// See [`crate::core::auth::ServiceMarker`].
fn service_marker() -> Result<Option<crate::core::auth::ServiceMarker>, ConfigError> {
    let v = var("AIRLOCK_SERVICE_TOKEN_MARKER")
        .unwrap_or_else(|| crate::core::auth::DEFAULT_SERVICE_MARKER.to_string());
    crate::core::auth::ServiceMarker::parse(&v).map_err(|message| ConfigError {
        var: "AIRLOCK_SERVICE_TOKEN_MARKER",
        message,
    })
}

/// Which backend a process runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Embedded,
    Aws,
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "embedded" => Ok(Backend::Embedded),
            "aws" => Ok(Backend::Aws),
            other => Err(format!("unknown backend {other:?}: embedded or aws")),
        }
    }
}

/// The most operation timeouts one API request can wait out before it answers. A stalled
/// call fails the request, after at most one more call: the re-read after a commit whose
/// outcome is unknown, or giving the key back after a failed send. So a request waits on
/// at most two stalled calls; four leaves room for the fast calls before them (a first
/// execute makes three in all). With each call bounded by the operation timeout, a request
/// with stalled calls still answers (503) before its function's timeout; a test checks
/// this against the template.
pub const MAX_SEQUENTIAL_CALLS: u64 = 4;

/// The AWS backend's settings. Names: `AIRLOCK_RESOURCE_PREFIX` (before every default
/// name, so several stacks or test runs share one account or emulator), and every set
/// `AIRLOCK_*_TABLE`, `AIRLOCK_*_QUEUE_URL` and `AIRLOCK_SIGNING_KEY_ID`, by variable name;
/// which variables exist, and the defaults, are the AWS adapter's (`adapters::aws::shapes`).
/// Limits of every SDK call, so a stalled call answers 503 well within a function's
/// timeout: `AIRLOCK_AWS_ATTEMPT_TIMEOUT_MS` per attempt (default 1,000) and
/// `AIRLOCK_AWS_OPERATION_TIMEOUT_MS` for a call with its retries (default 2,000).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwsConfig {
    pub resource_prefix: String,
    pub given: std::collections::BTreeMap<String, String>,
    pub attempt_timeout_ms: u64,
    pub operation_timeout_ms: u64,
    /// How long the in-process consumer's `ReceiveMessage` long-polls, seconds (0 to 20;
    /// `AIRLOCK_AWS_RECEIVE_WAIT_S`, default 1). The test emulator serves one request at a
    /// time, so its tests poll without waiting.
    pub receive_wait_s: u64,
}

impl Default for AwsConfig {
    fn default() -> Self {
        AwsConfig {
            resource_prefix: String::new(),
            given: Default::default(),
            attempt_timeout_ms: 1_000,
            operation_timeout_ms: 2_000,
            receive_wait_s: 1,
        }
    }
}

impl AwsConfig {
    fn from_env() -> Result<AwsConfig, ConfigError> {
        let given = std::env::vars()
            .filter(|(k, v)| {
                k.starts_with("AIRLOCK_")
                    && (k.ends_with("_TABLE")
                        || k.ends_with("_QUEUE_URL")
                        || k == "AIRLOCK_SIGNING_KEY_ID")
                    && !v.trim().is_empty()
            })
            .map(|(k, v)| (k, v.trim().to_string()))
            .collect();
        let d = AwsConfig::default();
        let c = AwsConfig {
            resource_prefix: var("AIRLOCK_RESOURCE_PREFIX").unwrap_or_default(),
            given,
            attempt_timeout_ms: number(
                "AIRLOCK_AWS_ATTEMPT_TIMEOUT_MS",
                d.attempt_timeout_ms,
                100,
                60_000,
            )?,
            operation_timeout_ms: number(
                "AIRLOCK_AWS_OPERATION_TIMEOUT_MS",
                d.operation_timeout_ms,
                100,
                300_000,
            )?,
            receive_wait_s: number("AIRLOCK_AWS_RECEIVE_WAIT_S", d.receive_wait_s, 0, 20)?,
        };
        if c.operation_timeout_ms < c.attempt_timeout_ms {
            return Err(ConfigError {
                var: "AIRLOCK_AWS_OPERATION_TIMEOUT_MS",
                message: "must not be below AIRLOCK_AWS_ATTEMPT_TIMEOUT_MS".into(),
            });
        }
        Ok(c)
    }

    /// The value given for `var`, if any.
    pub fn given(&self, var: &str) -> Option<&str> {
        self.given.get(var).map(String::as_str)
    }
}

/// Secret bytes: never printed, not even by `{:?}` of the configuration.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

fn now() -> Result<Option<chrono::DateTime<chrono::Utc>>, ConfigError> {
    match var("AIRLOCK_NOW") {
        None => Ok(None),
        Some(v) => chrono::DateTime::parse_from_rfc3339(v.trim())
            .map(|t| Some(t.with_timezone(&chrono::Utc)))
            .map_err(|e| ConfigError {
                var: "AIRLOCK_NOW",
                message: format!("must be an RFC 3339 instant ({e})"),
            }),
    }
}

fn roles() -> Result<crate::core::auth::RoleTable, ConfigError> {
    let (name, text) = match (var("AIRLOCK_ROLES_FILE"), var("AIRLOCK_ROLES")) {
        (Some(path), _) => (
            "AIRLOCK_ROLES_FILE",
            std::fs::read_to_string(path.trim()).map_err(|e| ConfigError {
                var: "AIRLOCK_ROLES_FILE",
                message: format!("{}: {e}", path.trim()),
            })?,
        ),
        (None, Some(text)) => ("AIRLOCK_ROLES", text),
        (None, None) => return Ok(crate::core::auth::RoleTable::default()),
    };
    crate::core::auth::RoleTable::parse(&text).map_err(|message| ConfigError { var: name, message })
}

fn cursor_key() -> Result<Option<Secret>, ConfigError> {
    use base64::Engine;
    let Some(v) = var("AIRLOCK_CURSOR_KEY") else {
        return Ok(None);
    };
    let err = |message: &str| ConfigError {
        var: "AIRLOCK_CURSOR_KEY",
        message: message.into(),
    };
    let k = base64::engine::general_purpose::STANDARD
        .decode(v.trim())
        .map_err(|_| err("not base64"))?;
    if k.len() < 32 {
        return Err(err("needs at least 32 bytes"));
    }
    Ok(Some(Secret(k)))
}

/// `AIRLOCK_CONFIRMATION_PUBLIC_KEY`, parsed ([`crate::core::token::parse_public_key`]). The
/// error never quotes the value (a private key pasted by mistake stays out of the logs).
fn confirmation_public_key() -> Result<Option<p256::PublicKey>, ConfigError> {
    const VAR: &str = "AIRLOCK_CONFIRMATION_PUBLIC_KEY";
    match var(VAR) {
        None => Ok(None),
        Some(v) => crate::core::token::parse_public_key(&v)
            .map(Some)
            .map_err(|message| ConfigError { var: VAR, message }),
    }
}

impl Config {
    /// Rules across variables: the two token kinds must be told apart, and the JWKS
    /// refetch cooldown may not outlast the cache.
    fn check(&self) -> Result<(), ConfigError> {
        if self.service_issuer == self.operator_issuer
            && self.service_audience == self.operator_audience
            && self.service_audience_claim == self.operator_audience_claim
        {
            return Err(ConfigError {
                var: "AIRLOCK_OPERATOR_AUDIENCE",
                message: "service and operator tokens would be indistinguishable (same issuer, \
                          audience and audience claim): give them different audiences"
                    .into(),
            });
        }
        if self.jwks_refetch_cooldown_s > self.jwks_cache_s {
            return Err(ConfigError {
                var: "AIRLOCK_JWKS_REFETCH_COOLDOWN_SECONDS",
                message: "must not exceed AIRLOCK_JWKS_CACHE_SECONDS".into(),
            });
        }
        Ok(())
    }

    /// Reads `AIRLOCK_*` variables over the defaults. `state_dir` comes from the caller
    /// (the command line's `--state-dir`, itself defaulting to `AIRLOCK_STATE_DIR`).
    pub fn from_env() -> Result<Config, ConfigError> {
        let d = Config::default();
        let c = Config {
            state_dir: var("AIRLOCK_STATE_DIR")
                .map(PathBuf::from)
                .unwrap_or(d.state_dir),
            backend: match var("AIRLOCK_BACKEND") {
                None => d.backend,
                Some(v) => v.trim().parse().map_err(|message| ConfigError {
                    var: "AIRLOCK_BACKEND",
                    message,
                })?,
            },
            now: now()?,
            roles: roles()?,
            cursor_key: cursor_key()?,
            aws: AwsConfig::from_env()?,
            service_issuer: var("AIRLOCK_SERVICE_ISSUER").unwrap_or(d.service_issuer),
            service_audience: var("AIRLOCK_SERVICE_AUDIENCE").unwrap_or(d.service_audience),
            operator_issuer: var("AIRLOCK_OPERATOR_ISSUER").unwrap_or(d.operator_issuer),
            operator_audience: var("AIRLOCK_OPERATOR_AUDIENCE").unwrap_or(d.operator_audience),
            service_jwks_url: jwks_url("AIRLOCK_SERVICE_JWKS_URL")?,
            operator_jwks_url: jwks_url("AIRLOCK_OPERATOR_JWKS_URL")?,
            service_audience_claim: claim_name("AIRLOCK_SERVICE_AUDIENCE_CLAIM", "aud")?,
            operator_audience_claim: claim_name("AIRLOCK_OPERATOR_AUDIENCE_CLAIM", "aud")?,
            claims: crate::core::auth::ClaimNames {
                scope_prefix: var("AIRLOCK_SERVICE_SCOPE_PREFIX").unwrap_or_default(),
                roles: claim_name("AIRLOCK_OPERATOR_ROLES_CLAIM", "roles")?,
                desks: claim_name("AIRLOCK_OPERATOR_DESKS_CLAIM", "desks")?,
                service_marker: service_marker()?,
            },
            jwks_cache_s: number("AIRLOCK_JWKS_CACHE_SECONDS", 600, 60, 86_400)?,
            jwks_refetch_cooldown_s: number("AIRLOCK_JWKS_REFETCH_COOLDOWN_SECONDS", 30, 1, 3_600)?,
            confirmation_audience: var("AIRLOCK_CONFIRMATION_AUDIENCE")
                .unwrap_or(d.confirmation_audience),
            confirmation_ttl_s: number("AIRLOCK_CONFIRMATION_TTL_SECONDS", 300, 30, 900)?,
            confirmation_public_key: confirmation_public_key()?,
            max_service_token_lifetime_s: number(
                "AIRLOCK_MAX_SERVICE_TOKEN_LIFETIME_SECONDS",
                900,
                60,
                900,
            )?,
            clock_skew_s: number("AIRLOCK_CLOCK_SKEW_SECONDS", 60, 0, 60)?,
            execute_lease_ms: number("AIRLOCK_EXECUTE_LEASE_MS", 10_000, 1_000, 120_000)?,
            execute_rate_per_minute: number("AIRLOCK_EXECUTE_RATE_PER_MINUTE", 20, 1, 1_000_000)?,
            plan_rate_per_minute: number(
                "AIRLOCK_PLAN_RATE_PER_MINUTE",
                DEFAULT_PLAN_RATE_PER_MINUTE,
                1,
                1_000_000,
            )?,
            mcp_execute_rate_per_second: mcp_execute_rate()?,
            mcp_execute_burst: match mcp_execute_rate()? {
                None => d.mcp_execute_burst,
                Some(r) => number("AIRLOCK_MCP_EXECUTE_BURST", r.ceil() as u32, 1, 100_000)?,
            },
            approval_hold_ms: number(
                "AIRLOCK_APPROVAL_HOLD_MS",
                DEFAULT_APPROVAL_HOLD_MS,
                0,
                DEFAULT_APPROVAL_HOLD_MS,
            )?,
            approval_holds_per_operator: number(
                "AIRLOCK_APPROVAL_HOLDS_PER_OPERATOR",
                DEFAULT_APPROVAL_HOLDS_PER_OPERATOR,
                0,
                100,
            )?,
            orders_backlog_limit: number(
                "AIRLOCK_ORDERS_BACKLOG_LIMIT",
                DEFAULT_ORDERS_BACKLOG_LIMIT,
                0,
                1_000_000,
            )?,
            orders_backlog_cache_ms: number("AIRLOCK_ORDERS_BACKLOG_CACHE_MS", 0, 0, 60_000)?,
            orders_backlog_wait_ms: number(
                "AIRLOCK_ORDERS_BACKLOG_WAIT_MS",
                DEFAULT_ORDERS_BACKLOG_WAIT_MS,
                0,
                10_000,
            )?,
            sweep_after_ms: number("AIRLOCK_SWEEP_AFTER_MS", 60_000, 1_000, 3_600_000)?,
            sweep_interval_ms: number("AIRLOCK_SWEEP_INTERVAL_MS", 5_000, 100, 600_000)?,
            worker_retry_ms: number("AIRLOCK_WORKER_RETRY_MS", 2_000, 10, 600_000)?,
            worker_visibility_ms: number(
                "AIRLOCK_WORKER_VISIBILITY_MS",
                30_000,
                1_000,
                43_200_000,
            )?,
            approval_origin: var("AIRLOCK_APPROVAL_ORIGIN").map(|v| v.trim().to_string()),
            approval_rp_id: var("AIRLOCK_APPROVAL_RP_ID").map(|v| v.trim().to_string()),
            approval_session_s: number("AIRLOCK_APPROVAL_SESSION_SECONDS", 900, 60, 3_600)?,
            header_read_timeout_ms: number(
                "AIRLOCK_HEADER_READ_TIMEOUT_MS",
                DEFAULT_HEADER_READ_TIMEOUT_MS,
                100,
                120_000,
            )?,
            body_read_timeout_ms: number(
                "AIRLOCK_BODY_READ_TIMEOUT_MS",
                DEFAULT_BODY_READ_TIMEOUT_MS,
                100,
                120_000,
            )?,
        };
        c.check()?;
        Ok(c)
    }
}
