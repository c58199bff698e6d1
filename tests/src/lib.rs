//! Test harness: starts the real `airlock` binary on an ephemeral loopback port with a
//! temporary state dir, mints tokens with its CLI, and stops it on drop.
//!
//! The binary is `target/debug/airlock-failpoints` (built with test-only failpoints by the
//! README's test command, `scripts/test.sh`), or `$AIRLOCK_TEST_BIN`. A missing binary is a
//! loud failure, never a skip.

pub mod browser;
pub mod contract;
pub mod faults;
pub mod idp;
pub mod lambda;
pub mod moto;
pub mod passkey;
pub mod raw;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use std::time::{Duration, Instant};

use serde_json::Value;

pub const BASE: &str = "/api/internal/v1/mastra";

pub fn binary() -> PathBuf {
    if let Ok(p) = std::env::var("AIRLOCK_TEST_BIN") {
        return PathBuf::from(p);
    }
    // target/debug/deps/<test exe> -> target/debug/airlock-failpoints
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = dir.join("airlock-failpoints");
    assert!(
        bin.exists(),
        "{} is missing: run the README's test command (scripts/test.sh), which builds it",
        bin.display()
    );
    bin
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A fresh, empty state dir under the system temp dir.
/// A body column of the embedded database as JSON text, for tests that read the file
/// directly: the adapter stores plans, actions, audit records, keys, check sets and queue
/// messages packed (`airlock::adapters::sqlite::packed`).
pub fn stored_body(r: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<String> {
    airlock::adapters::sqlite::packed::text(r.get_ref(i)?).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Blob, e.into())
    })
}

pub fn temp_state_dir() -> PathBuf {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let d = std::env::temp_dir().join(format!("airlock-test-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// Which backend a server runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Embedded,
    Aws,
}

/// Runs one async test body against both backends: `both!(name)` defines
/// `name::embedded` and `name::aws`, each calling `name(Backend)`.
#[macro_export]
macro_rules! both {
    ($name:ident) => {
        mod $name {
            #[tokio::test]
            async fn embedded() {
                super::$name($crate::Backend::Embedded).await
            }
            #[tokio::test]
            async fn aws() {
                super::$name($crate::Backend::Aws).await
            }
        }
    };
}

/// Where servers keep their state: a state dir and, on AWS, an emulator (moto) holding the
/// tables, queues and key. A stack outlives a crashed server, so a restart finds its state.
pub struct Stack {
    pub backend: Backend,
    pub state_dir: PathBuf,
    moto: Option<moto::Moto>,
    bootstrapped: bool,
}

/// The policy a stack's processes start with (`policy.json` in the state dir): the
/// defaults, except that new orders and changes of orders are confirmed with the plan's
/// token, as the suites written for the token path expect, and reference prices have no
/// age limit: the suites restart their stacks minutes or weeks later on the clock
/// (`AIRLOCK_NOW`) with the prices seeded at the start, where a real market's feed would
/// have refreshed them. The `prices` suite sets the age limit itself. The approval suites
/// use [`Stack::operator_mode`], which keeps the real defaults (a person approves new
/// orders on the approval page; prices older than 300 s fail).
pub const TOKEN_MODE_POLICY: &str = r#"{"confirmation": {"order.submit.cl": "token", "order.replace.cl": "token"}, "max_quote_age_seconds": null}"#;

impl Stack {
    pub fn new(backend: Backend) -> Stack {
        let state_dir = temp_state_dir();
        std::fs::write(state_dir.join("policy.json"), TOKEN_MODE_POLICY).expect("policy.json");
        Stack {
            backend,
            state_dir,
            moto: match backend {
                Backend::Aws => Some(moto::Moto::start()),
                Backend::Embedded => None,
            },
            bootstrapped: false,
        }
    }

    /// The shipped default policy: `order.submit.cl` needs an operator's approval on the
    /// approval page.
    pub fn operator_mode(self) -> Stack {
        let _ = std::fs::remove_file(self.state_dir.join("policy.json"));
        self
    }

    /// The emulator's endpoint, on the AWS backend (a fault proxy goes in front of it).
    pub fn emulator_endpoint(&self) -> Option<String> {
        self.moto.as_ref().map(|m| m.endpoint.clone())
    }

    /// The environment every process of this stack gets (backend, emulator endpoint).
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![(
            "AIRLOCK_BACKEND".to_string(),
            match self.backend {
                Backend::Embedded => "embedded",
                Backend::Aws => "aws",
            }
            .to_string(),
        )];
        if let Some(m) = &self.moto {
            env.extend(m.env());
        }
        env
    }

    /// Runs the CLI on this stack with extra environment.
    pub fn cli(&self, extra: &[(&str, &str)], args: &[&str]) -> String {
        let mut env = self.env();
        env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        cli(&self.state_dir, &env, args)
    }

    /// Starts `airlock serve` on this stack (bootstrapping the AWS resources and demo data
    /// on first use, at the instant `AIRLOCK_NOW` of `env` if given).
    pub fn start(mut self, env: &[(&str, &str)]) -> Server {
        if self.backend == Backend::Aws && !self.bootstrapped {
            self.cli(env, &["bootstrap", "--demo-data"]);
            self.bootstrapped = true;
        }
        let mut full = self.env();
        // Workers stay off unless a test turns them on, so queues can be inspected.
        full.push(("AIRLOCK_WORKERS".into(), "off".into()));
        full.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let state_dir = self.state_dir.clone();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(state_dir.join("serve.log"))
            .expect("log file");
        let mut cmd = Command::new(binary());
        cmd.arg("--state-dir")
            .arg(&state_dir)
            .args(["serve", "--addr", "127.0.0.1:0"])
            .env_remove("AIRLOCK_NOW")
            .env_remove("AIRLOCK_FAILPOINTS")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log));
        for (k, v) in &full {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn airlock serve");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(l) => l,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "airlock serve did not start; see {}",
                    state_dir.join("serve.log").display()
                )
            }
        };
        let Some(base) = line
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .map(String::from)
        else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "airlock serve did not start ({line:?}); see {}",
                state_dir.join("serve.log").display()
            )
        };
        Server {
            child: Some(child),
            base,
            state_dir,
            backend: self.backend,
            env: full,
            stack: Some(self),
        }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.state_dir);
        }
    }
}

