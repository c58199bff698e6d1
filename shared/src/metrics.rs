//! Airlock's metrics. The use cases and the HTTP layer record them through the `metrics`
//! facade (`metrics::counter!` and friends, names below); one in-process recorder,
//! [`Registry`], keeps them and renders them two ways:
//!
//! - Prometheus text, for `GET /metrics` of `airlock serve` and `airlock stats`;
//! - CloudWatch Embedded Metric Format (EMF) lines on stdout, flushed after every Lambda
//!   invocation ([`flush_emf`]): counters as the increase since the last flush, histograms
//!   as the values observed since then (`Values`/`Counts`, so CloudWatch computes p95 and
//!   p99), gauges as their value.
//!
//! Our own recorder rather than `metrics-exporter-prometheus` plus an EMF crate: one store
//! serves both formats, and the dependency tree stays the `metrics` crate alone.
//! Labels are closed sets (action types, outcomes, error codes, route templates, queue
//! names): never ids, tokens or free text.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

pub const PLAN_REQUESTS: &str = "airlock_plan_requests_total";
pub const EXECUTE_REQUESTS: &str = "airlock_execute_requests_total";
pub const EXECUTE_REJECTIONS: &str = "airlock_execute_rejections_total";
pub const HTTP_DURATION: &str = "airlock_http_request_duration_seconds";
pub const MCP_TOOL_CALLS: &str = "airlock_mcp_tool_calls_total";
pub const WORKER_MESSAGES: &str = "airlock_worker_messages_total";
pub const ORDER_LATENCY: &str = "airlock_order_latency_seconds";
pub const QUEUE_DEPTH: &str = "airlock_queue_depth";
pub const QUEUE_OLDEST_AGE: &str = "airlock_queue_oldest_message_age_seconds";
pub const DEAD_LETTERS: &str = "airlock_dead_letters";
pub const DEAD_LETTERED: &str = "airlock_dead_letters_total";
pub const SWEEPER_RESENDS: &str = "airlock_sweeper_resends_total";
pub const KILL_SWITCH: &str = "airlock_kill_switch_engaged";
pub const COLD_STARTS: &str = "airlock_lambda_cold_starts_total";

/// Upper bounds (seconds) of the latency histogram buckets: fine enough for `airlock
/// stats` to estimate percentiles from 0.5 ms to 30 s.
pub const BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05,
    0.075, 0.1, 0.15, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// At most this many distinct values of one histogram wait for the next EMF flush (more
/// are merged into the nearest bucket bound: CloudWatch keeps the percentiles close).
const MAX_PENDING_VALUES: usize = 100;

#[derive(Default)]
struct CounterCell {
    total: AtomicU64,
    flushed: AtomicU64,
}

impl metrics::CounterFn for CounterCell {
    fn increment(&self, value: u64) {
        self.total.fetch_add(value, Ordering::Relaxed);
    }
    fn absolute(&self, value: u64) {
        self.total.fetch_max(value, Ordering::Relaxed);
    }
}

#[derive(Default)]
struct GaugeCell {
    bits: AtomicU64,
    dirty: AtomicBool,
}

impl GaugeCell {
    fn update(&self, f: impl Fn(f64) -> f64) {
        let _ = self
            .bits
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                Some(f(f64::from_bits(b)).to_bits())
            });
        self.dirty.store(true, Ordering::Relaxed);
    }
    fn get(&self) -> f64 {
        f64::from_bits(self.bits.load(Ordering::Relaxed))
    }
}

impl metrics::GaugeFn for GaugeCell {
    fn increment(&self, value: f64) {
        self.update(|v| v + value);
    }
    fn decrement(&self, value: f64) {
        self.update(|v| v - value);
    }
    fn set(&self, value: f64) {
        self.update(|_| value);
    }
}

#[derive(Default)]
struct Hist {
    /// Per bucket of [`BUCKETS`], then the overflow (`+Inf`); not cumulative.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
    /// Values since the last EMF flush, with how many times each was seen.
    pending: BTreeMap<u64, u64>,
}

#[derive(Default)]
struct HistCell(Mutex<Hist>);

impl metrics::HistogramFn for HistCell {
    fn record(&self, value: f64) {
        let mut h = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if h.counts.is_empty() {
            h.counts = vec![0; BUCKETS.len() + 1];
        }
        let i = BUCKETS
            .iter()
            .position(|b| value <= *b)
            .unwrap_or(BUCKETS.len());
        h.counts[i] += 1;
        h.sum += value;
        h.count += 1;
        let v = if h.pending.len() >= MAX_PENDING_VALUES {
            BUCKETS.get(i).copied().unwrap_or(value)
        } else {
            value
        };
        *h.pending.entry(v.to_bits()).or_default() += 1;
    }
}

