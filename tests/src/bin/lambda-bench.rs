//! `lambda-bench`: cold start and peak memory of the release Lambda function binaries, run
//! the way Lambda runs them: under the Runtime API emulator (`airlock_tests::lambda`), fed API
//! Gateway REST proxy events, on the embedded backend (SQLite in a temp state dir).
//!
//! Run (from the workspace root):
//!
//! ```text
//! cargo build --release -p accounts -p positions -p orders -p jobs -p action-status -p plan -p execute \
//!     -p worker-orders -p worker-jobs -p sweeper \
//!     -p airlock-local   # airlock-local: the CLI and `serve`, for tokens and queued work (setup only)
//! cargo run --release -p airlock-tests --bin lambda-bench
//! ```
//!
//! The seven API functions get one API Gateway REST event each (below). The two workers get
//! SQS events with one record each, every invocation a message of its own that the setup
//! queued: the setup runs the release `airlock serve` (workers off, `AIRLOCK_NOW` at a CME
//! session) on the same state dir, plans and executes `runs + burst + 2` market orders (both
//! energy accounts, three CL months, sides alternating) and as many `positions.sync` actions,
//! stops it, and takes the message bodies from its queue table, so each `worker-orders`
//! invocation creates, submits and fills a new order and each `worker-jobs` one runs a new
//! sync job. The `sweeper` gets a scheduled event (nothing is left to sweep).
//!
//! For each function:
//!
//! - **cold start**: `--runs` (default 20) fresh processes; init = the time from `spawn()` to
//!   the process's first `GET /runtime/invocation/next` (state built, runtime polling). Also
//!   the first invocation's latency, after init.
//! - **memory**: one fresh process, then a burst of `--burst` (default 1000) invocations
//!   queued by `--callers` (default 8) threads; peak RSS = `VmHWM` of `/proc/<pid>/status` at
//!   the end (and after init, for comparison).
//!
//! Targets: init under 50 ms (checked on the max of the runs), peak RSS under 40 MB
//! (40,000,000 bytes). The embedded backend is not the AWS one: on AWS, init also builds the
//! SDK clients and fetches the KMS signing key's public key (`GetPublicKey`) before the first
//! `/next`, unless `AIRLOCK_CONFIRMATION_PUBLIC_KEY` gives it; that network round trip is not
//! in these figures.
//!
//! Options: `--runs N`, `--burst N`, `--callers N`, `--functions a,b,...` (default: all
//! ten), `--bin-dir DIR` (where the function binaries are; default: next to this
//! executable, i.e. `target/release` under `cargo run --release`), `--cli PATH` (the airlock
//! CLI; default `$AIRLOCK_TEST_BIN`, else `airlock` in the bin dir, else
//! `target/debug/airlock-failpoints` or `target/debug/airlock`).
//!
//! Not a test: nothing here runs under `cargo test`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use airlock_tests::lambda::{
    apigw_rest_event, response_parts, FunctionProcess, LambdaEmulator, IGNORE_STAGE_ENV,
};
use airlock_tests::{cli, temp_state_dir, BASE};
use serde_json::{json, Value};

const ALL: [&str; 10] = [
    "accounts",
    "positions",
    "orders",
    "jobs",
    "action-status",
    "plan",
    "execute",
    "worker-orders",
    "worker-jobs",
    "sweeper",
];
/// A Monday 09:00 in Chicago (CME open): the setup's `serve` runs there to queue orders.
const MARKET_OPEN: &str = "2026-11-23T15:00:00Z";
const INIT_TARGET: Duration = Duration::from_millis(50);
const RSS_TARGET_BYTES: u64 = 40_000_000;
const TIMEOUT: Duration = Duration::from_secs(30);

struct Opts {
    runs: usize,
    burst: usize,
    callers: usize,
    functions: Vec<String>,
    bin_dir: PathBuf,
    cli: Option<PathBuf>,
}

fn usage() -> ! {
    eprintln!(
        "usage: lambda-bench [--runs N] [--burst N] [--callers N] [--functions a,b] \
         [--bin-dir DIR] [--cli PATH]"
    );
    std::process::exit(2)
}

