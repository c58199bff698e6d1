//! `airlock`: the local command line (contract, Local command line).

mod commands;

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
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve every endpoint (and the sweeper) on one HTTP listener.
    Serve {
        #[arg(long, default_value = "127.0.0.1:3000")]
        addr: String,
        #[arg(long, default_value = "embedded", value_parser = ["embedded"])]
        backend: String,
    },
    /// Print a JWT signed by the local dev issuer.
    Token {
        #[command(subcommand)]
        kind: commands::TokenKind,
    },
    /// Engage, release or show the global kill switch.
    KillSwitch {
        #[arg(value_parser = ["engage", "release", "status"])]
        action: String,
        /// Why (recorded on the control record).
        #[arg(long)]
        reason: Option<String>,
        #[arg(long, default_value = "embedded", value_parser = ["embedded"])]
        backend: String,
    },
    /// Set the rollout mode of an action type (disabled, plan_only, execute), or show all.
    Rollout {
        action_type: Option<String>,
        mode: Option<String>,
    },
    /// Print the audit trail of a plan or action id, in time order.
    Audit { id: String },
    /// Load benchmark data: N extra filled orders.
    #[command(hide = true)]
    SeedOrders { n: usize },
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
    let result = rt.block_on(async move {
        let mut cfg = airlock::config::Config::from_env().map_err(|e| e.to_string())?;
        cfg.state_dir = cli.state_dir;
        match cli.command {
            Command::Serve { addr, .. } => commands::serve(cfg, &addr).await,
            Command::Token { kind } => commands::token(cfg, kind),
            Command::KillSwitch { action, reason, .. } => {
                commands::kill_switch(cfg, &action, reason).await
            }
            Command::Rollout { action_type, mode } => {
                commands::rollout(cfg, action_type, mode).await
            }
            Command::Audit { id } => commands::audit(cfg, &id).await,
            Command::SeedOrders { n } => commands::seed_orders(cfg, n).await,
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