#[derive(Clone)]
enum Cell {
    Counter(Arc<CounterCell>),
    Gauge(Arc<GaugeCell>),
    Histogram(Arc<HistCell>),
}

/// The recorder: every metric this process recorded, by name and labels.
#[derive(Default)]
pub struct Registry {
    cells: RwLock<HashMap<Key, Cell>>,
}

impl Registry {
    fn cell(&self, key: &Key, make: impl FnOnce() -> Cell) -> Cell {
        if let Some(c) = self
            .cells
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
        {
            return c.clone();
        }
        self.cells
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.clone())
            .or_insert_with(make)
            .clone()
    }

    fn sorted(&self) -> Vec<(Key, Cell)> {
        let cells = self.cells.read().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<(Key, Cell)> = cells.iter().map(|(k, c)| (k.clone(), c.clone())).collect();
        v.sort_by(|a, b| (a.0.name(), labels(&a.0)).cmp(&(b.0.name(), labels(&b.0))));
        v
    }

    /// Everything recorded, in the Prometheus text exposition format (0.0.4).
    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        let mut last = String::new();
        for (key, cell) in self.sorted() {
            let name = key.name();
            let labels = labels(&key);
            if name != last {
                let kind = match cell {
                    Cell::Counter(_) => "counter",
                    Cell::Gauge(_) => "gauge",
                    Cell::Histogram(_) => "histogram",
                };
                let _ = writeln!(out, "# TYPE {name} {kind}");
                last = name.to_string();
            }
            match cell {
                Cell::Counter(c) => {
                    let _ = writeln!(
                        out,
                        "{name}{} {}",
                        braces(&labels, None),
                        c.total.load(Ordering::Relaxed)
                    );
                }
                Cell::Gauge(g) => {
                    let _ = writeln!(out, "{name}{} {}", braces(&labels, None), g.get());
                }
                Cell::Histogram(h) => {
                    let h = h.0.lock().unwrap_or_else(|e| e.into_inner());
                    let mut cumulative = 0;
                    for (i, le) in BUCKETS
                        .iter()
                        .map(|b| b.to_string())
                        .chain(["+Inf".to_string()])
                        .enumerate()
                    {
                        cumulative += h.counts.get(i).copied().unwrap_or(0);
                        let _ = writeln!(
                            out,
                            "{name}_bucket{} {cumulative}",
                            braces(&labels, Some(&le))
                        );
                    }
                    let _ = writeln!(out, "{name}_sum{} {}", braces(&labels, None), h.sum);
                    let _ = writeln!(out, "{name}_count{} {}", braces(&labels, None), h.count);
                }
            }
        }
        out
    }

    /// The EMF documents of what changed since the last call (one JSON line per metric and
    /// label set), and resets the deltas. `function` becomes a dimension of every metric.
    pub fn emf(&self, namespace: &str, function: &str, timestamp_ms: i64) -> Vec<String> {
        let mut out = Vec::new();
        for (key, cell) in self.sorted() {
            let (value, unit) = match cell {
                Cell::Counter(c) => {
                    let total = c.total.load(Ordering::Relaxed);
                    let before = c.flushed.swap(total, Ordering::Relaxed);
                    if total == before {
                        continue;
                    }
                    (serde_json::json!(total - before), "Count")
                }
                Cell::Gauge(g) => {
                    if !g.dirty.swap(false, Ordering::Relaxed) {
                        continue;
                    }
                    (serde_json::json!(g.get()), "None")
                }
                Cell::Histogram(h) => {
                    let pending =
                        std::mem::take(&mut h.0.lock().unwrap_or_else(|e| e.into_inner()).pending);
                    if pending.is_empty() {
                        continue;
                    }
                    let values: Vec<f64> = pending.keys().map(|b| f64::from_bits(*b)).collect();
                    let counts: Vec<u64> = pending.values().copied().collect();
                    (
                        serde_json::json!({"Values": values, "Counts": counts}),
                        "Seconds",
                    )
                }
            };
            let name = key.name();
            let label_keys: Vec<&str> = key.labels().map(|l| l.key()).collect();
            let mut doc = serde_json::Map::new();
            doc.insert(
                "_aws".into(),
                serde_json::json!({
                    "Timestamp": timestamp_ms,
                    "CloudWatchMetrics": [{
                        "Namespace": namespace,
                        "Dimensions": dimension_sets(name, &label_keys),
                        "Metrics": [{"Name": name, "Unit": unit}]
                    }]
                }),
            );
            doc.insert("function".into(), serde_json::json!(function));
            for l in key.labels() {
                doc.insert(l.key().into(), serde_json::json!(l.value()));
            }
            doc.insert(name.into(), value);
            out.push(serde_json::Value::Object(doc).to_string());
        }
        out
    }
}