fn parse_opts() -> Opts {
    let exe = std::env::current_exe().expect("current exe");
    let mut o = Opts {
        runs: 20,
        burst: 1000,
        callers: 8,
        functions: ALL.iter().map(|s| s.to_string()).collect(),
        bin_dir: exe.parent().expect("exe dir").to_path_buf(),
        cli: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--runs" => o.runs = val().parse().unwrap_or_else(|_| usage()),
            "--burst" => o.burst = val().parse().unwrap_or_else(|_| usage()),
            "--callers" => o.callers = val().parse().unwrap_or_else(|_| usage()),
            "--functions" => o.functions = val().split(',').map(String::from).collect(),
            "--bin-dir" => o.bin_dir = PathBuf::from(val()),
            "--cli" => o.cli = Some(PathBuf::from(val())),
            _ => usage(),
        }
    }
    if o.runs == 0 || o.burst == 0 || o.callers == 0 {
        usage()
    }
    o
}

/// The airlock CLI (setup only: tokens, demo data).
fn cli_binary(o: &Opts) -> PathBuf {
    if let Some(p) = &o.cli {
        return p.clone();
    }
    if let Ok(p) = std::env::var("AIRLOCK_TEST_BIN") {
        return PathBuf::from(p);
    }
    let target = o.bin_dir.parent().unwrap_or(Path::new("."));
    let candidates = [
        o.bin_dir.join("airlock"),
        target.join("debug").join("airlock-failpoints"),
        target.join("debug").join("airlock"),
    ];
    candidates
        .iter()
        .find(|p| p.exists())
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "no airlock CLI found (tried {candidates:?}): cargo build -p airlock-local, \
                 or pass --cli"
            )
        })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Nearest-rank percentile of sorted values.
fn pct(sorted: &[Duration], q: f64) -> Duration {
    let n = sorted.len();
    let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
    sorted[rank - 1]
}

fn mb(kb: u64) -> String {
    format!("{:.1} MiB", kb as f64 / 1024.0)
}

struct Setup {
    dir: PathBuf,
    service: String,
    operator: String,
    plan: Value,
    action_id: Option<String>,
    /// Queued message bodies with their group (account), per queue, for the workers.
    orders_queue: Vec<(String, String)>,
    jobs_queue: Vec<(String, String)>,
    next_message: std::sync::atomic::AtomicUsize,
}

fn cli_env() -> Vec<(String, String)> {
    vec![("AIRLOCK_BACKEND".to_string(), "embedded".to_string())]
}

impl Setup {
    /// Fresh tokens (service tokens live at most 900 s): before each function's run.
    fn mint_tokens(&mut self) {
        let env = cli_env();
        self.service = cli(&self.dir, &env, &["token", "service"]);
        self.operator = cli(
            &self.dir,
            &env,
            &[
                "token",
                "operator",
                "--sub",
                "op-energy-trader",
                "--roles",
                "trader",
                "--desks",
                "energy",
            ],
        );
    }

    fn headers(&self) -> Vec<(&'static str, String)> {
        vec![
            ("Authorization", format!("Bearer {}", self.service)),
            ("X-Operator-Token", self.operator.clone()),
            ("Content-Type", "application/json".into()),
            ("User-Agent", "lambda-bench".into()),
        ]
    }

    fn env(&self) -> Vec<(&str, &str)> {
        vec![
            ("AIRLOCK_BACKEND", "embedded"),
            ("AIRLOCK_STATE_DIR", self.dir.to_str().expect("utf-8 dir")),
            ("RUST_LOG", "info"),
            IGNORE_STAGE_ENV,
        ]
    }

