//! `airlock check --base-url URL`: golden scenarios against a running stage, local
//! (`airlock serve`) or deployed (API Gateway, HTTPS), with the caller's two tokens.
//!
//! Health; every read endpoint, with its documented shape; pagination to the end; a plan
//! of each action type (the order plan must be executable); an execute with a tampered
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

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use airlock::adapters::http_client::{HttpClient, HttpRequest};
use airlock::doors::http::BASE_PATH;
use serde_json::{json, Value};

/// The whole run's budget: a healthy stage finishes well inside a minute.
const RUN_BUDGET: Duration = Duration::from_secs(55);
/// How long an accepted action may take to reach `succeeded` or `failed`.
const SETTLE_WITHIN: Duration = Duration::from_secs(30);
/// Pagination: the first pages use the small limit, the rest 200; at most this many pages.
const MAX_PAGES: usize = 100;
const SMALL_PAGES: usize = 5;
/// The largest answer read (a page of 200 orders is far below).
const MAX_ANSWER: usize = 4 * 1024 * 1024;
/// Open order statuses (contract, Order statuses).
const OPEN: [&str; 4] = ["queued", "submitted", "working", "partially_filled"];

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

/// An answer: status, JSON body (`Null` when not JSON), its request id, and its text.
struct Answer {
    status: u16,
    body: Value,
    request_id: Option<String>,
    text: String,
}

impl Answer {
    fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }

    /// `422 token_invalid: <message>` or `200 <the start of the body>`, for details.
    fn brief(&self) -> String {
        if let Some(code) = self.body["error"]["code"].as_str() {
            let msg = self.body["error"]["message"].as_str().unwrap_or("");
            return format!("{} {code}: {msg}", self.status);
        }
        let text: String = self.text.chars().take(160).collect();
        format!("{} {}", self.status, text.trim())
    }

    fn expect(&self, status: u16) -> Result<(), String> {
        if self.status == status {
            Ok(())
        } else {
            Err(format!("expected {status}, got {}", self.brief()))
        }
    }
}

/// Where to send requests, with what, and the run's shared findings.
struct Ctx {
    client: HttpClient,
    /// The API base (ends with the base path).
    base: String,
    /// The stage root, where `/health` is.
    root: String,
    headers: Vec<(String, String)>,
    auth: Vec<(String, String)>,
    timeout: Duration,
    deadline: Instant,
    operator: String,
    run_id: String,
}