/// The dimension sets CloudWatch aggregates a metric under: everything (with the
/// function), and the views the dashboard and the alarms read.
pub fn dimension_sets(name: &str, label_keys: &[&str]) -> Vec<Vec<String>> {
    let mut full = vec!["function".to_string()];
    full.extend(label_keys.iter().map(|k| k.to_string()));
    let view: &[&str] = match name {
        PLAN_REQUESTS => &["action_type"],
        EXECUTE_REQUESTS => &["outcome"],
        EXECUTE_REJECTIONS => &["code"],
        HTTP_DURATION => &["route", "method"],
        MCP_TOOL_CALLS => &["outcome"],
        WORKER_MESSAGES => &["queue", "outcome"],
        SWEEPER_RESENDS | DEAD_LETTERED => &["queue"],
        COLD_STARTS => return vec![full],
        _ => &[],
    };
    let mut sets = vec![full, view.iter().map(|s| s.to_string()).collect()];
    if name == PLAN_REQUESTS {
        sets.push(Vec::new());
    }
    sets
}

fn labels(key: &Key) -> Vec<(String, String)> {
    key.labels()
        .map(|l| (l.key().to_string(), l.value().to_string()))
        .collect()
}

fn braces(labels: &[(String, String)], le: Option<&str>) -> String {
    let mut parts: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    if let Some(le) = le {
        parts.push(format!("le=\"{le}\""));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Recorder for Registry {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        match self.cell(key, || Cell::Counter(Arc::default())) {
            Cell::Counter(c) => Counter::from_arc(c),
            _ => Counter::noop(),
        }
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        match self.cell(key, || Cell::Gauge(Arc::default())) {
            Cell::Gauge(g) => Gauge::from_arc(g),
            _ => Gauge::noop(),
        }
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        match self.cell(key, || Cell::Histogram(Arc::default())) {
            Cell::Histogram(h) => Histogram::from_arc(h),
            _ => Histogram::noop(),
        }
    }
}

/// A registry shared with the global recorder: `Recorder` is implemented on the `Arc` so
/// the process keeps a handle to render what the facade recorded.
pub struct Shared(pub Arc<Registry>);

impl Recorder for Shared {
    fn describe_counter(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
        self.0.describe_counter(k, u, d)
    }
    fn describe_gauge(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
        self.0.describe_gauge(k, u, d)
    }
    fn describe_histogram(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
        self.0.describe_histogram(k, u, d)
    }
    fn register_counter(&self, key: &Key, m: &Metadata<'_>) -> Counter {
        self.0.register_counter(key, m)
    }
    fn register_gauge(&self, key: &Key, m: &Metadata<'_>) -> Gauge {
        self.0.register_gauge(key, m)
    }
    fn register_histogram(&self, key: &Key, m: &Metadata<'_>) -> Histogram {
        self.0.register_histogram(key, m)
    }
}

/// The process's registry, installed as the global recorder on first use.
pub fn registry() -> &'static Arc<Registry> {
    static REGISTRY: OnceLock<Arc<Registry>> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let r = Arc::new(Registry::default());
        let _ = metrics::set_global_recorder(Shared(r.clone()));
        r
    })
}

/// Whether `airlock serve` records metrics: yes unless `AIRLOCK_METRICS=off` (the
/// benchmarks' baseline without them).
pub fn enabled_locally() -> bool {
    std::env::var("AIRLOCK_METRICS").as_deref() != Ok("off")
}

/// Whether this Lambda instance has flushed before (the first flush counts a cold start).
static WARM: AtomicBool = AtomicBool::new(false);

/// Where this process's metrics go on Lambda: EMF, under a namespace, for a function.
struct Emf {
    namespace: String,
    function: &'static str,
}

static EMF: OnceLock<Option<Emf>> = OnceLock::new();

