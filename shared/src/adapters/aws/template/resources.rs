//! Tables, queues and functions (with `Globals.Function` applied).

use std::collections::BTreeMap;

use serde_yaml::Value;

use super::model::{
    AttrType, EventDef, FunctionDef, IndexDef, KeySchema, QueueDef, Redrive, TableDef,
};
use super::yaml::{field, flag, number, referenced_id, seq, string_or_sub, text};

fn key_schema(items: &[Value], ctx: &str) -> Result<KeySchema, String> {
    let mut partition = None;
    let mut sort = None;
    for k in items {
        let name = text(k, "AttributeName").ok_or(format!("{ctx}: AttributeName"))?;
        match text(k, "KeyType").as_deref() {
            Some("HASH") => partition = Some(name),
            Some("RANGE") => sort = Some(name),
            other => return Err(format!("{ctx}: KeyType {other:?}")),
        }
    }
    Ok(KeySchema {
        partition: partition.ok_or(format!("{ctx}: no HASH key"))?,
        sort,
    })
}

pub(super) fn table(id: &str, p: &Value) -> Result<TableDef, String> {
    let ctx = |what: &str| format!("{id}.{what}");
    let mut attributes = Vec::new();
    for a in seq(p, "AttributeDefinitions") {
        let name = text(a, "AttributeName").ok_or(ctx("AttributeDefinitions"))?;
        let kind = match text(a, "AttributeType").as_deref() {
            Some("S") => AttrType::S,
            Some("N") => AttrType::N,
            Some("B") => AttrType::B,
            other => return Err(format!("{id}: attribute {name}: type {other:?}")),
        };
        attributes.push((name, kind));
    }
    let mut indexes = Vec::new();
    for ix in seq(p, "GlobalSecondaryIndexes") {
        let name = text(ix, "IndexName").ok_or(ctx("GlobalSecondaryIndexes"))?;
        indexes.push(IndexDef {
            key: key_schema(seq(ix, "KeySchema"), &ctx(&name))?,
            projection: field(ix, "Projection")
                .and_then(|pr| text(pr, "ProjectionType"))
                .unwrap_or_else(|| "KEYS_ONLY".into()),
            name,
        });
    }
    let ttl = match field(p, "TimeToLiveSpecification") {
        Some(t) if flag(t, "Enabled")? => text(t, "AttributeName"),
        _ => None,
    };
    Ok(TableDef {
        logical_id: id.to_string(),
        name_pattern: field(p, "TableName").and_then(string_or_sub),
        key: key_schema(seq(p, "KeySchema"), &ctx("KeySchema"))?,
        attributes,
        indexes,
        ttl,
        billing_mode: text(p, "BillingMode"),
        point_in_time_recovery: match field(p, "PointInTimeRecoverySpecification") {
            Some(s) => flag(s, "PointInTimeRecoveryEnabled")?,
            None => false,
        },
    })
}

pub(super) fn queue(id: &str, p: &Value) -> Result<QueueDef, String> {
    let redrive = match field(p, "RedrivePolicy") {
        None => None,
        Some(r) => Some(Redrive {
            dead_letter: field(r, "deadLetterTargetArn")
                .and_then(referenced_id)
                .ok_or(format!(
                    "{id}.RedrivePolicy.deadLetterTargetArn: expected !GetAtt <queue>.Arn"
                ))?,
            max_receive_count: number(r, "maxReceiveCount")
                .map_err(|e| format!("{id}.RedrivePolicy.{e}"))?
                .ok_or(format!("{id}.RedrivePolicy: no maxReceiveCount"))?,
        }),
    };
    Ok(QueueDef {
        logical_id: id.to_string(),
        name_pattern: field(p, "QueueName").and_then(string_or_sub),
        fifo: flag(p, "FifoQueue").map_err(|e| format!("{id}.{e}"))?,
        content_based_deduplication: flag(p, "ContentBasedDeduplication")
            .map_err(|e| format!("{id}.{e}"))?,
        visibility_timeout_s: number(p, "VisibilityTimeout").map_err(|e| format!("{id}.{e}"))?,
        retention_s: number(p, "MessageRetentionPeriod").map_err(|e| format!("{id}.{e}"))?,
        redrive,
    })
}

fn env_of(props: Option<&Value>) -> BTreeMap<String, Value> {
    props
        .and_then(|p| field(p, "Environment"))
        .and_then(|e| field(e, "Variables"))
        .and_then(Value::as_mapping)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.as_str()?.to_string(), v.clone())))
                .collect()
        })
        .unwrap_or_default()
}

fn event(e: &Value) -> EventDef {
    let p = field(e, "Properties");
    let method = || {
        p.and_then(|p| text(p, "Method"))
            .unwrap_or_default()
            .to_uppercase()
    };
    let path = || p.and_then(|p| text(p, "Path")).unwrap_or_default();
    match text(e, "Type").as_deref() {
        Some("Api") => EventDef::Api {
            method: method(),
            path: path(),
        },
        Some("HttpApi") => EventDef::HttpApi {
            method: method(),
            path: path(),
        },
        Some("SQS") => EventDef::Sqs {
            queue: p
                .and_then(|p| field(p, "Queue"))
                .and_then(referenced_id)
                .unwrap_or_default(),
        },
        Some("Schedule") | Some("ScheduleV2") => EventDef::Schedule,
        other => EventDef::Other(other.unwrap_or_default().to_string()),
    }
}

pub(super) fn function(
    id: &str,
    res: &Value,
    globals: Option<&Value>,
) -> Result<FunctionDef, String> {
    let p = field(res, "Properties");
    let pick = |key: &str| {
        p.and_then(|p| text(p, key))
            .or_else(|| globals.and_then(|g| text(g, key)))
    };
    let mut env = env_of(globals);
    env.extend(env_of(p));
    let architectures = p
        .and_then(|p| field(p, "Architectures"))
        .or_else(|| globals.and_then(|g| field(g, "Architectures")))
        .and_then(Value::as_sequence)
        .map(|s| {
            s.iter()
                .filter_map(|a| a.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let timeout_s = match p.and_then(|p| field(p, "Timeout")) {
        Some(_) => number(p.unwrap_or(&Value::Null), "Timeout"),
        None => number(globals.unwrap_or(&Value::Null), "Timeout"),
    }
    .map_err(|e| format!("{id}.{e}"))?;
    let events = p
        .and_then(|p| field(p, "Events"))
        .and_then(Value::as_mapping)
        .map(|m| m.values().map(event).collect())
        .unwrap_or_default();
    let meta = field(res, "Metadata");
    let role = p.and_then(|p| field(p, "Role")).and_then(referenced_id);
    let log_group = p
        .and_then(|p| field(p, "LoggingConfig"))
        .and_then(|l| field(l, "LogGroup"))
        .and_then(referenced_id);
    let tracing = p
        .and_then(|p| field(p, "Tracing"))
        .or_else(|| globals.and_then(|g| field(g, "Tracing")))
        .cloned();
    Ok(FunctionDef {
        logical_id: id.to_string(),
        build_method: meta.and_then(|m| text(m, "BuildMethod")),
        binary: meta
            .and_then(|m| field(m, "BuildProperties"))
            .and_then(|b| text(b, "Binary")),
        runtime: pick("Runtime"),
        handler: pick("Handler"),
        architectures,
        timeout_s,
        env,
        events,
        role,
        log_group,
        tracing,
        reserved_concurrency: p
            .and_then(|p| field(p, "ReservedConcurrentExecutions"))
            .cloned(),
    })
}