pub struct Server {
    child: Option<Child>,
    pub base: String,
    pub state_dir: PathBuf,
    pub backend: Backend,
    env: Vec<(String, String)>,
    stack: Option<Stack>,
}

impl Server {
    /// A server on the embedded backend with a new state dir.
    pub fn start(env: &[(&str, &str)]) -> Server {
        Stack::new(Backend::Embedded).start(env)
    }

    /// A server on the given backend with new state.
    pub fn start_on(backend: Backend, env: &[(&str, &str)]) -> Server {
        Stack::new(backend).start(env)
    }

    /// A server at [`MARKET_OPEN`] with the shipped default policy ([`Stack::operator_mode`]:
    /// new orders wait for an operator on the approval page).
    pub fn operator_mode_at_open(backend: Backend) -> Server {
        Stack::new(backend)
            .operator_mode()
            .start(&[("AIRLOCK_NOW", MARKET_OPEN)])
    }

    /// An embedded server on an existing state dir.
    pub fn start_in(state_dir: PathBuf, env: &[(&str, &str)]) -> Server {
        Stack {
            backend: Backend::Embedded,
            state_dir,
            moto: None,
            bootstrapped: false,
        }
        .start(env)
    }

    /// A server at [`MARKET_OPEN`] with the workers on, quick retries (100 ms) and a short
    /// visibility timeout (1 s), plus `extra` environment.
    pub fn with_workers(b: Backend, extra: &[(&str, &str)]) -> Server {
        let mut env = vec![
            ("AIRLOCK_NOW", MARKET_OPEN),
            ("AIRLOCK_WORKERS", "on"),
            ("AIRLOCK_WORKER_RETRY_MS", "100"),
            ("AIRLOCK_WORKER_VISIBILITY_MS", "1000"),
        ];
        env.extend_from_slice(extra);
        Server::start_on(b, &env)
    }