    /// The event a function gets in the benchmark: one representative request (for the
    /// workers, the next queued message).
    fn event(&self, function: &str) -> Value {
        match function {
            "worker-orders" | "worker-jobs" => {
                let q = if function == "worker-orders" {
                    &self.orders_queue
                } else {
                    &self.jobs_queue
                };
                let i = self
                    .next_message
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let (body, group) = q.get(i % q.len().max(1)).cloned().unwrap_or_default();
                return sqs_event(&format!("m-{i}"), &body, &group, function);
            }
            "sweeper" => {
                return json!({"source": "aws.events", "detail-type": "Scheduled Event", "detail": {}})
            }
            _ => {}
        }
        let h = self.headers();
        let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let ev = |method: &str, path: &str, query: &[(&str, &str)], body: Option<&str>| {
            apigw_rest_event(method, &format!("{BASE}{path}"), query, &h, body)
        };
        match function {
            "accounts" => ev("GET", "/accounts", &[], None),
            "positions" => ev("GET", "/positions", &[("account_id", "ACC-1")], None),
            "orders" => ev("GET", "/orders", &[("limit", "50")], None),
            "jobs" => ev("GET", "/jobs", &[], None),
            "action-status" => {
                let id = self
                    .action_id
                    .as_deref()
                    .unwrap_or("act_lambda_bench_missing");
                ev("GET", &format!("/actions/{id}"), &[], None)
            }
            "plan" => ev("POST", "/actions/plan", &[], Some(&plan_body().to_string())),
            "execute" => {
                // A plan made while CME is closed is not executable and has no confirmation
                // token (Lambdas ignore AIRLOCK_NOW): then send a well-formed JWT that is not
                // a confirmation token, so execute runs auth, the plan lookup and the token
                // check before it refuses.
                let token = self.plan["confirmation_token"]
                    .as_str()
                    .unwrap_or(&self.operator)
                    .to_string();
                let body = json!({
                    "plan_id": self.plan["plan_id"],
                    "confirmation_token": token,
                    "idempotency_key": "lambda-bench-execute",
                    "requested_by": "op-energy-trader"
                });
                ev("POST", "/actions/execute", &[], Some(&body.to_string()))
            }
            other => panic!("unknown function {other}"),
        }
    }
}

/// An SQS event with one record, as Lambda's event source mapping delivers it.
fn sqs_event(id: &str, body: &str, group: &str, function: &str) -> Value {
    let fifo = function == "worker-orders";
    let mut attributes = json!({ "ApproximateReceiveCount": "1" });
    if fifo {
        attributes["MessageGroupId"] = json!(group);
    }
    json!({
        "Records": [{
            "messageId": id,
            "receiptHandle": format!("receipt-{id}"),
            "body": body,
            "attributes": attributes,
            "messageAttributes": {},
            "eventSource": "aws:sqs",
            "eventSourceARN": if fifo {
                "arn:aws:sqs:us-east-1:123456789012:airlock-worker-orders.fifo"
            } else {
                "arn:aws:sqs:us-east-1:123456789012:airlock-worker-jobs"
            },
            "awsRegion": "us-east-1"
        }]
    })
}

