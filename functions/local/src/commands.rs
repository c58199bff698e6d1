//! The subcommands of `airlock`.

use std::sync::Arc;

use airlock::app::{self, AppState, Backend};
use airlock::config::Config;
use airlock::core::clock::{OffsetClock, SharedClock};
use airlock::core::domain::{human_time, ActionType};
use airlock::core::records::RolloutMode;
use airlock::core::usecases::control;
use clap::Subcommand;

#[derive(Subcommand)]
pub enum TokenKind {
    /// A service (Mastra) token for `Authorization: Bearer`.
    Service {
        #[arg(long, default_value = "mastra-dev")]
        sub: String,
        #[arg(long, default_value = "trade.read trade.plan trade.execute")]
        scopes: String,
        /// Lifetime in seconds (at most 900 for service tokens).
        #[arg(long, default_value_t = 900)]
        ttl: i64,
    },
    /// An operator token for `X-Operator-Token`.
    Operator {
        #[arg(long)]
        sub: String,
        /// Comma- or space-separated roles.
        #[arg(long, default_value = "trader")]
        roles: String,
        /// Comma- or space-separated desks (`*` for all).
        #[arg(long)]
        desks: Option<String>,
        #[arg(long, default_value_t = 900)]
        ttl: i64,
    },
}

fn clock(cfg: &Config) -> SharedClock {
    Arc::new(OffsetClock::starting_at_or_system(cfg.now))
}

pub fn list(s: &str) -> Vec<String> {
    s.split([',', ' '])
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(String::from)
        .collect()
}

pub fn token(cfg: Config, kind: TokenKind) -> Result<(), String> {
    let issuer = app::dev_issuer(&cfg)?;
    let now = clock(&cfg).now_ms().div_euclid(1000);
    let t = match kind {
        TokenKind::Service { sub, scopes, ttl } => {
            if !(1..=cfg.max_service_token_lifetime_s as i64).contains(&ttl) {
                return Err(format!(
                    "--ttl must be 1..={} seconds for a service token",
                    cfg.max_service_token_lifetime_s
                ));
            }
            issuer.service_token(&cfg, &sub, &scopes, now, ttl)
        }
        TokenKind::Operator {
            sub,
            roles,
            desks,
            ttl,
        } => {
            if ttl < 1 {
                return Err("--ttl must be at least 1 second".into());
            }
            let desks = desks.map(|d| list(&d));
            issuer.operator_token(&cfg, &sub, &list(&roles), desks.as_deref(), now, ttl)
        }
    };
    outln!("{t}");
    Ok(())
}

/// The state on the chosen backend; the embedded one seeds demo data into a new database.
pub(crate) async fn state(cfg: Config, backend: Backend) -> Result<AppState, String> {
    match backend {
        Backend::Aws => app::aws(cfg.clone(), clock(&cfg), true).await,
        Backend::Embedded => {
            let (state, db) = app::embedded(cfg.clone(), clock(&cfg))?;
            if db.is_empty().await.map_err(|e| e.to_string())? {
                airlock::app::seed::load_demo_all(&state.ports, state.clock.now_ms())
                    .await
                    .map_err(|e| e.to_string())?;
                tracing::info!("seeded demo data");
            }
            Ok(state)
        }
    }
}

pub async fn bootstrap(cfg: Config, demo_data: bool) -> Result<(), String> {
    for line in airlock::adapters::aws::bootstrap::bootstrap(&cfg.aws).await? {
        outln!("{line}");
    }
    if demo_data {
        let st = app::aws(cfg.clone(), clock(&cfg), true).await?;
        let page = airlock::core::ports::Page {
            after: None,
            limit: 1,
        };
        let any = st
            .ports
            .accounts
            .list_accounts(&airlock::core::auth::DeskScope::All, &page)
            .await
            .map_err(|e| e.to_string())?;
        if any.is_empty() {
            airlock::app::seed::load_demo_all(&st.ports, st.clock.now_ms())
                .await
                .map_err(|e| e.to_string())?;
            outln!("demo data: loaded");
        } else {
            outln!("demo data: accounts exist, left as they are");
        }
    }
    Ok(())
}