impl Ctx {
    async fn send(&self, req: HttpRequest, authed: bool) -> Result<Answer, String> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("not sent: the run's 55 s budget is spent".into());
        }
        let mut req = req.timeout(self.timeout.min(left)).max_body(MAX_ANSWER);
        for (k, v) in self
            .headers
            .iter()
            .chain(if authed { &self.auth[..] } else { &[] })
        {
            req = req.header(k.clone(), v.clone());
        }
        let url = req.url.clone();
        let r = self
            .client
            .send(req)
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        let text = String::from_utf8_lossy(&r.body).into_owned();
        Ok(Answer {
            status: r.status,
            body: serde_json::from_str(&text).unwrap_or(Value::Null),
            request_id: r.header("x-request-id").map(String::from),
            text,
        })
    }

    async fn get(&self, path: &str) -> Result<Answer, String> {
        self.send(HttpRequest::get(format!("{}{path}", self.base)), true)
            .await
    }

    async fn post(&self, path: &str, body: impl Into<Vec<u8>>) -> Result<Answer, String> {
        self.send(
            HttpRequest::post_json(format!("{}{path}", self.base), body),
            true,
        )
        .await
    }

    /// A plan request body for this run's operator, traced to the run's chat session.
    fn plan_body(&self, action_type: &str, payload: Value, tool: &str) -> Value {
        json!({
            "action_type": action_type,
            "payload": payload,
            "requested_by": self.operator,
            "chat_context": {"chat_session_id": self.run_id, "tool_call_id": tool},
        })
    }

    /// Executes `plan` (its id and token) under the key `key` and expects `202 queued`.
    async fn execute_accepted(
        &self,
        plan: &Value,
        key: &str,
        what: &str,
    ) -> Result<Accepted, String> {
        let token = plan["confirmation_token"]
            .as_str()
            .ok_or_else(|| format!("{what}: the plan has no confirmation token"))?;
        let plan_id = plan["plan_id"].as_str().unwrap_or_default();
        let body = self.execute_body(plan_id, Some(token), key).to_string();
        let a = self.post("/actions/execute", body.clone()).await?;
        accepted(&a, body, what)
    }

    fn execute_body(&self, plan_id: &str, token: Option<&str>, key: &str) -> Value {
        let mut b = json!({
            "plan_id": plan_id,
            "idempotency_key": format!("{}:{key}", self.run_id),
            "requested_by": self.operator,
            "chat_context": {"chat_session_id": self.run_id, "tool_call_id": key},
        });
        if let Some(t) = token {
            b["confirmation_token"] = json!(t);
        }
        b
    }

    async fn plan(&self, action_type: &str, payload: Value, tool: &str) -> Result<Answer, String> {
        let a = self
            .post(
                "/actions/plan",
                self.plan_body(action_type, payload, tool).to_string(),
            )
            .await?;
        a.expect(200)?;
        fields(
            &a.body,
            "the plan",
            &[
                "plan_id",
                "action_type",
                "normalized_payload",
                "risk_checks",
                "preview",
                "executable",
                "requires_confirmation",
                "confirmation_token",
                "expires_at",
                "queue_target",
                "policy_version",
                "approval",
            ],
        )?;
        for c in array(&a.body, "risk_checks")? {
            fields(c, "a risk check", &["name", "status", "reason"])?;
        }
        Ok(a)
    }

    /// Follows an action until `succeeded` or `failed` (at most [`SETTLE_WITHIN`]).
    async fn settle(&self, action_id: &str) -> Result<(Value, Duration), String> {
        let started = Instant::now();
        let wait = self.timeout.as_secs().saturating_sub(2).min(5);
        loop {
            let a = self
                .get(&format!("/actions/{action_id}?wait={wait}"))
                .await?;
            a.expect(200)?;
            let status = a.body["status"].as_str().unwrap_or("").to_string();
            if status == "succeeded" || status == "failed" {
                return Ok((a.body, started.elapsed()));
            }
            if started.elapsed() > SETTLE_WITHIN {
                return Err(format!(
                    "action {action_id} still {status} after {} s (are the workers running?)",
                    SETTLE_WITHIN.as_secs()
                ));
            }
            if wait == 0 {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }

    /// An order of the account as `GET /orders` lists it (newest first, first 200).
    async fn order(&self, account: &str, order_id: &str) -> Result<Value, String> {
        let a = self
            .get(&format!("/orders?account_id={account}&limit=200"))
            .await?;
        a.expect(200)?;
        array(&a.body, "orders")?
            .iter()
            .find(|o| o["order_id"] == order_id)
            .cloned()
            .ok_or_else(|| format!("order {order_id} is not among the account's newest 200"))
    }
}

/// Every key present (`null` is a value).
fn fields(v: &Value, what: &str, keys: &[&str]) -> Result<(), String> {
    let Some(obj) = v.as_object() else {
        return Err(format!("{what} is not a JSON object"));
    };
    let missing: Vec<&str> = keys
        .iter()
        .copied()
        .filter(|k| !obj.contains_key(*k))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!("{what} lacks {}", missing.join(", ")))
    }
}

fn array<'a>(v: &'a Value, key: &str) -> Result<&'a Vec<Value>, String> {
    v[key]
        .as_array()
        .ok_or_else(|| format!("`{key}` is not an array"))
}

/// A listing page: 200, `<list>[]` whose rows have `keys`, and a `next_cursor` key.
fn listing<'a>(a: &'a Answer, list: &str, keys: &[&str]) -> Result<&'a Vec<Value>, String> {
    a.expect(200)?;
    fields(&a.body, "the page", &[list, "next_cursor"])?;
    let rows = array(&a.body, list)?;
    for r in rows {
        fields(r, &format!("a row of {list}"), keys)?;
    }
    Ok(rows)
}

/// The contract's error body: `error.code`, `error.message`, `error.details[].field` (the
/// expected field among them when given), `request_id` (the `x-request-id` header).
fn error_shape(a: &Answer, status: u16, code: &str, field: Option<&str>) -> Outcome {
    if a.status != status || a.code() != code {
        return Err(format!("expected {status} {code}, got {}", a.brief()));
    }
    let e = &a.body["error"];
    if e["message"].as_str().is_none_or(str::is_empty) {
        return Err("error.message is missing or empty".into());
    }
    let details = match &e["details"] {
        Value::Null => Vec::new(),
        Value::Array(d) => d.clone(),
        _ => return Err("error.details is not an array".into()),
    };
    for d in &details {
        if d["field"].as_str().is_none() || d["message"].as_str().is_none() {
            return Err(format!("a detail lacks field or message: {d}"));
        }
    }
    if let Some(f) = field {
        if !details.iter().any(|d| d["field"] == f) {
            return Err(format!("error.details does not name {f}: {}", e["details"]));
        }
    }
    let Some(rid) = a.body["request_id"].as_str() else {
        return Err("request_id is missing".into());
    };
    if !rid.starts_with("req_") {
        return Err(format!("request_id {rid} is not a req_ id"));
    }
    if a.request_id.as_deref().is_some_and(|h| h != rid) {
        return Err(format!(
            "request_id {rid} differs from the x-request-id header"
        ));
    }
    Ok(match field {
        Some(f) => format!("{status} {code} at {f}"),
        None => format!("{status} {code}"),
    })
}

