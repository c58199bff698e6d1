//! `airlock check --base-url URL`: golden scenarios against a running stage, local
//! (`airlock serve`) or deployed (API Gateway, HTTPS), with the caller's two tokens.
//!
//! Health; every read endpoint, with its documented shape; pagination to the end; a plan
//! of each action type (the order plan must be executable), and a market order's protected
//! limit with its reference price's age; an execute with a tampered
//! confirmation token (422 `token_invalid`); a replayed rejection (the same answer twice);
//! the error shape of five bad inputs; and, with `--execute` on a sandbox only (`GET
//! /health` names the `paper` broker), one resting 1-lot limit order followed to a
//! terminal state and cancelled, a replay of its execute, and a `positions.sync`.
//!
//! Without `--execute` nothing can be queued: no execute carries a valid confirmation
//! token, and a new plan cannot have an operator's approval. Plans (and the rejected
//! executes) are written to the audit log like any other, under the chat session
//! `airlock-check-<time>`.
//!
//! Prints a table (one line per scenario), a summary line, and the JSON report with
//! `--json PATH` (`-`: on stdout, the table then on stderr). Exit code 0 when every
//! scenario passed, 1 when one failed, 2 when the check could not run (bad flags, a token
//! without `sub`, `--execute` on a stage that is not a sandbox). Each request has a timeout
//! and the whole run a budget of 55 s.
//!
//! [`client`] sends the requests, [`contract`] checks answers against the documented
//! shapes, [`reads`], [`plans`] and [`execute`] are the scenarios, [`tokens`] and
//! [`market`] the values they derive.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use airlock::adapters::http_client::HttpClient;
use airlock::doors::http::BASE_PATH;
use serde_json::{json, Value};

/// The whole run's budget: a healthy stage finishes well inside a minute.
const RUN_BUDGET: Duration = Duration::from_secs(55);
/// Open order statuses (contract, Order statuses).
pub(super) const OPEN: [&str; 4] = ["queued", "submitted", "working", "partially_filled"];

#[derive(clap::Args)]
pub struct CheckArgs {
    /// The stage's API URL: the stack's `ApiUrl` output
    /// (`https://<api-id>.execute-api.<region>.amazonaws.com/<stage>/api/internal/v1/mastra`)
    /// or a server's root (`http://127.0.0.1:3000`); the base path is added when missing, and
    /// `GET /health` is read next to it (`<stage URL>/health`).
    #[arg(long, env = "AIRLOCK_BASE_URL")]
    base_url: String,
    /// The service token (`Authorization: Bearer`), a client-credentials token with
    /// `trade.read trade.plan` (and `trade.execute`).
    #[arg(long, env = "AIRLOCK_SERVICE_TOKEN", hide_env_values = true)]
    service_token: String,
    /// The operator token (`X-Operator-Token`) of an operator who may plan on the account;
    /// its `sub` is the plans' `requested_by`.
    #[arg(long, env = "AIRLOCK_OPERATOR_TOKEN", hide_env_values = true)]
    operator_token: String,
    /// The account to read and plan on (default: the first active account listed).
    #[arg(long)]
    account: Option<String>,
    /// Sandboxes only (`GET /health` says `"broker": "paper"`, else refused): place one
    /// resting 1-lot limit order, follow it to a terminal state and cancel it, and run one
    /// `positions.sync`.
    #[arg(long)]
    execute: bool,
    /// Write the JSON report to this file (`-`: to stdout, and the table to stderr).
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// Seconds each request may take.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=55))]
    timeout: u64,
    /// An extra header on every request, `NAME: VALUE` (e.g. `x-apigw-api-id: <api-id>`
    /// through a VPC endpoint's own DNS name). May be repeated.
    #[arg(long = "header", value_name = "NAME: VALUE")]
    headers: Vec<String>,
}

/// One scenario's outcome.
struct Row {
    name: String,
    ok: bool,
    ms: u64,
    detail: String,
}

type Outcome = Result<String, String>;

