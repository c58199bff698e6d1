//! Typed configuration, read once at start. Environment names mirror the SAM template's
//! `Environment` keys; a bad value names the variable at fault.

use std::path::PathBuf;

#[derive(Debug, Clone)]
pub struct Config {
    /// Where the embedded backend keeps its SQLite file and local keys.
    pub state_dir: PathBuf,
    pub service_issuer: String,
    pub service_audience: String,
    pub operator_issuer: String,
    pub operator_audience: String,
    /// `aud` of confirmation tokens.
    pub confirmation_audience: String,
    /// Confirmation-token and plan lifetime, 30..=900 s (default 300).
    pub confirmation_ttl_s: u32,
    /// Longest accepted service-token lifetime (`exp - iat`), seconds.
    pub max_service_token_lifetime_s: u32,
    /// Clock skew tolerated on `exp`, `nbf` and `iat`, seconds (at most 60).
    pub clock_skew_s: u32,
    /// How long an execute attempt holds its idempotency key before another may take over.
    pub execute_lease_ms: i64,
    /// Per-operator decided executes per rolling minute.
    pub execute_rate_per_minute: u32,
    /// An action claimed but not sent for this long is resent by the sweeper.
    pub sweep_after_ms: i64,
    /// How often `airlock serve` runs the sweeper.
    pub sweep_interval_ms: u64,
    /// A failed message is retried after this delay times its attempt number.
    pub worker_retry_ms: u64,
    /// How long a received message stays hidden while a worker handles it; a worker that
    /// dies leaves it to be redelivered after this.
    pub worker_visibility_ms: u64,
}

pub const DEFAULT_SERVICE_ISSUER: &str = "airlock-local-dev";
pub const DEFAULT_SERVICE_AUDIENCE: &str = "airlock-api";
pub const DEFAULT_OPERATOR_ISSUER: &str = "airlock-local-dev-operators";
pub const DEFAULT_OPERATOR_AUDIENCE: &str = "airlock-operators";
pub const DEFAULT_CONFIRMATION_AUDIENCE: &str = "airlock-execute";

impl Default for Config {
    fn default() -> Self {
        Config {
            state_dir: PathBuf::from(".airlock"),
            service_issuer: DEFAULT_SERVICE_ISSUER.into(),
            service_audience: DEFAULT_SERVICE_AUDIENCE.into(),
            operator_issuer: DEFAULT_OPERATOR_ISSUER.into(),
            operator_audience: DEFAULT_OPERATOR_AUDIENCE.into(),
            confirmation_audience: DEFAULT_CONFIRMATION_AUDIENCE.into(),
            confirmation_ttl_s: 300,
            max_service_token_lifetime_s: 900,
            clock_skew_s: 60,
            execute_lease_ms: 10_000,
            execute_rate_per_minute: 20,
            sweep_after_ms: 60_000,
            sweep_interval_ms: 5_000,
            worker_retry_ms: 2_000,
            worker_visibility_ms: 30_000,
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

impl Config {
    /// Reads `AIRLOCK_*` variables over the defaults. `state_dir` comes from the caller
    /// (the command line's `--state-dir`, itself defaulting to `AIRLOCK_STATE_DIR`).
    pub fn from_env() -> Result<Config, ConfigError> {
        let d = Config::default();
        Ok(Config {
            state_dir: var("AIRLOCK_STATE_DIR")
                .map(PathBuf::from)
                .unwrap_or(d.state_dir),
            service_issuer: var("AIRLOCK_SERVICE_ISSUER").unwrap_or(d.service_issuer),
            service_audience: var("AIRLOCK_SERVICE_AUDIENCE").unwrap_or(d.service_audience),
            operator_issuer: var("AIRLOCK_OPERATOR_ISSUER").unwrap_or(d.operator_issuer),
            operator_audience: var("AIRLOCK_OPERATOR_AUDIENCE").unwrap_or(d.operator_audience),
            confirmation_audience: var("AIRLOCK_CONFIRMATION_AUDIENCE")
                .unwrap_or(d.confirmation_audience),
            confirmation_ttl_s: number("AIRLOCK_CONFIRMATION_TTL_SECONDS", 300, 30, 900)?,
            max_service_token_lifetime_s: number(
                "AIRLOCK_MAX_SERVICE_TOKEN_LIFETIME_SECONDS",
                900,
                60,
                900,
            )?,
            clock_skew_s: number("AIRLOCK_CLOCK_SKEW_SECONDS", 60, 0, 60)?,
            execute_lease_ms: number("AIRLOCK_EXECUTE_LEASE_MS", 10_000, 1_000, 120_000)?,
            execute_rate_per_minute: number("AIRLOCK_EXECUTE_RATE_PER_MINUTE", 20, 1, 1_000_000)?,
            sweep_after_ms: number("AIRLOCK_SWEEP_AFTER_MS", 60_000, 1_000, 3_600_000)?,
            sweep_interval_ms: number("AIRLOCK_SWEEP_INTERVAL_MS", 5_000, 100, 600_000)?,
            worker_retry_ms: number("AIRLOCK_WORKER_RETRY_MS", 2_000, 10, 600_000)?,
            worker_visibility_ms: number(
                "AIRLOCK_WORKER_VISIBILITY_MS",
                30_000,
                1_000,
                43_200_000,
            )?,
        })
    }
}
