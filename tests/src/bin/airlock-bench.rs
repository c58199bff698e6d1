//! `airlock-bench`: throughput and latency of the release `airlock serve`, over real HTTP.
//!
//! Run (from the workspace root):
//!
//! ```text
//! cargo build --release -p airlock-local && cargo run --release -p airlock-tests --bin airlock-bench -- all
//! ```
//!
//! Subcommands: `startup`, `reads`, `pairs`, `pairs-shared`, `all` (every one of them).
//! Options: `--duration SECS` (measured window of `reads`/`pairs`, default 10),
//! `--clients N` (default 16), `--runs N` (fresh starts for `startup`, default 20),
//! `--orders N` (bulk orders seeded for `startup`/`reads`, default 10000),
//! `--no-baseline` (skip the 1-client baseline runs), `--wait-idle SECS` (before each
//! scenario, wait up to this long for other processes to leave the machine idle; default 120),
//! `--workers on|off` (`AIRLOCK_WORKERS` of the `reads` and `pairs` servers; default `off`, as
//! in the test harness, so only the HTTP path is measured; `startup` uses serve's default).
//!
//! `pairs` gives each client its own trader on the energy desk; `pairs-shared` runs every
//! client as `op-energy-trader`. Both start `serve` with `AIRLOCK_NOW` at a Monday 09:00
//! Chicago (CME open) and `AIRLOCK_EXECUTE_RATE_PER_MINUTE=10000`, the largest value the
//! configuration accepts. Each pair plans 1 CLF27 on ACC-1 (market) and executes it; a client's
//! pairs alternate buy and sell so that the account stays inside the position limit (50) when
//! workers fill the orders.
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

use airlock_tests::{binary, cli, temp_state_dir, Server, BASE, MARKET_OPEN};
use serde_json::{json, Value};

const TRADER: &str = "op-energy-trader";
/// The highest per-operator execute rate the config accepts (`AIRLOCK_EXECUTE_RATE_PER_MINUTE`
/// is range-checked to 1..=10000; a larger value makes `serve` refuse to start).
const MAX_RATE_PER_MINUTE: &str = "10000";

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
    let base = format!("{}{BASE}", s.base);
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
        tasks.push(tokio::spawn(async move {
            let http = http_client();
            let auth = format!("Bearer {service}");
            let mut per_path = vec![Lat::default(); READ_PATHS.len()];
            let mut errors = Errors::default();
            let mut last = begin;
            let mut i = w;
            loop {
                let t = Instant::now();
                if t >= end {
                    break;
                }
                let p = i % READ_PATHS.len();
                i += 1;
                let r = http
                    .get(format!("{base}{}", READ_PATHS[p]))
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
                        format!("GET {} -> {status} {}", READ_PATHS[p], truncate(&body, 300))
                    });
                }
            }
            (per_path, errors, last)
        }));
    }
    let mut per_path = vec![Lat::default(); READ_PATHS.len()];
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
    for p in READ_PATHS {
        let r = http
            .get(s.url(p))
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
        for (p, l) in READ_PATHS.iter().zip(&r.per_path) {
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
        ("AIRLOCK_WORKERS", o.workers.as_str()),
    ];
    let s = Server::start(&env);
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
        "stored JSON bodies",
        format!(
            "plans {:.1} MB, actions {:.1} MB, audit {:.1} MB, queue {:.1} MB, idempotency_keys {:.1} MB; {} of {} pages free",
            body_mb("plans"),
            body_mb("actions"),
            body_mb("audit"),
            body_mb("queue"),
            body_mb("idempotency_keys"),
            pragma("freelist_count"),
            pragma("page_count"),
        ),
    ));
    rows
}

/// ERROR lines of the server log, grouped by their `cause` field.
fn server_errors(state_dir: &Path) -> String {
    let log = std::fs::read_to_string(state_dir.join("serve.log")).unwrap_or_default();
    let mut causes: BTreeMap<String, u64> = BTreeMap::new();
    for line in log.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if v["level"] != "ERROR" {
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

fn usage() -> ! {
    eprintln!(
        "usage: airlock-bench <startup|reads|pairs|pairs-shared|all> [--duration SECS] [--clients N] [--runs N] [--orders N] [--no-baseline] [--wait-idle SECS] [--workers on|off]"
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
    if !ran {
        usage();
    }
    print_table(&rows);
}