pub async fn serve(
    mut cfg: Config,
    backend: Backend,
    addr: &str,
    metrics_addr: Option<&str>,
    workers: bool,
) -> Result<(), String> {
    // `AIRLOCK_METRICS=off`: no recorder, no `/metrics` (the benchmarks' baseline).
    let metrics_on = airlock::metrics::enabled_locally();
    if metrics_on {
        airlock::metrics::registry();
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("binding {addr}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    // `/metrics` carries no tokens: only ever on a loopback address.
    let metrics_listener = match metrics_addr {
        Some(a) => {
            let l = tokio::net::TcpListener::bind(a)
                .await
                .map_err(|e| format!("binding {a}: {e}"))?;
            let at = l.local_addr().map_err(|e| e.to_string())?;
            if !at.ip().is_loopback() {
                return Err(format!(
                    "--metrics-addr {at}: /metrics has no authentication; bind it to a loopback address"
                ));
            }
            Some(l)
        }
        None => None,
    };
    // The approval page is served here too: `localhost` is a secure context for passkeys
    // (an IP address cannot be a WebAuthn relying party).
    if cfg.approval_origin.is_none() {
        cfg.approval_origin = Some(format!("http://localhost:{}", local.port()));
    }
    let state = state(cfg, backend).await?;
    if let Err(why) = &state.approvals.webauthn {
        return Err(format!("AIRLOCK_APPROVAL_ORIGIN: {why}"));
    }
    state.execute.confirmations.preload().await?;
    if workers {
        start_workers(&state)?;
    }
    let sweep = state.sweeper.clone();
    let every = std::time::Duration::from_millis(state.config.sweep_interval_ms);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            if let Err(e) = sweep.sweep_once().await {
                tracing::error!(error = %e, "sweeper pass failed");
            }
        }
    });
    outln!(
        "airlock listening on http://{local} (state dir {}); approvals at {}/approvals",
        state.config.state_dir.display(),
        state.approvals.origin
    );
    let mut routes = airlock::doors::catalog::all();
    // Limits on how long a client may take to send a request (slowloris).
    let timeouts = airlock::doors::http::serve::ReadTimeouts::from_config(&state.config);
    match metrics_listener.filter(|_| metrics_on) {
        Some(l) => {
            let at = l.local_addr().map_err(|e| e.to_string())?;
            outln!(
                "metrics at http://{at}{}",
                airlock::doors::http::routes::metrics::PATH
            );
            let app = airlock::doors::http::routes::metrics::routes().with_state(state.clone());
            let never = std::future::pending();
            tokio::spawn(airlock::doors::http::serve::serve(l, app, timeouts, never));
        }
        None if metrics_on && local.ip().is_loopback() => {
            routes = routes.merge(airlock::doors::http::routes::metrics::routes());
        }
        None => tracing::warn!(
            "not serving /metrics: the listener is not loopback; pass --metrics-addr 127.0.0.1:PORT"
        ),
    }
    let app = airlock::doors::http::app(routes, state);
    airlock::doors::http::serve::serve(listener, app, timeouts, shutdown()).await;
    Ok(())
}

/// The order and job consumers, on a thread and runtime of their own: the OS shares the
/// cores between it and the HTTP runtime's threads, so however many connections the API
/// serves, the workers keep their share and a stream of executes cannot starve them.
fn start_workers(state: &airlock::app::AppState) -> Result<(), String> {
    use airlock::core::domain::QueueTarget;
    use airlock::core::usecases::worker::consumer;
    let opts = consumer::ConsumerOptions::from_config(&state.config);
    let (orders, jobs) = (state.consumer(), state.consumer());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting the workers' runtime: {e}"))?;
    std::thread::Builder::new()
        .name("airlock-workers".into())
        .spawn(move || {
            rt.block_on(async move {
                tokio::join!(
                    consumer::run(orders, QueueTarget::Orders, opts),
                    consumer::run(jobs, QueueTarget::Jobs, opts)
                )
            });
        })
        .map_err(|e| format!("starting the workers' thread: {e}"))?;
    Ok(())
}

async fn shutdown() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            s.recv().await;
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}

pub(crate) fn print_control(c: &airlock::core::records::Control) {
    let state = if c.trade_execute_enabled {
        "released (trading enabled)"
    } else {
        "ENGAGED (order submission stopped)"
    };
    outln!("kill switch: {state}");
    if c.updated_at > 0 {
        outln!(
            "changed at {} by {}",
            human_time(c.updated_at),
            c.updated_by
        );
    }
    if let Some(r) = &c.reason {
        outln!("reason: {r}");
    }
    for (a, m) in &c.rollout {
        outln!(
            "rollout {a}: {}",
            serde_json::to_value(m)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default()
        );
    }
}

pub(crate) fn who() -> String {
    format!(
        "cli:{}",
        std::env::var("USER").unwrap_or_else(|_| "unknown".into())
    )
}

