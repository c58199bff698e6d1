//! `airlock-bench`: throughput and latency of the release `airlock serve`, over real HTTP.
//!
//! Run (from the workspace root):
//!
//! ```text
//! cargo build --release -p airlock-local && cargo run --release -p airlock-tests --bin airlock-bench -- all
//! ```
//!
//! Subcommands: `startup`, `reads`, `pairs`, `pairs-shared`, `workers`, `all` (every one of
//! them), `mcp` (MCP tool-call latency next to REST; not in `all`), and `aws-calls` (not in
//! `all`: it needs the moto emulator, `scripts/emulator.sh`).
//! Options: `--duration SECS` (measured window of `reads`/`pairs`, default 10),
//! `--clients N` (default 16), `--runs N` (fresh starts for `startup`, default 20),
//! `--orders N` (bulk orders seeded for `startup`/`reads`, default 10000),
//! `--read-paths /P,/P` (`reads`: paths from the server's root, default the four of
//! `READ_PATHS` under the base path; `--read-paths /health` measures the HTTP floor: the
//! same client and connections, the same middleware, no store, no token check),
//! `--no-baseline` (skip the 1-client baseline runs), `--wait-idle SECS` (before each
//! scenario, wait up to this long for other processes to leave the machine idle; default 120),
//! `--workers on|off` (`AIRLOCK_WORKERS` of the `reads` and `pairs` servers; default `off`, as
//! in the test harness, so only the HTTP path is measured; `startup` uses serve's default),
//! `--queued N` (`workers`: orders queued and drained, default 1000), `--groups N`
//! (`workers` queueing and `aws-calls`: the account-and-contract message groups the queued
//! orders rotate over, 1 to 12, default 6: both energy accounts on CLF27, CLG27, CLH27, then
//! the months after), `--stream-clients N`
//! (`workers`: clients, default 4), `--stream-secs SECS` (`workers`: measured stream, default
//! 20), `--stream-rates R,R` (`workers`: one stream per rate, pairs/s over all clients, 0 for
//! a closed loop; default `0,50`).
//!
//! `pairs` gives each client its own trader on the energy desk; `pairs-shared` runs every
//! client as `op-energy-trader`. Both start `serve` with `AIRLOCK_NOW` at a Monday 09:00
//! Chicago (CME open) and `AIRLOCK_EXECUTE_RATE_PER_MINUTE=1000000`, the largest value the
//! configuration accepts. Each pair plans 1 CLF27 on ACC-1 (market) and executes it; a client's
//! pairs alternate buy and sell so that the account stays inside the position limit (50) when
//! workers fill the orders.
//!
//! `workers`: plans and executes `--queued` market orders with the workers off (4 clients,
//! both energy accounts, CLF27/CLG27/CLH27, sides alternating per account and contract), kills
//! the server, restarts it on the same state dir with `AIRLOCK_WORKERS=on` and times the
//! drain until every order is filled (the database, opened read-only, is polled every 10 ms;
//! each order's fill time also comes from its `updated_at`). Then, on a fresh server with the
//! workers on, one steady stream per `--stream-rates` entry: end-to-end latency from the
//! execute response to `succeeded` seen by polling `GET /actions/{id}` every 10 ms (every
//! 10th execute of a client), and the server-side accept → succeeded time of every action.
//!
//! `aws-calls`: the AWS backend on moto (one request at a time). The AWS calls of each API
//! operation come from the request log (`backend_calls`, counted by the SDK interceptor); the
//! in-process worker's calls, which no request line carries, come from the emulator's own log
//! of `X-Amz-Target`s (a wrapper around moto written to a temp dir) while it drains queued
//! orders with no HTTP traffic, minus an idle window of the same length.
//!
//! The server under test is `$AIRLOCK_TEST_BIN` if set, else `airlock` next to this
//! executable (`target/release/airlock` under `cargo run --release`). Client and server share
//! the machine, so the figures include the client's own CPU use; each scenario reports the
//! CPU time both sides used per request. Results go to stdout as a markdown table.
//!
//! Not a test: nothing here runs under `cargo test`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use airlock_tests::{binary, cli, temp_state_dir, Server, BASE, COMBOS, MARKET_OPEN};
use serde_json::{json, Value};

const TRADER: &str = "op-energy-trader";
/// The highest per-operator execute (and plan) rate the config accepts
/// (`AIRLOCK_EXECUTE_RATE_PER_MINUTE` and `AIRLOCK_PLAN_RATE_PER_MINUTE` are range-checked
/// to 1..=1,000,000; a larger value makes `serve` refuse to start): no scenario here
/// reaches it.
const MAX_RATE_PER_MINUTE: &str = "1000000";
/// The scenarios that queue orders with the workers off (or measure plan and execute
/// alone) turn execute's orders-backlog admission check off; the closed-loop stream keeps
/// the default and retries refused executes after their `Retry-After`.
const NO_BACKLOG_LIMIT: (&str, &str) = ("AIRLOCK_ORDERS_BACKLOG_LIMIT", "0");

// ---------------------------------------------------------------------------------------
// Options and results

#[derive(Clone)]
struct Opts {
    duration: Duration,
    warmup: Duration,
    clients: usize,
    runs: usize,
    orders: usize,
    baseline: bool,
    wait_idle: Duration,
    /// `AIRLOCK_WORKERS` for the `reads` and `pairs` servers.
    workers: String,
    /// `workers`: orders queued with the workers off, then drained.
    queued: usize,
    /// `workers`: clients of the queueing phase and of the steady stream.
    stream_clients: usize,
    /// `workers`: measured length of the steady stream.
    stream_secs: Duration,
    /// `workers`: stream rates to run, plan+execute pairs per second over all clients;
    /// 0 = closed loop (each client as fast as it can).
    stream_rates: Vec<u64>,
    /// `reads`: the paths from the server's root, taken in turn by each client.
    read_paths: Vec<String>,
    /// `workers` and `aws-calls`: the account-and-contract message groups the queued
    /// orders rotate over ([`combos`]).
    groups: usize,
}

/// The contract months `--groups` takes, front month first (at [`MARKET_OPEN`]).
const MONTHS: [&str; 6] = ["CLF27", "CLG27", "CLH27", "CLJ27", "CLK27", "CLM27"];

/// `n` account-and-contract groups: both energy accounts on each month in turn, so the first
/// six are [`COMBOS`].
fn combos(n: usize) -> Vec<(&'static str, &'static str)> {
    (0..n.clamp(1, 2 * MONTHS.len()))
        .map(|i| (["ACC-1", "ACC-2"][i % 2], MONTHS[i / 2]))
        .collect()
}

struct Row {
    bench: String,
    metric: String,
    value: String,
    target: String,
    met: Option<bool>,
}

fn row(bench: &str, metric: &str, value: String, target: &str, met: Option<bool>) -> Row {
    Row {
        bench: bench.into(),
        metric: metric.into(),
        value,
        target: target.into(),
        met,
    }
}

fn info(bench: &str, metric: &str, value: String) -> Row {
    row(bench, metric, value, "", None)
}

fn print_table(rows: &[Row]) {
    println!();
    println!("| benchmark | metric | value | target | met |");
    println!("|---|---|---|---|---|");
    for r in rows {
        let met = match r.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "",
        };
        println!(
            "| {} | {} | {} | {} | {} |",
            r.bench, r.metric, r.value, r.target, met
        );
    }
}

// ---------------------------------------------------------------------------------------
// Statistics

/// Latencies in microseconds.
#[derive(Default, Clone)]
struct Lat(Vec<u64>);

impl Lat {
    fn push(&mut self, d: Duration) {
        self.0.push(d.as_micros() as u64);
    }
    fn extend(&mut self, o: &Lat) {
        self.0.extend_from_slice(&o.0);
    }
    fn sorted(&self) -> Vec<u64> {
        let mut v = self.0.clone();
        v.sort_unstable();
        v
    }
    /// Nearest-rank percentile, milliseconds.
    fn pct(&self, p: f64) -> f64 {
        let v = self.sorted();
        if v.is_empty() {
            return f64::NAN;
        }
        let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
        v[rank.clamp(1, v.len()) - 1] as f64 / 1000.0
    }
    fn max(&self) -> f64 {
        self.0.iter().copied().max().unwrap_or(0) as f64 / 1000.0
    }
    fn min(&self) -> f64 {
        self.0.iter().copied().min().unwrap_or(0) as f64 / 1000.0
    }
    fn mean(&self) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        self.0.iter().sum::<u64>() as f64 / self.0.len() as f64 / 1000.0
    }
    fn summary(&self) -> String {
        format!(
            "p50 {:.2} / p90 {:.2} / p99 {:.2} / max {:.2} ms (mean {:.2}, n={})",
            self.pct(50.0),
            self.pct(90.0),
            self.pct(99.0),
            self.max(),
            self.mean(),
            self.0.len()
        )
    }
}

/// CPU time (user+system) of a process, from /proc; None off Linux.
fn cpu_time(pid: &str) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line: indexes 11 and 12 here.
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_secs_f64(ticks as f64 / clk_tck()))
}

fn clk_tck() -> f64 {
    static TCK: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TCK.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// Busy CPU time of the whole machine (all cores, every process), from /proc/stat.
fn machine_busy() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let v: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal ...
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
    Some(Duration::from_secs_f64((total - idle) as f64 / clk_tck()))
}