/// Called by every Lambda's `main` with its binary name (the `function` dimension):
/// installs the registry, and with `AIRLOCK_METRICS=emf` (the template sets it) turns on
/// the per-invocation EMF flush, under `AIRLOCK_METRICS_NAMESPACE` (default `Airlock`).
pub fn init_lambda(function: &'static str) {
    registry();
    let _ = EMF.set(
        (std::env::var("AIRLOCK_METRICS").as_deref() == Ok("emf")).then(|| Emf {
            namespace: std::env::var("AIRLOCK_METRICS_NAMESPACE")
                .unwrap_or_else(|_| "Airlock".into()),
            function,
        }),
    );
}

/// After each Lambda invocation: prints what this invocation recorded as EMF lines on
/// stdout, where CloudWatch Logs turns them into metrics. A no-op outside Lambda.
pub fn flush_emf() {
    let Some(Some(emf)) = EMF.get() else {
        return;
    };
    if !WARM.swap(true, Ordering::Relaxed) {
        metrics::counter!(COLD_STARTS).increment(1);
    }
    let now = chrono::Utc::now().timestamp_millis();
    let lines = registry().emf(&emf.namespace, emf.function, now);
    if !lines.is_empty() {
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        for l in lines {
            let _ = writeln!(out, "{l}");
        }
        let _ = out.flush();
    }
}

/// Sets the gauges that describe state rather than events: each queue's depth, its dead
/// letters and the age of its oldest waiting message (when the queue can tell), and the
/// kill switch. Read when `/metrics` is scraped, and on each sweeper pass (Lambda).
pub async fn observe_state(
    queue: &dyn crate::core::ports::Queue,
    control: &dyn crate::core::ports::ControlStore,
    now: crate::core::domain::Millis,
) -> Result<(), crate::core::error::ApiError> {
    for d in queue.depth().await? {
        let q = d.queue.short_name();
        metrics::gauge!(QUEUE_DEPTH, "queue" => q).set((d.waiting + d.in_flight) as f64);
        metrics::gauge!(DEAD_LETTERS, "queue" => q).set(d.dead_letters as f64);
        let age = d.oldest_sent_at.map_or(0, |t| (now - t).max(0));
        if d.oldest_sent_at.is_some() || d.waiting == 0 {
            metrics::gauge!(QUEUE_OLDEST_AGE, "queue" => q).set(age as f64 / 1000.0);
        }
    }
    let engaged = !control.get_control().await?.trade_execute_enabled;
    metrics::gauge!(KILL_SWITCH).set(if engaged { 1.0 } else { 0.0 });
    Ok(())
}

/// `airlock stats`: a table from a running server's `/metrics` text.
pub mod stats {
    use std::collections::BTreeMap;

    /// One sample line of the Prometheus text format.
    #[derive(Debug, Clone, PartialEq)]
    pub struct Sample {
        pub name: String,
        pub labels: BTreeMap<String, String>,
        pub value: f64,
    }

    impl Sample {
        fn label(&self, k: &str) -> &str {
            self.labels.get(k).map_or("", String::as_str)
        }
    }

    /// The samples of a Prometheus text page (comments skipped).
    pub fn parse(text: &str) -> Vec<Sample> {
        let mut out = Vec::new();
        for line in text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            let (head, value) = match line.rsplit_once(' ') {
                Some(x) => x,
                None => continue,
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let (name, labels) = match head.split_once('{') {
                None => (head.to_string(), BTreeMap::new()),
                Some((n, rest)) => {
                    let mut labels = BTreeMap::new();
                    let mut rest = rest.trim_end_matches('}');
                    while let Some((k, v)) = rest.split_once("=\"") {
                        let mut val = String::new();
                        let mut chars = v.char_indices();
                        let mut end = v.len();
                        while let Some((i, c)) = chars.next() {
                            match c {
                                '\\' => {
                                    if let Some((_, e)) = chars.next() {
                                        val.push(if e == 'n' { '\n' } else { e });
                                    }
                                }
                                '"' => {
                                    end = i + 1;
                                    break;
                                }
                                c => val.push(c),
                            }
                        }
                        labels.insert(k.trim_start_matches(',').to_string(), val);
                        rest = &v[end..];
                    }
                    (n.to_string(), labels)
                }
            };
            out.push(Sample {
                name,
                labels,
                value,
            });
        }
        out
    }

