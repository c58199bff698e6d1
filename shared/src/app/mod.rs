//! Wiring: the state every handler gets, built once per process (per cold start in Lambda).

pub mod seed;

use std::sync::Arc;

use crate::adapters::dev_issuer::{DevIssuer, DEV_ISSUER_KID};
use crate::adapters::jwks_http::HttpFetcher;
use crate::adapters::keys;
use crate::adapters::local_signer::LocalSigner;
use crate::adapters::sqlite::Sqlite;
use crate::config::Config;
use crate::core::auth::jwks::{JwksCache, JwksTiming};
use crate::core::auth::{Authenticator, Issuer, KeySet, KeySource};
use crate::core::clock::SharedClock;
use crate::core::pagination::CursorCodec;
use crate::core::policy::Policy;
use crate::core::ports::Prices;
use crate::core::ports::{
    AccountStore, ActionStore, AuditLog, ControlStore, ExecuteLedger, JobStore, OrderStore,
    PlanStore, PositionStore, Queue, ReadModelWriter, Signer,
};
use crate::core::token::ConfirmationVerifier;
use crate::core::usecases::approvals::Approvals;
use crate::core::usecases::execute::{Dispatch, Executor};
use crate::core::usecases::plan::Planner;
use crate::core::usecases::reads::Reads;
use crate::core::usecases::worker::consumer::Consumer;
use crate::core::usecases::worker::sweeper::Sweeper;
use crate::core::usecases::worker::Worker;

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
    pub workers: Arc<dyn crate::core::ports::WorkerStore>,
    pub broker: Arc<dyn crate::core::ports::broker::Broker>,
    /// Reference prices for the price band (the paper broker's table).
    pub prices: Arc<dyn Prices>,
    /// The paper broker behind `broker` (its prices and book), for seeding and the CLI.
    pub paper: Arc<crate::adapters::paper_broker::PaperBroker>,
    /// The approval channel's documents (passkey operators, enrolments, challenges,
    /// sessions).
    pub approvals: Arc<dyn crate::core::ports::ApprovalStore>,
    /// The plan rate, approval holds and once-only audit marks.
    pub limits: Arc<dyn crate::core::ports::limits::LimitStore>,
}

impl Ports {
    /// Every port on one SQLite database, tokens signed by a local key.
    pub fn sqlite(db: &Sqlite, signer: Arc<dyn Signer>) -> Ports {
        let db = Arc::new(db.clone());
        let paper = Arc::new(crate::adapters::paper_broker::PaperBroker::new(db.clone()));
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
            read_models: db.clone(),
            workers: db.clone(),
            broker: paper.clone(),
            prices: paper.clone(),
            paper,
            approvals: db.clone(),
            limits: db.clone(),
        }
    }
}

/// What every front door gets (the REST handlers, the consumers, the CLI): the use cases
/// ([`UseCases`], its fields read through this), built once per process (per cold start in
/// Lambda). One `Arc`: axum clones the state for every request, and a clone of thirteen
/// `Arc`s would be thirteen shared counters moved up and down by both cores.
#[derive(Clone)]
pub struct AppState(Arc<UseCases>);

impl std::ops::Deref for AppState {
    type Target = UseCases;
    fn deref(&self) -> &UseCases {
        &self.0
    }
}

/// The use cases, each holding only the ports and settings it uses. `ports` is for the
/// CLI and the demo seed; no use case sees it.
pub struct UseCases {
    pub config: Arc<Config>,
    pub clock: SharedClock,
    pub auth: Arc<Authenticator>,
    /// The process's policy: the state dir's `policy.json`, or the defaults. A policy in
    /// the control record takes precedence (see [`crate::core::policy::in_force`]).
    pub policy: Arc<Policy>,
    pub plan: Arc<Planner>,
    pub execute: Arc<Executor>,
    pub reads: Arc<Reads>,
    /// The portfolio reads: valued positions, allocation, risk flags.
    pub portfolio: Arc<crate::core::usecases::portfolio::Portfolios>,
    pub worker: Arc<Worker>,
    pub sweeper: Arc<Sweeper>,
    pub approvals: Arc<Approvals>,
    pub ports: Arc<Ports>,
}