fn cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Waits (up to `max`) until other processes leave the machine mostly idle, so that a
/// concurrent build does not skew the figures; warns if it never does.
fn wait_quiet(max: Duration) {
    let t0 = Instant::now();
    loop {
        let a = machine_busy();
        std::thread::sleep(Duration::from_millis(1000));
        let busy = match (a, machine_busy()) {
            (Some(a), Some(b)) => (b - a).as_secs_f64() / cores() as f64 * 100.0,
            _ => return,
        };
        if busy < 10.0 {
            return;
        }
        if t0.elapsed() >= max {
            eprintln!(
                "  WARNING: the machine is {busy:.0}% busy with other work; figures will be skewed"
            );
            return;
        }
        eprintln!("  machine {busy:.0}% busy with other work; waiting for it to settle");
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// CPU used during a measured window: server, client (this process), whole machine.
#[derive(Clone, Copy, Default)]
struct CpuUse {
    server: Option<Duration>,
    client: Option<Duration>,
    machine: Option<Duration>,
}

/// CPU time of the server (by pid), of this process and of the machine, sampled together.
struct CpuMeter {
    server: String,
    start: [Option<Duration>; 3],
}

impl CpuMeter {
    fn sample(server: &str) -> [Option<Duration>; 3] {
        [cpu_time(server), cpu_time("self"), machine_busy()]
    }
    fn start(server_pid: Option<u32>) -> CpuMeter {
        let server = server_pid.map(|p| p.to_string()).unwrap_or_default();
        let start = CpuMeter::sample(&server);
        CpuMeter { server, start }
    }
    fn stop(&self) -> CpuUse {
        let end = CpuMeter::sample(&self.server);
        let d = |i: usize| end[i].zip(self.start[i]).map(|(b, a)| b.saturating_sub(a));
        CpuUse {
            server: d(0),
            client: d(1),
            machine: d(2),
        }
    }
}

fn cpu_rows(bench: &str, wall: Duration, n: usize, unit: &str, cpu: CpuUse) -> Vec<Row> {
    let mut rows = Vec::new();
    let cores = cores() as f64;
    let per = |d: Duration| d.as_secs_f64() * 1e6 / n.max(1) as f64;
    let util = |d: Duration| d.as_secs_f64() / wall.as_secs_f64() / cores * 100.0;
    if let (Some(s), Some(c)) = (cpu.server, cpu.client) {
        rows.push(info(
            bench,
            &format!("CPU per {unit}: server / client"),
            format!("{:.0} µs / {:.0} µs", per(s), per(c)),
        ));
        let other = cpu
            .machine
            .map(|m| format!(" / other {:.0}%", util(m.saturating_sub(s + c))))
            .unwrap_or_default();
        rows.push(info(
            bench,
            "CPU busy, % of all cores",
            format!(
                "server {:.0}% / client {:.0}%{other} ({} cores)",
                util(s),
                util(c),
                cores as usize
            ),
        ));
    }
    rows
}

/// Error tally: kind -> count, plus a few samples.
#[derive(Default)]
struct Errors {
    kinds: BTreeMap<String, u64>,
    samples: Vec<String>,
}

impl Errors {
    fn add(&mut self, kind: String, sample: impl FnOnce() -> String) {
        *self.kinds.entry(kind).or_default() += 1;
        if self.samples.len() < 5 {
            self.samples.push(sample());
        }
    }
    fn total(&self) -> u64 {
        self.kinds.values().sum()
    }
    fn merge(&mut self, o: Errors) {
        for (k, v) in o.kinds {
            *self.kinds.entry(k).or_default() += v;
        }
        for s in o.samples {
            if self.samples.len() < 5 {
                self.samples.push(s);
            }
        }
    }
    fn describe(&self) -> String {
        if self.kinds.is_empty() {
            return "0".into();
        }
        let kinds: Vec<String> = self
            .kinds
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect();
        format!("{} ({})", self.total(), kinds.join(", "))
    }
    fn print_samples(&self, what: &str) {
        for s in &self.samples {
            eprintln!("  {what} error sample: {s}");
        }
    }
}

fn error_code(body: &str) -> String {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v["error"]["code"].as_str().map(String::from))
        .unwrap_or_default()
}

fn truncate(s: &str, n: usize) -> String {
    if s.len() <= n {
        s.to_string()
    } else {
        let mut end = n;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &s[..end])
    }
}

fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(4)
        .timeout(Duration::from_secs(30))
        .build()
        .expect("http client")
}

// ---------------------------------------------------------------------------------------
// startup

/// A free loopback port (bound and released; the server binds it right after).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// One `GET /health` on a fresh connection; true on a 200.
fn health_ok(addr: &SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(addr, Duration::from_millis(20)) else {
        return false;
    };
    let _ = s.set_nodelay(true);
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let req = format!("GET /health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut buf = [0u8; 12];
    s.read_exact(&mut buf).is_ok() && buf.starts_with(b"HTTP/1.1 200")
}

struct Started {
    child: Child,
    /// Spawn to the first 200 from /health.
    health: Duration,
    /// Spawn to the "listening" line on stdout.
    listening: Option<Duration>,
}

fn spawn_serve(dir: &Path, env: &[(&str, &str)]) -> Started {
    let port = free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("serve.log"))
        .expect("log file");
    let mut cmd = Command::new(binary());
    cmd.arg("--state-dir")
        .arg(dir)
        .args(["serve", "--addr", &addr.to_string()])
        .env_remove("AIRLOCK_NOW")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let t0 = Instant::now();
    let mut child = cmd.spawn().expect("spawn airlock serve");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut line = String::new();
        let _ = r.read_line(&mut line);
        let _ = tx.send(Instant::now());
        // Keep draining so the server never blocks on a full pipe.
        let _ = std::io::copy(&mut r, &mut std::io::sink());
    });
    loop {
        if health_ok(&addr) {
            break;
        }
        if let Ok(Some(st)) = child.try_wait() {
            panic!(
                "airlock serve exited with {st} before /health answered; see {}",
                dir.join("serve.log").display()
            );
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no /health answer within 30 s"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
    let health = t0.elapsed();
    let listening = rx.recv_timeout(Duration::from_secs(1)).ok().map(|t| t - t0);
    Started {
        child,
        health,
        listening,
    }
}

/// SIGTERM (graceful shutdown, SQLite closes cleanly), SIGKILL after 5 s.
fn stop_gracefully(mut child: Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    eprintln!("  serve did not stop on SIGTERM within 5 s; killing it");
    let _ = child.kill();
    let _ = child.wait();
}

fn bench_startup(o: &Opts) -> Vec<Row> {
    let b = "startup";
    eprintln!("== startup: seeding {} bulk orders", o.orders);
    let dir = temp_state_dir();
    let t = Instant::now();
    cli(&dir, &[], &["seed-orders", &o.orders.to_string()]);
    eprintln!("  seeded in {:.2} s", t.elapsed().as_secs_f64());
    // One start and stop so that keys, migrations and seed are all in place.
    stop_gracefully(spawn_serve(&dir, &[]).child);
    let db_size = std::fs::metadata(dir.join("airlock.db"))
        .map(|m| m.len())
        .unwrap_or(0);

    // The floor: exec and exit of the same binary, no runtime work.
    let mut exec = Lat::default();
    for _ in 0..o.runs {
        let t = Instant::now();
        let st = Command::new(binary())
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .expect("airlock --version");
        assert!(st.success());
        exec.push(t.elapsed());
    }

    let mut health = Lat::default();
    let mut listening = Lat::default();
    for i in 0..o.runs {
        let s = spawn_serve(&dir, &[]);
        health.push(s.health);
        if let Some(l) = s.listening {
            listening.push(l);
        }
        eprintln!(
            "  start {:2}: /health after {:.1} ms (listening line at {})",
            i + 1,
            s.health.as_secs_f64() * 1000.0,
            s.listening
                .map(|l| format!("{:.1} ms", l.as_secs_f64() * 1000.0))
                .unwrap_or_else(|| "?".into())
        );
        stop_gracefully(s.child);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let p50 = health.pct(50.0);
    vec![
        info(
            b,
            "state",
            format!(
                "{} bulk orders + demo data, {:.1} MB airlock.db, {} fresh starts",
                o.orders,
                db_size as f64 / 1e6,
                o.runs
            ),
        ),
        row(
            b,
            "spawn → first 200 from /health: min / p50 / max",
            format!("{:.1} / {:.1} / {:.1} ms", health.min(), p50, health.max()),
            "< 300 ms",
            Some(health.max() < 300.0),
        ),
        info(
            b,
            "spawn → \"listening\" line: min / p50 / max",
            format!(
                "{:.1} / {:.1} / {:.1} ms",
                listening.min(),
                listening.pct(50.0),
                listening.max()
            ),
        ),
        info(
            b,
            "floor: `airlock --version` exec+exit: min / p50 / max",
            format!(
                "{:.1} / {:.1} / {:.1} ms",
                exec.min(),
                exec.pct(50.0),
                exec.max()
            ),
        ),
    ]
}

// ---------------------------------------------------------------------------------------
// reads

const READ_PATHS: [&str; 4] = [
    "/orders?limit=50",
    "/orders?account_id=ACC-1&limit=50",
    "/accounts",
    "/positions",
];

struct ReadResult {
    all: Lat,
    per_path: Vec<Lat>,
    errors: Errors,
    wall: Duration,
    cpu: CpuUse,
}

async fn run_reads(
    s: &Server,
    service: &str,
    operator: &str,
    clients: usize,
    o: &Opts,
    duration: Duration,
) -> ReadResult {
    let base = s.base.clone();
    let paths: Arc<Vec<String>> = Arc::new(o.read_paths.clone());
    let begin = Instant::now() + o.warmup;
    let end = begin + duration;
    let mut tasks = Vec::new();
    let meter = Arc::new(Mutex::new(None::<CpuMeter>));
    let pid = s.pid();
    {
        // Start the CPU meter when the measured window opens.
        let meter = meter.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(begin.into()).await;
            *meter.lock().unwrap() = Some(CpuMeter::start(pid));
        });
    }
    for w in 0..clients {
        let (base, service, operator) = (base.clone(), service.to_string(), operator.to_string());
        let paths = paths.clone();
        tasks.push(tokio::spawn(async move {
            let http = http_client();
            let auth = format!("Bearer {service}");
            let mut per_path = vec![Lat::default(); paths.len()];
            let mut errors = Errors::default();
            let mut last = begin;
            let mut i = w;
            loop {
                let t = Instant::now();
                if t >= end {
                    break;
                }
                let p = i % paths.len();
                i += 1;
                let r = http
                    .get(format!("{base}{}", paths[p]))
                    .header("authorization", &auth)
                    .header("x-operator-token", &operator)
                    .send()
                    .await;
                let (status, body) = match r {
                    Ok(r) => {
                        let st = r.status().as_u16();
                        (st, r.text().await.unwrap_or_default())
                    }
                    Err(e) => (0, e.to_string()),
                };
                let done = Instant::now();
                if t < begin {
                    continue;
                }
                last = last.max(done);
                per_path[p].push(done - t);
                if status != 200 {
                    errors.add(format!("{status} {}", error_code(&body)), || {
                        format!("GET {} -> {status} {}", paths[p], truncate(&body, 300))
                    });
                }
            }
            (per_path, errors, last)
        }));
    }
    let mut per_path = vec![Lat::default(); paths.len()];
    let mut errors = Errors::default();
    let mut last = begin;
    for t in tasks {
        let (pp, e, l) = t.await.expect("reader task");
        for (a, b) in per_path.iter_mut().zip(pp.iter()) {
            a.extend(b);
        }
        errors.merge(e);
        last = last.max(l);
    }
    let cpu = meter
        .lock()
        .unwrap()
        .as_ref()
        .map(CpuMeter::stop)
        .unwrap_or_default();
    let mut all = Lat::default();
    for p in &per_path {
        all.extend(p);
    }
    ReadResult {
        all,
        per_path,
        errors,
        wall: (last - begin).max(Duration::from_millis(1)),
        cpu,
    }
}