pub async fn rollout(
    cfg: Config,
    backend: Backend,
    action_type: Option<String>,
    mode: Option<String>,
) -> Result<(), String> {
    let state = state(cfg, backend).await?;
    let store = state.ports.control.as_ref();
    let c = match (action_type, mode) {
        (Some(a), Some(m)) => {
            let a: ActionType = a.parse().map_err(|e| format!("action type: {e}"))?;
            let m: RolloutMode = m.parse().map_err(|e| format!("mode: {e}"))?;
            control::set_rollout(store, a.as_str(), m, &who(), state.clock.now_ms()).await
        }
        (None, None) => store.get_control().await,
        _ => return Err("give both an action type and a mode, or neither to show".into()),
    }
    .map_err(|e| e.to_string())?;
    print_control(&c);
    Ok(())
}

pub async fn audit(cfg: Config, backend: Backend, id: &str) -> Result<(), String> {
    let state = state(cfg, backend).await?;
    let trail = state
        .ports
        .audit
        .trail(id)
        .await
        .map_err(|e| e.to_string())?;
    if trail.is_empty() {
        return Err(format!("no audit records for {id}"));
    }
    for r in trail {
        outln!("{}", serde_json::to_string(&r).map_err(|e| e.to_string())?);
    }
    Ok(())
}

pub async fn seed_orders(cfg: Config, backend: Backend, n: usize) -> Result<(), String> {
    let state = state(cfg, backend).await?;
    airlock::app::seed::load_bulk_orders(state.ports.read_models.as_ref(), state.clock.now_ms(), n)
        .await
        .map_err(|e| e.to_string())
}

pub async fn queues(cfg: Config, backend: Backend) -> Result<(), String> {
    let state = state(cfg, backend).await?;
    for d in state.ports.queue.depth().await.map_err(|e| e.to_string())? {
        outln!(
            "{} waiting={} in_flight={} dead_letters={}",
            d.queue,
            d.waiting,
            d.in_flight,
            d.dead_letters
        );
    }
    Ok(())
}

/// Moves every dead letter of `only` (or of both queues) back to its queue.
pub async fn redrive(cfg: Config, backend: Backend, only: Option<&str>) -> Result<(), String> {
    use airlock::core::domain::QueueTarget;
    let state = state(cfg, backend).await?;
    for q in [QueueTarget::Orders, QueueTarget::Jobs] {
        if only.is_some_and(|o| !q.as_str().ends_with(o)) {
            continue;
        }
        let moved = state
            .ports
            .queue
            .redrive(q, u32::MAX)
            .await
            .map_err(|e| e.to_string())?;
        outln!("{q} redriven={moved}");
    }
    Ok(())
}

pub async fn confirmation_key(cfg: Config, backend: Backend) -> Result<(), String> {
    use p256::pkcs8::{EncodePublicKey, LineEnding};
    let state = state(cfg, backend).await?;
    let signer = &state.ports.signer;
    let public = signer.public_key().await.map_err(|e| e.to_string())?;
    let pem = public
        .to_public_key_pem(LineEnding::LF)
        .map_err(|e| e.to_string())?;
    eprintln!("kid: {}", signer.key_id());
    // The name the functions log the key under (AIRLOCK_CONFIRMATION_PUBLIC_KEY's too).
    eprintln!(
        "thumbprint: {}",
        airlock::core::token::jwk_thumbprint(&public)
    );
    out!("{pem}");
    Ok(())
}

pub async fn policy(
    cfg: Config,
    backend: Backend,
    action: &str,
    file: Option<std::path::PathBuf>,
) -> Result<(), String> {
    let state = state(cfg, backend).await?;
    let store = state.ports.control.as_ref();
    let mut c = store.get_control().await.map_err(|e| e.to_string())?;
    match (action, file) {
        ("show", None) => {}
        ("set", Some(path)) => {
            let text =
                std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            let p: airlock::core::policy::Policy =
                serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
            p.validate()
                .map_err(|e| format!("{}: {e}", path.display()))?;
            c = control::set_policy(store, Some(p), &who(), state.clock.now_ms())
                .await
                .map_err(|e| e.to_string())?;
        }
        ("reset", None) => {
            c = control::set_policy(store, None, &who(), state.clock.now_ms())
                .await
                .map_err(|e| e.to_string())?;
        }
        _ => return Err("usage: airlock policy show | set FILE | reset".into()),
    }
    let source = if c.policy.is_some() {
        "control record"
    } else {
        "process default"
    };
    let p = state.policy_for(&c);
    eprintln!("policy from the {source}");
    outln!(
        "{}",
        serde_json::to_string_pretty(p).map_err(|e| e.to_string())?
    );
    Ok(())
}