/// The failed checks of a plan, `name (reason)`, and whether they are only `market_open`.
fn failed_checks(plan: &Value) -> (Vec<String>, bool) {
    let failed: Vec<&Value> = plan["risk_checks"]
        .as_array()
        .map(|c| c.iter().filter(|c| c["status"] == "fail").collect())
        .unwrap_or_default();
    let only_market = !failed.is_empty() && failed.iter().all(|c| c["name"] == "market_open");
    let named = failed
        .iter()
        .map(|c| {
            format!(
                "{} ({})",
                c["name"].as_str().unwrap_or("?"),
                c["reason"].as_str().unwrap_or("")
            )
        })
        .collect();
    (named, only_market)
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

/// The `sub` claim of a JWT (read, not verified: the server verifies it).
fn token_sub(token: &str) -> Option<String> {
    use base64::Engine;
    let part = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part.trim_end_matches('='))
        .ok()?;
    let claims: Value = serde_json::from_slice(&bytes).ok()?;
    claims["sub"].as_str().map(String::from)
}

/// The token with one character of its signature changed (in the middle, where every bit
/// of the character counts).
fn tamper(token: &str) -> String {
    let Some((head, sig)) = token.rsplit_once('.') else {
        return format!("{token}x");
    };
    let mut chars: Vec<char> = sig.chars().collect();
    let i = chars.len() / 2;
    if let Some(c) = chars.get_mut(i) {
        *c = if *c == 'A' { 'B' } else { 'A' };
    }
    format!("{head}.{}", chars.into_iter().collect::<String>())
}

/// A well-formed ES256 JWS whose signature is zeros, for when no plan gave a token.
const BOGUS_TOKEN: &str = "eyJhbGciOiJFUzI1NiIsInR5cCI6IkpXVCJ9.eyJwbGFuX2lkIjoibm9uZSJ9.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";

/// The contract to plan on: two months after the front month on `today` (never in the
/// close-only window), and one that expired two years ago (never executable).
fn contracts(today: chrono::NaiveDate) -> (String, String) {
    use airlock::core::domain::calendar::ExchangeCalendar;
    use airlock::core::domain::cl::ClContract;
    use chrono::Datelike;
    let cal = ExchangeCalendar::cme();
    let tradeable = ClContract::front_month(today, cal)
        .and_then(|c| c.next())
        .and_then(|c| c.next())
        .map(|c| c.symbol())
        .unwrap_or_else(|| "CLF27".into());
    let code = b"FGHJKMNQUVXZ"[today.month0() as usize] as char;
    (tradeable, format!("CL{code}{}", today.year() - 2))
}

/// Cents of a decimal price string ("68.40" -> 6840); `None` for anything else.
fn cents(price: &str) -> Option<i64> {
    let (whole, frac) = price.split_once('.').unwrap_or((price, ""));
    if frac.len() > 2 || whole.starts_with('-') {
        return None;
    }
    let frac = format!("{frac:0<2}");
    Some(whole.parse::<i64>().ok()? * 100 + frac.parse::<i64>().ok()?)
}

/// A buy limit 10 % under the reference price, on the cent: inside the default 20 % band,
/// far enough below the market to rest.
fn resting_buy_limit(reference: &str) -> Option<String> {
    let c = cents(reference)?;
    if c < 100 {
        return None;
    }
    let limit = c * 9 / 10;
    Some(format!("{}.{:02}", limit / 100, limit % 100))
}

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

async fn health(ctx: &Ctx, found: &mut Found) -> Outcome {
    let a = ctx
        .send(HttpRequest::get(format!("{}/health", ctx.root)), false)
        .await?;
    a.expect(200)?;
    fields(
        &a.body,
        "the health answer",
        &["status", "service", "version"],
    )?;
    if a.body["status"] != "ok" || a.body["service"] != "airlock" {
        return Err(format!("not Airlock's health answer: {}", a.text.trim()));
    }
    found.health = a.body.clone();
    Ok(format!(
        "{} {}, broker {}",
        a.body["service"].as_str().unwrap_or(""),
        a.body["version"].as_str().unwrap_or("?"),
        a.body["broker"].as_str().unwrap_or("not named")
    ))
}