async fn bench_reads(o: &Opts) -> Vec<Row> {
    let b = "reads";
    eprintln!("== reads: seeding {} bulk orders", o.orders);
    let dir = temp_state_dir();
    cli(&dir, &[], &["seed-orders", &o.orders.to_string()]);
    let s = Server::start_in(dir, &[("AIRLOCK_WORKERS", o.workers.as_str())]);
    let service = s.service_token();
    let operator = s.operator_token(TRADER, "trader", Some("energy"));
    // Sanity: every path answers 200 before we time anything.
    let http = http_client();
    for p in &o.read_paths {
        let r = http
            .get(format!("{}{p}", s.base))
            .header("authorization", format!("Bearer {service}"))
            .header("x-operator-token", &operator)
            .send()
            .await
            .expect("GET");
        let st = r.status();
        let body = r.text().await.unwrap_or_default();
        assert_eq!(st, 200, "GET {p}: {body}");
        eprintln!("  GET {p}: {} bytes", body.len());
    }

    let mut rows = Vec::new();
    let mut runs = vec![(o.clients, o.duration)];
    if o.baseline {
        runs.push((1, Duration::from_secs(3)));
    }
    for (clients, duration) in runs {
        eprintln!(
            "  {clients} client(s), {:.0} s warm-up + {:.0} s measured",
            o.warmup.as_secs_f64(),
            duration.as_secs_f64()
        );
        let r = run_reads(&s, &service, &operator, clients, o, duration).await;
        r.errors.print_samples("read");
        let n = r.all.0.len();
        let rps = n as f64 / r.wall.as_secs_f64();
        let main = clients == o.clients;
        let tag = format!("{clients} client{}", if clients == 1 { "" } else { "s" });
        rows.push(info(
            b,
            &format!("{tag}: requests/s"),
            format!("{rps:.0} ({n} requests in {:.1} s)", r.wall.as_secs_f64()),
        ));
        if main {
            rows.push(row(
                b,
                &format!("{tag}: p99 latency"),
                format!("{:.2} ms", r.all.pct(99.0)),
                "< 5 ms",
                Some(r.all.pct(99.0) < 5.0),
            ));
            rows.push(row(
                b,
                &format!("{tag}: errors (non-200)"),
                r.errors.describe(),
                "0",
                Some(r.errors.total() == 0),
            ));
        } else {
            rows.push(info(
                b,
                &format!("{tag}: errors (non-200)"),
                r.errors.describe(),
            ));
        }
        rows.push(info(b, &format!("{tag}: latency, all"), r.all.summary()));
        for (p, l) in o.read_paths.iter().zip(&r.per_path) {
            let p = p.strip_prefix(BASE).unwrap_or(p);
            rows.push(info(b, &format!("{tag}: latency, `{p}`"), l.summary()));
        }
        rows.extend(
            cpu_rows(b, r.wall, n, "request", r.cpu)
                .into_iter()
                .map(|mut x| {
                    x.metric = format!("{tag}: {}", x.metric);
                    x
                }),
        );
    }
    rows
}

// ---------------------------------------------------------------------------------------
// pairs

struct PairResult {
    pair: Lat,
    plan: Lat,
    execute: Lat,
    plan_errors: Errors,
    exec_errors: Errors,
    /// Successful pairs: (completion, ms after the window opened; execute latency, µs).
    timeline: Vec<(u64, u64)>,
    wall: Duration,
    cpu: CpuUse,
}

impl PairResult {
    /// Successful pairs per second of the window, and execute p50 (ms) in each second.
    fn per_second(&self) -> Vec<(usize, f64)> {
        let secs = (self.wall.as_secs_f64().round() as usize).max(1);
        let mut b: Vec<Lat> = vec![Lat::default(); secs];
        for &(at, ex) in &self.timeline {
            let i = ((at / 1000) as usize).min(secs - 1);
            b[i].0.push(ex);
        }
        b.iter().map(|l| (l.0.len(), l.pct(50.0))).collect()
    }
}

fn plan_body(operator_sub: &str, side: &str) -> String {
    json!({
        "action_type": "order.submit.cl",
        "payload": { "account_id": "ACC-1", "symbol": "CLF27", "side": side, "quantity": 1, "order_type": "market" },
        "requested_by": operator_sub,
        "chat_context": { "chat_session_id": "bench", "tool_call_id": "bench-call" }
    })
    .to_string()
}

/// `operators[w % len]` is (sub, token) for worker w.
async fn run_pairs(
    s: &Server,
    service: &str,
    operators: &[(String, String)],
    clients: usize,
    o: &Opts,
    duration: Duration,
    run: &str,
) -> PairResult {
    let base = format!("{}{BASE}", s.base);
    let begin = Instant::now() + o.warmup;
    let end = begin + duration;
    let meter = Arc::new(Mutex::new(None::<CpuMeter>));
    let pid = s.pid();
    {
        let meter = meter.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(begin.into()).await;
            *meter.lock().unwrap() = Some(CpuMeter::start(pid));
        });
    }
    let mut tasks = Vec::new();
    for w in 0..clients {
        let (sub, token) = operators[w % operators.len()].clone();
        let (base, service, run) = (base.clone(), service.to_string(), run.to_string());
        tasks.push(tokio::spawn(async move {
            let http = http_client();
            let auth = format!("Bearer {service}");
            // Buys and sells alternate, so the account's position (and any pending
            // exposure) stays far inside the default position limit of 50 contracts.
            let bodies = [plan_body(&sub, "buy"), plan_body(&sub, "sell")];
            let (mut pair, mut plan, mut execute) =
                (Lat::default(), Lat::default(), Lat::default());
            let (mut plan_errors, mut exec_errors) = (Errors::default(), Errors::default());
            let mut last = begin;
            let mut timeline = Vec::new();
            let mut seq = 0u64;
            loop {
                let t0 = Instant::now();
                if t0 >= end {
                    break;
                }
                let measured = t0 >= begin;
                seq += 1;
                let r = http
                    .post(format!("{base}/actions/plan"))
                    .header("authorization", &auth)
                    .header("x-operator-token", &token)
                    .header("content-type", "application/json")
                    .body(bodies[(seq % 2) as usize].clone())
                    .send()
                    .await;
                let (st, text) = match r {
                    Ok(r) => {
                        let st = r.status().as_u16();
                        (st, r.text().await.unwrap_or_default())
                    }
                    Err(e) => (0, e.to_string()),
                };
                let t1 = Instant::now();
                let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                if st != 200 || v["executable"] != json!(true) {
                    if measured {
                        let kind = if st == 200 {
                            "200 not executable".to_string()
                        } else {
                            format!("{st} {}", error_code(&text))
                        };
                        plan_errors.add(kind, || format!("plan -> {st} {}", truncate(&text, 400)));
                    }
                    continue;
                }
                let exec = json!({
                    "plan_id": v["plan_id"],
                    "confirmation_token": v["confirmation_token"],
                    "idempotency_key": format!("bench-{run}-{w}-{seq}"),
                    "requested_by": sub,
                })
                .to_string();
                let t2 = Instant::now();
                let r = http
                    .post(format!("{base}/actions/execute"))
                    .header("authorization", &auth)
                    .header("x-operator-token", &token)
                    .header("content-type", "application/json")
                    .body(exec)
                    .send()
                    .await;
                let (st, text) = match r {
                    Ok(r) => {
                        let st = r.status().as_u16();
                        (st, r.text().await.unwrap_or_default())
                    }
                    Err(e) => (0, e.to_string()),
                };
                let t3 = Instant::now();
                if !measured {
                    continue;
                }
                last = last.max(t3);
                plan.push(t1 - t0);
                execute.push(t3 - t2);
                if st != 202 {
                    exec_errors.add(format!("{st} {}", error_code(&text)), || {
                        format!("execute -> {st} {}", truncate(&text, 400))
                    });
                    continue;
                }
                pair.push(t3 - t0);
                timeline.push((
                    (t3 - begin).as_millis() as u64,
                    (t3 - t2).as_micros() as u64,
                ));
            }
            (
                pair,
                plan,
                execute,
                plan_errors,
                exec_errors,
                last,
                timeline,
            )
        }));
    }
    let mut res = PairResult {
        pair: Lat::default(),
        plan: Lat::default(),
        execute: Lat::default(),
        plan_errors: Errors::default(),
        exec_errors: Errors::default(),
        timeline: Vec::new(),
        wall: Duration::ZERO,
        cpu: CpuUse::default(),
    };
    let mut last = begin;
    for t in tasks {
        let (pair, plan, execute, pe, ee, l, tl) = t.await.expect("pair task");
        res.timeline.extend(tl);
        res.pair.extend(&pair);
        res.plan.extend(&plan);
        res.execute.extend(&execute);
        res.plan_errors.merge(pe);
        res.exec_errors.merge(ee);
        last = last.max(l);
    }
    res.wall = (last - begin).max(if res.pair.0.is_empty() {
        duration
    } else {
        Duration::ZERO
    });
    res.cpu = meter
        .lock()
        .unwrap()
        .as_ref()
        .map(CpuMeter::stop)
        .unwrap_or_default();
    res
}

