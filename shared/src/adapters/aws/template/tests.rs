//! The shape test: the template against the code's expectations. Each check returns the
//! problems it finds, so the last test can prove that drift is caught.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::yaml::{flag, number};
use super::*;
use crate::adapters::aws::shapes;

const PREFIX: &str = "${ResourcePrefix}";

/// Records a problem unless `cond` holds.
macro_rules! check {
    ($out:expr, $cond:expr, $($msg:tt)+) => {
        if !$cond {
            $out.push(format!($($msg)+));
        }
    };
}

fn tpl() -> Template {
    embedded().expect("infra/template.yaml parses")
}

fn ref_to(v: Option<&Value>) -> Option<String> {
    v.and_then(referenced_id)
}

fn table_problems(t: &Template) -> Vec<String> {
    let mut out = Vec::new();
    for s in shapes::TABLES {
        let id = s.logical_id;
        let Some(d) = t.table(id) else {
            out.push(format!("template has no table {id}"));
            continue;
        };
        check!(
            out,
            d.name_pattern.as_deref() == Some(format!("{PREFIX}{}", s.default_name).as_str()),
            "{id}: TableName must be ResourcePrefix + {:?}, is {:?}",
            s.default_name,
            d.name_pattern
        );
        check!(
            out,
            d.key.partition == s.partition,
            "{id}: partition key {}",
            d.key.partition
        );
        check!(
            out,
            d.key.sort.as_deref() == s.sort,
            "{id}: sort key {:?}",
            d.key.sort
        );
        // The code writes every table key as a string.
        for k in [Some(s.partition), s.sort].into_iter().flatten() {
            check!(
                out,
                d.attr_type(k) == Some(AttrType::S),
                "{id}: {k} must be S"
            );
        }
        let want: BTreeSet<&str> = s.indexes.iter().map(|i| i.name).collect();
        let have: BTreeSet<&str> = d.indexes.iter().map(|i| i.name.as_str()).collect();
        check!(
            out,
            have == want,
            "{id}: indexes {have:?}, the code uses {want:?}"
        );
        for ix in s.indexes {
            let Some(di) = d.index(ix.name) else { continue };
            let n = ix.name;
            check!(
                out,
                di.key.partition == ix.partition,
                "{id}.{n}: partition key"
            );
            check!(
                out,
                di.key.sort.as_deref() == Some(ix.sort),
                "{id}.{n}: sort key"
            );
            check!(
                out,
                d.attr_type(ix.partition) == Some(AttrType::S),
                "{id}.{n}: type"
            );
            let sort_type = if ix.sort_is_number {
                AttrType::N
            } else {
                AttrType::S
            };
            check!(
                out,
                d.attr_type(ix.sort) == Some(sort_type),
                "{id}.{n}: sort type"
            );
            // An index projected ALL is read whole (the `body` attribute); one of keys
            // only is read for keys, then the items from the table.
            check!(
                out,
                di.projection == ix.projection,
                "{id}.{n}: projection {}, the code reads {}",
                di.projection,
                ix.projection
            );
        }
        // Exactly the key attributes: CloudFormation rejects unused definitions, and
        // every key the code uses must be defined.
        let mut keys: BTreeSet<&str> = [s.partition].into_iter().chain(s.sort).collect();
        for ix in s.indexes {
            keys.insert(ix.partition);
            keys.insert(ix.sort);
        }
        let defined: BTreeSet<&str> = d.attributes.iter().map(|(n, _)| n.as_str()).collect();
        check!(
            out,
            defined == keys,
            "{id}: AttributeDefinitions {defined:?}, keys {keys:?}"
        );
        check!(
            out,
            d.ttl.as_deref() == s.ttl,
            "{id}: TTL {:?}, code uses {:?}",
            d.ttl,
            s.ttl
        );
        check!(
            out,
            d.billing_mode.as_deref() == Some("PAY_PER_REQUEST"),
            "{id}: on-demand billing"
        );
        check!(
            out,
            d.point_in_time_recovery,
            "{id}: point-in-time recovery"
        );
    }
    for d in &t.tables {
        check!(
            out,
            shapes::TABLES.iter().any(|s| s.logical_id == d.logical_id),
            "template table {} is unknown to shapes.rs",
            d.logical_id
        );
    }
    out
}

fn queue_problems(t: &Template) -> Vec<String> {
    let mut out = Vec::new();
    let mut dead_letters = BTreeSet::new();
    for s in shapes::QUEUES {
        let id = s.logical_id;
        let Some(q) = t.queue(id) else {
            out.push(format!("template has no queue {id}"));
            continue;
        };
        check!(
            out,
            q.name_pattern.as_deref() == Some(format!("{PREFIX}{}", s.default_name).as_str()),
            "{id}: QueueName {:?}",
            q.name_pattern
        );
        check!(out, q.fifo == s.fifo, "{id}: FifoQueue must be {}", s.fifo);
        // The code sets the deduplication id (the action id) itself.
        check!(
            out,
            !q.content_based_deduplication,
            "{id}: ContentBasedDeduplication"
        );
        let Some(r) = &q.redrive else {
            out.push(format!("{id}: no RedrivePolicy"));
            continue;
        };
        check!(
            out,
            r.max_receive_count == s.max_receive_count
                && r.max_receive_count == crate::core::records::MAX_RECEIVES,
            "{id}: maxReceiveCount {} (the workers treat receive {} as the last)",
            r.max_receive_count,
            crate::core::records::MAX_RECEIVES
        );
        dead_letters.insert(r.dead_letter.clone());
        match t.queue(&r.dead_letter) {
            None => out.push(format!("{id}: no dead-letter queue {}", r.dead_letter)),
            Some(dlq) => {
                let d = &dlq.logical_id;
                check!(
                    out,
                    dlq.name_pattern.as_deref()
                        == Some(format!("{PREFIX}{}", s.dead_letter_name).as_str()),
                    "{d}: QueueName {:?}",
                    dlq.name_pattern
                );
                check!(
                    out,
                    dlq.fifo == s.fifo,
                    "{d}: a FIFO queue needs a FIFO DLQ"
                );
                check!(out, dlq.redrive.is_none(), "{d}: a DLQ has no DLQ");
            }
        }
        // Lambda refuses an SQS trigger whose visibility timeout is below the function's
        // timeout.
        for f in &t.functions {
            let consumes = f
                .events
                .iter()
                .any(|e| matches!(e, EventDef::Sqs { queue } if queue == id));
            check!(
                out,
                !consumes || q.visibility_timeout_s.unwrap_or(30) >= f.timeout_s.unwrap_or(3),
                "{id}: VisibilityTimeout below {}'s Timeout",
                f.logical_id
            );
        }
    }
    for q in &t.queues {
        check!(
            out,
            shapes::QUEUES.iter().any(|s| s.logical_id == q.logical_id)
                || dead_letters.contains(&q.logical_id),
            "template queue {} is unknown to shapes.rs",
            q.logical_id
        );
    }
    out
}

fn key_problems(t: &Template) -> Vec<String> {
    let mut out = Vec::new();
    check!(out, !t.keys.is_empty(), "template has no KMS key");
    for k in &t.keys {
        check!(
            out,
            k.key_spec == "ECC_NIST_P256",
            "{}: KeySpec",
            k.logical_id
        );
        check!(
            out,
            k.key_usage == "SIGN_VERIFY",
            "{}: KeyUsage",
            k.logical_id
        );
    }
    let alias = format!("alias/{PREFIX}{}", shapes::SIGNING_ALIAS_NAME);
    check!(
        out,
        t.key_aliases == vec![alias.clone()],
        "key aliases {:?}, want {alias}",
        t.key_aliases
    );
    out
}

/// `AIRLOCK_*` variables the template sets that the code does not read yet.
/// The metrics module (`shared/src/metrics.rs`, in the works) reads these two: once it
/// has landed, add it to the sources below and empty this list.
const NOT_READ_YET: &[&str] = &[];

fn environment_problems(t: &Template) -> Vec<String> {
    let mut out = Vec::new();
    let code = [
        include_str!("../../../config.rs"),
        include_str!("../../../app/mod.rs"),
        include_str!("../../../metrics.rs"),
        include_str!("../shapes.rs"),
    ]
    .concat();
    for f in &t.functions {
        let id = &f.logical_id;
        // Aws::connect resolves every name at cold start: every function needs them all.
        for s in shapes::TABLES {
            check!(
                out,
                ref_to(f.env.get(s.env)).as_deref() == Some(s.logical_id),
                "{id}: {} must be !Ref {}",
                s.env,
                s.logical_id
            );
        }
        for q in shapes::QUEUES {
            check!(
                out,
                ref_to(f.env.get(q.env)).as_deref() == Some(q.logical_id),
                "{id}: {} must be !Ref {} (a queue's Ref is its URL)",
                q.env,
                q.logical_id
            );
        }
        let key = f
            .env
            .get(shapes::SIGNING_KEY_ENV)
            .and_then(|k| serde_yaml::to_string(k).ok())
            .unwrap_or_default();
        check!(
            out,
            t.keys.iter().any(|k| key.contains(&k.logical_id)),
            "{id}: {} must name the template's key",
            shapes::SIGNING_KEY_ENV
        );
        check!(
            out,
            f.env.get("AIRLOCK_BACKEND").and_then(Value::as_str) == Some("aws"),
            "{id}: AIRLOCK_BACKEND must be aws"
        );
        check!(
            out,
            f.env.contains_key("AIRLOCK_CURSOR_KEY"),
            "{id}: AIRLOCK_CURSOR_KEY"
        );
        check!(
            out,
            f.env
                .get("AIRLOCK_STATE_DIR")
                .and_then(Value::as_str)
                .is_some_and(|d| d.starts_with("/tmp/")),
            "{id}: AIRLOCK_STATE_DIR must be writable in Lambda (under /tmp)"
        );
        // Every function writes its metrics as EMF, in the stack's namespace.
        check!(
            out,
            f.env.get("AIRLOCK_METRICS").and_then(Value::as_str) == Some("emf"),
            "{id}: AIRLOCK_METRICS must be emf"
        );
        check!(
            out,
            ref_to(f.env.get("AIRLOCK_METRICS_NAMESPACE")).as_deref() == Some(NAMESPACE_PARAM),
            "{id}: AIRLOCK_METRICS_NAMESPACE must be !Ref {NAMESPACE_PARAM}"
        );
        if f.events.iter().any(|e| matches!(e, EventDef::Api { .. })) {
            let ignore = f.env.get("AWS_LAMBDA_HTTP_IGNORE_STAGE_IN_PATH");
            check!(
                out,
                matches!(ignore, Some(Value::String(s)) if s == "true")
                    || matches!(ignore, Some(Value::Bool(true))),
                "{id}: without AWS_LAMBDA_HTTP_IGNORE_STAGE_IN_PATH=true every route 404s"
            );
        }
        for name in f.env.keys().filter(|n| n.starts_with("AIRLOCK_")) {
            check!(
                out,
                code.contains(&format!("\"{name}\"")) || NOT_READ_YET.contains(&name.as_str()),
                "{id}: {name} is set but the code never reads it"
            );
        }
    }
    out
}