    /// Stops the process (SIGKILL: a crash) and keeps its state for a restart.
    pub fn crash(mut self) -> Stack {
        self.stop();
        self.stack.take().expect("stack")
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits for the process to exit by itself (e.g. a failpoint abort); keeps the state.
    pub fn wait_exit(mut self, timeout: Duration) -> Stack {
        let start = Instant::now();
        if let Some(c) = self.child.as_mut() {
            while start.elapsed() < timeout {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        self.crash()
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{BASE}{path}", self.base)
    }

    /// The environment the CLI runs with for this server.
    pub fn cli_env(&self) -> Vec<(String, String)> {
        self.env.clone()
    }

    /// Runs the CLI on this server's state and environment; returns stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        cli(&self.state_dir, &self.env, args)
    }

    /// Fills `quantity` of a working order at the paper broker (`airlock broker fill`), at
    /// `price` or the order's own; returns the broker's order after the fill.
    pub fn broker_fill(
        &self,
        account: &str,
        order_id: &str,
        quantity: u32,
        price: Option<&str>,
    ) -> Value {
        let quantity = quantity.to_string();
        let mut args = vec!["broker", "fill", "--account", account, "--order", order_id];
        args.extend(["--quantity", &quantity]);
        if let Some(p) = price {
            args.extend(["--price", p]);
        }
        serde_json::from_str(&self.cli(&args)).expect("the broker's order")
    }

    /// The paper broker's book of an account (`airlock broker-book`).
    pub fn broker_book(&self, account: &str) -> Value {
        serde_json::from_str(&self.cli(&["broker-book", account])).expect("the broker's book")
    }

    pub fn service_token(&self) -> String {
        self.cli(&["token", "service"])
    }

    pub fn operator_token(&self, sub: &str, roles: &str, desks: Option<&str>) -> String {
        let mut args = vec!["token", "operator", "--sub", sub, "--roles", roles];
        if let Some(d) = desks {
            args.extend(["--desks", d]);
        }
        self.cli(&args)
    }

    /// An API client for the demo energy trader.
    pub fn trader(&self) -> Api {
        Api::new(
            self,
            self.service_token(),
            self.operator_token("op-energy-trader", "trader", Some("energy")),
        )
    }

    /// The embedded backend's database (embedded servers only).
    pub fn db(&self) -> rusqlite::Connection {
        assert_eq!(
            self.backend,
            Backend::Embedded,
            "db() is for the embedded backend"
        );
        let c = rusqlite::Connection::open(self.state_dir.join("airlock.db")).expect("open db");
        c.busy_timeout(Duration::from_secs(5))
            .expect("busy timeout");
        c
    }

    /// How many approval documents of a kind (`challenge`, `session`, `enrolment`,
    /// `operator`) the store holds, live or expired: what requests made it keep.
    pub async fn stored_approval_docs(&self, kind: &str) -> usize {
        match self.backend {
            Backend::Embedded => self
                .db()
                .query_row(
                    "SELECT COUNT(*) FROM approval_docs WHERE kind = ?",
                    [kind],
                    |r| r.get::<_, i64>(0),
                )
                .expect("count approval docs") as usize,
            Backend::Aws => {
                let var = |k: &str| {
                    self.env
                        .iter()
                        .find(|(n, _)| n == k)
                        .map(|(_, v)| v.clone())
                };
                let conf =
                    crate::emulator_config(var("AWS_ENDPOINT_URL").expect("an emulator endpoint"))
                        .await;
                let ddb = aws_sdk_dynamodb::Client::new(&conf);
                let table = var("AIRLOCK_APPROVALS_TABLE").unwrap_or("airlock-approvals".into());
                let mut n = 0;
                let mut start = None;
                loop {
                    let o = ddb
                        .query()
                        .table_name(&table)
                        .key_condition_expression("#k = :k")
                        .expression_attribute_names("#k", "kind")
                        .expression_attribute_values(
                            ":k",
                            aws_sdk_dynamodb::types::AttributeValue::S(kind.into()),
                        )
                        .select(aws_sdk_dynamodb::types::Select::Count)
                        .set_exclusive_start_key(start)
                        .send()
                        .await
                        .expect("query approval docs");
                    n += o.count as usize;
                    match o.last_evaluated_key {
                        Some(k) if !k.is_empty() => start = Some(k),
                        _ => return n,
                    }
                }
            }
        }
    }

    /// Messages in both queues (waiting or in flight), through `airlock queues`.
    pub fn queued_messages(&self) -> i64 {
        self.queue_counts("waiting") + self.queue_counts("in_flight")
    }

    /// One count of `airlock queues` (`waiting`, `in_flight`, `dead_letters`), summed
    /// over both queues.
    pub fn queue_counts(&self, which: &str) -> i64 {
        self.cli(&["queues"])
            .lines()
            .flat_map(|l| l.split_whitespace())
            .filter_map(|w| w.split_once('='))
            .filter(|(k, _)| *k == which)
            .map(|(_, n)| n.parse::<i64>().expect("a count"))
            .sum()
    }

    /// Stops the AWS emulator under a running server (an outage).
    pub fn stop_emulator(&mut self) {
        if let Some(m) = self.stack.as_mut().and_then(|s| s.moto.as_mut()) {
            m.stop();
        }
    }

    /// The request log lines `airlock serve` wrote (JSON), oldest first.
    pub fn request_log(&self) -> Vec<Value> {
        self.log_lines()
            .into_iter()
            .filter(|v| v["fields"]["message"] == "request")
            .map(|v| v["fields"].clone())
            .collect()
    }

    /// Every JSON log line `airlock serve` wrote (`level`, `fields`, `spans`), oldest first.
    pub fn log_lines(&self) -> Vec<Value> {
        std::fs::read_to_string(self.state_dir.join("serve.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .collect()
    }

    /// The audit trail of a plan or action, through `airlock audit`.
    pub fn audit(&self, id: &str) -> Vec<Value> {
        self.cli(&["audit", id])
            .lines()
            .map(|l| serde_json::from_str(l).expect("audit JSON line"))
            .collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

pub fn cli(state_dir: &Path, env: &[(String, String)], args: &[&str]) -> String {
    let mut cmd = Command::new(binary());
    cmd.arg("--state-dir")
        .arg(state_dir)
        .args(args)
        .env_remove("AIRLOCK_NOW")
        .env("RUST_LOG", "warn");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run airlock");
    assert!(
        out.status.success(),
        "airlock {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf8")
        .trim()
        .to_string()
}

/// An HTTP client holding a service token and an operator token.
#[derive(Clone)]
pub struct Api {
    pub http: reqwest::Client,
    pub base: String,
    pub service: String,
    pub operator: String,
}

/// A response: status, headers we care about, JSON body.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub body: Value,
    pub request_id: Option<String>,
    pub retry_after: Option<String>,
}

impl Resp {
    pub fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }

    /// The error's message (`error.message`; empty if there is none).
    pub fn message(&self) -> &str {
        self.body["error"]["message"].as_str().unwrap_or("")
    }

    /// A plan's risk check by name.
    #[track_caller]
    pub fn check(&self, name: &str) -> &Value {
        self.body["risk_checks"]
            .as_array()
            .and_then(|a| a.iter().find(|c| c["name"] == name))
            .unwrap_or_else(|| panic!("no check {name} in {:?}", self.body))
    }

    /// Asserts a plan's risk check `name` has this status (`pass`, `warn`, `fail`).
    #[track_caller]
    pub fn assert_check(&self, name: &str, status: &str) {
        assert_eq!(
            self.check(name)["status"],
            status,
            "{name}: {:?}",
            self.body
        );
    }

    /// A plan's `plan_id`.
    #[track_caller]
    pub fn plan_id(&self) -> String {
        self.body["plan_id"].as_str().expect("plan id").to_string()
    }

    /// The field the error names first (`error.details[0].field`).
    pub fn field(&self) -> Value {
        self.body["error"]["details"][0]["field"].clone()
    }

    /// Asserts the answer is this error: its HTTP status and stable code (the body is
    /// printed otherwise).
    #[track_caller]
    pub fn assert_error(&self, status: u16, code: &str) {
        assert_eq!(
            (self.status, self.code()),
            (status, code),
            "{:?}",
            self.body
        );
    }

    /// Asserts the answer's HTTP status and its `status` field (`queued`, `duplicate`...).
    #[track_caller]
    pub fn assert_status(&self, status: u16, action_status: &str) {
        assert_eq!(
            (self.status, self.body["status"].as_str()),
            (status, Some(action_status)),
            "{:?}",
            self.body
        );
    }
}

impl Api {
    pub fn new(server: &Server, service: String, operator: String) -> Api {
        Api {
            http: reqwest::Client::new(),
            base: format!("{}{BASE}", server.base),
            service,
            operator,
        }
    }

    pub fn with_tokens(&self, service: &str, operator: &str) -> Api {
        Api {
            service: service.into(),
            operator: operator.into(),
            ..self.clone()
        }
    }

    async fn try_send(&self, rb: reqwest::RequestBuilder) -> Result<Resp, reqwest::Error> {
        let mut rb = rb;
        if !self.service.is_empty() {
            rb = rb.header("authorization", format!("Bearer {}", self.service));
        }
        if !self.operator.is_empty() {
            rb = rb.header("x-operator-token", &self.operator);
        }
        let r = rb.send().await?;
        let status = r.status().as_u16();
        let h = |n: &str| {
            r.headers()
                .get(n)
                .and_then(|v| v.to_str().ok())
                .map(String::from)
        };
        let request_id = h("x-request-id");
        let retry_after = h("retry-after");
        let text = r.text().await?;
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok(Resp {
            status,
            body,
            request_id,
            retry_after,
        })
    }

    async fn send(&self, rb: reqwest::RequestBuilder) -> Resp {
        self.try_send(rb).await.expect("HTTP request")
    }

    /// A POST that may fail at the transport level (the server died mid-request).
    pub async fn try_post(&self, path: &str, body: &Value) -> Result<Resp, reqwest::Error> {
        self.try_send(
            self.http
                .post(format!("{}{path}", self.base))
                .header("content-type", "application/json")
                .body(body.to_string()),
        )
        .await
    }

    /// Execute with an `Idempotency-Key` header next to the body's key.
    pub async fn send_with_header(&self, plan: &Resp, header_key: &str, body_key: &str) -> Resp {
        let body = serde_json::json!({
            "plan_id": plan["plan_id"],
            "confirmation_token": plan["confirmation_token"],
            "idempotency_key": body_key,
            "requested_by": "op-energy-trader"
        });
        self.send(
            self.http
                .post(format!("{}/actions/execute", self.base))
                .header("content-type", "application/json")
                .header("idempotency-key", header_key)
                .body(body.to_string()),
        )
        .await
    }

    /// The execute body for a plan and key.
    pub fn execute_body(plan: &Resp, key: &str) -> Value {
        serde_json::json!({
            "plan_id": plan["plan_id"],
            "confirmation_token": plan["confirmation_token"],
            "idempotency_key": key,
            "requested_by": "op-energy-trader"
        })
    }

    /// One tool called through MCP (protocol 2026-07-28, `POST /mcp`, answered 200): the
    /// JSON-RPC result.
    pub async fn mcp_tool(&self, name: &str, arguments: Value) -> Value {
        let body = serde_json::json!({
            "jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {
                "name": name,
                "arguments": arguments,
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities": {},
                },
            },
        });
        let r = self
            .http
            .post(format!("{}/mcp", self.base))
            .header("authorization", format!("Bearer {}", self.service))
            .header("x-operator-token", &self.operator)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", name)
            .body(body.to_string())
            .send()
            .await
            .expect("POST /mcp");
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.expect("JSON-RPC");
        v["result"].clone()
    }

    pub async fn get(&self, path: &str) -> Resp {
        self.send(self.http.get(format!("{}{path}", self.base)))
            .await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Resp {
        self.try_post(path, body).await.expect("HTTP request")
    }

    pub async fn post_raw(&self, path: &str, content_type: &str, body: Vec<u8>) -> Resp {
        self.send(
            self.http
                .post(format!("{}{path}", self.base))
                .header("content-type", content_type)
                .body(body),
        )
        .await
    }

    /// Polls the action until it is no longer queued or processing (90 s at most).
    pub async fn settled(&self, action_id: &str) -> Resp {
        let deadline = Instant::now() + Duration::from_secs(90);
        while Instant::now() < deadline {
            let r = self.get(&format!("/actions/{action_id}")).await;
            if r["status"] != "queued" && r["status"] != "processing" {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("action {action_id} never settled");
    }

    /// The order as `GET /orders` shows it (Null if it is not among the newest 200).
    pub async fn order(&self, order_id: &str) -> Value {
        let r = self.get("/orders?limit=200").await;
        r.body["orders"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["order_id"] == order_id)
            .cloned()
            .unwrap_or(Value::Null)
    }

    /// The account's position in `symbol` as `GET /positions` shows it (0 if none).
    pub async fn position(&self, account: &str, symbol: &str) -> i64 {
        let r = self.get(&format!("/positions?account_id={account}")).await;
        r.body["positions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["symbol"] == symbol)
            .map(|p| p["quantity"].as_i64().unwrap())
            .unwrap_or(0)
    }

    /// Plans a market buy of `qty` `symbol` on ACC-1 for the energy trader.
    pub async fn plan_buy(&self, symbol: &str, qty: u32) -> Resp {
        self.post(
            "/actions/plan",
            &serde_json::json!({
                "action_type": "order.submit.cl",
                "payload": { "account_id": "ACC-1", "symbol": symbol, "side": "buy", "quantity": qty, "order_type": "market" },
                "requested_by": "op-energy-trader",
                "chat_context": { "chat_session_id": "chat-1", "tool_call_id": "call-1" }
            }),
        )
        .await
    }

    /// A plan of a positions sync of `account` by the demo trader.
    pub async fn plan_sync(&self, account: &str) -> Resp {
        self.post(
            "/actions/plan",
            &serde_json::json!({
                "action_type": "positions.sync",
                "payload": { "account_id": account },
                "requested_by": "op-energy-trader"
            }),
        )
        .await
    }

    pub async fn execute(&self, plan: &Resp, key: &str) -> Resp {
        self.execute_with(
            plan["plan_id"].as_str().unwrap_or(""),
            plan["confirmation_token"].as_str().unwrap_or(""),
            key,
        )
        .await
    }

    /// Execute without a confirmation token (an `operator` plan, or an unknown one).
    pub async fn execute_untokened(&self, plan_id: &str, key: &str) -> Resp {
        self.post(
            "/actions/execute",
            &serde_json::json!({ "plan_id": plan_id, "idempotency_key": key, "requested_by": "op-energy-trader" }),
        )
        .await
    }

    pub async fn execute_with(&self, plan_id: &str, token: &str, key: &str) -> Resp {
        self.post(
            "/actions/execute",
            &serde_json::json!({
                "plan_id": plan_id,
                "confirmation_token": token,
                "idempotency_key": key,
                "requested_by": "op-energy-trader"
            }),
        )
        .await
    }
}

impl std::ops::Index<&str> for Resp {
    type Output = Value;
    fn index(&self, k: &str) -> &Value {
        &self.body[k]
    }
}

/// Rewrites an action's item in the actions table `table` as the release before the
/// sharded unsent index wrote it: `unsent = "1"` instead of `unsent_shard`.
pub async fn unsent_the_old_way(ddb: &aws_sdk_dynamodb::Client, table: &str, action_id: &str) {
    use aws_sdk_dynamodb::types::AttributeValue;
    ddb.update_item()
        .table_name(table)
        .key("action_id", AttributeValue::S(action_id.into()))
        .update_expression("REMOVE unsent_shard SET unsent = :u")
        .expression_attribute_values(":u", AttributeValue::S("1".into()))
        .send()
        .await
        .unwrap_or_else(|e| panic!("action {action_id} the old way: {e:?}"));
}

/// The SDK configuration of a test's own AWS clients on its emulator: explicit, not the
/// process environment (tests run in parallel, each on its own emulator).
pub async fn emulator_config(endpoint: impl Into<String>) -> aws_config::SdkConfig {
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(aws_config::Region::new(moto::Moto::REGION))
        .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
            "test", "test", None, None, "tests",
        ))
        .load()
        .await
}

/// The demo trader as the command line names an operator (`token operator`, `operators
/// enroll`).
pub const TRADER_ARGS: [&str; 6] = [
    "--sub",
    "op-energy-trader",
    "--roles",
    "trader",
    "--desks",
    "energy",
];

/// A command line about the demo trader: `head`, then [`TRADER_ARGS`].
pub fn trader_args<'a>(head: &[&'a str]) -> Vec<&'a str> {
    head.iter().copied().chain(TRADER_ARGS).collect()
}

/// The string `field` of every object in the JSON array `list`, in order (a test's view of
/// a listing's ids, a plan's check names...).
#[track_caller]
pub fn column<'a>(list: &'a Value, field: &str) -> Vec<&'a str> {
    list.as_array()
        .unwrap_or_else(|| panic!("not an array: {list}"))
        .iter()
        .map(|row| {
            row[field]
                .as_str()
                .unwrap_or_else(|| panic!("no string {field} in {row}"))
        })
        .collect()
}