/// Queues `n` market orders and `n` `positions.sync` actions with the release `airlock
/// serve` (workers off, clock at a CME session) on the state dir, and returns the queue's
/// message bodies and groups: (orders, jobs).
#[allow(clippy::type_complexity)]
fn queue_work(
    cli_bin: &Path,
    dir: &Path,
    n: usize,
) -> (Vec<(String, String)>, Vec<(String, String)>) {
    use std::io::BufRead;
    let dir_s = dir.to_str().expect("utf-8 dir");
    let env = vec![
        ("AIRLOCK_BACKEND".to_string(), "embedded".to_string()),
        ("AIRLOCK_NOW".to_string(), MARKET_OPEN.to_string()),
    ];
    let service = cli(dir, &env, &["token", "service"]);
    let mut child = std::process::Command::new(cli_bin)
        .args(["--state-dir", dir_s, "serve", "--addr", "127.0.0.1:0"])
        .env("AIRLOCK_BACKEND", "embedded")
        .env("AIRLOCK_NOW", MARKET_OPEN)
        .env("AIRLOCK_WORKERS", "off")
        .env("AIRLOCK_EXECUTE_RATE_PER_MINUTE", "1000000")
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn airlock serve");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("listening line");
    let base = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("airlock serve did not start: {line:?}"))
        .to_string();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    const COMBOS: [(&str, &str); 6] = [
        ("ACC-1", "CLF27"),
        ("ACC-2", "CLF27"),
        ("ACC-1", "CLG27"),
        ("ACC-2", "CLG27"),
        ("ACC-1", "CLH27"),
        ("ACC-2", "CLH27"),
    ];
    let clients = 4;
    rt.block_on(async {
        let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for w in 0..clients {
            let sub = format!("op-lambda-bench-{w}");
            let op = cli(
                dir,
                &env,
                &[
                    "token", "operator", "--sub", &sub, "--roles", "trader", "--desks", "energy",
                ],
            );
            let (next, base, service) = (next.clone(), base.clone(), service.clone());
            tasks.push(tokio::spawn(async move {
                let http = reqwest::Client::new();
                let post = |path: &str, body: Value| {
                    http.post(format!("{base}{BASE}{path}"))
                        .header("authorization", format!("Bearer {service}"))
                        .header("x-operator-token", &op)
                        .header("content-type", "application/json")
                        .body(body.to_string())
                        .send()
                };
                loop {
                    let k = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if k >= 2 * n {
                        break;
                    }
                    let payload = if k % 2 == 0 {
                        let j = k / 2;
                        let (account, symbol) = COMBOS[j % COMBOS.len()];
                        let side = if (j / COMBOS.len()).is_multiple_of(2) {
                            "buy"
                        } else {
                            "sell"
                        };
                        json!({"action_type": "order.submit.cl", "payload": {
                            "account_id": account, "symbol": symbol, "side": side,
                            "quantity": 1, "order_type": "market"}})
                    } else {
                        let account = if (k / 2) % 2 == 0 { "ACC-1" } else { "ACC-2" };
                        json!({"action_type": "positions.sync", "payload": {"account_id": account}})
                    };
                    let mut body = payload;
                    body["requested_by"] = json!(sub);
                    let plan: Value = post("/actions/plan", body)
                        .await
                        .expect("plan")
                        .json()
                        .await
                        .expect("plan JSON");
                    assert_eq!(plan["executable"], true, "setup plan: {plan}");
                    let r = post(
                        "/actions/execute",
                        json!({
                            "plan_id": plan["plan_id"],
                            "confirmation_token": plan["confirmation_token"],
                            "idempotency_key": format!("lambda-bench-{k}"),
                            "requested_by": sub,
                        }),
                    )
                    .await
                    .expect("execute");
                    assert_eq!(
                        r.status().as_u16(),
                        202,
                        "setup execute: {:?}",
                        r.text().await
                    );
                }
            }));
        }
        for t in tasks {
            t.await.expect("setup task");
        }
    });
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    let db = rusqlite::Connection::open(dir.join("airlock.db")).expect("open db");
    let mut st = db
        .prepare("SELECT queue, body, group_key FROM queue WHERE status = 'ready' ORDER BY id")
        .expect("prepare");
    let rows: Vec<(String, String, String)> = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .expect("query")
        .filter_map(Result::ok)
        .collect();
    let pick = |q: &str| -> Vec<(String, String)> {
        rows.iter()
            .filter(|(name, _, _)| name == q)
            .map(|(_, b, g)| (b.clone(), g.clone()))
            .collect()
    };
    (pick("worker:orders"), pick("worker:jobs"))
}

fn plan_body() -> Value {
    json!({
        "action_type": "order.submit.cl",
        "payload": {
            "account_id": "ACC-1", "symbol": "CLF27", "side": "buy",
            "quantity": 1, "order_type": "market"
        },
        "requested_by": "op-energy-trader",
        "chat_context": { "chat_session_id": "bench", "tool_call_id": "bench" }
    })
}

fn start(emu: &LambdaEmulator, bin: &Path, s: &Setup) -> (FunctionProcess, Duration) {
    let mut f = emu.spawn_function(bin, &s.env());
    let init = f
        .wait_ready(TIMEOUT)
        .unwrap_or_else(|e| panic!("{} did not start: {e}", bin.display()));
    (f, init)
}

/// The HTTP status of an API function's answer; for a worker, `ok` when no record failed
/// (else `failed`); for the sweeper, `sent=N`.
fn status_of(r: &Result<Value, String>) -> String {
    match r {
        Ok(v) if v.get("batchItemFailures").is_some() => {
            if v["batchItemFailures"]
                .as_array()
                .is_some_and(|a| a.is_empty())
            {
                "ok".into()
            } else {
                "failed".into()
            }
        }
        Ok(v) if v.get("sent").is_some() => format!("sent={}", v["sent"]),
        Ok(v) => response_parts(v).0.to_string(),
        Err(_) => "invoke error".into(),
    }
}