async fn reads(ctx: &Ctx, report: &mut Report, found: &mut Found) {
    scenario!(report, "read accounts", async {
        let a = ctx.get("/accounts").await?;
        let rows = listing(
            &a,
            "accounts",
            &["account_id", "name", "desk", "currency", "status"],
        )?;
        if found.account.is_none() {
            found.account = rows
                .iter()
                .find(|r| r["status"] == "active")
                .or(rows.first())
                .and_then(|r| r["account_id"].as_str())
                .map(String::from);
        }
        Ok(format!(
            "{} accounts; checking {}",
            rows.len(),
            found
                .account
                .as_deref()
                .unwrap_or("none (no account visible)")
        ))
    });
    let filter = found
        .account
        .as_ref()
        .map(|a| format!("account_id={a}&"))
        .unwrap_or_default();

    scenario!(report, "read positions", async {
        let a = ctx.get(&format!("/positions?{filter}limit=200")).await?;
        let rows = listing(
            &a,
            "positions",
            &[
                "account_id",
                "symbol",
                "quantity",
                "avg_price",
                "updated_at",
            ],
        )?;
        Ok(format!("{} positions", rows.len()))
    });

    scenario!(report, "read orders", async {
        let a = ctx.get(&format!("/orders?{filter}limit=200")).await?;
        let rows = listing(
            &a,
            "orders",
            &[
                "order_id",
                "account_id",
                "symbol",
                "side",
                "quantity",
                "order_type",
                "limit_price",
                "stop_price",
                "time_in_force",
                "status",
                "filled_quantity",
                "avg_fill_price",
                "action_id",
                "created_at",
                "updated_at",
            ],
        )?;
        let open = rows
            .iter()
            .find(|o| OPEN.iter().any(|s| o["status"] == *s))
            .or(rows.first());
        found.order_id = open.and_then(|o| o["order_id"].as_str()).map(String::from);
        Ok(format!("{} orders", rows.len()))
    });

    scenario!(report, "read jobs", async {
        let a = ctx.get("/jobs?limit=200").await?;
        let rows = listing(
            &a,
            "jobs",
            &[
                "job_id",
                "kind",
                "status",
                "account_id",
                "action_id",
                "created_at",
                "updated_at",
                "error",
                "result",
            ],
        )?;
        Ok(format!("{} jobs", rows.len()))
    });

    scenario!(report, "read portfolio", async {
        let account = found.account.clone().ok_or("no account to read")?;
        let a = ctx.get(&format!("/portfolio?account_id={account}")).await?;
        a.expect(200)?;
        let b = &a.body;
        fields(
            b,
            "the portfolio",
            &["account_id", "positions", "totals", "as_of", "price_source"],
        )?;
        fields(
            &b["totals"],
            "totals",
            &[
                "gross_notional",
                "net_notional",
                "net_contracts",
                "unrealized_pnl",
                "unpriced_positions",
            ],
        )?;
        for p in array(b, "positions")? {
            fields(
                p,
                "a valued position",
                &[
                    "symbol",
                    "contract_month",
                    "quantity",
                    "reference_price",
                    "notional",
                    "unrealized_pnl",
                ],
            )?;
            if let (Some(s), Some(m), Some(r)) = (
                p["symbol"].as_str(),
                p["contract_month"].as_str(),
                p["reference_price"].as_str(),
            ) {
                found.priced.push((s.into(), m.into(), r.into()));
            }
        }
        found.today = b["as_of"]
            .as_str()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.date_naive());
        Ok(format!(
            "{} positions, gross notional {}, as of {}",
            array(b, "positions")?.len(),
            b["totals"]["gross_notional"].as_str().unwrap_or("?"),
            b["as_of"].as_str().unwrap_or("?")
        ))
    });

    scenario!(report, "read portfolio/allocation", async {
        let a = ctx.get("/portfolio/allocation").await?;
        a.expect(200)?;
        fields(
            &a.body,
            "the allocation",
            &["by_contract_month", "by_side", "by_desk"],
        )?;
        for list in ["by_contract_month", "by_side", "by_desk"] {
            let slices = array(&a.body, list)?;
            let mut total = 0;
            for s in slices {
                fields(s, "a slice", &["key", "gross_notional", "percent"])?;
                total += s["percent"].as_str().and_then(cents).unwrap_or(0);
            }
            if !slices.is_empty() && total != 10_000 {
                return Err(format!(
                    "{list}: percents sum to {}.{:02}, not 100.00",
                    total / 100,
                    total % 100
                ));
            }
        }
        Ok(format!(
            "{} contract months, {} desks",
            array(&a.body, "by_contract_month")?.len(),
            array(&a.body, "by_desk")?.len()
        ))
    });

    scenario!(report, "read portfolio/risk-flags", async {
        let account = found.account.clone().ok_or("no account to read")?;
        let a = ctx
            .get(&format!("/portfolio/risk-flags?account_id={account}"))
            .await?;
        a.expect(200)?;
        fields(
            &a.body,
            "the risk flags",
            &["flags", "calendar_exposure", "trade_date", "policy_version"],
        )?;
        for f in array(&a.body, "flags")? {
            fields(f, "a flag", &["type", "severity", "message"])?;
        }
        if found.today.is_none() {
            found.today = a.body["trade_date"].as_str().and_then(|d| d.parse().ok());
        }
        Ok(format!(
            "{} flags, policy {}",
            array(&a.body, "flags")?.len(),
            a.body["policy_version"].as_str().unwrap_or("?")
        ))
    });

    scenario!(report, "read an unknown action", async {
        let a = ctx.get("/actions/act_airlock_check_unknown").await?;
        error_shape(&a, 404, "action_not_found", None)
    });
}