/// `shared`: every client acts as the demo energy trader (one rate-limit record shared by
/// all 16 clients). Otherwise each client is its own trader on the energy desk.
async fn bench_pairs(o: &Opts, shared: bool) -> Vec<Row> {
    let b = if shared { "pairs-shared" } else { "pairs" };
    eprintln!(
        "== {b}: plan+execute at {} clients, {}",
        o.clients,
        if shared {
            "all as op-energy-trader"
        } else {
            "one trader per client"
        }
    );
    let env = [
        ("AIRLOCK_NOW", MARKET_OPEN),
        ("AIRLOCK_EXECUTE_RATE_PER_MINUTE", MAX_RATE_PER_MINUTE),
        ("AIRLOCK_PLAN_RATE_PER_MINUTE", MAX_RATE_PER_MINUTE),
        ("AIRLOCK_WORKERS", o.workers.as_str()),
        NO_BACKLOG_LIMIT,
    ];
    let s = Server::start(&env);
    no_position_limit(&s);
    let service = s.service_token();
    let operators: Vec<(String, String)> = if shared {
        vec![(
            TRADER.into(),
            s.operator_token(TRADER, "trader", Some("energy")),
        )]
    } else {
        (0..o.clients)
            .map(|i| {
                let sub = format!("op-bench-trader-{i:02}");
                let tok = s.operator_token(&sub, "trader", Some("energy"));
                (sub, tok)
            })
            .collect()
    };
    let mut rows = Vec::new();
    let mut runs = vec![(o.clients, o.duration)];
    if o.baseline && !shared {
        runs.push((1, Duration::from_secs(3)));
    }
    for (k, (clients, duration)) in runs.into_iter().enumerate() {
        eprintln!(
            "  {clients} client(s), {:.0} s warm-up + {:.0} s measured",
            o.warmup.as_secs_f64(),
            duration.as_secs_f64()
        );
        let r = run_pairs(
            &s,
            &service,
            &operators,
            clients,
            o,
            duration,
            &format!("{b}{k}"),
        )
        .await;
        r.plan_errors.print_samples("plan");
        r.exec_errors.print_samples("execute");
        let n = r.pair.0.len();
        let pps = n as f64 / r.wall.as_secs_f64();
        let main = clients == o.clients;
        let tag = format!("{clients} client{}", if clients == 1 { "" } else { "s" });
        if main {
            rows.push(row(
                b,
                &format!("{tag}: successful pairs/s"),
                format!("{pps:.0} ({n} pairs in {:.1} s)", r.wall.as_secs_f64()),
                "≥ 1,000",
                Some(pps >= 1000.0),
            ));
            rows.push(row(
                b,
                &format!("{tag}: pair p99"),
                format!("{:.2} ms", r.pair.pct(99.0)),
                "< 25 ms",
                Some(r.pair.pct(99.0) < 25.0),
            ));
            let errs = r.plan_errors.total() + r.exec_errors.total();
            rows.push(row(
                b,
                &format!("{tag}: errors"),
                format!(
                    "plan {}; execute {}",
                    r.plan_errors.describe(),
                    r.exec_errors.describe()
                ),
                "0",
                Some(errs == 0),
            ));
        } else {
            rows.push(info(
                b,
                &format!("{tag}: successful pairs/s"),
                format!("{pps:.0} ({n} pairs in {:.1} s)", r.wall.as_secs_f64()),
            ));
            rows.push(info(
                b,
                &format!("{tag}: errors"),
                format!(
                    "plan {}; execute {}",
                    r.plan_errors.describe(),
                    r.exec_errors.describe()
                ),
            ));
        }
        rows.push(info(b, &format!("{tag}: pair latency"), r.pair.summary()));
        rows.push(info(b, &format!("{tag}: plan latency"), r.plan.summary()));
        rows.push(info(
            b,
            &format!("{tag}: execute latency"),
            r.execute.summary(),
        ));
        let ps = r.per_second();
        rows.push(info(
            b,
            &format!("{tag}: pairs in each second of the run"),
            ps.iter()
                .map(|(n, _)| n.to_string())
                .collect::<Vec<_>>()
                .join(", "),
        ));
        rows.push(info(
            b,
            &format!("{tag}: execute p50 in each second, ms"),
            ps.iter()
                .map(|(_, p)| format!("{p:.1}"))
                .collect::<Vec<_>>()
                .join(", "),
        ));
        rows.extend(
            cpu_rows(b, r.wall, n, "pair", r.cpu)
                .into_iter()
                .map(|mut x| {
                    x.metric = format!("{tag}: {}", x.metric);
                    x
                }),
        );
    }
    rows.push(info(
        b,
        "server log ERROR lines",
        server_errors(&s.state_dir),
    ));
    // Where the rows went: the database after the run.
    let db = s.db();
    let count = |t: &str| -> i64 {
        db.query_row(&format!("SELECT COUNT(*) FROM {t}"), [], |r| r.get(0))
            .unwrap_or(-1)
    };
    let rate_bytes: i64 = db
        .query_row(
            "SELECT COALESCE(MAX(LENGTH(body)), 0) FROM rate_limits",
            [],
            |r| r.get(0),
        )
        .unwrap_or(-1);
    let body_mb = |t: &str| -> f64 {
        db.query_row(
            &format!("SELECT COALESCE(SUM(LENGTH(body)), 0) FROM {t}"),
            [],
            |r| r.get::<_, i64>(0),
        )
        .map(|n| n as f64 / 1e6)
        .unwrap_or(-1.0)
    };
    let pragma = |p: &str| -> i64 {
        db.query_row(&format!("PRAGMA {p}"), [], |r| r.get(0))
            .unwrap_or(-1)
    };
    let size = |f: &str| {
        std::fs::metadata(s.state_dir.join(f))
            .map(|m| m.len() as f64 / 1e6)
            .unwrap_or(0.0)
    };
    rows.push(info(
        b,
        "database after the run",
        format!(
            "{} plans, {} actions, {} queue messages, {} audit records; largest rate_limits body {} bytes; airlock.db {:.1} MB + WAL {:.1} MB",
            count("plans"),
            count("actions"),
            count("queue"),
            count("audit"),
            rate_bytes,
            size("airlock.db"),
            size("airlock.db-wal")
        ),
    ));
    rows.push(info(
        b,
        "stored bodies (packed)",
        format!(
            "plans {:.1} MB, check_sets {:.1} MB, actions {:.1} MB, audit {:.1} MB, queue {:.1} MB, idempotency_keys {:.1} MB; {} of {} pages free",
            body_mb("plans"),
            body_mb("check_sets"),
            body_mb("actions"),
            body_mb("audit"),
            body_mb("queue"),
            body_mb("idempotency_keys"),
            pragma("freelist_count"),
            pragma("page_count"),
        ),
    ));
    let plans = count("plans").max(1) as f64;
    // The WAL is reused from its start once checkpointed, so it does not grow with the
    // pairs: its size is a bound (about 35 MB, the writer's backstop), not a cost per pair.
    rows.push(info(
        b,
        "database per pair",
        format!(
            "{:.1} KB (airlock.db over {plans} plans); with the WAL ({:.1} MB, reused) {:.1} KB",
            size("airlock.db") * 1e3 / plans,
            size("airlock.db-wal"),
            (size("airlock.db") + size("airlock.db-wal")) * 1e3 / plans,
        ),
    ));
    rows
}

/// `mcp`: the latency of MCP tool calls next to the REST calls they wrap, one client in a
/// closed loop for `--duration` (after the warm-up): each round is `tools/list`, then
/// `plan_cl_order` and `execute_plan` over MCP (2026-07-28 wire form), then the same plan
/// and execute over REST. One client, so the figures are latencies, not throughput.
async fn bench_mcp(o: &Opts) -> Vec<Row> {
    eprintln!(
        "== mcp: tool-call latency vs REST, 1 client, {:.0} s",
        o.duration.as_secs_f64()
    );
    let env = [
        ("AIRLOCK_NOW", MARKET_OPEN),
        ("AIRLOCK_EXECUTE_RATE_PER_MINUTE", MAX_RATE_PER_MINUTE),
        ("AIRLOCK_PLAN_RATE_PER_MINUTE", MAX_RATE_PER_MINUTE),
        ("AIRLOCK_WORKERS", o.workers.as_str()),
        NO_BACKLOG_LIMIT,
    ];
    let s = Server::start(&env);
    no_position_limit(&s);
    let service = s.service_token();
    let operator = s.operator_token(TRADER, "trader", Some("energy"));
    let http = http_client();
    let base = format!("{}{BASE}", s.base);
    let auth = format!("Bearer {service}");
    let order = json!({ "account_id": "ACC-1", "symbol": "CLF27", "side": "buy", "quantity": 1, "order_type": "market" });
    let meta = json!({ "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {} });
    let mut id = 0u64;
    let mut mcp = |method: &str, name: Option<&str>, params: Value| {
        id += 1;
        let mut params = params;
        params["_meta"] = meta.clone();
        let mut rq = http
            .post(format!("{base}/mcp"))
            .header("authorization", &auth)
            .header("x-operator-token", &operator)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", method.to_string())
            .body(
                json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })
                    .to_string(),
            );
        if let Some(n) = name {
            rq = rq.header("mcp-name", n.to_string());
        }
        rq
    };
    let rest = |path: &str, body: Value| {
        http.post(format!("{base}{path}"))
            .header("authorization", &auth)
            .header("x-operator-token", &operator)
            .header("content-type", "application/json")
            .body(body.to_string())
    };
    async fn timed(rq: reqwest::RequestBuilder) -> (Duration, Value) {
        let t = Instant::now();
        let body = match rq.send().await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(e) => e.to_string(),
        };
        (
            t.elapsed(),
            serde_json::from_str(&body).unwrap_or(Value::Null),
        )
    }
    let names = [
        "MCP tools/list",
        "MCP plan_cl_order",
        "MCP execute_plan",
        "REST plan",
        "REST execute",
    ];
    let mut lat = vec![Lat::default(); names.len()];
    let mut errors = 0u64;
    let begin = Instant::now() + o.warmup;
    let end = begin + o.duration;
    let mut round = 0u64;
    while Instant::now() < end {
        round += 1;
        let measured = Instant::now() >= begin;
        let side = if round.is_multiple_of(2) {
            "buy"
        } else {
            "sell"
        };
        let mut args = order.clone();
        args["side"] = json!(side);
        let (d0, r0) = timed(mcp("tools/list", None, json!({}))).await;
        let (d1, r1) = timed(mcp(
            "tools/call",
            Some("plan_cl_order"),
            json!({ "name": "plan_cl_order", "arguments": args }),
        ))
        .await;
        let p = &r1["result"]["structuredContent"];
        let exec =
            json!({ "plan_id": p["plan_id"], "confirmation_token": p["confirmation_token"] });
        let (d2, r2) = timed(mcp(
            "tools/call",
            Some("execute_plan"),
            json!({ "name": "execute_plan", "arguments": exec }),
        ))
        .await;
        let (d3, r3) = timed(rest(
            "/actions/plan",
            json!({ "action_type": "order.submit.cl", "payload": args, "requested_by": TRADER }),
        ))
        .await;
        let key = format!("bench-mcp-rest-{round}");
        let (d4, r4) = timed(rest("/actions/execute", json!({ "plan_id": r3["plan_id"], "confirmation_token": r3["confirmation_token"], "idempotency_key": key, "requested_by": TRADER }))).await;
        let ok = r0["result"]["tools"].is_array()
            && r2["result"]["structuredContent"]["status"] == "queued"
            && r4["status"] == "queued";
        if !ok {
            errors += 1;
            if errors <= 3 {
                eprintln!("  round {round} failed: {r2} / {r4}");
            }
        }
        if measured {
            for (l, d) in lat.iter_mut().zip([d0, d1, d2, d3, d4]) {
                l.push(d);
            }
        }
    }
    let mut rows = Vec::new();
    for (n, l) in names.iter().zip(&lat) {
        rows.push(info(
            "mcp",
            &format!("{n}: p50 / p95 / p99"),
            format!(
                "{:.2} / {:.2} / {:.2} ms ({} calls)",
                l.pct(50.0),
                l.pct(95.0),
                l.pct(99.0),
                l.0.len()
            ),
        ));
    }
    rows.push(row(
        "mcp",
        "rounds with an error",
        errors.to_string(),
        "0",
        Some(errors == 0),
    ));
    rows
}

/// The bench's orders stay open while the workers are off, and position limits count open
/// orders: a policy without a practical position limit (nor message throttle) keeps every
/// pair executable, so the figures measure the protocol, not the limits.
fn no_position_limit(s: &Server) {
    let file = s.state_dir.join("bench-policy.json");
    std::fs::write(&file, r#"{"version": "bench", "max_position": 4000000000, "max_messages_per_window": 4000000000, "confirmation": {"order.submit.cl": "token"}}"#)
        .expect("write the bench policy");
    s.cli(&["policy", "set", file.to_str().expect("utf-8 path")]);
}

/// ERROR lines of the server log, grouped by their `cause` field.
fn server_errors(state_dir: &Path) -> String {
    server_lines(state_dir, "ERROR")
}

/// Lines of the server log at `level`, grouped by their `cause` field.
fn server_lines(state_dir: &Path, level: &str) -> String {
    let log = std::fs::read_to_string(state_dir.join("serve.log")).unwrap_or_default();
    let mut causes: BTreeMap<String, u64> = BTreeMap::new();
    for line in log.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if v["level"] != level {
            continue;
        }
        let f = &v["fields"];
        let what = f["cause"]
            .as_str()
            .or(f["error"].as_str())
            .or(f["message"].as_str())
            .unwrap_or("?");
        *causes.entry(truncate(what, 120)).or_default() += 1;
    }
    if causes.is_empty() {
        return "none".into();
    }
    causes
        .iter()
        .map(|(c, n)| format!("{n} × {c}"))
        .collect::<Vec<_>>()
        .join("; ")
}