/// The state dir, tokens, demo data, one plan (via the release `plan` function) and, if the
/// market is open now, one executed action (via `execute`) for `action-status`.
fn setup(o: &Opts) -> Setup {
    let dir = temp_state_dir();
    let cli_bin = cli_binary(o);
    std::env::set_var("AIRLOCK_TEST_BIN", &cli_bin);
    let mut s = Setup {
        dir,
        service: String::new(),
        operator: String::new(),
        plan: Value::Null,
        action_id: None,
        orders_queue: Vec::new(),
        jobs_queue: Vec::new(),
        next_message: Default::default(),
    };
    s.mint_tokens();
    cli(&s.dir, &cli_env(), &["seed-orders", "0"]);
    if o.functions.iter().any(|f| f.starts_with("worker-")) {
        let n = o.runs + o.burst + 2;
        let t = Instant::now();
        let (orders, jobs) = queue_work(&cli_bin, &s.dir, n);
        println!(
            "setup: queued {} order and {} job messages with `airlock serve` in {:.1} s",
            orders.len(),
            jobs.len(),
            t.elapsed().as_secs_f64()
        );
        assert!(
            orders.len() >= n && jobs.len() >= n,
            "setup: not enough queued messages"
        );
        s.orders_queue = orders;
        s.jobs_queue = jobs;
    }
    let emu = LambdaEmulator::start();
    let (mut f, _) = start(&emu, &o.bin_dir.join("plan"), &s);
    let r = f.invoke(s.event("plan"), TIMEOUT).expect("setup plan");
    let (st, plan) = response_parts(&r);
    assert_eq!(st, 200, "setup plan: {r}");
    s.plan = plan;
    drop(f);
    let (mut f, _) = start(&emu, &o.bin_dir.join("execute"), &s);
    let r = f
        .invoke(s.event("execute"), TIMEOUT)
        .expect("setup execute");
    let (st, body) = response_parts(&r);
    if (200..300).contains(&st) {
        s.action_id = body["action_id"].as_str().map(String::from);
    }
    println!(
        "setup: CLI {}, state dir {}, plan executable: {}, execute → {st} {} {}",
        cli_bin.display(),
        s.dir.display(),
        s.plan["executable"],
        body["error"]["code"].as_str().unwrap_or(""),
        body["error"]["message"].as_str().unwrap_or("")
    );
    s
}

struct Figures {
    function: String,
    init: Vec<Duration>,
    first: Vec<Duration>,
    first_status: BTreeMap<String, usize>,
    hwm_init_kb: u64,
    hwm_kb: u64,
    rss_kb: u64,
    burst_elapsed: Duration,
    burst_lat: Vec<Duration>,
    burst_status: BTreeMap<String, usize>,
}

fn bench(o: &Opts, s: &Setup, function: &str) -> Figures {
    let bin = o.bin_dir.join(function);
    let emu = LambdaEmulator::start();
    let mut init = Vec::new();
    let mut first = Vec::new();
    let mut first_status = BTreeMap::new();
    for _ in 0..o.runs {
        let (mut f, d) = start(&emu, &bin, s);
        init.push(d);
        let t = Instant::now();
        let r = f.invoke(s.event(function), TIMEOUT);
        first.push(t.elapsed());
        *first_status.entry(status_of(&r)).or_insert(0) += 1;
    }
    init.sort();
    first.sort();

    let (mut f, _) = start(&emu, &bin, s);
    let hwm_init_kb = f.proc_status_kb("VmHWM").unwrap_or(0);
    let lat = Mutex::new(Vec::with_capacity(o.burst));
    let statuses = Mutex::new(BTreeMap::new());
    let t = Instant::now();
    std::thread::scope(|sc| {
        for c in 0..o.callers {
            let n = o.burst / o.callers + usize::from(c < o.burst % o.callers);
            let (emu, lat, statuses) = (&emu, &lat, &statuses);
            sc.spawn(move || {
                for _ in 0..n {
                    let t = Instant::now();
                    let r = emu.invoke(s.event(function), TIMEOUT);
                    let d = t.elapsed();
                    lat.lock().unwrap().push(d);
                    *statuses.lock().unwrap().entry(status_of(&r)).or_insert(0) += 1;
                }
            });
        }
    });
    let burst_elapsed = t.elapsed();
    let hwm_kb = f.proc_status_kb("VmHWM").unwrap_or(0);
    let rss_kb = f.proc_status_kb("VmRSS").unwrap_or(0);
    // Still the same process, alive: one more invocation answers.
    f.invoke(s.event(function), TIMEOUT)
        .unwrap_or_else(|e| panic!("{function} after the burst: {e}"));
    drop(f);
    let mut burst_lat = lat.into_inner().unwrap();
    burst_lat.sort();
    Figures {
        function: function.into(),
        init,
        first,
        first_status,
        hwm_init_kb,
        hwm_kb,
        rss_kb,
        burst_elapsed,
        burst_lat,
        burst_status: statuses.into_inner().unwrap(),
    }
}