/// Follows `next_cursor` to the end: no row twice, no page over its limit, bounded pages.
async fn paginate(ctx: &Ctx, path: &str, list: &str, id: &str, small: u32) -> Outcome {
    let mut seen = HashSet::new();
    let mut cursor: Option<String> = None;
    let mut last_created: Option<String> = None;
    for page in 0..MAX_PAGES {
        let limit = if page < SMALL_PAGES { small } else { 200 };
        let url = match &cursor {
            Some(c) => format!("{path}limit={limit}&cursor={c}"),
            None => format!("{path}limit={limit}"),
        };
        let a = ctx.get(&url).await?;
        let rows = listing(&a, list, &[id]).map_err(|e| format!("page {}: {e}", page + 1))?;
        if rows.len() > limit as usize {
            return Err(format!(
                "page {} has {} rows, over its limit {limit}",
                page + 1,
                rows.len()
            ));
        }
        for r in rows {
            let key = r[id].as_str().unwrap_or_default().to_string();
            if !seen.insert(key.clone()) {
                return Err(format!("{key} appears twice (page {})", page + 1));
            }
            // Orders come newest first.
            if let Some(c) = r["created_at"].as_str().filter(|_| list == "orders") {
                if last_created.as_deref().is_some_and(|l| c > l) {
                    return Err(format!("{key} is out of order (newest first)"));
                }
                last_created = Some(c.to_string());
            }
        }
        match a.body["next_cursor"].as_str() {
            None => {
                return Ok(format!("{} {list} in {} pages", seen.len(), page + 1));
            }
            Some(c) => cursor = Some(c.to_string()),
        }
    }
    Ok(format!(
        "{} {list}, no duplicates; stopped at the cap of {MAX_PAGES} pages",
        seen.len()
    ))
}

async fn plans(ctx: &Ctx, report: &mut Report, found: &mut Found) {
    let today = found
        .today
        .unwrap_or_else(|| chrono::Utc::now().date_naive());
    let (symbol, expired) = contracts(today);
    let account = found.account.clone();

    scenario!(report, format!("plan order.submit.cl ({symbol})"), async {
        let account = account.clone().ok_or("no account to plan on")?;
        let p = ctx
            .plan(
                "order.submit.cl",
                json!({"account_id": account, "symbol": symbol, "side": "buy",
                       "quantity": 1, "order_type": "market"}),
                "plan-order",
            )
            .await?;
        let (failed, only_market) = failed_checks(&p.body);
        if p.body["executable"] == true {
            let confirm = if p.body["confirmation_token"].is_string() {
                "confirmed with its token"
            } else {
                "approved on the approval page"
            };
            Ok(format!(
                "executable, {confirm}: {}",
                p.body["preview"].as_str().unwrap_or("")
            ))
        } else if only_market {
            Ok(format!(
                "executable but for the market hours: {}",
                failed.join("; ")
            ))
        } else {
            Err(format!("not executable: {}", failed.join("; ")))
        }
    });

    scenario!(report, "plan order.cancel", async {
        let account = account.clone().ok_or("no account to plan on")?;
        let order = found
            .order_id
            .clone()
            .unwrap_or_else(|| "ord_airlock_check_none".into());
        let p = ctx
            .plan(
                "order.cancel",
                json!({"account_id": account, "order_id": order}),
                "plan-cancel",
            )
            .await?;
        let (failed, _) = failed_checks(&p.body);
        Ok(if p.body["executable"] == true {
            format!("order {order}: executable")
        } else {
            format!("order {order}: not executable: {}", failed.join("; "))
        })
    });

    scenario!(report, "plan positions.sync", async {
        let account = account.clone().ok_or("no account to plan on")?;
        let p = ctx
            .plan(
                "positions.sync",
                json!({"account_id": account}),
                "plan-sync",
            )
            .await?;
        found.sync_token = p.body["confirmation_token"].as_str().map(String::from);
        let (failed, _) = failed_checks(&p.body);
        Ok(if p.body["executable"] == true {
            format!("executable: {}", p.body["preview"].as_str().unwrap_or(""))
        } else {
            format!("not executable: {}", failed.join("; "))
        })
    });
    // The sync plan's id, for the tampered execute (any plan id works: the token is
    // verified before the plan is read).
    let sync_plan_id = found
        .sync_token
        .as_deref()
        .and_then(plan_id_of)
        .unwrap_or_else(|| "pln_airlock_check_none".into());

    scenario!(report, "execute with a tampered token", async {
        let token = found
            .sync_token
            .as_deref()
            .map(tamper)
            .unwrap_or_else(|| BOGUS_TOKEN.to_string());
        let body = ctx.execute_body(&sync_plan_id, Some(&token), "tampered");
        let a = ctx.post("/actions/execute", body.to_string()).await?;
        let d = error_shape(&a, 422, "token_invalid", None)?;
        if a.body["status"] != "rejected" {
            return Err(format!("no `status: rejected` in {}", a.text.trim()));
        }
        Ok(format!("{d}, status rejected"))
    });

    scenario!(
        report,
        format!("replay a rejected execute ({expired})"),
        async {
            let account = account.clone().ok_or("no account to plan on")?;
            let p = ctx
                .plan(
                    "order.submit.cl",
                    json!({"account_id": account, "symbol": expired, "side": "buy",
                       "quantity": 1, "order_type": "market"}),
                    "plan-replay",
                )
                .await?;
            if p.body["executable"] != false {
                return Err(format!("a plan on expired {expired} is executable"));
            }
            let plan_id = p.body["plan_id"].as_str().unwrap_or_default();
            // No token: nothing can be queued, whatever the plan's confirmation mode.
            let body = ctx.execute_body(plan_id, None, "replay").to_string();
            let first = ctx.post("/actions/execute", body.clone()).await?;
            let again = ctx.post("/actions/execute", body).await?;
            for a in [&first, &again] {
                if a.status < 400 || a.status >= 500 || a.body["status"] != "rejected" {
                    return Err(format!("expected a rejection, got {}", a.brief()));
                }
            }
            if (again.status, &again.body["error"]) != (first.status, &first.body["error"]) {
                return Err(format!(
                    "the replay answered {}, the first {}",
                    again.brief(),
                    first.brief()
                ));
            }
            error_shape(&again, again.status, first.code(), None)?;
            Ok(format!(
                "{} {} twice, the same error",
                first.status,
                first.code()
            ))
        }
    );
}