// ---------------------------------------------------------------------------------------
// workers

fn order_body(sub: &str, account: &str, symbol: &str, side: &str) -> String {
    json!({
        "action_type": "order.submit.cl",
        "payload": { "account_id": account, "symbol": symbol, "side": side, "quantity": 1, "order_type": "market" },
        "requested_by": sub,
        "chat_context": { "chat_session_id": "bench", "tool_call_id": "bench-call" }
    })
    .to_string()
}

/// A client acting as one operator.
#[derive(Clone)]
struct Client {
    http: reqwest::Client,
    base: String,
    auth: String,
    token: String,
    sub: String,
    /// Executes refused with 503 `orders_backlogged` (each retried after its 1 s).
    backlogged: Arc<std::sync::atomic::AtomicU64>,
}

impl Client {
    fn new(s: &Server, service: &str, sub: &str, token: &str) -> Client {
        Client {
            http: http_client(),
            base: format!("{}{BASE}", s.base),
            auth: format!("Bearer {service}"),
            token: token.into(),
            sub: sub.into(),
            backlogged: Arc::default(),
        }
    }

    async fn send(&self, rb: reqwest::RequestBuilder) -> (u16, String) {
        let r = rb
            .header("authorization", &self.auth)
            .header("x-operator-token", &self.token)
            .send()
            .await;
        match r {
            Ok(r) => {
                let st = r.status().as_u16();
                (st, r.text().await.unwrap_or_default())
            }
            Err(e) => (0, e.to_string()),
        }
    }

    async fn post(&self, path: &str, body: String) -> (u16, String) {
        self.send(
            self.http
                .post(format!("{}{path}", self.base))
                .header("content-type", "application/json")
                .body(body),
        )
        .await
    }

    async fn get(&self, path: &str) -> (u16, String) {
        self.send(self.http.get(format!("{}{path}", self.base)))
            .await
    }

    /// Plan and execute one market order; the action id, and the instant the execute
    /// response was read in full.
    async fn plan_execute(
        &self,
        account: &str,
        symbol: &str,
        side: &str,
        key: &str,
    ) -> Result<(String, Instant), String> {
        let (st, text) = self
            .post(
                "/actions/plan",
                order_body(&self.sub, account, symbol, side),
            )
            .await;
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if st != 200 || v["executable"] != json!(true) {
            return Err(format!("plan -> {st} {}", truncate(&text, 300)));
        }
        let exec = json!({
            "plan_id": v["plan_id"],
            "confirmation_token": v["confirmation_token"],
            "idempotency_key": key,
            "requested_by": self.sub,
        })
        .to_string();
        loop {
            let (st, text) = self.post("/actions/execute", exec.clone()).await;
            let done = Instant::now();
            let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            match (st, v["action_id"].as_str()) {
                (202, Some(id)) => return Ok((id.to_string(), done)),
                // Admission control: the same key again after `Retry-After` (1 s).
                (503, _) if v["error"]["code"] == "orders_backlogged" => {
                    self.backlogged
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                _ => return Err(format!("execute -> {st} {}", truncate(&text, 300))),
            }
        }
    }
}

/// One trader per client (`op-bench-trader-NN`), tokens minted by the CLI.
fn bench_traders(s: &Server, n: usize) -> Vec<(String, String)> {
    (0..n)
        .map(|i| {
            let sub = format!("op-bench-trader-{i:02}");
            let tok = s.operator_token(&sub, "trader", Some("energy"));
            (sub, tok)
        })
        .collect()
}

/// A read-only connection to an embedded server's database (WAL: it never blocks the
/// server's writer).
fn db_read_only(state_dir: &Path) -> rusqlite::Connection {
    let c = rusqlite::Connection::open_with_flags(
        state_dir.join("airlock.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .expect("open db read-only");
    c.busy_timeout(Duration::from_secs(5))
        .expect("busy timeout");
    c
}

fn count(db: &rusqlite::Connection, sql: &str) -> i64 {
    db.query_row(sql, [], |r| r.get(0)).unwrap_or(-1)
}

/// Action records by id: (status, created_at ms, updated_at ms), server clock.
fn action_times(
    db: &rusqlite::Connection,
) -> std::collections::HashMap<String, (String, i64, i64)> {
    let mut st = db
        .prepare("SELECT action_id, created_at, body FROM actions")
        .expect("prepare");
    st.query_map([], |r| {
        let body: Value =
            serde_json::from_str(&airlock_tests::stored_body(r, 2)?).unwrap_or(Value::Null);
        Ok((
            r.get::<_, String>(0)?,
            (
                body["status"].as_str().unwrap_or_default().to_string(),
                r.get::<_, i64>(1)?,
                body["updated_at"].as_i64().unwrap_or_default(),
            ),
        ))
    })
    .expect("query")
    .filter_map(Result::ok)
    .collect()
}

fn ms_of(rfc3339: &str) -> i64 {
    // AIRLOCK_NOW is a fixed `YYYY-MM-DDTHH:MM:SSZ`; its epoch ms via SQLite would need a
    // connection, so compute it here for the one value used.
    let c = rusqlite::Connection::open_in_memory().expect("sqlite");
    c.query_row(
        "SELECT CAST((julianday(?1) - 2440587.5) * 86400000 AS INTEGER)",
        [rfc3339],
        |r| r.get(0),
    )
    .expect("epoch ms")
}

/// Plans and executes `n` market orders with `clients` concurrent clients (one trader
/// each), rotating through [`COMBOS`] with sides alternating per pair. Returns the action ids
/// with their execute completion instants, and the errors.
async fn queue_orders(
    s: &Server,
    service: &str,
    traders: &[(String, String)],
    n: usize,
    tag: &str,
    groups: usize,
) -> (Vec<(String, Instant)>, Errors) {
    let combos = combos(groups);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for (sub, tok) in traders {
        let c = Client::new(s, service, sub, tok);
        let (next, tag, combos) = (next.clone(), tag.to_string(), combos.clone());
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            let mut errors = Errors::default();
            loop {
                let k = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if k >= n {
                    break;
                }
                let (account, symbol) = combos[k % combos.len()];
                let side = if (k / combos.len()).is_multiple_of(2) {
                    "buy"
                } else {
                    "sell"
                };
                match c
                    .plan_execute(account, symbol, side, &format!("{tag}-{k}"))
                    .await
                {
                    Ok(x) => out.push(x),
                    Err(e) => {
                        let kind = e.split(' ').take(3).collect::<Vec<_>>().join(" ");
                        errors.add(kind, || e.clone())
                    }
                }
            }
            (out, errors)
        }));
    }
    let mut all = Vec::new();
    let mut errors = Errors::default();
    for t in tasks {
        let (o, e) = t.await.expect("queue task");
        all.extend(o);
        errors.merge(e);
    }
    (all, errors)
}

/// Durations (ms) of consecutive `chunk`-sized groups of sorted instants (ms).
fn chunk_rates(sorted_ms: &[i64], chunk: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i + chunk <= sorted_ms.len() && chunk > 1 {
        let (a, b) = (sorted_ms[i], sorted_ms[i + chunk - 1]);
        let secs = ((b - a).max(1)) as f64 / 1000.0;
        out.push(format!("{:.0}", (chunk - 1) as f64 / secs));
        i += chunk;
    }
    out
}

