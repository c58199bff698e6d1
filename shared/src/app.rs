//! Wiring: the state every handler gets, built once per process (per cold start in Lambda).

use std::sync::Arc;

use crate::adapters::keys;
use crate::adapters::local_signer::LocalSigner;
use crate::adapters::sqlite::Sqlite;
use crate::auth::dev_issuer::{DevIssuer, DEV_ISSUER_KID};
use crate::auth::{Authenticator, IssuerKeys, RoleTable};
use crate::clock::SharedClock;
use crate::config::Config;
use crate::pagination::CursorCodec;
use crate::policy::Policy;
use crate::ports::{
    AccountStore, ActionStore, AuditLog, ControlStore, ExecuteLedger, JobStore, OrderStore,
    PlanStore, PositionStore, Queue, ReadModelWriter, Signer,
};
use crate::token::ConfirmationVerifier;

/// The ports, one field per capability.
#[derive(Clone)]
pub struct Ports {
    pub accounts: Arc<dyn AccountStore>,
    pub positions: Arc<dyn PositionStore>,
    pub orders: Arc<dyn OrderStore>,
    pub jobs: Arc<dyn JobStore>,
    pub actions: Arc<dyn ActionStore>,
    pub plans: Arc<dyn PlanStore>,
    pub ledger: Arc<dyn ExecuteLedger>,
    pub control: Arc<dyn ControlStore>,
    pub audit: Arc<dyn AuditLog>,
    pub queue: Arc<dyn Queue>,
    pub signer: Arc<dyn Signer>,
    pub read_models: Arc<dyn ReadModelWriter>,
}

impl Ports {
    /// Every port on one SQLite database, tokens signed by a local key.
    pub fn sqlite(db: &Sqlite, signer: Arc<dyn Signer>) -> Ports {
        let db = Arc::new(db.clone());
        Ports {
            accounts: db.clone(),
            positions: db.clone(),
            orders: db.clone(),
            jobs: db.clone(),
            actions: db.clone(),
            plans: db.clone(),
            ledger: db.clone(),
            control: db.clone(),
            audit: db.clone(),
            queue: db.clone(),
            signer,
            read_models: db,
        }
    }
}

#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub clock: SharedClock,
    pub auth: Arc<Authenticator>,
    pub cursors: CursorCodec,
    pub confirmations: Arc<ConfirmationVerifier>,
    pub policy: Arc<Policy>,
    pub ports: Ports,
}

/// Files in the state dir.
pub mod files {
    pub const DEV_ISSUER_KEY: &str = "dev-issuer-key.pem";
    pub const CONFIRMATION_KEY: &str = "confirmation-signing-key.pem";
    pub const CURSOR_KEY: &str = "cursor-mac.key";
    pub const POLICY: &str = "policy.json";
}

/// Key id of the local confirmation-token signer.
pub const LOCAL_CONFIRMATION_KID: &str = "airlock-local-confirm-1";

/// The local dev issuer of the state dir (created on first use).
pub fn dev_issuer(cfg: &Config) -> Result<DevIssuer, String> {
    let key = keys::load_or_create_p256(&cfg.state_dir.join(files::DEV_ISSUER_KEY))?;
    DevIssuer::new(&key)
}

/// Authenticator that accepts tokens of the local dev issuer.
pub fn dev_authenticator(cfg: &Config) -> Result<Authenticator, String> {
    let issuer = dev_issuer(cfg)?;
    Ok(Authenticator {
        service: IssuerKeys::new(&cfg.service_issuer, &cfg.service_audience)
            .with_es256(DEV_ISSUER_KID, &issuer.public),
        operator: IssuerKeys::new(&cfg.operator_issuer, &cfg.operator_audience)
            .with_es256(DEV_ISSUER_KID, &issuer.public),
        roles: RoleTable::default(),
        max_service_lifetime_s: cfg.max_service_token_lifetime_s as i64,
        skew_s: cfg.clock_skew_s as i64,
    })
}

/// The embedded stack: SQLite in the state dir, local keys, the policy file if present.
pub fn embedded(cfg: Config, clock: SharedClock) -> Result<(AppState, Sqlite), String> {
    let db = Sqlite::open(&cfg.state_dir)?;
    let confirm_key = keys::load_or_create_p256(&cfg.state_dir.join(files::CONFIRMATION_KEY))?;
    let signer: Arc<dyn Signer> = Arc::new(LocalSigner::new(LOCAL_CONFIRMATION_KID, &confirm_key));
    let cursor_key = keys::load_or_create_secret(&cfg.state_dir.join(files::CURSOR_KEY))?;
    let policy = Policy::load_local(&cfg.state_dir.join(files::POLICY))?;
    let state = AppState {
        auth: Arc::new(dev_authenticator(&cfg)?),
        cursors: CursorCodec::new(cursor_key),
        confirmations: Arc::new(ConfirmationVerifier::new(
            &cfg.confirmation_audience,
            signer.key_id(),
            signer.public_key(),
        )),
        policy: Arc::new(policy),
        ports: Ports::sqlite(&db, signer),
        config: Arc::new(cfg),
        clock,
    };
    Ok((state, db))
}

/// The state a Lambda builds once per cold start, from its environment.
///
/// Today this is the embedded backend under `AIRLOCK_STATE_DIR` (useful with
/// `cargo lambda watch`); the DynamoDB/SQS/KMS backend is selected here once it lands.
pub fn from_env() -> Result<AppState, String> {
    let cfg = Config::from_env().map_err(|e| e.to_string())?;
    let clock: SharedClock = Arc::new(crate::clock::OffsetClock::system());
    match std::env::var("AIRLOCK_BACKEND").as_deref() {
        Ok("embedded") | Err(_) => embedded(cfg, clock).map(|(s, _)| s),
        Ok(other) => Err(format!(
            "configuration: AIRLOCK_BACKEND: unknown backend {other:?} (this build knows: embedded)"
        )),
    }
}