/// The `plan_id` claim of a confirmation token.
fn plan_id_of(token: &str) -> Option<String> {
    use base64::Engine;
    let part = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part)
        .ok()?;
    let claims: Value = serde_json::from_slice(&bytes).ok()?;
    claims["plan_id"].as_str().map(String::from)
}

async fn bad_inputs(ctx: &Ctx, report: &mut Report, found: &Found) {
    let account = found.account.clone().unwrap_or_else(|| "ACC-1".into());
    let sync = ctx.plan_body(
        "positions.sync",
        json!({"account_id": account}),
        "bad-input",
    );
    let mut unknown = sync.clone();
    unknown["airlock_check_unknown"] = json!(true);
    let mut missing = sync.clone();
    if let Some(o) = missing.as_object_mut() {
        o.remove("requested_by");
    }
    let mut bad_enum = sync.clone();
    bad_enum["action_type"] = json!("order.teleport");
    let cases: [(&str, String, &str); 4] = [
        ("malformed JSON", "{\"action_type\": ".into(), "/"),
        (
            "an unknown field",
            unknown.to_string(),
            "/airlock_check_unknown",
        ),
        (
            "a missing required field",
            missing.to_string(),
            "/requested_by",
        ),
        ("a bad enum value", bad_enum.to_string(), "/action_type"),
    ];
    for (what, body, field) in cases {
        scenario!(report, format!("bad input: {what}"), async {
            let a = ctx.post("/actions/plan", body).await?;
            error_shape(&a, 400, "invalid_request", Some(field))
        });
    }
    scenario!(report, "bad input: a forged cursor", async {
        let a = ctx
            .get("/orders?cursor=airlock-check-forged-cursor")
            .await?;
        error_shape(&a, 400, "invalid_cursor", Some("cursor"))
    });
}

/// An accepted execute: what to replay and follow.
struct Accepted {
    body: String,
    action_id: String,
    resource: Option<String>,
}

/// `202 queued` with an action id.
fn accepted(a: &Answer, body: String, what: &str) -> Result<Accepted, String> {
    a.expect(202)?;
    if a.body["status"] != "queued" {
        return Err(format!(
            "{what}: status {} instead of queued",
            a.body["status"]
        ));
    }
    let action_id = a.body["action_id"]
        .as_str()
        .ok_or_else(|| format!("{what}: no action_id"))?
        .to_string();
    let refs = &a.body["resource_refs"];
    Ok(Accepted {
        body,
        action_id,
        resource: refs["order_id"]
            .as_str()
            .or(refs["job_id"].as_str())
            .map(String::from),
    })
}