async fn bench_workers(o: &Opts) -> Vec<Row> {
    let b = "workers";
    let mut rows = Vec::new();
    let n = o.queued;
    let market_open_ms = ms_of(MARKET_OPEN);

    // 1. Queue n orders with the workers off.
    eprintln!("== workers: queue {n} market orders with the workers off");
    let env_off = [
        ("AIRLOCK_NOW", MARKET_OPEN),
        ("AIRLOCK_EXECUTE_RATE_PER_MINUTE", MAX_RATE_PER_MINUTE),
        ("AIRLOCK_PLAN_RATE_PER_MINUTE", MAX_RATE_PER_MINUTE),
        ("AIRLOCK_WORKERS", "off"),
        NO_BACKLOG_LIMIT,
    ];
    let s = Server::start(&env_off);
    no_position_limit(&s);
    let service = s.service_token();
    let traders = bench_traders(&s, o.stream_clients);
    let t = Instant::now();
    let (executed, errors) = queue_orders(&s, &service, &traders, n, "queued", o.groups).await;
    let queued_in = t.elapsed();
    errors.print_samples("queue");
    let ours: std::collections::HashSet<String> =
        executed.iter().map(|(id, _)| id.clone()).collect();
    let db = db_read_only(&s.state_dir);
    let ready = count(
        &db,
        "SELECT COUNT(*) FROM queue WHERE queue = 'worker:orders' AND status = 'ready'",
    );
    let filled_sql = "SELECT COUNT(*) FROM orders WHERE status = 'filled'";
    let filled_before = count(&db, filled_sql);
    drop(db);
    rows.push(info(
        b,
        &format!(
            "queue: {n} plan+execute with workers off, {} clients",
            traders.len()
        ),
        format!(
            "{} executes → 202 in {:.2} s; errors {}; {ready} messages ready on worker:orders",
            executed.len(),
            queued_in.as_secs_f64(),
            errors.describe()
        ),
    ));

    // 2. Restart the same state with the workers on; time until all n are filled.
    eprintln!(
        "  restart on the same state dir with AIRLOCK_WORKERS=on; waiting for {} fills",
        executed.len()
    );
    wait_quiet(o.wait_idle);
    let stack = s.crash();
    let env_on = [
        ("AIRLOCK_NOW", MARKET_OPEN),
        ("AIRLOCK_EXECUTE_RATE_PER_MINUTE", MAX_RATE_PER_MINUTE),
        ("AIRLOCK_PLAN_RATE_PER_MINUTE", MAX_RATE_PER_MINUTE),
        ("AIRLOCK_WORKERS", "on"),
    ];
    let t_spawn = Instant::now();
    let s = stack.start(&env_on);
    let t_listen = Instant::now();
    let meter = CpuMeter::start(s.pid());
    let db = db_read_only(&s.state_dir);
    let target = executed.len() as i64;
    let mut first_fill = None;
    let mut polls = 0u64;
    let all_filled = loop {
        let done = count(&db, filled_sql) - filled_before;
        if done > 0 && first_fill.is_none() {
            first_fill = Some(Instant::now());
        }
        if done >= target {
            break Some(Instant::now());
        }
        polls += 1;
        if polls.is_multiple_of(100) {
            let failed = action_times(&db)
                .values()
                .filter(|(status, ..)| status == "failed")
                .count();
            if failed > 0 {
                eprintln!("  {failed} actions failed");
            }
        }
        if t_spawn.elapsed() > Duration::from_secs(600) {
            eprintln!("  gave up after 600 s with {done} of {target} filled");
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let cpu = meter.stop();
    let wall = all_filled.map(|t| t - t_spawn);
    // Server-side timeline: each order's fill time (`updated_at`) on the server clock, which
    // started at AIRLOCK_NOW when the restarted process built its state.
    let mut fills: Vec<i64> = {
        let mut st = db
            .prepare("SELECT action_id, updated_at FROM orders WHERE status = 'filled' AND action_id IS NOT NULL")
            .expect("prepare");
        st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
            .expect("query")
            .filter_map(Result::ok)
            .filter(|(a, _)| ours.contains(a))
            .map(|(_, t)| t - market_open_ms)
            .collect()
    };
    fills.sort_unstable();
    let statuses: BTreeMap<String, usize> = action_times(&db)
        .into_iter()
        .filter(|(a, _)| ours.contains(a))
        .fold(BTreeMap::new(), |mut m, (_, (st, _, _))| {
            *m.entry(st).or_default() += 1;
            m
        });
    let book: Vec<String> = {
        // The books and the price table by name; the order documents (one per broker
        // order) summed up.
        let mut st = db
            .prepare(
                "SELECT key, LENGTH(doc) FROM paper_book WHERE key NOT LIKE 'order:%' ORDER BY key",
            )
            .expect("prepare");
        let mut v: Vec<String> = st
            .query_map([], |r| {
                Ok(format!(
                    "{} {} bytes",
                    r.get::<_, String>(0)?,
                    r.get::<_, i64>(1)?
                ))
            })
            .expect("query")
            .filter_map(Result::ok)
            .collect();
        let (n, largest, total): (i64, Option<i64>, Option<i64>) = db
            .query_row(
                "SELECT COUNT(*), MAX(LENGTH(doc)), SUM(LENGTH(doc)) FROM paper_book WHERE key LIKE 'order:%'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .expect("query");
        if n > 0 {
            v.push(format!(
                "{n} order documents, largest {} bytes, {} bytes in all",
                largest.unwrap_or(0),
                total.unwrap_or(0)
            ));
        }
        v
    };
    drop(db);
    match wall {
        Some(w) => {
            let rate = target as f64 / w.as_secs_f64();
            rows.push(row(
                b,
                &format!("drain: {target} queued orders → filled, restart to last fill"),
                format!(
                    "**{:.2} s → {rate:.0} orders/s** (spawn → listening {:.0} ms, → first fill {:.0} ms; observed by polling the database every 10 ms)",
                    w.as_secs_f64(),
                    (t_listen - t_spawn).as_secs_f64() * 1000.0,
                    first_fill.map(|f| (f - t_spawn).as_secs_f64() * 1000.0).unwrap_or(f64::NAN),
                ),
                "",
                None,
            ));
        }
        None => rows.push(row(
            b,
            "drain: queued orders → filled",
            format!("not finished within 600 s ({} filled)", fills.len()),
            "all filled",
            Some(false),
        )),
    }
    if fills.len() > 1 {
        let span = (fills[fills.len() - 1] - fills[0]) as f64 / 1000.0;
        rows.push(info(
            b,
            "drain: server-side, first fill → last fill",
            format!(
                "{span:.2} s for {} fills → {:.0} orders/s (fill times from `orders.updated_at`)",
                fills.len(),
                (fills.len() - 1) as f64 / span.max(0.001)
            ),
        ));
        rows.push(info(
            b,
            "drain: orders/s in each tenth of the drain",
            chunk_rates(&fills, fills.len() / 10).join(", "),
        ));
    }
    rows.push(info(
        b,
        "drain: action statuses after",
        format!("{statuses:?}"),
    ));
    rows.extend(cpu_rows(
        b,
        wall.unwrap_or(t_spawn.elapsed()),
        fills.len(),
        "order (drain)",
        cpu,
    ));
    rows.push(info(b, "drain: paper broker book after", book.join(", ")));
    rows.push(info(
        b,
        "drain: server log ERROR lines",
        server_errors(&s.state_dir),
    ));
    rows.push(info(
        b,
        "drain: server log WARN lines",
        server_lines(&s.state_dir, "WARN"),
    ));
    drop(s);

    // 3. End to end under a steady stream, workers on.
    for &rate in &o.stream_rates {
        rows.extend(stream_e2e(o, rate).await);
    }
    rows
}

/// `clients` clients plan+execute for `stream_secs` with workers on, at `rate` pairs/s in
/// total (0: as fast as they can). Every 10th execute of a client is sampled, if that
/// client's previous sample has settled: GET /actions/{id} right after the execute and then
/// every 10 ms until it reports `succeeded`. Every action's server-side time from accept to
/// succeeded is read from the database afterwards.
async fn stream_e2e(o: &Opts, rate: u64) -> Vec<Row> {
    let b = "workers";
    let clients = o.stream_clients;
    let duration = o.stream_secs;
    let pace = if rate == 0 {
        "closed loop".to_string()
    } else {
        format!("{rate} pairs/s")
    };
    eprintln!(
        "== workers: steady stream, {clients} clients, {pace}, {:.0} s warm-up + {:.0} s, workers on",
        o.warmup.as_secs_f64(),
        duration.as_secs_f64()
    );
    wait_quiet(o.wait_idle);
    let env_on = [
        ("AIRLOCK_NOW", MARKET_OPEN),
        ("AIRLOCK_EXECUTE_RATE_PER_MINUTE", MAX_RATE_PER_MINUTE),
        ("AIRLOCK_PLAN_RATE_PER_MINUTE", MAX_RATE_PER_MINUTE),
        ("AIRLOCK_WORKERS", "on"),
    ];
    let s = Server::start(&env_on);
    no_position_limit(&s);
    let service = s.service_token();
    let traders = bench_traders(&s, clients);
    let begin = Instant::now() + o.warmup;
    let end = begin + duration;
    let meter = Arc::new(Mutex::new(None::<CpuMeter>));
    {
        let (meter, pid) = (meter.clone(), s.pid());
        tokio::spawn(async move {
            tokio::time::sleep_until(begin.into()).await;
            *meter.lock().unwrap() = Some(CpuMeter::start(pid));
        });
    }
    let mut tasks = Vec::new();
    for (w, (sub, tok)) in traders.iter().enumerate() {
        let c = Client::new(&s, &service, sub, tok);
        // Paced: client w starts its pairs at w/rate, (w + clients)/rate, ... seconds.
        let interval = (rate > 0).then(|| Duration::from_secs_f64(clients as f64 / rate as f64));
        let start = Instant::now()
            + interval
                .map(|i| i.mul_f64(w as f64 / clients as f64))
                .unwrap_or_default();
        tasks.push(tokio::spawn(async move {
            let (account, symbol) = COMBOS[w % COMBOS.len()];
            let mut measured: Vec<(String, Instant)> = Vec::new();
            let mut errors = Errors::default();
            let mut poller: Option<tokio::task::JoinHandle<Result<Duration, String>>> = None;
            let mut sampled: Vec<Duration> = Vec::new();
            let mut poll_errors = Errors::default();
            let mut seq = 0u64;
            let mut last = begin;
            let mut due = start;
            while Instant::now() < end {
                if let Some(i) = interval {
                    tokio::time::sleep_until(due.into()).await;
                    due += i;
                }
                let t0 = Instant::now();
                if t0 >= end {
                    break;
                }
                seq += 1;
                let side = if seq.is_multiple_of(2) { "buy" } else { "sell" };
                let r = c
                    .plan_execute(account, symbol, side, &format!("stream-{w}-{seq}"))
                    .await;
                if t0 < begin {
                    continue;
                }
                let (id, done) = match r {
                    Ok(x) => x,
                    Err(e) => {
                        let kind = e.split(' ').take(3).collect::<Vec<_>>().join(" ");
                        errors.add(kind, || e.clone());
                        continue;
                    }
                };
                last = last.max(done);
                measured.push((id.clone(), done));
                // Every 10th, if the client's previous sample has settled: poll every 10 ms.
                let idle = poller.as_ref().is_none_or(|p| p.is_finished());
                if idle && seq.is_multiple_of(10) {
                    if let Some(p) = poller.take() {
                        match p.await.expect("poller") {
                            Ok(d) => sampled.push(d),
                            Err(e) => poll_errors.add(truncate(&e, 60), || e.clone()),
                        }
                    }
                    let c = c.clone();
                    poller = Some(tokio::spawn(async move {
                        loop {
                            let (st, text) = c.get(&format!("/actions/{id}")).await;
                            let now = Instant::now();
                            let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                            match (st, v["status"].as_str()) {
                                (200, Some("succeeded")) => return Ok(now - done),
                                (200, Some("failed")) => {
                                    return Err(format!("action failed: {}", v["error"]))
                                }
                                (200, _) => {}
                                _ => {
                                    return Err(format!(
                                        "GET /actions -> {st} {}",
                                        truncate(&text, 200)
                                    ))
                                }
                            }
                            if now - done > Duration::from_secs(120) {
                                return Err("not succeeded within 120 s".into());
                            }
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }));
                }
            }
            if let Some(p) = poller.take() {
                match p.await.expect("poller") {
                    Ok(d) => sampled.push(d),
                    Err(e) => poll_errors.add(truncate(&e, 60), || e.clone()),
                }
            }
            let refused = c.backlogged.load(std::sync::atomic::Ordering::Relaxed);
            (measured, errors, sampled, poll_errors, last, refused)
        }));
    }
    let mut measured = Vec::new();
    let mut errors = Errors::default();
    let mut sampled = Lat::default();
    let mut poll_errors = Errors::default();
    let mut last = begin;
    let mut backlogged = 0;
    for t in tasks {
        let (m, e, smp, pe, l, refused) = t.await.expect("stream task");
        backlogged += refused;
        measured.extend(m);
        errors.merge(e);
        for d in smp {
            sampled.push(d);
        }
        poll_errors.merge(pe);
        last = last.max(l);
    }
    let wall = (last - begin).max(Duration::from_millis(1));
    let cpu = meter
        .lock()
        .unwrap()
        .as_ref()
        .map(CpuMeter::stop)
        .unwrap_or_default();
    errors.print_samples("stream");
    poll_errors.print_samples("poll");
    // Let the workers finish the backlog, then read every action's times.
    let db = db_read_only(&s.state_dir);
    let ids: std::collections::HashSet<&str> = measured.iter().map(|(a, _)| a.as_str()).collect();
    let t_drain = Instant::now();
    let mut open_after;
    let times = loop {
        let times = action_times(&db);
        let open = ids
            .iter()
            .filter(|a| {
                times
                    .get(**a)
                    .is_none_or(|(st, _, _)| st != "succeeded" && st != "failed")
            })
            .count();
        open_after = open;
        if open == 0 || t_drain.elapsed() > Duration::from_secs(120) {
            break times;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // From the stream's last execute (the sampled polls above may end much later).
    let drained_after = last.elapsed();
    let mut server = Lat::default();
    let mut by_second: Vec<Lat> = vec![Lat::default(); (wall.as_secs_f64().ceil() as usize).max(1)];
    let mut not_succeeded = 0;
    for (id, done) in &measured {
        match times.get(id.as_str()) {
            Some((st, created, updated)) if st == "succeeded" => {
                let d = Duration::from_millis((updated - created).max(0) as u64);
                server.push(d);
                let i = ((*done - begin).as_secs() as usize).min(by_second.len() - 1);
                by_second[i].push(d);
            }
            _ => not_succeeded += 1,
        }
    }
    let n = measured.len();
    let mut rows = vec![
        info(
            b,
            &format!("stream ({pace}), {clients} clients, workers on: pairs/s"),
            format!(
                "{:.0} ({n} pairs in {:.1} s); errors {}; executes refused as backlogged (retried after 1 s) {backlogged}",
                n as f64 / wall.as_secs_f64(),
                wall.as_secs_f64(),
                errors.describe()
            ),
        ),
        row(
            b,
            &format!("stream ({pace}): execute response → `succeeded` seen by polling GET /actions/{{id}} (10 ms interval)"),
            format!(
                "p50 {:.1} / p90 {:.1} / p99 {:.1} / max {:.1} ms (n={} sampled: every 10th execute, at most one in flight per client; poll errors {})",
                sampled.pct(50.0),
                sampled.pct(90.0),
                sampled.pct(99.0),
                sampled.max(),
                sampled.0.len(),
                poll_errors.describe()
            ),
            "",
            None,
        ),
        info(
            b,
            &format!("stream ({pace}): server-side accept → succeeded (`created_at` → `updated_at`, ms clock), every action"),
            format!(
                "{}; not succeeded: {not_succeeded}",
                server.summary()
            ),
        ),
        info(
            b,
            &format!("stream ({pace}): server-side p50 by execute second, ms"),
            by_second
                .iter()
                .map(|l| {
                    if l.0.is_empty() {
                        "-".to_string()
                    } else {
                        format!("{:.0}", l.pct(50.0))
                    }
                })
                .collect::<Vec<_>>()
                .join(", "),
        ),
        info(
            b,
            &format!("stream ({pace}): backlog after the stream"),
            if open_after == 0 {
                format!("all settled {:.2} s after the last execute", drained_after.as_secs_f64())
            } else {
                format!("{open_after} of {n} still queued or processing {:.0} s after the last execute (gave up waiting)", drained_after.as_secs_f64())
            },
        ),
    ];
    rows.extend(cpu_rows(b, wall, n, &format!("pair (stream, {pace})"), cpu));
    rows.push(info(
        b,
        &format!("stream ({pace}): server log ERROR lines"),
        server_errors(&s.state_dir),
    ));
    rows
}

// ---------------------------------------------------------------------------------------
// aws-calls

/// moto's server answering one request at a time, as `scripts/moto_serial.py` runs it, plus
/// one line per request in `calls.log` next to this script: the arrival time and the
/// `X-Amz-Target` (`DynamoDB_20120810.GetItem`, `AmazonSQS.SendMessage`, `TrentService.Sign`;
/// every SDK client here speaks a JSON protocol), else the method and path.
const MOTO_LOGGED: &str = r#"
import os, signal, sys, time
from werkzeug.serving import run_simple
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication, MotoRequestHandler, create_backend_app,
)

def main():
    host, port = "127.0.0.1", None
    args = sys.argv[1:]
    for i, a in enumerate(args):
        if a in ("-H", "--host"):
            host = args[i + 1]
        if a in ("-p", "--port"):
            port = int(args[i + 1])
    os.environ.setdefault("MOTO_PORT", str(port))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    log = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "calls.log"), "a", buffering=1)
    inner = DomainDispatcherApplication(create_backend_app)
    def app(environ, start_response):
        target = environ.get("HTTP_X_AMZ_TARGET") or (environ.get("REQUEST_METHOD", "") + " " + environ.get("PATH_INFO", ""))
        log.write("%.6f\t%s\n" % (time.time(), target))
        return inner(environ, start_response)
    run_simple(host, port, app, threaded=False, use_reloader=False, request_handler=MotoRequestHandler)

main()
"#;

/// `DynamoDB_20120810.GetItem` → `DynamoDB.GetItem` (the names the request log uses).
fn call_name(target: &str) -> String {
    let (svc, op) = target.split_once('.').unwrap_or(("?", target));
    let svc = match svc {
        s if s.starts_with("DynamoDB") => "DynamoDB",
        "AmazonSQS" => "SQS",
        "TrentService" => "KMS",
        s => s,
    };
    format!("{svc}.{op}")
}

/// The AWS call log: (unix time, call name).
fn read_calls(path: &Path) -> Vec<(f64, String)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (t, what) = l.split_once('\t')?;
            Some((t.parse().ok()?, call_name(what)))
        })
        .collect()
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn tally<'a>(calls: impl Iterator<Item = &'a str>) -> BTreeMap<String, i64> {
    let mut m = BTreeMap::new();
    for c in calls {
        *m.entry(c.to_string()).or_default() += 1;
    }
    m
}

