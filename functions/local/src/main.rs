//! `airlock`: the local command line (contract, Local command line).

/// `println!` for the CLI's output: see [`out`].
macro_rules! outln {
    ($($t:tt)*) => { $crate::out(format_args!("{}\n", format_args!($($t)*))) };
}

/// `print!` for the CLI's output: see [`out`].
macro_rules! out {
    ($($t:tt)*) => { $crate::out(format_args!($($t)*)) };
}

mod check;
mod commands;
mod kill_switch;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "airlock",
    version,
    about = "Airlock: the trade-safety backend for a Mastra agent"
)]
struct Cli {
    /// State directory (SQLite database, local keys, policy file).
    #[arg(
        long,
        global = true,
        env = "AIRLOCK_STATE_DIR",
        default_value = ".airlock"
    )]
    state_dir: PathBuf,
    /// `embedded` (SQLite in the state dir) or `aws` (DynamoDB, SQS, KMS through the standard
    /// AWS environment; `AWS_ENDPOINT_URL` for an emulator).
    #[arg(
        long,
        global = true,
        env = "AIRLOCK_BACKEND",
        default_value = "embedded",
        value_parser = ["embedded", "aws"]
    )]
    backend: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve every endpoint (and the sweeper) on one HTTP listener.
    Serve {
        #[arg(long, default_value = "127.0.0.1:3000")]
        addr: String,
        /// Serve `GET /metrics` (Prometheus text) on this loopback address instead of the
        /// API's listener (which serves it only when it is itself loopback).
        #[arg(long)]
        metrics_addr: Option<String>,
        /// Run the order and job workers in this process (`off` leaves the queues to others).
        #[arg(long, env = "AIRLOCK_WORKERS", default_value = "on", value_parser = ["on", "off"])]
        workers: String,
    },
    /// Print a JWT signed by the local dev issuer.
    Token {
        #[command(subcommand)]
        kind: commands::TokenKind,
    },
    /// Engage, release or show the global kill switch. Engaging stops new orders at every
    /// gate and queues a cancel of every working order (of every account, or of
    /// `--accounts`); with `--flatten` (off by default) also a closing order of every open
    /// position; `status` shows the switch and its last engagement's cancels and closing
    /// orders.
    KillSwitch {
        #[arg(value_parser = ["engage", "release", "status"])]
        action: String,
        /// Why (recorded on the control record).
        #[arg(long)]
        reason: Option<String>,
        /// Pull only these accounts' working orders (comma-separated; engage).
        #[arg(long)]
        accounts: Option<String>,
        /// Engage without cancelling working orders.
        #[arg(long)]
        keep_working: bool,
        /// Also queue a closing order for every open position (engage; off by default): the
        /// opposite side, the net quantity, a day limit protected from the reference price.
        #[arg(long)]
        flatten: bool,
    },
    /// Create the AWS tables, queues and signing key (at `AWS_ENDPOINT_URL`); safe twice.
    Bootstrap {
        /// Also load the demo accounts, positions, orders and jobs.
        #[arg(long)]
        demo_data: bool,
    },
    /// Set the rollout mode of an action type (disabled, plan_only, execute), or show all.
    Rollout {
        action_type: Option<String>,
        mode: Option<String>,
    },
    /// Show the risk policy in force, set it from a JSON file, or reset it to the process's.
    Policy {
        #[arg(value_parser = ["show", "set", "reset"])]
        action: String,
        /// The policy JSON file (`set`); unknown fields are refused.
        file: Option<PathBuf>,
    },
    /// Print the audit trail of a plan or action id, in time order.
    Audit { id: String },
    /// The paper broker's reference prices; `SYMBOL PRICE` sets one and fills working
    /// orders it crosses.
    Prices {
        symbol: Option<String>,
        price: Option<String>,
    },
    /// The paper broker's book of an account: its orders and positions as the broker sees them.
    BrokerBook { account: String },
    /// Act as the paper broker's market: `fill` fills part or all of a working order.
    Broker {
        #[command(subcommand)]
        action: commands::BrokerCommand,
    },
    /// Set an account's status (active, suspended, closed). Only active accounts can have
    /// orders submitted; execute re-checks it atomically, so a suspension stops plans
    /// already confirmed.
    AccountStatus { account: String, status: String },
    /// Messages per queue: waiting, received but not yet deleted, dead letters. `redrive`
    /// moves dead letters back to their queue (after a fix): a settled action is not run
    /// again, one not yet settled runs once.
    Queues {
        #[arg(value_parser = ["redrive"])]
        action: Option<String>,
        /// Only this queue (`orders` or `jobs`); both by default.
        #[arg(long, value_parser = ["orders", "jobs"])]
        queue: Option<String>,
    },
    /// Print the confirmation-token public key (PEM) and its key id.
    ConfirmationKey,
    /// A table of a running server's metrics (`GET /metrics`): per endpoint count and
    /// p50/p95/p99, plans, execute outcomes and acceptance rate, rejections by code, MCP tool
    /// calls, workers and their throughput, queues, the kill switch.
    Stats {
        #[arg(long, default_value = "http://127.0.0.1:3000/metrics")]
        url: String,
        /// Seconds between two scrapes, for the workers' throughput (0: one scrape).
        #[arg(long, default_value_t = 2)]
        window: u64,
    },
    /// Print the API's OpenAPI 3.1 document (what `GET /openapi.json` serves, and
    /// docs/openapi.json).
    Openapi,
    /// Operators who approve plans with passkeys: `enroll` prints a one-time link that
    /// registers a passkey; `list` shows them; `revoke` forgets their passkeys.
    Operators {
        #[command(subcommand)]
        action: commands::OperatorsCommand,
    },
    /// Send an action's queue message again, N times (at-least-once delivery drills).
    #[command(hide = true)]
    Redeliver {
        action_id: String,
        #[arg(long, default_value_t = 1)]
        times: u32,
    },
    /// Golden scenarios against a running stage, local or deployed; exit 1 on any failure.
    ///
    /// Health, every read, pagination, a plan of each action type, a tampered and a
    /// replayed execute, the error shape of bad inputs; with `--execute` (sandboxes only)
    /// one order followed to a terminal state. A table, and a JSON report with `--json`.
    Check(check::CheckArgs),
    /// Load benchmark data: N extra filled orders.
    #[command(hide = true)]
    SeedOrders { n: usize },
}