async fn execute(ctx: &Ctx, report: &mut Report, found: &Found) {
    let account = found.account.clone().unwrap_or_default();
    let today = found
        .today
        .unwrap_or_else(|| chrono::Utc::now().date_naive());
    // The farthest priced contract at least two months out: it rests inside the band.
    let floor = {
        use chrono::Datelike;
        let m = today.year() * 12 + today.month0() as i32 + 2;
        format!("{:04}-{:02}", m / 12, m % 12 + 1)
    };
    let contract = found
        .priced
        .iter()
        .filter(|(_, month, _)| *month >= floor)
        .max_by(|a, b| a.1.cmp(&b.1))
        .cloned();
    let mut order: Option<Accepted> = None;
    let mut sync: Option<Accepted> = None;

    scenario!(
        report,
        "execute order.submit.cl (1, resting limit)",
        async {
            let (symbol, _, reference) = contract.clone().ok_or_else(|| {
            format!("{account} holds no priced contract from {floor} on, to price a resting limit order from")
        })?;
            let limit = resting_buy_limit(&reference)
                .ok_or_else(|| format!("{symbol}'s reference price {reference} is too low"))?;
            let p = ctx
                .plan(
                    "order.submit.cl",
                    json!({"account_id": account, "symbol": symbol, "side": "buy", "quantity": 1,
                       "order_type": "limit", "limit_price": limit, "time_in_force": "day"}),
                    "execute-order",
                )
                .await?;
            let (failed, only_market) = failed_checks(&p.body);
            if p.body["executable"] != true {
                return if only_market {
                    Ok(format!(
                        "skipped, the market is closed: {}",
                        failed.join("; ")
                    ))
                } else {
                    Err(format!("the plan is not executable: {}", failed.join("; ")))
                };
            }
            let plan_id = p.body["plan_id"].as_str().unwrap_or_default();
            match p.body["confirmation_token"].as_str() {
                Some(_) => {
                    let acc = ctx.execute_accepted(&p.body, "order", "the order").await?;
                    let d = format!(
                        "queued {} (order {}): buy 1 {symbol} limit {limit}, reference {reference}",
                        acc.action_id,
                        acc.resource.as_deref().unwrap_or("?")
                    );
                    order = Some(acc);
                    Ok(d)
                }
                None => {
                    // Operator confirmation: a person approves on the approval page; the check
                    // never does. The execute answers 409 and decides nothing.
                    let body = ctx.execute_body(plan_id, None, "order");
                    let a = ctx.post("/actions/execute", body.to_string()).await?;
                    error_shape(&a, 409, "approval_required", None)?;
                    Ok(format!(
                    "not sent: 409 approval_required, the order waits for an operator's approval at {}",
                    a.body["approval"]["url"].as_str().unwrap_or("?")
                ))
                }
            }
        }
    );

    scenario!(report, "execute positions.sync", async {
        if account.is_empty() {
            return Err("no account".into());
        }
        let p = ctx
            .plan(
                "positions.sync",
                json!({"account_id": account}),
                "execute-sync",
            )
            .await?;
        if p.body["confirmation_token"].is_null() {
            let (failed, _) = failed_checks(&p.body);
            return Err(format!(
                "the plan has no confirmation token: {}",
                failed.join("; ")
            ));
        }
        let acc = ctx.execute_accepted(&p.body, "sync", "the sync").await?;
        let d = format!(
            "queued {} (job {})",
            acc.action_id,
            acc.resource.as_deref().unwrap_or("?")
        );
        sync = Some(acc);
        Ok(d)
    });

    scenario!(report, "replay an accepted execute", async {
        let acc = order
            .as_ref()
            .or(sync.as_ref())
            .ok_or("nothing was queued to replay")?;
        let a = ctx.post("/actions/execute", acc.body.clone()).await?;
        a.expect(200)?;
        if a.body["status"] != "duplicate" || a.body["action_id"] != acc.action_id.as_str() {
            return Err(format!(
                "expected duplicate of {}, got {}",
                acc.action_id,
                a.text.trim()
            ));
        }
        Ok(format!("200 duplicate, the same action {}", acc.action_id))
    });

    if let Some(acc) = &order {
        let order_id = acc.resource.clone().unwrap_or_default();
        let settled = scenario!(report, "the order reaches a terminal state", async {
            let (action, took) = ctx.settle(&acc.action_id).await?;
            let o = ctx.order(&account, &order_id).await?;
            let d = format!(
                "action {} after {} ms; order {order_id} {}",
                action["status"].as_str().unwrap_or("?"),
                took.as_millis(),
                o["status"].as_str().unwrap_or("?")
            );
            if action["status"] == "succeeded" {
                Ok(d)
            } else {
                Err(format!(
                    "{d}: {}",
                    action["error"].as_str().unwrap_or("no error given")
                ))
            }
        });
        if settled {
            scenario!(
                report,
                "plan order.replace.cl of the check's order",
                async {
                    // Plans a change of the resting order's time in force (nothing executes):
                    // the preview and the payload say before and after.
                    let p = ctx
                    .plan(
                        "order.replace.cl",
                        json!({"account_id": account, "order_id": order_id, "time_in_force": "gtc"}),
                        "replace-order",
                    )
                    .await?;
                    p.expect(200)?;
                    let n = &p.body["normalized_payload"];
                    let preview = p.body["preview"].as_str().unwrap_or_default();
                    if n["replaces"]["order_id"] != order_id.as_str()
                        || n["time_in_force"] != "gtc"
                        || !preview.starts_with("Change order")
                    {
                        return Err(format!("unexpected plan: {}", p.body));
                    }
                    let (failed, _) = failed_checks(&p.body);
                    Ok(format!(
                        "{preview} executable: {} {}",
                        p.body["executable"],
                        failed.join("; ")
                    ))
                }
            );
            scenario!(report, "cancel the check's order", async {
                let p = ctx
                    .plan(
                        "order.cancel",
                        json!({"account_id": account, "order_id": order_id}),
                        "cancel-order",
                    )
                    .await?;
                if p.body["executable"] != true {
                    let o = ctx.order(&account, &order_id).await?;
                    let status = o["status"].as_str().unwrap_or("?");
                    let (failed, _) = failed_checks(&p.body);
                    return if OPEN.contains(&status) {
                        Err(format!(
                            "order {order_id} is {status} but cannot be cancelled: {}",
                            failed.join("; ")
                        ))
                    } else {
                        Ok(format!(
                            "order {order_id} already {status}: nothing to cancel"
                        ))
                    };
                }
                let cancel = ctx
                    .execute_accepted(&p.body, "cancel", "the cancel")
                    .await?;
                let (action, took) = ctx.settle(&cancel.action_id).await?;
                let o = ctx.order(&account, &order_id).await?;
                let d = format!(
                    "cancel {} after {} ms; order {order_id} {}",
                    action["status"].as_str().unwrap_or("?"),
                    took.as_millis(),
                    o["status"].as_str().unwrap_or("?")
                );
                if action["status"] == "succeeded" && o["status"] == "cancelled" {
                    Ok(d)
                } else {
                    Err(format!(
                        "{d} {}",
                        action["error"].as_str().unwrap_or_default()
                    ))
                }
            });
        }
    }

    if let Some(acc) = &sync {
        scenario!(report, "the sync reaches a terminal state", async {
            let (action, took) = ctx.settle(&acc.action_id).await?;
            let d = format!(
                "action {} after {} ms",
                action["status"].as_str().unwrap_or("?"),
                took.as_millis()
            );
            if action["status"] == "succeeded" {
                Ok(d)
            } else {
                Err(format!(
                    "{d}: {}",
                    action["error"].as_str().unwrap_or("no error given")
                ))
            }
        });
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

    #[test]
    fn contracts_are_derived_from_the_date() {
        let d = |s: &str| s.parse::<chrono::NaiveDate>().unwrap();
        // CLZ26 stopped trading on 2026-11-19: the front month is CLF27.
        assert_eq!(
            contracts(d("2026-11-23")),
            ("CLH27".into(), "CLX2024".into())
        );
        assert_eq!(
            contracts(d("2027-01-05")),
            ("CLJ27".into(), "CLF2025".into())
        );
    }

    #[test]
    fn limits_rest_ten_percent_under_the_reference() {
        assert_eq!(resting_buy_limit("68.40").as_deref(), Some("61.56"));
        assert_eq!(resting_buy_limit("70").as_deref(), Some("63.00"));
        assert_eq!(resting_buy_limit("70.5").as_deref(), Some("63.45"));
        assert_eq!(resting_buy_limit("0.50"), None);
        assert_eq!(resting_buy_limit("-37.63"), None);
        assert_eq!(resting_buy_limit("1.234"), None);
        assert_eq!(cents("100.00"), Some(10_000));
    }

    #[test]
    fn tokens_are_read_and_tampered() {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let token = format!(
            "{}.{}.{}",
            b64.encode(br#"{"alg":"ES256"}"#),
            b64.encode(br#"{"sub":"op-1","plan_id":"pln_1"}"#),
            "A".repeat(86)
        );
        assert_eq!(token_sub(&token).as_deref(), Some("op-1"));
        assert_eq!(plan_id_of(&token).as_deref(), Some("pln_1"));
        let t = tamper(&token);
        assert_ne!(t, token);
        assert_eq!(t.len(), token.len());
        assert_eq!(
            t.rsplit_once('.').unwrap().0,
            token.rsplit_once('.').unwrap().0
        );
        assert_eq!(token_sub("not a jwt"), None);
    }

    #[test]
    fn error_bodies_are_checked_against_the_contract() {
        let answer = |status: u16, body: Value, header: Option<&str>| Answer {
            status,
            text: body.to_string(),
            body,
            request_id: header.map(String::from),
        };
        let good = json!({"error": {"code": "invalid_request", "message": "Bad.",
            "details": [{"field": "/x", "message": "bad"}]}, "request_id": "req_1"});
        assert!(error_shape(
            &answer(400, good.clone(), Some("req_1")),
            400,
            "invalid_request",
            Some("/x")
        )
        .is_ok());
        for (a, why) in [
            (answer(400, good.clone(), Some("req_2")), "header"),
            (answer(422, good.clone(), None), "status"),
            (
                answer(
                    400,
                    json!({"error": {"code": "invalid_request"}, "request_id": "req_1"}),
                    None,
                ),
                "message",
            ),
            (
                answer(400, json!({"message": "Too Many Requests"}), None),
                "gateway body",
            ),
        ] {
            assert!(
                error_shape(&a, 400, "invalid_request", Some("/x")).is_err(),
                "{why}"
            );
        }
        assert!(error_shape(&answer(400, good, None), 400, "invalid_request", Some("/y")).is_err());
    }
}