fn function_problems(t: &Template) -> Vec<String> {
    use crate::doors::http::api;
    let mut out = Vec::new();
    let route = |m: &str, p: &str| EventDef::Api {
        method: m.into(),
        path: api(p),
    };
    // `GET /health` (no auth, outside the base path) rides on the accounts function.
    let health = EventDef::Api {
        method: "GET".into(),
        path: "/health".into(),
    };
    let expected: Vec<(&str, Vec<EventDef>)> = vec![
        // So does the OpenAPI document (same tokens as the reads).
        (
            "accounts",
            vec![
                route("GET", "/accounts"),
                health,
                route("GET", "/openapi.json"),
            ],
        ),
        ("positions", vec![route("GET", "/positions")]),
        (
            "portfolio",
            vec![
                route("GET", "/portfolio"),
                route("GET", "/portfolio/allocation"),
                route("GET", "/portfolio/risk-flags"),
            ],
        ),
        ("orders", vec![route("GET", "/orders")]),
        ("jobs", vec![route("GET", "/jobs")]),
        ("action-status", vec![route("GET", "/actions/{action_id}")]),
        ("plan", vec![route("POST", "/actions/plan")]),
        ("execute", vec![route("POST", "/actions/execute")]),
        // MCP answers GET and DELETE (405) itself.
        ("mcp", vec![route("ANY", "/mcp")]),
        (
            "worker-orders",
            vec![EventDef::Sqs {
                queue: shapes::ORDERS_QUEUE.logical_id.into(),
            }],
        ),
        (
            "worker-jobs",
            vec![EventDef::Sqs {
                queue: shapes::JOBS_QUEUE.logical_id.into(),
            }],
        ),
        ("sweeper", vec![EventDef::Schedule]),
        (
            "approvals",
            vec![
                EventDef::HttpApi {
                    method: "ANY".into(),
                    path: "/approvals/{proxy+}".into(),
                },
                EventDef::HttpApi {
                    method: "GET".into(),
                    path: "/approvals".into(),
                },
                route("POST", "/operators/enrolments"),
            ],
        ),
    ];
    let functions_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../functions");
    let mut crates: BTreeSet<String> = std::fs::read_dir(&functions_dir)
        .expect("functions/")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("Cargo.toml").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    crates.remove("local"); // the `airlock` command line, not a Lambda
    let mut built = BTreeSet::new();
    for f in &t.functions {
        let id = &f.logical_id;
        check!(
            out,
            f.build_method.as_deref() == Some("rust-cargolambda"),
            "{id}: BuildMethod"
        );
        check!(
            out,
            f.runtime.as_deref() == Some("provided.al2023"),
            "{id}: Runtime"
        );
        check!(
            out,
            f.handler.as_deref() == Some("bootstrap"),
            "{id}: Handler"
        );
        check!(out, f.architectures == ["arm64"], "{id}: Architectures");
        let Some(bin) = f.binary.clone() else {
            out.push(format!("{id}: no BuildProperties.Binary"));
            continue;
        };
        check!(out, crates.contains(&bin), "{id}: no crate functions/{bin}");
        match expected.iter().find(|(b, _)| *b == bin) {
            None => out.push(format!("{id}: no expected trigger for {bin}")),
            Some((_, want)) => check!(
                out,
                &f.events == want,
                "{id}: events {:?}, want {want:?}",
                f.events
            ),
        }
        check!(out, built.insert(bin.clone()), "{bin} is built twice");
    }
    check!(
        out,
        built == crates,
        "template functions build {built:?}, function crates are {crates:?}"
    );
    // Every operation of the OpenAPI document is routed to some function.
    let doc = crate::doors::catalog::all_api()
        .document()
        .expect("the OpenAPI document builds");
    let routed: Vec<&EventDef> = expected.iter().flat_map(|(_, e)| e).collect();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("path item").keys() {
            let m = method.to_uppercase();
            check!(
                out,
                routed
                    .iter()
                    .any(|e| matches!(e, EventDef::Api { method, path: p }
                    if p == path && (method == &m || method == "ANY"))),
                "{m} {path} is in the OpenAPI document but no function serves it"
            );
        }
    }
    out
}

// -------------------------------------------------------------------------------------
// Observability: the dashboard and the metric alarms read what the functions emit, and
// X-Ray tracing is a parameter.

/// The parameter that names the metrics' namespace.
const NAMESPACE_PARAM: &str = "MetricsNamespace";

/// The metrics the functions emit as EMF (`AIRLOCK_METRICS=emf`), each with the dimension
/// sets it is emitted under (`function` is the binary's name). CloudWatch keeps one metric
/// per dimension set and matches dimensions exactly: a panel or an alarm reads nothing
/// unless it names one of these sets.
const EMITTED: &[(&str, &[&[&str]])] = &[
    (
        "airlock_plan_requests_total",
        &[
            &["function", "action_type", "executable"],
            &["action_type"],
            &[],
        ],
    ),
    (
        "airlock_execute_requests_total",
        &[&["function", "action_type", "outcome"], &["outcome"]],
    ),
    (
        "airlock_execute_rejections_total",
        &[&["function", "action_type", "code"], &["code"]],
    ),
    (
        "airlock_http_request_duration_seconds",
        &[
            &["function", "route", "method", "status"],
            &["route", "method"],
        ],
    ),
    (
        "airlock_mcp_tool_calls_total",
        &[&["function", "tool", "outcome"], &["outcome"]],
    ),
    (
        "airlock_worker_messages_total",
        &[&["function", "queue", "outcome"], &["queue", "outcome"]],
    ),
    ("airlock_order_latency_seconds", &[&["function"], &[]]),
    (
        "airlock_sweeper_resends_total",
        &[&["function", "queue"], &["queue"]],
    ),
    (
        "airlock_dead_letters_total",
        &[&["function", "queue"], &["queue"]],
    ),
    ("airlock_kill_switch_engaged", &[&[]]),
    ("airlock_lambda_cold_starts_total", &[&["function"]]),
];

/// Whether `metric` is emitted with exactly the dimensions `dims`.
fn emitted_under(metric: &str, dims: &BTreeSet<String>) -> Result<(), String> {
    match EMITTED.iter().find(|(m, _)| *m == metric) {
        None => Err(format!("{metric} is no metric the functions emit")),
        Some((_, sets))
            if sets
                .iter()
                .any(|s| s.len() == dims.len() && s.iter().all(|d| dims.contains(*d))) =>
        {
            Ok(())
        }
        Some(_) => Err(format!(
            "{metric} is not emitted with the dimensions {dims:?}"
        )),
    }
}