/// Monday 2026-11-23 09:00 Chicago: CME Globex open, CLF27 tradable.
pub const MARKET_OPEN: &str = "2026-11-23T15:00:00Z";

/// The (account, contract) pairs the benchmarks' order scenarios rotate through: both energy accounts
/// and three CL months. Each pair's buys and sells alternate, so its position stays within a
/// contract or two of where it started, far inside the position limit (50).
pub const COMBOS: [(&str, &str); 6] = [
    ("ACC-1", "CLF27"),
    ("ACC-2", "CLF27"),
    ("ACC-1", "CLG27"),
    ("ACC-2", "CLG27"),
    ("ACC-1", "CLH27"),
    ("ACC-2", "CLH27"),
];

/// Forged tokens for attack tests.
pub mod forge {
    use base64::Engine;
    use hmac::Mac;

    const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

    pub fn b64(bytes: &[u8]) -> String {
        B64.encode(bytes)
    }

    /// The claims of a compact JWS, decoded.
    pub fn claims(token: &str) -> serde_json::Value {
        let part = token.split('.').nth(1).expect("payload");
        serde_json::from_slice(&B64.decode(part).expect("b64")).expect("json")
    }

    pub fn header(token: &str) -> serde_json::Value {
        let part = token.split('.').next().expect("header");
        serde_json::from_slice(&B64.decode(part).expect("b64")).expect("json")
    }