pub async fn prices(
    cfg: Config,
    backend: Backend,
    symbol: Option<String>,
    price: Option<String>,
) -> Result<(), String> {
    let now = clock(&cfg).now_ms();
    let state = state(cfg, backend).await?;
    let paper = &state.ports.paper;
    if let (Some(sym), Some(px)) = (&symbol, &price) {
        let c = airlock::core::domain::cl::ClContract::parse(sym).map_err(|e| e.to_string())?;
        let p = airlock::core::domain::Price::parse(px)?;
        paper
            .set_prices(&std::collections::BTreeMap::from([(c.symbol(), p)]))
            .await
            .map_err(|e| e.to_string())?;
        let n = state
            .worker
            .reconcile_working_orders()
            .await
            .map_err(|e| e.to_string())?;
        eprintln!("{} set to {p}; {n} working order(s) changed", c.symbol());
    }
    for (s, q) in paper.prices().await.map_err(|e| e.to_string())?.iter() {
        if symbol.as_deref().is_none_or(|x| {
            airlock::core::domain::cl::ClContract::parse(x)
                .map(|c| &c.symbol() == s)
                .unwrap_or(false)
        }) {
            let observed = match q.observed_at {
                Some(at) => format!(
                    "observed {}, {} s ago",
                    airlock::core::domain::rfc3339(at),
                    (now - at).max(0) / 1000
                ),
                None => "observed at an unknown time".to_string(),
            };
            outln!("{s} {} {observed}", q.price);
        }
    }
    Ok(())
}

pub async fn account_status(
    cfg: Config,
    backend: Backend,
    account: &str,
    status: &str,
) -> Result<(), String> {
    let status: airlock::core::domain::AccountStatus = status
        .parse()
        .map_err(|_| format!("unknown status {status}: use active, suspended or closed"))?;
    let state = state(cfg, backend).await?;
    let mut a = state
        .ports
        .accounts
        .get_account(account)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("no account {account}"))?;
    a.status = status;
    state
        .ports
        .read_models
        .put_accounts(&[a])
        .await
        .map_err(|e| e.to_string())?;
    outln!("{account}: {status}");
    Ok(())
}

pub async fn broker_book(cfg: Config, backend: Backend, account: &str) -> Result<(), String> {
    let state = state(cfg, backend).await?;
    let book = state
        .ports
        .paper
        .book(account)
        .await
        .map_err(|e| e.to_string())?;
    outln!(
        "{}",
        serde_json::to_string_pretty(&serde_json::json!({
            "orders": book.orders,
            "positions": book.positions,
        }))
        .map_err(|e| e.to_string())?
    );
    Ok(())
}

#[derive(Subcommand)]
pub enum BrokerCommand {
    /// Fill N contracts of a working order at the broker (at --price, by default its limit
    /// price, else the reference price), leaving it partially filled or filled; then
    /// reconcile working orders, as `prices` does, so Airlock records the fill.
    Fill {
        #[arg(long)]
        account: String,
        /// The order id (the broker's client order id).
        #[arg(long)]
        order: String,
        #[arg(long)]
        quantity: u32,
        #[arg(long)]
        price: Option<String>,
    },
}

pub async fn broker(cfg: Config, backend: Backend, action: BrokerCommand) -> Result<(), String> {
    let BrokerCommand::Fill {
        account,
        order,
        quantity,
        price,
    } = action;
    let price = price
        .as_deref()
        .map(airlock::core::domain::Price::parse_input)
        .transpose()
        .map_err(|e| format!("--price: {e}"))?;
    let state = state(cfg, backend).await?;
    let filled = state
        .ports
        .paper
        .fill(&account, &order, quantity, price)
        .await
        .map_err(|e| e.to_string())??;
    let n = state
        .worker
        .reconcile_working_orders()
        .await
        .map_err(|e| e.to_string())?;
    eprintln!(
        "{order}: {} of {} filled, {}; {n} working order(s) changed",
        filled.filled_quantity,
        filled.terms.quantity,
        serde_json::to_value(filled.status)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default()
    );
    outln!(
        "{}",
        serde_json::to_string_pretty(&filled).map_err(|e| e.to_string())?
    );
    Ok(())
}