/// What the reads found, for the scenarios after them.
#[derive(Default)]
struct Found {
    health: Value,
    account: Option<String>,
    today: Option<chrono::NaiveDate>,
    /// An order of the account, open ones first.
    order_id: Option<String>,
    /// `(symbol, contract_month, reference_price)` of the account's priced positions.
    priced: Vec<(String, String, String)>,
    sync_token: Option<String>,
}

struct Report {
    rows: Vec<Row>,
    /// The table goes to stderr when the JSON report takes stdout.
    table_to_stderr: bool,
}

impl Report {
    fn add(&mut self, name: &str, started: Instant, r: Outcome) -> bool {
        let ms = started.elapsed().as_millis() as u64;
        let (ok, detail) = match r {
            Ok(d) => (true, d),
            Err(d) => (false, d),
        };
        let line = format!(
            "{}  {name:<44} {ms:>6} ms  {}",
            if ok { "PASS" } else { "FAIL" },
            one_line(&detail, 220)
        );
        if self.table_to_stderr {
            eprintln!("{line}");
        } else {
            outln!("{line}");
        }
        self.rows.push(Row {
            name: name.to_string(),
            ok,
            ms,
            detail,
        });
        ok
    }
}

fn one_line(s: &str, max: usize) -> String {
    let s = s.replace('\n', " ");
    if s.chars().count() <= max {
        s
    } else {
        format!("{}...", s.chars().take(max).collect::<String>())
    }
}

macro_rules! scenario {
    ($report:expr, $name:expr, $body:expr) => {{
        let started = Instant::now();
        let r: Outcome = $body.await;
        $report.add(&$name, started, r)
    }};
}

mod client;
mod contract;
mod daily_loss;
mod execute;
mod market;
mod plans;
mod reads;
mod tokens;

use client::Ctx;
use execute::execute;
use plans::{bad_inputs, plans};
use reads::{health, paginate, reads};
use tokens::token_sub;

pub async fn run(args: CheckArgs) -> ExitCode {
    match check(args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("airlock check: {e}");
            ExitCode::from(2)
        }
    }
}

/// Runs every scenario; `Ok(all passed)`, or `Err` when the check cannot run.
async fn check(args: CheckArgs) -> Result<bool, String> {
    let started = Instant::now();
    let started_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let (base, root) = split_url(&args.base_url)?;
    let operator = token_sub(&args.operator_token)
        .ok_or("the operator token is not a JWT with a `sub` claim")?;
    let mut headers = Vec::new();
    for h in &args.headers {
        let (k, v) = h
            .split_once(':')
            .ok_or_else(|| format!("--header {h}: expected `NAME: VALUE`"))?;
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }
    let ctx = Ctx {
        client: HttpClient::new(),
        base: base.clone(),
        root,
        headers,
        auth: vec![
            (
                "authorization".into(),
                format!("Bearer {}", args.service_token.trim()),
            ),
            ("x-operator-token".into(), args.operator_token.trim().into()),
        ],
        timeout: Duration::from_secs(args.timeout),
        deadline: started + RUN_BUDGET,
        operator,
        run_id: format!("airlock-check-{}", chrono::Utc::now().timestamp_millis()),
    };
    let to_stdout = args.json.as_deref() == Some(std::path::Path::new("-"));
    let mut report = Report {
        rows: Vec::new(),
        table_to_stderr: to_stdout,
    };
    let mut found = Found {
        account: args.account.clone(),
        ..Found::default()
    };

    scenario!(report, "health", health(&ctx, &mut found));
    if args.execute {
        if let Err(why) = sandbox(&found.health) {
            return Err(format!(
                "--execute refused: {why}. It places an order, so it runs on sandboxes only."
            ));
        }
    }
    reads(&ctx, &mut report, &mut found).await;
    daily_loss::daily_loss(&ctx, &mut report, &found).await;
    scenario!(
        report,
        "paginate accounts (limit 1)",
        paginate(&ctx, "/accounts?", "accounts", "account_id", 1)
    );
    scenario!(
        report,
        "paginate orders (limit 2)",
        paginate(&ctx, "/orders?", "orders", "order_id", 2)
    );
    plans(&ctx, &mut report, &mut found).await;
    bad_inputs(&ctx, &mut report, &found).await;
    if args.execute {
        execute(&ctx, &mut report, &found).await;
    }

    let passed = report.rows.iter().filter(|r| r.ok).count();
    let failed = report.rows.len() - passed;
    let duration_ms = started.elapsed().as_millis() as u64;
    let summary = format!(
        "{} {passed} passed, {failed} failed in {duration_ms} ms against {base}",
        if failed == 0 { "OK" } else { "FAILED" }
    );
    let doc = json!({
        "base_url": base,
        "started_at": started_at,
        "execute": args.execute,
        "passed": passed,
        "failed": failed,
        "duration_ms": duration_ms,
        "scenarios": report.rows.iter().map(|r| json!({
            "name": r.name, "ok": r.ok, "ms": r.ms, "detail": r.detail,
        })).collect::<Vec<_>>(),
    });
    let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
    match args.json.as_deref() {
        Some(_) if to_stdout => {
            eprintln!("{summary}");
            outln!("{text}");
        }
        Some(p) => {
            outln!("{summary}");
            std::fs::write(p, format!("{text}\n"))
                .map_err(|e| format!("writing the JSON report to {}: {e}", p.display()))?;
        }
        None => outln!("{summary}"),
    }
    Ok(failed == 0)
}