impl AppState {
    /// Builds every use case from the ports and the configuration.
    pub fn new(
        config: Config,
        clock: SharedClock,
        auth: Authenticator,
        cursors: CursorCodec,
        policy: Policy,
        ports: Ports,
    ) -> AppState {
        ports.paper.set_clock(clock.clone());
        let policy = Arc::new(policy);
        let dispatch = Dispatch {
            queue: ports.queue.clone(),
            ledger: ports.ledger.clone(),
        };
        // A configured public key: no signer call at all (no KMS `GetPublicKey` at cold
        // start); else the signer's, fetched once. Plan tells it of the tokens it signs.
        let confirmations = Arc::new(match &config.confirmation_public_key {
            Some(key) => ConfirmationVerifier::with_public_key(
                &config.confirmation_audience,
                ports.signer.key_id(),
                key,
            ),
            None => ConfirmationVerifier::new(&config.confirmation_audience, ports.signer.clone()),
        });
        let plan = Planner {
            clock: clock.clone(),
            policy: policy.clone(),
            confirmation_ttl_s: config.confirmation_ttl_s,
            confirmation_audience: config.confirmation_audience.clone(),
            accounts: ports.accounts.clone(),
            positions: ports.positions.clone(),
            orders: ports.orders.clone(),
            control: ports.control.clone(),
            plans: ports.plans.clone(),
            prices: ports.prices.clone(),
            signer: ports.signer.clone(),
            confirmations: confirmations.clone(),
            approval_origin: config.approval_origin(),
            rate: crate::core::usecases::limits::PlanRate {
                store: ports.limits.clone(),
                limit: config.plan_rate_per_minute,
                clock: clock.clone(),
            },
        };
        let execute = Executor {
            clock: clock.clone(),
            policy: policy.clone(),
            lease_ms: config.execute_lease_ms,
            rate_per_minute: config.execute_rate_per_minute,
            backlog: crate::core::usecases::execute::Backlog::new(
                config.orders_backlog_limit,
                config.orders_backlog_cache_ms,
                config.orders_backlog_wait_ms,
            ),
            confirmations: confirmations.clone(),
            ledger: ports.ledger.clone(),
            audit: ports.audit.clone(),
            accounts: ports.accounts.clone(),
            positions: ports.positions.clone(),
            prices: ports.prices.clone(),
            actions: ports.actions.clone(),
            dispatch: dispatch.clone(),
            approval_origin: config.approval_origin(),
            limits: ports.limits.clone(),
        };
        let portfolio = Arc::new(crate::core::usecases::portfolio::Portfolios {
            clock: clock.clone(),
            policy: policy.clone(),
            accounts: ports.accounts.clone(),
            positions: ports.positions.clone(),
            prices: ports.prices.clone(),
            control: ports.control.clone(),
        });
        let reads = Reads {
            accounts: ports.accounts.clone(),
            positions: ports.positions.clone(),
            orders: ports.orders.clone(),
            jobs: ports.jobs.clone(),
            actions: ports.actions.clone(),
            cursors: cursors.clone(),
        };
        let worker = Arc::new(Worker {
            clock: clock.clone(),
            policy: policy.clone(),
            visibility_ms: config.worker_visibility_ms,
            accounts: ports.accounts.clone(),
            positions: ports.positions.clone(),
            orders: ports.orders.clone(),
            actions: ports.actions.clone(),
            control: ports.control.clone(),
            store: ports.workers.clone(),
            broker: ports.broker.clone(),
            prices: ports.prices.clone(),
        });
        let sweeper = Sweeper {
            clock: clock.clone(),
            sweep_after_ms: config.sweep_after_ms,
            lease_ms: config.execute_lease_ms,
            actions: ports.actions.clone(),
            audit: ports.audit.clone(),
            dispatch,
            worker: worker.clone(),
        };
        let origin = config.approval_origin();
        let approvals = Approvals {
            clock: clock.clone(),
            webauthn: crate::core::usecases::approvals::relying_party(
                &origin,
                config.approval_rp_id.as_deref(),
            )
            .map(Arc::new),
            origin,
            session_ttl_s: config.approval_session_s,
            roles: config.roles.clone(),
            docs: ports.approvals.clone(),
            plans: ports.plans.clone(),
            audit: ports.audit.clone(),
            tickets: cursors.clone(),
            decoys: Arc::new(crate::core::usecases::approvals::DecoyCredentials::new(
                cursors.derive_key("approvals-decoy-credentials"),
            )),
        };
        let plan = Arc::new(plan);
        let execute = Arc::new(execute);
        let reads = Arc::new(reads);
        AppState(Arc::new(UseCases {
            approvals: Arc::new(approvals),
            config: Arc::new(config),
            clock,
            auth: Arc::new(auth),
            policy,
            plan,
            execute,
            reads,
            portfolio,
            worker,
            sweeper: Arc::new(sweeper),
            ports: Arc::new(ports),
        }))
    }