/// The dashboard body, substituted: parameters by their defaults, the region by
/// `us-east-1`, `${Queue.QueueName}` by `queue:<logical id>` (so the checks see which
/// queue a panel reads); anything else is a problem.
fn dashboard_body(t: &Template, pattern: &str) -> Result<serde_json::Value, String> {
    let mut out = String::new();
    let mut rest = pattern;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let end = after.find('}').ok_or("an unclosed ${")?;
        let var = &after[..end];
        let value = if let Some(literal) = var.strip_prefix('!') {
            format!("${{{literal}}}")
        } else if var == "AWS::Region" {
            "us-east-1".to_string()
        } else if let Some(Some(default)) = t.parameters.get(var) {
            default.clone()
        } else if let Some(q) = var
            .strip_suffix(".QueueName")
            .filter(|q| t.queue(q).is_some())
        {
            format!("queue:{q}")
        } else {
            return Err(format!(
                "${{{var}}} is no parameter with a default, the region or a queue's name"
            ));
        };
        out.push_str(&value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    serde_json::from_str(&out).map_err(|e| format!("not JSON once substituted: {e}"))
}

/// One line of a metric panel's `metrics`.
#[derive(Debug)]
enum Series {
    /// `[namespace, name, dimension, value, ..., {options}]`.
    Metric {
        namespace: String,
        name: String,
        dims: BTreeMap<String, String>,
        id: Option<String>,
    },
    /// `[{"expression": ..., "id": ...}]`.
    Expression {
        id: Option<String>,
        expression: String,
    },
}

impl Series {
    fn id(&self) -> Option<&str> {
        match self {
            Series::Metric { id, .. } | Series::Expression { id, .. } => id.as_deref(),
        }
    }
}

fn series(row: &serde_json::Value) -> Result<Series, String> {
    let items = row.as_array().ok_or("not an array")?;
    let (options, fields) = match items.split_last() {
        Some((o @ serde_json::Value::Object(_), fields)) => (Some(o), fields),
        _ => (None, items.as_slice()),
    };
    let id = options.and_then(|o| o["id"].as_str()).map(String::from);
    if fields.is_empty() {
        let expression = options
            .and_then(|o| o["expression"].as_str())
            .ok_or("neither a metric nor an expression")?;
        return Ok(Series::Expression {
            id,
            expression: expression.to_string(),
        });
    }
    let texts: Vec<&str> = fields
        .iter()
        .map(|f| f.as_str().ok_or("a metric's fields are strings"))
        .collect::<Result<_, _>>()?;
    if texts.len() < 2 || !texts.len().is_multiple_of(2) {
        return Err("want [namespace, name, (dimension, value)..., {options}]".into());
    }
    if texts.contains(&".") {
        return Err("the \".\" shorthand: write the metric out".into());
    }
    Ok(Series::Metric {
        namespace: texts[0].to_string(),
        name: texts[1].to_string(),
        dims: texts[2..]
            .chunks(2)
            .map(|c| (c[0].to_string(), c[1].to_string()))
            .collect(),
        id,
    })
}

/// The ids a metric math expression reads: its words that start with a lower-case
/// letter (ids must; functions such as FILL, IF and SEARCH are upper case), outside
/// single quotes (SEARCH's query and statistic).
fn expression_ids(expression: &str) -> BTreeSet<String> {
    let mut unquoted = String::new();
    for (i, part) in expression.split('\'').enumerate() {
        if i % 2 == 0 {
            unquoted.push_str(part);
            unquoted.push(' ');
        }
    }
    unquoted
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with(|c: char| c.is_ascii_lowercase()))
        .map(String::from)
        .collect()
}

/// `SEARCH('{"namespace",dimension,...} MetricName="name"', 'statistic', period)`.
#[derive(Debug)]
struct Search {
    namespace: String,
    dims: BTreeSet<String>,
    metric: String,
    stat: String,
}

/// The SEARCH of an expression, if it has one.
fn search(expression: &str) -> Option<Result<Search, String>> {
    let (_, rest) = expression.split_once("SEARCH('")?;
    let parse = || -> Result<Search, String> {
        let (schema, rest) = rest
            .strip_prefix('{')
            .and_then(|r| r.split_once('}'))
            .ok_or("no {namespace,dimensions} schema")?;
        let mut parts = schema.split(',').map(|p| p.trim().trim_matches('"'));
        let namespace = parts.next().unwrap_or_default().to_string();
        let dims = parts.map(String::from).collect();
        let (query, rest) = rest.split_once('\'').ok_or("an unclosed query")?;
        let metric = query
            .split_once("MetricName=\"")
            .and_then(|(_, m)| m.split_once('"'))
            .map(|(m, _)| m.to_string())
            .ok_or("no MetricName=\"...\" in the query")?;
        let stat = rest
            .trim_start()
            .strip_prefix(',')
            .map(str::trim_start)
            .and_then(|r| r.strip_prefix('\''))
            .and_then(|r| r.split_once('\''))
            .map(|(s, _)| s.to_string())
            .ok_or("no statistic")?;
        Ok(Search {
            namespace,
            dims,
            metric,
            stat,
        })
    };
    Some(parse())
}

/// The `outcome`s of `metric` that the series of `ids` read (the ids of `panel`).
fn outcomes_read(
    ids: &BTreeSet<String>,
    panel: &BTreeMap<&str, &Series>,
    metric: &str,
) -> BTreeSet<String> {
    ids.iter()
        .filter_map(|i| match panel.get(i.as_str()) {
            Some(Series::Metric { name, dims, .. }) if name == metric => {
                dims.get("outcome").cloned()
            }
            _ => None,
        })
        .collect()
}

/// Whether `expression` is `100 * <numerator> / <denominator>` with a numerator that
/// reads exactly the outcomes `part` of `metric` and a denominator that reads `all`.
fn is_percent(
    expression: &str,
    panel: &BTreeMap<&str, &Series>,
    metric: &str,
    part: &[&str],
    all: &[&str],
) -> bool {
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    let Some((numerator, denominator)) = expression
        .strip_prefix("100 * ")
        .and_then(|e| e.split_once(" / "))
    else {
        return false;
    };
    outcomes_read(&expression_ids(numerator), panel, metric) == set(part)
        && outcomes_read(&expression_ids(denominator), panel, metric) == set(all)
}

fn dashboard_problems(t: &Template) -> Vec<String> {
    let mut out = Vec::new();
    let [d] = t.dashboards.as_slice() else {
        out.push(format!("{} dashboards, want one", t.dashboards.len()));
        return out;
    };
    let id = &d.logical_id;
    let body = match d.body_pattern.as_deref().map(|p| dashboard_body(t, p)) {
        Some(Ok(body)) => body,
        Some(Err(e)) => return vec![format!("{id}: DashboardBody: {e}")],
        None => return vec![format!("{id}: no DashboardBody")],
    };
    let namespace = t
        .parameters
        .get(NAMESPACE_PARAM)
        .cloned()
        .flatten()
        .unwrap_or_default();
    let mut shown = BTreeSet::new();
    let mut sqs = BTreeSet::new();
    let mut searches = Vec::new();
    let (mut acceptance, mut mcp_errors) = (false, false);
    let widgets = body["widgets"].as_array().cloned().unwrap_or_default();
    check!(out, !widgets.is_empty(), "{id}: no widgets");
    for (i, w) in widgets.iter().enumerate() {
        let props = &w["properties"];
        let at = format!(
            "{id} widget {i} ({})",
            props["title"].as_str().unwrap_or("")
        );
        if w["type"] != "metric" {
            continue;
        }
        check!(
            out,
            props["region"] == "us-east-1",
            "{at}: region must be ${{AWS::Region}}"
        );
        let Some(rows) = props["metrics"].as_array() else {
            out.push(format!("{at}: no metrics"));
            continue;
        };
        let mut lines = Vec::new();
        for row in rows {
            match series(row) {
                Ok(s) => lines.push(s),
                Err(e) => out.push(format!("{at}: {e}: {row}")),
            }
        }
        let panel: BTreeMap<&str, &Series> =
            lines.iter().filter_map(|s| Some((s.id()?, s))).collect();
        for s in &lines {
            match s {
                Series::Metric {
                    namespace: ns,
                    name,
                    dims,
                    ..
                } if *ns == namespace => {
                    let names = dims.keys().cloned().collect();
                    if let Err(e) = emitted_under(name, &names) {
                        out.push(format!("{at}: {e}"));
                    }
                    shown.insert(name.clone());
                }
                Series::Metric {
                    namespace: ns,
                    name,
                    dims,
                    ..
                } if ns == "AWS/SQS" => {
                    match dims.get("QueueName").and_then(|q| q.strip_prefix("queue:")) {
                        Some(q) if dims.len() == 1 => {
                            sqs.insert((name.clone(), q.to_string()));
                        }
                        _ => out.push(format!(
                            "{at}: {name}: QueueName must be a queue's ${{X.QueueName}}"
                        )),
                    }
                }
                Series::Metric { namespace: ns, .. } => out.push(format!(
                    "{at}: namespace {ns}, want ${{{NAMESPACE_PARAM}}} or AWS/SQS"
                )),
                Series::Expression { expression, .. } => match search(expression) {
                    Some(Ok(q)) => {
                        check!(
                            out,
                            q.namespace == namespace,
                            "{at}: SEARCH in {}, want ${{{NAMESPACE_PARAM}}}",
                            q.namespace
                        );
                        if let Err(e) = emitted_under(&q.metric, &q.dims) {
                            out.push(format!("{at}: SEARCH: {e}"));
                        }
                        shown.insert(q.metric.clone());
                        searches.push((q.metric, q.dims, q.stat));
                    }
                    Some(Err(e)) => out.push(format!("{at}: {expression}: {e}")),
                    None => {
                        for u in expression_ids(expression) {
                            check!(
                                out,
                                panel.contains_key(u.as_str()),
                                "{at}: {expression} reads {u}, no series of the panel"
                            );
                        }
                        let all = ["queued", "duplicate", "rejected"];
                        acceptance |= is_percent(
                            expression,
                            &panel,
                            "airlock_execute_requests_total",
                            &["queued"],
                            &all,
                        );
                        mcp_errors |= is_percent(
                            expression,
                            &panel,
                            "airlock_mcp_tool_calls_total",
                            &["error"],
                            &["error", "ok"],
                        );
                    }
                },
            }
        }
    }
    for (metric, _) in EMITTED {
        check!(
            out,
            shown.contains(*metric),
            "{id}: no panel shows {metric}"
        );
    }
    check!(
        out,
        acceptance,
        "{id}: no acceptance rate, 100 * queued / (queued + duplicate + rejected)"
    );
    check!(
        out,
        mcp_errors,
        "{id}: no MCP tool error rate, 100 * error / (error + ok)"
    );
    let searched = |metric: &str, dims: &[&str], stat: &str| {
        searches.iter().any(|(m, d, s)| {
            m == metric && s == stat && d == &dims.iter().map(|x| x.to_string()).collect()
        })
    };
    for stat in ["p95", "p99"] {
        check!(
            out,
            searched(
                "airlock_http_request_duration_seconds",
                &["route", "method"],
                stat
            ),
            "{id}: no {stat} latency per endpoint (SEARCH over route, method)"
        );
    }
    check!(
        out,
        searched("airlock_execute_rejections_total", &["code"], "Sum"),
        "{id}: no rejections by code (SEARCH over code)"
    );
    // The work queues' lag and depth, and their dead-letter queues' depth.
    for q in shapes::QUEUES {
        let work = q.logical_id.to_string();
        for metric in [
            "ApproximateAgeOfOldestMessage",
            "ApproximateNumberOfMessagesVisible",
        ] {
            check!(
                out,
                sqs.contains(&(metric.to_string(), work.clone())),
                "{id}: no {metric} of {work}"
            );
        }
        if let Some(r) = t.queue(&work).and_then(|q| q.redrive.as_ref()) {
            check!(
                out,
                sqs.contains(&(
                    "ApproximateNumberOfMessagesVisible".to_string(),
                    r.dead_letter.clone()
                )),
                "{id}: no ApproximateNumberOfMessagesVisible of {}",
                r.dead_letter
            );
        }
    }
    out
}