/// `--execute` runs only where `GET /health` names the paper broker.
fn sandbox(health: &Value) -> Result<(), String> {
    match health["broker"].as_str() {
        Some("paper") => Ok(()),
        Some(other) => Err(format!(
            "the stage's GET /health names the broker `{other}`, not `paper`: not a sandbox"
        )),
        None if health.is_null() => {
            Err("GET /health did not answer as Airlock (see its row above)".into())
        }
        None => Err(
            "the stage's GET /health names no broker, so it cannot be shown to be a sandbox".into(),
        ),
    }
}

/// The API base (with the base path) and the stage root (where `/health` is).
fn split_url(url: &str) -> Result<(String, String), String> {
    let url = url.trim().trim_end_matches('/');
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(format!("--base-url {url}: an http:// or https:// URL"));
    }
    match url.strip_suffix(BASE_PATH) {
        Some(root) => Ok((url.to_string(), root.to_string())),
        None => Ok((format!("{url}{BASE_PATH}"), url.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_base_url_may_include_the_base_path() {
        for url in [
            "http://127.0.0.1:3000",
            "http://127.0.0.1:3000/",
            "http://127.0.0.1:3000/api/internal/v1/mastra",
            "http://127.0.0.1:3000/api/internal/v1/mastra/",
        ] {
            assert_eq!(
                split_url(url).unwrap(),
                (
                    "http://127.0.0.1:3000/api/internal/v1/mastra".to_string(),
                    "http://127.0.0.1:3000".to_string()
                ),
                "{url}"
            );
        }
        // API Gateway: the stage is the first path segment, and /health is under it.
        assert_eq!(
            split_url("https://abc.execute-api.eu-west-1.amazonaws.com/v1/api/internal/v1/mastra")
                .unwrap()
                .1,
            "https://abc.execute-api.eu-west-1.amazonaws.com/v1"
        );
        assert!(split_url("ftp://x").is_err());
        assert!(split_url("127.0.0.1:3000").is_err());
    }

    #[test]
    fn execute_runs_only_where_health_names_the_paper_broker() {
        assert!(sandbox(&json!({"status": "ok", "broker": "paper"})).is_ok());
        let e = sandbox(&json!({"status": "ok", "broker": "ib"})).unwrap_err();
        assert!(e.contains("`ib`"), "{e}");
        assert!(sandbox(&json!({"status": "ok", "service": "airlock"})).is_err());
        assert!(sandbox(&Value::Null).is_err());
    }
}