    /// The policy in force under this control record.
    pub fn policy_for<'a>(&'a self, control: &'a crate::core::records::Control) -> &'a Policy {
        crate::core::policy::in_force(&self.policy, control)
    }

    /// A consumer of one queue's messages, for `airlock serve`.
    pub fn consumer(&self) -> Consumer {
        Consumer {
            worker: self.worker.clone(),
            queue: self.ports.queue.clone(),
        }
    }
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

/// Where one token kind's keys come from: its JWKS URL when configured; else, when
/// `dev_fallback`, the local dev issuer of the state dir (`airlock serve`, `airlock token`);
/// else nowhere (a Lambda with no identity provider refuses every token, saying why).
fn key_source(
    url: Option<&str>,
    var: &'static str,
    cfg: &Config,
    dev_fallback: bool,
    fetcher: &mut Option<Arc<HttpFetcher>>,
) -> Result<KeySource, String> {
    if let Some(url) = url {
        let fetcher = match fetcher {
            Some(f) => f.clone(),
            None => fetcher.insert(Arc::new(HttpFetcher::default())).clone(),
        };
        let timing = JwksTiming {
            cache_ttl: std::time::Duration::from_secs(cfg.jwks_cache_s.into()),
            refetch_cooldown: std::time::Duration::from_secs(cfg.jwks_refetch_cooldown_s.into()),
            ..JwksTiming::default()
        };
        return Ok(KeySource::Jwks(Arc::new(JwksCache::new(
            url, timing, fetcher,
        ))));
    }
    if !dev_fallback {
        tracing::warn!("{var} is not set: every token of this kind will be refused");
        return Ok(KeySource::Unconfigured(var));
    }
    let mut set = KeySet::default();
    set.insert(
        DEV_ISSUER_KID,
        jsonwebtoken::Algorithm::ES256,
        crate::core::auth::es256_decoding_key(&dev_issuer(cfg)?.public),
    );
    Ok(KeySource::Static(set))
}

/// The authenticator of this process: each token kind verified against its provider's
/// JWKS, or the local dev issuer where allowed (see [`key_source`]).
pub fn authenticator(cfg: &Config, dev_fallback: bool) -> Result<Authenticator, String> {
    if dev_fallback && cfg.service_jwks_url.is_some() != cfg.operator_jwks_url.is_some() {
        tracing::warn!(
            "only one of AIRLOCK_SERVICE_JWKS_URL and AIRLOCK_OPERATOR_JWKS_URL is set: the \
             other token kind is verified with the local dev issuer's key"
        );
    }
    let mut fetcher = None;
    let service_keys = key_source(
        cfg.service_jwks_url.as_deref(),
        "AIRLOCK_SERVICE_JWKS_URL",
        cfg,
        dev_fallback,
        &mut fetcher,
    )?;
    // One provider for both kinds (a Cognito pool, one OIDC tenant): one cache, one fetch.
    let operator_keys = match &service_keys {
        KeySource::Jwks(_) if cfg.operator_jwks_url == cfg.service_jwks_url => service_keys.clone(),
        _ => key_source(
            cfg.operator_jwks_url.as_deref(),
            "AIRLOCK_OPERATOR_JWKS_URL",
            cfg,
            dev_fallback,
            &mut fetcher,
        )?,
    };
    let mut service = Issuer::new(&cfg.service_issuer, &cfg.service_audience, service_keys);
    service.audience_claim = cfg.service_audience_claim.clone();
    let mut operator = Issuer::new(&cfg.operator_issuer, &cfg.operator_audience, operator_keys);
    operator.audience_claim = cfg.operator_audience_claim.clone();
    Ok(Authenticator {
        service,
        operator,
        claims: cfg.claims.clone(),
        roles: cfg.roles.clone(),
        max_service_lifetime_s: cfg.max_service_token_lifetime_s as i64,
        skew_s: cfg.clock_skew_s as i64,
        verified_services: Default::default(),
        verified_operators: Default::default(),
    })
}

impl Ports {
    /// Every store on DynamoDB, queues on SQS, tokens signed by KMS.
    pub fn aws(aws: &crate::adapters::aws::Aws, signer: Arc<dyn Signer>) -> Ports {
        let a = Arc::new(aws.clone());
        let paper = Arc::new(crate::adapters::paper_broker::PaperBroker::new(a.clone()));
        Ports {
            accounts: a.clone(),
            positions: a.clone(),
            orders: a.clone(),
            jobs: a.clone(),
            actions: a.clone(),
            plans: a.clone(),
            ledger: a.clone(),
            control: a.clone(),
            audit: a.clone(),
            queue: a.clone(),
            signer,
            read_models: a.clone(),
            workers: a.clone(),
            broker: paper.clone(),
            prices: paper.clone(),
            paper,
            approvals: a.clone(),
            limits: a.clone(),
        }
    }
}

pub use crate::config::Backend;

/// The cursor MAC key: the configured one (`AIRLOCK_CURSOR_KEY`), else a key file in the
/// state dir.
fn cursor_key(cfg: &Config) -> Result<Vec<u8>, String> {
    match &cfg.cursor_key {
        Some(k) => Ok(k.0.clone()),
        None => keys::load_or_create_secret(&cfg.state_dir.join(files::CURSOR_KEY)),
    }
}

/// The AWS stack: DynamoDB, SQS and KMS through the standard AWS environment.
/// `dev_issuer`: accept the state dir's dev issuer for a token kind without a JWKS URL
/// (`airlock serve --backend aws`); a deployed Lambda passes `false`.
pub async fn aws(cfg: Config, clock: SharedClock, dev_issuer: bool) -> Result<AppState, String> {
    let aws = crate::adapters::aws::Aws::connect(&cfg.aws).await?;
    let signer: Arc<dyn Signer> = Arc::new(crate::adapters::aws::KmsSigner::new(
        aws.kms.clone(),
        &aws.names.signing_key_id,
    ));
    let policy = Policy::load_local(&cfg.state_dir.join(files::POLICY))?;
    let auth = authenticator(&cfg, dev_issuer)?;
    let cursors = CursorCodec::new(cursor_key(&cfg)?);
    Ok(AppState::new(
        cfg,
        clock,
        auth,
        cursors,
        policy,
        Ports::aws(&aws, signer),
    ))
}

/// The embedded stack: SQLite in the state dir, local keys, the policy file if present.
pub fn embedded(cfg: Config, clock: SharedClock) -> Result<(AppState, Sqlite), String> {
    let db = Sqlite::open(&cfg.state_dir)?;
    let confirm_key = keys::load_or_create_p256(&cfg.state_dir.join(files::CONFIRMATION_KEY))?;
    let signer: Arc<dyn Signer> = Arc::new(LocalSigner::new(LOCAL_CONFIRMATION_KID, &confirm_key)?);
    let cursor_key = cursor_key(&cfg)?;
    let policy = Policy::load_local(&cfg.state_dir.join(files::POLICY))?;
    let auth = authenticator(&cfg, true)?;
    let state = AppState::new(
        cfg,
        clock,
        auth,
        CursorCodec::new(cursor_key),
        policy,
        Ports::sqlite(&db, signer),
    );
    Ok((state, db))
}

/// The state a Lambda builds once per cold start, from its environment:
/// `AIRLOCK_BACKEND` = `aws` (DynamoDB, SQS, KMS) or `embedded` (SQLite under
/// `AIRLOCK_STATE_DIR`, for `cargo lambda watch`). Lambdas ignore `AIRLOCK_NOW`.
pub async fn from_env() -> Result<AppState, String> {
    let cfg = Config::from_env().map_err(|e| e.to_string())?;
    let clock: SharedClock = Arc::new(crate::core::clock::OffsetClock::system());
    match cfg.backend {
        Backend::Aws => aws(cfg, clock, false).await,
        Backend::Embedded => embedded(cfg, clock).map(|(s, _)| s),
    }
}