/// `[{Name: n, Value: v}, ...]` as written (a value that is no literal reads `?`).
fn dimensions(v: Option<&Value>) -> BTreeMap<String, String> {
    v.and_then(Value::as_sequence)
        .map(|dims| {
            dims.iter()
                .map(|d| {
                    (
                        text(d, "Name").unwrap_or_default(),
                        text(d, "Value").unwrap_or_else(|| "?".into()),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn alarm_problems(t: &Template) -> Vec<String> {
    let mut out = Vec::new();
    let is_ref = |v: Option<&Value>, to: &str| ref_to(v).as_deref() == Some(to);
    // Every alarm notifies alike: the alarm topic, when there is one.
    let actions: Value =
        serde_yaml::from_str("!If [HasAlarmEmail, [!Ref AlarmTopic], !Ref AWS::NoValue]")
            .expect("YAML");
    for a in &t.alarms {
        let (id, p) = (&a.logical_id, &a.properties);
        for key in ["AlarmActions", "OKActions"] {
            check!(
                out,
                field(p, key) == Some(&actions),
                "{id}: {key} must be the alarm topic's, like every alarm's"
            );
        }
        // Whatever reads the functions' metrics reads a dimension set they emit.
        if is_ref(field(p, "Namespace"), NAMESPACE_PARAM) {
            let metric = text(p, "MetricName").unwrap_or_default();
            let dims = dimensions(field(p, "Dimensions")).into_keys().collect();
            if let Err(e) = emitted_under(&metric, &dims) {
                out.push(format!("{id}: {e}"));
            }
        }
        for m in seq(p, "Metrics") {
            let Some(metric) = field(m, "MetricStat").and_then(|s| field(s, "Metric")) else {
                continue;
            };
            let name = text(metric, "MetricName").unwrap_or_default();
            check!(
                out,
                is_ref(field(metric, "Namespace"), NAMESPACE_PARAM),
                "{id}: {name}: Namespace must be !Ref {NAMESPACE_PARAM}"
            );
            let dims = dimensions(field(metric, "Dimensions"))
                .into_keys()
                .collect();
            if let Err(e) = emitted_under(&name, &dims) {
                out.push(format!("{id}: {e}"));
            }
        }
    }

    // (a) The acceptance rate: queued * 100 / all executes, below the parameter, only
    // with traffic (IF), three five-minute periods of three.
    let execute_outcomes = |a: &&AlarmDef| {
        seq(&a.properties, "Metrics").iter().any(|m| {
            field(m, "MetricStat")
                .and_then(|s| field(s, "Metric"))
                .and_then(|x| text(x, "MetricName"))
                .as_deref()
                == Some("airlock_execute_requests_total")
        })
    };
    match t.alarms.iter().filter(execute_outcomes).collect::<Vec<_>>()[..] {
        [a] => {
            let (id, p) = (&a.logical_id, &a.properties);
            // id -> the outcomes it reads, through the expressions.
            let mut reads: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            let mut returned = Vec::new();
            for m in seq(p, "Metrics") {
                let mid = text(m, "Id").unwrap_or_default();
                if let Some(stat) = field(m, "MetricStat") {
                    let metric = field(stat, "Metric").unwrap_or(&Value::Null);
                    let dims = dimensions(field(metric, "Dimensions"));
                    check!(
                        out,
                        text(stat, "Stat").as_deref() == Some("Sum")
                            && number(stat, "Period") == Ok(Some(300)),
                        "{id}.{mid}: Sum over 300 s"
                    );
                    reads.insert(
                        mid.clone(),
                        dims.get("outcome").cloned().into_iter().collect(),
                    );
                } else if let Some(e) = text(m, "Expression") {
                    let mut r = BTreeSet::new();
                    for u in expression_ids(&e) {
                        match reads.get(&u) {
                            Some(o) => r.extend(o.iter().cloned()),
                            None => out.push(format!(
                                "{id}.{mid}: reads {u}, defined after it or nowhere"
                            )),
                        }
                    }
                    reads.insert(mid.clone(), r);
                    if flag(m, "ReturnData") != Ok(false) {
                        returned.push(e);
                    }
                }
            }
            let all: BTreeSet<String> =
                ["queued", "duplicate", "rejected"].map(String::from).into();
            match &returned[..] {
                [e] => {
                    let numerator = e
                        .split_once("100 * ")
                        .and_then(|(_, r)| r.split_once(" / "))
                        .map(|(n, _)| expression_ids(n));
                    let numerator_reads: Option<BTreeSet<String>> = numerator.map(|ids| {
                        ids.iter()
                            .flat_map(|u| reads.get(u).cloned().unwrap_or_default())
                            .collect()
                    });
                    check!(
                        out,
                        e.starts_with("IF(")
                            && numerator_reads == Some(["queued".to_string()].into())
                            && expression_ids(e)
                                .iter()
                                .flat_map(|u| reads.get(u).cloned().unwrap_or_default())
                                .collect::<BTreeSet<_>>()
                                == all,
                        "{id}: {e} is not IF(traffic, 100 * queued / (queued + duplicate + rejected), 100)"
                    );
                }
                other => out.push(format!("{id}: returns {other:?}, want one expression")),
            }
            check!(
                out,
                is_ref(field(p, "Threshold"), "AcceptanceRateAlarmPercent")
                    && text(p, "ComparisonOperator").as_deref() == Some("LessThanThreshold"),
                "{id}: below !Ref AcceptanceRateAlarmPercent"
            );
            check!(
                out,
                number(p, "EvaluationPeriods") == Ok(Some(3))
                    && number(p, "DatapointsToAlarm") == Ok(Some(3)),
                "{id}: 3 periods of 3"
            );
            check!(
                out,
                text(p, "TreatMissingData").as_deref() == Some("notBreaching"),
                "{id}: no traffic is no alarm"
            );
        }
        ref other => out.push(format!(
            "{} alarms on airlock_execute_requests_total, want one",
            other.len()
        )),
    }

    // (b) p99 of the execute and the plan endpoints, each over the parameter.
    for bin in ["execute", "plan"] {
        let route = t
            .functions
            .iter()
            .filter(|f| f.binary.as_deref() == Some(bin))
            .flat_map(|f| &f.events)
            .find_map(|e| match e {
                EventDef::Api { method, path } => Some(BTreeMap::from([
                    ("method".to_string(), method.clone()),
                    ("route".to_string(), path.clone()),
                ])),
                _ => None,
            });
        let Some(route) = route else {
            out.push(format!("no API event of the {bin} function"));
            continue;
        };
        let alarms: Vec<&AlarmDef> = t
            .alarms
            .iter()
            .filter(|a| {
                text(&a.properties, "MetricName").as_deref()
                    == Some("airlock_http_request_duration_seconds")
                    && dimensions(field(&a.properties, "Dimensions")) == route
            })
            .collect();
        let [a] = alarms[..] else {
            out.push(format!(
                "{} latency alarms on {route:?} ({bin}), want one",
                alarms.len()
            ));
            continue;
        };
        let (id, p) = (&a.logical_id, &a.properties);
        check!(
            out,
            is_ref(field(p, "Namespace"), NAMESPACE_PARAM),
            "{id}: Namespace"
        );
        check!(
            out,
            text(p, "ExtendedStatistic").as_deref() == Some("p99")
                && field(p, "Statistic").is_none()
                && number(p, "Period") == Ok(Some(300)),
            "{id}: p99 over 300 s"
        );
        check!(
            out,
            is_ref(field(p, "Threshold"), "LatencyP99AlarmSeconds")
                && text(p, "ComparisonOperator").as_deref() == Some("GreaterThanThreshold"),
            "{id}: above !Ref LatencyP99AlarmSeconds"
        );
        check!(
            out,
            text(p, "TreatMissingData").as_deref() == Some("notBreaching"),
            "{id}: no traffic is no alarm"
        );
    }

    for (param, default) in [
        (NAMESPACE_PARAM, "Airlock"),
        ("LatencyP99AlarmSeconds", "1"),
        ("AcceptanceRateAlarmPercent", "50"),
    ] {
        check!(
            out,
            t.parameters.get(param).cloned().flatten().as_deref() == Some(default),
            "parameter {param}: default {default}"
        );
    }
    out
}

/// The two actions X-Ray's active tracing needs of a function's role.
const XRAY_ACTIONS: [&str; 2] = ["xray:PutTelemetryRecords", "xray:PutTraceSegments"];

fn tracing_problems(t: &Template) -> Vec<String> {
    let mut out = Vec::new();
    check!(
        out,
        t.parameters
            .get("TracingMode")
            .cloned()
            .flatten()
            .as_deref()
            == Some("PassThrough"),
        "TracingMode: default PassThrough (off)"
    );
    check!(
        out,
        t.allowed_values.get("TracingMode").map(Vec::as_slice)
            == Some(&["Active".to_string(), "PassThrough".to_string()][..]),
        "TracingMode: Active or PassThrough"
    );
    let active: Value = serde_yaml::from_str("!Equals [!Ref TracingMode, Active]").expect("YAML");
    check!(
        out,
        t.conditions.get("TracingActive") == Some(&active),
        "condition TracingActive must be TracingMode = Active"
    );
    for f in &t.functions {
        let id = &f.logical_id;
        check!(
            out,
            ref_to(f.tracing.as_ref()).as_deref() == Some("TracingMode"),
            "{id}: Tracing must be !Ref TracingMode"
        );
        let Some(r) = f.role.as_deref().and_then(|r| t.role(r)) else {
            continue; // every_function_has_its_own_role... says why
        };
        let role = &r.logical_id;
        let managed = r
            .managed_policies
            .iter()
            .filter_map(|m| t.managed_policy(m))
            .flat_map(|m| &m.statements);
        for st in r.statements.iter().chain(managed) {
            check!(
                out,
                !st.actions.iter().any(|a| a.starts_with("xray:")),
                "{role}: X-Ray actions whatever TracingMode says"
            );
        }
        let (tracing, other): (Vec<_>, Vec<_>) = r
            .conditional_statements
            .iter()
            .partition(|(cond, _)| cond == "TracingActive");
        for (cond, st) in other {
            check!(
                out,
                !st.actions.iter().any(|a| a.starts_with("xray:")),
                "{role}: X-Ray actions under {cond}, not TracingActive"
            );
        }
        let xray_only = match &tracing[..] {
            [(_, st)] => {
                let mut actions = st.actions.clone();
                actions.sort();
                st.effect == "Allow"
                    && actions == XRAY_ACTIONS
                    && st.resources == [ResourceDef::Literal("*".into())]
                    && st.condition.is_none()
                    && st.principal.is_none()
            }
            _ => false,
        };
        check!(
            out,
            xray_only,
            "{role}: with TracingActive, exactly {XRAY_ACTIONS:?} on *, is {tracing:?}"
        );
    }
    out
}

fn all_problems(t: &Template) -> Vec<String> {
    [
        table_problems(t),
        queue_problems(t),
        key_problems(t),
        environment_problems(t),
        function_problems(t),
        dashboard_problems(t),
        alarm_problems(t),
        tracing_problems(t),
    ]
    .concat()
}

#[test]
fn every_table_has_the_keys_indexes_and_ttl_the_code_uses() {
    assert_eq!(table_problems(&tpl()), Vec::<String>::new());
}

/// Every placeholder samconfig.toml ships (a value on an example domain, or the example
/// VPC endpoint) is refused by the template's rules, which CloudFormation checks before
/// it creates anything: a deploy that kept one fails, naming the parameter.
#[test]
fn a_deploy_with_a_samconfig_placeholder_fails_before_creating_anything() {
    let samconfig = include_str!("../../../../../samconfig.toml");
    let rules = TEMPLATE
        .split_once("\nRules:\n")
        .and_then(|(_, r)| r.split_once("\nConditions:\n"))
        .map(|(r, _)| r)
        .expect("a Rules section before Conditions");
    let mut placeholders = 0;
    for line in samconfig.lines() {
        let Some((name, value)) = line
            .trim()
            .trim_end_matches(',')
            .trim_matches('"')
            .split_once('=')
        else {
            continue;
        };
        if !(value.contains("example.") || value == "vpce-0123456789abcdef0") {
            continue;
        }
        placeholders += 1;
        let refused = [
            format!("!Not [!Equals [!Ref {name}, {value}]]"),
            format!("!Not [!Equals [!Ref {name}, \"{value}\"]]"),
        ];
        assert!(
            refused.iter().any(|r| rules.contains(r.as_str())),
            "samconfig.toml's placeholder {name}={value} is not refused by a rule"
        );
    }
    assert!(placeholders >= 6, "found {placeholders} placeholders");
}

/// The orders queue is a high-throughput FIFO queue: its quota and its deduplication
/// are per message group (an account's contract, or its cancels).
#[test]
fn the_orders_queue_is_high_throughput_fifo() {
    let doc: Value = serde_yaml::from_str(TEMPLATE).expect("the template is YAML");
    let q = &doc["Resources"]["OrdersQueue"]["Properties"];
    assert_eq!(q["FifoQueue"], Value::from(true));
    assert_eq!(q["FifoThroughputLimit"], Value::from("perMessageGroupId"));
    assert_eq!(q["DeduplicationScope"], Value::from("messageGroup"));
}

/// The sweeper's index of unsent actions spreads its writes over
/// [`shapes::UNSENT_SHARDS`] partitions (a hashed attribute, the accepted time as its
/// sort key), holds keys only, and the sweeper's role may query it, read the actions
/// it lists together (`BatchGetItem`), and query the legacy index while it exists.
#[test]
fn the_unsent_index_is_sharded_keys_only_and_the_sweeper_queries_it() {
    let t = tpl();
    let table = t.table("ActionsTable").expect("ActionsTable");
    let ix = table
        .index(shapes::UNSENT_INDEX)
        .expect("the sharded unsent index");
    assert_eq!(ix.projection, "KEYS_ONLY");
    assert_eq!(ix.key.partition, shapes::UNSENT_SHARD_ATTRIBUTE);
    assert_eq!(ix.key.sort.as_deref(), Some("created_at"));
    assert_eq!(
        table.attr_type(shapes::UNSENT_SHARD_ATTRIBUTE),
        Some(AttrType::S)
    );
    // Distinct shard values over a sample of ids: the partition key is not a constant.
    let shards: BTreeSet<String> = (0..64)
        .map(|i| shapes::unsent_shard(&format!("act_{i}")))
        .collect();
    assert!(shards.len() > 1, "{shards:?}");
    let role = t.role("SweeperRole").expect("SweeperRole");
    let allows = |action: &str, logical_id: &str, suffix: &str| {
        role.statements.iter().any(|st| {
            st.effect == "Allow"
                && st.actions.iter().any(|a| a == action)
                && st.resources.contains(&ResourceDef::Arn {
                    logical_id: logical_id.into(),
                    suffix: suffix.into(),
                })
        })
    };
    for index in [shapes::UNSENT_INDEX, shapes::LEGACY_UNSENT_INDEX] {
        assert!(
            allows("dynamodb:Query", "ActionsTable", &format!("/index/{index}")),
            "the sweeper must query {index}"
        );
    }
    assert!(allows("dynamodb:BatchGetItem", "ActionsTable", ""));
    // No other role queries the unsent indexes.
    for r in t.roles.iter().filter(|r| r.logical_id != "SweeperRole") {
        for st in &r.statements {
            for res in &st.resources {
                if let ResourceDef::Arn { logical_id, suffix } = res {
                    assert!(
                        !(logical_id == "ActionsTable" && suffix.starts_with("/index/")),
                        "{}: {suffix}",
                        r.logical_id
                    );
                }
            }
        }
    }
}

/// The defaults deploy into a brand-new account: no reserved concurrency (its quota
/// of 10 refuses any reservation) and no access log (it needs API Gateway's
/// account-wide CloudWatch role, which a new account lacks).
#[test]
fn the_defaults_deploy_into_a_new_account() {
    let doc: Value = serde_yaml::from_str(TEMPLATE).expect("the template is YAML");
    let default = |p: &str| doc["Parameters"][p]["Default"].clone();
    let params = doc["Parameters"].as_mapping().expect("Parameters");
    let reserved: Vec<&str> = params
        .keys()
        .filter_map(Value::as_str)
        .filter(|k| k.ends_with("ReservedConcurrency"))
        .collect();
    assert!(reserved.len() >= 2, "{reserved:?}");
    for p in reserved {
        assert_eq!(default(p), Value::from(0), "{p}");
    }
    assert_eq!(default("ApiAccessLogs"), Value::from("off"));
    assert_eq!(default("SetApiGatewayAccountLogRole"), Value::from("false"));
    assert!(
        TEMPLATE.contains("Condition: WriteAccessLogs"),
        "the access log group exists only with the access log"
    );
}

#[test]
fn every_queue_has_its_dead_letter_queue_and_redrive() {
    assert_eq!(queue_problems(&tpl()), Vec::<String>::new());
}

#[test]
fn the_signing_key_is_p256_for_signing_with_the_alias_the_code_uses() {
    assert_eq!(key_problems(&tpl()), Vec::<String>::new());
}

#[test]
fn every_function_gets_the_environment_the_code_reads() {
    assert_eq!(environment_problems(&tpl()), Vec::<String>::new());
}

#[test]
fn every_function_crate_is_built_for_lambda_and_wired_to_its_trigger() {
    assert_eq!(function_problems(&tpl()), Vec::<String>::new());
}

/// The dashboard body, once substituted, is JSON with a panel for every metric the
/// functions emit, each read under a dimension set they emit it with, and the queues'
/// lag and depth.
#[test]
fn the_dashboard_shows_every_metric_the_functions_emit() {
    assert_eq!(dashboard_problems(&tpl()), Vec::<String>::new());
}

/// The acceptance-rate collapse and the p99 latency of execute and plan raise alarms,
/// at the parameters' thresholds, through the alarm topic like every other alarm.
#[test]
fn the_acceptance_rate_and_latency_alarms_read_what_the_functions_emit() {
    assert_eq!(alarm_problems(&tpl()), Vec::<String>::new());
}

/// X-Ray tracing is off unless TracingMode=Active, which gives every function role the
/// two X-Ray actions and nothing else.
#[test]
fn tracing_is_off_by_default_and_active_adds_only_the_xray_actions() {
    assert_eq!(tracing_problems(&tpl()), Vec::<String>::new());
}

/// A request whose AWS calls all stall still answers 503 before its function times
/// out: the calls of one request, each within the operation limit, fit in the timeout
/// of every function behind the API (the template's, with the defaults the code uses
/// when a function sets none of the limits itself).
#[test]
fn stalled_calls_end_within_every_api_functions_timeout() {
    let limits = crate::config::AwsConfig::default();
    let t = tpl();
    let mut problems = Vec::new();
    for f in t
        .functions
        .iter()
        .filter(|f| f.events.iter().any(|e| matches!(e, EventDef::Api { .. })))
    {
        for var in [
            "AIRLOCK_AWS_ATTEMPT_TIMEOUT_MS",
            "AIRLOCK_AWS_OPERATION_TIMEOUT_MS",
        ] {
            if f.env.contains_key(var) {
                problems.push(format!("{}: sets {var}; check it here", f.logical_id));
            }
        }
        let budget_ms = u64::from(f.timeout_s.unwrap_or(3)) * 1000;
        let worst_ms = limits.operation_timeout_ms * crate::config::MAX_SEQUENTIAL_CALLS;
        if worst_ms >= budget_ms {
            problems.push(format!(
                "{}: {} calls x {} ms = {worst_ms} ms, not below its {budget_ms} ms timeout",
                f.logical_id,
                crate::config::MAX_SEQUENTIAL_CALLS,
                limits.operation_timeout_ms
            ));
        }
    }
    // `GET /actions/{id}?wait=20` holds its request: the wait, then the first and the
    // last read stalling, still end before the function's timeout.
    let status = t
        .functions
        .iter()
        .find(|f| f.binary.as_deref() == Some("action-status"))
        .expect("the action-status function");
    let need_ms = crate::core::usecases::reads::MAX_WAIT_S * 1000 + 2 * limits.operation_timeout_ms;
    if need_ms >= u64::from(status.timeout_s.unwrap_or(3)) * 1000 {
        problems.push(format!(
            "ActionStatusFunction: a {} s wait needs more than {need_ms} ms",
            crate::core::usecases::reads::MAX_WAIT_S
        ));
    }
    // An `execute_plan` held for an operator's approval ends `reserve` before the
    // invocation's deadline, whatever the hold: its last look and the final execute's
    // calls, stalling, fit after it. Before the hold come the first execute and taking
    // the hold (a read and a write); the timeout must leave a hold worth having after
    // all of them stalling.
    let mcp = t
        .functions
        .iter()
        .find(|f| f.binary.as_deref() == Some("mcp"))
        .expect("the mcp function");
    let op = limits.operation_timeout_ms;
    let reserve = crate::doors::mcp::hold_reserve(op).as_millis() as u64;
    if reserve < 3 * op {
        problems.push(format!(
            "McpFunction: {reserve} ms kept after a hold do not fit its last look and a final execute"
        ));
    }
    let before = crate::config::MAX_SEQUENTIAL_CALLS * op + 2 * op;
    let need_ms = before + reserve + 5_000;
    if need_ms >= u64::from(mcp.timeout_s.unwrap_or(3)) * 1000 {
        problems.push(format!(
            "McpFunction: a held approval of 5 s needs more than {need_ms} ms"
        ));
    }
    assert_eq!(problems, Vec::<String>::new());
    // And the check can fail: a 2 s function would not hold them.
    assert!(limits.operation_timeout_ms * crate::config::MAX_SEQUENTIAL_CALLS >= 2_000);
}

/// The MCP function's concurrency is reserved (and capped) only when the stack asks:
/// the default reserves none, which a new account's quota of 10 allows.
#[test]
fn the_mcp_function_reserves_concurrency_only_when_asked() {
    let t = tpl();
    let yaml = |s: &str| -> Value { serde_yaml::from_str(s).expect("YAML") };
    assert_eq!(
        t.parameters
            .get("McpReservedConcurrency")
            .cloned()
            .flatten()
            .as_deref(),
        Some("0")
    );
    assert_eq!(
        t.conditions.get("ReserveMcpConcurrency"),
        Some(&yaml("!Not [!Equals [!Ref McpReservedConcurrency, 0]]"))
    );
    let mcp = t
        .functions
        .iter()
        .find(|f| f.binary.as_deref() == Some("mcp"))
        .expect("the mcp function");
    assert_eq!(
        mcp.reserved_concurrency,
        Some(yaml(
            "!If [ReserveMcpConcurrency, !Ref McpReservedConcurrency, !Ref AWS::NoValue]"
        ))
    );
    let with = |v: &str| BTreeMap::from([("McpReservedConcurrency".to_string(), v.to_string())]);
    assert_eq!(
        t.condition_holds("ReserveMcpConcurrency", &BTreeMap::new()),
        Ok(false)
    );
    assert_eq!(
        t.condition_holds("ReserveMcpConcurrency", &with("20")),
        Ok(true)
    );
}

/// Every reservation of concurrency is asked for: `!If [Reserve<X>Concurrency, !Ref
/// <X>ReservedConcurrency, !Ref AWS::NoValue]`, the condition holding only when the
/// parameter is not 0, and 0 by default. Besides MCP's (its cap keeps its held calls from
/// the others' concurrency), the approval page and both workers may reserve theirs; the
/// REST functions never do.
#[test]
fn concurrency_is_reserved_only_when_asked() {
    let t = tpl();
    let yaml = |s: &str| -> Value { serde_yaml::from_str(s).expect("YAML") };
    let mut reserving = BTreeSet::new();
    for f in &t.functions {
        let Some(r) = &f.reserved_concurrency else {
            continue;
        };
        let id = &f.logical_id;
        let (_, args) = intrinsic(r).unwrap_or_else(|| panic!("{id}: {r:?}"));
        let cond = args[0].as_str().unwrap_or_else(|| panic!("{id}: {r:?}"));
        let param = referenced_id(&args[1]).unwrap_or_else(|| panic!("{id}: {r:?}"));
        assert!(param.ends_with("ReservedConcurrency"), "{id}: {param}");
        assert_eq!(
            r,
            &yaml(&format!("!If [{cond}, !Ref {param}, !Ref AWS::NoValue]")),
            "{id}"
        );
        assert_eq!(
            t.conditions.get(cond),
            Some(&yaml(&format!("!Not [!Equals [!Ref {param}, 0]]"))),
            "{id}"
        );
        assert_eq!(t.condition_holds(cond, &BTreeMap::new()), Ok(false), "{id}");
        let with = BTreeMap::from([(param.clone(), "5".to_string())]);
        assert_eq!(t.condition_holds(cond, &with), Ok(true), "{id}");
        reserving.insert(f.binary.clone().unwrap_or_default());
    }
    assert_eq!(
        reserving,
        [
            "approvals",
            "mcp",
            "sweeper",
            "worker-jobs",
            "worker-orders"
        ]
        .map(String::from)
        .into(),
    );
}

/// A queue scales its worker up to `WorkerMaximumConcurrency` (default 2, Lambda's
/// least), never to the hundreds of instances an unbounded SQS event source reaches.
#[test]
fn every_queue_caps_its_workers_concurrency() {
    let doc: Value = serde_yaml::from_str(TEMPLATE).expect("the template is YAML");
    let p = &doc["Parameters"]["WorkerMaximumConcurrency"];
    assert_eq!(
        (&p["Default"], &p["MinValue"]),
        (&Value::from(2), &Value::from(2))
    );
    let mut queues = 0;
    for (id, res) in doc["Resources"].as_mapping().expect("Resources") {
        let events = res["Properties"]["Events"].as_mapping();
        for e in events.into_iter().flat_map(|m| m.values()) {
            if e["Type"] != "SQS" {
                continue;
            }
            queues += 1;
            let max = &e["Properties"]["ScalingConfig"]["MaximumConcurrency"];
            assert_eq!(
                referenced_id(max).as_deref(),
                Some("WorkerMaximumConcurrency"),
                "{id:?}"
            );
        }
    }
    assert_eq!(queues, 2);
}

/// MCP's `execute_plan` is paced to what API Gateway throttles `POST /actions/execute`
/// with: the MCP function's pace is the same two parameters, and only it has one.
#[test]
fn the_mcp_function_paces_execute_plan_as_the_gateway_throttles_execute() {
    let t = tpl();
    let doc: Value = serde_yaml::from_str(TEMPLATE).expect("the template is YAML");
    let execute_route = doc["Resources"]["Api"]["Properties"]["MethodSettings"]
        .as_sequence()
        .expect("MethodSettings")
        .iter()
        .find(|m| m["ResourcePath"] == "/~1api~1internal~1v1~1mastra~1actions~1execute")
        .expect("the execute route's throttle");
    assert_eq!(
        (
            ref_to(execute_route.get("ThrottlingRateLimit")).as_deref(),
            ref_to(execute_route.get("ThrottlingBurstLimit")).as_deref()
        ),
        (Some("ExecuteThrottleRate"), Some("ExecuteThrottleBurst"))
    );
    for f in &t.functions {
        let pace = (
            ref_to(f.env.get("AIRLOCK_MCP_EXECUTE_RATE_PER_SECOND")),
            ref_to(f.env.get("AIRLOCK_MCP_EXECUTE_BURST")),
        );
        if f.binary.as_deref() == Some("mcp") {
            assert_eq!(
                (pace.0.as_deref(), pace.1.as_deref()),
                (Some("ExecuteThrottleRate"), Some("ExecuteThrottleBurst"))
            );
        } else {
            assert_eq!(pace, (None, None), "{}", f.logical_id);
        }
    }
}

/// The failing assertions of the template's rules in a deployment with `params` (every
/// other parameter at its default).
fn rules_refusing(params: &[(&str, &str)]) -> Vec<String> {
    let t = tpl();
    let doc: Value = serde_yaml::from_str(TEMPLATE).expect("the template is YAML");
    let mut all: BTreeMap<String, String> = [
        ("VpcEndpointId", "vpce-0a1b2c3d4e5f60718"),
        ("ServiceIssuer", "https://idp.firm.test/mastra"),
        ("ServiceJwksUrl", "https://idp.firm.test/mastra/jwks.json"),
        ("OperatorIssuer", "https://sso.firm.test/operators"),
        (
            "OperatorJwksUrl",
            "https://sso.firm.test/operators/jwks.json",
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    all.extend(params.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let mut out = Vec::new();
    for (name, rule) in doc["Rules"].as_mapping().expect("Rules") {
        if let Some(c) = rule.get("RuleCondition") {
            if !t.holds(c, &all, 0).expect("a rule condition") {
                continue;
            }
        }
        for a in rule["Assertions"].as_sequence().expect("Assertions") {
            if !t.holds(&a["Assert"], &all, 0).expect("an assertion") {
                out.push(format!(
                    "{}: {}",
                    name.as_str().unwrap_or_default(),
                    a["AssertDescription"].as_str().unwrap_or_default()
                ));
            }
        }
    }
    out
}

/// The approval page's origin is its own domain (ApprovalDomainName with a certificate:
/// one deploy) or ApprovalOrigin (the default endpoint, known after a first deploy),
/// exactly one; the rules refuse the rest before anything is created. The domain and its
/// mapping exist only with a domain, and the origin every function gets follows.
#[test]
fn the_approval_page_gets_its_own_domain_only_when_asked() {
    const ARN: &str =
        "arn:aws:acm:eu-west-1:123456789012:certificate/0f1e2d3c-aaaa-bbbb-cccc-0123456789ab";
    let domain = ("ApprovalDomainName", "approvals.desk.firm.test");
    let refused = |p: &[(&str, &str)]| rules_refusing(p);
    // Neither: no origin.
    let none = refused(&[]);
    assert!(
        none.iter()
            .any(|r| r.starts_with("ApprovalOriginOrDomain:")),
        "{none:?}"
    );
    // The two-deploy path: the origin, no domain.
    assert_eq!(
        refused(&[(
            "ApprovalOrigin",
            "https://abc123.execute-api.eu-west-1.amazonaws.com"
        )]),
        Vec::<String>::new()
    );
    // samconfig.toml's placeholder is still refused.
    assert_eq!(
        refused(&[("ApprovalOrigin", "https://approvals.example.com")]).len(),
        1
    );
    // The one-deploy path: a domain and its certificate.
    assert_eq!(
        refused(&[domain, ("ApprovalCertificateArn", ARN)]),
        Vec::<String>::new()
    );
    // A domain without a certificate, or with an origin beside it.
    let r = refused(&[domain]);
    assert!(
        r.len() == 1 && r[0].contains("needs ApprovalCertificateArn"),
        "{r:?}"
    );
    let r = refused(&[
        domain,
        ("ApprovalCertificateArn", ARN),
        ("ApprovalOrigin", "https://other.firm.test"),
    ]);
    assert!(
        r.len() == 1 && r[0].contains("leave ApprovalOrigin empty"),
        "{r:?}"
    );

    let t = tpl();
    let with = BTreeMap::from([(domain.0.to_string(), domain.1.to_string())]);
    assert_eq!(
        t.condition_holds("HasApprovalDomain", &BTreeMap::new()),
        Ok(false)
    );
    assert_eq!(t.condition_holds("HasApprovalDomain", &with), Ok(true));
    let doc: Value = serde_yaml::from_str(TEMPLATE).expect("the template is YAML");
    let res = &doc["Resources"];
    let d = &res["ApprovalsDomain"];
    assert_eq!(d["Type"], Value::from("AWS::ApiGatewayV2::DomainName"));
    assert_eq!(d["Condition"], Value::from("HasApprovalDomain"));
    let conf = &d["Properties"]["DomainNameConfigurations"][0];
    assert_eq!(conf["EndpointType"], Value::from("REGIONAL"));
    assert_eq!(
        referenced_id(&conf["CertificateArn"]).as_deref(),
        Some("ApprovalCertificateArn")
    );
    let m = &res["ApprovalsApiMapping"];
    assert_eq!(m["Type"], Value::from("AWS::ApiGatewayV2::ApiMapping"));
    assert_eq!(m["Condition"], Value::from("HasApprovalDomain"));
    assert_eq!(
        referenced_id(&m["Properties"]["ApiId"]).as_deref(),
        Some("ApprovalsApi")
    );
    assert_eq!(
        referenced_id(&m["Properties"]["DomainName"]).as_deref(),
        Some("ApprovalsDomain")
    );
    let out = &doc["Outputs"]["ApprovalDomainTarget"];
    assert_eq!(out["Condition"], Value::from("HasApprovalDomain"));
    assert_eq!(
        out["Value"],
        serde_yaml::from_str::<Value>("!GetAtt ApprovalsDomain.RegionalDomainName").unwrap()
    );
    // Every function (plans name the page; the approvals function is its relying party)
    // gets the domain's origin with a domain, ApprovalOrigin without.
    let origin: Value = serde_yaml::from_str(
        "!If [HasApprovalDomain, !Sub \"https://${ApprovalDomainName}\", !Ref ApprovalOrigin]",
    )
    .unwrap();
    for f in &t.functions {
        assert_eq!(
            f.env.get("AIRLOCK_APPROVAL_ORIGIN"),
            Some(&origin),
            "{}",
            f.logical_id
        );
    }
}

/// Each edit makes the template disagree with the code; the checks must say so.
#[test]
fn the_checks_catch_drift() {
    let edits: &[(&str, &str)] = &[
        ("AttributeName: ttl, Enabled: true }\n      PointInTimeRecoverySpecification: { PointInTimeRecoveryEnabled: true }\n      DeletionProtectionEnabled: true\n\n  IdempotencyTable",
         "AttributeName: expires, Enabled: true }\n      PointInTimeRecoverySpecification: { PointInTimeRecoveryEnabled: true }\n      DeletionProtectionEnabled: true\n\n  IdempotencyTable"),
        ("- { AttributeName: created_at, AttributeType: N }", "- { AttributeName: created_at, AttributeType: S }"),
        ("IndexName: by_account", "IndexName: by_acct"),
        ("{ AttributeName: symbol, KeyType: RANGE }", "{ AttributeName: symbol, KeyType: HASH }"),
        ("\"${ResourcePrefix}airlock-audit\"", "\"${ResourcePrefix}airlock-audits\""),
        ("maxReceiveCount: 5", "maxReceiveCount: 3"),
        ("airlock-orders-dlq.fifo\"\n      FifoQueue: true", "airlock-orders-dlq.fifo\"\n      FifoQueue: false"),
        ("KeySpec: ECC_NIST_P256", "KeySpec: ECC_SECG_P256K1"),
        ("AIRLOCK_JOBS_TABLE: !Ref JobsTable", "AIRLOCK_JOBS_TABLE: !Ref OrdersTable"),
        ("AIRLOCK_EXECUTE_RATE_PER_MINUTE:", "AIRLOCK_EXECUTE_RATE_PER_MIN:"),
        ("Binary: worker-jobs", "Binary: worker-job"),
        ("Path: /api/internal/v1/mastra/actions/plan", "Path: /api/internal/v1/mastra/plan"),
        ("Architectures: [arm64]", "Architectures: [x86_64]"),
        // Observability.
        ("AIRLOCK_METRICS: emf", "AIRLOCK_METRICS: prometheus"),
        ("\"widgets\": [", "\"widgets\": [["),
        ("\"airlock_kill_switch_engaged\"", "\"airlock_kill_switch\""),
        ("{\\\"${MetricsNamespace}\\\",code}", "{\\\"${MetricsNamespace}\\\",reason}"),
        ("\"region\": \"${AWS::Region}\"", "\"region\": \"eu-west-1\""),
        ("\"${JobsDeadLetterQueue.QueueName}\"", "\"${JobsQueue.QueueName}\""),
        ("(FILL(queued, 0) + FILL(duplicate, 0) + FILL(rejected, 0))\"", "(FILL(queued, 0) + FILL(rejected, 0))\""),
        ("\"outcome\", \"error\", { \"id\": \"errors\"", "\"tool\", \"error\", { \"id\": \"errors\""),
        ("Dimensions: [{ Name: outcome, Value: rejected }]", "Dimensions: [{ Name: outcome, Value: rejected }, { Name: function, Value: execute }]"),
        ("IF(total >= 5, 100 * FILL(queued, 0) / total, 100)", "100 * FILL(queued, 0) / total"),
        ("Threshold: !Ref AcceptanceRateAlarmPercent", "Threshold: 50"),
        ("Value: /api/internal/v1/mastra/actions/plan }", "Value: /api/internal/v1/mastra/plan }"),
        ("ExtendedStatistic: p99", "ExtendedStatistic: p90"),
        ("      TreatMissingData: notBreaching\n      AlarmActions: !If [HasAlarmEmail, [!Ref AlarmTopic], !Ref AWS::NoValue]\n      OKActions: !If [HasAlarmEmail, [!Ref AlarmTopic], !Ref AWS::NoValue]\n\n  # Two panels",
         "      TreatMissingData: notBreaching\n\n  # Two panels"),
        ("Tracing: !Ref TracingMode", "Tracing: Active"),
        ("TracingActive: !Equals [!Ref TracingMode, Active]", "TracingActive: !Equals [!Ref TracingMode, PassThrough]"),
        ("Action: [xray:PutTraceSegments, xray:PutTelemetryRecords]", "Action: [xray:PutTraceSegments, xray:PutTelemetryRecords, xray:GetSamplingRules]"),
        ("          - TracingActive\n", "          - SetApiGatewayAccount\n"),
    ];
    assert_eq!(all_problems(&tpl()), Vec::<String>::new());
    for (from, to) in edits {
        assert!(TEMPLATE.contains(from), "the edit target is gone: {from:?}");
        let t = parse(&TEMPLATE.replacen(from, to, 1)).expect("edited template parses");
        assert!(
            !all_problems(&t).is_empty(),
            "no check noticed {from:?} -> {to:?}"
        );
    }
    // And one function losing the stage setting.
    let once = "          AWS_LAMBDA_HTTP_IGNORE_STAGE_IN_PATH: \"true\"\n";
    let t = parse(&TEMPLATE.replacen(once, "", 1)).unwrap();
    assert!(!environment_problems(&t).is_empty());
}

/// The IAM side as the permission proof (`tests/tests/e2e/permissions.rs`) reads it: every
/// function runs as a role of its own that writes its own log group, and only the roles
/// of the functions that plan (the plan endpoint, and the MCP endpoint's plan tools) may
/// sign. The proof reads the statements in force in its deployment (the parameters'
/// defaults); a role's conditional ones may only be X-Ray's, under TracingActive, and
/// execute's read of the public key, under ExecuteReadsPublicKey (see
/// [`the_execute_role_reads_the_public_key_only_when_it_is_not_configured`]).
/// A replace of a working order (`WorkerStore::replace_order`) is one transaction of
/// `UpdateItem`s on the orders, exposures and actions tables, as an order's step is, and
/// the paper broker's replace and fills read and write its documents with `GetItem` and
/// `PutItem` (one `TransactWriteItems` of puts when a fill moves the book). moto checks
/// no IAM: the worker-orders role must allow each.
#[test]
fn the_worker_orders_role_covers_a_replace() {
    let t = tpl();
    let role = t.role("WorkerOrdersRole").expect("WorkerOrdersRole");
    let allows = |action: &str, table: &str| {
        role.statements.iter().any(|s| {
            s.effect == "Allow"
                && s.actions.iter().any(|a| a == action)
                && s.resources.contains(&ResourceDef::Arn {
                    logical_id: table.into(),
                    suffix: String::new(),
                })
        })
    };
    for table in ["OrdersTable", "ExposuresTable", "ActionsTable"] {
        for action in ["dynamodb:GetItem", "dynamodb:UpdateItem"] {
            assert!(allows(action, table), "{action} on {table}");
        }
    }
    for action in ["dynamodb:GetItem", "dynamodb:PutItem"] {
        assert!(
            allows(action, "PaperBrokerTable"),
            "{action} on PaperBrokerTable"
        );
    }
}

/// `WorkerStore::settle_with_exposure` is one `TransactWriteItems` of two `UpdateItem`s
/// (the action's move, the exposure's increments), or the action's `UpdateItem` alone;
/// IAM authorizes each item's action on its table. The order worker settles a replace
/// that ends without changing its order with it, and the sweeper a dead letter's. moto
/// checks no IAM: both roles must allow each.
#[test]
fn the_roles_that_settle_an_action_can_release_its_exposure() {
    let t = tpl();
    for role_id in ["WorkerOrdersRole", "SweeperRole"] {
        let role = t.role(role_id).unwrap_or_else(|| panic!("no {role_id}"));
        for table in ["ActionsTable", "ExposuresTable"] {
            let allowed = role.statements.iter().any(|s| {
                s.effect == "Allow"
                    && s.actions.iter().any(|a| a == "dynamodb:UpdateItem")
                    && s.resources.contains(&ResourceDef::Arn {
                        logical_id: table.into(),
                        suffix: String::new(),
                    })
            });
            assert!(allowed, "{role_id}: dynamodb:UpdateItem on {table}");
        }
    }
}

#[test]
fn every_function_has_its_own_role_and_only_the_planners_sign() {
    let t = tpl();
    let mut roles = BTreeSet::new();
    for f in &t.functions {
        let id = &f.logical_id;
        let role = f.role.as_deref().unwrap_or_else(|| panic!("{id}: no Role"));
        assert!(roles.insert(role), "{id}: role {role} is shared");
        let r = t
            .role(role)
            .unwrap_or_else(|| panic!("{id}: no role {role}"));
        assert_eq!(r.external_policies, Vec::<String>::new(), "{role}");
        for m in &r.managed_policies {
            assert!(
                t.managed_policy(m).is_some(),
                "{role}: no managed policy {m}"
            );
        }
        let group = f
            .log_group
            .clone()
            .unwrap_or_else(|| panic!("{id}: no log group"));
        let writes_it = r.statements.iter().any(|s| {
            s.actions.iter().any(|a| a == "logs:PutLogEvents")
                && s.resources
                    == [ResourceDef::Arn {
                        logical_id: group.clone(),
                        suffix: String::new(),
                    }]
        });
        assert!(writes_it, "{role} must write {group}");
        for (cond, st) in &r.conditional_statements {
            if cond == "ExecuteReadsPublicKey" && role == "ExecuteRole" {
                continue;
            }
            assert_eq!(cond, "TracingActive", "{role}: a conditional policy");
            assert!(
                st.actions
                    .iter()
                    .all(|a| XRAY_ACTIONS.contains(&a.as_str())),
                "{role}: with {cond}, {:?}",
                st.actions
            );
        }
    }
    let planners: Vec<_> = ["plan", "mcp"]
        .iter()
        .map(|bin| {
            let role = t
                .functions
                .iter()
                .find(|f| f.binary.as_deref() == Some(*bin))
                .and_then(|f| f.role.clone())
                .unwrap_or_else(|| panic!("the {bin} function's role"));
            Some(PrincipalDef::Role(role))
        })
        .collect();
    for k in &t.keys {
        let signers: Vec<_> = k
            .policy
            .iter()
            .filter(|s| s.effect == "Allow" && s.actions.iter().any(|a| a == "kms:Sign"))
            .map(|s| s.principal.clone())
            .collect();
        assert_eq!(signers, planners, "{}", k.logical_id);
    }
}

/// With `ConfirmationPublicKey` set, the execute function gets it and makes
/// no KMS call, so its role may not read the key; empty (the default), it reads it
/// once per cold start, and may. Whether the code does either is the permission proof's
/// and `tests/tests/e2e/permissions.rs`'s cold-start test's business.
#[test]
fn the_execute_role_reads_the_public_key_only_when_it_is_not_configured() {
    let t = tpl();
    assert_eq!(
        t.parameters.get("ConfirmationPublicKey"),
        Some(&Some(String::new())),
        "ConfirmationPublicKey: default empty"
    );
    let empty: Value =
        serde_yaml::from_str("!Equals [!Ref ConfirmationPublicKey, \"\"]").expect("YAML");
    assert_eq!(t.conditions.get("ExecuteReadsPublicKey"), Some(&empty));
    let execute = t
        .functions
        .iter()
        .find(|f| f.binary.as_deref() == Some("execute"))
        .expect("the execute function");
    assert_eq!(
        ref_to(execute.env.get("AIRLOCK_CONFIRMATION_PUBLIC_KEY")).as_deref(),
        Some("ConfirmationPublicKey")
    );
    for f in t
        .functions
        .iter()
        .filter(|f| f.logical_id != execute.logical_id)
    {
        assert!(
            !f.env.contains_key("AIRLOCK_CONFIRMATION_PUBLIC_KEY"),
            "{}: only execute verifies with a configured key",
            f.logical_id
        );
    }
    let role = t
        .role(execute.role.as_deref().expect("Role"))
        .expect("ExecuteRole");
    let managed = role
        .managed_policies
        .iter()
        .filter_map(|m| t.managed_policy(m))
        .flat_map(|m| &m.statements);
    for st in role.statements.iter().chain(managed) {
        assert!(
            !st.actions.iter().any(|a| a.starts_with("kms:")),
            "ExecuteRole: {:?} whatever ConfirmationPublicKey says",
            st.actions
        );
    }
    let reads: Vec<_> = role
        .conditional_statements
        .iter()
        .filter(|(c, _)| c == "ExecuteReadsPublicKey")
        .map(|(_, st)| st)
        .collect();
    let [st] = reads[..] else {
        panic!("ExecuteRole: one statement under ExecuteReadsPublicKey, is {reads:?}")
    };
    assert_eq!(st.effect, "Allow");
    assert_eq!(st.actions, ["kms:GetPublicKey"]);
    let key = |id: &str| ResourceDef::Arn {
        logical_id: id.into(),
        suffix: String::new(),
    };
    assert_eq!(
        st.resources,
        [ResourceDef::Either(vec![
            key("SigningKeyA"),
            key("SigningKeyB")
        ])]
    );
    // The condition as a deploy evaluates it.
    let with = |v: &str| BTreeMap::from([("ConfirmationPublicKey".to_string(), v.to_string())]);
    assert_eq!(
        t.condition_holds("ExecuteReadsPublicKey", &BTreeMap::new()),
        Ok(true)
    );
    assert_eq!(
        t.condition_holds("ExecuteReadsPublicKey", &with("")),
        Ok(true)
    );
    assert_eq!(
        t.condition_holds("ExecuteReadsPublicKey", &with("MFkw")),
        Ok(false)
    );
}