/// Writes the CLI's output to stdout. A reader that stops early (`airlock audit ID | head`)
/// ends the program quietly with success, as `cat` would, where `println!` panics on the
/// broken pipe; any other write error ends it with a message and failure.
fn out(args: std::fmt::Arguments) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(args).and_then(|()| stdout.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("airlock: cannot write the output: {e}");
        std::process::exit(1);
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    airlock::telemetry::init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("airlock: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    // `check` talks to a stage over HTTP only: no state dir, backend or local config.
    let command = match cli.command {
        Command::Check(args) => return rt.block_on(check::run(args)),
        command => command,
    };
    let result = rt.block_on(async move {
        let mut cfg = airlock::config::Config::from_env().map_err(|e| e.to_string())?;
        cfg.state_dir = cli.state_dir;
        let backend: airlock::app::Backend = cli.backend.parse()?;
        match command {
            Command::Check(_) => Err("`check` runs before the configuration is read".into()),
            Command::Serve {
                addr,
                metrics_addr,
                workers,
            } => {
                commands::serve(
                    cfg,
                    backend,
                    &addr,
                    metrics_addr.as_deref(),
                    workers == "on",
                )
                .await
            }
            Command::Token { kind } => commands::token(cfg, kind),
            Command::KillSwitch {
                action,
                reason,
                accounts,
                keep_working,
                flatten,
            } => {
                let opts = airlock::core::usecases::kill_switch::EngageOptions {
                    reason,
                    accounts: accounts.as_deref().map(commands::list),
                    keep_working,
                    flatten,
                };
                kill_switch::run(cfg, backend, &action, opts).await
            }
            Command::Rollout { action_type, mode } => {
                commands::rollout(cfg, backend, action_type, mode).await
            }
            Command::Audit { id } => commands::audit(cfg, backend, &id).await,
            Command::Queues { action, queue } => match action {
                Some(_) => commands::redrive(cfg, backend, queue.as_deref()).await,
                None => commands::queues(cfg, backend).await,
            },
            Command::Redeliver { action_id, times } => {
                commands::redeliver(cfg, backend, &action_id, times).await
            }
            Command::Prices { symbol, price } => {
                commands::prices(cfg, backend, symbol, price).await
            }
            Command::BrokerBook { account } => commands::broker_book(cfg, backend, &account).await,
            Command::Broker { action } => commands::broker(cfg, backend, action).await,
            Command::AccountStatus { account, status } => {
                commands::account_status(cfg, backend, &account, &status).await
            }
            Command::Policy { action, file } => commands::policy(cfg, backend, &action, file).await,
            Command::ConfirmationKey => commands::confirmation_key(cfg, backend).await,
            Command::Stats { url, window } => commands::stats(&url, window).await,
            Command::Openapi => {
                out!("{}", airlock::doors::catalog::text()?);
                Ok(())
            }
            Command::Operators { action } => commands::operators(cfg, backend, action).await,
            Command::Bootstrap { demo_data } => commands::bootstrap(cfg, demo_data).await,
            Command::SeedOrders { n } => commands::seed_orders(cfg, backend, n).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("airlock: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