fn statuses(m: &BTreeMap<String, usize>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}×{v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn main() {
    let o = parse_opts();
    for f in &o.functions {
        let bin = o.bin_dir.join(f);
        assert!(
            bin.exists(),
            "{} is missing: cargo build --release -p accounts -p positions -p orders -p jobs \
             -p action-status -p plan -p execute -p worker-orders -p worker-jobs -p sweeper \
             (or pass --bin-dir)",
            bin.display()
        );
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "lambda-bench: {} runs/function, burst {} invocations from {} callers; bin dir {}; \
         {} CPUs; loadavg {}",
        o.runs,
        o.burst,
        o.callers,
        o.bin_dir.display(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load.trim()
    );
    let mut s = setup(&o);
    let mut results = Vec::new();
    for f in &o.functions {
        s.mint_tokens();
        s.next_message.store(0, std::sync::atomic::Ordering::SeqCst);
        let r = bench(&o, &s, f);
        eprintln!(
            "{f}: init p50 {:.1} ms, VmHWM {} (loadavg {})",
            ms(pct(&r.init, 0.5)),
            mb(r.hwm_kb),
            std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .trim()
        );
        results.push(r);
    }
    let _ = std::fs::remove_dir_all(&s.dir);

    println!();
    println!(
        "| function | init min / p50 / max (ms) | init < 50 ms | 1st invoke p50 (ms) | \
         VmHWM after init | VmHWM after burst | VmRSS after burst | peak < 40 MB | \
         burst inv/s | burst p50 / p99 (ms) | statuses (1st / burst) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut all_ok = true;
    for r in &results {
        let init_ok = *r.init.last().unwrap() < INIT_TARGET;
        let rss_ok = r.hwm_kb * 1024 < RSS_TARGET_BYTES;
        all_ok &= init_ok && rss_ok;
        println!(
            "| {} | {:.1} / {:.1} / {:.1} | {} | {:.2} | {} | {} | {} | {} | {:.0} | {:.2} / {:.2} | {} / {} |",
            r.function,
            ms(r.init[0]),
            ms(pct(&r.init, 0.5)),
            ms(*r.init.last().unwrap()),
            if init_ok { "yes" } else { "NO" },
            ms(pct(&r.first, 0.5)),
            mb(r.hwm_init_kb),
            mb(r.hwm_kb),
            mb(r.rss_kb),
            if rss_ok { "yes" } else { "NO" },
            r.burst_lat.len() as f64 / r.burst_elapsed.as_secs_f64(),
            ms(pct(&r.burst_lat, 0.5)),
            ms(pct(&r.burst_lat, 0.99)),
            statuses(&r.first_status),
            statuses(&r.burst_status),
        );
    }
    println!();
    println!(
        "Embedded backend (SQLite in a temp dir, local keys). On the AWS backend, init also \
         builds the AWS SDK clients, and the execute function makes one KMS GetPublicKey \
         call (the key that verifies confirmation tokens) before the first /next unless \
         AIRLOCK_CONFIRMATION_PUBLIC_KEY gives the key: add that round trip to the init \
         figures. Burst latency is emulator round trip with {} callers \
         queued against one sequential function process (Lambda's model: one invocation at a \
         time per environment).",
        o.callers
    );
    println!(
        "targets: {}",
        if all_ok {
            "all met"
        } else {
            "NOT all met (see NO above)"
        }
    );
}