/// Writes the logging moto wrapper into a fresh dir and points the harness at it
/// (`AIRLOCK_MOTO_SERVER`); returns the call log's path. Call before any thread starts.
fn install_logged_moto() -> PathBuf {
    let dir = temp_state_dir();
    let script = dir.join("moto_logged.py");
    let python = airlock_tests::moto::Moto::repo_root().join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/emulator.sh first",
        python.display()
    );
    std::fs::write(&script, format!("#!{}\n{MOTO_LOGGED}", python.display()))
        .expect("write moto wrapper");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::env::set_var("AIRLOCK_MOTO_SERVER", &script);
    dir.join("calls.log")
}

/// AWS calls per API operation (the request log's `backend_calls`, counted by the SDK
/// interceptor) and per order handled by the in-process worker (the emulator's own call log,
/// in a window with no HTTP requests, minus an idle window of the same length).
async fn bench_aws_calls(o: &Opts) -> Vec<Row> {
    let b = "aws-calls";
    let calls_log = PathBuf::from(std::env::var("AIRLOCK_BENCH_CALLS_LOG").expect("call log"));
    eprintln!("== aws-calls: AWS backend on moto (one request at a time)");
    let env_off = [
        ("AIRLOCK_NOW", MARKET_OPEN),
        ("AIRLOCK_EXECUTE_RATE_PER_MINUTE", MAX_RATE_PER_MINUTE),
        ("AIRLOCK_PLAN_RATE_PER_MINUTE", MAX_RATE_PER_MINUTE),
        ("AIRLOCK_WORKERS", "off"),
        // It queues more orders than the default limit with the workers off.
        NO_BACKLOG_LIMIT,
    ];
    let s = Server::start_on(airlock_tests::Backend::Aws, &env_off);
    no_position_limit(&s);
    let service = s.service_token();
    let op = s.operator_token(TRADER, "trader", Some("energy"));
    let c = Client::new(&s, &service, TRADER, &op);
    // (label, method, path, expected status), in request order.
    let mut done: Vec<(String, &str, String, u16, u16)> = Vec::new();
    let plan = |c: &Client, side: &'static str| {
        let c = c.clone();
        async move {
            let (st, text) = c
                .post("/actions/plan", order_body(TRADER, "ACC-1", "CLF27", side))
                .await;
            (
                st,
                serde_json::from_str::<Value>(&text).unwrap_or(Value::Null),
            )
        }
    };
    let exec_body = |p: &Value, token: &Value, key: &str| {
        json!({
            "plan_id": p["plan_id"], "confirmation_token": token,
            "idempotency_key": key, "requested_by": TRADER,
        })
        .to_string()
    };
    for round in 0..3 {
        for (label, path) in [
            ("GET /accounts", "/accounts".to_string()),
            ("GET /orders?limit=50", "/orders?limit=50".to_string()),
            (
                "GET /positions?account_id=ACC-1",
                "/positions?account_id=ACC-1".to_string(),
            ),
        ] {
            let (st, _) = c.get(&path).await;
            done.push((label.into(), "GET", path, 200, st));
        }
        let side = if round % 2 == 0 { "buy" } else { "sell" };
        let (st, p) = plan(&c, side).await;
        done.push((
            "POST /actions/plan (order.submit.cl)".into(),
            "POST",
            "/actions/plan".into(),
            200,
            st,
        ));
        let key = format!("calls-{round}");
        let (st, text) = c
            .post(
                "/actions/execute",
                exec_body(&p, &p["confirmation_token"], &key),
            )
            .await;
        done.push((
            "POST /actions/execute → 202 queued".into(),
            "POST",
            "/actions/execute".into(),
            202,
            st,
        ));
        let action: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let (st, _) = c
            .post(
                "/actions/execute",
                exec_body(&p, &p["confirmation_token"], &key),
            )
            .await;
        done.push((
            "POST /actions/execute → 200 duplicate (same key replayed)".into(),
            "POST",
            "/actions/execute".into(),
            200,
            st,
        ));
        let id = action["action_id"].as_str().unwrap_or("none").to_string();
        let (st, _) = c.get(&format!("/actions/{id}")).await;
        done.push((
            "GET /actions/{id}".into(),
            "GET",
            format!("/actions/{id}"),
            200,
            st,
        ));
        // Rejected, not decided: a confirmation token issued for another plan.
        let (st, p2) = plan(&c, side).await;
        done.push((
            "POST /actions/plan (order.submit.cl)".into(),
            "POST",
            "/actions/plan".into(),
            200,
            st,
        ));
        let (st, _) = c
            .post(
                "/actions/execute",
                exec_body(&p2, &p["confirmation_token"], &format!("calls-bad-{round}")),
            )
            .await;
        done.push(("POST /actions/execute → 422 token_invalid (the token of another plan; not a decision: audit only)".into(), "POST", "/actions/execute".into(), 422, st));
        // Rejected and decided: the kill switch is engaged (the plan is closed, the key
        // records the rejection).
        s.cli(&["kill-switch", "engage", "--reason", "bench"]);
        let (st, _) = c
            .post(
                "/actions/execute",
                exec_body(&p2, &p2["confirmation_token"], &format!("calls-ks-{round}")),
            )
            .await;
        done.push((
            "POST /actions/execute → 403 kill_switch_engaged (a decision: key, plan closed, audit)"
                .into(),
            "POST",
            "/actions/execute".into(),
            403,
            st,
        ));
        s.cli(&["kill-switch", "release"]);
    }
    let log = s.request_log();
    let mut per_label: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    // Request lines come in request order (one request at a time).
    let lines: Vec<&Value> = log.iter().collect();
    let mut mismatch = 0;
    let mut i = 0;
    for (label, method, path, want, got) in &done {
        // Find the next line for this method and path.
        while i < lines.len()
            && !(lines[i]["method"] == *method
                && lines[i]["path"]
                    .as_str()
                    .is_some_and(|p| p.ends_with(path.split('?').next().unwrap_or(path))))
        {
            i += 1;
        }
        let Some(l) = lines.get(i) else {
            mismatch += 1;
            continue;
        };
        i += 1;
        let status = l["status"].as_u64().unwrap_or(0) as u16;
        let calls = l["backend_calls"].as_str().unwrap_or("").replace(',', ", ");
        let calls = if calls.is_empty() {
            "(none)".to_string()
        } else {
            calls
        };
        let n = if calls == "(none)" {
            0
        } else {
            calls.split(", ").count()
        };
        let entry = format!(
            "{n}: {calls}{}",
            if status != *want || got != want {
                format!(" [status {status}, expected {want}]")
            } else {
                String::new()
            }
        );
        if !per_label.contains_key(label) {
            order.push(label.clone());
        }
        let v = per_label.entry(label.clone()).or_default();
        if !v.contains(&entry) {
            v.push(entry);
        }
    }
    let mut rows = Vec::new();
    for label in &order {
        rows.push(info(b, label, per_label[label].join(" **or** ")));
    }
    if mismatch > 0 {
        rows.push(info(b, "requests without a log line", mismatch.to_string()));
    }

    // The worker: queue orders with the workers off, restart with them on, and count the
    // emulator's calls while they drain (no HTTP requests), minus an idle window.
    let n = 20;
    // The three queued executes above are on the queue too.
    let earlier = done
        .iter()
        .filter(|(l, _, _, _, st)| l.contains("202 queued") && *st == 202)
        .count();
    let traders = vec![(TRADER.to_string(), op.clone())];
    let (executed, errors) = queue_orders(&s, &service, &traders, n, "aws-worker", o.groups).await;
    errors.print_samples("aws queue");
    let ids: Vec<String> = executed.iter().map(|(a, _)| a.clone()).collect();
    let stack = s.crash();
    let before = read_calls(&calls_log).len();
    let t_spawn = unix_now();
    let env_on = [
        ("AIRLOCK_NOW", MARKET_OPEN),
        ("AIRLOCK_EXECUTE_RATE_PER_MINUTE", MAX_RATE_PER_MINUTE),
        ("AIRLOCK_PLAN_RATE_PER_MINUTE", MAX_RATE_PER_MINUTE),
        ("AIRLOCK_WORKERS", "on"),
    ];
    let s = stack.start(&env_on);
    let t_listen = unix_now();
    // Wait without HTTP requests, so the emulator sees the worker's calls only, until it
    // has deleted (acknowledged) every message; then an idle window of the same length.
    let t_work_end = loop {
        let acks: Vec<f64> = read_calls(&calls_log)
            .into_iter()
            .skip(before)
            .filter(|(t, c)| *t >= t_listen && c == "SQS.DeleteMessage")
            .map(|(t, _)| t)
            .collect();
        if acks.len() >= ids.len() + earlier {
            break acks[ids.len() + earlier - 1] + 0.001;
        }
        if unix_now() - t_listen > 600.0 {
            eprintln!(
                "  only {} of {} messages acknowledged after 600 s",
                acks.len(),
                ids.len() + earlier
            );
            break unix_now();
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let work_secs = t_work_end - t_listen;
    let idle_secs = work_secs.clamp(5.0, 60.0);
    let wait = t_work_end + idle_secs - unix_now();
    if wait > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(wait));
    }
    let t_idle_end = t_work_end + idle_secs;
    let calls: Vec<(f64, String)> = read_calls(&calls_log).into_iter().skip(before).collect();
    let startup = tally(
        calls
            .iter()
            .filter(|(t, _)| *t < t_listen && *t >= t_spawn)
            .map(|(_, c)| c.as_str()),
    );
    let work = tally(
        calls
            .iter()
            .filter(|(t, _)| *t >= t_listen && *t < t_work_end)
            .map(|(_, c)| c.as_str()),
    );
    let idle = tally(
        calls
            .iter()
            .filter(|(t, _)| *t >= t_work_end && *t < t_idle_end)
            .map(|(_, c)| c.as_str()),
    );
    // Then check through the API that every order was handled.
    let c = Client::new(&s, &service, TRADER, &op);
    let mut statuses: BTreeMap<String, usize> = BTreeMap::new();
    for id in &ids {
        let (_, text) = c.get(&format!("/actions/{id}")).await;
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        *statuses
            .entry(v["status"].as_str().unwrap_or("?").to_string())
            .or_default() += 1;
    }
    let fmt = |m: &BTreeMap<String, i64>| {
        m.iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    rows.push(info(
        b,
        "serve start (workers on): calls before the listening line",
        fmt(&startup),
    ));
    rows.push(info(
        b,
        &format!("worker: calls from the listening line to the last DeleteMessage, {work_secs:.1} s ({} orders queued)", ids.len() + earlier),
        fmt(&work),
    ));
    rows.push(info(
        b,
        &format!("worker: calls in the next {idle_secs:.1} s, idle"),
        fmt(&idle),
    ));
    let scale = work_secs / idle_secs;
    let mut per_order = Vec::new();
    let mut total = 0.0;
    for (k, v) in &work {
        let d = *v as f64 - idle.get(k).copied().unwrap_or(0) as f64 * scale;
        if d > 0.0 {
            let x = d / (ids.len() + earlier).max(1) as f64;
            total += x;
            per_order.push(format!("{k} {x:.2}"));
        }
    }
    rows.push(info(
        b,
        "worker: calls per order ((busy − idle × busy/idle length) / orders)",
        format!("{total:.1}: {}", per_order.join(", ")),
    ));
    rows.push(info(
        b,
        "worker: action statuses after",
        format!("{statuses:?}"),
    ));
    rows
}

