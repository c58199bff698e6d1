//! `airlock bootstrap`: creates, at the AWS endpoint of the environment (an emulator or a
//! sandbox account), the tables, indexes, TTL attributes, queues and signing key that
//! `infra/template.yaml` declares (read through [`template`](super::template)), under the
//! default names `serve --backend aws` uses ([`shapes`](super::shapes): prefix + default
//! name, matched to the template by logical id). Safe to run twice: what exists is left as
//! it is. Deployment-only settings (point-in-time recovery, deletion protection, key
//! policies, encryption) are the stack's business, not the emulator's.

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ProjectionType, ScalarAttributeType, TimeToLiveSpecification,
};
use aws_sdk_kms::types::{KeySpec, KeyUsageType};
use aws_sdk_sqs::types::QueueAttributeName;

use super::shapes::{self, QueueShape};
use super::template::{self, AttrType, KeyDef, KeySchema, QueueDef, TableDef, Template};
use super::{aws_error, clients, sdk_config};
use crate::config::AwsConfig;

/// What bootstrap did, one line per resource.
pub type Report = Vec<String>;

fn key_schema(k: &KeySchema) -> Result<Vec<KeySchemaElement>, String> {
    let mut out = vec![KeySchemaElement::builder()
        .attribute_name(&k.partition)
        .key_type(KeyType::Hash)
        .build()
        .map_err(|e| e.to_string())?];
    if let Some(sort) = &k.sort {
        out.push(
            KeySchemaElement::builder()
                .attribute_name(sort)
                .key_type(KeyType::Range)
                .build()
                .map_err(|e| e.to_string())?,
        );
    }
    Ok(out)
}

/// A table as `DescribeTable` and `DescribeTimeToLive` report it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TableState {
    /// `CREATING`, `ACTIVE`, `UPDATING`, ...
    status: String,
    /// Each index and its status (`CREATING`, `ACTIVE`, ...).
    indexes: Vec<(String, String)>,
    /// `ENABLED`, `ENABLING`, `DISABLED`, `DISABLING`; `None` before it was read.
    ttl: Option<String>,
}

/// What bootstrap does next for one table.
#[derive(Debug, Clone, PartialEq, Eq)]
enum TableStep {
    Create,
    /// Creating or updating (a table, an index, TTL being switched off): ask again later.
    Wait(String),
    /// Read the TTL status (only once the table is active).
    ReadTtl,
    /// Switch TTL on for this attribute.
    EnableTtl(String),
    /// Add this index the template declares and the table lacks (one per update).
    CreateIndex(String),
    Done,
}

/// The next step towards the table the template declares. Real DynamoDB creates tables
/// and indexes over seconds to minutes and refuses `UpdateTimeToLive` and index changes
/// until the table is `ACTIVE` (the emulator creates them active at once), so every step
/// waits for that first. Safe to run again at any point: it only does what is missing.
fn next_table_step(t: &TableDef, state: Option<&TableState>) -> TableStep {
    let Some(st) = state else {
        return TableStep::Create;
    };
    if st.status != "ACTIVE" {
        return TableStep::Wait(format!("table {}", st.status));
    }
    if let Some((name, status)) = st.indexes.iter().find(|(_, s)| s != "ACTIVE") {
        return TableStep::Wait(format!("index {name} {status}"));
    }
    if let Some(ix) = t
        .indexes
        .iter()
        .find(|ix| !st.indexes.iter().any(|(n, _)| *n == ix.name))
    {
        return TableStep::CreateIndex(ix.name.clone());
    }
    let Some(attr) = &t.ttl else {
        return TableStep::Done;
    };
    match st.ttl.as_deref() {
        None => TableStep::ReadTtl,
        Some("ENABLED") | Some("ENABLING") => TableStep::Done,
        Some("DISABLING") => TableStep::Wait("TTL DISABLING".into()),
        Some(_) => TableStep::EnableTtl(attr.clone()),
    }
}