    /// `alg: none` with the given claims and an empty signature.
    pub fn alg_none(claims: &serde_json::Value) -> String {
        format!(
            "{}.{}.",
            b64(br#"{"alg":"none","typ":"JWT"}"#),
            b64(claims.to_string().as_bytes())
        )
    }

    /// HS256 signed with `secret` (the classic "HMAC with the public key" attack).
    pub fn hs256(claims: &serde_json::Value, kid: Option<&str>, secret: &[u8]) -> String {
        let header = match kid {
            Some(k) => serde_json::json!({ "alg": "HS256", "typ": "JWT", "kid": k }),
            None => serde_json::json!({ "alg": "HS256", "typ": "JWT" }),
        };
        let input = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let mut m = <hmac::Hmac<sha2::Sha256> as Mac>::new_from_slice(secret).expect("key");
        m.update(input.as_bytes());
        format!("{input}.{}", b64(&m.finalize().into_bytes()))
    }

    /// Re-signs `claims` with a fresh P-256 key under the same header: a forged signature.
    pub fn es256_foreign(token: &str, claims: &serde_json::Value) -> String {
        use p256::ecdsa::{signature::Signer, Signature, SigningKey};
        let key = SigningKey::random(&mut p256::elliptic_curve::rand_core::OsRng);
        let head = token.split('.').next().expect("header");
        let input = format!("{head}.{}", b64(claims.to_string().as_bytes()));
        let sig: Signature = key.sign(input.as_bytes());
        format!("{input}.{}", b64(&sig.to_bytes()))
    }

    /// The public key of a PKCS#8 P-256 private key file, as SPKI PEM text.
    pub fn public_pem_of(private_pem_path: &std::path::Path) -> String {
        use p256::pkcs8::{DecodePrivateKey, EncodePublicKey, LineEnding};
        let pem = std::fs::read_to_string(private_pem_path).expect("key file");
        let sk = p256::SecretKey::from_pkcs8_pem(&pem).expect("p256 key");
        sk.public_key()
            .to_public_key_pem(LineEnding::LF)
            .expect("pem")
    }
}