// ---------------------------------------------------------------------------------------

fn usage() -> ! {
    eprintln!(
        "usage: airlock-bench <startup|reads|pairs|pairs-shared|workers|all|mcp|aws-calls> [--duration SECS] [--clients N] [--runs N] [--orders N] [--no-baseline] [--wait-idle SECS] [--workers on|off] [--queued N] [--groups N] [--stream-clients N] [--stream-secs SECS] [--stream-rates R,R] [--read-paths /P,/P]"
    );
    std::process::exit(2)
}

fn default_binary() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("airlock")))
        .unwrap_or_else(|| PathBuf::from("target/release/airlock"))
}

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(what) = args.next() else { usage() };
    let mut o = Opts {
        duration: Duration::from_secs(10),
        warmup: Duration::from_secs(2),
        clients: 16,
        runs: 20,
        orders: 10_000,
        baseline: true,
        wait_idle: Duration::from_secs(120),
        workers: "off".into(),
        queued: 1000,
        stream_clients: 4,
        stream_secs: Duration::from_secs(20),
        stream_rates: vec![0, 50],
        read_paths: READ_PATHS.iter().map(|p| format!("{BASE}{p}")).collect(),
        groups: COMBOS.len(),
    };
    while let Some(a) = args.next() {
        let mut num = || -> u64 {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| usage())
        };
        match a.as_str() {
            "--duration" => o.duration = Duration::from_secs(num()),
            "--clients" => o.clients = num().max(1) as usize,
            "--runs" => o.runs = num().max(1) as usize,
            "--orders" => o.orders = num() as usize,
            "--no-baseline" => o.baseline = false,
            "--queued" => o.queued = num().max(1) as usize,
            "--groups" => o.groups = (num() as usize).clamp(1, 2 * MONTHS.len()),
            "--stream-clients" => o.stream_clients = num().max(1) as usize,
            "--stream-secs" => o.stream_secs = Duration::from_secs(num().max(1)),
            "--stream-rates" => {
                o.stream_rates = args
                    .next()
                    .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
                    .filter(|v: &Vec<u64>| !v.is_empty())
                    .unwrap_or_else(|| usage())
            }
            "--read-paths" => {
                o.read_paths = args
                    .next()
                    .map(|v| v.split(',').map(|p| p.trim().to_string()).collect())
                    .filter(|v: &Vec<String>| v.iter().all(|p| p.starts_with('/')))
                    .unwrap_or_else(|| usage())
            }
            "--wait-idle" => o.wait_idle = Duration::from_secs(num()),
            "--workers" => {
                o.workers = match args.next().as_deref() {
                    Some("on") => "on".into(),
                    Some("off") => "off".into(),
                    _ => usage(),
                }
            }
            _ => usage(),
        }
    }
    if what == "aws-calls" {
        // Before any thread starts, like AIRLOCK_TEST_BIN below.
        let log = install_logged_moto();
        std::env::set_var("AIRLOCK_BENCH_CALLS_LOG", log);
    }
    if std::env::var_os("AIRLOCK_TEST_BIN").is_none() {
        // Set before any thread starts: the harness reads it on every spawn.
        std::env::set_var("AIRLOCK_TEST_BIN", default_binary());
    }
    let bin = binary();
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --release -p airlock-local` first",
        bin.display()
    );
    if !bin.components().any(|c| c.as_os_str() == "release") {
        eprintln!(
            "warning: {} does not look like a release build; figures will not be representative",
            bin.display()
        );
    }
    eprintln!("server binary: {}", bin.display());

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut rows = Vec::new();
    let all = what == "all";
    let mut ran = false;
    if all || what == "startup" {
        wait_quiet(o.wait_idle);
        rows.extend(bench_startup(&o));
        ran = true;
    }
    if all || what == "reads" {
        wait_quiet(o.wait_idle);
        rows.extend(rt.block_on(bench_reads(&o)));
        ran = true;
    }
    if all || what == "pairs" {
        wait_quiet(o.wait_idle);
        rows.extend(rt.block_on(bench_pairs(&o, false)));
        ran = true;
    }
    if all || what == "pairs-shared" {
        wait_quiet(o.wait_idle);
        rows.extend(rt.block_on(bench_pairs(&o, true)));
        ran = true;
    }
    if all || what == "workers" {
        wait_quiet(o.wait_idle);
        rows.extend(rt.block_on(bench_workers(&o)));
        ran = true;
    }
    if what == "mcp" {
        wait_quiet(o.wait_idle);
        rows.extend(rt.block_on(bench_mcp(&o)));
        ran = true;
    }
    if what == "aws-calls" {
        rows.extend(rt.block_on(bench_aws_calls(&o)));
        ran = true;
        // The moto wrapper and its call log (the emulator stopped with the server).
        if let Some(dir) = std::env::var_os("AIRLOCK_BENCH_CALLS_LOG")
            .map(PathBuf::from)
            .and_then(|l| l.parent().map(Path::to_path_buf))
        {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    if !ran {
        usage();
    }
    print_table(&rows);
}