pub async fn redeliver(
    cfg: Config,
    backend: Backend,
    action_id: &str,
    times: u32,
) -> Result<(), String> {
    let state = state(cfg, backend).await?;
    let action = state
        .ports
        .actions
        .get_action(action_id)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("no action {action_id}"))?;
    for i in 0..times {
        // A new deduplication id each time: the queue treats it as a new delivery.
        let dedup = format!("{action_id}:redelivery:{i}:{}", state.clock.now_ms());
        state
            .ports
            .queue
            .send(
                &action.message,
                &action.message.normalized_payload.message_group(),
                &dedup,
            )
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[derive(Subcommand)]
pub enum OperatorsCommand {
    /// Create (or update) an operator and print a one-time link that registers a passkey
    /// for them. Open it in the operator's browser; it works once, until it expires.
    Enroll {
        #[arg(long)]
        sub: String,
        /// Comma- or space-separated roles (the role table: viewer, trader, head_trader, admin).
        #[arg(long, default_value = "trader")]
        roles: String,
        /// Comma- or space-separated desks (`*` for all).
        #[arg(long, default_value = "")]
        desks: String,
        /// How long the link works, seconds (60 to 604800).
        #[arg(long, default_value_t = airlock::core::usecases::approvals::DEFAULT_ENROLMENT_TTL_S)]
        ttl: u32,
    },
    /// List enrolled operators, their roles, desks and passkeys.
    List,
    /// Forget an operator's passkeys and end their sessions.
    Revoke {
        #[arg(long)]
        sub: String,
    },
}

/// Who runs the CLI, for the operator documents' `updated_by`.
fn cli_user() -> String {
    std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .map(|u| format!("cli:{u}"))
        .unwrap_or_else(|| "cli".into())
}

pub async fn operators(
    cfg: Config,
    backend: Backend,
    action: OperatorsCommand,
) -> Result<(), String> {
    let state = state(cfg, backend).await?;
    let a = &state.approvals;
    match action {
        OperatorsCommand::Enroll {
            sub,
            roles,
            desks,
            ttl,
        } => {
            let link = a
                .enroll(&sub, &list(&roles), &list(&desks), ttl, &cli_user())
                .await
                .map_err(|e| e.message)?;
            eprintln!(
                "enrolment link for {} (works once, until {}):",
                link.sub, link.expires_at
            );
            outln!("{}", link.url);
        }
        OperatorsCommand::List => {
            for o in a.list_operators().await.map_err(|e| e.message)? {
                outln!(
                    "{}\troles={}\tdesks={}\tpasskeys={}{}{}",
                    o.sub,
                    o.roles.join(","),
                    o.desks.join(","),
                    o.passkeys,
                    match &o.open_link_expires_at {
                        Some(at) => format!("\tlink open until {at}"),
                        None => String::new(),
                    },
                    if o.revoked { "\tREVOKED" } else { "" }
                );
            }
        }
        OperatorsCommand::Revoke { sub } => {
            if !a.revoke(&sub, &cli_user()).await.map_err(|e| e.message)? {
                return Err(format!("no operator {sub}"));
            }
            outln!("revoked {sub}: passkeys forgotten, enrolment link closed, sessions ended");
        }
    }
    Ok(())
}

/// `airlock stats`: scrapes `url` (twice, `window` seconds apart, for throughput) and
/// prints the table of `airlock::metrics::stats::report`.
pub async fn stats(url: &str, window: u64) -> Result<(), String> {
    use airlock::metrics::stats;
    let first = scrape(url).await?;
    let report = if window > 0 {
        tokio::time::sleep(std::time::Duration::from_secs(window)).await;
        let second = scrape(url).await?;
        let (a, b) = (stats::parse(&first), stats::parse(&second));
        stats::report(&b, Some((&a, window as f64)))
    } else {
        stats::report(&stats::parse(&first), None)
    };
    out!("{report}");
    Ok(())
}

/// GET of a plain `http://host:port/path` (the loopback `/metrics`): HTTP/1.1, one request.
async fn scrape(url: &str) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url}: only http:// URLs (the metrics listener is loopback)"))?;
    let (host, path) = rest.split_once('/').map_or((rest, "/"), |(h, p)| (h, p));
    let path = if path == "/" {
        "/".to_string()
    } else {
        format!("/{path}")
    };
    let mut conn = tokio::net::TcpStream::connect(host)
        .await
        .map_err(|e| format!("{url}: {e} (is `airlock serve` running?)"))?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    conn.write_all(req.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    conn.read_to_end(&mut buf)
        .await
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{url}: not an HTTP answer"))?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!("{url}: {}", head.lines().next().unwrap_or("")));
    }
    Ok(body.to_string())
}