/// How often, and for how long, bootstrap asks about a table being created or updated.
const POLL: std::time::Duration = std::time::Duration::from_secs(2);
const MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

async fn describe_table(
    ddb: &aws_sdk_dynamodb::Client,
    name: &str,
) -> Result<Option<TableState>, String> {
    use aws_sdk_dynamodb::operation::describe_table::DescribeTableError;
    match ddb.describe_table().table_name(name).send().await {
        Ok(o) => {
            let t = o
                .table()
                .ok_or_else(|| format!("DescribeTable {name}: no table"))?;
            Ok(Some(TableState {
                status: t
                    .table_status()
                    .map(|s| s.as_str().to_string())
                    .unwrap_or_default(),
                indexes: t
                    .global_secondary_indexes()
                    .iter()
                    .map(|ix| {
                        (
                            ix.index_name().unwrap_or_default().to_string(),
                            ix.index_status()
                                .map(|s| s.as_str().to_string())
                                .unwrap_or_default(),
                        )
                    })
                    .collect(),
                ttl: None,
            }))
        }
        Err(e)
            if matches!(
                e.as_service_error(),
                Some(DescribeTableError::ResourceNotFoundException(_))
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(format!("DescribeTable {name}: {}", aws_error(&e))),
    }
}

/// Brings one table to what the template declares: created, active, every index active,
/// TTL on; waits for each change DynamoDB makes in the background.
async fn ensure_table(
    ddb: &aws_sdk_dynamodb::Client,
    name: &str,
    t: &TableDef,
    report: &mut Report,
) -> Result<(), String> {
    let started = std::time::Instant::now();
    let mut did: Vec<String> = Vec::new();
    let mut ttl: Option<String> = None;
    loop {
        let mut state = describe_table(ddb, name).await?;
        if let Some(st) = state.as_mut() {
            st.ttl = ttl.clone();
        }
        match next_table_step(t, state.as_ref()) {
            TableStep::Done => break,
            TableStep::Create => {
                create_table(ddb, name, t).await?;
                did.push("created".into());
            }
            TableStep::Wait(what) => {
                if started.elapsed() > MAX_WAIT {
                    return Err(format!(
                        "table {name}: still {what} after {} s; run bootstrap again later",
                        MAX_WAIT.as_secs()
                    ));
                }
                tokio::time::sleep(POLL).await;
            }
            TableStep::ReadTtl => {
                let o = ddb
                    .describe_time_to_live()
                    .table_name(name)
                    .send()
                    .await
                    .map_err(|e| format!("DescribeTimeToLive {name}: {}", aws_error(&e)))?;
                ttl = Some(
                    o.time_to_live_description()
                        .and_then(|d| d.time_to_live_status())
                        .map(|s| s.as_str().to_string())
                        .unwrap_or_else(|| "DISABLED".into()),
                );
            }
            TableStep::EnableTtl(attr) => {
                ddb.update_time_to_live()
                    .table_name(name)
                    .time_to_live_specification(
                        TimeToLiveSpecification::builder()
                            .attribute_name(&attr)
                            .enabled(true)
                            .build()
                            .map_err(|e| e.to_string())?,
                    )
                    .send()
                    .await
                    .map_err(|e| format!("UpdateTimeToLive {name}: {}", aws_error(&e)))?;
                ttl = Some("ENABLING".into());
                did.push(format!("TTL on {attr}"));
            }
            TableStep::CreateIndex(ix) => {
                create_index(ddb, name, t, &ix).await?;
                did.push(format!("index {ix} added"));
            }
        }
    }
    report.push(if did.is_empty() {
        format!("table {name}: exists")
    } else {
        format!("table {name}: {}", did.join(", "))
    });
    Ok(())
}

fn attribute_definitions(t: &TableDef) -> Result<Vec<AttributeDefinition>, String> {
    t.attributes
        .iter()
        .map(|(attr, kind)| {
            AttributeDefinition::builder()
                .attribute_name(attr)
                .attribute_type(match kind {
                    AttrType::S => ScalarAttributeType::S,
                    AttrType::N => ScalarAttributeType::N,
                    AttrType::B => ScalarAttributeType::B,
                })
                .build()
                .map_err(|e| e.to_string())
        })
        .collect()
}

fn index(ix: &template::IndexDef) -> Result<GlobalSecondaryIndex, String> {
    GlobalSecondaryIndex::builder()
        .index_name(&ix.name)
        .set_key_schema(Some(key_schema(&ix.key)?))
        .projection(
            Projection::builder()
                .projection_type(ProjectionType::from(ix.projection.as_str()))
                .build(),
        )
        .build()
        .map_err(|e| e.to_string())
}

async fn create_index(
    ddb: &aws_sdk_dynamodb::Client,
    name: &str,
    t: &TableDef,
    ix_name: &str,
) -> Result<(), String> {
    let ix = t
        .indexes
        .iter()
        .find(|ix| ix.name == ix_name)
        .ok_or_else(|| format!("{}: no index {ix_name}", t.logical_id))?;
    let gsi = index(ix)?;
    let create = aws_sdk_dynamodb::types::CreateGlobalSecondaryIndexAction::builder()
        .index_name(gsi.index_name())
        .set_key_schema(Some(gsi.key_schema().to_vec()))
        .set_projection(gsi.projection().cloned())
        .build()
        .map_err(|e| e.to_string())?;
    ddb.update_table()
        .table_name(name)
        .set_attribute_definitions(Some(attribute_definitions(t)?))
        .global_secondary_index_updates(
            aws_sdk_dynamodb::types::GlobalSecondaryIndexUpdate::builder()
                .create(create)
                .build(),
        )
        .send()
        .await
        .map_err(|e| {
            format!(
                "UpdateTable {name} (add index {ix_name}): {}",
                aws_error(&e)
            )
        })?;
    Ok(())
}

async fn create_table(
    ddb: &aws_sdk_dynamodb::Client,
    name: &str,
    t: &TableDef,
) -> Result<(), String> {
    let billing = match t.billing_mode.as_deref() {
        Some("PAY_PER_REQUEST") => BillingMode::PayPerRequest,
        other => {
            return Err(format!(
                "{}: BillingMode {other:?}: only PAY_PER_REQUEST is supported",
                t.logical_id
            ))
        }
    };
    let mut req = ddb
        .create_table()
        .table_name(name)
        .billing_mode(billing)
        .set_key_schema(Some(key_schema(&t.key)?))
        .set_attribute_definitions(Some(attribute_definitions(t)?));
    for ix in &t.indexes {
        req = req.global_secondary_indexes(index(ix)?);
    }
    match req.send().await {
        Ok(_) => Ok(()),
        // Created meanwhile: by another bootstrap, or by this one when a slow reply made the
        // SDK retry the call. The loop reads the table again and carries on from there.
        Err(e)
            if e.as_service_error()
                .is_some_and(|se| se.is_resource_in_use_exception()) =>
        {
            Ok(())
        }
        Err(e) => Err(format!("CreateTable {name}: {}", aws_error(&e))),
    }
}

async fn queue_arn(sqs: &aws_sdk_sqs::Client, url: &str) -> Result<String, String> {
    let out = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .map_err(|e| format!("GetQueueAttributes {url}: {}", aws_error(&e)))?;
    out.attributes()
        .and_then(|a| a.get(&QueueAttributeName::QueueArn))
        .cloned()
        .ok_or_else(|| format!("no ARN for {url}"))
}

/// Creates one queue from its template definition (or finds it); returns its URL.
async fn ensure_queue(
    sqs: &aws_sdk_sqs::Client,
    name: &str,
    q: &QueueDef,
    redrive: Option<String>,
) -> Result<(String, bool), String> {
    if let Ok(found) = sqs.get_queue_url().queue_name(name).send().await {
        if let Some(url) = found.queue_url {
            return Ok((url, false));
        }
    }
    let mut req = sqs.create_queue().queue_name(name);
    if q.fifo {
        req = req
            .attributes(QueueAttributeName::FifoQueue, "true")
            .attributes(
                QueueAttributeName::ContentBasedDeduplication,
                q.content_based_deduplication.to_string(),
            );
    }
    if let Some(v) = q.visibility_timeout_s {
        req = req.attributes(QueueAttributeName::VisibilityTimeout, v.to_string());
    }
    if let Some(r) = q.retention_s {
        req = req.attributes(QueueAttributeName::MessageRetentionPeriod, r.to_string());
    }
    if let Some(policy) = redrive {
        req = req.attributes(QueueAttributeName::RedrivePolicy, policy);
    }
    let out = req
        .send()
        .await
        .map_err(|e| format!("CreateQueue {name}: {}", aws_error(&e)))?;
    Ok((out.queue_url.unwrap_or_default(), true))
}

async fn create_queue(
    sqs: &aws_sdk_sqs::Client,
    given: &AwsConfig,
    shape: &QueueShape,
    tpl: &Template,
    report: &mut Report,
) -> Result<(), String> {
    let q = tpl.queue(shape.logical_id).ok_or_else(|| {
        format!(
            "infra/template.yaml has no queue {} (shapes.rs)",
            shape.logical_id
        )
    })?;
    let (name, dead) = (shape.name(given), shape.dead_letter(given));
    let redrive = match &q.redrive {
        None => None,
        Some(r) => {
            let dlq = tpl.queue(&r.dead_letter).ok_or_else(|| {
                format!(
                    "infra/template.yaml: {}'s dead-letter queue {} is not a queue",
                    q.logical_id, r.dead_letter
                )
            })?;
            let (url, _) = ensure_queue(sqs, &dead, dlq, None).await?;
            let arn = queue_arn(sqs, &url).await?;
            Some(
                serde_json::json!({
                    "deadLetterTargetArn": arn,
                    "maxReceiveCount": r.max_receive_count.to_string(),
                })
                .to_string(),
            )
        }
    };
    let (_, created) = ensure_queue(sqs, &name, q, redrive).await?;
    report.push(format!(
        "queue {name} (dead letters: {dead}): {}",
        if created { "created" } else { "exists" }
    ));
    Ok(())
}

async fn create_key(
    kms: &aws_sdk_kms::Client,
    given: &AwsConfig,
    key: &KeyDef,
    report: &mut Report,
) -> Result<(), String> {
    let alias = shapes::default_signing_alias(given);
    if kms.describe_key().key_id(&alias).send().await.is_ok() {
        report.push(format!("key {alias}: exists"));
        return Ok(());
    }
    let created = kms
        .create_key()
        .key_spec(KeySpec::from(key.key_spec.as_str()))
        .key_usage(KeyUsageType::from(key.key_usage.as_str()))
        .description("Airlock confirmation-token signing key")
        .send()
        .await
        .map_err(|e| format!("CreateKey: {}", aws_error(&e)))?;
    let id = created
        .key_metadata()
        .map(|m| m.key_id().to_string())
        .ok_or("CreateKey returned no key id")?;
    match kms
        .create_alias()
        .alias_name(&alias)
        .target_key_id(&id)
        .send()
        .await
    {
        Ok(_) => {}
        // Made meanwhile (a retried call whose first reply was lost, or another bootstrap):
        // the alias exists, which is what this step is for.
        Err(e)
            if e.as_service_error()
                .is_some_and(|se| se.is_already_exists_exception()) =>
        {
            report.push(format!("key {alias}: exists (alias made meanwhile)"));
            return Ok(());
        }
        Err(e) => return Err(format!("CreateAlias: {}", aws_error(&e))),
    }
    report.push(format!("key {alias} ({id}): created"));
    Ok(())
}

/// Creates every resource that does not exist yet.
pub async fn bootstrap(given: &AwsConfig) -> Result<Report, String> {
    let tpl = template::embedded()?;
    let conf = sdk_config(given).await;
    let (ddb, sqs, kms) = clients(&conf);
    let mut report = Report::new();
    for shape in shapes::TABLES {
        let def = tpl.table(shape.logical_id).ok_or_else(|| {
            format!(
                "infra/template.yaml has no table {} (shapes.rs)",
                shape.logical_id
            )
        })?;
        ensure_table(&ddb, &shape.name(given), def, &mut report).await?;
    }
    copy_control(&ddb, &shapes::CONTROL.name(given), &mut report).await?;
    for shape in shapes::QUEUES {
        create_queue(&sqs, given, shape, &tpl, &mut report).await?;
    }
    // Rotation slots declare the same key twice; any one of them is the shape.
    let key = tpl
        .keys
        .first()
        .ok_or("infra/template.yaml declares no KMS key")?;
    create_key(&kms, given, key, &mut report).await?;
    Ok(report)
}

/// Execute's commit checks the control record on one of its copies
/// ([`super::control`]): a record written by an older version, without copies, is copied
/// to each missing one (never over a copy, which is as new as the record or newer). Until
/// then executes are refused, never let through.
async fn copy_control(
    ddb: &aws_sdk_dynamodb::Client,
    table: &str,
    report: &mut Report,
) -> Result<(), String> {
    use aws_sdk_dynamodb::types::AttributeValue;
    let got = ddb
        .get_item()
        .table_name(table)
        .key("id", AttributeValue::S(super::control::CONTROL_ID.into()))
        .consistent_read(true)
        .send()
        .await
        .map_err(|e| format!("GetItem {table}: {}", aws_error(&e)))?;
    let Some(record) = got.item else {
        return Ok(());
    };
    let mut copied = 0;
    for k in 0..super::control::CONTROL_SHARDS {
        let mut item = record.clone();
        let id = format!("{}#{k}", super::control::CONTROL_ID);
        item.insert("id".into(), AttributeValue::S(id));
        match ddb
            .put_item()
            .table_name(table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(id)")
            .send()
            .await
        {
            Ok(_) => copied += 1,
            Err(e) if super::is_condition_failure(&e) => {}
            Err(e) => return Err(format!("PutItem {table} (a copy): {}", aws_error(&e))),
        }
    }
    if copied > 0 {
        report.push(format!("control record: copied to {copied} copies"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(logical_id: &str) -> TableDef {
        template::embedded()
            .unwrap()
            .table(logical_id)
            .unwrap()
            .clone()
    }

    fn state(status: &str, indexes: &[(&str, &str)], ttl: Option<&str>) -> TableState {
        TableState {
            status: status.into(),
            indexes: indexes
                .iter()
                .map(|(n, s)| (n.to_string(), s.to_string()))
                .collect(),
            ttl: ttl.map(String::from),
        }
    }

    #[test]
    fn each_step_waits_for_what_dynamodb_does_in_the_background() {
        let keys = table("IdempotencyTable");
        let attr = keys.ttl.clone().expect("a TTL attribute");
        assert_eq!(next_table_step(&keys, None), TableStep::Create);
        assert!(matches!(
            next_table_step(&keys, Some(&state("CREATING", &[], None))),
            TableStep::Wait(_)
        ));
        let active = |ttl| state("ACTIVE", &[], ttl);
        assert_eq!(
            next_table_step(&keys, Some(&active(None))),
            TableStep::ReadTtl
        );
        assert_eq!(
            next_table_step(&keys, Some(&active(Some("DISABLED")))),
            TableStep::EnableTtl(attr)
        );
        assert!(matches!(
            next_table_step(&keys, Some(&active(Some("DISABLING")))),
            TableStep::Wait(_)
        ));
        for on in ["ENABLING", "ENABLED"] {
            assert_eq!(
                next_table_step(&keys, Some(&active(Some(on)))),
                TableStep::Done
            );
        }

        let orders = table("OrdersTable");
        let names: Vec<&str> = orders.indexes.iter().map(|i| i.name.as_str()).collect();
        assert!(names.len() >= 2, "{names:?}");
        assert!(matches!(
            next_table_step(
                &orders,
                Some(&state("ACTIVE", &[(names[0], "CREATING")], None))
            ),
            TableStep::Wait(_)
        ));
        assert_eq!(
            next_table_step(
                &orders,
                Some(&state("ACTIVE", &[(names[0], "ACTIVE")], None))
            ),
            TableStep::CreateIndex(names[1].to_string())
        );
    }

    /// Real DynamoDB, as far as bootstrap can tell: a new table or index is `CREATING` for
    /// a few polls, and `UpdateTimeToLive` or an index change on a table that is not
    /// `ACTIVE` is refused. Bootstrap from nothing, from a table half made by an earlier
    /// run, and again when all is done, must end with every index active and TTL on
    /// without ever being refused, in a bounded number of steps.
    #[test]
    fn bootstrap_reaches_the_declared_table_on_a_slow_dynamodb() {
        for logical_id in ["IdempotencyTable", "OrdersTable", "ActionsTable"] {
            let t = table(logical_id);
            let starts = [
                None,
                Some(state("CREATING", &[], None)),
                Some(state("ACTIVE", &[], Some("DISABLED"))),
            ];
            for start in starts {
                // (table, per index: (name, polls left while CREATING)), TTL status.
                let mut table_polls: u32 = match &start {
                    Some(s) if s.status == "CREATING" => 3,
                    _ => 0,
                };
                let mut exists = start.is_some();
                let mut indexes: Vec<(String, u32)> = Vec::new();
                let mut ttl = start
                    .and_then(|s| s.ttl)
                    .unwrap_or_else(|| "DISABLED".into());
                let mut ttl_read = false;
                let mut steps = 0;
                loop {
                    steps += 1;
                    assert!(steps < 100, "{logical_id}: no end");
                    let seen = exists.then(|| TableState {
                        status: if table_polls > 0 {
                            "CREATING"
                        } else {
                            "ACTIVE"
                        }
                        .into(),
                        indexes: indexes
                            .iter()
                            .map(|(n, p)| {
                                let s = if *p > 0 { "CREATING" } else { "ACTIVE" };
                                (n.clone(), s.to_string())
                            })
                            .collect(),
                        ttl: ttl_read.then(|| ttl.clone()),
                    });
                    let active = table_polls == 0 && indexes.iter().all(|(_, p)| *p == 0);
                    match next_table_step(&t, seen.as_ref()) {
                        TableStep::Done => break,
                        TableStep::Create => {
                            assert!(!exists, "{logical_id}: created twice");
                            exists = true;
                            table_polls = 3;
                            indexes = t.indexes.iter().map(|i| (i.name.clone(), 2)).collect();
                        }
                        TableStep::Wait(_) => {
                            table_polls = table_polls.saturating_sub(1);
                            for (_, p) in indexes.iter_mut() {
                                *p = p.saturating_sub(1);
                            }
                        }
                        TableStep::ReadTtl => ttl_read = true,
                        TableStep::EnableTtl(_) => {
                            assert!(active, "{logical_id}: UpdateTimeToLive before ACTIVE");
                            ttl = "ENABLING".into();
                        }
                        TableStep::CreateIndex(name) => {
                            assert!(active, "{logical_id}: UpdateTable before ACTIVE");
                            indexes.push((name, 2));
                        }
                    }
                }
                assert_eq!(table_polls, 0);
                let mut have: Vec<&str> = indexes.iter().map(|(n, _)| n.as_str()).collect();
                let mut want: Vec<&str> = t.indexes.iter().map(|i| i.name.as_str()).collect();
                have.sort();
                want.sort();
                assert_eq!(have, want, "{logical_id}: every index");
                assert!(indexes.iter().all(|(_, p)| *p == 0));
                if t.ttl.is_some() {
                    assert!(
                        ttl == "ENABLING" || ttl == "ENABLED",
                        "{logical_id}: TTL {ttl}"
                    );
                }
            }
        }
    }
}