    fn sum<'a>(samples: &'a [Sample], name: &str, keep: impl Fn(&Sample) -> bool + 'a) -> f64 {
        // `+ 0.0`: an empty sum of floats is -0.
        samples
            .iter()
            .filter(|s| s.name == name && keep(s))
            .map(|s| s.value)
            .sum::<f64>()
            + 0.0
    }

    /// The `q` quantile (0..1) of a cumulative histogram, in seconds, interpolated within
    /// its bucket; `None` without observations.
    pub fn quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
        let total = buckets.last()?.1;
        if total <= 0.0 {
            return None;
        }
        let target = q * total;
        let mut prev = (0.0, 0.0);
        for &(le, cum) in buckets {
            if cum >= target {
                if le.is_infinite() {
                    return Some(prev.0);
                }
                let width = cum - prev.1;
                let frac = if width > 0.0 {
                    (target - prev.1) / width
                } else {
                    1.0
                };
                return Some(prev.0 + (le - prev.0) * frac);
            }
            prev = (le, cum);
        }
        Some(prev.0)
    }

    /// The report: per endpoint count and p50/p95/p99; plans; execute outcomes, the
    /// acceptance rate and rejections by code; MCP tool calls; workers (and their
    /// throughput over `window_s` when `before` is the page scraped that long before);
    /// queues; the kill switch.
    pub fn report(now: &[Sample], before: Option<(&[Sample], f64)>) -> String {
        use super::*;
        let mut out = String::new();
        // Endpoints: every status of a route and method together.
        let mut routes: BTreeMap<(String, String), BTreeMap<u64, f64>> = BTreeMap::new();
        for s in now
            .iter()
            .filter(|s| s.name == format!("{HTTP_DURATION}_bucket"))
        {
            let le = match s.label("le") {
                "+Inf" => f64::INFINITY,
                v => v.parse().unwrap_or(f64::INFINITY),
            };
            *routes
                .entry((s.label("route").to_string(), s.label("method").to_string()))
                .or_default()
                .entry(le.to_bits())
                .or_default() += s.value;
        }
        let _ = writeln!(
            out,
            "{:<52} {:>8} {:>9} {:>9} {:>9}",
            "endpoint", "count", "p50 ms", "p95 ms", "p99 ms"
        );
        for ((route, method), b) in &routes {
            let mut buckets: Vec<(f64, f64)> =
                b.iter().map(|(k, v)| (f64::from_bits(*k), *v)).collect();
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            let count = buckets.last().map_or(0.0, |b| b.1);
            let ms =
                |q| quantile(&buckets, q).map_or("-".to_string(), |v| format!("{:.2}", v * 1000.0));
            let _ = writeln!(
                out,
                "{:<52} {:>8} {:>9} {:>9} {:>9}",
                format!("{method} {route}"),
                count,
                ms(0.50),
                ms(0.95),
                ms(0.99)
            );
        }
        let plans = sum(now, PLAN_REQUESTS, |_| true);
        let executable = sum(now, PLAN_REQUESTS, |s| s.label("executable") == "true");
        let _ = writeln!(out, "\nplans: {plans} ({executable} executable)");
        let outcome = |o: &str| sum(now, EXECUTE_REQUESTS, |s| s.label("outcome") == o);
        let (queued, duplicate, rejected) =
            (outcome("queued"), outcome("duplicate"), outcome("rejected"));
        let total = queued + duplicate + rejected;
        let rate = if total > 0.0 {
            format!("{:.1}%", queued * 100.0 / total)
        } else {
            "-".into()
        };
        let _ = writeln!(out, "executes: {total} ({queued} queued, {duplicate} duplicate, {rejected} rejected); acceptance rate {rate}");
        let mut codes: BTreeMap<&str, f64> = BTreeMap::new();
        for s in now.iter().filter(|s| s.name == EXECUTE_REJECTIONS) {
            *codes.entry(s.label("code")).or_default() += s.value;
        }
        if !codes.is_empty() {
            let list: Vec<String> = codes.iter().map(|(c, n)| format!("{c} {n}")).collect();
            let _ = writeln!(out, "rejections by code: {}", list.join(", "));
        }
        let tools = sum(now, MCP_TOOL_CALLS, |_| true);
        let tool_errors = sum(now, MCP_TOOL_CALLS, |s| s.label("outcome") == "error");
        let _ = writeln!(out, "mcp tool calls: {tools} ({tool_errors} errors)");
        for queue in ["orders", "jobs"] {
            let handled =
                |samples: &[Sample]| sum(samples, WORKER_MESSAGES, |s| s.label("queue") == queue);
            let mut line = format!("worker {queue}: {} messages", handled(now));
            for o in ["succeeded", "failed", "already_done", "refused", "retried"] {
                let n = sum(now, WORKER_MESSAGES, |s| {
                    s.label("queue") == queue && s.label("outcome") == o
                });
                if n > 0.0 {
                    let _ = write!(line, ", {n} {o}");
                }
            }
            if let Some((earlier, window)) = before {
                if window > 0.0 {
                    let _ = write!(
                        line,
                        "; {:.1}/s over {window} s",
                        (handled(now) - handled(earlier)) / window
                    );
                }
            }
            let depth = sum(now, QUEUE_DEPTH, |s| s.label("queue") == queue);
            let dead = sum(now, DEAD_LETTERS, |s| s.label("queue") == queue);
            let age = sum(now, QUEUE_OLDEST_AGE, |s| s.label("queue") == queue);
            let _ = writeln!(
                out,
                "{line}; depth {depth}, oldest {age:.1} s, dead letters {dead}"
            );
        }
        let engaged = sum(now, KILL_SWITCH, |_| true) > 0.0;
        let _ = writeln!(
            out,
            "kill switch: {}",
            if engaged { "ENGAGED" } else { "released" }
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_and_emf_from_one_store() {
        let r = Arc::new(Registry::default());
        let rec = Shared(r.clone());
        metrics::with_local_recorder(&rec, || {
            metrics::counter!(EXECUTE_REQUESTS, "action_type" => "order.cancel", "outcome" => "queued").increment(2);
            metrics::counter!(EXECUTE_REQUESTS, "action_type" => "order.cancel", "outcome" => "queued").increment(1);
            metrics::gauge!(KILL_SWITCH).set(1.0);
            metrics::histogram!(HTTP_DURATION, "route" => "/health", "method" => "GET", "status" => "200").record(0.004);
            metrics::histogram!(HTTP_DURATION, "route" => "/health", "method" => "GET", "status" => "200").record(0.004);
            metrics::histogram!(HTTP_DURATION, "route" => "/health", "method" => "GET", "status" => "200").record(0.2);
        });
        let text = r.prometheus();
        assert!(text.contains("# TYPE airlock_execute_requests_total counter\nairlock_execute_requests_total{action_type=\"order.cancel\",outcome=\"queued\"} 3\n"), "{text}");
        assert!(text.contains("airlock_kill_switch_engaged 1\n"), "{text}");
        assert!(text.contains("airlock_http_request_duration_seconds_bucket{route=\"/health\",method=\"GET\",status=\"200\",le=\"0.004\"} 2\n"), "{text}");
        assert!(text.contains("airlock_http_request_duration_seconds_bucket{route=\"/health\",method=\"GET\",status=\"200\",le=\"+Inf\"} 3\n"), "{text}");
        assert!(text.contains("airlock_http_request_duration_seconds_count{route=\"/health\",method=\"GET\",status=\"200\"} 3\n"), "{text}");

        let lines = r.emf("Airlock", "execute", 1_700_000_000_000);
        assert_eq!(lines.len(), 3, "{lines:?}");
        let docs: Vec<serde_json::Value> = lines
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let exec = docs
            .iter()
            .find(|d| d.get(EXECUTE_REQUESTS).is_some())
            .unwrap();
        assert_eq!(exec[EXECUTE_REQUESTS], 3);
        assert_eq!(exec["function"], "execute");
        assert_eq!(exec["outcome"], "queued");
        let m = &exec["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(m["Namespace"], "Airlock");
        assert_eq!(
            m["Dimensions"],
            serde_json::json!([["function", "action_type", "outcome"], ["outcome"]])
        );
        assert_eq!(
            m["Metrics"],
            serde_json::json!([{"Name": EXECUTE_REQUESTS, "Unit": "Count"}])
        );
        let hist = docs
            .iter()
            .find(|d| d.get(HTTP_DURATION).is_some())
            .unwrap();
        assert_eq!(
            hist[HTTP_DURATION],
            serde_json::json!({"Values": [0.004, 0.2], "Counts": [2, 1]})
        );
        // Flushed: nothing new, nothing printed; a new increment prints its delta.
        assert!(r.emf("Airlock", "execute", 0).is_empty());
        metrics::with_local_recorder(&rec, || {
            metrics::counter!(EXECUTE_REQUESTS, "action_type" => "order.cancel", "outcome" => "queued").increment(1);
        });
        let again = r.emf("Airlock", "execute", 0);
        assert_eq!(again.len(), 1);
        let d: serde_json::Value = serde_json::from_str(&again[0]).unwrap();
        assert_eq!(d[EXECUTE_REQUESTS], 1);
    }
}
